"""The call guard: what a kernel library calls at run time, checked by behaviour, not by name.

callguard.c is an LD_PRELOAD library for the GPU worker. While the worker's thread is armed
(around every call into a kernel library), it records each CUDA runtime call the library makes,
refuses the ones the ABI forbids (REFUSED: they return cudaErrorNotPermitted and never reach the
runtime), and lets the driver entry-point door (cudaGetDriverEntryPoint*, cuGetProcAddress*)
hand out only the driver functions on cudacalls.DRIVER_ENTRY_POINTS (the audit's
ALLOWED_DRIVER_ENTRY_POINTS), whatever name the code assembled at run time. Every launch and
memset (STREAM_CALLS, CONFIG_CALLS, and the driver's launch functions the door hands out) must be
on the stream of the cudal2_hgemm call being made (`Guard.armed(stream=...)`): a kernel that
works on the per-thread or legacy default stream, or any other, races the caller's work on
every stream but the harness's. The static audit reads names; this sees calls.

build() compiles it (the host C compiler, once per source and name lists, cached);
preload_env() is an environment with it preloaded; Guard reads it in the process it was
preloaded into; dry_call() is the worker task of `cudal2 audit`'s dry call (audit.check_dry_call),
the guard's check before a GPU sees the library.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.abi import KernelLibrary
from cudal2.core.vocab import AUDIT_VERSION
from cudal2.harness.cudacalls import DRIVER_ENTRY_POINTS, RUNTIME_ALLOWED
from cudal2.harness.metacheck import FAKE_POINTER, claimed_shape

SOURCE = Path(__file__).with_name("callguard.c")
DOORS = frozenset({"cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
                   "cuGetProcAddress", "cuGetProcAddress_v2"})

# The runtime calls a kernel library may not make during a call, with their per-thread-stream
# spellings. Each is also rejected by the static audit when imported (tests check both agree);
# here they are refused even when reached without an import (a pointer handed out by the door
# or computed from one is not: the door itself is guarded).
REFUSED = tuple(sorted({
    # synchronisation
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaStreamSynchronize_ptsz",
    "cudaEventSynchronize", "cudaThreadSynchronize", "cudaStreamQuery", "cudaStreamQuery_ptsz",
    "cudaEventQuery",
    # allocation and copies
    "cudaMalloc", "cudaMallocAsync", "cudaMallocAsync_ptsz", "cudaMallocHost", "cudaHostAlloc",
    "cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocArray",
    "cudaMallocFromPoolAsync", "cudaFree", "cudaFreeAsync", "cudaFreeAsync_ptsz", "cudaFreeHost",
    "cudaHostRegister", "cudaMemPoolCreate", "cudaMemcpy", "cudaMemcpyAsync",
    "cudaMemcpyAsync_ptsz", "cudaMemcpy2D", "cudaMemcpy2DAsync", "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol", "cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync",
    "cudaMemcpyPeer", "cudaMemcpyPeerAsync", "cudaMemcpy3D", "cudaMemcpy3DAsync",
    # streams, events, graphs, host functions, stream attributes
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
    "cudaStreamDestroy", "cudaStreamWaitEvent", "cudaStreamWaitEvent_ptsz",
    "cudaStreamSetAttribute", "cudaStreamSetAttribute_ptsz", "cudaStreamAddCallback",
    "cudaStreamAddCallback_ptsz", "cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz",
    "cudaStreamEndCapture", "cudaStreamEndCapture_ptsz", "cudaStreamAttachMemAsync",
    "cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventRecord", "cudaEventRecord_ptsz",
    "cudaEventRecordWithFlags", "cudaEventDestroy", "cudaEventElapsedTime",
    "cudaGraphCreate", "cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags", "cudaGraphDestroy", "cudaGraphExecDestroy",
    "cudaLaunchHostFunc", "cudaLaunchHostFunc_ptsz",
    # device state and limits
    "cudaDeviceSetLimit", "cudaDeviceSetCacheConfig", "cudaDeviceSetSharedMemConfig",
    "cudaDeviceReset", "cudaSetDevice", "cudaDeviceSetMemPool", "cudaCtxResetPersistingL2Cache",
    # pointers to code or data by symbol: the same class as the door
    "cudaGetFuncBySymbol", "cudaGetSymbolAddress",
}))


# The allowed runtime calls that put work on a stream: launches (nvcc's <<<>>> lowering is
# __cudaLaunchKernel, or cudaLaunchKernel under __NV_LEGACY_LAUNCH) and the workspace memset, each
# with the argument slot of its stream (x86-64 and aarch64 pass a dim3 in two integer slots).
# A _ptsz spelling reads stream 0 as the per-thread stream.
STREAM_CALLS = {
    "cudaLaunchKernel": 7, "cudaLaunchKernel_ptsz": 7, "__cudaLaunchKernel": 7,
    "__cudaLaunchKernel_ptsz": 7, "cudaLaunchCooperativeKernel": 7,
    "cudaLaunchCooperativeKernel_ptsz": 7, "cudaMemsetAsync": 3, "cudaMemsetAsync_ptsz": 3,
}
# Launches whose stream and attributes are in a cudaLaunchConfig_t (argument 0).
CONFIG_CALLS = ("cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz")


def recorded_calls() -> tuple[str, ...]:
    """The allowed runtime calls, recorded and passed on: the audit's runtime allowlist less the
    door and the stream calls (each has wrappers of its own)."""
    return tuple(sorted(RUNTIME_ALLOWED - DOORS - set(STREAM_CALLS) - set(CONFIG_CALLS)))


def header() -> str:
    """The name lists callguard.c is compiled with."""
    rec = " ".join(f"X({n})" for n in recorded_calls())
    ref = " ".join(f"X({n})" for n in REFUSED)
    streams = " ".join(f"X({n}, {slot}, {int(n.endswith('_ptsz'))})"
                       for n, slot in sorted(STREAM_CALLS.items()))
    configs = " ".join(f"X({n}, {int(n.endswith('_ptsz'))})" for n in CONFIG_CALLS)
    eps = ", ".join(f'"{n}"' for n in sorted(DRIVER_ENTRY_POINTS))
    return (f"#define CUDAL2_RECORDED(X) {rec}\n#define CUDAL2_REFUSED(X) {ref}\n"
            f"#define CUDAL2_STREAM_CALLS(X) {streams}\n#define CUDAL2_CONFIG_CALLS(X) {configs}\n"
            f"#define CUDAL2_ENTRY_POINTS {eps}, 0\n")


class CallGuardError(RuntimeError):
    """The call guard could not be built (no host C compiler, a compile error)."""


def build(cache: Path | None = None) -> Path:
    """libcudal2_callguard.so, compiled once per source and name lists with the host C
    compiler (cc/gcc/clang) into the cudal2 cache."""
    text, hdr = SOURCE.read_text(), header()
    key = hashlib.sha256((text + "\0" + hdr).encode()).hexdigest()[:16]
    out_dir = (cache or knobs.cache_dir()) / "callguard" / key
    so = out_dir / "libcudal2_callguard.so"
    if so.is_file():
        return so
    cc = next((shutil.which(c) for c in (os.environ.get("CC", ""), "cc", "gcc", "clang")
               if c and shutil.which(c)), None)
    if cc is None:
        raise CallGuardError("the call guard needs a host C compiler (cc, gcc or clang)")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "callguard_names.h").write_text(hdr)
    tmp = out_dir / f".{os.getpid()}.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-std=gnu11", "-include",
                        str(out_dir / "callguard_names.h"), "-o", str(tmp), str(SOURCE), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise CallGuardError(f"building {SOURCE.name} failed: {r.stderr[-2000:]}")
    os.replace(tmp, so)
    return so


def preload_env(base: dict | None = None, *, cache: Path | None = None) -> dict:
    """`base` (default: this process's environment) with the call guard first on LD_PRELOAD.
    Builds it: CallGuardError (or OSError) when it cannot be built."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join([str(build(cache))] + env.get("LD_PRELOAD", "").split())
    return env


class Guard:
    """The preloaded call guard of this process (None from `active()` when not preloaded)."""

    def __init__(self, lib):
        self._lib = lib
        lib.cudal2_guard_name.restype = ctypes.c_char_p
        lib.cudal2_guard_name.argtypes = [ctypes.c_int]
        lib.cudal2_guard_refused.argtypes = [ctypes.c_int]
        lib.cudal2_guard_arm.argtypes = [ctypes.c_int]
        lib.cudal2_guard_expect.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.cudal2_guard_refused_name.restype = ctypes.c_char_p
        lib.cudal2_guard_refused_name.argtypes = [ctypes.c_int]

    @classmethod
    def active(cls) -> "Guard | None":
        try:
            lib = ctypes.CDLL(None)
            lib.cudal2_guard_arm            # noqa: B018 - present only when preloaded
        except (OSError, AttributeError):
            return None
        return cls(lib)

    @contextlib.contextmanager
    def armed(self, stream: int | None = None):
        """Record (and police) the calling thread's CUDA calls inside the block. `stream`: the
        block is a cudal2_hgemm call on that stream (its raw handle; 0 the legacy default
        stream), the one stream its launches may use; None: no call, nothing may launch."""
        self._lib.cudal2_guard_expect(int(stream is not None), stream or None)
        self._lib.cudal2_guard_arm(1)
        try:
            yield self
        finally:
            self._lib.cudal2_guard_arm(0)
            self._lib.cudal2_guard_expect(0, None)

    def reset(self) -> None:
        self._lib.cudal2_guard_reset()

    def calls(self) -> list[tuple[str, bool]]:
        """(name, refused) of every call recorded since the last reset, in order; a door
        request reads 'cudaGetDriverEntryPoint:cuTensorMapEncodeTiled'."""
        n = self._lib.cudal2_guard_count()
        return [(self._lib.cudal2_guard_name(i).decode(errors="replace"),
                 bool(self._lib.cudal2_guard_refused(i))) for i in range(n)]

    def refused(self) -> list[str]:
        """Every refused call since the last reset, in order (a log of its own: however many
        allowed calls came first; the first 256 by name, the rest as a count)."""
        n = self._lib.cudal2_guard_refused_count()
        names = [self._lib.cudal2_guard_refused_name(i).decode(errors="replace")
                 for i in range(min(n, 256))]
        return names + ([f"... {n - 256} more"] if n > 256 else [])

    def dropped(self) -> int:
        """Calls past the log's capacity (4096 since the last reset): counted, not named."""
        return self._lib.cudal2_guard_dropped()


# ---- the audit's dry call (a worker task; audit.check_dry_call reads its answer) ----------------
DRY_SHAPE = (16, 16, 16)       # when the meta claims no shape (a malformed tile: the audit says so)
# The dry call's stream: a handle that is none of the default streams (0, legacy 1, per-thread 2),
# so a launch on any of those is seen; without a device the runtime never reads it.
DRY_STREAM = 0x5EED0000


def dry_call(so_path: str) -> dict:
    """Worker task, in a worker with the guard preloaded and no device visible: armed
    throughout, load the library (its static constructors run), read its meta, ask its
    workspace (cudal2_workspace, ABI 2) and call cudal2_hgemm once at the smallest shape its
    meta claims (metacheck.claimed_shape), every option at its default, on DRY_STREAM, with
    dummy pointers nothing dereferences (the runtime, without a device, launches nothing).
    Returns the call's answer and what the guard saw, under the rules of AUDIT_VERSION."""
    guard = Guard.active()
    if guard is None:
        raise RuntimeError("the call guard is not preloaded in this worker")
    guard.reset()
    p = FAKE_POINTER
    with guard.armed():
        lib = KernelLibrary(so_path)
        meta = lib.meta
        M, N, K = claimed_shape(meta) or DRY_SHAPE
        ws = lib.workspace_bytes(M, N, K)
    with guard.armed(stream=DRY_STREAM):
        rc = lib.launch(p, p, p, M, N, K, K, K if meta["layout"] == "RC" else N, N,
                        p if ws else 0, ws, DRY_STREAM)
    return {"shape": [M, N, K], "rc": rc, "workspace_bytes": ws, "rules": AUDIT_VERSION,
            "calls": [name for name, _ in guard.calls()], "calls_not_named": guard.dropped(),
            "refused": guard.refused()}
