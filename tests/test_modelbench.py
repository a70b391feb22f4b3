"""`cudal2 bench --model`: the pure arithmetic of the model replay (call order, bytes, HBM
fraction, time weighting) on CPU, and a clear refusal without a GPU."""
import json

import pytest

from cudal2 import cli
from cudal2.harness import bandwidth as bw
from cudal2.runs import modelbench as B
from cudal2.runs import shapes as S


def test_call_sequence_puts_a_rows_calls_in_the_last_rounds():
    # qkv and o once per layer (3 layers), experts 6 times, lm_head once: last
    assert B.call_sequence([3, 3, 6, 1]) == [2, 2, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3]
    assert B.call_sequence([1]) == [0]


def test_bytes_bandwidth_and_copies():
    rows = [dict(M=1, N=4096, K=4096, count=32), dict(M=1, N=128256, K=4096, count=1)]
    want = 2 * 32 * (4096 + 4096 * 4096 + 4096) + 2 * (4096 + 128256 * 4096 + 128256)
    assert B.pass_bytes(rows) == want
    # H100 SXM's HBM3: 2619 MHz memory clock, 5120-bit bus -> 3352.3 GB/s
    peak = bw.theoretical_peak_gbs(2619000, 5120)
    assert peak == pytest.approx(3352.32)
    assert bw.theoretical_peak_gbs(None, 5120) is None and B.hbm_fraction(1, 1.0, None) is None
    # 3.35232 GB in 1 ms (1000 us) at 3352.32 GB/s is the whole peak
    assert B.hbm_fraction(3_352_320_000, 1000.0, peak) == pytest.approx(1.0)
    # a 32 MiB weight on a 50 MiB L2: ceil(3 x 50 / 32) = 5 copies, never more than its count
    row = dict(M=1, N=4096, K=4096, count=32)
    assert B.weight_copies(row, 50 << 20) == 5
    assert B.weight_copies(dict(row, count=2), 50 << 20) == 2


def test_time_weighted_speedup_and_its_interval():
    w = {1: 0.5, 4096: 0.5}
    # harmonic: half the torch time sped up 2x, half unchanged -> 1 / (0.25 + 0.5)
    assert B.weighted_speedup(w, {1: 2.0, 4096: 1.0}) == pytest.approx(4 / 3)
    assert B.weighted_speedup(w, {1: 2.0}) == pytest.approx(2.0)     # normalised over timed passes
    iv = B.overall(w, {1: [20.0] * 9, 4096: [100.0] * 9}, {1: [10.0] * 9, 4096: [100.0] * 9})
    assert iv.median == pytest.approx(4 / 3) and iv.lo <= iv.median <= iv.hi and iv.n == 9
    with pytest.raises(ValueError, match="no round"):
        B.overall(w, {1: [None], 4096: [1.0]}, {1: [1.0], 4096: [1.0]})


def test_rows_from_a_shapes_csv_and_a_refusal_without_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path is not taken")
    m = S.Model("tiny", hidden=64, heads=2, kv_heads=1, head_dim=32, layers=2, intermediate=64,
                vocab=128)
    csv_path = S.write_rows(S.model_rows(m, [1, 8]), tmp_path / "tiny.csv")
    rows = B.read_rows(csv_path)
    assert [r["tokens"] for r in rows] == [1] * 5 + [8] * 5 and rows[-1]["count"] == 1
    assert sum(r["weight"] for r in B.passes(rows)[1]) == pytest.approx(0.5, abs=1e-5)
    cfg = tmp_path / "m"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps(dict(hidden_size=64, num_attention_heads=2,
                                                     num_hidden_layers=2, intermediate_size=64,
                                                     vocab_size=128)))
    for target in (csv_path, cfg):
        assert cli.main(["bench", "--model", str(target), "--tokens", "1"]) == 3
        assert "not measured: needs a CUDA GPU" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("M,N,K\nx,1,1\n")
    assert cli.main(["bench", "--model", str(tmp_path / "bad.csv")]) == 2
