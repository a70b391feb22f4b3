"""The skinny families (cudal2/templates/skinny_hgemm.cuh, skinny.py): skinny (M <= 64) and its
mirror skinny_n (N <= 64, B column-major, C = (B^T A^T)^T stored transposed): rules, builds (zero
spills, one kernel, mma.sync f32 in the PTX, HMMA in the SASS where cuobjdump is installed), ABI 2
meta, the launcher's refusals, the audit; on a GPU, vs torch on decode, residue and RC shapes.

The covering set is each family's defaults plus the corners of its space (each BM, the widest
warp tile, the deepest pipeline); CUDAL2_SKINNY_ALL=1 builds every valid config of the space
(`cudal2 templates --build-space skinny skinny_n` records the same as a CSV).
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess

import pytest

from cudal2.templates import FAMILIES

FAM, MIRROR = FAMILIES["skinny"], FAMILIES["skinny_n"]
INVALID_VALUE = 1


def _space(fam=FAM) -> list:
    names = sorted(fam.space())
    out = []
    for values in itertools.product(*(fam.space()[n] for n in names)):
        for layout in fam.choices()["LAYOUT"]:
            cfg = fam.default().with_(**dict(zip(names, values)), LAYOUT=layout)
            if fam.valid(cfg):
                out.append(cfg)
    return out


def _covering() -> list:
    if os.environ.get("CUDAL2_SKINNY_ALL"):
        return _space(FAM) + _space(MIRROR)
    # BM = 32 (no default has it) with the deepest, widest-K pipeline of the space; A through
    # registers (A_LOAD regs): a B-only ring of 10 stages, the mirror's, and one that fits sm_80
    return list(FAM.defaults()) + [FAM.config(BM=32, WM=32, BN=64, WN=16, BK=128, STAGES=6,
                                              LAYOUT="RR")] + list(MIRROR.defaults()) + REGS


REGS = [FAM.config(BM=64, WM=16, BN=128, WN=32, BK=64, STAGES=10, A_LOAD="regs"),
        FAM.config(BM=32, WM=16, BN=64, WN=32, BK=64, STAGES=6, LAYOUT="RR", A_LOAD="regs"),
        MIRROR.config(BM=64, WM=32, BN=64, WN=32, BK=128, STAGES=8, A_LOAD="regs")]


def _first_default(cfg) -> bool:
    """Built for every arch the family claims: its first default, and A_LOAD regs where sm_80's
    shared memory holds it."""
    return cfg == FAMILIES[cfg.family].default() or (
        cfg.get("A_LOAD") == "regs" and FAMILIES[cfg.family].valid(cfg, "sm_80"))


# every config for sm_90a; sm_80 (claimed too) for each family's first default, or everything
CASES = [pytest.param(c, a, id=f"{c.family}-{c.label().split(':')[1]}-{a}") for c in _covering()
         for a in (FAMILIES[c.family].arches if _first_default(c) or os.environ.get("CUDAL2_SKINNY_ALL")
                   else ("sm_90a",))]


def test_rules():
    assert FAM.valid(FAM.default()) and FAM.default().get("LAYOUT") == "RC"
    assert all(any(FAMILIES[c.family].valid(c, a) for a in FAMILIES[c.family].arches)
               for c in _covering())
    assert "BM=128" in " ".join(FAM.problems(FAM.config(BM=128))) or FAM.problems(FAM.config(BM=128))
    assert FAM.problems(FAM.config(BM=16, WM=32))            # warp tile taller than the tile
    assert FAM.problems(FAM.config(BM=16, BK=128, BN=64, WN=16, STAGES=6)) == []
    c = FAM.default()
    assert FAM.accepts(c, 1, 4096, 4096) and FAM.accepts(c, 16, 4095, 4096)      # RC: any N
    assert not FAM.accepts(c, 17, 4096, 4096) and not FAM.accepts(c, 8, 4096, 4100)
    assert not FAM.accepts(c.with_(LAYOUT="RR"), 8, 4095, 4096)
    # splits 0 with each decomposition (heuristic, split-K, stream-K), then each split count;
    # pdl 0 only (the kernel timer would see pdl overlap a call of the same kernel)
    space = FAM.option_space(c)
    assert space[0] == {"splits": 0, "decomposition": 0, "pdl": 0} and len(space) == 3 + 16
    assert {"splits": 0, "decomposition": 3, "pdl": 0} in space
    assert {"splits": 4, "decomposition": 3, "pdl": 0} not in space   # stream-K ignores splits
    assert all(o["pdl"] == 0 for o in space)
    assert FAM.option_problems(c, {"splits": 9}) and not FAM.option_problems(c, {"splits": 3})
    assert FAM.option_problems(c, {"splits": 0, "decomposition": 1})
    assert len(_space()) > 100
    # A through registers (A_LOAD regs): the ring holds B alone, two A buffers beside it; a
    # 64x128x64 tile keeps 10 stages (9 of B in flight, 144 KiB) where A in the ring fits 8
    from cudal2.templates.skinny import skinny_smem_bytes
    deep = REGS[0]
    assert FAM.valid(deep, "sm_90a") and not FAM.valid(deep, "sm_80")
    assert skinny_smem_bytes(deep.as_dict()) == (2 * 64 * 72 + 10 * 128 * 72) * 2
    assert FAM.problems(deep.with_(A_LOAD="ring"), "sm_90a")            # 10 stages of A and B
    assert deep.name() == "skinny_sm90a_f32_rc_64x128x64_w16x32_s10_ar"


def test_the_mirror_serves_small_n_with_b_column_major():
    c = MIRROR.default()
    assert MIRROR.valid(c) and MIRROR.choices()["LAYOUT"] == ["RC"] and MIRROR.space() == FAM.space()
    assert c.name() == "skinny_n_sm80_f32_rc_16x128x64_w16x32_s4"
    assert MIRROR.accepts(c, 4096, 16, 4096) and MIRROR.accepts(c, 4095, 1, 8)      # any M
    assert not MIRROR.accepts(c, 4096, 17, 4096) and not MIRROR.accepts(c, 16, 16, 4100)
    assert MIRROR.problems(c.with_(LAYOUT="RR"))                      # row-major B: not served
    assert MIRROR.option_space(c) == FAM.option_space(FAM.default())
    # the same space as skinny's RC half; both refuse 16 warps of 16x64 warp tiles, which sit on
    # the spill edge at 128 registers (found by `cudal2 templates --build-space`)
    assert MIRROR.problems(c.with_(BM=64, WM=16, BN=256, WN=64, STAGES=2))
    assert FAM.problems(FAM.default().with_(BM=64, WM=16, BN=256, WN=64, STAGES=3))
    assert len(_space(MIRROR)) == len([x for x in _space(FAM) if x.get("LAYOUT") == "RC"])


def _build(cfg, arch):
    from cudal2.core.build import build
    r = build(FAMILIES[cfg.family].build_spec(cfg, arch))
    assert r.ok, f"{cfg.label()} on {arch}: {r.status}\n{r.log[-3000:]}"
    return r


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_builds_one_kernel_without_spills(cfg, arch):
    from test_wgmma import _cuobjdump
    from cudal2.harness.audit import undefined_symbols
    from cudal2.templates.skinny import skinny_register_estimate
    r = _build(cfg, arch)
    assert r.spills == 0 and max(x.stack_bytes for x in r.resources) == 0, r.resources
    # the planner's estimate bounds ptxas's figure (an option it admits is not dropped later)
    assert r.max_registers <= skinny_register_estimate(cfg.as_dict()), r.max_registers
    ptx = r.ptx_path.read_text()
    entries = re.findall(r"\.entry\s+(\w+)", ptx)
    assert len(entries) == 1 and "hgemm_kernelILb1" in entries[0], entries   # 16-byte loads only
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "cp.async.cg.shared.global" in ptx and "atom.global.add.u32" in ptx
    # the streamed operand's copies carry the L2 evict-first policy, the small operand's do not:
    # every stage load copies BN rows of B per BM rows of A
    assert "createpolicy.fractional.L2::evict_first.b64" in ptx
    hinted = len(re.findall(r"cp\.async\.cg\.shared\.global\.L2::cache_hint \[", ptx))
    plain = len(re.findall(r"cp\.async\.cg\.shared\.global \[", ptx))
    if cfg.get("A_LOAD") == "regs":   # the ring holds B alone; A comes through L2 into registers
        assert hinted > 0 and plain == 0 and "ld.global.cg.v4" in ptx, (hinted, plain)
    else:
        assert hinted > 0 and plain > 0 and hinted * cfg.get("BM") == plain * cfg.get("BN"), (hinted, plain)
    imports = undefined_symbols(r.so_path)
    assert not [s for s in imports if "Memset" in s or "Memcpy" in s], imports
    tool = _cuobjdump()
    if tool:
        sass = subprocess.run([tool, "-sass", str(r.so_path)], capture_output=True, text=True,
                              check=True).stdout
        assert "HMMA.16816.F32" in sass


def _meta_cases():
    # RC on sm_80 and sm_90a, RR, and the mirror
    return CASES[:3] + [c for c in CASES if c.values[0].family == "skinny_n"][:1]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", _meta_cases())
def test_meta_and_refusals(cfg, arch):
    """Host-side: the meta, cudal2_workspace and every refusal come before any device access.
    The mirror's small dimension is N: its meta says max_n and gives the tile in C's terms."""
    from cudal2.core.abi import load_library
    lib = load_library(_build(cfg, arch).so_path)
    m, p = lib.meta, cfg.as_dict()
    mirror = cfg.family == "skinny_n"
    assert m["abi"] == 2 and m["family"] == cfg.family and m["acc"] == "f32" and m["arch"] == arch
    BM, BN = p["BM"], p["BN"]
    if mirror:
        assert m["max_n"] == BM and "max_m" not in m and m["tile"] == [BN, BM, p["BK"]]
    else:
        assert m["max_m"] == BM and "max_n" not in m and m["tile"] == [BM, BN, p["BK"]]
    assert m["workspace_zero_init"] is True and m["any_shape"] is True
    assert m["divisible"] == [1, 1 if p["LAYOUT"] == "RC" else 8, 8] and m["layout"] == p["LAYOUT"]
    assert [o["name"] for o in m["options"]] == ["splits", "decomposition", "pdl"] and m["params"] == p
    assert m["options"][1] == {"name": "decomposition", "values": [0, 2, 3], "default": 0}
    assert m["options"][2] == {"name": "pdl", "values": [0, 1], "default": 0}
    assert m["pdl"] is (arch == "sm_90a")        # sm_80 builds run pdl 1 as 0
    assert m["cluster_splitk_max"] == (8 if arch == "sm_90a" else 0) and m["streamk"] is True
    rc = p["LAYOUT"] == "RC"
    tiles = -(-4096 // BN)
    # an explicit split count above 8: its flat workspace, or two clusters' slabs where clusters
    # of 8 can be resident (a device); the mirror's tiles run along M
    want = -(-16 * BM * 4096 * 4 // 16) * 16 + 4 * tiles
    two = -(-2 * BM * 4096 * 4 // 16) * 16 + 4 * tiles
    small = (4096, BM) if mirror else (BM, 4096)
    sixteen = lib.workspace_bytes(*small, 4096, lib.options({"splits": 16}))
    assert sixteen == want or (arch == "sm_90a" and sixteen == two)
    assert lib.workspace_bytes(*small, 4096, lib.options({"splits": 1})) == 0
    # 4 splits: the global fixup's workspace, or none where a cluster reduces them (a device)
    four_ws = lib.workspace_bytes(*small, 4096, lib.options({"splits": 4}))
    assert four_ws in (0, -(-4 * BM * 4096 * 4 // 16) * 16 + 4 * tiles) and (four_ws or arch == "sm_90a")
    P = 1 << 20
    four = lib.options({"splits": 16})

    def call(S, big=4096, K=4096, lda=4096, ldb=None, ldc=None, a=P, b=P, c=P, ws=P, wsb=sixteen,
             options=four):
        """S: the small dimension (M, or N for the mirror); big: the other one."""
        M, N = (big, S) if mirror else (S, big)
        ldb = ldb or (K if rc else N)
        return lib.launch(a, b, c, M, N, K, lda, ldb, ldc or max(N, 1), ws, wsb, 0, options)
    assert call(0) == 0 and call(BM, big=0) == 0
    assert call(BM + 1) == INVALID_VALUE                       # the small side beyond the tile
    assert call(-1) == INVALID_VALUE
    assert call(BM, a=P + 2) == INVALID_VALUE                  # not 16-byte aligned
    assert call(BM, b=P + 8) == INVALID_VALUE
    assert call(BM, lda=4100) == INVALID_VALUE                 # ld not a multiple of 8
    assert call(BM, ldb=4100) == INVALID_VALUE
    assert call(BM, ldc=(BM - 1) if mirror else 4095) == INVALID_VALUE
    assert call(BM, wsb=sixteen - 1) == INVALID_VALUE          # too small a workspace
    assert call(BM, ws=P + 4) == INVALID_VALUE                 # misaligned workspace
    assert call(BM, ws=0) == INVALID_VALUE
    bad = (__import__("ctypes").c_int * 3)(9, 0, 0)
    assert call(BM, options=bad) == INVALID_VALUE              # not a listed split count
    bad = (__import__("ctypes").c_int * 3)(0, 1, 0)
    assert call(BM, options=bad) == INVALID_VALUE              # not a listed decomposition
    bad = (__import__("ctypes").c_int * 3)(0, 0, 2)
    assert call(BM, options=bad) == INVALID_VALUE              # pdl is 0 or 1


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_pdl_is_one_launch_attribute_and_a_wait_before_any_global_access(arch, fake_launches):
    """Option pdl 1 (sm_90a): the one launch carries programmatic stream serialisation (with the
    cluster dims where the splits reduce in a cluster, in the same cudaLaunchKernelEx), every
    decomposition; pdl 0 asks for nothing. The kernel's first global access follows
    griddepcontrol.wait; there is no launch_dependents (the next grid waits for this one's end).
    sm_80 builds: no attribute, no wait, pdl 1 runs as 0."""
    import re
    cfg = FAM.default()
    r = _build(cfg, arch)
    calls = [[1, 4096, 4096, [0, 0, 1], -1], [1, 4096, 4096, [0, 2, 1], -1],
             [1, 4096, 4096, [0, 3, 1], -1], [1, 4096, 4096, [16, 0, 1], -1],
             [1, 4096, 4096, [0, 2, 0], -1], [1, 4096, 4096, None, -1]]
    got = fake_launches(r.so_path, calls)
    assert all(g["rc"] == 0 and g["launches"] == 1 and g["memsets"] == 0 for g in got), got
    sm90 = arch == "sm_90a"
    assert [g["pdl"] for g in got] == ([1, 1, 1, 1, 0, 0] if sm90 else [0] * 6), got
    assert [g["ex"] for g in got[:4]] == ([1] * 4 if sm90 else [0] * 4), got
    assert got[1]["cluster"] == ([1, 8, 1] if sm90 else [1, 1, 1])   # 8 splits: cluster + pdl
    ptx = r.ptx_path.read_text()
    assert ("griddepcontrol.wait" in ptx) == sm90 and "griddepcontrol.launch_dependents" not in ptx
    if sm90:   # in each kernel entry the wait comes before the first global load, store or atomic
        for body in re.split(r"\.entry ", ptx)[1:]:
            wait = body.index("griddepcontrol.wait")
            access = r"\b(?:ld|st|atom|red)\.[\w.]*global|\bcp\.async[\w.]*global"
            first = min((m.start() for m in re.finditer(access, body)), default=len(body))
            assert wait < first, body[:200]


@pytest.mark.compile
@pytest.mark.parametrize("fam", [FAM, MIRROR], ids=lambda f: f.name)
def test_passes_the_harness_audit(fam):
    from cudal2.core.abi import load_library
    from cudal2.harness.audit import audit_build
    cfg = fam.default()
    spec = fam.build_spec(cfg, "sm_90a")
    r = _build(cfg, "sm_90a")
    res = audit_build(spec.source, r, "sm_90a", name=cfg.label(), meta=load_library(r.so_path).meta)
    assert res.ok, res.reasons
    assert res.mma, "the audit saw no tensor-core instruction"


# ---- correctness on a GPU -----------------------------------------------------------------
GPU_SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (7, 11008, 4096), (1, 1000, 8), (5, 72, 8200),
              (13, 136, 264), (1, 8, 8), (16, 64, 0), (0, 64, 64)]


def _gpu_arch(cfg, arch: str) -> str:
    """This GPU's arch, or a skip: a family that does not target it, or a config too deep for its
    shared memory (A_LOAD regs' 10-stage ring is an sm_90a build)."""
    if not FAMILIES[cfg.family].valid(cfg, arch):
        pytest.skip(f"{cfg.label()} does not build for {arch}")
    return arch


GPU_CASES = list(FAM.defaults()) + list(MIRROR.defaults()) + REGS   # (tools/gpu_session/prefill.py)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: f"{c.family}-{c.label().split(':')[1]}")
def test_matches_torch(cfg):
    import torch
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    from test_templates import _run
    fam = FAMILIES[cfg.family]
    mirror = fam is MIRROR
    arch = _gpu_arch(cfg, detect_arch())
    lib = load_library(_build(cfg, arch).so_path)
    meta = lib.meta
    # the mirror serves the transposed shapes (N small, M large)
    shapes = [(n, m, k) for m, n, k in GPU_SHAPES] if mirror else GPU_SHAPES
    for M, N, K in shapes:
        for splits in (0, 1, 4, 64):
            if fam.accepts(cfg, M, N, K):
                _run(lib, meta, M, N, K, options={"splits": splits})
    if mirror:
        _run(lib, meta, 200, 9, 72, ldc=11)               # odd ldc: the transposed 2-byte stores
        _run(lib, meta, 8192, min(cfg.get("BM"), 16), 4096)   # LoRA down-projection, rank 16
    else:
        _run(lib, meta, 9, 200, 72, ldc=203)              # odd ldc: scalar stores
    # bit-identical run to run (deterministic fixup), and the workspace reused with no memset
    small, big, K = min(cfg.get("BM"), 8), 4096, 8192
    M, N = (big, small) if mirror else (small, big)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    b = w if meta["layout"] == "RC" else w.t().contiguous()
    opts = lib.options({"splits": 0})
    ws_bytes = lib.workspace_bytes(M, N, K, opts)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")
    outs = []
    for _ in range(3):
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        assert lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, b.stride(0), N,
                          ws.data_ptr(), ws_bytes, torch.cuda.current_stream().cuda_stream,
                          opts) == 0
        outs.append(c)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs) and int(ws.count_nonzero()) == 0
    ref = a.double() @ w.double().t()
    assert (outs[0].double() - ref).abs().max().item() <= 2e-3 * ref.abs().max().item() + 1e-3


