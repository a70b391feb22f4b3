"""`cudal2 bench`: time kernels against torch, cuBLAS and cuBLASLt and write a report folder.

    cudal2 bench --kernels generated_kernels/index.csv --shapes shapes.csv --sample 100 --mode both
    cudal2 bench --kernels my.cu --shapes 4096,4096,4096 512x1024x256 --mode offline

Each (kernel, shape) goes through cudal2.harness.evaluate (build, audit, correctness, timing in
a killable worker; results DB, resumable). The report folder reports/<gpu>/<date>-<name>/ gets:
    results.csv                every evaluation (status, detail, medians per mode and who)
    eval_results_<mode>.csv    CUDA-L2's format: one speedup column per baseline
    summary.md                 geomean / mean / min / count below 1.0 per baseline and mode,
                               per size bucket, flop-weighted, time-weighted over a trace,
                               fraction of peak on large shapes, verdict counts
    speedup_*.png              distributions per baseline and mode, speedup vs size
    command.txt, provenance.json
Without a GPU every stage that can run does (build, audit); nothing is timed and no number is
invented: the command says "not measured: no GPU".
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import random
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cudal2.core.store import KernelIndex
from cudal2.core.toolchain import ToolchainError, detect_arch
from cudal2.harness import ResultsDB, provenance
from cudal2.harness.baselines import EXTRA_BASELINES
from cudal2.harness.bounds import peak_for_name
from cudal2.harness.measure import mode_keys
from cudal2.harness.pipeline import evaluate_many

# Size buckets, geomean and trace weights are shared with `cudal2 report`.
from cudal2.harness.types import BASELINES, MODES, EvalRequest, Shape, medians, unmeasured
from cudal2.runs.report import BUCKETS, fmt, read_weights, size_bucket, speedup_stats
from cudal2.search.tune import read_shapes

LARGE_FLOPS = 1e12


@dataclass(frozen=True)
class Job:
    kernel: str          # path as given / as in the index
    source: str
    shape: Shape
    acc: str | None = None


# ---- inputs -----------------------------------------------------------------------------------------

def parse_shapes(specs: list[str]) -> list[Shape]:
    """Each spec is a CSV file with M,N,K columns or one shape 'M,N,K' / 'MxNxK'."""
    out: list[Shape] = []
    for spec in specs:
        if re.fullmatch(r"\s*\d+\s*[,x]\s*\d+\s*[,x]\s*\d+\s*", spec):
            out.append(Shape.parse(spec.replace(" ", "")))
        elif Path(spec).is_file():
            out.extend(read_shapes(spec))
        else:
            raise ValueError(f"--shapes {spec!r} is neither a readable CSV file nor M,N,K")
    seen: set = set()
    return [s for s in out if not (s in seen or seen.add(s))]


def stratified_sample(shapes: list[Shape], n: int, seed: int = 0) -> list[Shape]:
    """n shapes drawn so each size bucket keeps its share (at least one from every bucket
    present), in the input order."""
    if n >= len(shapes):
        return list(shapes)
    if n < 1:
        raise ValueError(f"--sample must be >= 1, got {n}")
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(shapes):
        groups.setdefault(size_bucket(s.M, s.N, s.K), []).append(i)
    quota = {b: max(1, round(n * len(ix) / len(shapes))) for b, ix in groups.items()}
    while sum(quota.values()) > n:                 # rounding overshoot: trim the largest
        b = max(quota, key=lambda k: (quota[k], k))
        quota[b] -= 1
    while sum(quota.values()) < n:                 # undershoot: grow where shapes remain
        b = max((k for k in quota if quota[k] < len(groups[k])),
                key=lambda k: (len(groups[k]) - quota[k], k))
        quota[b] += 1
    picked = sorted(i for b, ix in groups.items() for i in rng.sample(ix, quota[b]))
    return [shapes[i] for i in picked]


def collect_jobs(kernels: list[str], shapes: list[Shape] | None, arch: str) -> list[Job]:
    """Kernel files, directories of .cu files, or a generated_kernels index.csv -> jobs."""
    jobs: list[Job] = []
    for spec in kernels:
        p = Path(spec)
        index = p if p.name == "index.csv" else (p / "index.csv" if (p / "index.csv").is_file() else None)
        if index is not None:
            idx = KernelIndex.load(index.parent)
            wanted = set(shapes) if shapes else None
            for row in idx.rows:
                shape = Shape(row.M, row.N, row.K)
                if row.arch != arch or (wanted is not None and shape not in wanted):
                    continue
                jobs.append(Job(str(index.parent / row.file), idx.source(row), shape, row.acc))
            continue
        files = sorted(p.rglob("*.cu")) if p.is_dir() else [p]
        if not files:
            raise ValueError(f"--kernels {spec}: no .cu files there")
        if not shapes:
            raise ValueError(f"--kernels {spec}: kernel files need --shapes (an index.csv "
                             "carries its own shapes)")
        for f in files:
            try:
                text = f.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read kernel {f}: {exc}") from None
            jobs.extend(Job(str(f), text, s) for s in shapes)
    return jobs


# ---- the report (pure Python: unit-tested on synthetic rows) -----------------------------------------

def measured(ev, mode: str) -> dict | None:
    """{who: median_us} of an ok, correct, measured evaluation in `mode`, else None (the test of
    "measured" is report.unmeasured, shared with report and export)."""
    return None if unmeasured(ev, mode) is not None else medians(ev, mode)


def summarize(evaluations, mode: str, baselines=BASELINES, weights: dict | None = None,
              peak_tflops: float | None = None) -> dict:
    """Per baseline: n, geomean, mean, min, below_1, flop_weighted, time_weighted, by bucket;
    plus the candidate's fraction of peak on large shapes."""
    rows = [(ev, m) for ev in evaluations if (m := measured(ev, mode))]
    out: dict = {"mode": mode, "n_shapes": len(rows), "baselines": {}}
    for b in baselines:
        pairs = [((ev.shape.M, ev.shape.N, ev.shape.K), m["candidate"], m[b],
                  ((ev.speedups or {}).get(mode) or {}).get(b)) for ev, m in rows if b in m]
        out["baselines"][b] = speedup_stats(pairs, weights)
    if peak_tflops:
        fr = [2.0 * ev.shape.M * ev.shape.N * ev.shape.K / (m["candidate"] * 1e-6) / (peak_tflops * 1e12)
              for ev, m in rows if 2.0 * ev.shape.M * ev.shape.N * ev.shape.K >= LARGE_FLOPS]
        out["large_fraction_of_peak"] = {"n": len(fr), "median": _median(fr),
                                         "max": max(fr) if fr else math.nan}
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def write_results_csv(evaluations, path: Path, modes, baselines) -> Path:
    whos = ["candidate", *baselines]
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["kernel", "source_sha", "M", "N", "K", "acc", "layout", "status", "detail",
                    *[f"{m}_{who}_us" for m in modes for who in whos],
                    *[f"{m}_speedup_{b}" for m in modes for b in baselines]])
        for ev in evaluations:
            t, sp = ev.timings or {}, ev.speedups or {}
            w.writerow([ev.origin, ev.source_sha[:16], ev.shape.M, ev.shape.N, ev.shape.K,
                        ev.acc, ev.layout, ev.status, (ev.detail or "")[:300],
                        *[fmt(((t.get(m) or {}).get(who) or {}).get("median_us"), 3)
                          for m in modes for who in whos],
                        *[fmt((sp.get(m) or {}).get(b), 4) for m in modes for b in baselines]])
    return path


