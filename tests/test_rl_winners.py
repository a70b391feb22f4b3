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
# the families line of the warm-start test's prompts (pinned there)
PINNED_FAMILIES = ("mma (mma_hgemm.cuh), ptx (ptx_hgemm.cuh), cutlass_sm90 (cutlass_sm90.cuh), "
                   "wgmma (wgmma_hgemm.cuh), lowlat (lowlat_hgemm.cuh), lowlat_mma (lowlat_hgemm.cuh), "
                   "skinny (skinny_hgemm.cuh), skinny_n (skinny_n_hgemm.cuh)")


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


def test_the_warm_started_policy_writes_each_shapes_own_winner(db, tmp_path, monkeypatch):
    """python -m cudal2_rl.warmstart --db --base on a tiny causal LM made here (2 layers, hidden 64,
    a BPE tokenizer trained on the pairs' text with the project's train_tokenizer, random weights:
    nothing downloaded), then the warm-started policy (load_policy with the adapter) greedily
    writes a kernel for each shape's prompt: the small shape gets its winner's 64-row mma tile,
    the big one its 128x256 wgmma tile, though the big shape's prompt shows the small shape's
    winner as its earlier kernel. The completions are whole (short, template-include) kernel
    files. The base's init scale is 0.3, not 0.02: LoRA trains only the projections, and with
    the tied embeddings at 0.02 a 64-wide model's logits stay near uniform (the loss stalls)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from cudal2_rl import prompts, warmstart
    from cudal2_rl.policy import load_policy, train_tokenizer
    # the prompts' family list as the 60 steps below were tuned on: every family registered since
    # lengthens both prompts, and this random 64-wide model's training moves with them (the gemv
    # family's one entry made it write a 128-row tile for the small shape)
    monkeypatch.setattr(prompts, "families_line", lambda arch: PINNED_FAMILIES)
    pairs = W.db_pairs(db)
    assert [(shape, comp) for _p, comp, shape, _w in pairs] == [((256, 256, 256), K1), ((4096, 4096, 4096), K2)]
    assert K1 in pairs[1][0]                         # the big shape's prompt shows the small one's winner
    tok = train_tokenizer([p + c for p, c, *_ in pairs], 512)
    torch.manual_seed(0)
    base = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, initializer_range=0.3, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None)).save_pretrained(base)
    tok.save_pretrained(base)
    out = tmp_path / "adapter"
    assert warmstart.main(["--base", str(base), "--db", str(tmp_path / "r.db"), "--steps", "60",
                           "--lr", "1e-2", "--threads", "1", "--save-every", "60", "--out", str(out)]) == 0
    model, tok = load_policy(str(base), adapter=out, log=lambda *a: None)
    model.eval()
    wrote = {}
    for prompt, _c, shape, _w in pairs:
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
        wrote[shape] = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert wrote[(256, 256, 256)].startswith("#define BM 64\n#define BN 64\n"), wrote
    assert wrote[(4096, 4096, 4096)].startswith("#define BM 128\n#define BN 256\n"), wrote
    assert wrote[(256, 256, 256)].strip() == K1.strip() and wrote[(4096, 4096, 4096)].strip() == K2.strip()
