"""The streamk family (cudal2/templates/streamk_hgemm.cuh, issue 51): deep K on few output tiles
in one launch that covers the GPU.

CPU: its rules; the work split of a call (streamk.streamk_work, the kernel's arithmetic replayed)
run in numpy at the deep-K targets and residues: every (tile, k-tile) exactly once, no empty CTA,
partials summed in a fixed order, equal to the product; the budget's figures are the split's; the
planner packs >= 100 candidates per deep-K row, every streamk one within the rule (>= 90% of the
resident slots busy, a reduction no larger than the operands); built with zero spills for sm_90a
and sm_80; against the fake runtime, every call one launch and no memset, the workspace the
caller's (capture-safe). GPU: matches torch at the targets and residues, bit-identical run to run,
the workspace zero after.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from cudal2.core.devices import GPUS
from cudal2.harness.types import Shape
from cudal2.templates import FAMILIES
from cudal2.templates.budget import (DEEPK, SLOTS_BUSY_MIN, as_built, budget, ctas_per_sm,
                                     is_deep_k)
from cudal2.templates.skinny import FIXUP_BATCH, streamk_fixup_batch
from cudal2.templates.streamk import streamk_register_estimate, streamk_work

FAM = FAMILIES["streamk"]
TARGETS = [(128, 64, 12288), (128, 128, 16384), (256, 128, 8192), (1024, 256, 16384),
           (128, 128, 2048)]
# residues: M, N and K off every tile and k-tile
RESIDUES = [(100, 72, 12296), (129, 65, 2056), (1000, 264, 8200), (8, 8, 4104)]
TILES = [(32, 32, 32), (32, 64, 64), (64, 64, 64), (128, 64, 64), (128, 128, 64)]
OPTIONS = [(0, 3), (0, 2), (0, 0), (3, 0), (8, 0), (64, 0)]     # (splits, decomposition)
SLOTS = [132, 264, 114, 4]                                      # H200/H100 at 1 or 2 per SM, tiny


def _coverage(w, tiles: int, k_tiles: int):
    seen = np.zeros((tiles, k_tiles), dtype=np.int64)
    for segs in w.ctas:
        assert segs and all(b < e for _, b, e in segs)            # no empty CTA or segment
        for t, b, e in segs:
            seen[t, b:e] += 1
    assert (seen == 1).all()                                    # every (tile, k-tile) once
    for t, order in enumerate(w.reducers):
        # the contributors of a split tile, in the order they are summed: ascending k
        starts = [next(b for tt, b, _ in w.ctas[c] if tt == t) for c in order]
        assert starts == sorted(starts) and len(set(order)) == len(order), (t, order)


@pytest.mark.parametrize("shape", TARGETS + RESIDUES, ids=lambda s: "x".join(map(str, s)))
def test_the_work_split_covers_every_iteration_once_in_a_fixed_order(shape):
    M, N, K = shape
    for (BM, BN, BK), (splits, dec), slots in itertools.product(TILES, OPTIONS, SLOTS):
        w = streamk_work(M, N, K, BM, BN, BK, 132, slots, splits, dec)
        tiles, k_tiles = -(-M // BM) * -(-N // BN), -(-K // BK)
        assert (w.tiles, w.k_tiles) == (tiles, k_tiles)
        _coverage(w, tiles, k_tiles)
        if w.mode == "streamk":      # the grid is the resident slots (never more than the work)
            assert len(w.ctas) == min(slots, 2048, tiles * k_tiles)
            sizes = [sum(e - b for _, b, e in s) for s in w.ctas]
            assert max(sizes) - min(sizes) <= 1                 # equal contiguous ranges


def _emulate(A: np.ndarray, B: np.ndarray, w, BM: int, BN: int, BK: int) -> np.ndarray:
    """The kernel's work split in numpy: each CTA's fp32 partial of each segment, a tile with
    one contributor written directly, else the partials summed from 0 in the reducers' order."""
    M, N = A.shape[0], B.shape[1]
    tiles_n = -(-N // BN)
    parts: dict[tuple[int, int], np.ndarray] = {}
    for c, segs in enumerate(w.ctas):
        for t, b, e in segs:
            m0, n0 = t // tiles_n * BM, t % tiles_n * BN
            a = A[m0:m0 + BM, b * BK:e * BK]
            parts[c, t] = a @ B[b * BK:e * BK, n0:n0 + BN]
    C = np.zeros((M, N), dtype=np.float32)
    for t in range(w.tiles):
        m0, n0 = t // tiles_n * BM, t % tiles_n * BN
        order = w.reducers[t] or [c for (c, tt) in parts if tt == t]
        runs = [order[i:i + w.cluster] for i in range(0, len(order), w.cluster)] \
            if w.slabs(t) else [order]
        acc = np.zeros_like(parts[order[0], t])
        for run in runs:        # a cluster's sum (rank order), then the clusters' (slab order)
            part = np.zeros_like(acc)
            for c in run:
                part = part + parts[c, t]
            acc = acc + part
        C[m0:m0 + BM, n0:n0 + BN] = acc
    return C


@pytest.mark.parametrize("shape", [TARGETS[0], TARGETS[2], TARGETS[4], RESIDUES[0], RESIDUES[1]],
                         ids=lambda s: "x".join(map(str, s)))
def test_the_emulated_split_computes_the_product(shape):
    M, N, K = shape
    rng = np.random.default_rng(M * 31 + N * 7 + K)
    A = (rng.random((M, K), dtype=np.float32) * 2 - 1).astype(np.float16).astype(np.float32)
    B = (rng.random((K, N), dtype=np.float32) * 2 - 1).astype(np.float16).astype(np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    for (BM, BN, BK), (splits, dec), cmax in [((32, 64, 64), (0, 3), 8), ((64, 64, 64), (8, 0), 8),
                                              ((128, 64, 32), (0, 0), 8), ((32, 32, 64), (64, 0), 8),
                                              ((32, 32, 64), (64, 0), 0), ((64, 32, 64), (12, 0), 8)]:
        w = streamk_work(M, N, K, BM, BN, BK, 132, 264, splits, dec, cmax)
        C = _emulate(A, B, w, BM, BN, BK)
        again = _emulate(A, B, w, BM, BN, BK)
        assert np.array_equal(C, again)                         # a fixed order: the same bits
        assert np.abs(C - ref).max() <= 1e-5 * np.abs(ref).max() * np.sqrt(K) + 1e-3


def test_the_budget_prices_the_split_it_replays():
    """budget()'s grid, units, k-tiles per CTA and reduction bytes are the work split's."""
    gpu = GPUS["H200"]
    for shape, cfg in itertools.product(TARGETS + RESIDUES, FAM.defaults()):
        p = cfg.as_dict()
        for splits, dec in OPTIONS:
            o = {"splits": splits, "decomposition": dec, "pdl": 0}
            b = budget(cfg, shape, gpu, options=o)
            slots = b.ctas_per_sm * gpu.sms
            assert b.slots == slots
            w = streamk_work(*shape, p["BM"], p["BN"], p["BK"], gpu.sms, slots, splits, dec)
            assert b.grid == b.units == len(w.ctas)
            assert b.decomposition == {"streamk": "stream-K", "splitk": "split-K"}[w.mode]
            per = max(sum(e - bb for _, bb, e in s) for s in w.ctas)
            assert b.wave_terms[0][1] == per * 2.0 * (p["BM"] + p["BN"]) * p["BK"]
            summed = sum(len(r) for r in w.reducers)
            slabs = sum(w.slabs(t) for t in range(w.tiles))
            two = 0 < slabs < summed       # clusters, then their slabs through the workspace
            assert b.reduction_bytes == 2.0 * 4 * p["BM"] * p["BN"] * (slabs if two else summed)
            assert (b.reduction == "none") == (summed == 0)
            assert (b.reduction == "cluster") == (summed > 0 and slabs == 0)
            assert (b.reduction == "cluster+workspace") == two
            assert b.slots_busy == pytest.approx(len(w.ctas) / (b.waves * slots))
            if "workspace" in b.reduction:
                # the last arriver's dependent round trips through L2: a batch of partials (or
                # of clusters' slabs) each in a build whose reducer batches its loads; a partial
                # each in one from before the batch, which reduced no more than a cluster's
                # splits in clusters
                most = max(w.slabs(t) for t in range(w.tiles))
                batch = streamk_fixup_batch(p) if w.mode == "streamk" else FIXUP_BATCH
                assert _trips(b, gpu) == -(-most // batch) + (gpu.dsmem_peer_us / gpu.fixup_peer_us
                                                              if two else 0)
                old = budget(cfg, shape, gpu, options=o, batched=False, two_level=False)
                assert old.reduction == "workspace" and _trips(old, gpu) == max(map(len, w.reducers))


def _trips(b, gpu) -> float:
    """A workspace reduction's dependent round trips, from its time and its bytes."""
    return round((b.t_reduce_us - b.reduction_bytes / gpu.stream_bytes_per_us) / gpu.fixup_peer_us, 6)


def test_a_build_is_replayed_as_it_reduces():
    """budget.as_built: a build whose meta declares its reducer's load batch is priced batched;
    an older build (no "fixup_batch") one partial per round trip; a config (no "params"): today's
    templates, batched."""
    cfg = FAM.default()
    meta = {"family": "streamk", "params": cfg.as_dict(), "cluster_splitk_max": 8,
            "options": [{"name": "decomposition"}]}
    o = {"splits": 16, "decomposition": 2}
    old = {"cluster": True, "batched": False, "two_level": False}
    assert as_built(meta, o) == (o, old)
    new = dict(meta, fixup_batch={"splits": 8, "streamk": 4}, cluster_groups=True)
    assert as_built(new, o) == (o, dict(old, batched=True, two_level=True))
    assert as_built({}, o) == (o, dict(old, batched=True, two_level=True))
    # the older build's 16 splits reduce through the workspace, today's in two clusters of 8
    shape = (128, 64, 12288)
    b_old = budget(cfg, shape, GPUS["H200"], options=o, **as_built(meta, o)[1])
    b_new = budget(cfg, shape, GPUS["H200"], options=o)
    assert (b_old.reduction, b_new.reduction) == ("workspace", "cluster+workspace")
    assert b_new.reduction_bytes == b_old.reduction_bytes / 8


def test_rules_and_where_the_planner_sends_it():
    assert FAM.arches == ("sm_80", "sm_90a") and FAM.instruction == "mma.sync"
    assert "streamk" in DEEPK
    bad = FAM.default().with_(BM=16, WM=16)
    assert any("BM=16" in m for m in FAM.problems(bad))
    assert any("warps" in m for m in FAM.problems(FAM.default().with_(WM=64, WN=64)))
    # any M (not skinny's M <= BM), K % 8 == 0, and N % 8 == 0 for B row-major
    rr, rc = FAM.default(), FAM.default().with_(LAYOUT="RC")
    assert FAM.serves(rr, 1024, 256, 16384) and FAM.serves(rr, 4096, 8, 8)
    assert not FAM.serves(rr, 128, 64, 12290) and not FAM.serves(rr, 128, 66, 4096)
    assert FAM.serves(rc, 128, 66, 4096)
    assert all(is_deep_k(*s) for s in TARGETS)
    assert not is_deep_k(4096, 4096, 4096) and not is_deep_k(128, 64, 1024)
    assert not is_deep_k(2048, 256, 12288)              # 32 tiles: a grid of its own tiles fills more


@pytest.mark.slow
def test_the_plan_packs_a_wide_sweep_within_the_rule_on_every_deep_k_row():
    """`campaign prepare`'s rule (2 configs a family, 8 a shape) over every family on the deep-K
    targets: >= 100 (config, options) screenings a row; every streamk one keeps >= 90% of the
    resident slots busy with a reduction no larger than the operands on both Hoppers, at the
    register estimate and DEEP_K_REGISTER_SPREAD either side (so ptxas's figure keeps it), except
    on a row where fewer than the sweep's count can (128x128x2048: the reduction's bound alone,
    the options that cover the slots ranked first by time); none of them is
    planned on a shape that is not a deep-K row (a large one, a launch-bound one)."""
    import inspect
    from cudal2.runs import campaign
    from cudal2.search import tune
    prep = {k: inspect.signature(campaign.prepare).parameters[k].default
            for k in ("limit_per_shape", "per_family")}
    big, small, targets = Shape(4096, 4096, 4096), Shape(256, 256, 256), [Shape(*t) for t in TARGETS]
    p = tune.plan(targets + [big, small], "sm_90a", layout="RR", **prep)
    assert not [c for c in p.per_shape[big] + p.per_shape[small] if c.family == "streamk"]
    for s in targets:
        cands = p.per_shape[s]
        mine = [c for c in cands if c.family == "streamk"]
        assert sum(len(c.options[s]) for c in cands) >= tune.DEEP_K_SCREENINGS, s
        assert tune.DEEP_K_BUILDS <= len(mine) <= tune.DEEP_K_MAX_BUILDS, s
        relaxed = {s in c.reduction_only for c in mine}
        assert len(relaxed) == 1, s                 # the row's rule, the same for every build
        slots_rule = relaxed == {False}
        for c, o in ((c, o) for c in mine for o in c.options[s]):
            # at the estimate and the spread either side: ptxas's figure keeps it in the rule
            for gpu, regs in itertools.product(("H100", "H200"), tune._registers_around(c.config)):
                b = budget(c.config, s, GPUS[gpu], options=o, registers=regs)
                assert not b.deep_k_problems(slots=slots_rule), (s, c.label, o, gpu, regs)
                assert b.slots_busy >= SLOTS_BUSY_MIN or not slots_rule
                assert b.reduction_bytes <= b.operand_bytes
    relaxed_rows = [s for s in targets if any(s in c.reduction_only for c in p.per_shape[s])]
    assert relaxed_rows == [Shape(128, 128, 2048)]


# ---- builds ----------------------------------------------------------------------------------
# each default for both arches; the widest warp tiles, the deepest rings and BK 32 for sm_90a
# (CUDAL2_STREAMK_ALL=1: the whole space, as `cudal2 templates --build-space streamk` builds it)
_WIDE = [FAM.config(BM=128, BN=128, BK=64, WM=64, WN=32, STAGES=6),
         FAM.config(BM=32, BN=128, BK=64, WM=16, WN=32, STAGES=8, LAYOUT="RC"),
         FAM.config(BM=64, BN=64, BK=32, WM=16, WN=32, STAGES=8),
         FAM.config(BM=128, BN=32, BK=64, WM=32, WN=16, STAGES=4, LAYOUT="RC")]
CASES = ([pytest.param(c, a, id=f"{c.label().split(':')[1]}-{a}") for c in FAM.defaults()
          for a in FAM.arches]
         + [pytest.param(c, "sm_90a", id=f"{c.label().split(':')[1]}-sm_90a") for c in _WIDE])
GPU_CASES = list(FAM.defaults())      # (tools/gpu_session/prefill.py)


def _build(cfg, arch):
    from test_skinny import _build as build_checked      # one way to build a case and say why not
    return build_checked(cfg, arch)


@pytest.mark.compile
@pytest.mark.parametrize("cfg,arch", CASES)
def test_builds_without_spills(cfg, arch):
    from cudal2.harness.audit import undefined_symbols
    r = _build(cfg, arch)
    assert r.spills == 0 and max(x.stack_bytes for x in r.resources) == 0, r.resources
    # the planner's estimate is within the spread it plans over (tune._registers_around)
    from cudal2.search.tune import DEEP_K_REGISTER_SPREAD
    est = streamk_register_estimate(cfg.as_dict())
    assert abs(r.max_registers - est) <= DEEP_K_REGISTER_SPREAD, (r.max_registers, est)
    ptx = r.ptx_path.read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    # B is read again by every row tile: no evict-first policy (skinny's streamed operand has one)
    assert "createpolicy" not in ptx and "atom.global.add.u32" in ptx
    assert ("mapa.shared::cluster" in ptx) == (arch == "sm_90a")   # the cluster reduction
    imports = undefined_symbols(r.so_path)
    assert not [s for s in imports if "Memset" in s or "Memcpy" in s or "Malloc" in s], imports


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_one_launch_no_memset_and_the_callers_workspace(arch, fake_launches):
    """Against the fake runtime (132 SMs, 2 CTAs each): stream-K launches the resident slots,
    split-K (tiles, splits), in a cluster of the splits on sm_90a (no workspace) and through
    the workspace otherwise; M past the tile is served (tiles_m > 1); every call one launch and
    no memset or allocation: what a CUDA graph captures. A split call without the workspace it
    asks for is refused before any launch."""
    from cudal2.core.abi import load_library
    cfg = FAM.default()                          # 64 x 64 tiles
    r = _build(cfg, arch)
    meta = load_library(r.so_path).meta
    assert meta["family"] == "streamk" and meta["workspace_zero_init"] and "max_m" not in meta
    # the reducer's load batches, as the budget prices them (budget.as_built reads the key)
    assert meta["fixup_batch"] == {"splits": FIXUP_BATCH, "streamk": streamk_fixup_batch(cfg.as_dict())}
    calls = [[128, 64, 12288, [0, 3, 0], -1], [128, 64, 12288, [8, 0, 0], -1],
             [128, 64, 12288, [16, 0, 0], -1], [1024, 256, 16384, [0, 0, 0], -1],
             [100, 72, 12296, [0, 3, 0], -1], [128, 64, 12288, [16, 0, 0], 0],
             [128, 64, 12288, [11, 0, 0], -1]]
    got = fake_launches(r.so_path, calls)
    assert all(g["memsets"] == 0 for g in got), got
    assert all(g["rc"] == 0 and g["launches"] == 1 for g in got[:5]), got
    assert got[0]["grid"][:2] == [264, 1] and got[0]["need"] > 0           # stream-K: the slots
    sm90 = arch == "sm_90a"
    assert got[1]["grid"][:2] == [2, 8]                                      # 2 tiles x 8 splits
    assert got[1]["cluster"] == ([1, 8, 1] if sm90 else [1, 1, 1])
    assert (got[1]["need"] == 0) == sm90                                     # DSMEM: no workspace
    assert got[2]["grid"][:2] == [2, 16] and got[2]["need"] > 0              # > 8: the workspace,
    assert got[2]["cluster"] == ([1, 8, 1] if sm90 else [1, 1, 1])           # after 2 clusters
    slabs = 2 if sm90 else 16
    assert got[2]["need"] == -(-slabs * 128 * 64 * 4 // 16) * 16 + 4 * 2
    assert got[3]["grid"][0] in (264, 64)                                    # 16 x 4 tiles
    assert got[4]["grid"][:2] == [264, 1]
    assert got[5]["rc"] != 0 and got[5]["launches"] == 0                     # no workspace given
    # a split count no cluster divides (11): the workspace alone, a slab per split
    assert got[6]["rc"] == 0 and got[6]["launches"] == 1
    assert got[6]["grid"][:2] == [2, 11] and got[6]["cluster"] == [1, 1, 1]
    assert got[6]["need"] == -(-11 * 128 * 64 * 4 // 16) * 16 + 4 * 2
    # under CUDA graph capture the runtime hands each captured graph a zero-init workspace of
    # its own, zeroed in that graph (tests/test_workspaces.py's fake capture): what the
    # stream-K call asks for, two graphs on one capture stream
    from test_workspaces import Graph, workspaces
    ws, rec = workspaces()
    g1, g2 = Graph(), Graph()
    rec.graph = g1
    p1 = ws.get(0, 99, got[0]["need"], zero=meta["workspace_zero_init"])
    rec.graph = g2
    p2 = ws.get(0, 99, got[0]["need"], zero=meta["workspace_zero_init"])
    assert p1 != p2 and [(g, z) for g, z, _ in rec.allocs] == [(g1, True), (g2, True)]


def _gpu_arch(cfg, arch: str) -> str:
    if not FAM.valid(cfg, arch):
        pytest.skip(f"{cfg.label()} does not build for {arch}")
    return arch


GPU_SHAPES = [(128, 64, 12288), (256, 128, 8192), (128, 128, 2048), (100, 72, 12296),
              (129, 65, 2056), (1000, 264, 8200), (8, 8, 8), (1, 8, 0), (0, 64, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda c: c.label().split(":")[1])
def test_matches_torch(cfg):
    import torch
    from cudal2.core.abi import load_library
    from cudal2.core.toolchain import detect_arch
    from test_templates import _run
    lib = load_library(_build(cfg, _gpu_arch(cfg, detect_arch())).so_path)
    meta = lib.meta
    for M, N, K in GPU_SHAPES:
        if FAM.accepts(cfg, M, N, K):
            for splits, dec in OPTIONS:
                _run(lib, meta, M, N, K, options={"splits": splits, "decomposition": dec})
    # bit-identical run to run in every decomposition, the workspace zero after, no memset
    M, N, K = 128, 64, 12288
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    b = w if meta["layout"] == "RC" else w.t().contiguous()
    ref = a.double() @ w.double().t()
    for splits, dec in ((0, 3), (16, 0), (8, 0)):
        opts = lib.options({"splits": splits, "decomposition": dec})
        ws_bytes = lib.workspace_bytes(M, N, K, opts)
        ws = torch.zeros(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
        outs = []
        for _ in range(3):
            c = torch.empty(M, N, device="cuda", dtype=torch.float16)
            assert lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K, b.stride(0), N,
                              ws.data_ptr(), ws_bytes, torch.cuda.current_stream().cuda_stream,
                              opts) == 0
            outs.append(c)
        torch.cuda.synchronize()
        assert all(torch.equal(outs[0], o) for o in outs) and int(ws.count_nonzero()) == 0
        assert (outs[0].double() - ref).abs().max().item() <= 2e-3 * ref.abs().max().item() + 1e-3


def test_space_size_and_registers_bound():
    """The space as enumerated for each arch; the register estimate is the occupancy the budget
    assumes before a build (campaign prepare rechecks with ptxas's)."""
    space = _space()
    assert sum(FAM.valid(c, "sm_90a") for c in space) == len(space) == 680
    assert sum(FAM.valid(c, "sm_80") for c in space) == 626
    p = FAM.default().as_dict()
    assert ctas_per_sm(128, streamk_register_estimate(p), 0, GPUS["H200"])[0] >= 1


def _space() -> list:
    names = sorted(FAM.space())
    out = []
    for values in itertools.product(*(FAM.space()[n] for n in names)):
        for layout in ("RR", "RC"):
            cfg = FAM.default().with_(**dict(zip(names, values)), LAYOUT=layout)
            if any(FAM.valid(cfg, a) for a in FAM.arches):
                out.append(cfg)
    return out


if os.environ.get("CUDAL2_STREAMK_ALL"):
    CASES[:] = [pytest.param(c, a, id=f"{c.label().split(':')[1]}-{a}") for c in _space()
                for a in FAM.arches if FAM.valid(c, a)]
