"""The streaming budget (cudal2.templates.budget, issue 50): the Hopper in-flight need derived
from the device table, the occupancy rule, the grid replayed as the kernels run it, the time's
terms, the planner's screen of decode candidates, the calibration of the device terms on the
committed H200 rows, and `cudal2 templates --explain`."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.core.devices import GPUS
from cudal2.harness.types import Shape
from cudal2.templates import FAMILIES
from cudal2.templates.budget import (BUDGETED, WAVE_FILL_MIN, budget, ctas_per_sm, is_decode,
                                     problems_on_arch)
from cudal2.templates.skinny import skinny_plan

REPO = Path(__file__).resolve().parents[1]
H100, H200 = GPUS["H100"], GPUS["H200"]
SKINNY = FAMILIES["skinny"].default()            # 16x128x64, 4 warps of 16x32, 4 stages, RC


def test_the_hopper_in_flight_need_is_littles_law_on_the_table():
    """At fill f the need per SM is f / (1 - f) x latency x reachable peak / SMs: with the fitted
    750 ns and 0.93 of the datasheet bandwidth, 4 x 0.75 us x 4.464 TB/s / 132 = 99.1 KiB on an
    H200 and 4 x 0.75 us x 3.116 TB/s / 132 = 69.1 KiB on an H100."""
    for gpu, tbps, kib in ((H200, 4.8, 99.08), (H100, 3.35, 69.15)):
        need = 0.8 / 0.2 * tbps * 0.93 * 1e6 * 0.750 / 132
        assert gpu.inflight_needed_per_sm() == pytest.approx(need)
        assert need / 1024 == pytest.approx(kib, abs=0.01)
    # more fill needs more in flight, without bound as it nears the peak
    assert H200.inflight_needed_per_sm(0.9) > 2 * H200.inflight_needed_per_sm(0.8)


def test_the_occupancy_rule():
    # skinny's default: 107 registers -> 14 x 256 per warp, 4 warps: 4 CTAs by registers; 82944
    # bytes + the 1 KiB reserve: 2 CTAs by shared memory
    assert ctas_per_sm(128, 107, 82944, H200) == (2, "shared memory")
    assert ctas_per_sm(1024, 64, 0, H200) == (1, "registers")
    assert ctas_per_sm(1024, 32, 0, H200) == (2, "threads")
    assert ctas_per_sm(256, 255, 0, H200) == (1, "registers")
    assert ctas_per_sm(32, 16, 0, H200) == (32, "the CTA cap")


@pytest.mark.parametrize("shape,options", [((1, 4096, 4096), {"splits": 8}),
                                           ((16, 57344, 8192), {"splits": 0}),
                                           ((1, 4096, 4096), {"decomposition": 3}),
                                           ((64, 8192, 28672), {"splits": 0, "decomposition": 0})])
def test_the_skinny_grid_is_the_kernels_plan(shape, options):
    M, N, K = shape
    b = budget(SKINNY, shape, H200, options=options, registers=107)
    slots = b.ctas_per_sm * H200.sms
    mode, n = skinny_plan(N, K, 128, 64, H200.sms, slots, options.get("splits", 0),
                          options.get("decomposition", 0))
    tiles = -(-N // 128)
    assert b.decomposition == ("stream-K" if mode == "streamk" else "split-K")
    assert b.grid == (n if mode == "streamk" else tiles * n)
    assert b.waves == -(-b.units // b.at_once) and b.at_once == min(b.units, slots)
    last = b.units - (b.waves - 1) * b.at_once
    assert b.last_wave_fill == pytest.approx(min(1.0, last / H200.sms))


def test_waves_in_flight_and_the_rule():
    # 1 x 4096 x 4096 at 2 splits: 64 CTAs on 132 SMs, one wave leaving half the SMs idle
    b = budget(SKINNY, (1, 4096, 4096), H200, options={"splits": 2}, registers=107)
    assert (b.grid, b.waves) == (64, 1) and b.last_wave_fill == pytest.approx(64 / 132)
    assert any("last of 1 wave" in p for p in b.problems())
    # STAGES - 1 stages of B (128 x 64 halves) in flight per CTA
    assert b.inflight_per_cta == 3 * 128 * 64 * 2
    assert b.inflight_per_sm == b.inflight_per_cta          # one CTA on each busy SM
    # eight stages on one CTA per SM: 7 x 16 KiB = 112 KiB, over the H200's need; stream-K fills
    deep = SKINNY.with_(STAGES=8)
    ok = budget(deep, (1, 4096, 4096), H200, options={"decomposition": 3}, registers=107)
    assert ok.inflight_per_sm == 7 * 16384 and ok.problems() == []
    # two stages of 8 KiB cannot keep 99 KiB in flight (the example, at 2 CTAs per SM)
    thin = SKINNY.with_(BN=64, WN=16, STAGES=2)
    assert any("in flight" in p for p in budget(thin, (1, 4096, 4096), H200, options={
        "decomposition": 3}, registers=66).problems())


def test_the_time_is_its_terms_and_never_beats_the_stream():
    for shape in ((1, 4096, 4096), (16, 8192, 28672), (64, 57344, 8192)):
        for options in ({"splits": 0}, {"splits": 4}, {"decomposition": 3}, {"splits": 32}):
            b = budget(SKINNY.with_(BM=64, WM=16) if shape[0] > 16 else SKINNY, shape, H200,
                       options=options)
            assert b.t_us == pytest.approx(b.t_floor_us + b.t_stream_us + b.t_reduce_us)
            assert b.t_us > b.stream_bytes / H200.stream_bytes_per_us
            assert b.gbps < H200.stream_bytes_per_us / 1e3
    # more bytes in flight per SM: never slower waves (a deeper pipeline may fit fewer CTAs per
    # SM and keep less in flight: 6 stages on one CTA hold 80 KiB, 4 stages on two 96 KiB)
    shape = (1, 8192, 8192)
    bs = sorted((budget(SKINNY.with_(STAGES=s), shape, H200, options={"decomposition": 3})
                 for s in (2, 3, 4, 6, 8)), key=lambda b: b.inflight_per_sm)
    assert [b.t_stream_us for b in bs] == sorted((b.t_stream_us for b in bs), reverse=True)
    # the same split count reduced in a cluster costs less than through the workspace
    c = budget(SKINNY, (1, 4096, 4096), H200, options={"splits": 8}, cluster=True)
    w = budget(SKINNY, (1, 4096, 4096), H200, options={"splits": 8}, cluster=False)
    assert (c.reduction, w.reduction) == ("cluster", "workspace") and c.t_us < w.t_us
    # an A100 has no clusters
    assert budget(SKINNY, (1, 4096, 4096), GPUS["A100"], options={"splits": 8}).reduction == "workspace"


def test_the_mirror_is_budgeted_on_the_transposed_shape():
    sk, sn = FAMILIES["skinny"].default(), FAMILIES["skinny_n"].default()
    a = budget(sk, (16, 8192, 4096), H200, options={"splits": 4})
    b = budget(sn, (8192, 16, 4096), H200, options={"splits": 4})
    assert (a.t_us, a.grid, a.inflight_per_sm) == (b.t_us, b.grid, b.inflight_per_sm)
    assert is_decode("skinny_n", 8192, 16, 4096) and not is_decode("skinny", 8192, 16, 4096)
    assert not is_decode("mma", 1, 4096, 4096)
    # a weight under 16 MiB is bound by the launch, not by streaming: not a decode row here
    assert not is_decode("skinny", 64, 64, 1024) and is_decode("skinny", 1, 4096, 4096)
    with pytest.raises(ValueError, match="streaming budget models"):
        budget(FAMILIES["mma"].default(), (1, 4096, 4096), H200)


def test_the_tile_grids_are_the_kernels_plans():
    """lowlat's grid is its tiles times lowlat_splits' count, reduced through the workspace;
    wgmma's a persistent grid over the tiles without a split, else tiles x wgmma_splits reduced
    in a cluster. The streamed operand is the large one (B here); a 3-stage lowlat keeps 32 KiB
    in flight, an 8-stage one 7 x 16 KiB, over an H200 SM's 99 KiB."""
    from cudal2.templates.lowlat import lowlat_splits
    from cudal2.templates.wgmma import wgmma_splits
    shape = (64, 4096, 4096)
    ll = FAMILIES["lowlat"].default().with_(LAYOUT="RC", STAGES=8)        # 64x128x64
    b = budget(ll, shape, H200, options={"splits": 0})
    n = lowlat_splits(*shape, 64, 128, 64, H200.sms)[0]
    assert (b.grid, b.splits, b.reduction) == (32 * n, n, "workspace") and n == 4
    assert b.inflight_per_cta == 7 * 128 * 64 * 2 and b.problems() == []
    assert b.stream_bytes == 2 * 4096 * 4096
    shallow = budget(ll.with_(STAGES=3), shape, H200, options={"splits": 0})
    assert shallow.inflight_per_sm == 32 * 1024 and "in flight" in shallow.problems()[0]
    wg = FAMILIES["wgmma"].default().with_(BM=64, BN=128, STAGES=8, CONSUMERS=1, CLUSTER_M=1,
                                           EPILOGUE="direct", LAYOUT="RC")
    persistent = budget(wg, shape, H200, options={"splits": 1, "sm_count": 0})
    assert (persistent.decomposition, persistent.grid, persistent.units) == ("persistent", 32, 32)
    assert persistent.last_wave_fill == pytest.approx(32 / 132)
    split = budget(wg, shape, H200, options={"splits": 4})
    assert wgmma_splits(*shape, 64, 128, 64, H200.sms, 4) == 4
    assert (split.grid, split.reduction, split.problems()) == (128, "cluster", [])
    # a 2-CTA cluster pairs row tiles: a 64-row decode row has one
    pair = budget(wg.with_(CLUSTER_M=2), shape, H200, options={"splits": 1})
    assert "CLUSTER_M=2" in pair.problems()[0]
    # the tile grids stream the large operand: B on a decode row, A on its mirror
    assert is_decode("lowlat", 64, 4096, 4096) and is_decode("wgmma", 4096, 64, 4096)
    assert not is_decode("cutlass_sm90", 64, 4096, 4096)


