"""The mma and ptx families (mma_hgemm.cuh, ptx_hgemm.cuh): raw CUDA mma.sync m16n8k16 kernels,
multi-stage cp.async into padded shared memory, grouped raster, split-K. Their parameter space,
static rules and the shapes they serve."""
from __future__ import annotations

from cudal2.templates.family import _ACC_LAYOUT, SMEM_LIMIT, Family, _register


def _mma_smem_bytes(p: dict) -> int:
    """mma_hgemm.cuh's kSmemBytes: STAGES stages of the B tile and of the A tile (two A buffers
    when A is staged through registers, skinny's A_LOAD "regs"), rows padded by 8 halves."""
    a = p["BM"] * (p["BK"] + 8)
    b = p["BN"] * (p["BK"] + 8) if p["LAYOUT"] == "RC" else p["BK"] * (p["BN"] + 8)
    a_bufs = 2 if p.get("A_LOAD") == "regs" else p["STAGES"]
    return (a_bufs * a + p["STAGES"] * b) * 2


def _mma_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    out = []
    BM, BN, BK, WM, WN = p["BM"], p["BN"], p["BK"], p["WM"], p["WN"]
    if WM % 16 or WN % 16:
        out.append(f"warp tile {WM}x{WN} must be a multiple of 16x16")
    if BM % WM or BN % WN:
        out.append(f"warp tile {WM}x{WN} must divide the block tile {BM}x{BN}")
    if BK % 16:
        out.append(f"BK={BK} must be a multiple of 16")
    if out:
        return out
    threads = (BM // WM) * (BN // WN) * 32
    if threads > 1024:
        out.append(f"{threads} threads per block > 1024")
    for what, chunks in (("A", BM * BK // 8), ("B", BK * BN // 8)):
        if chunks % threads:
            out.append(f"{what} tile has {chunks} 16-byte chunks, not a multiple of {threads} threads")
    acc_regs = (WM // 16) * (WN // 8) * (2 if p["ACC"] == "f16" else 4)
    if acc_regs > 128:
        out.append(f"warp tile {WM}x{WN} needs {acc_regs} accumulator registers per thread (> 128: spills)")
    if p["STAGES"] < 2:
        out.append("STAGES must be >= 2")
    if p["SPLITK"] > 16:
        out.append("SPLITK must be <= 16")
    if p["SPLITK_MAX_MN"] > 1 << 26:
        out.append("SPLITK_MAX_MN must be <= 2**26 (it sizes the declared workspace)")
    smem = _mma_smem_bytes(p)
    for a in ([arch] if arch else family.arches):
        if smem > SMEM_LIMIT[a]:
            out.append(f"{smem} bytes of shared memory > {SMEM_LIMIT[a]} on {a}")
    if family.name == "ptx" and (WM, WN) != (64, 64):
        out.append("the ptx family's inner-loop PTX is written for WM = WN = 64")
    return out


def _mma_accepts(p: dict, M: int, N: int, K: int) -> bool:
    return p["SPLITK"] == 1 or M * N <= p["SPLITK_MAX_MN"]


def _mma_name(p: dict) -> str:
    """BMxBNxBK, warp tile, stages, swizzle group, split-K (and its M*N cap when not the default)."""
    name = (f"{p['BM']}x{p['BN']}x{p['BK']}_w{p['WM']}x{p['WN']}_s{p['STAGES']}_g{p['SWIZZLE']}"
            f"_k{p['SPLITK']}")
    return name + (f"_mn{p['SPLITK_MAX_MN']}" if p["SPLITK_MAX_MN"] != 2097152 else "")


_MMA_SPACE = {
    "BM": (64, 128, 256), "BN": (64, 128, 256), "BK": (32, 64), "WM": (32, 64), "WN": (32, 64),
    "STAGES": (2, 3, 4, 5), "SWIZZLE": (1, 4, 8, 16), "SPLITK": (1, 2, 4, 8),
    "SPLITK_MAX_MN": (2097152,),
}
_MMA_DEFAULT = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3, SWIZZLE=8, SPLITK=1,
                    SPLITK_MAX_MN=2097152, ACC="f32", LAYOUT="RR")


_register(Family(
    name="mma", arches=("sm_80", "sm_90a"), header="mma_hgemm.cuh", style="mma", flags=(),
    description="raw CUDA: mma.sync m16n8k16, ldmatrix, multi-stage cp.async into padded smem, "
                "grouped raster, split-K; any M, N, K",
    _space=_MMA_SPACE, _fixed=_ACC_LAYOUT,
    _defaults=(_MMA_DEFAULT, {**_MMA_DEFAULT, "ACC": "f16"}, {**_MMA_DEFAULT, "LAYOUT": "RC"}),
    _problems=_mma_problems, _accepts=_mma_accepts, _name=_mma_name))

_register(Family(
    name="ptx", arches=("sm_80", "sm_90a"), header="ptx_hgemm.cuh", style="ptx", flags=(),
    description="the mma pipeline with each k16 step (ldmatrix + 32 mma.sync) as one hand-written "
                "inline-PTX block; warp tile fixed at 64x64; any M, N, K",
    _space={**_MMA_SPACE, "WM": (64,), "WN": (64,)}, _fixed=_ACC_LAYOUT,
    _defaults=(_MMA_DEFAULT,),
    _problems=_mma_problems, _accepts=_mma_accepts, _name=_mma_name))
