"""Per target shape of the 2026-11-26 campaigns: the best finalist's family and kernel time, the
fastest of the five baselines, and the export rule's interval against it (cudal2.runs.export.verdict,
the lowest interval over the baselines timed in the same session); for decode rows (RC, M <= 64)
the bandwidth of the large operand (B: N x K fp16) at our and at the fastest baseline's time.

    python reports/NVIDIA_H200/targets_table.py > reports/NVIDIA_H200/2026-11-26-targets.md
"""
from __future__ import annotations

import json
from pathlib import Path

from cudal2.harness.db import ResultsDB
from cudal2.runs.export import lowest_interval, verdict

HERE = Path(__file__).parent
CALLS = {"RR": HERE / "2026-11-26-campaign-rr-call1", "RC": HERE / "2026-11-26-campaign-rc-call1"}
BASELINES = ("torch", "cublas_nn", "cublas_tn", "cublaslt_heuristic", "cublaslt_autotuned")


def weight_gbs(N: int, K: int, us: float) -> float:
    """GB/s of reading the N x K fp16 weight once in `us` microseconds."""
    return 2 * N * K / us / 1e3


def families(call: Path) -> dict[str, str]:
    """source sha -> family, from the pack manifest the campaign wrote beside its reports."""
    man = next(call.rglob("pack_manifest.json"), None)
    if man is None:
        return {}
    return {c["sha"]: c["family"] for c in json.loads(man.read_text())["candidates"]}


def rows(layout: str, call: Path, fam: dict[str, str]):
    db = next(call.rglob("results.db.gz"))
    best = {}
    for ev in ResultsDB(db, readonly=True).rows():
        if ev.stage != "final" or ev.status != "ok" or "offline" not in (ev.timings or {}):
            continue
        key = (ev.shape.M, ev.shape.N, ev.shape.K)
        us = ev.timings["offline"]["candidate"]["median_us"]
        if key not in best or us < best[key][1]:
            best[key] = (ev, us)
    for (M, N, K), (ev, us) in best.items():
        base = {b: ev.timings["offline"][b]["median_us"] for b in BASELINES if b in ev.timings["offline"]}
        fastest = min(base, key=base.get)
        lo_b, iv = lowest_interval(ev)
        decode = layout == "RC" and M <= 64
        yield dict(layout=layout, shape=f"{M}x{N}x{K}", flop=2 * M * N * K,
                   family=fam.get(ev.source_sha, ev.source_sha[:12]), us=us, fastest=fastest,
                   fastest_us=base[fastest], vs=lo_b, median=iv["median"], lo=iv["lo"], hi=iv["hi"],
                   ours_gbs=weight_gbs(N, K, us) if decode else None,
                   base_gbs=weight_gbs(N, K, base[fastest]) if decode else None,
                   export=verdict(ev)[0])


def main() -> None:
    out = []
    for layout, call in CALLS.items():
        out += sorted(rows(layout, call, families(call)), key=lambda r: r["flop"])
    print("| layout | shape | best family | ours (us) | fastest baseline (us) | vs the lowest interval: median [lo, hi] | B GB/s ours / baseline | exported |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in out:
        bw = f"{r['ours_gbs']:.0f} / {r['base_gbs']:.0f}" if r["ours_gbs"] else ""
        print(f"| {r['layout']} | {r['shape']} | {r['family']} | {r['us']:.2f} | {r['fastest']} {r['fastest_us']:.2f} "
              f"| {r['vs']} {r['median']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | {bw} | {'yes' if r['export'] else 'no'} |")
    fams = {}
    for r in out:
        fams.setdefault(r["family"], []).append(r["median"])
    print("\nShapes won in finals per family (best finalist of the shape): "
          + ", ".join(f"{f} {len(v)}" for f, v in sorted(fams.items(), key=lambda x: -len(x[1]))))


if __name__ == "__main__":
    main()
