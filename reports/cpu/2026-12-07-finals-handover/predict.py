"""The H200 finals throughput predicted once a finals worker is kept (issue 66 point 7), from the
committed account of 2026-11-26 (reports/NVIDIA_H200/2026-11-26-campaign-{rr,rc}-call1): per
finals session its measured phases (the DB rows' env.phases_s) and its wall time outside them
(the log's per-shape seconds less the shape's share of screening, its phases and the average
shape set-up), then finals per minute for a kept worker:

    60 * finals / (phases + sessions * (x + h))

h: the hand-over a session keeps with a kept worker (the worker's exchange, the parent's
bookkeeping): measured on the fake device (--handover-s). x: in-worker work the phases of
2026-11-26 did not cover (loading, torch's and cuBLAS's first calls, references then inside
correctness, the rest of measure_group; phases of their own since 12b401a), unknown: from 0 to
the floor, the outside time of the sessions that waited for no boot (the worker's exit is in it
too). Not measured: no GPU.

    python reports/cpu/2026-12-07-finals-handover/predict.py [--handover-s 0.02]
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from cudal2.harness.db import ResultsDB  # noqa: E402

CALLS = {"RR": "2026-11-26-campaign-rr-call1/reports/NVIDIA_H200/2026-11-26-0902-campaign",
         "RC": "2026-11-26-campaign-rc-call1/reports/NVIDIA_H200/2026-11-26-0905-campaign"}
WAITED = 1.0          # a session this far over the floor waited for a spare's boot


def sessions(tag: str) -> list[dict]:
    """Per finals session (one per shape): finalists, measured phases, outside time."""
    d = ROOT / "reports/NVIDIA_H200" / CALLS[tag]
    log = (d.parents[2] / "log.txt").read_text()
    walls = {tuple(map(int, m.groups()[:3])): float(m.group(4)) for m in
             re.finditer(r"^\s+(\d+)x(\d+)x(\d+) .*\((\d+\.\d) s\)$", log, re.M)}
    summ = json.loads((d / "summary.json").read_text())
    scr, fin = summ["throughput"]["screen all"], summ["throughput"]["final all"]
    with ResultsDB(d / "results.db.gz", readonly=True) as db:
        rows = db.rows()
    n_scr: dict = {}
    by_shape: dict = {}
    for ev in rows:
        k = (ev.shape.M, ev.shape.N, ev.shape.K)
        if ev.stage == "final":
            by_shape.setdefault(k, []).append(ev)
        else:
            n_scr[k] = n_scr.get(k, 0) + 1
    setup = (sum(walls.values()) - scr["seconds"] - fin["seconds"]) / len(walls)
    out = []
    for k, evs in by_shape.items():
        phases = sum(evs[0].env["phases_s"].values())
        outside = walls[k] - n_scr[k] * scr["seconds"] / scr["n"] - phases - setup
        out.append({"shape": k, "finalists": len(evs), "phases": phases, "outside": outside})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--handover-s", type=float, default=0.02,
                    help="hand-over a session keeps with a kept worker (the fake device's)")
    h = ap.parse_args().handover_s
    ss = [s for tag in CALLS for s in sessions(tag)]
    n, fin = len(ss), sum(s["finalists"] for s in ss)
    phases, outside = sum(s["phases"] for s in ss), sum(s["outside"] for s in ss)
    floor = statistics.median(sorted(s["outside"] for s in ss)[:max(1, n // 5)])
    waited = sum(1 for s in ss if s["outside"] > floor + WAITED)
    print(f"H200 2026-11-26: {n} sessions, {fin} finals; phases {phases:.1f} s "
          f"({phases / fin:.3f} s a final), outside them {outside:.1f} s ({outside / n:.2f} s a session); "
          f"now {60 * fin / (phases + outside):.1f} finals per minute")
    print(f"  floor (median of the fastest fifth's outside time, no boot waited): {floor:.2f} s a session; "
          f"{waited} sessions over it by more than {WAITED:.0f} s (a spare's boot waited for)")
    for x in (0.0, floor / 2, floor):
        per = (phases + n * (x + h)) / fin
        print(f"  kept worker, x = {x:.2f} s, h = {h:.2f} s a session: {per:.3f} s a final, "
              f"{60 / per:.1f} finals per minute (predicted, not measured: no GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
