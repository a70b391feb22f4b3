"""Export measured winners from the results DB into a kernel table (`cudal2 export`).

The table is the user's own by default (knobs.user_kernels_dir(): CUDAL2_USER_KERNELS, else
<CUDAL2_CACHE>/kernels), outside the installed package so a pip upgrade never erases it; dispatch
layers it over the shipped generated_kernels/ (cudal2.core.tables). `--out generated_kernels`
writes the shipped table (the repository's own workflow). `--with-binaries` also stores each
tuned kernel's built library in the table (cudal2.core.binaries), so a machine without nvcc
serves it.

The only way a kernel enters the dispatch table. The export rule (docs/measurement.md): for each
(arch, acc, layout, shape), among final-stage rows that are ok, correct and measured (never
`estimated`, never screening), a kernel (with its runtime options) is exported only if

  1. the LOWER end of its kernel-time speedup interval against every baseline timed in the same
     session is at least 1 + margin (default 2%): a win that noise could explain is no win; and
  2. its end-to-end call (cudal2.matmul as users call it) is not slower than torch.matmul: the
     upper end of every end-to-end speedup interval measured is at least 1.0.

The row with the highest such lower bound wins. A row of the table is (arch, acc, layout, shape,
GPU model): each GPU's measurements export into that GPU's own row (`gpu`, the name the results DB
records, vocab.gpu_key), so tables of an H100 and an H200 (both sm_90a) coexist. When the table
already holds another kernel for that row (another model's campaign, another DB), the same rule
settles it: the higher lower bound stays, a tie keeps the table's row, and the loser (its kernel,
options, figure, report and DB) is recorded in the table's settled.csv. Sources are written
through cudal2.core.store.KernelIndex (identical sources stored once, atomic index.csv), with
tuned=1, the median speedup against every baseline, the interval's lower end, the options and the
report the numbers came from, and the row's token bucket (`m_bucket`, cudal2.core.vocab.m_bucket):
dispatch serves the kernel at the other M of that bucket it accepts. Each row also carries what
dispatch may trust of the kernel's meta: `config`, the family config name when the source is an
instantiation of one of our families byte for byte (cudal2.templates.config_of; its meta is ours,
trusted in full), and `verified`, the meta fields the winning row's audit confirmed against the
binary (cudal2.harness.metacheck); a kernel whose tile is neither serves only the shape it was
measured at (docs/dispatch.md). And `audit`, the audit version the winning row stands for
(cudal2.harness.audit.audited_version: its rules, as far as the call guard watched its calls):
a row below this cudal2's AUDIT_VERSION is written but does not serve until `cudal2 reaudit`.
Rows of the table without a `config` get one when their source is an instantiation. A tuned row whose kernel was measured again in these rows and now fails the rule
leaves the table. Everything refused is listed with its reason.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cudal2.core import binaries, knobs
from cudal2.core.build import BuildSpec, build_many
from cudal2.core.identity import source_sha
from cudal2.core.store import SPEEDUP_COLUMNS, IndexRow, KernelIndex, format_options
from cudal2.core.tables import audit_current
from cudal2.core.toolchain import find_toolchain
from cudal2.core.vocab import AUDIT_VERSION, WIN_MARGIN, gpu_key, m_bucket
from cudal2.harness.audit import audited_version
from cudal2.harness.db import ResultsDB
from cudal2.harness.types import on_gpu, unmeasured
from cudal2.templates import config_of

DEFAULT_MARGIN = WIN_MARGIN  # the same rule the runtime's first-call race applies
E2E_PREFIX = "e2e_"


@dataclass
class Decision:
    key: tuple                      # (arch, acc, layout, M, N, K)
    source_sha: str
    exported: bool
    reason: str                     # why refused, or what was exported
    median_us: float | None = None
    best_baseline: str = ""
    speedups: dict = field(default_factory=dict)      # baseline -> median speedup (offline)
    speedup_lo: float | None = None                   # min over baselines of the interval's lower end
    options: dict = field(default_factory=dict)
    removed: str = ""               # a tuned row that left the table (its file), if any
    gpu: str = ""                   # the GPU model the rows were measured on (vocab.gpu_key)
    kept: str = ""                  # the table's row (its file) that this winner did not beat
    verified: tuple = ()            # meta fields the winning row's audit confirmed (metacheck)
    audit: int = 0                  # the audit version it passed (audit.audited_version)


@dataclass
class ExportResult:
    decisions: list[Decision]
    index_path: Path | None

    @property
    def exported(self) -> list[Decision]:
        return [d for d in self.decisions if d.exported]

    @property
    def refused(self) -> list[Decision]:
        return [d for d in self.decisions if not d.exported and not d.kept]

    @property
    def removed(self) -> list[Decision]:
        return [d for d in self.decisions if d.removed]

    @property
    def kept(self) -> list[Decision]:
        return [d for d in self.decisions if d.kept]


def lowest_interval(ev, mode: str = "offline") -> tuple[str, dict] | None:
    """(baseline, its speedup interval) with the lowest lower end among the baselines timed in
    the row's session: the one the export rule must clear. None when no interval was recorded."""
    ivs = ((ev.stats or {}).get(mode) or {}).get("speedup") or {}
    timed = [b for b in ((ev.speedups or {}).get(mode) or {})
             if isinstance(ivs.get(b), dict) and ivs[b].get("lo") is not None]
    if not timed:
        return None
    lo_b = min(timed, key=lambda b: ivs[b]["lo"])
    return lo_b, ivs[lo_b]


