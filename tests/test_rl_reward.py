"""rl.reward: the verdict -> reward mapping, the per-shape normalisation, build-derived estimates,
re-measurement of a new best, and the results-DB cache (with counting fake executors; the real
harness path is in test_rl_executor.py / test_rl_train.py)."""
import math

import pytest

from cudal2.harness.types import STATUSES, Evaluation, Shape
from cudal2_rl import reward as R

SHORT = '#define BM 64\n#define BN 64\n#define BK 32\n#define WM 32\n#define WN 32\n#include "mma_hgemm.cuh"\n'
GPU = "NVIDIA H100 80GB HBM3"


def ev(status, speedup=None, estimated=False, mode="offline", base="cublaslt_autotuned"):
    e = Evaluation(status=status, source_sha="x", shape=Shape(64, 64, 64), arch="sm_90a")
    if speedup is not None:
        e.speedups = {mode: {base: speedup}}
    e.estimated = estimated
    return e


# ---- the mapping ---------------------------------------------------------------------------

def test_every_status_has_a_reward_and_the_ladder():
    for s in STATUSES:
        r = R.reward_for(ev(s, 1.0 if s in ("ok", "not_measured") else None))
        if s == "error":
            assert r is None      # the harness's failure: no number invented
        else:
            assert r is not None and -1.0 <= r < R.CORRECT_CEIL
    p = R.PENALTIES
    # cheating below every honest failure; format failures are honest failures
    assert p["too_fast"] < p["audit_rejected"] < p["no_code"] == p["two_files"] == p["not_abi"] \
        < p["build_error"] < p["crashed"] == p["timeout"] == p["oom"] < p["wrong"]
    assert max(p[c] for c in R.CHEATING) < min(v for k, v in p.items() if k not in R.CHEATING)
    # any correct kernel, however slow, beats every failure; the flat estimate too
    for s in (1e-9, 1e-3, 0.1):
        assert R.reward_for(ev("ok", s)) > R.CORRECT_FLOOR > max(p.values())
    assert R.FLAT_ESTIMATE > max(p.values())


def test_correct_reward_is_strictly_increasing_and_never_flat():
    xs = [math.log(s) for s in (1e-4, 0.01, 0.05, 0.1, 0.2, 0.45, 0.5, 0.59, 0.9, 1.0, 1.1, 2, 10, 1e4)]
    rs = [R.correct_reward(x) for x in xs]
    assert all(a < b for a, b in zip(rs, rs[1:]))
    assert all(R.CORRECT_FLOOR < r < R.CORRECT_CEIL for r in rs)
    assert R.correct_reward(0.0) == 0.0
    # identity near the best known time (slope 1), so speed differences there count in full
    assert R.correct_reward(0.01) == pytest.approx(0.01, rel=0.02)
    assert R.correct_reward(-0.01) == pytest.approx(-0.01, rel=0.02)
    # the old clip put all of these on -0.5: now they are ranked with usable gaps
    slow = [R.speedup_reward(s) for s in (0.45, 0.5, 0.55, 0.59)]
    assert min(b - a for a, b in zip(slow, slow[1:])) > 0.01
    assert R.speedup_reward(0.1) - R.speedup_reward(0.05) > 0.01      # 10x vs 20x slower
    assert R.speedup_reward(0.0) is None and R.speedup_reward(float("nan")) is None


def test_speedup_vs_the_chosen_baseline_and_mode_only():
    assert R.reward_for(ev("ok", 1.0)) == 0.0
    assert R.reward_for(ev("ok", 1.5)) == pytest.approx(R.correct_reward(math.log(1.5)))
    assert R.reward_for(ev("ok", 1.5, base="torch")) is None
    assert R.reward_for(ev("ok", 1.5, mode="server")) is None
    assert R.reward_for(ev("ok", 1.5, mode="server"), mode="server") == pytest.approx(
        R.correct_reward(math.log(1.5)))


