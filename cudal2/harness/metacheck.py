"""A kernel's meta against its binary: which of its claims the audit verified, which it could not.

A meta is the kernel's own claim; dispatch (cudal2.runtime.plan) serves shapes by its tile, and
reports read its threads. Where the built artefacts can confirm a claim, the audit checks it and
rejects a lie; where they cannot, the claim is recorded as unverified (and dispatch serves the
kernel only at the shapes it was measured at). What it confirmed (AuditResult.meta_verified, names
among cudal2.core.store.META_FIELDS) is exported with the kernel as index.csv's `verified` column:

- threads: every kernel entry's launch bounds (``.maxntid`` / ``.reqntid`` in the PTX, i.e.
  ``__launch_bounds__``). When entries declare bounds, the meta's ``threads`` must equal one of
  them (more threads than the bound cannot launch; fewer is a meta that describes another launch).
- tile (the shapes the meta claims: its tile, or any_shape): the host entry's own shape guard,
  called in a worker that sees no device (the audit's own worker on a machine without a GPU,
  else a fresh one with CUDA_VISIBLE_DEVICES=""), with aligned non-null pointers it never
  dereferences, at a shape the meta says the kernel serves (the tile, each side also a multiple
  of `divisible`; for any_shape the smallest shape `divisible` allows) and at a control shape
  that is a large multiple of it (CONTROL). Without a device a kernel that goes past its guard
  reaches the runtime, which answers no device (``cudaErrorNoDevice`` /
  ``cudaErrorInsufficientDriver``). Claimed shape past the guard: verified. Claimed shape refused
  (``cudaErrorInvalidValue``) while the control shape got past: the guard refuses what the meta
  claims, a lie: rejected. Both refused (a kernel that maps the runtime's failure to
  cudaErrorInvalidValue, e.g. CUTLASS's initialize without a device), any other answer, a crash
  or a hang: unverified. A tile coarser than the code's only narrows where dispatch serves the
  kernel: not a lie this can see, nor one that serves a wrong shape; a kernel with no guard at
  all passes.
- the requested shape (guard_refuses, asked by the pipeline when nothing will run): the same
  guard at the shape an evaluation asks for, for a kernel whose guard took its claimed shape
  (tile verified above); cudaErrorInvalidValue there is the kernel refusing the request, which
  the harness records as `refused`, as its launch would on a GPU.
- workspace: left to the GPU tier (a too-small workspace is only refused, or not, by a kernel
  that gets past its guard to a launch, which needs a device); recorded as unverified when a
  kernel declares one.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

_ENTRY = re.compile(r"^[ \t]*(?:\.(?:visible|weak)[ \t]+)?\.entry[ \t]+([\w$.]+)", re.M)
_BOUNDS = re.compile(r"\.(maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")

# cudaError_t values the probe reads
INVALID_VALUE = 1                      # the ABI's refusal (docs/abi.md)
NO_DEVICE = (100, 35)                  # cudaErrorNoDevice, cudaErrorInsufficientDriver: past the guard
FAKE_POINTER = 1 << 20                 # aligned, non-null, never dereferenced (no device)
CONTROL = (256, 256, 512)              # the control shape: lcm of these and the claimed shape


@dataclass
class MetaCheck:
    reasons: list[str] = field(default_factory=list)     # lies: the audit rejects
    notes: list[str] = field(default_factory=list)       # what could not be checked, and why
    verified: list[str] = field(default_factory=list)    # meta fields the binary confirmed


def launch_bounds(ptx: str) -> dict[str, int]:
    """{entry: threads per block} for each kernel entry of a PTX file that declares launch
    bounds (.maxntid / .reqntid, x*y*z); entries without bounds are absent."""
    out = {}
    ms = list(_ENTRY.finditer(ptx))
    for i, m in enumerate(ms):
        end = ms[i + 1].start() if i + 1 < len(ms) else len(ptx)
        head = ptx[m.start():end].split("{", 1)[0]            # directives precede the body
        b = _BOUNDS.search(head)
        if b:
            n = 1
            for g in b.groups()[1:]:
                n *= int(g or 1)
            out[m.group(1)] = n
    return out


def check_threads(meta: dict, ptx: str) -> MetaCheck:
    res = MetaCheck()
    if "threads" not in meta:
        return res
    t = meta["threads"]
    if not (isinstance(t, int) and not isinstance(t, bool) and t > 0):
        res.reasons.append(f"meta threads must be a positive int, got {t!r}")
        return res
    bounds = launch_bounds(ptx)
    n_entries = len(_ENTRY.findall(ptx))
    if not bounds:
        res.notes.append("meta threads unverified: no kernel entry declares launch bounds "
                         "(__launch_bounds__ / .maxntid)")
    elif t in bounds.values():
        res.verified.append("threads")
    elif len(bounds) == n_entries:
        res.reasons.append(f"meta declares threads {t} but the kernel's launch bounds are "
                           + ", ".join(f"{n} ({e[:40]})" for e, n in sorted(bounds.items())[:3]))
    else:
        res.notes.append(f"meta threads {t} unverified: it matches none of the declared launch "
                         f"bounds {sorted(set(bounds.values()))} and some entries declare none")
    return res


def probe_guard(so_path: str, shapes) -> list[int]:
    """Worker task (a worker that sees no GPU): cudal2_hgemm at each (M, N, K), row-major RR leading
    dimensions, the default stream, and aligned non-null pointers that are never dereferenced
    (host code does not read device memory, and without a device nothing launches); a large
    workspace so a workspace check is not what refuses; returns the cudaError_t values."""
    import ctypes
    lib = ctypes.CDLL(str(so_path), mode=ctypes.RTLD_LOCAL)
    fn = lib.cudal2_hgemm
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                  ctypes.c_void_p, ctypes.c_void_p]
    fake = FAKE_POINTER
    return [int(fn(fake, fake, fake, M, N, K, K, N, N, fake, 1 << 40, None, None))
            for M, N, K in shapes]


def claimed_shape(meta: dict) -> tuple[int, int, int] | None:
    """A shape the meta says the kernel serves: its tile, or for any_shape the smallest shape its
    `divisible` allows; None for a malformed tile (the ABI's rules report it)."""
    tile = meta.get("tile")
    if not (isinstance(tile, list) and len(tile) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in tile)):
        return None
    div = meta.get("divisible")
    if not (isinstance(div, list) and len(div) == 3 and all(isinstance(x, int) and x > 0 for x in div)):
        div = [1, 1, 1]
    if not meta.get("any_shape"):      # the tile, each side a multiple of `divisible` too
        return tuple(math.lcm(t, d) for t, d in zip(tile, div))
    return tuple(div)


