"""The RL-vs-search experiment (rl/experiment.py): held-out shapes, budget accounting, the
summary, and (compile) the whole command end to end on a CPU with the small built-in policy and
a real one-step RL run."""
import argparse
import csv
import json
import math

import pytest

from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import record
from cudal2.harness.types import Evaluation, Shape
from cudal2.runs.report import size_bucket
from cudal2_rl import experiment as X


# ---- budget accounting ------------------------------------------------------------------------
def test_budget_is_equal_per_arm_and_charges_rl_training():
    b = X.Budget(4, n_shapes=3, rl_training_evaluations=7)     # ceil(7 / 3) = 3 per shape
    assert b.rl_charge == 3
    assert {a: b.allowance(a) for a in X.ARMS + (X.RL_FULL,)} == {"rl": 1, "sft": 4, "tune": 4,
                                                                   "tune_policy": 4, "random": 4,
                                                                   "rl_full": 0}     # 4 - 7: fully charged
    s = Shape(64, 64, 64)
    assert b.admit("rl", s, "a", preexisting=False) == X.FRESH
    assert b.admit("rl", s, "b", preexisting=False) == X.OVER          # 1 left after training
    assert b.fresh("rl", s) == 1 and b.left("rl", s) == 0
    # training that spent more than the whole budget leaves the RL arm nothing
    assert X.Budget(2, n_shapes=1, rl_training_evaluations=5).allowance("rl") == 0
    assert X.Budget(2, n_shapes=1).allowance("rl") == 2                  # no training: no charge


def test_budget_repeats_and_cached_rows_are_not_fresh():
    b = X.Budget(2, n_shapes=1)
    s = Shape(128, 128, 128)
    assert b.admit("sft", s, "k1", preexisting=False) == X.FRESH
    assert b.admit("sft", s, "k1", preexisting=False) == X.REPEAT     # the arm's own repeat
    assert b.admit("sft", s, "old", preexisting=True) == X.CACHED     # a row from before
    assert b.admit("sft", s, "k2", preexisting=False) == X.FRESH
    assert b.admit("sft", s, "k3", preexisting=False) == X.OVER
    assert b.fresh("sft", s) == 2
    assert b.counts[("sft", (128, 128, 128))] == {X.FRESH: 2, X.REPEAT: 1, X.CACHED: 1, X.OVER: 1}
    # another arm asking for the same kernel pays for it too (each arm as if it ran alone)
    assert b.admit("tune", s, "k1", preexisting=False) == X.FRESH
    with pytest.raises(ValueError, match="--budget"):
        X.Budget(0, n_shapes=1)


def _row(sha_src, shape, us, origin="x"):
    from cudal2.core.identity import source_sha
    return Evaluation(status="not_measured", source_sha=source_sha(sha_src), shape=shape, arch="sm_90a",
                      acc="f32", estimated=True, origin=origin,
                      timings={"offline": {"candidate": {"median_us": us, "n": 0},
                                           "cublaslt_autotuned": {"median_us": 10.0, "n": 0}}},
                      speedups={"offline": {"cublaslt_autotuned": 10.0 / us}})


def test_harness_ledger_through_the_real_cache_rule(tmp_path, monkeypatch):
    """Pre-existing DB rows are cached (not charged); rows another arm made here are charged;
    the arm's winner is its fastest row; the rows go through the one writer."""
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(256, 256, 256)
    old = "int old;"
    record(db, _row(old, shape, 5.0, origin="earlier"), old)          # from before the experiment
    budget = X.Budget(2, n_shapes=1)
    h = X.Harness(db, budget, arch="sm_90a", acc="f32", baseline="cublaslt_autotuned", gpu="")
    made = []

    def fake_evaluate(sources, shp, origin, trusted):
        made.extend(sources)
        times = {"int a;": 4.0, "int b;": 2.0, "int c;": 3.0}
        return [record(db, _row(s, shp, times[s], origin), s) for s in sources]

    monkeypatch.setattr(h, "_evaluate", fake_evaluate)
    rows = h.run("sft", shape, [old, "int a;", "int a;", "int b;", "int c;"], trusted=False)
    assert made == ["int a;", "int b;"]                # old: cached; a twice: once; c: over budget
    assert rows[0].origin == "earlier" and rows[1] is rows[2] and rows[4] is None
    assert budget.counts[("sft", (256, 256, 256))] == {X.FRESH: 2, X.REPEAT: 1, X.CACHED: 1, X.OVER: 1}
    best, sha = h.best("sft", shape)
    assert best.timings["offline"]["candidate"]["median_us"] == 2.0        # b
    # the tune arm asks for b and c: b was made here by sft, so it is charged to tune, not re-run
    h.run("tune", shape, ["int b;", "int c;"], trusted=True)
    assert made == ["int a;", "int b;", "int c;"] and budget.fresh("tune", shape) == 2
    origins = sorted(r.origin for r in db.rows())
    assert origins == ["earlier", "exp-sft", "exp-sft", "exp-tune"]


