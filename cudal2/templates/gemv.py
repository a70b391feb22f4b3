"""The gemv family (gemv_hgemm.cuh): C = A @ B for M <= MAX_M <= 8 (LLM decode) on CUDA cores,
fp32 FMA, B streamed once from HBM by 16-byte evict-first loads, a persistent grid over the N
tiles, K split across a thread-block cluster at run time (ABI 2 option "splits", sm_90a) and
reduced through distributed shared memory; option "unroll" picks the loads in flight. Its
parameter space, static rules, the shapes it serves, and pure-Python replicas of the kernel's
shape of work (tile columns, threads, shared memory, bytes in flight), its work split
(`gemv_work`) and its arithmetic in the kernel's order (`gemv_emulate`). Importing this module
registers the family (cudal2/templates/__init__.py does).
"""
from __future__ import annotations

from cudal2.templates.family import Family, _register

SPLIT_VALUES = (1, 2, 4, 8)     # K split across a cluster of this many CTAs (sm_90a)
UNROLL_VALUES = (2, 4, 8)       # 16-byte B loads per row a thread issues before consuming any
DEFAULT_UNROLL = 4
CLUSTER_ARCHES = ("sm_90a",)    # the cluster path (distributed shared memory) needs sm_90
RED_FLOATS_MAX = 8192           # RR: the tk-reduction buffer, 32 KiB (gemv_hgemm.cuh's kRedRows)


def gemv_options(p: dict, arch: str) -> list[tuple[str, tuple[int, ...], int]]:
    """The runtime options the build of `p` for `arch` declares in its meta (call order): sm_80
    builds have no cluster, so their only split count is 1. The Family's declarations (arch-free,
    what the planner sweeps) are sm_90a's; an sm_80 build refuses splits > 1
    (cudaErrorInvalidValue) and the harness rejects such a request against its meta."""
    splits = SPLIT_VALUES if arch in CLUSTER_ARCHES else (1,)
    return [("splits", splits, 1), ("unroll", UNROLL_VALUES, DEFAULT_UNROLL)]


def gemv_threads(p: dict) -> int:
    return 32 * p["WARPS"]


def _lanes_n(p: dict) -> int:
    """RR: threads along N (8 columns each)."""
    return 8 * p["ROWS"]


def gemv_tile_cols(p: dict) -> int:
    """BN: output columns per CTA. RC: ROWS weight rows per warp; RR: 8 columns per thread
    along N, 8 * ROWS threads along N."""
    if p["LAYOUT"] == "RC":
        return p["WARPS"] * p["ROWS"]
    return 8 * _lanes_n(p)


