"""The kernel timer, its statistics and the finals' timing core on CPU, with a simulated GPU
timeline (no CUDA, no timing asserts on the real clock)."""
import math
import random

import pytest

from cudal2.timing import kerneltime as KT
from cudal2.timing import stats as S


class Ev:
    def __init__(self, t):
        self.t = t


class FakeGpu:
    """A host clock and a GPU queue. Enqueueing costs host time; the GPU runs the queue in order
    and waits (idles) when it catches up with the host, so a timer that lets the host into its
    bracket sees host time, as on real hardware."""

    def __init__(self, gpu_us=None, host_us=None, clocks=None, l2_bytes=1 << 20):
        self.host = 0.0              # seconds
        self.gpu_free = 0.0          # when the GPU finishes what is queued
        self.gpu_us = dict(gpu_us or {})
        self.host_us = dict(host_us or {})
        self.clocks = clocks         # callable(n_reads) -> MHz, or None
        self.reads = 0
        self.spins = []
        self.sleeps = []
        self.flushes = 0
        self.l2_bytes = l2_bytes
        self.calls = []

    def call(self, name, i=0):
        self.host += self.host_us.get(name, 5.0) * 1e-6
        self.gpu_free = max(self.gpu_free, self.host) + self.gpu_us[name] * 1e-6
        self.calls.append((name, i))

    # KernelBackend
    def now(self):
        return self.host

    def synchronize(self):
        self.host = max(self.host, self.gpu_free)

    def sleep(self, s):
        self.sleeps.append(s)
        self.host += s

    def flush_l2(self):
        self.flushes += 1
        self.gpu_free = max(self.gpu_free, self.host) + 20e-6

    def spin(self, us):
        self.spins.append(us)
        self.host += 2e-6
        self.gpu_free = max(self.gpu_free, self.host) + us * 1e-6

    def record(self):
        self.host += 1e-6
        self.gpu_free = max(self.gpu_free, self.host)
        return Ev(self.gpu_free)

    def done(self, ev):
        return ev.t <= self.host

    def elapsed_us(self, s, e):
        self.host = max(self.host, e.t)
        return (e.t - s.t) * 1e6

    def sm_clock_mhz(self):
        self.reads += 1
        return self.clocks(self.reads) if self.clocks else None


def fns(gpu, names):
    return {n: (lambda i, n=n: gpu.call(n, i)) for n in names}


# ---- stats ------------------------------------------------------------------------------------

def test_median_quantile_and_bootstrap_interval():
    assert S.median([3, 1, 2]) == 2 and S.median([4, 1, 3, 2]) == 2.5
    rng = random.Random(1)
    xs = [1.0 + 0.01 * rng.gauss(0, 1) for _ in range(200)]
    lo, hi = S.bootstrap_median_ci(xs, seed=0)
    assert lo < S.median(xs) < hi and hi - lo < 0.01
    assert S.bootstrap_median_ci(xs, seed=0) == (lo, hi)          # deterministic for a seed
    assert S.bootstrap_median_ci([5.0]) == (5.0, 5.0)
    with pytest.raises(ValueError):
        S.bootstrap_median_ci([])
    iv = S.interval([2.0] * 10)
    assert (iv.median, iv.lo, iv.hi, iv.n) == (2.0, 2.0, 2.0, 10) and iv.rel_halfwidth == 0
    assert S.tight([iv], 0.005) and not S.tight([S.Interval(1.0, 0.9, 1.1, 5)], 0.005)


