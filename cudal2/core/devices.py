"""The GPUs the planner reasons about: their peaks, their per-SM limits, and the calibrated
terms of the streaming budget (cudal2.templates.budget). One table, read by the budget, the
cost model (cudal2.search.costmodel re-exports it) and the RL reward's estimate; numbers only,
no device needed. cudal2.harness.bounds keeps its own spec-sheet peaks for the lower bound (a
verdict on a measurement must not move with a calibration).
"""
from __future__ import annotations

from dataclasses import dataclass

# The streaming budget's terms (cudal2.templates.budget), fitted on the H200's committed decode
# rows: reports/cpu/2026-11-29-decode-budget (its README has the command and the fit). The H100
# has no committed streaming-kernel rows: it takes the H200's latency and floor (same SM, HBM3 vs
# HBM3e, same memory system design), which the first H100 window can refit.
DRAM_LATENCY_NS = 750.0       # loaded DRAM latency a kernel's requests see (Little's law's L)
STREAM_FLOOR_US = 1.0         # a streaming call's fixed cost: launch, first wave's ramp, epilogue
STREAM_EFF = 0.93             # the most of the DRAM peak a streaming read reaches (cuBLAS: 0.92)
FIXUP_PEER_US = 0.5           # a split-K reducer reading one peer's fp32 partial through L2
FIXUP_STORE_US = 1.0          # a split-K CTA storing its partial, fencing and arriving at the tile's flag
DSMEM_PEER_US = 0.1           # ... through distributed shared memory (a prior: never measured)
STREAM_FILL = 0.8             # the share of the reachable peak the in-flight budget asks for


@dataclass(frozen=True)
class GpuSpec:
    name: str
    tflops: float            # dense fp16 tensor peak, TFLOP/s
    tbps: float              # DRAM bandwidth, TB/s
    sms: int
    smem_per_sm: int         # bytes usable by CTAs
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    launch_us: float = 4.0   # launch + tail cost seen by a stream-timed call
    l2_bytes: int = 50 * 2**20
    # the streaming budget (cudal2.templates.budget)
    dram_latency_ns: float = DRAM_LATENCY_NS
    stream_floor_us: float = STREAM_FLOOR_US
    stream_eff: float = STREAM_EFF
    fixup_peer_us: float = FIXUP_PEER_US
    fixup_store_us: float = FIXUP_STORE_US
    dsmem_peer_us: float = DSMEM_PEER_US
    mma_sync_tflops: float = 290.0   # best mma.sync kernel measured (H100, 8192x8192x4096)
    fp32_tflops: float = 67.0        # CUDA-core fp32 FMA peak (datasheet)
    smem_per_cta_reserved: int = 1024   # shared memory the driver keeps per resident CTA
    cluster_max: int = 8             # portable thread-block cluster size (0: no clusters)

    @property
    def stream_bytes_per_us(self) -> float:
        """The most bytes per microsecond a streaming read gets from DRAM."""
        return self.tbps * self.stream_eff * 1e6

    def inflight_needed_per_sm(self, fill: float = STREAM_FILL) -> float:
        """Bytes each SM must keep requested and not yet arrived for the chip to stream at
        `fill` of its reachable peak P. Little's law with a latency that grows with the load: X
        bytes in flight return every L + X / P, so they stream at X / (X + L x P) of P, and
        `fill` needs X = fill / (1 - fill) x L x P (4 x L x P at 0.8), over the SMs."""
        return fill / (1.0 - fill) * self.stream_bytes_per_us * self.dram_latency_ns * 1e-3 / self.sms


# Datasheet peaks (NVIDIA's H100, H200 and A100 datasheets; cudal2.harness.bounds holds the same).
GPUS = {
    "H100": GpuSpec("H100", 989.4, 3.35, 132, 227 * 1024),
    "H200": GpuSpec("H200", 989.4, 4.8, 132, 227 * 1024, l2_bytes=60 * 2**20),
    "A100": GpuSpec("A100", 312.0, 2.039, 108, 163 * 1024, max_ctas_per_sm=32, l2_bytes=40 * 2**20,
                    mma_sync_tflops=250.0, fp32_tflops=19.5, cluster_max=0),
}
ARCH_GPU = {"sm_90a": "H100", "sm_90": "H100", "sm_80": "A100", "sm_86": "A100", "sm_89": "A100"}
# Every GPU an arch's build may run on, for rules a build must meet on each (the budget).
GPUS_OF_ARCH = {"sm_90a": ("H100", "H200"), "sm_90": ("H100", "H200"), "sm_80": ("A100",),
                "sm_86": ("A100",), "sm_89": ("A100",)}


def gpu_for(arch: str | None = None, gpu: str | None = None) -> GpuSpec:
    """The spec for a GPU name ("NVIDIA H100 80GB HBM3" works) or, failing that, an arch."""
    if gpu:
        for key, spec in GPUS.items():
            if key.lower() in gpu.lower():
                return spec
    if arch in ARCH_GPU:
        return GPUS[ARCH_GPU[arch]]
    if gpu or arch:
        raise ValueError(f"no GPU spec for gpu={gpu!r} arch={arch!r}; known: {sorted(GPUS)}, "
                         f"arches {sorted(ARCH_GPU)}")
    return GPUS["H100"]
