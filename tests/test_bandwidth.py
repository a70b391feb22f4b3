"""The bandwidth ceiling (cudal2/harness/bandwidth.py): the arithmetic of a decode row's achieved
bandwidth, the streaming kernel's build and its C entry points' refusals (no GPU needed), the
fake device's answer, the report's decode section; on a GPU, the ceiling against the device's
theoretical peak.

All timings here are SYNTHETIC except the gpu-marked test's.
"""
import json
import math
from pathlib import Path

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


# ---- the ceilings table (summary["ceilings"]) -----------------------------------------------------

H200_L2 = 50 << 20
TABLE_KEYS = {"status", "method", "stream_read", "device_copy", "launch_floor", "device",
              "fake_device", "seconds"}


def test_cold_copies_rotate_more_than_eight_l2_between_two_reads_of_one_copy():
    cold = bw.L2_MULTIPLE * H200_L2                                    # 400 MiB
    for nbytes in (16, 8192, 1 << 20, 32 << 20, 100 << 20, cold - 16):
        n = bw.cold_copies(nbytes, H200_L2)
        assert (n - 1) * nbytes > cold and (n - 2) * nbytes <= cold    # enough, and no more
    assert bw.cold_copies(32 << 20, H200_L2) == 14                     # 13 x 32 MiB = 416 MiB > 400
    assert bw.cold_copies(cold, H200_L2) == 1 and bw.cold_copies(1 << 30, H200_L2) == 1
    # capped by a quarter of the free memory (as buffer_bytes), never below one copy
    assert bw.cold_copies(32 << 20, H200_L2, free_bytes=1 << 30) == 8
    assert bw.cold_copies(32 << 20, H200_L2, free_bytes=64 << 20) == 1
    # the decode rows' distinct weights, rounded down to 16 B, with the large buffer, ascending
    shapes = [(1, 57344, 8192), (64, 64, 64), (65, 4096, 4096), (1, 57344, 8192), (3, 5, 7)]
    assert bw.table_sizes(shapes, 1 << 30) == [64, 8192, 2 * 57344 * 8192, 1 << 30]
    assert bw.table_sizes([(256, 256, 256)]) == []


def test_ceiling_at_takes_the_exact_size_else_the_nearest_in_log_size():
    rows = [bw.stream_entry(nb, nb / 1e6, nb / 1.01e6, nb / 0.99e6, 1) for nb in (1 << 20, 32 << 20, 1 << 30)]
    table = {"status": "ok", "stream_read": rows}
    assert bw.ceiling_at(table, 32 << 20) is rows[1]
    assert bw.ceiling_at(table, 3 << 20) is rows[0]                    # log: 3 is nearer 1 than 32
    assert bw.ceiling_at(table, 8 << 20) is rows[1]                    # 8 is nearer 32 than 1
    assert bw.ceiling_at(table, 4 << 30) is rows[2] and bw.ceiling_at(table, 1) is rows[0]
    assert bw.ceiling_at(None, 1 << 20) is None and bw.ceiling_at({"stream_read": []}, 1) is None
    assert bw.ceiling_at(table, 0) is None
    e = rows[0]
    assert set(e) == {"bytes", "gbs", "ci", "us", "copies"} and e["gbs"] == pytest.approx(1000.0)
    assert e["ci"][0] < e["gbs"] < e["ci"][1] and set(e["us"]) == {"median", "lo", "hi"}
    c = bw.copy_entry(1 << 30, 500.0, 499.0, 501.0)                    # read + written: 2 x bytes
    assert c["gbs"] == pytest.approx(2 * (1 << 30) / 500e3) and c["bytes"] == 1 << 30


def test_a_table_without_measurements_keeps_its_shape():
    t = bw.empty_table("not_measured", "no GPU in this run")
    assert TABLE_KEYS | {"detail"} == set(t) and t["stream_read"] == []
    assert t["device_copy"]["status"] == t["launch_floor"]["status"] == "not_measured"
    assert bw.ceiling_lines(t)[0].startswith("ceilings: stream read none (not_measured")
    assert bw.ceiling_at(t, 1 << 20) is None


def _check_table(t: dict, sizes: list[int]) -> None:
    assert TABLE_KEYS <= set(t) and set(t) <= TABLE_KEYS | {"detail"}
    assert [e["bytes"] for e in t["stream_read"]] == sorted(sizes)
    for e in t["stream_read"]:
        assert set(e) == {"bytes", "gbs", "ci", "us", "copies"}
        assert e["ci"][0] <= e["gbs"] <= e["ci"][1] and e["us"]["lo"] <= e["us"]["median"] <= e["us"]["hi"]
        assert e["copies"] == bw.cold_copies(e["bytes"], t["device"]["l2_bytes"]) or not t["fake_device"]
    cp = t["device_copy"]
    assert set(cp) == {"bytes", "gbs", "ci", "us"} and cp["ci"][0] <= cp["gbs"] <= cp["ci"][1]


