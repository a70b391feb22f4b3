"""The RL-vs-search experiment (rl/experiment/) end to end on a small synthetic reward table
(RewardTable.from_entries: 40 off-grid shapes x 12 binaries with a known best per shape), the
policy arms played by deterministic stand-in proposers, and its statistics, budget, held-out
checks, shards and merge. No LM, no GPU, no nvcc."""
import json
import math
import random
import subprocess
import sys

import pytest

from cudal2.core.identity import source_sha
from cudal2.templates import FAMILIES, enumerate_space, instantiate
from cudal2_rl.experiment import arms as A
from cudal2_rl.experiment import cli, heldout as H, merge, prior, statistics as S
from cudal2_rl.experiment.budget import Allowance, Budget
from cudal2_rl.experiment.policies import Keyer, arm_settings
from cudal2_rl.experiment.rlrun import read_rl_run
from cudal2_rl.experiment.run import Setup, execute
from cudal2_rl.table import Draw, Entry, Queue, RewardTable

# ---- the synthetic table ----------------------------------------------------------------------
# 40 shapes off the grid; binary i is an mma config; at each shape the best binary is opt(shape)
# and every other one is 10% slower per step away from it; 2 draws of 0.5 GPU-s per entry.
SHAPES = sorted((m, n, k) for m in (96, 192, 320, 640, 1280) for n in (160, 384, 768, 1536) for k in (200, 600))
TRAIN = SHAPES[::5]                                    # 8 training shapes
HELD = [s for s in SHAPES if s not in TRAIN]           # 32 held out
CONFIGS = [c for c in enumerate_space(FAMILIES["mma"], arch="sm_90a") if c.get("SPLITK") == 1][:12]
SOURCES = [instantiate(c) for c in CONFIGS]
KEYS = [f"bin{i:02d}" for i in range(12)]


