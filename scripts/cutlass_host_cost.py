#!/usr/bin/env python3
"""Host cost per call of cutlass_sm90 kernels (kernel ABI 2), on a GPU, in one go (< 30 s).

    python scripts/cutlass_host_cost.py                     # the family's default builds (cache / nvcc)
    python scripts/cutlass_host_cost.py K1.so K2.so ...     # carried builds, no nvcc needed
    python scripts/cutlass_host_cost.py --calls 5000 --shape 128 128 128

Each kernel is called through ctypes the way dispatch calls it (abi.raw_launch: no argtypes,
pre-converted pointers) on torch's current stream, on a tiny shape so the GPU never holds the
host back. Rows, per kernel and options:
  hit    the same pointers, shape and options every call: the launcher's per-thread Params cache
         answers, so a call is the argument checks, one cudaGetDevice and the launch
  miss   C cycles through more buffers than the cache holds (8), so every call builds Params
         (can_implement, get_workspace_size, the TMA descriptors through cuTensorMapEncodeTiled):
         about what every call cost before the cache
host us/call is the launch loop's wall time / calls before synchronising (what the caller's
thread pays); wall us/call includes draining the stream. References: a ctypes call of
cudal2_meta (the Python + ctypes floor) and torch.matmul on the same shape.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _default_builds() -> list[tuple[str, Path]]:
    from cudal2.core.build import build
    from cudal2.templates import FAMILIES
    fam = FAMILIES["cutlass_sm90"]
    out = []
    for cfg in fam.defaults():
        r = build(fam.build_spec(cfg, "sm_90a"))
        if not r.ok:
            raise SystemExit(f"cannot build {cfg.label()}: {r.status}\n{r.log[-2000:]}")
        out.append((cfg.label().replace("cutlass_sm90:", ""), r.so_path))
    return out


def _time_loop(fn, calls: int, sync) -> tuple[float, float]:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("so", nargs="*", help="kernel .so files (default: build the cutlass_sm90 defaults)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per row (default 2000)")
    ap.add_argument("--shape", type=int, nargs=3, default=(128, 128, 128), metavar=("M", "N", "K"))
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("cutlass_host_cost: no CUDA GPU visible; this benchmark needs one", file=sys.stderr)
        return 2
    from cudal2.core.abi import load_library
    kernels = [(Path(p).name, Path(p)) for p in args.so] if args.so else _default_builds()
    M, N, K = args.shape
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream()
    sp = ctypes.c_void_p(stream.cuda_stream)
    sync = torch.cuda.synchronize
    a = torch.randn(M, K, device=dev, dtype=torch.float16)
    n_c = 12                                         # > the launcher's 8 cache entries
    cs = [torch.empty(M, N, device=dev, dtype=torch.float16) for _ in range(n_c)]
    vp = ctypes.c_void_p
    rows = []
    start = time.perf_counter()

    meta_fn = load_library(kernels[0][1])._meta_fn
    rows.append(("(ctypes floor: cudal2_meta())", "", "", *_time_loop(meta_fn, args.calls, sync)))
    b_rr = torch.randn(K, N, device=dev, dtype=torch.float16)
    rows.append(("(torch.matmul)", "", "", *_time_loop(lambda: torch.matmul(a, b_rr), args.calls, sync)))

    for label, so in kernels:
        lib = load_library(so)
        meta = lib.meta
        if meta.get("abi") != 2:
            print(f"skipping {label}: ABI {meta.get('abi', 1)} (this benchmark is for ABI 2 kernels)")
            continue
        rc = meta["layout"] == "RC"
        b = torch.randn(N, K, device=dev, dtype=torch.float16) if rc else b_rr
        ldb = K if rc else N
        fn = lib.raw_launch
        variants = [{}]
        names = [o["name"] for o in meta.get("options", [])]
        if "swizzle" in names:
            variants.append({"swizzle": 8, "raster": 1})
        if "splits" in names:
            variants.append({"splits": 2, "decomposition": 2})    # needs a workspace: a memset per call
        for chosen in variants:
            opts = lib.options(chosen)
            ws_bytes = lib.workspace_bytes(M, N, K, opts)
            ws = torch.empty(max(ws_bytes, 1), device=dev, dtype=torch.uint8)
            wsp, wsb = vp(ws.data_ptr() if ws_bytes else 0), ctypes.c_size_t(ws_bytes)
            ap_, bp = vp(a.data_ptr()), vp(b.data_ptr())
            cps = [vp(c.data_ptr()) for c in cs]
            err = fn(ap_, bp, cps[0], M, N, K, K, ldb, N, wsp, wsb, sp, opts)
            sync()
            if err != 0:
                rows.append((label, str(chosen or "defaults"), f"error {err}", float("nan"), float("nan")))
                continue
            ref = (a.float() @ b.float().t()) if rc else (a.float() @ b.float())
            ok = torch.allclose(cs[0].float(), ref, atol=0.05, rtol=0.01)

            def hit():
                fn(ap_, bp, cps[0], M, N, K, K, ldb, N, wsp, wsb, sp, opts)
            i = [0]

            def miss():
                i[0] += 1
                fn(ap_, bp, cps[i[0] % n_c], M, N, K, K, ldb, N, wsp, wsb, sp, opts)
            what = str(chosen or "defaults") + (f", ws {ws_bytes} B" if ws_bytes else "")
            rows.append((label, what, "hit" + ("" if ok else " (WRONG RESULT)"), *_time_loop(hit, args.calls, sync)))
            rows.append((label, what, "miss", *_time_loop(miss, args.calls, sync)))

    w = max(len(r[0]) for r in rows)
    print(f"host cost per call, {M}x{N}x{K}, {args.calls} calls per row, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    print(f"{'kernel':<{w}}  {'options':<44} {'path':<6} {'host us/call':>13} {'wall us/call':>13}")
    for k, o, pth, host, wall in rows:
        print(f"{k:<{w}}  {o:<44} {pth:<6} {host:>13.2f} {wall:>13.2f}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
