"""Coverage: what the results DBs have measured, what ships, and what to measure next
(`cudal2 report --coverage`, `cudal2 campaign prepare --order gain`).

Per shape list (the 1000-shape grid, the LLM trace) and FLOP bucket (cudal2.runs.report.BUCKETS):
- measured: shapes with a final-stage row timed by kernel time (timer "kernel", offline mode, a
  correct candidate, not estimated); the per-call-event rows of the first campaign do not count;
- exported: shapes with a tuned row in generated_kernels/index.csv (what `cudal2.matmul` serves);
- geomean over the measured shapes of the best candidate's speedup (its own run's paired-ratio
  median) against the fastest of the baselines in that run, and against cuBLASLt autotuned.
A trace shape counts only when measured in the trace's layout (its `layout` column; RC for
nn.Linear weights): an RR measurement is a different problem.

The planner (`order_by_gain`) ranks unmeasured shapes by expected gain, defined as the measured
geomean speedup against the fastest baseline of the shape's FLOP bucket (1.0, parity, for a bucket
with no measurement), ties broken by the cost model's baseline time for the shape (more time at
stake first). Where our kernels have come closest to or beaten cuBLAS, an unmeasured shape is the
likeliest to yield a winner, and the largest of them save the most time.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cudal2.core import knobs
from cudal2.core.shapefile import check_sizes, open_csv, reader as csv_reader
from cudal2.core.store import KernelIndex
from cudal2.harness.types import BASELINES, Shape
from cudal2.runs.report import (BUCKETS, Best, collect, fmt, geomean,
                                read_rows, size_bucket)

AUTOTUNED = "cublaslt_autotuned"


def kernel_time_rows(evaluations: Iterable) -> list:
    """Final-stage rows timed by kernel time (the rows a coverage count may stand on)."""
    return [ev for ev in evaluations if ev.stage == "final"
            and ((ev.env or {}).get("settings") or {}).get("timer") == "kernel"]


def vs_fastest(best: Best) -> float | None:
    """The best candidate's speedup against the fastest baseline timed in its run."""
    sp = [s for b in BASELINES if b in best.baselines_us and (s := best.speedup(b))]
    return min(sp) if sp else None


@dataclass
class ShapeCoverage:
    grid: str
    shape: tuple[int, int, int]
    layout: str                      # the list's layout ("" = any)
    measured: bool
    exported: bool
    best_us: float | None = None
    vs_fastest: float | None = None
    vs_autotuned: float | None = None

    @property
    def bucket(self) -> str:
        return size_bucket(*self.shape)


def read_shape_list(path) -> list[tuple[tuple[int, int, int], str]]:
    """(shape, layout) per row of an M,N,K[,layout] CSV, duplicates dropped ("" = any layout)."""
    out: dict[tuple, str] = {}
    with open_csv(path) as f:
        for i, rec in enumerate(csv_reader(f, path, ("M", "N", "K")), start=2):
            try:
                s = (int(rec["M"]), int(rec["N"]), int(rec["K"]))
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{i}: bad shape row {rec}") from None
            out.setdefault((check_sizes(s, path, i), (rec.get("layout") or "").strip()), None)
    return list(out)


def coverage(evaluations: Iterable, shape_lists: dict[str, list], tuned: Iterable = ()) -> list[ShapeCoverage]:
    """Per (list name, shape): measured, exported and the best speedups. `shape_lists`: name ->
    [(shape, layout)]; `tuned`: the kernel table's tuned rows (.shape, .layout)."""
    rows = kernel_time_rows(evaluations)
    by_layout: dict[str, dict] = {}
    for lay in {lay for lst in shape_lists.values() for _, lay in lst}:
        sel = [ev for ev in rows if not lay or ev.layout == lay]
        by_layout[lay] = {r.shape: r for r in collect(sel, mode="offline")}
    tuned = list(tuned)
    out = []
    for name, lst in shape_lists.items():
        for shape, lay in lst:
            exported = any(t.shape == shape and (not lay or t.layout == lay) for t in tuned)
            r = by_layout[lay].get(shape)
            best = r.overall() if r else None
            out.append(ShapeCoverage(name, shape, lay, best is not None, exported,
                                     best.median_us if best else None,
                                     vs_fastest(best) if best else None,
                                     best.speedup(AUTOTUNED) if best else None))
    return out


