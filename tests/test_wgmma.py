"""The wgmma family (cudal2/templates/wgmma_hgemm.cuh, docs/wgmma.md): config rules and tile
orders (unit), builds for sm_90a with zero spills, the ABI 2 exports, meta, audit, argument
checks and HGMMA in the SASS (compile: nvcc, no GPU), correctness against torch (gpu)."""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess

import pytest

from cudal2.core.toolchain import find_cuobjdump as _cuobjdump  # the SASS checks (test_skinny imports it too)
from cudal2.templates import (FAMILIES, SMEM_LIMIT, WGMMA_OPTIONS, instantiate, template_dir,
                              wgmma_option_space)
from cudal2.templates.wgmma import wgmma_options, wgmma_splits

FAM = FAMILIES["wgmma"]
INVALID_VALUE = 1   # cudaErrorInvalidValue


# ---- the family and its config rules (pure Python) ------------------------------------------
def test_family_is_registered():
    assert FAM.arches == ("sm_90a",) and FAM.style == "wgmma"
    assert FAM.header == "wgmma_hgemm.cuh" and (template_dir() / FAM.header).is_file()
    assert FAM.choices()["ACC"] == ["f32"] and FAM.choices()["LAYOUT"] == ["RR", "RC"]
    assert "ACC" not in FAM.space() and "LAYOUT" not in FAM.space()
    assert FAM.any_shape


def test_defaults():
    ds = FAM.defaults()
    assert len({c.label() for c in ds}) == len(ds) >= 4
    for c in ds:
        assert FAM.problems(c, "sm_90a") == [], c.label()
    big = FAM.default()
    assert (big.get("BM"), big.get("BN"), big.get("CLUSTER_M"), big.get("CONSUMERS")) == (128, 256, 2, 2)
    assert {c.get("LAYOUT") for c in ds} == {"RR", "RC"}
    assert any(c.get("BN") == 128 and c.get("CLUSTER_M") == 2 for c in ds)         # 128x128 variant
    simple = [c for c in ds if c.get("CONSUMERS") == 1 and c.get("CLUSTER_M") == 1
              and c.get("EPILOGUE") == "direct"]
    assert simple, "the simple fallback config (1 consumer, no cluster, direct stores) is a default"


@pytest.mark.parametrize("changes,why", [
    (dict(BM=192), "rows per consumer"),                  # 192 / 2 consumers = 96 rows
    (dict(BM=64, CONSUMERS=2), "rows per consumer"),
    (dict(CONSUMERS=4), "CONSUMERS"),
    (dict(BN=96), "BN"),
    (dict(BK=32), "BK"),
    (dict(CLUSTER_M=4), "CLUSTER_M"),
    (dict(STAGES=1), "STAGES"),
    (dict(BM=256, BN=256), "accumulator registers"),     # 128 rows x 256 per consumer thread: 256
    (dict(BM=192, CONSUMERS=3, BN=256), "accumulator registers"),
    (dict(STAGES=5), "shared memory"),                    # 5 x 48 KiB + C staging
    (dict(ACC="f16"), "fp32 accumulation only"),
    (dict(EPILOGUE="smem"), "EPILOGUE"),
    (dict(NOPE=1), "unknown parameter"),
])
def test_bad_configs_are_rejected(changes, why):
    cfg = FAM.default().with_(**changes)
    problems = FAM.problems(cfg)
    assert problems and any(why in p for p in problems), problems
    with pytest.raises(ValueError, match="invalid"):
        instantiate(cfg)


def test_shared_memory_rule_matches_the_header_formula():
    from cudal2.templates import _wgmma_smem_bytes
    p = FAM.default().as_dict()
    # 4 stages of (128 + 256) x 64 fp16, C staged 128 columns at a time, barriers, 1 KiB slack
    assert _wgmma_smem_bytes(p) == 4 * 384 * 128 + 128 * 128 * 2 + 96 + 1024 <= SMEM_LIMIT["sm_90a"]
    three = dict(p, STAGES=3)          # room for the whole 128 x 256 C tile
    assert _wgmma_smem_bytes(three) == 3 * 384 * 128 + 128 * 256 * 2 + 72 + 1024
    direct = dict(p, EPILOGUE="direct")
    assert _wgmma_smem_bytes(direct) == 4 * 384 * 128 + 96 + 1024


