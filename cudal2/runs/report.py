"""Speedup summaries from results-DB rows (`cudal2 report`, `cudal2 report --compare`).

Per shape, the best measured candidate of each origin (search = "tune", "rl", anything else by
name) against the five baselines, with the baselines' medians taken from the *same* run as that
candidate (interleaved timing). Aggregates: geomean and mean speedup per baseline, count below
1.0, per flop bucket, a flop-weighted speedup (total baseline time / total candidate time) and,
with a weighted shape list (shapes/llm_trace.csv), the time-weighted speedup
1 / sum(w_i / s_i). Only stdlib + numpy; PNGs only when matplotlib is importable.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cudal2.core.shapefile import check_sizes, open_csv, reader as csv_reader
from cudal2.harness import bandwidth as bw
from cudal2.harness.db import DBError, ResultsDB
from cudal2.harness.types import BASELINES, medians, on_gpu, unmeasured

# Flop buckets (docs/measurement.md): upper bounds on 2*M*N*K, the last open.
BUCKETS = ((1e9, "<1e9"), (1e11, "1e9-1e11"), (1e12, "1e11-1e12"), (float("inf"), ">=1e12"))


def size_bucket(M: int, N: int, K: int) -> str:
    f = 2.0 * M * N * K
    return next(name for hi, name in BUCKETS if f < hi)


def origin_group(origin: str) -> str:
    o = (origin or "").lower()
    if o.startswith("tune") or o == "search":
        return "search"
    if o.startswith("rl"):
        return "rl"
    return o or "other"


@dataclass
class Best:
    """The best measured candidate of one origin for one shape."""
    origin: str
    source_sha: str
    median_us: float
    baselines_us: dict[str, float]
    # the row's own speedups (median of per-round paired ratios); absent: ratio of medians
    speedups: dict[str, float] = field(default_factory=dict)

    def speedup(self, baseline: str) -> float | None:
        s = self.speedups.get(baseline)
        if s:
            return float(s)
        b = self.baselines_us.get(baseline)
        return b / self.median_us if b else None


@dataclass
class ShapeRow:
    M: int
    N: int
    K: int
    best: dict[str, Best] = field(default_factory=dict)     # origin group -> Best

    @property
    def bucket(self) -> str:
        return size_bucket(self.M, self.N, self.K)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    def overall(self) -> Best | None:
        """The best candidate of any origin."""
        return min(self.best.values(), key=lambda x: x.median_us) if self.best else None

    def baselines_us(self) -> dict[str, float]:
        """Baseline medians: from the overall best candidate's run (any origin)."""
        b = self.overall()
        return b.baselines_us if b else {}


def collect(evaluations: Iterable, *, mode: str = "offline", gpu: str | None = None) -> list[ShapeRow]:
    """Best measured (status ok, correct, not estimated) candidate per shape and origin group."""
    rows: dict[tuple, ShapeRow] = {}
    for ev in evaluations:
        if unmeasured(ev, mode) or not on_gpu(ev, gpu):
            continue
        bases = medians(ev, mode)
        cand = bases.pop("candidate")
        key = (ev.shape.M, ev.shape.N, ev.shape.K)
        row = rows.setdefault(key, ShapeRow(*key))
        g = origin_group(ev.origin)
        if g not in row.best or cand < row.best[g].median_us:
            row.best[g] = Best(g, ev.source_sha, cand, bases,
                               dict(((ev.speedups or {}).get(mode) or {})))
    return [rows[k] for k in sorted(rows)]


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def speedup_stats(pairs: Iterable[tuple], weights: dict | None = None) -> dict:
    """Aggregates over (shape, candidate_us, baseline_us[, speedup]) tuples: n, geomean, mean,
    min, below_1, flop_weighted (total baseline time / total candidate time: where the time
    goes), time_weighted (1 / sum(w_i / s_i) over the shapes in `weights`), weight_covered, and
    the geomean per size bucket. Speedup s = the given one (a row's paired-ratio median), else
    baseline / candidate."""
    sp, cand_t, base_t, wsum, wdiv = [], 0.0, 0.0, 0.0, 0.0
    buckets: dict[str, list[float]] = {}
    for shape, cand, base, *given in pairs:
        s = given[0] if given and given[0] else base / cand
        sp.append(s)
        cand_t += cand
        base_t += base
        buckets.setdefault(size_bucket(*shape), []).append(s)
        if weights and shape in weights:
            wsum += weights[shape]
            wdiv += weights[shape] / s
    return {"n": len(sp), "geomean": geomean(sp),
            "mean": sum(sp) / len(sp) if sp else float("nan"),
            "min": min(sp) if sp else float("nan"),
            "below_1": sum(s < 1.0 for s in sp),
            "flop_weighted": base_t / cand_t if cand_t else float("nan"),
            "time_weighted": wsum / wdiv if wdiv else float("nan"),
            "weight_covered": wsum,
            "buckets": {k: {"n": len(v), "geomean": geomean(v)} for k, v in buckets.items()}}


