"""Reference kernel families (cudal2/templates): configs, static constraints, instantiation,
nvcc builds (compile tier: zero spills, ABI symbols, accumulator type in the PTX, meta JSON and
argument validation through ctypes without a GPU) and correctness against torch (gpu tier)."""
from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess

import pytest

from cudal2.templates import (FAMILIES, SMEM_LIMIT, KernelConfig, default_configs, instantiate,
                              template_dir)

INVALID_VALUE = 1   # cudaErrorInvalidValue
MMA_F32 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
MMA_F16 = "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"


# ---- configs and families (pure Python) ---------------------------------------------------
def test_config_is_sorted_frozen_and_hashable():
    c = KernelConfig.make("mma", BN=64, BM=128, ACC="f32")
    assert c.params == (("ACC", "f32"), ("BM", 128), ("BN", 64))
    assert c == KernelConfig("mma", (("BN", 64), ("ACC", "f32"), ("BM", 128)))
    assert len({c, KernelConfig.make("mma", ACC="f32", BM=128, BN=64)}) == 1
    assert c.get("BM") == 128 and c.get("NOPE") is None and c.get("NOPE", 3) == 3
    d = c.with_(BM=64, STAGES=4)
    assert d.get("BM") == 64 and d.get("STAGES") == 4 and c.get("BM") == 128
    assert c.label() == "mma:ACC=f32,BM=128,BN=64"
    with pytest.raises(Exception):
        c.family = "ptx"
    with pytest.raises(ValueError, match="int or a str"):
        KernelConfig.make("mma", BM=1.5)
    with pytest.raises(ValueError, match="int or a str"):
        KernelConfig.make("mma", BM=True)
    with pytest.raises(ValueError, match="macro name"):
        KernelConfig.make("mma", bm=128)


def test_families_and_their_headers():
    assert {"mma", "ptx", "cutlass_sm90", "wgmma", "lowlat", "skinny"} <= set(FAMILIES)
    assert FAMILIES["mma"].arches == ("sm_80", "sm_90a") == FAMILIES["ptx"].arches
    assert FAMILIES["cutlass_sm90"].arches == ("sm_90a",) == FAMILIES["wgmma"].arches
    assert {"mma", "ptx", "cutlass", "wgmma", "lowlat", "lowlat_mma"} <= {f.style for f in FAMILIES.values()}
    for f in FAMILIES.values():
        assert (template_dir() / f.header).is_file()
        f32_only = f.name.startswith("skinny") or f.name == "streamk"
        required = {"LAYOUT"} if f32_only else {"ACC", "LAYOUT"}
        assert set(f.space()) <= set(f.choices()) and required <= set(f.choices())
        assert "ACC" not in f.space() and "LAYOUT" not in f.space()   # requirements, not knobs
        for a in f.arches:
            assert a in SMEM_LIMIT
    assert "-DNDEBUG" in FAMILIES["cutlass_sm90"].flags


def test_default_instantiations():
    labels = {c.label() for c in default_configs()}
    want = [("mma", "f32", "RR"), ("mma", "f16", "RR"), ("mma", "f32", "RC"), ("ptx", "f32", "RR")]
    got = {(c.family, c.get("ACC"), c.get("LAYOUT")) for c in default_configs()}
    assert set(want) <= got
    scheds = {c.get("SCHEDULE") for c in FAMILIES["cutlass_sm90"].defaults()}
    assert scheds == {"cooperative", "pingpong"}
    assert len(labels) == len(default_configs())
    for c in default_configs():
        fam = FAMILIES[c.family]
        assert fam.problems(c) == []
        for a in fam.arches:
            assert fam.valid(c, a)
        assert fam.default() == fam.defaults()[0]


@pytest.mark.parametrize("family,changes,why", [
    ("mma", dict(WM=48), "divide"),
    ("mma", dict(WM=24, BM=96), "multiple of 16"),
    ("mma", dict(BK=40), "multiple of 16"),
    ("mma", dict(BM=256, BN=256, WM=32, WN=32), "threads per block"),
    ("mma", dict(BM=256, BN=256, BK=64, STAGES=5), "shared memory"),
    ("mma", dict(STAGES=1), "STAGES"),
    ("mma", dict(SPLITK=0), "positive"),
    ("mma", dict(ACC="bf16"), "ACC"),
    ("mma", dict(LAYOUT="CC"), "LAYOUT"),
    ("mma", dict(NOPE=1), "unknown parameter NOPE"),
    ("mma", dict(BM="128"), "positive int"),
    ("mma", dict(BM=64, BN=64, WM=16, WN=16), "chunks"),
    ("ptx", dict(WM=32, BM=64), "WM = WN = 64"),
    ("cutlass_sm90", dict(BM=64), "cooperative"),
    ("cutlass_sm90", dict(SCHEDULE="pingpong", BM=256), "pingpong"),
    ("cutlass_sm90", dict(SCHEDULE="pingpong", BN=256), "accumulator registers"),
    ("cutlass_sm90", dict(BN=512), "BN"),
    ("cutlass_sm90", dict(BN=72), "BN"),
    ("cutlass_sm90", dict(BK=32), "BK"),
    ("cutlass_sm90", dict(CLUSTER_M=4, CLUSTER_N=2), "cluster"),
    ("cutlass_sm90", dict(SWIZZLE=8), "unknown parameter SWIZZLE"),   # a runtime option now
    ("cutlass_sm90", dict(SCHEDULE="stream"), "SCHEDULE"),
    ("cutlass_sm90", dict(SCHEDULER="stream"), "SCHEDULER"),
    ("cutlass_sm90", dict(SCHEDULE="pingpong", BN=128, SCHEDULER="streamk"), "stream-K"),
    ("cutlass_sm90", dict(BM=256, BN=64, CLUSTER_M=1), "BN=128"),
    ("cutlass_sm90", dict(BM=256, BN=256), "accumulator registers"),
    ("cutlass_sm90", dict(BK=128), "BK"),
    ("cutlass_sm90", dict(CLUSTER_M=2, CLUSTER_N=2), "cluster"),
])
def test_valid_rejects_bad_configs(family, changes, why):
    fam = FAMILIES[family]
    cfg = fam.default().with_(**changes)
    problems = fam.problems(cfg)
    assert problems and any(why in p for p in problems), problems
    assert not fam.valid(cfg)
    with pytest.raises(ValueError, match="invalid"):
        instantiate(cfg)