def test_an_sm90a_build_meets_both_hoppers():
    """problems_on_arch asks the H100's and the H200's need: 96 KiB in flight meets the H100's
    69 KiB, not the H200's 99."""
    shape, options = (1, 8192, 8192), {"decomposition": 3}
    h100 = budget(SKINNY, shape, H100, options=options, registers=107)
    h200 = budget(SKINNY, shape, H200, options=options, registers=107)
    assert h100.inflight_per_sm == h200.inflight_per_sm == 96 * 1024
    assert h100.problems() == [] and h200.problems()
    assert [p.split(":")[0] for p in problems_on_arch(SKINNY, shape, "sm_90a", options=options,
                                                      registers=107)] == ["H200"]


def _decode_rows() -> list[Shape]:
    with (REPO / "shapes" / "llm_trace.csv").open() as f:
        rows = [Shape(int(r["M"]), int(r["N"]), int(r["K"])) for r in csv.DictReader(f)]
    return list(dict.fromkeys(s for s in rows if s.M <= 64))


@pytest.mark.slow
def test_the_plan_packs_only_decode_candidates_within_the_budget():
    """`campaign prepare`'s plan of the decode rows (every family, RC, the verdict call's limits):
    every candidate is of a budgeted family (the tile grids' too: lowlat, lowlat_mma, wgmma) and
    its options meet the budget on both Hoppers, and each streaming
    family packs every (config, options) of its space that meets it, up to DECODE_BUILDS
    configs, and every row holds at least DECODE_SCREENINGS screenings. (Before skinny's A could
    go through registers, A_LOAD regs, the 64-row rows held 37-59: A took a third to a half of
    each ring stage, and no 64-row ring but 8 stages on one CTA kept an H200's 99 KiB in flight.)"""
    from cudal2.search import tune
    from cudal2.templates import enumerate_space
    rows = _decode_rows()
    p = tune.plan(rows, "sm_90a", limit_per_shape=8, per_family=2, layout="RC")
    packed: dict = {}
    for c in p.candidates:
        for s, opts in c.options.items():
            if s in rows:                 # every candidate of a decode row declares its budget
                assert c.family in BUDGETED, (c.label, s)
            if is_decode(c.family, s.M, s.N, s.K):
                for o in opts:
                    assert not problems_on_arch(c.config, s, "sm_90a", options=o), (c.label, s, o)
                    packed.setdefault((s, c.family), set()).add((c.config, tuple(sorted(o.items()))))
    for name in ("skinny", "gemv"):
        fam = FAMILIES[name]
        space = enumerate_space(fam, arch="sm_90a", layout="RC")
        for s in rows:
            admissible = {(c, tuple(sorted(o.items()))) for c in space
                          if fam.serves(c, s.M, s.N, s.K, checked=True)
                          for o in fam.option_space(c)
                          if not problems_on_arch(c, s, "sm_90a", options=o)}
            mine = packed.get((s, name), set())
            assert mine <= admissible
            configs = {c for c, _ in admissible}
            if len(configs) <= tune.DECODE_BUILDS:
                assert mine == admissible, (s, name, len(mine), len(admissible))
            else:
                assert len({c for c, _ in mine}) >= tune.DECODE_BUILDS, (s, name)
    assert any(name == "gemv" for (_, name) in packed)
    for s in rows:
        total = sum(len(c.options[s]) for c in p.per_shape[s])
        assert total >= tune.DECODE_SCREENINGS, (s, total)
    tall = [c.get("A_LOAD") for (s, _), pairs in packed.items() if s.M == 64 for c, _ in pairs]
    assert tall.count("regs") > 3 * tall.count("ring"), (tall.count("regs"), tall.count("ring"))


