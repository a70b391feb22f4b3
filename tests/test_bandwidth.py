"""The bandwidth ceiling (cudal2/harness/bandwidth.py): the arithmetic of a decode row's achieved
bandwidth, the streaming kernel's build and its C entry points' refusals (no GPU needed), the
fake device's answer, the report's decode section; on a GPU, the ceiling against the device's
theoretical peak.

All timings here are SYNTHETIC except the gpu-marked test's.
"""
import math

import pytest

from cudal2.harness import bandwidth as bw
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.runs import report

H100_CLOCK_KHZ, H100_BUS = 2_619_000, 5120          # cudaDevAttrMemoryClockRate, bus width


def test_decode_arithmetic():
    assert bw.is_decode(1) and bw.is_decode(64) and not bw.is_decode(65) and not bw.is_decode(0)
    # the large operand of a decode row is the weight, K x N fp16
    assert bw.large_operand_bytes(1, 57344, 8192) == 2 * 57344 * 8192
    assert bw.large_operand_bytes(64, 64, 4096) == 2 * 64 * 4096
    assert bw.large_operand_bytes(4096, 64, 128) == 2 * 4096 * 128      # A is the larger one
    assert bw.achieved_gbs(2e9, 1e6) == pytest.approx(2.0)             # 2 GB in 1 s
    assert bw.achieved_gbs(1, 0) is None and bw.fraction(None, 3000) is None
    assert bw.fraction(2850.0, 3000.0) == pytest.approx(0.95) and bw.fraction(1.0, 0) is None
    peak = bw.theoretical_peak_gbs(H100_CLOCK_KHZ, H100_BUS)
    assert peak == pytest.approx(3352.3, abs=0.1)                      # the H100 SXM's 3.35 TB/s
    assert bw.theoretical_peak_gbs(None, H100_BUS) is None
    # 1x57344x8192 (the H200's fused gate_up decode row) at 3.72 TB/s: 252.6 us
    nb = bw.large_operand_bytes(1, 57344, 8192)
    f = bw.decode_figures(1, 57344, 8192, nb / 3720e3, ceiling_gbs=4400.0, peak_gbs=4915.2)
    assert f["gbs"] == pytest.approx(3720.0) and f["of_ceiling"] == pytest.approx(3720 / 4400)
    assert f["of_peak"] == pytest.approx(3720 / 4915.2) and f["bytes"] == nb


def test_ceiling_interval_and_buffer_size():
    c = bw.ceiling(1 << 30, 320.0, 319.0, 322.0)
    assert c["gbs"] == pytest.approx((1 << 30) / 320e3)
    lo, hi = c["ci"]                        # the slow end of the time is the low end of GB/s
    assert lo == pytest.approx((1 << 30) / 322e3) and hi == pytest.approx((1 << 30) / 319e3)
    assert lo < c["gbs"] < hi and c["bytes"] == 1 << 30
    assert bw.buffer_bytes(50 << 20) == 1 << 30                        # H100: 1 GiB > 8 x 50 MiB
    assert bw.buffer_bytes(200 << 20) == 1600 << 20                    # a larger L2: 8 x L2
    assert bw.buffer_bytes(50 << 20, free_bytes=2 << 30) == 512 << 20   # a quarter of what is free
    with pytest.raises(bw.BandwidthError, match="too little"):
        bw.buffer_bytes(50 << 20, free_bytes=512 << 20)
    assert bw.checksum([1, 2, 0xFFFFFFFF]) == 2 and bw.checksum([-1, 1]) == 0


@pytest.mark.compile
def test_the_streaming_kernel_builds_and_refuses_bad_arguments(tmp_path, monkeypatch):
    """Both arches build with zero spills, every load is a 16-byte non-coherent load without L1
    allocation under an evict-first L2 policy, and the launcher refuses bad arguments before it
    touches the device (so this runs without one); the fake device answers the worker task in
    the measurement's shape, the library loaded for real."""
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    from cudal2.core.build import build
    for arch in ("sm_90a", "sm_80"):
        res = build(bw.spec(arch))
        assert res.ok, res.log[-2000:]
        assert res.spills == 0 and [r.function for r in res.resources] == ["cudal2_stream_read_kernel"]
        ptx = res.ptx_path.read_text()
        loads = [ln for ln in ptx.splitlines() if "ld.global" in ln]
        assert loads and all("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32" in ln for ln in loads)
        assert "createpolicy.fractional.L2::evict_first" in ptx
        assert "st.global.u32" in ptx                 # one checksum per CTA: the loads are live
    so = bw.build_stream_read("sm_90a")
    lib = bw.StreamReadLib(so)
    assert lib.threads == 512
    EINVAL = 1                                         # cudaErrorInvalidValue
    assert lib.launch(None, 1 << 20, 16, 1, None) == EINVAL           # no buffer
    assert lib.launch(16, (1 << 20) + 8, 16, 1, None) == EINVAL       # not a multiple of 16 B
    assert lib.launch(16, 1 << 20, 16, 0, None) == EINVAL             # no CTA
    assert lib.launch(24, 1 << 20, 16, 1, None) == EINVAL             # misaligned
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.01")
    m = bw.measure_task(so)
    assert m["status"] == "ok" and m["fake_device"] and m["bytes"] == bw.MIN_BUFFER_BYTES
    assert m["of_peak"] == pytest.approx(0.9) and m["ci"][0] < m["gbs"] < m["ci"][1]
    assert m["source_sha"] and m["method"].startswith("read-only streaming kernel")
    assert "GB/s" in bw.line(m) and "fake device" in bw.line(m)
    assert bw.measure_task(str(tmp_path / "none.so"))["status"] == "error"
    assert bw.line(None) == "stream read: not measured"


