"""A build plan kept on disk, keyed by everything it is computed from.

`campaign prepare`'s planning prices every config's runtime options at every row: minutes on
two cores for the verdict call's lists. A second prepare at the same code and inputs (the
lent-GPU kit prepares again at the same commit) reads the plan back instead.

The key covers what tune.plan reads: its arguments (the shapes in order, arch, families, limits,
accumulator, layout, option cap, decode builds, the cost model's fields), the searched families'
spaces and defaults as registered in this process, every file of the cudal2 package (the
planner's code and the templates that instantiate the sources) and the Python and numpy
versions. A change to any of them is another key, so a stale plan is never read. The package is
hashed before and after planning: a plan whose code changed under it is not kept. An entry is
gzipped JSON (configs, sources, per-row options), written atomically; PLANS_KEPT are kept.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

import cudal2
from cudal2.core import knobs
from cudal2.harness.types import Shape
from cudal2.search.costmodel import CostModel
from cudal2.search.tune import BuildPlan, Candidate, families_for, plan
from cudal2.templates.family import KernelConfig

SCHEMA = "cudal2.plan/1"
PLANS_KEPT = 8          # the newest entries (by last use) a cache folder keeps


def code_digest(root: Path | None = None) -> str:
    """sha256 over every file of the cudal2 package (paths and bytes; caches left out)."""
    root = Path(root or Path(cudal2.__file__).resolve().parent)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def plan_key(shapes: Iterable[Shape], arch: str, *, code: str, families: Iterable[str] | None = None,
             model: CostModel | None = None, **kw) -> str | None:
    """The key of tune.plan(shapes, arch, families=..., model=..., **kw) at package digest `code`;
    None for a model that is not a CostModel (a test's stand-in: its state is not its fields)."""
    model = model or CostModel.default()
    if not isinstance(model, CostModel):
        return None
    fams = families_for(arch, families)
    inputs = {
        "schema": SCHEMA, "code": code, "python": sys.version, "numpy": np.__version__,
        "shapes": [[s.M, s.N, s.K] for s in shapes], "arch": arch,
        "families": [[f.name, sorted((k, list(v)) for k, v in f.space().items()), f.defaults()]
                     for f in fams],
        "model": dataclasses.asdict(model), "kw": sorted(kw.items()),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=repr).encode()).hexdigest()


def cached_plan(shapes: list[Shape], arch: str, *, cache_dir=None, log: Callable = print,
                progress: Callable | None = None, jobs: int | None = None, **kw) -> BuildPlan:
    """tune.plan(shapes, arch, progress=progress, jobs=jobs, **kw), read from `cache_dir`
    (default $CUDAL2_CACHE/plans) when an entry has this key, else planned and stored there
    (jobs, how many processes plan, is no input: the same plan)."""
    folder = Path(cache_dir) if cache_dir is not None else knobs.cache_dir() / "plans"
    code = code_digest()
    key = plan_key(shapes, arch, code=code, **kw)
    if key is None:
        return plan(shapes, arch, progress=progress, jobs=jobs, **kw)
    path = folder / f"{key[:32]}.json.gz"
    found = _read(path, key)
    if found is not None:
        os.utime(path)          # last use: what pruning keeps
        log(f"plan: read from {path} (same code and inputs)")
        return found
    p = plan(shapes, arch, progress=progress, jobs=jobs, **kw)
    if code_digest() != code:
        log("plan: cudal2's files changed while planning; the plan is not kept")
        return p
    _write(path, key, p)
    _prune(folder)
    return p


def _read(path: Path, key: str) -> BuildPlan | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, EOFError):
        return None                      # none yet, or unreadable: plan again
    if d.get("schema") != SCHEMA or d.get("key") != key:
        return None
    return _from_json(d)


def _write(path: Path, key: str, p: BuildPlan) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8", compresslevel=6) as f:
            json.dump(dict(_to_json(p), schema=SCHEMA, key=key), f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.json.gz"), key=lambda q: q.stat().st_mtime, reverse=True)
    for old in entries[PLANS_KEPT:]:
        old.unlink(missing_ok=True)


def _shape(s: Shape) -> list[int]:
    return [s.M, s.N, s.K]


def _to_json(p: BuildPlan) -> dict:
    index = {id(c): i for i, c in enumerate(p.candidates)}
    return {
        "arch": p.arch, "acc": p.acc, "layout": p.layout, "pairs": p.pairs,
        "evaluations": p.evaluations, "shapes": [_shape(s) for s in p.shapes],
        "candidates": [{"family": c.family, "config": [c.config.family, [list(kv) for kv in c.config.params]],
                        "source": c.source, "shapes": [_shape(s) for s in c.shapes],
                        "options": [[_shape(s), o] for s, o in c.options.items()],
                        "reduction_only": [_shape(s) for s in c.reduction_only]}
                       for c in p.candidates],
        "per_shape": [[_shape(s), [index[id(c)] for c in cs]] for s, cs in p.per_shape.items()],
    }


def _from_json(d: dict) -> BuildPlan:
    cands = []
    for c in d["candidates"]:
        family, params = c["config"]
        cands.append(Candidate(c["family"], KernelConfig(family, tuple(tuple(kv) for kv in params)),
                               c["source"], [Shape(*s) for s in c["shapes"]],
                               options={Shape(*s): o for s, o in c["options"]},
                               reduction_only={Shape(*s) for s in c["reduction_only"]}))
    per_shape = {Shape(*s): [cands[i] for i in idx] for s, idx in d["per_shape"]}
    return BuildPlan(d["arch"], [Shape(*s) for s in d["shapes"]], cands, per_shape, d["pairs"],
                     d["evaluations"], d["acc"], d["layout"])