def test_bootstrap_geomean_interval():
    xs = [0.8, 0.9, 1.0, 1.1, 1.25, 0.95, 1.05, 0.85]
    g, lo, hi = S.bootstrap_geomean_ci(xs, seed=0)
    assert abs(g - math.exp(sum(map(math.log, xs)) / len(xs))) < 1e-12
    assert lo < g < hi and 0.8 < lo and hi < 1.25
    assert S.bootstrap_geomean_ci(xs, seed=0) == (g, lo, hi)      # deterministic for a seed
    assert S.bootstrap_geomean_ci([2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        S.bootstrap_geomean_ci([])
    with pytest.raises(ValueError, match="positive"):
        S.bootstrap_geomean_ci([1.0, 0.0])


def test_paired_ratios_and_clock_filter():
    assert S.paired_ratios([2.0, None, 3.0], [1.0, 1.0, 0.0]) == [2.0]
    keep = S.kept_rounds([1980, 1975, 1700, None, 1980], tolerance=0.03)
    assert keep == [True, True, False, True, True]
    assert S.kept_rounds([None, None]) == [True, True]


# ---- the kernel timer ---------------------------------------------------------------------------

def test_kernel_time_excludes_the_host_path_of_short_kernels():
    """A 3 us kernel behind a 15 us host launch: per-call events would read ~15 us; the spin
    keeps the queue full, so the timer reads the GPU's 3 us."""
    gpu = FakeGpu({"k": 3.0}, {"k": 15.0})
    res = KT.time_kernels(fns(gpu, ["k"]), KT.KernelTimeConfig(), gpu, n_sets=4)
    t = res.time("k")
    assert t.median == pytest.approx(3.0, rel=1e-6)
    assert res.calls_per_sample == round(500 / 3.0)
    assert res.starved == 0 and res.stopped == "tight"
    assert min(gpu.spins[-res.rounds:]) >= res.calls_per_sample * (15.0 - 3.0)


def test_a_too_short_spin_is_detected_and_retaken():
    gpu = FakeGpu({"k": 3.0}, {"k": 15.0})
    cal = KT.Calibration({"k": 3.0}, {"k": 15.0}, calls=100, spin_us={"k": 50.0})
    res = KT.time_kernels(fns(gpu, ["k"]), KT.KernelTimeConfig(), gpu, n_sets=2, calibration=cal)
    assert res.starved >= 1                       # the first samples ran dry and were retaken
    assert res.spin_us["k"] > 50.0
    assert res.time("k").median == pytest.approx(3.0, rel=1e-3)


def test_precall_runs_one_untimed_call_on_the_previous_set():
    gpu = FakeGpu({"k": 100.0})
    cal = KT.Calibration({"k": 100.0}, {"k": 5.0}, calls=2, spin_us={"k": 30.0})
    res = KT.time_kernels(fns(gpu, ["k"]), KT.KernelTimeConfig(precall=True, min_rounds=3,
                                                               max_rounds=3, warmup_ms=0.001),
                          gpu, n_sets=4, calibration=cal)
    assert res.time("k").median == pytest.approx(100.0)     # the pre-call is outside the bracket
    timed = [i for _, i in gpu.calls[-9:]]                   # 3 rounds x (1 pre-call + 2 calls)
    assert timed == [3, 0, 1, 1, 2, 3, 3, 0, 1]
    assert KT.FINAL_CONFIG.precall and not KT.SCREEN_CONFIG.precall


def test_calls_per_sample_sized_for_the_work_and_capped():
    gpu = FakeGpu({"k": 1000.0})
    cal = KT.calibrate(fns(gpu, ["k"]), KT.KernelTimeConfig(), gpu, n_sets=2)
    assert cal.calls == 1 and cal.gpu_us["k"] == pytest.approx(1000.0)
    gpu = FakeGpu({"k": 0.1})
    assert KT.calibrate(fns(gpu, ["k"]), KT.KernelTimeConfig(max_calls=200), gpu, n_sets=2).calls == 200


def test_rounds_interleave_cycle_operand_sets_and_pair_ratios():
    gpu = FakeGpu({"cand": 10.0, "base": 20.0}, {"cand": 4.0, "base": 4.0})
    res = KT.time_kernels(fns(gpu, ["cand", "base"]), KT.KernelTimeConfig(), gpu, n_sets=7,
                          pairs=[("base", "cand")])
    r = res.ratio("base", "cand")
    assert r.median == pytest.approx(2.0) and r.lo == pytest.approx(2.0)
    assert res.stopped == "tight" and res.rounds == KT.KernelTimeConfig().min_rounds
    timed = [i for n, i in gpu.calls if n == "cand"]
    assert set(timed) == set(range(7))            # every operand set is used
    firsts = {tuple(sorted(n for n, _ in gpu.calls[k:k + 2])) for k in range(0, 4)}
    assert firsts                                  # (interleaving is random: see the next test)


def test_round_order_is_random():
    orders = set()
    gpu = FakeGpu({"a": 5.0, "b": 5.0, "c": 5.0})
    cfg = KT.KernelTimeConfig(sample_us=5.0, min_rounds=12, max_rounds=12)
    KT.time_kernels(fns(gpu, ["a", "b", "c"]), cfg, gpu, n_sets=2)
    seq = [n for n, _ in gpu.calls]
    # the timed part: one call per sample; the last 36 calls are 12 rounds of 3
    for r in range(12):
        orders.add(tuple(seq[-36 + 3 * r:-36 + 3 * r + 3] if r < 11 else seq[-3:]))
    assert len(orders) > 1


def test_noise_stops_at_the_budget_or_round_cap_and_intervals_cover():
    rng = random.Random(3)

    class Noisy(FakeGpu):
        def call(self, name, i=0):
            self.gpu_us[name] = (10.0 if name == "cand" else 12.0) * (1 + 0.05 * rng.gauss(0, 1))
            super().call(name, i)

    gpu = Noisy({"cand": 10.0, "base": 12.0})
    cfg = KT.KernelTimeConfig(sample_us=10.0, min_rounds=6, max_rounds=40, target=0.001)
    res = KT.time_kernels(fns(gpu, ["cand", "base"]), cfg, gpu, n_sets=2, pairs=[("base", "cand")])
    assert res.stopped in ("budget", "max_rounds") and res.rounds == 40
    r = res.ratio("base", "cand")
    assert r.lo < 1.2 < r.hi and r.n == 40


def test_throttled_rounds_are_discarded():
    # every 9th clock read is a throttle dip: those rounds leave the statistics
    gpu = FakeGpu({"k": 5.0}, clocks=lambda n: 1400.0 if n % 9 == 0 else 1980.0)

    class Slow(FakeGpu):
        pass

    cfg = KT.KernelTimeConfig(min_rounds=20, max_rounds=20)
    res = KT.time_kernels(fns(gpu, ["k"]), cfg, gpu, n_sets=2)
    kept = res.kept()
    assert not all(kept) and sum(kept) < 20
    d = res.session_dict()
    assert d["discarded_throttled"] == 20 - sum(kept) and d["sm_clock_mhz"]["min"] == 1400.0


def test_timed_outputs_are_verified():
    gpu = FakeGpu({"k": 5.0})
    bad = {3}
    res = KT.time_kernels(fns(gpu, ["k"]), KT.KernelTimeConfig(), gpu, n_sets=4,
                          verify=lambda n, i: "wrong" if i in bad else None)
    assert res.failures and res.stopped == "failed" and res.failures[0].startswith("k@round")


def test_screening_stops_early_when_clearly_slower():
    gpu = FakeGpu({"k": 50.0})
    res = KT.time_kernels(fns(gpu, ["k"]), KT.SCREEN_CONFIG, gpu, n_sets=2, reference_us=10.0)
    assert res.stopped == "early_stop" and res.rounds == KT.SCREEN_CONFIG.min_rounds


def test_server_mode_single_calls_after_fixed_gaps():
    gpu = FakeGpu({"cand": 10.0, "base": 20.0}, {"cand": 5.0, "base": 5.0})
    cal = KT.calibrate(fns(gpu, ["cand", "base"]), KT.KernelTimeConfig(), gpu, n_sets=2)
    out = KT.time_after_gaps(fns(gpu, ["cand", "base"]), KT.ServerConfig(gaps_ms=(1.0, 10.0)), gpu,
                             calibration=cal, n_sets=2, pairs=[("base", "cand")])
    assert list(out) == ["server_1ms", "server_10ms"]
    for key, kt in out.items():
        assert kt.time("cand").median == pytest.approx(10.0)
        assert kt.ratio("base", "cand").median == pytest.approx(2.0)
        assert kt.calls_per_sample == 1
    assert 0.001 in gpu.sleeps and 0.01 in gpu.sleeps
    assert gpu.flushes >= 2 * sum(kt.rounds for kt in out.values())


def test_operand_sets_exceed_three_l2():
    assert KT.n_operand_sets(1 << 20, 50 << 20) == 150
    assert KT.n_operand_sets(200 << 20, 50 << 20) == 2
    assert KT.n_operand_sets(1 << 10, 50 << 20, max_bytes=1 << 20) == 1024
    assert KT.n_operand_sets(1 << 20, 50 << 20, "hot") == 1


def test_config_validation():
    with pytest.raises(ValueError, match="operands"):
        KT.KernelTimeConfig(operands="warm")
    with pytest.raises(ValueError, match="max_rounds"):
        KT.KernelTimeConfig(min_rounds=5, max_rounds=3)
    with pytest.raises(ValueError, match="nothing"):
        KT.time_kernels({}, KT.KernelTimeConfig(), FakeGpu())
    with pytest.raises(ValueError, match="pair"):
        KT.time_kernels(fns(FakeGpu({"a": 1.0}), ["a"]), KT.KernelTimeConfig(), FakeGpu({"a": 1.0}),
                        pairs=[("b", "a")])


# ---- e2e ----------------------------------------------------------------------------------------

class FakeHost:
    def __init__(self, cost_us):
        self.t, self.cost = 0.0, cost_us

    def now(self):
        return self.t

    def synchronize(self):
        self.t += 1e-6

    def capture(self, fn, calls):
        def replay():
            self.t += 2e-6 + calls * 1e-6          # a graph launch: no per-call host cost
        return replay


def test_e2e_ratios_of_user_calls():
    from cudal2.harness.e2e import E2EConfig, measure_e2e

    host = FakeHost({})

    def contender(us):
        def f(i):
            host.t += us * 1e-6
        return f
    out = measure_e2e({"cudal2": contender(8.0), "torch": contender(10.0)}, E2EConfig(), host)
    sp = out["speedups"]["eager_throughput"]["cudal2"]
    assert sp["median"] == pytest.approx(10.0 / 8.0, rel=0.02)
    assert set(out["timings"]) == {"eager_throughput", "eager_latency", "graph_throughput",
                                   "graph_latency"}
    assert out["timings"]["eager_latency"]["torch"]["median_us"] > 0
    with pytest.raises(ValueError, match="reference"):
        measure_e2e({"cudal2": contender(1.0)}, E2EConfig(), host)


def test_e2e_without_graph_capture_says_why():
    from cudal2.harness.e2e import E2EConfig, measure_e2e

    class NoGraph(FakeHost):
        def capture(self, fn, calls):
            raise RuntimeError("operation not permitted when stream is capturing")

    host = NoGraph({})
    out = measure_e2e({"cudal2": lambda i: None, "torch": lambda i: None}, E2EConfig(), host)
    assert set(out["timings"]) == {"eager_throughput", "eager_latency"}
    assert "capture failed" in out["session"]["graph_note"]


# ---- finals' timing core (measure.time_group) on CPU tensors ------------------------------------

def _kernels(gpu, wrong_from_set=None, status=0):
    """Kernels as Python callables on CPU tensors: each advances the fake GPU and writes C."""
    def kernel(name):
        def fn(a, b_rr, b_rc, c):
            gpu.call(name)
            if name.startswith("cand") and status:
                return status
            c.copy_((a.float() @ b_rr.float()).half())
            if name.startswith("cand") and wrong_from_set is not None and len(gpu.calls) > wrong_from_set:
                c.zero_()
            return 0
        return fn
    return kernel


def _time_group(gpu, durations, modes=("offline",), peak=None, **kw):
    from cudal2.harness import bounds
    from cudal2.harness.measure import time_group
    from cudal2.harness.types import EvalRequest, Shape

    gpu.gpu_us = durations
    kernel = _kernels(gpu, **kw)
    req = EvalRequest("x", Shape(32, 48, 64), modes=modes, server_gaps_ms=(1.0,))
    notes = {}
    cands = {n: kernel(n) for n in durations if n.startswith("cand")}
    baselines = {n: (lambda name, pool, verify: kernel(name)) for n in durations
                 if not n.startswith("cand")}
    out = time_group(cands, baselines, req, acc="f32", device="cpu",
                     peak=peak or bounds.peak_for_name("H100"), notes=notes, backend=gpu,
                     l2_bytes=64 << 10)
    return out, notes


def test_time_group_pairs_every_candidate_with_every_baseline():
    gpu = FakeGpu()
    out, _ = _time_group(gpu, {"cand0": 10.0, "cand1": 5.0, "torch": 20.0, "cublas_nn": 40.0,
                                "cublas_tn": 30.0}, modes=("offline", "server"))
    for c, want in (("cand0", 2.0), ("cand1", 4.0)):
        r = out[c]
        assert r["status"] == "ok", r["detail"]
        assert r["speedups"]["offline"]["torch"] == pytest.approx(want)
        iv = r["stats"]["offline"]["speedup"]
        assert iv["cublas_best"]["median"] == pytest.approx(30.0 / (10.0 if c == "cand0" else 5.0))
        assert iv["torch"]["lo"] <= iv["torch"]["median"] <= iv["torch"]["hi"]
        assert r["stats"]["offline"]["session"]["group"] == 2
        assert r["timings"]["server_1ms"]["candidate"]["median_us"] == pytest.approx(
            10.0 if c == "cand0" else 5.0)
        assert r["bounds"]["cold_operands"]


def test_time_group_reports_its_phases():
    """Every stage's host seconds land in `phases` (the campaign sums them per run)."""
    from cudal2.harness import bounds
    from cudal2.harness.measure import PHASES, time_group
    from cudal2.harness.types import EvalRequest, Shape

    gpu = FakeGpu({"cand0": 5.0, "torch": 10.0})
    kernel = _kernels(gpu)
    phases = {}
    out = time_group({"cand0": kernel("cand0")}, {"torch": lambda n, p, v: kernel(n)},
                     EvalRequest("x", Shape(16, 16, 16), modes=("offline", "server"),
                                 server_gaps_ms=(1.0,)),
                     acc="f32", device="cpu", peak=bounds.peak_for_name("H100"), notes={},
                     backend=gpu, l2_bytes=1 << 16, phases=phases)
    assert out["cand0"]["status"] == "ok"
    assert set(phases) == {"operands", "baselines", "calibrate", "offline", "server"} <= set(PHASES)
    assert all(v >= 0 for v in phases.values())


def test_time_group_too_fast_checked_against_the_cold_bound():
    from cudal2.harness.bounds import GpuPeak

    slow = GpuPeak("slow", 1e-3, 1e-3, 1 << 30, "test")     # 32*48*64*2 flop at 1 GFLOP/s: 197 us
    out, _ = _time_group(FakeGpu(), {"cand0": 1.0, "torch": 20.0}, peak=slow)
    assert out["cand0"]["status"] == "too_fast" and "lower bound" in out["cand0"]["detail"]


def test_time_group_catches_a_kernel_that_cheats_while_timed():
    out, _ = _time_group(FakeGpu(), {"cand0": 10.0, "torch": 20.0}, wrong_from_set=30)
    assert out["cand0"]["status"] == "wrong" and "timed output wrong" in out["cand0"]["detail"]


def test_time_group_launch_error_and_unusable_baselines():
    from cudal2.harness import bounds
    from cudal2.harness.baselines import BaselineError
    from cudal2.harness.measure import time_group
    from cudal2.harness.types import EvalRequest, Shape

    gpu = FakeGpu({"cand0": 5.0, "torch": 5.0, "cublas_nn": 5.0})
    kernel = _kernels(gpu)

    def unavailable(name, pool, verify):
        raise BaselineError("no cuBLASLt algorithm")

    def wrong(name, pool, verify):
        return lambda a, b_rr, b_rc, c: (c.zero_(), 0)[1]

    notes = {}
    out = time_group({"cand0": kernel("cand0")},
                     {"torch": lambda n, p, v: kernel(n), "cublaslt_heuristic": unavailable,
                      "cublas_nn": wrong},
                     EvalRequest("x", Shape(16, 16, 16)), acc="f32", device="cpu",
                     peak=bounds.peak_for_name("H100"), notes=notes, backend=gpu, l2_bytes=1 << 16)
    assert out["cand0"]["status"] == "ok"
    assert set(out["cand0"]["timings"]["offline"]) == {"candidate", "torch"}
    assert notes["cublaslt_heuristic"] == "unavailable: no cuBLASLt algorithm"
    assert notes["cublas_nn"].startswith("dropped:")
    gpu = FakeGpu({"cand0": 5.0})
    out = time_group({"cand0": _kernels(gpu, status=719)("cand0")}, {},
                     EvalRequest("x", Shape(16, 16, 16)), acc="f32", device="cpu",
                     peak=bounds.peak_for_name("H100"), notes={}, backend=gpu, l2_bytes=1 << 16)
    assert out["cand0"]["status"] == "launch_error" and "719" in out["cand0"]["detail"]


def test_time_group_e2e_hook_fills_its_own_keys():
    from cudal2.harness import bounds
    from cudal2.harness.measure import time_group
    from cudal2.harness.types import EvalRequest, Shape

    gpu = FakeGpu({"cand0": 5.0, "torch": 10.0})
    kernel = _kernels(gpu)
    e2e = {"timings": {"eager_latency": {"cudal2": {"median_us": 9.0}, "torch": {"median_us": 10.0}}},
           "speedups": {"eager_latency": {"cudal2": {"median": 1.1, "lo": 1.0, "hi": 1.2, "n": 5}}},
           "session": {"rounds": 5}}
    out = time_group({"cand0": kernel("cand0")}, {"torch": lambda n, p, v: kernel(n)},
                     EvalRequest("x", Shape(16, 16, 16), modes=("offline", "e2e")), acc="f32",
                     device="cpu", peak=bounds.peak_for_name("H100"), notes={}, backend=gpu,
                     l2_bytes=1 << 16, e2e=lambda name, us: e2e)
    r = out["cand0"]
    assert r["timings"]["e2e_eager_latency"]["candidate"]["median_us"] == 9.0
    assert r["speedups"]["e2e_eager_latency"] == {"torch": 1.1}
    assert r["stats"]["e2e_eager_latency"]["speedup"]["torch"]["lo"] == 1.0


def test_mode_keys():
    from cudal2.harness.measure import mode_keys
    from cudal2.harness.types import EvalRequest, Shape

    r = EvalRequest("x", Shape(1, 1, 1), modes=("offline", "server", "e2e", "wall"),
                    server_gaps_ms=(1, 10))
    assert mode_keys(r) == ["offline", "server_1ms", "server_10ms", "e2e_eager_throughput",
                            "e2e_eager_latency", "e2e_graph_throughput", "e2e_graph_latency", "wall"]
    assert KT.gap_key(0.5) == "server_0.5ms"


def test_cold_lower_bound_charges_operands_to_hbm():
    from cudal2.harness import bounds

    h100 = bounds.peak_for_name("H100")
    M, N, K = 64, 4096, 4096          # 33 MB of operands fit in L2: warm bound is compute
    warm = bounds.lower_bound_us(M, N, K, h100)
    cold = bounds.lower_bound_us(M, N, K, h100, cold=True)
    assert cold > warm
    assert cold == pytest.approx(max(2 * M * N * K / 989.4e12, 2 * (M * K + K * N) / 3.35e12) * 1e6)
    assert not math.isnan(cold)


# ---- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_kernel_time_of_a_tiny_gemm_is_gpu_time_not_host_time():
    """torch.matmul 64x64x64: a few microseconds of GPU work behind a longer host path. Per-call
    events measured 17-36 us for it on the first H100 campaign; kernel time must not include the
    host path: it stays below the host's own per-call time, and the spin kept the queue full."""
    import time

    import torch

    be = KT.CudaKernelBackend()
    n = KT.n_operand_sets(2 * (64 * 64 * 2), be.l2_bytes)
    a = torch.randn(n, 64, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(n, 64, 64, device="cuda", dtype=torch.float16)
    c = torch.empty(64, 64, device="cuda", dtype=torch.float16)
    f = {"torch": lambda i: torch.matmul(a[i], b[i], out=c), "again": lambda i: torch.matmul(a[i], b[i], out=c)}
    res = KT.time_kernels(f, KT.KernelTimeConfig(), be, n_sets=n, pairs=[("again", "torch")])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(200):
        f["torch"](i % n)
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    kt = res.time("torch").median
    assert 0 < kt < host_us, (kt, host_us)
    r = res.ratio("again", "torch")
    assert r.lo <= 1.0 <= r.hi or abs(r.median - 1.0) < 0.03, r   # the same call against itself
    assert res.session_dict()["calls_per_sample"] > 10       # ~0.5 ms of a few-us kernel


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(64, 64, 64), (256, 256, 256)])
def test_flush_and_rotation_time_the_same_cold_gemm_on_gpu(mnk):
    """The two cold methods of kerneltime.cold_plan must measure the same thing before the rule
    may pick either: torch.matmul timed by rotation (sets > 3x L2) and by an L2 flush before
    each sample (N + 1 sets), one session after the other: the medians within 5%."""
    import torch

    M, N, K = mnk
    be = KT.CudaKernelBackend()
    bps = 2 * (M * K + K * N)
    n_rot = KT.n_operand_sets(bps, be.l2_bytes)
    cfg = KT.KernelTimeConfig(precall=True, sample_us=200.0, max_calls=64, min_rounds=10,
                              max_rounds=30)
    a = torch.randn(n_rot, M, K, device="cuda").half()
    b = torch.randn(n_rot, K, N, device="cuda").half()
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    res = {}
    for method, n in (("rotate", n_rot), ("flush", cfg.max_calls + 1)):
        f = {method: lambda i: torch.matmul(a[i], b[i], out=c)}
        res[method] = KT.time_kernels(f, dataclasses_replace(cfg, cold=method), be, n_sets=n)
    t_rot, t_flush = res["rotate"].time("rotate").median, res["flush"].time("flush").median
    assert abs(t_flush / t_rot - 1.0) < 0.05, (t_rot, t_flush)


@pytest.mark.gpu
def test_screen_and_finals_on_gpu(tmp_path):
    """Screening ranks two template builds in one worker; finals time the better one against
    the baselines; rows land in the DB with their stage."""
    from cudal2.core.build import build
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import ScreenCandidate, evaluate, screen
    from cudal2.harness.types import EvalRequest, Shape
    from cudal2.templates import FAMILIES
    from cudal2.core.toolchain import detect_arch

    arch = detect_arch()
    fam = FAMILIES["mma"]
    cands = []
    for cfg in (fam.default(), fam.config(BM=64, BN=64, WM=32, WN=32)):
        spec = fam.build_spec(cfg, arch)
        cands.append(ScreenCandidate(spec.source, build(spec), origin="test"))
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(1024, 1024, 1024)
    rows, ref = screen(shape, cands, arch=arch, db=db)
    assert [r.stage for r in rows] == ["screen", "screen"]
    assert all(r.status == "ok" for r in rows), [r.detail for r in rows]
    assert ref["torch_us"] > 0
    best = min(rows, key=lambda r: r.timings["screen"]["candidate"]["median_us"])
    src = next(c.source for c in cands if c.build.key and best.source_sha)
    ev = evaluate(EvalRequest(src, shape, arch=arch, modes=("offline", "e2e")), db=db)
    assert ev.status == "ok" and ev.stage == "final", ev.detail
    assert "e2e_eager_throughput" in ev.timings
    assert db.baseline_choices()          # cuBLASLt's autotuned choice recorded once


# ---- cold operands: rotation or an L2 flush (kerneltime.cold_plan) -------------------------------

def test_cold_plan_picks_the_cheaper_method_and_records_its_estimate():
    l2 = 50 << 20
    tiny = 2 * (64 * 64 + 64 * 64)                   # 64x64x64: 16 KiB a set, 9600 sets to rotate
    finals = KT.cold_plan(tiny, l2, samples=6 * KT.FINAL_CONFIG.min_rounds,
                          max_calls=KT.FINAL_CONFIG.max_calls)
    # a finals session's flushes (36 x 100 MiB) move more than filling 3x L2 of sets once
    assert finals.method == "rotate" and finals.n_sets == KT.n_operand_sets(tiny, l2) == 9600
    assert finals.flush_bytes > finals.rotate_bytes
    few = KT.cold_plan(tiny, l2, samples=1, max_calls=64)
    assert few.method == "flush" and few.n_sets == 65 and few.rotate_sets == 9600
    assert few.flush_bytes < few.rotate_bytes
    # the threshold: flush below the break-even sample count, rotate from it on
    per_sample = KT.FLUSH_L2_MULTIPLE * l2
    fill = 65 * tiny * KT.ROTATE_FILL_BYTES_PER_BYTE
    even = (finals.rotate_bytes - fill) / per_sample
    assert KT.cold_plan(tiny, l2, samples=int(even) - 1, max_calls=64).method == "flush"
    assert KT.cold_plan(tiny, l2, samples=int(even) + 1, max_calls=64).method == "rotate"
    big = 2 * (4096 * 4096 * 2)                      # 4096^3: 3 sets rotate, fewer than a flush needs
    assert KT.cold_plan(big, l2, samples=1, max_calls=64).method == "rotate"
    hot = KT.cold_plan(tiny, l2, "hot", samples=36, max_calls=64)
    assert hot.method == "hot" and hot.n_sets == 1
    assert set(finals.to_dict()) >= {"method", "operand_sets", "est_rotate_bytes", "est_flush_bytes"}
    with pytest.raises(ValueError, match="cold"):
        KT.KernelTimeConfig(cold="warm")


class LoggingGpu(FakeGpu):
    """FakeGpu that logs the stream's order: flush, spin, record (events), call (with its set)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log = []

    def call(self, name, i=0):
        self.log.append(("call", name, i))
        super().call(name, i)

    def flush_l2(self):
        self.log.append(("flush",))
        super().flush_l2()

    def spin(self, us):
        self.log.append(("spin",))
        super().spin(us)

    def record(self):
        self.log.append(("record",))
        return super().record()


def _samples(log):
    """Each timed sample as (ops before its start event since the previous stop, ops inside)."""
    out, before, inside, open_ = [], [], None, False
    for op in log:
        if op[0] == "record":
            if not open_:
                inside, open_ = [], True
            else:
                out.append((before, inside))
                before, open_ = [], False
        elif open_:
            inside.append(op)
        else:
            before.append(op)
    return out


def test_flush_mode_flushes_before_each_sample_and_never_inside_the_bracket():
    gpu = LoggingGpu({"cand": 3.0, "base": 4.0}, {"cand": 10.0, "base": 10.0})
    cal = KT.Calibration({"cand": 3.0, "base": 4.0}, {"cand": 10.0, "base": 10.0}, calls=8,
                         spin_us={"cand": 200.0, "base": 200.0})
    cfg = KT.KernelTimeConfig(precall=True, cold="flush", min_rounds=4, max_rounds=4, warmup_ms=0.001)
    gpu.log.clear()
    res = KT.time_kernels(fns(gpu, ["cand", "base"]), cfg, gpu, n_sets=9, calibration=cal,
                          pairs=[("base", "cand")])
    assert res.ratio("base", "cand").median == pytest.approx(4.0 / 3.0)
    samples = _samples(gpu.log[next(i for i, op in enumerate(gpu.log) if op[0] == "flush"):])
    assert len(samples) == 8 and res.calls_per_sample == 8
    for before, inside in samples:
        assert [op[0] for op in before][:2] == ["flush", "spin"]      # flush, then the spin
        assert all(op[0] == "call" for op in inside) and len(inside) == 8   # no flush inside
        pre = [op[2] for op in before if op[0] == "call"]
        sets = [op[2] for op in inside] + pre
        assert len(set(sets)) == 9              # the pre-call's set and 8 timed ones: all distinct
    assert res.session_dict()["cold"] == "flush"
    # too few sets for the calls: a flush session caps the calls (N + 1 sets) ...
    capped = KT.time_kernels(fns(gpu, ["cand"]), cfg, gpu, n_sets=5, calibration=cal)
    assert capped.calls_per_sample == 4
    # ... and the rotating default never flushes in the offline bracket
    gpu.log.clear()
    KT.time_kernels(fns(gpu, ["cand"]), dataclasses_replace(cfg, cold="rotate"), gpu, n_sets=9,
                    calibration=cal)
    assert not [op for op in gpu.log if op[0] == "flush"]


def dataclasses_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


def test_a_retaken_sample_moves_on_to_fresh_operand_sets():
    """A starved sample is taken again on the next sets: the failed attempt pulled its own sets
    into L2, so taking it again on them would time warm operands."""
    gpu = LoggingGpu({"k": 3.0}, {"k": 15.0})
    cal = KT.Calibration({"k": 3.0}, {"k": 15.0}, calls=4, spin_us={"k": 5.0})
    gpu.log.clear()
    res = KT.time_kernels(fns(gpu, ["k"]), KT.KernelTimeConfig(min_rounds=2, max_rounds=2,
                                                               warmup_ms=0.001),
                          gpu, n_sets=1000, calibration=cal)
    assert res.starved >= 1
    timed = [[op[2] for op in inside] for _, inside in _samples(gpu.log)]
    seen = [s for sample in timed for s in sample]
    assert len(seen) == len(set(seen))           # no set timed twice, retakes included


# ---- the export bar stops a hopeless session (KernelTimeConfig.stop_below) ------------------------

def test_offline_rounds_stop_once_no_candidate_can_reach_the_bar():
    rng = random.Random(5)

    class Noisy(FakeGpu):
        def call(self, name, i=0):
            base = {"cand0": 10.0, "cand1": 11.0, "base0": 9.0, "base1": 12.0}[name]
            self.gpu_us[name] = base * (1 + 0.02 * rng.gauss(0, 1))
            super().call(name, i)

    names = ["cand0", "cand1", "base0", "base1"]
    pairs = [(b, c) for c in ("cand0", "cand1") for b in ("base0", "base1")]
    cfg = KT.KernelTimeConfig(sample_us=10.0, min_rounds=6, max_rounds=60, target=0.0001,
                              budget_s=100.0, stop_below=1.02)
    gpu = Noisy({n: 1.0 for n in names})
    res = KT.time_kernels(fns(gpu, names), cfg, gpu, n_sets=2, pairs=pairs)
    assert res.stopped == KT.STOPPED_BELOW_BAR and res.rounds < 60
    d = res.session_dict()
    assert set(d["below_bar"]) == {"cand0", "cand1"}
    for c, why in d["below_bar"].items():
        assert why["baseline"] == "base0" and why["hi"] < 1.02 and why["bar"] == 1.02
        assert res.ratio("base0", c).hi < 1.02
    # without the bar the same session runs to its cap
    gpu = Noisy({n: 1.0 for n in names})
    full = KT.time_kernels(fns(gpu, names), dataclasses_replace(cfg, stop_below=None), gpu,
                           n_sets=2, pairs=pairs)
    assert full.stopped == "max_rounds" and full.rounds == 60


def test_a_candidate_that_can_reach_the_bar_keeps_the_session_going():
    """One finalist above the bar: the session runs exactly as without the rule (same rounds,
    same numbers), however hopeless the other finalist is."""
    def run(stop_below):
        rng = random.Random(7)

        class Noisy(FakeGpu):
            def call(self, name, i=0):
                base = {"win": 8.0, "lose": 20.0, "base": 9.0}[name]
                self.gpu_us[name] = base * (1 + 0.02 * rng.gauss(0, 1))
                super().call(name, i)

        gpu = Noisy({"win": 1.0, "lose": 1.0, "base": 1.0})
        cfg = KT.KernelTimeConfig(sample_us=10.0, min_rounds=6, max_rounds=30, target=0.0001,
                                  budget_s=100.0, stop_below=stop_below)
        return KT.time_kernels(fns(gpu, ["win", "lose", "base"]), cfg, gpu, n_sets=2,
                               pairs=[("base", "win"), ("base", "lose")])
    gated, plain = run(1.02), run(None)
    assert gated.stopped == plain.stopped == "max_rounds" and gated.rounds == plain.rounds
    assert gated.per_round == plain.per_round
    assert gated.ratio("base", "win").lo > 1.02


def test_time_group_gated_stops_below_the_bar_and_leaves_a_winner_alone():
    from cudal2.harness import bounds
    from cudal2.harness.measure import time_group
    from cudal2.harness.types import EvalRequest, Shape

    def group(durations, gate):
        rng = random.Random(11)

        class Noisy(FakeGpu):                 # 1% noise: intervals never tight at 1e-9
            def call(self, name, i=0):
                self.gpu_us[name] = durations[name] * (1 + 0.01 * rng.gauss(0, 1))
                super().call(name, i)

        gpu = Noisy(dict(durations))
        kernel = _kernels(gpu)
        req = EvalRequest("x", Shape(32, 48, 64), gate_margin=gate)
        cands = {n: kernel(n) for n in durations if n.startswith("cand")}
        base = {n: (lambda name, pool, verify: kernel(name)) for n in durations
                if not n.startswith("cand")}
        return time_group(cands, base, req, acc="f32", device="cpu",
                          peak=bounds.peak_for_name("H100"), notes={}, backend=gpu,
                          l2_bytes=64 << 10,
                          kernel_config=KT.KernelTimeConfig(precall=True, target=1e-9,
                                                            max_rounds=20))

    lose = group({"cand0": 12.0, "torch": 10.0, "cublas_nn": 11.0}, 0.02)["cand0"]
    s = lose["stats"]["offline"]["session"]
    assert s["stopped"] == KT.STOPPED_BELOW_BAR and s["rounds"] == 6
    assert s["config"]["stop_below"] == pytest.approx(1.02)
    assert lose["gate"]["passed"] is False and lose["cold_operands"]["method"] == "rotate"
    ungated = group({"cand0": 12.0, "torch": 10.0, "cublas_nn": 11.0}, None)["cand0"]
    assert ungated["stats"]["offline"]["session"]["stopped"] != KT.STOPPED_BELOW_BAR
    win = group({"cand0": 8.0, "torch": 10.0, "cublas_nn": 11.0}, 0.02)["cand0"]
    win_plain = group({"cand0": 8.0, "torch": 10.0, "cublas_nn": 11.0}, None)["cand0"]
    assert win["timings"] == win_plain["timings"] and win["stats"]["offline"]["speedup"] == \
        win_plain["stats"]["offline"]["speedup"]
    assert win["gate"]["passed"] is True


# ---- the finals' GPU path (measure._measure_group) on CPU fakes ----------------------------------

def test_measure_group_phases_cover_its_wall_time_and_share_one_reference(monkeypatch):
    """Two candidates of one shape through measure_group's own code path, on CPU tensors and a
    fake GPU: the phases (PHASES, none overlapping) and 'other' sum to the group's wall time;
    the autotune is its own phase, not counted in 'baselines'; the main shape's references are
    computed once for the group; the cold method is recorded."""
    import time

    import torch

    from cudal2.harness import bounds, check, measure
    from cudal2.harness.types import EvalRequest, Shape

    gpu = FakeGpu({"cand0": 5.0, "cand1": 6.0, "torch": 10.0, "cublaslt_autotuned": 9.0},
                  l2_bytes=1 << 16)
    seen_inputs = {}

    class Lib:
        def __init__(self, name):
            self.name = name

        def workspace_bytes(self, M, N, K, opts):
            return 64 if self.name == "cand1" else 0      # draws differ per kernel: inputs must not

    def so_launcher(lib, opts):
        def launch(ops):
            if (ops.M, ops.N, ops.K) == (32, 48, 64):
                seen_inputs.setdefault(lib.name, []).append(ops.a.clone())
            ops.c.copy_((ops.a.float() @ ops.b.float()).half())
            return 0
        return launch

    def kernel(name):
        def fn(a, b_rr, b_rc, c):
            gpu.call(name)
            c.copy_((a.float() @ b_rr.float()).half())
            return 0
        return fn

    class Runners:
        def __init__(self, libs, M, N, K, acc, layout):
            self.notes = {}

        def autotune(self, pool, gpu_name, *, verify=None, known=None, backend=None, cold="rotate"):
            time.sleep(0.2)
            return {"key": f"{gpu_name}|lt", "index": 0, "source": "results DB"}

        def launcher(self, name):
            return kernel(name)

        def close(self):
            pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(measure, "DEVICE", "cpu")
    monkeypatch.setattr(measure, "_load", lambda so, o: (Lib(so), {"acc": "f32", "layout": "RR"}, None))
    monkeypatch.setattr(measure, "_so_launcher", so_launcher)
    monkeypatch.setattr(measure, "_candidate_launch", lambda lib, lay, M, N, K, o, ws: kernel(lib.name))
    monkeypatch.setattr(measure, "gpu_env", lambda: {"gpu": "Fake GPU"})
    monkeypatch.setattr(measure, "_env", lambda before: {"gpu": "Fake GPU"})
    monkeypatch.setattr(measure.Guard, "active", classmethod(lambda cls: None))
    monkeypatch.setattr(measure.bounds, "device_peak", lambda: bounds.peak_for_name("H100"))
    monkeypatch.setattr(measure.KT, "CudaKernelBackend", lambda: gpu)
    monkeypatch.setattr(measure, "BaselineRunners", Runners)
    req = EvalRequest("x", Shape(32, 48, 64), baselines=("torch", "cublaslt_autotuned"))
    out = measure.measure_group(["cand0", "cand1"], [req, req], baseline_libs={"cublas": "-"})
    assert [r["status"] for r in out] == ["ok", "ok"], [r["detail"] for r in out]
    env = out[0]["env"]
    ph = env["phases_s"]
    assert list(ph) == [k for k in measure.PHASES if k in ph]            # named once, in order
    assert {"provenance", "load", "init", "reference", "correctness", "operands", "baselines",
            "autotune", "calibrate", "offline", "other"} <= set(ph)
    assert sum(ph.values()) == pytest.approx(env["measure_s"], abs=2e-3)
    assert ph["autotune"] >= 0.2 and ph["baselines"] < 0.2               # nested, not doubled
    assert ph["other"] < 0.1 * env["measure_s"]
    # the main shape's 8 references (3 seeds x 0/1 and random, reuse, padded) once for both
    assert env["shared_inputs"]["references_computed"] == 8
    assert len(seen_inputs["cand0"]) == len(seen_inputs["cand1"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(seen_inputs["cand0"], seen_inputs["cand1"]))
    assert env["cold_operands"]["method"] == "rotate"
    assert env["lt_autotune_choice"] == {"key": "Fake GPU|lt", "source": "results DB"}
    assert out[1]["env"] is env