def test_valid_is_arch_aware_and_checks_the_family():
    mma = FAMILIES["mma"]
    big = mma.default().with_(BM=256, BN=128, BK=64, STAGES=3, WM=64, WN=64)   # 162816 bytes
    assert mma.valid(big, "sm_90a") and mma.valid(big, "sm_80")
    bigger = big.with_(STAGES=4)                                               # 217088 bytes
    assert mma.valid(bigger, "sm_90a") and not mma.valid(bigger, "sm_80") and not mma.valid(bigger)
    assert not FAMILIES["cutlass_sm90"].valid(FAMILIES["cutlass_sm90"].default(), "sm_80")
    assert "family" in mma.problems(FAMILIES["ptx"].default())[0]
    missing = KernelConfig.make("mma", BM=128)
    assert any("missing parameter BN" in p for p in mma.problems(missing))


def test_accepts():
    mma, cut = FAMILIES["mma"], FAMILIES["cutlass_sm90"]
    c = mma.default()
    for shape in [(1, 1, 1), (63, 129, 257), (4097, 64, 8191), (64, 64, 0), (16384, 16384, 16384)]:
        assert mma.accepts(c, *shape)
    assert not mma.accepts(c, -1, 4, 4)
    split = c.with_(SPLITK=4)
    assert mma.accepts(split, 64, 64, 16384) and not mma.accepts(split, 4096, 4096, 4096)
    cc = cut.default()
    assert cut.accepts(cc, 1, 8, 8) and cut.accepts(cc, 4097, 64, 8192)
    assert not cut.accepts(cc, 64, 129, 256) and not cut.accepts(cc, 64, 128, 257)
    assert not mma.accepts(c.with_(WM=48), 128, 128, 128)   # invalid configs accept nothing
    # serves = accepts + the ABI's shape rule. CUTLASS kernels claim any_shape (ABI 2, with
    # "divisible": [1, 8, 8]): TMA zero-fills the residues, so a 128x192 tile serves N = 8192
    assert mma.serves(c, 63, 129, 257) and cut.serves(cc, 4096, 4096, 4096)
    wide = cc.with_(BN=192)
    assert cut.accepts(wide, 4096, 16384, 8192) and cut.serves(wide, 4096, 16384, 8192)
    assert cut.serves(cc, 4097, 64, 8192) and cut.serves(wide, 128, 12288, 64) and cut.serves(cc, 1, 8, 8)
    assert not cut.serves(cc, 64, 129, 256) and not cut.serves(cc, 64, 128, 257)


def test_space_values_are_reachable():
    """Every value the tuner may pick appears in at least one valid config."""
    import random
    rng = random.Random(0)
    for fam in FAMILIES.values():
        space = fam.space()
        seen = {k: set() for k in space}
        n_valid = 0
        for _ in range(3000):
            cfg = fam.default().with_(**{k: rng.choice(v) for k, v in space.items()})
            if fam.valid(cfg):
                n_valid += 1
                for k, v in cfg.params:
                    if k in seen:
                        seen[k].add(v)
        assert n_valid > 50, fam.name
        for k, v in space.items():
            assert seen[k] == set(v), (fam.name, k, set(v) - seen[k])


def test_instantiate_is_deterministic_and_self_contained():
    for cfg in default_configs():
        fam = FAMILIES[cfg.family]
        text = instantiate(cfg)
        assert text == instantiate(cfg)
        assert not re.search(r'^\s*#\s*include\s*"', text, re.M), cfg.label()
        assert "torch" not in text.lower().replace("no torch", "")
        for macro, value in fam.macros(cfg):
            assert f"#define {macro} {value}\n" in text
        # defines come before the defaults of the family's parameters (#ifndef BM, MAX_M, ...)
        defaults = [text.index(f"#ifndef {m}\n") for m, _ in fam.macros(cfg) if f"#ifndef {m}\n" in text]
        assert defaults and text.index("#define") < min(defaults), cfg.label()
        assert 'extern "C" int cudal2_hgemm(' in text and 'extern "C" const char* cudal2_meta(void)' in text
        assert cfg.label() in text.splitlines()[1]
    ptx = instantiate(FAMILIES["ptx"].default())
    assert "begin mma_hgemm.cuh (inlined)" in ptx and "cudal2_ptx_kstep" in ptx
    f16 = instantiate(FAMILIES["mma"].default().with_(ACC="f16", LAYOUT="RC"))
    assert "#define ACC_F16 1\n" in f16 and "#define LAYOUT_RC 1\n" in f16
    coop, ping, streamk = FAMILIES["cutlass_sm90"].defaults()[:3]
    assert "#define SCHEDULE_PINGPONG 0\n" in instantiate(coop)
    assert "#define SCHEDULE_PINGPONG 1\n" in instantiate(ping)
    assert "#define SCHEDULER_STREAMK 0\n" in instantiate(coop)
    assert "#define SCHEDULER_STREAMK 1\n" in instantiate(streamk)
    assert "#define SWIZZLE" not in instantiate(coop)          # a runtime option, not a macro


def test_runtime_options_of_each_family():
    """ABI 2 (cutlass_sm90): one build takes swizzle and raster (stream-K builds also splits and
    decomposition) at run time; ABI 1 families (mma, ptx) declare none."""
    cut = FAMILIES["cutlass_sm90"]
    for name in ("mma", "ptx"):
        f = FAMILIES[name]
        assert f.options(f.default()) == {} and f.option_decls(f.default()) == []
        assert f.option_defaults(f.default()) == {} and f.option_space(f.default()) == [{}]
        assert f.option_problems(f.default(), {"swizzle": 8})       # none declared
    pers, streamk = cut.default(), cut.default().with_(BN=128, SCHEDULER="streamk")
    assert cut.options(pers) == {"swizzle": [1, 2, 4, 8], "raster": [0, 1, 2]}
    assert list(cut.options(streamk)) == ["swizzle", "raster", "splits", "decomposition"]
    assert cut.options(streamk)["decomposition"] == [0, 1, 2, 3]
    assert cut.option_defaults(streamk) == {"swizzle": 1, "raster": 0, "splits": 1, "decomposition": 0}
    # values and CUTLASS's rule: a split count needs the heuristic or split-K decomposition
    assert cut.option_problems(pers, {}) == [] and cut.option_problems(pers, {"swizzle": 8, "raster": 2}) == []
    assert any("swizzle=3" in p for p in cut.option_problems(pers, {"swizzle": 3}))
    assert any("splits" in p for p in cut.option_problems(pers, {"splits": 2}))   # persistent: none
    assert cut.option_problems(streamk, {"splits": 4, "decomposition": 2}) == []
    assert cut.option_problems(streamk, {"splits": 4}) == []                      # heuristic -> split-K
    assert any("decomposition" in p for p in cut.option_problems(streamk, {"splits": 4, "decomposition": 3}))
    # the sweep: every valid combination once, defaults first, without CUTLASS's synonyms
    space = cut.option_space(pers)
    assert space[0] == cut.option_defaults(pers) and len(space) == 4 * 3
    sk = cut.option_space(streamk)
    assert sk[0] == cut.option_defaults(streamk)
    assert len(sk) == len({tuple(sorted(o.items())) for o in sk}) == 4 * 3 * 6
    assert all(cut.option_problems(streamk, o) == [] for o in sk)
    assert {(o["splits"], o["decomposition"]) for o in sk} == {(1, 0), (1, 1), (1, 3), (2, 2), (4, 2), (8, 2)}


