"""The kernel ABI (docs/abi.md, the text of record), loaded with ctypes.

    int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K,
                     int lda, int ldb, int ldc, void* workspace, size_t workspace_bytes,
                     void* stream [, const int* options]);      // options: ABI 2 only
    size_t cudal2_workspace(int M, int N, int K, const int* options);   // ABI 2 only
    const char* cudal2_meta(void);

One .so per kernel, loaded once per process (RTLD_LOCAL, so identical symbol names in different
kernels never clash). Only trusted code (tables we exported, or the harness's worker process)
loads a library: loading runs the library's static constructors.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from pathlib import Path

from cudal2.core.toolchain import normalise_arch, pip_cuda_roots
from cudal2.core.vocab import ACCS, LAYOUTS, OPTION_NAME

ABI_SYMBOLS = ("cudal2_hgemm", "cudal2_meta")
ABI2_SYMBOLS = ABI_SYMBOLS + ("cudal2_workspace",)
ABI_VERSIONS = (1, 2)
META_KEYS = ("style", "arch", "acc", "layout", "tile", "any_shape", "workspace_bytes")


def abi_version(meta) -> int:
    """1 unless the meta says "abi": 2 (the runtime-options ABI)."""
    return int(meta.get("abi", 1) or 1)


def meta_options(meta) -> list[dict]:
    """The runtime options an ABI 2 kernel declares: [{"name", "values", "default"}] in call
    order ([] for ABI 1)."""
    return list(meta.get("options") or []) if abi_version(meta) == 2 else []


def option_values(meta, chosen=None) -> list[int]:
    """The options array for one call: each declared option's chosen value (`chosen` maps name ->
    int; missing names take the default). Raises AbiError naming an unknown name or a value the
    kernel does not list."""
    decl = meta_options(meta)
    chosen = dict(chosen or {})
    names = [o["name"] for o in decl]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise AbiError(f"option(s) {unknown} not declared by the kernel (it takes {names})")
    out = []
    for o in decl:
        v = chosen.get(o["name"], o["default"])
        if v not in o["values"]:
            raise AbiError(f"option {o['name']}={v!r} is not one of {o['values']}")
        out.append(int(v))
    return out


def meta_accepts(meta, M: int, N: int, K: int) -> bool:
    """Does a kernel (by its cudal2_meta) handle this shape? M, N, K multiples of `divisible`,
    then any_shape or multiples of its tile; ABI 1 split-K kernels also declare the largest M*N
    their workspace covers (splitk_max_mn), skinny kernels the largest M (max_m) or N (max_n)."""
    limit = meta.get("splitk_max_mn")
    if limit and M * N > int(limit):
        return False
    if meta.get("max_m") is not None and M > int(meta["max_m"]):   # skinny kernels
        return False
    if meta.get("max_n") is not None and N > int(meta["max_n"]):   # their mirror (skinny_n)
        return False
    div = meta.get("divisible")
    if isinstance(div, (list, tuple)) and len(div) == 3 and any(
            int(d) > 1 and x % int(d) for x, d in zip((M, N, K), div)):
        return False
    if meta.get("any_shape"):
        return True
    tile = meta.get("tile")
    if not isinstance(tile, (list, tuple)) or len(tile) != 3:
        return False
    bm, bn, bk = (int(t) for t in tile)
    return bm > 0 and bn > 0 and bk > 0 and M % bm == 0 and N % bn == 0 and K % bk == 0


_HGEMM_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_HGEMM2_ARGTYPES = _HGEMM_ARGTYPES + [ctypes.c_void_p]


class AbiError(RuntimeError):
    """A library does not honour the kernel ABI; the message names the file and the problem."""


def meta_problems(meta: dict, arch: str | None = None) -> list[str]:
    """Every way `meta` breaks the ABI's meta rules (docs/abi.md, "Meta"), [] when it keeps
    them; with `arch`, also whether it names that build arch. The one statement of the rules:
    the audit reports the whole list, loading refuses on the first."""
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        return [f"cudal2_meta() lacks {', '.join(missing)}"]
    out = []
    if meta["acc"] not in ACCS:
        out.append(f"meta acc must be one of {ACCS}, got {meta['acc']!r}")
    if meta["layout"] not in LAYOUTS:
        out.append(f"meta layout must be one of {LAYOUTS}, got {meta['layout']!r}")
    if arch is not None:
        try:
            if normalise_arch(str(meta["arch"])) != normalise_arch(arch):
                out.append(f"meta arch {meta['arch']!r} differs from the build arch {arch!r}")
        except ValueError:
            out.append(f"meta arch {meta['arch']!r} is not a known arch")
    tile = meta["tile"]
    if not (isinstance(tile, list) and len(tile) == 3
            and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tile)):
        out.append(f"meta tile must be [BM, BN, BK] positive ints, got {tile!r}")
    ws = meta["workspace_bytes"]
    if not (isinstance(ws, int) and not isinstance(ws, bool) and 0 <= ws <= (1 << 34)):
        out.append(f"meta workspace_bytes must be an int in [0, 16 GiB], got {ws!r}")
    if not isinstance(meta["any_shape"], bool):
        out.append(f"meta any_shape must be true/false, got {meta['any_shape']!r}")
    abi = meta.get("abi", 1)
    if abi not in ABI_VERSIONS:
        return out + [f"meta abi must be one of {ABI_VERSIONS}, got {abi!r}"]
    opts = meta.get("options", [])
    if not isinstance(opts, list):
        return out + [f"meta options must be a list, got {type(opts).__name__}"]
    if abi == 1 and opts:
        out.append('meta declares options but not "abi": 2')
    seen = set()
    for o in opts:
        ok = (isinstance(o, dict) and isinstance(o.get("name"), str)
              and re.fullmatch(OPTION_NAME, o["name"])
              and isinstance(o.get("values"), list) and o["values"]
              and all(isinstance(v, int) and not isinstance(v, bool) for v in o["values"])
              and o.get("default") in o["values"])
        if not ok:
            out.append(f"meta option {o!r} must be {{\"name\": a lower-case word, \"values\": "
                       "[int, ...], \"default\": one of the values}")
        elif o["name"] in seen:
            out.append(f"meta option {o['name']!r} declared twice")
        else:
            seen.add(o["name"])
    return out


def parse_meta(text: str, where: str = "cudal2_meta") -> dict:
    """The meta JSON of a library, checked against every rule; AbiError names the first broken."""
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AbiError(f"{where}: cudal2_meta() is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise AbiError(f"{where}: cudal2_meta() must be a JSON object, got {type(meta).__name__}")
    problems = meta_problems(meta)
    if problems:
        raise AbiError(f"{where}: {problems[0]}")
    return meta


def preload_cuda_runtime() -> None:
    """Make libcudart.so.N resolvable when the .so's runpath points to a build machine's folder:
    a library already loaded (by torch, or here from pip's nvidia packages) satisfies it by soname."""
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
    except ImportError:
        pass
    try:
        for root in pip_cuda_roots():
            for lib in sorted((root / "lib").glob("libcudart.so.*")):
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                return
    except OSError:
        pass


_GLOBAL_SCOPE = ctypes.CDLL(None)


class KernelLibrary:
    """A loaded kernel .so: its meta and a launch function."""

    def __init__(self, so_path: str | os.PathLike):
        self.path = Path(so_path)
        if not self.path.is_file():
            raise AbiError(f"{self.path}: no such kernel library")
        try:
            self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as first:
            if "libcudart" not in str(first):
                raise AbiError(f"{self.path}: cannot load: {first}") from None
            preload_cuda_runtime()
            try:
                self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as exc:
                raise AbiError(f"{self.path}: cannot load: {exc}") from None
        for symbol in ABI_SYMBOLS:
            if not hasattr(self._lib, symbol):
                raise AbiError(f"{self.path}: missing symbol {symbol} (extern \"C\" required)")
        self._meta_fn = self._lib.cudal2_meta
        self._meta_fn.restype = ctypes.c_char_p
        self._meta_fn.argtypes = []
        self._hgemm = self._lib.cudal2_hgemm
        self._hgemm.restype = ctypes.c_int
        self._hgemm.argtypes = _HGEMM_ARGTYPES
        # A second function object for the same symbol without argtypes: ctypes' per-argument
        # converters cost ~0.2 us per call more than pre-typed arguments (see raw_launch).
        self._hgemm_raw = self._lib["cudal2_hgemm"]
        self._hgemm_raw.restype = ctypes.c_int
        self._meta: dict | None = None
        self._workspace_fn = None
        self._option_arrays: dict[tuple, object] = {}

    @property
    def abi(self) -> int:
        return abi_version(self.meta)

    def _check_abi2(self) -> None:
        """ABI 2 kernels take the options pointer and export cudal2_workspace: set both up."""
        if self._workspace_fn is not None or self.abi != 2:
            return
        if not hasattr(self._lib, "cudal2_workspace"):
            raise AbiError(f"{self.path}: meta says abi 2 but cudal2_workspace is not exported")
        fn = self._lib.cudal2_workspace
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self._workspace_fn = fn
        self._hgemm.argtypes = _HGEMM2_ARGTYPES

    def options(self, chosen=None):
        """The options argument for `chosen` ({name: int}; missing names take their default):
        None for an ABI 1 kernel (which takes none; naming one raises AbiError), else a ctypes
        int array, cached, so the pointer stays valid for the library's lifetime."""
        if self.abi != 2:
            if chosen:
                raise AbiError(f"{self.path}: options {dict(chosen)} given to an ABI 1 kernel")
            return None
        self._check_abi2()
        values = tuple(option_values(self.meta, chosen))
        arr = self._option_arrays.get(values)
        if arr is None:
            arr = self._option_arrays[values] = (ctypes.c_int * max(len(values), 1))(*values)
        return arr

    def workspace_bytes(self, M: int, N: int, K: int, options=None) -> int:
        """Bytes of workspace a call needs: ABI 1, the meta's workspace_bytes; ABI 2, what
        cudal2_workspace answers for this shape and options array (from `options()`)."""
        if self.abi != 2:
            return int(self.meta.get("workspace_bytes") or 0)
        self._check_abi2()
        return int(self._workspace_fn(M, N, K, options))

    @property
    def meta(self) -> dict:
        if self._meta is None:
            raw = self._meta_fn()
            if raw is None:
                raise AbiError(f"{self.path}: cudal2_meta() returned NULL")
            self._meta = parse_meta(raw.decode("utf-8", errors="replace"), str(self.path))
        return self._meta

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, M: int, N: int, K: int,
               lda: int, ldb: int, ldc: int, ws_ptr: int, ws_bytes: int, stream_ptr: int,
               options=None) -> int:
        """Launch on `stream_ptr`; returns the kernel's cudaError_t value (0 = success).
        `options`: the array `options()` made (None: every option at its default)."""
        if self.abi == 2:
            self._check_abi2()
            rc = self._hgemm(a_ptr, b_ptr, c_ptr, M, N, K, lda, ldb, ldc, ws_ptr, ws_bytes,
                             stream_ptr, options)
        elif options is not None:
            raise AbiError(f"{self.path}: options given to an ABI 1 kernel")
        else:
            rc = self._hgemm(a_ptr, b_ptr, c_ptr, M, N, K, lda, ldb, ldc, ws_ptr, ws_bytes, stream_ptr)
        if rc:
            self.clear_cuda_error()
        return rc

    def clear_cuda_error(self) -> int:
        """Consume the CUDA runtime's pending error after a call that returned one, and return it.
        A refused or failed launch (cudaFuncSetAttribute, cudaLaunchKernel) leaves its error
        pending in the runtime this library links, which torch shares by soname: torch's next
        launch check would raise it (seen on an H200: error 209 of one kernel failed the next
        test's torch.rand). A sticky error (a fault in a kernel) stays: the context is lost."""
        # looked up as the library's own calls bind: the global scope first, then its own
        fn = getattr(_GLOBAL_SCOPE, "cudaGetLastError", None) or getattr(self._lib, "cudaGetLastError", None)
        return int(fn()) if fn is not None else 0

    @property
    def raw_launch(self):
        """The ctypes function without argtypes, for the dispatch hot path (no wrapper frame, no
        argument converters). The caller passes typed values: pointers as ctypes.c_void_p,
        workspace_bytes as ctypes.c_size_t, the six ints as Python ints (ctypes passes them as C
        int and raises ctypes.ArgumentError beyond 32 bits); ABI 2 kernels take the options
        array (or None) as a 13th argument."""
        return self._hgemm_raw


_loaded: dict[Path, KernelLibrary] = {}
_lock = threading.Lock()


def clear_cuda_error() -> int:
    """KernelLibrary.clear_cuda_error through any loaded library (they share one CUDA runtime by
    soname), for callers that hold only a raw launch function (the dispatch hot path)."""
    lib = next(iter(list(_loaded.values())), None)
    return lib.clear_cuda_error() if lib is not None else 0


def load_library(so_path: str | os.PathLike) -> KernelLibrary:
    """Load a kernel .so once per process (thread-safe)."""
    path = Path(so_path).resolve()
    lib = _loaded.get(path)
    if lib is not None:
        return lib
    with _lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = KernelLibrary(path)
        return lib
