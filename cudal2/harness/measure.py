"""Check and time built candidates of one shape on the GPU. Runs INSIDE a worker process
(cudal2.harness.worker); the caller (cudal2.harness.pipeline) turns each returned dict into an
Evaluation. Two stages, one harness (docs/measurement.md):

screen(shape, candidates)   many pre-built (library, options) candidates of one shape in one warm
    worker: a smoke check (one random and one 0/1 input against cached references), then a few
    kernel-time samples each, stopping early once a candidate is clearly slower than the best so
    far. Ranks candidates; never a reported or exported number.

measure_group(so_paths, requests)   finals, in a fresh worker: every candidate's full correctness
    suite; then ONE interleaved kernel-time session of all the candidates and every baseline (set
    up and autotuned once for the shape), with the stopping rule; then the end-to-end call of
    each candidate against torch.matmul, server mode (single calls after fixed idle gaps) and,
    when asked, CUDA-L2's wall-clock timer. One result dict per candidate:

    {"status": "ok" | "wrong" | "too_fast" | "launch_error" | "not_measured" | "error",
     "detail", "acc", "layout", "meta", "options",
     "correctness": check.CheckReport.to_dict(),
     "timings": {mode_key: {who: {median_us, lo_us, hi_us, p10_us, p90_us, n, ...}}},
     "speedups": {mode_key: {baseline: median of per-round baseline/candidate ratios}},
     "stats": {mode_key: {"speedup": {baseline: {median, lo, hi, n}}, "session": {...}}},
     "bounds", "baseline_notes", "lt_autotune": [new autotune entries], "env"}

env["phases_s"] says where a group's worker time went (seconds, the whole group), by PHASES
(docs/measurement.md, "Where finals time goes"): the phases do not overlap, each ends with a
device synchronisation so queued GPU work is charged to the phase that queued it, and with
"other" (what no phase claims inside measure_group) they sum to env["measure_s"], the group's
wall time in measure_group; the campaign sums them per stage so a GPU session shows what limits
finals per minute.

mode keys: "offline" (kernel time), "server_<gap>ms", "e2e_<kind>" (who: candidate = cudal2.matmul,
torch = torch.matmul), "wall" (CUDA-L2's host clock, labelled).
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from contextlib import contextmanager

from cudal2.core.abi import load_library
from cudal2.core.vocab import AUDIT_VERSION, WIN_MARGIN
from cudal2.harness import bounds, check, fakedevice
from cudal2.harness.baselines import BaselineError, BaselineRunners, build_baselines
from cudal2.harness.callguard import Guard
from cudal2.harness.e2e import KINDS, E2EConfig, HostBackend, measure_e2e
from cudal2.harness.timing import TimingConfig, gpu_env, run_schedule
from cudal2.harness.worker import mark_poisoned
from cudal2.timing import kerneltime as KT

DEVICE = "cuda"                 # where finals run (CPU tests of the finals path set "cpu")
N_SCREEN_SETS_MAX = 64          # screening rotates fewer sets (still > 3x L2 for large shapes)
DERIVED_CUBLAS_BEST = "cublas_best"   # per round, the faster of cuBLAS NN and TN (CUDA-L2's "max")
# env["phases_s"]'s keys, named once (docs/measurement.md lists what each holds)
PHASES = ("provenance",   # GPU clock/temperature/driver reads before and after
          "load",         # loading each candidate's library, its workspace size and allocation
          "init",         # torch's cuBLAS handle (the first GEMM's one-time cost), once per group
          "reference",    # the main shape's correctness inputs and fp32 references, once per group
          "correctness",  # each candidate's correctness suite (on the shared references)
          "operands",     # the timing operand sets (kerneltime.cold_plan)
          "baselines",    # baseline libraries (build-cache lookup, load), handles, cuBLASLt's
          #                 heuristic query, each baseline's checked first call
          "autotune",     # cuBLASLt autotuned: the choice (a known key: only the look-up)
          "calibrate",    # the kernel timer's set-up (NVML handle) and calibration probe
          "offline", "server", "e2e", "wall",   # the timed sessions
          "other")        # measure_group's wall time that no phase above claims


class PhaseTimes(dict):
    """Seconds per phase of one finals group. Phases nest without overlapping: a phase entered
    inside another is counted in its own and taken out of the outer one."""

    def __init__(self):
        super().__init__()
        self.stack: list[list[float]] = []      # per open phase: seconds of its inner phases


@contextmanager
def _phase(phases: dict | None, name: str, sync=None):
    """Adds the block's host wall time (seconds) to phases[name]; `sync` (e.g. a device
    synchronise) runs at its end, so GPU work the block queued is charged to it. In a PhaseTimes
    the time of phases nested inside is not counted twice."""
    t0 = time.perf_counter()
    stack = getattr(phases, "stack", None)
    inner = [0.0]
    if stack is not None:
        stack.append(inner)
    try:
        yield
        if sync is not None:
            sync()
    finally:
        dt = time.perf_counter() - t0
        if stack is not None:
            stack.pop()
            if stack:
                stack[-1][0] += dt
        if phases is not None:
            phases[name] = round(phases.get(name, 0.0) + dt - inner[0], 4)


def _device_sync(device):
    """A synchronise for a CUDA device (charges queued work to a phase), else None."""
    if str(device).startswith("cuda"):
        import torch
        return torch.cuda.synchronize
    return None


def _fail(status: str, detail: str, **extra) -> dict:
    out = {"status": status, "detail": detail, "timings": {}, "speedups": {}, "stats": {}}
    out.update(extra)
    return out


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
    mark_poisoned(detail)
    return _fail("launch_error", detail, **base)


# ---- operands ------------------------------------------------------------------------------------

class OperandPool:
    """n_sets operand sets of random normal fp16 data for timing: A (M x K), B row-major (K x N)
    and the same B column-major (stored N x K), and fp32 references computed on demand (a few
    kept). Cold operands (kerneltime.cold_plan): rotated sets whose total exceeds 3x L2, or N + 1
    sets and an L2 flush before each sample (`cold`, which the autotune's sessions follow too)."""

    def __init__(self, M: int, N: int, K: int, n_sets: int, device, *, seed: int = 12345,
                 cold: str = "rotate"):
        import torch

        self.M, self.N, self.K, self.n_sets, self.cold = M, N, K, n_sets, cold
        gen = torch.Generator(device=device).manual_seed(seed)
        self.A = torch.empty(n_sets, M, K, dtype=torch.float16, device=device)
        self.B = torch.empty(n_sets, K, N, dtype=torch.float16, device=device)
        self.Bt = torch.empty(n_sets, N, K, dtype=torch.float16, device=device)
        # many sets per draw: a tiny shape has thousands of sets, and a chain of launches per set
        # is host-bound; at most ~64 MB of fp32 draws per chunk
        chunk = max(1, (64 << 20) // (4 * max(1, M * K + K * N)))
        for lo in range(0, n_sets, chunk):
            hi = min(n_sets, lo + chunk)
            self.A[lo:hi].copy_(torch.randn(hi - lo, M, K, generator=gen, device=device))
            self.B[lo:hi].copy_(torch.randn(hi - lo, K, N, generator=gen, device=device))
        self.Bt.copy_(self.B.transpose(1, 2))
        self._refs: OrderedDict[int, object] = OrderedDict()
        self._rms: dict[int, tuple[float, float]] = {}

    @staticmethod
    def bytes_per_set(M: int, N: int, K: int) -> int:
        """What one call reads: A and one layout of B (fp16)."""
        return 2 * (M * K + K * N)

    @staticmethod
    def fill_bytes_per_set(M: int, N: int, K: int) -> int:
        """What one set allocates and fills: A, B and B's column-major copy (fp16)."""
        return 2 * (M * K + 2 * K * N)

    def a(self, i: int):
        return self.A[i]

    def b_rr(self, i: int):
        return self.B[i]

    def b_rc(self, i: int):
        return self.Bt[i]

    def ref(self, i: int):
        r = self._refs.get(i)
        if r is None:
            r = self._refs[i] = check.reference(self.A[i], self.B[i])
            while len(self._refs) > 4:
                self._refs.popitem(last=False)
        else:
            self._refs.move_to_end(i)
        return r

    def rms(self, i: int) -> tuple[float, float]:
        if i not in self._rms:
            self._rms[i] = (check.rms(self.A[i]), check.rms(self.B[i]))
        return self._rms[i]

    def verify(self, c, i: int, *, acc: str) -> str | None:
        ra, rb = self.rms(i)
        cmp = check.compare(c, self.ref(i), K=self.K, acc=acc, rms_a=ra, rms_b=rb)
        return None if cmp.ok else cmp.detail


# ---- the device-agnostic core (GPU path and CPU tests alike) -----------------------------------

def mode_keys(request, *, gaps_ms=None) -> list[str]:
    """The timings keys a request produces, in order."""
    keys = []
    for m in request.modes:
        if m == "offline":
            keys.append("offline")
        elif m == "server":
            keys += [KT.gap_key(g) for g in (gaps_ms or request.server_gaps_ms)]
        elif m == "e2e":
            keys += [f"e2e_{k}" for k in KINDS]
        elif m == "wall":
            keys.append("wall")
    return keys


def _interval_dict(iv) -> dict:
    return {"median": iv.median, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def baseline_agreement(kt, base_names, margin: float = WIN_MARGIN) -> dict | None:
    """How far the session's baselines sit apart: the fastest and the slowest by median, the
    paired per-round ratio slowest / fastest with its interval, and `disagree` when even its
    lower end is more than `margin` (the export rule's) above 1: which baseline a kernel is
    compared against then moves a verdict by more than the bar. None with fewer than two."""
    timed = [b for b in base_names if any(v is not None for v in kt.per_round.get(b, ()))]
    if len(timed) < 2:
        return None
    med = {b: kt.time(b).median for b in timed}
    fast, slow = min(timed, key=med.get), max(timed, key=med.get)
    iv = kt.ratio(slow, fast)
    return {"fastest": fast, "slowest": slow, "spread": iv.median - 1.0, "lo": iv.lo - 1.0,
            "hi": iv.hi - 1.0, "margin": margin, "disagree": iv.lo > 1.0 + margin}


def kernel_bar(result: dict, margin: float, mode: str = "offline") -> tuple[bool, float | None, str]:
    """(clears, lower end, baseline) of the export rule's kernel-time bar for one result (row
    parts timings/speedups/stats): the lowest lower end of its speedup intervals against every
    baseline timed in the session must be at least 1 + margin."""
    timed = set(((result.get("speedups") or {}).get(mode) or {}))
    ivs = (((result.get("stats") or {}).get(mode) or {}).get("speedup")) or {}
    los = {b: ivs[b].get("lo") for b in timed if isinstance(ivs.get(b), dict)}
    if not timed or len(los) < len(timed) or any(v is None for v in los.values()):
        return False, None, ""
    who = min(los, key=los.get)
    return los[who] >= 1.0 + margin, float(los[who]), who


def time_group(candidates: dict, baselines: dict, request, *, acc: str, device, peak,
               notes: dict, backend=None, l2_bytes: int | None = None, e2e=None,
               kernel_config: "KT.KernelTimeConfig | None" = None,
               server_config: "KT.ServerConfig | None" = None, pool: OperandPool | None = None,
               phases: dict | None = None) -> dict:
    """Time the (already checked) candidates against the baselines in every requested mode.

    candidates[name] / a baseline's callable: fn(a, b_rr, b_rc, c) -> status, enqueues one call
    writing c. baselines[name] is setup(name, pool, verify) -> such a callable (it runs outside
    timing and may raise to say the baseline is unavailable). e2e(name) -> e2e.measure_e2e's
    dict for a candidate given its kernel time (GPU path; None skips e2e). `phases`, when given,
    gains the seconds of each stage (PHASES). Operands are kept cold by kerneltime.cold_plan's
    method, the same for every callable (each result's "cold_operands" says which). With
    request.gate_margin set, the offline session also stops once no candidate can reach the
    export bar (KernelTimeConfig.stop_below). Returns {name: result part} with status, detail,
    timings, speedups, stats, bounds, cold_operands."""
    import torch

    M, N, K = request.shape.M, request.shape.N, request.shape.K
    backend = backend or KT.CudaKernelBackend()
    sync = _device_sync(device)
    if l2_bytes is None:
        l2_bytes = getattr(backend, "l2_bytes", peak.l2_bytes)
    cfg = kernel_config or KT.FINAL_CONFIG
    if pool is None:
        plan = KT.cold_plan(OperandPool.bytes_per_set(M, N, K), l2_bytes, request.operands,
                            samples=(len(candidates) + len(baselines)) * cfg.min_rounds,
                            max_calls=cfg.max_calls,
                            fill_bytes_per_set=OperandPool.fill_bytes_per_set(M, N, K))
        with _phase(phases, "operands", sync):
            pool = OperandPool(M, N, K, plan.n_sets, device,
                               cold="flush" if plan.method == "flush" else "rotate")
        cold_info = plan.to_dict()
    else:
        cold_info = {"method": pool.cold if request.operands == "cold" else "hot",
                     "operand_sets": pool.n_sets}
    gate = getattr(request, "gate_margin", None)
    # the same cold method for every callable; a gated session stops below the export bar
    cfg = dataclasses.replace(cfg, cold=pool.cold,
                              stop_below=1.0 + gate if gate is not None else cfg.stop_below)

    def verify_c(c, i):
        return pool.verify(c, i, acc=acc)

    outs = {name: torch.empty(M, N, dtype=torch.float16, device=device) for name in candidates}
    fns = dict(candidates)
    for name, setup in baselines.items():
        with _phase(phases, "baselines", sync):
            try:
                fn = setup(name, pool, verify_c)
            except RuntimeError as exc:         # BaselineError, torch errors: unavailable, say why
                notes[name] = f"unavailable: {exc}"
                continue
            c = torch.full((M, N), float("nan"), dtype=torch.float16, device=device)
            try:
                st = fn(pool.a(0), pool.b_rr(0), pool.b_rc(0), c)
            except RuntimeError as exc:
                st = f"{exc}"
            why = f"returned status {st}" if st else verify_c(c, 0)
            if why:
                notes[name] = f"dropped: {why}"
                continue
        outs[name] = c
        fns[name] = fn
    base_names = [n for n in fns if n not in candidates]

    def wrap(name, fn):
        def call(i: int) -> None:
            st = fn(pool.a(i), pool.b_rr(i), pool.b_rc(i), outs[name])
            if st:
                if name in candidates:
                    raise check.LaunchError(st, f"timed call of {name}")
                raise RuntimeError(f"baseline {name} returned status {st} while timed")
        return call

    callables = {n: wrap(n, f) for n, f in fns.items()}

    def prepare(name: str) -> None:          # NaN in the output: the timed calls must write it
        outs[name].view(torch.int16).fill_(0x7E00)

    def verify(name: str, i: int):
        return verify_c(outs[name], i)

    pairs = [(b, c) for c in candidates for b in base_names]
    lower = bounds.lower_bound_us(M, N, K, peak, cold=request.operands == "cold")
    results = {c: {"status": "ok", "detail": "", "timings": {}, "speedups": {}, "stats": {},
                   "bounds": {"lower_bound_us": lower, "peak": peak.name,
                              "peak_source": peak.source, "cold_operands": request.operands == "cold",
                              "fraction_of_peak": {}},
                   "cold_operands": cold_info}
               for c in candidates}

    def record(key: str, kt: "KT.KernelTimes", session: dict) -> None:
        agree = baseline_agreement(kt, base_names)
        for c, res in results.items():
            if res["status"] != "ok" or c not in kt.per_round:
                continue
            t = {"candidate": kt.stats_dict(c)}
            sp, spd = {}, {}
            for b in base_names:
                t[b] = kt.stats_dict(b)
                iv = kt.ratio(b, c)
                sp[b], spd[b] = iv.median, _interval_dict(iv)
            if "cublas_nn" in base_names and "cublas_tn" in base_names:
                iv = kt.ratio_of_best(["cublas_nn", "cublas_tn"], c)
                spd[DERIVED_CUBLAS_BEST] = _interval_dict(iv)
            res["timings"][key] = t
            res["speedups"][key] = sp
            res["stats"][key] = {"speedup": spd, "session": dict(session, group=len(candidates))}
            if agree is not None:
                res["stats"][key]["baselines"] = agree
            res["bounds"]["fraction_of_peak"][key] = bounds.fraction_of_peak(
                t["candidate"]["median_us"], M, N, K, peak)

    def fail_timed(failures: list[str]) -> bool:
        bad = False
        for f in failures:
            who = f.split("@", 1)[0]
            if who in results and results[who]["status"] == "ok":
                results[who].update(status="wrong", detail="timed output wrong: " + f)
                bad = True
            elif who not in results:
                notes["timed_outputs"] = (notes.get("timed_outputs", "") + "; " + f).strip("; ")
        return bad

    gated: set = set()           # candidates below the gate's bar: no server, no e2e
    try:
        cal = None
        if "offline" in request.modes or "server" in request.modes:
            with _phase(phases, "calibrate"):
                cal = KT.calibrate(callables, cfg, backend, n_sets=pool.n_sets)
        if "offline" in request.modes:
            with _phase(phases, "offline"):
                kt = KT.time_kernels(callables, cfg, backend, n_sets=pool.n_sets, pairs=pairs,
                                     verify=verify, prepare=prepare, calibration=cal)
            fail_timed(kt.failures)
            record("offline", kt, kt.session_dict())
        if gate is not None and "offline" in request.modes:
            # server mode and the end-to-end call only for a candidate past the export bar
            for r in results.values():
                if r["status"] != "ok":
                    continue
                ok, lo, who = kernel_bar(r, gate)
                r["gate"] = {"margin": gate, "passed": ok, "lo": lo, "baseline": who,
                             "skipped": [] if ok else [m for m in request.modes
                                                       if m in ("server", "e2e")]}
        gated = {c for c, r in results.items() if (r.get("gate") or {}).get("passed") is False}
        if "server" in request.modes and any(r["status"] == "ok" and c not in gated
                                             for c, r in results.items()):
            scfg = server_config or KT.ServerConfig(gaps_ms=tuple(request.server_gaps_ms))
            live = {n: f for n, f in callables.items()
                    if n not in results or (results[n]["status"] == "ok" and n not in gated)}
            with _phase(phases, "server"):
                by_gap = KT.time_after_gaps(live, scfg, backend, calibration=cal, n_sets=pool.n_sets,
                                            pairs=[p for p in pairs if p[1] in live], verify=verify)
            for key, kt in by_gap.items():
                fail_timed(kt.failures)
                record(key, kt, dict(kt.session_dict(), server=scfg.to_dict()))
        if "wall" in request.modes:
            with _phase(phases, "wall"):
                res = run_schedule({n: f for n, f in callables.items()}, TimingConfig(mode="wall"),
                                   _WallBackend(backend), n_buffers=min(pool.n_sets, 3),
                                   verify=lambda who, i: verify(who, i),
                                   prepare_set=lambda i: [prepare(n) for n in callables])
            for c, r in results.items():
                if r["status"] != "ok":
                    continue
                cand = res.stats[c].median_us
                r["timings"]["wall"] = {"candidate": res.stats[c].to_dict(),
                                        **{b: res.stats[b].to_dict() for b in base_names}}
                r["speedups"]["wall"] = {b: res.stats[b].median_us / cand for b in base_names}
                r["stats"]["wall"] = {"session": {"timer": "host clock (CUDA-L2's method)"}}
            fail_timed(res.failures)
    except check.LaunchError as exc:
        for r in results.values():
            if r["status"] == "ok":
                r.update(status="launch_error", detail=str(exc))
        return results
    for c, r in results.items():
        if r["status"] != "ok":
            continue
        t = r["timings"].get("offline", {}).get("candidate", {}).get("median_us")
        if t is not None and bounds.is_too_fast(t, M, N, K, peak, cold=request.operands == "cold"):
            r.update(status="too_fast",
                     detail=f"offline median {t:.3g} us is below the physical lower bound "
                            f"{lower:.3g} us on {peak.name} ({bounds.DEFAULT_MARGIN:.0%} margin)")
            continue
        if e2e is not None and "e2e" in request.modes and c not in gated:
            with _phase(phases, "e2e"):
                out = e2e(c, t)
            for kind, whos in out["timings"].items():
                key = f"e2e_{kind}"
                r["timings"][key] = {("candidate" if w == "cudal2" else w): v for w, v in whos.items()}
                spd = out["speedups"][kind].get("cudal2")
                r["speedups"][key] = {"torch": spd["median"]}
                r["stats"][key] = {"speedup": {"torch": spd}, "session": out["session"]}
    return results


class _WallBackend:
    """timing.run_schedule's backend for the wall mode, on top of a KernelBackend."""

    def __init__(self, kb):
        self.kb = kb

    def now(self):
        return self.kb.now()

    def synchronize(self):
        self.kb.synchronize()

    def sleep(self, s):
        self.kb.sleep(s)

    def flush_l2(self):
        self.kb.flush_l2()

    def start(self):
        return self.kb.record()

    def stop(self, token):
        return (token, self.kb.record())

    def elapsed_us(self, handle):
        return self.kb.elapsed_us(*handle)

    def capture(self, fn, calls):            # pragma: no cover - wall mode never captures
        raise NotImplementedError


# ---- the GPU path ------------------------------------------------------------------------------

def _load(so_path: str, options: dict | None):
    """(library, meta, options array) for a candidate; AbiError names what is wrong."""

    lib = load_library(so_path)
    meta = lib.meta
    return lib, meta, lib.options(options or None)


def _candidate_launch(lib, layout: str, M: int, N: int, K: int, opts, ws):
    """fn(a, b_rr, b_rc, c) -> status: one call of a loaded kernel on torch's current stream."""
    import torch

    ws_bytes = ws.numel() if ws is not None else 0
    ws_ptr = ws.data_ptr() if ws_bytes else 0
    ldb = N if layout == "RR" else K

    def fn(a, b_rr, b_rc, c) -> int:
        b = b_rr if layout == "RR" else b_rc
        return lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, ldb, N,
                          ws_ptr, ws_bytes, torch.cuda.current_stream().cuda_stream, opts)
    return fn


@contextmanager
def _guarded(guard):
    """Arm the call guard (if preloaded) around a call into the kernel library."""
    if guard is None:
        yield
    else:
        with guard.armed():
            yield


def _guarded_launch(guard, launch):
    """The correctness suite's calls run armed: the kernel's first calls on a GPU, with fresh
    inputs each, each on torch's current stream, the one stream its work may go to. Timed calls
    run disarmed, so the guard costs the timing nothing."""
    if guard is None:
        return launch
    import torch

    def armed_launch(ops) -> int:
        with guard.armed(stream=torch.cuda.current_stream().cuda_stream):
            return launch(ops)
    return armed_launch


@contextmanager
def _side_stream(device):
    """The correctness suite runs on a stream of its own, not the default one, as a serving
    engine's calls do: a launch on the legacy or per-thread default stream is then not the call's
    stream, and the guard refuses it (ordered both ways with the surrounding work)."""
    if not str(device).startswith("cuda"):
        yield
        return
    import torch

    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        main.wait_stream(side)


def call_record(guard) -> dict:
    """What the call guard saw: every runtime call by name with its count, what it refused,
    under the rules of AUDIT_VERSION (launches on the call's stream only)."""
    if guard is None:
        return {"status": "off: the call guard is not preloaded in this worker"}
    seen: dict[str, int] = {}
    for name, _ in guard.calls():
        seen[name] = seen.get(name, 0) + 1
    return {"status": "on", "rules": AUDIT_VERSION, "calls": seen,
            "calls_not_named": guard.dropped(), "refused": sorted(set(guard.refused()))}


def _so_launcher(lib, opts):
    """check.Launch for the correctness suite, passing the candidate's options."""
    import torch

    def launch(ops) -> int:
        return lib.launch(ops.a.data_ptr(), ops.b_store.data_ptr(), ops.c.data_ptr(),
                          ops.M, ops.N, ops.K, ops.lda, ops.ldb, ops.ldc,
                          ops.ws.data_ptr() if ops.ws_bytes else 0, ops.ws_bytes,
                          torch.cuda.current_stream().cuda_stream, opts)
    return launch


def _env(env_before: dict) -> dict:
    import torch
    env = dict(gpu_env())
    env.update({f"{k}_before": v for k, v in env_before.items()
                if k in ("sm_clock_mhz", "temp_c", "power_w")})
    env.update(torch=torch.__version__, cuda=torch.version.cuda,
               device_name=torch.cuda.get_device_name())
    env.setdefault("gpu", env["device_name"])
    return env


def measure(so_path: str, request, *, baseline_libs: dict | None = None,
            lt_known: dict | None = None) -> dict:
    """Finals for one candidate (measure_group of one)."""
    return measure_group([so_path], [request], baseline_libs=baseline_libs, lt_known=lt_known)[0]


def measure_group(so_paths: list[str], requests: list, *, baseline_libs: dict | None = None,
                  lt_known: dict | None = None) -> list[dict]:
    """Finals for candidates of ONE shape (and accumulator and B layout) in this worker. Every
    request must name the same shape and timing settings. A CUDA error from any candidate
    poisons the worker: that candidate is launch_error, the rest 'error' (not its fault; the
    pipeline measures them again in a fresh worker)."""
    if len(so_paths) != len(requests) or not requests:
        raise ValueError("measure_group needs one request per library")
    r0 = requests[0]
    for r in requests[1:]:
        if (r.shape, r.modes, r.baselines, r.extra_baselines, r.operands, r.server_gaps_ms,
                r.timer, r.acc) != (r0.shape, r0.modes, r0.baselines, r0.extra_baselines,
                                    r0.operands, r0.server_gaps_ms, r0.timer, r0.acc):
            raise ValueError("measure_group: requests differ in shape or timing settings")
    done: dict[int, dict] = {}
    try:
        if fakedevice.enabled():
            return _fake_group(so_paths, requests, done)
        return _measure_group(so_paths, requests, baseline_libs, lt_known, done)
    except Exception as exc:  # noqa: BLE001 - only CUDA errors are verdicts; the rest re-raise
        if not _cuda_error(exc):
            raise
        detail = f"CUDA error while measuring: {type(exc).__name__}: {exc}"[:1000]
        mark_poisoned(detail)
        culprit = done.get("current")
        out = []
        for i in range(len(requests)):
            if i in done:
                out.append(done[i])
            elif culprit is None or culprit == i:
                out.append(_fail("launch_error", detail))
            else:
                out.append(_fail("error", "not measured: another candidate in the same worker "
                                          "broke the CUDA context"))
        return out


def _fake_group(so_paths, requests, done: dict) -> list[dict]:
    """measure_group on the fake device (cudal2/harness/fakedevice.py): same result shape, the
    group's once-per-session phases slept once beside each finalist's own."""
    phases: dict[str, float] = {}
    wanted = list(requests[0].baselines) + list(requests[0].extra_baselines)
    out = []
    for i, (so, r) in enumerate(zip(so_paths, requests)):
        done["current"] = i
        out.append(fakedevice.measure_one(_load, so, r, wanted, phases))
        done[i] = out[-1]
    done.pop("current", None)
    fakedevice.session(phases)
    env = dict(fakedevice.env(), phases_s=phases, measure_s=round(sum(phases.values()), 4))
    return [dict(res, env=env) for res in out]


def _measure_group(so_paths, requests, baseline_libs, lt_known, done: dict) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [_fail("not_measured", "not measured: no GPU") for _ in requests]
    t_start = time.perf_counter()
    phases = PhaseTimes()
    results = _measure_group_timed(so_paths, requests, baseline_libs, lt_known, done, phases,
                                   DEVICE)
    total = time.perf_counter() - t_start
    phases["other"] = round(max(0.0, total - sum(v for k, v in phases.items() if k != "other")), 4)
    account = {k: phases[k] for k in PHASES if k in phases}
    for r in results:
        if r is not None:       # failed candidates too: the group's time is the group's
            env = r.setdefault("env", {})
            env["phases_s"], env["measure_s"] = account, round(total, 4)
    return results


def _measure_group_timed(so_paths, requests, baseline_libs, lt_known, done: dict,
                         phases: PhaseTimes, device: str = "cuda") -> list[dict]:
    import torch

    req = requests[0]
    M, N, K = req.shape.M, req.shape.N, req.shape.K
    sync = _device_sync(device)
    with _phase(phases, "provenance"):
        env_before = gpu_env()
    results: list[dict | None] = [None] * len(requests)
    live: dict[str, tuple] = {}          # name -> (index, lib, meta, opts, ws, layout)
    acc_all = None
    guard = Guard.active()              # preloaded by gpu_pool; None: the row says so
    shared = None                       # the main shape's inputs and references, once per group
    for i, (so, r) in enumerate(zip(so_paths, requests)):
        done["current"] = i
        with _phase(phases, "load"):
            if guard is not None:
                guard.reset()
            with _guarded(guard):
                lib, meta, opts = _load(so, dict(r.options))
        declared, layout = meta["acc"], meta["layout"]
        acc = r.acc or declared
        base = {"acc": acc, "layout": layout, "meta": meta, "options": dict(r.options)}
        if acc == "f32" and declared == "f16":
            results[i] = _fail("wrong", "kernel declares an f16 accumulator; the request needs f32", **base)
            continue
        with _phase(phases, "load"), _guarded(guard):
            ws_bytes = lib.workspace_bytes(M, N, K, opts)
        tile = tuple(meta["tile"])[:3] if meta.get("tile") else None
        div = meta.get("divisible")
        if shared is None:
            with _phase(phases, "init", sync):
                if sync is not None:                 # torch's cuBLAS, as the references use it
                    torch.cuda.current_blas_handle()
            with _phase(phases, "reference", sync):
                shared = check.ShapeInputs(M, N, K, device=device).prepare(
                    max(q.seeds for q in requests))
        with _phase(phases, "correctness", sync), _side_stream(device):
            report = check.check_kernel(_guarded_launch(guard, _so_launcher(lib, opts)), M, N, K,
                                        acc=acc, layout=layout,
                                        ws_bytes=ws_bytes, any_shape=bool(meta.get("any_shape")),
                                        tile=tile, seeds=r.seeds, device=device,
                                        divisible=tuple(int(d) for d in div) if div else (1, 1, 1),
                                        workspace=lambda m, n, k: lib.workspace_bytes(m, n, k, opts),
                                        ws_zero_init=bool(meta.get("workspace_zero_init")),
                                        max_m=meta.get("max_m"), max_n=meta.get("max_n"),
                                        inputs=shared)
        base["correctness"] = report.to_dict()
        base["call_guard"] = call_record(guard)
        if base["call_guard"].get("refused"):
            # refused before it reached the runtime: the context is intact, no poisoning
            results[i] = _fail("audit_rejected", "the call guard refused "
                               + ", ".join(base["call_guard"]["refused"][:6])
                               + " during its first calls (forbidden by the ABI)", **base)
            done[i] = results[i]
            continue
        if report.launch_error is not None:
            results[i] = _poisoned(f"kernel returned cudaError {report.launch_error}", **base)
            done[i] = results[i]
            # the context may be broken: the others go to a fresh worker
            return [results[j] or _fail("error", "not measured: another candidate in the same "
                                        "worker failed to launch") for j in range(len(requests))]
        if not report.ok:
            results[i] = _fail("wrong", report.first_failure, **base)
            done[i] = results[i]
            continue
        # zeroed once here, never between calls (the workspace_zero_init contract, docs/abi.md)
        with _phase(phases, "load"):
            ws = torch.zeros(max(ws_bytes, 1), dtype=torch.uint8, device=device) if ws_bytes else None
        live[f"cand{i}"] = (i, lib, meta, opts, ws, layout, base)
        acc_all = acc
    done.pop("current", None)
    shared_info = shared.to_dict() if shared is not None else None
    shared = None                       # its memory is the timing operands' now
    if not live:
        return results
    layouts = {v[5] for v in live.values()}
    if len(layouts) > 1:
        raise ValueError(f"measure_group: candidates of several B layouts {sorted(layouts)}")
    layout = layouts.pop()

    wanted = list(req.baselines) + list(req.extra_baselines)
    notes: dict[str, str] = {}
    runners = None
    new_lt: list[dict] = []
    if wanted:
        with _phase(phases, "baselines", sync):
            try:
                libs = baseline_libs or build_baselines(req.arch)
            except BaselineError as exc:       # torch baselines still run; the rest say why
                notes["cublas libraries"] = str(exc)
                libs = {}
            try:
                runners = BaselineRunners(libs, M, N, K, acc_all, layout)
            except BaselineError as exc:
                notes["cublas libraries"] = str(exc)
                runners = BaselineRunners({}, M, N, K, acc_all, layout)
    with _phase(phases, "calibrate"):           # the timer's set-up: NVML handle, L2 size
        backend = KT.CudaKernelBackend()
    lt_info: dict = {}

    def setup(name: str, pool, verify):
        if name == "cublaslt_autotuned":
            with _phase(phases, "autotune", sync):
                entry = runners.autotune(pool, env_before.get("gpu") or torch.cuda.get_device_name(),
                                         verify=verify, known=lt_known, backend=backend,
                                         cold=pool.cold)
            lt_info.update(key=entry.get("key"), source=entry.get("source"))
            if entry.get("source") == "tuned now":
                new_lt.append(entry)
        if name == "torch_tunableop":
            runners.setup_tunableop(pool.a(0), pool.b_rr(0),
                                    torch.empty(M, N, dtype=torch.float16, device=device))
        return runners.launcher(name)

    cands = {n: _candidate_launch(v[1], v[5], M, N, K, v[3], v[4]) for n, v in live.items()}

    def e2e(name: str, kernel_us: float | None) -> dict:
        _, lib, meta, opts, _, lay, _ = live[name]
        # about 2 ms of GPU work per throughput sample (a large GEMM needs one call)
        calls = max(1, min(50, int(2000.0 / max(kernel_us or 1.0, 1.0))))
        return measure_e2e(_e2e_contenders(lib, meta, opts, lay, M, N, K), E2EConfig(calls=calls),
                           HostBackend())

    try:
        timed = time_group(cands, {n: setup for n in wanted}, req, acc=acc_all, device=device,
                           peak=bounds.device_peak(), notes=notes, backend=backend, e2e=e2e,
                           phases=phases)
    finally:
        if runners is not None:
            notes.update({k: v for k, v in runners.notes.items() if k not in notes})
            runners.close()
    with _phase(phases, "provenance"):
        env = _env(env_before)
    env["shared_inputs"] = shared_info
    if lt_info:
        env["lt_autotune_choice"] = lt_info      # the key the choice was made or found under
    for name, (i, _, _, _, _, _, base) in live.items():
        part = dict(timed[name])
        env["cold_operands"] = part.pop("cold_operands", None)     # the same for the group
        results[i] = dict(base, **part, baseline_notes=notes, lt_autotune=new_lt, env=env)
    return results


def _e2e_contenders(lib, meta, opts, layout: str, M: int, N: int, K: int) -> dict:
    """cudal2.matmul serving this kernel for the shape (the state an exact table hit leaves) and
    torch.matmul, called as users call them on a few operand sets."""
    import torch

    # here, not at the top: the runtime loads torch, and every verb whose module imports the
    # harness (tune, bench, campaign, db merge) would pay seconds of it for `--help`
    from cudal2.runtime.matmul import matmul
    from cudal2.runtime.resolve import serve_kernel

    gen = torch.Generator(device="cuda").manual_seed(7)
    sets = []
    for _ in range(4):
        a, b = check.random_inputs(M, N, K, gen, "cuda")
        sets.append((a, b if layout == "RR" else b.t().contiguous().t()))
    serve_kernel(lib, M, N, K, layout, options=opts)
    cm, tm = matmul, torch.matmul
    return {"cudal2": lambda i: cm(*sets[i % 4]), "torch": lambda i: tm(*sets[i % 4])}


# ---- screening -----------------------------------------------------------------------------------

def screen(shape, candidates: list, *, arch: str = "sm_90a", acc: str | None = None,
           operands: str = "cold", reference_us: float | None = None,
           config: "KT.KernelTimeConfig | None" = None) -> dict:
    """Screen (so_path, options) candidates of one shape in this (warm) worker. Returns
    {"candidates": [{"status", "detail", "meta", "options", "acc", "layout", "timings":
    {"screen": {"candidate": stats}}, "stats": {"screen": {"session": ...}}}, ...],
    "reference": {"torch_us": ..}, "env": {...}}. A CUDA error poisons the worker and
    ends the batch: the remaining candidates come back as 'error' (retried elsewhere)."""
    import torch

    if fakedevice.enabled():
        torch_us = fakedevice.torch_us(tuple(shape))
        one = lambda so, options, best: fakedevice.screen_one(_load, so, options, tuple(shape), acc)  # noqa: E731
        return {"candidates": _screen_all(candidates, one, torch_us),
                "reference": {"torch_us": torch_us}, "env": fakedevice.env()}
    if not torch.cuda.is_available():
        return {"candidates": [_fail("not_measured", "not measured: no GPU") for _ in candidates],
                "reference": {}, "env": {}}
    M, N, K = shape
    cfg = config or KT.SCREEN_CONFIG
    env_before, backend, pool, smoke, torch_us, torch_stats = _screen_setup(M, N, K, operands, cfg)
    best = min(x for x in (reference_us, torch_us) if x)
    out = _screen_all(candidates, lambda so, options, best: _screen_one(
        so, options, M, N, K, acc, pool, smoke, backend, cfg, best), best)
    return {"candidates": out, "reference": {"torch_us": torch_us, "torch": torch_stats},
            "env": _env(env_before)}


_SETUP: dict = {}       # this worker's screening set-up of its current shape


def _screen_setup(M: int, N: int, K: int, operands: str, cfg) -> tuple:
    """(env before, timer backend, operand pool, smoke inputs with references, torch's time and
    its stats) for screening one shape, made once per worker and shape: the chunks of a shape
    that pipeline.screen sends to one warm worker share it; a new shape frees the last one's."""
    import torch

    key = (M, N, K, operands, cfg)
    if key in _SETUP:
        return _SETUP[key]
    _SETUP.clear()
    env_before = gpu_env()
    backend = KT.CudaKernelBackend()
    n_sets = min(N_SCREEN_SETS_MAX, KT.n_operand_sets(OperandPool.bytes_per_set(M, N, K),
                                                        backend.l2_bytes, operands))
    pool = OperandPool(M, N, K, n_sets, "cuda")
    # smoke inputs: one random and one 0/1 set with cached references (fresh, not the pool's)
    gen = torch.Generator(device="cuda").manual_seed(99)
    smoke = []
    for kind in ("random", "ones"):
        a, b = (check.random_inputs if kind == "random" else check.ones_inputs)(M, N, K, gen, "cuda")
        smoke.append((kind, a, b, b.t().contiguous(), check.reference(a, b)))
    # the reference time: torch.matmul on the same pool, kernel time
    c_ref = torch.empty(M, N, dtype=torch.float16, device="cuda")
    ref_t = KT.time_kernels({"torch": lambda i: torch.matmul(pool.a(i), pool.b_rr(i), out=c_ref)},
                            cfg, backend, n_sets=n_sets)
    _SETUP[key] = (env_before, backend, pool, smoke, ref_t.time("torch").median,
                   ref_t.stats_dict("torch"))
    return _SETUP[key]


def _screen_all(candidates: list, screen_one, best: float) -> list[dict]:
    """Each candidate through screen_one(so, options, best_us) in turn; a CUDA error poisons the
    worker and ends the batch (the rest come back as 'error', retried elsewhere)."""
    out = []
    for idx, (so, options) in enumerate(candidates):
        try:
            out.append(screen_one(so, options, best))
        except Exception as exc:  # noqa: BLE001
            if _cuda_error(exc):
                detail = f"CUDA error while screening: {type(exc).__name__}: {exc}"[:1000]
                mark_poisoned(detail)
                out.append(_fail("launch_error", detail, options=dict(options or {})))
                out += [_fail("error", "not screened: an earlier candidate broke the CUDA context",
                              options=dict(o or {})) for _, o in candidates[idx + 1:]]
                break
            out.append(_fail("error", f"{type(exc).__name__}: {exc}"[:1000],
                             options=dict(options or {})))
            continue
        t = out[-1].get("timings", {}).get("screen", {}).get("candidate", {}).get("median_us")
        if out[-1]["status"] == "ok" and t:
            best = min(best, t)
        if out[-1].get("poisoned"):
            out += [_fail("error", "not screened: an earlier candidate broke the CUDA context",
                          options=dict(o or {})) for _, o in candidates[idx + 1:]]
            break
    return out


def _screen_one(so, options, M, N, K, acc_req, pool, smoke, backend, cfg, best_us) -> dict:
    import torch

    lib, meta, opts = _load(so, options)
    declared, layout = meta["acc"], meta["layout"]
    acc = acc_req or declared
    base = {"acc": acc, "layout": layout, "meta": meta, "options": dict(options or {})}
    if acc == "f32" and declared == "f16":
        return _fail("wrong", "kernel declares an f16 accumulator; the request needs f32", **base)
    ws_bytes = lib.workspace_bytes(M, N, K, opts)
    # zeroed once here, never between calls (the workspace_zero_init contract, docs/abi.md)
    ws = torch.zeros(max(ws_bytes, 1), dtype=torch.uint8, device="cuda") if ws_bytes else None
    fn = _candidate_launch(lib, layout, M, N, K, opts, ws)
    c = torch.empty(M, N, dtype=torch.float16, device="cuda")
    for kind, a, b, bt, ref in smoke:
        c.view(torch.int16).fill_(0x7E00)
        st = fn(a, b, bt, c)
        if st:
            mark_poisoned(f"kernel returned cudaError {st}")
            return _fail("launch_error", f"kernel returned cudaError {st} (smoke, {kind})",
                         poisoned=True, **base)
        if kind == "ones":
            cmp = check.compare(c, ref, exact=True)
        else:
            cmp = check.compare(c, ref, K=K, acc=acc, rms_a=check.rms(a), rms_b=check.rms(b))
        if not cmp.ok:
            return _fail("wrong", f"smoke {kind}: {cmp.detail}", **base)

    def call(i: int) -> None:
        st = fn(pool.a(i), pool.b_rr(i), pool.b_rc(i), c)
        if st:
            raise check.LaunchError(st, "screening")

    try:
        kt = KT.time_kernels({"candidate": call}, cfg, backend, n_sets=pool.n_sets,
                             verify=lambda n, i: pool.verify(c, i, acc=acc),
                             prepare=lambda n: c.view(torch.int16).fill_(0x7E00),
                             reference_us=best_us)
    except check.LaunchError as exc:
        return _fail("launch_error", str(exc), **base)
    if kt.failures:
        return _fail("wrong", "timed output wrong: " + kt.failures[0], **base)
    return dict(base, status="ok", detail="", timings={"screen": {"candidate": kt.stats_dict("candidate")}},
                speedups={}, stats={"screen": {"session": kt.session_dict()}})
