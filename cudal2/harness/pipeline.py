"""The harness's pipeline: source -> build -> audit -> (GPU) screen or finals -> Evaluation ->
the results DB. One writer of result rows (`record`) and one cache rule (`answers`), used by
bench, tune, campaign and RL alike.

    evaluate(request)          finals for one kernel in a fresh worker (correctness suite, kernel
                               time against every baseline with the stopping rule, e2e, server)
    evaluate_group(requests)   finals for several trusted kernels of ONE shape sharing a
                               worker (fresh, or kept from clean sessions: `session_ok`): one
                               interleaved session, baselines set up once
    evaluate_many(requests)    evaluate() over a list: parallel builds, then one GPU at a time
    screen(shape, candidates)  ranking only: many pre-built (build, options) candidates of one
                               shape in one warm worker (smoke check + a few kernel-time samples),
                               in chunks with time slices: a fault costs one candidate

Without a GPU the pipeline stops after the audit with status "not_measured": nothing invented
(an `estimator` may price it, flagged estimated, before it is recorded). Harness errors ("error")
are recorded but never served from the cache.
"""
from __future__ import annotations

import collections
import functools
import logging
import re
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from cudal2.core.abi import AbiError, meta_accepts, option_values
from cudal2.core.build import BuildSpec, build, build_many
from cudal2.core.identity import source_sha
from cudal2.core.vocab import normalise_options
from cudal2.harness import measure as M, provenance, types as T
from cudal2.harness.audit import audit_build, check_source
from cudal2.harness.baselines import BaselineError, build_baselines
from cudal2.harness.measure import mode_keys
from cudal2.harness.metacheck import guard_refuses
from cudal2.harness.types import EvalRequest, Evaluation
from cudal2.harness.worker import WorkerPool, mark_poisoned

log = logging.getLogger("cudal2.harness")

# measure's status -> Evaluation status
_MEASURE_STATUS = {"ok": T.OK, "wrong": T.WRONG, "too_fast": T.TOO_FAST,
                   "launch_error": T.CRASHED, "not_measured": T.NOT_MEASURED, "error": T.ERROR,
                   "audit_rejected": T.AUDIT_REJECTED}     # the call guard refused a call
# measure's words for cudaErrorInvalidValue, the ABI's refusal (finals; screening adds "(smoke, ...)")
_GUARD_REFUSAL = re.compile(r"kernel returned cudaError 1(?!\d)")
_LOAD_VERDICT = {"load_crashed": T.CRASHED, "load_timeout": T.TIMEOUT, "load_oom": T.OOM}


# ---- the cache rule -------------------------------------------------------------------------------

def settings(request: EvalRequest) -> dict:
    """How a request is timed, besides its key (source, shape, arch, GPU model, options):
    recorded in every row's env["settings"] and compared by `answers`."""
    return {"timer": request.timer, "operands": request.operands,
            "server_gaps_ms": list(request.server_gaps_ms) if "server" in request.modes else [],
            "baselines": sorted(set(request.baselines) | set(request.extra_baselines)),
            "modes": list(request.modes), "mode_keys": mode_keys(request), "seeds": request.seeds,
            "gate_margin": request.gate_margin}


def answers(row: Evaluation, request: EvalRequest) -> bool:
    """THE cache rule: a stored row answers a request (on the same GPU model, which the caller's
    query fixes) only if it was made for the same runtime options and accumulator and, for a
    timed verdict (ok, too_fast), timed the same way: a final-stage row, the same timer and
    operands, every requested mode key and baseline present. A failure verdict (wrong, crash,
    build or audit failure) answers whatever the timing; harness errors never answer."""
    if row.status not in T.FINAL_STATUSES:
        return False
    if dict(request.options) != dict(row.options or {}):
        return False
    if request.acc and row.acc and row.acc != request.acc:
        return False
    if row.status not in (T.OK, T.TOO_FAST):
        return True
    if row.stage != "final":
        return False
    rec = (row.env or {}).get("settings") or {}
    if rec.get("timer") != request.timer or rec.get("operands") != request.operands:
        return False
    want = settings(request)
    if not set(want["baselines"]) <= set(rec.get("baselines") or ()):
        return False
    have = set(row.timings or {})
    need = {k for k in want["mode_keys"] if not k.startswith("e2e_graph")}  # capture may fail
    gate = (row.env or {}).get("gate") or {}
    if (gate.get("passed") is False and request.gate_margin is not None
            and gate.get("margin", float("inf")) <= request.gate_margin):
        # below a bar no lower than this request's: its server and e2e keys were never wanted
        need = {k for k in need if not k.startswith(("server_", "e2e_"))}
    return need <= have


