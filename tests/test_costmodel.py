"""Cost model: roofline prior, fit, rank correlation, save/load.

All measurements here are SYNTHETIC (generated below from a known hidden law): there is no real
GPU measurement in the repo yet. They test that the machinery fits and ranks, not that the model
is right about any GPU.
"""
import math
from pathlib import Path

import numpy as np
import pytest

from cudal2.search.costmodel import (CostModel, Sample, gpu_for, held_out_rank_correlation,
                              kernel_facts, occupancy, spearman)
from cudal2.harness.types import Evaluation, Shape

GRID = (64, 256, 1024, 4096, 8192)
TILES = [(64, 64, 32, 4, 2), (128, 128, 32, 8, 3), (128, 256, 64, 8, 4), (64, 128, 32, 4, 3),
         (256, 128, 64, 8, 4)]


def _meta(bm, bn, bk, warps, stages, style="mma", splitk=1):
    return {"style": style, "tile": [bm, bn, bk], "warps": warps, "stages": stages,
            "splitk": splitk, "acc": "f32", "layout": "RR"}


def _res(bm, bn, bk, stages):
    return {"registers": 96 + bm * bn // 512, "shared_bytes": stages * (bm + bn) * bk * 2, "spills": 0}


def synthetic_samples(seed=0):
    """SYNTHETIC: 'measured' = prior x a hidden law the prior lacks (big tiles lose 30% on small
    shapes, 3 stages win 15%) x 5% noise."""
    rng = np.random.default_rng(seed)
    prior = CostModel.default()
    out = []
    for M in GRID:
        for N in GRID:
            for K in (256, 4096):
                for bm, bn, bk, w, st in TILES:
                    meta, res = _meta(bm, bn, bk, w, st), _res(bm, bn, bk, st)
                    t = prior.predict_us(meta, res, (M, N, K))
                    if bm * bn >= 128 * 256 and M * N < 1024 * 1024:
                        t *= 1.3
                    if st == 3:
                        t *= 0.85
                    t *= math.exp(rng.normal(0, 0.05))
                    out.append(Sample(meta, res, (M, N, K), t, "H100 (synthetic)"))
    return out


def test_spearman_matches_definition():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get average ranks: ranks a = [1, 2.5, 2.5, 4], b = [1, 2, 3, 4]
    a, b = np.array([1, 2.5, 2.5, 4]), np.array([1, 2, 3, 4.0])
    expect = np.corrcoef(a, b)[0, 1]
    assert spearman([1, 2, 2, 3], [5, 6, 7, 8]) == pytest.approx(expect)
    assert math.isnan(spearman([1, 2], [1, 2]))
    with pytest.raises(ValueError):
        spearman([1, 2, 3], [1, 2])


def test_prior_is_physical():
    m = CostModel.default("H100")
    meta, res = _meta(128, 128, 32, 8, 3), _res(128, 128, 32, 3)
    big = m.predict_us(meta, res, (8192, 8192, 8192))
    # never faster than the tensor peak, never slower than 10x an ideal cuBLAS on a big shape
    assert big >= 2 * 8192 ** 3 / 989.4e6
    assert big < 10 * m.predict_baseline_us((8192, 8192, 8192))
    # more work -> more time; a launch-bound shape costs about the launch
    assert m.predict_us(meta, res, (4096, 4096, 4096)) < big
    assert m.predict_us(meta, res, (64, 64, 64)) == pytest.approx(gpu_for("sm_90a").launch_us, rel=0.5)
    # bandwidth: H200 is faster than H100 on a memory-bound shape, same on compute-bound
    skinny = (64, 16384, 16384)
    assert CostModel.default("H200").predict_baseline_us(skinny) < m.predict_baseline_us(skinny)
    # the baseline prior sits at ~80% of peak on a compute-bound shape
    t = m.predict_baseline_us((16384, 16384, 16384))
    assert 2 * 16384 ** 3 / (t * 1e6) == pytest.approx(0.8 * 989.4, rel=0.02)
    # Hopper's peak is wgmma's: an mma.sync kernel is priced at no more than the ~0.3 of it
    # measured (ptx 290 TFLOP/s at best on the H100); on an A100 mma.sync is the peak's path
    tflops = 2 * 8192 ** 3 / (big * 1e6)
    assert tflops <= 0.31 * 989.4, tflops
    a100 = CostModel.default("A100").predict_us(meta, res, (8192, 8192, 8192))
    assert 2 * 8192 ** 3 / (a100 * 1e6) > 0.4 * 312.0


def test_occupancy_and_facts():
    gpu = gpu_for(gpu="NVIDIA H100 80GB HBM3")
    f = kernel_facts(_meta(128, 128, 32, 8, 3), {"registers": 255, "shared_bytes": 100 * 1024, "spills": 0})
    assert f.threads == 256 and f.stages == 3
    assert occupancy(f, gpu) == 1          # 255 regs x 256 threads fills the register file
    f2 = kernel_facts({"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "STAGES": 2}, None)
    assert (f2.BM, f2.threads, f2.stages) == (64, 128, 2)     # (64/32) x (64/32) warps
    f3 = kernel_facts({"tile": [128, 128, 32], "threads": 256, "smem_bytes": 80000}, {"shared_bytes": 0})
    assert f3.shared_bytes == 80000 and f3.threads == 256     # dynamic smem from the meta
    assert occupancy(f2, gpu) > 1
    with pytest.raises(ValueError):
        gpu_for(gpu="Voodoo2")


def test_fit_improves_held_out_ranking_on_synthetic_data():
    samples = synthetic_samples()
    r = held_out_rank_correlation(samples, holdout=0.3, seed=1, synthetic=True)
    assert r["test"] > 0 and r["train"] > r["test"]
    assert r["spearman"] > 0.9
    assert r["spearman"] >= r["spearman_prior"]
    # the fitted model also beats the prior at ranking candidates *within* a shape, which is
    # what tune uses it for
    fitted = CostModel.fit(samples, synthetic=True)
    assert fitted.synthetic and fitted.n_fit == len(samples)
    shape = (256, 256, 4096)
    rows = [s for s in samples if s.shape == shape]
    truth = [s.median_us for s in rows]
    fit_pred = [fitted.predict_us(s.meta, s.resources, shape) for s in rows]
    assert spearman(fit_pred, truth) >= spearman(
        [CostModel.default().predict_us(s.meta, s.resources, shape) for s in rows], truth)


def _ev(status, median, *, estimated=False, base=None):
    t = {"offline": {"candidate": {"median_us": median}}} if median else {}
    if base:
        t.setdefault("offline", {})["cublaslt_autotuned"] = {"median_us": base}
    return Evaluation(status=status, source_sha="a" * 64, shape=Shape(1024, 1024, 1024), arch="sm_90a",
                      acc="f32", layout="RR", build={"registers": 128, "shared_bytes": 32768, "spills": 0},
                      timings=t, estimated=estimated, meta=_meta(128, 128, 32, 8, 3),
                      env={"gpu": "NVIDIA H100 80GB HBM3 (synthetic)"})


def test_fit_from_evaluations_skips_estimated_and_failed_rows():
    evs = [_ev("ok", 30.0 + i, base=25.0 + i) for i in range(10)]
    evs += [_ev("ok", 1.0, estimated=True), _ev("wrong", 1.0), _ev("not_measured", None)]
    m = CostModel.fit(evs, synthetic=True)
    assert m.n_fit == 10                      # estimated / wrong / unmeasured rows ignored
    assert m.n_fit_baselines == {"cublaslt_autotuned": 10}
    # the baseline correction pulls the ideal-cuBLAS prior toward the measured ~30 us
    assert m.predict_baseline_us((1024, 1024, 1024), "cublaslt_autotuned") == pytest.approx(29.5, rel=0.3)
    assert m.predict_baseline_us((1024, 1024, 1024), "torch") == CostModel.default().predict_baseline_us(
        (1024, 1024, 1024), "torch")


def test_gpu_without_a_spec_takes_the_arch_spec():
    """A campaign on a GPU the model has no spec for (SYNTHETIC rows labelled an L4) falls back to
    the build arch's spec instead of failing after the timing is done."""
    import dataclasses
    evs = [dataclasses.replace(_ev("ok", 30.0 + i, base=25.0 + i), arch="sm_80",
                               env={"gpu": "NVIDIA L4 (synthetic)"}) for i in range(10)]
    assert CostModel.fit(evs, synthetic=True).gpu == "A100"
    assert CostModel.default("NVIDIA L4", arch="sm_90a").gpu == "H100"
    assert CostModel.default("NVIDIA H200", arch="sm_80").gpu == "H200"     # a known name wins
    with pytest.raises(ValueError, match="no GPU spec"):
        CostModel.default("NVIDIA L4")


def test_save_load_roundtrip(tmp_path):
    m = CostModel.fit(synthetic_samples(), synthetic=True)
    p = m.save(tmp_path / "cm.json")
    m2 = CostModel.load(p)
    meta, res = _meta(128, 256, 64, 8, 4), _res(128, 256, 64, 4)
    assert m2.predict_us(meta, res, (4096, 512, 1024)) == pytest.approx(m.predict_us(meta, res, (4096, 512, 1024)))
    assert m2.synthetic
    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="not a cost model"):
        CostModel.load(tmp_path / "bad.json")


def _checked_in_measurement_dbs():
    """results.db (or .db.gz) files that GPU runs committed under reports/<gpu>/ (reports/cpu
    holds none: nothing there is measured)."""
    root = Path(__file__).resolve().parent.parent / "reports"
    return sorted(p for pat in ("results.db", "results.db.gz") for p in root.rglob(pat)
                  if p.relative_to(root).parts[0] != "cpu")


def test_fits_and_predicts_on_checked_in_measurements():
    """The cost model on REAL measurements committed by a GPU run (campaign or bench DBs):
    fit on some shapes, rank the candidates of the others."""
    dbs = _checked_in_measurement_dbs()
    if not dbs:
        pytest.skip("no checked-in GPU measurements under reports/<gpu>/ yet (awaiting a GPU run: "
                    "tools/gpu_session/, docs/gpu_session.md)")
    from cudal2.harness.db import ResultsDB
    evaluations = [ev for p in dbs for ev in ResultsDB(p, readonly=True).rows() if ev.status == "ok" and not ev.estimated]
    if len(evaluations) < 10:
        pytest.skip(f"only {len(evaluations)} measured rows in {[str(p) for p in dbs]}")
    held = held_out_rank_correlation(evaluations, holdout=0.3, seed=0)
    assert held["test"] > 0
    assert np.isfinite(held["spearman"]) and held["spearman"] > 0, held


def test_cv_ridge_keeps_the_prior_when_there_is_nothing_to_learn():
    """SYNTHETIC: with a hidden law (synthetic_samples) cross-validation picks a real correction;
    when 'measured' is the prior times pure noise it picks the strongest ridge (= the prior),
    as it did on the first H100 campaign's data, where the weak-ridge fit ranked held-out
    shapes worse than the prior."""
    from cudal2.search.costmodel import RIDGE_GRID
    law = CostModel.fit(synthetic_samples(), synthetic=True)
    assert law.ridge < RIDGE_GRID[-1]
    rng = np.random.default_rng(3)
    pure = [Sample(s.meta, s.resources, s.shape,
                   CostModel.default().predict_us(s.meta, s.resources, s.shape) * math.exp(rng.normal(0, 0.3)),
                   s.gpu) for s in synthetic_samples()]
    assert CostModel.fit(pure, synthetic=True).ridge == RIDGE_GRID[-1]


def test_prior_explains_large_shapes_on_checked_in_measurements():
    """The raster/L2 traffic term (dram_bytes) on REAL data: on the checked-in GPU campaigns'
    >= 1e12-FLOP rows the analytic prior is within 30% on (geometric) average, and it prefers a
    swizzled raster for a large CUTLASS GEMM (the H100 campaign measured 0.45x of cuBLAS for the
    unswizzled 128x128 tile on 12288x16384x16384)."""
    from cudal2.search.costmodel import samples_from_evaluations
    from cudal2.harness.db import ResultsDB
    from cudal2.templates import FAMILIES
    dbs = _checked_in_measurement_dbs()
    if not dbs:
        pytest.skip("no checked-in GPU measurements under reports/<gpu>/ yet")
    rows = [ev for p in dbs for ev in ResultsDB(p, readonly=True).rows() if ev.status == "ok" and not ev.estimated]
    big = [s for s in samples_from_evaluations(rows, mode="offline")
           if s.who == "candidate" and 2 * math.prod(s.shape) >= 1e12]
    if len(big) < 5:
        pytest.skip(f"only {len(big)} measured rows of >= 1e12 FLOP")
    gpus = {s.gpu for s in big}
    ratios = [math.log(CostModel.default(s.gpu).predict_us(s.meta, s.resources, s.shape) / s.median_us)
              for s in big]
    assert abs(np.mean(ratios)) < math.log(1.3), (gpus, math.exp(np.mean(ratios)))
    cfg = FAMILIES["cutlass_sm90"].default().with_(BM=128, BN=128, BK=64, CLUSTER_M=1, CLUSTER_N=1)
    m, shape = CostModel.default("H100"), (12288, 16384, 16384)
    assert m.predict_us(cfg.with_(SWIZZLE=8), None, shape) < 0.8 * m.predict_us(cfg.with_(SWIZZLE=1), None, shape)


# ---- CUTLASS SM90: clusters, tiles above 128x128, tile order and decomposition (runtime options)
def _cutlass(**changes):
    from cudal2.templates import FAMILIES
    from cudal2.search.tune import config_meta
    cfg = FAMILIES["cutlass_sm90"].default().with_(BM=128, BN=128, CLUSTER_M=1, CLUSTER_N=1)
    return config_meta(cfg.with_(**changes))


def test_cutlass_schedule_replays_cutlass_host_code():
    """cutlass_schedule: CUTLASS clamps max_swizzle_size by the smaller (cluster-padded) tile
    count and pads both tile counts to whole swizzle groups x clusters (padded tiles are
    computed); the heuristic raster walks along M when N has more tiles; the stream-K
    heuristic keeps data-parallel when the tail wave is over half full, else splits."""
    from cudal2.search.costmodel import cutlass_schedule
    def sch(meta, shape, **opts):
        return cutlass_schedule(kernel_facts(meta, None, opts), shape, 132)
    s = sch(_cutlass(), (9 * 128, 9 * 128, 4096), swizzle=8)
    assert (s.log_swizzle, s.tiles_m, s.tiles_n, s.mode) == (3, 16, 16, "dp")   # 9 -> 16: padding
    s = sch(_cutlass(), (5 * 128, 40 * 128, 4096), swizzle=8)
    assert (s.log_swizzle, s.tiles_m, s.along_m) == (2, 8, True)                # min 5 tiles: 4 kept
    assert sch(_cutlass(), (5 * 128, 40 * 128, 4096), swizzle=8, raster=2).along_m is False
    assert sch(_cutlass(), (128, 40 * 128, 4096), swizzle=8).log_swizzle == 0
    assert sch(_cutlass(), (128, 40 * 128, 4096)).grid == 40                    # persistent grid: min(SMs, tiles)
    assert sch(_cutlass(CLUSTER_M=2), (3 * 128, 5 * 128, 4096)).tiles_m == 4    # whole clusters
    sk = _cutlass(SCHEDULER="streamk")
    assert sch(sk, (2304, 2304, 8192)).mode == "streamk"          # 324 tiles: 60-tile tail
    assert sch(sk, (2688, 2304, 8192)).mode == "dp"               # 378 tiles: 114-tile tail
    assert sch(sk, (2688, 2304, 8192), decomposition=3).mode == "streamk"
    assert sch(sk, (2304, 2304, 8192), decomposition=1).mode == "dp"
    s = sch(sk, (2304, 2304, 8192), splits=4)
    assert (s.mode, s.splits) == ("splitk", 4)
    assert sch(sk, (512, 512, 64), splits=8).splits == 1         # one k tile: nothing to split
    assert sch(_cutlass(), (2304, 2304, 8192), splits=4).mode == "dp"   # a persistent build has no splits


def test_prior_knows_clusters_tiles_and_tile_order():
    m = CostModel.default("H100")
    big = (12288, 16384, 16384)
    t = lambda meta, **o: m.predict_us(meta, None, big, o or None)
    # tile order (the runtime options): the first campaign's 128x128 tile lost half its speed
    # to an unswizzled raster on this shape; raster along the wrong dimension costs more
    assert t(_cutlass(), swizzle=8) < 0.7 * t(_cutlass(), swizzle=1)
    assert t(_cutlass(), raster=2) > t(_cutlass(), raster=1) == t(_cutlass())   # heuristic: along M here
    # clusters: multicast shares operand loads, so a 2x1 cluster beats 1x1 with the same tile
    wide = _cutlass(BN=256)
    assert t(_cutlass(BN=256, CLUSTER_M=2), swizzle=8) < t(wide, swizzle=8)
    assert t(_cutlass(BM=256, CLUSTER_N=2), swizzle=8) < t(_cutlass(BM=256), swizzle=8)
    # tiles above 128x128 keep the tensor cores better fed (all else equal: swizzled, big shape)
    assert t(wide, swizzle=8) < t(_cutlass(), swizzle=8)
    # but on a small problem a big tile and a cluster leave SMs idle
    small = (1024, 1024, 1024)
    assert m.predict_us(_cutlass(), None, small) < m.predict_us(_cutlass(BN=256, CLUSTER_M=2), None, small)
    # the meta's declared defaults are what options=None means
    meta = dict(_cutlass(), options=[{"name": "swizzle", "values": [1, 2, 4, 8], "default": 8},
                                     {"name": "raster", "values": [0, 1, 2], "default": 0}])
    assert m.predict_us(meta, None, big) == pytest.approx(t(_cutlass(), swizzle=8))
    assert m.predict_us(meta, None, big, {"swizzle": 1}) == pytest.approx(t(_cutlass()))


def test_prior_knows_stream_k_and_split_k():
    m = CostModel.default("H100")
    sk = _cutlass(SCHEDULER="streamk")
    t = lambda shape, **o: m.predict_us(sk, None, shape, o)
    # wave quantisation: 324 tiles on 132 SMs; stream-K spreads the 60-tile tail
    assert t((2304, 2304, 8192)) < 0.95 * t((2304, 2304, 8192), decomposition=1)
    # 16 output tiles, 256 k tiles each: split-K / stream-K use the idle SMs
    assert t((512, 512, 16384), splits=8, decomposition=2) < 0.5 * t((512, 512, 16384), decomposition=1)
    # a full machine gains nothing from splitting K (partials and fixup cost extra)
    assert t((4096, 4096, 4096), splits=4, decomposition=2) > t((4096, 4096, 4096), decomposition=1)


def test_rank_options_drops_combinations_that_run_the_same_schedule():
    from cudal2.templates import FAMILIES
    fam = FAMILIES["cutlass_sm90"]
    cfg = fam.default().with_(BN=128, CLUSTER_M=1)
    meta = _cutlass()
    m = CostModel.default("H100")
    tiny = m.rank_options(meta, None, (128, 128, 4096), fam.option_space(cfg))
    assert len(tiny) == 1 and tiny[0][1] == {"swizzle": 1, "raster": 0}         # one tile: one schedule
    ranked = m.rank_options(meta, None, (12288, 16384, 16384), fam.option_space(cfg))
    assert [r[0] for r in ranked] == sorted(r[0] for r in ranked)
    assert ranked[0][1]["swizzle"] == 8 and 4 < len(ranked) < 12
    # ABI 1 kernels: the single empty combination
    assert m.rank_options(_meta(128, 128, 32, 8, 3), None, (64, 64, 64), [{}])[0][1] == {}


def test_samples_carry_options_into_fit_and_ranking():
    """A measured row's options reach the features: the same kernel on the same shape at two
    swizzles is two different predictions (SYNTHETIC times)."""
    m = CostModel.default("H100")
    big = (12288, 16384, 16384)
    rows = [Sample(_cutlass(), {}, big, m.predict_us(_cutlass(), None, big, {"swizzle": sw}), "H100 (synthetic)",
                   options={"swizzle": sw}) for sw in (1, 2, 4, 8)]
    assert m.rank_correlation(rows) == pytest.approx(1.0)
    ev = Evaluation(status="ok", source_sha="a" * 64, shape=Shape(*big), arch="sm_90a", acc="f32", layout="RR",
                    build={}, timings={"offline": {"candidate": {"median_us": 9000.0}}}, meta=_cutlass())
    from cudal2.search.costmodel import samples_from_evaluations
    assert samples_from_evaluations([ev])[0].options == {}      # rows without options: the defaults


@pytest.mark.compile
def test_cutlass_schedule_agrees_with_cutlass_workspace_sizes():
    """The decomposition cutlass_schedule replays, checked against CUTLASS's own host code: a
    stream-K build's cudal2_workspace (Gemm::get_workspace_size, on 132 SMs without a GPU) is 0
    for data-parallel, partials of every output tile for split-K, of the stream-K tiles only for
    stream-K."""
    from cudal2.core.abi import load_library
    from cudal2.core.build import build
    from cudal2.search.costmodel import cutlass_schedule
    from cudal2.templates import FAMILIES
    from cudal2.search.tune import config_meta
    fam = FAMILIES["cutlass_sm90"]
    cfg = next(c for c in fam.defaults() if c.get("SCHEDULER") == "streamk")
    r = build(fam.build_spec(cfg, "sm_90a"))
    assert r.ok, r.log[-3000:]
    lib = load_library(r.so_path)
    meta = config_meta(cfg)
    bm, bn = cfg.get("BM"), cfg.get("BN")
    up = lambda x, m: -(-x // m) * m
    checked = set()
    for shape in [(2304, 2304, 8192), (2688, 2304, 8192), (512, 512, 16384), (1000, 1000, 1000),
                  (4096, 4096, 4096), (128, 4096, 4096), (8192, 1024, 512), (777, 3000, 2048)]:
        for opts in fam.option_space(cfg):
            s = cutlass_schedule(kernel_facts(meta, None, opts), shape, 132)
            n = (s.tiles_m * s.tiles_n if s.mode == "splitk" else s.sk_tiles if s.mode == "streamk" else 0)
            want = up(up(n * bm * bn * 4, 128) + up(n * 2 * 4, 128), 16) if n else 0
            got = lib.workspace_bytes(*shape, lib.options(opts))
            assert got == want, (shape, opts, s, got, want)
            checked.add(s.mode)
    assert checked == {"dp", "splitk", "streamk"}


def test_prior_knows_the_skinny_family_and_the_in_kernel_fixup():
    from cudal2.search.costmodel import CostModel, gpu_for, kernel_facts, skinny_splits
    from cudal2.templates import FAMILIES
    cm = CostModel.default(gpu="H100")
    h100 = gpu_for(gpu="H100")
    sk = FAMILIES["skinny"].default()                      # BM 16, BN 128, BK 64, RC
    # the kernel's own split choice: ~2 CTAs per SM over the N tiles, whole BK tiles, <= 64
    # 32 N tiles: 264 / 32 -> 9 splits, 64 k tiles -> 8 per split, which 8 splits cover
    assert skinny_splits(4096, 4096, 128, 64, 132) == 8
    assert skinny_splits(128, 4096, 128, 64, 132) == 64
    assert skinny_splits(4096, 64, 128, 64, 132) == 1
    # decode 1 x 4096 x 4096 split-K: the prior is the streaming budget's time, which reads B
    # once (33.5 MB) no faster than the H100's reachable peak
    from cudal2.templates.budget import budget
    split_k = {"splits": 0, "decomposition": 2}
    t = cm.predict_us(sk, None, (1, 4096, 4096), split_k)
    assert t == pytest.approx(budget(sk, (1, 4096, 4096), h100, options=split_k).t_us)
    assert t > 2 * 4096 * 4096 / h100.stream_bytes_per_us
    # bandwidth-bound: 16 rows cost about what one row does
    assert cm.predict_us(sk, None, (16, 4096, 4096), split_k) < 1.15 * t
    assert kernel_facts(sk).skinny and kernel_facts(sk).fixup_in_kernel
    # an mma split-K build reducing in the kernel pays no second launch but its last CTA's read
    # of the peers' partial tiles; an old one (a meta with a workspace and no zero-init
    # declaration) paid half a launch for its reduce kernel
    mma = FAMILIES["mma"].default().with_(SPLITK=4)
    new = {"style": "mma", "tile": [128, 128, 32], "splitk": 4, "workspace_bytes": 1,
           "workspace_zero_init": True, "threads": 128, "stages": 3}
    old = {k: v for k, v in new.items() if k != "workspace_zero_init"}
    shape = (128, 128, 8192)
    from cudal2.search.costmodel import FIXUP_SM_GBPS
    fixup_us = 8.0 * 128 * 128 * 3 / (FIXUP_SM_GBPS * 1e3)
    a100 = CostModel.default(gpu="A100")                    # no cluster: the workspace fixup
    diff = a100.predict_us(new, None, shape) - a100.predict_us(old, None, shape)
    assert abs(diff - (fixup_us - 0.5 * gpu_for(gpu="A100").launch_us)) < 1e-9, diff
    assert kernel_facts(mma).fixup_in_kernel and not kernel_facts(old).fixup_in_kernel
    # on an H100 <= 8 splits reduce inside a cluster through DSMEM: cheaper than through L2
    diff = cm.predict_us(new, None, shape) - cm.predict_us(old, None, shape)
    assert diff < fixup_us - 0.5 * h100.launch_us, diff


def test_prior_prices_the_mirror_as_the_skinny_kernel_on_the_transposed_shape():
    from cudal2.search.costmodel import CostModel, kernel_facts
    from cudal2.templates import FAMILIES
    cm = CostModel.default(gpu="H100")
    sk, sn = FAMILIES["skinny"].default(), FAMILIES["skinny_n"].default()   # same params, RC
    assert kernel_facts(sn).mirror and kernel_facts(sn).skinny and not kernel_facts(sk).mirror
    for M, N, K in ((16, 4096, 4096), (8, 8192, 4096), (1, 11008, 4096)):
        assert cm.predict_us(sn, None, (N, M, K)) == cm.predict_us(sk, None, (M, N, K))
    # a built mirror's meta gives its tile in C's terms: the facts keep the kernel's
    meta = {"style": "mma", "family": "skinny_n", "tile": [128, 16, 64], "threads": 128,
            "workspace_zero_init": True, "params": sn.as_dict()}
    f = kernel_facts(meta)
    assert (f.BM, f.BN, f.mirror) == (16, 128, True)
    assert cm.predict_us(meta, None, (4096, 16, 4096)) == cm.predict_us(
        {**meta, "family": "skinny", "tile": [16, 128, 64]}, None, (16, 4096, 4096))


def test_an_unfitted_model_predicts_the_features_prior():
    """An unfitted model predicts with prior_us alone (no feature vector; on a ruled row the
    budget without the roofline it replaces): exactly _features' prior, for every family's
    default and options on a plain, a decode and a deep-K row."""
    from cudal2.search.costmodel import _features, prior_us
    from cudal2.search.tune import config_meta
    from cudal2.templates import FAMILIES
    model = CostModel.default(arch="sm_90a")
    rows = (Shape(4096, 4096, 4096), Shape(16, 8192, 4096), Shape(128, 128, 16384), Shape(8192, 16, 4096))
    for fam in FAMILIES.values():
        if "sm_90a" not in fam.arches:
            continue
        cfg = fam.default().with_(LAYOUT="RC") if "LAYOUT" in fam.default().as_dict() else fam.default()
        for decode in (False, True):
            for o in fam.option_space(cfg, decode=decode)[:8]:
                f = kernel_facts(config_meta(cfg), None, o)
                for s in rows:
                    assert prior_us(f, s, model.spec) == _features(f, s, model.spec)[0], (fam.name, o, s)
                    assert model.predict_facts_us(f, s) == _features(f, s, model.spec)[0]
