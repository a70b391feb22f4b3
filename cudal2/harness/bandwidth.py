"""The device's own HBM bandwidth ceiling, and what a decode row reaches of it.

A read-only streaming kernel (baselines/stream_read.cu: 16-byte non-coherent loads, no L1
allocation, an L2 evict-first policy, a grid of every resident CTA, one checksum per CTA) reads
one buffer of max(MIN_BUFFER_BYTES, L2_MULTIPLE x L2) bytes per call; the kernel timer
(cudal2.timing.kerneltime: GPU time per call, host out of the bracket, median with a bootstrap
interval) times it, and every round's checksum is compared with the buffer's sum (a kernel that
skipped bytes would not pass). The ceiling is bytes / time in GB/s (1e9 B/s), with the interval
of the time turned into one of GB/s. It is measured in the same call as the GEMMs it judges
(cudal2.runs.campaign, cudal2.runs.modelbench): an H100's spec-sheet 3.35 TB/s is not what its
HBM delivers to a kernel, and the fraction of the measured ceiling is the figure issue 32 sets
its decode target on (>= 85%).

A decode row (M <= DECODE_MAX_M) is bound by reading its large operand (the weight, K x N fp16:
2*K*max(M, N) bytes); its achieved bandwidth is those bytes over its kernel time.

The arithmetic is pure (CPU tests); `measure` needs a GPU; `measure_task` is the worker task
(the fake device of a CPU rehearsal answers it: cudal2.harness.fakedevice.stream_read).
"""
from __future__ import annotations

import ctypes
import time
from pathlib import Path

from cudal2.core.build import BuildSpec, build
from cudal2.core.identity import source_sha
from cudal2.harness import fakedevice
from cudal2.timing import kerneltime as KT

NAME = "stream_read"
SOURCE = Path(__file__).resolve().parent / "baselines" / "stream_read.cu"
EXPORTS = ("cudal2_baseline_abi", "cudal2_stream_read_threads", "cudal2_stream_read_blocks_per_sm",
           "cudal2_stream_read_device", "cudal2_stream_read")
DECODE_MAX_M = 64                 # issue 32's decode rows: M <= 64
MIN_BUFFER_BYTES = 1 << 30        # the streamed buffer: at least 1 GiB ...
L2_MULTIPLE = 8                   # ... and 8 x L2 (what a call leaves in L2 is < 1/8 of the next)
FREE_FRACTION = 0.25              # never more than this share of the free device memory
ELEM_BYTES = 2                    # fp16 operands
# a call is ~0.2-0.35 ms on an H100/H200: a few calls per sample, rounds until the interval is
# within 0.5% (or 3 s); every round's checksum is checked
CONFIG = KT.KernelTimeConfig(sample_us=2000.0, max_calls=16, warmup_ms=20.0, min_rounds=8,
                             max_rounds=40, budget_s=3.0, target=0.005)
METHOD = ("read-only streaming kernel (baselines/stream_read.cu: 16 B ld.global.nc.L1::no_allocate "
          "loads with an L2 evict_first policy, 4 in flight per thread, grid = SMs x resident CTAs, "
          "checksum per CTA checked every round), one buffer of max(1 GiB, 8 x L2) read once per "
          "call, kernel time (kerneltime.time_kernels: median of rounds, bootstrap interval); "
          "GB/s = 1e9 B/s")


class BandwidthError(RuntimeError):
    """The streaming kernel could not be built, loaded or run; the message says which."""


# ---- pure arithmetic ------------------------------------------------------------------------------

def is_decode(M: int, N: int = 0, K: int = 0) -> bool:
    """A decode row: M <= DECODE_MAX_M tokens (bound by reading its weight)."""
    return 0 < M <= DECODE_MAX_M


def large_operand_bytes(M: int, N: int, K: int, elem_bytes: int = ELEM_BYTES) -> int:
    """Bytes of the larger input operand: B (K x N) for a decode row (N >= M), else A (M x K)."""
    return elem_bytes * K * max(M, N)


def achieved_gbs(nbytes: float, time_us: float) -> float | None:
    """GB/s (1e9 B/s) of `nbytes` read in `time_us` microseconds; None without a time."""
    if not time_us or time_us <= 0:
        return None
    return nbytes / (time_us * 1e3)


def fraction(gbs: float | None, ceiling_gbs: float | None) -> float | None:
    """gbs / ceiling_gbs, None when either is unknown."""
    if gbs is None or not ceiling_gbs or ceiling_gbs <= 0:
        return None
    return gbs / ceiling_gbs


def theoretical_peak_gbs(memory_clock_khz: float | None, bus_width_bits: float | None) -> float | None:
    """The DRAM peak: memory clock x bus width x 2 (two transfers per clock), GB/s; None unknown."""
    if not memory_clock_khz or not bus_width_bits:
        return None
    return 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9


