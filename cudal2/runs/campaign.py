"""A GPU campaign in two halves (`cudal2 campaign prepare|run`).

prepare (CPU machine, nvcc, no GPU): plan the deduplicated candidates for a shape list
  (cudal2.search.tune.plan), build them all in parallel (build cache), copy each build-cache entry
  (.so, ptxas stats, source, gzipped PTX) into a pack folder with a manifest, and dry-run the pack:
  every .so loads in a killable worker and exports the ABI symbols, its meta matches the
  manifest. `max_pack_bytes` (`--max-pack-mib`) refuses a pack larger than the user's limit
  (none by default).
run (GPU machine; needs torch + numpy + stdlib, matplotlib optional, no nvcc): for each shape
  (the tuned table's shapes first, then the shape list), SCREEN every packed (build, runtime
  options) candidate of the shape in one warm worker (smoke check + a few kernel-time samples,
  early stop when clearly slower), then run the FINALS of the best few in a fresh worker
  (correctness suite, kernel time against every baseline with the stopping rule; end-to-end
  call and server mode for a kernel past the export margin) through the harness's tournament
  (cudal2.harness.tournament; build_result=..., baseline_libs=...: nothing is recompiled); stop cleanly before the budget runs out, export by the export rule, write reports
  (CSV, markdown, PNG), the throughput (screenings and finals per GPU-minute) and the cost
  model's held-out score next to the DB. Before any shape, once in a GPU worker, it measures the
  device's ceilings with the packed kernels (summary["ceilings"], the call's phase "bandwidth";
  cudal2.harness.bandwidth, .floor): the read-only streaming kernel at each decode row's weight
  size and a large buffer, a device copy, the launch floor; with decode rows (M <= 64) the large
  buffer's figure is also summary["bandwidth"], and the reports give each decode row's GB/s on
  its large operand and its fraction of that ceiling. Shapes run in the pack's run_order
  (RUN_ORDERS); `live_dir` keeps results.db.gz and summary.json current after every shape.
"""
from __future__ import annotations

import argparse
import atexit
import csv
import datetime as _dt
import functools
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from cudal2.core import knobs
from cudal2.core.abi import preload_cuda_runtime
from cudal2.core.build import BuildSpec, build_many, result_from_json
from cudal2.core.identity import file_sha, source_sha
from cudal2.core.store import KernelIndex
from cudal2.core.toolchain import find_toolchain, pip_cuda_roots
from cudal2.harness import bandwidth, baselines as hb, fakedevice, provenance
from cudal2.harness.audit import check_dependencies
from cudal2.harness.db import ResultsDB
from cudal2.harness import tournament
from cudal2.harness.cluster import connect_ray, ray_actors, visible_devices
from cudal2.harness.pipeline import audit_verdict, budget_cut, gpu_pool, record
from cudal2.harness.tournament import Entrant
from cudal2.harness.types import BASELINES, DEFAULT_SERVER_GAPS_MS, EvalRequest, Shape
from cudal2.harness.worker import WorkerPool, probe_library
from cudal2.runs import export as export_mod, report
from cudal2.runs.progress import Bar, clock
from cudal2.runs.account import Account, Throughput
from cudal2.runs.report import size_bucket
from cudal2.search.costmodel import CostModel, held_out_rank_correlation
from cudal2.search.plancache import cached_plan
from cudal2.search.tune import build_plan, read_shapes, shapes_layout
from cudal2.templates import config_of

SCHEMA = "cudal2.campaign/2"  # a format name: kept when the module moved
MANIFEST = "manifest.json"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


LIBRARY, LIBRARY_GZ = "kernel.so", "kernel.so.gz"   # a pack entry's library: as built, or gzipped
# a pack entry's build record, gzipped: its nvcc -MD list (the audit's dependency check) is most
# of its ~12 KB and shrinks ~5x, a tenth of a decode pack of ~200 builds
BUILD_INFO, BUILD_INFO_GZ = "build.json", "build.json.gz"


def _gzip(src: Path, dest: Path) -> None:
    with src.open("rb") as f, gzip.open(dest, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)


def _pack_entry(result, dest: Path, *, gz: bool = False) -> dict:
    """Copy one build-cache entry into the pack (PTX gzipped; the library too with `gz`: a
    candidate's .so shrinks ~4x, and a decode pack carries hundreds). Returns its manifest
    fields (so_sha256: the library's own bytes)."""
    entry = result.so_path.parent
    dest.mkdir(parents=True, exist_ok=True)
    if gz:
        _gzip(result.so_path, dest / LIBRARY_GZ)
    else:
        shutil.copy2(result.so_path, dest / LIBRARY)
    _gzip(entry / BUILD_INFO, dest / BUILD_INFO_GZ)
    if result.ptx_path and result.ptx_path.exists():
        _gzip(result.ptx_path, dest / "kernel.ptx.gz")
    return {"key": result.key, "so_sha256": file_sha(result.so_path),
            "resources": {"registers": result.max_registers, "shared_bytes": result.max_shared_bytes,
                          "spills": result.spills}}


_UNPACKED: dict[tuple, Path] = {}   # (a gzipped library, its size and time) -> where it was unpacked


def library_path(d: Path, workdir=None) -> Path:
    """The loadable library of the pack entry in folder `d`: its kernel.so, or its kernel.so.gz
    unpacked once into `workdir` (default: a temporary folder of this process), so the pack
    stays as it was carried. A missing library is d / kernel.so (a caller's check names it)."""
    d = Path(d).resolve()
    if (d / LIBRARY).is_file() or not (d / LIBRARY_GZ).is_file():
        return d / LIBRARY
    st = (d / LIBRARY_GZ).stat()
    key = (d, st.st_size, st.st_mtime_ns, str(workdir))
    if key not in _UNPACKED or not _UNPACKED[key].is_file():
        root = Path(workdir) if workdir is not None else _scratch()
        dest = root / hashlib.sha256(str(key).encode()).hexdigest()[:16] / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".part")
        with gzip.open(d / LIBRARY_GZ, "rb") as g, part.open("wb") as f:
            shutil.copyfileobj(g, f)
        part.chmod(0o755)
        part.replace(dest)
        _UNPACKED[key] = dest
    return _UNPACKED[key]