def write_eval_results(evaluations, out: Path, mode: str, baselines) -> Path:
    """CUDA-L2's eval_results layout: one row per shape, one speedup column per baseline
    (speedup = baseline median / our median), plus the medians."""
    path = out / f"eval_results_{mode}.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["mnk", "M", "N", "K", *baselines, "ours_us", *[f"{b}_us" for b in baselines]])
        for ev in evaluations:
            m = measured(ev, mode)
            if not m:
                continue
            w.writerow([f"{ev.shape.M}_{ev.shape.N}_{ev.shape.K}", ev.shape.M, ev.shape.N,
                        ev.shape.K, *[fmt(m[b] / m["candidate"], 4) if b in m else ""
                                      for b in baselines],
                        fmt(m["candidate"], 3), *[fmt(m.get(b), 3) for b in baselines]])
    return path


def summary_markdown(evaluations, modes, baselines, *, title: str, weights=None,
                     peak_tflops: float | None = None, command: str = "",
                     synthetic: bool = False, pngs=()) -> str:
    evs = list(evaluations)
    counts: dict[str, int] = {}
    for ev in evs:
        counts[ev.status] = counts.get(ev.status, 0) + 1
    md = [f"# {title}", ""]
    if synthetic:
        md += ["**SYNTHETIC DATA (tests only): these numbers were not measured.**", ""]
    md += [f"{len(evs)} evaluations; verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
           "", "Speedup = median over interleaved rounds of baseline time / candidate time "
           "(offline: kernel time; e2e_*: the end-to-end call vs torch.matmul, host clock; wall: "
           "CUDA-L2's host clock). "
           "Flop-weighted = total baseline time / total candidate time over the shapes (where the "
           "time goes). A candidate below a physical lower bound is a `too_fast` verdict, never a "
           "speedup.", ""]
    for mode in modes:
        s = summarize(evs, mode, baselines, weights, peak_tflops)
        md += [f"## {mode}", "", f"{s['n_shapes']} measured shapes.", "",
               "| baseline | shapes | geomean | mean | min | below 1.0 | flop-weighted"
               + (" | time-weighted (trace)" if weights else "") + " |",
               "|---|---|---|---|---|---|---" + ("|---" if weights else "") + "|"]
        for b in baselines:
            a = s["baselines"][b]
            md.append(f"| {b} | {a['n']} | {fmt(a['geomean'])} | {fmt(a['mean'])} | "
                      f"{fmt(a['min'])} | {a['below_1']} | {fmt(a['flop_weighted'])}"
                      + (f" | {fmt(a['time_weighted'])}" if weights else "") + " |")
        md += ["", "Geomean by problem size (2*M*N*K flop):", "",
               "| bucket | " + " | ".join(baselines) + " |",
               "|---|" + "---|" * len(baselines)]
        for _, name in BUCKETS:
            cells = [s["baselines"][b]["buckets"].get(name) for b in baselines]
            if any(cells):
                md.append(f"| {name} (n={max(c['n'] for c in cells if c)}) | "
                          + " | ".join(fmt(c["geomean"]) if c else "" for c in cells) + " |")
        lf = s.get("large_fraction_of_peak")
        if lf and lf["n"]:
            md += ["", f"Candidate fraction of dense fp16 peak ({peak_tflops:g} TFLOP/s) on the "
                       f"{lf['n']} shapes >= 1e12 flop: median {fmt(lf['median'])}, max "
                       f"{fmt(lf['max'])}."]
        md.append("")
    if pngs:
        md += [f"![{Path(p).stem}]({Path(p).name})" for p in pngs] + [""]
    if command:
        md += [f"Made by: `{command}`", ""]
    return "\n".join(md)


