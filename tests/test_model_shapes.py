"""`cudal2 shapes --model`: a model's linear layers from its config, checked against sizes worked
out by hand for small synthetic configs (no download, no GPU)."""
import csv
import json
import os
from pathlib import Path

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
        ("shared_expert_gate", 8, 1, 256, 2), ("lm_head", 8, 320, 256, 1)}
    # separate, tp 1: the shared expert's gate and up of 256 each; its sigmoid gate hidden -> 1
    sep = _shapes(m, 8, fused=False)
    assert {r for r in sep if r[0].startswith("shared")} == {
        ("shared_gate", 8, 256, 256, 2), ("shared_up", 8, 256, 256, 2),
        ("shared_down", 8, 256, 256, 2), ("shared_expert_gate", 8, 1, 256, 2)}


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


# --- every decoder family: (N, K, count) per layer worked out by hand ----------------------------
def _nk(tmp_path, cfg, tp=1, fused=True, tokens=4):
    """{layer: (N, K, count)} of one rank; every row's M is `tokens` (no experts here)."""
    gemms = S.layer_gemms(S.read_config(_model(tmp_path, cfg)), tokens, tp=tp, fused=fused)
    assert {m for _, m, _, _, _ in gemms} == {tokens}
    return {layer: (n, k, c) for layer, _, n, k, c in gemms}


# GPT-NeoX (Pythia): fused query_key_value of 3 x hidden, dense_h_to_4h / dense_4h_to_h.
GPT_NEOX = dict(model_type="gpt_neox", hidden_size=256, num_attention_heads=4, num_hidden_layers=2,
                intermediate_size=1024, vocab_size=500, rotary_pct=0.25, use_parallel_residual=True)
# GPT-2: Conv1D c_attn / c_proj / c_fc / c_proj; n_inner null = 4 x n_embd = 512; hd 32.
GPT2 = dict(model_type="gpt2", n_embd=128, n_head=4, n_layer=3, n_inner=None, n_positions=1024,
            vocab_size=301, activation_function="gelu_new")
# StarCoder (GPTBigCode): multi-query fused c_attn, hidden + 2 hd; hd 32.
BIGCODE = dict(model_type="gpt_bigcode", n_embd=256, n_head=8, n_layer=2, n_inner=1024,
               multi_query=True, n_positions=2048, vocab_size=1000)
# Phi-2: separate q/k/v (no kv field: all heads), dense, fc1/fc2; hd 32.
PHI = dict(model_type="phi", hidden_size=256, num_attention_heads=8, num_key_value_heads=None,
           num_hidden_layers=2, intermediate_size=1024, vocab_size=512, partial_rotary_factor=0.5)
# OPT-350m-like: ffn_dim, q/k/v/out_proj, embeddings of 128 projected in and out of 256; hd 64.
OPT = dict(model_type="opt", hidden_size=256, ffn_dim=1024, num_attention_heads=4,
           num_hidden_layers=2, word_embed_proj_dim=128, vocab_size=600, do_layer_norm_before=False)
# StarCoder2: GQA q/k/v/o (6 heads of 64, 2 kv heads), c_fc / c_proj.
STARCODER2 = dict(model_type="starcoder2", hidden_size=384, num_attention_heads=6,
                  num_key_value_heads=2, num_hidden_layers=2, intermediate_size=1536,
                  vocab_size=700, use_bias=True)
# Falcon-7B-like: multi-query query_key_value (hidden + 2 hd), MLP 4 x hidden = 1024; hd 32.
FALCON = dict(model_type="falcon", hidden_size=256, num_attention_heads=8, num_hidden_layers=2,
              multi_query=True, new_decoder_architecture=False, parallel_attn=True, alibi=False,
              bias=False, vocab_size=400)


