"""Export measured winners from the results DB into generated_kernels/ (`cudal2 export`).

The only way a kernel enters the dispatch table. For each (arch, acc, layout, shape) the
evaluation with the best recorded median time in the chosen mode is taken -- status ok,
correctness ok, measured (never `estimated`) -- and exported only if it beats the *best*
baseline timed in the same run by the stated margin (default 2%). Sources are written through
cudal2.kernels.KernelIndex (identical sources stored once, atomic index.csv), with tuned=1, the
speedup against every baseline and the report the numbers came from. Everything refused is
listed with its reason.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .report import medians, on_gpu, unmeasured

DEFAULT_MARGIN = 0.02


@dataclass
class Decision:
    key: tuple                      # (arch, acc, layout, M, N, K)
    source_sha: str
    exported: bool
    reason: str                     # why refused, or what was exported
    median_us: float | None = None
    best_baseline: str = ""
    speedups: dict = field(default_factory=dict)


@dataclass
class ExportResult:
    decisions: list[Decision]
    index_path: Path | None

    @property
    def exported(self) -> list[Decision]:
        return [d for d in self.decisions if d.exported]

    @property
    def refused(self) -> list[Decision]:
        return [d for d in self.decisions if not d.exported]


def _exportable(ev, mode: str) -> str | None:
    """None if the row may be exported, else why not."""
    why = unmeasured(ev, mode)
    if why is None and (not ev.acc or not ev.layout):
        why = "accumulator/layout unknown"
    return why


def select(evaluations: Iterable, *, mode: str = "offline", margin: float = DEFAULT_MARGIN,
           gpu: str | None = None) -> list[Decision]:
    """One decision per (arch, acc, layout, shape) seen in `evaluations` (measured or not)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    groups: dict[tuple, list] = {}
    for ev in evaluations:
        if not on_gpu(ev, gpu):
            continue
        key = (ev.arch, ev.acc, ev.layout, ev.shape.M, ev.shape.N, ev.shape.K)
        groups.setdefault(key, []).append(ev)
    out = []
    for key in sorted(groups, key=str):
        evs = groups[key]
        usable = [ev for ev in evs if _exportable(ev, mode) is None]
        if not usable:
            why = sorted({_exportable(ev, mode) for ev in evs})
            out.append(Decision(key, evs[0].source_sha, False, "nothing measured: " + "; ".join(why)))
            continue
        gpus = {(ev.env or {}).get("gpu", "") for ev in usable}
        if len(gpus) > 1:
            out.append(Decision(key, "", False, f"measured on several GPUs {sorted(gpus)}: pick one with --gpu"))
            continue
        best = min(usable, key=lambda ev: medians(ev, mode)["candidate"])
        bases = medians(best, mode)
        cand = bases.pop("candidate")
        if not bases:
            out.append(Decision(key, best.source_sha, False, "no baseline timed in the same run", cand))
            continue
        speedups = {w: t / cand for w, t in bases.items()}
        worst = min(speedups, key=speedups.get)           # the best baseline = the smallest speedup
        d = Decision(key, best.source_sha, False, "", cand, worst, speedups)
        if speedups[worst] < 1.0 + margin:
            d.reason = (f"did not beat the best baseline {worst} ({bases[worst]:.2f} us) by "
                        f"{margin:.0%}: {cand:.2f} us, speedup {speedups[worst]:.3f}")
        else:
            d.exported = True
            d.reason = f"{cand:.2f} us, {speedups[worst]:.3f}x the best baseline {worst}"
        out.append(d)
    return out