def _red_rows(p: dict) -> int:
    """RR: rows of m the shared-memory reduction takes per round (its buffer <= 32 KiB)."""
    return min(p["MAX_M"], RED_FLOATS_MAX // (8 * gemv_threads(p)))


def gemv_smem_bytes(p: dict, splits: int) -> int:
    """Shared memory one CTA uses, static plus dynamic, as gemv_hgemm.cuh computes it: RR's
    tk-reduction buffer (threads x 8 x red_rows floats), plus with splits > 1 the rank's
    partial outputs (MAX_M x BN floats, dynamic)."""
    static = 0 if p["LAYOUT"] == "RC" else 4 * gemv_threads(p) * 8 * _red_rows(p)
    return static + (4 * p["MAX_M"] * gemv_tile_cols(p) if splits > 1 else 0)


def gemv_inflight_bytes(p: dict, unroll: int) -> int:
    """Bytes of B one CTA has requested and not yet consumed at steady state: every thread's
    independent 16-byte loads (RC: unroll per weight row, ROWS rows; RR: unroll rows)."""
    per_thread = unroll * (p["ROWS"] if p["LAYOUT"] == "RC" else 1)
    return 16 * per_thread * gemv_threads(p)


def gemv_register_estimate(p: dict) -> int:
    """Registers a build's largest instantiation (unroll 8) takes, before it is built: within
    ~12% of ptxas on the whole space for sm_90a (`cudal2 templates --build-space gemv`, 2026-11-29:
    RC 68-235, grown by each weight row's 8 loads in flight; RR 62-164, by MAX_M x 8
    accumulators)."""
    if p["LAYOUT"] == "RC":
        return 48 + 36 * p["ROWS"] + 4 * p["MAX_M"]
    return 56 + 12 * p["MAX_M"] + 2 * p["ROWS"]


def run_splits(K: int, splits: int) -> int:
    """The split count a call runs (gemv_hgemm.cuh's run_splits): the option, halved until every
    rank gets at least one 8-element chunk of K."""
    s = splits
    while s > 1 and s > K // 8:
        s //= 2
    return s


def rank_chunks(K: int, splits: int, rank: int) -> tuple[int, int]:
    """[begin, end) of the 8-element K chunks rank `rank` of `splits` takes: equal contiguous
    ranges to one chunk, none empty when K >= 8 * splits."""
    chunks = K // 8
    return rank * chunks // splits, (rank + 1) * chunks // splits


def gemv_work(M: int, N: int, K: int, p: dict, splits: int, slots: int) -> list[tuple[int, int, int, int]]:
    """The kernel's work split, replayed: (cta, tile, k_begin, k_end) for every tile each CTA
    processes, CTAs in launch order (blockIdx.x), each CTA's tiles in its loop order. `slots`:
    the resident CTAs (occupancy x SMs); the kernel runs min(tiles, slots // splits) clusters
    (cudaOccupancyMaxActiveClusters, when clusters pack the slots), cluster i looping over tiles
    i, i + clusters, ...; rank q of a cluster is CTA i * splits + q and takes K chunks
    rank_chunks(K, splits, q). M == 0 or N == 0: [] (nothing is launched). Raises ValueError
    where not one cluster fits (the kernel refuses the call). splits > 1 is sm_90a's (an sm_80
    build refuses it)."""
    if M == 0 or N == 0:
        return []
    s = run_splits(K, splits)
    clusters = slots // s
    if clusters < 1:
        raise ValueError(f"no cluster of {s} CTAs fits in {slots} resident slots")
    tiles = -(-N // gemv_tile_cols(p))
    clusters = min(clusters, tiles)
    out = []
    for cta in range(clusters * s):
        cluster, rank = divmod(cta, s)
        cb, ce = rank_chunks(K, s, rank)
        out += [(cta, t, 8 * cb, 8 * ce) for t in range(cluster, tiles, clusters)]
    return out


def _rank_sums(A, B, p: dict, cb: int, ce: int):
    """One rank's fp32 sums of every output (M x N) over K chunks [cb, ce), in the kernel's
    order: per thread, chunks in its walk order and elements in k order (float32 multiply, exact
    for fp16 inputs, then add: the kernel's fma), then RC's butterfly or RR's tk-ordered sum."""
    import numpy as np
    M, N = A.shape[0], B.shape[0] if p["LAYOUT"] == "RC" else B.shape[1]
    a = A.astype(np.float32)
    b = B.astype(np.float32)
    if p["LAYOUT"] == "RC":
        threads, wt = 32, b.T                       # wt[k, n]
    else:
        threads, wt = gemv_threads(p) // _lanes_n(p), b
    # thread i's chunks: cb + i, cb + i + threads, ... (RC: lanes of a warp; RR: tk)
    acc = np.zeros((threads, M, N), np.float32)
    for base in range(cb, ce, threads):
        n = min(threads, ce - base)
        for e in range(8):
            ks = 8 * np.arange(base, base + n) + e
            acc[:n] += a[:, ks].T[:, :, None] * wt[ks][:, None, :]
    if p["LAYOUT"] == "RC":
        idx = np.arange(threads)
        for off in (16, 8, 4, 2, 1):   # the butterfly: lane l adds lane l ^ off
            acc = acc + acc[idx ^ off]
        return acc[0]
    s = acc[0]
    for tk in range(1, threads):       # the shared-memory reduction, in tk order
        s = s + acc[tk]
    return s


def gemv_emulate(A, B, p: dict, splits: int, unroll: int):
    """The kernel's result, emulated with numpy in its exact reduction order: A (M x K fp16), B
    as the kernel reads it (RC: N x K, the nn.Linear weight; RR: K x N); returns C (M x N fp16).
    Each rank's sums (_rank_sums), then the cluster's reduction in rank order 0 .. splits - 1,
    one rounding to fp16. The order does not depend on `unroll` (a thread consumes its loads in
    k order whatever is in flight) nor on the grid (a tile's sums are the same on any CTA).
    Raises ValueError where the kernel refuses (M > MAX_M, K % 8, an unlisted option)."""
    import numpy as np   # here, not at the top: importing cudal2.templates stays light
    M, K = A.shape
    if unroll not in UNROLL_VALUES or splits not in SPLIT_VALUES:
        raise ValueError(f"options splits={splits} unroll={unroll}: not one of "
                         f"{SPLIT_VALUES} x {UNROLL_VALUES}")
    if M > p["MAX_M"] or K % 8:
        raise ValueError(f"M={M}, K={K}: the kernel refuses M > MAX_M={p['MAX_M']} and K % 8 != 0")
    s = run_splits(K, splits)
    total = None
    for rank in range(s):
        part = _rank_sums(A, B, p, *rank_chunks(K, s, rank))
        total = part if total is None else total + part
    return total.astype(np.float16)


def _problems(family, p: dict, arch: str | None) -> list[str]:
    out = [f"{k}={p[k]} must be one of {', '.join(map(str, v))}"
           for k, v in _SPACE.items() if p[k] not in v]
    if out:
        return out
    # 16 warps leave a thread 128 registers (`cudal2 templates --build-space gemv`, nvcc 13.0):
    if p["LAYOUT"] == "RC" and p["WARPS"] == 16 and p["ROWS"] == 4:
        # unroll 8 keeps 32 16-byte loads (128 registers) in flight: 284-3240 bytes spilled
        out.append("RC with 16 warps of 4 rows: unroll 8's 32 loads in flight spill at 128 registers")
    if p["LAYOUT"] == "RR" and p["WARPS"] == 16 and p["MAX_M"] == 8:
        # 64 fp32 sums, 32 registers of A and the loads in flight: 652-964 bytes spilled
        out.append("RR with 16 warps at MAX_M 8: 8 x 8 sums plus A and the loads spill at 128 registers")
    return out


def _accepts(p: dict, M: int, N: int, K: int) -> bool:
    # 16-byte loads of dense operands: K % 8 (lda = K), and N % 8 for RR (ldb = N)
    return M <= p["MAX_M"] and K % 8 == 0 and (p["LAYOUT"] == "RC" or N % 8 == 0)


def _name(p: dict) -> str:
    """m<MAX_M>_w<WARPS>_r<ROWS> (splits and unroll are runtime options, not in the name)."""
    return f"m{p['MAX_M']}_w{p['WARPS']}_r{p['ROWS']}"


_SPACE = {"MAX_M": (1, 2, 4, 8), "WARPS": (4, 8, 16), "ROWS": (1, 2, 4)}
_DEFAULT = dict(MAX_M=8, WARPS=8, ROWS=2, ACC="f32", LAYOUT="RC")

_register(Family(
    name="gemv", arches=("sm_80", "sm_90a"), header="gemv_hgemm.cuh", style="gemv", flags=(),
    description="M <= 8 (decode) on CUDA cores: fp32 FMA, B streamed once by 16-byte evict-first "
                "loads, persistent grid over N tiles, K split across a cluster at run time (ABI 2 "
                "option splits, sm_90a, reduced through DSMEM, no workspace), option unroll; "
                "K % 8 == 0 (and N % 8 == 0 for RR)",
    _space=_SPACE,
    _fixed={"ACC": ("f32",), "LAYOUT": ("RR", "RC")},
    _defaults=(_DEFAULT, {**_DEFAULT, "LAYOUT": "RR"}),
    _problems=_problems, _accepts=_accepts, _name=_name,
    _options=lambda p: gemv_options(p, "sm_90a"),
    instruction="fma"))
