"""Physical lower bounds on the time of one HGEMM, per GPU model.

A measured time below the bound is a verdict ("too_fast": the kernel skipped work, cached an
answer, or the timer was fooled), never a win. The bound is max(compute time at peak dense fp16
tensor throughput, HBM time at peak bandwidth) for the bytes that cannot be served from L2.
Everything here is arithmetic on numbers, so it is unit-tested without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

# A time below margin * bound is "too fast". 0.9 covers boosting above the spec-sheet clock
# (H100 SXM peaks are quoted at 1830 MHz, max SM clock 1980 MHz = 1.08x) and event jitter.
DEFAULT_MARGIN = 0.9


@dataclass(frozen=True)
class GpuPeak:
    name: str
    tflops_fp16: float       # dense fp16 tensor throughput, fp16 or fp32 accumulate (TFLOP/s)
    tbytes_per_s: float      # peak DRAM bandwidth (TB/s)
    l2_bytes: int            # L2 size: traffic that may be served from cache
    source: str              # "spec sheet" | "device properties (conservative)"


# Matched by substring of the device name, first match wins: more specific names come first.
# Where one marketing name covers variants, the fastest variant is listed (a lower bound must
# never flag an honest kernel).
KNOWN_PEAKS: tuple[tuple[str, GpuPeak], ...] = (
    ("GH200", GpuPeak("GH200", 989.4, 4.9, 50 * 2**20, "spec sheet")),
    ("H200", GpuPeak("H200", 989.4, 4.8, 50 * 2**20, "spec sheet")),
    ("H100 NVL", GpuPeak("H100 NVL", 835.0, 3.9, 50 * 2**20, "spec sheet")),
    ("H100 PCIe", GpuPeak("H100 PCIe", 756.0, 2.0, 50 * 2**20, "spec sheet")),
    ("H100", GpuPeak("H100 SXM", 989.4, 3.35, 50 * 2**20, "spec sheet")),
    ("H800", GpuPeak("H800 SXM", 989.4, 3.35, 50 * 2**20, "spec sheet")),
    ("A100", GpuPeak("A100", 312.0, 2.04, 40 * 2**20, "spec sheet")),
    ("A800", GpuPeak("A800", 312.0, 2.04, 40 * 2**20, "spec sheet")),
)

# For a GPU we do not know: generous per-SM figures (2x Hopper's 4096 dense fp16 flop/clk/SM, a
# 2.5 GHz clock) so the bound stays below anything real; bandwidth 2x the DDR formula.
_UNKNOWN_FLOP_PER_CLK_PER_SM = 8192
_UNKNOWN_CLOCK_HZ = 2.5e9
_UNKNOWN_TBPS_FALLBACK = 10.0


def peak_for_name(name: str) -> GpuPeak | None:
    for key, peak in KNOWN_PEAKS:
        if key.lower() in name.lower():
            return peak
    return None


def conservative_peak(name: str, sm_count: int, mem_clock_khz: int | None = None,
                      bus_width_bits: int | None = None, l2_bytes: int | None = None) -> GpuPeak:
    """An over-estimate of an unknown GPU's peaks from its device properties."""
    tflops = sm_count * _UNKNOWN_FLOP_PER_CLK_PER_SM * _UNKNOWN_CLOCK_HZ / 1e12
    if mem_clock_khz and bus_width_bits:
        # DDR: 2 transfers per clock; x2 again for safety (HBM3e, compression, unknown quirks).
        tbps = 2 * 2 * mem_clock_khz * 1e3 * bus_width_bits / 8 / 1e12
    else:
        tbps = _UNKNOWN_TBPS_FALLBACK
    return GpuPeak(name, tflops, tbps, int(l2_bytes or 128 * 2**20),
                   "device properties (conservative)")


def device_peak(device=None) -> GpuPeak:
    """Peaks for a torch CUDA device (needs a GPU): the spec sheet when known, else conservative."""
    import torch

    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    known = peak_for_name(props.name)
    if known is not None:
        return known
    return conservative_peak(props.name, props.multi_processor_count,
                             getattr(props, "memory_clock_rate", None),
                             getattr(props, "memory_bus_width", None),
                             getattr(props, "L2_cache_size", None))


def gemm_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def gemm_bytes(M: int, N: int, K: int, elem_bytes: int = 2) -> int:
    """Minimum DRAM-side traffic: read A and B once, write C once (fp16)."""
    return elem_bytes * (M * K + K * N + M * N)


def lower_bound_us(M: int, N: int, K: int, peak: GpuPeak, *, cold: bool = False) -> float:
    """The least time one C = A @ B can take on this GPU, in microseconds.

    Compute: 2MNK flops at the dense tensor peak. Memory, at peak bandwidth: with cold operands
    (the kernel timer rotates operand sets larger than 3x L2) A and B must come from HBM, so
    their bytes are charged in full (C may stay in L2); otherwise only the bytes beyond what L2
    could already hold. The larger of the two; either alone is a valid lower bound."""
    t_compute = gemm_flops(M, N, K) / (peak.tflops_fp16 * 1e12)
    if cold:
        dram = 2 * (M * K + K * N)
    else:
        dram = max(0, gemm_bytes(M, N, K) - peak.l2_bytes)
    t_memory = dram / (peak.tbytes_per_s * 1e12)
    return max(t_compute, t_memory) * 1e6


def is_too_fast(median_us: float, M: int, N: int, K: int, peak: GpuPeak,
                margin: float = DEFAULT_MARGIN, *, cold: bool = False) -> bool:
    return median_us < margin * lower_bound_us(M, N, K, peak, cold=cold)


def fraction_of_peak(median_us: float, M: int, N: int, K: int, peak: GpuPeak) -> float:
    """Achieved tensor throughput as a fraction of the dense fp16 peak."""
    return gemm_flops(M, N, K) / (median_us * 1e-6) / (peak.tflops_fp16 * 1e12)
