"""The launch floor: the least any kernel costs by kernel time, on the device the GEMMs run on.

Three callables timed in one kernel-time session (cudal2.timing.kerneltime: the same timer, the
same spin and one untimed call ahead of each sample as the finals), back to back on torch's
current stream, operands hot (one set; the floor is the launch and the least work, not memory):
  empty            an empty kernel <<<1, 32>>>               (baselines/launch_floor.cu)
  one_cta          one CTA of 32 threads, dst[i] = src[i] + 1 (its output checked every round)
  cublas_smallest  the packed cuBLAS baseline (cublasGemmEx NN) on CUBLAS_SHAPE, the smallest GEMM
                   a shape list holds (its output checked against torch every round)
A small shape's time reads against this floor: a 16x16x16 GEMM cannot take less than the empty
kernel, and cuBLAS's floor is what beating cuBLAS on tiny shapes is measured from.

`measure` needs a GPU; `measure_part` is what the ceilings table calls (a failure becomes
{"status": "error", "detail"}; the fake device answers with synthetic times, the libraries
loaded for real).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from cudal2.core.build import BuildSpec, build_so
from cudal2.harness import fakedevice
from cudal2.timing import kerneltime as KT

NAME = "launch_floor"
SOURCE = Path(__file__).resolve().parent / "baselines" / "launch_floor.cu"
EXPORTS = ("cudal2_baseline_abi", "cudal2_launch_floor_threads", "cudal2_launch_empty",
           "cudal2_launch_one_cta")
CUBLAS_SHAPE = (16, 16, 16)       # cuBLAS takes any M, N, K >= 1; 16 is the smallest a list holds
THREADS = 32
# a call is ~2-5 us: 64 calls (the most a sample takes) per sample, rounds until the intervals
# are within 1% or 0.5 s, the finals' untimed call ahead of each sample
CONFIG = KT.KernelTimeConfig(sample_us=200.0, max_calls=64, warmup_ms=2.0, min_rounds=6,
                             max_rounds=30, budget_s=0.5, target=0.01, operands="hot",
                             precall=True)
METHOD = ("launch floor: an empty kernel <<<1, 32>>> and a one-CTA load/store kernel "
          "(baselines/launch_floor.cu) and cuBLAS (cublasGemmEx NN, the packed baseline) at "
          f"{CUBLAS_SHAPE[0]}x{CUBLAS_SHAPE[1]}x{CUBLAS_SHAPE[2]}, timed together by kernel time "
          "(64 back-to-back calls per sample, one untimed call ahead, hot operands; median of "
          "rounds, bootstrap interval), outputs checked every round")


class FloorError(RuntimeError):
    """The floor's kernels could not be built, loaded or run; the message says which."""


def source() -> str:
    return SOURCE.read_text()


def spec(arch: str) -> BuildSpec:
    return BuildSpec(source(), arch, name="baseline-launch-floor")


def build_launch_floor(arch: str, *, cache: Path | None = None) -> str:
    """Build the floor's kernels for `arch` through the build cache (no GPU needed); its .so."""
    return build_so(spec(arch), FloorError, "the launch-floor kernels", cache=cache)


class FloorLib:
    """The built .so through ctypes (loaded the way the baselines are)."""

    def __init__(self, so_path: str):
        from cudal2.harness.baselines import load_checked
        self.lib = L = load_checked(so_path, EXPORTS, FloorError)
        L.cudal2_launch_floor_threads.restype = ctypes.c_int
        L.cudal2_launch_empty.argtypes = [ctypes.c_void_p]
        L.cudal2_launch_empty.restype = ctypes.c_int
        L.cudal2_launch_one_cta.argtypes = [ctypes.c_void_p] * 3
        L.cudal2_launch_one_cta.restype = ctypes.c_int
        self.empty, self.one_cta = L.cudal2_launch_empty, L.cudal2_launch_one_cta
        self.threads = int(L.cudal2_launch_floor_threads())


def interval(median: float, lo: float, hi: float) -> dict:
    """The table's µs entry of one callable."""
    return {"median": median, "lo": lo, "hi": hi}


def _checked(status: int, what: str) -> None:
    if status:
        raise FloorError(f"{what} failed (status {status})")


def _one_cta(lib: FloorLib, torch) -> tuple:
    """(call, verify, prepare) of the one-CTA kernel: 32 words in, each plus one out."""
    src = torch.randint(0, 1 << 30, (THREADS,), dtype=torch.int32, device="cuda")
    dst = torch.zeros_like(src)
    a, b = src.data_ptr(), dst.data_ptr()

    def call(_i: int) -> None:
        _checked(lib.one_cta(a, b, torch.cuda.current_stream().cuda_stream), "the one-CTA launch")

    def verify() -> str | None:
        return None if torch.equal(dst, src + 1) else "the one-CTA kernel's output is wrong"
    return call, verify, dst.zero_


