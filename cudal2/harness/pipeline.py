"""evaluate(): one kernel source on one shape -> one `Evaluation` -> one results-DB row.

    build (cudal2.build, cached) -> audit (static rules + meta read in a worker)
      -> measure (cudal2.harness.measure, in a GPU worker with time and memory limits)
      -> Evaluation -> ResultsDB.add

Without a GPU the pipeline stops after the audit with status "not_measured": nothing invented.
A DB row for the same (source sha, shape, arch, GPU model) that answers the request (same
accumulator; for timed rows the same modes, baselines, timer, L2 flush and arrival rate) is
returned as is, without building or timing, so an interrupted run resumes where it stopped.
Harness errors ("error") are stored but never served from the cache.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Iterable

from . import provenance
from . import types as T
from .types import EvalRequest, Evaluation

log = logging.getLogger("cudal2.harness")

# measure's status -> Evaluation status
_MEASURE_STATUS = {"ok": T.OK, "wrong": T.WRONG, "too_fast": T.TOO_FAST,
                   "launch_error": T.CRASHED, "not_measured": T.NOT_MEASURED}
_LOAD_VERDICT = {"load_crashed": T.CRASHED, "load_timeout": T.TIMEOUT, "load_oom": T.OOM}


def _measure_task(so_path: str, request: EvalRequest, baseline_libs: dict | None) -> dict:
    """Worker task: measure (which marks the worker poisoned on a CUDA error it sees), then make
    sure the CUDA context is still usable: an error the kernel left behind surfaces here."""
    from . import measure as M
    from .worker import mark_poisoned
    out = M.measure(so_path, request, baseline_libs=baseline_libs)
    if out.get("status") != "launch_error":
        try:
            import torch
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - sticky CUDA error after the kernel ran
            mark_poisoned(f"CUDA context unusable after measuring: {e}")
            out = dict(out, status="launch_error", detail=f"CUDA error after the kernel ran: {e}")
    return out


def _warm_cuda() -> None:
    """Worker preload: import torch and create the CUDA context before any task's clock starts."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")


def gpu_pool(device: int | str | None = None, *, max_tasks: int = 1):
    """The worker pool evaluate() uses for measuring. max_tasks=1: every kernel runs in a fresh
    process (its static code cannot tamper with the next kernel's measurement); raise it for
    trusted kernels (our own templates) to save the ~seconds of CUDA start-up per evaluation."""
    from .worker import WorkerPool
    return WorkerPool(1, device=device, max_tasks=max_tasks,
                      preload=("torch", "cudal2.harness.measure", "cudal2.harness.pipeline:_warm_cuda"))


def settings(request: EvalRequest) -> dict:
    """The request settings a timed row depends on besides its key (source, shape, arch, GPU
    model): recorded in every row's env["settings"] and compared on a cache hit, so a row timed
    one way is never served to a request asking for another."""
    from .measure import DEFAULT_SERVER_QPS
    return {"timer": request.timer, "flush_l2": request.flush_l2,
            "target_qps": float(request.target_qps or DEFAULT_SERVER_QPS),
            "baselines": sorted(set(request.baselines) | set(request.extra_baselines)),
            "modes": list(request.modes), "seeds": request.seeds}


def _recorded_settings(hit: Evaluation) -> dict:
    """A row's settings; rows stored before settings were recorded were timed with the
    defaults, against the baselines their timings and notes name."""
    rec = (hit.env or {}).get("settings")
    if isinstance(rec, dict):
        return rec
    named = {who for whos in (hit.timings or {}).values() for who in whos}
    named |= set((hit.env or {}).get("baseline_notes") or {})
    return {"timer": "events", "flush_l2": False, "target_qps": None,
            "baselines": sorted(named - {"candidate"})}


def _same_timing(hit: Evaluation, request: EvalRequest) -> bool:
    """Whether a timed row answers this request: every mode and baseline asked for was timed,
    with the same timer, L2 flush and (server mode) arrival rate."""
    rec, want = _recorded_settings(hit), settings(request)
    if not set(request.modes) <= set(hit.timings or {}):
        return False
    if not set(want["baselines"]) <= set(rec.get("baselines") or ()):
        return False
    if rec.get("flush_l2") != want["flush_l2"]:
        return False
    if set(request.modes) - {"wall"} and rec.get("timer") != want["timer"]:
        return False                      # the GPU timer matters to offline and server only
    return "server" not in request.modes or rec.get("target_qps") == want["target_qps"]


