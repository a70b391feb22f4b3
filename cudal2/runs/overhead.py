"""Host cost per call of each matmul path, against torch.matmul.

Paths: torch.matmul, cudal2.matmul (the eager hot path), the cudal2::hgemm torch.library op
(what torch.compile and autograd use), and cudal2.matmul with CUDAL2_DISABLE=1.

What is timed is the Python call only: a batch of calls between two host clock reads. On CUDA
the GPU is synchronised before and after each batch, outside the clock, so GPU execution and
busy-waiting are not in the number (a batch is short enough never to fill the launch queue).
Paths are interleaved batch by batch so clock drift hits all alike; median and p10/p90 of the
per-call time over the batches are reported.

    python -m cudal2.runs.overhead                      # CPU, and CUDA when a GPU is visible
    python -m cudal2.runs.overhead --device cuda --shape 64 64 64 --json overhead.json
    cudal2 bench --overhead ...                    # the same
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# The runtime (cudal2.runtime.matmul, op, resolve) is imported in the functions that call it: it
# loads torch, which `cudal2 bench --overhead --help` must not wait for.

PATHS = ("torch.matmul", "cudal2.matmul", "cudal2::hgemm op", "CUDAL2_DISABLE=1")
DEFAULT_SHAPES = {"cpu": [(16, 16, 16)], "cuda": [(64, 64, 64), (128, 4096, 4096)]}


def _inputs(device: str, shape, dtype):
    import torch
    M, N, K = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(K, N, generator=g).to(device=device, dtype=dtype)
    return a, b


def _callables(a, b):
    import torch

    from cudal2.runtime.matmul import matmul
    from cudal2.runtime.op import OP

    mm, cm, op = torch.matmul, matmul, OP
    return {
        "torch.matmul": lambda: mm(a, b),
        "cudal2.matmul": lambda: cm(a, b),
        "cudal2::hgemm op": lambda: op(a, b),
        "CUDAL2_DISABLE=1": lambda: cm(a, b),
    }


def served_by(a, b) -> str:
    """Which path cudal2.matmul took for these operands after a first call: kernel or torch."""
    from cudal2.runtime.resolve import TORCH, serving
    if not a.is_cuda:
        return "torch (CPU)"
    for layout, ldb_ok in (("RR", b.stride(1) == 1), ("RC", b.stride(0) == 1)):
        if ldb_ok:
            hit = serving.get((a.get_device(), a.shape[0], b.shape[1], a.shape[1], layout))
            if hit is None:
                continue
            return "torch (no kernel serves)" if hit is TORCH else "kernel"
    return "torch (not eligible)"


def measure(device: str = "cpu", shape=(16, 16, 16), dtype=None, calls: int = 200,
            repeats: int = 25) -> dict:
    """Per-call host time (us) of each path on one shape; returns a JSON-able dict."""
    import torch
    if dtype is None:
        dtype = torch.float16 if device == "cuda" else torch.float32
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA GPU visible (torch.cuda.is_available() is False)")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    a, b = _inputs(device, shape, dtype)
    fns = _callables(a, b)
    old = os.environ.get("CUDAL2_DISABLE")

    def set_disabled(on: bool):
        if on:
            os.environ["CUDAL2_DISABLE"] = "1"
        elif old is None:
            os.environ.pop("CUDAL2_DISABLE", None)
        else:
            os.environ["CUDAL2_DISABLE"] = old

    samples = {p: [] for p in PATHS}
    try:
        set_disabled(False)
        with torch.no_grad():
            for p in PATHS:  # warm-up: first-call resolution, races and builds happen here
                set_disabled(p == "CUDAL2_DISABLE=1")
                for _ in range(3):
                    fns[p]()
            set_disabled(False)
            route = served_by(a, b)
            for _ in range(repeats):
                for p in PATHS:
                    set_disabled(p == "CUDAL2_DISABLE=1")
                    fn = fns[p]
                    sync()
                    t0 = time.perf_counter_ns()
                    for _ in range(calls):
                        fn()
                    t1 = time.perf_counter_ns()
                    sync()
                    samples[p].append((t1 - t0) / calls / 1000.0)
    finally:
        set_disabled(False)
    ref = statistics.median(samples["torch.matmul"])
    rows = []
    for p in PATHS:
        s = sorted(samples[p])
        med = statistics.median(s)
        rows.append({"path": p, "median_us": med, "p10_us": s[len(s) // 10],
                     "p90_us": s[min(len(s) - 1, (9 * len(s)) // 10)], "n": len(s),
                     "delta_us": med - ref, "ratio": med / ref if ref > 0 else float("nan")})
    M, N, K = shape
    return {"device": device, "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "shape": [M, N, K], "dtype": str(dtype).replace("torch.", ""), "served_by": route,
            "calls_per_batch": calls, "torch": torch.__version__, "rows": rows}


def format_table(results: list[dict]) -> str:
    lines = []
    for r in results:
        M, N, K = r["shape"]
        lines.append(f"{r['device']} ({r['device_name']}) {M}x{N}x{K} {r['dtype']}: cudal2.matmul "
                     f"served by {r['served_by']}; host time per call (us), median of {r['rows'][0]['n']} batches of {r['calls_per_batch']} calls")
        lines.append(f"  {'path':<20} {'median us':>10} {'p10':>8} {'p90':>8} {'vs torch':>10}")
        for row in r["rows"]:
            lines.append(f"  {row['path']:<20} {row['median_us']:>10.2f} {row['p10_us']:>8.2f} "
                         f"{row['p90_us']:>8.2f} {row['delta_us']:>+10.2f}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def run(devices=None, shapes=None, calls: int = 200, repeats: int = 25) -> list[dict]:
    import torch
    if devices is None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = []
    for dev in devices:
        for shape in (shapes or DEFAULT_SHAPES[dev]):
            out.append(measure(dev, tuple(shape), calls=calls, repeats=repeats))
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="which path to time; 'all' = CPU, plus CUDA when a GPU is visible")
    parser.add_argument("--shape", nargs=3, type=int, action="append", metavar=("M", "N", "K"),
                        help="shape(s) to time (default: 16^3 on CPU; 64^3 and 128x4096x4096 on CUDA)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=25, help="timed batches per path")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")


def run_cli(args) -> int:
    import torch
    if args.device == "all":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    else:
        devices = [args.device]
    if args.calls < 1 or args.repeats < 1:
        print("cudal2 overhead: --calls and --repeats must be >= 1", file=sys.stderr)
        return 2
    if "cuda" in devices and not torch.cuda.is_available():
        print("cudal2 overhead: --device cuda needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    print(f"timing host cost per call of {', '.join(PATHS)} on {', '.join(devices)} "
          f"({args.repeats} batches x {args.calls} calls per path)", flush=True)
    results = run(devices, args.shape, calls=args.calls, repeats=args.repeats)
    print(format_table(results), end="")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudal2.runs.overhead", description=__doc__.split("\n")[0])
    configure_parser(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