def cached(db, request: EvalRequest, gpu: str | None, *, sha: str | None = None) -> Evaluation | None:
    """The newest stored row that answers `request` on GPU model `gpu` ('' / None = no GPU), or
    None. A not_measured row never stands in for a measurement on a GPU (the key holds the GPU)."""
    if db is None:
        return None
    rows = db.rows(source_sha=sha or source_sha(request.source), shape=request.shape,
                   arch=request.arch, gpu=gpu or "", status=T.FINAL_STATUSES,
                   options=dict(request.options))
    for row in reversed(rows):                     # newest first: the latest verdict wins
        if answers(row, request):
            return row
    return None


def record(db, ev: Evaluation, source: str | None = None, *,
           estimator: Callable[[Evaluation], object] | None = None) -> Evaluation:
    """THE writer of result rows: price a not_measured row with `estimator` (flagged estimated)
    if one is given, then append it to `db` (None: not stored). Returns `ev` (with its id)."""
    if estimator is not None and ev.status == T.NOT_MEASURED and not ev.estimated:
        estimator(ev)
    ev.binary_key = ev.binary_key or (ev.build or {}).get("binary_key")   # BuildResult.summary()'s
    if db is not None and ev.id is None:
        db.add(ev, source=source)
    return ev


# ---- workers --------------------------------------------------------------------------------------

def _measure_task(so_paths: list[str], requests: list[EvalRequest], baseline_libs: dict | None,
                  lt_known: dict | None) -> list[dict]:
    """Worker task: finals (measure_group), then make sure the CUDA context is still usable: an
    error the kernel left behind surfaces here. A usable context then hands the session's cached
    device memory back to the driver: the worker may serve the next session (a pool with
    max_tasks > 1, `session_ok`), and memory it kept cached is memory the screening worker, another
    process on the same GPU, cannot get."""
    outs = M.measure_group(so_paths, requests, baseline_libs=baseline_libs, lt_known=lt_known)
    if all(o.get("status") != "launch_error" for o in outs):
        try:
            import torch
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - sticky CUDA error after the kernel ran
            mark_poisoned(f"CUDA context unusable after measuring: {e}")
            culprit = 0 if len(outs) == 1 else None
            outs = [dict(o, status="launch_error" if culprit == i else "error",
                         detail=f"CUDA error after the kernels ran: {e}") for i, o in enumerate(outs)]
    return outs


def session_ok(out) -> bool:
    """Whether a finals worker may serve another session after this one (WorkerPool.run's
    keep_if): only when every candidate of the session came back ok. A kernel that was wrong
    (its guard bands or inputs changed, or its answer), too fast, refused by the call guard or
    broke the harness may have left state behind in the process (device memory, a library's
    statics): the next session gets a fresh worker, as every session did before a worker
    could be kept."""
    return (out.status == "ok" and isinstance(out.value, list) and bool(out.value)
            and all(isinstance(m, dict) and m.get("status") == "ok" for m in out.value))


def _screen_task(shape: tuple, candidates: list, arch: str, acc: str | None, operands: str,
                 reference_us: float | None) -> dict:
    return M.screen(tuple(shape), [(so, dict(o)) for so, o in candidates], arch=arch, acc=acc,
                    operands=operands, reference_us=reference_us)


