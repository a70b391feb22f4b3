"""The RL loop end to end: the built-in policy (small test recipe, built once and cached), its
build rate, and a 2-step trl GRPO run through the real build + audit path without a GPU."""
import csv
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.compile, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_policy():
    from cudal2_rl.policy import SMALL_RECIPE, build_builtin
    return build_builtin(SMALL_RECIPE, log=lambda *a: None)


def test_builtin_policy_has_chat_template_and_builds_kernels(small_policy):
    from transformers import AutoTokenizer
    from cudal2_rl.policy import SMALL_RECIPE, build_check
    tok = AutoTokenizer.from_pretrained(small_policy)
    assert tok.chat_template and tok.eos_token == "<|end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hgemm M=64 N=64 K=64"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>hgemm M=64 N=64 K=64<|end|><|assistant|>"
    rep = build_check(str(small_policy), samples=8, seed=1, recipe=SMALL_RECIPE, log=lambda *a: None)
    # after its warm start most sampled kernels extract and build with nvcc (16/16 measured for
    # both recipes with pinned warp tiles and min_p sampling), and they differ (GRPO needs variety)
    assert rep["fraction_built"] >= 0.75, rep
    assert rep["unique_sources"] >= 4, rep
    assert rep["in_warm_start"] == 8      # its SFT covers the whole grid: nothing is held out


def test_grpo_two_steps_real_harness(tmp_path, small_policy, monkeypatch, capsys):
    from cudal2_rl.config import RLConfig
    from cudal2_rl.train import run
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n64,128,256\n256,256,512\n1024,64,128\n")
    kdir = tmp_path / "generated_kernels"
    out = tmp_path / "run"
    res = run(RLConfig(policy=str(small_policy), shapes=str(shapes), sample=2, steps=2,
                       out=str(out), num_generations=2, prompts_per_step=2, jobs=2,
                       kernels_dir=str(kdir), timeout=300, seed=0, launch_bound="keep",
                       save_checkpoints=True))
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    step_recs = [r for r in steps if r.get("type") == "step"]
    assert [r["step"] for r in step_recs] == [1, 2]
    reward = res["reward"]
    for r in step_recs:
        assert r["summary"]["n"] == 4 and r["summary"]["reward_mean"] is not None
        if reward.estimated:
            assert "estimated: no GPU" in r["line"]
    # every reward for code has a DB row; repeated kernels were served from it
    from cudal2.harness.db import ResultsDB
    db = ResultsDB(out / "results.db")
    rows = db.rows()
    pairs = {(a["sha"], tuple(a["shape"])) for r in step_recs for a in r["attempts"] if a["sha"]}
    assert len(rows) == len(pairs) == reward.n_evaluated
    assert any(a["compiled"] for r in step_recs for a in r["attempts"])   # real nvcc builds
    if reward.estimated:
        assert all(r.estimated for r in rows if r.status == "not_measured")
        assert not kdir.exists() or not (kdir / "index.csv").exists()      # nothing estimated exported
        assert any(r.get("type") == "export" and r["exported"] == 0 for r in steps)
    table = list(csv.DictReader((out / "best_kernels.csv").open()))
    assert len(table) == 2
    for row in table:
        if row["file"]:
            assert (out / row["file"]).read_text().strip()
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("checkpoint-*"))
    # the closing line names everything the run wrote (the DB's WAL files aside)
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("outputs: ")][-1]
    named = {Path(p.split(" (")[0].rstrip("/")).name for p in line[len("outputs: "):].split(", ")}
    written = {p.name for p in out.iterdir() if not p.name.startswith("results.db-")}
    assert written and written <= named, (written - named, line)
    # resume: one more step from the last checkpoint, log appended, cache reused
    run(RLConfig(policy=str(small_policy), shapes=str(shapes), sample=2, steps=3,
             out=str(out), num_generations=2, prompts_per_step=2, jobs=2,
             kernels_dir=str(kdir), timeout=300, seed=0, resume=True, launch_bound="keep"))
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("type") == "step"] == [1, 2, 3]
    assert any(r.get("type") == "resume" for r in steps)


def test_launch_bound_shapes_are_left_out_with_the_reason_logged(tmp_path):
    from cudal2_rl.config import RLConfig
    from cudal2_rl.train import RunLog, choose_shapes
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n64,64,64\n4096,4096,4096\n")
    log = RunLog(tmp_path / "log.jsonl")
    cfg = RLConfig(shapes=str(shapes), sample=0, out=str(tmp_path))
    assert choose_shapes(cfg, log, tmp_path / "none.db", gpu="") == [(4096, 4096, 4096)]
    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    left = [r for r in recs if r.get("type") == "launch_bound"]
    assert [r["shape"] for r in left] == [[64, 64, 64]] and left[0]["left_out"]
    assert "launch floor" in left[0]["reason"]
    # kept on request, and said so
    keep = RLConfig(shapes=str(shapes), sample=0, out=str(tmp_path), launch_bound="keep")
    assert choose_shapes(keep, log, tmp_path / "none.db", gpu="") == [(64, 64, 64), (4096, 4096, 4096)]
    # nothing left: a clear error, not an empty run
    shapes.write_text("M,N,K\n64,64,64\n")
    with pytest.raises(ValueError, match="launch-bound"):
        choose_shapes(cfg, log, tmp_path / "none.db", gpu="")


