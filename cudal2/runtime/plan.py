"""Which tuned kernels may serve a shape: pure decision logic (no torch, no GPU), tested on CPU
from synthetic tables."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from cudal2.core.abi import meta_accepts  # the ABI's shape rule (also what the planner follows)
from cudal2.core.store import IndexRow
from cudal2.core.vocab import LAYOUTS

# How many nearest tuned kernels race cuBLAS for an untabled shape, and how many kernels we are
# willing to build/load to find them (meta is only known once a kernel is loaded).
NEAREST_CANDIDATES = 2
MAX_PROBES = 6
INT_MAX = 2**31 - 1  # the kernel ABI's sizes and leading dimensions are C ints

# A table entry is the index row itself (arch, acc, layout, shape, file, sha256, family, tuned).
TableEntry = IndexRow
Table = Mapping[tuple, TableEntry]  # (arch, acc, layout, M, N, K) -> entry


def table_from_index(index) -> dict[tuple, TableEntry]:
    """The serving table: tuned rows of a KernelIndex only (untuned seeds never serve)."""
    return {r.key: r for r in index.rows if r.tuned}


def log_distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """Euclidean distance of (log M, log N, log K): a 2x change in any dimension costs ln 2."""
    return math.sqrt(sum((math.log(x) - math.log(y)) ** 2 for x, y in zip(a, b)))


@dataclass(frozen=True)
class Decision:
    kind: str                                  # "exact" | "nearest" | "fallback"
    candidates: tuple[TableEntry, ...]         # exact: one; nearest: best first; fallback: ()
    reason: str
    unresolved: tuple[TableEntry, ...] = ()    # nearest candidates whose meta is not known yet
    distances: tuple[float, ...] = ()          # per candidate


def plan(shape: tuple[int, int, int], layout: str, arch: str | None, acc: str, table: Table, *,
         metas: Mapping[str, Mapping] | None = None, exclude: Iterable[str] = (),
         k: int = NEAREST_CANDIDATES, unknown_meta: str = "candidate",
         verified: Mapping[str, Iterable[str]] | None = None) -> Decision:
    """Which kernel(s) may serve `shape` (M, N, K) for B `layout` on `arch` with accumulator `acc`.

    exact:   a tuned kernel for this very (arch, acc, layout, M, N, K) (and, if its meta is known,
             accepting the shape);
    nearest: the `k` tuned kernels of the same (arch, acc, layout) nearest in log-space
             distance (log_distance) that accept the shape (meta any_shape, or M, N, K divisible by
             its tile); they race cuBLAS before serving;
    fallback: nothing may serve: torch.matmul.
    `metas` maps sha256 -> cudal2_meta for kernels loaded so far; a kernel whose meta is unknown
    is a candidate marked `unresolved` (unknown_meta="candidate") or skipped ("reject").
    `exclude` holds sha256s known not to work here (build/load failure, wrong meta).
    `verified` maps sha256 -> the meta fields the audit confirmed against the binary
    (AuditResult.meta_verified); when given, a kernel whose "tile" is not among them (absent
    included) serves only its own measured shape (exact), never a nearest one.
    """
    M, N, K = (int(x) for x in shape)
    metas = metas or {}
    exclude = frozenset(exclude)
    if min(M, N, K) <= 0:
        return Decision("fallback", (), f"empty shape {M}x{N}x{K}")
    if max(M, N, K) > INT_MAX:
        return Decision("fallback", (), f"{M}x{N}x{K} exceeds the kernel ABI's 32-bit int sizes")
    if layout not in LAYOUTS:
        return Decision("fallback", (), f"layout {layout!r} is not one of {LAYOUTS}")
    if not arch:
        return Decision("fallback", (), "no known arch for this GPU")
    same = [e for e in table.values() if e.tuned and e.arch == arch and e.acc == acc
            and e.layout == layout and e.sha256 not in exclude]
    if not same:
        others = sorted({f"{e.arch}/{e.acc}_{e.layout}" for e in table.values() if e.tuned})
        return Decision("fallback", (), f"no tuned kernel for {arch}/{acc}_{layout}"
                        + (f" (tuned: {', '.join(others)})" if others else " (table is empty)"))
    for e in same:
        if e.shape == (M, N, K):
            meta = metas.get(e.sha256)
            if meta is None or meta_accepts(meta, M, N, K):
                return Decision("exact", (e,), f"tuned kernel {e.file}", (e,) if meta is None else ())
    ranked = sorted(((log_distance((M, N, K), e.shape), e.shape, e.file, e) for e in same
                     if e.shape != (M, N, K)), key=lambda t: t[:3])
    cands, unresolved, dists = [], [], []
    for d, _, _, e in ranked:
        if verified is not None and "tile" not in verified.get(e.sha256, ()):
            continue                 # its tile is the kernel's claim only: exact shapes only
        meta = metas.get(e.sha256)
        if meta is None:
            if unknown_meta != "candidate":
                continue
            unresolved.append(e)
        elif not meta_accepts(meta, M, N, K):
            continue
        cands.append(e)
        dists.append(d)
        if len(cands) >= k:
            break
    if not cands:
        return Decision("fallback", (), f"none of {len(same)} tuned {arch}/{acc}_{layout} "
                        f"kernels accepts {M}x{N}x{K} (tile divisibility / any_shape)")
    desc = ", ".join(f"{e.M}x{e.N}x{e.K} (d={d:.2f})" for e, d in zip(cands, dists))
    return Decision("nearest", tuple(cands), f"nearest by log-space distance: {desc}",
                    tuple(unresolved), tuple(dists))