def buffer_bytes(l2_bytes: int, free_bytes: int | None = None) -> int:
    """The streamed buffer: max(MIN_BUFFER_BYTES, L2_MULTIPLE x L2), at most FREE_FRACTION of the
    free device memory (then still >= 4 x L2, else BandwidthError), a multiple of 1 MiB."""
    want = max(MIN_BUFFER_BYTES, L2_MULTIPLE * int(l2_bytes))
    if free_bytes is not None:
        cap = int(free_bytes * FREE_FRACTION)
        if cap < 4 * l2_bytes:
            raise BandwidthError(f"{free_bytes / 2**30:.2f} GiB free: too little for a streamed "
                                 f"buffer of 4 x L2 ({4 * l2_bytes / 2**20:.0f} MiB) in a quarter of it")
        want = min(want, cap)
    return want >> 20 << 20


def ceiling(nbytes: int, median_us: float, lo_us: float, hi_us: float) -> dict:
    """The ceiling of one timed session: GB/s at the median time, its interval from the time's
    (the slow end of the time is the low end of GB/s)."""
    return {"gbs": achieved_gbs(nbytes, median_us),
            "ci": [achieved_gbs(nbytes, hi_us), achieved_gbs(nbytes, lo_us)],
            "bytes": int(nbytes), "us": {"median": median_us, "lo": lo_us, "hi": hi_us}}


def decode_figures(M: int, N: int, K: int, time_us: float, ceiling_gbs: float | None = None,
                   peak_gbs: float | None = None) -> dict:
    """One row's bandwidth: bytes of the large operand, GB/s over `time_us`, its fraction of the
    measured ceiling and of the theoretical peak (None where unknown)."""
    nb = large_operand_bytes(M, N, K)
    gbs = achieved_gbs(nb, time_us)
    return {"bytes": nb, "gbs": gbs, "of_ceiling": fraction(gbs, ceiling_gbs),
            "of_peak": fraction(gbs, peak_gbs)}


def checksum(words) -> int:
    """The kernel's checksum of uint32 words: their sum mod 2**32 (what the per-CTA sums add to)."""
    return sum(int(w) & 0xFFFFFFFF for w in words) & 0xFFFFFFFF


# ---- the kernel ----------------------------------------------------------------------------------

def source() -> str:
    return SOURCE.read_text()


def spec(arch: str) -> BuildSpec:
    return BuildSpec(source(), arch, name="baseline-stream-read")


def build_stream_read(arch: str, *, cache: Path | None = None) -> str:
    """Build the streaming kernel for `arch` through the build cache (no GPU needed); its .so."""
    res = build(spec(arch), cache=cache)
    if not res.ok:
        tail = "\n".join(res.log.splitlines()[-15:])
        raise BandwidthError(f"building the streaming kernel for {arch} failed ({res.status}):\n{tail}")
    return str(res.so_path)


_I, _V, _ULL = ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong


class StreamReadLib:
    """The built .so through ctypes (loaded the way the baselines are: cudart preloaded)."""

    def __init__(self, so_path: str):
        from cudal2.harness.baselines import BaselineError, _load
        try:
            self.lib = L = _load(str(so_path))
        except BaselineError as exc:
            raise BandwidthError(str(exc)) from None
        missing = [s for s in EXPORTS if not hasattr(L, s)]
        if missing:
            raise BandwidthError(f"{so_path}: missing symbol(s) {missing}")
        L.cudal2_baseline_abi.restype = _I
        if L.cudal2_baseline_abi() != 1:
            raise BandwidthError(f"{so_path}: baseline ABI {L.cudal2_baseline_abi()}, want 1")
        L.cudal2_stream_read_threads.restype = _I
        L.cudal2_stream_read_blocks_per_sm.argtypes = [ctypes.POINTER(_I)]
        L.cudal2_stream_read_blocks_per_sm.restype = _I
        L.cudal2_stream_read_device.argtypes = [ctypes.POINTER(_I)] * 4
        L.cudal2_stream_read_device.restype = _I
        L.cudal2_stream_read.argtypes = [_V, _ULL, _V, _I, _V]
        L.cudal2_stream_read.restype = _I
        self.launch = L.cudal2_stream_read
        self.threads = int(L.cudal2_stream_read_threads())

    def blocks_per_sm(self) -> int:
        n = _I(0)
        st = self.lib.cudal2_stream_read_blocks_per_sm(ctypes.byref(n))
        if st:
            raise BandwidthError(f"cudaOccupancyMaxActiveBlocksPerMultiprocessor failed ({st})")
        return max(1, n.value)

    def device(self) -> dict:
        vals = [_I(0) for _ in range(4)]
        st = self.lib.cudal2_stream_read_device(*[ctypes.byref(v) for v in vals])
        if st:
            raise BandwidthError(f"cudaDeviceGetAttribute failed ({st})")
        sms, clk, bus, l2 = (v.value for v in vals)
        return {"sms": sms, "memory_clock_khz": clk, "bus_width_bits": bus, "l2_bytes": l2}


