"""`cudal2 report --explain`: per shape, what we measured beside what we predicted and what the
physics allows, ranked by how far we are behind the fastest baseline (issue 53, item 3).

Per (M, N, K, layout) of a results DB's final rows (offline kernel time):
- ours: the best measured candidate (cudal2.runs.report.collect over the rows of that layout):
  family, config, source_sha[:12], runtime options, median us with the row's interval;
- the fastest of the five baselines timed in the same run (cudal2.harness.types.BASELINES), the
  time ratio ours / fastest (the gap: > 1 = we are slower) and the row's paired speedup
  (fastest / ours, median over rounds) with its interval;
- the cost model's prediction for our best (CostModel.default for the row's GPU, else its arch),
  from the kernel's meta and ptxas resources: the DB row's, else the pack manifest's entry (its
  family and params, its resources), else the source banner of the pack's kernel source
  (cudal2.templates.config_of); measured / predicted;
- the physics: fp16 bytes of A, B, C and the FLOP; for a decode row (bandwidth.is_decode) the
  GB/s on the large operand of ours and of the baseline (bandwidth.decode_figures) and their
  fraction of the streaming ceiling measured at the size nearest that operand (summary.json's
  "ceilings" through bandwidth.ceiling_at; else its one large-buffer "bandwidth" figure, said
  so); for a shape under 1e9 FLOP each time above the empty-kernel launch floor
  ("ceilings".launch_floor);
- the profile's figures (an optional profile CSV, PROFILE_COLUMNS) for ours and the baseline.
Ranked by the gap, worst first; a second ranking by |log(measured / predicted)|.

Every number comes from the files read; an unknown cell is empty in the CSV and says why on the
page. For a row our streaming family won, the streaming budget of that build at the shape
(cudal2.templates.budget, the build replayed as it ran: budget.as_built); the deep-K
budget of issue 51 is not built, and the page says so.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cudal2.core.devices import gpu_for
from cudal2.harness import bandwidth as bw, ncu
from cudal2.harness.db import DBError
from cudal2.harness.types import BASELINES, medians
from cudal2.runs.campaign import read_source, source_path
from cudal2.runs.report import BUCKETS, collect, fmt, geomean, origin_group, read_rows
from cudal2.search.costmodel import CostModel
from cudal2.templates.budget import BUDGETED, as_built, budget
from cudal2.templates.family import KernelConfig, config_of

MODE = "offline"
SMALL_FLOP = BUCKETS[0][0]                 # "a shape under 1e9 FLOP"
DEEP_K_RATIO = 8                           # a grouping label: K >= 8 x max(M, N), not decode
PROFILE_COLUMNS = ncu.COLUMNS               # the profile stage's CSV (cudal2.harness.ncu)
PROFILE_FIELDS = ("kernel", "launches", "duration_us", "dram_pct_peak", "occupancy_pct",
                  "registers", "smem_bytes", "grid", "block", "stalls", "note")
BUDGET_NOTE = ("The streaming budget (cudal2.templates.budget, issue 50: CTAs per SM, waves, bytes "
               "in flight per SM against the GPU's need, the reduction's bytes, its time) is given "
               "for rows our streaming families (skinny, skinny_n, gemv) won; the deep-K budget of "
               "issue 51 is not built, and no number stands in for it.")
BUDGET_FIELDS = ("budget_us", "budget_inflight_kib", "budget_needed_kib", "budget_waves",
                 "budget_last_wave_fill", "budget_reduction", "budget_reduction_bytes", "budget_note")


# ---- inputs ----------------------------------------------------------------------------------

def read_json(path, what: str) -> dict:
    """A JSON object from `path`; ValueError naming the file when it is missing or not one."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"{what} {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{what} {p}: not JSON ({exc})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{what} {p}: not a JSON object")
    return d


def read_profile(path) -> dict[tuple, list[dict]]:
    """(M, N, K, layout, who) -> the profile CSV's rows (ncu.read_csv: one per kernel launch)."""
    out: dict[tuple, list[dict]] = {}
    for rec in ncu.read_csv(path):
        key = (int(rec["M"]), int(rec["N"]), int(rec["K"]), rec["layout"], rec["who"])
        out.setdefault(key, []).append(rec)
    return out


def pack_candidates(manifest: dict | None) -> dict[str, dict]:
    """source sha -> the pack manifest's candidate entry."""
    return {c["sha"]: c for c in (manifest or {}).get("candidates") or [] if c.get("sha")}


# ---- the streaming ceiling and the launch floor ----------------------------------------------

@dataclass
class Ceilings:
    """What summary.json says about the device's own limits, and why a figure is missing."""
    stream: list = field(default_factory=list)      # "ceilings".stream_read entries, ascending
    large: dict | None = None                       # summary["bandwidth"]: one large-buffer figure
    floor: dict | None = None                       # "ceilings".launch_floor (measured)
    stream_why: str = ""
    floor_why: str = ""

    def line(self) -> str:
        if self.stream:
            sizes = ", ".join(f"{e['bytes'] / 2**20:.0f} MiB {e['gbs']:.0f} GB/s" for e in self.stream)
            return f"streaming ceiling by size (summary.json 'ceilings'): {sizes}"
        if self.large:
            return ("streaming ceiling: the large-buffer figure only (summary.json 'bandwidth', "
                    f"not the row's size): {bw.line(self.large)}")
        return f"streaming ceiling: none ({self.stream_why})"

    def floor_line(self) -> str:
        if not self.floor:
            return f"launch floor: none ({self.floor_why})"
        parts = [f"{k} {_us_iv(v)}" + (f" at {'x'.join(map(str, v['shape']))}" if v.get("shape") else "")
                 for k, v in self.floor.items() if isinstance(v, dict) and v.get("median")]
        return "launch floor (summary.json 'ceilings'): " + ", ".join(parts)


def _us_iv(d: dict) -> str:
    iv = f" [{d['lo']:.2f}, {d['hi']:.2f}]" if d.get("lo") is not None and d.get("hi") is not None else ""
    return f"{d['median']:.2f} us{iv}"


def ceilings_of(summary: dict | None) -> Ceilings:
    """Ceilings from summary.json ("ceilings", else the one "bandwidth" figure), with the reasons."""
    if summary is None:
        return Ceilings(stream_why="no --summary given", floor_why="no --summary given")
    c = summary.get("ceilings")
    if not isinstance(c, dict):
        why = "summary.json has no 'ceilings' (the call predates them)"
        large = summary.get("bandwidth")
        if isinstance(large, dict) and large.get("status") == "ok" and large.get("gbs"):
            return Ceilings(large=large, floor_why=why)
        bwhy = (f"its 'bandwidth' is {large.get('status')}: {large.get('detail', '')}"
                if isinstance(large, dict) else "nor 'bandwidth'")
        return Ceilings(stream_why=f"{why}, {bwhy}", floor_why=why)
    if c.get("fake_device"):
        why = "'ceilings' came from the fake device (a CPU rehearsal, not a measurement)"
        return Ceilings(stream_why=why, floor_why=why)
    if c.get("status") != "ok":
        why = f"'ceilings' status {c.get('status')}: {c.get('detail', '')}"
        return Ceilings(stream_why=why, floor_why=why)
    stream = sorted((e for e in c.get("stream_read") or [] if e.get("bytes") and e.get("gbs")),
                    key=lambda e: e["bytes"])
    lf = c.get("launch_floor")
    floor_ok = isinstance(lf, dict) and "status" not in lf and (lf.get("empty") or {}).get("median")
    floor_why = "" if floor_ok else (
        f"launch_floor {lf.get('status')}: {lf.get('detail', '')}" if isinstance(lf, dict)
        else "'ceilings' has no launch_floor")
    return Ceilings(stream=stream, floor=lf if floor_ok else None,
                    stream_why="" if stream else "'ceilings' has no stream_read sizes",
                    floor_why=floor_why)


# ---- one shape -------------------------------------------------------------------------------

def shape_class(M: int, N: int, K: int) -> str:
    """A grouping label for the page: decode (M <= 64), deep-K (K >= 8 x max(M, N)), small
    (< 1e9 FLOP), other."""
    if bw.is_decode(M, N, K):
        return "decode"
    if K >= DEEP_K_RATIO * max(M, N):
        return "deep-K"
    return "small" if 2.0 * M * N * K < SMALL_FLOP else "other"


def physics(M: int, N: int, K: int) -> dict:
    e = bw.ELEM_BYTES
    return {"flop": 2 * M * N * K, "a_bytes": e * M * K, "b_bytes": e * K * N, "c_bytes": e * M * N}


def best_evaluation(evs: list, layout: str, r, best):
    """The Evaluation behind collect's Best (same shape, layout, origin group, sha and median)."""
    for ev in evs:
        if (ev.layout == layout and (ev.shape.M, ev.shape.N, ev.shape.K) == r.shape
                and ev.source_sha == best.source_sha and origin_group(ev.origin) == best.origin
                and medians(ev, MODE).get("candidate") == best.median_us):
            return ev
    return None


def ours_cells(ev, best, cand: dict | None) -> dict:
    t = ((ev.timings or {}).get(MODE) or {}).get("candidate") or {}
    meta = ev.meta or {}
    family = meta.get("family") or (cand or {}).get("family") or ""
    params = meta.get("params") or dict((cand or {}).get("params") or [])
    config = (cand or {}).get("label") or (
        f"{family}:" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) if params else "")
    return {"ours_family": family, "ours_config": config, "ours_origin": ev.origin,
            "ours_sha": ev.source_sha[:12],
            "ours_options": ",".join(f"{k}={v}" for k, v in sorted((ev.options or {}).items())),
            "ours_us": best.median_us, "ours_lo_us": t.get("lo_us"), "ours_hi_us": t.get("hi_us")}