def test_normalised_by_the_best_known_time_for_the_shape():
    """x = log(s / ref): a shape whose verified best is 1.5x puts 1.5x at 0; a group of
    uniformly slow kernels still ranks, with the same gaps whatever the reference."""
    group = [0.30, 0.33, 0.36, 0.40]
    for ref in (1.0, 1.5):
        rs = [R.reward_for(ev("ok", s), reference=ref) for s in group]
        assert all(a < b for a, b in zip(rs, rs[1:]))
        assert len(set(rs)) == len(rs)
    assert R.reward_for(ev("ok", 1.5), reference=1.5) == 0.0
    assert R.reward_for(ev("ok", 1.6), reference=1.5) > 0 > R.reward_for(ev("ok", 1.4), reference=1.5)


def test_not_measured_without_an_estimate_gets_the_flat_estimate():
    e = ev("not_measured")
    assert R.reward_for(e) == R.FLAT_ESTIMATE


# ---- estimates from the build, never the meta -------------------------------------------------

MMA_LOOP = """
.visible .entry gemm(
.param .u64 a
)
.maxntid 128, 1, 1
{
$L__BB0_1:
	cp.async.wait_group 1;
	cp.async.cg.shared.global [%r1], [%rd1], 16, %r2;
	cp.async.cg.shared.global [%r1], [%rd1], 16, %r2;
@MMA@
	@%p1 bra 	$L__BB0_1;
	ret;
}
"""
FMA_LOOP = """
.visible .entry naive(
.param .u64 a
)
{
$L__BB1_1:
	ld.global.nc.u16 	%rs1, [%rd1];
	ld.global.nc.u16 	%rs2, [%rd2];
	fma.rn.f32 	%f1, %f2, %f3, %f1;
	@%p1 bra 	$L__BB1_1;
	ret;
}
"""
MMA = "\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f1};\n"


def test_ptx_facts_read_the_instruction_mix():
    from cudal2_rl.estimate import ptx_facts
    f = ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 16))
    (e,) = f.entries
    assert f.kind == "mma" and e.threads == 128 and e.hot.depth == 3
    assert e.hot.flops == 16 * 4096 / 32 and e.hot.bytes == 32
    g = ptx_facts(FMA_LOOP)
    assert g.kind == "fma_f32" and g.entries[0].hot.bytes == 4 and g.entries[0].threads is None
    assert ptx_facts(".visible .entry k()\n{\n\tret;\n}\n").entries == []


def test_estimate_ranks_tensor_cores_above_scalar_and_prices_the_slowest_entry():
    from cudal2.search.costmodel import GPUS
    from cudal2_rl.estimate import estimate_us, ptx_facts
    g, shape = GPUS["H100"], (4096, 4096, 4096)
    big = estimate_us(ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 16)), shape, g)[0]   # reuse 64
    small = estimate_us(ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 4)), shape, g)[0]   # reuse 16
    naive = estimate_us(ptx_facts(FMA_LOOP), shape, g)[0]
    assert big < small < naive
    # a never-launched fast entry next to a naive one cannot raise the estimate
    both = estimate_us(ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 64) + FMA_LOOP), shape, g)[0]
    assert both == pytest.approx(naive)
    assert estimate_us(ptx_facts(""), shape, g)[0] is None


def test_add_estimate_is_flagged_and_uses_no_meta():
    from cudal2.search.costmodel import GPUS
    from cudal2_rl.estimate import ptx_facts
    facts = ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 64))
    rows = []
    for meta in ({"style": "mma", "tile": [16, 16, 16]},
                 {"style": "cutlass", "tile": [128, 256, 64], "threads": 384}):
        e = ev("not_measured")
        e.meta = meta
        assert R.add_estimate(e, facts, {"cublaslt_autotuned": 200.0}, GPUS["H100"])
        assert e.estimated and e.timings["offline"]["candidate"]["estimated"]
        assert e.env["estimate"]["from"].startswith("build")
        rows.append(e.speedups["offline"]["cublaslt_autotuned"])
    assert rows[0] == rows[1]        # same device code, two metas: the same estimate
    assert R.reward_for(e) == R.FLAT_ESTIMATE     # ... which never reaches the reward
    # nothing to price: flagged, flat reward
    e = ev("not_measured")
    assert not R.add_estimate(e, None, {"cublaslt_autotuned": 200.0}, GPUS["H100"])
    assert e.estimated and R.reward_for(e) == R.FLAT_ESTIMATE and "no estimate" in e.detail
    # a failed build never gets an estimate
    assert not R.add_estimate(ev("build_error"), facts, {"torch": 1.0}, GPUS["H100"])