@functools.cache
def _scratch() -> Path:
    """This process's folder for unpacked libraries, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="cudal2-pack-"))
    atexit.register(shutil.rmtree, path, True)
    return path


SOURCE = "kernel.cu.gz"    # a pack entry's source: gzipped (an instantiation inlines ~20-70 KB of headers)


def write_source(d: Path, text: str) -> None:
    """A pack entry's source, into its folder `d`."""
    d.mkdir(parents=True, exist_ok=True)
    with gzip.open(d / SOURCE, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(text)


def source_path(d: Path) -> Path:
    """Where a pack entry's source lies: kernel.cu.gz, or an older pack's kernel.cu."""
    return d / SOURCE if (d / SOURCE).is_file() or not (d / "kernel.cu").is_file() else d / "kernel.cu"


def read_source(d: Path) -> str:
    """The source of the pack entry in folder `d` (either form)."""
    p = source_path(d)
    if p.suffix == ".gz":
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return f.read()
    return p.read_text()


def _baselines() -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """The harness's baseline libraries: {lib: (source, link libraries, exported symbols)}."""
    return {lib: (hb.source(lib), tuple(hb.LIBRARIES), tuple(hb.EXPORTS[lib])) for lib in hb.SOURCES}


def _meta(c: dict) -> dict:
    """A packed candidate's meta: what its .so reported at the dry run, else its config."""
    return c.get("meta") or dict(c["params"], style=c["family"])


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def tuned_rows(arch: str, acc: str, layout: str, root=None) -> list:
    """The tuned rows of the kernel table for this arch, accumulator and layout."""
    return [r for r in KernelIndex.load(root).tuned_rows()
            if (r.arch, r.acc, r.layout) == (arch, acc, layout)]


def prepare(shapes_file, arch: str, out, *, families=None, limit_per_shape: int | None = 8,
            per_family: int | None = 2,
            jobs: int | None = None, acc: str = "f32", layout: str | None = None,
            include_tuned: bool = True, kernels_root=None, max_pack_bytes: int | None = None,
            order: str = "file", limit_shapes: int | None = None, measured_dbs=(),
            lt_choices_from=(), run_order: str = "buckets", progress: bool | None = None,
            log=print) -> dict:
    """The CPU half: plan, build, pack, dry-run. Returns the manifest. include_tuned: the tuned
    table's kernels for this arch/acc/layout join the pack (with their shapes, timed first), so
    the run re-measures what dispatch serves today. layout: the shapes file's layout column
    (a `cudal2 shapes --model` file says RC), else `layout`, else RR. order "gain": the shapes
    `measured_dbs` (results DBs) have not measured by kernel time, most promising first
    (cudal2.runs.coverage.order_by_gain); limit_shapes: the first N of the list after ordering.
    lt_choices_from: results DBs, or folders holding them (results.db, results.db.gz), whose
    cuBLASLt autotune choices the pack carries: the run reuses a choice whose key (GPU, cuBLASLt
    version, shape, accumulator, layout) matches instead of autotuning again. run_order: how
    `campaign run` takes the shapes (RUN_ORDERS). progress: bars with an ETA over planning and
    building (None: on a terminal only)."""

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; pick a fresh folder")
    shapes = read_shapes(shapes_file)
    layout = shapes_layout(shapes_file, layout)
    if order == "gain":
        from cudal2.runs.coverage import order_by_gain
        evs = [ev for p in measured_dbs for ev in ResultsDB(p, readonly=True).rows()]
        ranked = order_by_gain(shapes, evs, CostModel.default(arch=arch), layout=layout)
        log(f"order gain: {len(shapes) - len(ranked)} of {len(shapes)} shapes measured already "
            f"({len(measured_dbs)} DBs); next: " + ", ".join(f"{s} {g:.3f}" for s, g in ranked[:5]))
        shapes = [s for s, _ in ranked]
    elif order != "file":
        raise ValueError(f"--order {order!r}: file or gain")
    if run_order not in RUN_ORDERS:
        raise ValueError(f"--run-order {run_order!r}: " + " or ".join(RUN_ORDERS))
    if limit_shapes:
        shapes = shapes[:limit_shapes]
    tuned = tuned_rows(arch, acc, layout, kernels_root) if include_tuned else []
    first = [Shape(*r.shape) for r in tuned]
    shapes = list(dict.fromkeys(first + shapes))     # tuned shapes first, no repeats
    p = _plan(shapes, arch, layout, progress=progress, log=log, families=families,
              limit_per_shape=limit_per_shape, acc=acc, per_family=per_family,
              jobs=jobs or knobs.build_jobs())     # the cores the builds get next
    log(f"  packing into {out}")
    with Bar(len(p.candidates), "building", enabled=progress, unit="build", log=log) as bar:
        def built(r):
            bar.update()
            bar.log(f"  built {r.name}: {r.status}{' (cached)' if r.cached else f' {r.seconds:.1f} s'}")
        rep = build_plan(p, jobs=jobs, progress=built)
    log("  " + rep.text())
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(shapes_file, out / "shapes.csv")
    cands = []
    for c in p.candidates:
        if not c.build.ok:
            log(f"  dropped {c.label}: {c.build.status}")
            continue
        reasons = check_dependencies(c.build)     # the files the build read (carried with it)
        if reasons:
            log(f"  dropped {c.label}: audit: {'; '.join(reasons)}")
            continue
        over = c.keep_within_budget(arch)        # the decode budget, with ptxas's registers
        if over:
            log(f"  {c.label}: {over} decode screening(s) over the streaming budget dropped")
        if not c.shapes:
            continue
        sha = source_sha(c.source)
        fields = _pack_entry(c.build, out / "builds" / sha[:16], gz=True)
        write_source(out / "builds" / sha[:16], c.source)
        cands.append({"sha": sha, "dir": f"builds/{sha[:16]}", "family": c.family, "label": c.label,
                      "params": [[k, v] for k, v in c.config.params],
                      # per served shape, the runtime options screening tries (the plan's sweep)
                      "sweeps": [[[s.M, s.N, s.K], c.options.get(s, [{}])] for s in c.shapes],
                      "shapes": [[s.M, s.N, s.K] for s in c.shapes], **fields})
    if tuned:
        idx = KernelIndex.load(kernels_root)
        # the index keeps file byte hashes; the pack and the DB name a kernel by its identity
        by_identity: dict[str, tuple[str, list]] = {}
        for t in tuned:
            src = idx.source(t)
            by_identity.setdefault(source_sha(src), (src, []))[1].append(t)
        groups = list(by_identity.items())
        specs = [BuildSpec(src, arch=arch, name=f"tuned-{rows[0].file}") for _, (src, rows) in groups]
        by_sha = {c["sha"]: c for c in cands}
        for (sha, (_, rows)), spec, r in zip(groups, specs, build_many(specs, jobs=jobs)):
            if not r.ok:
                log(f"  tuned kernel {rows[0].file} failed to build ({r.status}): not re-measured")
                continue
            entry = by_sha.get(sha)
            if entry is None:
                fields = _pack_entry(r, out / "builds" / sha[:16], gz=True)
                write_source(out / "builds" / sha[:16], spec.source)
                entry = by_sha[sha] = {"sha": sha, "dir": f"builds/{sha[:16]}",
                                       "family": rows[0].family, "label": f"tuned:{rows[0].file}",
                                       "params": [], "sweeps": [], "shapes": [], **fields}
                cands.append(entry)
            for t in rows:                     # the options dispatch serves the shape with
                if [t.M, t.N, t.K] not in entry["shapes"]:
                    entry["shapes"].append([t.M, t.N, t.K])
                sweep = next((sw for sh, sw in entry["sweeps"] if sh == [t.M, t.N, t.K]), None)
                if sweep is None:
                    entry["sweeps"].append([[t.M, t.N, t.K], [t.options_dict]])
                elif t.options_dict not in sweep:
                    sweep.append(t.options_dict)
    bases, stream, launch = _pack_baselines(out, arch, jobs=jobs, progress=progress, log=log)
    manifest = {"schema": SCHEMA, "arch": arch, "acc": acc, "layout": layout, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "git_commit": _git_commit(), "nvcc": _nvcc(),
        "shapes": [[s.M, s.N, s.K] for s in shapes], "tuned_shapes": [[s.M, s.N, s.K] for s in first],
        "run_order": run_order,
        "screenings": sum(len(sw) for c in cands for _, sw in c["sweeps"]),
        "lt_choices": lt_choices(lt_choices_from),
        "candidates": cands, "baselines": bases, "stream_read": stream, "launch_floor": launch,
        "build": {k: v for k, v in vars(rep).items() if k != "failures"}}
    _seal(out, manifest, max_pack_bytes, "lower --limit-per-shape or the shape count", log)
    log(f"plan: {len(shapes)} shapes ({len(first)} from the tuned table), {len(cands)} builds, "
        f"{manifest['screenings']} (shape, build, options) screenings")
    log(f"pack ready: {out} ({manifest['pack_bytes'] / 2**20:.1f} MiB, {len(cands)} candidates, {len(bases)} baselines); "
        f"on the GPU machine run `cudal2 campaign run {out} --out reports/`")
    return manifest


def _plan(shapes: list, arch: str, layout: str, *, progress, log, **kw):
    """prepare's plan of `shapes` (tune.plan with the prior of `arch`'s GPU), timed. Planning
    ranks every config's runtime options per shape: minutes for a model's file (a line first, so
    a log without the bar does not look hung); the same code and inputs again (a second prepare
    at one commit) read the plan back (cudal2.search.plancache)."""
    log(f"campaign prepare: planning {len(shapes)} shapes for {arch} (layout {layout})")
    t0 = time.monotonic()
    with Bar(len(shapes), "planning", enabled=progress, unit="shape", log=log) as bar:
        p = cached_plan(shapes, arch, model=CostModel.default(arch=arch), layout=layout,
                        progress=lambda s: bar.update(), log=bar.log, **kw)
    log(f"campaign prepare: {len(shapes)} shapes, {len(p.candidates)} unique candidates "
        f"({p.pairs} shape x candidate pairs) for {arch} in {time.monotonic() - t0:.0f} s")
    return p


# -- a pack of given sources at given shapes: the RL reward's queue ------------------------------
QUEUE_FIELDS = ("binary_key", "M", "N", "K", "count", "source_sha", "source_file")
EVERY_ENTRANT = "every entrant"     # a confirm pack's finalist rule (prepare_queue(confirm=True))


def read_queue(path) -> list[dict]:
    """The rows of a queue file (rl/table.py's Queue: JSONL, or CSV with a header, fields
    QUEUE_FIELDS, oldest first), each with its source's text ("source": source_file is relative to
    the queue's folder)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"queue {path}: {exc.strerror}") from None
    if path.suffix == ".csv":
        raw = list(csv.DictReader(text.splitlines()))
    else:
        try:
            raw = [json.loads(l) for l in text.splitlines() if l.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"queue {path}: not JSONL ({exc})") from None
    rows = []
    for i, r in enumerate(raw, 1):
        missing = [f for f in QUEUE_FIELDS if r.get(f) in (None, "")]
        if missing:
            raise ValueError(f"queue {path} row {i}: missing {', '.join(missing)}")
        src = path.parent / r["source_file"]
        if not src.is_file():
            raise ValueError(f"queue {path} row {i}: source {src} missing")
        rows.append(dict(r, M=int(r["M"]), N=int(r["N"]), K=int(r["K"]), count=int(r["count"]),
                         age=i, source=src.read_text()))
    return rows


def read_confirm(path) -> list[dict]:
    """An experiment's confirm.jsonl (rl/experiment/report.confirm: per held-out shape, every arm's
    winner, its source under sources/ beside the file) as queue rows (read_queue's), one per
    (entrant, shape), counted by how many arms and seeds chose it."""
    path = Path(path)
    try:
        lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"confirm file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    rows = []
    for i, line in enumerate(lines, 1):
        for e in line.get("entrants") or []:
            src = path.parent / str(e.get("source_file", ""))
            if not e.get("source_file") or not src.is_file():
                raise ValueError(f"confirm file {path} line {i}: source {src} missing")
            rows.append({"binary_key": e.get("binary_key", ""), "M": int(line["M"]), "N": int(line["N"]),
                         "K": int(line["K"]), "count": len(e.get("chosen_by") or [1]),
                         "source_sha": e.get("source_sha", ""), "source_file": e["source_file"],
                         "age": i, "source": src.read_text()})
    return rows


def queue_sources(rows: list[dict]) -> list[dict]:
    """The queue's rows grouped by source identity, most wanted first: the most counted, and among
    equals the most recently queued (so a carry limit drops the least counted, then the oldest).
    Each: sha, source, file, shapes, count, rows."""
    by: dict[str, dict] = {}
    for r in rows:
        sha = source_sha(r["source"])
        g = by.setdefault(sha, {"sha": sha, "source": r["source"], "file": r["source_file"],
                                "shapes": [], "count": 0, "age": 0, "rows": 0})
        if [r["M"], r["N"], r["K"]] not in g["shapes"]:
            g["shapes"].append([r["M"], r["N"], r["K"]])
        g["count"] += r["count"]
        g["age"] = max(g["age"], r["age"])
        g["rows"] += 1
    return sorted(by.values(), key=lambda g: (-g["count"], -g["age"]))


def _queue_candidate(g: dict, audit: dict) -> dict:
    """A queued source's manifest entry: its own shapes, default options, the family its
    instantiation banner or its meta names."""
    cfg = config_of(g["source"])
    meta = audit.get("meta") or {}
    return {"sha": g["sha"], "dir": f"builds/{g['sha'][:16]}",
            "family": cfg.family if cfg else meta.get("style") or "queued",
            "label": f"queue:{Path(g['file']).name}",
            "params": [[k, v] for k, v in cfg.params] if cfg else [],
            "sweeps": [[s, [{}]] for s in g["shapes"]], "shapes": g["shapes"],
            "layout": audit.get("layout") or meta.get("layout") or "RR", "count": g["count"], "meta": meta}


def _pack_queued(groups: list[dict], builds: list, out: Path, room: int | None, probe: EvalRequest,
                 log) -> tuple[list[dict], list[dict]]:
    """Pack the queued sources that build and pass the audit, most wanted first, while they fit
    in `room` bytes (None: no limit). Returns (manifest entries, groups left out for room)."""
    cands, left_out = [], []
    for g, b in zip(groups, builds):
        why = b.status if not b.ok else "; ".join(check_dependencies(b))
        audit = {} if why else audit_verdict(replace(probe, source=g["source"]), g["sha"], b)
        why = why or ("" if audit["ok"] else f"{audit['status']}: {(audit['detail'] or '')[:200]}")
        if why:
            log(f"  left out {g['file']}: {why}")
            continue
        d = out / "builds" / g["sha"][:16]
        fields = _pack_entry(b, d, gz=True)
        write_source(d, g["source"])
        if room is not None and _dir_bytes(d) > room:
            shutil.rmtree(d)
            left_out.append(g)
            continue
        room = None if room is None else room - _dir_bytes(d)
        cands.append({**_queue_candidate(g, audit), **fields})
    return cands, left_out


def prepare_queue(queue_file, arch: str, out, *, jobs: int | None = None, acc: str = "f32",
                  max_pack_bytes: int | None = None, lt_choices_from=(), progress: bool | None = None,
                  confirm: bool = False, log=print) -> dict:
    """A pack of the queue's sources, each screened at its own queued shapes (`campaign run`
    sends each shape's best to finals as for a planned pack): built and audited here (a source
    that fails either stays here, logged), and within max_pack_bytes: the least counted, then the
    oldest, sources are left out first, with a line saying how many. Returns the manifest.
    confirm: `queue_file` is an experiment's confirm.jsonl (read_confirm), and every entrant that
    passes screening goes to its shape's one finals session (manifest "finalists": "every
    entrant"; each candidate its own group), so each arm's winner meets the others there."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; pick a fresh folder")
    groups = queue_sources(read_confirm(queue_file) if confirm else read_queue(queue_file))
    what = "confirm" if confirm else "queue"
    log(f"campaign prepare: {what} {queue_file}: {sum(g['rows'] for g in groups)} rows, "
        f"{len(groups)} sources, for {arch}, packing into {out}")
    with Bar(len(groups), "building", enabled=progress, unit="build", log=log) as bar:
        builds = build_many([BuildSpec(g["source"], arch=arch, name=f"queue-{g['sha'][:12]}") for g in groups],
                            jobs=jobs, progress=lambda r: bar.update())
    out.mkdir(parents=True, exist_ok=True)
    bases, stream, launch = _pack_baselines(out, arch, jobs=jobs, progress=progress, log=log)
    room = None if max_pack_bytes is None else max_pack_bytes - _dir_bytes(out) - (64 << 10)
    cands, left_out = _pack_queued(groups, builds, out, room, EvalRequest(source="", shape=Shape(1, 1, 1),
                                                                          arch=arch, acc=acc), log)
    if confirm:
        cands = [dict(c, group=c["sha"]) for c in cands]
    if left_out:
        log(f"  carry limit: {len(left_out)} of {len(groups)} queued sources "
            f"({sum(g['rows'] for g in left_out)} rows) left out, the least counted and oldest first")
    shapes = list(dict.fromkeys(tuple(s) for c in cands for s in c["shapes"]))
    (out / "shapes.csv").write_text("M,N,K\n" + "".join(f"{M},{N},{K}\n" for M, N, K in shapes))
    manifest = {"schema": SCHEMA, "arch": arch, "acc": acc, "layout": cands[0]["layout"] if cands else "RR",
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "git_commit": _git_commit(), "nvcc": _nvcc(), "shapes": [list(s) for s in shapes],
                "tuned_shapes": [], "screenings": sum(len(c["shapes"]) for c in cands),
                "lt_choices": lt_choices(lt_choices_from), "candidates": cands, "baselines": bases,
                "stream_read": stream, "launch_floor": launch, "queue": {"file": str(queue_file), "sources": len(groups),
                                                 "packed": len(cands), "left_out": len(left_out)},
                **({"finalists": EVERY_ENTRANT} if confirm else {})}
    _seal(out, manifest, max_pack_bytes, "raise --max-pack-mib", log)
    log(f"{what} pack ready: {out} ({manifest['pack_bytes'] / 2**20:.1f} MiB, {len(cands)} sources, "
        f"{manifest['screenings']} (source, shape) screenings)")
    return manifest

