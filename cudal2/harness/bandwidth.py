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

The ceilings table (`ceilings_task`, summary["ceilings"] of a campaign run): the same kernel at
each decode weight size of the run beside the large buffer (a small read has its own ramp; its
operands stay cold by rotating over `cold_copies` copies, every call's checksum checked), a
device-to-device copy of the large buffer, and the launch floor (cudal2.harness.floor); each
part fails on its own. `ceiling_at` picks a row's ceiling from the table by its weight's bytes.

The arithmetic is pure (CPU tests); `measure` needs a GPU; `measure_task` and `ceilings_task`
are worker tasks (the fake device of a CPU rehearsal answers them: cudal2.harness.fakedevice).
"""
from __future__ import annotations

import ctypes
import math
import time
from pathlib import Path

from cudal2.core.build import BuildSpec, build_so
from cudal2.core.identity import source_sha
from cudal2.harness import fakedevice, floor
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
# one size of the ceilings table: ~0.03-1 ms a call; rounds of ~1 ms of calls until the interval
# is within 1%, at most 0.4 s (with the copies' fill, ~0.5 s a size on an H200)
SIZE_CONFIG = KT.KernelTimeConfig(sample_us=1000.0, max_calls=64, warmup_ms=5.0, min_rounds=6,
                                  max_rounds=30, budget_s=0.4, target=0.01)
# the device copy of the large buffer: ~0.5 ms a call, rounds within 1% or 0.5 s
COPY_CONFIG = KT.KernelTimeConfig(sample_us=2000.0, max_calls=16, warmup_ms=10.0, min_rounds=6,
                                  max_rounds=20, budget_s=0.5, target=0.01)
CEILINGS_BUDGET_S = 20.0          # no part of the table starts later than this into its task
COPY_METHOD = ("device copy: torch Tensor.copy_ of the large buffer into a second one "
               "(cudaMemcpyAsync device to device), checked equal once, kernel time; "
               "GB/s = (bytes read + bytes written) / time = 2 x bytes / time")
CEILINGS_METHOD = ("stream read at each decode weight size of the run and the large buffer: the "
                   "streaming kernel (grid = min(SMs x resident CTAs, one 16 B vector a thread)), "
                   "each call reading the next of `copies` copies so that more than 8 x L2 is read "
                   "between two reads of one copy (at most a quarter of free memory), every call's "
                   "checksum checked; sizes rounded down to 16 B; per size rounds of 1 ms within 1% "
                   "or 0.4 s (the large buffer: as summary['bandwidth']). " + COPY_METHOD + ". "
                   + floor.METHOD)


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


def cold_copies(nbytes: int, l2_bytes: int, free_bytes: int | None = None) -> int:
    """Copies of an `nbytes` buffer to rotate over so that more than L2_MULTIPLE x L2 bytes are
    read between two reads of one copy ((copies - 1) x nbytes > L2_MULTIPLE x L2; one for a
    buffer that large itself), at most FREE_FRACTION of the free memory, at least one."""
    cold = L2_MULTIPLE * int(l2_bytes)
    n = 1 if nbytes >= cold else cold // nbytes + 2
    if free_bytes is not None:
        n = min(n, int(free_bytes * FREE_FRACTION) // nbytes)
    return max(1, n)


def table_sizes(shapes, large_bytes: int | None = None) -> list[int]:
    """The ceilings table's read sizes, ascending: each distinct large operand of the decode
    rows among `shapes` (rounded down to 16 B, what the kernel reads) and `large_bytes`."""
    sizes = {large_operand_bytes(*s) >> 4 << 4 for s in shapes if is_decode(*s)}
    sizes.add(int(large_bytes or 0))
    return sorted(b for b in sizes if b > 0)


def stream_entry(nbytes: int, median_us: float, lo_us: float, hi_us: float, copies: int) -> dict:
    """One stream_read row of the ceilings table."""
    c = ceiling(nbytes, median_us, lo_us, hi_us)
    return {"bytes": c["bytes"], "gbs": c["gbs"], "ci": c["ci"], "us": c["us"], "copies": int(copies)}


def copy_entry(nbytes: int, median_us: float, lo_us: float, hi_us: float) -> dict:
    """The device copy's row: GB/s of the bytes read and written (2 x nbytes)."""
    c = ceiling(2 * nbytes, median_us, lo_us, hi_us)
    return {"bytes": int(nbytes), "gbs": c["gbs"], "ci": c["ci"], "us": c["us"]}


def ceiling_at(ceilings: dict | None, nbytes: int) -> dict | None:
    """The table's stream_read row measured at exactly `nbytes`, else the nearest in log size;
    None without a row (or for nbytes <= 0)."""
    rows = [e for e in ((ceilings or {}).get("stream_read") or []) if e.get("bytes", 0) > 0]
    if not rows or nbytes <= 0:
        return None
    exact = [e for e in rows if e["bytes"] == nbytes]
    return exact[0] if exact else min(rows, key=lambda e: abs(math.log(e["bytes"] / nbytes)))


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
    return build_so(spec(arch), BandwidthError, "the streaming kernel", cache=cache)


_I, _V, _ULL = ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong


class StreamReadLib:
    """The built .so through ctypes (loaded the way the baselines are: cudart preloaded)."""

    def __init__(self, so_path: str):
        from cudal2.harness.baselines import load_checked
        self.lib = L = load_checked(so_path, EXPORTS, BandwidthError)
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


def _open(so_path: str) -> tuple[StreamReadLib, dict]:
    """The library and the device facts (with torch's name for the GPU)."""
    import torch

    lib = StreamReadLib(so_path)
    dev = lib.device()
    if torch.cuda.is_available():
        dev["name"] = torch.cuda.get_device_name()
    return lib, dev


def _grid(lib: StreamReadLib, dev: dict, nbytes: int) -> int:
    """Every resident CTA, but no more CTAs than one 16-byte vector a thread fills (a small read)."""
    return max(1, min(dev["sms"] * lib.blocks_per_sm(), -(-nbytes // (16 * lib.threads))))


def _session(lib: StreamReadLib, nbytes: int, copies: int, blocks: int,
             config: KT.KernelTimeConfig, backend) -> KT.KernelTimes:
    """Time reading `copies` copies of an `nbytes` buffer of random words (one allocation), call i
    reading copy i into its own row of CTA sums; each round checks the rows its sample wrote
    against their copies' sums. Returns the session; raises BandwidthError."""
    import torch

    if nbytes <= 0 or nbytes % 16:
        raise BandwidthError(f"the streamed buffer must be a positive multiple of 16 bytes, got {nbytes}")
    buf = torch.empty(copies * nbytes // 4, dtype=torch.int32, device="cuda")
    buf.random_()
    want = buf.view(copies, -1).sum(1, dtype=torch.int64) & 0xFFFFFFFF
    out = torch.zeros(copies, blocks, dtype=torch.int32, device="cuda")
    src, dst, row = buf.data_ptr(), out.data_ptr(), blocks * 4
    read: list[int] = []                       # the copies read since the last prepare

    def call(i: int) -> None:
        st = lib.launch(src + i * nbytes, nbytes, dst + i * row, blocks,
                        torch.cuda.current_stream().cuda_stream)
        if st:
            raise BandwidthError(f"the streaming kernel's launch failed (cudaError {st})")
        read.append(i)

    def verify(_name: str, _i: int) -> str | None:
        idx = torch.tensor(sorted(set(read)), dtype=torch.int64, device="cuda")
        got = out.index_select(0, idx).sum(1, dtype=torch.int64) & 0xFFFFFFFF
        bad = int((got != want.index_select(0, idx)).sum().item())
        return f"{bad} of {len(idx)} checksum(s) differ from the buffer's: bytes were skipped" if bad else None

    def prepare(_name: str) -> None:
        read.clear()
        out.zero_()

    prepare(NAME)
    call(0)
    torch.cuda.synchronize()
    why = verify(NAME, 0)
    if why:
        raise BandwidthError(why)
    kt = KT.time_kernels({NAME: call}, config, backend, n_sets=copies, verify=verify, prepare=prepare)
    if kt.failures:
        raise BandwidthError("; ".join(kt.failures))
    return kt


def measure(so_path: str, *, nbytes: int | None = None, config: KT.KernelTimeConfig = CONFIG,
            backend=None) -> dict:
    """Time the streaming kernel on this process's GPU (torch's current stream). Returns
    {"status": "ok", "gbs", "ci": [lo, hi], "bytes", "us", "method", "peak_gbs", "of_peak",
    "device", "blocks", "threads", "rounds", "stopped", "seconds"}; raises BandwidthError."""
    import torch

    t0 = time.perf_counter()
    lib, dev = _open(so_path)
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(nbytes or buffer_bytes(dev["l2_bytes"], free))
    blocks = dev["sms"] * lib.blocks_per_sm()
    kt = _session(lib, nbytes, 1, blocks, config, backend or KT.CudaKernelBackend())
    iv = kt.time(NAME)
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


# ---- the ceilings table ---------------------------------------------------------------------------

def _error(exc: BaseException) -> dict:
    return {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:500]}


def _size_row(lib: StreamReadLib, dev: dict, nbytes: int, config, backend) -> dict:
    """One stream_read row: `nbytes` read cold, over cold_copies copies (fake device: synthetic)."""
    if fakedevice.enabled():
        return stream_entry(nbytes, *fakedevice.stream_read_at(nbytes),
                            cold_copies(nbytes, dev["l2_bytes"]))
    import torch

    copies = cold_copies(nbytes, dev["l2_bytes"], torch.cuda.mem_get_info()[0])
    kt = _session(lib, nbytes, copies, _grid(lib, dev, nbytes), config,
                  backend or KT.CudaKernelBackend())
    iv = kt.time(NAME)
    torch.cuda.empty_cache()
    return stream_entry(nbytes, iv.median, iv.lo, iv.hi, copies)


def measure_sizes(so_path: str, sizes, *, deadline: float = math.inf,
                  config: KT.KernelTimeConfig = SIZE_CONFIG, backend=None) -> tuple[list, list, list]:
    """The table's stream_read rows at `sizes` (bytes, multiples of 16): (rows, problems, sizes
    skipped because time.perf_counter() passed `deadline`); one size's failure is its own."""
    lib, dev = (StreamReadLib(so_path), fakedevice.device()) if fakedevice.enabled() else _open(so_path)
    rows, problems, skipped = [], [], []
    for nb in sizes:
        if time.perf_counter() > deadline:
            skipped.append(nb)
            continue
        try:
            rows.append(_size_row(lib, dev, nb, config, backend))
        except Exception as exc:  # noqa: BLE001 - one size's failure costs that size
            problems.append(f"{nb} B: {_error(exc)['detail']}")
    return rows, problems, skipped


def measure_copy(nbytes: int, *, config: KT.KernelTimeConfig = COPY_CONFIG, backend=None) -> dict:
    """Time a device-to-device copy of `nbytes` (Tensor.copy_) on this process's GPU: the
    table's device_copy row (GB/s of bytes read + written); raises BandwidthError."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    src.random_()
    dst = torch.zeros_like(src)

    def call(_i: int) -> None:
        dst.copy_(src)

    call(0)
    torch.cuda.synchronize()
    if not torch.equal(dst, src):
        raise BandwidthError("the device copy's output differs from its source")
    kt = KT.time_kernels({"device_copy": call}, config, backend or KT.CudaKernelBackend(), n_sets=1)
    iv = kt.time("device_copy")
    del src, dst
    torch.cuda.empty_cache()
    return copy_entry(nbytes, iv.median, iv.lo, iv.hi)


def copy_part(nbytes: int | None) -> dict:
    """The table's device_copy: the large buffer copied (its size found here when the stream read
    gave none; fake device: synthetic), or {"status": "error", "detail"}; never raises."""
    try:
        if fakedevice.enabled():
            nb = nbytes or MIN_BUFFER_BYTES
            return copy_entry(nb, *fakedevice.device_copy(nb))
        if not nbytes:
            import torch
            l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
            nbytes = buffer_bytes(l2, torch.cuda.mem_get_info()[0])
        return measure_copy(nbytes)
    except Exception as exc:  # noqa: BLE001 - the copy's failure costs the copy
        return _error(exc)


def _in_time(deadline: float, budget_s: float, part):
    """part(), or not_measured when the task's budget is spent."""
    if time.perf_counter() > deadline:
        return {"status": "not_measured", "detail": f"budget: the ceilings' {budget_s:.0f} s were spent"}
    return part()


def _table(rows: list, problems: list, skipped: list, copy: dict, launch: dict, dev: dict,
           seconds: float) -> dict:
    """summary["ceilings"]: status ok, or error when a stream size failed, or not_measured when
    the budget skipped some (the rows measured are kept either way)."""
    head: dict = {"status": "ok"}
    if problems:
        head = {"status": "error", "detail": "stream read: " + "; ".join(problems)[:500]}
    elif skipped:
        head = {"status": "not_measured",
                "detail": f"budget: stream read of {len(skipped)} size(s) not measured: {skipped}"[:500]}
    return dict(head, method=CEILINGS_METHOD, stream_read=sorted(rows, key=lambda e: e["bytes"]),
                device_copy=copy, launch_floor=launch, device=dev,
                fake_device=fakedevice.enabled(), seconds=round(seconds, 3))


def empty_table(status: str, detail: str, seconds: float = 0.0) -> dict:
    """summary["ceilings"] in its full shape when no part was measured (every part says why)."""
    why = {"status": status, "detail": detail}
    return dict(why, method=CEILINGS_METHOD, stream_read=[], device_copy=dict(why),
                launch_floor=dict(why), device={}, fake_device=fakedevice.enabled(),
                seconds=round(seconds, 3))


def ceilings_task(stream_so: str | None, floor_so: str | None = None, cublas_so: str | None = None,
                  *, sizes=(), acc: str = "f32", budget_s: float = CEILINGS_BUDGET_S) -> dict:
    """Worker task (a GPU worker, or the fake device of a CPU rehearsal): {"bandwidth": the large
    buffer's measurement (measure_task's answer), "ceilings": the table}. In order: the large
    buffer, the launch floor (floor_so; cuBLAS's smallest GEMM from cublas_so, accumulating in
    `acc`), the stream read at `sizes`, the device copy; each part fails on its own, and none
    starts past `budget_s` into the task. Never raises."""
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    try:
        big = measure_task(stream_so) if stream_so else {"status": "not_measured",
                                                         "detail": "no streaming kernel"}
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the large buffer's own failure
        big = _error(exc)
    launch = _in_time(deadline, budget_s, lambda: floor.measure_part(floor_so, cublas_so, acc=acc))
    rows, problems, skipped = [], [], []
    if big["status"] == "ok":
        rows.append(stream_entry(big["bytes"], big["us"]["median"], big["us"]["lo"], big["us"]["hi"], 1))
        try:
            more, problems, skipped = measure_sizes(stream_so, [b for b in sizes if b != big["bytes"]],
                                                    deadline=deadline)
            rows += more
        except Exception as exc:  # noqa: BLE001 - the library or device: every size lost
            problems.append(_error(exc)["detail"])
    else:
        problems.append(f"the large buffer: {big.get('detail', big['status'])}")
    copy = _in_time(deadline, budget_s, lambda: copy_part(big.get("bytes")))
    dev = big.get("device") or (fakedevice.device() if fakedevice.enabled() else {})
    return {"bandwidth": big,
            "ceilings": _table(rows, problems, skipped, copy, launch, dev, time.perf_counter() - t0)}


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def ceiling_lines(c: dict | None) -> list[str]:
    """One line per part of the ceilings table (stream read by size, device copy, launch floor),
    or one saying why there is no table."""
    if not c or "stream_read" not in c:
        why = f" ({c.get('status')}: {c.get('detail', '')})" if c else ""
        return [f"ceilings: not measured{why}"]
    fake = " [fake device]" if c.get("fake_device") else ""
    status = "" if c.get("status") == "ok" else f" ({c.get('status')}: {c.get('detail', '')})"
    rows = ", ".join(f"{_mib(e['bytes'])} {e['gbs']:.0f} GB/s x{e['copies']}" for e in c["stream_read"])
    cp = c["device_copy"]
    copy = (f"device copy {cp['gbs']:.0f} GB/s [{cp['ci'][0]:.0f}, {cp['ci'][1]:.0f}] (read + written) "
            f"over {_mib(cp['bytes'])}" if "gbs" in cp
            else f"device copy: not measured ({cp.get('status')}: {cp.get('detail', '')})")
    return [f"ceilings: stream read {rows or 'none'}{status}{fake}", copy + fake,
            floor.line(c["launch_floor"]) + fake]


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