@pytest.mark.compile
def test_same_binary_two_metas_same_estimate_and_a_lying_naive_kernel_ranks_low(tmp_path):
    """Built with nvcc: the naive kernel of tests/data with its honest meta and with a meta
    claiming a 128x256 CUTLASS tile get the same estimate, below a real template kernel's."""
    from pathlib import Path
    from cudal2.harness.db import ResultsDB
    naive = (Path(__file__).parent / "data" / "cheats" / "good_naive.cu").read_text()
    liar = naive.replace('\\"style\\": \\"mma\\"', '\\"style\\": \\"cutlass\\"').replace(
        "[16, 16, 1]", "[128, 256, 64]")
    assert liar != naive
    template = '#define BM 128\n#define BN 128\n#define WM 64\n#define WN 64\n#include "mma_hgemm.cuh"\n'
    from cudal2_rl.executor import LocalExecutor
    ex = LocalExecutor(jobs=1)
    if ex.gpu_name():
        pytest.skip("a GPU is visible: rewards are measured, not estimated")
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"), timeout_s=300)
    rs = rf(prompts=[""] * 3, completions=[naive, liar, template], M=[4096] * 3, N=[4096] * 3,
            K=[4096] * 3)
    a = rf.attempts[-1]
    assert [x.verdict for x in a] == ["not_measured"] * 3 and all(x.estimated for x in a)
    assert a[0].speedup == a[1].speedup and rs[0] == rs[1]
    # the estimate ranks the template kernel far above the naive one; the reward stays flat
    assert a[2].speedup > 10 * a[0].speedup and rs == [R.FLAT_ESTIMATE] * 3


# ---- the cache, through fake executors ------------------------------------------------------

class CountingExecutor:
    """Fake executor: a canned not_measured row per request (no build behind it: the estimator
    finds no PTX and gives the flat estimate), counting calls."""

    def __init__(self, status="not_measured", gpu=""):
        self.requests = []
        self.status = status
        self.gpu = gpu

    def gpu_name(self):
        return self.gpu

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


@pytest.fixture
def no_ptx(monkeypatch):
    """The fake rows have no build in the cache: the estimator sees no PTX (no nvcc here)."""
    import cudal2.core.build as B
    monkeypatch.setattr(R, "build", lambda spec, **kw: B.BuildResult("compile_error", "", None, None, ""))


@pytest.fixture
def fake_ptx(monkeypatch):
    """Every build 'kept' the PTX of MMA_LOOP: estimates without nvcc."""
    import cudal2.core.build as B
    from cudal2_rl import estimate as E
    monkeypatch.setattr(R, "build", lambda spec, **kw: B.BuildResult("ok", "k", None, None, ""))
    monkeypatch.setattr(R, "facts_for_build", lambda br: E.ptx_facts(MMA_LOOP.replace("@MMA@", MMA * 16)))


def test_cache_repeated_kernel_is_not_reevaluated(tmp_path, no_ptx):
    from cudal2.harness.db import ResultsDB
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db)
    comps = [SHORT, SHORT, "no code here", "```cuda\n" + SHORT + "```"]
    r1 = rf(prompts=[""] * 4, completions=comps, M=[64, 64, 64, 128], N=[64] * 4, K=[64] * 4)
    # same source + same shape twice in one batch -> one evaluation; another shape -> another
    assert len(ex.requests) == 2
    assert r1[2] == R.PENALTIES["no_code"]
    assert r1[0] == r1[1] == R.FLAT_ESTIMATE
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


