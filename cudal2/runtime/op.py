"""The cudal2::hgemm torch.library op: what torch.compile traces (a fake impl) and what autograd
differentiates (grad_a = grad @ b^T, grad_b = a^T @ grad). Its impl runs the eager kernel path."""
from __future__ import annotations

import torch

from cudal2.core import knobs
from cudal2.runtime.hot import disabled, launch

_f16 = torch.float16
_mm = torch.matmul
_autocast_any = torch._C._is_any_autocast_enabled


@torch.library.custom_op("cudal2::hgemm", mutates_args=())
def hgemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D a, b: a tuned kernel when one serves (fp16 CUDA), else torch.matmul."""
    if a.dim() != 2 or b.dim() != 2:
        raise RuntimeError(f"cudal2::hgemm takes 2-D tensors, got {a.dim()}-D and {b.dim()}-D")
    if (a.is_cuda and a.dtype is _f16 and b.dtype is _f16 and not disabled()
            and not (_autocast_any() and torch.get_autocast_dtype("cuda") is not _f16)):
        c = launch(a, b, None)
        if c is not None:
            return c
    c = _mm(a, b)
    # torch.matmul may return a view of its work buffer; the op contract wants a fresh,
    # contiguous tensor matching the fake impl.
    return c if c.is_contiguous() else c.contiguous()


@hgemm.register_fake
def _hgemm_fake(a, b):
    torch._check(a.dim() == 2 and b.dim() == 2,
                 lambda: f"cudal2::hgemm takes 2-D tensors, got {a.dim()}-D and {b.dim()}-D")
    torch._check(a.shape[1] == b.shape[0], lambda: (
        f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
        f"{b.shape[0]}x{b.shape[1]})"))
    torch._check(a.dtype == b.dtype, lambda: (
        f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}"))
    return a.new_empty((a.shape[0], b.shape[1]))


def _hgemm_setup_context(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _hgemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = OP(grad, b.mT)  # b^T of a row-major b is column-major: layout RC
    if ctx.needs_input_grad[1]:
        gb = OP(a.mT, grad)
    return ga, gb


hgemm.register_autograd(_hgemm_backward, setup_context=_hgemm_setup_context)
OP = torch.ops.cudal2.hgemm.default


@torch.compiler.assume_constant_result
def _disabled_at_trace() -> bool:
    return knobs.disabled()


def compiled_matmul(a, b, out):
    """Under torch.compile: eligible 2-D fp16 CUDA operands become one opaque cudal2::hgemm node
    (its impl does the table lookup at run time); everything else is torch.matmul, traced."""
    if (out is None and a.dtype is _f16 and b.dtype is _f16 and a.dim() == 2 and b.dim() == 2
            and not _disabled_at_trace()):
        return OP(a, b)
    return _mm(a, b) if out is None else _mm(a, b, out=out)