@pytest.mark.parametrize("cfg, tp, fused, want", [
    # 3 x 256 = 768; tp 2: (2 + 2*2) x 64 = 384, 512 of the MLP's 1024 per rank
    (GPT_NEOX, 1, True, {"qkv": (768, 256, 2), "o": (256, 256, 2), "up": (1024, 256, 2),
                         "down": (256, 1024, 2), "lm_head": (500, 256, 1)}),
    (GPT_NEOX, 2, False, {"qkv": (384, 256, 2), "o": (256, 128, 2), "up": (512, 256, 2),
                          "down": (256, 512, 2), "lm_head": (250, 256, 1)}),
    (GPT2, 1, False, {"qkv": (384, 128, 3), "o": (128, 128, 3), "up": (512, 128, 3),
                      "down": (128, 512, 3), "lm_head": (301, 128, 1)}),
    (GPT2, 2, True, {"qkv": (192, 128, 3), "o": (128, 64, 3), "up": (256, 128, 3),
                     "down": (128, 256, 3), "lm_head": (151, 128, 1)}),   # ceil(301 / 2)
    # (8 + 2) x 32 = 320; tp 2: 4 heads and the one kv head replicated, (4 + 2) x 32 = 192
    (BIGCODE, 1, False, {"qkv": (320, 256, 2), "o": (256, 256, 2), "up": (1024, 256, 2),
                         "down": (256, 1024, 2), "lm_head": (1000, 256, 1)}),
    (BIGCODE, 2, True, {"qkv": (192, 256, 2), "o": (256, 128, 2), "up": (512, 256, 2),
                        "down": (256, 512, 2), "lm_head": (500, 256, 1)}),
    (PHI, 1, True, {"qkv": (768, 256, 2), "o": (256, 256, 2), "up": (1024, 256, 2),
                    "down": (256, 1024, 2), "lm_head": (512, 256, 1)}),
    (PHI, 2, False, {"q": (128, 256, 2), "k": (128, 256, 2), "v": (128, 256, 2),
                     "o": (256, 128, 2), "up": (512, 256, 2), "down": (256, 512, 2),
                     "lm_head": (256, 256, 1)}),
    # projections replicated, once per pass; lm_head K = word_embed_proj_dim
    (OPT, 1, False, {"project_in": (256, 128, 1), "q": (256, 256, 2), "k": (256, 256, 2),
                     "v": (256, 256, 2), "o": (256, 256, 2), "up": (1024, 256, 2),
                     "down": (256, 1024, 2), "project_out": (128, 256, 1), "lm_head": (600, 128, 1)}),
    (OPT, 2, True, {"project_in": (256, 128, 1), "qkv": (384, 256, 2), "o": (256, 128, 2),
                    "up": (512, 256, 2), "down": (256, 512, 2), "project_out": (128, 256, 1),
                    "lm_head": (300, 128, 1)}),
    # (6 + 2*2) x 64 = 640; tp 2: 3 heads and 1 kv head per rank
    (STARCODER2, 1, True, {"qkv": (640, 384, 2), "o": (384, 384, 2), "up": (1536, 384, 2),
                           "down": (384, 1536, 2), "lm_head": (700, 384, 1)}),
    (STARCODER2, 2, False, {"q": (192, 384, 2), "k": (64, 384, 2), "v": (64, 384, 2),
                            "o": (384, 192, 2), "up": (768, 384, 2), "down": (384, 768, 2),
                            "lm_head": (350, 384, 1)}),
    # 256 + 2 x 32 = 320; tp 2: (4 + 2) x 32 = 192 (the kv head replicated)
    (FALCON, 1, False, {"qkv": (320, 256, 2), "o": (256, 256, 2), "up": (1024, 256, 2),
                        "down": (256, 1024, 2), "lm_head": (400, 256, 1)}),
    (FALCON, 2, True, {"qkv": (192, 256, 2), "o": (256, 128, 2), "up": (512, 256, 2),
                       "down": (256, 512, 2), "lm_head": (200, 256, 1)}),
], ids=lambda v: v.get("model_type") if isinstance(v, dict) and "model_type" in v else None)
def test_non_gated_decoders_have_no_gate(tmp_path, cfg, tp, fused, want):
    assert _nk(tmp_path, cfg, tp, fused) == want


def test_a_fused_checkpoint_stays_fused_under_separate(tmp_path):
    """--separate is transformers' modules: GPT-NeoX's query_key_value and Phi-3's qkv_proj and
    gate_up_proj are one weight there; Phi-2's q/k/v and GPT-J's are three."""
    m = S.read_config(_model(tmp_path, GPT_NEOX, "neox"))
    assert _shapes(m, 4, fused=False) == _shapes(m, 4) == {
        ("qkv", 4, 768, 256, 2), ("o", 4, 256, 256, 2), ("up", 4, 1024, 256, 2),
        ("down", 4, 256, 1024, 2), ("lm_head", 4, 500, 256, 1)}
    phi3 = dict(model_type="phi3", hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                num_hidden_layers=2, intermediate_size=512, vocab_size=320)
    # (8 + 2*4) x 32 = 512; gate_up 2 x 512
    assert _nk(tmp_path, phi3, fused=False) == {"qkv": (512, 256, 2), "o": (256, 256, 2),
                                                "gate_up": (1024, 256, 2), "down": (256, 512, 2),
                                                "lm_head": (320, 256, 1)}
    gptj = dict(model_type="gptj", n_embd=256, n_head=4, n_layer=2, n_inner=None, rotary_dim=64,
                vocab_size=400)
    (tmp_path / "j").mkdir()
    assert _nk(tmp_path / "j", gptj, fused=False) == {
        "q": (256, 256, 2), "k": (256, 256, 2), "v": (256, 256, 2), "o": (256, 256, 2),
        "up": (1024, 256, 2), "down": (256, 1024, 2), "lm_head": (400, 256, 1)}