def test_the_main_job_shows_what_the_policy_wrote(tmp_path, capsys):
    """A best kernel when one built, else the last completion with its verdict: never nothing."""
    from types import SimpleNamespace
    from cudal2_rl.reward import Attempt
    from cudal2_rl.train import _show_written
    r = SimpleNamespace(attempts=[
        [Attempt((64, 64, 64), "build_error", -0.5, detail="nvcc: error\nmore", source="// first\n")],
        [Attempt((128, 64, 64), "not_abi", -0.85, detail="no cudal2_meta", source="// second\n"),
         Attempt((128, 64, 64), "not_abi", -0.85, source="  \n")]])
    _show_written(r, tmp_path)
    out = capsys.readouterr().out
    assert "no kernel built; last completion for 128x64x64, verdict not_abi: no cudal2_meta" in out
    assert "// second" in out
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "64_64_64.cu").write_text("// best\n")
    _show_written(r, tmp_path)
    assert "// best" in capsys.readouterr().out


def test_checkpoints_only_when_asked():
    """A demo keeps its outputs and the final policy, not the optimizer state: trl saves
    checkpoints only with --save-checkpoints or --resume (the settings trl is given)."""
    import argparse
    from cudal2_rl.config import RLConfig, add_arguments, from_args
    from cudal2_rl.train import checkpoint_args
    p = argparse.ArgumentParser()
    add_arguments(p)
    demo = from_args(p.parse_args("--steps 2 --sample 1 --num-generations 2 --out runs/demo".split()))
    assert checkpoint_args(demo) == {"save_strategy": "no"}
    asked = from_args(p.parse_args("--steps 2 --save-checkpoints".split()))
    assert checkpoint_args(asked) == {"save_strategy": "steps", "save_steps": 2, "save_total_limit": 2}
    assert checkpoint_args(RLConfig(steps=200, resume=True))["save_steps"] == 50
    assert checkpoint_args(RLConfig(steps=200, save_checkpoints=True, save_steps=7))["save_steps"] == 7


def test_grpo_under_accelerate_two_processes(tmp_path, small_policy):
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU: two gloo processes train one
    GRPO step; rank 0 alone evaluates both ranks' completions and writes the DB and the log."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate is not installed (pip install accelerate)")
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n64,128,256\n")
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDAL2_BUILD_JOBS": "1"}
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           "-m", "cudal2_rl.train", "--policy", str(small_policy), "--shapes", str(shapes),
           "--steps", "1", "--out", str(out), "--num-generations", "2", "--prompts-per-step", "1",
           "--jobs", "1", "--launch-bound", "keep", "--kernels-dir", str(tmp_path / "gk"), "--seed", "0"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    dist = [r for r in recs if r.get("type") == "distributed"]
    assert len(dist) == 1 and dist[0]["processes"] == 2 and dist[0]["backend"] == "gloo"
    assert len([r for r in recs if r.get("type") == "setup"]) == 1       # one writer
    steps = [r for r in recs if r.get("type") == "step"]
    assert [r["step"] for r in steps] == [1]
    assert steps[0]["summary"]["n"] == 2            # one completion per rank, both scored by rank 0
    from cudal2.harness.db import ResultsDB
    rows = ResultsDB(out / "results.db").rows()
    assert len(rows) == len({a["sha"] for a in steps[0]["attempts"] if a["sha"]})
    assert (out / "policy" / "config.json").is_file()