def test_accepts_follows_tma_strides():
    rr, rc = FAM.default(), FAM.default().with_(LAYOUT="RC")
    rc_direct = rc.with_(EPILOGUE="direct", BN=128, STAGES=4)
    for cfg in (rr, rc, rc_direct):
        assert FAM.accepts(cfg, 1, 8, 8) and FAM.accepts(cfg, 4097, 1000, 1000)
        assert FAM.accepts(cfg, 64, 64, 0)
        assert not FAM.accepts(cfg, 64, 64, 12)                  # K % 8: lda = K
        assert FAM.serves(cfg, 77, 136, 264)                     # any_shape with divisible
    assert not FAM.accepts(rr, 64, 1003, 64)                     # ldb = N
    assert not FAM.accepts(rc, 64, 1003, 64)                     # ldc = N (TMA store)
    assert FAM.accepts(rc_direct, 64, 1003, 64)                  # RC + direct stores: any N


def test_space_values_are_reachable():
    import random
    rng = random.Random(1)
    seen = {k: set() for k in FAM.space()}
    n_valid = 0
    for _ in range(3000):
        cfg = FAM.default().with_(**{k: rng.choice(v) for k, v in FAM.space().items()})
        if FAM.valid(cfg):
            n_valid += 1
            for k, v in cfg.params:
                if k in seen:
                    seen[k].add(v)
    assert n_valid > 100
    for k, v in FAM.space().items():
        assert seen[k] == set(v), (k, set(v) - seen[k])


def test_instantiation_is_self_contained():
    for cfg in FAM.defaults():
        text = instantiate(cfg)
        assert text == instantiate(cfg)
        assert not re.search(r'^\s*#\s*include\s*"', text, re.M)
        for macro, value in FAM.macros(cfg):
            assert f"#define {macro} {value}\n" in text
        assert f"#define EPILOGUE_TMA {int(cfg.get('EPILOGUE') == 'tma')}\n" in text
        assert text.index("#define") < text.index("#ifndef BM")
        for sym in ('extern "C" int cudal2_hgemm(', 'extern "C" size_t cudal2_workspace(',
                    'extern "C" const char* cudal2_meta(void)'):
            assert sym in text


def test_option_space_matches_the_header():
    src = (template_dir() / FAM.header).read_text()
    assert [o[0] for o in WGMMA_OPTIONS] == ["raster", "swizzle", "sm_count", "splits"]
    for name, values, default in WGMMA_OPTIONS:
        arr = re.search(rf"k{''.join(w.title() for w in name.split('_'))}Values\[\] = \{{([^}}]*)\}}", src)
        assert arr, name
        assert [int(v) for v in arr.group(1).split(",")] == list(values), name
        assert default in values
        listed = f"[{', '.join(map(str, values))}]"
        if name == "splits":   # CLUSTER_M 1 builds; CLUSTER_M 2 builds declare [1]
            assert f'#define CUDAL2_SPLITS_JSON "{listed}"' in src
            assert '#define CUDAL2_SPLITS_JSON "[1]"' in src and "kSplitsValues[] = {1};" in src
        else:
            assert f'\\"name\\": \\"{name}\\", \\"values\\": {listed}' in src
    assert wgmma_option_space()["raster"] == [0, 1, 2, 3]
    assert dict((n, v) for n, v, _ in wgmma_options({"CLUSTER_M": 2}))["splits"] == (1,)