def test_falcon_variants_and_explicit_widths(tmp_path):
    # Falcon-40B-like: 8 heads of 32, 2 kv heads: (8 + 2*2) x 32 = 384; ffn_hidden_size 768
    new = {**FALCON, "new_decoder_architecture": True, "num_kv_heads": 2, "ffn_hidden_size": 768}
    assert _nk(tmp_path, new, tp=2) == {"qkv": (192, 256, 2), "o": (256, 128, 2),
                                        "up": (384, 256, 2), "down": (256, 384, 2),
                                        "lm_head": (200, 256, 1)}
    (tmp_path / "rw").mkdir()   # Falcon-RW: no multi-query, 3 x hidden
    assert _nk(tmp_path / "rw", {**FALCON, "multi_query": False})["qkv"] == (768, 256, 2)
    (tmp_path / "g").mkdir()    # GPT-2 with n_inner given
    assert _nk(tmp_path / "g", {**GPT2, "n_inner": 384})["up"] == (384, 128, 3)
    (tmp_path / "o").mkdir()    # OPT whose embeddings are as wide as its layers: no projections
    assert set(_nk(tmp_path / "o", {**OPT, "word_embed_proj_dim": 256})) == {
        "qkv", "o", "up", "down", "lm_head"}


def test_gpt2_conv1d_is_rr_as_transformers_runs_it_and_rc_as_vllm_loads_it(tmp_path, capsys):
    m = S.read_config(_model(tmp_path, GPT2, "gpt2"))
    sep = {r["layer"]: r["layout"] for r in S.model_rows(m, [1], fused=False)}
    assert sep == {"qkv": "RR", "o": "RR", "up": "RR", "down": "RR", "lm_head": "RC"}
    assert {r["layout"] for r in S.model_rows(m, [1])} == {"RC"}
    out = tmp_path / "g.csv"
    assert cli.main(["shapes", "--model", str(tmp_path / "gpt2"), "--separate", "--tokens", "1",
                     "--out", str(out)]) == 0
    assert "layout RC+RR; the planners take one layout per file" in capsys.readouterr().out
    assert [r["layout"] for r in csv.DictReader(out.open())] == ["RR"] * 4 + ["RC"]


def test_deepseek_moe_shared_experts_have_no_gate(tmp_path):
    # layer 0 dense (first_k_dense_replace), layer 1: 8 experts of 64, top-2, 2 shared = 128
    cfg = dict(model_type="deepseek", hidden_size=256, num_attention_heads=4, num_hidden_layers=2,
               intermediate_size=512, n_routed_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=64, n_shared_experts=2, first_k_dense_replace=1,
               moe_layer_freq=1, vocab_size=320)
    m = S.read_config(_model(tmp_path, cfg))
    # 4 tokens x 2 = 8 assignments over 8 experts: 1 token each, all 8 active
    assert _shapes(m, 4, tp=2) == {
        ("qkv", 4, 384, 256, 2), ("o", 4, 256, 128, 2), ("gate_up", 4, 512, 256, 1),
        ("down", 4, 256, 256, 1), ("router", 4, 8, 256, 1), ("expert_gate_up", 1, 64, 256, 8),
        ("expert_down", 1, 256, 32, 8), ("shared_gate_up", 4, 128, 256, 1),
        ("shared_down", 4, 256, 64, 1), ("lm_head", 4, 160, 256, 1)}
    # moe_layer_freq 2 over 5 layers, the first dense: layers 2 and 4 are sparse, 0, 1, 3 dense
    (tmp_path / "f").mkdir()
    m = S.read_config(_model(tmp_path / "f", {**cfg, "num_hidden_layers": 5, "moe_layer_freq": 2}))
    assert (m.moe_layers, m.layers - m.moe_layers) == (2, 3)


