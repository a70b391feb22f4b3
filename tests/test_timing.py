"""The timing harness's scheduling core on CPU, with a fake clock (no CUDA, no timing asserts)."""
import math
import random
import statistics

import pytest

from cudal2.harness import timing
from cudal2.harness.timing import TimingConfig, run_schedule


class FakeBackend:
    """A device whose calls take a known time on a simulated clock."""

    def __init__(self, durations):
        self.t = 0.0
        self.durations = durations          # name -> seconds per call
        self.sleeps = []
        self.flushes = 0
        self.events = []                    # ("sync"|"sleep"|"flush"|"start"|"call", ...)
        self.current = None

    # the callables call this to "run" on the device
    def call(self, name, b):
        self.events.append(("call", name, b))
        self.t += self.durations[name]

    def now(self):
        return self.t

    def synchronize(self):
        self.events.append(("sync",))

    def sleep(self, s):
        self.sleeps.append(s)
        self.events.append(("sleep", s))
        self.t += s

    def flush_l2(self):
        self.flushes += 1
        self.events.append(("flush",))

    def start(self):
        return self.t

    def stop(self, token):
        return self.t - token

    def elapsed_us(self, handle):
        return handle * 1e6

    def capture(self, fn, calls):
        def replay():
            for _ in range(calls):
                fn()
        return replay


def _callables(be, names):
    return {n: (lambda b, n=n: be.call(n, b)) for n in names}


def test_stats_median_and_quantiles_match_numpy_definition():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    s = timing.summarize(xs)
    assert s.median_us == 5.5
    assert s.n == 10 and s.min_us == 1.0 and s.mean_us == 5.5
    # numpy linear interpolation: p10 at position 0.9 -> 1.9, p90 at 8.1 -> 9.1
    assert s.p10_us == pytest.approx(1.9)
    assert s.p90_us == pytest.approx(9.1)
    assert timing.summarize([3.0]).p90_us == 3.0
    with pytest.raises(ValueError):
        timing.summarize([])


def test_arrival_gaps_offline_zero_server_exponential_mean():
    rng = random.Random(1)
    assert timing.arrival_gaps(5, "offline", 100, rng) == [0.0] * 5
    assert timing.arrival_gaps(5, "wall", 100, rng) == [0.0] * 5
    gaps = timing.arrival_gaps(20000, "server", 500.0, random.Random(2))
    assert all(g >= 0 for g in gaps)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 500.0, rel=0.05)
    # exponential: standard deviation equals the mean, median = ln2 * mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 500.0, rel=0.07)
    assert statistics.median(gaps) == pytest.approx(math.log(2) / 500.0, rel=0.07)
    capped = timing.arrival_gaps(1000, "server", 1.0, random.Random(3), max_gap_s=0.01)
    assert max(capped) <= 0.01


def test_interleaving_is_random_and_fair():
    rng = random.Random(0)
    names = ["a", "b", "c", "d"]
    firsts = {n: 0 for n in names}
    orders = set()
    for _ in range(400):
        o = timing.interleaved_order(names, rng)
        assert sorted(o) == names
        firsts[o[0]] += 1
        orders.add(tuple(o))
    assert len(orders) > 12                       # many of the 24 permutations appear
    assert all(60 < c < 140 for c in firsts.values())


def test_offline_schedule_times_each_callable_and_verifies_each_set():
    be = FakeBackend({"cand": 10e-6, "torch": 20e-6})
    seen_verify, prepared = [], []
    cfg = TimingConfig(mode="offline", warmup_ms=1.0, rounds_per_set=4, n_sets=3)
    res = run_schedule(_callables(be, ["cand", "torch"]), cfg, be, n_buffers=2,
                       verify=lambda n, b: seen_verify.append((n, b)),
                       prepare_set=prepared.append)
    assert res.stats["cand"].median_us == pytest.approx(10.0)
    assert res.stats["torch"].median_us == pytest.approx(20.0)
    assert res.stats["cand"].n == 12 and res.stats["torch"].n == 12
    assert be.sleeps == [] and res.failures == []
    # buffers rotate per repetition set and every callable is verified after each set
    assert prepared == [0, 1, 0]
    assert sorted(seen_verify) == sorted([(n, b) for b in (0, 1, 0) for n in ("cand", "torch")])
    # warm-up lasted at least warmup_ms per callable before the first timed call
    timed_calls = [e for e in be.events if e[0] == "call"]
    warm = len(timed_calls) - 24
    assert warm * 15e-6 >= 2 * 1e-3 - 30e-6


def test_timed_calls_use_the_set_buffer():
    be = FakeBackend({"x": 1e-6})
    cfg = TimingConfig(warmup_ms=0.0, rounds_per_set=2, n_sets=3)
    run_schedule(_callables(be, ["x"]), cfg, be, n_buffers=3)
    timed = [e[2] for e in be.events if e[0] == "call"][-6:]
    assert timed == [0, 0, 1, 1, 2, 2]


def test_verify_failures_are_reported():
    be = FakeBackend({"cand": 1e-6, "torch": 1e-6})
    cfg = TimingConfig(warmup_ms=0.0, rounds_per_set=1, n_sets=2)
    res = run_schedule(_callables(be, ["cand", "torch"]), cfg, be,
                       verify=lambda n, b: "mismatch" if n == "cand" else None)
    assert res.failures == ["cand@set0: mismatch", "cand@set1: mismatch"]


