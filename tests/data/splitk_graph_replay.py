"""A split-K kernel called the way cudal2.runtime calls it (loader.Workspaces + launcher), inside
two CUDA graphs captured as a serving engine captures them (one per batch size, both through
torch.cuda.graph's shared capture stream), replayed in the reverse order of capture.

Run by tests/test_splitk.py in its own process: a stale semaphore traps and loses the CUDA
context, which must cost this probe only. Prints one JSON line: whether each replay matched the
eager output bit for bit, and whether the workspace ended zero.

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


def poison_free_memory() -> None:
    """Leave non-zero bytes in memory the driver hands out next (as a serving process's earlier
    tensors would): a buffer that is not zeroed when used then shows it."""
    junk = torch.full((256 << 20,), 0x01, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del junk
    torch.cuda.empty_cache()


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
    poison_free_memory()
    graphs, outs = [], []
    for a, b in ops:
        c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call(lib, a, b, c)
        graphs.append(g)
        outs.append(c)
    verdict = {"shapes": SHAPES, "splitk": CFG.get("SPLITK"),
               "capture_streams": len({k[1] for k in workspaces._bufs})}
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