def test_comment_only_edit_is_the_same_kernel_in_the_cache(tmp_path, no_ptx):
    from cudal2.harness.db import ResultsDB
    edited = "// tuned for this shape\n" + SHORT.replace("#define BK 32", "#define BK   32  /* k */")
    assert R.source_sha(edited) == R.source_sha(SHORT)
    ex = CountingExecutor()
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"))
    rf(prompts=[""] * 2, completions=[SHORT, edited], M=[64] * 2, N=[64] * 2, K=[64] * 2)
    assert len(ex.requests) == 1


def test_step_summary_and_best(tmp_path, fake_ptx):
    from cudal2.harness.db import ResultsDB
    rf = R.KernelReward(CountingExecutor(), ResultsDB(tmp_path / "r.db"))
    rf(prompts=[""] * 2, completions=[SHORT, "x"], M=[256, 256], N=[256, 256], K=[256, 256])
    s = rf.step_summary()
    assert s["n"] == 2 and s["frac_compiled"] == 0.5 and s["frac_correct"] is None and s["estimated"]
    assert s["groups"] == 1 and s["frac_group_zero_std"] == 0.0 and s["reward_std"] > 0
    # an estimate is no reference and no best: it only ranks (best_estimated), at the flat reward
    assert rf.best == {} and rf.reference((256, 256, 256)) == 1.0
    a = rf.best_estimated[(256, 256, 256)]
    assert a.source == SHORT and a.estimated and not a.verified and 0 < a.speedup < 1
    assert a.reward == R.FLAT_ESTIMATE
    assert "no GPU" in rf.estimate_note() and "0 measurements" in rf.estimate_note()
    assert "PTX" in rf.estimate_note()


def test_reward_requires_shape_columns(tmp_path):
    from cudal2.harness.db import ResultsDB
    rf = R.KernelReward(CountingExecutor(), ResultsDB(tmp_path / "r.db"))
    with pytest.raises(ValueError, match="M, N, K"):
        rf(prompts=[""], completions=[SHORT])


def test_multi_turn_returns_pass_through(tmp_path):
    from cudal2.harness.db import ResultsDB
    rf = R.KernelReward(CountingExecutor(), ResultsDB(tmp_path / "r.db"))
    assert rf(prompts=[""] * 2, completions=["a", "b"], M=[1, 1], N=[1, 1], K=[1, 1],
              turn_return=[0.5, None]) == [0.5, None]
    assert rf.executor.requests == []


def _measured_row(r, speedup, gpu=GPU, status="ok"):
    from cudal2.harness.pipeline import settings
    e = Evaluation(status=status, source_sha=R.source_sha(r.source), shape=r.shape, arch=r.arch,
                   acc="f32", layout="RR", env={"gpu": gpu, "settings": settings(r)})
    if status == "ok":
        e.timings = {"offline": {"candidate": {"median_us": 10.0 / speedup},
                                 **{b: {"median_us": 10.0} for b in r.baselines}}}
        e.speedups = {"offline": {b: speedup for b in r.baselines}}
    return e


def test_no_gpu_reuses_a_gpu_measurement(tmp_path):
    """Without a GPU, a kernel the DB has measured on a GPU gets the measured reward."""
    from cudal2.harness.db import ResultsDB
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db)
    db.add(_measured_row(rf._request(SHORT, (64, 64, 64)), 1.2), source=SHORT)
    rf = R.KernelReward(ex, db)
    assert rf.reuse_gpu == GPU
    r = rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert ex.requests == [] and r[0] == pytest.approx(R.correct_reward(math.log(1.2)))
    a = rf.attempts[-1][0]
    assert a.verdict == "ok" and not a.estimated and a.cached
    # measured once, never re-measured: it is not a verified best (no reference, no export)
    assert not a.verified and (64, 64, 64) not in rf.best


