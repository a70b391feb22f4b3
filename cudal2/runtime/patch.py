"""Routing a model's nn.Linear layers through the tuned kernels (fp16 CUDA inputs), and back.

Only a layer that runs nn.Linear's own forward is patched: a subclass with its own forward, or a
layer whose forward was replaced on the instance (accelerate's device_map/offload hooks do that),
is left alone, so what it adds still runs. The patched forward is an instance attribute holding
a plain picklable object, so deepcopy, pickle and torch.save/torch.load reproduce a patched model.
Where no kernel serves the call, the layer's own forward runs: F.linear, bias fused."""
from __future__ import annotations

import contextlib
import logging
import types

import torch
import torch.nn.functional as F

from cudal2.core import knobs
from cudal2.runtime.hot import disabled as _disabled, launch as _launch
from cudal2.runtime.matmul import _PLAIN, _grad_enabled, _is_compiling, matmul, torch_only_mode

log = logging.getLogger("cudal2.runtime")

_f16 = torch.float16
_LINEAR_FORWARD = torch.nn.Linear.forward


class _PatchedForward:
    """`layer.forward` of a patched layer. Module-level and holding only its layer, so pickling
    and deepcopy rebuild it bound to the copied layer (the memo keeps the cycle)."""

    def __init__(self, layer: torch.nn.Linear):
        self.layer = layer

    def __call__(self, x):
        layer = self.layer
        w, b = layer.weight, layer.bias
        if (type(x) in _PLAIN and x.is_cuda and x.dtype is _f16 and type(w) in _PLAIN
                and w.dtype is _f16 and (b is None or b.dtype is _f16) and x.dim() >= 2
                and x.shape[-1] == w.shape[1]):
            y = _kernel_linear(x.reshape(-1, x.shape[-1]), w, b)
            if y is not None:
                return y.reshape(*x.shape[:-1], w.shape[0])
        return F.linear(x, w, b)   # nn.Linear.forward itself


def _kernel_linear(x2, w, b):
    """x2 @ w^T + b by a table kernel; None where torch serves it (the caller runs F.linear).
    The same gates as cudal2.matmul's CUDA path (matmul.py), in the same order."""
    if _is_compiling() or (_grad_enabled() and (x2.requires_grad or w.requires_grad)):
        y = matmul(x2, w.t())      # the cudal2::hgemm op: traced or differentiated
        return y if b is None else y + b
    if torch_only_mode() or _disabled():
        return None
    y = _launch(x2, w.t(), None)   # W is (out, in) row-major: W^T is layout RC
    if y is None or b is None:
        return y
    # y is fresh: add in place, unless autograd must see the bias
    return y + b if _grad_enabled() and b.requires_grad else y.add_(b)


def _patchable(m: torch.nn.Module) -> bool:
    """nn.Linear's own forward: no override in the class, no other forward on the instance (a
    bound nn.Linear.forward of the layer itself is what accelerate leaves after removing a hook)."""
    own = m.__dict__.get("forward")
    return type(m).forward is _LINEAR_FORWARD and (
        own is None or (getattr(own, "__func__", None) is _LINEAR_FORWARD
                        and getattr(own, "__self__", None) is m))


def _is_patched(m: torch.nn.Module) -> bool:
    return isinstance(m.__dict__.get("forward"), _PatchedForward)


def patch(model: torch.nn.Module) -> torch.nn.Module:
    """Route every plain nn.Linear in `model` (itself included) through the tuned kernels for 2-D+
    fp16 CUDA inputs; other inputs, and shapes torch serves, run F.linear unchanged. Layers with
    their own forward (subclass or instance/hook) are left alone. A no-op under CUDAL2_DISABLE=1.
    Returns `model`; idempotent. Raises ValueError on a bad CUDAL2_* variable."""
    knobs.check_env()
    if knobs.disabled():
        log.info("cudal2.patch: CUDAL2_DISABLE=1, model left unpatched")
        return model
    patched = skipped = 0
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) or _is_patched(m):
            continue
        if _patchable(m):
            m.forward = _PatchedForward(m)
            patched += 1
        else:
            skipped += 1
            log.debug("cudal2.patch: %s (%s) has its own forward or hooks: left alone",
                      name or "<model>", type(m).__name__)
    log.info("cudal2.patch: %d nn.Linear layers patched, %d left alone", patched, skipped)
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Undo patch(): each patched layer runs its class's forward again, also beneath an
    accelerate hook added since; layers patch() left alone are untouched."""
    for m in model.modules():
        if _is_patched(m):
            del m.__dict__["forward"]
        if isinstance(m.__dict__.get("_old_forward"), _PatchedForward):
            # an accelerate hook added after patch() calls this: give it the class's forward
            m._old_forward = types.MethodType(type(m).forward, m)
    return model


@contextlib.contextmanager
def patched(model: torch.nn.Module):
    """`with cudal2.patched(model): ...` patches for the block and restores afterwards."""
    patch(model)
    try:
        yield model
    finally:
        unpatch(model)