def test_max_m_bounds_what_is_served_and_the_edge_shapes():
    from cudal2.core.abi import meta_accepts
    from cudal2.harness.check import edge_shapes
    meta = {"any_shape": True, "tile": [16, 128, 64], "max_m": 16, "divisible": [1, 1, 8]}
    assert meta_accepts(meta, 16, 4097, 4096) and meta_accepts(meta, 1, 8, 8)
    assert not meta_accepts(meta, 17, 4096, 4096) and not meta_accepts(meta, 16, 4096, 4095)
    # the suite's edge shapes near a 16-row target stay at or below max_m
    assert edge_shapes(16, 4096, 4096, (1, 1, 8), 16) == [(15, 4097, 4072), (16, 4095, 4136)]


def test_max_n_bounds_what_the_mirror_serves_and_the_edge_shapes():
    from cudal2.core.abi import meta_accepts
    from cudal2.harness.check import edge_shapes
    meta = {"any_shape": True, "tile": [128, 16, 64], "max_n": 16, "divisible": [1, 1, 8]}
    assert meta_accepts(meta, 4097, 16, 4096) and meta_accepts(meta, 1, 1, 8)
    assert not meta_accepts(meta, 4096, 17, 4096) and not meta_accepts(meta, 4096, 16, 4095)
    # near a 16-column target the suite's edge shapes keep N at or below max_n
    assert edge_shapes(4096, 16, 4096, (1, 1, 8), None, 16) == [(4095, 16, 4072), (4097, 15, 4136)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: f"{c.family}-{c.label().split(':')[1]}")
