"""The skinny families (skinny_hgemm.cuh): M <= 64, bandwidth-bound shapes such as LLM decode
("skinny"), and its mirror N <= 64 with B column-major ("skinny_n", skinny_n_hgemm.cuh).

One CTA row covers every row of A (BM = 16, 32 or 64, M padded with zero rows), so B is streamed
from HBM exactly once with 16-byte cp.async; K is split across the SMs at run time (ABI 2 option
"splits", 0 = chosen from the shape and the SM count) and reduced in fp32 inside the kernel
(splitk_fixup.cuh: through the workspace, or on sm_90a with <= 8 splits inside a thread-block
cluster through distributed shared memory), or handed out stream-K (option "decomposition" 3, or
0 where split-K would leave a partial last wave: streamk.cuh). The mirror runs the same kernel on C^T = B^T A^T, streaming A once and
storing C transposed. Importing this module registers both families
(cudal2/templates/__init__.py does).
"""
from __future__ import annotations

from cudal2.templates.family import Family, _register
from cudal2.templates.mma import _mma_problems, _mma_smem_bytes

# Runtime options of every skinny build (call order, values, default): 0 = the kernel's choice.
# decomposition (docs/abi.md's shared name): 0 heuristic (stream-K where the split-K grid would
# end in a partial wave, else split-K), 2 split-K, 3 stream-K (the grid = the resident slots,
# equal contiguous (tile, k-tile) ranges: streamk.cuh). An explicit split count is split-K.
# pdl: programmatic dependent launch (sm_90a builds; sm_80 builds run 1 as 0): the grid may be
# scheduled while the stream's previous kernel drains, and waits for it before any global access.
# Every build accepts 1 (its meta says so), but the planner sweeps 0 only: the kernel timer runs
# each call right behind a call of the same kernel, where pdl would overlap its own predecessor,
# a path no baseline gets. CUDAL2_PDL=1 turns it on in dispatch, and `cudal2 bench --model`
# measures it behind a model's own kernels.
SKINNY_OPTIONS = (("splits", (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64), 0),
                  ("decomposition", (0, 2, 3), 0),
                  ("pdl", (0,), 0))


STREAMK_MAX_CTAS = 2048      # streamk.cuh's kMaxCtas: the most CTAs a stream-K grid runs
FIXUP_BATCH = 4              # splitk_fixup.cuh's kFixupBatch: splits a reducing thread loads at once


def cluster_of(splits: int, cluster_max: int = 8) -> int:
    """The cluster a split count reduces in on sm_90a (skinny_hgemm.cuh's cluster_of): its
    largest divisor of at most cluster_max; 1: none (the workspace alone)."""
    return next((c for c in range(min(splits, cluster_max), 1, -1) if splits % c == 0), 1)


