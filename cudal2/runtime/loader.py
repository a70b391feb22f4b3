"""Table kernels built (or taken from the table's carried binaries) and loaded lazily, once per
source, and the buffers their calls need."""
from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from pathlib import Path
from typing import Callable

import torch

from cudal2.core import binaries, knobs
from cudal2.core.abi import load_library
from cudal2.core.build import BuildSpec, build, lookup
from cudal2.core.toolchain import ToolchainError

log = logging.getLogger("cudal2.runtime")

BUILD_IN_CALL_WARNING = ("cudal2: building %s for %s inside this call (not built yet: run "
                         "`cudal2 warmup`; CUDAL2_BUILD_IN_CALL=0 serves torch instead)")


class KernelLoadError(RuntimeError):
    """A table kernel could not be built or loaded; the message names the file and why."""


class KernelNotBuilt(KernelLoadError):
    """The kernel is not built yet and CUDAL2_BUILD_IN_CALL=0 forbids building it inside a call.
    Not remembered as a failure: once `cudal2 warmup` has built it, it loads."""


def build_and_load(source: str, arch: str, name: str):
    """Build (through the cache: a kernel the tuner built is a cache hit) and load one kernel."""
    res = build(BuildSpec(source=source, arch=arch, name=name), key_on_load=False)   # no cuobjdump in a call
    if not res.ok:
        tail = res.log.strip()[-1500:]
        raise KernelLoadError(f"{name}: build {res.status}: {tail}")
    return load_library(res.so_path)


def is_built(source: str, arch: str) -> bool:
    """Whether build_and_load would find the kernel in the build cache (no nvcc run). Raises
    ToolchainError without nvcc."""
    return lookup(BuildSpec(source=source, arch=arch)) is not None


def _torch_cuda() -> str | None:
    return torch.version.cuda


class KernelLoader:
    """sha256 -> loaded KernelLibrary, built at most once per process.

    A lock per source guards the first build/load (concurrent first calls wait for one build);
    after that a lookup is a dict get. Failures are remembered so a broken kernel is not rebuilt
    on every call. Before building, a binary the kernel's table carries (cudal2.core.binaries)
    is loaded if its provenance checks out here; a kernel not in the build cache is built inside
    the call only when CUDAL2_BUILD_IN_CALL allows it, announced at WARNING.

    The cache lookup belongs to the builder: a loader given its own `build_and_load` is told
    what is built by `is_built` (default: everything, the builder answers for its own cache).
    `load_binary` loads a carried .so (default abi.load_library); `cuda` gives the running
    torch's CUDA version (default torch.version.cuda).
    """

    def __init__(self, build_and_load: Callable[..., object] | None = None, *,
                 is_built: Callable[[str, str], bool] | None = None,
                 load_binary: Callable[[Path], object] | None = None,
                 cuda: Callable[[], str | None] | None = None):
        own = build_and_load is None
        self._build_and_load = build_and_load or globals()["build_and_load"]
        self._is_built = is_built or (globals()["is_built"] if own else (lambda source, arch: True))
        self._load_binary = load_binary or load_library
        self._cuda = cuda or _torch_cuda
        self._libs: dict[str, object] = {}
        self._errors: dict[str, Exception] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, sha: str, source: Callable[[], str], arch: str, name: str = "kernel", *,
            carried: tuple[Path, str] | None = None, call: str = ""):
        """The loaded kernel keyed `sha`. `carried`: (table root, source sha256) where the table
        may carry its binary; `call`: the shape being served ('MxNxK RR'), for the log."""
        lib = self._libs.get(sha)
        if lib is not None:
            return lib
        with self._guard:
            lock = self._locks.setdefault(sha, threading.Lock())
        with lock:
            lib = self._libs.get(sha)
            if lib is not None:
                return lib
            err = self._errors.get(sha)
            if err is not None:
                raise err
            try:
                lib = self._load(source, arch, name, carried, call)
            except KernelNotBuilt:
                raise                 # not a failure: warmup may build it later
            except Exception as exc:  # a bad kernel is data: remember it, serve torch instead
                self._errors[sha] = exc
                raise
            self._libs[sha] = lib
            return lib

    def _load(self, source, arch, name, carried, call):
        if carried is not None:
            lib = self._carried(*carried, arch, name)
            if lib is not None:
                return lib
        text = source()
        try:
            built = self._is_built(text, arch)
        except ToolchainError as exc:
            raise KernelLoadError(f"{name}: not built here and no nvcc to build it ({exc})") from None
        if not built:
            if not knobs.build_in_call():
                raise KernelNotBuilt(f"{name}: not built yet and CUDAL2_BUILD_IN_CALL=0")
            log.warning(BUILD_IN_CALL_WARNING, name, call or "its first shape")
        return self._build_and_load(text, arch, name)

    def _carried(self, root, sha: str, arch: str, name: str):
        """The table's carried binary, loaded, if its provenance checks out; else None (said at
        WARNING when the table carries one that is refused: once, as the kernel then builds
        or fails and is remembered)."""
        so, why = binaries.check(root, arch, sha, cuda=self._cuda())
        if so is None:
            if why:
                log.warning("cudal2: not using the carried binary of %s: %s; building it instead",
                            name, why)
            return None
        try:
            return self._load_binary(so)
        except Exception as exc:  # noqa: BLE001 - e.g. its libcudart is not here: build instead
            log.warning("cudal2: the carried binary %s of %s does not load (%s); building it "
                        "instead", so, name, exc)
            return None