def _nvcc() -> str:
    try:
        return find_toolchain().version
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the builds succeeded
        return f"unknown ({exc})"


def _pack_baselines(out: Path, arch: str, *, jobs, progress, log) -> tuple[list, dict | None, dict | None]:
    """The baseline libraries, the streaming kernel and the launch floor's kernels, built and
    packed (every pack carries them: the GPU machine compiles nothing): (baselines, stream read,
    launch floor), the last two None when they did not build."""
    from cudal2.harness import floor
    bases = []
    blibs = _baselines()
    specs = [BuildSpec(src, arch=arch, libraries=libs, name=f"baseline-{lib}")
             for lib, (src, libs, _) in blibs.items()]
    with Bar(len(specs) + 2, "building baselines", enabled=progress, unit="build", log=log) as bar:
        built = build_many(specs + [bandwidth.spec(arch), floor.spec(arch)], jobs=jobs,
                           progress=lambda r: bar.update())
    launch = _pack_launch_floor(built.pop(), out, log)
    stream = _pack_stream_read(built.pop(), out, log)
    for (lib, (src, libs, exports)), r in zip(blibs.items(), built):
        if not r.ok:
            raise RuntimeError(f"baseline {lib} failed to build: {r.status}\n{r.log[-2000:]}")
        d = f"baselines/{lib}"
        fields = _pack_entry(r, out / d)
        write_source(out / d, src)
        bases.append({"name": lib, "sha": source_sha(src), "dir": d, "libraries": list(libs),
                      "exports": list(exports), **fields})
    return bases, stream, launch


def _seal(out: Path, manifest: dict, max_pack_bytes: int | None, advice: str, log) -> None:
    """Write the manifest with the pack's size, refuse a pack over the limit, dry-run it."""
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = _dir_bytes(out)
    manifest["pack_bytes"] = size
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if max_pack_bytes is not None and size > max_pack_bytes:
        raise RuntimeError(f"pack {out} is {size / 2**20:.1f} MiB > --max-pack-mib "
                           f"{max_pack_bytes / 2**20:g}: {advice}")
    problems = dry_run(out, log=log)
    if problems:
        raise RuntimeError(f"dry run of {out} failed:\n  " + "\n  ".join(problems))


# the manifest's entries for the ceilings' kernels (cudal2.harness.bandwidth, .floor)
CEILING_KERNELS = ("stream_read", "launch_floor")


def _pack_kernel(result, out: Path, mod) -> dict:
    """A ceilings kernel (module `mod`: NAME, source(), EXPORTS) packed as baselines/<NAME>."""
    d = f"baselines/{mod.NAME}"
    fields = _pack_entry(result, out / d)
    src = mod.source()
    write_source(out / d, src)
    return {"name": mod.NAME, "sha": source_sha(src), "dir": d, "libraries": [],
            "exports": list(mod.EXPORTS), **fields}


def _pack_stream_read(result, out: Path, log) -> dict | None:
    """The streaming kernel (the run's bandwidth ceiling: cudal2.harness.bandwidth) packed beside
    the baselines; None, logged, when it did not build (the run then builds it, or measures no
    ceiling)."""
    if not result.ok:
        log(f"  the streaming kernel failed to build ({result.status}): this pack measures no "
            "bandwidth ceiling")
        return None
    return _pack_kernel(result, out, bandwidth)


def _pack_launch_floor(result, out: Path, log) -> dict | None:
    """The launch floor's kernels (cudal2.harness.floor) packed beside the streaming kernel; None,
    logged, when they did not build (the run then builds them, or measures no floor)."""
    from cudal2.harness import floor
    if not result.ok:
        log(f"  the launch-floor kernels failed to build ({result.status}): this pack measures "
            "no launch floor")
        return None
    return _pack_kernel(result, out, floor)


def lt_choices(paths) -> dict:
    """{autotune key: entry}: the cuBLASLt choices recorded in these results DBs (folders: every
    results.db / results.db.gz under them), the latest recorded winning."""
    dbs = []
    for p in map(Path, paths):
        if p.is_dir():
            dbs += sorted(q for q in p.rglob("results.db*") if q.name in ("results.db", "results.db.gz"))
        elif p.is_file():
            dbs.append(p)
        else:
            raise ValueError(f"--lt-choices-from {p}: no such file or folder")
    out: dict = {}
    for p in dbs:
        with ResultsDB(p, readonly=True) as db:
            out.update(db.baseline_choice_log())
    return out


