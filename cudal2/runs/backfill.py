"""Binary keys for rows recorded before keys (`cudal2 db backfill-keys DB...`).

A row's kernel is known by its source text; its binary key (cudal2.core.binarykey) comes from
rebuilding that source, which only describes the binary that was measured when today's build
is the same build: the row's nvcc is today's, and either today's cache key for the source is
the one the row recorded (same flags, headers, ABI) or the source includes none of our template
headers (a self-contained file, which a cache-format change does not alter). Each distinct
(source, arch, nvcc) that passes is rebuilt once (every DB's at once) and its key recorded in
the DB's binary_keys table (ResultsDB.add_binary_key); evaluation rows are never touched. A
`.db.gz` is rewritten atomically. Running it again adds nothing.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.build import BuildSpec, build_many, cache_key, includes_templates, uses_cutlass
from cudal2.core.toolchain import ToolchainError, find_toolchain
from cudal2.harness.db import DBError, ResultsDB

MAX_CUTLASS_JOBS = 2          # a CUTLASS compile needs ~3.4 GB and a minute


def plan(db: ResultsDB, nvcc: str) -> tuple[dict, Counter]:
    """({(sha, arch, nvcc): (BuildSpec, how)} to rebuild, Counter of skip reasons per group)."""
    groups: dict[tuple, set] = {}          # (sha, arch, nvcc) -> build keys of its unkeyed rows
    for ev in db.rows():
        g = groups.setdefault((ev.source_sha, ev.arch, (ev.env or {}).get("nvcc") or ""), set())
        if ev.binary_key is None:
            g.add((ev.build or {}).get("key"))
    todo, skipped = {}, Counter()
    for (sha, arch, nv), recorded in groups.items():
        why, spec = None, None
        source = db.source(sha)
        if not recorded:
            why = "keyed already"
        elif nv != nvcc:
            why = f"nvcc {nv or 'unknown'} is not today's {nvcc}"
        elif source is None:
            why = "source not stored"
        else:
            spec = BuildSpec(source, arch=arch, name=sha[:12])
            if cache_key(spec, nvcc) in recorded:
                how = "rebuilt: today's build key is the recorded one"
            elif not includes_templates(source):
                how = "rebuilt: self-contained source" + (
                    " (CUTLASS version not recorded)" if uses_cutlass(source) else "")
            else:
                why = "template headers changed since"
        if why:
            skipped[why] += 1
        else:
            todo[(sha, arch, nv)] = (spec, how)
    return todo, skipped


def build_all(specs: list[BuildSpec], *, jobs: int, log=print) -> dict[BuildSpec, object]:
    """Build every spec (at most MAX_CUTLASS_JOBS CUTLASS builds at once); {spec: BuildResult}."""
    done = [0]

    def progress(r):
        done[0] += 1
        log(f"  built {done[0]}/{len(specs)}: {r.name} {r.status}"
            + (" (cached)" if r.cached else f" {r.seconds:.0f}s"))
    heavy = [s for s in specs if uses_cutlass(s.source)]
    light = [s for s in specs if not uses_cutlass(s.source)]
    out = dict(zip(light, build_many(light, jobs=jobs, progress=progress)))
    out.update(zip(heavy, build_many(heavy, jobs=min(jobs, MAX_CUTLASS_JOBS), progress=progress)))
    return out


def backfill(paths, *, jobs: int | None = None, log=print) -> dict:
    """Record binary keys in each DB of `paths`. Returns {path: {"rows", "rows_keyed",
    "sources_keyed", "added", "skipped": {reason: groups}}}."""
    nvcc = find_toolchain().version
    plans = {}
    for p in map(Path, paths):
        with ResultsDB(p, readonly=True) as db:
            plans[p] = plan(db, nvcc)
    specs = list({spec for todo, _ in plans.values() for spec, _ in todo.values()})
    log(f"backfill-keys: {len(specs)} distinct source(s) to rebuild for {len(plans)} DB(s)")
    built = build_all(specs, jobs=jobs or knobs.build_jobs(), log=log)
    report = {}
    for p, (todo, skipped) in plans.items():
        keys = {}
        for group, (spec, how) in todo.items():
            r = built[spec]
            if not r.ok:
                skipped[f"build {r.status} today"] += 1
            elif r.binary_key is None:
                skipped["no key (cuobjdump or objdump missing)"] += 1
            else:
                keys[group] = (r.binary_key, how)
        report[str(p)] = _write(p, keys) | {"skipped": dict(skipped)}
        log(_line(p, report[str(p)]))
    return report


def _write(path: Path, keys: dict) -> dict:
    """Add `keys` to the DB at `path` (a .gz through a temporary copy, replaced atomically
    when a key was added; otherwise left as it is); the DB's counts after."""
    if path.suffix != ".gz":
        with ResultsDB(path) as db:
            return _add(db, keys)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        plain, flat = Path(tmp) / "results.db", Path(tmp) / "flat.db"
        plain.write_bytes(gzip.decompress(path.read_bytes()))
        with ResultsDB(plain) as db:
            counts = _add(db, keys)
            if not counts["added"]:
                return counts
            db.backup_to(flat)                 # one rollback-journal file, no -wal beside it
        gz = Path(tmp) / "results.db.gz"
        gz.write_bytes(gzip.compress(flat.read_bytes(), mtime=0))
        os.replace(gz, path)
    return counts


def _add(db: ResultsDB, keys: dict) -> dict:
    added = sum(db.add_binary_key(sha, arch, nv, key, how)
                for (sha, arch, nv), (key, how) in keys.items())
    rows = db.rows()
    keyed = {(e.source_sha, e.arch) for e in rows if e.binary_key}
    return {"rows": len(rows), "rows_keyed": sum(e.binary_key is not None for e in rows),
            "sources_keyed": len(keyed), "added": added}


def _line(path: Path, r: dict) -> str:
    skips = "; ".join(f"{n} {why}" for why, n in sorted(r["skipped"].items())) or "none"
    return (f"{path}: rows keyed {r['rows_keyed']}/{r['rows']}, sources keyed "
            f"{r['sources_keyed']} ({r['added']} new), skipped sources: {skips}")


# --- CLI: cudal2 db backfill-keys DB... -----------------------------------------------------
def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dbs", nargs="+", metavar="DB", help="results DBs (.db or .db.gz)")
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"parallel nvcc processes (default CUDAL2_BUILD_JOBS; CUTLASS at "
                             f"most {MAX_CUTLASS_JOBS})")


def run_cli(args: argparse.Namespace) -> int:
    try:
        backfill(args.dbs, jobs=args.jobs)
    except (DBError, ToolchainError, OSError) as exc:
        print(f"cudal2 db backfill-keys: {exc}", file=sys.stderr)
        return 2
    return 0
