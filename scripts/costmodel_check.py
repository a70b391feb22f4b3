"""How well the cost model explains measured campaigns: the analytic prior's Spearman and
log-RMSE on every measured candidate row, its mean predicted/measured ratio on the >= 1e12-FLOP
rows, the fitted model's held-out Spearman (70/30 split of the shapes, three seeds), and
the achieved TFLOP/s of candidates and cuBLASLt autotuned on the >= 5e11-FLOP rows.

    python scripts/costmodel_check.py [results.db ...]   (default: every reports/<gpu>/**/results.db[.gz])
    python scripts/costmodel_check.py --sweep-mem-exposed [results.db ...]
        the prior's log-RMSE on the >= 1e11-FLOP offline rows for MEM_EXPOSED 0 .. 1 (how 0.6 was chosen)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from cudal2.search.costmodel import CostModel, held_out_rank_correlation, samples_from_evaluations, spearman
from cudal2.harness.db import ResultsDB


def sweep_mem_exposed(rows) -> None:
    import cudal2.search.costmodel as cm
    s = [x for x in samples_from_evaluations(rows, mode="offline")
         if x.who == "candidate" and 2 * math.prod(x.shape) >= 1e11]
    meas = np.array([x.median_us for x in s])
    keep = cm.MEM_EXPOSED
    try:
        for value in (0.0, 0.25, 0.5, 0.6, 0.75, 1.0):
            cm.MEM_EXPOSED = value
            pred = np.array([CostModel.default(x.gpu).predict_us(x.meta, x.resources, x.shape) for x in s])
            r = np.log(pred / meas)
            print(f"MEM_EXPOSED {value:.2f}: {len(s)} rows >= 1e11 FLOP, log-RMSE {np.sqrt(np.mean(r ** 2)):.3f}, "
                  f"predicted/measured {math.exp(np.mean(r)):.2f}")
    finally:
        cm.MEM_EXPOSED = keep


def main(argv: list[str]) -> int:
    sweep = "--sweep-mem-exposed" in argv
    argv = [a for a in argv if a != "--sweep-mem-exposed"]
    root = Path(__file__).resolve().parents[1] / "reports"
    dbs = [Path(a) for a in argv] or sorted(p for pat in ("*/**/results.db", "*/**/results.db.gz")
                                            for p in root.glob(pat) if p.relative_to(root).parts[0] != "cpu")
    rows = [ev for p in dbs for ev in ResultsDB(p, readonly=True).rows() if ev.status == "ok" and not ev.estimated]
    print(f"{len(rows)} measured rows from {len(dbs)} DB(s)")
    if sweep:
        sweep_mem_exposed(rows)
        return 0
    for mode in ("offline", "server"):
        s = [x for x in samples_from_evaluations(rows, mode=mode) if x.who == "candidate"]
        if not s:
            continue
        pred = np.array([CostModel.default(x.gpu).predict_us(x.meta, x.resources, x.shape) for x in s])
        meas = np.array([x.median_us for x in s])
        r = np.log(pred / meas)
        big = np.array([2 * math.prod(x.shape) >= 1e12 for x in s])
        held = [held_out_rank_correlation(rows, mode=mode, seed=k) for k in (0, 1, 2)]
        print(f"{mode}: prior on {len(s)} rows: Spearman {spearman(pred, meas):.3f}, log-RMSE "
              f"{np.sqrt(np.mean(r ** 2)):.3f}; >= 1e12 FLOP ({big.sum()} rows): predicted/measured "
              f"{math.exp(np.mean(r[big])) if big.any() else float('nan'):.2f} (geometric mean)")
        print(f"  held-out Spearman, fit / prior, seeds 0-2: "
              + ", ".join(f"{h['spearman']:.3f} / {h['spearman_prior']:.3f}" for h in held))
        # achieved throughput of the larger rows: candidates vs cuBLASLt autotuned, same runs
        for who in ("candidate", "cublaslt_autotuned"):
            tf = [2 * math.prod(x.shape) / x.median_us / 1e6 for x in samples_from_evaluations(rows, mode=mode)
                  if x.who == who and 2 * math.prod(x.shape) >= 5e11]
            if tf:
                print(f"  {who}: {len(tf)} rows >= 5e11 FLOP at {min(tf):.0f}-{max(tf):.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