def load_manifest(pack) -> dict:
    pack = Path(pack)
    try:
        m = json.loads((pack / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"{pack} has no {MANIFEST}: not a campaign pack (run `cudal2 campaign prepare`)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{pack / MANIFEST} is not JSON: {exc}") from None
    if m.get("schema") != SCHEMA:
        raise ValueError(f"{pack / MANIFEST}: schema {m.get('schema')!r}, want {SCHEMA}")
    return m


def pack_entries(m: dict) -> list[tuple[str, dict]]:
    """(what, manifest entry) of every library a pack holds: candidates, baselines and the
    ceilings' kernels (stream read, launch floor; older packs lack them)."""
    entries = [(f"candidate {c['label']}", c) for c in m["candidates"]]
    entries += [(f"baseline {b['name']}", b) for b in m["baselines"]]
    entries += [(f"baseline {m[k]['name']}", m[k]) for k in CEILING_KERNELS if m.get(k)]
    return entries


def file_problem(pack: Path, what: str, e: dict) -> str | None:
    """Why an entry's files are not as its manifest says (library there, its bytes' sha256, its
    source's identity); None when they are."""
    so, src = pack / e["dir"] / LIBRARY, source_path(pack / e["dir"])
    if not so.is_file() and (pack / e["dir"] / LIBRARY_GZ).is_file():
        so = pack / e["dir"] / LIBRARY_GZ
        try:
            sha = hashlib.sha256(gzip.decompress(so.read_bytes())).hexdigest()
        except (OSError, EOFError) as exc:
            return f"{what}: {so} does not unpack: {exc}"
    elif not so.is_file():
        return f"{what}: {so} missing"
    else:
        sha = file_sha(so)
    if sha != e["so_sha256"]:
        return f"{what}: {so} does not match its sha256 in the manifest"
    if not src.is_file() or source_sha(read_source(src.parent)) != e["sha"]:
        return f"{what}: source missing or not matching {e['sha'][:12]}"
    return None


def dry_run(pack, *, log=print) -> list[str]:
    """Check a pack: manifest loads, every file is there and hashes right, every .so loads in a
    killable worker and exports cudal2_hgemm + cudal2_meta with meta matching the manifest.
    Returns the problems found ([] = good)."""

    pack = Path(pack)
    m = load_manifest(pack)
    problems = []
    entries = pack_entries(m)
    with WorkerPool(1, mem_limit_bytes=4 << 30) as pool:
        for what, e in entries:
            bad = file_problem(pack, what, e)
            if bad:
                problems.append(bad)
                continue
            so = library_path(pack / e["dir"])
            probe = probe_library if what.startswith("candidate") else probe_baseline
            args = (str(so.resolve()),) if probe is probe_library else (str(so.resolve()), e["exports"])
            out = pool.run(probe, *args, timeout_s=60)
            if not out.ok:
                problems.append(f"{what}: loading {so} -> {out.status}: {out.detail[-300:]}")
                continue
            syms = dict(out.value["symbols"])
            if what.startswith("candidate") and (out.value.get("meta") or {}).get("abi") != 2:
                syms.pop("cudal2_workspace", None)       # ABI 1 kernels do not export it
            if not all(syms.values()):
                problems.append(f"{what}: missing symbol(s) {[s for s, ok in syms.items() if not ok]}")
                continue
            if what.startswith("candidate"):
                meta = out.value["meta"]
                if meta.get("arch") not in (None, m["arch"]):
                    problems.append(f"{what}: meta arch {meta.get('arch')} != pack arch {m['arch']}")
                    continue
                e.setdefault("meta", meta)
    log(f"dry run {pack}: {len(entries)} libraries checked, {len(problems)} problem(s)")
    return problems


def probe_baseline(so_path: str, exports: list) -> dict:
    """Worker task: load a baseline .so and check its entry points (baselines have their own ABI,
    cudal2/harness/baselines.py EXPORTS, and no cudal2_meta)."""
    import ctypes
    preload_cuda_runtime()
    try:   # the .so needs libcublas(Lt).so.N by soname: load pip's copies first, as abi does cudart
        for root in pip_cuda_roots():
            for pat in ("libcublasLt.so.*", "libcublas.so.*"):
                for f in sorted((root / "lib").glob(pat))[:1]:
                    ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass
    lib = ctypes.CDLL(str(so_path), mode=ctypes.RTLD_LOCAL)
    symbols = {s: hasattr(lib, s) for s in exports}
    if symbols.get("cudal2_baseline_abi"):
        lib.cudal2_baseline_abi.restype = ctypes.c_int
        symbols["abi_version_1"] = lib.cudal2_baseline_abi() == 1
    return {"symbols": symbols}


def pack_build_result(pack, entry: dict, workdir):
    """A cudal2.core.build.BuildResult for a packed build, for evaluate(build_result=...): the GPU
    machine times the carried binary and never calls nvcc (it may lack nvcc or CUTLASS headers).
    The gzipped PTX (the audit reads its mma types) is unpacked into `workdir`."""

    d = Path(pack) / entry["dir"]
    if (d / BUILD_INFO_GZ).is_file():
        with gzip.open(d / BUILD_INFO_GZ, "rt", encoding="utf-8") as f:
            info = json.load(f)
    else:                                     # an older pack's plain record
        info = json.loads((d / BUILD_INFO).read_text())
    ptx = None
    if (d / "kernel.ptx.gz").exists():
        ptx = Path(workdir) / f"{entry['sha'][:16]}.ptx"
        if not ptx.exists():
            ptx.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(d / "kernel.ptx.gz", "rb") as g, ptx.open("wb") as f:
                shutil.copyfileobj(g, f)
    return result_from_json(info, so_path=library_path(d, workdir), ptx_path=ptx,
                            name=entry.get("label", "kernel"))


def packed_baselines(pack, m: dict, log=print) -> dict | None:
    """{"cublas": so, "cublaslt": so} from the pack if they load here (checked in a worker), else
    None: evaluate() then builds the baselines on this machine (needs nvcc)."""
    libs = {}
    with WorkerPool(1, mem_limit_bytes=4 << 30) as pool:
        for b in m["baselines"]:
            so = (Path(pack) / b["dir"] / "kernel.so").resolve()
            out = pool.run(probe_baseline, str(so), b["exports"], timeout_s=60)
            if not out.ok or not all(out.value["symbols"].values()):
                log(f"  packed baseline {b['name']} does not load here ({out.status}: {out.detail[-200:]}); "
                    "the harness will build the baselines on this machine")
                return None
            libs[b["name"]] = str(so)
    return libs or None


# How `campaign run` takes a pack's shapes: "buckets" one shape of each size bucket in turn, so a
# budget cut leaves every bucket covered; "file" the list's own order, for a list already ranked
# by priority (the verdict call's), so a budget cut takes the least important first.
RUN_ORDERS = ("buckets", "file")


def _run_order(shapes: list, run_order: str) -> list[tuple]:
    """The manifest's shapes in the order `run_order` names (RUN_ORDERS)."""
    if run_order == "file":
        return [tuple(s) for s in shapes]
    by_bucket: dict[str, list[tuple]] = {}
    for s in shapes:
        by_bucket.setdefault(size_bucket(*s), []).append(tuple(s))
    return [q[i] for i in range(max(map(len, by_bucket.values()), default=0))
            for q in by_bucket.values() if i < len(q)]


def _per_shape(m: dict, model) -> list[tuple[tuple, list[tuple[dict, dict]]]]:
    """Shapes in run order (the tuned table's first, then the manifest's in its run_order) with
    their (candidate, options) pairs, the cost model's best-predicted build first."""
    per_shape: dict[tuple, list[dict]] = {}
    for c in m["candidates"]:
        for s in c["shapes"]:
            per_shape.setdefault(tuple(s), []).append(c)
    order = ([tuple(s) for s in m.get("tuned_shapes", [])]
             + _run_order(m["shapes"], m.get("run_order", "buckets")))
    out = []
    for shape in dict.fromkeys(order):
        cs = per_shape.get(shape, [])
        cs.sort(key=lambda c: model.predict_us(_meta(c), c["resources"], shape))
        out.append((shape, [(c, o) for c in cs for o in _screened_options(c, shape, model)]))
    return out


# On the largest shapes a screening costs milliseconds of GPU time per option: screen only the
# cost model's best few runtime options of each build there.
LARGE_SHAPE_FLOP = 1e12
LARGE_SHAPE_OPTIONS = 2


def _screened_options(c: dict, shape: tuple, model) -> list[dict]:
    opts = _sweep(c, shape)
    M, N, K = shape
    if 2.0 * M * N * K < LARGE_SHAPE_FLOP or len(opts) <= LARGE_SHAPE_OPTIONS:
        return opts
    return sorted(opts, key=lambda o: model.predict_us(_meta(c), c["resources"], shape, o))[:LARGE_SHAPE_OPTIONS]


def _sweep(c: dict, shape: tuple) -> list[dict]:
    """The runtime options screening tries for candidate `c` on `shape` ([{}]: defaults)."""
    for sh, opts in c.get("sweeps") or ():
        if tuple(sh) == tuple(shape):
            return opts or [{}]
    return [{}]


def _copy_db(src: Path, dest: Path) -> None:
    """A consistent copy of a results DB (a live one with its WAL contents, or a committed
    results.db.gz)."""
    if not src.is_file():
        raise ValueError(f"--resume-db {src}: no such file")
    if dest.exists():
        raise ValueError(f"--resume-db: {dest} already exists (a run folder is never overwritten)")
    with ResultsDB(src, readonly=True) as db:
        db.backup_to(dest)


class _DBTimed:
    """A tournament backend whose DB writes (this thread's: ResultsDB.thread_write_seconds) are
    counted apart from its GPU work, in seconds["screen"] and seconds["finals"]."""

    def __init__(self, inner, db):
        self.inner, self.db, self.seconds = inner, db, {"screen": 0.0, "finals": 0.0}

    def _timed(self, what, fn, *a, **kw):
        w0 = self.db.thread_write_seconds() if self.db is not None else 0.0
        try:
            return fn(*a, **kw)
        finally:
            if self.db is not None:
                self.seconds[what] += self.db.thread_write_seconds() - w0

    def screen(self, *a, **kw):
        return self._timed("screen", self.inner.screen, *a, **kw)

    def finals(self, *a, **kw):
        return self._timed("finals", self.inner.finals, *a, **kw)


# Finals sessions one kept finals worker serves at most (pipeline.session_ok decides whether it
# serves the next at all): its loaded libraries are never unloaded, so a bound on them. The H200
# verdict call of 2026-11-26 ran 55 sessions: one worker a call. A fresh worker per session cost
# that call ~2 s a session (issue 66 point 7): its exit (the CUDA context torn down) and, in 33
# of its 55 sessions, 1-8 s more waiting for a spare's boot (Python, torch, a CUDA context)
# (reports/cpu/2026-12-07-finals-handover/predict.py).
FINALS_WORKER_SESSIONS = 64


class _LocalLane:
    """Tournaments on one GPU of this machine: a screening pool and a finals pool pinned to
    `device` (CUDA_VISIBLE_DEVICES; None: unpinned), rows into the shared DB (its writes are
    serialised; pipeline.record is the writer). db_s: the DB seconds inside its screenings and
    finals, and after them. The finals pool keeps its worker from session to session while every
    candidate comes back ok (pipeline.session_ok); its spare boots once, at the start."""

    def __init__(self, device, *, has_gpu: bool, db, base_libs, known_lt, audits):
        self.name = f"GPU {device}" if device is not None else "GPU"
        self.screen_pool = (gpu_pool(device, max_tasks=1000, spare=0) if has_gpu
                            else WorkerPool(1, device=device))
        self.final_pool = (gpu_pool(device, max_tasks=FINALS_WORKER_SESSIONS, spare=1) if has_gpu
                           else WorkerPool(1, device=device))
        self.backend = _DBTimed(tournament.HarnessBackend(
            db=db, screen_pool=self.screen_pool, finals_pool=self.final_pool, gpu=has_gpu,
            trusted=True, baseline_libs=base_libs, lt_known=known_lt, audits=audits), db)

    @property
    def db_s(self) -> dict:
        return dict(self.backend.seconds, after=0.0)

    def run(self, shape, entrants, policy, deadline=None):
        return tournament.run(shape, entrants, self.backend, policy, deadline=deadline)

    def ceilings(self, kernels: dict, **kw) -> dict:
        """The device's ceilings (bandwidth.ceilings_task: {"bandwidth", "ceilings"}), timed in a
        fresh finals worker of this lane's GPU; {"status", "detail"} when the worker failed. The
        worker is not kept: the finals start in one that held no 1 GiB buffer (its replacement
        boots while the audit runs)."""
        out = self.final_pool.run(bandwidth.ceilings_task, **kernels, **kw, timeout_s=BANDWIDTH_TIMEOUT_S,
                                  keep_if=lambda _out: False)
        return out.value if out.ok else {"status": out.status, "detail": out.detail[-500:]}

    @property
    def finals_workers(self) -> int:
        """GPU workers the finals pool started (the ceilings' and any spare included)."""
        return self.final_pool.started

    def close(self):
        self.screen_pool.close()
        self.final_pool.close()


class _CampaignActor:
    """A Ray actor: tournaments on its GPU (Ray pins one per actor), rows returned, never
    stored (the driver records them). The pack must be on a filesystem the actor sees."""

    def __init__(self, pack: str):
        import ray
        self.has_gpu, self.gpu = False, ""
        if ray.get_gpu_ids():          # torch only where Ray gave this actor a GPU
            import torch
            self.has_gpu = torch.cuda.is_available()
            self.gpu = torch.cuda.get_device_name(0) if self.has_gpu else ""
        m = load_manifest(pack)
        self.base_libs = packed_baselines(pack, m, log=lambda *a: None) if self.has_gpu else None
        self.lane = None
        self.known_lt: dict = dict(m.get("lt_choices") or {})

    def gpu_name(self) -> str:
        return self.gpu

    def run(self, shape, entrants, policy, audits=None, seconds_left=None):
        """One shape's tournament; `audits` (the driver's verdicts by sha) come with the first
        call only; seconds_left: the driver's deadline, as this process's clock can take it."""
        if self.lane is None:
            self.lane = _LocalLane(None, has_gpu=self.has_gpu, db=None, base_libs=self.base_libs,
                                   known_lt=self.known_lt, audits=audits)
        deadline = None if seconds_left is None else time.monotonic() + seconds_left
        return self.lane.run(shape, entrants, policy, deadline)

    def ceilings(self, kernels: dict, **kw) -> dict:
        """The device's ceilings (bandwidth.ceilings_task) on this actor's GPU, in a worker of its own."""
        if not self.has_gpu:
            return {"status": "not_measured", "detail": "no GPU in this actor"}
        with gpu_pool(None, max_tasks=1, spare=0) as pool:
            out = pool.run(bandwidth.ceilings_task, **kernels, **kw, timeout_s=BANDWIDTH_TIMEOUT_S)
        return out.value if out.ok else {"status": out.status, "detail": out.detail[-500:]}


class _RayLane:
    """The driver's side of a _CampaignActor: runs a shape's tournament there and records the
    rows it made here (the one writer)."""

    def __init__(self, ray, actor, db, audits):
        self.ray, self.actor, self.db, self.audits = ray, actor, db, audits
        self.name = f"ray actor {actor._actor_id.hex()[:8]}"
        self.db_s = {"screen": 0.0, "finals": 0.0, "after": 0.0}   # rows recorded here, after

    def run(self, shape, entrants, policy, deadline=None):
        left = None if deadline is None else deadline - time.monotonic()
        res = self.ray.get(self.actor.run.remote(shape, entrants, policy, self.audits, left))
        self.audits = None                  # the actor keeps them
        src = {e.key: e.request.source for e in entrants}
        w0 = self.db.thread_write_seconds()
        for row in list(res.screened) + list(res.rows):
            if row is not None and row.id is None and not budget_cut(row):
                record(self.db, row, src.get((row.source_sha, tuple(sorted((row.options or {}).items())))))
        self.db_s["after"] += self.db.thread_write_seconds() - w0
        return res

    def ceilings(self, kernels: dict, **kw) -> dict:
        return self.ray.get(self.actor.ceilings.remote(kernels, **kw))

    def close(self):
        try:
            self.ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass


# ---- run: the GPU half, as named steps ---------------------------------------------------------

# kept from the budget for export, reports and the summary after the last timing (8 s for 49
# shapes in an H100 campaign of 2026-11-23)
FINISH_RESERVE_S = 15.0
# the ceilings' worker task (a fresh worker, a 1 GiB buffer, the table's parts: ~5-10 s on an H200)
BANDWIDTH_TIMEOUT_S = 120.0
BANDWIDTH_MIN_LEFT_S = 30.0           # not started with less than this left before the deadline
BANDWIDTH_BUDGET_S = 20.0             # no part of the table starts later than this into its task


@dataclass
class _Run:
    """One campaign run: what its steps share."""
    pack: Path
    m: dict
    out: Path
    gpu: str = "no-gpu"
    has_gpu: bool = False
    run_dir: Path | None = None
    db: ResultsDB | None = None
    plan: list = field(default_factory=list)
    builds: dict = field(default_factory=dict)
    audits: dict = field(default_factory=dict)
    lanes: list = field(default_factory=list)
    deadline: float = float("inf")         # time.monotonic(): no new work past it
    acct: Account = field(default_factory=Account)
    thr: Throughput = field(default_factory=Throughput)
    statuses: dict = field(default_factory=dict)
    lane_shapes: dict = field(default_factory=dict)
    done_shapes: int = 0
    finals_sessions: int = 0               # finals sessions run (tournament.Result.sessions)
    live: Path | None = None               # a folder kept current after every shape
    log: Callable = print
    bar: Bar | None = None                 # the shapes' progress bar (drawn on a terminal only)
    lock: threading.Lock = field(default_factory=threading.Lock)
    summary: dict = field(default_factory=dict)


def run(pack, out, *, budget_s: float = float("inf"), modes=("offline", "e2e", "server"), baselines=None,
        kernels_root=None, margin: float = 0.02, allow_no_gpu: bool = False, resume_db=None,
        server_gaps_ms=None, finals_per_shape: int = 2, db_path=None, devices=None,
        executor: str = "local", address: str | None = None, ray_cpus: int | None = None,
        live_dir=None, call_account=None, exclude_families=(), progress: bool | None = None,
        log=print) -> dict:
    """The GPU half. Returns a summary dict (counts, paths, throughput, the by-phase account).
    budget_s: a deadline, checked before each unit of work (a shape, a screening chunk, a finals
    session), FINISH_RESERVE_S before it kept for export and reports. resume_db: the results.db
    of an earlier run of this pack: its rows are copied in and what it recorded is not timed
    again (the harness's cache rule). db_path: a results DB to append to (created if absent;
    default <run folder>/results.db). Shapes spread over lanes, each running whole tournaments:
    executor "local" has one lane per GPU in `devices` (default: every visible GPU), "ray" one per
    actor of the cluster at `address`; rows reach the DB only here, in this process. live_dir: a
    folder holding a consistent copy of the DB and the summary, rewritten after every shape (what
    a killed run leaves). call_account: the JSON a calling script began (account.Account.from_file:
    the call's start and its phases before the campaign). exclude_families: pack families (and
    "split-K": every build with SPLITK > 1) kept out of this run, e.g. a family whose GPU tests
    failed in the same call. progress: a bar over the shapes with an ETA (None: on a terminal
    only); the per-shape lines print above it."""
    packs = [Path(p).resolve() for p in ([pack] if isinstance(pack, (str, Path)) else pack)]
    r = _Run(pack=packs[0], m=_merge_packs(packs), out=Path(out), log=log,
             acct=Account.from_file(call_account) if call_account else Account(),
             live=Path(live_dir) if live_dir else None)
    start = time.monotonic()
    _exclude(r, exclude_families)
    with r.acct.phase("campaign start"):
        ray_mod, ray_owned = _open_device(r, executor, address, ray_cpus, allow_no_gpu)
        modes, baselines = tuple(modes), tuple(baselines or BASELINES)
        gaps = tuple(server_gaps_ms or DEFAULT_SERVER_GAPS_MS)
        _open_run_dir(r, db_path, resume_db)
        r.deadline = start + budget_s - min(FINISH_RESERVE_S, 0.1 * budget_s)
        model = CostModel.default(r.gpu if r.has_gpu else None, arch=r.m["arch"])
        r.plan = [item for part in r.m["parts"] for item in _per_shape(part, model)]
        log(f"campaign run: {len(r.plan)} shapes, {len(r.m['candidates'])} builds, "
            f"{sum(len(c) for _, c in r.plan)} screenings planned; finals: modes {list(modes)} "
            f"(server gaps {list(gaps)} ms) x {len(baselines)} baselines on {r.gpu}, "
            f"{'no time budget' if budget_s == float('inf') else f'budget {budget_s:.0f} s'}; "
            f"output {r.run_dir}")
    # the ceilings first: they need no candidate, and the audit's CPU time (~0.1 s a build on 2
    # cores) must not leave them under their minimum; the lanes read the audits, filled in place,
    # from the first shape on
    with r.acct.phase("campaign start"):
        _open_lanes(r, devices, ray_mod)
    with r.acct.phase("bandwidth"):
        _bandwidth(r)
    with r.acct.phase("audit"):
        _audit_builds(r)
    request = dict(arch=r.m["arch"], acc=r.m.get("acc"), modes=modes, baselines=baselines,
                   origin="tune", server_gaps_ms=gaps, gate_margin=margin)
    r.bar = Bar(len(r.plan), "shapes", enabled=progress, unit="shape", log=log)
    r.log = r.bar.log                      # the per-shape lines print above the bar
    try:
        _drive(r, _tournament_policy(r.m, finals_per_shape), request)
    finally:
        r.bar.close()
        r.log = log
        with r.acct.phase("campaign end"):
            for ln in r.lanes:
                ln.close()
            if ray_owned:
                ray_mod.shutdown()
    _finish(r, kernels_root=kernels_root, margin=margin)
    log(f"campaign done in {time.monotonic() - start:.0f} s: {r.done_shapes} shapes {r.statuses}, "
        f"{r.summary['exported']} exported, {r.summary['removed']} removed; DB, CSV and reports in {r.run_dir}")
    return r.summary


def _tournament_policy(m: dict, finals_per_shape: int):
    """The tournament policy the packs ask for (tournament.py picks the finalists): the fastest
    few per shape, or for a confirm pack every entrant (each candidate is its own group). A
    confirm pack runs alone."""
    confirm = [part.get("finalists") == EVERY_ENTRANT for part in m["parts"]]
    if any(confirm) and not all(confirm):
        raise ValueError("campaign run: a confirm pack (every entrant in finals) runs alone, not beside other packs")
    return tournament.FinalistPolicy(per_group=True) if confirm and all(confirm) \
        else tournament.FinalistPolicy(top=finals_per_shape)


def _merge_packs(packs: list[Path]) -> dict:
    """One manifest for a run over several packs (e.g. RR and RC shapes, planned apart): the
    first pack's, every candidate's folder made absolute, candidates of all packs (each build
    once), and "parts": each pack's own plan input, timed in the order given."""
    ms = [load_manifest(p) for p in packs]
    for key in ("arch", "acc"):
        if len({m.get(key) for m in ms}) > 1:
            raise ValueError(f"campaign run: the packs differ in {key}: "
                             + ", ".join(f"{p} {m.get(key)}" for p, m in zip(packs, ms)))
    merged = dict(ms[0], candidates=[], parts=[], lt_choices={})
    # the ceilings' kernels: the first pack's that carries each (older packs do not)
    for k in CEILING_KERNELS:
        merged[k] = next((dict(m[k], dir=str(p / m[k]["dir"])) for p, m in zip(packs, ms) if m.get(k)), None)
    seen: set[str] = set()
    for p, m in zip(packs, ms):
        for c in m["candidates"]:
            c["dir"] = str(p / c["dir"])
            c.setdefault("layout", _meta(c).get("layout", m.get("layout", "RR")))
            if c["sha"] not in seen:
                seen.add(c["sha"])
                merged["candidates"].append(c)
        merged["parts"].append(m)
        merged["lt_choices"].update(m.get("lt_choices") or {})
    return merged


def _exclude(r: _Run, families) -> None:
    """Drop the pack's candidates of these families ("split-K": any build with SPLITK > 1)."""
    families = set(families or ())
    if not families:
        return
    def out(c):
        return c["family"] in families or ("split-K" in families and dict(c["params"]).get("SPLITK", 1) > 1)
    gone = [c for c in r.m["candidates"] if out(c)]
    r.m["candidates"] = [c for c in r.m["candidates"] if not out(c)]
    for part in r.m["parts"]:
        part["candidates"] = [c for c in part["candidates"] if not out(c)]
    r.log(f"excluded {len(gone)} builds of {sorted(families)} from this run")


def _open_device(r: _Run, executor: str, address, ray_cpus, allow_no_gpu: bool):
    """Find the GPU(s): r.has_gpu, r.gpu. Returns (ray module or None, whether we started it)."""
    ray_mod, ray_owned = None, False
    if executor == "ray":
        ray_mod, ray_owned = connect_ray(address, num_cpus=ray_cpus)
        # one actor per GPU; a cluster without GPUs (plumbing only) gets ray_cpus of them (2)
        r.lanes, n_gpus = ray_actors(ray_mod, _CampaignActor, str(r.pack), compile_workers=ray_cpus or 2)
        r.has_gpu = n_gpus > 0
        r.gpu = ray_mod.get(r.lanes[0].gpu_name.remote()) if r.has_gpu else "no-gpu"
    elif executor == "local":
        r.has_gpu = provenance.gpu_visible()     # a real GPU, or the fake device of a rehearsal
        r.gpu = (provenance.gpu_name() or "GPU") if r.has_gpu else "no-gpu"
    else:
        raise ValueError(f"unknown executor {executor!r}; use 'local' or 'ray'")
    if not r.has_gpu and not allow_no_gpu:
        if ray_owned:
            ray_mod.shutdown()
        raise RuntimeError("campaign run needs a CUDA GPU (torch.cuda.is_available() is False); "
                           "--allow-no-gpu runs the plumbing only (rows are not_measured)")
    return ray_mod, ray_owned


def _open_run_dir(r: _Run, db_path, resume_db) -> None:
    """The run folder <out>/<gpu>/<date>-campaign and its results DB (resumed or appended to)."""
    tag = r.gpu.replace(" ", "_").replace("/", "_").replace("(", "").replace(")", "")
    r.run_dir = r.out / tag / (_dt.datetime.now().strftime("%Y-%m-%d-%H%M") + "-campaign")
    r.run_dir.mkdir(parents=True, exist_ok=True)
    db_path = Path(db_path) if db_path else r.run_dir / "results.db"
    if db_path.suffix == ".gz":
        raise ValueError(f"--db {db_path}: a gzipped DB is read-only; gunzip it or `cudal2 db merge` it")
    if resume_db:
        _copy_db(Path(resume_db), db_path)
    r.db = ResultsDB(db_path)


def _audit_builds(r: _Run) -> None:
    """Every build audited once, up front and in parallel (CPU work the GPU would wait for)."""
    r.builds = {c["sha"]: pack_build_result(r.pack, c, r.run_dir / "ptx") for c in r.m["candidates"]}
    probe_req = EvalRequest(source="", shape=Shape(1, 1, 1), arch=r.m["arch"], acc=r.m.get("acc"))
    srcs = {c["sha"]: read_source(r.pack / c["dir"]) for c in r.m["candidates"]}
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        futs = {sha: ex.submit(audit_verdict, replace(probe_req, source=srcs[sha]), sha, r.builds[sha])
                for sha in r.builds}
        r.audits.update({sha: f.result() for sha, f in futs.items()})   # the lanes' dict
    r.log(f"audited {len(r.audits)} builds in {time.monotonic() - t0:.1f} s "
          f"({sum(not a['ok'] for a in r.audits.values())} rejected)")


def _open_lanes(r: _Run, devices, ray_mod) -> None:
    """One lane per GPU: local worker pools, or the Ray actors _open_device made."""
    if ray_mod is not None:
        r.lanes = [_RayLane(ray_mod, a, r.db, r.audits) for a in r.lanes]
    else:
        if devices:
            devices = [str(d) for d in devices]          # as asked: pinned, even a single one
        else:
            found = visible_devices() if r.has_gpu and not fakedevice.enabled() else []
            devices = found if len(found) > 1 else [None]
        base_libs = packed_baselines(r.pack, r.m, log=r.log) if r.has_gpu else None
        # cuBLASLt choices: the pack's (from the DBs it was prepared with), then this run's DB
        known_lt = {**(r.m.get("lt_choices") or {}), **r.db.baseline_choices()}
        r.lanes = [_LocalLane(d, has_gpu=r.has_gpu, db=r.db, base_libs=base_libs,
                              known_lt=known_lt, audits=r.audits) for d in devices]
    if len(r.lanes) > 1:
        r.log(f"  {len(r.lanes)} lanes: " + ", ".join(ln.name for ln in r.lanes))


def _ceiling_so(r: _Run, mod, entry: dict | None, build_fn) -> tuple[str | None, str | None]:
    """(.so, None) of a ceilings kernel: the pack's, else built here (a pack made before it was
    packed); (None, why) when neither."""
    if entry:
        return str((r.pack / entry["dir"] / "kernel.so").resolve()), None
    try:
        return build_fn(r.m["arch"]), None
    except Exception as exc:  # noqa: BLE001 - no nvcc here: no such ceiling, never the run
        return None, f"the pack carries no {mod.NAME} kernel and none builds here: {exc}"[:500]


def _ceiling_kernels(r: _Run) -> tuple[dict, str | None]:
    """The ceilings task's libraries: the streaming kernel, the launch floor and the packed cuBLAS
    baseline. Returns (kwargs, why the streaming kernel is missing or None)."""
    from cudal2.harness import floor
    stream_so, why = _ceiling_so(r, bandwidth, r.m.get("stream_read"), bandwidth.build_stream_read)
    floor_so, _ = _ceiling_so(r, floor, r.m.get("launch_floor"), floor.build_launch_floor)
    cb = next((b for b in r.m.get("baselines", []) if b["name"] == "cublas"), None)
    cublas_so = str((r.pack / cb["dir"] / "kernel.so").resolve()) if cb else None
    return {"stream_so": stream_so, "floor_so": floor_so, "cublas_so": cublas_so}, why


def _not_measured(detail: str) -> dict:
    return {"status": "not_measured", "detail": detail}


def _bandwidth(r: _Run) -> None:
    """Once per call, before any shape, on the first lane's GPU (or the fake device): the
    device's ceilings (bandwidth.ceilings_task: the streaming kernel at each decode weight size
    and a large buffer, a device copy, the launch floor) as summary["ceilings"], and for a plan
    with decode rows (M <= 64) the large buffer's entry as summary["bandwidth"] (the reports give
    each decode row's fraction of it). A failure costs the ceilings, never the run."""
    decode = [shape for shape, _ in r.plan if bandwidth.is_decode(*shape)]
    if not r.has_gpu or not r.lanes:
        r.summary["ceilings"] = bandwidth.empty_table("not_measured", "no GPU in this run")
        return
    left = r.deadline - time.monotonic()
    if left < BANDWIDTH_MIN_LEFT_S:
        res = _not_measured(f"budget: under {BANDWIDTH_MIN_LEFT_S:.0f} s left")
    else:
        kernels, why = _ceiling_kernels(r)
        res = _not_measured(why) if why and not kernels["floor_so"] else None
        if res is None:
            try:
                res = r.lanes[0].ceilings(kernels, sizes=bandwidth.table_sizes(decode),
                                          acc=r.m.get("acc") or "f32",
                                          budget_s=min(BANDWIDTH_BUDGET_S, left - BANDWIDTH_MIN_LEFT_S / 2))
            except Exception as exc:  # noqa: BLE001 - a lane's failure costs the ceilings, never the run
                res = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:500]}
    if "ceilings" not in res:                 # the task never answered: both say why
        res = {"bandwidth": res, "ceilings": bandwidth.empty_table(res["status"], res.get("detail", ""))}
    r.summary["ceilings"] = res["ceilings"]
    if decode:
        r.summary["bandwidth"] = dict(res["bandwidth"], decode_rows=len(decode))
        r.log(f"bandwidth ceiling for {len(decode)} decode row(s): {bandwidth.line(res['bandwidth'])}")
    for ln in bandwidth.ceiling_lines(res["ceilings"]):
        r.log(ln)


