"""rl.reward: the verdict -> reward mapping, estimation, and the results-DB cache (with a
counting fake executor; the real harness path is in test_rl_train.py)."""
import math

import pytest

from cudal2.harness.types import STATUSES, Evaluation, Shape
from cudal2_rl import reward as R

SHORT = '#define BM 64\n#define BN 64\n#define BK 32\n#define WM 32\n#define WN 32\n#include "mma_hgemm.cuh"\n'


def ev(status, speedup=None, estimated=False, mode="offline", base="cublaslt_autotuned"):
    e = Evaluation(status=status, source_sha="x", shape=Shape(64, 64, 64), arch="sm_90a")
    if speedup is not None:
        e.speedups = {mode: {base: speedup}}
    e.estimated = estimated
    return e


def test_every_status_has_a_reward_and_ordering():
    for s in STATUSES:
        r = R.reward_for(ev(s, 1.0 if s in ("ok", "not_measured") else None))
        if s == "error":
            assert r is None      # the harness's failure: no number invented
        else:
            assert r is not None and -1.0 <= r <= R.LOG_CLIP[1]
    p = R.PENALTIES
    assert p["too_fast"] == p["no_code"] == p["not_abi"] == p["two_files"] == -1.0
    assert p["too_fast"] < p["audit_rejected"] < p["build_error"] < p["crashed"] < p["wrong"]
    assert p["timeout"] == p["crashed"]
    # any correct kernel, however slow, beats every failure
    assert R.reward_for(ev("ok", 1e-6)) == R.LOG_CLIP[0] > max(p.values())


def test_speedup_is_log_and_clipped():
    assert R.reward_for(ev("ok", 1.0)) == 0.0
    assert R.reward_for(ev("ok", 1.5)) == pytest.approx(math.log(1.5))
    assert R.reward_for(ev("ok", 0.8)) == pytest.approx(math.log(0.8))
    assert R.reward_for(ev("ok", 100.0)) == R.LOG_CLIP[1]
    # speedup vs another baseline / mode is not used
    assert R.reward_for(ev("ok", 1.5, base="torch")) is None
    assert R.reward_for(ev("ok", 1.5, mode="server")) is None
    assert R.reward_for(ev("ok", 1.5, mode="server"), mode="server") == pytest.approx(math.log(1.5))


def test_estimated_uses_same_formula_and_is_flagged():
    from cudal2.search.costmodel import CostModel
    e = ev("not_measured")
    e.meta = {"style": "mma", "tile": [64, 64, 32]}
    e.build = {"registers": 96, "shared_bytes": 20000, "spills": 0}
    assert R.reward_for(e) is None            # no estimate yet: nothing invented
    assert R.add_estimate(e, CostModel.default(), ("cublaslt_autotuned", "torch"))
    assert e.estimated and e.timings["offline"]["candidate"]["estimated"]
    s = e.speedups["offline"]["cublaslt_autotuned"]
    assert R.reward_for(e) == pytest.approx(R.speedup_reward(s))
    # a failed build never gets an estimate
    assert not R.add_estimate(ev("build_error"), CostModel.default(), ("torch",))


class CountingExecutor:
    """Fake executor: returns a canned not_measured row per request and counts calls."""

    def __init__(self, status="not_measured"):
        self.requests = []
        self.status = status

    def gpu_name(self):
        return ""

    def evaluate_many(self, requests):
        self.requests += list(requests)
        out = []
        for r in requests:
            e = Evaluation(status=self.status, source_sha=R.source_sha(r.source), shape=r.shape,
                           arch=r.arch, acc="f32", layout="RR",
                           build={"status": "ok", "registers": 96, "shared_bytes": 30000, "spills": 0},
                           meta={"style": "mma", "tile": [64, 64, 32], "acc": "f32", "layout": "RR"})
            out.append(e)
        return out


def test_cache_repeated_kernel_is_not_reevaluated(tmp_path):
    from cudal2.harness.db import ResultsDB
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db)
    comps = [SHORT, SHORT, "no code here", "```cuda\n" + SHORT + "```"]
    r1 = rf(prompts=[""] * 4, completions=comps, M=[64, 64, 64, 128], N=[64] * 4, K=[64] * 4)
    # same source + same shape twice in one batch -> one evaluation; another shape -> another
    assert len(ex.requests) == 2
    assert r1[2] == R.PENALTIES["no_code"]
    assert r1[0] == r1[1] and r1[0] is not None and r1[0] > -0.6
    assert all(a.estimated for a in rf.attempts[-1] if a.verdict == "not_measured")
    # a later step with the same kernel: served from the DB, never rebuilt or re-timed
    r2 = rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert len(ex.requests) == 2 and r2[0] == r1[0]
    assert rf.attempts[-1][0].cached
    # a fresh reward function over the same DB also hits the cache (persisted rows)
    ex2 = CountingExecutor()
    rf2 = R.KernelReward(ex2, ResultsDB(tmp_path / "r.db"))
    rf2(prompts=[""], completions=[SHORT], M=[128], N=[64], K=[64])
    assert ex2.requests == []
    # every reward for code has a row behind it, flagged estimated
    rows = db.rows()
    assert len(rows) == 2 and all(r.estimated for r in rows)


