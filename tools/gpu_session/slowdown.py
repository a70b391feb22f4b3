"""How much slower this machine runs the kit's CPU work now than the idle 2-core machine the
rehearsal's floors were set on: the median of three Python starts that import torch (what every
pytest group, GPU worker and campaign run begins with), over REFERENCE_S, never below 1.

    python tools/gpu_session/slowdown.py        # prints the factor, e.g. 1.0 idle, ~2 loaded
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

# the median start measured on the idle 2-core CPU machine (no other process running),
# 2026-12-07: `python tools/gpu_session/slowdown.py --seconds`
REFERENCE_S = 0.98
RUNS = 3


def start_seconds(runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.monotonic() - t)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    seconds = start_seconds()
    print(f"{seconds:.2f}" if "--seconds" in argv else f"{max(1.0, seconds / REFERENCE_S):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