def _drive(r: _Run, policy, request: dict) -> None:
    """Every lane takes the next shape until the plan runs out or the deadline passes."""
    todo = iter(r.plan)

    def lane_loop(lane):
        while True:
            with r.lock:
                if time.monotonic() >= r.deadline:
                    if not r.summary.get("stopped"):
                        r.summary["stopped"] = f"deadline: stopped after {r.done_shapes} of {len(r.plan)} shapes"
                        r.log(f"budget: {r.summary['stopped']}")
                    return
                nxt = next(todo, None)
            if nxt is None:
                return
            try:
                _shape(r, lane, *nxt, policy, request)
            except Exception as exc:  # noqa: BLE001 - the harness's bug costs this shape, not the run
                with r.lock:
                    r.statuses["shape error"] = r.statuses.get("shape error", 0) + 1
                    r.log(f"  {Shape(*nxt[0])}: the tournament raised {type(exc).__name__}: {exc}")
            with r.lock:
                _checkpoint(r)
                _tick(r)

    with ThreadPoolExecutor(len(r.lanes)) as ex:
        for f in [ex.submit(lane_loop, ln) for ln in r.lanes]:
            f.result()


def _tick(r: _Run) -> None:
    """A shape done: the bar moves, with the budget left beside its ETA (the run stops there)."""
    if r.bar is None:
        return
    left = r.deadline - time.monotonic()
    if left != float("inf"):
        r.bar.postfix(f"budget left {clock(max(0.0, left))}")
    r.bar.update()