def bucket_table(cov: list[ShapeCoverage]) -> list[dict]:
    """Per (list, bucket, then 'all'): shapes, measured, exported, geomeans."""
    out = []
    for name in dict.fromkeys(c.grid for c in cov):
        for _, bucket in BUCKETS + ((None, "all"),):
            sub = [c for c in cov if c.grid == name and (bucket == "all" or c.bucket == bucket)]
            if not sub:
                continue
            m = [c for c in sub if c.measured]
            out.append({"list": name, "bucket": bucket, "shapes": len(sub), "measured": len(m),
                        "exported": sum(c.exported for c in sub),
                        "geomean_vs_fastest": geomean([c.vs_fastest for c in m]),
                        "geomean_vs_cublaslt_autotuned": geomean([c.vs_autotuned for c in m])})
    return out


def write_report(cov: list[ShapeCoverage], out: Path, *, sources: list[str], command: str = "") -> dict:
    """coverage.md (per list and bucket) + coverage.csv (per shape) + buckets.csv."""
    out.mkdir(parents=True, exist_ok=True)
    table = bucket_table(cov)
    with (out / "buckets.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["list"], lineterminator="\n")
        w.writeheader()
        for t in table:
            w.writerow({k: fmt(v) if isinstance(v, float) else v for k, v in t.items()})
    with (out / "coverage.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["list", "M", "N", "K", "layout", "bucket", "measured", "exported", "best_us",
                    "vs_fastest_baseline", "vs_cublaslt_autotuned"])
        for c in cov:
            w.writerow([c.grid, *c.shape, c.layout, c.bucket, int(c.measured), int(c.exported),
                        fmt(c.best_us, 2), fmt(c.vs_fastest), fmt(c.vs_autotuned)])
    md = ["# Coverage", "",
          "Shapes measured by kernel time (final-stage rows, offline mode, a correct candidate), "
          "shapes with an exported winner (tuned rows of generated_kernels/index.csv), and the "
          "geomean over the measured shapes of the best candidate's speedup (median of per-round "
          "ratios in its run) against the fastest baseline of that run and against cuBLASLt "
          "autotuned. A trace shape counts only when measured in the trace's layout.", "",
          "| list | bucket | shapes | measured | exported | geomean vs fastest baseline | "
          "geomean vs cuBLASLt autotuned |", "|---|---|---|---|---|---|---|"]
    for t in table:
        md.append(f"| {t['list']} | {t['bucket']} | {t['shapes']} | {t['measured']} | {t['exported']} | "
                  f"{fmt(t['geomean_vs_fastest'])} | {fmt(t['geomean_vs_cublaslt_autotuned'])} |")
    md += ["", "Results DBs read:", ""] + [f"- `{s}`" for s in sources]
    if command:
        md += ["", f"Made by: `{command}`"]
    (out / "coverage.md").write_text("\n".join(md) + "\n")
    return {"md": out / "coverage.md", "csv": out / "coverage.csv", "buckets": out / "buckets.csv"}


def bucket_gains(evaluations: Iterable) -> dict[str, float]:
    """Per FLOP bucket, the measured geomean speedup against the fastest baseline (kernel time)."""
    per: dict[str, list[float]] = {}
    for r in collect(kernel_time_rows(evaluations), mode="offline"):
        s = vs_fastest(r.overall())
        if s:
            per.setdefault(r.bucket, []).append(s)
    return {b: geomean(v) for b, v in per.items()}


