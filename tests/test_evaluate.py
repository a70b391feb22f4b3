"""evaluate(): build -> audit -> (GPU) measure -> DB, with the DB as a cache. The CPU half runs
everywhere with nvcc; the GPU half (marked) measures the control kernel and the GPU-only
hostile kernels (a kernel that never ends, an illegal address)."""
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cudal2.harness import provenance
from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import evaluate, evaluate_many
from cudal2.harness.types import EvalRequest, Shape

HOSTILE = Path(__file__).parent / "data" / "hostile"


def _req(name, shape=Shape(128, 128, 64), **kw):
    return EvalRequest((HOSTILE / name).read_text(), shape, arch="sm_90a", origin=name, **kw)


def test_provenance_without_gpu_queries():
    env = provenance.collect(gpu=False)
    assert env["gpu"] is None and env["hostname"] and env["time"].endswith("+00:00")
    assert "torch" in env and "git_commit" in env


@pytest.mark.compile
def test_no_gpu_pipeline_and_cache(tmp_path, monkeypatch):
    db = ResultsDB(tmp_path / "r.db")
    ev = evaluate(_req("control_ok.cu"), db=db, gpu=False)
    assert ev.status == "not_measured" and "no GPU" in ev.detail
    assert ev.audit["ok"] and ev.build["status"] == "ok" and ev.build["registers"] > 0
    assert ev.acc == "f32" and ev.layout == "RR" and ev.meta["tile"] == [16, 16, 1]
    assert ev.timings == {} and ev.speedups == {} and not ev.estimated   # nothing invented
    assert ev.env["nvcc"] and ev.env["gpu"] is None and ev.id == 1

    # second time: served from the DB without building or auditing
    import cudal2.build
    monkeypatch.setattr(cudal2.build, "build", lambda *a, **k: pytest.fail("rebuilt a cached kernel"))
    again = evaluate(_req("control_ok.cu"), db=db, gpu=False)
    assert again.id == ev.id and db.count() == 1
    # another shape is another evaluation
    monkeypatch.undo()
    other = evaluate(_req("control_ok.cu", shape=Shape(64, 64, 64)), db=db, gpu=False)
    assert other.id == 2 and db.source(ev.source_sha) == (HOSTILE / "control_ok.cu").read_text()


@pytest.mark.compile
@pytest.mark.parametrize("name, status, fragment", [
    ("fp16_acc_claims_f32.cu", "audit_rejected", "accumulates in fp16"),
    ("calls_cublas.cu", "audit_rejected", "cuBLAS"),
    ("meta_segv.cu", "crashed", "SIGSEGV"),
    ("ctor_hang.cu", "timeout", "no reply"),
    ("ctor_fork.cu", "crashed", "created processes"),
    ("meta_garbage.cu", "audit_rejected", "not JSON"),
])
def test_hostile_verdicts(tmp_path, name, status, fragment):
    db = ResultsDB(tmp_path / "r.db")
    ev = evaluate(_req(name), db=db, gpu=False, probe_timeout_s=3)
    assert ev.status == status and fragment in ev.detail, (ev.status, ev.detail)
    assert db.rows()[0].status == status