def _entrants(r: _Run, S: Shape, pairs: list, request: dict) -> list:
    """The shape's (build, options) entrants, with the screening rows an earlier run recorded."""
    sources = {c["sha"]: read_source(r.pack / c["dir"]) for c, _ in pairs}
    prior = {(ev.source_sha, tuple(sorted(ev.options.items()))): ev
             for ev in r.db.rows(shape=S, stage="screen", gpu=r.gpu if r.has_gpu else "")}
    # each request keeps its own timeout: the tournament cuts what the deadline leaves (a cut is
    # not the kernel's timeout)
    return [Entrant(EvalRequest(source=sources[c["sha"]], shape=S, options=o, timeout_s=120.0,
                                **request),
                    r.builds[c["sha"]], group=c.get("group", ""), layout=c["layout"],
                    screened=prior.get((c["sha"], tuple(sorted(o.items())))))
            for c, o in pairs]


def _shape(r: _Run, lane, shape: tuple, pairs: list, policy, request: dict) -> None:
    """One shape's tournament on `lane`; its counts, phases and log line."""
    t_shape = time.monotonic()
    S, bucket = Shape(*shape), report.size_bucket(*shape)
    entrants = _entrants(r, S, pairs, request)
    before = {ev.id for ev in r.db.rows(shape=S)}      # resumed rows: timed earlier
    db0 = lane.db_s
    t_run = time.monotonic()
    res = lane.run(S, entrants, policy, r.deadline)
    t_end = time.monotonic()
    db = {k: v - db0[k] for k, v in lane.db_s.items()}
    with r.lock:
        r.acct.add("shape setup", t_run - t_shape)
        r.acct.add("screening", res.screen_s - db["screen"])
        r.acct.add("DB", sum(db.values()))
        if res.screened_fresh:
            r.thr.add("screen", bucket, res.screened_fresh, res.screen_s)
        for row in res.screened:
            if row is not None:
                k = "screen cut by the deadline" if budget_cut(row) else f"screen {row.status}"
                r.statuses[k] = r.statuses.get(k, 0) + 1
        if res.not_reached:
            r.statuses["finals cut by the deadline"] = r.statuses.get("finals cut by the deadline", 0) + len(res.not_reached)
        evs = [ev for ev in {id(res.rows[i]): res.rows[i] for i in res.finalists}.values()
               if not budget_cut(ev)]
        fresh = [ev for ev in evs if ev.id not in before]
        sessions = {json.dumps(ev.env.get("phases_s"), sort_keys=True): ev.env["phases_s"]
                    for ev in fresh if (ev.env or {}).get("phases_s")}
        measure = {}
        for ph in sessions.values():
            for k, v in ph.items():
                measure[k] = measure.get(k, 0.0) + float(v)
        r.acct.add_finals(res.finals_s - db["finals"], measure)
        r.acct.add("shape setup", max(0.0, t_end - t_run - res.screen_s - res.finals_s - db["after"])
                   + time.monotonic() - t_end)
        if evs:
            r.thr.add("final", bucket, len(evs), res.finals_s)
            for ev in evs:
                r.statuses[ev.status] = r.statuses.get(ev.status, 0) + 1
        r.lane_shapes[lane.name] = r.lane_shapes.get(lane.name, 0) + 1
        r.done_shapes += 1
        r.finals_sessions += res.sessions
        r.log(f"  {S} {bucket}{' on ' + lane.name if len(r.lanes) > 1 else ''}: {len(pairs)} screened, "
              f"{len(evs)} in finals ({res.sessions} session{'s' if res.sessions != 1 else ''}): "
              f"{', '.join(ev.status for ev in evs)}{_best_note(evs)} ({time.monotonic() - t_shape:.1f} s)")


