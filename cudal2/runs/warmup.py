"""`cudal2 warmup`: build every kernel the table serves on this GPU (or `--arch`) into the build
cache, so that no call builds one; one line per kernel: built, cached, carried or failed, or
refused (its rows did not pass this cudal2's audit: `cudal2 reaudit`)
(cudal2.runtime.warmup does the work; `cudal2.warmup()` is the same in a running process)."""
from __future__ import annotations

import argparse
import sys

from cudal2.core.toolchain import ToolchainError


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None,
                        help="sm_80 | sm_86 | sm_89 | sm_90a (default: CUDAL2_ARCH, else the visible GPU's)")
    parser.add_argument("--gpu", default=None,
                        help="only the rows this GPU model is served (default: the visible GPU; "
                             "without one, every GPU model's rows of the arch)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="parallel nvcc processes (default: CUDAL2_BUILD_JOBS, else the CPU count)")


def run_cli(args: argparse.Namespace) -> int:
    from cudal2.runtime.warmup import FAILED, REFUSED, warmup   # torch: here, so --help stays light
    try:
        done = warmup(args.arch, args.gpu, jobs=args.jobs, progress=lambda r: print(
            f"  {r.name}: {r.status}{' (cached)' if r.cached else f' {r.seconds:.1f} s'}",
            file=sys.stderr, flush=True))
    except (ToolchainError, ValueError) as exc:
        print(f"cudal2 warmup: {exc}", file=sys.stderr)
        return 2
    for w in done:
        extra = f" (+{w.rows - 1} rows)" if w.rows > 1 else ""
        print(f"{w.status:<8} {w.row.file} [{w.table}]{extra}" + (f": {w.detail}" if w.detail else ""))
    failed = sum(w.status == FAILED for w in done)
    counts = {s: sum(w.status == s for w in done) for s in ("built", "cached", "carried", FAILED, REFUSED)}
    print(f"{len(done)} kernels: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if failed else 0
