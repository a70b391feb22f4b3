"""rl.executor with the real harness (build + audit, no GPU): the local pool, the Ray executor
on a small local cluster, and the reward's cache in front of them (a repeated kernel is never
rebuilt or re-evaluated)."""
import pytest

from cudal2.harness.types import EvalRequest, Shape

BAD = '#define BM 64\n#include "mma_hgemm.cuh"\nthis is not C++;\n'


def _good():
    from cudal2.templates import FAMILIES
    f = FAMILIES["mma"]
    return f.short_source(f.config(BM=64, BN=64, WM=32, WN=32, STAGES=2))


@pytest.mark.compile
def test_local_executor_and_reward_cache(tmp_path, monkeypatch):
    import cudal2.core.build as B
    import cudal2.harness.pipeline as P
    from cudal2.harness.db import ResultsDB
    from cudal2_rl.executor import LocalExecutor
    from cudal2_rl.reward import PENALTIES, KernelReward

    built = []
    real = B.build_many

    def counting(specs, **kw):
        built.extend(s.source for s in specs)
        return real(specs, **kw)
    monkeypatch.setattr(P, "build_many", counting)    # the name the pipeline calls

    good = _good()
    ex = LocalExecutor(jobs=2)
    assert ex.gpu_name() == "" or ex.gpu_name()
    rf = KernelReward(ex, ResultsDB(tmp_path / "r.db"), timeout_s=300)
    comps = [good, "```cuda\n" + good + "```", BAD, "no code at all"]
    r = rf(prompts=[""] * 4, completions=comps, M=[64] * 4, N=[128] * 4, K=[256] * 4)
    assert r[2] == PENALTIES["build_error"] and r[3] == PENALTIES["no_code"]
    assert r[0] == r[1] and r[0] is not None and r[0] > PENALTIES["wrong"]
    assert sorted(built) == sorted([good, BAD])          # the duplicate was built once
    statuses = {a.verdict for a in rf.attempts[-1]}
    assert statuses == {"not_measured" if not ex.gpu_name() else "ok", "build_error", "no_code"}
    n_rows = rf.db.count()
    assert n_rows == 2
    # the same kernels again, in a later step: no build, no evaluation, no new row
    r2 = rf(prompts=[""] * 2, completions=[good, BAD], M=[64] * 2, N=[128] * 2, K=[256] * 2)
    assert r2 == [r[0], r[2]]
    assert len(built) == 2 and rf.n_evaluated == 2 and rf.db.count() == n_rows
    assert all(a.cached for a in rf.attempts[-1])
    # the row behind the reward: estimated and audited when there is no GPU
    from cudal2.harness.pipeline import cached
    row = cached(rf.db, rf._request(good, (64, 128, 256)), ex.gpu_name())
    assert row is not None and row.audit.get("ok")
    if not ex.gpu_name():
        assert row.estimated and row.speedups["offline"]["cublaslt_autotuned"] > 0
    ex.close()


@pytest.mark.compile
def test_ray_executor_local_cluster(tmp_path):
    pytest.importorskip("ray")
    from cudal2_rl.executor import RayExecutor
    good = _good()
    ex = RayExecutor(None, num_cpus=2)
    try:
        assert "ray" in ex.describe()
        reqs = [EvalRequest(source=good, shape=Shape(64, 64, 64), origin="rl"),
                EvalRequest(source=BAD, shape=Shape(64, 64, 64), origin="rl")]
        evs = ex.evaluate_many(reqs)
        assert [e.shape for e in evs] == [Shape(64, 64, 64)] * 2
        assert evs[1].status == "build_error"
        assert evs[0].status in ("not_measured", "ok") and evs[0].audit.get("ok")
        assert evs[0].meta.get("style") == "mma"
    finally:
        ex.close()


def test_evaluate_one_calls_the_function_after_the_submodule_was_imported():
    """Regression: the harness's evaluate() once lived in a submodule of the same name, so with
    that submodule imported first (as the GPU path does for gpu_pool) `cudal2.harness.evaluate`
    was the module and every evaluation a harness error ('module' object is not callable).
    An #include escape is refused before nvcc, so this needs no compiler."""
    import cudal2.harness.pipeline  # noqa: F401 - the import order under test
    import cudal2.harness
    assert callable(cudal2.harness.evaluate)
    from cudal2_rl.executor import _evaluate_one
    ev = _evaluate_one(EvalRequest(source='#include "/etc/passwd"\n', shape=Shape(64, 64, 64),
                                   arch="sm_90a", origin="rl"))
    assert ev.status != "error", ev.detail
