"""`cudal2 shapes --model`: a model's linear layers from its config, checked against sizes worked
out by hand for small synthetic configs (no download, no GPU)."""
import csv
import json

import pytest

from cudal2 import cli
from cudal2.runs import shapes as S
from cudal2.search.tune import read_shapes

# Dense grouped-query (Llama-like): hidden 512, 8 heads of 64, 2 kv heads, MLP 1536.
LLAMA = dict(model_type="llama", hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
             num_hidden_layers=4, intermediate_size=1536, vocab_size=1000)
# Mixtral-like: every layer 8 experts of 512, top-2; no dense MLP.
MIXTRAL = dict(model_type="mixtral", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=2, intermediate_size=512, num_local_experts=8,
               num_experts_per_tok=2, vocab_size=320)
# Qwen-MoE-like: layer 0 dense (mlp_only_layers), layers 1-2 sparse with 4 experts of 128 and a
# shared expert of 256; head_dim given explicitly (not hidden / heads).
QWEN_MOE = dict(model_type="qwen2_moe", hidden_size=256, num_attention_heads=4, head_dim=32,
                num_key_value_heads=4, num_hidden_layers=3, intermediate_size=1024, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=128,
                shared_expert_intermediate_size=256, decoder_sparse_step=1, mlp_only_layers=[0],
                vocab_size=640)


