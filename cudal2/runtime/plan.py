"""Which tuned kernels may serve a shape: pure decision logic (no torch, no GPU), tested on CPU
from synthetic tables."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from cudal2.core.shapefile import INT_MAX  # noqa: F401 - hot.py reads it from here
from cudal2.core.abi import meta_accepts  # the ABI's shape rule (also what the planner follows)
from cudal2.core.store import IndexRow
from cudal2.core.tables import audit_current
from cudal2.core.vocab import LAYOUTS, gpu_key

# How many nearest tuned kernels race cuBLAS for an untabled shape, and how many kernels we are
# willing to build/load to find them (meta is only known once a kernel is loaded).
NEAREST_CANDIDATES = 2
MAX_PROBES = 6
# The farthest (log_distance) a tuned kernel may be from a shape and still race for it: ln 8, one
# dimension 8x off (or all three ~3.3x). Farther, the kernel was tuned for another regime (a
# decode GEMV against a prefill tile, docs/dispatch.md "The distance cap"), it rarely wins, and
# a candidate costs a build (seconds to minutes of nvcc) and a race on the first call.
NEAREST_MAX_DISTANCE = math.log(8)

# torch.matmul accumulates fp16 GEMMs in fp32, so only f32-accumulate kernels serve it.
SERVED_ACC = "f32"

# A table entry is the index row itself (arch, acc, layout, shape, file, sha256, family, tuned).
TableEntry = IndexRow
Table = Mapping[tuple, TableEntry]  # (arch, acc, layout, M, N, K, gpu) -> entry


def table_from_index(index) -> dict[tuple, TableEntry]:
    """The serving table of one KernelIndex: its tuned rows whose kernels passed this cudal2's
    audit (untuned seeds never serve; cudal2.core.tables's rule)."""
    return {r.key: r for r in index.rows if r.tuned and audit_current(r)}


def measured_here(e: TableEntry, gpu: str | None) -> bool:
    """Whether row `e` was measured on GPU model `gpu` (its name, as torch.cuda.get_device_name
    and the results DB spell it), so that it serves outright there. An H100 and an H200 are one
    arch, not one speed: on any other GPU the row races torch.matmul first. A row naming no GPU
    (an index written before the column) is measured here only for a caller naming none."""
    return e.gpu == gpu_key(gpu)


def for_gpu(entries: Iterable[TableEntry], gpu: str | None) -> list[TableEntry]:
    """The rows that may serve on GPU model `gpu`: its own (measured_here), then the other rows
    of the shapes it has no row of its own for, which race torch.matmul before they serve."""
    entries = list(entries)
    own = [e for e in entries if measured_here(e, gpu)]
    shadowed = {e.key[:6] for e in own}
    return own + [e for e in entries if not measured_here(e, gpu) and e.key[:6] not in shadowed]


def served_rows(entries: Iterable[TableEntry], arch: str, gpu: str | None = None) -> list[TableEntry]:
    """The tuned rows dispatch may serve on `arch` (f32 accumulate), on GPU model `gpu` as
    for_gpu() picks them; gpu None: every GPU model's rows (a machine without a GPU asking)."""
    rows = [e for e in entries if e.tuned and e.arch == arch and e.acc == SERVED_ACC]
    return sorted(rows if gpu is None else for_gpu(rows, gpu), key=lambda e: e.key)


def log_distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """Euclidean distance of (log M, log N, log K): a 2x change in any dimension costs ln 2."""
    return math.sqrt(sum((math.log(x) - math.log(y)) ** 2 for x, y in zip(a, b)))


def bucket_match(shape: tuple[int, int, int], same: Iterable[TableEntry],
                 metas: Mapping[str, Mapping]) -> TableEntry | None:
    """The tuned row whose M bucket (index column m_bucket) holds M, for the same N and K, whose
    kernel accepts the shape (or whose meta is not known yet): nearest M in log space first,
    then the larger M (its tiles were measured over at least as many rows), then the file."""
    M, N, K = shape
    rows = [e for e in same if e.N == N and e.K == K and e.M != M and e.bucket
            and e.bucket[0] <= M <= e.bucket[1]]
    rows.sort(key=lambda e: (abs(math.log(e.M / M)), -e.M, e.file))
    for e in rows:
        meta = metas.get(e.sha256)
        if meta is None or meta_accepts(meta, M, N, K):
            return e
    return None


def _at_shape(shape: tuple[int, int, int], rows: list[TableEntry], trusted: list[TableEntry],
              metas: Mapping[str, Mapping]) -> Decision | None:
    """A row measured at this very shape (exact), else at another M of its token bucket whose
    tile the audit confirmed (bucket); None."""
    M, N, K = shape
    for e in rows:
        if e.shape == shape:
            meta = metas.get(e.sha256)
            if meta is None or meta_accepts(meta, M, N, K):
                return Decision("exact", (e,), f"tuned kernel {e.file}", (e,) if meta is None else ())
    b = bucket_match(shape, trusted, metas)
    if b is not None:
        return Decision("bucket", (b,), f"tuned kernel {b.file} (M={b.M}, bucket {b.m_bucket})",
                        (b,) if b.sha256 not in metas else ())
    return None


@dataclass(frozen=True)
class Decision:
    kind: str                                  # "exact" | "bucket" | "other_gpu" | "nearest" | "fallback"
    candidates: tuple[TableEntry, ...]         # exact, bucket, other_gpu: one; nearest: best first
    reason: str
    unresolved: tuple[TableEntry, ...] = ()    # nearest candidates whose meta is not known yet
    distances: tuple[float, ...] = ()          # per candidate


def plan(shape: tuple[int, int, int], layout: str, arch: str | None, acc: str, table: Table, *,
         metas: Mapping[str, Mapping] | None = None, exclude: Iterable[str] = (),
         k: int = NEAREST_CANDIDATES, unknown_meta: str = "candidate",
         gpu: str | None = None, verified: Mapping[str, Iterable[str]] | None = None,
         max_distance: float = NEAREST_MAX_DISTANCE) -> Decision:
    """Which kernel(s) may serve `shape` (M, N, K) for B `layout` on `arch` with accumulator `acc`,
    on the GPU model `gpu`: every step below sees the rows for_gpu() keeps (the GPU's own rows,
    then other GPUs' rows and rows naming none for the shapes it has no row of its own for).

    exact:   a tuned kernel measured on this GPU model for this very (arch, acc, layout, M, N, K)
             (and, if its meta is known, accepting the shape); it serves outright;
    bucket:  one measured on this GPU model for (N, K) at another M of M's token bucket
             (bucket_match); it serves as an exact one does;
    other_gpu: an exact or bucket row measured on another GPU model (or one its row does not
             name): it races cuBLAS before serving, as a nearest kernel does (an H100 and an H200
             are one arch, not one speed);
    nearest: the `k` tuned kernels of the same (arch, acc, layout) nearest in log-space
             distance (log_distance), within `max_distance` (NEAREST_MAX_DISTANCE), that accept
             the shape (meta any_shape, or M, N, K divisible by its tile); they race cuBLAS
             before serving;
    fallback: nothing may serve: torch.matmul.
    `metas` maps sha256 -> cudal2_meta for kernels loaded so far; a kernel whose meta is unknown
    is a candidate marked `unresolved` (unknown_meta="candidate") or skipped ("reject").
    `exclude` holds sha256s known not to work here (build/load failure, wrong meta).
    `verified` maps sha256 -> the meta fields the audit confirmed against the binary
    (AuditResult.meta_verified); when given, a kernel whose "tile" is not among them (absent
    included) serves only its own measured shape (exact), never a bucket or a nearest one.
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
    tuned = [e for e in table.values() if e.tuned and e.arch == arch and e.acc == acc
             and e.layout == layout and e.sha256 not in exclude]
    if not tuned:
        others = sorted({f"{e.arch}/{e.acc}_{e.layout}" for e in table.values() if e.tuned})
        return Decision("fallback", (), f"no tuned kernel for {arch}/{acc}_{layout}"
                        + (f" (tuned: {', '.join(others)})" if others else " (table is empty)"))
    same = for_gpu(tuned, gpu)

    def tile_trusted(e: TableEntry) -> bool:
        # a kernel whose tile the audit did not confirm serves no other M than its own
        return verified is None or "tile" in verified.get(e.sha256, ())
    own = [e for e in same if measured_here(e, gpu)]
    hit = _at_shape((M, N, K), own, [e for e in own if tile_trusted(e)], metas)
    if hit is not None:
        return hit
    # the best measured first where two other GPUs measured one shape
    others = sorted((e for e in same if not measured_here(e, gpu)),
                    key=lambda e: (-(e.speedup_lo or 0.0), e.gpu))
    hit = _at_shape((M, N, K), others, [e for e in others if tile_trusted(e)], metas)
    if hit is not None:      # measured for this shape, on another GPU: it races before it serves
        e = hit.candidates[0]
        return Decision("other_gpu", hit.candidates, f"{hit.reason}, measured on "
                        f"{e.gpu or 'a GPU its row does not name'}, not on "
                        f"{gpu_key(gpu) or 'this unnamed GPU'}: it races torch.matmul first",
                        hit.unresolved, (log_distance((M, N, K), e.shape),))
    ranked = sorted(((log_distance((M, N, K), e.shape), e.shape, e.file, e) for e in same
                     if e.shape != (M, N, K) and tile_trusted(e)), key=lambda t: t[:3])
    cap = max_distance + 1e-9        # exactly 8x off is within the cap, whatever the rounding
    if ranked and ranked[0][0] > cap:
        d, e = ranked[0][0], ranked[0][3]
        return Decision("fallback", (), f"the nearest tuned {arch}/{acc}_{layout} kernel "
                        f"({e.M}x{e.N}x{e.K}) is at log-distance {d:.2f} from {M}x{N}x{K}, beyond "
                        f"the nearest-shape cap {max_distance:.2f}")
    cands, unresolved, dists = [], [], []
    for d, _, _, e in ranked:
        if d > cap:
            break
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
                        f"kernels within log-distance {max_distance:.2f} accepts {M}x{N}x{K} "
                        "(tile divisibility / any_shape)")
    desc = ", ".join(f"{e.M}x{e.N}x{e.K} (d={d:.2f})" for e, d in zip(cands, dists))
    return Decision("nearest", tuple(cands), f"nearest by log-space distance: {desc}",
                    tuple(unresolved), tuple(dists))
