"""The kernel ABI of DESIGN.md, loaded with ctypes.

    int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K,
                     int lda, int ldb, int ldc, void* workspace, size_t workspace_bytes,
                     void* stream);
    const char* cudal2_meta(void);

One .so per kernel, loaded once per process (RTLD_LOCAL, so identical symbol names in different
kernels never clash). Only trusted code (tables we exported, or the harness's worker process)
loads a library: loading runs the library's static constructors.
"""
from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

ABI_SYMBOLS = ("cudal2_hgemm", "cudal2_meta")
META_KEYS = ("style", "arch", "acc", "layout", "tile", "any_shape", "workspace_bytes")


def meta_accepts(meta, M: int, N: int, K: int) -> bool:
    """Does a kernel (by its cudal2_meta) handle this shape? any_shape, or divisible by its tile;
    split-K kernels also declare the largest M*N their workspace covers (splitk_max_mn)."""
    limit = meta.get("splitk_max_mn")
    if limit and M * N > int(limit):
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


class AbiError(RuntimeError):
    """A library does not honour the kernel ABI; the message names the file and the problem."""


def parse_meta(text: str, where: str = "cudal2_meta") -> dict:
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AbiError(f"{where}: cudal2_meta() is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise AbiError(f"{where}: cudal2_meta() must be a JSON object, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise AbiError(f"{where}: cudal2_meta() lacks {', '.join(missing)}")
    if meta["acc"] not in ("f32", "f16"):
        raise AbiError(f"{where}: meta acc must be 'f32' or 'f16', got {meta['acc']!r}")
    if meta["layout"] not in ("RR", "RC"):
        raise AbiError(f"{where}: meta layout must be 'RR' or 'RC', got {meta['layout']!r}")
    return meta


def _preload_cuda_runtime() -> None:
    """Make libcudart.so.N resolvable when the .so's runpath points to a build machine's folder:
    a library already loaded (by torch, or here from pip's nvidia packages) satisfies it by soname."""
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
    except ImportError:
        pass
    try:
        from .toolchain import _pip_cuda_roots
        for root in _pip_cuda_roots():
            for lib in sorted((root / "lib").glob("libcudart.so.*")):
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                return
    except OSError:
        pass


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
            _preload_cuda_runtime()
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

    @property
    def meta(self) -> dict:
        if self._meta is None:
            raw = self._meta_fn()
            if raw is None:
                raise AbiError(f"{self.path}: cudal2_meta() returned NULL")
            self._meta = parse_meta(raw.decode("utf-8", errors="replace"), str(self.path))
        return self._meta

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, M: int, N: int, K: int,
               lda: int, ldb: int, ldc: int, ws_ptr: int, ws_bytes: int, stream_ptr: int) -> int:
        """Launch on `stream_ptr`; returns the kernel's cudaError_t value (0 = success)."""
        return self._hgemm(a_ptr, b_ptr, c_ptr, M, N, K, lda, ldb, ldc, ws_ptr, ws_bytes, stream_ptr)

    @property
    def raw_launch(self):
        """The ctypes function without argtypes, for the dispatch hot path (no wrapper frame, no
        argument converters). The caller passes typed values: pointers as ctypes.c_void_p,
        workspace_bytes as ctypes.c_size_t, the six ints as Python ints (ctypes passes them as C
        int and raises ctypes.ArgumentError beyond 32 bits)."""
        return self._hgemm_raw


_loaded: dict[Path, KernelLibrary] = {}
_lock = threading.Lock()


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
