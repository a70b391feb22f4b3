"""The verdict call's shape lists, in the order they are worth measuring:
  RR: the shapes the low-latency and deep-K families target (every shape under 1e9 FLOP of
      shapes/stratified_100.csv, the deep-K shapes DEEP_K), then the rest of the stratified 100
      that no committed results DB measured by kernel time, by expected gain (cudal2.runs.coverage);
  RC: the decode rows (M <= 64) of shapes/llm_trace.csv, and NARROW_N rows only skinny_n serves.

    python tools/gpu_session/priority.py OUT_DIR [--rest N]   # writes priority_rr.csv, priority_rc.csv
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEEP_K = [(128, 64, 12288), (128, 128, 16384), (256, 128, 8192), (1024, 256, 16384), (128, 128, 2048)]
SMALL_FLOP = 1e9
DECODE_M = 64
NARROW_N = [(8192, 16, 4096), (4096, 64, 4096)]   # N <= 64 (LoRA down): the skinny_n mirror's shapes


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def rr_shapes(rest: int) -> list[tuple[int, int, int]]:
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.types import Shape
    from cudal2.runs.coverage import order_by_gain
    from cudal2.search.costmodel import CostModel
    strat = [(int(r["M"]), int(r["N"]), int(r["K"])) for r in _rows(REPO / "shapes" / "stratified_100.csv")]
    first = list(dict.fromkeys(DEEP_K + [s for s in strat if 2.0 * s[0] * s[1] * s[2] < SMALL_FLOP]))
    dbs = sorted(q for q in (REPO / "reports").rglob("results.db*") if q.name in ("results.db", "results.db.gz"))
    evs = [ev for p in dbs for ev in ResultsDB(p, readonly=True).rows()]
    others = [Shape(*s) for s in strat if s not in first]
    ranked = order_by_gain(others, evs, CostModel.default(arch="sm_90a"), layout="RR")
    return first + [(s.M, s.N, s.K) for s, _ in ranked[:rest]]


def rc_rows() -> list[dict]:
    rows = [r for r in _rows(REPO / "shapes" / "llm_trace.csv") if int(r["M"]) <= DECODE_M]
    seen, out = set(), []
    for r in rows:
        key = (r["M"], r["N"], r["K"])
        if key not in seen:
            seen.add(key)
            out.append(dict(r, layout="RC"))
    for M, N, K in NARROW_N:
        out.append({"M": M, "N": N, "K": K, "weight": 0, "model": "lora", "layer": f"down{N}",
                    "tokens": M, "layout": "RC"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--rest", type=int, default=20, help="unmeasured stratified shapes after the targets")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rr = rr_shapes(args.rest)
    with (out / "priority_rr.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["M", "N", "K"])
        w.writerows(rr)
    rc = rc_rows()
    with (out / "priority_rc.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rc[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rc)
    print(f"priority shapes: {len(rr)} RR ({out / 'priority_rr.csv'}), {len(rc)} RC ({out / 'priority_rc.csv'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
