"""How well the cost model explains measured campaigns: the analytic prior's Spearman and
log-RMSE on every measured candidate row, its mean predicted/measured ratio on the >= 1e12-FLOP
rows, and the fitted model's held-out Spearman (70/30 split of the shapes, three seeds).

    python scripts/costmodel_check.py [results.db ...]   (default: every reports/<gpu>/**/results.db)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from cudal2.costmodel import CostModel, held_out_rank_correlation, samples_from_evaluations, spearman
from cudal2.harness.db import ResultsDB


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1] / "reports"
    dbs = [Path(a) for a in argv] or sorted(p for p in root.glob("*/**/results.db")
                                            if p.relative_to(root).parts[0] != "cpu")
    rows = [ev for p in dbs for ev in ResultsDB(p).rows() if ev.status == "ok" and not ev.estimated]
    print(f"{len(rows)} measured rows from {len(dbs)} DB(s)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
