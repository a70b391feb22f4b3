"""Check and time one built candidate on one shape, on the GPU. Runs INSIDE a worker process
(cudal2.harness.worker); the caller (evaluate) turns the returned dict into an Evaluation.

    measure(so_path, request, baseline_libs=...) -> {
        "status": "ok" | "wrong" | "too_fast" | "launch_error",
        "detail": one line, "acc", "layout", "meta",
        "correctness": check.CheckReport.to_dict(),
        "timings": {mode: {who: {median_us, p10_us, p90_us, n, mean_us, min_us}}},
        "speedups": {mode: {baseline: baseline_median / candidate_median}},
        "bounds": {lower_bound_us, peak, fraction_of_peak per mode},
        "baseline_notes": {baseline: why it is missing / which algorithm},
        "env": {gpu, driver, sm_clock_mhz, temp_c, *_before, torch, cuda}}

Order: correctness first (a wrong kernel is never timed), then the baselines are set up outside
any timed region (handles, workspace, heuristic query, autotuning, TunableOp tuning), each is run
once and verified, then every mode is timed by the one harness (timing.time_interleaved) with
the candidate and baselines interleaved, fresh random inputs rotating through buffer sets and the
last output of every set verified against the reference.
"""
from __future__ import annotations

from . import bounds, check
from .timing import TimingConfig, gpu_env, time_interleaved

DEFAULT_SERVER_QPS = 100.0      # mean idle gap 10 ms between calls
N_BUFFERS = 3                   # input sets rotated through while timing


def _fail(status: str, detail: str, **extra) -> dict:
    out = {"status": status, "detail": detail, "timings": {}, "speedups": {}}
    out.update(extra)
    return out


def timing_config(request, mode: str) -> TimingConfig:
    """The timing settings for one mode of an EvalRequest."""
    return TimingConfig(mode=mode, timer=request.timer, flush_l2=request.flush_l2,
                        target_qps=float(request.target_qps or DEFAULT_SERVER_QPS))