def test_any_causal_lm_folder_loads_offline_or_names_what_is_missing(tmp_path, small_policy):
    """--policy PATH: a transformers causal-LM folder (here the test policy saved as a plain
    model, no recipe) loads offline with its chat template; a folder missing the tokenizer, the
    chat template or the weights is refused with an error naming it."""
    import shutil
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from cudal2_rl.policy import default_style, is_builtin, load_policy
    folder = tmp_path / "my-model"
    AutoModelForCausalLM.from_pretrained(small_policy).save_pretrained(folder)
    AutoTokenizer.from_pretrained(small_policy).save_pretrained(folder)
    assert not is_builtin(str(folder)) and default_style(str(folder)) == "full"
    model, tok = load_policy(str(folder), log=lambda *a: None)
    text = tok.apply_chat_template([{"role": "user", "content": "hgemm M=64 N=64 K=64"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>")
    ids = tok(text, return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]

    no_weights = tmp_path / "no-weights"
    shutil.copytree(folder, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="cannot load a causal LM"):
        load_policy(str(no_weights), log=lambda *a: None)
    no_template = tmp_path / "no-template"
    shutil.copytree(folder, no_template)
    for f in no_template.glob("*chat_template*"):
        f.unlink()
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        load_policy(str(no_template), log=lambda *a: None)
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    shutil.copy(folder / "config.json", no_tokenizer)
    shutil.copy(folder / "model.safetensors", no_tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        load_policy(str(no_tokenizer), log=lambda *a: None)


def test_warm_start_sft_step_on_a_results_db_measured_winners(tmp_path, small_policy):
    """python -m cudal2_rl.warmstart --db --base: the test policy takes one LoRA SFT step on the
    measured winners of a small results DB (estimated rows never enter)."""
    import math
    from safetensors.torch import load_file
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.types import Evaluation, Shape
    from cudal2_rl import warmstart
    from cudal2_rl.reward import source_sha
    k1 = '#define BM 64\n#define BN 64\n#include "mma_hgemm.cuh"\n'
    k2 = '#define BM 128\n#define BN 256\n#include "wgmma_hgemm.cuh"\n'
    db = ResultsDB(tmp_path / "r.db")
    for src, shape, speedup, est in ((k1, (256, 256, 256), 1.2, False), (k2, (256, 256, 256), 0.9, False),
                                     (k2, (4096, 4096, 4096), 1.3, False), (k1, (4096, 4096, 4096), 5.0, True)):
        e = Evaluation(status="not_measured" if est else "ok", source_sha=source_sha(src), shape=Shape(*shape),
                       arch="sm_90a", acc="f32", layout="RR", env={"gpu": "NVIDIA H100 80GB HBM3"},
                       estimated=est, stage="final")
        e.timings = {"offline": {"candidate": {"median_us": 100.0 / speedup}}}
        e.speedups = {"offline": {"cublaslt_autotuned": speedup}}
        db.add(e, source=src)
    out = tmp_path / "adapter"
    assert warmstart.main(["--base", str(small_policy), "--db", str(tmp_path / "r.db"), "--steps", "1",
                           "--threads", "1", "--out", str(out)]) == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["pairs"] == 2 and recipe["steps_done"] == 1 and recipe["base"] == str(small_policy)
    assert math.isfinite(recipe["losses"][0])
    lora_b = [t for k, t in load_file(str(out / "adapter_model.safetensors")).items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)       # the step moved the adapter
    with pytest.raises(SystemExit, match="--base"):
        warmstart.main(["--base", str(tmp_path / "missing"), "--db", str(tmp_path / "r.db"), "--steps", "1"])


def _table_of(sources_dir, shapes, db_path):
    """A synthetic reward table (test data, not a measurement): every source the run wrote,
    built (from the build cache) for its binary key, measured at each shape at a distinct time."""
    from cudal2.core.build import BuildSpec, build
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.types import Evaluation, Shape
    from cudal2.core.identity import source_sha
    db = ResultsDB(db_path)
    keys = 0
    for i, src in enumerate(sorted(sources_dir.glob("*.cu"))):
        text = src.read_text()
        br = build(BuildSpec(text, arch="sm_90a"))
        if not br.ok or not br.binary_key:
            continue
        keys += 1
        for M, N, K in shapes:
            for draw in range(2):
                us = 10.0 + 3.0 * i + 0.01 * draw
                db.add(Evaluation(status="ok", source_sha=source_sha(text), shape=Shape(M, N, K),
                                  arch="sm_90a", acc="f32", layout="RR", stage="final",
                                  binary_key=br.binary_key,
                                  timings={"offline": {"candidate": {"median_us": us},
                                                       "cublaslt_autotuned": {"median_us": 20.0}}},
                                  env={"gpu": "TEST GPU", "settings": {"timer": "kernel",
                                                                      "operands": "cold"}}),
                       source=text)
    db.close()
    return keys


def test_main_job_learns_from_a_table_that_covers_its_shapes(tmp_path, small_policy):
    """Without a GPU, a table that measured the kernels the policy writes gives measured rewards:
    reward variance in the groups and a gradient. A first run with no table learns what the
    seeded policy writes; the second, with a table of those binaries, trains on it."""
    from cudal2_rl.config import RLConfig
    from cudal2_rl.train import run
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n")
    common = dict(policy=str(small_policy), shapes=str(shapes), steps=1, num_generations=4,
                  prompts_per_step=1, jobs=2, timeout=300, seed=0, launch_bound="keep",
                  export=False, temperature=1.5)
    first = tmp_path / "first"
    run(RLConfig(out=str(first), table="none", **common))
    assert _table_of(first / "sources", [(1024, 1024, 1024)], tmp_path / "table.db") >= 2
    out = tmp_path / "run"
    res = run(RLConfig(out=str(out), table=str(tmp_path / "table.db"), **common))
    if not res["reward"].estimated:
        pytest.skip("a GPU is visible: rewards come from the harness, not the table")
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert any(r.get("type") == "table" and r["gpu"] == "TEST GPU" for r in recs)
    step = [r for r in recs if r.get("type") == "step"][0]
    assert step["summary"]["table_hits"] >= 2, step["line"]
    assert step["summary"]["reward_std"] > 0 and step["trl"]["grad_norm"] > 0, step["line"]
    assert "table: " in step["line"]
    done = [r for r in recs if r.get("type") == "done"][0]     # charged to RL by the experiment
    assert done["table_reads"] >= 2