def test_stream_k_and_cluster_splits_are_exact_and_leave_the_workspace_zero(cfg):
    """Every decomposition on minimal and residue shapes (stream-K, the heuristic, split-K at 2,
    8 (a cluster on sm_90a) and 64 splits, K = 0) against torch; then a 200-call stress run per
    decomposition on one workspace zeroed once: the same bits every call and the workspace zero
    after every call."""
    import torch
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    from test_templates import _run
    fam = FAMILIES[cfg.family]
    arch = _gpu_arch(cfg, detect_arch())
    lib = load_library(_build(cfg, arch).so_path)
    meta = lib.meta
    mirror = fam is MIRROR
    decomps = [{"decomposition": 3}, {"decomposition": 0}, {"splits": 2}, {"splits": 8},
               {"splits": 64}, {"splits": 0, "decomposition": 2}]
    shapes = [(1, 8, 8), (3, 1000, 72), (13, 136, 264), (5, 72, 8200), (1, 6144, 4096), (16, 64, 0)]
    for M, N, K in shapes:
        if mirror:
            M, N = N, M
        if not fam.accepts(cfg, M, N, K):
            continue
        for o in decomps:
            _run(lib, meta, M, N, K, options=o)
    stream = torch.cuda.current_stream().cuda_stream
    small, big, K = min(cfg.get("BM"), 5), 6144, 4096
    M, N = (big, small) if mirror else (small, big)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    b = w if meta["layout"] == "RC" else w.t().contiguous()
    for o in ({"decomposition": 3}, {"decomposition": 0}, {"splits": 8}, {"splits": 64}):
        opts = lib.options(o)
        ws_bytes = lib.workspace_bytes(M, N, K, opts)
        ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
        first = None
        for i in range(200):
            c = torch.empty(M, N, device="cuda", dtype=torch.float16)
            assert lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, b.stride(0), N,
                              ws.data_ptr() if ws_bytes else 0, ws_bytes, stream, opts) == 0
            torch.cuda.synchronize()
            assert int(ws.count_nonzero()) == 0, (o, i)
            if first is None:
                first = c
                ref = a.double() @ w.double().t()
                assert (c.double() - ref).abs().max().item() <= 2e-3 * ref.abs().max().item() + 1e-3, o
            else:
                assert torch.equal(first, c), (o, i)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: f"{c.family}-{c.label().split(':')[1]}")