def _model(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _shapes(model, tokens, tp=1, fused=True):
    return {(layer, m, n, k, c) for layer, m, n, k, c in S.layer_gemms(model, tokens, tp=tp, fused=fused)}


def test_dense_grouped_query_fused_and_separate_tp1_tp2(tmp_path):
    m = S.read_config(_model(tmp_path, LLAMA))
    assert (m.head_dim, m.kv_heads) == (64, 2)
    # fused, tp 1: qkv N = (8 + 2*2) * 64
    assert _shapes(m, 1) == {("qkv", 1, 768, 512, 4), ("o", 1, 512, 512, 4),
                             ("gate_up", 1, 3072, 512, 4), ("down", 1, 512, 1536, 4),
                             ("lm_head", 1, 1000, 512, 1)}
    # separate, tp 2: 4 heads and 1 kv head per rank; o and down split K
    assert _shapes(m, 16, tp=2, fused=False) == {
        ("q", 16, 256, 512, 4), ("k", 16, 64, 512, 4), ("v", 16, 64, 512, 4),
        ("o", 16, 512, 256, 4), ("gate", 16, 768, 512, 4), ("up", 16, 768, 512, 4),
        ("down", 16, 512, 768, 4), ("lm_head", 16, 500, 512, 1)}
    # fused, tp 2
    assert _shapes(m, 64, tp=2) == {("qkv", 64, 384, 512, 4), ("o", 64, 512, 256, 4),
                                    ("gate_up", 64, 1536, 512, 4), ("down", 64, 512, 768, 4),
                                    ("lm_head", 64, 500, 512, 1)}
    # tp 4 > 2 kv heads: each rank holds one replicated kv head, 2 query heads
    assert ("qkv", 1, (2 + 2) * 64, 512, 4) in _shapes(m, 1, tp=4)


def test_mixtral_like_experts_fused_and_separate_tp1_tp2(tmp_path):
    m = S.read_config(_model(tmp_path, MIXTRAL))
    assert (m.experts, m.top_k, m.expert_intermediate, m.moe_layers) == (8, 2, 512, 2)
    # 1 token, top-2 of 8: 2 experts active, 1 token each
    assert _shapes(m, 1) == {("qkv", 1, (4 + 4) * 64, 256, 2), ("o", 1, 256, 256, 2),
                             ("router", 1, 8, 256, 2), ("expert_gate_up", 1, 1024, 256, 4),
                             ("expert_down", 1, 256, 512, 4), ("lm_head", 1, 320, 256, 1)}
    # 16 tokens: 32 assignments over 8 experts = 4 tokens each, all 8 active; tp 2 splits the
    # experts' intermediate size
    assert _shapes(m, 16, tp=2, fused=False) == {
        ("q", 16, 128, 256, 2), ("k", 16, 64, 256, 2), ("v", 16, 64, 256, 2),
        ("o", 16, 256, 128, 2), ("router", 16, 8, 256, 2), ("expert_gate", 4, 256, 256, 16),
        ("expert_up", 4, 256, 256, 16), ("expert_down", 4, 256, 256, 16), ("lm_head", 16, 160, 256, 1)}
    assert S.expert_tokens(3, 2, 8) == (1, 6) and S.expert_tokens(100, 2, 8) == (25, 8)


def test_qwen_moe_like_shared_expert_and_dense_layer(tmp_path):
    m = S.read_config(_model(tmp_path, QWEN_MOE))
    assert (m.head_dim, m.moe_layers, m.shared_intermediate) == (32, 2, 256)
    # 8 tokens x top-2 over 4 experts: 4 tokens each, 4 active
    assert _shapes(m, 8, tp=2) == {
        ("qkv", 8, (2 + 2 * 2) * 32, 256, 3), ("o", 8, 256, 64, 3),
        ("gate_up", 8, 1024, 256, 1), ("down", 8, 256, 512, 1),
        ("router", 8, 4, 256, 2), ("expert_gate_up", 4, 128, 256, 8), ("expert_down", 4, 256, 64, 8),
        ("shared_gate_up", 8, 256, 256, 2), ("shared_down", 8, 256, 128, 2),
        ("lm_head", 8, 320, 256, 1)}


def test_weights_are_flop_shares_per_pass_and_the_cli_writes_a_shapes_file(tmp_path):
    d = _model(tmp_path, LLAMA, "tiny-llama")
    out = tmp_path / "tiny.csv"
    assert cli.main(["shapes", "--model", str(d), "--tokens", "1,4", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == list(S.COLUMNS) and {r["layout"] for r in rows} == {"RC"}
    assert {r["model"] for r in rows} == {"tiny-llama"} and len(rows) == 10
    assert sum(float(r["weight"]) for r in rows) == pytest.approx(1.0, abs=1e-5)
    # one pass's FLOPs are 2*M*N*K*count with one M: the share is N*K*count / total; two passes
    nk = {"qkv": 768 * 512 * 4, "o": 512 * 512 * 4, "gate_up": 3072 * 512 * 4,
          "down": 512 * 1536 * 4, "lm_head": 1000 * 512}
    total = sum(nk.values())
    for r in rows:
        assert float(r["weight"]) == pytest.approx(nk[r["layer"]] / total / 2, rel=1e-5)
    # the campaign's and the tuner's reader takes it: distinct (M, N, K) in file order
    assert [(s.M, s.N, s.K) for s in read_shapes(out)[:3]] == [(1, 768, 512), (1, 512, 512), (1, 3072, 512)]
    # config.json path works as well as the folder
    assert S.read_config(d / "config.json").hidden == 512


@pytest.mark.parametrize("change, tp, field", [
    ({"hidden_size": None}, 1, "hidden_size"),
    ({"num_attention_heads": 7}, 1, "num_attention_heads"),
    ({"num_key_value_heads": 3}, 1, "num_key_value_heads"),
    ({"intermediate_size": "1536"}, 1, "intermediate_size"),
    ({}, 3, "num_attention_heads"),
    ({"num_attention_heads": 12, "hidden_size": 768, "num_key_value_heads": 4}, 8, "num_attention_heads"),
    ({"intermediate_size": 1537}, 2, "intermediate_size"),
    # 16 ranks cannot share 3 kv heads evenly
    ({"num_attention_heads": 48, "hidden_size": 3072, "num_key_value_heads": 3}, 16, "num_key_value_heads"),
])
def test_malformed_configs_name_the_field(tmp_path, change, tp, field):
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    with pytest.raises(S.ConfigError, match=repr(field)):
        S.layer_gemms(S.read_config(_model(tmp_path, cfg)), 1, tp=tp)


def test_unreadable_configs_say_why(tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text("{ not json")
    with pytest.raises(S.ConfigError, match="not JSON"):
        S.read_config(d)
    with pytest.raises(S.ConfigError, match="no such config"):
        S.read_config(tmp_path / "nowhere")
    moe = _model(tmp_path, {k: v for k, v in MIXTRAL.items() if k != "num_experts_per_tok"}, "moe")
    with pytest.raises(S.ConfigError, match="'num_experts_per_tok' is missing"):
        S.read_config(moe)
    assert cli.main(["shapes", "--model", str(d), "--out", str(tmp_path / "x.csv")]) == 2
    assert "not JSON" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()
