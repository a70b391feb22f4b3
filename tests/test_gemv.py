"""The gemv family (cudal2/templates/gemv_hgemm.cuh, gemv.py): M <= 8 on CUDA cores. Rules,
names and per-arch options; the Python replica of the kernel's work split on decode and residue
shapes (every output column and 8-wide K chunk once, no empty CTA, launch order); the numpy
emulation of its arithmetic against a float64 reference, bit-identical run to run (unit). Builds
with zero spills and no stack, the streaming loads and the cluster reduction in the PTX, FFMA in
the SASS, the ABI 2 meta, the launcher's refusals before any CUDA call, its grid and cluster dims
against a fake CUDA runtime, the no-device guard and the audit (compile: nvcc, no GPU). On a GPU:
vs torch and bit for bit vs the emulation for M = 1..8, residue N and K, RC and RR, every splits x
unroll option; repeats and a CUDA graph's replays bit-identical; M > MAX_M refused.
"""
from __future__ import annotations

import ctypes
import math
import re
import subprocess

import numpy as np
import pytest

from cudal2.templates import FAMILIES, instantiate
from cudal2.templates.gemv import (SPLIT_VALUES, UNROLL_VALUES, gemv_emulate, gemv_inflight_bytes,
                                   gemv_options, gemv_smem_bytes, gemv_threads, gemv_tile_cols,
                                   gemv_work, rank_chunks, run_splits)

FAM = FAMILIES["gemv"]
RC, RR = FAM.defaults()[:2]
INVALID_VALUE = 1   # cudaErrorInvalidValue
DECODE = [(4096, 4096), (6144, 4096), (4096, 14336), (57344, 8192), (8192, 28672)]


def _space() -> list:
    return [c for lay in ("RR", "RC") for c in
            [FAM.default().with_(LAYOUT=lay, MAX_M=m, WARPS=w, ROWS=r)
             for m in (1, 2, 4, 8) for w in (4, 8, 16) for r in (1, 2, 4)] if FAM.valid(c)]


# ---- rules, names, options (pure Python) -------------------------------------------------------
def test_rules():
    assert FAM.arches == ("sm_80", "sm_90a") and FAM.style == "gemv" and FAM.instruction == "fma"
    assert RC.get("LAYOUT") == "RC" and RR.get("LAYOUT") == "RR" and FAM.valid(RC) and FAM.valid(RR)
    assert FAM.choices()["ACC"] == ["f32"] and FAM.problems(RC.with_(ACC="f16"))
    for bad, why in [(dict(MAX_M=16), "MAX_M"), (dict(WARPS=2), "WARPS"), (dict(ROWS=8), "ROWS"),
                     (dict(WARPS=16, ROWS=4), "spill"), (dict(LAYOUT="RR", WARPS=16, MAX_M=8), "spill")]:
        problems = FAM.problems(RC.with_(**bad))
        assert any(why in p for p in problems), (bad, problems)
    # the spill rules are per layout: RR at 16 warps of 4 rows builds, RC at MAX_M 8 too
    assert FAM.valid(RR.with_(WARPS=16, ROWS=4, MAX_M=4)) and FAM.valid(RC.with_(WARPS=16, MAX_M=8))
    space = _space()
    assert len(space) == 2 * 36 - 7 and all(FAM.valid(c, a) for c in space for a in FAM.arches)


def test_accepts():
    for c in (RC, RR):
        m = c.get("MAX_M")
        assert all(FAM.accepts(c, M, 4096, 4096) for M in range(0, m + 1))    # odd M too
        assert not FAM.accepts(c, m + 1, 4096, 4096)
        assert not FAM.accepts(c, 1, 4096, 4100) and FAM.accepts(c, 1, 4096, 8)
        assert FAM.accepts(c, 1, 4096, 0) and not FAM.accepts(c, -1, 4096, 4096)
        assert FAM.serves(c, 3, 4096, 4096)                       # any_shape: no tile rule
    assert FAM.accepts(RC, 1, 4095, 4096) and not FAM.accepts(RR, 1, 4095, 4096)   # RR: N % 8
    one = RC.with_(MAX_M=1)
    assert FAM.accepts(one, 1, 11008, 4096) and not FAM.accepts(one, 2, 11008, 4096)