def test_rl_does_not_reuse_a_row_timed_another_way(tmp_path, no_ptx):
    """The one cache rule: a row measured with the old per-call events timer, or without the
    mode RL asks for, is not served to RL; the kernel is evaluated again."""
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import settings
    db = ResultsDB(tmp_path / "r.db")
    ex = CountingExecutor()
    rf = R.KernelReward(ex, db, reuse_gpu=GPU)
    req = rf._request(SHORT, (64, 64, 64))
    for timer, modes in (("events", ("offline",)), ("kernel", ("server",))):
        st = dict(settings(req), timer=timer)
        keys = {"offline": "offline", "server": "server_1ms"}
        db.add(Evaluation(status="ok", source_sha=R.source_sha(SHORT), shape=Shape(64, 64, 64),
                          arch="sm_90a", acc="f32", layout="RR",
                          env={"gpu": GPU, "settings": st},
                          timings={keys[m]: {"candidate": {"median_us": 5.0}} for m in modes},
                          speedups={keys[m]: {"cublaslt_autotuned": 1.2} for m in modes}),
               source=SHORT)
    rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert len(ex.requests) == 1 and not rf.attempts[-1][0].cached


# ---- winner's curse: a new best is re-measured before it counts ------------------------------

class FakeGpuExecutor:
    """A 'GPU' executor whose measurements come from a script: speedups[sha] is a list of the
    values successive measurements of that kernel return."""

    def __init__(self, speedups):
        self.speedups = {k: list(v) for k, v in speedups.items()}
        self.calls = []           # ("many" | "remeasure", sha, baselines)

    def gpu_name(self):
        return GPU

    def _one(self, r, how):
        sha = R.source_sha(r.source)
        self.calls.append((how, sha[:8], tuple(r.baselines)))
        return _measured_row(r, self.speedups[sha].pop(0))

    def evaluate_many(self, requests):
        return [self._one(r, "many") for r in requests]

    def remeasure(self, request):
        return self._one(request, "remeasure")


def test_new_best_is_remeasured_in_a_fresh_run_before_it_counts(tmp_path):
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import cached
    k1, k2, k3 = SHORT, SHORT.replace("64", "128"), SHORT.replace("32", "16")
    s1, s2, s3 = (R.source_sha(k) for k in (k1, k2, k3))
    # k1: 1.50x once (lucky), 1.20x when measured again; k2: 0.9x (no new best); k3 later 1.3x/1.25x
    ex = FakeGpuExecutor({s1: [1.5, 1.2], s2: [0.9], s3: [1.3, 1.25]})
    db = ResultsDB(tmp_path / "r.db")
    rf = R.KernelReward(ex, db)
    shape = (512, 512, 512)
    rs = rf(prompts=[""] * 2, completions=[k1, k2], M=[512] * 2, N=[512] * 2, K=[512] * 2)
    assert [c[0] for c in ex.calls] == ["many", "many", "remeasure"]
    assert ex.calls[-1][2] == rf.all_baselines            # the fresh run times every baseline
    assert rf.n_remeasured == 1
    a1, a2 = rf.attempts[-1]
    # the reward, the best and the reference use the re-measurement, not the lucky first value
    assert a1.speedup == pytest.approx(1.2) and a1.verified and rs[0] == pytest.approx(
        R.correct_reward(math.log(1.2)))
    assert not a2.verified and a2.speedup == pytest.approx(0.9)
    assert rf.best[shape].speedup == pytest.approx(1.2) and rf.reference(shape) == pytest.approx(1.2)
    # both rows are in the DB; the cache serves the newest (the re-measurement) from now on
    rows = db.rows(source_sha=s1)
    assert len(rows) == 2 and rows[-1].env["rl_remeasure_of"] == rows[0].id
    assert rows[-1].env["rl_first_speedup"] == pytest.approx(1.5)
    hit = cached(db, rf._request(k1, shape), GPU)
    assert hit.id == rows[-1].id
    # next step: k3 beats the verified 1.2 -> re-measured (1.25) and becomes the best; the
    # cached k1 is served as is (already verified, not measured again)
    rs2 = rf(prompts=[""] * 2, completions=[k3, k1], M=[512] * 2, N=[512] * 2, K=[512] * 2)
    assert [c[0] for c in ex.calls[3:]] == ["many", "remeasure"]
    assert rf.best[shape].sha == s3 and rf.best[shape].speedup == pytest.approx(1.25)
    # rewards against the best known time before this step (1.2x)
    assert rs2[0] == pytest.approx(R.correct_reward(math.log(1.25 / 1.2)))
    assert rs2[1] == pytest.approx(0.0)


