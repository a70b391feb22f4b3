"""cudal2.matmul's runtime: torch.matmul's semantics, tuned kernels where they are known to win.

One module per job, cheapest first:

    matmul.py   the public entry: routes eager / autograd / torch.compile / everything else
    hot.py      the eager kernel path: attribute checks, one dict lookup, one ctypes launch
    resolve.py  once per (device, shape, layout): plan, load, maybe race; the serving table
    plan.py     which tuned kernels may serve a shape (pure: no torch, no GPU)
    race.py     a nearest kernel against torch's cuBLAS once, by kernel time (cudal2.timing)
    loader.py   loading table kernels lazily (carried binary, build cache, else a build the
                CUDAL2_BUILD_IN_CALL knob allows), once per source; workspaces
    warmup.py   building every served kernel ahead of the calls (cudal2 warmup, cudal2.warmup())
    op.py       the cudal2::hgemm torch.library op (torch.compile's fake impl, autograd)
    patch.py    routing a model's nn.Linear layers through cudal2.matmul

docs/dispatch.md explains the rules.
"""