def test_names_are_unique_and_file_safe():
    space = _space()
    names = [c.name() for c in space]
    assert len(set(names)) == len(names)
    assert RC.name() == "gemv_sm80_f32_rc_m8_w8_r2" and RR.name() == "gemv_sm80_f32_rr_m8_w8_r2"


def test_options_per_arch():
    """The Family declares sm_90a's options (what the planner sweeps); an sm_80 build's meta lists
    splits 1 only (no cluster), and the harness rejects any other value against that meta."""
    assert FAM.option_decls(RC) == gemv_options(RC.as_dict(), "sm_90a")
    assert FAM.options(RC) == {"splits": [1, 2, 4, 8], "unroll": [2, 4, 8]}
    assert FAM.option_defaults(RC) == {"splits": 1, "unroll": 4}
    assert gemv_options(RC.as_dict(), "sm_80") == [("splits", (1,), 1), ("unroll", (2, 4, 8), 4)]
    space = FAM.option_space(RC)
    assert space[0] == {"splits": 1, "unroll": 4} and len(space) == 12
    assert FAM.option_problems(RC, {"splits": 3}) and FAM.option_problems(RC, {"unroll": 16})
    assert FAM.option_problems(RC, {"splits": 8, "unroll": 2}) == []


def test_shape_of_work():
    p = RC.as_dict()                  # 8 warps of 2 rows: 16 columns, 256 threads
    assert gemv_tile_cols(p) == 16 and gemv_threads(p) == 256
    assert gemv_smem_bytes(p, 1) == 0 and gemv_smem_bytes(p, 4) == 4 * 8 * 16
    assert gemv_inflight_bytes(p, 4) == 16 * 4 * 2 * 256
    q = RR.as_dict()                  # 16 threads along N (128 columns) by 16 along K
    assert gemv_tile_cols(q) == 128 and gemv_threads(q) == 256
    assert gemv_smem_bytes(q, 1) == 256 * 8 * 4 * 4 == 32768          # 4 rows of m per round
    assert gemv_smem_bytes(q, 2) == 32768 + 4 * 8 * 128
    assert gemv_inflight_bytes(q, 8) == 16 * 8 * 256
    assert all(gemv_smem_bytes(c.as_dict(), 8) <= 48 * 1024 for c in _space())   # no opt-in


def test_instantiation_has_the_banner():
    text = instantiate(RC)
    assert text.startswith("// cudal2 kernel, family gemv (style gemv), instantiated from "
                           "cudal2/templates/gemv_hgemm.cuh")
    assert RC.label() in text.splitlines()[1] and "// targets: sm_80, sm_90a" in text
    for line in ("#define MAX_M 8\n", "#define WARPS 8\n", "#define ROWS 2\n", "#define LAYOUT_RC 1\n",
                 "#define ACC_F16 0\n"):
        assert line in text
    assert "#define LAYOUT_RC 0\n" in instantiate(RR) and not re.search(r'^\s*#\s*include\s*"', text, re.M)


