"""The streamk family (streamk_hgemm.cuh): deep K on few output tiles in one launch that covers
the GPU. skinny_hgemm.cuh's kernel over a grid of M x N tiles: the (tile, k-tile) iterations
handed out stream-K over the resident slots (equal contiguous ranges, streamk.cuh), or split-K
reduced in a thread-block cluster (sm_90a, 2..8 splits) or by the last arriver through the
zero-init workspace; mma.sync m16n8k16, sm_80 and sm_90a, RR and RC.

Its parameter space and rules, and the work split of a call (`streamk_work`): which CTA runs
which k-tiles of which tile, and which CTAs reduce a tile in which order, replayed from the
kernel's own arithmetic (the budget prices it, the emulation test runs it in numpy).
"""
from __future__ import annotations

from dataclasses import dataclass

from cudal2.templates.family import Family, _register
from cudal2.templates.mma import _mma_problems
from cudal2.templates.skinny import (SKINNY_OPTIONS, STREAMK_MAX_CTAS, _as_mma,
                                     _skinny_option_redundant, cluster_of, skinny_plan,
                                     skinny_smem_bytes)

# Runtime options: skinny's, with every split count to 64 (streamk_hgemm.cuh's list): on a row of
# few tiles only a few counts fill the resident slots, and each is a grid of its own. The planner
# sweeps them all with the stream-K grid on a deep-K row (budget.is_deep_k), where the budget
# keeps those that cover the slots with a reduction no larger than the operands
# (budget.Budget.deep_k_problems).
STREAMK_OPTIONS = tuple((name, tuple(range(65)) if name == "splits" else values, default)
                        for name, values, default in SKINNY_OPTIONS)


@dataclass(frozen=True)
class Work:
    """One call's work split: `ctas[c]` the (tile, k-tile begin, k-tile end) segments CTA c runs
    in order; `reducers[t]` the CTAs whose partials of tile t are summed, in the order the kernel
    sums them (empty: one CTA wrote the tile directly). mode: "streamk" or "splitk". cluster:
    split-K's CTAs per thread-block cluster (1: none); a tile whose reducers span several
    clusters sums each cluster's run of `cluster` reducers first, then those sums in order."""
    mode: str
    tiles: int
    k_tiles: int
    ctas: tuple
    reducers: tuple
    cluster: int = 1

    def slabs(self, t: int) -> int:
        """Partial tiles of tile t that cross the workspace: none where one cluster holds its
        reducers, a cluster's sum each where several do, else every reducer's."""
        n = len(self.reducers[t])
        return 0 if n <= 1 or self.cluster == n else n // self.cluster


