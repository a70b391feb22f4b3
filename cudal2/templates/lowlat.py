"""The lowlat and lowlat_mma families (lowlat_hgemm.cuh): a low-latency HGEMM for launch-bound shapes. One output
tile per CTA on a plain grid (no cluster, no persistent scheduler, no tensor maps: cp.async loads,
so the host does one cudaLaunchKernel per call), a 2-8 stage pipeline (2-4 for launch-bound
shapes, 6-8 to keep a decode row's weight in flight) and a register epilogue;
wgmma (sm_90a) for tiles of 64 or 128 rows, mma.sync (sm_80 and later) for 16 or 32. Deep K on few
tiles splits across CTAs in the same launch (kernel ABI 2, runtime option "splits", reduced in
the kernel by splitk_fixup.cuh's deterministic fixup: a zero-init workspace). Its parameter
space, static rules, the shapes it serves and the kernel's split choice (lowlat_splits)."""
from __future__ import annotations

from cudal2.templates.family import SMEM_LIMIT, Family, _register


def lowlat_smem_bytes(p: dict) -> int:
    """Dynamic shared memory of a lowlat config, as lowlat_hgemm.cuh computes kSmemBytes."""
    BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["STAGES"]
    if BM >= 64:    # swizzled 128-byte rows, unpadded, plus 1 KiB to align the base
        return S * (BM + BN) * BK * 2 + 1024
    a = BM * (BK + 8)
    b = BN * (BK + 8) if p["LAYOUT"] == "RC" else BK * (BN + 8)
    return S * (a + b) * 2


def lowlat_instruction(p: dict) -> str:
    """The tensor-core instruction a config's main loop issues."""
    return "wgmma" if p["BM"] >= 64 else "mma.sync"


# Runtime option "splits" as every build's meta declares it (the values the kernel accepts; 0 = the
# launcher's choice, lowlat_splits; 1 = no split, the ABI 1 kernel of before).
SPLIT_VALUES = (0, 1, 2, 4, 8, 16, 32, 64)
MAX_SPLITS = 64
MIN_K_TILES = 4          # the launcher's choice gives every split at least this many k-tiles
# What the planner sweeps per (shape, build): the kernel's own choice only (the cost model replays
# it with lowlat_splits below). Other values are for explicit calls and tests; add them here
# once measurements show where the choice misses (each one is a timing per shape and build).
# On a decode row it sweeps every value: the choice plans one CTA per SM, and a deep ring on a
# grid of two per SM, or a count that ends the last wave full, can meet the streaming budget
# where the choice does not (the planner keeps those that meet it, one per distinct grid).
PLANNED_SPLITS = (0,)