def test_server_mode_sleeps_exponential_gaps_with_gpu_idle():
    be = FakeBackend({"a": 5e-6, "b": 5e-6})
    cfg = TimingConfig(mode="server", target_qps=1000.0, warmup_ms=0.0, rounds_per_set=50,
                       n_sets=4, seed=7)
    res = run_schedule(_callables(be, ["a", "b"]), cfg, be)
    assert len(be.sleeps) == 400
    assert statistics.fmean(be.sleeps) == pytest.approx(1e-3, rel=0.2)
    # every sleep is preceded by a synchronize: the device is idle during the gap
    for i, e in enumerate(be.events):
        if e[0] == "sleep":
            assert be.events[i - 1] == ("sync",)
    # the gap is not part of the measured time
    assert res.stats["a"].median_us == pytest.approx(5.0)


def test_wall_mode_uses_host_clock_between_synchronizes():
    be = FakeBackend({"a": 7e-6})
    cfg = TimingConfig(mode="wall", warmup_ms=0.0, rounds_per_set=3, n_sets=1)
    res = run_schedule(_callables(be, ["a"]), cfg, be)
    assert res.stats["a"].median_us == pytest.approx(7.0)
    calls = [i for i, e in enumerate(be.events) if e[0] == "call"][-3:]
    for i in calls:
        assert be.events[i - 1] == ("sync",) and be.events[i + 1] == ("sync",)


def test_l2_flush_before_every_timed_call():
    be = FakeBackend({"a": 1e-6, "b": 1e-6})
    cfg = TimingConfig(flush_l2=True, warmup_ms=0.0, rounds_per_set=3, n_sets=2)
    run_schedule(_callables(be, ["a", "b"]), cfg, be)
    assert be.flushes == 12
    for i, e in enumerate(be.events):
        if e == ("flush",):
            assert be.events[i + 1][0] == "call"


def test_graph_timer_divides_by_captured_calls():
    be = FakeBackend({"a": 3e-6})
    cfg = TimingConfig(timer="graph", graph_calls=8, warmup_ms=0.0, rounds_per_set=2, n_sets=1)
    res = run_schedule(_callables(be, ["a"]), cfg, be)
    assert res.stats["a"].median_us == pytest.approx(3.0)
    assert res.stats["a"].n == 2


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        TimingConfig(mode="fast")
    with pytest.raises(ValueError, match="timer"):
        TimingConfig(timer="cycles")
    with pytest.raises(ValueError, match="target_qps"):
        TimingConfig(mode="server", target_qps=0)
    with pytest.raises(ValueError, match="nothing"):
        run_schedule({}, TimingConfig(), FakeBackend({}))


@pytest.mark.gpu
def test_wall_schedule_and_gpu_env_on_gpu():
    import torch

    from cudal2.timing.kerneltime import CudaKernelBackend
    from cudal2.harness.measure import _WallBackend

    a = [torch.randn(1024, 1024, device="cuda", dtype=torch.float16) for _ in range(2)]
    b = [torch.randn(1024, 1024, device="cuda", dtype=torch.float16) for _ in range(2)]
    out = torch.empty(1024, 1024, device="cuda", dtype=torch.float16)
    fns = {"torch": lambda i: torch.matmul(a[i], b[i], out=out)}
    res = run_schedule(fns, TimingConfig(mode="wall", rounds_per_set=5, n_sets=4),
                       _WallBackend(CudaKernelBackend()), n_buffers=2)
    s = res.stats["torch"]
    assert s.n == 20
    assert 0 < s.p10_us <= s.median_us <= s.p90_us
    assert s.median_us < 1e5          # a 1024^3 fp16 GEMM is nowhere near 0.1 s
    env = timing.gpu_env()
    assert env.get("gpu")


def test_measure_marks_the_worker_poisoned_on_a_cuda_error(monkeypatch):
    """A CUDA error anywhere in measuring (here: the library load) is the kernel's verdict and
    tells the worker to exit after replying; other exceptions stay harness errors."""
    import torch

    from cudal2.harness import measure, worker
    from cudal2.harness.types import EvalRequest, Shape

    req = EvalRequest("x", Shape(16, 16, 16))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker, "_poison_reason", None)

    def illegal(path):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(measure, "load_library", illegal)   # the name measure calls
    out = measure.measure("k.so", req)
    assert out["status"] == "launch_error" and "illegal memory access" in out["detail"]
    assert "illegal memory access" in worker._poison_reason

    monkeypatch.setattr(worker, "_poison_reason", None)
    monkeypatch.setattr(measure, "load_library", lambda p: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        measure.measure("k.so", req)
    assert worker._poison_reason is None
    assert not measure._cuda_error(torch.cuda.OutOfMemoryError("CUDA out of memory"))


@pytest.mark.parametrize("field", ["rounds_per_set", "n_sets", "graph_calls"])
def test_config_error_names_the_field_and_value(field):
    with pytest.raises(ValueError, match=f"TimingConfig.{field} must be >= 1, got 0"):
        TimingConfig(**{field: 0})
    with pytest.raises(ValueError, match="target_qps > 0, got 0"):
        TimingConfig(mode="server", target_qps=0)