def streamk_work(M: int, N: int, K: int, BM: int, BN: int, BK: int, sms: int, slots: int,
                 splits: int = 0, decomposition: int = 0, cluster_max: int = 8) -> Work:
    """The work split of one call (skinny_hgemm.cuh's decide() and streamk.cuh's ranges,
    replayed). Stream-K: CTA c owns iterations [c*I/G, (c+1)*I/G) of the I = tiles x k-tiles
    (tile-major); a tile with more than one contributor is summed in contributor order. Split-K:
    CTA (tile, z) runs split z's k-tiles; the splits are summed in split-index order, in
    clusters of cluster_of(splits, cluster_max) on a GPU with clusters (cluster_max 0: none)."""
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    tiles, k_tiles = tiles_m * tiles_n, -(-K // BK)
    mode, n = skinny_plan(N, K, BN, BK, sms, slots, splits, decomposition, tiles_m)
    if mode == "streamk":
        iters = tiles * k_tiles
        G = n
        ctas, by_tile = [], [[] for _ in range(tiles)]
        for c in range(G):
            it, end, segs = c * iters // G, (c + 1) * iters // G, []
            while it < end:
                t, kt = divmod(it, k_tiles)
                stop = min(k_tiles, kt + end - it)
                segs.append((t, kt, stop))
                by_tile[t].append(c)
                it += stop - kt
            ctas.append(tuple(segs))
        reducers = tuple(tuple(cs) if len(cs) > 1 else () for cs in by_tile)
        return Work("streamk", tiles, k_tiles, tuple(ctas), reducers)
    per = -(-k_tiles // n)
    ctas = tuple(((t, z * per, min(k_tiles, (z + 1) * per)),) for z in range(n) for t in range(tiles))
    reducers = tuple(tuple(z * tiles + t for z in range(n)) if n > 1 else () for t in range(tiles))
    return Work("splitk", tiles, k_tiles, ctas, reducers, cluster_of(n, cluster_max) if n > 1 else 1)


def streamk_register_estimate(p: dict) -> int:
    """Registers before a build: what ptxas gives, by a least-squares fit over the 680 configs of
    the sm_90a space (`cudal2 templates --build-space streamk` at the batched and two-level
    reducers, 2026-11-29: residuals -14..+23, mean |5|; reports/cpu/2026-11-29-deepk-two-level/
    refit_registers.py). Not a bound: the budget's rule on a deep-K row turns on the occupancy,
    and an upper bound (skinny's) put 181 configs at the wrong CTAs per SM on the H200, this fit
    37; `campaign prepare` rechecks every option with ptxas's own figure."""
    threads = 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
    acc = (p["WM"] // 16) * (p["WN"] // 8) * 4
    a_chunks = p["BM"] * p["BK"] // 8 // threads
    b_chunks = p["BN"] * p["BK"] // 8 // threads
    fit = (111.38 + 0.82 * acc + 2.06 * a_chunks + 2.78 * b_chunks + 0.27 * p["STAGES"]
           - 1.74 * (p.get("LAYOUT") == "RC"))
    return min(255, 65536 // threads // 8 * 8, int(round(fit)))


def _problems(family, p: dict, arch: str | None) -> list[str]:
    out = []
    if p["BM"] not in (32, 64, 128):
        out.append(f"BM={p['BM']} must be 32, 64 or 128")
    if p["WM"] > p["BM"] or p["WN"] > p["BN"]:
        out.append(f"warp tile {p['WM']}x{p['WN']} must fit the tile {p['BM']}x{p['BN']}")
    if p["BM"] % p["WM"] or p["BN"] % p["WN"]:
        return out + [f"warp tile {p['WM']}x{p['WN']} must divide the tile {p['BM']}x{p['BN']}"]
    warps = (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
    if not 4 <= warps <= 16:
        out.append(f"{warps} warps per CTA: the streamk family runs 4 to 16")
    else:
        for what, rows in (("A", p["BM"]), ("B", p["BN"])):
            chunks = rows * p["BK"] // 8 // (32 * warps)
            if chunks > 16:
                out.append(f"{chunks} 16-byte {what} loads per thread per stage (> 16: spills)")
    acc = (p["WM"] // 16) * (p["WN"] // 8) * 4
    if acc > 64:
        # the stream-K segment loop keeps its state beside the accumulators: past 64 of them the
        # 128 registers of a 512-thread CTA are not enough, and a 4-warp CTA gains nothing
        out.append(f"warp tile {p['WM']}x{p['WN']}: {acc} accumulators per thread (> 64)")
    if out:
        return out
    return _mma_problems(family, _as_mma(p), arch)


def _accepts(p: dict, M: int, N: int, K: int) -> bool:
    # 16-byte loads of dense operands: lda = K, ldb = N (RR) or K (RC) multiples of 8
    return K % 8 == 0 and (p["LAYOUT"] == "RC" or N % 8 == 0)


def _name(p: dict) -> str:
    """BMxBNxBK, warp tile, stages (the decomposition is a runtime option)."""
    return f"{p['BM']}x{p['BN']}x{p['BK']}_w{p['WM']}x{p['WN']}_s{p['STAGES']}"


_SPACE = {"BM": (32, 64, 128), "BN": (32, 64, 128), "BK": (32, 64), "WM": (16, 32, 64),
          "WN": (16, 32, 64), "STAGES": (2, 3, 4, 6, 8)}
_DEFAULT = dict(BM=64, BN=64, BK=64, WM=32, WN=32, STAGES=4, LAYOUT="RR", A_LOAD="ring")

_register(Family(
    name="streamk", arches=("sm_80", "sm_90a"), header="streamk_hgemm.cuh", style="mma", flags=(),
    description="deep K on few output tiles: stream-K over the resident slots (equal contiguous "
                "(tile, k-tile) ranges, the last arriver sums in contributor order) or split-K "
                "(a thread-block cluster through DSMEM on sm_90a, else the zero-init workspace), "
                "one launch; mma.sync m16n8k16 f32; K % 8 == 0 (and N % 8 == 0 for RR)",
    _space=_SPACE,
    _fixed={"LAYOUT": ("RR", "RC"), "A_LOAD": ("ring",)},
    _defaults=(_DEFAULT, {**_DEFAULT, "LAYOUT": "RC"},
               {**_DEFAULT, "BM": 128, "WM": 64, "BN": 64, "WN": 32, "STAGES": 3}),
    _problems=_problems, _name=_name, _accepts=_accepts,
    _options=lambda p: [(n, v, d) for n, v, d in STREAMK_OPTIONS],
    _option_redundant=_skinny_option_redundant,
    instruction="mma.sync"))

__all__ = ["streamk_work", "Work", "streamk_register_estimate", "skinny_smem_bytes",
           "STREAMK_MAX_CTAS"]
