"""The verdict call's canary: one GPU worker, started as every screening and final starts it
(cudal2.harness.pipeline.gpu_pool: the call guard preloaded unless CUDAL2_CALL_GUARD=0), screens
one trivial kernel (tests/data/hostile/control_ok.cu, built from the carried cache) on 64x64x64.
Exit 0 when it came back ok (or not_measured without a GPU), 1 otherwise, with the row's verdict.

    python tools/gpu_session/canary.py [--arch sm_90a]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    from cudal2.core.build import BuildSpec, build
    from cudal2.harness.pipeline import ScreenCandidate, screen
    from cudal2.harness.types import NOT_MEASURED, OK, Shape

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args(argv)
    src = (REPO / "tests" / "data" / "hostile" / "control_ok.cu").read_text()
    built = build(BuildSpec(src, args.arch, name="canary"))
    if not built.ok:
        print(f"canary: control_ok.cu did not build ({built.status}): {built.log[-500:]}")
        return 1
    (row,), _ = screen(Shape(64, 64, 64), [ScreenCandidate(src, built, (), "canary")], arch=args.arch,
                       timeout_s=60.0)
    guard = (row.audit or {}).get("call_guard")
    print(f"canary: {row.status} {row.detail[:300]} (call guard: {guard if guard is not None else 'not reported'})")
    return 0 if row.status in (OK, NOT_MEASURED) else 1


if __name__ == "__main__":
    sys.exit(main())
