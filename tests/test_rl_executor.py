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


# ---- group screening (GPU path) with a fake harness ----------------------------------------

def _row(req, status="ok", stage="final", screen_us=None, speedup=None):
    from cudal2.core.identity import source_sha
    from cudal2.harness.types import Evaluation
    e = Evaluation(status=status, source_sha=source_sha(req.source), shape=req.shape, arch=req.arch,
                   stage=stage)
    if screen_us is not None:
        e.timings = {"screen": {"candidate": {"median_us": screen_us}}}
    if speedup is not None:
        e.speedups = {"offline": {"cublaslt_autotuned": speedup}}
    return e


def test_group_runner_screens_a_group_and_sends_only_its_fastest_to_finals():
    """One screen per shape, finals for the fastest screened kernel only (the next one when the
    fastest fails its full checks), non-finalists anchored to the finalist, builds of the next
    shape running while the current one is measured, and the throughput counters."""
    import time
    from cudal2_rl.executor import Executor, GroupRunner

    class Ex(Executor):
        jobs = 2

        def gpu_name(self):
            return "FakeGPU"

    A, B = Shape(256, 256, 256), Shape(512, 512, 512)
    srcs = [f"int kernel{i};\n" for i in range(6)]     # distinct kernels (comments do not count)
    # shape A: k0 20us, k1 10us (fastest, but fails its finals), k2 wrong at smoke, k3 12us;
    # shape B: k4 5us, k5 a build error (two entrants: screened, k4 to finals)
    reqs = [EvalRequest(source=s, shape=A if i < 4 else B, origin="rl") for i, s in enumerate(srcs)]
    screen_plan = {0: ("ok", 20.0), 1: ("ok", 10.0), 2: ("wrong", None), 3: ("ok", 12.0),
                   4: ("ok", 5.0), 5: ("build_error", None)}
    finals_plan = {1: ("wrong", None), 3: ("ok", 0.8), 4: ("ok", 1.1)}

    class Fake(GroupRunner):
        def build(self, request):
            i = srcs.index(request.source)
            if request.shape == B:
                time.sleep(0.3)          # still building while shape A is measured
            return f"build-{i}"

        def screen(self, shape, entrants):
            rows = []
            for e in entrants:
                st, us = screen_plan[srcs.index(e.request.source)]
                rows.append(_row(e.request, st, "screen", us))
            return rows, {}

        def finals(self, shape, entrants):
            out = []
            for e in entrants:
                st, s = finals_plan[srcs.index(e.request.source)]
                out.append(_row(e.request, st, "final", speedup=s))
            return out

    ex = Ex()
    runner = Fake(ex)
    rows = runner.run(reqs)
    finals = [i for kind, i in runner.events if kind == "final"]
    assert finals == [1, 3, 4]        # A: fastest (1) failed its finals -> next fastest (3); B: 4
    ev = [e[0] if e[0] != "build" else f"build{e[1]}" for e in runner.events]
    assert ev.index("screen") < ev.index("build4")      # shape A measured while B still builds
    assert [r.stage for r in rows] == ["screen", "final", "screen", "final", "final", "screen"]
    assert [r.status for r in rows] == ["ok", "wrong", "wrong", "ok", "ok", "build_error"]
    # k0 screened at 20us vs the finalist k3 at 12us (0.8x in finals): 0.8 * 12 / 20
    assert rows[0].stats["rl"]["screened"]["cublaslt_autotuned"] == pytest.approx(0.48)
    assert rows[0].stats["rl"]["finalist"] == rows[3].source_sha
    assert ex.fresh == 6 and ex.gpu_seconds > 0 and "per GPU-minute" in ex.throughput()


def test_throughput_line_without_a_gpu():
    from cudal2_rl.executor import Executor
    assert Executor().throughput() == "evaluations per GPU-minute: not measured: no GPU"


def test_local_executor_uses_every_core_unless_told(monkeypatch):
    import os
    from cudal2_rl.executor import LocalExecutor
    monkeypatch.delenv("CUDAL2_BUILD_JOBS", raising=False)
    assert LocalExecutor().jobs == (os.cpu_count() or 1)
    monkeypatch.setenv("CUDAL2_BUILD_JOBS", "1")
    assert LocalExecutor().jobs == 1


@pytest.mark.compile
def test_missing_header_is_a_build_error_and_an_escape_stays_a_rejection(tmp_path):
    """A misspelt header (template or toolkit) is the compiler's verdict: -0.8, with nvcc's
    message; an include that climbs out with '..' is refused before nvcc: -0.9."""
    from pathlib import Path
    from cudal2.harness.db import ResultsDB
    from cudal2_rl.executor import LocalExecutor
    from cudal2_rl.reward import PENALTIES, KernelReward
    naive = (Path(__file__).parent / "data" / "cheats" / "good_naive.cu").read_text()
    comps = ['#define BM 64\n#include "mma_hgem.cuh"\n',
             naive.replace("#include <cuda_fp16.h>", '#include "cuda_fp16.hh"'),
             '#define BM 64\n#include "../templates/mma_hgemm.cuh"\n']
    rf = KernelReward(LocalExecutor(jobs=1), ResultsDB(tmp_path / "r.db"), timeout_s=300)
    r = rf(prompts=[""] * 3, completions=comps, M=[64] * 3, N=[64] * 3, K=[64] * 3)
    assert r == [PENALTIES["build_error"], PENALTIES["build_error"], PENALTIES["audit_rejected"]]
    a = rf.attempts[-1]
    assert "mma_hgem.cuh" in a[0].build.get("log_tail", "") and "'..'" in a[2].detail