def verdict(ev, mode: str = "offline", margin: float = DEFAULT_MARGIN) -> tuple[bool, str, float | None]:
    """(passes, why, lower bound) of the export rule for one measured row."""
    why = unmeasured(ev, mode)
    if why is None and (not ev.acc or not ev.layout):
        why = "accumulator/layout unknown"
    if why is None and getattr(ev, "stage", "final") != "final":
        why = "a screening row (ranking only)"
    if why:
        return False, why, None
    ivs = ((ev.stats or {}).get(mode) or {}).get("speedup") or {}
    timed = set(((ev.speedups or {}).get(mode) or {}))
    if not timed:
        return False, "no baseline timed in the same session", None
    missing = sorted(b for b in timed if not isinstance(ivs.get(b), dict) or ivs[b].get("lo") is None)
    if missing:
        return False, f"no speedup interval vs {missing} (timed before the kernel timer)", None
    lo_b, iv = lowest_interval(ev, mode)
    lo = float(iv["lo"])
    if lo < 1.0 + margin:
        return False, (f"interval vs {lo_b} [{iv['lo']:.3f}, {iv['hi']:.3f}] "
                       f"(median {iv['median']:.3f}) does not clear {1 + margin:.2f}"), lo
    e2e = {k: v for k, v in (ev.stats or {}).items() if k.startswith(E2E_PREFIX)}
    if not e2e:
        return False, "end-to-end call not measured", lo
    for k, v in sorted(e2e.items()):
        iv = (v.get("speedup") or {}).get("torch") or {}
        if iv.get("hi") is None or iv["hi"] < 1.0:
            return False, (f"end-to-end {k[len(E2E_PREFIX):]} slower than torch.matmul "
                           f"(interval [{iv.get('lo', float('nan')):.3f}, {iv.get('hi', float('nan')):.3f}])"), lo
    return True, f"lower bound {lo:.3f} vs {lo_b}; end-to-end not slower", lo