def _cache_hit(db, sha: str, request: EvalRequest, gpu: str | None) -> Evaluation | None:
    """The stored row that answers this request, or None. The key includes the GPU model ('' =
    no GPU), so a not_measured row never stands in for a measurement on a GPU; timed rows must
    also match the request's timing settings; a row measured for another accumulator is not
    reused."""
    if db is None:
        return None
    rows = db.rows(source_sha=sha, shape=request.shape, arch=request.arch, gpu=gpu or "",
                   status=T.FINAL_STATUSES)
    for hit in reversed(rows):                     # newest first: the latest verdict wins
        if hit.status in (T.OK, T.TOO_FAST) and not _same_timing(hit, request):
            continue
        if request.acc and hit.acc and hit.acc != request.acc:
            continue
        return hit
    return None


def _base(request: EvalRequest, sha: str, env: dict) -> Evaluation:
    return Evaluation(status=T.ERROR, source_sha=sha, shape=request.shape, arch=request.arch,
                      acc=request.acc or "", env={**env, "settings": settings(request)},
                      origin=request.origin)


def evaluate(request: EvalRequest, *, db=None, pool=None, build_result=None,
             probe_pool=None, baseline_libs: dict | None = None, gpu: bool | None = None,
             probe_timeout_s: float = 30, check_deps: bool = True) -> Evaluation:
    """Build, audit and (with a GPU) measure one request; store and return the Evaluation.

    db: a ResultsDB (cache + store) or None. pool: the GPU WorkerPool (default: a fresh
    gpu_pool() for this call). build_result: a BuildResult already made for this source/arch.
    probe_pool: the CPU pool that reads meta (default: a fresh worker per kernel), within
    probe_timeout_s.
    baseline_libs: built baseline libraries (default: built here, cached). gpu: force GPU use
    on/off (default: whether torch sees one). check_deps: run the audit's `nvcc -M` include
    check; only a caller that ran it where the build was made (campaign prepare) turns it off,
    so a GPU machine without nvcc can evaluate carried builds."""
    from ..build import BuildSpec, build, source_sha
    from .audit import audit_build, check_includes
    sha = source_sha(request.source)
    use_gpu = provenance.gpu_visible() if gpu is None else gpu
    gpu_model = provenance.gpu_name() if use_gpu else None
    hit = _cache_hit(db, sha, request, gpu_model)
    if hit is not None:
        log.info("cached: %s %s -> %s", sha[:12], request.shape, hit.status)
        return hit
    env = provenance.collect(gpu=use_gpu)
    ev = _base(request, sha, env)

    def done(e: Evaluation) -> Evaluation:
        if db is not None:
            db.add(e, source=request.source)
        return e

    pre = check_includes(request.source)      # before nvcc sees it: size, #include escapes
    if pre:
        ev.status, ev.detail = T.AUDIT_REJECTED, "; ".join(pre)[:1000]
        ev.audit = {"ok": False, "verdict": "rejected", "reasons": pre}
        return done(ev)
    br = build_result or build(BuildSpec(request.source, arch=request.arch,
                                         name=request.origin or "kernel"),
                               timeout=request.build_timeout_s)
    ev.build = br.summary()
    if not br.ok:
        ev.status, ev.detail = T.BUILD_ERROR, f"build {br.status}"
        return done(ev)
    audit = audit_build(request.source, br, request.arch, name=request.origin or sha[:12],
                        pool=probe_pool, probe_timeout_s=probe_timeout_s, check_deps=check_deps)
    ev.audit = {"ok": audit.ok, "verdict": audit.verdict, "reasons": audit.reasons,
                "notes": audit.notes, "imports": audit.imports, "needed": audit.needed,
                "mma": audit.mma, "load": audit.load}
    ev.meta = audit.meta
    ev.acc = request.acc or audit.meta.get("acc", "") or ""
    ev.layout = audit.meta.get("layout", "") or ""
    if not audit.ok:
        ev.status = _LOAD_VERDICT.get(audit.verdict, T.AUDIT_REJECTED)
        ev.detail = "; ".join(audit.reasons)[:1000]
        return done(ev)
    if request.acc == "f32" and audit.meta.get("acc") == "f16":
        ev.status, ev.detail = T.WRONG, "kernel declares an f16 accumulator; the request needs f32"
        return done(ev)
    if not use_gpu:
        ev.status, ev.detail = T.NOT_MEASURED, "no GPU: built and audited, not run"
        return done(ev)

    if baseline_libs is None and request.baselines:
        from .baselines import BaselineError, build_baselines
        try:
            baseline_libs = build_baselines(request.arch)
        except BaselineError as e:      # measure still runs the torch baseline and says why
            log.warning("%s", e)
    own = pool is None
    pool = pool or gpu_pool()
    try:
        out = pool.run(_measure_task, str(br.so_path), request, baseline_libs,
                       timeout_s=request.timeout_s, mem_limit_bytes=request.mem_limit_bytes)
    finally:
        if own:
            pool.close()
    if out.status == "ok":
        m = out.value or {}
        ev.status = _MEASURE_STATUS.get(m.get("status"), T.ERROR)
        ev.detail = str(m.get("detail") or "")
        ev.correctness = m.get("correctness") or {}
        ev.timings = m.get("timings") or {}
        ev.speedups = m.get("speedups") or {}
        ev.env = {**ev.env, **(m.get("env") or {})}
        ev.env["gpu"] = gpu_model or ev.env.get("gpu")    # the name the cache is keyed by
        if m.get("bounds"):
            ev.correctness = {**ev.correctness, "bounds": m["bounds"]}
        if m.get("baseline_notes"):
            ev.env["baseline_notes"] = m["baseline_notes"]
        ev.acc = m.get("acc") or ev.acc
        ev.layout = m.get("layout") or ev.layout
    elif out.status == "error":
        # an exception mentioning CUDA poisoned the worker: the kernel's fault; else ours
        ev.status = T.CRASHED if out.poisoned else T.ERROR
        ev.detail = out.detail[:1000]
    else:
        ev.status = {"crashed": T.CRASHED, "timeout": T.TIMEOUT, "oom": T.OOM}[out.status]
        ev.detail = out.detail[:1000]
    return done(ev)


