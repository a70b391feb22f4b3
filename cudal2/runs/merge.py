"""Accumulate results DBs into one (`cudal2 db merge A.db B.db.gz ... --into C.db`).

Campaigns run on many machines and in many calls; each writes its own results DB. Merging copies
every evaluation row (with its kernel source) and every cuBLASLt autotune choice of the inputs
into one DB through the harness's one writer (`pipeline.record`), skipping a row the target
already holds: a row's identity is everything it records but its row id (kernel, shape, arch,
GPU, options, stage, verdict, timings, provenance, creation time), so merging the same DB twice,
or a DB into one that was resumed from it (`campaign run --resume-db`), adds nothing. Inputs are
read read-only (a committed `results.db.gz` too); history stays append-only.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import sys
from pathlib import Path

from cudal2.harness.db import SCHEMA_VERSION, DBError, ResultsDB
from cudal2.harness.pipeline import record


def row_identity(ev) -> str:
    """What makes two rows the same recorded evaluation: every field but the DB row id and the
    binary key (a backfill may key a row after it was first merged)."""
    d = dataclasses.asdict(ev)
    d.pop("id", None)
    d.pop("binary_key", None)
    return json.dumps(d, sort_keys=True, default=str)


def read_source(src, into: Path) -> tuple[list, list]:
    """A source DB read in full: ([(row, its kernel source)], [(autotune key, entry)]). Every
    problem (missing, not a results DB, a newer schema, unreadable, a row without its source)
    is raised here, naming the file, so merge finds it before it touches the target."""
    src = Path(src)
    if src.resolve() == into.resolve():
        raise ValueError(f"{src} is the target DB; name each input once, the target in --into")
    try:
        with ResultsDB(src, readonly=True) as db:
            if (db.schema_version or 0) > SCHEMA_VERSION:
                raise DBError(f"{src}: schema version {db.schema_version} is newer than this "
                              f"cudal2 ({SCHEMA_VERSION}); upgrade cudal2")
            texts: dict[str, str | None] = {}
            rows = []
            for ev in db.rows():
                text = texts.setdefault(ev.source_sha, db.source(ev.source_sha))
                if text is None:
                    raise DBError(f"{src}: row {ev.id} names source {ev.source_sha[:12]}, "
                                  "which the DB does not hold")
                rows.append((ev, text))
            return rows, db.baseline_choice_log()
    except sqlite3.DatabaseError as exc:           # a page that fails to read, mid-file
        raise DBError(f"{src}: unreadable results DB ({exc})") from None


def merge(sources, into, *, log=print) -> dict:
    """Copy the rows of each DB in `sources` into the DB at `into` (created if absent), without
    duplicates. Returns {"added", "skipped", "choices_added", "per_source": {path: added}}.
    Nothing half-done: every source is read in full before the target is opened, so a bad
    source leaves no target created and an existing one untouched; a target this call created
    is removed if writing it fails (an existing one keeps the complete rows it got: rows are
    appended one transaction each, and a rerun skips them)."""
    into = Path(into)
    if into.suffix == ".gz":
        raise ValueError(f"--into {into}: a gzipped DB is read-only; merge into a .db file")
    loaded = [(Path(src), *read_source(src, into)) for src in sources]
    created = not into.exists()
    try:
        with ResultsDB(into) as target:
            return _write(target, loaded, log)
    except BaseException:
        if created:
            for p in (into, Path(f"{into}-wal"), Path(f"{into}-shm")):
                p.unlink(missing_ok=True)
        raise


def _write(target: ResultsDB, loaded: list, log) -> dict:
    """merge's writing half: the sources' rows and choices the target does not hold yet."""
    seen = {row_identity(ev) for ev in target.rows()}
    choices = {(k, json.dumps(v, sort_keys=True)) for k, v in target.baseline_choice_log()}
    out = {"added": 0, "skipped": 0, "choices_added": 0, "per_source": {}}
    for src, rows, src_choices in loaded:
        added = 0
        for ev, text in rows:
            key = row_identity(ev)
            if key in seen:
                out["skipped"] += 1
                continue
            ev.id = None                       # a new row in the target
            record(target, ev, source=text)
            seen.add(key)
            added += 1
        for k, entry in src_choices:
            ck = (k, json.dumps(entry, sort_keys=True))
            if ck not in choices:
                target.add_baseline_choice(k, entry)
                choices.add(ck)
                out["choices_added"] += 1
        out["added"] += added
        out["per_source"][str(src)] = added
        log(f"  {src}: {added} rows added")
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    m = sub.add_parser("merge", help="copy the rows of several results DBs into one, without duplicates")
    m.add_argument("sources", nargs="+", help="results DBs to read (results.db or results.db.gz)")
    m.add_argument("--into", required=True, help="the DB to append to (created if absent)")


def run_cli(args: argparse.Namespace) -> int:
    try:
        res = merge(args.sources, args.into)
    except (ValueError, DBError) as exc:
        print(f"cudal2 db {args.action}: {exc}", file=sys.stderr)
        return 2
    print(f"merged into {args.into}: {res['added']} rows added, {res['skipped']} already there, "
          f"{res['choices_added']} cuBLASLt choices added")
    return 0