def _warm_cuda() -> None:
    """Worker preload: import torch and create the CUDA context before any task's clock starts."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")


def gpu_pool(device: int | str | None = None, *, max_tasks: int = 1, spare: int = 1):
    """The worker pool for GPU work. max_tasks=1: every task runs in a fresh process (its static
    code cannot tamper with the next measurement); `spare` workers boot in the background so the
    next task does not wait for Python, torch and a CUDA context. Raise max_tasks for trusted
    kernels (our own templates, audited packs): in screening, and in finals, where a worker
    serves the next session only after one whose every candidate was ok (`session_ok`)."""
    return WorkerPool(1, device=device, max_tasks=max_tasks, spare=spare, env=_call_guard_env(),
                      preload=("torch", "cudal2.harness.measure", "cudal2.harness.pipeline:_warm_cuda"))


def _call_guard_env() -> dict | None:
    """The GPU workers' environment with the call guard preloaded (cudal2/harness/callguard.c);
    without a host C compiler the workers run without it and each measured row says so
    (audit.call_guard). CUDAL2_CALL_GUARD=0 turns it off."""
    import os
    import subprocess

    from cudal2.harness import callguard
    if os.environ.get("CUDAL2_CALL_GUARD", "1") == "0":
        return None
    try:
        return callguard.preload_env()
    except (callguard.CallGuardError, OSError, subprocess.SubprocessError) as exc:
        log.warning("cudal2: GPU workers run without the call guard: %s", exc)
        return None


# ---- build + audit ------------------------------------------------------------------------------

def _base(request: EvalRequest, sha: str, env: dict) -> Evaluation:
    return Evaluation(status=T.ERROR, source_sha=sha, shape=request.shape, arch=request.arch,
                      acc=request.acc or "", env={**env, "settings": settings(request)},
                      origin=request.origin, options=dict(request.options))


def audit_verdict(request: EvalRequest, sha: str, build_result, *, env: dict | None = None,
                  probe_pool=None) -> dict:
    """Build (if no BuildResult is given) and audit one source once: the verdict the `audits`
    caches of screen and evaluate_group hold by source sha (the audit does not depend on the
    shape or the options)."""
    probe = _base(replace(request, options=()), sha, env or {})
    ok = _build_and_audit(replace(request, options=()), probe, build_result=build_result,
                          check_shape=False,      # shape-free: the verdict is cached per source
                          probe_pool=probe_pool) is not None
    return {"ok": ok, "status": probe.status, "detail": probe.detail, "build": probe.build,
            "audit": probe.audit, "meta": probe.meta, "acc": probe.acc, "layout": probe.layout}


def _build_and_audit(request: EvalRequest, ev: Evaluation, *, build_result=None, probe_pool=None,
                     probe_timeout_s: float = 30, audits: dict | None = None, check_shape: bool = True):
    """Fill ev's build and audit parts. Returns the BuildResult when the kernel may run, else
    None with ev's status and detail set. `audits` (sha -> audit_verdict) answers a source
    audited before in this run (a campaign audits each build once)."""
    hit = (audits or {}).get(ev.source_sha)
    if hit is not None and build_result is not None:
        ev.build, ev.audit, ev.meta = hit["build"], hit["audit"], hit["meta"]
        ev.acc = request.acc or hit["meta"].get("acc", "") or ""
        ev.layout = hit["layout"]
        if not hit["ok"]:
            ev.status, ev.detail = hit["status"], hit["detail"]
            return None
        return _check_request(request, ev, build_result, check_shape)
    # before nvcc sees it: size, #include escapes, default-stream names; a quoted header that is
    # merely not found is left to the compile (a build error, as a misspelt header is), the
    # audit checks the rest
    pre = check_source(request.source, missing=False)
    if pre:
        ev.status, ev.detail = T.AUDIT_REJECTED, "; ".join(pre)[:1000]
        ev.audit = {"ok": False, "verdict": "rejected", "reasons": pre}
        return None
    br = build_result or build(BuildSpec(request.source, arch=request.arch,
                                         name=request.origin or "kernel"),
                               timeout=request.build_timeout_s)
    ev.build = br.summary()
    if not br.ok:
        ev.status, ev.detail = T.BUILD_ERROR, f"build {br.status}"
        return None
    audit = audit_build(request.source, br, request.arch, name=request.origin or ev.source_sha[:12],
                        pool=probe_pool, probe_timeout_s=probe_timeout_s)
    ev.audit = {"ok": audit.ok, "verdict": audit.verdict, "reasons": audit.reasons,
                "notes": audit.notes, "imports": audit.imports, "needed": audit.needed,
                "mma": audit.mma, "load": audit.load, "meta_verified": audit.meta_verified,
                "audit_version": audit.audit_version}
    ev.meta = audit.meta
    ev.acc = request.acc or audit.meta.get("acc", "") or ""
    ev.layout = audit.meta.get("layout", "") or ""
    if not audit.ok:
        ev.status = _LOAD_VERDICT.get(audit.verdict, T.AUDIT_REJECTED)
        ev.detail = "; ".join(audit.reasons)[:1000]
        return None
    return _check_request(request, ev, br, check_shape)


def _check_request(request: EvalRequest, ev: Evaluation, br, check_shape: bool = True):
    """What an audited kernel must still satisfy for this request: its options, its accumulator,
    the shape (a kernel whose meta, checked against its own guard by the audit, refuses the shape
    is `refused`: caught here, on any machine, before anything runs)."""
    if request.options:
        try:
            option_values(ev.meta, dict(request.options))
        except AbiError as exc:
            ev.status, ev.detail = T.AUDIT_REJECTED, f"options: {exc}"
            return None
    if request.acc == "f32" and ev.meta.get("acc") == "f16":
        ev.status, ev.detail = T.WRONG, "kernel declares an f16 accumulator; the request needs f32"
        return None
    M, N, K = request.shape.M, request.shape.N, request.shape.K
    if check_shape and ev.meta and not meta_accepts(ev.meta, M, N, K):
        ev.status, ev.detail = T.REFUSED, f"the kernel does not serve {M}x{N}x{K} (its meta)"
        return None
    return br


def _not_run(request: EvalRequest, ev: Evaluation, br, probe_pool, timeout_s: float) -> None:
    """No GPU: built and audited, not run; or `refused` when the kernel's own guard, called at the
    requested shape in a worker that sees no device, refuses it (what its launch would return)."""
    s = request.shape
    if ("tile" in ((ev.audit or {}).get("meta_verified") or ()) and br.so_path
            and guard_refuses(br.so_path, (s.M, s.N, s.K), pool=probe_pool, timeout_s=timeout_s)):
        ev.status = T.REFUSED
        ev.detail = f"the kernel's own guard refuses {s.M}x{s.N}x{s.K} (cudaErrorInvalidValue)"
    else:
        ev.status, ev.detail = T.NOT_MEASURED, "no GPU: built and audited, not run"


def _apply(ev: Evaluation, m: dict, gpu_model: str | None) -> Evaluation:
    """Fill an Evaluation from measure's result dict."""
    ev.status = _MEASURE_STATUS.get(m.get("status"), T.ERROR)
    ev.detail = str(m.get("detail") or "")
    if m.get("status") == "launch_error" and _GUARD_REFUSAL.match(ev.detail):
        ev.status = T.REFUSED       # its own guard said no (cudaErrorInvalidValue), nothing ran
    ev.correctness = m.get("correctness") or ev.correctness or {}
    if m.get("call_guard"):                 # the dynamic layer of the audit: what it saw
        ev.audit = {**(ev.audit or {}), "call_guard": m["call_guard"]}
    ev.timings = m.get("timings") or {}
    ev.speedups = m.get("speedups") or {}
    ev.stats = m.get("stats") or {}
    ev.env = {**ev.env, **(m.get("env") or {})}
    ev.env["gpu"] = gpu_model or ev.env.get("gpu")    # the name the cache is keyed by
    if m.get("bounds"):
        ev.correctness = {**ev.correctness, "bounds": m["bounds"]}
    if m.get("gate"):
        ev.env["gate"] = m["gate"]
    if m.get("baseline_notes"):
        ev.env["baseline_notes"] = m["baseline_notes"]
    ev.acc = m.get("acc") or ev.acc
    ev.layout = m.get("layout") or ev.layout
    return ev


