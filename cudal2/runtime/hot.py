"""The eager kernel path: a 2-D fp16 CUDA a @ b served by a table kernel in a few attribute
checks, one dict lookup keyed by (device index, M, N, K, layout) and one ctypes launch on torch's
current stream. Everything it does not recognise returns None (torch.matmul serves it)."""
from __future__ import annotations

import ctypes
import os
import warnings

import torch

from cudal2.core import knobs
from cudal2.core.abi import clear_cuda_error
from cudal2.runtime.plan import INT_MAX
from cudal2.runtime.resolve import (
    TORCH as _TORCH,
    resolve as _resolve,
    serving as _serving,
    workspaces as _workspaces,
)

# Every pointer and leading dimension the kernel path accepts is 16-byte aligned (8 halves):
# vectorised loads in every family assume it; anything else goes to torch.
ALIGN_BYTES = 16
ALIGN_ELEMS = 8

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_f16 = torch.float16
_vp = ctypes.c_void_p
_NULL = ctypes.c_void_p(0)
_workspace = _workspaces.get
_raw_stream = None
_cur_device = None
_env = getattr(os.environ, "_data", None) if os.name == "posix" else None


def disabled() -> bool:
    """CUDAL2_DISABLE, read cheaply: os.environ.get costs ~0.6 us, a miss in the raw bytes dict
    ~30 ns; only a set variable is parsed by knobs.disabled(), the one definition of the knob,
    which refuses (ValueError naming it) anything but 0 or 1, here too: a typo never means on."""
    if _env is not None and b"CUDAL2_DISABLE" not in _env:
        return False
    return knobs.disabled()


def _init_cuda_fns() -> None:
    # Raw C entry points of CUDA builds of torch (what inductor uses); public fallbacks otherwise.
    global _raw_stream, _cur_device
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda d: torch.cuda.current_stream(d).cuda_stream)
    _cur_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def launch(a, b, out):
    """Serve 2-D fp16 CUDA a @ b with a table kernel; None when it must go to torch."""
    M, K = a.shape
    K2, N = b.shape
    if K != K2 or M == 0 or N == 0 or K == 0:
        return None
    lda, sa1 = a.stride()
    sb0, sb1 = b.stride()
    pa, pb = a.data_ptr(), b.data_ptr()
    if sa1 != 1 or lda < K or lda % ALIGN_ELEMS or pa % ALIGN_BYTES:
        return None
    if sb1 == 1 and sb0 >= N:
        layout, ldb = "RR", sb0
    elif sb0 == 1 and sb1 >= K:
        layout, ldb = "RC", sb1
    else:
        return None
    # ctypes truncates ints to the ABI's 32-bit int silently: wider leading dimensions go to torch
    # (M, N, K beyond it never get a kernel: plan()).
    if ldb % ALIGN_ELEMS or pb % ALIGN_BYTES or (lda | ldb) > INT_MAX:
        return None
    dev = a.get_device()
    if b.get_device() != dev:
        return None
    if _cur_device is None:
        _init_cuda_fns()
    # The kernel launches in the calling thread's current device; tensors elsewhere go to torch.
    if _cur_device() != dev:
        return None
    key = (dev, M, N, K, layout)
    served = _serving.get(key)
    if served is None:
        served = _resolve(dev, M, N, K, layout, a, b)
    if served is _TORCH:
        return None
    if out is None:
        c = a.new_empty(M, N)
        ldc = N
    else:
        if (type(out) not in _PLAIN or out.dtype is not _f16 or out.get_device() != dev
                or out.shape != (M, N) or out.requires_grad):
            return None
        ldc, sc1 = out.stride()
        if (sc1 != 1 or ldc < N or ldc % ALIGN_ELEMS or ldc > INT_MAX
                or out.data_ptr() % ALIGN_BYTES):
            return None
        if _overlaps(out, ldc, M, N, a, lda, M, K) or _overlaps(out, ldc, M, N, b, ldb, *(
                (K, N) if layout == "RR" else (N, K))):
            return None
        c = out
    fn, ws_bytes, ws_c, opts, ws_zero = served
    stream = _raw_stream(dev)
    if ws_bytes:
        ws = _workspace(dev, stream, ws_bytes, ws_zero)
        if ws is None:    # inside a capture whose graph has no buffer of its own: torch serves
            return None
        ws = _vp(ws)
    else:
        ws = _NULL
    if opts is None:      # ABI 1: twelve arguments
        rc = fn(_vp(pa), _vp(pb), _vp(c.data_ptr()), M, N, K, lda, ldb, ldc, ws, ws_c,
                _vp(stream) if stream else _NULL)
    else:                 # ABI 2: the options array recorded for the shape
        rc = fn(_vp(pa), _vp(pb), _vp(c.data_ptr()), M, N, K, lda, ldb, ldc, ws, ws_c,
                _vp(stream) if stream else _NULL, opts)
    if rc:
        # A launch error (e.g. too little shared memory on this part) must not break the user:
        # remember, warn once, and let torch compute this and every later call of the shape;
        # the error it left pending in the CUDA runtime would fail torch's next launch check.
        clear_cuda_error()
        _serving[key] = _TORCH
        warnings.warn(f"cudal2: kernel for {M}x{N}x{K} {layout} failed to launch (cudaError {rc}); "
                      "using torch.matmul for this shape", RuntimeWarning, stacklevel=3)
        return None
    return c


def _overlaps(c, ldc, rows_c, cols_c, x, ldx, rows_x, cols_x) -> bool:
    c0 = c.data_ptr()
    c1 = c0 + 2 * (ldc * (rows_c - 1) + cols_c)
    x0 = x.data_ptr()
    x1 = x0 + 2 * (ldx * (rows_x - 1) + cols_x)
    return c0 < x1 and x0 < c1