def test_instantiate_unknown_family():
    with pytest.raises(ValueError, match="unknown family"):
        instantiate(KernelConfig.make("nope", BM=1))


def test_short_source_names_the_header():
    for cfg in default_configs():
        fam = FAMILIES[cfg.family]
        text = fam.short_source(cfg)
        assert text.rstrip().endswith(f'#include "{fam.header}"')
        for macro, value in fam.macros(cfg):
            assert f"#define {macro} {value}\n" in text


def test_cli_prints_an_instantiation(capsys):
    import argparse
    from cudal2.templates.cli import configure_parser, run_cli
    from cudal2.templates.__main__ import main
    assert main(["ptx", "-D", "ACC=f16", "-D", "BM=64"]) == 0
    out = capsys.readouterr().out
    assert out == instantiate(FAMILIES["ptx"].default().with_(ACC="f16", BM=64))
    assert main(["cutlass_sm90", "--default", "1", "--short"]) == 0
    assert "#define SCHEDULE_PINGPONG 1" in capsys.readouterr().out
    assert main(["mma", "-D", "WM=48"]) == 2
    assert "divide" in capsys.readouterr().err
    assert main(["nope"]) == 2 and main(["mma", "-D", "BM"]) == 2 and main(["mma", "--default", "7"]) == 2
    assert main(["--list"]) == 0
    assert "cutlass_sm90" in capsys.readouterr().out
    p = argparse.ArgumentParser()
    configure_parser(p)
    assert run_cli(p.parse_args(["mma"])) == 0


# ---- fragment rules, emulated on the CPU ----------------------------------------------------
# A numpy model of one CTA tile's k-loop through shared memory: ldmatrix.x4 (plain and .trans)
# and mma.sync.m16n8k16 as the PTX ISA defines their per-lane fragments, driven by the per-lane
# address formulas read from mma_hgemm.cuh itself (C and Python agree on these expressions), and
# the kernel's epilogue mapping. Shared-memory padding holds NaN, so reading it shows up.
def _kernel_exprs(layout_rc: bool) -> dict[str, str]:
    src = (template_dir() / "mma_hgemm.cuh").read_text()
    m = re.search(r"const uint32_t a_lane = (.+?);\n#if LAYOUT_RC\n(.+?)#else\n(.+?)#endif", src, re.S)
    assert m, "mma_hgemm.cuh: the ldmatrix lane-address block moved; update this test"
    exprs = {"a_lane": m.group(1)}
    for line in (m.group(2) if layout_rc else m.group(3)).splitlines():
        d = re.match(r"\s*(?:const|constexpr) uint32_t (\w+) = (.+?);", line)
        if d:
            exprs[d.group(1)] = d.group(2)
    for name in ("a_addr", "b_addr"):
        d = re.search(rf"{name}\[\w+\] = (.+?);", src)
        exprs[name] = d.group(1)
    assert set(exprs) == {"a_lane", "b_lane", "kBPairStep", "kBKStep", "a_addr", "b_addr"}, exprs
    return exprs