def test_estimates_are_not_remeasured(tmp_path, no_ptx):
    from cudal2.harness.db import ResultsDB
    ex = CountingExecutor()
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"))
    rf(prompts=[""], completions=[SHORT], M=[64], N=[64], K=[64])
    assert rf.n_remeasured == 0 and len(ex.requests) == 1


def test_screened_reward_stays_below_its_finalist(tmp_path):
    """Group screening: a non-finalist's screened speedup cannot outscore the group's finalist,
    which alone went through the full correctness suite."""
    from cudal2.harness.db import ResultsDB
    k1, k2 = SHORT, SHORT.replace("64", "128")
    s1 = R.source_sha(k1)

    class Screening(FakeGpuExecutor):
        def evaluate_groups(self, requests):
            fin = _measured_row(requests[0], 0.8)
            scr = _measured_row(requests[1], 0.8)
            scr.stage, scr.speedups, scr.timings = "screen", {}, {}
            scr.stats = {"rl": {"screened": {"cublaslt_autotuned": 0.95}, "mode": "offline",
                                "finalist": s1}}
            return [fin, scr]
    rf = R.KernelReward(Screening({}), ResultsDB(tmp_path / "r.db"))
    rs = rf(prompts=[""] * 2, completions=[k1, k2], M=[256] * 2, N=[256] * 2, K=[256] * 2)
    assert rs[1] < rs[0] and rs[0] == pytest.approx(R.correct_reward(math.log(0.8)))
    a = rf.attempts[-1][1]
    assert a.stage == "screen" and not a.verified and a.speedup == pytest.approx(0.95)


def test_launch_bound_shapes_are_named_with_a_reason(tmp_path):
    from cudal2.harness.db import ResultsDB
    out = R.launch_bound([(64, 64, 64), (4096, 4096, 4096)], floor_us=3.0)
    assert list(out) == [(64, 64, 64)] and "estimated" in out[(64, 64, 64)]
    # a measured baseline time wins over the estimate
    db = ResultsDB(tmp_path / "r.db")
    rf = R.KernelReward(CountingExecutor(), db)
    row = _measured_row(rf._request(SHORT, (64, 64, 64)), 1.0)
    row.timings["offline"]["cublaslt_autotuned"]["median_us"] = 9.0
    db.add(row, source=SHORT)
    out = R.launch_bound([(64, 64, 64)], db=db, gpu=GPU, floor_us=3.0)
    assert out == {}
    out = R.launch_bound([(64, 64, 64)], db=db, gpu=GPU, floor_us=5.0)
    assert "measured on" in out[(64, 64, 64)]


# ---- the resolution floor: noise carries no advantage ----------------------------------------

def _att(speedup, reward=None, res=R.math.log1p(R.RESOLUTION), verdict="ok", shape=(64, 64, 64),
         turn=1, estimated=False):
    r = R.speedup_reward(speedup) if reward is None else reward
    return R.Attempt(shape, verdict, r, speedup, estimated, turn=turn, resolution=res)


