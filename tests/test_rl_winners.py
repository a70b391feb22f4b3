"""rl.winners: warm-start pairs from a results DB's measured winners per shape."""
import pytest

from cudal2.harness.db import ResultsDB
from cudal2.harness.types import Evaluation, Shape
from cudal2_rl import winners as W
from cudal2_rl.reward import source_sha

GPU = "NVIDIA H100 80GB HBM3"
K1 = '#define BM 64\n#define BN 64\n#define BK 32\n#define WM 32\n#define WN 32\n#include "mma_hgemm.cuh"\n'
K2 = '#define BM 128\n#define BN 256\n#define BK 64\n#define STAGES 4\n#include "wgmma_hgemm.cuh"\n'
K3 = '#define BM 128\n#define BN 128\n#define BK 32\n#define WM 64\n#define WN 64\n#include "mma_hgemm.cuh"\n'


def row(src, shape, speedup, *, status="ok", estimated=False, gpu=GPU, stage="final"):
    e = Evaluation(status=status, source_sha=source_sha(src), shape=Shape(*shape), arch="sm_90a",
                   acc="f32", layout="RR", env={"gpu": gpu}, estimated=estimated, stage=stage)
    if speedup is not None:
        e.timings = {"offline": {"candidate": {"median_us": 100.0 / speedup},
                                 "cublaslt_autotuned": {"median_us": 100.0}}}
        e.speedups = {"offline": {"cublaslt_autotuned": speedup}}
    return e


@pytest.fixture
def db(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    small, big = (256, 256, 256), (4096, 4096, 4096)
    for src, shape, s, kw in (
            (K1, small, 1.20, {}), (K2, small, 0.90, {}), (K3, small, 1.05, {}),
            (K2, small, 5.00, {"estimated": True, "status": "not_measured"}),   # an estimate: never
            (K3, small, 9.00, {"status": "wrong"}),                             # wrong: never
            (K2, big, 1.30, {}), (K1, big, 0.70, {}),
            (K3, big, 3.00, {"stage": "screen"})):                              # screened only
        db.add(row(src, shape, s, **kw), source=src)
    return db


def test_the_warm_start_data_change_with_the_shape(db):
    pairs = W.db_pairs(db, earlier=2)
    by = {shape: (prompt, comp, w) for prompt, comp, shape, w in pairs}
    assert set(by) == {(256, 256, 256), (4096, 4096, 4096)}
    # each shape's target is its own measured winner: the small shape's mma tile, the big one's wgmma
    assert by[(256, 256, 256)][1] == K1 and by[(256, 256, 256)][2].speedup == pytest.approx(1.2)
    assert by[(4096, 4096, 4096)][1] == K2 and by[(4096, 4096, 4096)][2].speedup == pytest.approx(1.3)
    assert by[(256, 256, 256)][1] != by[(4096, 4096, 4096)][1]
    # prompts name the shape and carry the slower earlier kernels with their measured times
    p_small = by[(256, 256, 256)][0]
    assert "256" in p_small and "4096" not in p_small.split("An earlier")[0]
    assert "0.90x" in p_small and "1.05x" in p_small and "95.2 us" in p_small
    assert p_small.index("0.90x") < p_small.index("1.05x")        # slowest first, best last
    assert "5.00x" not in p_small and "9.00x" not in p_small        # no estimate, no wrong row
    assert "0.70x" in by[(4096, 4096, 4096)][0] and "3.00x" not in by[(4096, 4096, 4096)][0]


def test_newest_measurement_counts_and_gpus_do_not_mix(db):
    db.add(row(K1, (256, 256, 256), 0.5), source=K1)          # K1 re-measured: slower
    ws = W.measured_winners(db)[(256, 256, 256)]
    assert [w.source for w in ws] == [K3, K2, K1]
    db.add(row(K1, (512, 512, 512), 1.1, gpu="NVIDIA H200"), source=K1)
    with pytest.raises(ValueError, match="2 GPU models"):
        W.measured_winners(db)
    assert list(W.measured_winners(db, gpu="NVIDIA H200")) == [(512, 512, 512)]
    assert W.db_pairs(db, gpu=GPU, min_speedup=1.2)[0][2] == (4096, 4096, 4096)