def select(evaluations: Iterable, *, mode: str = "offline", margin: float = DEFAULT_MARGIN,
           gpu: str | None = None) -> list[Decision]:
    """One decision per (arch, acc, layout, shape, GPU model) seen in `evaluations` (measured or
    not)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    groups: dict[tuple, list] = {}
    for ev in evaluations:
        if not on_gpu(ev, gpu) or getattr(ev, "stage", "final") != "final":
            continue
        key = (ev.arch, ev.acc, ev.layout, ev.shape.M, ev.shape.N, ev.shape.K)
        groups.setdefault((key, gpu_key((ev.env or {}).get("gpu"))), []).append(ev)
    out = []
    for key, gpu in sorted(groups, key=str):
        evs = groups[key, gpu]
        judged = [(ev, *verdict(ev, mode, margin)) for ev in evs]
        measured = [j for j in judged if j[3] is not None]
        if not measured:
            why = sorted({j[2] for j in judged})
            out.append(Decision(key, evs[0].source_sha, False, "nothing measured: " + "; ".join(why),
                                gpu=gpu))
            continue
        passing = [j for j in measured if j[1]]
        ev, ok, why, lo = max(passing or measured, key=lambda j: j[3])
        sp = dict((ev.speedups or {}).get(mode) or {})
        cand = ev.timings[mode]["candidate"]["median_us"]
        worst = min(sp, key=sp.get) if sp else ""
        out.append(Decision(key, ev.source_sha, ok, (f"{cand:.2f} us, " if ok else "") + why, cand,
                            worst, sp, lo, dict(ev.options or {}), gpu=gpu,
                            verified=tuple((ev.audit or {}).get("meta_verified") or ()),
                            audit=audited_version(ev.audit)))
    return out


def export(evaluations: Iterable, source_for: Callable[[str], str | None], *, root=None,
           mode: str = "offline", margin: float = DEFAULT_MARGIN, report: str = "",
           gpu: str | None = None, family_for: Callable[[str], str] | None = None,
           dry_run: bool = False, db: str = "") -> ExportResult:
    """Select winners and write them into the store at `root` (default: the user's table,
    knobs.user_kernels_dir(); the shipped table is never written unless named).
    `source_for(sha)` returns the kernel text of a source sha (None if unknown: refused). A tuned
    row whose (kernel, options) these rows measured again and refused leaves the table; another
    kernel in the winner's row is settled by `settle`. `db`: the results DB the rows came from
    (recorded with a loser in settled.csv)."""
    if not report:
        raise ValueError("export needs `report`: the run the numbers came from (a path or a name)")
    evaluations = list(evaluations)
    metas = {ev.source_sha: (ev.meta or {}) for ev in evaluations}
    remeasured = {(ev.arch, ev.acc, ev.layout, ev.shape.M, ev.shape.N, ev.shape.K,
                   gpu_key((ev.env or {}).get("gpu")), ev.source_sha, format_options(ev.options or {}))
                  for ev in evaluations if on_gpu(ev, gpu) and unmeasured(ev, mode) is None
                  and getattr(ev, "stage", "final") == "final"}
    decisions = select(evaluations, mode=mode, margin=margin, gpu=gpu)
    idx = KernelIndex.load(knobs.user_kernels_dir() if root is None else root)
    changed = False
    for d in decisions:
        old = idx.get(*d.key, gpu=d.gpu)
        if not d.exported:
            # this GPU's own row (else the row naming no GPU) answers for this
            # GPU's evidence; the index keeps a file's byte hash, the DB a source identity
            old = old or idx.get(*d.key)
            if old is not None and old.tuned and (*d.key, d.gpu, source_sha(idx.source(old)),
                                                  old.options) in remeasured:
                idx.remove(*old.key)
                d.removed = old.file
                d.reason += f"; the tuned row ({old.file}) measured again here fails the rule: removed"
                changed = True
            elif old is not None and old.tuned and old.speedup_lo is None and d.speedup_lo is not None:
                # exported before the kernel timer (no interval behind it); this shape's finals
                # ran here and nothing cleared the rule: cuBLAS serves it until something does
                idx.remove(*old.key)
                d.removed = old.file
                d.reason += (f"; the tuned row ({old.file}) had no kernel-time interval and no "
                             "finalist of this run clears the rule: removed")
                changed = True
            continue
        src = source_for(d.source_sha)
        if src is None or source_sha(src) != d.source_sha:
            d.exported, d.reason = False, f"source {d.source_sha[:12]} not found (or does not match its sha)"
            continue
        if old is not None and old.tuned:   # this GPU's own row; it shadows the others of its shape
            fresh = (*d.key, d.gpu, source_sha(idx.source(old)), old.options) in remeasured
            if settle(idx, old, d, fresh=fresh, report=report, db=db):
                changed = True
            if d.kept:
                continue
        arch, acc, layout, M, N, K = d.key
        family = (family_for(d.source_sha) if family_for else "") or str(
            metas.get(d.source_sha, {}).get("family") or metas.get(d.source_sha, {}).get("style") or "")
        idx.add(src, arch=arch, acc=acc, layout=layout, M=M, N=N, K=K, family=family, tuned=True,
                mode=mode, report=report, speedups={k: round(v, 4) for k, v in d.speedups.items()
                                                     if f"speedup_{k}" in SPEEDUP_COLUMNS},
                options=d.options, speedup_lo=round(d.speedup_lo, 4),
                m_bucket="-".join(map(str, m_bucket(M))), gpu=d.gpu,
                config=config_name(src), verified=d.verified, audit=d.audit)
        changed = True
    changed = fill_configs(idx) > 0 or changed
    path = idx.write(prune=True) if changed and not dry_run else None
    return ExportResult(decisions, path)


def config_name(source: str) -> str:
    """index column `config`: KernelConfig.name() of the config `source` instantiates byte for
    byte (cudal2.templates.config_of), '' when it is not an instantiation."""
    config = config_of(source)
    return config.name() if config is not None else ""


def fill_configs(idx: KernelIndex) -> int:
    """Give every row without a `config` (an index written before the column) its config name
    when its source is an instantiation; returns how many rows changed."""
    n = 0
    for row in idx.rows:
        if not row.config:
            name = config_name(idx.source(row))
            if name:
                idx.replace_row(dataclasses.replace(row, config=name))
                n += 1
    return n


def settle(idx: KernelIndex, old: IndexRow, d: Decision, *, fresh: bool, report: str,
           db: str) -> bool:
    """Two kernels for one row of the table: the table's tuned `old` and this export's winner
    `d`. The higher lower bound of the kernel-time speedup interval vs the fastest baseline
    (speedup_lo: the export rule's own figure, a ratio to cuBLAS timed in the same session, so
    two sessions on one GPU model compare) stays; a tie, or a new figure no higher, keeps the
    table's row (so export is idempotent and the order of two exports does not change which
    kernel stays); a row with
    no interval (exported before the kernel timer) loses to one with, and a row whose kernel did
    not pass this cudal2's audit (it would not serve: cudal2.core.tables) loses to one that did,
    whatever the figures. `fresh`: these rows
    measured `old`'s kernel again, so select() already ranked it by its new figure and `d` won.
    The same kernel and options is no contest (its new figures replace the old). The loser is
    recorded in settled.csv; sets d.kept when the table's row stays. Returns whether a new
    record was staged."""
    old_sha = source_sha(idx.source(old))
    new_opts = format_options(d.options)
    if (old_sha, old.options) == (d.source_sha, new_opts):
        return False
    new_lo = round(d.speedup_lo, 4)
    old_serves, new_serves = audit_current(old), d.audit >= AUDIT_VERSION
    if old_serves != new_serves:
        keep_old, rule = old_serves, "audit"
    else:
        keep_old = not fresh and old.speedup_lo is not None and old.speedup_lo >= new_lo
        rule = "remeasured" if fresh else "speedup_lo"
    where = dict(arch=d.key[0], acc=d.key[1], layout=d.key[2], M=d.key[3], N=d.key[4], K=d.key[5],
                 gpu=d.gpu, rule=rule)
    if keep_old:
        d.exported, d.kept = False, old.file
        d.reason += (f"; the table's {old.file} passed this cudal2's audit and this one did not "
                     f"(audit v{d.audit}): kept, this one recorded in settled.csv" if rule == "audit"
                     else f"; the table's {old.file} (lower bound {old.speedup_lo:.4f}, "
                     f"{old.report}) is no slower than this ({new_lo:.4f}): kept, this one "
                     "recorded in settled.csv")
        return idx.record_settled(
            **where, kept_source_sha=old_sha, kept_options=old.options,
            kept_speedup_lo=old.speedup_lo, kept_report=old.report, lost_source_sha=d.source_sha,
            lost_options=new_opts, lost_speedup_lo=new_lo, lost_report=report, lost_db=db,
            lost_speedups=";".join(f"{k}={v:.4f}" for k, v in sorted(d.speedups.items())))
    d.reason += (f"; replaces the table's {old.file} ("
                 + ("audited under older rules" if rule == "audit" else "lower bound " + (
                     "none" if old.speedup_lo is None else f"{old.speedup_lo:.4f}"))
                 + f", {old.report}): recorded in settled.csv")
    return idx.record_settled(
        **where, kept_source_sha=d.source_sha, kept_options=new_opts, kept_speedup_lo=new_lo,
        kept_report=report, lost_source_sha=old_sha, lost_options=old.options,
        lost_speedup_lo=old.speedup_lo, lost_report=old.report, lost_db="",
        lost_speedups=";".join(f"{k}={v:.4f}" for k, v in sorted(old.speedups.items())))


def carry_binaries(root, *, build: Callable | None = None, jobs: int | None = None,
                   nvcc: str | None = None) -> list[tuple[str, str, str]]:
    """Build every tuned kernel of the table at `root` (through the build cache, CUDAL2_BUILD_JOBS
    at a time) and store its library and provenance under <root>/bin/<arch>/ (binaries.carry);
    binaries of kernels no longer in the table are deleted. `nvcc`: the version the builds ran
    with (default: the toolchain's); `build`: default build_many. Returns (arch, file, 'carried'
    | why not) per kernel."""
    idx = KernelIndex.load(root)
    groups: dict[tuple[str, str], list[IndexRow]] = {}
    for row in idx.tuned_rows():
        groups.setdefault((row.arch, row.sha256), []).append(row)
    specs = [BuildSpec(idx.source(rows[0]), arch=arch, name=rows[0].file)
             for (arch, _), rows in groups.items()]
    results = (build or build_many)(specs, jobs=jobs or knobs.build_jobs()) if specs else []
    nvcc = nvcc or (find_toolchain().version if any(r.ok for r in results) else "")
    out = []
    for ((arch, sha), rows), res in zip(groups.items(), results):
        if not res.ok:
            out.append((arch, rows[0].file, f"build {res.status}"))
            continue
        binaries.carry(idx.root, arch, sha, res.so_path, nvcc=nvcc, gpus=[r.gpu for r in rows if r.gpu])
        out.append((arch, rows[0].file, "carried"))
    binaries.prune(idx.root, set(groups))
    return out


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
    parser.add_argument("--mode", default="offline",
                        help="the timings key a winner must win in (offline: kernel time)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="required lead over the best baseline (0.02 = 2%%)")
    parser.add_argument("--report", required=True, help="the report the numbers come from (path or name)")
    parser.add_argument("--gpu", default=None, help="only rows measured on this GPU (substring)")
    parser.add_argument("--arch", default=None, help="only this arch")
    parser.add_argument("--sources", nargs="*", default=[], help="folders of <sha>.cu files (a campaign pack)")
    parser.add_argument("--out", default=None,
                        help="the table to write (default: your own table, CUDAL2_USER_KERNELS, "
                             "else $CUDAL2_CACHE/kernels; `--out generated_kernels`: the shipped one)")
    parser.add_argument("--with-binaries", action="store_true",
                        help="also build every tuned kernel of the table and store its library "
                             "(bin/<arch>/<sha>.so + provenance): a machine without nvcc serves it")
    parser.add_argument("--dry-run", action="store_true", help="decide and print, write nothing")
    parser.add_argument("--verbose", action="store_true", help="list every refusal")


def run_cli(args: argparse.Namespace) -> int:
    if not Path(args.db).exists():
        print(f"cudal2 export: no results DB at {args.db}", file=sys.stderr)
        return 2
    db = ResultsDB(args.db, readonly=True)
    rows = db.rows()
    if args.arch:
        rows = [r for r in rows if r.arch == args.arch]
    root = Path(args.out) if args.out else knobs.user_kernels_dir()
    print(f"export: {len(rows)} DB rows from {args.db}, mode {args.mode}, margin {args.margin:.0%}, into {root}")
    res = export(rows, sources_from(db, args.sources), root=root, mode=args.mode, margin=args.margin,
                 report=args.report, gpu=args.gpu, dry_run=args.dry_run, db=str(args.db))
    for d in res.exported:
        print(f"  exported {d.key}: {d.reason}")
    for d in res.removed:
        print(f"  removed  {d.key}: {d.removed}")
    for d in res.kept:
        print(f"  kept     {d.key}{' on ' + d.gpu if d.gpu else ''}: {d.reason}")
    refused = res.refused
    for d in refused if args.verbose else refused[:20]:
        print(f"  refused  {d.key}: {d.reason}")
    if len(refused) > 20 and not args.verbose:
        print(f"  ... {len(refused) - 20} more refusals (--verbose lists them)")
    print(f"{len(res.exported)} exported, {len(res.kept)} kept the table's row, {len(refused)} refused; "
          + (f"index: {res.index_path}" if res.index_path else "nothing written"))
    if args.with_binaries and not args.dry_run:
        carried = carry_binaries(root)
        for arch, file, status in carried:
            print(f"  binary   {arch} {file}: {status}")
        failed = sum(status != "carried" for _, _, status in carried)
        print(f"{len(carried) - failed} binaries carried under {root / binaries.BIN_DIR}, {failed} failed")
        return 1 if failed else 0
    return 0