def test_rewards_within_the_resolution_are_tied():
    # four kernels within 0.04% of each other (the spread the estimate gave), one build failure
    g = [_att(0.5000), _att(0.5001), _att(0.5002), _att(None, R.PENALTIES["build_error"], 0,
                                                        "build_error")]
    assert R.tie_within_resolution(g) == 2
    assert g[0].reward == g[1].reward == g[2].reward == R.speedup_reward(0.5)
    assert g[3].reward == R.PENALTIES["build_error"]          # failures keep their rank
    # a group all within the resolution has no spread at all: trl's advantage is zero
    g = [_att(1.000), _att(1.003), _att(1.0045)]
    R.tie_within_resolution(g)
    assert len({a.reward for a in g}) == 1
    # differences beyond the resolution stay ranked; a wider recorded interval ties more
    g = [_att(1.00), _att(1.02), _att(1.10)]
    assert R.tie_within_resolution(g) == 0 and g[0].reward < g[1].reward < g[2].reward
    g = [_att(1.00, res=0.05), _att(1.02, res=0.05), _att(1.10, res=0.05)]
    R.tie_within_resolution(g)
    assert g[0].reward == g[1].reward < g[2].reward
    # other shapes and turns are other groups; estimated rows are left alone
    g = [_att(1.0), _att(1.001, shape=(128, 64, 64)), _att(1.002, turn=2)]
    assert R.tie_within_resolution(g) == 0


def test_measurement_resolution_reads_the_interval():
    e = ev("ok", 1.0)
    assert R.measurement_resolution(e) == pytest.approx(math.log1p(R.RESOLUTION))
    e.stats = {"offline": {"speedup": {"cublaslt_autotuned": {"median": 1.0, "lo": 0.9, "hi": 1.1}}}}
    assert R.measurement_resolution(e) == pytest.approx(0.5 * math.log(1.1 / 0.9))


def test_trl_sees_tied_rewards_for_noise(tmp_path):
    """Through KernelReward.__call__ (what trl calls): two kernels measured 0.2% apart (inside
    the 0.5% floor) get one reward; a third 10% faster ranks above them."""
    from cudal2.harness.db import ResultsDB
    ks = [SHORT, SHORT.replace("64", "128"), SHORT.replace("32", "16")]
    ex = FakeGpuExecutor({R.source_sha(k): [v] for k, v in zip(ks, (0.800, 0.8016, 0.88))})
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"))
    rs = rf(prompts=[""] * 3, completions=ks, M=[512] * 3, N=[512] * 3, K=[512] * 3)
    assert rs[0] == rs[1] == pytest.approx(R.correct_reward(math.log(0.8))) and rs[2] > rs[0]
    assert [a.reward for a in rf.attempts[-1]] == rs      # the log shows what trl saw


def test_attempt_round_trips_through_the_log():
    """--resume rebuilds Attempts from log.jsonl records (to_dict, then JSON)."""
    import json
    from cudal2_rl.reward import Attempt
    a = Attempt((64, 128, 256), "ok", 0.5, 1.6, True, "ab" * 32, 7, False, "d", {"regs": 96},
                "torch", "// src", "final", True, 1.2, ["note: x"], 2, 0.01)
    b = Attempt.from_dict(json.loads(json.dumps(a.to_dict())), source="// src")
    assert b == a
    assert Attempt.from_dict(a.to_dict(), cached=True).cached and b.shape == (64, 128, 256)


# ---- the reward table without a GPU (rl.table), against real builds --------------------------