def lowlat_splits(M: int, N: int, K: int, BM: int, BN: int, BK: int, sms: int,
                  asked: int = 0) -> tuple[int, int]:
    """(splits, k-tiles per split) of one call: lowlat_hgemm.cuh's plan_splits, replayed. asked 0:
    enough splits to fill `sms` SMs at one CTA each, no more than balance the partial tiles the
    last CTA reads (s * BM*BN*4 bytes) against the k-tiles one split streams (k_tiles/s *
    (BM+BN)*BK*2 bytes), at least MIN_K_TILES k-tiles per split; asked > 0: that many, at most
    one per k-tile. Every split a non-empty range of whole k-tiles. K == 0: (1, 0)."""
    if K <= 0 or M <= 0 or N <= 0:
        return 1, 0
    k_tiles = (K - 1) // BK + 1
    tiles = ((M - 1) // BM + 1) * ((N - 1) // BN + 1)
    s = asked
    if asked == 0:
        s = min(sms // tiles, MAX_SPLITS)
        while s > 1 and s * s * BM * BN * 4 > k_tiles * (BM + BN) * BK * 2:
            s -= 1
        s = min(s, k_tiles // MIN_K_TILES)
    s = max(1, min(s, k_tiles))
    per = -(-k_tiles // s)
    return -(-k_tiles // per), per


def lowlat_workspace_bytes(M: int, N: int, splits: int, BM: int, BN: int) -> int:
    """cudal2_workspace of a call that runs `splits` splits (splitk_fixup.cuh's layout: one fp32
    slab per split, padded to 16 bytes, then a semaphore per output tile); 0 without a split."""
    if splits <= 1:
        return 0
    tiles = -(-M // BM) * -(-N // BN)
    return -(-splits * M * N * 4 // 16) * 16 + 4 * tiles


# 2-4: a short prologue for launch-bound shapes; 6 and 8: a decode row's weight in flight (a
# 128-column B tile, 16 KiB a stage: 5 stages meet an H100's 69 KiB per SM, 7 an H200's 99).
LOWLAT_STAGES = (2, 3, 4, 6, 8)


def _problems(family: Family, p: dict, arch: str | None) -> list[str]:
    out = []
    wgmma = family.instruction == "wgmma"
    if p["BM"] in (16, 32, 64, 128) and (p["BM"] >= 64) != wgmma:
        out.append(f"BM={p['BM']} belongs to {'lowlat' if p['BM'] >= 64 else 'lowlat_mma'} "
                   f"({'wgmma' if p['BM'] >= 64 else 'mma.sync'}), not {family.name}")
    if p["ACC"] != "f32":
        out.append("the lowlat family implements fp32 accumulation only (ACC=f32)")
    if p["BM"] not in (16, 32, 64, 128):
        out.append(f"BM={p['BM']} must be 16 or 32 (mma.sync) or 64 or 128 (wgmma)")
    if p["BN"] not in (64, 128):
        out.append(f"BN={p['BN']} must be 64 or 128")
    if p["BK"] != 64:
        out.append(f"BK={p['BK']} must be 64 (one 128-byte swizzle atom)")
    if not 2 <= p["STAGES"] <= 8:
        out.append(f"STAGES={p['STAGES']} must be 2..8 (cp.async.wait_group takes 0..7)")
    if out:
        return out
    smem = lowlat_smem_bytes(p)
    for a in ([arch] if arch else family.arches):
        if smem > SMEM_LIMIT[a]:
            out.append(f"{smem} bytes of shared memory > {SMEM_LIMIT[a]} on {a}")
    return out


def _accepts(p: dict, M: int, N: int, K: int) -> bool:
    # 16-byte cp.async chunks never straddle the matrix edge: K % 8, and N % 8 for RR (ldb = N).
    # The meta's "divisible" says the same.
    return K % 8 == 0 and (p["LAYOUT"] == "RC" or N % 8 == 0)


def _name(p: dict) -> str:
    """BMxBNxBK, stages, cluster (always 1x1)."""
    return f"{p['BM']}x{p['BN']}x{p['BK']}_s{p['STAGES']}_c1x1"


# Two families over one header, so that each issues one tensor-core instruction (the cost model
# prices a style, which is the family's name, by its instruction's ceiling): lowlat (wgmma, BM 64/128, sm_90a) and
# lowlat_mma (mma.sync, BM 16/32, sm_80 and sm_90a).
_COMMON = dict(header="lowlat_hgemm.cuh", flags=(), _problems=_problems,
               _accepts=_accepts, _name=_name,
               _options=lambda p: [("splits", PLANNED_SPLITS, 0)],
               _decode_options=lambda p: [("splits", SPLIT_VALUES, 0)], _fixed={"ACC": ("f32",), "LAYOUT": ("RR", "RC")})
_DEFAULT = dict(BM=64, BN=128, BK=64, STAGES=3, ACC="f32", LAYOUT="RR")
_register(Family(
    name="lowlat", arches=("sm_90a",), instruction="wgmma", style="lowlat",
    description="low-latency kernel for launch-bound shapes: one tile per CTA, plain grid, no "
                "cluster, no tensor maps (cp.async into wgmma's 128-byte-swizzled layout), 2-8 "
                "stages, wgmma m64nBNk16, register epilogue with 16-byte stores; deep K on few tiles "
                "split across CTAs in the same launch (ABI 2 option splits, reduced in the kernel); "
                "K % 8 == 0 and (RR) N % 8 == 0",
    _space={"BM": (64, 128), "BN": (64, 128), "BK": (64,), "STAGES": LOWLAT_STAGES},
    _defaults=(_DEFAULT, {**_DEFAULT, "LAYOUT": "RC"}, {**_DEFAULT, "BN": 64},
               {**_DEFAULT, "BM": 128}), **_COMMON))
_SKINNY = dict(_DEFAULT, BM=32)
_register(Family(
    name="lowlat_mma", arches=("sm_80", "sm_90a"), instruction="mma.sync", style="lowlat_mma",
    description="the low-latency kernel for tiles of 16 or 32 rows: mma.sync m16n8k16 from "
                "padded shared memory (cp.async, ldmatrix), BN/32 warps; deep K split across CTAs "
                "in the same launch (option splits); K % 8 == 0 and (RR) N % 8 == 0",
    _space={"BM": (16, 32), "BN": (64, 128), "BK": (64,), "STAGES": LOWLAT_STAGES},
    _defaults=(_SKINNY, {**_SKINNY, "LAYOUT": "RC"}, {**_SKINNY, "BM": 16, "BN": 64}), **_COMMON))
