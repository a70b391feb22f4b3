"""Noise in the kernel timer's sessions, on a fake GPU (no hardware): each round's SM clock,
power draw and throttle reasons are recorded; a round with a severe throttle reason or a deep
clock dip is discarded, a steady power cap is not; a session whose baselines sit apart beyond
their intervals is flagged, and the campaign's summary counts both."""
import pytest

from cudal2.harness.types import Evaluation, Shape
from cudal2.timing import kerneltime as KT
from tests.test_kerneltime import FakeGpu


class PoweredGpu(FakeGpu):
    """FakeGpu with a power reading per round: `reasons(r)` gives round r's throttle reasons."""

    def __init__(self, reasons, **kw):
        super().__init__(**kw)
        self.reasons, self.reads_power = reasons, 0

    def power_state(self):
        r = self.reads_power
        self.reads_power += 1
        return {"power_w": 690.0 + r % 3, "throttle": self.reasons(r)}


def _time(gpu, names, **cfg):
    calls = {n: (lambda n: (lambda i: gpu.call(n, i)))(n) for n in names}
    return KT.time_kernels(calls, KT.KernelTimeConfig(min_rounds=8, max_rounds=8, **cfg), gpu)


def test_rounds_record_clock_power_and_throttle_and_severe_ones_are_discarded():
    # rounds 2 and 5 saw a thermal slowdown; every round sits at the power cap
    gpu = PoweredGpu(lambda r: ["sw_power_cap"] + (["hw_thermal"] if r in (2, 5) else []),
                     gpu_us={"a": 10.0, "b": 20.0}, clocks=lambda n: 1755.0)
    kt = _time(gpu, ["a", "b"])
    sess = kt.session_dict()
    assert sess["rounds"] == 8 and sess["discarded_throttled"] == 2
    pr = sess["per_round"]
    assert pr["kept"] == [r not in (2, 5) for r in range(8)]
    assert pr["sm_clock_mhz"] == [1755.0] * 8 and len(pr["power_w"]) == 8
    assert pr["throttle"][2] == ["sw_power_cap", "hw_thermal"] and sess["power_w"]["max"] == 692.0
    assert kt.ratio("b", "a").median == pytest.approx(2.0)
    # a steady power cap alone discards nothing
    kt2 = _time(PoweredGpu(lambda r: ["sw_power_cap"], gpu_us={"a": 10.0}), ["a"])
    assert kt2.session_dict()["discarded_throttled"] == 0


def test_a_clock_dip_is_discarded_and_a_backend_without_power_still_works():
    reads = []

    def clocks(n):
        reads.append(n)
        return 1200.0 if 12 <= len(reads) <= 13 else 1980.0     # one round's reads dip 40%
    kt = _time(FakeGpu(gpu_us={"a": 10.0, "b": 10.0}, clocks=clocks), ["a", "b"])
    sess = kt.session_dict()
    assert sess["discarded_throttled"] >= 1 and sess["power_w"] is None
    assert sess["per_round"]["throttle"] == [[]] * 8
    assert sess["per_round"]["kept"].count(False) == sess["discarded_throttled"]


def test_throttle_bits_decode_to_names():
    assert KT.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    assert set(KT.SEVERE_THROTTLE) & {"sw_power_cap", "gpu_idle"} == set()


def test_baselines_that_disagree_beyond_their_intervals_are_flagged():
    from cudal2.harness.measure import baseline_agreement
    far = _time(FakeGpu(gpu_us={"cublas_nn": 20.0, "cublas_tn": 23.0, "cand": 10.0}),
                ["cublas_nn", "cublas_tn", "cand"])
    ag = baseline_agreement(far, ["cublas_nn", "cublas_tn"])
    assert ag["disagree"] and ag["fastest"] == "cublas_nn" and ag["spread"] == pytest.approx(0.15)
    near = _time(FakeGpu(gpu_us={"cublas_nn": 20.0, "cublas_tn": 20.1, "cand": 10.0}),
                 ["cublas_nn", "cublas_tn", "cand"])
    assert not baseline_agreement(near, ["cublas_nn", "cublas_tn"])["disagree"]
    assert baseline_agreement(near, ["cublas_nn"]) is None


def test_campaign_summary_counts_throttled_rounds_and_disagreeing_shapes():
    from cudal2.runs.campaign import noise_summary

    def row(i, shape, disagree, discarded):
        return Evaluation(status="ok", source_sha=f"s{i}", shape=shape, arch="sm_90a", stage="final",
                          id=i, stats={"offline": {
                              "session": {"rounds": 10, "discarded_throttled": discarded,
                                          "sm_clock_mhz": {"min": 1440.0, "max": 1830.0},
                                          "power_w": {"min": 650.0, "max": 700.0}},
                              "baselines": {"disagree": disagree}}})
    a, b = Shape(8192, 8192, 8192), Shape(64, 64, 64)
    nz = noise_summary([row(1, a, True, 2), row(2, a, True, 1), row(3, b, False, 0)])
    assert nz["rounds"] == 30 and nz["discarded_throttled"] == 3
    assert nz["baselines_disagree"] == [str(a)] and nz["sm_clock_mhz"] == [1440.0, 1830.0]