# ---- the RL run's log ---------------------------------------------------------------------------
def _write_log(path, *, done=True):
    recs = [{"type": "setup", "shapes": [[64, 128, 256], [256, 256, 512]], "style": "compact",
             "config": {"max_completion_length": 0}},
            {"type": "step", "step": 1, "estimated": True,
             "attempts": [{"sha": "a", "cached": False}, {"sha": "a", "cached": True},
                          {"sha": "", "cached": False}, {"sha": "b", "cached": False}]}]
    if done:
        recs.append({"type": "done", "evaluations": 5, "remeasured": 1})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def test_read_rl_run(tmp_path):
    log = tmp_path / "log.jsonl"
    _write_log(log)
    run = X.read_rl_run(log)
    assert run.shapes == {(64, 128, 256), (256, 256, 512)} and run.style == "compact"
    assert run.evaluations == 6 and run.estimated            # done: 5 evaluations + 1 re-measurement
    _write_log(log, done=False)
    assert X.read_rl_run(log).evaluations == 2               # cut run: uncached attempts with code
    with pytest.raises(ValueError, match="no RL run log"):
        X.read_rl_run(tmp_path / "missing.jsonl")
    log.write_text(json.dumps({"type": "step", "attempts": []}) + "\n")
    with pytest.raises(ValueError, match="setup"):
        X.read_rl_run(log)


def test_policy_arms_sample_as_their_policy_did_in_training():
    """The default small model builds 0/16 at temperature 1 and was warm-started on the brief
    prompt: an arm that starts from it samples as it does (or as its RL run set); the toy keeps
    its compact prompt and temperature 1; any other model gets the full prompt."""
    assert X.arm_settings("smollm2") == ("brief", 1792, 0.6, 0.2)
    assert X.arm_settings("builtin") == ("compact", 128, 1.0, 0.05)
    assert X.arm_settings("/models/coder") == ("full", 2048, 1.0, 0.05)
    trained = {"policy": "smollm2", "temperature": 0.0, "min_p": -1.0,      # train's "use the default"
               "max_completion_length": 0}
    assert X.arm_settings("runs/demo/policy", trained) == ("brief", 1792, 0.6, 0.2)
    assert X.arm_settings("runs/demo/policy", {**trained, "temperature": 0.8, "min_p": 0.0,
                                               "max_completion_length": 1024}) == ("brief", 1024, 0.8, 0.0)
    p = argparse.ArgumentParser()
    X.configure_parser(p)
    args = p.parse_args([])
    assert args.temperature is None and args.min_p is None          # per arm unless given


# ---- held-out shapes ----------------------------------------------------------------------------
def test_heldout_is_stratified_reproducible_and_disjoint(tmp_path):
    train = {(64, 64, 1024), (4096, 4096, 4096)}
    a = X.choose_heldout(shapes_file="shapes/stratified_100.csv", n=8, seed=3, exclude=train,
                         arch="sm_90a", log=lambda *x: None)
    b = X.choose_heldout(shapes_file="shapes/stratified_100.csv", n=8, seed=3, exclude=train,
                         arch="sm_90a", log=lambda *x: None)
    assert a == b and len(set(a)) == 8
    assert not {(s.M, s.N, s.K) for s in a} & train
    buckets = [size_bucket(s.M, s.N, s.K) for s in a]
    assert {bk: buckets.count(bk) for bk in set(buckets)} == {"<1e9": 2, "1e9-1e11": 2, "1e11-1e12": 2, ">=1e12": 2}
    c = X.choose_heldout(shapes_file="shapes/stratified_100.csv", n=8, seed=4, exclude=train,
                         arch="sm_90a", log=lambda *x: None)
    assert c != a