def export(evaluations: Iterable, source_for: Callable[[str], str | None], *, root=None,
           mode: str = "offline", margin: float = DEFAULT_MARGIN, report: str = "",
           gpu: str | None = None, family_for: Callable[[str], str] | None = None,
           dry_run: bool = False) -> ExportResult:
    """Select winners and write them into the store at `root` (default: knobs.kernels_dir()).
    `source_for(sha)` returns the kernel text of a source sha (None if unknown: refused).
    A shape already tuned with a better worst-case speedup keeps its kernel."""
    from .kernels import KernelIndex, sha256_text

    if not report:
        raise ValueError("export needs `report`: the run the numbers came from (a path or a name)")
    evaluations = list(evaluations)
    metas = {ev.source_sha: (ev.meta or {}) for ev in evaluations}
    decisions = select(evaluations, mode=mode, margin=margin, gpu=gpu)
    idx = KernelIndex.load(root)
    changed = False
    for d in decisions:
        if not d.exported:
            continue
        src = source_for(d.source_sha)
        if src is None or sha256_text(src) != d.source_sha:
            d.exported, d.reason = False, f"source {d.source_sha[:12]} not found (or does not match its sha)"
            continue
        arch, acc, layout, M, N, K = d.key
        old = idx.get(*d.key)
        if old is not None and old.tuned and old.speedups and old.sha256 != d.source_sha and \
                min(old.speedups.values()) >= d.speedups[d.best_baseline]:
            d.exported = False
            d.reason = (f"kept the tuned kernel already there ({old.file}, worst speedup "
                        f"{min(old.speedups.values()):.3f} from {old.report})")
            continue
        family = (family_for(d.source_sha) if family_for else "") or str(
            metas.get(d.source_sha, {}).get("family") or metas.get(d.source_sha, {}).get("style") or "")
        idx.add(src, arch=arch, acc=acc, layout=layout, M=M, N=N, K=K, family=family, tuned=True,
                mode=mode, report=report, speedups={k: round(v, 4) for k, v in d.speedups.items()})
        changed = True
    path = idx.write() if changed and not dry_run else None
    return ExportResult(decisions, path)


def sources_from(db=None, dirs: Iterable = ()) -> Callable[[str], str | None]:
    """A sha -> source resolver: the results DB (if it stores sources), then `<dir>/<sha>.cu`."""
    dirs = [Path(d) for d in dirs]

    def find(sha: str) -> str | None:
        getter = getattr(db, "source", None) if db is not None else None
        if getter is not None:
            try:
                s = getter(sha)
            except (KeyError, LookupError):
                s = None
            if s:
                return s
        for d in dirs:
            for p in (d / f"{sha}.cu", d / f"{sha[:16]}.cu"):
                if p.is_file():
                    return p.read_text()
        return None

    return find


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default="results.db", help="results DB (SQLite)")
    parser.add_argument("--mode", default="offline", choices=("offline", "server", "wall"),
                        help="the timing mode a winner must win in")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="required lead over the best baseline (0.02 = 2%%)")
    parser.add_argument("--report", required=True, help="the report the numbers come from (path or name)")
    parser.add_argument("--gpu", default=None, help="only rows measured on this GPU (substring)")
    parser.add_argument("--arch", default=None, help="only this arch")
    parser.add_argument("--sources", nargs="*", default=[], help="folders of <sha>.cu files (a campaign pack)")
    parser.add_argument("--out", default=None, help="generated_kernels root (default: CUDAL2_KERNELS)")
    parser.add_argument("--dry-run", action="store_true", help="decide and print, write nothing")
    parser.add_argument("--verbose", action="store_true", help="list every refusal")


def run_cli(args: argparse.Namespace) -> int:
    from . import knobs
    from .harness.db import ResultsDB

    if not Path(args.db).exists():
        print(f"cudal2 export: no results DB at {args.db}", file=sys.stderr)
        return 2
    db = ResultsDB(args.db)
    rows = db.rows()
    if args.arch:
        rows = [r for r in rows if r.arch == args.arch]
    root = Path(args.out) if args.out else knobs.kernels_dir()
    print(f"export: {len(rows)} DB rows from {args.db}, mode {args.mode}, margin {args.margin:.0%}, into {root}")
    res = export(rows, sources_from(db, args.sources), root=root, mode=args.mode, margin=args.margin,
                 report=args.report, gpu=args.gpu, dry_run=args.dry_run)
    for d in res.exported:
        print(f"  exported {d.key}: {d.reason}")
    refused = res.refused
    for d in refused if args.verbose else refused[:20]:
        print(f"  refused  {d.key}: {d.reason}")
    if len(refused) > 20 and not args.verbose:
        print(f"  ... {len(refused) - 20} more refusals (--verbose lists them)")
    print(f"{len(res.exported)} exported, {len(refused)} refused; "
          + (f"index: {res.index_path}" if res.index_path else "nothing written"))
    return 0
