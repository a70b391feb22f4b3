"""A GPU campaign in two halves (`cudal2 campaign prepare|run`).

prepare (CPU machine, nvcc, no GPU): plan the deduplicated candidates for a shape list
  (cudal2.search.tune.plan), build them all in parallel (build cache), copy each build-cache entry
  (.so, ptxas stats, source, gzipped PTX) into a pack folder with a manifest, and dry-run the pack:
  every .so loads in a killable worker and exports the ABI symbols, its meta matches the
  manifest. The pack is small enough to carry (< 64 MiB, checked).
run (GPU machine; needs torch + numpy + stdlib, matplotlib optional, no nvcc): for each shape
  (the tuned table's shapes first, then the shape list), SCREEN every packed (build, runtime
  options) candidate of the shape in one warm worker (smoke check + a few kernel-time samples,
  early stop when clearly slower), then run the FINALS of the best few in a fresh worker
  (correctness suite, kernel time against every baseline with the stopping rule, end-to-end
  call, server mode) through cudal2.harness (build_result=..., baseline_libs=...: nothing is
  recompiled); stop cleanly before the budget runs out, export by the export rule, write reports
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
import time
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
from cudal2.harness.pipeline import ScreenCandidate, audit_verdict, evaluate_group, gpu_pool, screen
from cudal2.harness.types import BASELINES, DEFAULT_SERVER_GAPS_MS, EvalRequest, Shape
from cudal2.harness.worker import WorkerPool, probe_library
from cudal2.runs import export as export_mod, report
from cudal2.runs.report import size_bucket
from cudal2.search.costmodel import CostModel, held_out_rank_correlation
from cudal2.search.tune import build_plan, plan, read_shapes

SCHEMA = "cudal2.campaign/2"  # a format name: kept when the module moved
MAX_PACK_BYTES = 64 << 20
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
            jobs: int | None = None, acc: str = "f32", layout: str = "RR",
            include_tuned: bool = True, kernels_root=None, log=print) -> dict:
    """The CPU half: plan, build, pack, dry-run. Returns the manifest. include_tuned: the tuned
    table's kernels for this arch/acc/layout join the pack (with their shapes, timed first), so
    the run re-measures what dispatch serves today."""

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; pick a fresh folder")
    shapes = read_shapes(shapes_file)
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
    if size > MAX_PACK_BYTES:
        raise RuntimeError(f"pack {out} is {size / 2**20:.1f} MiB > {MAX_PACK_BYTES >> 20} MiB: "
                           "lower --limit-per-shape or the shape count")
    problems = dry_run(out, log=log)
    if problems:
        raise RuntimeError(f"dry run of {out} failed:\n  " + "\n  ".join(problems))
    log(f"plan: {len(shapes)} shapes ({len(first)} from the tuned table), {len(cands)} builds, "
        f"{manifest['screenings']} (shape, build, options) screenings")
    log(f"pack ready: {out} ({size / 2**20:.1f} MiB, {len(cands)} candidates, {len(bases)} baselines); "
        f"carry it to a GPU machine and run `cudal2 campaign run {out} --budget-s 480 --out reports/`")
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


def finalists(screened: list, *, top: int = 2, within: float = 0.03, cap: int = 3,
              reference_us: float | None = None) -> list[int]:
    """Indices of the screened candidates that go to finals: the `top` fastest, plus any within
    `within` of the fastest or of the reference (torch) time, at most `cap`. `screened` holds
    (index, median_us or None)."""
    ok = sorted((t, i) for i, t in screened if t)
    if not ok:
        return []
    best = ok[0][0]
    bar = max(best, reference_us or 0.0) * (1.0 + within)
    chosen = [i for _, i in ok[:top]]
    chosen += [i for t, i in ok[top:] if t <= bar]
    return chosen[:cap]


def run(pack, out, *, budget_s: float = 480.0, modes=("offline", "e2e", "server"), baselines=None,
        kernels_root=None, margin: float = 0.02, allow_no_gpu: bool = False, resume_db=None,
        server_gaps_ms=None, finals_per_shape: int = 2, log=print) -> dict:
    """The GPU half. Returns a summary dict (counts, paths, throughput). resume_db: the
    results.db of an earlier run of this pack: its rows are copied in and what it recorded is
    not timed again (the harness's cache rule)."""

    start = time.monotonic()
    pack, out = Path(pack).resolve(), Path(out)
    m = load_manifest(pack)
    baselines = tuple(baselines or BASELINES)
    import torch
    has_gpu = torch.cuda.is_available()
    if not has_gpu and not allow_no_gpu:
        raise RuntimeError("campaign run needs a CUDA GPU (torch.cuda.is_available() is False); "
                           "--allow-no-gpu runs the plumbing only (rows are not_measured)")
    gpu = torch.cuda.get_device_name(0) if has_gpu else "no-gpu"
    tag = gpu.replace(" ", "_").replace("/", "_")
    run_dir = out / tag / (_dt.datetime.now().strftime("%Y-%m-%d-%H%M") + "-campaign")
    run_dir.mkdir(parents=True, exist_ok=True)
    gaps = tuple(server_gaps_ms or DEFAULT_SERVER_GAPS_MS)
    plan_ = _per_shape(m, CostModel.default(gpu if has_gpu else None, arch=m["arch"]))
    log(f"campaign run: {len(plan_)} shapes, {len(m['candidates'])} builds, "
        f"{sum(len(c) for _, c in plan_)} screenings planned; finals: modes {list(modes)} "
        f"(server gaps {list(gaps)} ms) x {len(baselines)} baselines on {gpu}, budget "
        f"{budget_s:.0f} s; output {run_dir}")
    base_libs = packed_baselines(pack, m, log=log) if has_gpu else None
    if resume_db:
        _copy_db(Path(resume_db), run_dir / "results.db")
    db = ResultsDB(run_dir / "results.db")
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
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    probe_req = EvalRequest(source="", shape=Shape(1, 1, 1), arch=m["arch"], acc=m.get("acc"))
    srcs = {c["sha"]: (pack / c["dir"] / "kernel.cu").read_text() for c in m["candidates"]}
    with ThreadPoolExecutor(8) as ex:
        futs = {sha: ex.submit(audit_verdict, replace(probe_req, source=srcs[sha]), sha, builds[sha])
                for sha in builds}
        audits = {sha: f.result() for sha, f in futs.items()}
    log(f"audited {len(audits)} builds in {time.monotonic() - t0:.1f} s "
        f"({sum(not a['ok'] for a in audits.values())} rejected)")
    screen_pool = gpu_pool(max_tasks=1000, spare=0) if has_gpu else WorkerPool(1)
    final_pool = gpu_pool(max_tasks=1, spare=2) if has_gpu else WorkerPool(1)
    try:
        for shape, pairs in plan_:
            now = time.monotonic()
            if now + (avg or 0.0) > deadline:
                log(f"budget: stopping after {done_shapes} of {len(plan_)} shapes "
                    f"({now - start:.0f} s used, {reserve:.0f} s kept for export and reports)")
                break
            t_shape = time.monotonic()
            S = Shape(*shape)
            bucket = report.size_bucket(*shape)
            sources = {c["sha"]: (pack / c["dir"] / "kernel.cu").read_text() for c, _ in pairs}
            # 1. screening (ranking only), skipped when there is one candidate
            chosen = list(range(len(pairs)))
            if len(pairs) > 1:
                cands = [ScreenCandidate(sources[c["sha"]], builds[c["sha"]],
                                         tuple(sorted(o.items())), origin="tune")
                         for c, o in pairs]
                prior = [ev for ev in db.rows(shape=S, stage="screen", gpu=gpu if has_gpu else "")]
                stored = {(ev.source_sha, tuple(sorted(ev.options.items()))): ev for ev in prior}
                rows = [stored.get((c["sha"], tuple(sorted(o.items())))) for c, o in pairs]
                todo = [i for i, r in enumerate(rows) if r is None]
                t0 = time.monotonic()
                ref = {}
                if todo:
                    got, ref = screen(S, [cands[i] for i in todo], arch=m["arch"], acc=m.get("acc"),
                                      db=db, pool=screen_pool, gpu=has_gpu, audits=audits)
                    for i, r in zip(todo, got):
                        rows[i] = r
                thr.add("screen", bucket, len(todo), time.monotonic() - t0)
                timed = [(i, ((r.timings or {}).get("screen", {}).get("candidate") or {}).get("median_us")
                          if r.status == "ok" else None) for i, r in enumerate(rows)]
                chosen = finalists(timed, top=finals_per_shape, reference_us=ref.get("torch_us")) \
                    if has_gpu else [i for i, r in enumerate(rows) if r.status == "not_measured"][:finals_per_shape]
                for r in rows:
                    statuses[f"screen {r.status}"] = statuses.get(f"screen {r.status}", 0) + 1
            # 2. finals of the chosen few in one fresh worker (our own templates: trusted)
            reqs = [EvalRequest(source=sources[pairs[i][0]["sha"]], shape=S, arch=m["arch"],
                                acc=m.get("acc"), modes=tuple(modes), baselines=baselines,
                                origin="tune", options=pairs[i][1], server_gaps_ms=gaps,
                                timeout_s=max(10.0, min(120.0, deadline - time.monotonic())))
                    for i in chosen]
            if reqs:
                t0 = time.monotonic()
                by_layout: dict[str, list[int]] = {}
                for j, i in enumerate(chosen):
                    meta = _meta(pairs[i][0])
                    by_layout.setdefault(meta.get("layout", m.get("layout", "RR")), []).append(j)
                evs = []
                before = {ev.id for ev in db.rows(shape=S)}      # resumed rows: timed earlier
                for js in by_layout.values():
                    group = evaluate_group([reqs[j] for j in js], db=db, pool=final_pool,
                                           build_results=[builds[pairs[chosen[j]][0]["sha"]] for j in js],
                                           baseline_libs=base_libs, gpu=has_gpu,
                                           lt_known=known_lt, audits=audits)
                    thr.add_phases(next((ev.env.get("phases_s") for ev in group
                                         if ev.id not in before and (ev.env or {}).get("phases_s")), None))
                    evs += group
                thr.add("final", bucket, len(reqs), time.monotonic() - t0)
                for ev in evs:
                    statuses[ev.status] = statuses.get(ev.status, 0) + 1
                best = [ev for ev in evs if ev.status == "ok"]
                note = ""
                if best:
                    b = max(best, key=lambda e: (e.speedups.get("offline") or {}).get("cublaslt_autotuned", 0))
                    iv = ((b.stats.get("offline") or {}).get("speedup") or {}).get("cublaslt_autotuned")
                    if iv:
                        note = f", best vs cuBLASLt autotuned {iv['median']:.3f} [{iv['lo']:.3f}, {iv['hi']:.3f}]"
                log(f"  {S} {bucket}: {len(pairs)} screened, {len(reqs)} in finals: "
                    f"{', '.join(ev.status for ev in evs)}{note} ({time.monotonic() - t_shape:.1f} s)")
            done_shapes += 1
            dt = time.monotonic() - t_shape
            avg = dt if avg is None else 0.7 * avg + 0.3 * dt
    finally:
        screen_pool.close()
        final_pool.close()
    rows = db.rows()
    summary = {"gpu": gpu, "run_dir": str(run_dir), "shapes_done": done_shapes,
               "shapes_planned": len(plan_), "statuses": statuses, "exported": 0, "removed": 0,
               "reports": [], "throughput": thr.table(), "finals_phases_s": thr.phases}
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
    p.add_argument("--layout", default="RR", choices=("RR", "RC"),
                   help="B layout (RC for nn.Linear weights, e.g. shapes/llm_trace.csv)")
    p.add_argument("--no-tuned", action="store_true",
                   help="do not add the tuned table's kernels and shapes to the pack")
    r = sub.add_parser("run", help="GPU half: time the pack's candidates and baselines, export, report")
    r.add_argument("pack", help="a folder made by `cudal2 campaign prepare`")
    r.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget for the whole run")
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
    r.add_argument("--kernels-out", default=None, help="generated_kernels root to export into")
    r.add_argument("--allow-no-gpu", action="store_true", help="run the plumbing without a GPU (no timings)")
    d = sub.add_parser("check", help="dry-run an existing pack (loads every .so in a worker)")
    d.add_argument("pack")


def run_cli(args: argparse.Namespace) -> int:
    try:
        if args.action == "prepare":
            prepare(args.shapes, args.arch, args.out, families=args.families,
                    limit_per_shape=args.limit_per_shape or None, jobs=args.jobs,
                    per_family=args.per_family or None,
                    acc=args.acc, layout=args.layout, include_tuned=not args.no_tuned)
        elif args.action == "run":
            run(args.pack, args.out, budget_s=args.budget_s, modes=tuple(args.modes),
                kernels_root=args.kernels_out, margin=args.margin, allow_no_gpu=args.allow_no_gpu,
                resume_db=args.resume_db, server_gaps_ms=args.server_gaps_ms,
                finals_per_shape=args.finals_per_shape)
        else:
            problems = dry_run(args.pack)
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
    except (ValueError, RuntimeError) as exc:
        print(f"cudal2 campaign {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0