def _outcome_verdict(ev: Evaluation, out) -> Evaluation:
    """A worker that did not return: crash/timeout/oom are the kernel's; a plain exception is
    ours unless it poisoned CUDA."""
    if out.status == "error":
        ev.status = T.CRASHED if out.poisoned else T.ERROR
    else:
        ev.status = {"crashed": T.CRASHED, "timeout": T.TIMEOUT, "oom": T.OOM}[out.status]
    ev.detail = out.detail[:1000]
    return ev


def _lt_known(db) -> dict:
    return db.baseline_choices() if db is not None else {}


def _record_lt(db, outs: Iterable[dict], known: dict | None = None) -> None:
    """Store the cuBLASLt autotune choices a worker made (one writer: this process)."""
    seen = set()
    for o in outs:
        for e in o.get("lt_autotune") or ():
            key = e.get("key")
            if key and key not in seen:
                seen.add(key)
                entry = {k: v for k, v in e.items() if k not in ("key", "source")}
                if known is not None:
                    known[key] = entry
                if db is not None:
                    db.add_baseline_choice(key, entry)


# ---- the deadline ---------------------------------------------------------------------------------
# A run's budget is a deadline (a time.monotonic() value), checked before each unit of work
# (a screening task, a finals session); a unit's time limit is cut to what is left.
MIN_SLICE_S = 1.0               # with less than this left before a deadline, no unit starts
BUDGET = "budget:"              # the detail of every row the deadline cut (budget_cut)
NOT_REACHED = "budget: not reached before the deadline"