def opt(shape) -> int:
    return (shape[0] // 96 + shape[1] // 160) % 12


def time_us(shape, i) -> float:
    base = shape[0] * shape[1] * shape[2] / 5e7
    return round(base * (1 + 0.1 * abs(i - opt(shape))), 6)


def _entry(shape, i):
    us = time_us(shape, i)
    draws = tuple(Draw(us, None, None, "screen", j, "t.db", 0.5) for j in range(2))
    return Entry(KEYS[i], shape, "RR", "f32", source_sha(SOURCES[i]), SOURCES[i], draws, us, us)


def _baselines():
    # cuBLASLt between the best and the second best at 28 held-out shapes; 4 without one
    return {s: min(time_us(s, i) for i in range(12)) * 1.05 for s in SHAPES if s not in HELD[:4]}


@pytest.fixture(scope="module")
def table():
    return RewardTable.from_entries([_entry(s, i) for s in SHAPES for i in range(12)],
                                    gpu="H100", arch="sm_90a", baselines=_baselines())


def oracle(shape, n, seed):
    """An RL stand-in that learned the structure: the best binary first."""
    return [SOURCES[opt(shape)]] + [SOURCES[(opt(shape) + d) % 12] for d in range(1, n)]


def fixed(shape, n, seed):
    """An SFT stand-in: the same four binaries whatever the shape, one unmeasured source and one
    completion with no kernel."""
    return [None, "// a kernel no GPU measured", *SOURCES[:4]][:n + 2]


def keyer(table):
    return Keyer(table, "sm_90a", build=lambda src: "unmeasured-" + source_sha(src))


def setup_for(shapes=HELD, seeds=(0, 1, 2), shard=(0, 1), budget=None, arms=("rl", "sft", "tune", "random")):
    """A Setup as the command makes it (the RL run read 64 rows, 32 GPU-s, in training)."""
    budget = budget or Budget(4, None, rl_reads=64, rl_gpu_seconds=32.0, n_shapes=len(shapes))
    return Setup(list(shapes), list(arms), list(seeds), budget, {"gpu": "H100", "arch": "sm_90a", "paths": []},
                 shard=shard, notes=["synthetic"])


def _execute(table, out, setup, *, queue=True):
    return execute(table, setup, proposers={"rl": oracle, "sft": fixed}, keyer=keyer(table),
                   model=prior.fit(table, TRAIN), out=out, queue=Queue(out / "queue.jsonl") if queue else None,
                   command="test", log=lambda *a: None)


# ---- end to end -------------------------------------------------------------------------------
def test_end_to_end_on_a_synthetic_table(table, tmp_path):
    out = tmp_path / "x"
    doc = _execute(table, out, setup_for())
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 32 * 3 * 5                          # (rl, sft, tune, random, exhaustive) x shape x seed
    per = {a["arm"]: a for a in doc["summary"]["per_arm"]}
    # RL: charged ceil(64 / 32) = 2 of its 4 evaluations and 32 / 32 = 1 GPU-s per shape; finds the best
    rl = [r for r in rows if r["arm"] == "rl"]
    assert {(r["evaluations"], r["charged_evaluations"], r["charged_gpu_seconds"], r["gpu_seconds"]) for r in rl} == {(2, 2, 1.0, 2.0)}
    assert per["rl"]["vs_best"]["ratio"] == 1.0 and per["rl"]["vs_best"]["found_best"] == 96
    # exhaustive reads all 12 (12 GPU-s at 2 x 0.5 each); its ratio is 1 by definition
    ex = [r for r in rows if r["arm"] == A.REFERENCE]
    assert {(r["evaluations"], r["gpu_seconds"]) for r in ex} == {(12, 12.0)}
    # SFT: a no-code completion costs nothing, the unmeasured source is a miss (counted, no value, queued)
    sft = next(r for r in rows if r["arm"] == "sft" and (r["M"], r["N"], r["K"]) == HELD[5] and r["seed"] == 0)
    assert (sft["samples"], sft["no_code"], sft["evaluations"], sft["misses"], sft["hits"]) == (6, 1, 4, 1, 3)
    best = min(time_us(HELD[5], i) for i in range(12))
    assert sft["winner_us"] == min(time_us(HELD[5], i) for i in range(3)) and sft["best_us"] == best
    queue = [json.loads(x) for x in (out / "queue.jsonl").read_text().splitlines()]
    assert len(queue) == 32 and {q["count"] for q in queue} == {3}        # one per shape, once per seed
    # random reads 4 distinct binaries per (shape, seed); tune within its budget too
    assert {r["evaluations"] for r in rows if r["arm"] in ("random", "tune")} == {4}
    # paired: the oracle beats every search arm and the fixed SFT list; the answer says so
    pairs = {(p["a"], p["b"]): p for p in doc["summary"]["paired"]}
    assert pairs[("rl", "random")]["hi"] < 1.0 and pairs[("rl", "sft")]["hi"] < 1.0
    text = (out / "table.md").read_text()
    assert "**Yes**" in text and "rl beats random" in text and "PILOT" not in text
    assert "96 policy read(s) missed the table" in text
    # fast_1: the RL winner is the best, faster than cuBLASLt's 1.05x at the 28 shapes that have one
    assert per["rl"]["fast_1"] == {"fast_1": 1.0, "n": 84, "no_baseline": 12}
    # confirm.jsonl: per shape, each distinct winner with its source on disk
    lines = [json.loads(x) for x in (out / "confirm.jsonl").read_text().splitlines()]
    assert len(lines) == 32 and all((out / e["source_file"]).read_text() in SOURCES
                                    for c in lines for e in c["entrants"])
    assert any(["exhaustive", 0] in e["chosen_by"] for e in lines[0]["entrants"])


def test_shards_merge_to_the_one_run(table, tmp_path):
    whole = _execute(table, tmp_path / "whole", setup_for(), queue=False)
    for i in (0, 1):
        part = _execute(table, tmp_path / f"s{i}", setup_for(shard=(i, 2)), queue=False)
        assert len(part["remaining"]) == 16 and "PARTIAL: 16 held-out shape(s)" in (tmp_path / f"s{i}" / "table.md").read_text()
    later = json.loads((tmp_path / "s1" / "experiment.json").read_text())
    later["table"]["paths"] = ["a.db", "rows-a-gpu-call-added.db"]      # the table grew between runs
    (tmp_path / "s1" / "experiment.json").write_text(json.dumps(later))
    merged = merge.merge([tmp_path / "s0", tmp_path / "s1"], tmp_path / "m")
    assert merged["summary"] == whole["summary"] and merged["remaining"] == []
    one = merge.merge([tmp_path / "s1"], tmp_path / "m1")
    assert len(one["remaining"]) == 16 and one["pilot"]           # 16 shapes answered: a pilot
    assert len((tmp_path / "m" / "confirm.jsonl").read_text().splitlines()) == 32
    bare = _execute(table, tmp_path / "bare", setup_for(shapes=HELD[:2] + [(7, 7, 7)], seeds=(0,)), queue=False)
    assert bare["remaining"] == [[7, 7, 7]]                       # no table rows yet: it remains
    assert "PARTIAL: 1 held-out shape(s) not run yet" in (tmp_path / "bare" / "README.md").read_text()
    _execute(table, tmp_path / "b", setup_for(budget=Budget(5, None, n_shapes=32)), queue=False)
    with pytest.raises(ValueError, match="its budget differs"):
        merge.merge([tmp_path / "s0", tmp_path / "b"], tmp_path / "bad")


# ---- statistics -------------------------------------------------------------------------------
def test_nested_bootstrap_covers_a_known_ratio():
    rng = random.Random(7)
    groups = {s: [1.25 * math.exp(rng.gauss(0, 0.2)) for _ in range(3)] for s in range(40)}
    g, lo, hi = S.nested_bootstrap(groups, seed=1)
    assert lo < 1.25 < hi and lo < g < hi and hi / lo < 1.3
    assert S.nested_bootstrap(groups, seed=1) == (g, lo, hi)          # deterministic for a seed
    assert S.nested_bootstrap({s: [0.8, 0.8] for s in range(5)}) == pytest.approx((0.8, 0.8, 0.8))


def _row(arm, shape, seed, us, best=1.0, base=None):
    return {"arm": arm, "M": shape, "N": 1, "K": 1, "seed": seed, "winner_us": us, "best_us": best,
            "baseline_us": base, "evaluations": 2, "gpu_seconds": 1.0, "charged_evaluations": 0,
            "charged_gpu_seconds": 0.0, "misses": 0, "hits": 2}


def test_paired_ratio_regret_and_fast_1_are_exact():
    rows = [_row("rl", 1, 0, 2.0, base=3.0), _row("tune", 1, 0, 4.0, base=3.0),
            _row("rl", 2, 0, 3.0, best=3.0), _row("tune", 2, 0, 1.5, best=1.5),
            _row("rl", 3, 0, None, base=1.0), _row("tune", 3, 0, 1.0, base=1.0)]
    p = S.paired(rows, "rl", "tune")
    assert p["ratio"] == pytest.approx(math.sqrt(0.5 * 2.0)) and p["pairs"] == 2 and p["unpaired"] == 1
    assert (p["a_faster"], p["b_faster"]) == (1, 1)
    v = S.vs_best(rows, "rl")
    assert v["ratio"] == pytest.approx(math.sqrt(2.0 * 1.0)) and v["found_best"] == 1 and v["no_winner"] == 1
    assert S.fast_1(rows, "rl") == {"fast_1": 0.5, "n": 2, "no_baseline": 1}   # 2 < 3; no winner is not fast
    assert S.fast_1(rows, "tune") == {"fast_1": 0.0, "n": 2, "no_baseline": 1}


# ---- budget and reads -------------------------------------------------------------------------
def test_budget_charges_rl_training_in_evaluations_and_gpu_seconds(table):
    b = Budget(4, 2.0, rl_reads=10, rl_gpu_seconds=3.0, n_shapes=4)
    assert b.allowance("rl") == Allowance(1, 1.25) and b.allowance("tune") == Allowance(4, 2.0)
    assert b.charged("rl") == (3, 0.75) and b.charged("sft") == (0, 0.0)
    assert Budget(2, None, rl_reads=9, n_shapes=1).allowance("rl") == Allowance(0, None)
    with pytest.raises(ValueError, match="--budget"):
        Budget(0)
    s = A.ShapeSearch(table, HELD[0], Allowance(3, 1.5))
    assert s.read(KEYS[0]) is not None and s.read(KEYS[0]) is not None    # a repeat: free
    assert s.read("nope", "src") is None and s.missed == [("nope", "src")]  # a miss: counted
    assert (len(s.asked), s.repeats, s.gpu_seconds, s.left()) == (2, 1, 1.0, 1)
    s.read(KEYS[1])
    assert s.gpu_seconds == 2.0 and s.left() == 0 and s.read(KEYS[2]) is None   # GPU-s cap reached
    g = A.ShapeSearch(table, HELD[0], Allowance(12, 1.0))
    g.read(KEYS[0])
    assert g.left() == 0                                                   # 1 GPU-s spent of 1


def test_read_rl_run_counts_distinct_table_reads(tmp_path):
    log = tmp_path / "log.jsonl"
    att = [{"binary_key": "a", "shape": [64, 64, 64], "gpu_seconds": 1.5},
           {"binary_key": "a", "shape": [64, 64, 64], "gpu_seconds": 1.5},      # read twice: once
           {"binary_key": "a", "shape": [64, 64, 128], "gpu_seconds": 2.0},
           {"binary_key": None, "shape": [64, 64, 64]}]                         # did not build
    recs = [{"type": "setup", "shapes": [[64, 64, 64], [64, 64, 128]], "style": "compact", "config": {}},
            {"type": "step", "attempts": att}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = read_rl_run(log)
    assert run.shapes == {(64, 64, 64), (64, 64, 128)} and (run.reads, run.gpu_seconds) == (2, 3.5)
    log.write_text(log.read_text() + json.dumps({"type": "done", "table_reads": 7, "table_gpu_seconds": 9.0}) + "\n")
    assert (read_rl_run(log).reads, read_rl_run(log).gpu_seconds) == (7, 9.0)
    with pytest.raises(ValueError, match="no RL run log"):
        read_rl_run(tmp_path / "missing.jsonl")
    log.write_text(json.dumps({"type": "step", "attempts": []}) + "\n")
    with pytest.raises(ValueError, match="setup"):
        read_rl_run(log)


# ---- held-out shapes --------------------------------------------------------------------------
def test_heldout_checks_name_the_overlap():
    excl = {"the grid": {(64, 64, 64)}, "RL training": set(TRAIN)}
    got = H.choose(SHAPES + [(64, 64, 64)], excl, n=0, seed=0)
    assert got == HELD
    assert H.choose(SHAPES, excl, n=8, seed=3) == H.choose(SHAPES, excl, n=8, seed=3) != H.choose(SHAPES, excl, n=8, seed=4)
    with pytest.raises(ValueError, match=r"overlaps the RL training shapes on 1 shape\(s\): 96x160x200"):
        H.choose(SHAPES, excl, n=0, seed=0, explicit=[(96, 160, 200), (96, 160, 600)])
    assert H.choose(SHAPES, excl, n=0, seed=0, explicit=[(7, 7, 7), (96, 160, 600)]) == [(7, 7, 7), (96, 160, 600)]
    with pytest.raises(ValueError, match="--heldout 40 needs more"):
        H.choose(SHAPES, excl, n=40, seed=0)
    with pytest.raises(ValueError, match=">= 32 shapes and >= 3 seeds"):
        H.check_size(31, 3, allow_small=False)
    assert H.check_size(31, 3, allow_small=True) and not H.check_size(32, 3, allow_small=False)
    assert H.shard(HELD, 1, 4) == HELD[1::4] and H.parse_shard("1/4") == (1, 4)
    with pytest.raises(ValueError, match="want 0 <= i < n"):
        H.parse_shard("4/4")


# ---- tune's prior -----------------------------------------------------------------------------
def test_tune_prior_reads_configs_and_stays_in_budget(table):
    c = CONFIGS[3]
    assert prior.entry_config(SOURCES[3]) == c
    assert prior.entry_config(FAMILIES["mma"].short_source(c)) == c          # a family file
    assert prior.entry_config("__global__ void k() {}") is None
    model = prior.fit(table, TRAIN)
    assert model.n_fit == 96                                                 # training rows only
    ranked = prior.rank(table.entries(HELD[0]), model, HELD[0], seed=0)
    assert sorted(e.binary_key for e in ranked) == KEYS
    for strategy in ("rank", "evolve"):
        s = A.ShapeSearch(table, HELD[0], Allowance(6, None))
        A.run_tune(s, model, seed=0, strategy=strategy)
        assert len(s.asked) == 6 and s.winner() is not None


# ---- the command ------------------------------------------------------------------------------
def test_command_runs_search_arms_from_a_table(table, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(RewardTable, "open", classmethod(lambda cls, *a, **k: table), raising=False)
    train = tmp_path / "train.csv"
    train.write_text("M,N,K\n" + "".join(f"{m},{n},{k}\n" for m, n, k in TRAIN))
    base = ["--table", "t.db", "--arms", "tune", "random", "--train-shapes", str(train),
            "--out", str(tmp_path / "o")]
    assert cli.main(base) == 0
    doc = json.loads((tmp_path / "o" / "experiment.json").read_text())
    assert [tuple(s) for s in doc["heldout"]] == HELD and doc["pilot"] is False
    assert "Not answered: the run has no RL arm" in capsys.readouterr().out
    assert cli.main(base + ["--seeds", "0"]) == 2
    assert ">= 32 shapes and >= 3 seeds" in capsys.readouterr().err
    assert cli.main(base[:-2] + ["--heldout", "4", "--allow-small", "--out", str(tmp_path / "p")]) == 0
    assert "(PILOT)" in (tmp_path / "p" / "README.md").read_text()
    assert cli.main(["merge", str(tmp_path / "o"), str(tmp_path / "p"), "--out", str(tmp_path / "m")]) == 2
    assert "differs" in capsys.readouterr().err


def test_both_entry_points_and_policy_settings():
    for argv in (["-m", "cudal2_rl", "experiment", "--help"], ["-m", "cudal2_rl.experiment", "merge", "--help"]):
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage:" in r.stdout
    s = arm_settings("smollm2")
    assert (s.style, s.max_new_tokens, s.temperature, s.min_p) == ("brief", 1792, 0.6, 0.2)
    s = arm_settings("runs/demo/policy", {"policy": "smollm2", "temperature": 0.8, "min_p": 0.0,
                                          "max_completion_length": 1024})
    assert (s.style, s.max_new_tokens, s.temperature, s.min_p) == ("brief", 1024, 0.8, 0.0)