def _best_note(evs: list) -> str:
    """', best vs cuBLASLt autotuned <median> [lo, hi]' for the best ok finalist, else ''."""
    best = [ev for ev in evs if ev.status == "ok"]
    if not best:
        return ""
    b = max(best, key=lambda e: (e.speedups.get("offline") or {}).get("cublaslt_autotuned", 0))
    iv = ((b.stats.get("offline") or {}).get("speedup") or {}).get("cublaslt_autotuned")
    return f", best vs cuBLASLt autotuned {iv['median']:.3f} [{iv['lo']:.3f}, {iv['hi']:.3f}]" if iv else ""


def _summary(r: _Run, complete: bool) -> dict:
    """The run's summary so far (complete=False: written after each shape, for a killed run)."""
    s = r.summary
    s.update(gpu=r.gpu, run_dir=str(r.run_dir), complete=complete, shapes_done=r.done_shapes,
             shapes_planned=len(r.plan), statuses=dict(r.statuses), throughput=r.thr.table(),
             call=r.acct.table(), lanes=dict(r.lane_shapes), finals_workers=_finals_workers(r))
    s.setdefault("exported", 0)
    s.setdefault("removed", 0)
    s.setdefault("reports", [])
    return s


def _finals_workers(r: _Run) -> dict:
    """Finals sessions run and the finals workers the local lanes started for them (None on Ray:
    the actors' pools are theirs): a kept worker makes these 1 + the ceilings' worker + one after
    each session that failed a candidate, however many sessions ran."""
    counts = [getattr(ln, "finals_workers", None) for ln in r.lanes]
    return {"sessions": r.finals_sessions,
            "started": sum(counts) if counts and None not in counts else None}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _checkpoint(r: _Run) -> None:
    """After a shape: summary.json in the run folder, and in the live folder a consistent copy of
    the DB and the summary (what a run killed at any point leaves usable)."""
    text = json.dumps(_summary(r, complete=False), indent=1) + "\n"
    _write_atomic(r.run_dir / "summary.json", text)
    if r.live is None:
        return
    with r.acct.phase("checkpoint"):
        r.live.mkdir(parents=True, exist_ok=True)
        _live_db(r.db, r.run_dir / "live.db.tmp", r.live / LIVE_DB)
        _write_atomic(r.live / "summary.json", text)


# The live DB travels gzipped: a GPU call's DB outgrows the 16 MiB a returned file may be (~22 MB
# for 55-70 shapes); level 1 because it is rewritten after every shape (~4x smaller, ~0.1 s/10 MB).
LIVE_DB = "results.db.gz"
LIVE_GZIP_LEVEL = 1


def _live_db(db: ResultsDB, tmp: Path, dest: Path) -> None:
    """A consistent copy of `db` (backup_to `tmp`), gzipped into `dest` atomically."""
    tmp.unlink(missing_ok=True)
    db.backup_to(tmp)
    part = dest.with_name(dest.name + ".tmp")
    with tmp.open("rb") as src, gzip.open(part, "wb", compresslevel=LIVE_GZIP_LEVEL) as out:
        shutil.copyfileobj(src, out, 1 << 20)
    part.replace(dest)
    tmp.unlink()


def _finish(r: _Run, *, kernels_root, margin: float) -> None:
    """Export by the export rule, the cost model's held-out score, reports, the final summary."""
    with r.acct.phase("campaign end"):
        rows = r.db.rows()
        r.summary["noise"] = nz = noise_summary(rows)
    r.log(f"noise: {nz['discarded_throttled']} of {nz['rounds']} finals rounds discarded as throttled, "
          f"SM clock {nz['sm_clock_mhz']} MHz, power {nz['power_w']} W, "
          f"{len(nz['baselines_disagree'])} shape(s) whose baselines disagree beyond their intervals")
    r.log("throughput (wall time of each stage on the GPU machine):")
    for line in r.thr.lines():
        r.log(line)
    fw = _finals_workers(r)
    r.log(f"finals: {fw['sessions']} session(s) in {fw['started'] if fw['started'] is not None else '?'} "
          f"finals worker start(s) (the ceilings' included)")
    if r.has_gpu:
        with r.acct.phase("export"):
            _export(r, rows, kernels_root, margin)
    measured = [ev for ev in rows if ev.status == "ok" and not ev.estimated and ev.stage == "final"]
    with r.acct.phase("cost model"):
        _costmodel(r, measured)
    with r.acct.phase("reports"):
        _reports(r, rows, measured)
    shutil.rmtree(r.run_dir / "ptx", ignore_errors=True)     # unpacked copies; the pack keeps them
    r.log(r.acct.line())
    _checkpoint(r)
    _write_atomic(r.run_dir / "summary.json", json.dumps(_summary(r, complete=True), indent=1) + "\n")
    if r.live is not None:
        _write_atomic(r.live / "summary.json", json.dumps(r.summary, indent=1) + "\n")



def _export(r: _Run, rows: list, kernels_root, margin: float) -> None:
    src_for = export_mod.sources_from(r.db, [r.pack / c["dir"] for c in r.m["candidates"]])
    by_sha = {c["sha"]: r.pack / c["dir"] for c in r.m["candidates"]}

    def source_for(sha):
        d = by_sha.get(sha)
        return read_source(d) if d else src_for(sha)

    res = export_mod.export(rows, source_for, root=kernels_root, mode="offline", margin=margin,
                            report=str(r.run_dir), gpu=r.gpu)
    r.summary["exported"] = len(res.exported)
    r.summary["removed"] = len(res.removed)
    (r.run_dir / "export.txt").write_text("\n".join(
        f"{'exported' if d.exported else 'refused '} {d.key}: {d.reason}" for d in res.decisions) + "\n")


def _costmodel(r: _Run, measured: list) -> None:
    """The cost model's honest score: fitted on some shapes, ranked on the others."""
    if not measured:
        return
    metas = {c["sha"]: _meta(c) for c in r.m["candidates"]}
    for ev in measured:                   # the DB row may lack the meta: take the pack's
        if not ev.meta and ev.source_sha in metas:
            ev.meta = metas[ev.source_sha]
    try:
        r.summary["costmodel_held_out"] = held_out_rank_correlation(measured, mode="offline")
        CostModel.fit(measured, gpu=r.gpu, mode="offline").save(r.run_dir / "costmodel.json")
        r.log(f"cost model on held-out shapes: {r.summary['costmodel_held_out']}")
    except Exception as exc:  # noqa: BLE001 - a report extra; never lose the run for it
        r.log(f"cost model fit skipped: {exc}")