def test_split_count_rule():
    """wgmma_splits, plan_splits's replay: the fewest waves x k-blocks per split at one CTA per
    SM, ties to fewer splits, never more splits than k-blocks, none for CLUSTER_M 2."""
    assert wgmma_splits(64, 4096, 4096, 64, 128, 64, 132, 0) == 4       # 32 tiles: 128 CTAs
    assert wgmma_splits(64, 14336, 4096, 64, 128, 64, 132, 0) == 8      # 7 waves of 8 k-blocks < 64
    assert wgmma_splits(64, 16896, 4096, 64, 128, 64, 132, 0) == 1      # 132 tiles: one wave
    assert wgmma_splits(64, 4096, 128, 64, 128, 64, 132, 8) == 2        # 2 k-blocks
    assert wgmma_splits(64, 4096, 4096, 64, 128, 64, 132, 1) == 1
    assert wgmma_splits(64, 4096, 4096, 64, 128, 64, 132, 0, cluster_m=2) == 1
    assert wgmma_splits(64, 4096, 0, 64, 128, 64, 132, 0) == 1
    # every k-block in exactly one split, none empty: kb_begin = z * kb / splits
    for kb in range(1, 40):
        for s in range(1, min(kb, 8) + 1):
            ranges = [range(z * kb // s, (z + 1) * kb // s) for z in range(s)]
            assert [k for r in ranges for k in r] == list(range(kb)) and all(ranges)
    src = (template_dir() / FAM.header).read_text()
    for line in ("const int kb_begin = (int)((long long)z * p.num_k_blocks / splits);",
                 "const int kb_end = (int)((long long)(z + 1) * p.num_k_blocks / splits);",
                 "const long long cost = ((tiles * c + sms - 1) / sms) * ((num_k_blocks + c - 1) / c);",
                 "if (c == 1 || cost < best) { best = cost; s = c; }",
                 "if (s > num_k_blocks) s = num_k_blocks;"):
        assert line in src, line


# ---- tile orders: a Python model of TileSched::next (wgmma_hgemm.cuh) ---------------------------
def _hilbert_d2xy(n, d):
    x = y = 0
    s = 1
    while s < n:
        rx = 1 & (d >> 1)
        ry = 1 & (d ^ rx)
        if ry == 0:
            if rx == 1:
                x, y = s - 1 - x, s - 1 - y
            x, y = y, x
        x += s * rx
        y += s * ry
        d >>= 2
        s *= 2
    return x, y


def _order(raster, swz, tcm, tn):
    """Global tile index t -> (cm, n) for t in 0..tcm*tn-1, as TileSched computes it."""
    out = []
    if raster == 3:
        dim = 1
        while dim < max(tcm, tn):
            dim *= 2
        for d in range(dim * dim):
            x, y = _hilbert_d2xy(dim, d)
            if x < tcm and y < tn:
                out.append((x, y))
        return out
    for t in range(tcm * tn):
        if raster == 1:
            band = t // (swz * tcm)
            first_n = band * swz
            w = min(swz, tn - first_n)
            idx = t - band * swz * tcm
            out.append((idx // w, first_n + idx % w))
        else:
            band = t // (swz * tn)
            first_m = band * swz
            h = min(swz, tcm - first_m)
            idx = t - band * swz * tn
            out.append((first_m + idx % h, idx // h))
    return out


@pytest.mark.parametrize("tcm,tn", [(1, 1), (16, 16), (32, 32), (5, 7), (1, 64), (33, 2), (12, 9)])
@pytest.mark.parametrize("raster,swz", [(1, 1), (1, 8), (2, 8), (2, 16), (3, 8)])
def test_tile_orders_are_permutations(tcm, tn, raster, swz):
    order = _order(raster, swz, tcm, tn)
    assert sorted(order) == [(m, n) for m in range(tcm) for n in range(tn)]


def test_hilbert_order_is_a_walk_of_neighbours():
    order = _order(3, 0, 16, 16)
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(order, order[1:]))
    # a wave of 64 consecutive tiles covers an 8 x 8 block
    wave = order[64:128]
    assert max(m for m, _ in wave) - min(m for m, _ in wave) == 7
    assert max(n for _, n in wave) - min(n for _, n in wave) == 7


def test_tile_order_model_matches_the_header():
    """The model above follows these lines of TileSched; if they change, update the model."""
    src = (template_dir() / FAM.header).read_text()
    for line in ("const int band = t / (swz * tiles_cm);", "cm = idx / w;", "n = first_n + idx % w;",
                 "const int band = t / (swz * tiles_n);", "n = idx / h;", "cm = first_m + idx % h;",
                 "const int rx = 1 & (d >> 1);", "const int ry = 1 & (d ^ rx);",
                 "in = x < tiles_cm && y < tiles_n;"):
        assert line in src, line


# ---- builds (nvcc, no GPU) ----------------------------------------------------------------
def _build(cfg):
    from cudal2.core.build import build
    r = build(FAM.build_spec(cfg, "sm_90a"))
    assert r.ok, f"{cfg.label()}: {r.status}\n{r.log[-4000:]}"
    return r


def _exports(so_path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(so_path)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _instantiations() -> list:
    """The defaults, then for every value of every knob and layout one config that has it (the
    default with that one change where valid, else the first config of the space with it): 14
    builds of ~2-5 s, every value built at least once. CUDAL2_WGMMA_ALL=1: every instantiation
    of the space (832, both layouts; 35 min on 2 shared cores, all passed: reports/cpu/2026-11-23-wgmma-space)."""
    from cudal2.search.tune import enumerate_space
    space = [c for lay in ("RR", "RC") for c in enumerate_space(FAM, arch="sm_90a", acc="f32", layout=lay)]
    if os.environ.get("CUDAL2_WGMMA_ALL"):
        return space
    out = list(FAM.defaults())
    base = FAM.default()
    valid = set(space)
    for knob, values in FAM.choices().items():
        for v in values:
            if any(c.get(knob) == v for c in out):
                continue
            near = base.with_(**{knob: v})
            out.append(near if near in valid else next(c for c in space if c.get(knob) == v))
    return out


CASES = [pytest.param(c, id=c.label().replace("wgmma:", "")) for c in _instantiations()]


@pytest.fixture(scope="module")
def prebuilt(prebuild):
    """Every case built at once where the run is one process (conftest's prebuild); the tests
    below read each from the build cache. With CUDAL2_WGMMA_ALL=1 that is ~45 minutes of builds
    one at a time."""
    prebuild(FAM.build_spec(p.values[0], "sm_90a") for p in CASES)


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CASES)
def test_builds_without_spills(cfg, prebuilt):
    r = _build(cfg)
    assert r.spills == 0, f"{cfg.label()} spills: {r.resources}"
    assert r.resources and max(x.stack_bytes for x in r.resources) == 0
    assert {"cudal2_hgemm", "cudal2_meta", "cudal2_workspace"} <= _exports(r.so_path)
    ptx = r.ptx_path.read_text()
    n = cfg.get("BN")
    wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.(\w+)\.f16\.f16", ptx))
    assert wgmma == {(f"m64n{n}k16", "f32")}, wgmma
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert ("multicast::cluster" in ptx) == (cfg.get("CLUSTER_M") > 1)
    assert ("setmaxnreg.inc.sync.aligned.u32" in ptx) == (cfg.get("CONSUMERS") > 1)
    tma_store = cfg.get("EPILOGUE") == "tma"
    assert ("stmatrix.sync.aligned.m8n8.x4" in ptx) == tma_store
    assert ("cp.async.bulk.tensor.2d.global.shared::cta" in ptx) == tma_store


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CASES)
def test_sass_holds_hgmma(cfg, prebuilt):
    """The sm_90a machine code runs the tensor cores through HGMMA (not HMMA/FFMA), and no
    wgmma is serialised. Needs cuobjdump and nvdisasm (pip nvidia-cuda-cuobjdump and
    nvidia-cuda-nvdisasm, both in the build extra); without them the PTX check in
    test_builds_without_spills stands."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (PATH, next to nvcc, or pip nvidia-cuda-cuobjdump); "
                    "the PTX wgmma check covers the accumulator type")
    r = _build(cfg)
    sass = subprocess.run([tool, "-sass", str(r.so_path)], capture_output=True, text=True).stdout
    if "Function" not in sass:
        pytest.skip(f"{tool} could not disassemble the sm_90a cubin")
    hgmma = re.findall(r"HGMMA\.64x(\d+)x16\.F32", sass)
    assert hgmma and set(hgmma) == {str(cfg.get("BN"))}, set(hgmma)
    assert "HMMA" not in sass.replace("HGMMA", "")


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CASES)
def test_meta_and_argument_checks(cfg, prebuilt):
    """cudal2_meta and the launcher's argument checks run on the host: no GPU needed."""
    from cudal2.core.abi import abi_version, load_library, meta_options, parse_meta
    from cudal2.templates import _wgmma_smem_bytes
    r = _build(cfg)
    lib = load_library(r.so_path)
    raw = ctypes.CDLL(str(r.so_path)).cudal2_meta
    raw.restype = ctypes.c_char_p
    m = parse_meta(raw().decode())
    p = cfg.as_dict()
    assert m == lib.meta and abi_version(m) == 2
    assert m["style"] == "wgmma" and m["family"] == "wgmma" and m["arch"] == "sm_90a"
    assert m["acc"] == "f32" and m["layout"] == p["LAYOUT"] and m["params"] == p
    assert m["tile"] == [p["BM"], p["BN"], p["BK"]] and m["any_shape"] is True
    n8 = p["LAYOUT"] == "RR" or p["EPILOGUE"] == "tma"
    assert m["divisible"] == [1, 8 if n8 else 1, 8]
    assert m["smem_bytes"] == _wgmma_smem_bytes(p) <= SMEM_LIMIT["sm_90a"]
    assert m["threads"] == 128 * (p["CONSUMERS"] + 1) and m["cluster"] == [p["CLUSTER_M"], 1, 1]
    assert m["workspace_bytes"] == 0
    assert [(o["name"], tuple(o["values"]), o["default"]) for o in meta_options(m)] == wgmma_options(p)
    assert m["cluster_splitk_max"] == (8 if p["CLUSTER_M"] == 1 else 0)
    ws = ctypes.CDLL(str(r.so_path)).cudal2_workspace
    ws.restype = ctypes.c_size_t
    ws.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    assert ws(8192, 8192, 8192, None) == 0 and lib.workspace_bytes(64, 64, 64, lib.options()) == 0

    P = 1 << 20   # fake aligned addresses: every call below returns before touching them
    default = lib.options({})

    def call(M, N, K, lda, ldb, ldc, a=P, b=P, c=P, opts=default):
        return lib.launch(a, b, c, M, N, K, lda, ldb, ldc, 0, 0, 0, options=opts)
    rc = p["LAYOUT"] == "RC"
    assert call(0, 64, 64, 64, 64, 64) == 0 and call(64, 0, 64, 64, 64, 64) == 0
    assert call(0, 64, 64, 64, 64, 64, opts=None) == 0
    assert call(-1, 64, 64, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, -1, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 56) == INVALID_VALUE                  # ldc < N
    assert call(64, 64, 64, 56, 64, 64) == INVALID_VALUE                  # lda < K
    assert call(64, 96, 64, 64, 56 if rc else 88, 96) == INVALID_VALUE    # ldb too small
    assert call(64, 64, 64, 68, 64, 64) == INVALID_VALUE                  # lda % 8
    assert call(64, 64, 64, 64, 68, 64) == INVALID_VALUE                  # ldb % 8
    assert call(64, 64, 64, 64, 64, 64, a=P + 2) == INVALID_VALUE         # TMA: 16-byte aligned A
    assert call(64, 64, 64, 64, 64, 64, b=P + 8) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, a=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, c=P + 1) == INVALID_VALUE         # not even 2-byte aligned
    if p["EPILOGUE"] == "tma":
        assert call(64, 60, 64, 64, 64, 60) == INVALID_VALUE              # ldc % 8 (TMA store)
        assert call(64, 64, 64, 64, 64, 64, c=P + 8) == INVALID_VALUE
    bad_splits = (5, 9, -1) if p["CLUSTER_M"] == 1 else (0, 2, 8)
    for bad in ((7, 8, 0, 1), (0, 3, 0, 1), (0, 8, 100, 1), (-1, 8, 0, 1),
                *((0, 8, 0, s) for s in bad_splits)):
        arr = (ctypes.c_int * 4)(*bad)
        assert call(64, 64, 64, 64, 64, 64, opts=arr) == INVALID_VALUE, bad


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CASES)
def test_passes_the_harness_audit(cfg, prebuilt):
    from cudal2.core.abi import load_library
    from cudal2.harness.audit import audit_build
    spec = FAM.build_spec(cfg, "sm_90a")
    r = _build(cfg)
    res = audit_build(spec.source, r, "sm_90a", name=cfg.label(), meta=load_library(r.so_path).meta)
    assert res.ok, res.reasons
    assert res.mma, "the audit saw no tensor-core instruction"


# The split-K build the tests below call: a decode tile (BM = 64, one consumer, no cluster along M).
SPLIT_CFG = FAM.default().with_(BM=64, BN=128, CONSUMERS=1, CLUSTER_M=1, EPILOGUE="direct",
                                LAYOUT="RC", STAGES=6)


@pytest.mark.compile
def test_a_split_call_is_one_cluster_launch_with_a_fake_runtime(fake_launches):
    """A fake CUDA runtime records what one cudal2_hgemm call launches (no GPU): with splits > 1
    one cudaLaunchKernelEx over (tiles, splits) with cluster dims (1, splits, 1), the split count
    wgmma_splits's (the cost model's replay); no memset, no workspace. Where no such cluster can be
    resident, or one split, the persistent grid of before; CLUSTER_M 2 builds take splits 1 only."""
    so = _build(SPLIT_CFG).so_path
    BM, BN, BK = (SPLIT_CFG.get(k) for k in ("BM", "BN", "BK"))
    calls = [[64, 4096, 4096, [0, 8, 0, 0], 0], [33, 4096, 4096, [0, 8, 0, 4], 0],
             [64, 4096, 4096, None, 0], [64, 4096, 128, [0, 8, 0, 8], 0],
             [64, 16896, 4096, [0, 8, 0, 0], 0], [1, 6144, 4096, [0, 8, 0, 0], 0],
             [128, 1024, 8192, [0, 8, 0, 3], 0], [64, 4096, 4096, [0, 8, 0, 5], 0],
             [64, 4096, 0, [0, 8, 0, 4], 0]]
    got = fake_launches(so, calls)
    for (M, N, K, opts, _), g in zip(calls[:7], got):
        s = wgmma_splits(M, N, K, BM, BN, BK, 132, opts[3] if opts else 1)
        tiles = -(-M // BM) * -(-N // BN)
        assert g["rc"] == 0 and g["launches"] == 1 and g["memsets"] == 0 and g["need"] == 0, g
        if s > 1:
            assert g["ex"] == 1 and g["grid"] == [tiles, s, 1] and g["cluster"] == [1, s, 1], (M, N, K, g)
        else:
            assert g["ex"] == 0 and g["grid"] == [min(tiles, 132), 1, 1], (M, N, K, g)
    assert [g["grid"][1] for g in got[:7]] == [4, 4, 1, 2, 1, 8, 3]
    assert got[7]["rc"] == INVALID_VALUE and got[7]["launches"] == 0     # 5: not a declared value
    assert got[8]["rc"] == 0 and got[8]["ex"] == 0                       # K == 0: the zero kernel
    # no resident cluster: the persistent grid, unsplit
    got = fake_launches(so, [[64, 4096, 4096, [0, 8, 0, 4], 0]], clusters=0)
    assert got[0]["rc"] == 0 and got[0]["ex"] == 0 and got[0]["grid"] == [32, 1, 1], got
    # CLUSTER_M 2 (the default build): splits 1 runs, anything else is refused
    so2 = _build(FAM.default().with_(LAYOUT="RC")).so_path
    got = fake_launches(so2, [[256, 4096, 4096, [0, 8, 0, 1], 0], [256, 4096, 4096, [0, 8, 0, 2], 0]])
    assert got[0]["rc"] == 0 and got[0]["launches"] == 1 and got[0]["grid"][1] == 1, got
    assert got[1]["rc"] == INVALID_VALUE and got[1]["launches"] == 0, got


# ---- correctness on a GPU -----------------------------------------------------------------
GPU_SHAPES = [(128, 256, 64), (256, 512, 128), (4096, 4096, 4096), (1000, 1000, 1000),
              (600, 1000, 2048), (77, 136, 264), (1, 8, 8), (3000, 2056, 520), (64, 8192, 64),
              (8192, 64, 128), (100, 1003, 72), (64, 64, 0), (0, 64, 64), (63, 129, 257)]


def _run(torch, lib, M, N, K, opts, *, lda=None, ldb=None, ldc=None):
    rc = lib.meta["layout"] == "RC"
    lda, ldb, ldc = lda or max(K, 1), ldb or max(K if rc else N, 1), ldc or max(N, 1)
    g = torch.Generator(device="cuda").manual_seed(M * 7919 + N * 131 + K)
    b_rows = N if rc else K
    a_store = (torch.rand(max(M, 1) * lda + 64, device="cuda", generator=g) * 2 - 1).half()
    b_store = (torch.rand(max(b_rows, 1) * ldb + 64, device="cuda", generator=g) * 2 - 1).half()
    A = a_store[:M * lda].view(M, lda)[:, :K]
    Bm = b_store[:b_rows * ldb].view(b_rows, ldb)[:, :(K if rc else N)]
    B = Bm.t() if rc else Bm
    c_store = torch.full((max(M, 1) * ldc + 64,), -7.0, device="cuda", dtype=torch.float16)
    a0, b0 = a_store.clone(), b_store.clone()
    err = lib.launch(a_store.data_ptr(), b_store.data_ptr(), c_store.data_ptr(), M, N, K, lda, ldb,
                     ldc, 0, 0, torch.cuda.current_stream().cuda_stream, options=opts)
    torch.cuda.synchronize()
    assert err == 0, f"{M}x{N}x{K}: cudal2_hgemm returned {err}"
    assert torch.equal(a_store, a0) and torch.equal(b_store, b0), "inputs modified"
    if M == 0 or N == 0:
        assert bool((c_store == -7.0).all())
        return
    C = c_store[:M * ldc].view(M, ldc)
    ref = A.double() @ B.double() if K else torch.zeros(M, N, device="cuda", dtype=torch.float64)
    tol = ref.abs() * 2.0 ** -10 + 2.0 ** -14 * (1 + math.sqrt(K))
    bad = (C[:, :N].double() - ref).abs() > tol
    assert not bool(bad.any()), f"{M}x{N}x{K} {opts and list(opts)}: {int(bad.sum())} elements off"
    if ldc > N:
        assert bool((C[:, N:] == -7.0).all()), "wrote into the padding of C"
    assert bool((c_store[M * ldc:] == -7.0).all()), "wrote past the end of C"


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CASES)
def test_matches_torch(cfg):
    import torch
    from cudal2.core.abi import load_library, meta_accepts
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma kernels run on sm_90 (Hopper) only")
    lib = load_library(_build(cfg).so_path)
    meta = lib.meta
    default = lib.options({})
    for M, N, K in GPU_SHAPES:
        if meta_accepts(meta, M, N, K):
            assert FAM.accepts(cfg, M, N, K)
            _run(torch, lib, M, N, K, default)
        else:
            assert not FAM.accepts(cfg, M, N, K)
            P = 1 << 20
            assert lib.launch(P, P, P, M, N, K, max(K, 1), max(N, K, 1), max(N, 1), 0, 0, 0,
                              options=default) == INVALID_VALUE, (M, N, K)
    rc = meta["layout"] == "RC"
    _run(torch, lib, 200, 136, 72, default, lda=80, ldb=80 if rc else 144, ldc=144)   # padded lds
    _run(torch, lib, 333, 264, 136, None)                                              # options NULL
    for raster in (0, 1, 2, 3):
        for swizzle in ((1, 4, 16) if raster in (1, 2) else (8,)):
            for sm_count in (0, 64, 130):
                opts = lib.options({"raster": raster, "swizzle": swizzle, "sm_count": sm_count})
                _run(torch, lib, 1536, 2304, 512, opts)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [c for c in CASES if c.values[0].get("CLUSTER_M") == 1])
def test_split_k_in_a_cluster_matches_torch_and_is_bit_identical(cfg):
    """Split-K reduced through distributed shared memory: correct on residues, odd leading
    dimensions, fewer k-blocks than splits and the decode shapes; two runs of one call give the
    same bits (the rank-ordered sum); no workspace is asked for."""
    import torch
    from cudal2.core.abi import load_library
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma kernels run on sm_90 (Hopper) only")
    lib = load_library(_build(cfg).so_path)
    rc = lib.meta["layout"] == "RC"
    for M, N, K in [(64, 4096, 4096), (33, 1000, 2056), (1, 8, 8), (64, 256, 128), (100, 1000, 520),
                    (64, 6144, 4096), (200, 136, 4104)]:
        for splits in (0, 2, 3, 4, 8):
            opts = lib.options({"splits": splits})
            assert lib.workspace_bytes(M, N, K, opts) == 0
            _run(torch, lib, M, N, K, opts)
    _run(torch, lib, 64, 136, 1032, lib.options({"splits": 3}), lda=1040, ldb=1040 if rc else 144,
         ldc=144)
    # bit-identical run to run (the same operands, one stream)
    M, N, K = 64, 2048, 8192
    g = torch.Generator(device="cuda").manual_seed(7)
    A = (torch.rand(M, K, device="cuda", generator=g) - 0.5).half()
    B = (torch.rand(N, K, device="cuda", generator=g) - 0.5).half()
    if not rc:
        B = B.t().contiguous()
    outs = []
    for _ in range(2):
        C = torch.empty(M, N, device="cuda", dtype=torch.float16)
        assert lib.launch(A.data_ptr(), B.data_ptr(), C.data_ptr(), M, N, K, K, B.stride(0), N, 0, 0,
                          torch.cuda.current_stream().cuda_stream,
                          options=lib.options({"splits": 8})) == 0
        outs.append(C)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])