def order_by_gain(shapes: list[Shape], evaluations: Iterable, model, *, layout: str = "") -> list[tuple[Shape, float]]:
    """The shapes no row measured by kernel time (in `layout`, "" = any), most promising first:
    (shape, expected gain) by the rule in this module's docstring."""
    evs = [ev for ev in evaluations if not layout or ev.layout == layout]
    measured = {r.shape for r in collect(kernel_time_rows(evs), mode="offline")}
    gains = bucket_gains(evs)
    todo = [s for s in shapes if (s.M, s.N, s.K) not in measured]
    scored = [(s, gains.get(size_bucket(s.M, s.N, s.K), 1.0), model.predict_baseline_us(s)) for s in todo]
    scored.sort(key=lambda x: (-x[1], -x[2], x[0]))
    return [(s, g) for s, g, _ in scored]



def configure_parser(parser: argparse.ArgumentParser) -> None:
    """`cudal2 report --coverage` (cudal2.cli hands the verb to this module for that flag)."""
    parser.add_argument("--db", nargs="+", default=["results.db"],
                        help="results DB(s) (results.db.gz read as is); rows of all are read")
    parser.add_argument("--grid", default=None,
                        help="the shape grid (M,N,K; default: the repository's shapes.csv)")
    parser.add_argument("--trace", default=None,
                        help="the LLM trace (M,N,K[,layout]; default: the repository's "
                             "shapes/llm_trace.csv); '' to leave it out")
    parser.add_argument("--kernels", default=None,
                        help="generated_kernels root whose tuned rows count as exported (default: $CUDAL2_KERNELS)")
    parser.add_argument("--out", default=None, help="output folder (default reports/<gpu>/<date>-coverage)")


DEFAULT_LISTS = {"grid": "shapes.csv", "trace": "shapes/llm_trace.csv"}


def shape_list_path(name: str, given: str | None) -> Path:
    """The file of shape list `name`: the one given, else the repository's own, found from the
    package rather than the working directory, so the defaults hold wherever the command runs.
    The wheel does not ship the shape lists: there a default is refused, naming the option."""
    if given is not None:
        return Path(given)
    path = knobs.repo_root() / DEFAULT_LISTS[name]
    if not path.is_file():
        raise ValueError(f"--{name}: the default {path} is not here (the shape lists come with "
                         f"a source checkout, not the wheel); pass --{name} FILE")
    return path


def run_cli(args: argparse.Namespace) -> int:
    try:
        args.grid = str(shape_list_path("grid", args.grid))
        if args.trace != "":
            args.trace = str(shape_list_path("trace", args.trace))
        evs = read_rows(args.db)
        lists = {"grid": read_shape_list(args.grid)}
        if args.trace:
            lists["trace"] = read_shape_list(args.trace)
        tuned = KernelIndex.load(args.kernels).tuned_rows()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cudal2 report --coverage: {exc}", file=sys.stderr)
        return 2
    cov = coverage(evs, lists, tuned)
    gpus = sorted({str((e.env or {}).get("gpu", "")) for e in kernel_time_rows(evs)} - {""})
    tag = (gpus[0] if len(gpus) == 1 else "mixed" if gpus else "no-gpu").replace(" ", "_")
    out = Path(args.out) if args.out else Path("reports") / tag / (_dt.date.today().isoformat() + "-coverage")
    cmd = (f"cudal2 report --coverage --db {' '.join(args.db)} --grid {args.grid} --trace '{args.trace}'"
           + (f" --kernels {args.kernels}" if args.kernels else "") + (f" --out {args.out}" if args.out else ""))
    paths = write_report(cov, out, sources=list(args.db), command=cmd)
    (out / "command.txt").write_text(cmd + "\n")
    for t in bucket_table(cov):
        if t["bucket"] == "all":
            print(f"{t['list']}: {t['measured']} of {t['shapes']} shapes measured by kernel time, "
                  f"{t['exported']} with an exported winner")
    print(f"coverage written to {out}: " + ", ".join(p.name for p in paths.values()))
    return 0