def streamk_fixup_batch(p: dict) -> int:
    """Stream-K contributors whose partials the last arriver loads at once (mma_hgemm.cuh's
    kStreamkBatch): 64 floats in flight per thread, its (WM/16) x (WN/8) float4 fragments each."""
    frags = (p["WM"] // 16) * (p["WN"] // 8)
    return 1 if frags >= 16 else 16 // frags


def skinny_splits(N: int, K: int, BN: int, BK: int, sms: int, asked: int = 0,
                  tiles_m: int = 1) -> int:
    """The split count a skinny kernel runs (skinny_hgemm.cuh's plan(), replayed): about two
    CTAs per SM over the output tiles (tiles_m rows of N tiles: one row for the skinny families,
    M's for streamk), at most 64, whole BK tiles per split, no empty split."""
    tiles = max(1, tiles_m * -(-N // BN))
    k_tiles = -(-K // BK)
    s = asked if asked > 0 else -(-2 * sms // tiles)
    s = max(1, min(s, 64))
    if s > k_tiles:
        s = max(k_tiles, 1)
    if K <= 0:
        return 1
    chunk = -(-k_tiles // s) * BK
    return -(-K // chunk)


def skinny_plan(N: int, K: int, BN: int, BK: int, sms: int, slots: int, splits: int = 0,
                decomposition: int = 0, tiles_m: int = 1) -> tuple[str, int]:
    """How a skinny (or streamk) call runs (skinny_hgemm.cuh's decide(), replayed): ("streamk",
    grid) or ("splitk", splits). `slots`: the resident CTAs (per SM x SMs); tiles_m: rows of
    output tiles (1 for the skinny families). Stream-K when asked (decomposition 3), or by the
    heuristic (splits and decomposition 0) where it walks fewer k-tiles per CTA than split-K's
    waves do."""
    tiles = max(1, tiles_m * -(-N // BN))
    k_tiles = max(1, -(-K // BK))
    grid = max(1, min(slots, STREAMK_MAX_CTAS, tiles * k_tiles))
    n = skinny_splits(N, K, BN, BK, sms, splits, tiles_m)
    if decomposition == 3:
        return "streamk", grid
    if decomposition == 0 and splits == 0:
        chunk = -(-k_tiles // n)                  # k-tiles per split (plan()'s k_chunk / BK)
        if -(-tiles * k_tiles // grid) < -(-tiles * n // max(slots, 1)) * chunk:
            return "streamk", grid
    return "splitk", n


def skinny_smem_bytes(p: dict) -> int:
    """Dynamic shared memory of a skinny build (mma_hgemm.cuh's kSmemBytes; an old build's meta
    without A_LOAD ran A through the ring)."""
    return _mma_smem_bytes(p)


def skinny_register_estimate(p: dict) -> int:
    """Registers a skinny build takes, before it is built: an upper bound, not a fit. ptxas's
    figures on the 154 skinny and skinny_n builds of the RC decode pack (sm_90a, 2026-11-29: 89-205)
    sit 0-73 under it (median 37): the planner must not admit an option that ptxas's figure then
    drops (campaign prepare rechecks). Grows with the accumulators, the A chunks held in registers
    (A_LOAD regs) and the unrolled B loads; capped by __launch_bounds__(threads, 1)."""
    threads = 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
    acc = (p["WM"] // 16) * (p["WN"] // 8) * 4
    a_chunks = p["BM"] * p["BK"] // 8 // threads if p.get("A_LOAD") == "regs" else 0
    b_chunks = p["BN"] * p["BK"] // 8 // threads
    cap = min(255, 65536 // threads // 8 * 8)
    return min(cap, int(138 + 0.75 * acc + 6.5 * a_chunks + 3.5 * b_chunks))


def _skinny_option_redundant(p: dict, o: dict) -> bool:
    """A split count other than 0 runs split-K whatever the decomposition (3 ignores it): only
    (splits 0, decomposition 0 / 2 / 3) and (splits s, decomposition 0) behave differently."""
    return o["decomposition"] != 0 and o["splits"] != 0


def _as_mma(p: dict) -> dict:
    """The mma family's parameters of the same kernel (its rules on tiles, threads, registers
    and shared memory hold for it unchanged)."""
    return {**p, "ACC": "f32", "SWIZZLE": 1, "SPLITK": 1, "SPLITK_MAX_MN": 1}


def _skinny_problems(family, p: dict, arch: str | None) -> list[str]:
    out = []
    if p["BM"] not in (16, 32, 64):
        out.append(f"BM={p['BM']} must be 16, 32 or 64 (the largest M served, padded to m16 rows)")
    if p["WM"] > p["BM"]:
        out.append(f"WM={p['WM']} must not exceed BM={p['BM']}")
    warps = (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) if p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0 else 4
    if warps < 4:
        # a streaming kernel needs loads in flight: one or two warps also spill their
        # unrolled tile loads (BM=32 BN=64 WM=32 WN=64 BK=128: 304 bytes on sm_90a)
        out.append(f"{warps} warps per CTA: the skinny family needs at least 4")
    b_chunks = p["BK"] * p["BN"] // 8 // (32 * warps)
    if b_chunks > 16:
        # BN=256 BK=128 on 4 warps: 32 unrolled 16-byte loads per thread spill (136 bytes)
        out.append(f"{b_chunks} 16-byte B loads per thread per stage (> 16: spills)")
    if warps == 32 and p["BN"] == 256 and p["BK"] == 128:
        # 1024 threads (64 registers a thread) over a 64x256x128 tile: the stream-K segment loop's
        # state spills (16x32 and 32x16 warp tiles, STAGES=2 on sm_90a: 104-168 bytes, found by
        # `cudal2 templates --build-space skinny skinny_n --where BM=64`)
        out.append("32 warps on a BN=256 BK=128 tile: the stream-K loop spills at 64 registers")
    if warps == 16 and p["WM"] == 16 and p["WN"] == 64:
        # 16x64 warp tiles at 512 threads (128 registers a thread) sit on the spill edge: the
        # mirror's transposed epilogue spilled 24 bytes, skinny RC 8 bytes on sm_90a at STAGES 2
        # or 3 as the loads changed (cudal2 templates --build-space skinny skinny_n)
        out.append("16 warps of 16x64 warp tiles: the kernel spills at 128 registers")
    if out:
        return out
    return _mma_problems(family, _as_mma(p), arch)


def _skinny_accepts(p: dict, M: int, N: int, K: int) -> bool:
    # 16-byte loads of dense operands: lda = K, ldb = N (RR) or K (RC) multiples of 8
    return M <= p["BM"] and K % 8 == 0 and (p["LAYOUT"] == "RC" or N % 8 == 0)


# BM: the largest small dimension served (M for skinny, N for skinny_n)
# A_LOAD: "ring", A's k-tiles ride the cp.async ring beside B's; "regs", A goes through registers
# into two buffers, so the ring holds B alone (a 64-row A took a third of a 64x128 stage: deeper
# B rings, 10 to 16 stages, fit where they did not).
_SKINNY_SPACE = {"BM": (16, 32, 64), "BN": (32, 64, 128, 256), "BK": (32, 64, 128), "WM": (16, 32),
                 "WN": (16, 32, 64), "STAGES": (2, 3, 4, 6, 8, 10, 12, 16), "A_LOAD": ("ring", "regs")}
_SKINNY_DEFAULT = dict(BM=16, BN=128, BK=64, WM=16, WN=32, STAGES=4, LAYOUT="RC", A_LOAD="ring")


def _skinny_name(p: dict) -> str:
    """BMxBNxBK, warp tile, stages, "_ar" when A goes through registers (the split count is a
    runtime option, not in the name)."""
    name = f"{p['BM']}x{p['BN']}x{p['BK']}_w{p['WM']}x{p['WN']}_s{p['STAGES']}"
    return name + ("_ar" if p.get("A_LOAD") == "regs" else "")


_register(Family(
    name="skinny", arches=("sm_80", "sm_90a"), header="skinny_hgemm.cuh", style="mma", flags=(),
    description="M <= 64 (decode): B streamed once from HBM by 16-byte cp.async, mma.sync "
                "m16n8k16 f32 with M padded to BM rows, K split across the SMs at run time (ABI 2 "
                "option splits) and reduced inside the kernel; K % 8 == 0 (and N % 8 == 0 for RR)",
    _space=_SKINNY_SPACE,
    _fixed={"LAYOUT": ("RR", "RC")},
    _defaults=(_SKINNY_DEFAULT, {**_SKINNY_DEFAULT, "LAYOUT": "RR"},
               {**_SKINNY_DEFAULT, "BM": 64, "WM": 32, "BN": 128, "WN": 32, "STAGES": 4}),
    _problems=_skinny_problems, _name=_skinny_name,
    _accepts=_skinny_accepts,
    _options=lambda p: [(n, v, d) for n, v, d in SKINNY_OPTIONS],
    _option_redundant=_skinny_option_redundant,
    instruction="mma.sync"))


def _skinny_n_accepts(p: dict, M: int, N: int, K: int) -> bool:
    # 16-byte loads of dense operands: lda = K and ldb = K (B column-major) multiples of 8
    return N <= p["BM"] and K % 8 == 0


_register(Family(
    name="skinny_n", arches=("sm_80", "sm_90a"), header="skinny_n_hgemm.cuh", style="mma", flags=(),
    description="N <= 64 with B column-major (few output features: LoRA down-projection, router, "
                "classifier head): the skinny kernel on C^T = B^T A^T, A streamed once from HBM, C "
                "stored transposed; K split across the SMs at run time (option splits); K % 8 == 0",
    _space=_SKINNY_SPACE,
    _fixed={"LAYOUT": ("RC",)},
    _defaults=(_SKINNY_DEFAULT, {**_SKINNY_DEFAULT, "BM": 64, "WM": 32, "BN": 128, "WN": 32}),
    _problems=_skinny_problems, _name=_skinny_name,
    _accepts=_skinny_n_accepts,
    _options=lambda p: [(n, v, d) for n, v, d in SKINNY_OPTIONS],
    _option_redundant=_skinny_option_redundant,
    instruction="mma.sync"))
