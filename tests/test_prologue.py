"""The prologue of the small-shape kernels (issue 51, point 3): how many SASS instructions each
kernel entry lays out before its first global load (`buildspace.prologue_lengths`, read with
cuobjdump from the build; nvcc 13.0).

The cut of 2026-11-30 (reports/cpu/2026-11-30-prologue) took the integer divisions out of the
path to the first load: lowlat's grid is (N tiles, M tiles), the copy addresses are a constant
row step per further copy, and the host passes stream-K's divisors (streamk.cuh's Walk) as
multiply-high pairs. The bounds below are the cut's counts with about 10% to spare, so a change
that puts the divisions back fails here; the counts before the cut are in the comments.
"""
from __future__ import annotations

import pytest

from cudal2.core.build import build
from cudal2.core.toolchain import find_cuobjdump
from cudal2.templates import FAMILIES
from cudal2.templates.buildspace import disassemble, prologue_lengths

# (family, arch): the longest prologue of the default config's entries that load. The cut's
# counts: 158, 142 and 297; before it (8d03a88): 218, 214 and 365. (skinny's default: 436 before,
# 416 after, too close to bound.)
BOUNDS = {("lowlat", "sm_90a"): 175, ("lowlat_mma", "sm_90a"): 160, ("streamk", "sm_90a"): 330}


@pytest.mark.compile
@pytest.mark.parametrize("family,arch", sorted(BOUNDS), ids=lambda v: str(v))
def test_the_first_load_comes_within_the_cut_prologue(family, arch):
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump: the prologue is read from the SASS")
    cfg = FAMILIES[family].default()
    r = build(FAMILIES[family].build_spec(cfg, arch))
    assert r.ok, r.log[-3000:]
    lengths = prologue_lengths(disassemble(r.so_path, tool))
    gemm = {fn: n for fn, n in lengths.items() if "zero_kernel" not in fn}
    assert gemm, f"no entry of {cfg.label()} loads from global memory"
    assert max(gemm.values()) <= BOUNDS[(family, arch)], (cfg.label(), gemm)
