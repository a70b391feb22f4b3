"""The launch floor (cudal2/harness/floor.py, baselines/launch_floor.cu): its kernels build for both
arches with zero spills, the one-CTA kernel's memory ops are live, the launcher refuses bad
arguments without a device, the fake device answers in the measurement's shape, failures are the
floor's own; on a GPU, the floor against physical sense.

All timings here are SYNTHETIC except the gpu-marked test's.
"""
import pytest

from cudal2.harness import floor

EINVAL = 1                                  # cudaErrorInvalidValue


@pytest.mark.compile
def test_the_floor_kernels_build_and_refuse_bad_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    from cudal2.core.build import build
    for arch in ("sm_90a", "sm_80"):
        res = build(floor.spec(arch))
        assert res.ok, res.log[-2000:]
        assert res.spills == 0
        assert sorted(r.function for r in res.resources) == ["cudal2_empty_kernel", "cudal2_one_cta_kernel"]
        ptx = res.ptx_path.read_text()
        body = ptx[ptx.index(".entry cudal2_empty_kernel"):]
        body = body[:body.index("}")]
        assert "ld.global" not in body and "st.global" not in body       # empty: a launch only
        one = ptx[ptx.index(".entry cudal2_one_cta_kernel"):]
        assert "ld.global" in one and "st.global" in one                  # one load, one store
    lib = floor.FloorLib(floor.build_launch_floor("sm_90a"))
    assert lib.threads == 32
    assert lib.one_cta(None, 16, None) == EINVAL                         # no source
    assert lib.one_cta(16, None, None) == EINVAL                         # no destination
    assert lib.one_cta(18, 16, None) == EINVAL                           # misaligned words
    with pytest.raises(floor.FloorError, match="cannot load"):
        floor.FloorLib(str(tmp_path / "none.so"))


@pytest.mark.compile
def test_the_fake_device_answers_the_floor_and_failures_stay_the_floors(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    so = floor.build_launch_floor("sm_90a")
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.01")
    m = floor.measure_part(so, None)
    assert set(m) == {"empty", "one_cta", "cublas_smallest"}
    for name in ("empty", "one_cta"):
        iv = m[name]
        assert set(iv) == {"median", "lo", "hi"} and iv["lo"] < iv["median"] < iv["hi"]
    assert m["cublas_smallest"] == {"status": "not_measured", "detail": "no cuBLAS baseline library given"}
    # a cuBLAS library that does not load costs cuBLAS's floor, not the launch floor
    m = floor.measure_part(so, str(tmp_path / "nocublas.so"))
    assert m["cublas_smallest"]["status"] == "error" and m["empty"]["median"] > 0
    assert "cuBLAS 16x16x16 error" in floor.line(m) and "empty 2.00 us" in floor.line(m)
    assert floor.measure_part(None)["status"] == "not_measured"
    bad = floor.measure_part(str(tmp_path / "none.so"))
    assert bad["status"] == "error" and "FloorError" in bad["detail"]
    assert floor.line(bad).startswith("launch floor: not measured (error: FloorError")
    assert floor.line(None) == "launch floor: not measured"


def test_the_floors_line_reads_its_intervals():
    iv = floor.interval(2.0, 1.9, 2.1)
    m = {"empty": iv, "one_cta": floor.interval(2.5, 2.4, 2.6),
         "cublas_smallest": dict(floor.interval(4.5, 4.4, 4.6), shape=[16, 16, 16])}
    assert floor.line(m) == ("launch floor: empty 2.00 us [1.90, 2.10], one CTA 2.50 us [2.40, 2.60], "
                             "cuBLAS 16x16x16 4.50 us [4.40, 4.60]")
    assert floor.CONFIG.operands == "hot" and floor.CONFIG.precall      # as the finals time a call


@pytest.mark.gpu
def test_the_launch_floor_on_a_gpu():
    """On a GPU: an empty launch costs between 0.3 and 20 us by kernel time, the one-CTA kernel
    no less than 0.9 of it, and cuBLAS's smallest GEMM (its output checked every round) no less
    than the empty kernel."""
    from cudal2.core.toolchain import detect_arch
    from cudal2.harness.baselines import build_baselines
    arch = detect_arch()
    m = floor.measure(floor.build_launch_floor(arch), build_baselines(arch)["cublas"])
    e, o, c = m["empty"], m["one_cta"], m["cublas_smallest"]
    assert 0.3 < e["median"] < 20, m
    assert o["median"] > 0.9 * e["median"] and c["median"] > 0.9 * e["median"], m
    assert c["shape"] == [16, 16, 16] and e["lo"] <= e["median"] <= e["hi"]