def launcher(lib, M: int, N: int, K: int, options=None) -> tuple:
    """The serving-table value of a kernel for one shape: (raw ctypes function, workspace bytes,
    the same as a c_size_t, the options array or None for ABI 1, whether its workspace must start
    zero), built once so a launch converts nothing it can reuse (abi.raw_launch's convention).
    CUDAL2_PDL=1 sets option pdl to 1 in the kernels that declare it."""
    if knobs.pdl() and any(o.get("name") == "pdl" for o in lib.meta.get("options") or []):
        options = {**dict(options or {}), "pdl": 1}
    opts = lib.options(options or None)
    ws_bytes = lib.workspace_bytes(M, N, K, opts)
    zero = bool(lib.meta.get("workspace_zero_init"))
    return (lib.raw_launch, ws_bytes, ctypes.c_size_t(ws_bytes), opts, zero)


class Workspaces:
    """The workspace a kernel call gets, grown as needed (kernels never allocate).

    Eager calls: one buffer per (device, stream), and kernels declaring workspace_zero_init
    (docs/abi.md) their own buffer per (device, stream): zeroed when it is allocated, never
    again; each such call leaves it zero. The others may leave anything in theirs.

    Calls inside a CUDA graph capture: a buffer per captured graph (held while the graph lives),
    never a stream's. Graphs captured on one capture stream and one memory pool would otherwise
    share one buffer, zeroed only by the graph that allocated it: replayed first, another graph
    would find a split-K semaphore holding garbage. A graph's zero-init buffer is zeroed inside
    that graph (a memset node before its first zero-init kernel), so every replay starts from
    zero whatever the order of replays. A capture whose graph cannot be named gets None: the
    caller serves torch instead."""

    def __init__(self, capturing: Callable[[], bool] | None = None,
                 capturing_graph: Callable[[], object] | None = None,
                 alloc: Callable[[int, int, bool], torch.Tensor] | None = None):
        self._capturing = capturing or _capturing
        self._capturing_graph = capturing_graph or _capturing_graph
        self._alloc = alloc or _alloc
        self._bufs: dict[tuple, torch.Tensor] = {}
        self._graph_bufs: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()

    def get(self, dev: int, stream: int, nbytes: int, zero: bool = False) -> int | None:
        """The device pointer of a buffer of at least nbytes; None inside a capture whose graph
        is unknown."""
        if self._capturing():
            graph = self._capturing_graph()
            if graph is None:
                return None
            bufs = self._graph_bufs.setdefault(graph, {})
            key = (dev, zero)
        else:
            bufs, key = self._bufs, (dev, stream, zero)
        buf = bufs.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = self._alloc(dev, max(nbytes, 1 << 20), zero)
            bufs[key] = buf
        return buf.data_ptr()

    def clear(self) -> None:
        self._bufs.clear()
        self._graph_bufs.clear()


def _alloc(dev: int, nbytes: int, zero: bool) -> torch.Tensor:
    # on the current stream: inside a capture, from the graph's pool, a zero-fill recorded in it
    return (torch.zeros if zero else torch.empty)(nbytes, dtype=torch.uint8, device=f"cuda:{dev}")


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def _capturing_graph():
    """The torch.cuda.CUDAGraph being captured on the current stream (weakly referenceable), or
    None where this torch cannot say."""
    get = getattr(getattr(torch._C, "_CUDAGraph", None), "get_currently_capturing_graph", None)
    try:
        graph = get() if get is not None else None
        weakref.ref(graph)
    except Exception:  # noqa: BLE001 - an older torch, or a graph object no weakref can hold
        return None
    return graph