def fastest_cells(ev, best) -> dict:
    bases = {b: t for b, t in best.baselines_us.items() if b in BASELINES and t}
    if not bases:
        return {"fastest_baseline": "", "fastest_us": None, "gap": None, "speedup": None,
                "speedup_lo": None, "speedup_hi": None}
    name = min(bases, key=bases.get)
    iv = ((((ev.stats or {}).get(MODE) or {}).get("speedup") or {}).get(name)) or {}
    return {"fastest_baseline": name, "fastest_us": bases[name],
            "gap": best.median_us / bases[name], "speedup": best.speedup(name),
            "speedup_lo": iv.get("lo"), "speedup_hi": iv.get("hi")}


def kernel_description(ev, cand: dict | None, pack_dir: Path | None):
    """(meta, resources, source, why): what the cost model needs about our kernel and where it
    came from; meta None with `why` when it cannot be known."""
    if ev.meta:
        return ev.meta, dict(ev.build or {}), "db row", ""
    if cand and cand.get("family") and cand.get("params"):
        try:
            cfg = KernelConfig(cand["family"], tuple(map(tuple, cand["params"])))
        except ValueError as exc:
            return None, None, "", f"pack manifest entry unusable ({exc})"
        return cfg, cand.get("resources"), "pack manifest", ""
    src = source_path(pack_dir / cand["dir"]) if cand and pack_dir and cand.get("dir") else None
    if src is not None and src.is_file():
        cfg = config_of(read_source(src.parent))
        if cfg is not None:
            return cfg, (cand or {}).get("resources"), "source banner", ""
        return None, None, "", f"{src}: no config banner of our families"
    if cand is None:
        return None, None, "", "no meta in the DB row and the sha is in no pack manifest given"
    return None, None, "", "no meta in the DB row; the manifest entry has no family/params or source"