@pytest.mark.compile
def test_the_table_rewards_the_binary_it_measured_not_a_text_or_another_shape(tmp_path):
    """A table that measured one WMMA binary at 256^3 (reward draw 10.1 us, reference draws 10.0
    us; a faster binary sets the shape's reference at 8.0 us). Tried as a policy would game it:
    comments added: the same binary, the same measured reward; the meta string respaced (the
    same meaning, another binary): a miss, flat and queued, since the table vouches only for what
    it timed; the measured binary asked at a shape the table lacks: a miss, queued."""
    from cudal2.core.build import BuildSpec, build
    from cudal2.harness.db import ResultsDB
    from cudal2_rl.corpus import variants
    from cudal2_rl.executor import LocalExecutor
    from cudal2_rl.table import Draw, Entry, Queue, RewardTable
    src = next(v for v in variants("wmma") if v.meta()["tile"][:2] == [128, 32]).source()
    key = build(BuildSpec(src, arch="sm_90a")).binary_key
    assert key
    S = (256, 256, 256)

    def draws(*us):
        return tuple(Draw(u, None, None, "screen", i, "t.db", 0.01) for i, u in enumerate(us))

    table = RewardTable.from_entries(
        [Entry(key, S, "RR", "f32", "sha", src, draws(10.0, 10.1, 10.0)),
         Entry("faster", S, "RR", "f32", "sha2", "", draws(8.0))], gpu="TEST GPU", arch="sm_90a")
    commented = "// tuned for 256 x 256\n" + src.replace("{\n", "{  // the body\n", 1)
    meta = '\\"acc\\": \\"f32\\"'
    assert src.count(meta) == 1
    respaced = src.replace(meta, '\\"acc\\":\\"f32\\"')
    queue = Queue(tmp_path / "queue.jsonl")
    rf = R.KernelReward(LocalExecutor(2), ResultsDB(tmp_path / "r.db"), table=table, queue=queue,
                        reuse_gpu="")
    fence = "```cuda\n{}```"
    texts = [fence.format(s) for s in (src, commented, respaced, src)]
    got = rf.score_attempts(texts, [S, S, S, (512, 256, 256)])
    if not rf.estimated:
        pytest.skip("a GPU is visible: rewards come from the harness, not the table")
    hit = R.correct_reward(math.log(8.0 / 10.1))
    assert [a.table for a in got] == ["hit", "hit", "miss", "miss"], [(a.verdict, a.detail) for a in got]
    assert got[0].reward == got[1].reward == pytest.approx(hit)
    assert got[2].reward == got[3].reward == R.FLAT_ESTIMATE < hit
    assert got[0].table_rows == [["t.db", 0], ["t.db", 1], ["t.db", 2]]
    # no baseline time in this table: the speedup is against its fastest binary, and says so
    assert got[0].versus == "table best" and got[0].speedup == pytest.approx(8.0 / 10.1)
    queued = {(r["binary_key"] == key, (r["M"], r["N"], r["K"])) for r in queue.rows()}
    assert queued == {(False, S), (True, (512, 256, 256))}


def test_without_a_gpu_a_table_hit_ranks_above_every_estimate_for_outputs():
    """The run's best per shape (kernels/, best_kernels.csv, the step line) is a kernel a GPU
    timed (a reward-table hit) before any estimate, however flattering; hits compare by speedup."""
    from cudal2_rl.reward import Attempt, note_bests
    s = (4096, 4096, 4096)
    guess = Attempt(s, "not_measured", -0.55, 3.0, estimated=True, sha="guess")
    hit = Attempt(s, "not_measured", 0.0, 0.9, sha="hit", table="hit")
    better = Attempt(s, "not_measured", 0.1, 1.1, sha="better", table="hit")
    best, ranked = {}, {}
    note_bests([guess, hit], best, ranked)
    assert best == {} and ranked[s].sha == "hit"
    note_bests([Attempt(s, "not_measured", -0.55, 9.0, estimated=True, sha="g2"), better], best, ranked)
    assert ranked[s].sha == "better"
    from types import SimpleNamespace
    from cudal2_rl.train import _best_how, _bests_line
    run = SimpleNamespace(estimated=True, best={}, best_estimated=ranked)
    assert _bests_line(run, [s, (64, 64, 64)]) == "1/2 shapes with a built kernel, 1 of them measured (reward table)"
    assert _best_how(better) == " (measured: reward table)" and _best_how(guess) == " (estimated)"
    better.versus = "table best"
    assert "no baseline time" in _best_how(better)
