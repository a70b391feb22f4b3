"""A split-K kernel called the way cudal2.runtime calls it (loader.Workspaces + launcher), inside
two CUDA graphs captured as a serving engine captures them (one per batch size, on
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
from cudal2.core.build import build
from cudal2.runtime.loader import Workspaces, launcher
from cudal2.templates import FAMILIES

CFG = FAMILIES["mma"].default().with_(SPLITK=3)     # tests/test_splitk.py's GPU_CASES[2] (RR)
SHAPES = ((64, 256, 4096), (128, 256, 4096))       # two "batch sizes", one graph each
workspaces = Workspaces()


def call(lib, a, b, c) -> None:
    """resolve._nearest's launch: the workspace of the current stream, zeroed when first asked."""
    (M, K), N = a.shape, b.shape[1]
    _, ws_bytes, _, opts, zero = launcher(lib, M, N, K)
    stream = torch.cuda.current_stream().cuda_stream
    ws = workspaces.get(0, stream, ws_bytes, zero) if ws_bytes else 0
    rc = lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, N, N, ws, ws_bytes,
                    stream, opts)
    assert rc == 0, f"launch returned cudaError {rc}"


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
    lib = load_library(build(FAMILIES[CFG.family].build_spec(CFG, "sm_90a")).so_path)
    torch.manual_seed(0)
    ops = [(torch.randn(M, K, device="cuda", dtype=torch.float16),
            torch.randn(K, N, device="cuda", dtype=torch.float16)) for M, N, K in SHAPES]
    eager = []
    for a, b in ops:                                 # resolved and served eagerly first
        c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float16)
        call(lib, a, b, c)
        eager.append(c)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()            # one pool for every graph (vLLM, SGLang)
    dirty_pool(pool)
    graphs, outs = [], []
    for a, b in ops:
        c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            call(lib, a, b, c)
        graphs.append(g)
        outs.append(c)
    torch.cuda.synchronize()
    verdict = {"shapes": SHAPES, "splitk": CFG.get("SPLITK"), "workspaces": len(workspaces._bufs),
               # whether the scenario was reached: non-zero workspace bytes before any replay
               "nonzero_before_replay": [int(b.count_nonzero()) for b in workspaces._bufs.values()]}
    for name, order in (("reverse", (1, 0)), ("forward", (0, 1))):
        for i in order:
            outs[i].zero_()
            graphs[i].replay()
        torch.cuda.synchronize()
        verdict[name] = [bool(torch.equal(outs[i], eager[i])) for i in range(len(SHAPES))]
    verdict["workspaces_zero"] = [int(buf.count_nonzero()) == 0 for buf in workspaces._bufs.values()]
    return verdict


if __name__ == "__main__":
    print(json.dumps(main()))