def _reports(r: _Run, rows: list, measured: list) -> None:
    weights = None
    try:
        weights = report.read_weights(r.pack / "shapes.csv")
    except ValueError:          # a shape list without weights: no time-weighted speedup
        pass
    keys = sorted({k for ev in measured for k in (ev.timings or {})}, key=lambda k: (k != "offline", k))
    for key in keys:
        shape_rows = report.collect(rows, mode=key)
        if shape_rows:
            paths = report.write_summary(shape_rows, r.run_dir / key, mode=key, weights=weights,
                                         title=f"campaign on {r.gpu}", command=" ".join(sys.argv),
                                         bandwidth=r.summary.get("bandwidth"))
            r.summary["reports"].append(str(paths["summary"]))
    write_evaluations_csv(rows, r.run_dir / "evaluations.csv")


def noise_summary(rows) -> dict:
    """What noise the finals saw (kernel time): rounds discarded as throttled, the SM clock and
    power ranges, and the shapes whose baselines sat apart beyond their intervals by more than
    the export margin (measure.baseline_agreement)."""
    out = {"rounds": 0, "discarded_throttled": 0, "sm_clock_mhz": None, "power_w": None,
           "baselines_disagree": []}
    clocks, watts, seen = [], [], set()
    for ev in rows:
        st = (ev.stats or {}).get("offline") or {}
        sess = st.get("session") or {}
        if ev.stage != "final" or not sess or ev.id in seen:
            continue
        seen.add(ev.id)
        out["rounds"] += int(sess.get("rounds") or 0)
        out["discarded_throttled"] += int(sess.get("discarded_throttled") or 0)
        for k, acc in (("sm_clock_mhz", clocks), ("power_w", watts)):
            r = sess.get(k) or {}
            acc += [v for v in (r.get("min"), r.get("max")) if v]
        if (st.get("baselines") or {}).get("disagree"):
            name = str(ev.shape)
            if name not in out["baselines_disagree"]:
                out["baselines_disagree"].append(name)
    if clocks:
        out["sm_clock_mhz"] = [min(clocks), max(clocks)]
    if watts:
        out["power_w"] = [min(watts), max(watts)]
    return out


def write_evaluations_csv(rows, path: Path) -> Path:
    """Every row's timings, one line per (row, timings key, who), with intervals and the stage."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["M", "N", "K", "source_sha", "options", "stage", "status", "mode", "who",
                    "median_us", "lo_us", "hi_us", "p10_us", "p90_us", "n", "speedup", "speedup_lo",
                    "speedup_hi"])
        for ev in rows:
            opts = ";".join(f"{k}={v}" for k, v in sorted((ev.options or {}).items()))
            for mode, whos in (ev.timings or {}).items():
                ivs = ((ev.stats or {}).get(mode) or {}).get("speedup") or {}
                for who, t in whos.items():
                    iv = ivs.get(who) or {}
                    w.writerow([ev.shape.M, ev.shape.N, ev.shape.K, ev.source_sha[:16], opts, ev.stage,
                                ev.status, mode, who, t.get("median_us"), t.get("lo_us"), t.get("hi_us"),
                                t.get("p10_us"), t.get("p90_us"), t.get("n"), iv.get("median"),
                                iv.get("lo"), iv.get("hi")])
            if not ev.timings:
                w.writerow([ev.shape.M, ev.shape.N, ev.shape.K, ev.source_sha[:16], opts, ev.stage,
                            ev.status] + [""] * 11)
    return path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="CPU half: build every candidate + baselines, pack, dry run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--shapes", help="CSV with M,N,K (shapes/stratified_100.csv)")
    src.add_argument("--sources-queue", metavar="FILE",
                     help="a queue file (JSONL or CSV: binary_key, M, N, K, count, source_sha, "
                          "source_file; the RL reward's misses): pack those sources, each at its own "
                          "shapes, instead of planning candidates for --shapes")
    src.add_argument("--sources-confirm", metavar="FILE",
                     help="an experiment's confirm.jsonl (rl/experiment): every arm's winner at each "
                          "held-out shape, all sent to that shape's one finals session by `campaign run`")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--out", required=True, help="pack folder to create (must be new or empty)")
    p.add_argument("--families", nargs="+", default=None)
    p.add_argument("--limit-per-shape", type=int, default=8,
                   help="candidates per shape at least (0 = all), filled best first by the cost model")
    p.add_argument("--per-family", type=int, default=2,
                   help="each family's best candidates per shape, its first default among them "
                        "(0 = no quota: --limit-per-shape best overall)")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--acc", default="f32", choices=("f32", "f16"))
    p.add_argument("--layout", default=None, choices=("RR", "RC"),
                   help="B layout (RC for nn.Linear weights); default: the shapes file's layout "
                        "column (shapes/llm_trace.csv, `cudal2 shapes` files: RC), else RR")
    p.add_argument("--no-tuned", action="store_true",
                   help="do not add the tuned table's kernels and shapes to the pack")
    p.add_argument("--order", default="file", choices=("file", "gain"),
                   help="file: the shape list's order; gain: only shapes the --db DBs have not "
                        "measured by kernel time, by expected gain (docs/tuning.md)")
    p.add_argument("--limit-shapes", type=int, default=None, help="keep the first N shapes after ordering")
    p.add_argument("--run-order", default="buckets", choices=RUN_ORDERS,
                   help="how `campaign run` takes the shapes: buckets (default) one of each size "
                        "bucket in turn, so a budget cut leaves every bucket covered; file: the "
                        "list's order (a list ranked by priority, cut from its end)")
    p.add_argument("--db", nargs="+", default=[],
                   help="--order gain: results DBs (results.db.gz too) whose measurements are skipped "
                        "and rank the rest")
    p.add_argument("--lt-choices-from", nargs="+", default=[],
                   help="results DBs or folders of them (e.g. reports/) whose cuBLASLt autotune "
                        "choices the pack carries, reused where their key matches")
    p.add_argument("--max-pack-mib", type=float, default=None,
                   help="refuse a pack larger than this many MiB (default: no limit)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (drawn only on a terminal anyway)")
    r = sub.add_parser("run", help="GPU half: time the pack's candidates and baselines, export, report")
    r.add_argument("pack", nargs="+",
                   help="folders made by `cudal2 campaign prepare` (several: one run, their shapes "
                        "in the order given, e.g. an RC pack of decode shapes and an RR pack)")
    r.add_argument("--budget-s", type=float, default=0.0,
                   help="wall-clock budget for the whole run in seconds; the run stops cleanly "
                        "before it (0, the default: no limit, every planned shape is timed)")
    r.add_argument("--out", default="reports", help="reports root: <out>/<gpu>/<date>-campaign/")
    r.add_argument("--modes", nargs="+", default=["offline", "e2e", "server"],
                   choices=("offline", "server", "e2e", "wall"),
                   help="what the finals measure (default: offline e2e server)")
    r.add_argument("--margin", type=float, default=0.02)
    r.add_argument("--server-gaps-ms", type=float, nargs="+", default=None,
                   help="server mode's idle gaps before single calls (default 1 10)")
    r.add_argument("--finals-per-shape", type=int, default=2,
                   help="screened candidates per shape that go to finals (plus near-ties, at most 3)")
    r.add_argument("--resume-db", default=None,
                   help="results.db of an earlier run of this pack: copied in, its recorded pairs skipped")
    r.add_argument("--db", default=None,
                   help="results DB to append to (created if absent; default <run folder>/results.db): "
                        "runs accumulate into it and skip what it already holds")
    r.add_argument("--kernels-out", default=None,
                   help="the kernel table to export into (default: your own table, "
                        "CUDAL2_USER_KERNELS, else $CUDAL2_CACHE/kernels)")
    r.add_argument("--exclude-families", nargs="+", default=[],
                   help="pack families kept out of this run ('split-K': every build with SPLITK > 1)")
    r.add_argument("--live", default=None,
                   help="a folder kept current after every shape (a consistent copy of the DB, "
                        "gzipped, as results.db.gz, and summary.json): what a run killed at any point leaves")
    r.add_argument("--call-account", default=None,
                   help="JSON {start: epoch s, phases: {name: s}} a calling script began: the "
                        "summary's by-phase account then covers the whole call")
    r.add_argument("--allow-no-gpu", action="store_true", help="run the plumbing without a GPU (no timings)")
    r.add_argument("--no-progress", action="store_true",
                   help="no progress bar (drawn only on a terminal anyway)")
    r.add_argument("--devices", nargs="+", default=None,
                   help="GPUs to spread shapes over, as CUDA_VISIBLE_DEVICES names them (default: every visible GPU)")
    r.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: this machine's GPUs; ray: one actor per GPU of a Ray cluster")
    r.add_argument("--address", default=None,
                   help="Ray cluster address with --executor ray ('auto': the running cluster; default: start a local one)")
    d = sub.add_parser("check", help="dry-run an existing pack (loads every .so in a worker)")
    d.add_argument("pack")


def run_cli(args: argparse.Namespace) -> int:
    try:
        if args.action == "prepare" and (args.sources_queue or args.sources_confirm):
            prepare_queue(args.sources_queue or args.sources_confirm, args.arch, args.out, jobs=args.jobs,
                          acc=args.acc, confirm=bool(args.sources_confirm),
                          max_pack_bytes=None if args.max_pack_mib is None else int(args.max_pack_mib * 2**20),
                          lt_choices_from=args.lt_choices_from,
                          progress=False if args.no_progress else None)
        elif args.action == "prepare":
            prepare(args.shapes, args.arch, args.out, families=args.families,
                    limit_per_shape=args.limit_per_shape or None, jobs=args.jobs,
                    per_family=args.per_family or None,
                    acc=args.acc, layout=args.layout, include_tuned=not args.no_tuned,
                    max_pack_bytes=None if args.max_pack_mib is None else int(args.max_pack_mib * 2**20),
                    order=args.order, limit_shapes=args.limit_shapes, measured_dbs=args.db,
                    lt_choices_from=args.lt_choices_from, run_order=args.run_order,
                    progress=False if args.no_progress else None)
        elif args.action == "run":
            run(args.pack, args.out, budget_s=args.budget_s or float("inf"), modes=tuple(args.modes),
                kernels_root=args.kernels_out, margin=args.margin, allow_no_gpu=args.allow_no_gpu,
                resume_db=args.resume_db, server_gaps_ms=args.server_gaps_ms,
                finals_per_shape=args.finals_per_shape, db_path=args.db, devices=args.devices,
                executor=args.executor, address=args.address, live_dir=args.live,
                call_account=args.call_account, exclude_families=args.exclude_families,
                progress=False if args.no_progress else None)
        else:
            problems = dry_run(args.pack)
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
    except (ValueError, RuntimeError) as exc:
        print(f"cudal2 campaign {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0
