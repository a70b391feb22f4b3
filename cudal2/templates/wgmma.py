"""The wgmma family (wgmma_hgemm.cuh, docs/wgmma.md): our own Hopper kernel, raw CUDA + inline PTX.
Its parameter space, static rules, runtime options and the shapes it serves."""
from __future__ import annotations

from cudal2.templates.family import _ENUM_MACROS, SMEM_LIMIT, Family, _register

# TMA loads into a STAGES-deep mbarrier pipeline, one producer warpgroup and CONSUMERS consumer
# warpgroups issuing wgmma.mma_async, clusters of CLUSTER_M CTAs along M sharing B by TMA
# multicast, a persistent grid whose tile order (raster, swizzle) and size (sm_count) are ABI 2
# runtime options, and a stmatrix + TMA-store ("tma") or register ("direct") epilogue. CLUSTER_M 1
# builds also split K at run time (option "splits"): a tile's splits are one cluster along y,
# reduced through distributed shared memory (few-tile shapes: decode with 33 <= M <= 64, deep K).
_ENUM_MACROS.setdefault("EPILOGUE", ("EPILOGUE_TMA", {"direct": 0, "tma": 1}))

# The runtime options every wgmma kernel declares in its meta (call order, values, default):
# what the tuner sweeps per shape without rebuilding.
WGMMA_OPTIONS: tuple[tuple[str, tuple[int, ...], int], ...] = (
    ("raster", (0, 1, 2, 3), 0),                              # 0 heuristic, 1 along M, 2 along N, 3 Hilbert
    ("swizzle", (1, 2, 4, 8, 16), 8),                         # group size of rasters 1 and 2
    ("sm_count", (0, 64, 96, 114, 120, 128, 130, 132), 0),    # persistent grid size (0 = every SM)
    ("splits", (0, 1, 2, 3, 4, 6, 8), 1),                     # K splits in a cluster (0 = wgmma_splits)
)
SPLITS_MAX = 8    # splitk_fixup.cuh's kClusterMax: the most CTAs of a portable cluster


def wgmma_options(p: dict) -> list[tuple[str, tuple[int, ...], int]]:
    """The runtime options a build declares: CLUSTER_M 2 builds share B along M in the cluster
    and take splits 1 only."""
    if p.get("CLUSTER_M", 1) == 1:
        return list(WGMMA_OPTIONS)
    return [o if o[0] != "splits" else ("splits", (1,), 1) for o in WGMMA_OPTIONS]


