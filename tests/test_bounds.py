"""Physical lower bounds: arithmetic only."""
import pytest

from cudal2.harness import bounds


def test_known_gpus_by_name():
    assert bounds.peak_for_name("NVIDIA H100 80GB HBM3").tflops_fp16 == 989.4
    assert bounds.peak_for_name("NVIDIA H100 80GB HBM3").tbytes_per_s == 3.35
    assert bounds.peak_for_name("NVIDIA H200").tbytes_per_s == 4.8
    assert bounds.peak_for_name("NVIDIA H100 PCIe").tflops_fp16 == 756.0
    assert bounds.peak_for_name("NVIDIA A100-SXM4-80GB").tflops_fp16 == 312.0
    assert bounds.peak_for_name("NVIDIA A100-SXM4-80GB").tbytes_per_s == 2.04
    assert bounds.peak_for_name("NVIDIA GeForce RTX 3090") is None


def test_compute_bound_large_shape():
    h100 = bounds.peak_for_name("H100 SXM")
    # 16384^3: 8.8e12 flop at 989.4 TFLOP/s = 8.89 ms; bytes (1.6 GB) at 3.35 TB/s = 0.47 ms
    t = bounds.lower_bound_us(16384, 16384, 16384, h100)
    assert t == pytest.approx(2 * 16384**3 / 989.4e12 * 1e6)
    assert bounds.is_too_fast(0.8 * t, 16384, 16384, 16384, h100)
    assert not bounds.is_too_fast(0.95 * t, 16384, 16384, 16384, h100)   # within the margin
    assert bounds.fraction_of_peak(t, 16384, 16384, 16384, h100) == pytest.approx(1.0)


def test_memory_bound_skinny_shape_counts_only_bytes_beyond_l2():
    h100 = bounds.peak_for_name("H100")
    M, N, K = 64, 16384, 16384
    nbytes = 2 * (M * K + K * N + M * N)
    expect = (nbytes - h100.l2_bytes) / 3.35e12 * 1e6
    assert bounds.lower_bound_us(M, N, K, h100) == pytest.approx(expect)
    assert expect > 2 * M * N * K / 989.4e12 * 1e6     # bandwidth dominates
    # a tiny shape fits in L2: only the compute bound remains (tiny, never flags honest kernels)
    assert bounds.lower_bound_us(64, 64, 64, h100) == pytest.approx(2 * 64**3 / 989.4e12 * 1e6)


def test_unknown_gpu_is_conservative():
    p = bounds.conservative_peak("Mystery", sm_count=132, mem_clock_khz=2_619_000,
                                 bus_width_bits=5120)
    h100 = bounds.peak_for_name("H100")
    assert p.tflops_fp16 > h100.tflops_fp16 and p.tbytes_per_s > h100.tbytes_per_s
    assert bounds.lower_bound_us(4096, 4096, 4096, p) < bounds.lower_bound_us(4096, 4096, 4096, h100)
    assert bounds.conservative_peak("x", 10).tbytes_per_s == 10.0