@pytest.mark.compile
def test_the_ceilings_task_answers_on_the_fake_device(tmp_path, monkeypatch):
    """The worker task end to end on the fake device (the libraries loaded for real): the large
    buffer as summary["bandwidth"] was, the table in its exact shape, small sizes ramping (a
    launch in their time), each part failing on its own."""
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.01")
    from cudal2.harness import floor
    so, fso = bw.build_stream_read("sm_90a"), floor.build_launch_floor("sm_90a")
    sizes = [8192, 32 << 20]
    res = bw.ceilings_task(so, fso, None, sizes=sizes)
    big, t = res["bandwidth"], res["ceilings"]
    assert big["status"] == "ok" and big["bytes"] == bw.MIN_BUFFER_BYTES and big["fake_device"]
    assert t["status"] == "ok" and t["fake_device"] and t["seconds"] >= 0
    _check_table(t, sizes + [bw.MIN_BUFFER_BYTES])
    small, mid, large = t["stream_read"]
    assert small["copies"] == bw.cold_copies(8192, t["device"]["l2_bytes"]) > 1000 and large["copies"] == 1
    assert small["gbs"] < mid["gbs"] < large["gbs"]                    # the ramp
    assert large["gbs"] == pytest.approx(big["gbs"])
    assert bw.ceiling_at(t, 30 << 20) is mid
    lf = t["launch_floor"]
    assert set(lf) == {"empty", "one_cta", "cublas_smallest"}
    assert lf["empty"]["median"] < lf["one_cta"]["median"]
    assert lf["cublas_smallest"]["status"] == "not_measured"           # no cuBLAS library given
    lines = bw.ceiling_lines(t)
    assert len(lines) == 3 and "8 KiB" in lines[0] and "x14" in lines[0] and "device copy" in lines[1]
    assert lines[2].startswith("launch floor: empty 2.00 us") and all("fake device" in ln for ln in lines)
    json.dumps(res)                                                    # it crosses the worker's pipe
    # parts fail apart: no streaming kernel, a launch floor that does not load, a budget spent
    res = bw.ceilings_task(None, str(tmp_path / "none.so"), sizes=sizes)
    t = res["ceilings"]
    assert res["bandwidth"]["status"] == "not_measured" and t["status"] == "error"
    assert t["stream_read"] == [] and t["launch_floor"]["status"] == "error"
    assert t["device_copy"]["gbs"] > 0
    t = bw.ceilings_task(so, fso, sizes=sizes, budget_s=1e-9)["ceilings"]
    assert t["status"] == "not_measured" and "budget" in t["detail"]
    assert [e["bytes"] for e in t["stream_read"]] == [bw.MIN_BUFFER_BYTES]
    assert t["launch_floor"]["status"] == t["device_copy"]["status"] == "not_measured"


@pytest.mark.compile
def test_a_campaign_run_on_the_fake_device_writes_the_ceilings(tmp_path, monkeypatch):
    """prepare packs the launch floor beside the streaming kernel (dry-run checked); a run on the
    fake device measures the table once, before the shapes, from the pack's libraries (cuBLAS's
    smallest GEMM included), and keeps summary["bandwidth"] as the large buffer's entry."""
    from cudal2.harness import provenance
    from cudal2.runs import campaign
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n64,64,64\n")
    lines: list[str] = []
    m = campaign.prepare(shapes, "sm_90a", tmp_path / "pack", families=["mma"], limit_per_shape=1,
                         jobs=2, include_tuned=False, log=lines.append)
    lf = m["launch_floor"]
    assert lf["name"] == "launch_floor" and (tmp_path / "pack" / lf["dir"] / "kernel.so").is_file()
    assert ("baseline launch_floor", lf) in campaign.pack_entries(m)
    assert any("dry run" in ln and "0 problem(s)" in ln for ln in lines)
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.02")
    provenance.gpu_visible.cache_clear()
    provenance.gpu_name.cache_clear()
    logged: list[str] = []
    try:
        s = campaign.run(tmp_path / "pack", tmp_path / "rep", budget_s=300, finals_per_shape=1,
                         modes=("offline",), kernels_root=tmp_path / "gk", log=logged.append)
    finally:
        monkeypatch.delenv("CUDAL2_FAKE_DEVICE")
        provenance.gpu_visible.cache_clear()
        provenance.gpu_name.cache_clear()
    t = s["ceilings"]
    assert t["status"] == "ok" and t["fake_device"]
    _check_table(t, [8192, bw.MIN_BUFFER_BYTES])
    assert t["launch_floor"]["cublas_smallest"]["shape"] == [16, 16, 16]
    assert s["bandwidth"]["bytes"] == bw.MIN_BUFFER_BYTES and s["bandwidth"]["decode_rows"] == 1
    assert any(ln.startswith("ceilings: stream read 8 KiB") for ln in logged)
    assert any(ln.startswith("launch floor: empty") for ln in logged)
    written = json.loads((Path(s["run_dir"]) / "summary.json").read_text())
    assert written["ceilings"] == json.loads(json.dumps(t))


@pytest.mark.gpu
def test_the_ceilings_on_a_gpu_are_physical():
    """On a GPU: every size's checksums pass, a small cold read is slower per byte than the large
    buffer (its ramp), the copy moves bytes read + written below twice the peak, and the table
    costs seconds."""
    from cudal2.core.toolchain import detect_arch
    from cudal2.harness import floor
    arch = detect_arch()
    res = bw.ceilings_task(bw.build_stream_read(arch), floor.build_launch_floor(arch), None,
                           sizes=[1 << 20, 32 << 20])
    t = res["ceilings"]
    assert t["status"] == "ok", t.get("detail")
    big = res["bandwidth"]
    _check_table(t, [1 << 20, 32 << 20, big["bytes"]])
    small, mid, large = t["stream_read"]
    assert small["copies"] > mid["copies"] > 1 and large["copies"] == 1
    assert small["gbs"] < large["gbs"] * 1.05 and large["gbs"] < 1.05 * big["peak_gbs"]
    assert 0 < t["device_copy"]["gbs"] < 2.1 * big["peak_gbs"]
    assert t["seconds"] < 15, t["seconds"]