def prediction_cells(ev, best, cand: dict | None, pack_dir: Path | None) -> dict:
    meta, res, source, why = kernel_description(ev, cand, pack_dir)
    out = {"predicted_us": None, "prediction_source": source, "prediction_error": None,
           "prediction_note": why}
    if meta is None:
        return out
    try:
        model = CostModel.default(gpu=(ev.env or {}).get("gpu") or None, arch=ev.arch)
    except ValueError:
        try:
            model = CostModel.default(arch=ev.arch)
        except ValueError as exc:
            return dict(out, prediction_note=f"no cost-model spec: {exc}")
    try:
        p = model.predict_us(meta, res, ev.shape, ev.options or {})
    except Exception as exc:          # noqa: BLE001 - one row's failure is written in its cell
        return dict(out, prediction_note=f"cost model failed: {type(exc).__name__}: {exc}")
    if not p or not p > 0 or math.isinf(p):
        return dict(out, prediction_note=f"cost model gave {p!r}")
    return dict(out, predicted_us=p, prediction_error=best.median_us / p,
                prediction_note=f"CostModel.default({model.gpu}) prior")


def budget_cells(ev, cand: dict | None, pack_dir: Path | None) -> dict:
    """The streaming budget of our best kernel at the row's shape on the row's GPU, replayed as
    the build ran (budget.as_built), or why there is none."""
    out = dict.fromkeys(BUDGET_FIELDS)
    meta, res, _, why = kernel_description(ev, cand, pack_dir)
    if meta is None:
        return dict(out, budget_note=why)
    cfg = meta if isinstance(meta, KernelConfig) else None
    if cfg is None and meta.get("family") in BUDGETED and isinstance(meta.get("params"), dict):
        cfg = KernelConfig(meta["family"], tuple(meta["params"].items()))
    if cfg is None or cfg.family not in BUDGETED:
        return dict(out, budget_note="not a budgeted family")
    try:
        gpu = gpu_for(gpu=(ev.env or {}).get("gpu") or None, arch=ev.arch)
        options, how = as_built(meta if isinstance(meta, dict) else {}, ev.options or {})
        b = budget(cfg, ev.shape, gpu, options=options, registers=int((res or {}).get("registers") or 0),
                   **how)
    except ValueError as exc:
        return dict(out, budget_note=f"budget failed: {exc}")
    return {"budget_us": b.t_us, "budget_inflight_kib": b.inflight_per_sm / 1024,
            "budget_needed_kib": b.inflight_needed_per_sm / 1024, "budget_waves": b.waves,
            "budget_last_wave_fill": b.last_wave_fill, "budget_reduction": b.reduction,
            "budget_reduction_bytes": b.reduction_bytes,
            "budget_note": "; ".join(b.problems()) or f"met on {gpu.name}"}


