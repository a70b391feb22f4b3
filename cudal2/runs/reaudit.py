"""`cudal2 reaudit [--table DIR] [--arch ARCH]`: audit a kernel table's rows again under this
cudal2's rules, so that the rows whose kernels pass serve again.

A tuned row serves only when its kernel passed the current audit (vocab.AUDIT_VERSION, index
column `audit`; cudal2.core.tables). A row exported before the rules changed, or whose calls
the call guard never watched, waits here: its source is built for its arch (cache hits are
free), audited (static rules, then the dry call under the call guard: cudal2.harness.audit), and
when it passes, every row of that kernel gets the current version through the store's writer
(index.csv rewritten atomically). A rejected kernel's rows stay as they are, unserved, with the
reasons printed. Without a host C compiler there is no dry call, so nothing changes. The table is
the user's by default (knobs.user_kernels_dir()); `--table generated_kernels` is the shipped one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.build import BuildSpec, build_many
from cudal2.core.store import INDEX_NAME, IndexRow, KernelIndex, KernelIndexError, with_fields
from cudal2.core.tables import audit_current
from cudal2.core.vocab import AUDIT_VERSION
from cudal2.harness.audit import open_dry_pool, audit_build, audited_version
from cudal2.harness.worker import WorkerPool


def stale(idx: KernelIndex, arch: str | None = None) -> dict[tuple[str, str], list[IndexRow]]:
    """(sha256, arch) -> the tuned rows of that kernel audited under older rules (one audit
    answers for all of them)."""
    out: dict[tuple[str, str], list[IndexRow]] = {}
    for row in idx.tuned_rows():
        if not audit_current(row) and arch in (None, row.arch):
            out.setdefault((row.sha256, row.arch), []).append(row)
    return out


def reaudit(root: Path, *, arch: str | None = None, say=print) -> int:
    """Audit the stale rows of the table at `root`; returns how many kernels were rejected
    (or could not be audited). Raises KernelIndexError for a missing or unreadable table."""
    if not (root / INDEX_NAME).is_file():
        raise KernelIndexError(f"no kernel table at {root} (no {INDEX_NAME})")
    idx = KernelIndex.load(root)
    todo = stale(idx, arch)
    if not todo:
        say(f"{root}: every tuned row passed the audit v{AUDIT_VERSION}; nothing to do")
        return 0
    dry_pool, off = open_dry_pool()
    if off:
        say(f"{root}: {len(todo)} kernel(s) not audited: {off}; without the call guard's dry call "
            f"no audit reaches v{AUDIT_VERSION}, so nothing changed")
        return len(todo)
    specs = [BuildSpec(idx.source(rows[0]), arch=a, name=rows[0].file) for (_, a), rows in todo.items()]
    builds = build_many(specs)
    bad = 0
    with WorkerPool(max_tasks=1) as pool, dry_pool:
        for ((_, a), rows), spec, br in zip(todo.items(), specs, builds):
            res = audit_build(spec.source, br, a, name=rows[0].file, pool=pool, dry_pool=dry_pool)
            version = audited_version(res.to_dict())
            key = f"binary key {br.binary_key[:16]}" if br.binary_key else "no binary key"
            if res.ok and version >= AUDIT_VERSION:
                for row in rows:
                    idx.replace_row(with_fields(row, audit=version))
                say(f"ok        {rows[0].file} ({a}, {len(rows)} row(s), {key}): audit v{version}")
            else:
                bad += 1
                why = "; ".join(res.reasons or res.notes) or f"audit reached v{version} only"
                say(f"REJECTED  {rows[0].file} ({a}, {len(rows)} row(s), {key}): {why}")
    if bad < len(todo):
        idx.write()
    say(f"{root}: {len(todo) - bad} kernel(s) now audited v{AUDIT_VERSION}, {bad} still not served")
    return bad


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", type=Path, default=None,
                        help="the table's root (default: your table, $CUDAL2_USER_KERNELS or "
                             "$CUDAL2_CACHE/kernels; generated_kernels: the shipped one)")
    parser.add_argument("--arch", default=None, help="only the rows of this arch (default: all)")


def run_cli(args: argparse.Namespace) -> int:
    root = args.table or knobs.user_kernels_dir()
    try:
        return 1 if reaudit(root, arch=args.arch) else 0
    except (KernelIndexError, OSError, UnicodeDecodeError) as exc:
        print(f"cudal2 reaudit: {exc}", file=sys.stderr)
        return 2