def test_the_device_terms_are_the_fit_of_the_committed_rows():
    """cudal2.core.devices' latency, floor and split-K terms are the least RMS log error over the
    committed H200 decode rows of the streaming families among their grid neighbours (`cudal2 report --budget` runs the
    whole grid: reports/cpu/2026-11-29-decode-budget)."""
    from cudal2.runs import budgetfit
    rows = [r for r in budgetfit.decode_rows([REPO / "reports"]) if r.gpu == "H200"]
    assert {r.config.family for r in rows} > {"skinny", "lowlat"}
    rows = budgetfit.streaming_rows(rows)
    assert len(rows) >= 400
    terms = budgetfit.terms_of(H200)
    grid = []
    for axis, v in zip(budgetfit.FIT_GRID, terms):
        i = axis.index(v)
        grid.append(tuple(axis[max(0, i - 1):i + 2]))
    best, err = budgetfit.fit(rows, H200, grid)
    assert best == tuple(terms), (best, terms)
    assert err < 0.55 and math.isfinite(err)


def test_templates_explain_prints_the_budget_and_refuses_bad_input():
    run = lambda *a: subprocess.run([sys.executable, "-m", "cudal2", "templates", "--explain", *a],
                                    capture_output=True, text=True, timeout=120)
    r = run("skinny", "--shape", "1x4096x4096", "-D", "STAGES=8", "--option", "decomposition=3")
    assert r.returncode == 0, r.stderr
    assert "in flight: 112.0 KiB per CTA" in r.stdout and "budget: met" in r.stdout
    assert "1 of 1 option combination(s) meet the budget" in r.stderr
    r = run("skinny", "--shape", "1x4096")
    assert r.returncode == 2 and "expected MxNxK" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("mma", "--shape", "1x4096x4096")
    assert r.returncode == 2 and "streaming budget models" in r.stderr
    r = run("skinny:BM=16,BQ=3", "--shape", "1x4096x4096")
    assert r.returncode == 2 and "BQ" in r.stderr