def test_step_summary_and_best(tmp_path):
    from cudal2.harness.db import ResultsDB
    rf = R.KernelReward(CountingExecutor(), ResultsDB(tmp_path / "r.db"))
    rf(prompts=[""] * 2, completions=[SHORT, "x"], M=[256, 256], N=[256, 256], K=[256, 256])
    s = rf.step_summary()
    assert s["n"] == 2 and s["frac_compiled"] == 0.5 and s["frac_correct"] is None and s["estimated"]
    assert (256, 256, 256) in rf.best and rf.best[(256, 256, 256)].source == SHORT
    assert "no GPU" in rf.estimate_note() and "0 measurements" in rf.estimate_note()


def test_reward_requires_shape_columns(tmp_path):
    from cudal2.harness.db import ResultsDB
    rf = R.KernelReward(CountingExecutor(), ResultsDB(tmp_path / "r.db"))
    with pytest.raises(ValueError, match="M, N, K"):
        rf(prompts=[""], completions=[SHORT])


def test_no_gpu_reuses_a_gpu_measurement(tmp_path):
    """Without a GPU, a kernel the DB has measured on a GPU gets the measured reward."""
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import settings
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db)
    # a row as the harness writes it after timing RL's request on an H100 (kernel time)
    m = Evaluation(status="ok", source_sha=R.source_sha(SHORT), shape=Shape(64, 64, 64), arch="sm_90a",
                   acc="f32", layout="RR",
                   env={"gpu": "NVIDIA H100 80GB HBM3",
                        "settings": settings(rf._request(SHORT, (64, 64, 64)))},
                   timings={"offline": {"candidate": {"median_us": 5.0},
                                        "cublaslt_autotuned": {"median_us": 6.0}}},
                   speedups={"offline": {"cublaslt_autotuned": 1.2}})
    db.add(m, source=SHORT)
    rf = R.KernelReward(ex, db)
    assert rf.reuse_gpu == "NVIDIA H100 80GB HBM3"
    r = rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert ex.requests == [] and r[0] == pytest.approx(math.log(1.2))
    a = rf.attempts[-1][0]
    assert a.verdict == "ok" and not a.estimated and a.cached


def test_rl_does_not_reuse_a_row_timed_another_way(tmp_path):
    """The one cache rule: a row measured with the old per-call events timer, or without the
    mode RL asks for, is not served to RL; the kernel is evaluated again."""
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import settings
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db, reuse_gpu="NVIDIA H100 80GB HBM3")
    req = rf._request(SHORT, (64, 64, 64))
    for timer, modes in (("events", ("offline",)), ("kernel", ("server",))):
        st = dict(settings(req), timer=timer)
        keys = {"offline": "offline", "server": "server_1ms"}
        db.add(Evaluation(status="ok", source_sha=R.source_sha(SHORT), shape=Shape(64, 64, 64),
                          arch="sm_90a", acc="f32", layout="RR",
                          env={"gpu": "NVIDIA H100 80GB HBM3", "settings": st},
                          timings={keys[m]: {"candidate": {"median_us": 5.0}} for m in modes},
                          speedups={keys[m]: {"cublaslt_autotuned": 1.2} for m in modes}),
               source=SHORT)
    rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert len(ex.requests) == 1 and not rf.attempts[-1][0].cached


def test_attempt_round_trips_through_the_log():
    """--resume rebuilds Attempts from log.jsonl records (to_dict, then JSON)."""
    import json
    from cudal2_rl.reward import Attempt
    a = Attempt((64, 128, 256), "ok", 0.5, 1.6, True, "ab" * 32, 7, False, "d", {"regs": 96},
                "torch", "// src")
    b = Attempt.from_dict(json.loads(json.dumps(a.to_dict())), source="// src")
    assert b == a
    assert Attempt.from_dict(a.to_dict(), cached=True).cached and b.shape == (64, 128, 256)