def test_pdl_sees_the_previous_kernels_writes_in_a_stream_and_in_graphs(cfg):
    """pdl 1 right behind a kernel that rewrites the small operand on the same stream: 200 calls
    alternating two operands, each output the bits pdl 0 gives for its operand (the wait comes
    before any read), the workspace zero after; then two CUDA graphs captured on torch's capture
    stream, each (rewrite, call with pdl 1) on a workspace of its own, replayed in reverse order:
    outputs exact, workspaces zero. Every decomposition that differs: the heuristic, stream-K, a
    cluster split, the global fixup."""
    import torch
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    fam = FAMILIES[cfg.family]
    arch = detect_arch()
    if arch != "sm_90a":
        pytest.skip("programmatic dependent launch needs sm_90 (other builds run pdl 1 as 0)")
    lib = load_library(_build(cfg, arch).so_path)
    mirror = fam is MIRROR
    small, big, K = min(cfg.get("BM"), 5), 6144, 4096
    M, N = (big, small) if mirror else (small, big)
    src = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(2)]
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    b = w if lib.meta["layout"] == "RC" else w.t().contiguous()
    a = torch.empty_like(src[0])

    def call(c, opts, ws, ws_bytes):
        stream = torch.cuda.current_stream().cuda_stream
        assert lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, b.stride(0), N,
                          ws.data_ptr() if ws_bytes else 0, ws_bytes, stream, opts) == 0

    for o in ({}, {"decomposition": 3}, {"splits": 8}, {"splits": 16}):
        opts0, opts1 = lib.options({**o, "pdl": 0}), lib.options({**o, "pdl": 1})
        ws_bytes = lib.workspace_bytes(M, N, K, opts1)
        assert ws_bytes == lib.workspace_bytes(M, N, K, opts0)
        ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
        refs = []
        for s in src:
            a.copy_(s)
            refs.append(torch.empty(M, N, device="cuda", dtype=torch.float16))
            call(refs[-1], opts0, ws, ws_bytes)
        outs = []
        for i in range(200):
            a.copy_(src[i % 2])      # the previous kernel on the stream writes what the call reads
            outs.append(torch.empty(M, N, device="cuda", dtype=torch.float16))
            call(outs[-1], opts1, ws, ws_bytes)
        torch.cuda.synchronize()
        assert int(ws.count_nonzero()) == 0, o
        for i, c in enumerate(outs):
            assert torch.equal(c, refs[i % 2]), (o, i)
        # two graphs on the default capture stream, each with a workspace of its own (zeroed
        # before the capture), replayed in reverse order
        graphs, gouts, gws = [], [], []
        for s in src:
            g = torch.cuda.CUDAGraph()
            out = torch.empty(M, N, device="cuda", dtype=torch.float16)
            buf = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                a.copy_(s)
                call(out, opts1, buf, ws_bytes)
            graphs.append(g)
            gouts.append(out)
            gws.append(buf)
        for _ in range(3):
            for g in reversed(graphs):
                g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(out, ref) for out, ref in zip(gouts, refs)), o
        assert all(int(buf.count_nonzero()) == 0 for buf in gws), o