def _ev(shape, cand, bases):
    t = {"offline": {"candidate": {"median_us": cand}, **{b: {"median_us": v} for b, v in bases.items()}}}
    return Evaluation(status="ok", source_sha="a" * 64, shape=Shape(*shape), arch="sm_90a", acc="f32",
                      layout="RC", timings=t, origin="tune", env={"gpu": "H100 (synthetic)"})


def test_the_report_gives_each_decode_rows_bandwidth(tmp_path):
    nb = bw.large_operand_bytes(1, 8192, 4096)                         # 64 MiB of weight
    bases = {b: nb / 3000e3 for b in BASELINES}                         # every baseline 3000 GB/s
    bases["cublaslt_autotuned"] = nb / 3100e3                           # the fastest: 3100 GB/s
    rows = report.collect([_ev((1, 8192, 4096), nb / 2800e3, bases),   # ours 2800 GB/s
                           _ev((256, 8192, 4096), 100.0, {b: 90.0 for b in BASELINES})])
    ceiling = {"status": "ok", "gbs": 3200.0, "ci": [3190.0, 3210.0], "bytes": 1 << 30,
               "peak_gbs": 3352.3, "of_peak": 3200 / 3352.3}
    (rec,) = report.decode_table(rows, ceiling)                         # M = 256 is no decode row
    assert rec["shape"] == (1, 8192, 4096) and rec["baseline"] == "cublaslt_autotuned"
    assert rec["candidate"]["gbs"] == pytest.approx(2800.0)
    assert rec["candidate"]["of_ceiling"] == pytest.approx(2800 / 3200)
    assert rec["candidate"]["of_peak"] == pytest.approx(2800 / 3352.3)
    assert rec["baseline_figures"]["of_ceiling"] == pytest.approx(3100 / 3200)
    paths = report.write_summary(rows, tmp_path / "offline", mode="offline", bandwidth=ceiling)
    md = paths["summary"].read_text()
    assert "## Decode rows (M <= 64)" in md and "stream read 3200 GB/s [3190, 3210]" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 1x8192x4096 |"))
    assert "| 2800 | 0.875 | 0.835 | cublaslt_autotuned | 3100 | 0.969 |" in line
    # no ceiling in the call: the GB/s still, the fractions blank; e2e (host clock) has no section
    (rec,) = report.decode_table(rows, {"status": "error", "detail": "no GPU"})
    assert rec["candidate"]["gbs"] == pytest.approx(2800.0) and rec["candidate"]["of_ceiling"] is None
    md = report.write_summary(rows, tmp_path / "e2e", mode="e2e_eager").get("summary").read_text()
    assert "Decode rows" not in md
    assert math.isnan(report.geomean([]))


def test_modelbench_takes_the_ceiling_flags():
    import argparse
    from cudal2.runs import modelbench
    p = argparse.ArgumentParser()
    modelbench.configure_parser(p)
    a = p.parse_args(["--model", "x.csv", "--no-ceiling", "--stream-so", "s.so"])
    assert a.no_ceiling and a.stream_so == "s.so"
    assert bw.theoretical_peak_gbs(H100_CLOCK_KHZ, H100_BUS) == pytest.approx(3352.3, abs=0.1)
    assert modelbench.DECODE_MAX_M == bw.DECODE_MAX_M


@pytest.mark.gpu
def test_the_measured_ceiling_is_within_the_devices_theoretical_peak():
    """On a GPU: the streaming kernel, timed by kernel time with its checksum checked every
    round, reaches between half the theoretical peak (memory clock x bus width x 2) and 1.05 of
    it (nothing reads faster than the bus; a ceiling under half would mean the kernel is wrong)."""
    from cudal2.core.toolchain import detect_arch
    m = bw.measure(bw.build_stream_read(detect_arch()))
    assert m["status"] == "ok" and m["peak_gbs"], m
    assert 0.5 < m["gbs"] / m["peak_gbs"] < 1.05, bw.line(m)
    assert m["ci"][0] <= m["gbs"] <= m["ci"][1] and m["bytes"] >= bw.MIN_BUFFER_BYTES // 4