@pytest.mark.compile
def test_build_error_is_a_verdict(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    ev = evaluate(EvalRequest("this is not CUDA {", Shape(64, 64, 64)), db=db, gpu=False)
    assert ev.status == "build_error" and ev.build["status"] == "compile_error"
    assert "error" in ev.build["log_tail"]


def test_source_rules_before_building(tmp_path, monkeypatch):
    import cudal2.build
    monkeypatch.setattr(cudal2.build, "build", lambda *a, **k: pytest.fail("built a rejected source"))
    db = ResultsDB(tmp_path / "r.db")
    huge = "// padding\n" * 200_000
    ev = evaluate(EvalRequest(huge, Shape(64, 64, 64)), db=db, gpu=False)
    assert ev.status == "audit_rejected" and "bytes" in ev.detail
    ev = evaluate(_req("include_escape.cu"), db=db, gpu=False)
    assert ev.status == "audit_rejected" and "'..'" in ev.detail
    with pytest.raises(ValueError, match="UTF-8"):
        EvalRequest("bad \udcff surrogate", Shape(64, 64, 64))


@pytest.mark.compile
def test_evaluate_many_order_cache_and_executor(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    names = ["control_ok.cu", "synchronises.cu", "control_ok.cu", "meta_segv.cu"]
    reqs = [_req(n) for n in names]
    reqs[2] = _req("control_ok.cu", shape=Shape(256, 128, 64))
    seen = []
    with ThreadPoolExecutor(2) as ex:
        out = evaluate_many(reqs, db=db, executor=ex, gpu=False,
                            progress=lambda i, n, e: seen.append((i, n, e.status)))
    assert [e.status for e in out] == ["not_measured", "audit_rejected", "not_measured", "crashed"]
    assert [s[0] for s in seen] == [1, 2, 3, 4] and db.count() == 4
    again = evaluate_many(reqs, db=db, gpu=False)                  # all cached now
    assert [e.id for e in again] == [e.id for e in out] and db.count() == 4


# ---- GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.compile
def test_gpu_measures_the_control_kernel(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    ev = evaluate(_req("control_ok.cu", shape=Shape(256, 256, 256), baselines=("torch",),
                       timeout_s=300), db=db)
    assert ev.status in ("ok", "too_fast"), ev.detail
    assert ev.correctness.get("ok") is True
    cand = ev.timings["offline"]["candidate"]
    assert cand["median_us"] > 0 and cand["n"] > 0
    assert "torch" in ev.speedups["offline"]
    assert ev.env["gpu"] and db.lookup(ev.source_sha, ev.shape, "sm_90a", provenance.gpu_name())


@pytest.mark.gpu
@pytest.mark.compile
def test_gpu_hostile_kernels_and_recovery(tmp_path):
    from cudal2.harness.pipeline import gpu_pool
    db = ResultsDB(tmp_path / "r.db")
    with gpu_pool(max_tasks=10) as pool:
        spin = evaluate(_req("kernel_spins.cu", baselines=(), timeout_s=20), db=db, pool=pool)
        assert spin.status == "timeout", spin.detail
        wild = evaluate(_req("kernel_illegal_address.cu", baselines=(), timeout_s=120), db=db, pool=pool)
        assert wild.status == "crashed", (wild.status, wild.detail)
        good = evaluate(_req("control_ok.cu", baselines=(), timeout_s=300), db=db, pool=pool)
        assert good.status in ("ok", "too_fast"), good.detail
        assert pool.restarts >= 2


def _timed_row(db, req, gpu, **over):
    """A stored OK row as evaluate writes it after measuring `req` on `gpu`."""
    from cudal2.build import source_sha
    from cudal2.harness.pipeline import settings
    from cudal2.harness.types import Evaluation

    stats = {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "n": 50}
    who = ["candidate", *req.baselines, *req.extra_baselines]
    ev = Evaluation(status="ok", source_sha=source_sha(req.source), shape=req.shape,
                    arch=req.arch, acc="f32", layout="RR",
                    timings={m: {w: dict(stats) for w in who} for m in req.modes},
                    env={"gpu": gpu, "settings": settings(req), **over})
    db.add(ev, source=req.source)
    return ev


def test_cache_key_gpu_model_and_timing_settings(tmp_path):
    """A row answers only the request it was measured for: not_measured rows (no GPU) never
    stand in for a GPU measurement; a row timed with another timer, L2 flush, arrival rate or
    fewer baselines/modes is measured again; the latest matching verdict wins."""
    from cudal2.harness.pipeline import _cache_hit
    from cudal2.harness.types import Evaluation

    db = ResultsDB(tmp_path / "r.db")
    req = EvalRequest("// k\n", Shape(64, 64, 64), baselines=("torch", "cublas_nn"))
    assert _cache_hit(db, "0" * 64, req, None) is None
    from cudal2.build import source_sha
    sha = source_sha(req.source)
    db.add(Evaluation(status="not_measured", source_sha=sha, shape=req.shape, arch=req.arch,
                      env={"gpu": None}), source=req.source)
    assert _cache_hit(db, sha, req, None).status == "not_measured"     # no GPU: resume
    assert _cache_hit(db, sha, req, "NVIDIA H100 80GB HBM3") is None   # GPU: measure it

    h100 = "NVIDIA H100 80GB HBM3"
    row = _timed_row(db, req, h100)
    assert _cache_hit(db, sha, req, h100).id == row.id
    assert _cache_hit(db, sha, req, "NVIDIA H200") is None
    from dataclasses import replace
    for other in (replace(req, timer="graph"), replace(req, flush_l2=True),
                  replace(req, modes=("offline", "server")),
                  replace(req, baselines=("torch", "cublas_nn", "cublas_tn")),
                  replace(req, extra_baselines=("torch_tunableop",)),
                  replace(req, acc="f16")):
        assert _cache_hit(db, sha, other, h100) is None, other
    # fewer baselines than were timed: the row answers
    assert _cache_hit(db, sha, replace(req, baselines=("torch",)), h100).id == row.id

    server = replace(req, modes=("server",), target_qps=500.0)
    srow = _timed_row(db, server, h100)
    assert _cache_hit(db, sha, server, h100).id == srow.id
    assert _cache_hit(db, sha, replace(server, target_qps=50.0), h100) is None
    # the newest row that answers wins; an older matching row is still found
    graph = replace(req, timer="graph")
    grow = _timed_row(db, graph, h100)
    assert _cache_hit(db, sha, graph, h100).id == grow.id
    assert _cache_hit(db, sha, req, h100).id == row.id
    # wall mode times with the host clock: the GPU timer does not matter there
    wall = replace(req, modes=("wall",))
    wrow = _timed_row(db, wall, h100)
    assert _cache_hit(db, sha, replace(wall, timer="graph"), h100).id == wrow.id
    # a verdict that needs no timing (wrong answer) is served whatever the timing settings
    db.add(Evaluation(status="wrong", source_sha=sha, shape=req.shape, arch=req.arch,
                      acc="f32", env={"gpu": h100}), source=req.source)
    assert _cache_hit(db, sha, replace(req, timer="graph", flush_l2=True), h100).status == "wrong"


def test_eval_request_timing_fields_are_validated():
    base = dict(source="// k\n", shape=Shape(64, 64, 64))
    r = EvalRequest(**base, timer="graph", flush_l2=True, extra_baselines=("torch_cublaslt",))
    assert (r.timer, r.flush_l2, r.extra_baselines) == ("graph", True, ("torch_cublaslt",))
    with pytest.raises(ValueError, match="timer"):
        EvalRequest(**base, timer="cycles")
    with pytest.raises(ValueError, match="extra baseline"):
        EvalRequest(**base, extra_baselines=("torch_cudnn",))
    with pytest.raises(ValueError, match="target_qps"):
        EvalRequest(**base, target_qps=0)
    with pytest.raises(TypeError, match="flush_l2"):
        EvalRequest(**base, flush_l2="yes")
    for field, value in (("seeds", 0), ("timeout_s", 0), ("build_timeout_s", -1)):
        with pytest.raises(ValueError, match=f"EvalRequest.{field} must be .*, got {value}"):
            EvalRequest(**base, **{field: value})


@pytest.mark.compile
def test_compile_bomb_costs_one_build_timeout_then_the_db_row(tmp_path):
    """A generated file that keeps nvcc busy ends as build_error at the request's build timeout;
    the row is cached, so the same bomb from the policy never reaches nvcc again."""
    bomb = (Path(__file__).parent / "data" / "build_bombs" / "compile_bomb.cu").read_text()
    db = ResultsDB(tmp_path / "r.db")
    req = EvalRequest(bomb, Shape(64, 64, 64), arch="sm_80", origin="bomb", build_timeout_s=3)
    first = evaluate(req, db=db, gpu=False)
    assert first.status == "build_error" and first.build["status"] == "timeout"
    again = evaluate(req, db=db, gpu=False)
    assert again.status == "build_error" and db.count() == 1
