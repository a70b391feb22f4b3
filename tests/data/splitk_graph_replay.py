"""A split-K kernel served by cudal2.runtime's hot path (hot.launch: its Workspaces, the launcher
recorded by serve_kernel), resolved and called eagerly first, then inside two CUDA graphs captured as a serving engine captures them (one per batch size, on
torch.cuda.graph's shared capture stream, from one memory pool an earlier graph has dirtied),
replayed in the reverse order of capture.

Run by tests/test_splitk.py in its own process: a stale semaphore traps and loses the CUDA
context, which must cost this probe only. Prints one JSON line: whether each replay matched the
eager output bit for bit, whether the workspaces ended zero, and (to tell a pass from a
scenario not reached) the non-zero bytes each workspace held before the first replay.

    python tests/data/splitk_graph_replay.py
"""
from __future__ import annotations

import json

import torch

from cudal2.core.abi import load_library
from cudal2.core.build import BuildSpec, build
from cudal2.runtime import hot, resolve
from cudal2.templates import FAMILIES

CFG = FAMILIES["mma"].default().with_(SPLITK=3)     # tests/test_splitk.py's GPU_CASES[2] (RR)
SHAPES = ((64, 256, 4096), (128, 256, 4096))       # two "batch sizes", one graph each


def call(a, b, c) -> None:
    """What cudal2.matmul does for a served shape; the kernel must launch (a None would mean
    torch served the call and the probe tested nothing)."""
    assert hot.launch(a, b, c) is c, "the hot path handed the call to torch"


def buffers() -> list:
    """Every workspace the runtime holds: the eager streams' and each captured graph's."""
    ws = resolve.workspaces
    return list(ws._bufs.values()) + [b for g in list(ws._graph_bufs.values()) for b in g.values()]


def dirty_pool(pool) -> None:
    """A first graph in the shared pool fills a workspace-sized block with non-zero bytes and
    frees it, as a serving engine's earlier graphs leave their activations: a buffer a later
    capture takes from the pool holds them unless something zeroes it when it is used."""
    g0, nbytes = torch.cuda.CUDAGraph(), 1 << 20   # Workspaces' smallest buffer
    with torch.cuda.graph(g0, pool=pool):
        junk = torch.full((nbytes,), 0x01, dtype=torch.uint8, device="cuda")
    g0.replay()
    torch.cuda.synchronize()
    del junk


def main() -> dict:
    # built without the cluster reduction: on sm_90a 3 splits would reduce inside a cluster and
    # never touch the workspace whose graph hazard this probe sets up
    spec = FAMILIES[CFG.family].build_spec(CFG, "sm_90a")
    spec = BuildSpec("#define CUDAL2_CLUSTER_SPLITK 0\n" + spec.source, arch=spec.arch,
                     name=spec.name + "-global")
    lib = load_library(build(spec).so_path)
    for M, N, K in SHAPES:
        resolve.serve_kernel(lib, M, N, K, "RR", dev=0)
    torch.manual_seed(0)
    ops = [(torch.randn(M, K, device="cuda", dtype=torch.float16),
            torch.randn(K, N, device="cuda", dtype=torch.float16)) for M, N, K in SHAPES]
    eager = []
    for a, b in ops:                                 # resolved and served eagerly first
        c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float16)
        call(a, b, c)
        eager.append(c)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()            # one pool for every graph (vLLM, SGLang)
    dirty_pool(pool)
    graphs, outs = [], []
    for a, b in ops:
        c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            call(a, b, c)
        graphs.append(g)
        outs.append(c)
    torch.cuda.synchronize()
    verdict = {"shapes": SHAPES, "splitk": CFG.get("SPLITK"), "workspaces": len(buffers()),
               "graph_workspaces": len(resolve.workspaces._graph_bufs),
               # whether the scenario was reached: non-zero workspace bytes before any replay
               "nonzero_before_replay": [int(b.count_nonzero()) for b in buffers()]}
    for name, order in (("reverse", (1, 0)), ("forward", (0, 1))):
        for i in order:
            outs[i].zero_()
            graphs[i].replay()
        torch.cuda.synchronize()
        verdict[name] = [bool(torch.equal(outs[i], eager[i])) for i in range(len(SHAPES))]
    verdict["workspaces_zero"] = [int(buf.count_nonzero()) == 0 for buf in buffers()]
    return verdict


if __name__ == "__main__":
    print(json.dumps(main()))