def wgmma_splits(M: int, N: int, K: int, BM: int, BN: int, BK: int, sms: int, asked: int = 1,
                 cluster_m: int = 1) -> int:
    """The split count of one call: wgmma_hgemm.cuh's plan_splits, replayed. asked 0: the fewest
    (waves x k-blocks per split) at one CTA per SM over 1..8 splits, ties to fewer; never more
    splits than k-blocks (the launcher also steps down to a cluster size that is resident)."""
    if cluster_m > 1 or K <= 0 or M <= 0 or N <= 0:
        return 1
    tiles = -(-M // BM) * -(-N // BN)
    kb = -(-K // BK)
    s = asked
    if asked == 0:
        costs = [(-(-tiles * c // sms) * -(-kb // c), c) for c in range(1, SPLITS_MAX + 1)]
        s = min(costs)[1]
    return max(1, min(s, kb))


def _wgmma_option_redundant(p: dict, o: dict) -> bool:
    # swizzle is the group size of rasters 1 and 2 only: with 0 (heuristic) or 3 (Hilbert) every
    # swizzle value runs the same order. A split call's grid is (tiles, splits), not persistent:
    # sm_count does not apply, and the planner keeps the heuristic order for it.
    if o["raster"] in (0, 3) and o["swizzle"] != 8:
        return True
    return o.get("splits", 1) != 1 and (o["sm_count"] != 0 or o["raster"] != 0)


def wgmma_option_space() -> dict[str, list[int]]:
    """Runtime option -> values of the wgmma family (the same list every build's meta declares)."""
    return {name: list(values) for name, values, _ in WGMMA_OPTIONS}


def _wgmma_smem_bytes(p: dict) -> int:
    """Dynamic shared memory of a wgmma config, as wgmma_hgemm.cuh computes kSmemBytes."""
    fixed = p["STAGES"] * (p["BM"] + p["BN"]) * p["BK"] * 2 + 3 * p["STAGES"] * 8 + 1024
    if p["EPILOGUE"] != "tma":
        return fixed
    # C staging for all consumers: the whole BM x BN tile if it fits, else 128 columns, else 64
    chunks = p["BN"] // 64
    for c in (chunks, 2, 1):
        if c <= chunks and fixed + p["BM"] * 128 * c <= SMEM_LIMIT["sm_90a"]:
            return fixed + p["BM"] * 128 * c
    return fixed + p["BM"] * 128


def _wgmma_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    out = []
    BM, BN, BK, C = p["BM"], p["BN"], p["BK"], p["CONSUMERS"]
    if p["ACC"] != "f32":
        out.append("the wgmma family implements fp32 accumulation only (ACC=f32)")
    if C not in (1, 2, 3):
        out.append(f"CONSUMERS={C} must be 1, 2 or 3")
    elif BM % (64 * C) or BM // (64 * C) not in (1, 2):
        out.append(f"BM={BM} must be 64 or 128 rows per consumer warpgroup (CONSUMERS={C})")
    if BN not in (64, 128, 192, 256):
        out.append(f"BN={BN} must be 64, 128, 192 or 256 (wgmma N, whole 64-column swizzle chunks)")
    if BK not in (64, 128):
        out.append(f"BK={BK} must be 64 or 128 (whole 128-byte swizzle atoms)")
    if p["CLUSTER_M"] not in (1, 2):
        out.append(f"CLUSTER_M={p['CLUSTER_M']} must be 1 or 2")
    if p["STAGES"] < 2:
        out.append("STAGES must be >= 2")
    if out:
        return out
    acc = (BM // C // 64) * BN // 2
    limit = 96 if C == 3 else 128
    if acc > limit:
        out.append(f"{acc} accumulator registers per consumer thread (> {limit}: spills)")
    smem = _wgmma_smem_bytes(p)
    if smem > SMEM_LIMIT["sm_90a"]:
        out.append(f"{smem} bytes of shared memory > {SMEM_LIMIT['sm_90a']} on sm_90a")
    return out


def _wgmma_accepts(p: dict, M: int, N: int, K: int) -> bool:
    # TMA strides are multiples of 16 bytes: lda = K, ldb = N (RR) or K (RC), ldc = N when the
    # epilogue is a TMA store. The meta's "divisible" says the same.
    n_div8 = p["LAYOUT"] == "RR" or p["EPILOGUE"] == "tma"
    return K % 8 == 0 and (N % 8 == 0 or not n_div8)


def _wgmma_name(p: dict) -> str:
    """BMxBNxBK, stages, cluster (CLUSTER_M x 1), consumer warpgroups, epilogue (tma | direct)."""
    return (f"{p['BM']}x{p['BN']}x{p['BK']}_s{p['STAGES']}_c{p['CLUSTER_M']}x1"
            f"_g{p['CONSUMERS']}_{p['EPILOGUE']}")


_WGMMA_BIG = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, CLUSTER_M=2, EPILOGUE="tma",
                  ACC="f32", LAYOUT="RR")
_WGMMA_128 = dict(_WGMMA_BIG, BN=128, STAGES=6)
# The simplest path (one consumer warpgroup, no cluster, register epilogue): the fallback.
_WGMMA_SIMPLE = dict(_WGMMA_BIG, BN=128, CONSUMERS=1, CLUSTER_M=1, EPILOGUE="direct")
_register(Family(
    name="wgmma", arches=("sm_90a",), header="wgmma_hgemm.cuh", style="wgmma", flags=(),
    description="raw CUDA + inline PTX Hopper kernel: TMA (multicast in 2-CTA clusters) into an "
                "mbarrier pipeline, producer + consumer warpgroups with setmaxnreg, "
                "wgmma.mma_async f32, persistent grid with runtime tile order (ABI 2), TMA-store "
                "epilogue; N % 8 == 0 (RR or TMA store) and K % 8 == 0",
    _space={"BM": (64, 128, 192, 256), "BN": (64, 128, 192, 256), "BK": (64, 128),
            "STAGES": (2, 3, 4, 5, 6, 7, 8), "CONSUMERS": (1, 2, 3), "CLUSTER_M": (1, 2),
            "EPILOGUE": ("direct", "tma")},
    _fixed={"ACC": ("f32",), "LAYOUT": ("RR", "RC")},
    _defaults=(_WGMMA_BIG, {**_WGMMA_BIG, "LAYOUT": "RC"}, _WGMMA_128, _WGMMA_SIMPLE,
               {**_WGMMA_SIMPLE, "LAYOUT": "RC"}),
    _problems=_wgmma_problems, _accepts=_wgmma_accepts,
    _options=wgmma_options,
    _option_redundant=_wgmma_option_redundant,
    instruction="wgmma", _name=_wgmma_name))
