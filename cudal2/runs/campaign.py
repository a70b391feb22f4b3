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
  model's held-out score next to the DB.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from cudal2.core.abi import preload_cuda_runtime
from cudal2.core.build import BuildSpec, build_many, result_from_json
from cudal2.core.identity import source_sha
from cudal2.core.store import KernelIndex
from cudal2.core.toolchain import find_toolchain, pip_cuda_roots
from cudal2.harness import baselines as hb
from cudal2.harness.audit import check_dependencies
from cudal2.harness.db import ResultsDB
from cudal2.harness import tournament
from cudal2.harness.cluster import connect_ray, ray_actors, visible_devices
from cudal2.harness.pipeline import audit_verdict, gpu_pool, record
from cudal2.harness.tournament import Entrant
from cudal2.harness.types import BASELINES, DEFAULT_SERVER_GAPS_MS, EvalRequest, Shape
from cudal2.harness.worker import WorkerPool, probe_library
from cudal2.runs import export as export_mod, report
from cudal2.runs.report import size_bucket
from cudal2.search.costmodel import CostModel, held_out_rank_correlation
from cudal2.search.tune import build_plan, plan, read_shapes, shapes_layout

SCHEMA = "cudal2.campaign/2"  # a format name: kept when the module moved
MANIFEST = "manifest.json"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _sha_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _pack_entry(result, dest: Path) -> dict:
    """Copy one build-cache entry into the pack (PTX gzipped). Returns its manifest fields."""
    entry = result.so_path.parent
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(result.so_path, dest / "kernel.so")
    shutil.copy2(entry / "build.json", dest / "build.json")
    if result.ptx_path and result.ptx_path.exists():
        with result.ptx_path.open("rb") as f, gzip.open(dest / "kernel.ptx.gz", "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g)
    return {"key": result.key, "so_sha256": _sha_file(dest / "kernel.so"),
            "resources": {"registers": result.max_registers, "shared_bytes": result.max_shared_bytes,
                          "spills": result.spills}}


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
            log=print) -> dict:
    """The CPU half: plan, build, pack, dry-run. Returns the manifest. include_tuned: the tuned
    table's kernels for this arch/acc/layout join the pack (with their shapes, timed first), so
    the run re-measures what dispatch serves today. layout: the shapes file's layout column
    (a `cudal2 shapes --model` file says RC), else `layout`, else RR. order "gain": the shapes
    `measured_dbs` (results DBs) have not measured by kernel time, most promising first
    (cudal2.runs.coverage.order_by_gain); limit_shapes: the first N of the list after ordering."""

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
    if limit_shapes:
        shapes = shapes[:limit_shapes]
    tuned = tuned_rows(arch, acc, layout, kernels_root) if include_tuned else []
    first = [Shape(*r.shape) for r in tuned]
    shapes = list(dict.fromkeys(first + shapes))     # tuned shapes first, no repeats
    model = CostModel.default(arch=arch)
    p = plan(shapes, arch, families=families, limit_per_shape=limit_per_shape, model=model,
             acc=acc, layout=layout, per_family=per_family)
    log(f"campaign prepare: {len(shapes)} shapes, {len(p.candidates)} unique candidates "
        f"({p.pairs} shape x candidate pairs) for {arch}, packing into {out}")
    rep = build_plan(p, jobs=jobs, progress=lambda r: log(
        f"  built {r.name}: {r.status}{' (cached)' if r.cached else f' {r.seconds:.1f} s'}"))
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
        sha = source_sha(c.source)
        fields = _pack_entry(c.build, out / "builds" / sha[:16])
        (out / "builds" / sha[:16] / "kernel.cu").write_text(c.source)
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
                fields = _pack_entry(r, out / "builds" / sha[:16])
                (out / "builds" / sha[:16] / "kernel.cu").write_text(spec.source)
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
    bases = []
    blibs = _baselines()
    specs = [BuildSpec(src, arch=arch, libraries=libs, name=f"baseline-{lib}")
             for lib, (src, libs, _) in blibs.items()]
    for (lib, (src, libs, exports)), r in zip(blibs.items(), build_many(specs, jobs=jobs)):
        if not r.ok:
            raise RuntimeError(f"baseline {lib} failed to build: {r.status}\n{r.log[-2000:]}")
        d = f"baselines/{lib}"
        fields = _pack_entry(r, out / d)
        (out / d / "kernel.cu").write_text(src)
        bases.append({"name": lib, "sha": source_sha(src), "dir": d, "libraries": list(libs),
                      "exports": list(exports), **fields})
    try:
        nvcc = find_toolchain().version
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the builds above succeeded
        nvcc = f"unknown ({exc})"
    manifest = {"schema": SCHEMA, "arch": arch, "acc": acc, "layout": layout, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "git_commit": _git_commit(), "nvcc": nvcc,
        "shapes": [[s.M, s.N, s.K] for s in shapes], "tuned_shapes": [[s.M, s.N, s.K] for s in first],
        "screenings": sum(len(sw) for c in cands for _, sw in c["sweeps"]),
        "candidates": cands, "baselines": bases,
        "build": {k: v for k, v in vars(rep).items() if k != "failures"}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = _dir_bytes(out)
    manifest["pack_bytes"] = size
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if max_pack_bytes is not None and size > max_pack_bytes:
        raise RuntimeError(f"pack {out} is {size / 2**20:.1f} MiB > --max-pack-mib "
                           f"{max_pack_bytes / 2**20:g}: lower --limit-per-shape or the shape count")
    problems = dry_run(out, log=log)
    if problems:
        raise RuntimeError(f"dry run of {out} failed:\n  " + "\n  ".join(problems))
    log(f"plan: {len(shapes)} shapes ({len(first)} from the tuned table), {len(cands)} builds, "
        f"{manifest['screenings']} (shape, build, options) screenings")
    log(f"pack ready: {out} ({size / 2**20:.1f} MiB, {len(cands)} candidates, {len(bases)} baselines); "
        f"on the GPU machine run `cudal2 campaign run {out} --out reports/`")
    return manifest


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


def dry_run(pack, *, log=print) -> list[str]:
    """Check a pack: manifest loads, every file is there and hashes right, every .so loads in a
    killable worker and exports cudal2_hgemm + cudal2_meta with meta matching the manifest.
    Returns the problems found ([] = good)."""

    pack = Path(pack)
    m = load_manifest(pack)
    problems = []
    entries = [(f"candidate {c['label']}", c) for c in m["candidates"]]
    entries += [(f"baseline {b['name']}", b) for b in m["baselines"]]
    with WorkerPool(1, mem_limit_bytes=4 << 30) as pool:
        for what, e in entries:
            so = pack / e["dir"] / "kernel.so"
            if not so.is_file():
                problems.append(f"{what}: {so} missing")
                continue
            if _sha_file(so) != e["so_sha256"]:
                problems.append(f"{what}: {so} does not match its sha256 in the manifest")
                continue
            src = pack / e["dir"] / "kernel.cu"
            if not src.is_file() or source_sha(src.read_text()) != e["sha"]:
                problems.append(f"{what}: source missing or not matching {e['sha'][:12]}")
                continue
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
    info = json.loads((d / "build.json").read_text())
    ptx = None
    if (d / "kernel.ptx.gz").exists():
        ptx = Path(workdir) / f"{entry['sha'][:16]}.ptx"
        if not ptx.exists():
            ptx.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(d / "kernel.ptx.gz", "rb") as g, ptx.open("wb") as f:
                shutil.copyfileobj(g, f)
    return result_from_json(info, so_path=(d / "kernel.so").resolve(), ptx_path=ptx,
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


def _per_shape(m: dict, model) -> list[tuple[tuple, list[tuple[dict, dict]]]]:
    """Shapes in run order (the tuned table's first, then the manifest's, taking one shape of each
    size bucket in turn) with their (candidate, options) pairs, the cost model's best-predicted
    build first."""
    per_shape: dict[tuple, list[dict]] = {}
    for c in m["candidates"]:
        for s in c["shapes"]:
            per_shape.setdefault(tuple(s), []).append(c)
    # the shape list round-robin over size buckets, so a budget cut leaves every bucket covered
    by_bucket: dict[str, list[tuple]] = {}
    for s in m["shapes"]:
        by_bucket.setdefault(size_bucket(*s), []).append(tuple(s))
    rr = [q[i] for i in range(max(map(len, by_bucket.values()), default=0))
          for q in by_bucket.values() if i < len(q)]
    order = [tuple(s) for s in m.get("tuned_shapes", [])] + rr
    out = []
    for shape in dict.fromkeys(order):
        cs = per_shape.get(shape, [])
        cs.sort(key=lambda c: model.predict_us(_meta(c), c["resources"], shape))
        out.append((shape, [(c, o) for c in cs for o in _sweep(c, shape)]))
    return out


def _sweep(c: dict, shape: tuple) -> list[dict]:
    """The runtime options screening tries for candidate `c` on `shape` ([{}]: defaults)."""
    for sh, opts in c.get("sweeps") or ():
        if tuple(sh) == tuple(shape):
            return opts or [{}]
    return [{}]


def _copy_db(src: Path, dest: Path) -> None:
    """A consistent copy of a results DB (sqlite's backup API: WAL contents included)."""
    import sqlite3
    if not src.is_file():
        raise ValueError(f"--resume-db {src}: no such file")
    if dest.exists():
        raise ValueError(f"--resume-db: {dest} already exists (a run folder is never overwritten)")
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as a, sqlite3.connect(dest) as b:
        a.backup(b)


class Throughput:
    """Screenings and finals per GPU-minute, by size bucket (the campaign's benchmark)."""

    def __init__(self):
        self.rec: dict[str, dict[str, float]] = {}
        self.phases: dict[str, float] = {}      # finals: seconds per measure phase, all groups

    def add_phases(self, phases: dict | None) -> None:
        """One finals group's env["phases_s"] (measure.PHASES), summed over the run."""
        for k, v in (phases or {}).items():
            self.phases[k] = self.phases.get(k, 0.0) + float(v)

    def phase_line(self) -> str | None:
        """Where the finals' wall time went: the measure phases, and the rest (worker start,
        DB, cache lookups, process hand-over) as 'outside measure'."""
        final = sum(r["seconds"] for k, r in self.rec.items() if k.startswith("final"))
        if not final or not self.phases:
            return None
        inside = sum(self.phases.values())
        parts = [f"{k} {v:.1f} s" for k, v in sorted(self.phases.items(), key=lambda kv: -kv[1])]
        return (f"  finals {final:.1f} s by phase: " + ", ".join(parts)
                + f", outside measure {max(0.0, final - inside):.1f} s")

    def add(self, stage: str, bucket: str, n: int, seconds: float) -> None:
        r = self.rec.setdefault(f"{stage} {bucket}", {"n": 0, "seconds": 0.0})
        r["n"] += n
        r["seconds"] += seconds

    def table(self) -> dict:
        out: dict = {}
        for k, r in sorted(self.rec.items()):
            out[k] = dict(r, per_gpu_minute=r["n"] / (r["seconds"] / 60.0) if r["seconds"] else None)
        for stage in ("screen", "final"):
            n = sum(r["n"] for k, r in self.rec.items() if k.startswith(stage))
            t = sum(r["seconds"] for k, r in self.rec.items() if k.startswith(stage))
            out[f"{stage} all"] = {"n": n, "seconds": t, "per_gpu_minute": n / (t / 60.0) if t else None}
        return out

    def lines(self) -> list[str]:
        out = [f"  {k:<22} {v['n']:5d} in {v['seconds']:7.1f} s: "
               + (f"{v['per_gpu_minute']:8.1f} per GPU-minute" if v["per_gpu_minute"] else "-")
               for k, v in self.table().items()]
        phase = self.phase_line()
        return out + ([phase] if phase else [])


class _LocalLane:
    """Tournaments on one GPU of this machine: a screening pool and a finals pool pinned to
    `device` (CUDA_VISIBLE_DEVICES; None: unpinned), rows into the shared DB (its writes are
    serialised; pipeline.record is the writer)."""

    def __init__(self, device, *, has_gpu: bool, db, base_libs, known_lt, audits):
        self.name = f"GPU {device}" if device is not None else "GPU"
        self.screen_pool = (gpu_pool(device, max_tasks=1000, spare=0) if has_gpu
                            else WorkerPool(1, device=device))
        self.final_pool = (gpu_pool(device, max_tasks=1, spare=2) if has_gpu
                           else WorkerPool(1, device=device))
        self.backend = tournament.HarnessBackend(db=db, screen_pool=self.screen_pool,
                                                 finals_pool=self.final_pool, gpu=has_gpu,
                                                 trusted=True, baseline_libs=base_libs,
                                                 lt_known=known_lt, audits=audits)

    def run(self, shape, entrants, policy):
        return tournament.run(shape, entrants, self.backend, policy)

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
        self.known_lt: dict = {}

    def gpu_name(self) -> str:
        return self.gpu

    def run(self, shape, entrants, policy, audits=None):
        """One shape's tournament; `audits` (the driver's verdicts by sha) come with the first
        call only."""
        if self.lane is None:
            self.lane = _LocalLane(None, has_gpu=self.has_gpu, db=None, base_libs=self.base_libs,
                                   known_lt=self.known_lt, audits=audits)
        return self.lane.run(shape, entrants, policy)


class _RayLane:
    """The driver's side of a _CampaignActor: runs a shape's tournament there and records the
    rows it made here (the one writer)."""

    def __init__(self, ray, actor, db, audits):
        self.ray, self.actor, self.db, self.audits = ray, actor, db, audits
        self.name = f"ray actor {actor._actor_id.hex()[:8]}"

    def run(self, shape, entrants, policy):
        res = self.ray.get(self.actor.run.remote(shape, entrants, policy, self.audits))
        self.audits = None                  # the actor keeps them
        src = {e.key: e.request.source for e in entrants}
        for row in list(res.screened) + list(res.rows):
            if row is not None and row.id is None:
                record(self.db, row, src.get((row.source_sha, tuple(sorted((row.options or {}).items())))))
        return res

    def close(self):
        try:
            self.ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass


def run(pack, out, *, budget_s: float = float("inf"), modes=("offline", "e2e", "server"), baselines=None,
        kernels_root=None, margin: float = 0.02, allow_no_gpu: bool = False, resume_db=None,
        server_gaps_ms=None, finals_per_shape: int = 2, db_path=None, devices=None,
        executor: str = "local", address: str | None = None, ray_cpus: int | None = None,
        log=print) -> dict:
    """The GPU half. Returns a summary dict (counts, paths, throughput). resume_db: the
    results.db of an earlier run of this pack: its rows are copied in and what it recorded is
    not timed again (the harness's cache rule). db_path: a results DB to append to (created if
    absent; default <run folder>/results.db): calls on any machine accumulate into it, and what it
    already holds is not timed again. Shapes spread over lanes, each running whole
    tournaments: executor "local" has one lane per GPU in `devices` (default: every visible
    GPU; CUDA_VISIBLE_DEVICES names), "ray" one per actor of the cluster at `address` ("auto";
    None: a local cluster of `ray_cpus` CPUs); rows reach the DB only here, in this process."""

    start = time.monotonic()
    pack, out = Path(pack).resolve(), Path(out)
    m = load_manifest(pack)
    baselines = tuple(baselines or BASELINES)
    import torch
    ray_mod, ray_lanes, ray_owned = None, None, False
    if executor == "ray":
        ray_mod, ray_owned = connect_ray(address, num_cpus=ray_cpus)
        # one actor per GPU; a cluster without GPUs (plumbing only) gets ray_cpus of them (2)
        ray_lanes, n_gpus = ray_actors(ray_mod, _CampaignActor, str(pack),
                                       compile_workers=ray_cpus or 2)
        has_gpu = n_gpus > 0
        gpu = ray_mod.get(ray_lanes[0].gpu_name.remote()) if has_gpu else "no-gpu"
    elif executor == "local":
        has_gpu = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if has_gpu else "no-gpu"
    else:
        raise ValueError(f"unknown executor {executor!r}; use 'local' or 'ray'")
    if not has_gpu and not allow_no_gpu:
        if ray_owned:
            ray_mod.shutdown()
        raise RuntimeError("campaign run needs a CUDA GPU (torch.cuda.is_available() is False); "
                           "--allow-no-gpu runs the plumbing only (rows are not_measured)")
    # local: one lane per visible GPU (a worker pool pinned to it); one unpinned lane otherwise
    if devices:
        devices = [str(d) for d in devices]          # as asked: pinned, even a single one
    else:
        found = visible_devices() if has_gpu else []
        devices = found if len(found) > 1 else [None]
    tag = gpu.replace(" ", "_").replace("/", "_")
    run_dir = out / tag / (_dt.datetime.now().strftime("%Y-%m-%d-%H%M") + "-campaign")
    run_dir.mkdir(parents=True, exist_ok=True)
    gaps = tuple(server_gaps_ms or DEFAULT_SERVER_GAPS_MS)
    plan_ = _per_shape(m, CostModel.default(gpu if has_gpu else None, arch=m["arch"]))
    log(f"campaign run: {len(plan_)} shapes, {len(m['candidates'])} builds, "
        f"{sum(len(c) for _, c in plan_)} screenings planned; finals: modes {list(modes)} "
        f"(server gaps {list(gaps)} ms) x {len(baselines)} baselines on {gpu}, "
        f"{'no time budget' if budget_s == float('inf') else f'budget {budget_s:.0f} s'}; "
        f"output {run_dir}")
    base_libs = packed_baselines(pack, m, log=log) if has_gpu and executor == "local" else None
    db_path = Path(db_path) if db_path else run_dir / "results.db"
    if db_path.suffix == ".gz":
        raise ValueError(f"--db {db_path}: a gzipped DB is read-only; gunzip it or `cudal2 db merge` it")
    if resume_db:
        _copy_db(Path(resume_db), db_path)
    db = ResultsDB(db_path)
    known_lt = db.baseline_choices()
    # export + reports after the last timing: 8 s for 49 shapes in the third H100 session
    # (its 60 s reserve left ~50 s of the lease idle)
    reserve = min(30.0, 0.1 * budget_s)
    deadline = start + budget_s - reserve
    thr = Throughput()
    statuses: dict[str, int] = {}
    done_shapes, avg = 0, None
    builds = {c["sha"]: pack_build_result(pack, c, run_dir / "ptx") for c in m["candidates"]}
    # every build audited once, up front and in parallel (CPU work the GPU would wait for)
    t0 = time.monotonic()
    probe_req = EvalRequest(source="", shape=Shape(1, 1, 1), arch=m["arch"], acc=m.get("acc"))
    srcs = {c["sha"]: (pack / c["dir"] / "kernel.cu").read_text() for c in m["candidates"]}
    with ThreadPoolExecutor(8) as ex:
        futs = {sha: ex.submit(audit_verdict, replace(probe_req, source=srcs[sha]), sha, builds[sha])
                for sha in builds}
        audits = {sha: f.result() for sha, f in futs.items()}
    log(f"audited {len(audits)} builds in {time.monotonic() - t0:.1f} s "
        f"({sum(not a['ok'] for a in audits.values())} rejected)")
    policy = tournament.FinalistPolicy(top=finals_per_shape)
    if ray_lanes is not None:
        lanes = [_RayLane(ray_mod, a, db, audits) for a in ray_lanes]
    else:
        lanes = [_LocalLane(d, has_gpu=has_gpu, db=db, base_libs=base_libs, known_lt=known_lt,
                            audits=audits) for d in devices]
    if len(lanes) > 1:
        log(f"  {len(lanes)} lanes: " + ", ".join(ln.name for ln in lanes))
    todo = iter(plan_)
    lock = threading.Lock()
    stop = []

    def drive(lane):
        """One lane (a GPU) takes the next shape until the plan or the budget runs out."""
        nonlocal done_shapes, avg
        while True:
            with lock:
                now = time.monotonic()
                if stop:
                    return
                if now + (avg or 0.0) > deadline:
                    stop.append(True)
                    log(f"budget: stopping after {done_shapes} of {len(plan_)} shapes "
                        f"({now - start:.0f} s used, {reserve:.0f} s kept for export and reports)")
                    return
                nxt = next(todo, None)
            if nxt is None:
                return
            shape, pairs = nxt
            t_shape = time.monotonic()
            S = Shape(*shape)
            bucket = report.size_bucket(*shape)
            sources = {c["sha"]: (pack / c["dir"] / "kernel.cu").read_text() for c, _ in pairs}
            # screen, finalists, one finals session (cudal2.harness.tournament)
            prior = {(ev.source_sha, tuple(sorted(ev.options.items()))): ev
                     for ev in db.rows(shape=S, stage="screen", gpu=gpu if has_gpu else "")}
            entrants = [Entrant(EvalRequest(source=sources[c["sha"]], shape=S, arch=m["arch"],
                                            acc=m.get("acc"), modes=tuple(modes), baselines=baselines,
                                            origin="tune", options=o, server_gaps_ms=gaps,
                                            gate_margin=margin,
                                            timeout_s=max(10.0, min(120.0, deadline - time.monotonic()))),
                                builds[c["sha"]], layout=_meta(c).get("layout", m.get("layout", "RR")),
                                screened=prior.get((c["sha"], tuple(sorted(o.items())))))
                        for c, o in pairs]
            before = {ev.id for ev in db.rows(shape=S)}      # resumed rows: timed earlier
            res = lane.run(S, entrants, policy)
            with lock:
                if res.screened_fresh:
                    thr.add("screen", bucket, res.screened_fresh, res.screen_s)
                for r in res.screened:
                    if r is not None:
                        statuses[f"screen {r.status}"] = statuses.get(f"screen {r.status}", 0) + 1
                evs = list({id(res.rows[i]): res.rows[i] for i in res.finalists}.values())
                if evs:
                    thr.add_phases(next((ev.env.get("phases_s") for ev in evs
                                         if ev.id not in before and (ev.env or {}).get("phases_s")), None))
                    thr.add("final", bucket, len(evs), res.finals_s)
                    for ev in evs:
                        statuses[ev.status] = statuses.get(ev.status, 0) + 1
                    best = [ev for ev in evs if ev.status == "ok"]
                    note = ""
                    if best:
                        b = max(best, key=lambda e: (e.speedups.get("offline") or {}).get("cublaslt_autotuned", 0))
                        iv = ((b.stats.get("offline") or {}).get("speedup") or {}).get("cublaslt_autotuned")
                        if iv:
                            note = f", best vs cuBLASLt autotuned {iv['median']:.3f} [{iv['lo']:.3f}, {iv['hi']:.3f}]"
                    log(f"  {S} {bucket}{' on ' + lane.name if len(lanes) > 1 else ''}: {len(pairs)} "
                        f"screened, {len(evs)} in finals ({res.sessions} session{'s' if res.sessions != 1 else ''}): "
                        f"{', '.join(ev.status for ev in evs)}{note} ({time.monotonic() - t_shape:.1f} s)")
                lane_shapes[lane.name] = lane_shapes.get(lane.name, 0) + 1
                done_shapes += 1
                dt = time.monotonic() - t_shape
                avg = dt if avg is None else 0.7 * avg + 0.3 * dt

    lane_shapes: dict[str, int] = {}
    try:
        with ThreadPoolExecutor(len(lanes)) as ex:
            for f in [ex.submit(drive, ln) for ln in lanes]:
                f.result()
    finally:
        for ln in lanes:
            ln.close()
        if ray_owned:
            ray_mod.shutdown()
    rows = db.rows()
    summary = {"gpu": gpu, "run_dir": str(run_dir), "shapes_done": done_shapes,
               "shapes_planned": len(plan_), "statuses": statuses, "exported": 0, "removed": 0,
               "reports": [], "throughput": thr.table(), "finals_phases_s": thr.phases,
               "lanes": lane_shapes, "noise": noise_summary(rows)}
    nz = summary["noise"]
    log(f"noise: {nz['discarded_throttled']} of {nz['rounds']} finals rounds discarded as throttled, "
        f"SM clock {nz['sm_clock_mhz']} MHz, power {nz['power_w']} W, "
        f"{len(nz['baselines_disagree'])} shape(s) whose baselines disagree beyond their intervals")
    log("throughput (wall time of each stage on the GPU machine):")
    for line in thr.lines():
        log(line)
    src_for = export_mod.sources_from(db, [pack / c["dir"] for c in m["candidates"]])
    by_sha = {c["sha"]: pack / c["dir"] / "kernel.cu" for c in m["candidates"]}
    metas = {c["sha"]: _meta(c) for c in m["candidates"]}

    def source_for(sha):
        p = by_sha.get(sha)
        return p.read_text() if p else src_for(sha)

    if has_gpu:
        res = export_mod.export(rows, source_for, root=kernels_root, mode="offline", margin=margin,
                                report=str(run_dir), gpu=gpu)
        summary["exported"] = len(res.exported)
        summary["removed"] = len(res.removed)
        (run_dir / "export.txt").write_text("\n".join(
            f"{'exported' if d.exported else 'refused '} {d.key}: {d.reason}" for d in res.decisions) + "\n")
    # The cost model's honest score: fitted on some shapes, ranked on the others.
    measured = [ev for ev in rows if ev.status == "ok" and not ev.estimated and ev.stage == "final"]
    if measured:
        for ev in measured:                   # the DB row may lack the meta: take the pack's
            if not ev.meta and ev.source_sha in metas:
                ev.meta = metas[ev.source_sha]
        try:
            summary["costmodel_held_out"] = held_out_rank_correlation(measured, mode="offline")
            CostModel.fit(measured, gpu=gpu, mode="offline").save(run_dir / "costmodel.json")
            log(f"cost model on held-out shapes: {summary['costmodel_held_out']}")
        except Exception as exc:  # noqa: BLE001 - a report extra; never lose the run for it
            log(f"cost model fit skipped: {exc}")
    weights = None
    try:
        weights = report.read_weights(pack / "shapes.csv")
    except ValueError:          # a shape list without weights: no time-weighted speedup
        pass
    keys = sorted({k for ev in measured for k in (ev.timings or {})},
                  key=lambda k: (k != "offline", k))
    for key in keys:
        shape_rows = report.collect(rows, mode=key)
        if shape_rows:
            paths = report.write_summary(shape_rows, run_dir / key, mode=key, weights=weights,
                                         title=f"campaign on {gpu}", command=" ".join(sys.argv))
            summary["reports"].append(str(paths["summary"]))
    shutil.rmtree(run_dir / "ptx", ignore_errors=True)     # unpacked copies; the pack keeps them
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_evaluations_csv(rows, run_dir / "evaluations.csv")
    log(f"campaign done in {time.monotonic() - start:.0f} s: {done_shapes} shapes {statuses}, "
        f"{summary['exported']} exported, {summary['removed']} removed; DB, CSV and reports in {run_dir}")
    return summary


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
    p.add_argument("--shapes", required=True, help="CSV with M,N,K (shapes/stratified_100.csv)")
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
    p.add_argument("--db", nargs="+", default=[],
                   help="--order gain: results DBs (results.db.gz too) whose measurements are skipped "
                        "and rank the rest")
    p.add_argument("--max-pack-mib", type=float, default=None,
                   help="refuse a pack larger than this many MiB (default: no limit)")
    r = sub.add_parser("run", help="GPU half: time the pack's candidates and baselines, export, report")
    r.add_argument("pack", help="a folder made by `cudal2 campaign prepare`")
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
    r.add_argument("--kernels-out", default=None, help="generated_kernels root to export into")
    r.add_argument("--allow-no-gpu", action="store_true", help="run the plumbing without a GPU (no timings)")
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
        if args.action == "prepare":
            prepare(args.shapes, args.arch, args.out, families=args.families,
                    limit_per_shape=args.limit_per_shape or None, jobs=args.jobs,
                    per_family=args.per_family or None,
                    acc=args.acc, layout=args.layout, include_tuned=not args.no_tuned,
                    max_pack_bytes=None if args.max_pack_mib is None else int(args.max_pack_mib * 2**20),
                    order=args.order, limit_shapes=args.limit_shapes, measured_dbs=args.db)
        elif args.action == "run":
            run(args.pack, args.out, budget_s=args.budget_s or float("inf"), modes=tuple(args.modes),
                kernels_root=args.kernels_out, margin=args.margin, allow_no_gpu=args.allow_no_gpu,
                resume_db=args.resume_db, server_gaps_ms=args.server_gaps_ms,
                finals_per_shape=args.finals_per_shape, db_path=args.db, devices=args.devices,
                executor=args.executor, address=args.address)
        else:
            problems = dry_run(args.pack)
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
    except (ValueError, RuntimeError) as exc:
        print(f"cudal2 campaign {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0