def evaluate_many(requests: Iterable[EvalRequest], *, db=None, pool=None, executor=None,
                  jobs: int | None = None, gpu: bool | None = None,
                  progress: Callable[[int, int, Evaluation], None] | None = None) -> list[Evaluation]:
    """Evaluate many requests: cached ones come from the DB, the rest are built in parallel
    (cudal2.build.build_many, or `executor.map` when an Executor is given, e.g. a Ray pool),
    then measured one at a time on this machine's GPU. Results in input order."""
    from ..build import BuildSpec, build, build_many, source_sha
    requests = list(requests)
    use_gpu = provenance.gpu_visible() if gpu is None else gpu
    gpu_model = provenance.gpu_name() if use_gpu else None
    results: list[Evaluation | None] = [None] * len(requests)
    todo = []
    for i, r in enumerate(requests):
        hit = _cache_hit(db, source_sha(r.source), r, gpu_model)
        if hit is not None:
            results[i] = hit
        else:
            todo.append(i)
    specs = [BuildSpec(requests[i].source, arch=requests[i].arch,
                       name=requests[i].origin or "kernel") for i in todo]
    timeout = max((requests[i].build_timeout_s for i in todo), default=300.0)
    if executor is not None:
        builds = list(executor.map(functools.partial(build, timeout=timeout), specs))
    else:
        builds = build_many(specs, jobs=jobs, timeout=timeout)
    libs: dict[str, dict] = {}
    if use_gpu:
        from .baselines import BaselineError, build_baselines
        for arch in {requests[i].arch for i in todo if requests[i].baselines}:
            try:
                libs[arch] = build_baselines(arch)
            except BaselineError as e:     # measure says per baseline why it is missing
                log.warning("%s", e)
    own = pool is None and use_gpu
    if own:
        pool = gpu_pool()
    try:
        done = sum(r is not None for r in results)
        for i, br in zip(todo, builds):
            req = requests[i]
            # a source that repeats in this batch may have been stored a moment ago
            results[i] = (_cache_hit(db, source_sha(req.source), req, gpu_model)
                          or evaluate(req, db=db, pool=pool, build_result=br, gpu=use_gpu,
                                      baseline_libs=libs.get(req.arch)))
            done += 1
            if progress is not None:
                progress(done, len(requests), results[i])
    finally:
        if own:
            pool.close()
    return results  # type: ignore[return-value]
