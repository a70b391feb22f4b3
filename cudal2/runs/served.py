"""`cudal2 served`: what dispatch serves on this GPU (or a given arch), and from which table.

One line per served row of the layered table (cudal2.core.tables: the user's rows over the
shipped ones, the faster measured row of a key serving): the shape it was measured at and the M
it serves (its token bucket), layout, family, config, the measured lower bound of its speedup
against the fastest baseline, the GPU that measured it (a row measured on another GPU model
races torch.matmul on its first call here before it serves), its table (shipped / user) and whether
it is ready (built, carried, or a build the first call would run: `cudal2 warmup`). Rows
shadowed by a faster row of the other table, rows whose kernel did not pass this cudal2's audit
(cudal2.core.tables: not served until `cudal2 reaudit`), and tables that did not read, are
listed after.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from cudal2.core import binaries
from cudal2.core.build import BuildSpec, lookup
from cudal2.core.store import IndexRow
from cudal2.core.tables import Tables, load_tables, why_unaudited
from cudal2.core.toolchain import ToolchainError
from cudal2.runtime.plan import measured_here, served_rows

COLUMNS = ("table", "layout", "shape", "serves M", "family", "config", "lo", "vs", "measured on",
           "ready")


def readiness(tables: Tables, arch: str, cuda: str | None) -> Callable[[IndexRow], str]:
    """row -> 'carried' | 'built' | 'not built' | 'no nvcc' (what its first call would cost)."""
    memo: dict[str, str] = {}

    def ready(row: IndexRow) -> str:
        if row.sha256 not in memo:
            so, _ = binaries.check(tables.root_of(row), arch, row.sha256, cuda=cuda)
            try:
                memo[row.sha256] = "carried" if so else (
                    "built" if lookup(BuildSpec(tables.source(row), arch=arch)) else "not built")
            except ToolchainError:
                memo[row.sha256] = "no nvcc"
        return memo[row.sha256]
    return ready


def fastest_baseline(row: IndexRow) -> str:
    """The baseline the row beats by the least (its lowest median speedup): the one its lower
    bound is measured against."""
    sp = row.speedups
    return min(sp, key=sp.get) if sp else ""


def line(row: IndexRow, table: str, ready: str, gpu: str | None = None) -> tuple[str, ...]:
    return (table, row.layout, f"{row.M}x{row.N}x{row.K}", row.m_bucket or str(row.M),
            row.family or "-", row.config or "-",
            "-" if row.speedup_lo is None else f"{row.speedup_lo:.3f}", fastest_baseline(row) or "-",
            measured_on(row, gpu), ready)


def measured_on(row: IndexRow, gpu: str | None = None) -> str:
    """The GPU the row was measured on: its gpu column, else (rows of indexes older than the
    column) the GPU folder of its report, reports/<gpu>/..., marked as the report's. Asked for a
    GPU model (`gpu`), a row measured on another says that it races torch.matmul there first."""
    where = row.gpu
    if not where:
        parts = Path(row.report).parts
        folder = parts[parts.index("reports") + 1] if "reports" in parts[:-1] else ""
        where = f"{folder.replace('_', ' ')} (by its report)" if folder else "not recorded"
    return where if gpu is None or measured_here(row, gpu) else f"{where}, races torch first"


def aligned(rows: list[tuple[str, ...]], header=COLUMNS) -> list[str]:
    """Plain text columns (pipes and logs read it; no terminal needed)."""
    allrows = [tuple(header)] + rows
    widths = [max(len(r[i]) for r in allrows) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in allrows]


def report(tables: Tables, arch: str, gpu: str | None, ready: Callable[[IndexRow], str]) -> list[str]:
    """The lines `cudal2 served` prints."""
    rows = served_rows(tables.rows.values(), arch, gpu)
    where = ", ".join(f"{name} {idx.root}" for name, idx in tables.indexes.items())
    out = [f"{arch}, {'GPU ' + gpu if gpu else 'every GPU model'}: {len(rows)} rows served "
           f"(tables: {where})"]
    out += aligned([line(r, tables.table_of(r), ready(r), gpu) for r in rows]) if rows else [
        "  nothing: every shape uses torch.matmul"]
    shadowed = [s for s in tables.shadowed if s.row in served_rows([s.row], arch, gpu)]
    if shadowed:
        out.append(f"shadowed ({len(shadowed)}: a faster measured row of the other table serves):")
        out += ["  " + l for l in aligned([line(s.row, s.table, f"by {s.by}") for s in shadowed],
                                          COLUMNS[:-1] + ("served",))]
    unaudited = [u for u in tables.unaudited if served_rows([u.row], arch, gpu)]
    if unaudited:
        out.append(f"not served ({len(unaudited)}: not audited under this cudal2's rules):")
        out += ["  " + l for l in aligned([line(u.row, u.table, f"audit v{u.row.audit_version}")
                                           for u in unaudited], COLUMNS[:-1] + ("audit",))]
        out += [f"  {u.row.file} [{u.table}]: {why_unaudited(u, tables.indexes[u.table].root)}"
                for u in unaudited]
    out += [f"warning: {p}" for p in tables.problems]
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None,
                        help="sm_80 | sm_86 | sm_89 | sm_90a (default: CUDAL2_ARCH, else the visible GPU's)")
    parser.add_argument("--gpu", default=None,
                        help="GPU model name as the table spells it, e.g. 'NVIDIA H100 80GB HBM3' "
                             "(default: the visible GPU; without one, every GPU model's rows)")


def run_cli(args: argparse.Namespace) -> int:
    import torch

    try:
        from cudal2.runtime.warmup import target   # torch: here, so that --help stays light
        arch, gpu = target(args.arch, args.gpu)
    except (ToolchainError, ValueError) as exc:
        print(f"cudal2 served: {exc}", file=sys.stderr)
        return 2
    tables = load_tables()
    for text in report(tables, arch, gpu, readiness(tables, arch, torch.version.cuda)):
        print(text)
    return 0