def aggregate(rows: list[ShapeRow], origin: str | None = None, weights: dict | None = None,
              baselines=BASELINES) -> dict[str, dict]:
    """speedup_stats per baseline over the best candidate of `origin` for each shape
    (`origin=None`: the best candidate of any origin)."""
    out = {}
    for b in baselines:
        pairs = []
        for r in rows:
            best = r.best.get(origin) if origin else r.overall()
            if best and best.speedup(b) is not None and b in best.baselines_us:
                pairs.append((r.shape, best.median_us, best.baselines_us[b], best.speedup(b)))
        out[b] = speedup_stats(pairs, weights)
    return out


def read_weights(path) -> dict[tuple[int, int, int], float]:
    """shape -> summed weight from a CSV with M,N,K,weight (shapes/llm_trace.csv)."""
    out: dict[tuple, float] = {}
    with open_csv(path) as f:
        r = csv_reader(f, path, ("M", "N", "K", "weight"))
        for i, rec in enumerate(r, start=2):
            try:
                k = (int(rec["M"]), int(rec["N"]), int(rec["K"]))
                w = float(rec["weight"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{i}: bad weighted shape row {rec}: {exc}") from None
            k = check_sizes(k, path, i)
            out[k] = out.get(k, 0.0) + w
    return out


def timer_label(mode: str) -> str:
    """What a timings key measures, for report headings."""
    if mode == "offline":
        return "kernel time (GPU time per call, host out of the bracket, cold operands)"
    if mode.startswith("server_"):
        return f"kernel time of single calls after {mode[len('server_'):]} idle gaps, L2 flushed"
    if mode.startswith("e2e_"):
        return f"end-to-end call ({mode[len('e2e_'):].replace('_', ' ')}, host clock, cudal2.matmul vs torch.matmul)"
    if mode == "wall":
        return "CUDA-L2's host-clock timer (host dispatch included)"
    if mode == "screen":
        return "screening kernel time (ranking only)"
    return mode


def fmt(x, nd=3) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def write_compare(rows: list[ShapeRow], out: Path, *, mode: str, weights=None, title: str = "") -> dict:
    """compare.csv (per shape) + compare.md (per origin and size bucket). Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    origins = sorted({g for r in rows for g in r.best}, key=lambda g: (g not in ("search", "rl"), g))
    csv_path = out / "compare.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["M", "N", "K", "bucket", *[f"{b}_us" for b in BASELINES],
                    *[c for g in origins for c in (f"{g}_us", f"{g}_sha",
                                                    *[f"{g}_vs_{b}" for b in BASELINES])]])
        for r in rows:
            bases = r.baselines_us()
            line = [r.M, r.N, r.K, r.bucket, *[fmt(bases.get(b), 2) for b in BASELINES]]
            for g in origins:
                best = r.best.get(g)
                line += [fmt(best.median_us, 2) if best else "", best.source_sha[:12] if best else "",
                         *[fmt(best.speedup(b)) if best else "" for b in BASELINES]]
            w.writerow(line)
    md = [f"# {title or 'Search vs RL vs baselines'} ({mode})", "",
          f"{len(rows)} shapes with a measured candidate. Speedup = median over interleaved rounds "
          "of baseline time / candidate time (kernel time unless the mode says otherwise); "
          "geomean over shapes; `<1` = shapes where the candidate is slower (the library would "
          "not use it).", ""]
    for g in origins:
        md += [f"## {g}", "", "| bucket | shapes | " + " | ".join(BASELINES) + " | <1 vs " + BASELINES[-1] + " |",
               "|---|---|" + "---|" * len(BASELINES) + "---|"]
        for _, bname in BUCKETS + ((None, "all"),):
            sub = [r for r in rows if g in r.best and (bname == "all" or r.bucket == bname)]
            if not sub:
                continue
            agg = aggregate(sub, g)
            md.append(f"| {bname} | {len(sub)} | " + " | ".join(fmt(agg[b]['geomean']) for b in BASELINES)
                      + f" | {agg[BASELINES[-1]]['below_1']} |")
        agg = aggregate([r for r in rows if g in r.best], g, weights)
        md += ["", "flop-weighted (total baseline time / total candidate time): "
               + ", ".join(f"{b} {fmt(agg[b]['flop_weighted'])}" for b in BASELINES)]
        if weights:
            md += ["", f"time-weighted on the trace (1/sum(w/s), weight covered "
                       f"{fmt(agg[BASELINES[-1]]['weight_covered'])}): "
                   + ", ".join(f"{b} {fmt(agg[b]['time_weighted'])}" for b in BASELINES)]
        md.append("")
    both = [r for r in rows if "search" in r.best and "rl" in r.best]
    if both:
        rl_wins = sum(r.best["rl"].median_us < r.best["search"].median_us for r in both)
        ratio = geomean([r.best["search"].median_us / r.best["rl"].median_us for r in both])
        md += ["## RL vs search, head to head", "",
               f"{len(both)} shapes with both: RL faster on {rl_wins}, search faster on "
               f"{len(both) - rl_wins}; geomean search time / RL time = {fmt(ratio)}.", ""]
    md_path = out / "compare.md"
    md_path.write_text("\n".join(md) + "\n")
    return {"csv": csv_path, "md": md_path}


def decode_table(rows: list[ShapeRow], bandwidth: dict | None = None) -> list[dict]:
    """Per decode row (M <= 64): the bandwidth on its large operand (the weight, 2*K*N bytes) of
    the best candidate and of the fastest baseline of its run, each as GB/s, as a fraction of
    the streaming ceiling measured in the same call (`bandwidth`: bandwidth.measure's answer)
    and of the theoretical peak it recorded."""
    ok = bool(bandwidth) and bandwidth.get("status") == "ok"
    ceil = bandwidth.get("gbs") if ok else None
    peak = bandwidth.get("peak_gbs") if ok else None
    out = []
    for r in rows:
        best = r.overall()
        if best is None or not bw.is_decode(r.M, r.N, r.K):
            continue
        bases = {b: t for b, t in r.baselines_us().items() if b in BASELINES and t}
        fastest = min(bases, key=bases.get) if bases else None
        rec = {"shape": r.shape, "candidate_us": best.median_us,
               "candidate": bw.decode_figures(r.M, r.N, r.K, best.median_us, ceil, peak),
               "baseline": fastest, "baseline_us": bases.get(fastest)}
        rec["baseline_figures"] = (bw.decode_figures(r.M, r.N, r.K, bases[fastest], ceil, peak)
                                   if fastest else None)
        out.append(rec)
    return out


def _decode_lines(rows: list[ShapeRow], bandwidth: dict | None) -> list[str]:
    """The decode rows' bandwidth section of summary.md ([] without decode rows)."""
    table = decode_table(rows, bandwidth)
    if not table:
        return []
    md = ["", "## Decode rows (M <= 64): HBM bandwidth on the large operand", "",
          "Bytes of the large operand (the weight, 2*K*N) over kernel time, as GB/s, as a fraction "
          "of the read-only streaming kernel's bandwidth measured in the same call (the device's "
          "own ceiling) and of the theoretical peak (memory clock x bus width x 2). "
          + (bw.line(bandwidth) + "." if bandwidth else "No ceiling was measured in this call."), "",
          "| shape | MiB | best us | GB/s | of ceiling | of peak | fastest baseline | its GB/s | of ceiling |",
          "|---|---|---|---|---|---|---|---|---|"]
    for rec in table:
        c, b = rec["candidate"], rec["baseline_figures"] or {}
        md.append(f"| {'x'.join(map(str, rec['shape']))} | {c['bytes'] / 2**20:.1f} | "
                  f"{fmt(rec['candidate_us'], 2)} | {fmt(c['gbs'], 0)} | {fmt(c['of_ceiling'])} | "
                  f"{fmt(c['of_peak'])} | {rec['baseline'] or ''} | {fmt(b.get('gbs'), 0)} | "
                  f"{fmt(b.get('of_ceiling'))} |")
    return md


def write_summary(rows: list[ShapeRow], out: Path, *, mode: str, weights=None, title: str = "",
                  command: str = "", bandwidth: dict | None = None) -> dict:
    """summary.md + per_shape.csv (+ PNGs when matplotlib is importable) for one run. bandwidth:
    the streaming ceiling measured in the same call (cudal2.harness.bandwidth.measure's answer):
    kernel-time modes get a section of the decode rows' bandwidth beside it."""
    out.mkdir(parents=True, exist_ok=True)
    paths = write_compare(rows, out, mode=mode, weights=weights, title=title)
    agg = aggregate(rows, None, weights)
    md = [f"# {title or 'Speedup summary'} ({mode})", "", f"{len(rows)} shapes. Best candidate of any "
          f"origin per shape vs each baseline, {timer_label(mode)}; speedup = median over "
          "interleaved rounds of baseline time / candidate time.", "",
          "| baseline | shapes | geomean | mean | below 1.0 | flop-weighted | time-weighted (trace) |",
          "|---|---|---|---|---|---|---|"]
    for b in BASELINES:
        a = agg[b]
        md.append(f"| {b} | {a['n']} | {fmt(a['geomean'])} | {fmt(a['mean'])} | {a['below_1']} | "
                  f"{fmt(a['flop_weighted'])} | {fmt(a['time_weighted'])} |")
    md += ["", "Per size bucket (geomean):", "", "| bucket | shapes | " + " | ".join(BASELINES) + " |",
           "|---|---|" + "---|" * len(BASELINES)]
    for _, bname in BUCKETS:
        sub = [r for r in rows if r.bucket == bname]
        if sub:
            a = aggregate(sub)
            md.append(f"| {bname} | {len(sub)} | " + " | ".join(fmt(a[b]['geomean']) for b in BASELINES) + " |")
    if mode == "offline" or mode.startswith("server_"):       # kernel time: bytes / time means something
        md += _decode_lines(rows, bandwidth)
    pngs = plot(rows, out, mode=mode)
    if pngs:
        md += [""] + [f"![{p.stem}]({p.name})" for p in pngs]
    if command:
        md += ["", f"Made by: `{command}`"]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    paths.update(summary=out / "summary.md", pngs=pngs)
    return paths


def plot(rows: list[ShapeRow], out: Path, *, mode: str) -> list[Path]:
    """Speedup vs problem size per baseline (PNG); [] when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    fig, ax = plt.subplots(figsize=(8, 5))
    for b in BASELINES:
        pts = [(2.0 * r.M * r.N * r.K, s) for r in rows if (best := r.overall()) and (s := best.speedup(b))]
        if pts:
            ax.scatter(*zip(*pts), s=10, label=b, alpha=0.7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("problem size (2*M*N*K flop)")
    ax.set_ylabel("speedup (baseline / candidate median)")
    ax.set_title(f"best candidate vs baselines ({mode})")
    ax.legend(fontsize=8)
    p = out / f"speedup_vs_size_{mode}.png"
    fig.tight_layout()
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return [p]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", nargs="+", default=["results.db"],
                        help="results DB(s) (SQLite; results.db.gz read as is); rows of all are read")
    parser.add_argument("--compare", action="store_true", help="search vs RL vs baselines per shape and bucket")
    parser.add_argument("--mode", default="offline",
                        help="timings key: offline (kernel time), server_<gap>ms, e2e_<kind>, wall")
    parser.add_argument("--gpu", default=None, help="only rows measured on this GPU (substring)")
    parser.add_argument("--weights", default=None, help="weighted shape CSV for a time-weighted speedup "
                                                        "(shapes/llm_trace.csv)")
    parser.add_argument("--out", default=None, help="output folder (default reports/<gpu>/<date>-report)")
    parser.add_argument("--bandwidth", default=None,
                        help="a campaign's summary.json: its streaming ceiling (summary['bandwidth']) "
                             "beside the decode rows' bandwidth")


def read_rows(paths) -> list:
    """Every row of the results DBs at `paths`, all read before any report is written; DBError
    naming the file when one is missing, not a results DB or unreadable."""
    out = []
    for p in paths:
        if not Path(p).exists():
            raise DBError(f"no results DB at {p}")
        try:
            with ResultsDB(p, readonly=True) as db:
                out += db.rows()
        except sqlite3.DatabaseError as exc:       # a page that fails to read, mid-file
            raise DBError(f"{p}: unreadable results DB ({exc})") from None
    return out


def run_cli(args: argparse.Namespace) -> int:
    try:
        evs = read_rows(args.db)
    except DBError as exc:
        print(f"cudal2 report: {exc}", file=sys.stderr)
        return 2
    rows = collect(evs, mode=args.mode, gpu=args.gpu)
    if not rows:
        print(f"cudal2 report: no measured candidate rows in {' '.join(args.db)} (mode {args.mode}); "
              "rows from machines without a GPU are not_measured and make no report", file=sys.stderr)
        return 1
    try:
        weights = read_weights(args.weights) if args.weights else None
    except (OSError, ValueError) as exc:
        print(f"cudal2 report: --weights: {exc}", file=sys.stderr)
        return 2
    gpus = sorted({str((e.env or {}).get("gpu", "")) for e in evs if e.status == "ok"} - {""})
    tag = (args.gpu or (gpus[0] if len(gpus) == 1 else "mixed")).replace(" ", "_")
    out = Path(args.out) if args.out else Path("reports") / tag / (
        _dt.date.today().isoformat() + ("-compare" if args.compare else "-report"))
    ceiling = None
    if getattr(args, "bandwidth", None):
        try:
            ceiling = json.loads(Path(args.bandwidth).read_text()).get("bandwidth")
        except (OSError, ValueError, AttributeError) as exc:
            print(f"cudal2 report: --bandwidth: {exc}", file=sys.stderr)
            return 2
    cmd = "cudal2 report " + " ".join(sys.argv[2:])
    if args.compare:
        paths = write_compare(rows, out, mode=args.mode, weights=weights)
    else:
        paths = write_summary(rows, out, mode=args.mode, weights=weights, command=cmd,
                              bandwidth=ceiling)
    (out / "command.txt").write_text(cmd + "\n")
    print(f"report over {len(rows)} shapes written to {out}: " + ", ".join(
        str(p.name) for p in paths.values() if isinstance(p, Path)))
    return 0