def _cuda_error(exc: BaseException) -> bool:
    """An exception from the CUDA runtime (illegal address, misaligned access, launch failure):
    after one of these the context is sticky-broken and the worker must not be reused. Out of
    memory is not one (torch raises it for its own allocations; the context survives)."""
    import torch
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return False
    accel = getattr(torch, "AcceleratorError", None)      # torch >= 2.8
    return (accel is not None and isinstance(exc, accel)) or \
        (isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


def _poisoned(detail: str, **base) -> dict:
    """The kernel broke the CUDA context: tell the worker to exit after replying (a fresh one
    takes the next evaluation) and return the verdict."""
    from .worker import mark_poisoned
    mark_poisoned(detail)
    return _fail("launch_error", detail, **base)


def measure(so_path: str, request, *, baseline_libs: dict[str, str] | None = None) -> dict:
    base: dict = {}
    try:
        return _measure(so_path, request, baseline_libs, base)
    except Exception as exc:  # noqa: BLE001 - only CUDA errors are verdicts; the rest re-raise
        if not _cuda_error(exc):
            raise
        return _poisoned(f"CUDA error while measuring: {type(exc).__name__}: {exc}"[:1000],
                         **base)


def _measure(so_path: str, request, baseline_libs, base: dict) -> dict:
    import torch

    from ..abi import load_library

    if not torch.cuda.is_available():
        return _fail("not_measured", "not measured: no GPU")
    shape = request.shape
    M, N, K = shape.M, shape.N, shape.K
    lib = load_library(so_path)
    meta = lib.meta
    declared = meta["acc"]
    acc = request.acc or declared
    layout = meta["layout"]
    base.update(acc=acc, layout=layout, meta=meta)
    if acc == "f32" and declared == "f16":
        return _fail("wrong", "kernel declares an f16 accumulator; the request needs f32", **base)
    ws_bytes = int(meta.get("workspace_bytes") or 0)
    tile = tuple(meta["tile"])[:3] if meta.get("tile") else None
    env_before = gpu_env()

    # 1. correctness on fresh, guarded buffers
    report = check.check_kernel(check.so_launcher(lib), M, N, K, acc=acc, layout=layout,
                                ws_bytes=ws_bytes, any_shape=bool(meta.get("any_shape")),
                                tile=tile, seeds=request.seeds, device="cuda")
    base["correctness"] = report.to_dict()
    if report.launch_error is not None:
        return _poisoned(f"kernel returned cudaError {report.launch_error}", **base)
    if not report.ok:
        return _fail("wrong", report.first_failure, **base)

    # 2. baselines, set up outside any timed region (handles, workspace, heuristic, tuning)
    wanted = list(request.baselines) + list(request.extra_baselines)
    notes: dict[str, str] = {}
    runners = None
    if wanted:
        from .baselines import BaselineError, BaselineRunners, build_baselines

        try:
            libs = baseline_libs or build_baselines(request.arch)
        except BaselineError as exc:       # torch baselines still run; the rest say why
            notes["cublas libraries"] = str(exc)
            libs = {}
        try:
            runners = BaselineRunners(libs, M, N, K, acc, layout)
        except BaselineError as exc:       # e.g. cublasCreate failed: torch baselines only
            notes["cublas libraries"] = str(exc)
            runners = BaselineRunners({}, M, N, K, acc, layout)

    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def candidate(a, b_rr, b_rc, c) -> int:
        b_store = b_rr if layout == "RR" else b_rc
        return lib.launch(a.data_ptr(), b_store.data_ptr(), c.data_ptr(), M, N, K, K,
                          N if layout == "RR" else K, N, ws.data_ptr() if ws_bytes else 0,
                          ws_bytes, torch.cuda.current_stream().cuda_stream)

    def setup(name: str, sets, verify):
        if name == "cublaslt_autotuned":
            runners.autotune(sets, env_before.get("gpu") or torch.cuda.get_device_name(),
                             verify=verify)
        if name == "torch_tunableop":
            a, b_rr, _ = sets[0]
            runners.setup_tunableop(a, b_rr, torch.empty(M, N, dtype=torch.float16,
                                                         device="cuda"))
        return runners.launcher(name)

    try:
        out = time_all(candidate, {name: setup for name in wanted}, request, acc=acc,
                       device="cuda", peak=bounds.device_peak(), notes=notes)
    finally:
        if runners is not None:
            notes.update({k: v for k, v in runners.notes.items() if k not in notes})
            runners.close()
    env = dict(gpu_env())
    env.update({f"{k}_before": v for k, v in env_before.items()
                if k in ("sm_clock_mhz", "temp_c", "power_w")})
    env.update(torch=torch.__version__, cuda=torch.version.cuda,
               device_name=torch.cuda.get_device_name())
    env.setdefault("gpu", env["device_name"])
    return dict(base, **out, env=env)


def time_all(candidate, baselines: dict, request, *, acc: str, device, peak, notes: dict,
             backend=None) -> dict:
    """Time the candidate against the baselines in every requested mode (device-agnostic: the
    GPU path passes CUDA tensors and the CUDA backend, tests pass CPU tensors and a fake clock).

    candidate(a, b_rr, b_rc, c) -> status enqueues one call writing c. baselines[name] is
    setup(name, sets, verify) -> the same kind of callable (setup runs outside timing and may
    raise to say the baseline is unavailable). Returns the status / timings / speedups /
    bounds / baseline_notes part of measure's result."""
    import torch

    M, N, K = request.shape.M, request.shape.N, request.shape.K
    # N_BUFFERS sets of random normal A, B (both B layouts) and their fp32 references
    gen = torch.Generator(device=device).manual_seed(12345)
    sets, refs = [], []
    for _ in range(N_BUFFERS):
        a, b = check.random_inputs(M, N, K, gen, device)
        sets.append((a, b, b.t().contiguous()))
        refs.append(check.reference(a, b))
    rms = [(check._rms(a), check._rms(b)) for a, b, _ in sets]

    def verify_tensor(c, i: int):
        cmp = check.compare(c, refs[i], K=K, acc=acc, rms_a=rms[i][0], rms_b=rms[i][1])
        return None if cmp.ok else cmp.detail

    outs = {"candidate": torch.empty(M, N, dtype=torch.float16, device=device)}

    def wrap(name, fn):
        def call(i: int) -> None:
            st = fn(*sets[i], outs[name])
            if st:
                if name == "candidate":
                    raise check.LaunchError(st, "timed call")
                raise RuntimeError(f"baseline {name} returned status {st} while timed")
        return call

    callables = {"candidate": wrap("candidate", candidate)}
    for name, setup in baselines.items():
        try:
            fn = setup(name, sets, verify_tensor)
        except RuntimeError as exc:         # BaselineError, torch errors: unavailable, say why
            notes[name] = f"unavailable: {exc}"
            continue
        c = torch.full((M, N), float("nan"), dtype=torch.float16, device=device)
        try:
            st = fn(*sets[0], c)
        except RuntimeError as exc:
            st = f"{exc}"
        why = f"returned status {st}" if st else verify_tensor(c, 0)
        if why:
            notes[name] = f"dropped: {why}"
            continue
        outs[name] = c
        callables[name] = wrap(name, fn)

    def prepare_set(i: int) -> None:       # NaN in every output: the last call must write it
        for c in outs.values():
            c.view(torch.int16).fill_(0x7E00)

    def verify(who: str, i: int):
        return verify_tensor(outs[who], i)

    lower = bounds.lower_bound_us(M, N, K, peak)
    timings, speedups, failures, fractions = {}, {}, [], {}
    result = {"baseline_notes": notes, "timings": timings, "speedups": speedups,
              "bounds": {"lower_bound_us": lower, "peak": peak.name, "peak_source": peak.source,
                         "fraction_of_peak": fractions}}
    try:
        for mode in request.modes:
            res = time_interleaved(callables, timing_config(request, mode), n_buffers=N_BUFFERS,
                                   verify=verify, prepare_set=prepare_set, backend=backend)
            timings[mode] = {who: s.to_dict() for who, s in res.stats.items()}
            cand = res.stats["candidate"].median_us
            speedups[mode] = {who: s.median_us / cand for who, s in res.stats.items()
                              if who != "candidate"}
            fractions[mode] = bounds.fraction_of_peak(cand, M, N, K, peak)
            failures += [f"{mode}: {f}" for f in res.failures]
    except check.LaunchError as exc:
        return dict(result, status="launch_error", detail=str(exc))
    cand_bad = [f for f in failures if "candidate@" in f]
    if cand_bad:
        return dict(result, status="wrong", detail="timed output wrong: " + cand_bad[0])
    if failures:
        notes["timed_outputs"] = "; ".join(failures[:3])
    fast = [m for m in timings if bounds.is_too_fast(timings[m]["candidate"]["median_us"],
                                                    M, N, K, peak)]
    if fast:
        t = timings[fast[0]]["candidate"]["median_us"]
        return dict(result, status="too_fast",
                    detail=f"{fast[0]} median {t:.3g} us is below the physical lower bound "
                           f"{lower:.3g} us on {peak.name} ({bounds.DEFAULT_MARGIN:.0%} margin)")
    return dict(result, status="ok", detail="")
