"""`cudal2 report --budget`: the streaming budget (cudal2.templates.budget) against every
committed Hopper decode row a budgeted family ran, and the fit of its device terms.

Rows: every ok row of a results DB (results.db or .db.gz, searched under the given paths) whose
family is one the budget models, whose small dimension is <= 64, measured on an H100 or H200 by
kernel time: a final's offline median, else a screening's median (3-8 rounds; labelled). Each is
replayed as the build that ran: its meta's params, ptxas registers, shared memory, and its
runtime options; a build whose meta declares no "decomposition" option predates stream-K and ran
split-K (decomposition 2), one that declares no cluster reduction reduced through the workspace.

The fit: the four device terms (DRAM latency, stream floor, the workspace reducer's round trip
and a split CTA's store-and-arrive cost) that minimise the RMS of log(measured / predicted)
over every point of a grid (FIT_GRID), per GPU, on the streaming families' rows (the tile grids'
few committed rows, lowlat's default configs, are reported beside them, not fitted). The report: per row predicted beside measured and the log
error; per group (family, M, split count, stage) the median error; the rank correlation and the
median and 90th-percentile |log error|; the worst rows.

    cudal2 report --budget reports/ --out reports/cpu/DATE-decode-budget
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cudal2.core.devices import GpuSpec, gpu_for
from cudal2.harness.db import ResultsDB
from cudal2.search.costmodel import spearman
from cudal2.templates.budget import BUDGETED, STREAMING, TILED, as_built, budget, replayable
from cudal2.templates.family import KernelConfig

# The grid the fit searches: (latency ns, floor us, reducer round trip us, split store us).
FIT_GRID = (tuple(range(300, 2001, 150)), (0.5, 1.0, 2.0, 3.0, 4.0, 5.0),
            (0.1, 0.2, 0.3, 0.5, 0.8, 1.2), (0.0, 0.5, 1.0, 2.0))
FIELDS = ("gpu", "M", "N", "K", "layout", "family", "config", "options", "stage", "registers",
          "measured_us", "predicted_us", "log_error", "waves", "inflight_per_sm_kib", "reduction",
          "t_floor_us", "t_stream_us", "t_reduce_us")


@dataclass(frozen=True)
class Row:
    """One measured decode row, replayable by the budget."""
    gpu: str
    config: KernelConfig
    shape: tuple[int, int, int]
    layout: str
    options: dict
    registers: int
    smem_bytes: int
    how: tuple               # budget.as_built's reduction keywords, as pairs
    measured_us: float
    stage: str

    def predict(self, gpu: GpuSpec):
        return budget(self.config, self.shape, gpu, options=self.options, registers=self.registers,
                      smem_bytes=self.smem_bytes, **dict(self.how))


def db_paths(paths) -> list[Path]:
    """Results DBs under each path (a DB file itself, or a folder searched recursively)."""
    out = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.rglob("results.db*") if q.name in ("results.db", "results.db.gz"))
        else:
            raise ValueError(f"{p}: no such results DB or folder")
    return out


def decode_rows(paths) -> list[Row]:
    """Every committed Hopper decode row of a budgeted family (see the module's docstring)."""
    rows = []
    for path in db_paths(paths):
        for ev in ResultsDB(path, readonly=True).rows():
            fam, gpu = ev.meta.get("family"), ev.env.get("gpu") or ""
            if ev.status != "ok" or fam not in BUDGETED or not ("H100" in gpu or "H200" in gpu):
                continue
            if not replayable(fam, ev.shape.M, ev.shape.N) or not isinstance(ev.meta.get("params"), dict):
                continue
            mode = "offline" if ev.stage == "final" else "screen"
            t = (ev.timings.get(mode) or {}).get("candidate", {}).get("median_us")
            if not t:
                continue
            cfg = KernelConfig(fam, tuple(ev.meta["params"].items()))
            options, how = as_built(ev.meta, ev.options)
            rows.append(Row(gpu_for(gpu=gpu).name, cfg, (ev.shape.M, ev.shape.N, ev.shape.K),
                            ev.layout, options, int(ev.build.get("registers") or 0),
                            int(ev.meta.get("smem_bytes") or 0), tuple(sorted(how.items())),
                            float(t), ev.stage))
    return rows


def streaming_rows(rows: list[Row]) -> list[Row]:
    """The rows the device terms are fitted on: the streaming families'."""
    return [r for r in rows if r.config.family in STREAMING]


def with_terms(gpu: GpuSpec, terms) -> GpuSpec:
    L, F, R, W = terms
    return dataclasses.replace(gpu, dram_latency_ns=float(L), stream_floor_us=float(F),
                               fixup_peer_us=float(R), fixup_store_us=float(W))


def terms_of(gpu: GpuSpec) -> tuple:
    return (gpu.dram_latency_ns, gpu.stream_floor_us, gpu.fixup_peer_us, gpu.fixup_store_us)


def log_errors(rows: list[Row], gpu: GpuSpec) -> np.ndarray:
    return np.array([math.log(r.measured_us / r.predict(gpu).t_us) for r in rows])


def rms(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(errors ** 2))) if len(errors) else float("nan")


def fit(rows: list[Row], gpu: GpuSpec, grid=FIT_GRID) -> tuple[tuple, float]:
    """The grid's terms with the least RMS log error over `rows` (every point tried), and that
    error."""
    scored = ((rms(log_errors(rows, with_terms(gpu, t))), t) for t in itertools.product(*grid))
    err, terms = min(scored)
    return tuple(terms), err