def decode_cells(M: int, N: int, K: int, ours_us: float, base_us: float | None, ceil: Ceilings) -> dict:
    keys = ("weight_bytes", "ours_gbs", "base_gbs", "ceiling_gbs", "ceiling_bytes",
            "ours_of_ceiling", "base_of_ceiling", "ceiling_note")
    if not bw.is_decode(M, N, K):
        return dict.fromkeys(keys)
    nb = bw.large_operand_bytes(M, N, K)
    entry = bw.ceiling_at({"stream_read": ceil.stream}, nb) if ceil.stream else ceil.large
    gbs = entry.get("gbs") if entry else None
    note = ("nearest size" if ceil.stream else "large-buffer figure, not the row's size") if entry \
        else ceil.stream_why
    o = bw.decode_figures(M, N, K, ours_us, gbs)
    b = bw.decode_figures(M, N, K, base_us, gbs) if base_us else {}
    return {"weight_bytes": nb, "ours_gbs": o["gbs"], "base_gbs": b.get("gbs"), "ceiling_gbs": gbs,
            "ceiling_bytes": entry.get("bytes") if entry else None, "ours_of_ceiling": o["of_ceiling"],
            "base_of_ceiling": b.get("of_ceiling"), "ceiling_note": note}


def floor_cells(flop: int, ours_us: float, base_us: float | None, ceil: Ceilings) -> dict:
    keys = ("floor_us", "ours_above_floor_us", "base_above_floor_us", "floor_note")
    if flop >= SMALL_FLOP:
        return dict.fromkeys(keys)
    if not ceil.floor:
        return dict(dict.fromkeys(keys), floor_note=ceil.floor_why)
    f = float(ceil.floor["empty"]["median"])
    return {"floor_us": f, "ours_above_floor_us": ours_us - f,
            "base_above_floor_us": base_us - f if base_us else None, "floor_note": "empty kernel"}


def _fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def profile_side(rows: list[dict] | None, why_none: str) -> dict:
    """One side's profile figures: the longest-running launch's, the duration summed over the
    launches; the note says why when there is nothing to show."""
    if rows is None:
        return dict(dict.fromkeys(PROFILE_FIELDS), note=why_none)
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        st = sorted({f"{r['status']}" + (f": {r['detail']}" if r["detail"] else "") for r in rows})
        return dict(dict.fromkeys(PROFILE_FIELDS), note="profile status " + "; ".join(st))
    top = max(ok, key=lambda r: _fnum(r["duration_us"]) or 0.0)
    durs = [_fnum(r["duration_us"]) for r in ok]
    return {"kernel": top["kernel"], "launches": len(ok),
            "duration_us": sum(durs) if all(d is not None for d in durs) else None,
            "dram_pct_peak": _fnum(top["dram_pct_peak"]),
            "occupancy_pct": _fnum(top["achieved_occupancy_pct"]),
            "registers": top["registers"], "smem_bytes": top["smem_bytes"], "grid": top["grid"],
            "block": top["block"],
            "stalls": " ".join(s for s in (top["stall_1"], top["stall_2"], top["stall_3"]) if s),
            "note": "" if len(ok) == len(rows) else f"{len(rows) - len(ok)} launch(es) not ok"}