def _cublas(cublas_so: str, acc: str, torch) -> tuple:
    """(call, verify, prepare, close) of cuBLAS on CUBLAS_SHAPE: NaN into C before each sample,
    C against torch's fp32 product after it."""
    from cudal2.harness.baselines import BaselineRunners
    M, N, K = CUBLAS_SHAPE
    runners = BaselineRunners({"cublas": cublas_so}, M, N, K, acc, "RR")
    fn = runners.launcher("cublas_nn")
    a = torch.randn(M, K, device="cuda").half()
    b = torch.randn(K, N, device="cuda").half()
    c = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    want = a.float() @ b.float()

    def call(_i: int) -> None:
        _checked(fn(a, b, b, c), "cublasGemmEx")

    def verify() -> str | None:
        ok = torch.allclose(c.float(), want, rtol=1e-2, atol=5e-2)
        return None if ok else "cuBLAS's output differs from torch's product"
    return call, verify, lambda: c.fill_(float("nan")), runners.close


def measure(so_path: str, cublas_so: str | None = None, *, acc: str = "f32",
            config: KT.KernelTimeConfig = CONFIG, backend=None) -> dict:
    """Time the floor on this process's GPU. Returns {"empty": µs, "one_cta": µs,
    "cublas_smallest": µs + "shape" | {"status", "detail"}} (µs: {"median", "lo", "hi"});
    raises FloorError."""
    import torch

    lib = FloorLib(so_path)
    stream = lambda: torch.cuda.current_stream().cuda_stream          # noqa: E731
    calls = {"empty": lambda _i: _checked(lib.empty(stream()), "the empty launch")}
    checks, preps, close = {}, {}, None
    calls["one_cta"], checks["one_cta"], preps["one_cta"] = _one_cta(lib, torch)
    cublas = {"status": "not_measured", "detail": "no cuBLAS baseline library given"}
    if cublas_so:
        try:
            calls["cublas"], checks["cublas"], preps["cublas"], close = _cublas(cublas_so, acc, torch)
        except Exception as exc:  # noqa: BLE001 - cuBLAS's failure costs its floor, not the others
            cublas = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        for name, fn in calls.items():           # each runs and checks once before timing
            preps.get(name, lambda: None)()
            fn(0)
            torch.cuda.synchronize()
            why = checks.get(name, lambda: None)()
            if why:
                raise FloorError(why)
        kt = KT.time_kernels(calls, config, backend or KT.CudaKernelBackend(), n_sets=1,
                             verify=lambda n, _i: checks.get(n, lambda: None)(),
                             prepare=lambda n: preps.get(n, lambda: None)())
    finally:
        if close:
            close()
    if kt.failures:
        raise FloorError("; ".join(kt.failures))
    out = {n: interval(*_miv(kt, n)) for n in ("empty", "one_cta")}
    if "cublas" in calls:
        cublas = dict(interval(*_miv(kt, "cublas")), shape=list(CUBLAS_SHAPE))
    return dict(out, cublas_smallest=cublas)


def _miv(kt, name: str) -> tuple[float, float, float]:
    iv = kt.time(name)
    return iv.median, iv.lo, iv.hi


def fake(so_path: str, cublas_so: str | None = None) -> dict:
    """The fake device's floor in the measurement's shape: the libraries loaded for real, the
    times synthetic (fakedevice.launch_floor), its session slept."""
    FloorLib(so_path)
    us = fakedevice.launch_floor()
    out = {n: interval(us[n], us[n] * 0.99, us[n] * 1.01) for n in ("empty", "one_cta")}
    cublas = {"status": "not_measured", "detail": "no cuBLAS baseline library given"}
    if cublas_so:
        try:
            from cudal2.harness.baselines import CublasLib
            CublasLib(cublas_so)
            t = us["cublas_smallest"]
            cublas = dict(interval(t, t * 0.99, t * 1.01), shape=list(CUBLAS_SHAPE))
        except Exception as exc:  # noqa: BLE001 - as on a GPU: cuBLAS's failure is its own
            cublas = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    return dict(out, cublas_smallest=cublas)


def measure_part(so_path: str | None, cublas_so: str | None = None, *, acc: str = "f32") -> dict:
    """The ceilings table's "launch_floor": the floor (fake device: synthetic), or
    {"status": "not_measured" | "error", "detail"}; never raises."""
    if not so_path:
        return {"status": "not_measured", "detail": "no launch-floor library"}
    try:
        if fakedevice.enabled():
            return fake(so_path, cublas_so)
        return measure(so_path, cublas_so, acc=acc)
    except Exception as exc:  # noqa: BLE001 - the floor's failure costs the floor, never the table
        return {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:500]}


def line(m: dict | None) -> str:
    """One line for logs: 'launch floor: empty 2.1 us [2.0, 2.2], one CTA 2.4 us [..], cuBLAS
    16x16x16 4.6 us [..]', or why there is none."""
    if not m or "status" in m:
        why = f" ({m.get('status')}: {m.get('detail', '')})" if m else ""
        return f"launch floor: not measured{why}"

    def fmt(iv: dict) -> str:
        if "status" in iv:
            return f"{iv['status']} ({iv.get('detail', '')})"
        return f"{iv['median']:.2f} us [{iv['lo']:.2f}, {iv['hi']:.2f}]"
    cb = m["cublas_smallest"]
    shape = "x".join(map(str, cb.get("shape", CUBLAS_SHAPE)))
    return (f"launch floor: empty {fmt(m['empty'])}, one CTA {fmt(m['one_cta'])}, "
            f"cuBLAS {shape} {fmt(cb)}")