def budget_cut(row: Evaluation | None) -> bool:
    """Whether `row` is a unit the deadline cut (not reached, or stopped at the deadline): a
    not_measured row never stored, which says nothing about the kernel."""
    return row is not None and row.status == T.NOT_MEASURED and row.detail.startswith(BUDGET)


def _cut(ev: Evaluation, detail: str = NOT_REACHED) -> Evaluation:
    ev.status, ev.detail = T.NOT_MEASURED, detail
    return ev


def _left(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()


# ---- finals ---------------------------------------------------------------------------------------

def evaluate(request: EvalRequest, *, db=None, pool=None, build_result=None,
             probe_pool=None, baseline_libs: dict | None = None, gpu: bool | None = None,
             probe_timeout_s: float = 30,
             estimator: Callable[[Evaluation], object] | None = None,
             lt_known: dict | None = None, deadline: float | None = None) -> Evaluation:
    """Build, audit and (with a GPU) run the finals of one request; record and return the row.

    db: a ResultsDB (cache + store) or None. pool: the GPU WorkerPool (default: a fresh
    gpu_pool() for this call). build_result: a BuildResult already made for this source/arch.
    probe_pool: the CPU pool that reads meta. baseline_libs: built baseline libraries (default:
    built here, cached). gpu: force GPU use on/off (default: whether torch sees one). estimator:
    prices a not_measured row before it is recorded (RL without a GPU). deadline: as for
    evaluate_group."""
    return evaluate_group([request], db=db, pool=pool,
                          build_results=[build_result] if build_result is not None else None,
                          probe_pool=probe_pool, baseline_libs=baseline_libs, gpu=gpu,
                          probe_timeout_s=probe_timeout_s,
                          estimator=estimator, lt_known=lt_known, deadline=deadline)[0]


def evaluate_group(requests: list[EvalRequest], *, db=None, pool=None, build_results=None,
                   probe_pool=None, baseline_libs: dict | None = None, gpu: bool | None = None,
                   probe_timeout_s: float = 30,
                   estimator: Callable[[Evaluation], object] | None = None,
                   lt_known: dict | None = None, audits: dict | None = None,
                   deadline: float | None = None) -> list[Evaluation]:
    """Finals for requests of ONE shape sharing one worker (our own trusted kernels; a policy's
    kernels go one per evaluate()): every candidate's correctness suite, then one interleaved
    kernel-time session with all of them and every baseline. Rows in input order. The worker is
    fresh, or (a pool with max_tasks > 1, the campaign's) one whose every earlier session came
    back ok (`session_ok`): it then pays no boot and no exit per session.

    deadline (a time.monotonic() value): the session's limit (the sum of the requests'
    timeout_s) is cut to what is left; a session stopped by the deadline, or not started for
    want of MIN_SLICE_S, gives not_measured rows with a 'budget:' detail (`budget_cut`), not
    stored: no verdict on the kernels."""
    requests = list(requests)
    if not requests:
        return []
    use_gpu = provenance.gpu_visible() if gpu is None else gpu
    gpu_model = provenance.gpu_name() if use_gpu else None
    env = provenance.collect(gpu=use_gpu)
    out: list[Evaluation | None] = [None] * len(requests)
    runnable = []                      # (index, ev, build result)
    for i, r in enumerate(requests):
        sha = source_sha(r.source)
        hit = cached(db, r, gpu_model, sha=sha)
        if hit is not None:
            log.info("cached: %s %s -> %s", sha[:12], r.shape, hit.status)
            out[i] = hit
            continue
        ev = _base(r, sha, env)
        br = _build_and_audit(r, ev, build_result=(build_results or [None] * len(requests))[i],
                              probe_pool=probe_pool, probe_timeout_s=probe_timeout_s,
                              audits=audits)
        if br is None:
            out[i] = record(db, ev, r.source, estimator=estimator)
        elif not use_gpu:
            _not_run(r, ev, br, probe_pool, probe_timeout_s)
            out[i] = record(db, ev, r.source, estimator=estimator)
        else:
            runnable.append((i, ev, br))
    if not runnable:
        return out  # type: ignore[return-value]
    shapes = {(requests[i].shape, ev.layout) for i, ev, _ in runnable}
    if len(shapes) > 1:
        raise ValueError(f"evaluate_group: one shape and B layout per group, got {sorted(map(str, shapes))}")
    if baseline_libs is None and requests[0].baselines:
        try:
            baseline_libs = build_baselines(requests[0].arch)
        except BaselineError as e:      # measure still runs the torch baseline and says why
            log.warning("%s", e)
    known = lt_known if lt_known is not None else _lt_known(db)
    full = sum(requests[i].timeout_s for i, _, _ in runnable)
    left = _left(deadline)
    if left < MIN_SLICE_S:
        for i, ev, _ in runnable:
            out[i] = _cut(ev)
        return out  # type: ignore[return-value]
    timeout = min(full, left)
    own = pool is None
    pool = pool or gpu_pool(spare=0)
    mem = max((requests[i].mem_limit_bytes or 0) for i, _, _ in runnable) or None
    try:
        res = pool.run(_measure_task, [str(br.so_path) for _, _, br in runnable],
                       [requests[i] for i, _, _ in runnable], baseline_libs, known,
                       timeout_s=timeout, mem_limit_bytes=mem, keep_if=session_ok)
    finally:
        if own:
            pool.close()
    if res.status == "ok":
        _record_lt(db, res.value or [], known)
        for (i, ev, _), m in zip(runnable, res.value or []):
            out[i] = record(db, _apply(ev, m, gpu_model), requests[i].source)
    elif res.status == "timeout" and timeout < full:
        # the deadline stopped the session, not the requests' own limits: no verdict
        for i, ev, _ in runnable:
            out[i] = _cut(ev, f"budget: stopped at the deadline ({timeout:.1f} s of {full:.0f} s)")
    elif len(runnable) > 1 and res.status in ("crashed", "timeout", "oom"):
        # one of them took the worker down: measure each alone, so the verdict lands on it
        for i, ev, br in runnable:
            out[i] = evaluate(requests[i], db=db, pool=None if own else pool, build_result=br,
                              probe_pool=probe_pool, baseline_libs=baseline_libs, gpu=use_gpu,
                              lt_known=known, deadline=deadline)
    else:
        for i, ev, _ in runnable:
            out[i] = record(db, _outcome_verdict(ev, res), requests[i].source)
    return out  # type: ignore[return-value]


def evaluate_many(requests: Iterable[EvalRequest], *, db=None, pool=None, executor=None,
                  jobs: int | None = None, gpu: bool | None = None,
                  progress: Callable[[int, int, Evaluation], None] | None = None,
                  estimator: Callable[[Evaluation], object] | None = None) -> list[Evaluation]:
    """evaluate() over many requests: cached ones come from the DB, the rest are built in
    parallel (cudal2.core.build.build_many, or `executor.map` when an Executor is given, e.g. a Ray
    pool), then measured one at a time, each in a fresh worker. Results in input order."""
    requests = list(requests)
    use_gpu = provenance.gpu_visible() if gpu is None else gpu
    gpu_model = provenance.gpu_name() if use_gpu else None
    results: list[Evaluation | None] = [None] * len(requests)
    todo = []
    for i, r in enumerate(requests):
        hit = cached(db, r, gpu_model)
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
        for arch in {requests[i].arch for i in todo if requests[i].baselines}:
            try:
                libs[arch] = build_baselines(arch)
            except BaselineError as e:     # measure says per baseline why it is missing
                log.warning("%s", e)
    own = pool is None and use_gpu
    if own:
        pool = gpu_pool()
    known = _lt_known(db)
    try:
        done = sum(r is not None for r in results)
        for i, br in zip(todo, builds):
            req = requests[i]
            # a source that repeats in this batch may have been stored a moment ago
            results[i] = (cached(db, req, gpu_model)
                          or evaluate(req, db=db, pool=pool, build_result=br, gpu=use_gpu,
                                      baseline_libs=libs.get(req.arch), estimator=estimator,
                                      lt_known=known))
            done += 1
            if progress is not None:
                progress(done, len(requests), results[i])
    finally:
        if own:
            pool.close()
    return results  # type: ignore[return-value]


# ---- screening ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScreenCandidate:
    """One (kernel, runtime options) to screen: its source, its BuildResult (packed or built),
    the options, and who made it."""
    source: str
    build: object
    options: tuple[tuple[str, int], ...] = ()   # a dict is accepted
    origin: str = "screen"

    def __post_init__(self):
        # one spelling for every use below: the request, the meta check and the worker's args
        object.__setattr__(self, "options", normalise_options(self.options))


# Screening's time slices (docs/measurement.md, "Faults cost one candidate"). A task of n
# candidates in a warm worker may take SCREEN_TASK_S + n * SCREEN_CANDIDATE_S; a task that may
# land on a fresh worker (the first of a shape, the first after a fault) SCREEN_SETUP_S more, for
# the worker's set-up of the shape (operand sets, smoke references, torch's time). The H200
# campaign screened ~2400 candidates per GPU-minute (~25 ms each): the slices bound a hang.
SCREEN_CHUNK = 8                # trusted candidates per task in one warm worker
SCREEN_CANDIDATE_S = 5.0        # one candidate: load, smoke check, 3-8 kernel-time rounds
SCREEN_TASK_S = 5.0             # a task's fixed part: dispatch, the reply
SCREEN_SETUP_S = 20.0           # a fresh worker's set-up for the shape


def screen_slice(n: int, *, cold: bool, candidate_s: float | None = None) -> float:
    """The time limit of one screening task of `n` candidates (cold: it may set up a worker;
    candidate_s: one candidate's slice, default SCREEN_CANDIDATE_S)."""
    per = SCREEN_CANDIDATE_S if candidate_s is None else candidate_s
    return (SCREEN_SETUP_S if cold else 0.0) + SCREEN_TASK_S + n * per


def screen(shape: T.Shape, candidates: list[ScreenCandidate], *, arch: str = "sm_90a",
           acc: str | None = "f32", db=None, pool=None, gpu: bool | None = None,
           operands: str = "cold", reference_us: float | None = None, trusted: bool = True,
           probe_pool=None, audits: dict | None = None, timeout_s: float | None = None,
           deadline: float | None = None) -> tuple[list[Evaluation], dict]:
    """Screen candidates of one shape: audit each distinct build once (`audits` caches verdicts
    by source sha across calls), then smoke check and time every (build, options) in a warm
    worker, SCREEN_CHUNK per task (trusted=True: our templates), or one fresh worker each
    (trusted=False: policy code). Returns (one stage='screen' row per candidate, in order; the
    worker's reference dict).

    Faults cost one candidate: a CUDA fault (the worker is poisoned) is the verdict of the
    candidate that raised it, and the chunk's candidates it did not reach go on in a fresh
    worker; a crash, a hang (the chunk's slice, `screen_slice`) or an OOM sends the chunk's
    candidates one by one, each with its own slice. timeout_s: one candidate's slice (default
    SCREEN_CANDIDATE_S). deadline (a time.monotonic() value): checked before every task, each
    task's limit cut to what is left; a candidate not reached, or stopped by the deadline, is
    not_measured with a 'budget:' detail (`budget_cut`) and is not stored."""
    use_gpu = provenance.gpu_visible() if gpu is None else gpu
    gpu_model = provenance.gpu_name() if use_gpu else None
    env = provenance.collect(gpu=use_gpu)
    audits = {} if audits is None else audits
    cand_s = None if timeout_s is None else float(timeout_s)
    rows: list[Evaluation | None] = [None] * len(candidates)
    todo: list[tuple[int, Evaluation]] = []
    for i, c in enumerate(candidates):
        sha = source_sha(c.source)
        req = EvalRequest(c.source, shape, arch=arch, acc=acc, origin=c.origin, options=c.options,
                          operands=operands)
        ev = _base(req, sha, env)
        ev.stage = "screen"
        ev.env["settings"] = {"timer": req.timer, "operands": operands, "stage": "screen"}
        verdict = audits.get(sha)
        if verdict is None:
            verdict = audits[sha] = audit_verdict(req, sha, c.build, env=env,
                                                  probe_pool=probe_pool)
        ev.build, ev.audit, ev.meta = verdict["build"], verdict["audit"], verdict["meta"]
        ev.acc, ev.layout = verdict["acc"] or ev.acc, verdict["layout"]
        if not verdict["ok"]:
            ev.status, ev.detail = verdict["status"], verdict["detail"]
            rows[i] = record(db, ev, c.source)
            continue
        if c.options:
            try:
                option_values(ev.meta, dict(c.options))
            except AbiError as exc:
                ev.status, ev.detail = T.AUDIT_REJECTED, f"options: {exc}"
                rows[i] = record(db, ev, c.source)
                continue
        if not use_gpu:
            ev.status, ev.detail = T.NOT_MEASURED, "no GPU: built and audited, not screened"
            rows[i] = record(db, ev, c.source)
            continue
        todo.append((i, ev))
    reference: dict = {}
    if not todo:
        return rows, reference  # type: ignore[return-value]

    def done(i: int, ev: Evaluation) -> None:
        rows[i] = ev if budget_cut(ev) else record(db, ev, candidates[i].source)

    own = pool is None
    pool = pool or gpu_pool(max_tasks=1000 if trusted else 1, spare=0)
    queue = collections.deque(todo)        # not screened yet, in order
    alone: collections.deque = collections.deque()   # a failed chunk's candidates, one per task
    cold = True                            # the next task may set up a fresh worker
    best = reference_us                    # the early-stop bar: the best time so far
    missed: dict[int, int] = {}            # times a candidate's task ended before reaching it
    try:
        while queue or alone:
            if alone:
                batch = [alone.popleft()]
            else:
                n = SCREEN_CHUNK if trusted else 1
                batch = [queue.popleft() for _ in range(min(n, len(queue)))]
            full = screen_slice(len(batch), cold=cold or not trusted, candidate_s=cand_s)
            left = _left(deadline)
            if left < MIN_SLICE_S:
                for i, ev in [*batch, *alone, *queue]:
                    done(i, _cut(ev))
                break
            limit = min(full, left)
            args = [(str(candidates[i].build.so_path), list(candidates[i].options)) for i, _ in batch]
            res = pool.run(_screen_task, (shape.M, shape.N, shape.K), args, arch, acc, operands,
                           best, timeout_s=limit)
            poisoned = getattr(res, "poisoned", False)
            cold = res.status != "ok" or poisoned
            if res.status == "ok":
                reference = res.value.get("reference") or reference
                got = list(res.value.get("candidates") or [])
                upto = len(got)
                if poisoned:
                    # the candidate that broke the context is the last one screened (its
                    # launch_error); the ones after it were not reached
                    upto = 1 + max((k for k, m in enumerate(got) if m.get("poisoned")
                                    or m.get("status") == "launch_error"), default=len(got) - 1)
                for (i, ev), m in zip(batch[:upto], got):
                    m = dict(m)
                    m.pop("poisoned", None)
                    m["env"] = res.value.get("env")
                    done(i, _apply(ev, m, gpu_model))
                for t in (reference.get("torch_us"), *(screen_us(rows[i]) for i, _ in batch[:upto])):
                    best = min(x for x in (best, t) if x) if t else best
                again = []
                for i, ev in batch[upto:]:       # not reached: on in a fresh worker (3 tries)
                    missed[i] = missed.get(i, 0) + 1
                    if missed[i] < 3:
                        again.append((i, ev))
                    else:
                        ev.status, ev.detail = T.ERROR, "not screened: no result in 3 tasks"
                        done(i, ev)
                queue.extendleft(reversed(again))
            elif res.status == "timeout" and limit < full:
                # the deadline stopped it, not its own slice: no verdict on these kernels
                for i, ev in batch:
                    done(i, _cut(ev, f"budget: stopped at the deadline ({limit:.1f} s of a "
                                     f"{full:.0f} s slice)"))
            elif len(batch) > 1:
                # crashed, hung or over memory: one by one, so the verdict lands on the culprit
                alone.extendleft(reversed(batch))
            else:
                i, ev = batch[0]
                done(i, _outcome_verdict(ev, res))
    finally:
        if own:
            pool.close()
    return rows, reference  # type: ignore[return-value]


def screen_us(row: Evaluation | None) -> float | None:
    """The time a screening row ranks its candidate by (None: not timed)."""
    if row is None or row.status != T.OK:
        return None
    t = ((row.timings or {}).get("screen") or {}).get("candidate") or {}
    us = t.get("median_us")
    return float(us) if us and us > 0 else None