def profile_cells(profile: dict | None, why_none: str, key: tuple, baseline: str, sha12: str) -> dict:
    """Both sides' profile figures; ours: the rows naming our sha when some do, the baseline:
    the fastest baseline's rows when some are (else the baseline profiled, said in the note)."""
    out = {}
    for who in ("ours", "baseline"):
        rows = None if profile is None else profile.get((*key, who))
        if rows:
            named = [r for r in rows if (r["name"] == baseline if who == "baseline" else sha12 in r["name"])]
            rows = named or rows
        why = why_none if profile is None else "no row for this shape in the profile"
        side = profile_side(rows, why)
        if who == "baseline" and rows and rows[0]["name"] != baseline:
            side["note"] = (side["note"] + "; " if side["note"] else "") + f"baseline profiled: {rows[0]['name']}"
        out.update({f"{who}_prof_{k}": v for k, v in side.items()})
    return out


# ---- the table -------------------------------------------------------------------------------

def explain(evs: list, *, ceil: Ceilings, profile: dict | None = None, profile_why: str = "",
            manifest: dict | None = None, pack_dir: Path | None = None) -> list[dict]:
    """One record per (M, N, K, layout) with a measured final row, ranked by the gap (worst
    first; shapes without a baseline last)."""
    finals = [e for e in evs if e.stage == "final"]
    cands = pack_candidates(manifest)
    out = []
    for layout in sorted({e.layout for e in finals}):
        sub = [e for e in finals if e.layout == layout]
        for r in collect(sub, mode=MODE):
            best = r.overall()
            ev = best_evaluation(sub, layout, r, best)
            M, N, K = r.shape
            rec = {"M": M, "N": N, "K": K, "layout": layout, "class": shape_class(M, N, K),
                   **physics(M, N, K)}
            rec.update(ours_cells(ev, best, cands.get(ev.source_sha)))
            rec.update(fastest_cells(ev, best))
            rec.update(prediction_cells(ev, best, cands.get(ev.source_sha), pack_dir))
            rec.update(budget_cells(ev, cands.get(ev.source_sha), pack_dir))
            rec.update(decode_cells(M, N, K, best.median_us, rec["fastest_us"], ceil))
            rec.update(floor_cells(rec["flop"], best.median_us, rec["fastest_us"], ceil))
            rec.update(profile_cells(profile, profile_why, (M, N, K, layout), rec["fastest_baseline"],
                                     rec["ours_sha"]))
            out.append(rec)
    out.sort(key=lambda x: (x["gap"] is None, -(x["gap"] or 0.0)))
    return out


def by_prediction_error(recs: list[dict]) -> list[dict]:
    """The records with a prediction, worst |log(measured / predicted)| first."""
    return sorted((r for r in recs if r["prediction_error"]),
                  key=lambda r: -abs(math.log(r["prediction_error"])))


# ---- writing ---------------------------------------------------------------------------------

CSV_COLUMNS = (["M", "N", "K", "layout", "class", "flop", "a_bytes", "b_bytes", "c_bytes",
                "ours_family", "ours_config", "ours_origin", "ours_sha", "ours_options", "ours_us",
                "ours_lo_us", "ours_hi_us", "fastest_baseline", "fastest_us", "gap", "speedup",
                "speedup_lo", "speedup_hi", "predicted_us", "prediction_source", "prediction_error",
                "prediction_note", "weight_bytes", "ours_gbs", "base_gbs", "ceiling_gbs",
                "ceiling_bytes", "ours_of_ceiling", "base_of_ceiling", "ceiling_note", "floor_us",
                "ours_above_floor_us", "base_above_floor_us", "floor_note", *BUDGET_FIELDS]
               + [f"{w}_prof_{k}" for w in ("ours", "baseline") for k in PROFILE_FIELDS])


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_csv(recs: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["rank", *CSV_COLUMNS])
        for i, r in enumerate(recs, start=1):
            w.writerow([i, *(_cell(r[c]) for c in CSV_COLUMNS)])
    return path


def _shape(r) -> str:
    return f"{r['M']}x{r['N']}x{r['K']}"


def _iv(x, lo, hi, nd) -> str:
    if x is None:
        return ""
    return fmt(x, nd) + (f" [{fmt(lo, nd)}, {fmt(hi, nd)}]" if lo is not None and hi is not None else "")