def _gpu_here() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def check_tile(meta: dict, so_path, *, pool=None, timeout_s: float = 30) -> MetaCheck:
    """The shapes the meta claims against the host entry's shape guard (module docstring).
    `pool`: the audit's worker pool, used when this machine has no GPU."""
    res = MetaCheck()
    shape = claimed_shape(meta)
    if shape is None:
        return res
    M, N, K = shape
    control = tuple(math.lcm(x, c) for x, c in zip(shape, CONTROL))
    out = _probe(so_path, [shape, control], pool, timeout_s)
    claim = "any_shape" if meta.get("any_shape") else f"tile {meta['tile']}"
    at = f"{M}x{N}x{K}"
    if out.status != "ok":
        res.notes.append(f"meta tile unverified: calling cudal2_hgemm at {at} without a "
                         f"device {out.status}: {out.detail[:200]}")
        return res
    claimed, ctl = out.value
    if claimed in NO_DEVICE:
        res.verified.append("tile")
    elif claimed == INVALID_VALUE and ctl in NO_DEVICE:
        res.reasons.append(f"meta declares {claim} (it serves {at}) but the kernel's own guard "
                           f"refuses {at} (cudaErrorInvalidValue) while it takes "
                           f"{'x'.join(map(str, control))}")
    else:
        res.notes.append(f"meta tile unverified: without a device cudal2_hgemm returned {claimed} "
                         f"at {at} and {ctl} at {'x'.join(map(str, control))}")
    return res


def _probe(so_path, shapes, pool, timeout_s: float):
    """probe_guard in `pool` when this machine has no GPU, else in a fresh worker that sees none
    (generated code never runs in this process)."""
    if pool is not None and not _gpu_here():
        return pool.run(probe_guard, str(so_path), shapes, timeout_s=timeout_s)
    from cudal2.harness.worker import WorkerPool
    with WorkerPool(max_tasks=1, device="") as fresh:     # sees no GPU: nothing can launch
        return fresh.run(probe_guard, str(so_path), shapes, timeout_s=timeout_s)


def guard_refuses(so_path, shape, *, pool=None, timeout_s: float = 30) -> bool:
    """Does the kernel's own guard refuse `shape` (M, N, K): cudaErrorInvalidValue without a
    device? Ask it only of a kernel whose guard took its claimed shape (meta_verified 'tile'):
    one that answers cudaErrorInvalidValue to every call without a device refuses nothing in
    particular. A crash or a hang is no answer (False)."""
    out = _probe(so_path, [tuple(int(x) for x in shape)], pool, timeout_s)
    return out.status == "ok" and list(out.value) == [INVALID_VALUE]


def check_meta_binary(meta: dict, build_result, pool=None) -> MetaCheck:
    """Every check above for a built kernel."""
    res = MetaCheck()
    ptx_path = getattr(build_result, "ptx_path", None)
    if ptx_path and Path(ptx_path).is_file():
        parts = [check_threads(meta, Path(ptx_path).read_text(errors="replace"))]
    else:
        parts = [MetaCheck(notes=["meta threads unverified: the build kept no PTX"])]
    if build_result.so_path:
        parts.append(check_tile(meta, build_result.so_path, pool=pool))
    for p in parts:
        res.reasons += p.reasons
        res.notes += p.notes
        res.verified += p.verified
    if meta.get("workspace_bytes") or meta.get("abi") == 2:
        res.notes.append("meta workspace unverified without a GPU (the GPU tier's checks call it "
                         "with the workspace it asks for)")
    return res


def audit_meta(audit_result, meta: dict, build_result, pool=None) -> None:
    """The audit's hook (cudal2.harness.audit.audit_build): for a meta that keeps the ABI's rules,
    add the binary's verdict on it to `audit_result` (reasons, notes, meta_verified)."""
    if audit_result.reasons:
        return
    mc = check_meta_binary(meta, build_result, pool)
    audit_result.reasons += mc.reasons
    audit_result.notes += mc.notes
    audit_result.meta_verified = mc.verified
