"""The planner packs issue 32's new decompositions for the shapes they target (no GPU):
lowlat's in-kernel split-K for the shapes under 1e9 FLOP of shapes/stratified_100.csv and the
deep-K targets (RR), skinny's stream-K and cluster split-K for the decode rows (M <= 64) of
shapes/llm_trace.csv (RC), and the wgmma family's cluster split-K for the decode rows with
33 <= M <= 64 (one BM = 64 tile row).

Planned as `cudal2 campaign prepare` plans (its defaults: 2 configs per family, at least 8 a
shape), over the new families only: a family's picks and each build's options are chosen within
the family (tune._pick_per_family), so the full plan packs the same ones; this keeps the test
cheap."""
from __future__ import annotations

import csv
import inspect
from pathlib import Path

import pytest

from cudal2.harness.types import Shape
from cudal2.runs import campaign
from cudal2.search import tune
from cudal2.search.costmodel import gpu_for, kernel_facts, occupancy, skinny_plan
from cudal2.templates.budget import budget
from cudal2.search.tune import config_meta
from cudal2.templates.lowlat import lowlat_splits
from cudal2.templates.wgmma import wgmma_splits

ROOT = Path(__file__).resolve().parents[1]
DEEP_K = [Shape(128, 64, 12288), Shape(128, 128, 2048), Shape(1024, 256, 16384)]
H100 = gpu_for(gpu="H100")
PREPARE = {k: inspect.signature(campaign.prepare).parameters[k].default
           for k in ("limit_per_shape", "per_family")}


def _rows(name: str) -> list[dict]:
    with (ROOT / "shapes" / name).open(newline="") as f:
        return list(csv.DictReader(f))


def small_shapes() -> list[Shape]:
    out = [Shape(int(r["M"]), int(r["N"]), int(r["K"])) for r in _rows("stratified_100.csv")]
    return [s for s in out if 2.0 * s.M * s.N * s.K < 1e9]


def decode_rows() -> list[Shape]:
    rows = [r for r in _rows("llm_trace.csv") if int(r["M"]) <= 64]
    return list(dict.fromkeys(Shape(int(r["M"]), int(r["N"]), int(r["K"])) for r in rows))


def test_lowlat_split_k_is_packed_for_the_small_and_deep_k_shapes():
    shapes = list(dict.fromkeys(DEEP_K + small_shapes()))
    assert len(small_shapes()) == 25 and len(shapes) == 26   # two deep-K targets are small too
    p = tune.plan(shapes, "sm_90a", families=["lowlat", "lowlat_mma"], layout="RR", **PREPARE)
    split_shapes = 0
    for s in shapes:
        cands = p.per_shape[s]
        assert {c.family for c in cands} == {"lowlat", "lowlat_mma"}, s
        assert all(c.options[s] == [{"splits": 0}] for c in cands), s   # the kernel's own choice
        splits = [lowlat_splits(s.M, s.N, s.K, c.config.get("BM"), c.config.get("BN"),
                                c.config.get("BK"), H100.sms)[0] for c in cands]
        if s in DEEP_K:   # one CTA per tile walked 192 k-tiles serially; now K is split
            assert min(splits) > 1, (s, splits)
        split_shapes += max(splits) > 1
    assert split_shapes >= 5 + len(DEEP_K), split_shapes


def test_skinny_stream_k_and_cluster_split_k_are_packed_for_the_decode_rows():
    """The decode rows' skinny candidates are timed only with options whose streaming budget
    holds (cudal2.templates.budget); among them stream-K on every row, and a split-K reduced
    inside a cluster on the rows where one holds."""
    rows = decode_rows()
    assert len(rows) >= 20
    p = tune.plan(rows, "sm_90a", families=["skinny", "skinny_n"], layout="RC", **PREPARE)
    clustered = 0
    for s in rows:
        cands = [c for c in p.per_shape[s] if c.family == "skinny"]
        assert len(cands) >= PREPARE["per_family"], s
        runs, cluster = set(), False
        for c in cands:
            assert all(not budget(c.config, s, H100, options=o).problems() for o in c.options[s])
            slots = H100.sms * occupancy(kernel_facts(config_meta(c.config)), H100)
            plans = [skinny_plan(s.N, s.K, c.config.get("BN"), c.config.get("BK"), H100.sms, slots,
                                 o["splits"], o["decomposition"]) for o in c.options[s]]
            runs |= {mode for mode, _ in plans}
            cluster |= any(mode == "splitk" and 2 <= n <= 8 for mode, n in plans)
        assert "streamk" in runs, (s, runs)
        clustered += cluster
    assert clustered >= len(rows) // 2, clustered


def test_wgmma_cluster_split_k_is_packed_for_the_m64_decode_rows():
    """Decode rows with 33 <= M <= 64 are one 64-row tile row: where 128-column tiles leave SMs
    idle, the wgmma family's plan holds a BM = 64 build without a cluster along M, timed with
    options whose split count (wgmma_splits, the launcher's rule) is 2..8, reduced through
    distributed shared memory. (Rows of >= 132 such tiles fill the SMs unsplit.)"""
    rows = [s for s in decode_rows() if 33 <= s.M <= 64]
    assert len(rows) >= 6
    p = tune.plan(rows, "sm_90a", families=["wgmma"], layout="RC", **PREPARE)
    few_tiles = [s for s in rows if -(-s.N // 128) < H100.sms]
    assert len(few_tiles) >= 6
    for s in few_tiles:
        split = [(c.config.label(), o) for c in p.per_shape[s]
                 if c.config.get("BM") == 64 and c.config.get("CLUSTER_M") == 1
                 for o in c.options[s]
                 if 2 <= wgmma_splits(s.M, s.N, s.K, 64, c.config.get("BN"), c.config.get("BK"),
                                      H100.sms, o["splits"]) <= 8]
        assert split, s


@pytest.mark.parametrize("shape", [Shape(1, 6144, 4096), Shape(1, 4096, 14336), Shape(1, 28672, 4096)])
def test_the_decode_grid_has_no_partial_wave_under_stream_k(shape):
    """Llama-3 8B decode (qkv, down, gate_up): split-K's grid of 288-448 CTAs on 264 slots left a
    9-27% last wave; stream-K's grid is the slots, each CTA within one k-tile of the others."""
    BN, BK, slots = 128, 64, 2 * H100.sms
    mode, grid = skinny_plan(shape.N, shape.K, BN, BK, H100.sms, slots, 0, 3)
    iters = -(-shape.N // BN) * -(-shape.K // BK)
    assert mode == "streamk" and grid == slots and iters >= grid
    assert -(-iters // grid) - iters // grid <= 1