def _ldmatrix_x4(smem, addrs, trans):
    """regs[lane][j] = the two halfs lane holds of 8x8 matrix j (rows from lanes 8j..8j+7)."""
    import numpy as np
    regs = np.empty((32, 4, 2))
    for j in range(4):
        rows = []
        for i in range(8):
            addr = int(addrs[8 * j + i])
            assert addr % 16 == 0, "ldmatrix row addresses must be 16-byte aligned"
            rows.append(smem[addr // 2: addr // 2 + 8])
        # 8 row addresses in 8 distinct 16-byte bank groups: a conflict-free ldmatrix phase.
        assert len({int(addrs[8 * j + i]) % 128 // 16 for i in range(8)}) == 8
        mat = np.stack(rows)
        if trans:
            mat = mat.T
        for lane in range(32):
            regs[lane, j] = mat[lane >> 2, 2 * (lane & 3): 2 * (lane & 3) + 2]
    return regs


def _mma_m16n8k16(acc, a, b0, b1):
    """acc[lane] (c0..c3) += A @ B with A, B gathered from the lanes' fragments (PTX ISA)."""
    import numpy as np
    A, B = np.full((16, 16), np.inf), np.full((16, 8), np.inf)
    for lane in range(32):
        g, t = lane >> 2, 2 * (lane & 3)
        A[g, t:t + 2], A[g + 8, t:t + 2], A[g, t + 8:t + 10], A[g + 8, t + 8:t + 10] = a[lane]
        B[t:t + 2, g], B[t + 8:t + 10, g] = b0[lane], b1[lane]
    D = A @ B
    for lane in range(32):
        g, t = lane >> 2, 2 * (lane & 3)
        acc[lane, 0:2] += D[g, t:t + 2]
        acc[lane, 2:4] += D[g + 8, t:t + 2]


@pytest.mark.parametrize("layout_rc", [False, True], ids=["RR", "RC"])
def test_fragment_addressing_computes_the_tile_product(layout_rc):
    import numpy as np
    BM, BN, BK, WM, WN, pad = 128, 128, 32, 64, 64, 8
    ex = _kernel_exprs(layout_rc)
    rng = np.random.default_rng(0)
    A = rng.integers(-4, 5, (BM, BK)).astype(np.float64)   # small integers: exact in float
    B = rng.integers(-4, 5, (BK, BN)).astype(np.float64)    # K x N
    kAStride = BK + pad
    sA = np.full((BM, kAStride), np.nan)
    sA[:, :BK] = A
    if layout_rc:                                   # B stored N x K: BN rows of BK
        kBStride = BK + pad
        sB = np.full((BN, kBStride), np.nan)
        sB[:, :BK] = B.T
    else:                                           # B stored K x N: BK rows of BN
        kBStride = BN + pad
        sB = np.full((BK, kBStride), np.nan)
        sB[:, :BN] = B
    sA, sB = sA.ravel(), sB.ravel()
    kMI, kNI = WM // 16, WN // 8
    C = np.full((BM, BN), np.nan)
    lanes = np.arange(32)
    for wm in range(BM // WM):
        for wn in range(BN // WN):
            env = dict(lane=lanes, wm=wm, wn=wn, WM=WM, WN=WN, kAStride=kAStride, kBStride=kBStride)
            a_lane, b_lane = eval(ex["a_lane"], env), eval(ex["b_lane"], env)
            env.update(kBPairStep=eval(ex["kBPairStep"], env), kBKStep=eval(ex["kBKStep"], env),
                       a_stage=a_lane, b_stage=b_lane)
            acc = np.zeros((kMI, kNI, 32, 4))
            for kk in range(BK // 16):
                a = [_ldmatrix_x4(sA, eval(ex["a_addr"], dict(env, mi=mi, kk=kk)), False)
                     for mi in range(kMI)]
                b = [_ldmatrix_x4(sB, eval(ex["b_addr"], dict(env, p=p, kk=kk)), not layout_rc)
                     for p in range(kNI // 2)]
                for mi in range(kMI):
                    for ni in range(kNI):   # the kernel's operand choice: b[ni/2][(ni%2)*2 (+1)]
                        pair = b[ni // 2]
                        _mma_m16n8k16(acc[mi, ni], a[mi], pair[:, (ni % 2) * 2], pair[:, (ni % 2) * 2 + 1])
            for lane in range(32):          # the epilogue's mapping
                g, t = lane >> 2, lane & 3
                for mi in range(kMI):
                    for ni in range(kNI):
                        col = wn * WN + ni * 8 + 2 * t
                        for h in range(2):
                            row = wm * WM + mi * 16 + g + 8 * h
                            C[row, col:col + 2] = acc[mi, ni, lane, 2 * h: 2 * h + 2]
    np.testing.assert_array_equal(C, A @ B)


@pytest.mark.parametrize("acc", ["f32", "f16"])
def test_ptx_inner_loop_uses_the_emulated_fragment_mapping(acc):
    """ptx_hgemm.cuh spells the k16 step out by hand: its ldmatrix destinations and each mma's
    operands must be the mapping the emulation above proves (A of fragment mi = ra[4mi..4mi+3];
    B of fragment ni = rb[4(ni/2) + 2(ni%2)], +1; accumulator operands in (mi, ni) order)."""
    src = (template_dir() / "ptx_hgemm.cuh").read_text()
    f16 = acc == "f16"
    block = src.split("#else\n#define CUDAL2_ACC2")[1 if f16 else 0]
    regs = 2 if f16 else 4
    addr0 = 4 * 8 * regs   # first address operand after the accumulators
    ldm = re.findall(r"\{(r[ab])(\d+),r[ab]\d+,r[ab]\d+,r[ab]\d+\}, \[%(\d+)\]", block)
    assert ldm == [("ra", str(4 * i), str(addr0 + i)) for i in range(4)] + \
                  [("rb", str(4 * p), str(addr0 + 4 + p)) for p in range(4)]
    mmas = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.(\w+)\.f16\.f16\.(\w+) \{([^}]*)\}, "
                      r"\{([^}]*)\}, \{([^}]*)\}, \{([^}]*)\}", block)
    assert len(mmas) == 32
    for i, (dtype, ctype, d, a, b, c) in enumerate(mmas):
        mi, ni = divmod(i, 8)
        assert dtype == ctype == acc and d == c
        assert d.split(",") == [f"%{(mi * 8 + ni) * regs + r}" for r in range(regs)]
        assert a.split(",") == [f"ra{4 * mi + r}" for r in range(4)]
        first = 4 * (ni // 2) + 2 * (ni % 2)
        assert b.split(",") == [f"rb{first}", f"rb{first + 1}"]


# ---- builds (nvcc, no GPU) ----------------------------------------------------------------
def _build(cfg, arch):
    from cudal2.core.build import build
    r = build(FAMILIES[cfg.family].build_spec(cfg, arch))
    assert r.ok, f"{cfg.label()} on {arch}: {r.status}\n{r.log[-4000:]}"
    return r


def _exports(so_path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(so_path)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _mma_case(cfg, arch):
    return pytest.param(cfg, arch, id=f"{cfg.family}-{cfg.get('ACC')}-{cfg.get('LAYOUT')}-{arch}")


_RAW_CASES = [_mma_case(c, a) for c in default_configs(["mma", "ptx"]) for a in FAMILIES[c.family].arches]
# Non-default corners built once (sm_90a): split-K + RC + f16 in both styles, a deep BK=64 pipeline.
_EXTRA = [
    FAMILIES["mma"].default().with_(ACC="f16", LAYOUT="RC", SPLITK=4, BK=64, STAGES=4, SWIZZLE=1),
    FAMILIES["ptx"].default().with_(ACC="f16", LAYOUT="RC", SPLITK=2),
    FAMILIES["mma"].default().with_(BM=64, BN=256, WM=32, WN=64, STAGES=2),
]
_RAW_CASES += [_mma_case(c, "sm_90a") for c in _EXTRA]


def _check_ptx_accumulator(ptx: str, acc: str, label: str):
    if acc == "f32":
        assert MMA_F32 in ptx and MMA_F16 not in ptx, label
    else:
        assert MMA_F16 in ptx and MMA_F32 not in ptx, label
    for line in re.findall(r"mma\.sync\.aligned\.[^\s]+", ptx):
        assert line in (MMA_F32, MMA_F16), f"{label}: unexpected mma {line}"


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", _RAW_CASES)
def test_raw_kernels_build_without_spills(cfg, arch):
    r = _build(cfg, arch)
    assert r.spills == 0, f"{cfg.label()} {arch} spills: {r.resources}"
    assert r.resources and max(x.stack_bytes for x in r.resources) == 0
    assert {"cudal2_hgemm", "cudal2_meta"} <= _exports(r.so_path)
    ptx = r.ptx_path.read_text()
    _check_ptx_accumulator(ptx, cfg.get("ACC"), cfg.label())
    assert "cp.async.cg.shared.global" in ptx and "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert ("ldmatrix.sync.aligned.m8n8.x4.trans" in ptx) == (cfg.get("LAYOUT") == "RR")
    # B is read again by every M tile: no evict-first policy (the skinny families' alone)
    assert "L2::cache_hint" not in ptx and "createpolicy" not in ptx
    assert "griddepcontrol" not in ptx   # programmatic dependent launch: the skinny families' option


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", _RAW_CASES)
def test_raw_kernels_meta_and_argument_checks(cfg, arch):
    """cudal2_meta and the launcher's argument checks run on the host: no GPU needed."""
    from cudal2.core.abi import load_library
    lib = load_library(_build(cfg, arch).so_path)
    m = lib.meta
    p = cfg.as_dict()
    assert m["style"] == FAMILIES[cfg.family].style and m["family"] == cfg.family
    assert m["arch"] == arch and m["acc"] == p["ACC"] and m["layout"] == p["LAYOUT"]
    assert m["tile"] == [p["BM"], p["BN"], p["BK"]] and m["stages"] == p["STAGES"]
    assert m["warps"] == (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) and m["any_shape"] is True
    assert m["params"] == p
    split = p["SPLITK"]
    assert m["workspace_per_mn"] == (4 * split if split > 1 else 0)
    # partial slabs for M*N <= SPLITK_MAX_MN plus one semaphore per tile (splitk_fixup.cuh)
    X, tiles = p["SPLITK_MAX_MN"], p["SPLITK_MAX_MN"] // (p["BM"] * p["BN"]) + p["SPLITK_MAX_MN"] // min(p["BM"], p["BN"]) + 3
    assert m["workspace_bytes"] == (-(-4 * split * X // 16) * 16 + 4 * tiles if split > 1 else 0)
    assert m["workspace_zero_init"] is (split > 1)
    rc = p["LAYOUT"] == "RC"
    P = 1 << 20   # a fake, aligned address: every call below must return before touching it
    ws, wsb = (P, m["workspace_bytes"]) if split > 1 else (0, 0)

    def call(M, N, K, lda, ldb, ldc, a=P, b=P, c=P, ws=ws, wsb=wsb):
        rc = lib.launch(a, b, c, M, N, K, lda, ldb, ldc, ws, wsb, 0)
        # The dispatcher's calling convention (abi.raw_launch: no argtypes, typed values) must
        # hand the kernel the same arguments.
        vp = ctypes.c_void_p
        assert lib.raw_launch(vp(a), vp(b), vp(c), M, N, K, lda, ldb, ldc, vp(ws),
                              ctypes.c_size_t(wsb), vp(0)) == rc
        return rc
    assert call(0, 64, 64, 64, 64, 64) == 0 and call(64, 0, 64, 64, 64, 64) == 0
    assert call(-1, 64, 64, 64, 64, 64) == INVALID_VALUE
    assert call(64, -1, 64, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, -1, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 63) == INVALID_VALUE                         # ldc < N
    assert call(64, 64, 64, 63, 64, 64) == INVALID_VALUE                         # lda < K
    assert call(64, 96, 64, 64, 63 if rc else 95, 96) == INVALID_VALUE           # ldb too small
    assert call(64, 64, 64, 64, 64, 64, a=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, b=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, c=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, a=P + 1) == INVALID_VALUE   # not even 2-byte aligned
    if split > 1:
        assert call(64, 64, 64, 64, 64, 64, wsb=split * 64 * 64 * 4 - 1) == INVALID_VALUE
        assert call(64, 64, 64, 64, 64, 64, ws=0) == INVALID_VALUE
        big = int(math.isqrt(p["SPLITK_MAX_MN"])) + 8
        assert call(big, big, 64, 64, big, big, wsb=1 << 40) == INVALID_VALUE   # M*N over the cap


def _cutlass_id(c) -> str:
    return (f"{c.get('BM')}x{c.get('BN')}-{c.get('CLUSTER_M')}x{c.get('CLUSTER_N')}-{c.get('SCHEDULE')}"
            f"-{c.get('SCHEDULER')}-{c.get('ACC')}-{c.get('LAYOUT')}")


def _int_array(*values):
    return (ctypes.c_int * len(values))(*values)


@pytest.mark.compile
@pytest.mark.parametrize("cfg", FAMILIES["cutlass_sm90"].defaults(), ids=_cutlass_id)
def test_cutlass_kernels_build(cfg):
    """Every cutlass_sm90 default: zero spills, the ABI 2 symbols, wgmma/TMA of the declared
    accumulator, a meta that declares the family's runtime options, cudal2_workspace, and the
    argument and option checks, all on the host (no GPU)."""
    fam = FAMILIES["cutlass_sm90"]
    r = _build(cfg, "sm_90a")
    assert r.spills == 0, f"{cfg.label()} spills: {r.resources}"
    assert r.resources and max(x.stack_bytes for x in r.resources) == 0
    assert {"cudal2_hgemm", "cudal2_meta", "cudal2_workspace"} <= _exports(r.so_path)
    ptx = r.ptx_path.read_text()
    wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.(\w+)\.f16\.f16", ptx))
    assert wgmma == {cfg.get("ACC")}, wgmma
    assert "cp.async.bulk.tensor" in ptx      # TMA loads
    from cudal2.core.abi import load_library, parse_meta
    lib = load_library(r.so_path)
    raw = lib._meta_fn().decode()
    m, p = parse_meta(raw), cfg.as_dict()
    assert m == lib.meta and m["abi"] == 2 and lib.abi == 2
    assert m["style"] == "cutlass" and m["family"] == "cutlass_sm90" and m["arch"] == "sm_90a"
    assert m["acc"] == p["ACC"] and m["layout"] == p["LAYOUT"] and m["tile"] == [p["BM"], p["BN"], p["BK"]]
    assert m["cluster"] == [p["CLUSTER_M"], p["CLUSTER_N"], 1]
    assert m["schedule"] == p["SCHEDULE"] and m["scheduler"] == p["SCHEDULER"]
    assert m["any_shape"] is True and m["divisible"] == [1, 8, 8]
    assert m["stages"] >= 2 and m["warps"] == 12 and m["params"] == p
    # the meta's options are the family's, in call order, with the same defaults
    assert m["options"] == [{"name": n, "values": list(v), "default": d} for n, v, d in fam.option_decls(cfg)]
    streamk = p["SCHEDULER"] == "streamk"
    # workspace (no GPU here: cudal2_workspace assumes 132 SMs): the persistent scheduler needs
    # none; split-K keeps partials of every output tile; stream-K of < 2 waves of tiles
    if streamk:
        need = lib.workspace_bytes(4096, 4096, 4096, lib.options({"splits": 4, "decomposition": 2}))
        assert need >= 4096 * 4096 * m["workspace_per_mn"]
        assert lib.workspace_bytes(4096, 4096, 4096, lib.options({"decomposition": 1})) == 0   # data-parallel
        assert 0 < lib.workspace_bytes(1000, 1000, 4096, lib.options({"decomposition": 3})) <= m["workspace_bytes"]
        assert m["workspace_bytes"] > 0 and m["workspace_per_mn"] == (2 if p["ACC"] == "f16" else 4)
    else:
        assert m["workspace_bytes"] == 0
        for o in fam.option_space(cfg):
            assert lib.workspace_bytes(4096, 4096, 4096, lib.options(o)) == 0
    assert lib.workspace_bytes(0, 64, 64, None) == 0
    P = 1 << 20
    n_opts = len(m["options"])

    def call(M, N, K, lda, ldb, ldc, a=P, b=P, c=P, options=None):
        return lib.launch(a, b, c, M, N, K, lda, ldb, ldc, 0, 0, 0, options=options)
    assert call(0, 64, 64, 64, 64, 64) == 0
    assert call(0, 64, 64, 64, 64, 64, options=lib.options({"swizzle": 8, "raster": 2})) == 0
    assert call(-1, 64, 64, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 56) == INVALID_VALUE        # ldc < N
    assert call(64, 64, 60, 64, 64, 64) == INVALID_VALUE        # K % 8
    assert call(64, 60, 64, 64, 64, 64) == INVALID_VALUE        # N % 8
    assert call(64, 64, 64, 68, 64, 64) == INVALID_VALUE        # lda % 8
    assert call(64, 64, 64, 64, 64, 64, a=P + 2) == INVALID_VALUE   # 16-byte alignment
    # option values the meta does not list: refused before anything else (even an empty C)
    good = [o["default"] for o in m["options"]]
    for i, bad in [(0, 3), (0, 0), (0, 16), (1, 3), (1, -1)] + ([(2, 3), (2, 0), (3, 4)] if streamk else []):
        vals = list(good)
        vals[i] = bad
        assert call(0, 64, 64, 64, 64, 64, options=_int_array(*vals)) == INVALID_VALUE, (i, bad)
        assert lib.workspace_bytes(64, 64, 64, _int_array(*vals)) == 0
    if streamk:   # CUTLASS's rule: splits > 1 with data-parallel or stream-K decomposition
        for dec in (1, 3):
            assert call(0, 64, 64, 64, 64, 64, options=_int_array(1, 0, 2, dec)) == INVALID_VALUE
        assert call(0, 64, 64, 64, 64, 64, options=_int_array(1, 0, 2, 2)) == 0
    assert n_opts == (4 if streamk else 2)


@pytest.mark.compile
def test_reference_kernels_through_the_cli(tmp_path, capsys):
    """The done-when of the runtime issue, as a user types it: `cudal2 templates --defaults DIR`,
    then `cudal2 build DIR/<file> --arch A` for every arch each family claims, and `nm -D` of every
    result shows both ABI symbols. Same sources and flags as the builds above: cache hits."""
    import json

    from cudal2.cli import main
    assert main(["templates", "--defaults", str(tmp_path)]) == 0
    written = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    want = {str(tmp_path / f"{c.name()}.cu") for f in FAMILIES.values() for c in f.defaults()}
    assert written == want
    for fam in FAMILIES.values():
        files = sorted(str(tmp_path / f"{c.name()}.cu") for c in fam.defaults())
        for arch in fam.arches:
            assert main(["build", *files, "--arch", arch, "--json"]) == 0
            rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
            assert sorted(r["file"] for r in rows) == files
            for r in rows:
                assert r["spills"] == 0, r
                assert {"cudal2_hgemm", "cudal2_meta"} <= _exports(r["so"]), (arch, r["file"])


# ---- correctness on a GPU -----------------------------------------------------------------
GPU_SHAPES = [(128, 128, 128), (256, 512, 1024), (1024, 1024, 1024), (64, 8192, 64),
              (1, 1, 1), (63, 129, 257), (4097, 64, 8191), (64, 64, 0), (8, 16, 0), (0, 64, 64)]


def tolerance(ref, K: int, acc: str):
    """Elementwise bound for fp16 inputs in [-1, 1): one fp16 rounding of the output, plus (f16
    accumulation) a rounding of the running sum, ~sqrt(K)/3 in size, at up to every one of K
    steps, as a 6-sigma random walk."""
    out_round = ref.abs() * 2.0 ** -10 + 2.0 ** -14 * (1 + math.sqrt(K))
    if acc == "f32":
        return out_round
    return out_round + 6 * 2.0 ** -11 * (math.sqrt(K) / 3 + 1) * math.sqrt(K)


def _run(lib, meta, M, N, K, *, lda=None, ldb=None, ldc=None, offset_a=0, options=None):
    import torch
    dev = torch.device("cuda")
    rc = meta["layout"] == "RC"
    lda = lda or max(K, 1)
    ldb = ldb or max(K if rc else N, 1)
    ldc = ldc or max(N, 1)
    g = torch.Generator(device=dev).manual_seed(M * 7919 + N * 131 + K)
    a_store = torch.rand(max(M, 1) * lda + offset_a + 8, device=dev, generator=g, dtype=torch.float32)
    a_store = (a_store * 2 - 1).half()
    b_rows = N if rc else K
    b_store = ((torch.rand(max(b_rows, 1) * ldb + 8, device=dev, generator=g) * 2 - 1).half())
    A = a_store[offset_a:offset_a + M * lda].view(M, lda)[:, :K] if M else a_store[:0].view(0, K)
    Bm = b_store[:b_rows * ldb].view(b_rows, ldb)[:, :(K if rc else N)]
    B = Bm.t() if rc else Bm                   # logical K x N
    sentinel = -7.0
    c_store = torch.full((max(M, 1) * ldc + 64,), sentinel, device=dev, dtype=torch.float16)
    opts = lib.options(options) if meta.get("abi") == 2 else None     # ABI 1: None
    ws_bytes = lib.workspace_bytes(M, N, K, opts)
    # a zero-init workspace (in-kernel split-K fixup) is zeroed once at allocation, as dispatch does
    ws = (torch.zeros if meta.get("workspace_zero_init") else torch.empty)(
        max(ws_bytes, 1), device=dev, dtype=torch.uint8)
    a_before, b_before = a_store.clone(), b_store.clone()
    stream = torch.cuda.current_stream()
    a_ptr = a_store.data_ptr() + 2 * offset_a
    err = lib.launch(a_ptr, b_store.data_ptr(), c_store.data_ptr(), M, N, K, lda, ldb, ldc,
                     ws.data_ptr() if ws_bytes else 0, ws_bytes, stream.cuda_stream, options=opts)
    torch.cuda.synchronize()
    assert err == 0, f"cudal2_hgemm returned {err}"
    assert torch.equal(a_store, a_before) and torch.equal(b_store, b_before), "inputs modified"
    if M == 0 or N == 0:
        assert bool((c_store == sentinel).all()), "wrote C for an empty output"
        return
    C = c_store[:M * ldc].view(M, ldc)
    ref = (A.double() @ B.double()) if K else torch.zeros(M, N, device=dev, dtype=torch.float64)
    got = C[:, :N].double()
    tol = tolerance(ref, K, meta["acc"])
    bad = (got - ref).abs() > tol
    assert not bool(bad.any()), (f"{M}x{N}x{K}: {int(bad.sum())} elements off, max err "
                                 f"{float((got - ref).abs().max()):.4g}")
    if ldc > N:
        assert bool((C[:, N:] == sentinel).all()), "wrote into the padding of C"
    assert bool((c_store[M * ldc:] == sentinel).all()), "wrote past the end of C"


def _gpu_cases():
    cases = [(c, "") for c in default_configs()]
    cases += [(FAMILIES["mma"].default().with_(SPLITK=3), "split3"),
              (FAMILIES["ptx"].default().with_(ACC="f16", LAYOUT="RC"), "")]
    return [pytest.param(c, id=f"{c.family}-{c.get('ACC')}-{c.get('LAYOUT')}"
                         + (f"-{c.get('SCHEDULE')}" if c.get("SCHEDULE") else "") + (f"-{t}" if t else ""))
            for c, t in cases]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", _gpu_cases())
def test_kernels_match_torch(cfg):
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    arch = detect_arch()
    fam = FAMILIES[cfg.family]
    if arch not in fam.arches:
        pytest.skip(f"family {fam.name} does not target {arch}")
    lib = load_library(_build(cfg, arch).so_path)
    meta = lib.meta
    for M, N, K in GPU_SHAPES:
        if fam.accepts(cfg, M, N, K):
            _run(lib, meta, M, N, K)
        else:
            P = 1 << 20   # fake aligned pointers: a refused shape must be refused before any access
            assert lib.launch(P, P, P, M, N, K, max(K, 1), max(N, K, 1), max(N, 1), 0, 0, 0,
                              lib.options()) == INVALID_VALUE, (M, N, K)
    if fam.name in ("cutlass_sm90", "wgmma"):      # TMA: aligned operands, ld % 8 == 0
        _run(lib, meta, 200, 136, 72, ldc=144)                    # padded C (ldc % 8 == 0)
    elif not fam.name.startswith(("skinny", "lowlat")):   # 16-byte loads only: their own files
        # (tests/test_skinny.py, tests/test_lowlat.py) check that they refuse these
        _run(lib, meta, 100, 70, 90, ldc=73)                      # odd ldc: scalar stores
        _run(lib, meta, 65, 72, 136, lda=137, offset_a=1)         # misaligned A: guarded loads
        _run(lib, meta, 33, 40, 24, ldb=(29 if meta["layout"] == "RC" else 43))   # odd ldb


def _cutlass_space_cases():
    """The whole cutlass_sm90 space for f32/RR (48 configs: tune.enumerate_space), plus the
    register- and layout-heaviest corners again as f32/RC and f16/RR."""
    from cudal2.search import tune
    fam = FAMILIES["cutlass_sm90"]
    cases = tune.enumerate_space(fam, arch="sm_90a", acc="f32", layout="RR")
    corners = [dict(BM=128, BN=256, SCHEDULE="cooperative", SCHEDULER="streamk"),
               dict(BM=256, BN=128, SCHEDULE="cooperative", SCHEDULER="streamk"),
               dict(BM=64, BN=256, SCHEDULE="pingpong", SCHEDULER="persistent"),
               dict(BM=128, BN=128, SCHEDULE="pingpong", SCHEDULER="persistent")]
    for acc, layout in (("f32", "RC"), ("f16", "RR")):
        cases += [fam.default().with_(CLUSTER_M=2, CLUSTER_N=1, ACC=acc, LAYOUT=layout, **c) for c in corners]
    return cases


def _device_only(cfg):
    from dataclasses import replace
    return replace(FAMILIES[cfg.family].build_spec(cfg, "sm_90a"), device_only=True)


@pytest.fixture(scope="module")
def cutlass_space_prebuilt(prebuild):
    """The 56 space builds at once where the run is one process (conftest's prebuild; each takes
    ~3.5 GB, so set CUDAL2_BUILD_JOBS lower where memory is short)."""
    prebuild(_device_only(c) for c in _cutlass_space_cases())


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("cfg", _cutlass_space_cases(), ids=_cutlass_id)
def test_cutlass_space_builds_without_spills(cfg, cutlass_space_prebuilt):
    """Every config Family.valid lets into the cutlass_sm90 space compiles for sm_90a with zero
    spills and no stack: 48 f32/RR (the whole space) and 8 f32/RC, f16/RR corners. The device
    code alone (BuildSpec.device_only: the library build's SASS and ptxas figures, without its
    host compile and link, ~60% of its CPU; ~25 s and ~3.5 GB each on 2 cores): the launcher,
    its symbols and its checks are the same code for every config, and test_cutlass_kernels_build
    holds them on the defaults' full builds."""
    assert FAMILIES["cutlass_sm90"].valid(cfg, "sm_90a")
    from cudal2.core.build import build
    r = build(_device_only(cfg))
    assert r.ok, f"{cfg.label()}: {r.status}\n{r.log[-4000:]}"
    assert r.spills == 0, f"{cfg.label()} spills: {r.resources}"
    assert r.resources and max(x.stack_bytes for x in r.resources) == 0
    assert any(x.registers > 0 for x in r.resources)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", FAMILIES["cutlass_sm90"].defaults(), ids=_cutlass_id)
def test_cutlass_runtime_options_match_torch(cfg):
    """Every runtime option combination of each CUTLASS default (swizzle, raster; stream-K
    builds: splits, decomposition) on residue, wave-quantised and long-K shapes, each with the
    workspace cudal2_workspace asks for; a workspace one byte short is refused. Buffers are
    reallocated per call, so the launcher's Params cache sees both new and reused addresses."""
    from cudal2.core.abi import load_library
    fam = FAMILIES["cutlass_sm90"]
    lib = load_library(_build(cfg, "sm_90a").so_path)
    meta = lib.meta
    for M, N, K in [(200, 136, 72), (1000, 1000, 1024), (2304, 2304, 1024), (256, 256, 8192)]:
        for o in fam.option_space(cfg):
            _run(lib, meta, M, N, K, options=o)
    if cfg.get("SCHEDULER") == "streamk":
        import torch
        opts = lib.options({"splits": 4, "decomposition": 2})
        need = lib.workspace_bytes(256, 256, 8192, opts)
        assert need > 0
        ws = torch.empty(need, device="cuda", dtype=torch.uint8)
        x = torch.zeros(256 * 8192 + 8, device="cuda", dtype=torch.float16)
        err = lib.launch(x.data_ptr(), x.data_ptr(), x.data_ptr(), 256, 256, 8192, 8192, 256, 256,
                         ws.data_ptr(), need - 1, torch.cuda.current_stream().cuda_stream, options=opts)
        assert err == INVALID_VALUE


def _pack_cutlass_builds():
    """Every cutlass_sm90 build of the campaign pack named by CUDAL2_TEST_PACK (the GPU kit's
    run.sh sets it to the carried .gpu_campaign): the pack holds the space's binaries, so a GPU
    machine checks them all without compiling."""
    import json
    import os
    from pathlib import Path
    pack = os.environ.get("CUDAL2_TEST_PACK", "")
    manifest = Path(pack) / "manifest.json" if pack else None
    if manifest is None or not manifest.is_file():
        return [pytest.param(None, None, marks=pytest.mark.skip(
            reason="no campaign pack: set CUDAL2_TEST_PACK to a folder made by `cudal2 campaign prepare`"))]
    out = []
    for c in json.loads(manifest.read_text())["candidates"]:
        if c["family"] == "cutlass_sm90":
            # a tuned-table kernel carries no template parameters: its meta declares its options
            cfg = KernelConfig(c["family"], tuple(map(tuple, c["params"]))) if c.get("params") else None
            out.append(pytest.param(Path(pack) / c["dir"], cfg, id=_cutlass_id(cfg) if cfg else c["label"]))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("build_dir,cfg", _pack_cutlass_builds())
def test_pack_cutlass_builds_match_torch(build_dir, cfg):
    """Every cutlass_sm90 config a campaign carries, with every runtime option combination its
    Family allows, against an fp64 reference on residue (M, N not tile multiples), grid,
    wave-quantised and long-K shapes: the configs the campaign screens are correct everywhere they
    claim to serve, not only on the shapes it times."""
    from cudal2.core.abi import load_library, meta_accepts
    fam = FAMILIES["cutlass_sm90"]
    so = [p for p in build_dir.iterdir() if p.suffix == ".so"]
    assert len(so) == 1, f"{build_dir}: expected one .so, found {so}"
    lib = load_library(so[0])
    meta = lib.meta
    if cfg is not None:
        assert meta["tile"][:2] == [cfg.get("BM"), cfg.get("BN")], (meta["tile"], cfg.label())
        combos = fam.option_space(cfg)
    else:
        import itertools
        decls = meta.get("options", [])
        combos = [dict(zip([d["name"] for d in decls], v)) for v in itertools.product(*[d["values"] for d in decls])]
    for M, N, K in [(200, 136, 72), (1000, 1000, 1024), (1024, 2048, 512), (2304, 2304, 1024),
                    (264, 4104, 4096), (256, 256, 8192)]:
        if not meta_accepts(meta, M, N, K):
            assert cfg is None, f"{cfg.label()} refuses {M}x{N}x{K}: the space serves any M, N"
            continue        # a tuned kernel of an earlier ABI may serve tile multiples only
        for o in combos:
            _run(lib, meta, M, N, K, options=o)


@pytest.mark.compile
@pytest.mark.parametrize("cfg", default_configs(), ids=lambda c: c.label().split(",LAYOUT")[0])
def test_defaults_pass_the_harness_audit(cfg):
    """Our reference kernels are what the audit is meant to let through (sm_90a builds, cached)."""
    from cudal2.core.abi import load_library
    from cudal2.harness.audit import audit_build
    spec = FAMILIES[cfg.family].build_spec(cfg, "sm_90a")
    r = _build(cfg, "sm_90a")
    res = audit_build(spec.source, r, "sm_90a", name=cfg.label(), meta=load_library(r.so_path).meta)
    assert res.ok, res.reasons


def test_config_names_are_canonical_file_names():
    """Every family's configs have a name that encodes the config, is file-name safe and is
    one per config (the defaults and a sample of each space), and an invalid config has none."""
    import itertools
    import re
    seen = {}
    for fam in FAMILIES.values():
        cfgs = list(fam.defaults())
        space = fam.space()
        for combo in itertools.islice(itertools.product(*space.values()), 0, 4000, 7):
            c = fam.default().with_(**dict(zip(space, combo)))
            if fam.valid(c):
                cfgs.append(c)
        for c in cfgs:
            n = c.name()
            assert re.fullmatch(r"[a-z0-9_]+", n) and n.startswith(fam.name + "_"), n
            assert seen.setdefault(n, c) == c, (n, c, seen[n])
    assert FAMILIES["wgmma"].default().name() == "wgmma_sm90a_f32_rr_128x256x64_s4_c2x1_g2_tma"
    with pytest.raises(ValueError, match="BK"):
        FAMILIES["wgmma"].default().with_(BK=32).name()


def test_a_config_valid_on_one_claimed_arch_instantiates_and_builds_only_there():
    """A deep mma pipeline fits sm_90a's 227 KiB of shared memory, not sm_80's 163: it is a
    kernel (named after sm_90a), the planner's sm_90a space has it, and a build spec for sm_80
    is refused naming the arch."""
    from cudal2.templates.family import enumerate_space
    fam = FAMILIES["mma"]
    only90 = [c for c in enumerate_space(fam, arch="sm_90a") if not fam.valid(c, "sm_80")]
    assert only90, "no sm_90a-only mma config in the space"
    cfg = only90[0]
    assert fam.valid(cfg, "sm_90a") and not fam.valid(cfg)          # valid() = every claimed arch
    assert "// config: mma:" in instantiate(cfg) and cfg.name().startswith("mma_sm90a_")
    assert fam.build_spec(cfg, "sm_90a").arch == "sm_90a"
    with pytest.raises(ValueError, match="for sm_80.*shared memory"):
        fam.build_spec(cfg, "sm_80")
    with pytest.raises(ValueError, match="invalid"):                # fits no arch at all
        instantiate(fam.default().with_(BM=256, BN=256, BK=64, STAGES=5))



_OPT_IN_DRIVER = r"""
import ctypes, json, sys
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # before the kernel's libcudart
lib = ctypes.CDLL(sys.argv[2])
vp, P, out = ctypes.c_void_p, 1 << 20, []
for step in sys.argv[3].split(","):
    if step == "reset":
        fake.fake_device_reset()
        continue
    rc = lib.cudal2_hgemm(vp(P), vp(P), vp(P), 256, 256, 512, 512, 256, 256, vp(0),
                          ctypes.c_size_t(0), vp(0))
    c = (ctypes.c_int * 11)()
    fake.fake_counts(c)
    out.append([rc, list(c)[:5]])
print(json.dumps(out))
"""


@pytest.mark.compile
def test_mma_shared_memory_opt_in_is_made_again_after_a_device_reset(reset_fake_cudart):
    """mma_hgemm.cuh (mma, ptx, skinny): the > 48 KiB opt-in is made once per device; after a
    device reset drops it, the refused launch's error is consumed, the opt-in made again and the
    launch retried once (tests/data/reset_fake_cudart.c)."""
    import json
    import sys
    from cudal2.core.build import build
    cfg = FAMILIES["mma"].default()                            # 3 stages of 128x128x32: > 48 KiB
    r = build(FAMILIES["mma"].build_spec(cfg, "sm_90a"))
    assert r.ok, r.log[-2000:]
    run = subprocess.run([sys.executable, "-c", _OPT_IN_DRIVER, str(reset_fake_cudart),
                          str(r.so_path),
                          "call,call,reset,call,call"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # per call: rc, then attempts, launches, memsets, opt-ins (setattrs), pending error
    assert json.loads(run.stdout) == [[0, [1, 1, 0, 1, 0]], [0, [2, 2, 0, 1, 0]],
                                      [0, [4, 3, 0, 2, 0]], [0, [5, 4, 0, 2, 0]]]
