"""The low-latency families (cudal2/templates/lowlat_hgemm.cuh: lowlat = wgmma, lowlat_mma =
mma.sync): config rules and the split choice (unit); every instantiation of a covering set builds
with zero spills (the split-K kernel too), exports the ABI 2 symbols, holds HGMMA or HMMA in its
SASS, needs no tensor map, passes the audit, refuses bad arguments and options before any CUDA
call, and serves every M its meta claims (a no-device dry call, metacheck.probe_guard) (compile:
nvcc, no GPU); correctness against torch on grid, residue, RC and small shapes, and of the
in-kernel split-K: residues, odd leading dimensions, empty K, 64 splits, deep K, a 200-call
stress run bit-identical with the workspace zero after each call (gpu). The launcher against a
fake CUDA runtime (grids, the split plan, the workspace, the shared-memory opt-in after a device
reset): tests/test_lowlat_runtime.py."""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess

import pytest

from cudal2.templates import FAMILIES, SMEM_LIMIT, template_dir
from cudal2.templates.lowlat import (MIN_K_TILES, SPLIT_VALUES, lowlat_smem_bytes, lowlat_splits,
                                     lowlat_workspace_bytes)

LL, LLM = FAMILIES["lowlat"], FAMILIES["lowlat_mma"]
INVALID_VALUE = 1   # cudaErrorInvalidValue


# ---- the families and their rules (pure Python) -------------------------------------------
def test_families_share_one_header_and_split_by_instruction():
    assert LL.header == LLM.header == "lowlat_hgemm.cuh" and (template_dir() / LL.header).is_file()
    assert LL.arches == ("sm_90a",) and LLM.arches == ("sm_80", "sm_90a")
    assert LL.instruction == "wgmma" and LLM.instruction == "mma.sync"
    assert set(LL.space()["BM"]) == {64, 128} and set(LLM.space()["BM"]) == {16, 32}
    for fam in (LL, LLM):
        for c in fam.defaults():
            assert fam.problems(c) == [], c.label()
    assert LL.default().name() == "lowlat_sm90a_f32_rr_64x128x64_s3_c1x1"
    assert LLM.default().name() == "lowlat_mma_sm80_f32_rr_32x128x64_s3_c1x1"


@pytest.mark.parametrize("fam,changes,why", [
    ("lowlat", dict(BM=32), "belongs to lowlat_mma"),
    ("lowlat_mma", dict(BM=64), "belongs to lowlat"),
    ("lowlat", dict(BN=256), "BN"),
    ("lowlat", dict(BK=128), "BK"),
    ("lowlat", dict(STAGES=9), "STAGES"),
    ("lowlat", dict(STAGES=1), "STAGES"),
    ("lowlat", dict(ACC="f16"), "fp32"),
    ("lowlat_mma", dict(BM=48), "BM"),
])
def test_bad_configs_are_rejected(fam, changes, why):
    f = FAMILIES[fam]
    bad = f.problems(f.default().with_(**changes))
    assert bad and any(why in b for b in bad), bad


def test_accepts_follows_the_16_byte_loads():
    rr, rc = LL.default(), LL.default().with_(LAYOUT="RC")
    assert LL.accepts(rr, 1, 8, 8) and LL.accepts(rr, 77, 136, 264)
    assert not LL.accepts(rr, 64, 60, 64)     # RR: ldb = N must be a multiple of 8
    assert LL.accepts(rc, 64, 60, 64)         # RC: N is a row count of B
    assert not LL.accepts(rc, 64, 64, 60)     # K % 8 always
    assert LL.serves(rr, 3, 8, 8)             # any M, no tile multiple needed


def test_shared_memory_rule_matches_the_header_formula():
    src = (template_dir() / LL.header).read_text()
    assert "constexpr size_t kSmemBytes = (size_t)STAGES * (kAStage + kBStage) * sizeof(half)" in src
    assert lowlat_smem_bytes(LL.default().as_dict()) == 3 * (64 + 128) * 64 * 2 + 1024
    p = LLM.default().as_dict()   # 32 x 128, RR: A 32 x (64+8), B 64 x (128+8)
    assert lowlat_smem_bytes(p) == 3 * (32 * 72 + 64 * 136) * 2
    for fam in (LL, LLM):
        for c in _space(fam):
            assert lowlat_smem_bytes(c.as_dict()) <= SMEM_LIMIT["sm_90a"]