def _result(nbytes: int, median_us: float, lo_us: float, hi_us: float, dev: dict, **extra) -> dict:
    """The one shape of a measurement's answer (GPU and fake device alike)."""
    out = {"status": "ok", "method": METHOD, "source_sha": source_sha(source()),
           **ceiling(nbytes, median_us, lo_us, hi_us)}
    peak = theoretical_peak_gbs(dev.get("memory_clock_khz"), dev.get("bus_width_bits"))
    out.update(peak_gbs=peak, of_peak=fraction(out["gbs"], peak), device=dev, **extra)
    return out


def measure(so_path: str, *, nbytes: int | None = None, config: KT.KernelTimeConfig = CONFIG,
            backend=None) -> dict:
    """Time the streaming kernel on this process's GPU (torch's current stream). Returns
    {"status": "ok", "gbs", "ci": [lo, hi], "bytes", "us", "method", "peak_gbs", "of_peak",
    "device", "blocks", "threads", "rounds", "stopped", "seconds"}; raises BandwidthError."""
    import torch

    t0 = time.perf_counter()
    lib = StreamReadLib(so_path)
    dev = lib.device()
    if torch.cuda.is_available():
        dev["name"] = torch.cuda.get_device_name()
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(nbytes or buffer_bytes(dev["l2_bytes"], free))
    if nbytes % 16:
        raise BandwidthError(f"the streamed buffer must be a multiple of 16 bytes, got {nbytes}")
    blocks = dev["sms"] * lib.blocks_per_sm()
    buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    buf.random_()
    want = int(buf.sum(dtype=torch.int64).item()) & 0xFFFFFFFF
    out = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    src, dst = buf.data_ptr(), out.data_ptr()
    errors: list[int] = []

    def call(_i: int) -> None:
        st = lib.launch(src, nbytes, dst, blocks, torch.cuda.current_stream().cuda_stream)
        if st:
            errors.append(st)
            raise BandwidthError(f"the streaming kernel's launch failed (cudaError {st})")

    def verify(_name: str, _i: int) -> str | None:
        got = int(out.sum(dtype=torch.int64).item()) & 0xFFFFFFFF
        return None if got == want else f"checksum {got:#x} != the buffer's {want:#x}: bytes were skipped"

    call(0)
    torch.cuda.synchronize()
    why = verify(NAME, 0)
    if why:
        raise BandwidthError(why)
    kt = KT.time_kernels({NAME: call}, config, backend or KT.CudaKernelBackend(), n_sets=1,
                         verify=verify, prepare=lambda _n: out.zero_())
    if kt.failures:
        raise BandwidthError("; ".join(kt.failures))
    iv = kt.time(NAME)
    del buf, out
    torch.cuda.empty_cache()
    return _result(nbytes, iv.median, iv.lo, iv.hi, dev, blocks=blocks, threads=lib.threads,
                   rounds=kt.rounds, stopped=kt.stopped,
                   seconds=round(time.perf_counter() - t0, 3))


def measure_task(so_path: str, **kw) -> dict:
    """Worker task (a GPU worker, or the fake device of a CPU rehearsal): the measurement, or
    {"status": "error", "detail"} when the kernel cannot be built, loaded or run."""
    try:
        if fakedevice.enabled():
            t0 = time.perf_counter()
            StreamReadLib(so_path)                  # the library is loaded for real
            med, lo, hi, dev = fakedevice.stream_read(kw.get("nbytes") or MIN_BUFFER_BYTES)
            return _result(kw.get("nbytes") or MIN_BUFFER_BYTES, med, lo, hi, dev, fake_device=True,
                           seconds=round(time.perf_counter() - t0, 3))
        return measure(so_path, **kw)
    except BandwidthError as exc:
        return {"status": "error", "detail": str(exc)}


def line(m: dict | None) -> str:
    """One line for logs and reports: 'stream read 3012 GB/s [3005, 3018] (0.90 of the 3352 GB/s
    peak) over 1024 MiB', or why there is no figure."""
    if not m:
        return "stream read: not measured"
    if m.get("status") != "ok":
        return f"stream read: not measured ({m.get('status')}: {m.get('detail', '')})"
    lo, hi = m["ci"]
    peak = (f" ({m['of_peak']:.2f} of the {m['peak_gbs']:.0f} GB/s theoretical peak)"
            if m.get("of_peak") else "")
    fake = " [fake device]" if m.get("fake_device") else ""
    return (f"stream read {m['gbs']:.0f} GB/s [{lo:.0f}, {hi:.0f}]{peak} over "
            f"{m['bytes'] / 2**20:.0f} MiB{fake}")