def test_heldout_errors_name_the_problem(tmp_path):
    f = tmp_path / "held.csv"
    f.write_text("M,N,K\n64,128,256\n512,512,512\n")
    with pytest.raises(ValueError, match="overlaps the training shapes on 1 shape.*64x128x256"):
        X.choose_heldout(shapes_file="", n=0, seed=0, exclude={(64, 128, 256)}, arch="sm_90a", explicit=str(f))
    bad = tmp_path / "bad.csv"
    bad.write_text("M,N\n1,2\n")
    with pytest.raises(ValueError, match="bad.csv: header must have columns M,N,K"):
        X.choose_heldout(shapes_file=str(bad), n=1, seed=0, exclude=set(), arch="sm_90a")
    with pytest.raises(ValueError, match="only 1 shape"):
        X.choose_heldout(shapes_file=str(f), n=2, seed=0, exclude={(64, 128, 256)}, arch="sm_90a",
                         keep_launch_bound=True)


def test_unknown_policy_and_overlap_are_clear_cli_errors(tmp_path, capsys):
    rc = X.main(["--arms", "sft", "--sft-policy", str(tmp_path / "no-such-model"), "--heldout", "1",
                 "--out", str(tmp_path / "o")])
    assert rc == 2 and "--sft-policy" in capsys.readouterr().err
    pol = tmp_path / "run" / "policy"
    pol.mkdir(parents=True)
    _write_log(tmp_path / "run" / "log.jsonl")
    held = tmp_path / "held.csv"
    held.write_text("M,N,K\n256,256,512\n")
    rc = X.main(["--arms", "rl", "--rl-policy", str(pol), "--heldout-shapes", str(held),
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "overlaps" in err and "256x256x512" in err


# ---- the summary --------------------------------------------------------------------------------
def test_summary_geomean_interval_and_regret():
    rows = []
    for (m, n, k), s, reg in (((64, 64, 64), 0.5, 0.2), ((64, 64, 128), 0.8, None),
                              ((4096, 4096, 4096), 0.9, 0.0)):
        rows.append({"arm": "tune", "bucket": size_bucket(m, n, k), "speedup": s, "regret": reg,
                     "fresh": 3, "budget": 4})
    rows.append({"arm": "rl", "bucket": "<1e9", "speedup": None, "regret": None, "fresh": 0, "budget": 1})
    t = {(r["arm"], r["bucket"]): r for r in X.summarise(rows, ["tune", "rl"])}
    allr = t[("tune", "all")]
    assert allr["shapes"] == 3 and allr["with_kernel"] == 3
    assert math.isclose(allr["geomean_speedup"], (0.5 * 0.8 * 0.9) ** (1 / 3))
    assert allr["lo"] <= allr["geomean_speedup"] <= allr["hi"]
    assert math.isclose(allr["mean_regret"], 0.1) and allr["regret_shapes"] == 2
    assert t[("tune", "<1e9")]["shapes"] == 2 and t[("tune", "1e11-1e12")]["geomean_speedup"] == 0.9
    assert t[("rl", "all")]["with_kernel"] == 0 and t[("rl", "all")]["geomean_speedup"] is None


# ---- end to end on a CPU (nvcc, no GPU) ---------------------------------------------------------
@pytest.fixture(scope="module")
def small_policy():
    from cudal2_rl.policy import SMALL_RECIPE, build_builtin
    return build_builtin(SMALL_RECIPE, log=lambda *a: None)


@pytest.mark.compile
@pytest.mark.slow
def test_experiment_end_to_end_estimated(tmp_path, small_policy):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this test checks the no-GPU (estimated) path")
    from cudal2_rl.config import RLConfig
    from cudal2_rl.train import run as train
    train_shapes = tmp_path / "train.csv"
    train_shapes.write_text("M,N,K\n256,256,512\n")
    rl_out = tmp_path / "rl"
    train(RLConfig(policy=str(small_policy), shapes=str(train_shapes), sample=0, steps=1, out=str(rl_out),
                   num_generations=2, prompts_per_step=1, jobs=2, export=False, timeout=300, seed=0,
                   launch_bound="keep"))
    # the defaults keep the trained policy and no optimizer checkpoints
    assert (rl_out / "policy").is_dir() and not (rl_out / "checkpoints").exists()
    rl_run = X.read_rl_run(rl_out / "log.jsonl")
    assert rl_run.shapes == {(256, 256, 512)} and rl_run.evaluations >= 1
    pool = tmp_path / "pool.csv"
    pool.write_text("M,N,K\n256,256,512\n1000,520,2000\n1000,1000,1000\n")      # two off the grid
    out = tmp_path / "exp"
    rc = X.main(["--rl-policy", str(rl_out / "policy"), "--sft-policy", str(small_policy),
                 "--shapes", str(pool), "--heldout", "2", "--budget", "3", "--families", "mma",
                 "--exhaustive-max", "1", "--jobs", "2", "--out", str(out), "--seed", "0", "--seeds", "0"])
    assert rc == 0
    doc = json.loads((out / "experiment.json").read_text())
    held = {tuple(s) for s in doc["heldout"]}
    assert held == {(1000, 520, 2000), (1000, 1000, 1000)}                  # the training shape is out
    assert doc["heldout_excluded"]["the grid"] == 1000 and doc["seeds"] == [0]
    assert doc["estimated"] and doc["gpu"] == ""
    charge = math.ceil(rl_run.evaluations / 2)
    assert doc["budget"]["allowance"] == {"rl": max(0, 3 - charge), "rl_full": max(0, 3 - rl_run.evaluations),
                                          "sft": 3, "tune": 3, "tune_policy": 3, "random": 3}
    per = list(csv.DictReader((out / "per_shape.csv").open()))
    assert len(per) == 2 * 6 and {r["values"] for r in per} == {"estimated"}
    for r in per:
        assert int(r["fresh"]) <= int(r["budget"])
        if r["arm"] in ("tune", "tune_policy", "random"):
            assert int(r["fresh"]) == 3                  # template arms spend the whole budget
        if r["arm"] in ("rl", "sft"):
            assert int(r["samples"]) >= int(r["fresh"])
    # every row went through the harness's writer into the one DB, estimated, never measured
    rows = ResultsDB(out / "results.db").rows()
    assert rows and all(r.status != "ok" for r in rows)
    assert {r.origin for r in rows} >= {"exp-sft", "exp-tune", "exp-random"}
    assert all(r.estimated for r in rows if r.status == "not_measured")
    fresh_total = sum(c["fresh"] for c in doc["budget"]["ledger"])
    assert len(rows) <= fresh_total                      # cross-arm repeats are not re-run
    md = (out / "table.md").read_text()
    assert "ESTIMATED" in md.splitlines()[0] and "not measurements" in md
    assert "ESTIMATED" in (out / "README.md").read_text()
    assert "not affordable" in md                         # exhaustive skipped, and said so
    assert (out / "experiment.png").stat().st_size > 1000
    table = list(csv.DictReader((out / "table.csv").open()))
    assert {r["arm"] for r in table} == {"rl", "rl_full", "sft", "tune", "tune_policy", "random"}
    assert {r["values"] for r in table} == {"estimated"}


def test_reference_note_says_where_exhaustive_was_not_affordable():
    ref = {(1, 1, 1): {"mma": "not affordable: 3456 configs > --exhaustive-max 64", "cutlass_sm90": 48},
           (2, 2, 2): {"mma": "not affordable: 864 configs > --exhaustive-max 64", "cutlass_sm90": 48}}
    assert X.reference_note(ref, 64) == ("cutlass_sm90 exhaustive on 2 shape(s) (96 configs); mma not "
                                         "affordable on 2 shape(s) (space 864-3456 configs > --exhaustive-max 64)")
    assert X.reference_note({}, 64) == "no exhaustive reference"


def test_gpu_path_screens_then_one_finals_session(tmp_path, monkeypatch):
    """The GPU path with the harness's GPU steps faked (no GPU here): arms screen their kernels,
    tune's search ranks by screening time, the winners meet in ONE finals session that is never
    served from the cache, and its rows go through the one writer."""
    from cudal2.core.identity import source_sha
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(1024, 1024, 1024)
    screened, sessions = [], []

    class Pool:
        def close(self):
            pass

    def fake_screen(shp, cands, *, db=None, trusted=True, reference_us=None, **kw):
        rows = []
        for c in cands:
            screened.append((c.origin, trusted))
            us = 10.0 + int(source_sha(c.source)[:4], 16) % 97
            ev = Evaluation(status="ok", source_sha=source_sha(c.source), shape=shp, arch="sm_90a",
                            stage="screen", origin=c.origin,
                            timings={"screen": {"candidate": {"median_us": us, "n": 3}}})
            rows.append(record(db, ev, c.source))
        return rows, {"torch_us": 9.0}

    def fake_group(reqs, *, db=None, **kw):
        assert db is None                       # finals are fresh: no cache in between
        sessions.append([r.origin for r in reqs])
        return [Evaluation(status="ok", source_sha=source_sha(r.source), shape=r.shape, arch="sm_90a",
                           origin=r.origin, timings={"offline": {"candidate": {"median_us": 20.0 + i}}},
                           speedups={"offline": {"cublaslt_autotuned": 0.9 - 0.1 * i}},
                           stats={"offline": {"speedup": {"cublaslt_autotuned": {"median": 0.9 - 0.1 * i,
                                                                                 "lo": 0.85 - 0.1 * i,
                                                                                 "hi": 0.95 - 0.1 * i}}}})
                for i, r in enumerate(reqs)]

    monkeypatch.setattr(X, "screen", fake_screen)
    import cudal2.harness.tournament as TN
    monkeypatch.setattr(TN, "evaluate_group", fake_group)
    monkeypatch.setattr(X, "build_many", lambda specs, jobs=None: [None] * len(specs))
    monkeypatch.setattr(X, "build_baselines", lambda arch: {})
    monkeypatch.setattr(X, "gpu_pool", lambda **kw: Pool())
    budget = X.Budget(3, n_shapes=1)
    h = X.Harness(db, budget, arch="sm_90a", acc="f32", baseline="cublaslt_autotuned", gpu="FakeGPU")
    res = X.run_tune_arm(shape, h, arch="sm_90a", acc="f32", families=["mma"], seed=0, log=lambda *a: None)
    assert len(res.trials) == 3 and all(t.time_us and not t.estimated for t in res.trials)
    assert budget.fresh("tune", shape) == 3 and screened == [("exp-tune", True)] * 3
    X.run_random_arm(shape, h, arch="sm_90a", acc="f32", families=["mma"], seed=0)
    assert budget.fresh("random", shape) == 3 and screened[3:] == [("exp-random", True)] * 3
    h.run("sft", shape, ["int a;", "int b;"], trusted=False)
    assert screened[6:] == [("exp-sft", False)] * 2            # policy code: untrusted screening
    winners = {a: h.best(a, shape)[1] for a in ("tune", "random", "sft")}
    assert all(winners.values())
    fin = h.finals(shape, winners, {})
    assert len(sessions) == 1 and len(sessions[0]) == len(set(winners.values()))
    assert X.speedup_of(fin["tune"], "cublaslt_autotuned")[1] is not None      # the interval
    finals_rows = db.rows(origin="exp-finals")
    assert len(finals_rows) == len(set(winners.values())) and all(r.stage == "final" for r in finals_rows)


# ---- the decisive experiment's rules (issue 25) ------------------------------------------------
def test_meta_only_variants_are_one_device_code_and_cost_once(tmp_path, monkeypatch):
    from cudal2.core.identity import device_sha, source_sha
    src = open("rl/data/corpus/wmma.cu").read()
    lie = src.replace('"${META}"', '"{\\"tile\\":[32,32]}"')
    split = src.replace('"${META}"', '"a"\n  "b"') + "\n// a comment\n"
    assert len({source_sha(x) for x in (src, lie, split)}) == 3
    assert device_sha(src) == device_sha(lie) == device_sha(split)
    assert device_sha(src) != device_sha(src.replace("M % BM", "M % (2 * BM)"))     # code differs
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(1000, 1000, 1000)
    budget = X.Budget(3, n_shapes=1)
    h = X.Harness(db, budget, arch="sm_90a", acc="f32", baseline="cublaslt_autotuned", gpu="")
    made = []

    def fake_evaluate(sources, shp, origin, trusted):
        made.extend(sources)
        return [record(db, _row(s, shp, 2.0 + len(made), origin), s) for s in sources]

    monkeypatch.setattr(h, "_evaluate", fake_evaluate)
    rows = h.run("sft", shape, [src, lie, split], trusted=False)
    assert made == [src] and rows[1] is rows[0] and rows[2] is rows[0]     # run once, answers all
    assert budget.fresh("sft", shape) == 1 and budget.counts[("sft", (1000, 1000, 1000))][X.REPEAT] == 2
    h.run("sft", shape, [lie], trusted=False)                                # a later batch too
    assert budget.fresh("sft", shape) == 1 and len(made) == 1


def test_heldout_leaves_out_grid_and_warm_start_shapes(tmp_path):
    from cudal2_rl.policy import grid_shapes
    grid = set(grid_shapes())
    shapes, where = X.warm_start_shapes("builtin")
    assert shapes == grid and "grid" in where
    ws, where = X.warm_start_shapes("smollm2")                    # the shipped adapter's corpus draw
    assert len(ws) == 160 and ws <= grid and "recipe.json" in where
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "recipe.json").write_text(json.dumps({"shapes": [[1000, 1000, 1000]]}))
    assert X.warm_start_shapes(str(folder))[0] == {(1000, 1000, 1000)}
    (folder / "recipe.json").write_text(json.dumps({"args": {"db": "old.db"}}))
    with pytest.raises(ValueError, match="records no shapes"):
        X.warm_start_shapes(str(folder))
    held = X.choose_heldout(shapes_file="shapes/llm_trace.csv", n=32, seed=0, exclude=grid | ws,
                            arch="sm_90a", log=lambda *a: None)
    assert len(held) == 32 and not {(s.M, s.N, s.K) for s in held} & grid
    f = tmp_path / "held.csv"
    f.write_text("M,N,K\n1000,1000,1000\n4096,4096,4096\n")
    with pytest.raises(ValueError, match="overlaps the the grid shapes on 1 shape.*4096x4096x4096"):
        X.check_disjoint(X.read_shapes(str(f)), grid, "the grid")


def test_a_grid_shape_held_out_is_a_clear_cli_error(tmp_path, capsys):
    held = tmp_path / "held.csv"
    held.write_text("M,N,K\n1000,1000,1000\n4096,4096,4096\n")
    rc = X.main(["--arms", "tune", "--heldout-shapes", str(held), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "grid, warm-start or training shapes on 1 shape" in err and "4096x4096x4096" in err


def test_policy_action_space_families():
    assert X.policy_families("builtin", "sm_90a") == ["mma", "ptx"]
    assert X.policy_families("smollm2", "sm_90a") == ["mma", "ptx"]      # the adapter's wmma + ptx corpus
    assert set(X.CORPUS_FAMILIES.values()) <= set(__import__("cudal2.templates", fromlist=["x"]).FAMILIES)


def _per(arm, shape, seed, us, *, correct=True, vs_lt=None):
    m, n, k = shape
    return {"M": m, "N": n, "K": k, "bucket": size_bucket(m, n, k), "seed": seed, "arm": arm,
            "time_us": us, "correct": correct and us is not None, "vs_lt": vs_lt,
            "speedup": vs_lt, "regret": None, "fresh": 1, "budget": 2}


def test_paired_ratios_bootstrap_over_shapes_and_seeds_and_fast_1():
    rows = []
    shapes = [(1000 + 8 * i, 512, 768) for i in range(6)]
    for i, sh in enumerate(shapes):
        for sd in range(3):
            tune = 10.0
            rl = tune / (1.2 if i % 2 else 0.9) * (1 + 0.01 * sd)
            rows += [_per("tune", sh, sd, tune, vs_lt=1.1), _per("rl", sh, sd, rl, vs_lt=1.1 * tune / rl)]
    rows.append(_per("rl", (77, 77, 77), 0, None))                          # no RL kernel: unpaired
    rows.append(_per("tune", (77, 77, 77), 0, 5.0, vs_lt=0.9))
    p = X.paired(rows, "rl", "tune", seed=1)
    assert p["pairs"] == 18 and p["shapes"] == 6 and p["unpaired"] == 1
    logs = [math.log(10.0 / r["time_us"]) for r in rows if r["arm"] == "rl" and r["time_us"]]
    assert math.isclose(p["ratio"], math.exp(sum(logs) / len(logs)))
    assert p["lo"] < p["ratio"] < p["hi"] and p["a_faster"] == 9
    assert X.paired(rows, "rl", "tune", seed=1) == p                       # seeded
    f, n = X.fast_1(rows, "rl")
    assert n == 19 and math.isclose(f, 9 / 19)                            # correct and > 1x cuBLASLt
    assert X.fast_1(rows, "tune") == (18 / 19, 19)
    wrong = [dict(r, correct=False) for r in rows if r["arm"] == "tune"]
    assert X.fast_1(wrong, "tune") == (0.0, 19)                            # a wrong kernel is never fast
    pt = X.paired_table(rows, ["rl", "rl_full", "tune", "tune_policy"])
    assert [(q["a"], q["b"]) for q in pt] == [("rl", "tune")]               # only arms with rows
    t = {(r["arm"], r["bucket"]): r for r in X.summarise(rows, ["rl", "tune"])}
    assert math.isclose(t[("rl", "all")]["fast_1"], 9 / 19)


def test_rl_fully_charged_is_the_prefix_of_its_search(tmp_path, monkeypatch):
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(1000, 1000, 1000)
    budget = X.Budget(5, n_shapes=4, rl_training_evaluations=3)     # amortised 1 -> 4 left; full 3 -> 2
    h = X.Harness(db, budget, arch="sm_90a", acc="f32", baseline="cublaslt_autotuned", gpu="")
    times = {"int a;": 9.0, "int b;": 8.0, "int c;": 1.0, "int d;": 5.0}
    monkeypatch.setattr(h, "_evaluate", lambda srcs, shp, origin, trusted:
                        [record(db, _row(s, shp, times[s], origin), s) for s in srcs])
    h.run("rl", shape, ["int a;", "int a;", "int b;", "int c;", "int d;"], trusted=False)
    h.derive_prefix(X.RL_FULL, "rl", shape)
    assert budget.fresh("rl", shape) == 4 and budget.fresh(X.RL_FULL, shape) == 2
    assert budget.counts[(X.RL_FULL, (1000, 1000, 1000))] == {X.FRESH: 2, X.REPEAT: 1, X.CACHED: 0, X.OVER: 0}
    assert h.best("rl", shape)[0].timings["offline"]["candidate"]["median_us"] == 1.0      # c
    assert h.best(X.RL_FULL, shape)[0].timings["offline"]["candidate"]["median_us"] == 8.0  # b: c came later


def test_a_finalist_that_fails_finals_is_replaced_by_its_arms_next_fastest(tmp_path, monkeypatch):
    from cudal2.core.identity import source_sha
    db = ResultsDB(tmp_path / "r.db")
    shape = Shape(1000, 1000, 1000)
    sessions = []
    us = {"int a;": 5.0, "int b;": 6.0, "int c;": 7.0}

    def fake_screen(shp, cands, *, db=None, **kw):
        return [record(db, Evaluation(status="ok", source_sha=source_sha(c.source), shape=shp, arch="sm_90a",
                                      stage="screen", origin=c.origin,
                                      timings={"screen": {"candidate": {"median_us": us[c.source], "n": 3}}}),
                       c.source) for c in cands], {"torch_us": 9.0}

    def fake_group(reqs, *, db=None, **kw):
        sessions.append([r.source for r in reqs])
        return [Evaluation(status="wrong" if r.source == "int a;" else "ok", source_sha=source_sha(r.source),
                           shape=r.shape, arch="sm_90a", origin=r.origin,
                           timings={"offline": {"candidate": {"median_us": us[r.source]}}},
                           speedups={"offline": {"cublaslt_autotuned": 10.0 / us[r.source]}})
                for r in reqs]

    import cudal2.harness.tournament as TN
    monkeypatch.setattr(X, "screen", fake_screen)
    monkeypatch.setattr(TN, "evaluate_group", fake_group)
    monkeypatch.setattr(X, "build_many", lambda specs, jobs=None: [None] * len(specs))
    monkeypatch.setattr(X, "build_baselines", lambda arch: {})
    monkeypatch.setattr(X, "gpu_pool", lambda **kw: type("P", (), {"close": lambda self: None})())
    h = X.Harness(db, X.Budget(3, n_shapes=1), arch="sm_90a", acc="f32", baseline="cublaslt_autotuned",
                  gpu="FakeGPU")
    h.run("rl", shape, ["int a;", "int b;"], trusted=False)
    h.run("tune", shape, ["int c;"], trusted=True)
    fin = h.finals(shape, {"rl": h.best("rl", shape)[1], "tune": h.best("tune", shape)[1]}, {})
    assert sessions == [["int a;", "int c;"], ["int b;"]]          # a fails: rl's next fastest, b
    assert fin["rl"].source_sha == source_sha("int b;") and fin["rl"].status == "ok"
    assert fin["tune"].source_sha == source_sha("int c;")
    assert any("replaced" in n for n in h.finals_notes)
