"""The project's vocabulary, defined once: target arches, the compute capabilities they run on,
B layouts, accumulators, runtime-option spelling, and the margin a kernel must win by."""
from __future__ import annotations

# Target architectures (nvcc's sm_XX; Hopper's wgmma/TMA need the "a" variant).
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
# torch.cuda.get_device_capability -> the arch our kernels are built for
ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89"}
# B is row-major K x N ("RR") or column-major, stored N x K ("RC": x @ W^T of nn.Linear)
LAYOUTS = ("RR", "RC")
ACCS = ("f32", "f16")
# Instructions a kernel's main loop issues, lowest throughput ceiling first: fp32 FMA on CUDA
# cores (the gemv family: M <= 8, bound by B's bytes), then tensor cores (an H100 runs wgmma at
# its dense peak; mma.sync measured at most 290 TFLOP/s there, ~0.3 of it).
INSTRUCTIONS = ("fma", "mma.sync", "wgmma")
# A kernel serves a shape only when the lower end of its speedup interval against every
# baseline clears 1 + WIN_MARGIN (export, and the runtime's first-call race).
WIN_MARGIN = 0.02
# The version of the audit's rules (cudal2.harness.audit: by name, and by behaviour through the
# call guard). 1: before stream discipline; 2: launches and memsets only on the call's stream
# (per-thread and legacy handles named in the source rejected, every launch's stream checked by
# the guard), no L2 access-policy window. A table row audited under an older version does not
# serve until `cudal2 reaudit` audits its kernel again (cudal2.core.tables).
AUDIT_VERSION = 2


# A runtime option's name (docs/abi.md: lower-case words): what the meta may declare and what
# index.csv's options column can hold.
OPTION_NAME = r"[a-z][a-z0-9_]*"


def normalise_options(options) -> tuple[tuple[str, int], ...]:
    """Runtime options as sorted (name, int) pairs, from a dict or pairs; the one spelling the
    DB, the cache rule, the kernel table and dispatch compare."""
    items = dict(options or {})
    for k, v in items.items():
        if not isinstance(k, str) or not k or isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"runtime option {k!r}={v!r}: names are strings, values ints")
    return tuple(sorted(items.items()))


# Token (M) buckets of the kernel table: powers of two. M in (2^(j-1), 2^j] is bucket
# (2^(j-1) + 1, 2^j); 1 and 2 are buckets of their own. A kernel exported at one M serves the M
# of its bucket it accepts (docs/dispatch.md says why powers of two).
def m_bucket(m: int) -> tuple[int, int]:
    """(lo, hi) of the token bucket holding M (M >= 1)."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"M must be a positive integer, got {m!r}")
    hi = 1 << (m - 1).bit_length()
    return (hi // 2 + 1 if hi > 1 else 1, hi)


# The GPU model a kernel-table row was measured on: the name the results DB records (NVML's, which
# torch.cuda.get_device_name also reports, e.g. "NVIDIA H100 80GB HBM3"), whitespace collapsed.
# Two GPUs of one arch (H100, H200: both sm_90a) differ in clocks, bandwidth and L2, so a row's
# GPU is part of its key ('' = not recorded: rows written before the column existed). A row serves
# outright only on its own GPU model and races torch first on any other (runtime/plan.measured_here).
def gpu_key(name) -> str:
    """The one spelling of a GPU model that the kernel table and dispatch compare ('' = none)."""
    return " ".join(str(name or "").split())