# --- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, says", [
    (dict(model_type="bert", hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
          intermediate_size=3072, vocab_size=30522), "'bert': an encoder-only model"),
    (dict(model_type="t5", d_model=512, num_heads=8, num_layers=6, d_ff=2048, vocab_size=32128),
     "'t5': an encoder-decoder model"),
    (dict(model_type="mamba", hidden_size=768, num_hidden_layers=24, vocab_size=50280),
     "'mamba': not a supported decoder"),
    # a multimodal wrapper is judged by its language model
    (dict(model_type="llava", text_config=dict(model_type="rwkv", hidden_size=64)),
     "'rwkv': not a supported decoder"),
])
def test_encoders_and_unknown_types_are_refused_naming_model_type(tmp_path, capsys, cfg, says):
    d = _model(tmp_path, cfg)
    with pytest.raises(S.ConfigError, match=f"field 'model_type' is {says}; supported: .*gpt2.*llama"):
        S.read_config(d)
    assert cli.main(["shapes", "--model", str(d), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_type" in err and not (tmp_path / "x.csv").exists()


def test_mla_is_refused_before_the_type(tmp_path):
    cfg = dict(model_type="deepseek_v3", hidden_size=256, num_attention_heads=4, kv_lora_rank=64,
               num_hidden_layers=2, vocab_size=320)
    with pytest.raises(S.ConfigError, match="'kv_lora_rank': multi-head latent attention"):
        S.read_config(_model(tmp_path, cfg))


@pytest.mark.parametrize("cfg, field", [
    ({**FALCON, "multi_query": None}, "'multi_query' is missing"),
    ({**FALCON, "multi_query": "yes"}, "'multi_query' must be true or false, got 'yes'"),
    ({**FALCON, "new_decoder_architecture": True}, "'num_kv_heads' is missing"),
    ({**FALCON, "new_decoder_architecture": True, "num_kv_heads": 3},
     "'num_kv_heads' \\(3\\) does not divide"),
    ({k: v for k, v in BIGCODE.items() if k != "multi_query"}, "'multi_query' is missing"),
    ({k: v for k, v in OPT.items() if k != "ffn_dim"}, "'intermediate_size' is missing"),
    ({**STARCODER2, "intermediate_size": 1537},
     "'intermediate_size' \\(1537\\) is not divisible by tp=2"),
    ({**FALCON, "ffn_hidden_size": 1023}, "'ffn_hidden_size' \\(1023\\) is not divisible by tp=2"),
])
def test_family_fields_are_named_when_malformed(tmp_path, cfg, field):
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(S.ConfigError, match=field):
        S.layer_gemms(S.read_config(_model(tmp_path, cfg)), 1, tp=2)


# --- hub ids from the local Hugging Face cache ----------------------------------------------------
def _cache_repo(hub, repo_id, configs, main=None):
    """A cache folder as huggingface_hub lays one out: blobs, snapshots/<rev>/config.json linked
    to its blob, refs/main; `configs` {revision: config}, oldest first by mtime."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    for i, (rev, cfg) in enumerate(configs.items()):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_text(json.dumps(cfg))
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "config.json").symlink_to(Path("..", "..", "blobs", blob.name))
        os.utime(snap, (1_000_000 + i, 1_000_000 + i))
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(main)
    return repo


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # no folder named like the hub id
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_hub_id_resolves_to_refs_main_and_is_named_by_repo(hub, tmp_path):
    # refs/main names the older revision: it wins over the newer snapshot (vocab 999)
    old, new = "a" * 40, "b" * 40
    _cache_repo(hub, "acme/tiny-llama", {old: {**LLAMA, "_name_or_path": "/fsx/ckpt/final"},
                                         new: {**LLAMA, "vocab_size": 999}}, main=old)
    m = S.read_config("acme/tiny-llama")
    assert (m.vocab, m.name) == (1000, "tiny-llama")
    out = tmp_path / "t.csv"
    assert cli.main(["shapes", "--model", "acme/tiny-llama", "--tokens", "1", "--out", str(out)]) == 0
    assert {r["model"] for r in csv.DictReader(out.open())} == {"tiny-llama"}
    # the snapshot folder itself (named by its hash) also gives the repo's name
    snap = hub / "models--acme--tiny-llama" / "snapshots" / new
    assert S.read_config(snap).name == "tiny-llama" and S.read_config(snap / "config.json").vocab == 999


def test_hub_id_without_refs_takes_the_newest_snapshot(hub):
    _cache_repo(hub, "acme/m", {"r1": {**LLAMA, "vocab_size": 111}, "r2": {**LLAMA, "vocab_size": 222}})
    assert S.read_config("acme/m").vocab == 222
    _cache_repo(hub, "gpt2", {"r": GPT2})       # a legacy id without an org
    assert S.read_config("gpt2").name == "gpt2"


def test_hub_id_not_cached_is_refused_saying_where_it_looked(hub, capsys, tmp_path):
    with pytest.raises(S.ConfigError) as exc:
        S.read_config("meta-llama/Meta-Llama-3-8B")
    msg = str(exc.value)
    assert "not in the local Hugging Face cache" in msg and "nothing is downloaded" in msg
    assert str(hub / "models--meta-llama--Meta-Llama-3-8B") in msg and "\n" not in msg
    _cache_repo(hub, "acme/gone", {"r1": LLAMA}, main="r9")
    with pytest.raises(S.ConfigError, match="refs/main names revision r9, whose config.json is "
                                            "not in the cache"):
        S.read_config("acme/gone")
    assert cli.main(["shapes", "--model", "org/none", "--out", str(tmp_path / "x.csv")]) == 2
    assert "models--org--none" in capsys.readouterr().err


def test_cache_folder_follows_huggingface_hub_variables(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert S.hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert S.hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert S.hub_cache() == tmp_path / "c"