def _or(x, nd, why) -> str:
    return fmt(x, nd) if x is not None else f"({why})" if why else ""


def class_lines(recs: list[dict]) -> list[str]:
    lines = ["| class | shapes | geomean speedup vs fastest | min | max | ours slower |", "|---|---|---|---|---|---|"]
    for c in ("decode", "deep-K", "small", "other", "all"):
        sp = [r["speedup"] for r in recs if r["speedup"] and (c == "all" or r["class"] == c)]
        if sp:
            lines.append(f"| {c} | {len(sp)} | {fmt(geomean(sp))} | {fmt(min(sp))} | {fmt(max(sp))} "
                         f"| {sum(s < 1 for s in sp)} |")
    return lines


def gap_table(recs: list[dict]) -> list[str]:
    md = ["| # | shape | layout | class | ours (family, sha, options) | ours us [lo, hi] | fastest baseline us "
          "| ours/fastest time | speedup [lo, hi] | predicted us | measured/predicted |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(recs, start=1):
        pred = _or(r["predicted_us"], 2, r["prediction_note"])
        md.append(f"| {i} | {_shape(r)} | {r['layout']} | {r['class']} | {r['ours_family']} "
                  f"`{r['ours_sha']}` {r['ours_options'] or '(default options)'} "
                  f"| {_iv(r['ours_us'], r['ours_lo_us'], r['ours_hi_us'], 2)} "
                  f"| {r['fastest_baseline']} {fmt(r['fastest_us'], 2)} | {fmt(r['gap'])} "
                  f"| {_iv(r['speedup'], r['speedup_lo'], r['speedup_hi'], 3)} | {pred} "
                  f"| {fmt(r['prediction_error'])} |")
    return md


def budget_table(recs: list[dict]) -> list[str]:
    mine = [r for r in recs if r["budget_us"] is not None]
    if not mine:
        return ["(no row won by a streaming family)"]
    md = ["| shape | ours | measured us | budget us | in flight KiB/SM (needed) | waves | last wave "
          "| reduction (MiB) | budget |", "|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        md.append(f"| {_shape(r)} | {r['ours_family']} | {fmt(r['ours_us'], 2)} | {fmt(r['budget_us'], 2)} "
                  f"| {fmt(r['budget_inflight_kib'], 1)} ({fmt(r['budget_needed_kib'], 1)}) "
                  f"| {r['budget_waves']} | {fmt(r['budget_last_wave_fill'])} "
                  f"| {r['budget_reduction']} ({fmt(r['budget_reduction_bytes'] / 2**20, 2)}) "
                  f"| {r['budget_note']} |")
    return md


def physics_table(recs: list[dict]) -> list[str]:
    md = ["| shape | GFLOP | A MiB | B MiB | C MiB | weight MiB | ours GB/s | baseline GB/s | ceiling GB/s (at MiB) "
          "| ours of ceiling | baseline of ceiling | floor us | ours above floor | baseline above floor |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mib = lambda x: fmt(x / 2**20, 2) if x is not None else ""   # noqa: E731
    for r in recs:
        dec = r["weight_bytes"] is not None
        ceil = (f"{fmt(r['ceiling_gbs'], 0)} ({mib(r['ceiling_bytes']) or 'large buffer'})"
                if r["ceiling_gbs"] else "(none: see the ceiling line)" if dec else "")
        small = r["flop"] < SMALL_FLOP
        floor = (fmt(r["floor_us"], 2) if r["floor_us"] is not None
                 else "(none: see the floor line)" if small else "")
        md.append(f"| {_shape(r)} | {fmt(r['flop'] / 1e9, 3)} | {mib(r['a_bytes'])} | {mib(r['b_bytes'])} "
                  f"| {mib(r['c_bytes'])} | {mib(r['weight_bytes'])} | {fmt(r['ours_gbs'], 0)} "
                  f"| {fmt(r['base_gbs'], 0)} | {ceil} | {fmt(r['ours_of_ceiling'])} "
                  f"| {fmt(r['base_of_ceiling'])} | {floor} | {fmt(r['ours_above_floor_us'], 2)} "
                  f"| {fmt(r['base_above_floor_us'], 2)} |")
    return md


def profile_table(recs: list[dict]) -> list[str]:
    md = ["| shape | who | kernel | launches | duration us | DRAM % peak | occupancy % | regs | smem | grid "
          "| block | top stalls | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        for w in ("ours", "baseline"):
            p = {k: r[f"{w}_prof_{k}"] for k in PROFILE_FIELDS}
            who = w if w == "ours" else r["fastest_baseline"] or "baseline"
            md.append(f"| {_shape(r)} | {who} | {p['kernel'] or ''} | {p['launches'] or ''} "
                      f"| {fmt(p['duration_us'], 2)} | {fmt(p['dram_pct_peak'], 1)} | {fmt(p['occupancy_pct'], 1)} "
                      f"| {p['registers'] or ''} | {p['smem_bytes'] or ''} | {p['grid'] or ''} "
                      f"| {p['block'] or ''} | {p['stalls'] or ''} | {p['note'] or ''} |")
    return md


def error_table(recs: list[dict], n: int = 10) -> list[str]:
    ranked = by_prediction_error(recs)
    md = ["| # | shape | layout | ours | measured us | predicted us | measured/predicted | from |",
          "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ranked[:n], start=1):
        md.append(f"| {i} | {_shape(r)} | {r['layout']} | {r['ours_family']} `{r['ours_sha']}` "
                  f"| {fmt(r['ours_us'], 2)} | {fmt(r['predicted_us'], 2)} | {fmt(r['prediction_error'])} "
                  f"| {r['prediction_source']} |")
    missing = [r for r in recs if not r["prediction_error"]]
    if missing:
        md += ["", f"{len(missing)} shape(s) without a prediction: "
               + "; ".join(f"{_shape(r)} ({r['prediction_note']})" for r in missing)]
    return md


def config_table(recs: list[dict]) -> list[str]:
    md = ["| shape | layout | origin | sha | config | options |", "|---|---|---|---|---|---|"]
    md += [f"| {_shape(r)} | {r['layout']} | {r['ours_origin']} | `{r['ours_sha']}` | {r['ours_config']} "
           f"| {r['ours_options'] or '(defaults)'} |" for r in recs]
    return md


def write_md(recs: list[dict], path: Path, *, sources: list[str], ceil: Ceilings, profile_line: str,
             gpu: str, dates: str, command: str) -> Path:
    md = ["# Explain: measured beside predicted, per shape, ranked by the gap", "",
          f"{len(recs)} shapes (M, N, K, layout) with a measured final row on {gpu or 'an unnamed GPU'}, "
          f"finals dated {dates}; read from {'; '.join(sources)}.", "",
          "ours = the best measured candidate of the shape (offline kernel time, median with the row's "
          "bootstrap interval); fastest = the fastest of the five baselines timed in the same run; "
          "ours/fastest time = the gap (> 1: we are slower), the ranking key; speedup = the row's "
          "median over interleaved rounds of baseline time / ours, with its interval; predicted = the "
          "cost model's prior (CostModel.default for the GPU) from the kernel's meta and ptxas "
          "resources; measured/predicted > 1: the model was optimistic.", "",
          "- " + ceil.line(), "- " + ceil.floor_line(), "- " + profile_line, "- " + BUDGET_NOTE,
          f"- classes are grouping labels: decode M <= {bw.DECODE_MAX_M}; deep-K K >= {DEEP_K_RATIO} x "
          "max(M, N); small < 1e9 FLOP; other.", "",
          "## By class", "", *class_lines(recs), "",
          "## Ranked by the gap (ours / fastest baseline time, worst first)", "", *gap_table(recs), "",
          "## Ranked by prediction error (|log(measured / predicted)|, worst first)", "",
          *error_table(recs), "",
          "## Physics: bytes, FLOP, bandwidth of decode rows, time above the launch floor", "",
          "fp16 operands: A = 2MK, B = 2KN, C = 2MN bytes; weight = the large operand (bandwidth."
          "large_operand_bytes) of a decode row; GB/s = 1e9 B/s; floor columns for shapes under 1e9 FLOP.",
          "", *physics_table(recs), "", "## The streaming budget of our best kernel", "",
          *budget_table(recs), "", "## Profile", ""]
    md += profile_table(recs) if profile_line.startswith("profile:") else [profile_line]
    md += ["", "## Our kernels", "", *config_table(recs), "", f"Made by: `{command}`"]
    path.write_text("\n".join(md) + "\n")
    return path


def stdout_table(recs: list[dict]) -> str:
    head = f"{'#':>3} {'shape':<16} {'lay':<3} {'class':<6} {'ours':<11} {'ours_us':>9} " \
           f"{'fastest':<19} {'base_us':>9} {'gap':>6} {'pred_us':>9} {'meas/pred':>9}"
    lines = [head]
    for i, r in enumerate(recs, start=1):
        lines.append(f"{i:>3} {_shape(r):<16} {r['layout']:<3} {r['class']:<6} {r['ours_family'][:11]:<11} "
                     f"{fmt(r['ours_us'], 2):>9} {r['fastest_baseline'][:19]:<19} {fmt(r['fastest_us'], 2):>9} "
                     f"{fmt(r['gap']):>6} {fmt(r['predicted_us'], 2) or '-':>9} "
                     f"{fmt(r['prediction_error']) or '-':>9}")
    return "\n".join(lines)


# ---- CLI -------------------------------------------------------------------------------------

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", nargs="+", required=True,
                        help="results DB(s) of a GPU campaign (SQLite; .db.gz read as is)")
    parser.add_argument("--summary", default=None,
                        help="the campaign's summary.json: its 'ceilings' (else its 'bandwidth')")
    parser.add_argument("--profile", default=None,
                        help="profile CSV (one row per kernel launch; default: profile.csv beside the DB)")
    parser.add_argument("--pack", default=None,
                        help="pack_manifest.json of the call: meta/resources when a row lacks them")
    parser.add_argument("--out", required=True, help="output folder: explain.md, explain.csv")


def _profile(args) -> tuple[dict | None, str]:
    """The profile rows and the page's one line about them (why there are none)."""
    path = Path(args.profile) if args.profile else Path(args.db[0]).parent / "profile.csv"
    if not args.profile and not path.is_file():
        return None, ("no profile.csv in this call (none given with --profile, none beside the DB): "
                      "calls made before the profile stage have none")
    prof = read_profile(path)
    statuses = sorted({r["status"] for rows in prof.values() for r in rows})
    if statuses and statuses != ["ok"] and "ok" not in statuses:
        return None, f"profile status {', '.join(statuses)} ({path}): no figures"
    if not prof:
        return None, f"profile {path} has no rows: no figures"
    return prof, f"profile: {path} ({sum(map(len, prof.values()))} launches; statuses {', '.join(statuses)})"


def _dates(evs: list) -> str:
    ds = sorted({(e.created or "")[:10] for e in evs if e.stage == "final"} - {""})
    return ds[0] if len(ds) == 1 else f"{ds[0]}..{ds[-1]}" if ds else "(no date)"


def command_line(args: argparse.Namespace) -> str:
    """The command that makes this page again (from the parsed arguments)."""
    parts = ["cudal2 report --explain --db", *args.db]
    parts += [f"--{k} {getattr(args, k)}" for k in ("summary", "profile", "pack") if getattr(args, k)]
    return " ".join(parts + [f"--out {args.out}"])


def run_cli(args: argparse.Namespace) -> int:
    try:
        evs = read_rows(args.db)
        summary = read_json(args.summary, "--summary") if args.summary else None
        manifest = read_json(args.pack, "--pack") if args.pack else None
        profile, profile_line = _profile(args)
    except (DBError, ValueError) as exc:
        print(f"cudal2 report: {exc}", file=sys.stderr)
        return 2
    ceil = ceilings_of(summary)
    recs = explain(evs, ceil=ceil, profile=profile, profile_why=profile_line.split(" (")[0],
                   manifest=manifest, pack_dir=Path(args.pack).parent if args.pack else None)
    if not recs:
        print(f"cudal2 report: no measured final rows in {' '.join(args.db)} (mode {MODE}); rows from "
              "machines without a GPU are not_measured and explain nothing", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = sorted({str((e.env or {}).get("gpu", "")) for e in evs if e.stage == "final"} - {""})
    sources = [f"DB {', '.join(args.db)}"] + [f"{k} {getattr(args, k)}" for k in ("summary", "pack")
                                             if getattr(args, k)]
    cmd = command_line(args)
    write_csv(recs, out / "explain.csv")
    write_md(recs, out / "explain.md", sources=sources, ceil=ceil, profile_line=profile_line,
             gpu=", ".join(gpus), dates=_dates(evs), command=cmd)
    print(stdout_table(recs))
    print(f"explain over {len(recs)} shapes written to {out}: explain.md, explain.csv")
    return 0
