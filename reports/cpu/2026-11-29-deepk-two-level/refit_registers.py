"""Least-squares fit of streamk's ptxas registers over a space build (the features of
cudal2.templates.streamk.streamk_register_estimate), and how often the fit and the current
estimate put a config at the wrong CTAs per SM on the H200.

    python reports/cpu/2026-11-29-deepk-two-level/refit_registers.py SPACE.csv.gz
"""
import csv
import gzip
import sys

import numpy as np

from cudal2.core.devices import GPUS
from cudal2.templates.budget import ctas_per_sm
from cudal2.templates.skinny import skinny_smem_bytes
from cudal2.templates.streamk import streamk_register_estimate

rows = [r for r in csv.DictReader(gzip.open(sys.argv[1], "rt")) if r["ok"] in ("True", "1", "true")]
print(f"{len(rows)} builds; spills > 0: {sum(int(r['spills'] or 0) > 0 for r in rows)}; "
      f"stack > 0: {sum(int(r['stack_bytes'] or 0) > 0 for r in rows)}")
X, y, ps = [], [], []
for r in rows:
    p = dict(kv.split("=") for kv in r["label"].split(":", 1)[1].split(","))
    p = {k: (int(v) if v.isdigit() else v) for k, v in p.items()}
    threads = 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
    acc = (p["WM"] // 16) * (p["WN"] // 8) * 4
    X.append([1.0, acc, p["BM"] * p["BK"] // 8 // threads, p["BN"] * p["BK"] // 8 // threads,
              p["STAGES"], float(p.get("LAYOUT") == "RC")])
    y.append(int(r["registers"]))
    ps.append((p, threads))
X, y = np.array(X), np.array(y, dtype=float)
coef, *_ = np.linalg.lstsq(X, y, rcond=None)
fit = X @ coef
print("fit: " + " + ".join(f"{c:.2f}*{n}" for c, n in
                          zip(coef, ("1", "acc", "a_chunks", "b_chunks", "STAGES", "RC"))))
res = y - fit
print(f"residuals (ptxas - fit): {res.min():.0f}..{res.max():.0f}, mean |{np.abs(res).mean():.1f}|")
cur = np.array([streamk_register_estimate(p) for p, _ in ps])
print(f"current estimate: residuals {(y - cur).min():.0f}..{(y - cur).max():.0f}, "
      f"mean |{np.abs(y - cur).mean():.1f}|")
gpu = GPUS["H200"]


def occ(p, threads, regs):
    return ctas_per_sm(threads, int(regs), skinny_smem_bytes(p), gpu)[0]


wrong_fit = sum(occ(p, t, min(255, round(f))) != occ(p, t, r) for (p, t), f, r in zip(ps, fit, y))
wrong_cur = sum(occ(p, t, c) != occ(p, t, r) for (p, t), c, r in zip(ps, cur, y))
print(f"wrong CTAs per SM on the H200: refit {wrong_fit}, current estimate {wrong_cur}")