def _group_lines(rows: list[Row], errors: np.ndarray) -> list[str]:
    keys = {"family": lambda r: r.config.family, "M": lambda r: r.shape[0],
            "splits asked": lambda r: r.options.get("splits", 0), "stage": lambda r: r.stage}
    out = []
    for name, key in keys.items():
        groups: dict = {}
        for r, e in zip(rows, errors):
            groups.setdefault(key(r), []).append(e)
        parts = [f"{k}: {len(v)} rows, median {np.median(v):+.2f}" for k, v in sorted(groups.items())]
        out.append(f"- by {name}: " + "; ".join(parts))
    return out


def report(rows: list[Row], out: Path, *, refit: bool = True, command: str = "") -> str:
    """rows.csv.gz and README.md under `out`; returns the README's text."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# The streaming budget against the committed Hopper decode rows", "",
             *([f"Made by `{command}` (no GPU: it reads committed results DBs).", ""] if command else []),
             "Measured: kernel time from the committed results DBs (a final's offline median, "
             "else a screening's median). Predicted: cudal2.templates.budget with cudal2.core.devices' "
             "terms, each row replayed as the build that ran (its registers, its options; a build "
             "without the stream-K option ran split-K, one without the cluster reduction reduced "
             "through the workspace). Error: log(measured / predicted); > 0 means slower than "
             "predicted.", ""]
    with gzip.open(out / "rows.csv.gz", "wt", newline="") as f:   # a row dump: committed gzipped
        w = csv.writer(f, lineterminator="\n")
        w.writerow(FIELDS)
        for name in sorted({r.gpu for r in rows}):
            mine = [r for r in rows if r.gpu == name]
            gpu = gpu_for(gpu=name)
            lines += [f"## {name}: {len(mine)} rows", ""]
            if refit and not streaming_rows(mine):
                lines += ["No streaming-family rows: no fit.", ""]
            elif refit:
                terms, err = fit(streaming_rows(mine), gpu)
                lines += [f"Fit over FIT_GRID on the {len(streaming_rows(mine))} streaming-family "
                          f"rows: latency {terms[0]} ns, floor {terms[1]} us, reducer round "
                          f"trip {terms[2]} us, split store {terms[3]} us (RMS log error {err:.3f}); "
                          f"the table's terms: {terms_of(gpu)}.", ""]
            e = log_errors(mine, gpu)
            preds = [r.predict(gpu) for r in mine]
            rho = spearman([p.t_us for p in preds], [r.measured_us for r in mine])
            lines += [f"With the table's terms: rank correlation {rho:.3f}, RMS log error {rms(e):.3f}, "
                      f"median |log error| {np.median(np.abs(e)):.3f} ({math.exp(np.median(np.abs(e))):.2f}x), "
                      f"90th percentile {np.percentile(np.abs(e), 90):.3f} "
                      f"({math.exp(np.percentile(np.abs(e), 90)):.2f}x).", ""]
            for label, part in (("streaming families", STREAMING), ("tile grids", TILED)):
                idx = [i for i, r in enumerate(mine) if r.config.family in part]
                if idx and len(idx) < len(mine):
                    pe = e[idx]
                    pr = spearman([preds[i].t_us for i in idx], [mine[i].measured_us for i in idx])
                    lines.append(f"- the {label}' {len(idx)} rows: rank correlation {pr:.3f}, RMS log "
                                 f"error {rms(pe):.3f}, median |log error| {np.median(np.abs(pe)):.3f}")
            lines += _group_lines(mine, e) + ["", "Worst rows:", ""]
            for i in np.argsort(-np.abs(e))[:12]:
                r, p = mine[i], preds[i]
                lines.append(f"- {'x'.join(map(str, r.shape))} {r.config.label()} {r.options} "
                             f"({r.stage}): measured {r.measured_us:.1f} us, predicted {p.t_us:.1f} "
                             f"({e[i]:+.2f})")
            lines.append("")
            for r, p, ei in zip(mine, preds, e):
                w.writerow([r.gpu, *r.shape, r.layout, r.config.family, r.config.label(),
                            ";".join(f"{k}={v}" for k, v in sorted(r.options.items())), r.stage,
                            r.registers, f"{r.measured_us:.3f}", f"{p.t_us:.3f}", f"{ei:.4f}",
                            p.waves, f"{p.inflight_per_sm / 1024:.1f}", p.reduction,
                            f"{p.t_floor_us:.3f}", f"{p.t_stream_us:.3f}", f"{p.t_reduce_us:.3f}"])
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="results DBs, or folders searched for them")
    parser.add_argument("--out", type=Path, required=True, help="folder for rows.csv.gz and README.md")
    parser.add_argument("--no-fit", action="store_true", help="skip the grid fit (the table's terms only)")


def run_cli(args) -> int:
    rows = decode_rows(args.paths)
    if not rows:
        raise ValueError(f"no Hopper decode rows of {', '.join(BUDGETED)} in {' '.join(args.paths)}")
    command = "cudal2 report --budget " + " ".join(map(str, args.paths)) + f" --out {args.out}" + (
        " --no-fit" if args.no_fit else "")
    print(report(rows, args.out, refit=not args.no_fit, command=command), end="")
    return 0
