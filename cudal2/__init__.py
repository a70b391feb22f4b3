"""cudal2: per-shape HGEMM CUDA kernels behind a drop-in ``torch.matmul``.

``cudal2.matmul(input, other, *, out=None)`` has torch.matmul's semantics for every input; 2-D fp16 CUDA
tensors with a supported layout are served by a tuned kernel when one beat cuBLAS for the shape.
``cudal2.patch(model)`` / ``cudal2.patched(model)`` route a model's nn.Linear layers through it.

Importing the package loads the standard library only: no build, no GPU query, not even the
torch.library op (registered when cudal2.matmul is first touched). Sub-modules and the public
names are imported on first attribute access.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# The layers (docs/internals.md), reachable as cudal2.<name> without importing them up front.
_LAZY_MODULES = ("core", "timing", "runtime", "harness", "templates", "search", "runs", "cli")
# Names re-exported from a sub-module on first use.
_LAZY_NAMES = {
    "matmul": "runtime.matmul",
    "patch": "runtime.patch",
    "patched": "runtime.patch",
    "unpatch": "runtime.patch",
    "hgemm": "runtime.op",
    "warmup": "runtime.warmup",
    "plan": "runtime.plan",
    "Decision": "runtime.plan",
    "KernelIndex": "core.store",
    "IndexRow": "core.store",
}

__all__ = ["__version__", *_LAZY_NAMES]


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the module exists but one of its imports is missing: say so
            raise AttributeError(f"module 'cudal2' has no attribute {name!r}") from None
    mod = _LAZY_NAMES.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(f".{mod}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cudal2' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_NAMES))