# ---- the work split (gemv_work, the kernel's persistent grid replayed) -------------------------
def _check_split(M, N, K, p, splits, slots):
    """The split's invariants; returns the work list."""
    work = gemv_work(M, N, K, p, splits, slots)
    assert work == gemv_work(M, N, K, p, splits, slots)                 # deterministic
    if M == 0 or N == 0:
        assert work == []
        return work
    s, BN = run_splits(K, splits), gemv_tile_cols(p)
    tiles = -(-N // BN)
    clusters = min(tiles, slots // s)
    ctas = [w[0] for w in work]
    assert ctas == sorted(ctas) and set(ctas) == set(range(clusters * s))   # launch order, none empty
    a = np.array(work, dtype=np.int64)
    assert (a[:, 2] % 8 == 0).all() and (a[:, 3] % 8 == 0).all()
    if K >= 8:
        assert (a[:, 3] > a[:, 2]).all()                                  # no empty K range
    # each CTA's tiles: its cluster's, in loop order (t, t + clusters, ...); the same K range
    for cta in range(0, clusters * s, max(1, clusters * s // 7)):
        mine = a[a[:, 0] == cta]
        assert list(mine[:, 1]) == list(range(cta // s, tiles, clusters))
        assert len(set(map(tuple, mine[:, 2:]))) == 1
    # every tile: exactly s ranks whose K ranges partition [0, K) in order
    order = np.lexsort((a[:, 2], a[:, 1]))
    b = a[order]
    assert (np.bincount(b[:, 1], minlength=tiles) == s).all()
    starts, ends = b[:, 2].reshape(tiles, s), b[:, 3].reshape(tiles, s)
    assert (starts[:, 0] == 0).all() and (ends[:, -1] == K).all()
    assert (starts[:, 1:] == ends[:, :-1]).all()
    assert (tiles - 1) * BN < N <= tiles * BN                             # the tiles cover N
    return work


def _coverage(N, K, p, work):
    """Times each (output column n < N, 8-wide K chunk) is computed by the work list."""
    BN = gemv_tile_cols(p)
    count = np.zeros((-(-N // BN) * BN, max(K // 8, 1)), np.int32)
    for _, t, k0, k1 in work:
        count[t * BN:(t + 1) * BN, k0 // 8:k1 // 8] += 1
    return count[:N, :K // 8]


@pytest.mark.parametrize("N,K", DECODE)
def test_work_split_on_decode_shapes(N, K):
    combos = [(RC, 1), (RC, 8), (RR, 4), (RC.with_(WARPS=4, ROWS=1, MAX_M=1), 2)]
    for cfg, splits in combos:
        p = cfg.as_dict()
        first = _check_split(1, N, K, p, splits, 132 * 3)
        assert len({w[0] for w in first}) == min(-(-N // gemv_tile_cols(p)), 132 * 3 // splits) * splits
        for M in range(2, 9):        # the split does not depend on M
            assert gemv_work(M, N, K, p, splits, 132 * 3) == first
    # slots that no cluster count divides, and fewer slots than tiles
    _check_split(5, N, K, RR.as_dict(), 8, 133)
    _check_split(7, N, K, RC.as_dict(), 2, 7)


RESIDUE = [(1, 100, 264), (3, 8, 8), (8, 200, 8), (5, 136, 2056), (2, 8, 24), (7, 1000, 72),
           (1, 72, 0), (0, 64, 64), (4, 0, 64), (6, 4104, 520)]


@pytest.mark.parametrize("cfg", [RC, RR, RC.with_(WARPS=16, ROWS=1, MAX_M=2)], ids=lambda c: c.name())
def test_work_split_covers_every_column_and_chunk_once(cfg):
    """Residues: N not a multiple of BN, K not a multiple of 8 x 32 x unroll, K = 8 (every split
    count clamps to 1), N = 8, fewer chunks than splits (clamped to a power of two), K = 0, empty
    outputs; slots small and large."""
    p = cfg.as_dict()
    for M, N, K in RESIDUE:
        if p["LAYOUT"] == "RR" and N % 8:
            continue
        for splits in SPLIT_VALUES:
            for slots in (3, 16, 264):
                if slots < splits:
                    continue
                work = _check_split(M, N, K, p, splits, slots)
                if M and N and K:
                    assert (_coverage(N, K, p, work) == 1).all(), (M, N, K, splits, slots)
                elif M and N:       # K == 0: one split, every tile once with an empty range
                    assert run_splits(K, splits) == 1 and all(w[2:] == (0, 0) for w in work)
    assert run_splits(8, 8) == 1 and run_splits(24, 8) == 2 and run_splits(64, 8) == 8
    assert [rank_chunks(72, 8, q) for q in range(8)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5),
                                                        (5, 6), (6, 7), (7, 9)]
    with pytest.raises(ValueError, match="no cluster"):
        gemv_work(1, 64, 4096, p, 8, 7)


# ---- the arithmetic, emulated in the kernel's order ---------------------------------------------
def _operands(M, N, K, layout, seed):
    rng = np.random.default_rng(seed)
    A = (rng.random((M, K)) * 2 - 1).astype(np.float16)
    W = (rng.random((N, K)) * 2 - 1).astype(np.float16)          # the nn.Linear weight, N x K
    return A, W, (W if layout == "RC" else np.ascontiguousarray(W.T))


def _tolerance(ref, K):
    """One fp16 rounding of the output plus fp32 accumulation over K terms in [-1, 1)."""
    return np.abs(ref) * 2.0 ** -10 + 2.0 ** -14 * (1 + math.sqrt(K)) + K * 2.0 ** -23


@pytest.mark.parametrize("cfg", [RC, RR], ids=lambda c: c.name())
def test_emulation_matches_a_float64_reference_and_repeats_bit_for_bit(cfg):
    p = cfg.as_dict()
    shapes = [(1, 40, 264), (3, 136, 2056), (8, 24, 8), (5, 200, 72), (7, 16, 4096), (2, 8, 16)]
    for M, N, K in shapes:
        A, W, B = _operands(M, N, K, p["LAYOUT"], M * 131 + K)
        ref = A.astype(np.float64) @ W.astype(np.float64).T
        for splits in SPLIT_VALUES:
            C = gemv_emulate(A, B, p, splits, 4)
            assert C.dtype == np.float16 and C.shape == (M, N)
            err = np.abs(C.astype(np.float64) - ref)
            assert (err <= _tolerance(ref, K)).all(), (M, N, K, splits, float(err.max()))
            again = gemv_emulate(A, B, p, splits, 8)             # unroll does not change the order
            assert again.tobytes() == C.tobytes()


@pytest.mark.parametrize("layout", ["RC", "RR"])
def test_emulation_follows_the_kernels_order(layout):
    """Terms whose fp32 sum depends on the order: thread 0's first chunk holds 2048 then seven
    terms of 2^-14, each lost against 2048 (half an ulp is 2^-13); thread 1's chunk (the next
    lane, RC; the next tk, RR) holds -2048. In the kernel's order the result is 0; the exact sum,
    7 x 2^-14, is an fp16 normal number."""
    p = FAM.default().with_(LAYOUT=layout, MAX_M=1).as_dict()
    K, N = 8 * 64, 8
    A = np.ones((1, K), np.float16)
    W = np.zeros((N, K), np.float16)
    W[:, 0], W[:, 1:8], W[:, 8] = 2048, 2.0 ** -14, -2048
    B = W if layout == "RC" else np.ascontiguousarray(W.T)
    ref = A.astype(np.float64) @ W.astype(np.float64).T
    assert (ref == 7 * 2.0 ** -14).all() and float(np.float16(ref[0, 0])) > 0
    for splits in (1, 2):             # both chunks on one rank in either case (64 chunks)
        assert (gemv_emulate(A, B, p, splits, 4) == 0).all(), splits


# ---- builds (nvcc, no GPU) ---------------------------------------------------------------------
# the defaults on both arches; two corners on sm_90a: RC at 16 warps and MAX_M 8 (128 registers,
# the spill edge) and RR at 16 warps of 4 rows (512 threads, the most K threads)
CASES = [pytest.param(c, a, id=f"{c.name()}-{a}") for c in (RC, RR) for a in ("sm_90a", "sm_80")] + [
    pytest.param(c, "sm_90a", id=f"{c.name()}-sm_90a") for c in
    (RC.with_(WARPS=16, ROWS=2, MAX_M=8), RR.with_(WARPS=16, ROWS=4, MAX_M=4))]


@pytest.fixture(scope="module")
def prebuilt(prebuild):
    """Every case built at once where the run is one process (conftest's prebuild); the tests
    read the build cache."""
    prebuild(FAM.build_spec(p.values[0], p.values[1]) for p in CASES)


def _build(cfg, arch):
    from cudal2.core.build import build
    r = build(FAM.build_spec(cfg, arch))
    assert r.ok, f"{cfg.label()} on {arch}: {r.status}\n{r.log[-3000:]}"
    return r


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_builds_without_spills(cfg, arch, prebuilt):
    from cudal2.core.toolchain import find_cuobjdump
    from cudal2.harness.audit import undefined_symbols
    r = _build(cfg, arch)
    assert r.spills == 0 and max(x.stack_bytes for x in r.resources) == 0, r.resources
    # minBlocks 1: one CTA's threads fit the register file
    assert max(x.registers for x in r.resources) <= 65536 // gemv_threads(cfg.as_dict())
    ptx = r.ptx_path.read_text()
    entries = re.findall(r"\.entry\s+(\w+)", ptx)
    assert sorted(entries) == sorted(f"_ZN11cudal2_gemv11gemv_kernelILi{u}EEEvNS_6ParamsE"
                                     for u in UNROLL_VALUES), entries     # one kernel per unroll
    # B: 16-byte no-L1 loads under an L2 evict-first policy; fp32 FMA, no tensor core
    assert "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32" in ptx
    assert "createpolicy.fractional.L2::evict_first.b64" in ptx and "fma.rn.f32" in ptx
    assert "mma.sync" not in ptx and "wgmma" not in ptx
    assert ("shfl.sync.bfly" in ptx) == (cfg.get("LAYOUT") == "RC")
    cluster = arch == "sm_90a"        # the K split's reduction through distributed shared memory
    for needle in ("barrier.cluster.arrive.release", "mapa.shared::cluster", "ld.shared::cluster.f32"):
        assert (needle in ptx) == cluster, needle
    assert not [s for s in undefined_symbols(r.so_path) if "Memset" in s or "Memcpy" in s]
    tool = find_cuobjdump()
    if tool:
        sass = subprocess.run([tool, "-sass", str(r.so_path)], capture_output=True, text=True,
                              check=True).stdout
        assert re.search(r"\bFFMA\b", sass) and not re.search(r"\bHMMA\b", sass)


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES[:4])
def test_meta_and_refusals(cfg, arch, prebuilt):
    """Host-side: the meta, cudal2_workspace and every refusal come before any device access
    (fake, aligned pointers that are never dereferenced)."""
    from cudal2.core.abi import load_library, meta_problems
    lib = load_library(_build(cfg, arch).so_path)
    m, p = lib.meta, cfg.as_dict()
    assert meta_problems(m, arch) == []
    rc = p["LAYOUT"] == "RC"
    assert m["abi"] == 2 and m["family"] == m["style"] == "gemv" and m["acc"] == "f32"
    assert m["arch"] == arch and m["layout"] == p["LAYOUT"] and m["params"] == p
    assert m["tile"] == [p["MAX_M"], gemv_tile_cols(p), 8] and m["max_m"] == p["MAX_M"]
    assert m["threads"] == gemv_threads(p) and m["warps"] == p["WARPS"] and m["any_shape"] is True
    assert m["divisible"] == [1, 1 if rc else 8, 8] and m["workspace_bytes"] == 0
    assert "workspace_zero_init" not in m
    assert m["smem_bytes"] == gemv_smem_bytes(p, 1)
    cluster = arch == "sm_90a"
    assert m["cluster_splitk_max"] == (8 if cluster else 0)
    assert m["cluster_smem_bytes"] == (gemv_smem_bytes(p, 2) - gemv_smem_bytes(p, 1) if cluster else 0)
    assert [(o["name"], tuple(o["values"]), o["default"]) for o in m["options"]] == gemv_options(p, arch)
    for o in ({}, {"splits": 8 if cluster else 1, "unroll": 2}):
        assert lib.workspace_bytes(8, 4096, 4096, lib.options(o)) == 0
    P = 1 << 20
    M = p["MAX_M"]

    def call(M=M, N=4096, K=4096, lda=4096, ldb=None, ldc=None, a=P, b=P, c=P, options=None):
        ldb = ldb or (K if rc else N)
        return lib.launch(a, b, c, M, N, K, lda, ldb, ldc or max(N, 1), 0, 0, 0, options)
    assert call(0) == 0 and call(N=0) == 0                   # nothing to do: success, no launch
    assert call(M + 1) == INVALID_VALUE                      # beyond MAX_M
    assert call(-1) == INVALID_VALUE and call(N=-8) == INVALID_VALUE and call(K=-8) == INVALID_VALUE
    assert call(K=4100, lda=4104, ldb=4104) == INVALID_VALUE   # K % 8
    assert call(0, K=12, lda=16, ldb=16) == INVALID_VALUE      # ... even for an empty output
    if not rc:
        assert call(N=4100, ldb=4104) == INVALID_VALUE and call(0, N=4100, ldb=4104) == INVALID_VALUE
    assert call(a=P + 2) == INVALID_VALUE and call(b=P + 8) == INVALID_VALUE   # not 16-byte aligned
    assert call(lda=4100) == INVALID_VALUE and call(ldb=4100) == INVALID_VALUE  # ld % 8
    assert call(lda=4088) == INVALID_VALUE and call(ldb=(4088)) == INVALID_VALUE  # ld too small
    assert call(a=0) == INVALID_VALUE and call(b=0) == INVALID_VALUE
    assert call(c=0) == INVALID_VALUE and call(ldc=4095) == INVALID_VALUE and call(c=P + 1) == INVALID_VALUE
    for bad in ((3, 4), (16, 4), (1, 3), (1, 1), (1, 16)):
        assert call(options=(ctypes.c_int * 2)(*bad)) == INVALID_VALUE, bad
    if not cluster:                                          # no cluster: splits 1 only
        for s in (2, 4, 8):
            assert call(options=(ctypes.c_int * 2)(s, 4)) == INVALID_VALUE


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES[:4])
def test_one_launch_with_the_replicas_grid(cfg, arch, prebuilt, fake_launches):
    """Against a fake CUDA runtime (132 SMs, 2 CTAs per SM, 16 resident clusters): one launch, no
    memset; splits 1 is a plain launch of min(tiles, 264) CTAs (gemv_work's CTAs at 264 slots);
    splits s > 1 a cluster launch (cudaLaunchKernelEx, cluster (s, 1, 1)) of min(tiles, 16)
    clusters; K < 8 * splits runs fewer splits; an sm_80 build refuses splits > 1."""
    p = cfg.as_dict()
    N, K = 4096, 4096                 # the fake calls with lda = ldb = K: N <= K for RR
    calls = [[1, N, K, None, 0], [8, N, K, [1, 2], 0], [3, 100 * 8, K, [2, 8], 0],
             [1, N, K, [4, 4], 0], [2, N, K, [8, 8], 0], [1, 16, 24, [8, 4], 0], [1, 8, 8, [8, 4], 0],
             [0, N, K, [1, 4], 0], [1, 8, 0, None, 0]]
    got = fake_launches(_build(cfg, arch).so_path, calls)
    assert all(g["memsets"] == 0 and g["need"] == 0 for g in got), got
    cluster = arch == "sm_90a"
    for (M, n, k, opts, _), g in zip(calls, got):
        splits = (opts or [1, 4])[0]
        if M == 0:
            assert g["rc"] == 0 and g["launches"] == 0
            continue
        if splits > 1 and not cluster:
            assert g["rc"] == INVALID_VALUE and g["launches"] == 0, g
            continue
        s = run_splits(k, splits)
        work = gemv_work(M, n, k, p, s, 264 if s == 1 else 16 * s)
        ctas = len({w[0] for w in work})
        assert g["rc"] == 0 and g["launches"] == 1, g
        assert g["grid"] == [ctas, 1, 1] and g["cluster"] == [s, 1, 1], (opts, g)
        assert g["ex"] == (1 if s > 1 else 0), g


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES[:4])
def test_guard_passes_what_the_meta_claims_without_a_device(cfg, arch, prebuilt):
    """The launcher's guard, called in a worker that sees no GPU (metacheck.probe_guard: lda = K,
    ldb = N, so N = K for RC): every served decode shape gets past it to the runtime, which answers
    no device (never a guess); M > MAX_M and K % 8 are refused."""
    from cudal2.harness.metacheck import NO_DEVICE, probe_guard
    from cudal2.harness.worker import WorkerPool
    m = cfg.get("MAX_M")
    served = [(1, 4096, 4096), (m, 8192, 8192), (3 if m >= 3 else 1, 14336, 14336), (1, 8, 8)]
    refused = [(m + 1, 4096, 4096), (1, 4100, 4100)]
    with WorkerPool(max_tasks=1, device="") as pool:
        out = pool.run(probe_guard, str(_build(cfg, arch).so_path), served + refused, timeout_s=60)
    assert out.status == "ok", out.detail
    assert all(rc in NO_DEVICE for rc in out.value[:len(served)]), out.value
    assert out.value[len(served):] == [INVALID_VALUE] * len(refused)


@pytest.mark.compile
def test_passes_the_harness_audit(prebuilt):
    from cudal2.core.abi import load_library
    from cudal2.harness.audit import audit_build
    spec = FAM.build_spec(RC, "sm_90a")
    r = _build(RC, "sm_90a")
    res = audit_build(spec.source, r, "sm_90a", name=RC.label(), meta=load_library(r.so_path).meta)
    assert res.ok, res.reasons
    assert not res.mma, "a CUDA-core kernel issues no tensor-core instruction"


# ---- correctness on a GPU ----------------------------------------------------------------------
GPU_CASES = [RC, RR]   # the defaults (MAX_M 8): every M of a decode step
GPU_SHAPES = [(M, 4096, 4096) for M in range(1, 9)] + [
    (1, 4095, 4096), (3, 1000, 72), (5, 136, 2056), (7, 11008, 8), (2, 8, 8), (8, 72, 8200),
    (4, 6144, 24), (1, 200, 0), (0, 64, 64), (6, 40, 264)]


def _gpu_lib(cfg):
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    arch = detect_arch()
    if arch not in FAM.arches:
        pytest.skip(f"gemv does not target {arch}")
    return load_library(_build(cfg, arch).so_path), arch


def _call(lib, a, b, c, M, N, K, opts):
    import torch
    return lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, a.stride(0) if M else K,
                      b.stride(0), c.stride(0) if M else N, 0, 0,
                      torch.cuda.current_stream().cuda_stream, opts)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: c.name())
def test_matches_torch_for_every_m_and_option(cfg):
    """Every splits x unroll option the build lists on decode (M = 1..8), residue N and K, K = 0
    and an empty output, against a float64 reference (test_templates._run: padding and inputs
    checked too); padded C (odd ldc: scalar stores)."""
    from test_templates import _run
    lib, arch = _gpu_lib(cfg)
    meta = lib.meta
    decls = gemv_options(cfg.as_dict(), arch)
    for M, N, K in GPU_SHAPES:
        if not FAM.accepts(cfg, M, N, K):
            continue
        for splits in decls[0][1]:
            for unroll in decls[1][1]:
                _run(lib, meta, M, N, K, options={"splits": splits, "unroll": unroll})
    _run(lib, meta, 5, 200, 72, ldc=203)
    _run(lib, meta, 8, 4096, 4096, lda=4104, ldb=(4104 if meta["layout"] == "RC" else 4112))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: c.name())
def test_bits_are_the_emulations_and_repeat(cfg):
    """The kernel's fp16 output equals gemv_emulate bit for bit (its fp32 products are exact, so
    the same order gives the same bits) for every option on residue shapes; three calls of one
    call are bit-identical."""
    import torch
    lib, arch = _gpu_lib(cfg)
    p = cfg.as_dict()
    decls = gemv_options(p, arch)
    for M, N, K in [(1, 136, 2056), (8, 200, 264), (3, 40, 8), (5, 1000, 4096)]:
        A, W, B = _operands(M, N, K, p["LAYOUT"], M + N + K)
        a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
        for splits in decls[0][1]:
            for unroll in decls[1][1]:
                opts = lib.options({"splits": splits, "unroll": unroll})
                outs = [torch.empty(M, N, device="cuda", dtype=torch.float16) for _ in range(3)]
                for c in outs:
                    assert _call(lib, a, b, c, M, N, K, opts) == 0
                torch.cuda.synchronize()
                want = gemv_emulate(A, B, p, splits, unroll)
                got = outs[0].cpu().numpy()
                assert got.tobytes() == want.tobytes(), (M, N, K, splits, unroll)
                assert all(torch.equal(outs[0], c) for c in outs[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: c.name())
def test_cuda_graph_replays_the_same_bits_and_m_beyond_max_m_is_refused(cfg):
    """One launch, no allocation or sync: captured in a CUDA graph (the most splits the build
    lists), the graph's replays give the eager call's bits; M = MAX_M + 1 with real operands is
    cudaErrorInvalidValue and leaves C untouched."""
    import torch
    lib, arch = _gpu_lib(cfg)
    p = cfg.as_dict()
    M, N, K = 5, 6144, 4096
    A, W, B = _operands(M, N, K, p["LAYOUT"], 7)
    a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    opts = lib.options({"splits": gemv_options(p, arch)[0][1][-1], "unroll": 8})
    eager = torch.empty(M, N, device="cuda", dtype=torch.float16)
    assert _call(lib, a, b, eager, M, N, K, opts) == 0
    out = torch.zeros(M, N, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        assert _call(lib, a, b, out, M, N, K, opts) == 0
    for _ in range(3):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    big = p["MAX_M"] + 1
    a9 = torch.randn(big, K, device="cuda", dtype=torch.float16)
    c9 = torch.full((big, N), -7.0, device="cuda", dtype=torch.float16)
    assert _call(lib, a9, b, c9, big, N, K, opts) == INVALID_VALUE
    torch.cuda.synchronize()
    assert bool((c9 == -7.0).all())
