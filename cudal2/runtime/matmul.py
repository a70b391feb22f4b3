"""cudal2.matmul: torch.matmul's semantics for every input; 2-D fp16 CUDA operands go to a tuned
kernel when one serves the shape (the eager path, hot.py), through the cudal2::hgemm op when
autograd or torch.compile needs it (op.py), and to torch.matmul otherwise, errors included."""
from __future__ import annotations

import torch

from cudal2.runtime.hot import disabled as _disabled, launch as _launch
from cudal2.runtime.op import OP as _op, compiled_matmul as _compiled_matmul

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_f16 = torch.float16
_mm = torch.matmul
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_tf_modes = torch._C._len_torch_function_stack
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._functorch.peek_interpreter_stack
_autocast_any = torch._C._is_any_autocast_enabled


def matmul(input, other, *, out=None):  # noqa: A002 - torch.matmul's keyword names
    """torch.matmul(input, other, out=out), with tuned kernels for 2-D fp16 CUDA operands."""
    if type(input) in _PLAIN and type(other) in _PLAIN and input.is_cuda:
        return _cuda_matmul(input, other, out)
    if out is None:
        return _mm(input, other)
    return _mm(input, other, out=out)


def _cuda_matmul(a, b, out):
    if _is_compiling():
        return _compiled_matmul(a, b, out)
    if a.dtype is not _f16 or b.dtype is not _f16 or a.ndim != 2 or b.ndim != 2:
        return _mm(a, b) if out is None else _mm(a, b, out=out)
    if torch_only_mode():
        return _mm(a, b) if out is None else _mm(a, b, out=out)
    if _grad_enabled() and (a.requires_grad or b.requires_grad):
        if out is None:
            return _op(a, b)  # autograd through the custom op (kernel path forward and backward)
        return _mm(a, b, out=out)  # torch's own error: out= does not support autograd
    if _disabled():
        return _mm(a, b) if out is None else _mm(a, b, out=out)
    c = _launch(a, b, out)
    if c is None:
        return _mm(a, b) if out is None else _mm(a, b, out=out)
    return c


def torch_only_mode() -> bool:
    """A transform, a torch function/dispatch mode or a non-fp16 autocast is active: only torch
    knows what the call means there (the one rule, also for patch.py's layers)."""
    return (_functorch_active() is not None or _tf_modes() or _dispatch_modes()
            or (_autocast_any() and torch.get_autocast_dtype("cuda") is not _f16))
