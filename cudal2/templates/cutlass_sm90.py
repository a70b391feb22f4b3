"""The cutlass_sm90 family (cutlass_sm90.cuh): CUTLASS 3.x TMA warp-specialised kernels from the
CollectiveBuilders, kernel ABI 2. Its parameter space, static rules, runtime options and the
shapes it serves."""
from __future__ import annotations

from cudal2.templates.family import _ACC_LAYOUT, SMEM_LIMIT, Family, OptionDecl, _register

_CUTLASS_FLAGS = ("-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG")


def _cutlass_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    """What CUTLASS 3.x (4.2) cannot build, or the space does not cover (every config this
    accepts was compiled for sm_90a with zero spills:
    tests/test_templates.py::test_cutlass_space_builds_without_spills)."""
    out = []
    BM, BN, BK = p["BM"], p["BN"], p["BK"]
    coop = p["SCHEDULE"] == "cooperative"
    if coop and BM not in (128, 256):
        out.append(f"cooperative schedule splits BM over two consumer warpgroups: BM must be 128 or 256, got {BM}")
    if not coop and BM not in (64, 128):
        out.append(f"pingpong schedule: BM must be 64 or 128, got {BM}")
    if BN % 16 or not 16 <= BN <= 256:
        out.append(f"BN={BN} must be a multiple of 16 in [16, 256] (wgmma N)")
    if BM == 256 and BN != 128:
        out.append(f"BM=256 pairs with BN=128 only (the CUTLASS profiler's 256-row tile; 256x{BN} "
                   "is not in the compiled space)")
    if BK != 64:
        out.append(f"BK={BK} must be 64 (128 bytes of fp16, one TMA swizzle atom: the compiled space)")
    cm, cn = p["CLUSTER_M"], p["CLUSTER_N"]
    if (cm, cn) not in ((1, 1), (2, 1), (1, 2)):
        out.append(f"cluster {cm}x{cn}: one of 1x1, 2x1, 1x2 (the compiled space)")
    if p["SCHEDULER"] == "streamk" and not coop:
        out.append("SCHEDULER=streamk needs the cooperative schedule (CUTLASS's ping-pong kernel "
                   "has no stream-K scheduler)")
    # accumulator registers per consumer thread (128 threads per warpgroup)
    rows = BM // 2 if coop else BM
    per_thread = rows * BN // 128 // (2 if p["ACC"] == "f16" else 1)
    if per_thread > 128:
        out.append(f"{per_thread} accumulator registers per consumer thread (> 128: spills)")
    stage = (BM + BN) * BK * 2
    if 2 * stage + 32768 > SMEM_LIMIT["sm_90a"]:
        out.append(f"two {stage}-byte stages plus the epilogue do not fit in shared memory")
    return out


def _cutlass_accepts(p: dict, M: int, N: int, K: int) -> bool:
    return N % 8 == 0 and K % 8 == 0


# Runtime options of a cutlass_sm90 build (cutlass_sm90.cuh's header has their meaning).
_CUTLASS_OPTIONS: list[OptionDecl] = [("swizzle", (1, 2, 4, 8), 1), ("raster", (0, 1, 2), 0)]
_STREAMK_OPTIONS: list[OptionDecl] = [("splits", (1, 2, 4, 8), 1), ("decomposition", (0, 1, 2, 3), 0)]


def _cutlass_options(p: dict) -> list[OptionDecl]:
    return _CUTLASS_OPTIONS + (_STREAMK_OPTIONS if p["SCHEDULER"] == "streamk" else [])


def _cutlass_option_rule(p: dict, o: dict) -> list[str]:
    # CUTLASS's stream-K can_implement: a split count needs the heuristic or split-K decomposition
    if o.get("splits", 1) > 1 and o.get("decomposition", 0) not in (0, 2):
        return [f"splits={o['splits']} needs decomposition 0 (heuristic) or 2 (split-K), "
                f"got {o['decomposition']}"]
    return []


def _cutlass_option_redundant(p: dict, o: dict) -> bool:
    """CUTLASS turns a heuristic decomposition with splits > 1 into split-K, and split-K with
    one split is data-parallel: those spellings repeat another combination."""
    splits, dec = o.get("splits", 1), o.get("decomposition", 0)
    return (dec == 0 and splits > 1) or (dec == 2 and splits == 1)


def _cutlass_name(p: dict) -> str:
    """BMxBNxBK, schedule (coop | ping), scheduler (persistent | streamk), cluster MxN."""
    sched = "coop" if p["SCHEDULE"] == "cooperative" else "ping"
    return (f"{p['BM']}x{p['BN']}x{p['BK']}_{sched}_{p['SCHEDULER']}"
            f"_c{p['CLUSTER_M']}x{p['CLUSTER_N']}")


_COOP = dict(BM=128, BN=256, BK=64, CLUSTER_M=2, CLUSTER_N=1, SCHEDULE="cooperative",
             SCHEDULER="persistent", ACC="f32", LAYOUT="RR")
_PING = dict(_COOP, BM=128, BN=128, SCHEDULE="pingpong")
_STREAMK = dict(_COOP, BN=128, CLUSTER_M=1, SCHEDULER="streamk")
_TALL = dict(_COOP, BM=256, BN=128, CLUSTER_M=1, CLUSTER_N=2)
_register(Family(
    name="cutlass_sm90", arches=("sm_90a",), header="cutlass_sm90.cuh", style="cutlass",
    flags=_CUTLASS_FLAGS,
    description="CUTLASS 3.x SM90 TMA warp-specialised GEMM (cooperative or pingpong, persistent "
                "or stream-K scheduler) from the CollectiveBuilders, kernel ABI 2 (runtime "
                "swizzle, raster, splits, decomposition); any M, N % 8 == 0, K % 8 == 0, "
                "16-byte aligned operands",
    _space={"BM": (64, 128, 256), "BN": (64, 128, 192, 256), "BK": (64,),
            "CLUSTER_M": (1, 2), "CLUSTER_N": (1, 2), "SCHEDULE": ("cooperative", "pingpong"),
            "SCHEDULER": ("persistent", "streamk")},
    _fixed=_ACC_LAYOUT, _defaults=(_COOP, _PING, _STREAMK, _TALL),
    _problems=_cutlass_problems, _accepts=_cutlass_accepts, any_shape=True,
    _options=_cutlass_options, _option_rule=_cutlass_option_rule,
    _option_redundant=_cutlass_option_redundant, instruction="wgmma", _name=_cutlass_name))