# ---- the cluster split-K reduction, emulated (numpy) -----------------------------------------
def _red_rows(BM, BN, bar_offset):
    """red_rows() of wgmma_hgemm.cuh: BM, halved until a chunk of BM x (BN + 8) floats fits."""
    r = BM
    while r > 1 and r * (BN + 8) * 4 > bar_offset:
        r //= 2
    return r


def _cluster_reduce(partials, BM, BN, consumers, red_rows):
    """cluster_reduce of wgmma_hgemm.cuh over `partials` (splits x BM x BN fp32, rank z's
    accumulators): each thread's fragment stores into its rank's chunk buffer, then each rank
    sums the units of its slice over ranks 0..splits-1 in order. Returns the tile and how many
    times each element was stored and reduced."""
    import numpy as np
    splits = partials.shape[0]
    wg_m, mi_n = BM // consumers, BM // consumers // 64
    stride = BN + 8
    out = np.full((BM, BN), np.nan, dtype=np.float32)
    stored = np.zeros((BM, BN), dtype=int)
    reduced = np.zeros((BM, BN), dtype=int)
    units_per_row = BN // 4
    units = red_rows * units_per_row
    begin = [z * units // splits for z in range(splits + 1)]      # cluster_slice_begin
    for r0 in range(0, BM, red_rows):
        bufs = np.full((splits, red_rows * stride), np.nan, dtype=np.float32)
        for z in range(splits):
            for cw in range(consumers):
                for warp in range(4):
                    for lane in range(32):
                        row_in = cw * wg_m + warp * 16 + (lane >> 2) - r0
                        off = row_in * stride + 2 * (lane & 3)
                        for mi in range(mi_n):
                            for h in range(2):
                                r = row_in + mi * 64 + 8 * h
                                if r < 0 or r >= red_rows:
                                    continue
                                for j in range(BN // 8):
                                    a = off + (mi * 64 + 8 * h) * stride + 8 * j
                                    row, col = r0 + r, 8 * j + 2 * (lane & 3)
                                    bufs[z, a:a + 2] = partials[z, row, col:col + 2]
                                    stored[row, col:col + 2] += z == 0
        for z in range(splits):
            for ct in range(128 * consumers):
                for u in range(begin[z] + ct, begin[z + 1], 128 * consumers):
                    r, c4 = u // units_per_row, (u % units_per_row) * 4
                    s = np.zeros(4, dtype=np.float32)
                    for q in range(splits):                       # rank order
                        s = s + bufs[q, r * stride + c4:r * stride + c4 + 4]
                    out[r0 + r, c4:c4 + 4] = s
                    reduced[r0 + r, c4:c4 + 4] += 1
    return out, stored, reduced


@pytest.mark.parametrize("BM,BN,consumers,bar_offset", [(64, 128, 1, 6 * 192 * 128),
                                                       (128, 64, 2, 2 * 192 * 128),
                                                       (192, 64, 3, 2 * 256 * 128),
                                                       (128, 256, 1, 2 * 384 * 128)])
@pytest.mark.parametrize("splits", [2, 3, 8])
def test_cluster_reduction_emulated_covers_the_tile_once_in_rank_order(BM, BN, consumers, bar_offset,
                                                                     splits):
    """Every element of the tile is stored once per rank and reduced once, by one rank, as the
    fp32 sum of ranks 0, 1, ..., splits-1 in that order, whatever the chunking (BM = 128, BN =
    256 over 2 small stages needs two chunks)."""
    import numpy as np
    red_rows = _red_rows(BM, BN, bar_offset)
    assert BM % red_rows == 0 and red_rows >= 16
    rng = np.random.default_rng(BM * BN + splits)
    partials = rng.standard_normal((splits, BM, BN)).astype(np.float32) * 1000
    out, stored, reduced = _cluster_reduce(partials, BM, BN, consumers, red_rows)
    assert (stored == 1).all() and (reduced == 1).all()
    want = np.zeros((BM, BN), dtype=np.float32)
    for z in range(splits):
        want = want + partials[z]
    assert np.array_equal(out, want)                    # bit for bit: the same additions in order


def test_cluster_reduction_model_matches_the_header():
    """The emulation above follows these lines of wgmma_hgemm.cuh; if they change, update it."""
    src = (template_dir() / FAM.header).read_text()
    for line in ("constexpr int kRedStride = BN + 8;",
                 "while (r > 1 && r * kRedStride * 4 > kBarOffset) r /= 2;",
                 "const int row_in = cw * kWgM + warp * 16 + (lane >> 2) - r0;",
                 "const int off = row_in * kRedStride + 2 * (lane & 3);",
                 "const int r = row_in + mi * 64 + 8 * h;",
                 "*reinterpret_cast<float2*>(red + off + (mi * 64 + 8 * h) * kRedStride + 8 * j) =",
                 "make_float2(acc[mi][4 * j + 2 * h], acc[mi][4 * j + 2 * h + 1]);",
                 "for (int u = u_begin + ct; u < u_end; u += 128 * kConsumers) {",
                 "const int r = u / kUnitsPerRow, c4 = (u % kUnitsPerRow) * 4;",
                 "const uint32_t local = red_base + (uint32_t)(r * kRedStride + c4) * 4u;"):
        assert line in src, line