def test_a_repeated_budget_is_the_computed_one_with_the_callers_own_options():
    """budget() answers a repeated (config, row, GPU, options) from its cache (a plan prices each
    option on the planning GPU, then screens it on every GPU of the arch): the terms of a fresh
    computation, with the caller's options in its order, in a record of its own."""
    from cudal2.templates import budget as budget_mod
    row = (16, 8192, 4096)
    for name in ("wgmma", "skinny", "gemv", "lowlat"):
        cfg = FAMILIES[name].default().with_(LAYOUT="RC")
        for o in FAMILIES[name].option_space(cfg, decode=True)[:6]:
            fresh = budget_mod._budget.__wrapped__(cfg, row, H200, tuple(sorted(o.items())), 0, 0,
                                                   True, True, True)
            given, turned = budget(cfg, row, H200, options=o), budget(cfg, row, H200, options=dict(reversed(o.items())))
            assert given == fresh == turned and given.t_us == fresh.t_us
            assert list(given.options) == list(o) and list(turned.options) == list(reversed(o))
            given.options["splits"] = -1            # one caller's record is not another's
            assert budget(cfg, row, H200, options=o).options == o


def test_the_waves_are_the_units_at_once_then_the_rest():
    """Every wave but the last runs `at_once` units (their terms worked out once), the last the
    rest; the stream time is the waves' sum."""
    cfg = FAMILIES["lowlat"].default().with_(LAYOUT="RC")
    for row in ((16, 8192, 4096), (64, 128256, 4096), (8, 57344, 8192)):
        for o in FAMILIES["lowlat"].option_space(cfg, decode=True):
            b = budget(cfg, row, H100, options=o)
            counts = [w[0] for w in b.wave_terms]
            assert sum(counts) == b.units and len(counts) == b.waves
            assert all(n == b.at_once for n in counts[:-1]) and 0 < counts[-1] <= b.at_once
            assert b.t_stream_us == sum(w[3] for w in b.wave_terms)