def test_split_choice_fills_the_sms_and_keeps_whole_k_tiles():
    """lowlat_splits (the kernel's plan_splits): the issue's deep-K shapes split, big grids and
    short K do not; every split a non-empty range of whole k-tiles; explicit values clamp to the
    k-tiles; the workspace is one fp32 slab per split plus a semaphore per tile."""
    # 128x64x12288 on 64x64 tiles: 2 tiles, 192 k-tiles; sqrt-balance: 13 splits of 15 k-tiles
    assert lowlat_splits(128, 64, 12288, 64, 64, 64, 132) == (13, 15)
    assert lowlat_splits(128, 64, 12288, 128, 64, 64, 132) == (12, 16)
    assert lowlat_splits(128, 128, 2048, 64, 128, 64, 132) == (4, 8)
    assert lowlat_splits(1024, 256, 16384, 128, 128, 64, 132) == (8, 32)     # 16 tiles: fill 132 SMs
    assert lowlat_splits(4096, 4096, 4096, 64, 128, 64, 132)[0] == 1          # 2048 tiles
    assert lowlat_splits(128, 128, 256, 64, 128, 64, 132)[0] == 1             # 4 k-tiles: < 2 x MIN_K_TILES
    assert lowlat_splits(64, 64, 0, 64, 64, 64, 132) == (1, 0)
    assert lowlat_splits(64, 64, 64 * 10, 64, 64, 64, 132, asked=64) == (10, 1)   # at most one per k-tile
    assert lowlat_splits(64, 64, 64 * 10, 64, 64, 64, 132, asked=4) == (4, 3)     # 3+3+3+1
    assert lowlat_splits(64, 64, 64 * 9, 64, 64, 64, 132, asked=4) == (3, 3)      # never an empty split
    for M, N, K in ((1, 8, 8), (77, 136, 264), (128, 64, 12288), (3, 1024, 4096), (64, 64, 65536)):
        for sms in (1, 66, 132, 148):
            for asked in SPLIT_VALUES:
                s, per = lowlat_splits(M, N, K, 64, 64, 64, sms, asked)
                k_tiles = -(-K // 64)
                assert 1 <= s <= 64 and (s - 1) * per < k_tiles <= s * per, (M, N, K, sms, asked)
                if asked == 0 and s > 1:
                    assert per >= MIN_K_TILES and s * -(-M // 64) * -(-N // 64) <= sms
    assert lowlat_workspace_bytes(128, 64, 1, 64, 64) == 0
    assert lowlat_workspace_bytes(128, 64, 13, 64, 64) == 13 * 128 * 64 * 4 + 2 * 4
    assert lowlat_workspace_bytes(3, 5, 2, 16, 64) == 128 + 4     # 120 bytes of partials, padded


def test_planner_sweeps_the_kernels_own_split_choice():
    """The meta declares every split value the kernel takes; the planner times the kernel's own
    choice only (the cost model cannot rank the others yet: lowlat.PLANNED_SPLITS), but every
    value on a decode row, where the streaming budget screens them."""
    for fam in (LL, LLM):
        c = fam.default()
        assert fam.option_decls(c) == [("splits", (0,), 0)]
        assert fam.option_space(c) == [{"splits": 0}]
        assert fam.option_space(c, decode=True) == [{"splits": v} for v in SPLIT_VALUES]


def _space(fam):
    from cudal2.search.tune import enumerate_space
    return [c for lay in ("RR", "RC") for c in enumerate_space(fam, arch="sm_90a", acc="f32", layout=lay)]


# ---- builds (nvcc, no GPU) ----------------------------------------------------------------
def _instantiations() -> list:
    """(config, arch): each family's defaults and, for every knob value and layout, one config
    that has it (the 6- and 8-stage rings among them); lowlat_mma's defaults also for sm_80. 18
    builds of ~2-4 s. CUDAL2_LOWLAT_ALL=1: the whole space of both families (78 configs, 118
    builds)."""
    out = []
    for fam in (LL, LLM):
        space = _space(fam)
        cfgs = space if os.environ.get("CUDAL2_LOWLAT_ALL") else list(fam.defaults())
        for knob, values in fam.choices().items():
            for v in values:
                if not any(c.get(knob) == v for c in cfgs):
                    near = fam.default().with_(**{knob: v})
                    cfgs.append(near if near in space else next(c for c in space if c.get(knob) == v))
        # sm_80 (lowlat_mma only) runs the same source: its defaults cover the other arch
        out += [(c, a) for c in cfgs for a in fam.arches
                if a == "sm_90a" or c in fam.defaults() or os.environ.get("CUDAL2_LOWLAT_ALL")]
    return out


CASES = [pytest.param(c, a, id=f"{c.name()}-{a}") for c, a in _instantiations()]


def _sass_cases() -> list:
    """Disassembly costs ~4 s a build: one case per (family, arch) carries the SASS check (the
    PTX check of every case pins the wgmma N)."""
    seen, out = set(), []
    for p in CASES:
        cfg, arch = p.values
        key = (cfg.family, arch)
        if key not in seen or os.environ.get("CUDAL2_LOWLAT_ALL"):
            seen.add(key)
            out.append(p)
    return out


@pytest.fixture(scope="module")
def prebuilt(prebuild):
    """Every case built at once where the run is one process (conftest's prebuild); the tests
    read the build cache."""
    prebuild(FAMILIES[p.values[0].family].build_spec(p.values[0], p.values[1]) for p in CASES)


def _build(cfg, arch):
    from cudal2.core.build import build
    r = build(FAMILIES[cfg.family].build_spec(cfg, arch))
    assert r.ok, f"{cfg.label()} on {arch}: {r.status}\n{r.log[-4000:]}"
    return r


def _entries(ptx: str) -> dict[str, str]:
    """{entry name: its PTX text} of every kernel entry."""
    ms = list(re.finditer(r"^\.visible \.entry (\S+)\(", ptx, re.M))
    return {m.group(1): ptx[m.start():(ms[i + 1].start() if i + 1 < len(ms) else len(ptx))]
            for i, m in enumerate(ms)}


def _symbols(so_path, *flags) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", *flags, str(so_path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_builds_without_spills(cfg, arch, prebuilt):
    r = _build(cfg, arch)
    assert r.spills == 0, f"{cfg.label()} spills: {r.resources}"
    assert r.resources and max(x.stack_bytes for x in r.resources) == 0
    assert {"cudal2_hgemm", "cudal2_meta", "cudal2_workspace"} <= _symbols(r.so_path, "--defined-only")
    # one launch, no tensor map: the host imports neither the driver entry point nor a memset
    imports = _symbols(r.so_path, "--undefined-only")
    assert "cudaLaunchKernel" in imports
    assert not {s for s in imports if "DriverEntryPoint" in s or "Memset" in s or "Malloc" in s}, imports
    ptx = r.ptx_path.read_text()
    assert "cp.async.bulk.tensor" not in ptx and "cluster" not in ptx and "mbarrier" not in ptx
    assert "cp.async.cg.shared.global" in ptx
    # two kernels: lowlat_kernel (splits == 1: no workspace, no semaphore, no trap) and
    # lowlat_splitk_kernel (the partials' L2 loads, the semaphore's atomic, the contract's trap)
    bodies = _entries(ptx)
    plain = next(b for n, b in bodies.items() if "lowlat_kernel" in n)
    split = next(b for n, b in bodies.items() if "lowlat_splitk_kernel" in n)
    assert "atom." not in plain and "ld.global.cg.f32" not in plain and "trap;" not in plain
    assert "atom.global.add.u32" in split and "ld.global.cg.f32" in split and "trap;" in split
    if cfg.family == "lowlat":
        wgmma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.(\w+)\.f16\.f16", ptx))
        assert wgmma == {(f"m64n{cfg.get('BN')}k16", "f32")}, wgmma
        assert "mma.sync" not in ptx
    else:
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and "wgmma" not in ptx


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", _sass_cases())
def test_sass_holds_the_tensor_core_instruction(cfg, arch, prebuilt):
    """lowlat runs HGMMA.64xBNx16.F32 and no HMMA; lowlat_mma runs HMMA.16816.F32 and no HGMMA."""
    from cudal2.core.toolchain import find_cuobjdump
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (PATH, next to nvcc, or pip nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "-sass", str(_build(cfg, arch).so_path)], capture_output=True, text=True).stdout
    if "Function" not in sass:
        pytest.skip(f"{tool} could not disassemble the {arch} cubin")
    hgmma = set(re.findall(r"HGMMA\.64x(\d+)x16\.F32", sass))
    hmma = set(re.findall(r"\bHMMA\.(\w+)\.F32", sass))
    if cfg.family == "lowlat":
        assert hgmma == {str(cfg.get("BN"))} and not hmma, (hgmma, hmma)
    else:
        assert hmma == {"16816"} and not hgmma, (hgmma, hmma)


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_meta_and_argument_checks(cfg, arch, prebuilt):
    """cudal2_meta, cudal2_workspace at explicit split counts and the launcher's argument and
    option checks run on the host before any CUDA call: no GPU needed, and a refused call never
    launches."""
    from cudal2.core.abi import abi_version, load_library, meta_accepts, parse_meta
    r = _build(cfg, arch)
    lib = load_library(r.so_path)
    raw = ctypes.CDLL(str(r.so_path)).cudal2_meta
    raw.restype = ctypes.c_char_p
    m = parse_meta(raw().decode())
    p = cfg.as_dict()
    rc = p["LAYOUT"] == "RC"
    assert m == lib.meta and abi_version(m) == 2 and lib.abi == 2
    assert m["style"] == m["family"] == cfg.family == FAMILIES[cfg.family].style and m["arch"] == arch
    assert m["acc"] == "f32" and m["layout"] == p["LAYOUT"] and m["params"] == p
    assert m["tile"] == [p["BM"], p["BN"], p["BK"]] and m["any_shape"] is True
    assert m["divisible"] == [1, 1 if rc else 8, 8]
    assert m["options"] == [{"name": "splits", "values": list(SPLIT_VALUES), "default": 0}]
    assert m["workspace_zero_init"] is True and m["splitk_fixup"] == "deterministic"
    assert m["workspace_bytes"] == 256 * p["BM"] * p["BN"] * 4 + 16 + 128 * 4   # for information
    assert m["smem_bytes"] == lowlat_smem_bytes(p) and m["cluster"] == [1, 1, 1]
    assert m["threads"] == (128 * p["BM"] // 64 if p["BM"] >= 64 else p["BN"] // 32 * 32)
    for shape in ((64, 60, 64), (64, 64, 60), (3, 8, 8), (77, 136, 264)):
        assert meta_accepts(m, *shape) == FAMILIES[cfg.family].accepts(cfg, *shape), shape
    # the workspace of an explicit split count needs no device (option 0 asks for the SM count)
    BM, BN = p["BM"], p["BN"]
    for M, N, K, splits in ((64, 64, 1024, 4), (77, 136, 264, 64), (3, 8, 8, 2), (128, 64, 12288, 64),
                            (4096, 4096, 4096, 1), (64, 64, 1024, 1)):
        want = lowlat_workspace_bytes(M, N, lowlat_splits(M, N, K, BM, BN, 64, 132, splits)[0], BM, BN)
        assert lib.workspace_bytes(M, N, K, lib.options({"splits": splits})) == want, (M, N, K, splits)
    assert lib.workspace_bytes(64, 64, 1024, lib.options({"splits": 1})) == 0
    assert lib.workspace_bytes(64, 64, 0, lib.options({"splits": 4})) == 0       # K == 0: no split
    assert lib.workspace_bytes(0, 64, 64, None) == 0
    bad_opt = (ctypes.c_int * 1)(3)                                              # not a listed value
    assert lib.workspace_bytes(64, 64, 1024, bad_opt) == 0

    P = 1 << 20   # fake aligned addresses: every call below returns before touching them

    def call(M, N, K, lda, ldb, ldc, a=P, b=P, c=P, ws=0, ws_bytes=0, options=None):
        return lib.launch(a, b, c, M, N, K, lda, ldb, ldc, ws, ws_bytes, 0, options=options)
    assert call(0, 64, 64, 64, 64, 64) == 0 and call(64, 0, 64, 64, 64, 64) == 0
    assert call(-1, 64, 64, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, -1, 64, 64, 64) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 56) == INVALID_VALUE                  # ldc < N
    assert call(64, 64, 64, 56, 64, 64) == INVALID_VALUE                  # lda < K
    assert call(64, 96, 64, 64, 56 if rc else 88, 96) == INVALID_VALUE    # ldb too small
    assert call(64, 64, 64, 72, 68, 64) == INVALID_VALUE                  # ldb % 8
    assert call(64, 64, 64, 68, 64, 64) == INVALID_VALUE                  # lda % 8
    assert call(64, 64, 60, 64, 64, 64) == INVALID_VALUE                  # K % 8
    if not rc:
        assert call(64, 60, 64, 64, 64, 60) == INVALID_VALUE              # RR: N % 8
    assert call(64, 64, 64, 64, 64, 64, a=P + 2) == INVALID_VALUE         # 16-byte aligned A
    assert call(64, 64, 64, 64, 64, 64, b=P + 8) == INVALID_VALUE         # and B
    assert call(64, 64, 64, 64, 64, 64, a=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, c=0) == INVALID_VALUE
    assert call(64, 64, 64, 64, 64, 64, c=P + 1) == INVALID_VALUE         # not even 2-byte aligned
    assert call(0, 64, 64, 64, 64, 64, options=bad_opt) == INVALID_VALUE  # an unlisted option value
    # a split call without the workspace cudal2_workspace asks for is refused before any launch
    four = lib.options({"splits": 4})
    need = lib.workspace_bytes(64, 64, 1024, four)
    assert need == lowlat_workspace_bytes(64, 64, 4, BM, BN) > 0
    assert call(64, 64, 1024, 1024, 1024 if rc else 64, 64, options=four) == INVALID_VALUE            # none
    assert call(64, 64, 1024, 1024, 1024 if rc else 64, 64, ws=P, ws_bytes=need - 1, options=four) == INVALID_VALUE
    assert call(64, 64, 1024, 1024, 1024 if rc else 64, 64, ws=P + 8, ws_bytes=need, options=four) == INVALID_VALUE


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", _sass_cases())
def test_serves_every_m_its_meta_claims(cfg, arch, prebuilt):
    """The meta claims any M and N (any_shape): the launcher's guard, called without a device
    (metacheck.probe_guard in a worker that sees no GPU, as the audit's dry call), gets past its
    checks (the runtime answers no device) at the smallest claimed shape and at M far beyond
    65535 tiles (grid.y's limit, where M tiles used to go) up to INT_MAX, and N likewise."""
    from cudal2.core.abi import load_library, meta_accepts
    from cudal2.harness.metacheck import NO_DEVICE, check_tile, probe_guard
    from cudal2.harness.worker import WorkerPool
    r = _build(cfg, arch)
    meta = load_library(r.so_path).meta
    BM = cfg.get("BM")
    INT_MAX = 2**31 - 1
    shapes = [(1, 8, 8), (65535 * BM, 8, 8), (65535 * BM + 1, 8, 8), (65536 * BM + 77, 8, 8),
              (INT_MAX, 8, 8), (1, INT_MAX - 7, 8), (1 << 24, 1 << 24, 8), (INT_MAX, 1 << 20, 8)]
    assert all(meta_accepts(meta, *s) for s in shapes)
    with WorkerPool(max_tasks=1, device="") as pool:     # sees no GPU: nothing can launch
        out = pool.run(probe_guard, str(r.so_path), shapes, timeout_s=60)
        assert out.status == "ok", out.detail
        assert all(rc in NO_DEVICE for rc in out.value), dict(zip(shapes, out.value))
        res = check_tile(meta, r.so_path, pool=pool)
    assert "tile" in res.verified and not res.reasons, (res.reasons, res.notes)


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_passes_the_harness_audit(cfg, arch, prebuilt):
    from cudal2.core.abi import load_library
    from cudal2.harness.audit import audit_build
    spec = FAMILIES[cfg.family].build_spec(cfg, arch)
    r = _build(cfg, arch)
    res = audit_build(spec.source, r, arch, name=cfg.label(), meta=load_library(r.so_path).meta)
    assert res.ok, res.reasons
    assert res.mma, "the audit saw no tensor-core instruction"


# ---- correctness on a GPU -----------------------------------------------------------------
# grid (many tiles), residues in M, N and K, skinny and single-row shapes, K == 0, empty output
GPU_SHAPES = [(128, 256, 64), (256, 512, 128), (1000, 1000, 1000), (77, 136, 264), (1, 8, 8),
              (3, 1024, 4096), (64, 8192, 64), (8192, 64, 128), (100, 1003, 72), (64, 64, 0),
              (0, 64, 64), (63, 129, 257), (17, 40, 8)]


def _operands(torch, lib, M, N, K, lda, ldb, ldc, c_offset):
    rc = lib.meta["layout"] == "RC"
    g = torch.Generator(device="cuda").manual_seed(M * 7919 + N * 131 + K)
    b_rows = N if rc else K
    a_store = (torch.rand(max(M, 1) * lda + 64, device="cuda", generator=g) * 2 - 1).half()
    b_store = (torch.rand(max(b_rows, 1) * ldb + 64, device="cuda", generator=g) * 2 - 1).half()
    A = a_store[:M * lda].view(M, lda)[:, :K]
    Bm = b_store[:b_rows * ldb].view(b_rows, ldb)[:, :(K if rc else N)]
    B = Bm.t() if rc else Bm
    c_full = torch.full((max(M, 1) * ldc + 64 + c_offset,), -7.0, device="cuda", dtype=torch.float16)
    return a_store, b_store, A, B, c_full


def _run(torch, lib, M, N, K, *, lda=None, ldb=None, ldc=None, c_offset=0, splits=None, calls=1):
    """One shape (calls > 1: that many calls on one workspace, zeroed once, C bit-identical and
    the workspace all zero after each); splits: the option (None: the default, 0)."""
    rc = lib.meta["layout"] == "RC"
    lda, ldb, ldc = lda or max(K, 1), ldb or max(K if rc else N, 1), ldc or max(N, 1)
    a_store, b_store, A, B, c_full = _operands(torch, lib, M, N, K, lda, ldb, ldc, c_offset)
    c_store = c_full[c_offset:]
    opts = lib.options({} if splits is None else {"splits": splits})
    ws_bytes = lib.workspace_bytes(M, N, K, opts)
    ws = torch.zeros(max(ws_bytes, 16), device="cuda", dtype=torch.uint8)   # zeroed once (the contract)
    first = None
    for i in range(calls):
        err = lib.launch(a_store.data_ptr(), b_store.data_ptr(), c_store.data_ptr(), M, N, K, lda, ldb,
                         ldc, ws.data_ptr() if ws_bytes else 0, ws_bytes,
                         torch.cuda.current_stream().cuda_stream, options=opts)
        torch.cuda.synchronize()
        assert err == 0, f"{M}x{N}x{K} splits={splits}: cudal2_hgemm returned {err}"
        assert not bool(ws.any()), f"{M}x{N}x{K} splits={splits}: call {i} left the workspace nonzero"
        if first is None:
            first = c_full.clone()
        else:
            assert torch.equal(c_full, first), f"{M}x{N}x{K} splits={splits}: call {i} differs from call 0"
    if M == 0 or N == 0:
        assert bool((c_full == -7.0).all())
        return
    C = c_store[:M * ldc].view(M, ldc)
    ref = A.double() @ B.double() if K else torch.zeros(M, N, device="cuda", dtype=torch.float64)
    tol = ref.abs() * 2.0 ** -10 + 2.0 ** -14 * (1 + math.sqrt(K))
    bad = (C[:, :N].double() - ref).abs() > tol
    assert not bool(bad.any()), f"{M}x{N}x{K} splits={splits}: {int(bad.sum())} elements off"
    if ldc > N:
        assert bool((C[:, N:] == -7.0).all()), "wrote into the padding of C"
    assert bool((c_store[M * ldc:] == -7.0).all()), "wrote past the end of C"
    assert bool((c_full[:c_offset] == -7.0).all()), "wrote before C"


def _gpu_lib(cfg, arch):
    import torch
    from cudal2.core.abi import load_library
    cap = torch.cuda.get_device_capability()
    # an sm_80 build holds sm_80 machine code only (no PTX): it runs on compute capability 8.x
    if arch == "sm_90a" and cap != (9, 0) or arch == "sm_80" and cap[0] != 8:
        pytest.skip(f"{arch} build does not run on compute capability {cap}")
    return torch, load_library(_build(cfg, arch).so_path)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,arch", CASES)
def test_matches_torch(cfg, arch):
    """Every shape at the default option (the launcher's split choice: (3, 1024, 4096) splits)
    and without a split."""
    from cudal2.core.abi import meta_accepts
    torch, lib = _gpu_lib(cfg, arch)
    for M, N, K in GPU_SHAPES:
        if meta_accepts(lib.meta, M, N, K):
            _run(torch, lib, M, N, K)
            _run(torch, lib, M, N, K, splits=1)
        else:
            P = 1 << 20
            assert lib.launch(P, P, P, M, N, K, max(K, 1), max(N, K, 1), max(N, 1), 0, 0, 0) == INVALID_VALUE
    rc = lib.meta["layout"] == "RC"
    _run(torch, lib, 200, 136, 72, lda=80, ldb=80 if rc else 144, ldc=144)   # padded lds
    _run(torch, lib, 70, 72, 72, ldc=75, c_offset=1)                         # C not 16-byte aligned


# split-K: deep K on few tiles, residues in M, N and K (K % 8 == 0), one-row and one-k-tile splits,
# 64 splits (8192 = 128 k-tiles of 2), the shapes
SPLIT_SHAPES = [(128, 64, 12288), (128, 128, 2048), (77, 136, 1032), (1, 8, 4096), (63, 72, 8192),
                (96, 72, 8192), (17, 40, 520), (200, 200, 64), (64, 64, 0), (3, 1024, 4096)]


def _split_cases():
    """One config of each (family, arch) as the SASS check takes, plus a covering case of
    lowlat's 128-row tile (two warpgroups) and of lowlat_mma's 16-row tile (all built by
    `prebuilt` and tools/gpu_session/prefill.py)."""
    out = list(_sass_cases())
    for bm in (128, 16):
        p = next(p for p in CASES if p.values[0].get("BM") == bm and p.values[1] == "sm_90a")
        if p not in out:
            out.append(p)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,arch", _split_cases())
def test_split_k_matches_torch_and_leaves_the_workspace_zero(cfg, arch):
    """Every split value on deep-K, residue and empty-K shapes (the workspace cudal2_workspace
    asks for, zeroed once, all zero after every call), odd and padded leading dimensions, and
    calls past grid.y's old limit of 65535 M tiles."""
    from cudal2.core.abi import meta_accepts
    torch, lib = _gpu_lib(cfg, arch)
    rc = lib.meta["layout"] == "RC"
    for M, N, K in SPLIT_SHAPES:
        if not meta_accepts(lib.meta, M, N, K):
            continue
        for splits in SPLIT_VALUES:
            _run(torch, lib, M, N, K, splits=splits, calls=2)
    for splits in (0, 4, 64):
        _run(torch, lib, 200, 136, 4096, lda=4104, ldb=4104 if rc else 144, ldc=139, splits=splits)
        _run(torch, lib, 70, 72, 2048, ldc=75, c_offset=1, splits=splits)      # C not 16-byte aligned
    BM = cfg.get("BM")
    _run(torch, lib, 65536 * BM + 5, 8, 16, splits=1)                           # > 65535 M tiles


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,arch", _sass_cases())
def test_split_k_stress_is_bit_identical(cfg, arch):
    """200 calls of the issue's deepest shape at the launcher's choice and at 64 splits: C the
    same bits every call, the workspace zero after every call."""
    torch, lib = _gpu_lib(cfg, arch)
    for splits in (0, 64):
        _run(torch, lib, 128, 64, 12288, splits=splits, calls=200)
