"""Host cost of cudal2.matmul's eager kernel path, measured without a GPU.

The kernel path only runs on CUDA tensors, so on a CPU machine this script drives it with
stand-ins: CPU fp16 tensors (their attribute reads cost what a CUDA tensor's do), a serving-table
entry for the shape made by dispatch from a stub kernel library (the ABI's two symbols in C,
compiled here with the system C compiler, loaded by cudal2.core.abi; cudal2_hgemm returns 0), device -1 (what a CPU tensor's get_device() returns) and stream 0. What it cannot see:
cudaLaunchKernel inside the real kernel (torch.matmul pays the same for its cuBLAS launch) and
the CUDA caching allocator (torch.matmul allocates its output too).

It prints, per call (median of batches): the whole simulated path, and its pieces one by one,
next to torch.matmul on the same CPU tensors and a bare Python call of a no-op, so the numbers can
be read against each other on any machine.

    python benchmarks/eager_path_cpu.py [--calls 2000] [--repeats 25]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cudal2.runtime import hot, loader, matmul, resolve
from cudal2.core import abi

_STUB = r"""
#include <stddef.h>
const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [1, 1, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb,
                 int ldc, void* ws, size_t ws_bytes, void* stream) { return 0; }
"""


def stub_library(workdir: Path) -> abi.KernelLibrary:
    """A kernel library honouring the ABI whose cudal2_hgemm does nothing."""
    src, so = workdir / "stub.c", workdir / "stub.so"
    src.write_text(_STUB)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return abi.KernelLibrary(so)


def per_call_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1000.0)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--shape", nargs=3, type=int, default=(64, 64, 64), metavar=("M", "N", "K"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    M, N, K = args.shape
    a = torch.randn(M, K).half()
    b = torch.randn(K, N).half()
    with tempfile.TemporaryDirectory() as tmp:
        lib = stub_library(Path(tmp))
        resolve.reset()
        hot._init_cuda_fns()
        # Stand-ins for the CUDA-only pieces: the current device is the CPU tensors' "device"
        # (-1), the current stream is 0, and the shape is served by the stub.
        hot._cur_device = lambda: -1
        hot._raw_stream = lambda dev: 0
        resolve.serving[(-1, M, N, K, "RR")] = served = loader.launcher(lib, M, N, K)
        plain, cuda_matmul = matmul._PLAIN, matmul._cuda_matmul

        def path(a, b):  # cudal2.matmul's first line with is_cuda -> is_cpu, then its body
            if type(a) in plain and type(b) in plain and a.is_cpu:
                return cuda_matmul(a, b, None)
            return None

        assert path(a, b) is not None and path(a, b).shape == (M, N), "stub path not taken"
        pa, pb, pc = a.data_ptr(), b.data_ptr(), a.data_ptr()
        raw, _, ws_c, _ = served
        vp, null = ctypes.c_void_p, hot._NULL
        mm = torch.matmul
        with torch.no_grad():
            pieces = {
                "torch.matmul (CPU, computes)": lambda: mm(a, b),
                "cudal2 eager path (simulated)": lambda: path(a, b),
                "  a.new_empty(M, N)": lambda: a.new_empty(M, N),
                "  ctypes call of the stub": lambda: raw(vp(pa), vp(pb), vp(pc), M, N, K, K, N, N,
                                                         null, ws_c, null),
                "  (with argtypes, int args)": lambda: lib._hgemm(pa, pb, pc, M, N, K, K, N, N, 0, 0, 0),
                "  Python call of a no-op": lambda: None,
            }
            per_call_us(pieces["cudal2 eager path (simulated)"], args.calls, 3)  # warm-up
            res = {name: per_call_us(f, args.calls, args.repeats) for name, f in pieces.items()}
    resolve.reset()
    whole = res["cudal2 eager path (simulated)"]
    rest = whole - res["  a.new_empty(M, N)"] - res["  ctypes call of the stub"]
    print(f"host time per call, {M}x{N}x{K} fp16, median of {args.repeats} batches of "
          f"{args.calls} calls (torch {torch.__version__}, {torch.get_num_threads()} thread)")
    for name, us in res.items():
        print(f"  {name:<32} {us:8.3f} us")
    print(f"  {'checks + lookup (path - alloc - call)':<32} {rest:8.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