def plot(evaluations, out: Path, modes, baselines) -> list[Path]:
    """Speedup distribution per baseline and mode, and speedup vs problem size (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evs = list(evaluations)
    paths = []
    for mode in modes:
        rows = [(ev, m) for ev in evs if (m := measured(ev, mode))]
        if not rows:
            continue
        data = [[m[b] / m["candidate"] for _, m in rows if b in m] for b in baselines]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        keep = [(b, d) for b, d in zip(baselines, data) if d]
        ax.boxplot([d for _, d in keep], showfliers=True)
        ax.set_xticks(range(1, len(keep) + 1), [b for b, _ in keep], rotation=20, fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("speedup (baseline / candidate median)")
        ax.set_title(f"speedup distribution per baseline ({mode}, {len(rows)} shapes)")
        fig.tight_layout()
        p = out / f"speedup_distribution_{mode}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for b in baselines:
            pts = [(2.0 * ev.shape.M * ev.shape.N * ev.shape.K, m[b] / m["candidate"])
                   for ev, m in rows if b in m]
            if pts:
                ax.scatter(*zip(*pts), s=10, alpha=0.7, label=b)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("problem size (2*M*N*K flop)")
        ax.set_ylabel("speedup")
        ax.set_title(f"speedup vs size ({mode})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"speedup_vs_size_{mode}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def write_report(evaluations, out: Path, *, modes, baselines=BASELINES, title: str = "",
                 command: str = "", provenance: dict | None = None, weights=None,
                 peak_tflops: float | None = None, synthetic: bool = False) -> dict:
    """The whole report folder from Evaluations. Returns {"csv", "eval_results", "summary",
    "pngs", "command", "provenance"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    evs = list(evaluations)
    paths: dict = {"csv": write_results_csv(evs, out / "results.csv", modes, baselines),
                   "eval_results": [write_eval_results(evs, out, m, baselines) for m in modes]}
    try:
        pngs = plot(evs, out, modes, baselines)
    except ImportError:
        pngs = []                    # matplotlib absent: the markdown and CSVs still stand
    paths["pngs"] = pngs
    summary = out / "summary.md"
    summary.write_text(summary_markdown(evs, modes, baselines, title=title or "cudal2 bench",
                                        weights=weights, peak_tflops=peak_tflops,
                                        command=command, synthetic=synthetic, pngs=pngs))
    paths["summary"] = summary
    (out / "command.txt").write_text(command + "\n")
    paths["command"] = out / "command.txt"
    prov = dict(provenance or {}, command=command, synthetic=synthetic,
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    (out / "provenance.json").write_text(json.dumps(prov, indent=1, sort_keys=True, default=str))
    paths["provenance"] = out / "provenance.json"
    return paths


# ---- the verb -----------------------------------------------------------------------------------------

def configure_parser(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--kernels", nargs="+", required=True,
                        help="kernel .cu files, directories of them, or a generated_kernels "
                             "index.csv (which carries each kernel's shapes)")
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="shape CSV files (M,N,K columns, e.g. shapes.csv) and/or shapes "
                             "M,N,K or MxNxK; required for kernel files")
    parser.add_argument("--sample", type=int, default=None,
                        help="evaluate a sample of this many shapes, stratified by size bucket")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    parser.add_argument("--mode", default="offline",
                        choices=("offline", "server", "e2e", "wall", "both", "all"),
                        help="offline: kernel time (spin + back-to-back calls on cold operands); "
                             "server: single calls after --server-gaps-ms idle gaps; e2e: the "
                             "end-to-end cudal2.matmul call vs torch.matmul; wall: CUDA-L2's "
                             "host-clock timer; both: offline+e2e+server; all: the four")
    parser.add_argument("--server-gaps-ms", type=float, nargs="+", default=None,
                        help="server mode's idle gaps (default 1 10)")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma-separated subset of {','.join(BASELINES)}")
    parser.add_argument("--extra-baselines", default="",
                        help=f"PyTorch switches as extra baselines: {','.join(EXTRA_BASELINES)}")
    parser.add_argument("--operands", default="cold", choices=("cold", "hot"),
                        help="cold: operand sets whose total exceeds 3x L2 rotate; hot: one set")
    parser.add_argument("--acc", choices=("f32", "f16"), default=None,
                        help="accumulator to require (default: each kernel's declared acc)")
    parser.add_argument("--arch", default=None, help="target arch (default: the visible GPU, CUDAL2_ARCH)")
    parser.add_argument("--seeds", type=int, default=3, help="correctness seeds per evaluation")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per evaluation")
    parser.add_argument("--db", default="results.db", help="results DB (resumable; default results.db)")
    parser.add_argument("--out", default=None, help="report folder (default reports/<gpu>/<date>-<name>)")
    parser.add_argument("--name", default="bench", help="report name (default bench)")
    parser.add_argument("--weights", default=None,
                        help="weighted shape CSV (M,N,K,weight; shapes/llm_trace.csv) for a "
                             "time-weighted speedup")
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit 3 when no GPU is visible (default: build + audit, exit 0)")


def _modes(args) -> tuple[str, ...]:
    return {"both": ("offline", "e2e", "server"), "all": MODES}.get(args.mode, (args.mode,))


def _list(text: str, known, what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in known]
    if bad:
        raise ValueError(f"unknown {what} {bad}; known: {', '.join(known)}")
    return items


def run_cli(args: argparse.Namespace) -> int:

    try:
        arch = detect_arch(args.arch)
    except (ToolchainError, ValueError, RuntimeError) as exc:
        print(f"cudal2 bench: {exc}", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        if shapes is not None and args.sample:
            shapes = stratified_sample(shapes, args.sample, args.seed)
        jobs = collect_jobs(args.kernels, shapes, arch)
        baselines = _list(args.baselines, BASELINES, "baseline(s)")
        extras = _list(args.extra_baselines, EXTRA_BASELINES, "extra baseline(s)")
        weights = read_weights(args.weights) if args.weights else None
    except ValueError as exc:
        print(f"cudal2 bench: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print("cudal2 bench: nothing to evaluate (no kernel matches these shapes and arch "
              f"{arch})", file=sys.stderr)
        return 2
    modes = _modes(args)
    gpu = provenance.gpu_visible()
    n_kernels = len({j.kernel for j in jobs})
    print(f"cudal2 bench: {len(jobs)} evaluations ({n_kernels} kernels, "
          f"{len({j.shape for j in jobs})} shapes) for {arch}, modes {'+'.join(modes)}, "
          f"baselines {', '.join(baselines + extras)}; DB {args.db}")
    if not gpu:
        print("cudal2 bench: no GPU visible: building and auditing only; timing needs a GPU")
    gaps = {"server_gaps_ms": tuple(args.server_gaps_ms)} if args.server_gaps_ms else {}
    requests = [EvalRequest(j.source, j.shape, arch=arch, acc=args.acc or None, modes=modes,
                            baselines=baselines, seeds=args.seeds, timeout_s=args.timeout,
                            origin=j.kernel, operands=args.operands, extra_baselines=extras,
                            **gaps) for j in jobs]

    db = ResultsDB(args.db)
    t0 = time.time()

    def progress(done: int, total: int, ev) -> None:
        el = time.time() - t0
        eta = el / done * (total - done) if done else 0
        print(f"\r[{done}/{total}] {ev.shape} {ev.status:<13} elapsed {el:6.0f}s ETA {eta:6.0f}s",
              end="" if done < total else "\n", flush=True)
    evs = evaluate_many(requests, db=db, gpu=gpu, progress=progress)
    for ev, j in zip(evs, jobs):
        ev.origin = j.kernel                 # cached rows keep the kernel path for the report
    counts: dict[str, int] = {}
    for ev in evs:
        counts[ev.status] = counts.get(ev.status, 0) + 1
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if not gpu:
        for ev in evs:
            if ev.status not in ("not_measured",):
                print(f"  {ev.origin} {ev.shape}: {ev.status}: {ev.detail}")
        print("not measured: no GPU. Built and audited only; no timing, no report numbers.")
        ok = all(ev.status == "not_measured" for ev in evs)
        return 3 if args.require_gpu else (0 if ok else 1)
    gpu_name = provenance.gpu_name() or "gpu"
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", gpu_name.replace("NVIDIA ", "")).strip("_")
    out = Path(args.out) if args.out else Path("reports") / tag / f"{_dt.date.today().isoformat()}-{args.name}"
    peak = peak_for_name(gpu_name)
    command = "cudal2 bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    keys = mode_keys(requests[0])
    paths = write_report(evs, out, modes=keys, baselines=baselines + extras,
                         title=f"cudal2 bench on {gpu_name}: {args.name}", command=command,
                         provenance=provenance.collect(gpu=True), weights=weights,
                         peak_tflops=peak.tflops_fp16 if peak else None)
    print(f"report written to {out}: {paths['summary'].name}, {paths['csv'].name}, "
          f"{len(paths['pngs'])} PNG(s)")
    return 0 if counts.get("ok") else 1

