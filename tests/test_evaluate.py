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
    import cudal2.harness.pipeline as P      # the names the pipeline calls
    monkeypatch.setattr(P, "build", lambda *a, **k: pytest.fail("rebuilt a cached kernel"))
    monkeypatch.setattr(P, "build_many", lambda *a, **k: pytest.fail("rebuilt a cached kernel"))
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
    import cudal2.harness.pipeline as P      # the names the pipeline calls
    monkeypatch.setattr(P, "build", lambda *a, **k: pytest.fail("built a rejected source"))
    monkeypatch.setattr(P, "build_many", lambda *a, **k: pytest.fail("built a rejected source"))
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
    assert ev.env["gpu"] and ev.stats["offline"]["session"]["rounds"] >= 1
    from cudal2.harness.pipeline import cached
    assert cached(db, _req("control_ok.cu", shape=Shape(256, 256, 256), baselines=("torch",)),
                  provenance.gpu_name()).id == ev.id


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


def _timed_row(db, req, gpu, *, stage="final", **over):
    """A stored OK row as the harness writes it after measuring `req` on `gpu`."""
    from cudal2.core.identity import source_sha
    from cudal2.harness.measure import mode_keys
    from cudal2.harness.pipeline import settings
    from cudal2.harness.types import Evaluation

    stats = {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "n": 50}
    who = ["candidate", *req.baselines, *req.extra_baselines]
    ev = Evaluation(status="ok", source_sha=source_sha(req.source), shape=req.shape,
                    arch=req.arch, acc="f32", layout="RR", options=dict(req.options), stage=stage,
                    timings={m: {w: dict(stats) for w in who} for m in mode_keys(req)},
                    env={"gpu": gpu, "settings": settings(req), **over})
    db.add(ev, source=req.source)
    return ev


def test_one_cache_rule_gpu_model_options_and_how_it_was_timed(tmp_path):
    """A row answers only the request it was measured for: not_measured rows (no GPU) never
    stand in for a GPU measurement; a row timed with another timer, operands, server gaps,
    options, fewer baselines or modes, or a screening row, is measured again; the newest
    matching verdict wins; a wrong verdict answers whatever the timing."""
    from dataclasses import replace

    from cudal2.core.identity import source_sha
    from cudal2.harness.pipeline import answers, cached
    from cudal2.harness.types import Evaluation

    db = ResultsDB(tmp_path / "r.db")
    req = EvalRequest("// k\n", Shape(64, 64, 64), baselines=("torch", "cublas_nn"))
    assert cached(db, req, None) is None
    sha = source_sha(req.source)
    db.add(Evaluation(status="not_measured", source_sha=sha, shape=req.shape, arch=req.arch,
                      env={"gpu": None}), source=req.source)
    assert cached(db, req, None).status == "not_measured"     # no GPU: resume
    h100 = "NVIDIA H100 80GB HBM3"
    assert cached(db, req, h100) is None                       # GPU: measure it

    row = _timed_row(db, req, h100)
    assert cached(db, req, h100).id == row.id
    assert cached(db, req, "NVIDIA H200") is None
    for other in (replace(req, operands="hot"), replace(req, modes=("offline", "server")),
                  replace(req, modes=("offline", "e2e")),
                  replace(req, baselines=("torch", "cublas_nn", "cublas_tn")),
                  replace(req, extra_baselines=("torch_tunableop",)),
                  replace(req, acc="f16"), replace(req, options={"swizzle": 8})):
        assert cached(db, other, h100) is None, other
    assert cached(db, replace(req, baselines=("torch",)), h100).id == row.id   # fewer: answers

    server = replace(req, modes=("server",), server_gaps_ms=(1.0, 10.0))
    srow = _timed_row(db, server, h100)
    assert cached(db, server, h100).id == srow.id
    assert cached(db, replace(server, server_gaps_ms=(100.0,)), h100) is None
    # options are part of what was evaluated
    opt = replace(req, options={"swizzle": 8})
    orow = _timed_row(db, opt, h100)
    assert cached(db, opt, h100).id == orow.id and cached(db, req, h100).id == row.id
    # a screening row never answers a finals request
    scr = _timed_row(db, replace(req, options={"swizzle": 4}), h100, stage="screen")
    assert not answers(scr, replace(req, options={"swizzle": 4}))
    # a row timed by the old per-call events timer does not answer a kernel-time request
    old = _timed_row(db, replace(req, options={"swizzle": 2}), h100)
    old.env["settings"]["timer"] = "events"
    assert not answers(old, replace(req, options={"swizzle": 2}))
    # a verdict that needs no timing (wrong answer) is served whatever the timing settings
    db.add(Evaluation(status="wrong", source_sha=sha, shape=req.shape, arch=req.arch,
                      acc="f32", env={"gpu": h100}), source=req.source)
    assert cached(db, replace(req, operands="hot", modes=("wall",)), h100).status == "wrong"
    # a harness error never answers
    err = Evaluation(status="error", source_sha=sha, shape=req.shape, arch=req.arch, env={"gpu": h100})
    assert not answers(err, req)


def test_eval_request_timing_fields_are_validated():
    base = dict(source="// k\n", shape=Shape(64, 64, 64))
    r = EvalRequest(**base, operands="hot", server_gaps_ms=(1, 100), extra_baselines=("torch_cublaslt",),
                    options={"swizzle": 8, "raster": 1})
    assert (r.timer, r.operands, r.server_gaps_ms) == ("kernel", "hot", (1.0, 100.0))
    assert r.options == (("raster", 1), ("swizzle", 8))
    with pytest.raises(ValueError, match="timer"):
        EvalRequest(**base, timer="events")
    with pytest.raises(ValueError, match="extra baseline"):
        EvalRequest(**base, extra_baselines=("torch_cudnn",))
    with pytest.raises(ValueError, match="operands"):
        EvalRequest(**base, operands="lukewarm")
    with pytest.raises(ValueError, match="server_gaps_ms"):
        EvalRequest(**base, server_gaps_ms=(-1,))
    with pytest.raises(ValueError, match="runtime option"):
        EvalRequest(**base, options={"swizzle": "eight"})
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


def test_runtime_options_are_checked_against_the_meta_then_reach_the_worker_and_db(tmp_path,
                                                                                   monkeypatch):
    """An option the kernel does not declare costs no GPU time; valid ones are timed and stored."""
    from types import SimpleNamespace

    from cudal2.core.identity import source_sha
    from cudal2.harness import pipeline as P

    monkeypatch.setattr(P.provenance, "collect", lambda gpu=None: {"gpu": "FakeGPU" if gpu else None})
    monkeypatch.setattr(P.provenance, "gpu_name", lambda: "FakeGPU")
    src = "// one ABI 2 build\n"
    meta = {"style": "cutlass", "arch": "sm_90a", "acc": "f32", "layout": "RR", "tile": [128, 128, 64],
            "any_shape": True, "workspace_bytes": 0, "abi": 2,
            "options": [{"name": "swizzle", "values": [1, 2, 4, 8], "default": 1}]}
    audits = {source_sha(src): {"ok": True, "status": "error", "detail": "", "build": {},
                                "audit": {"ok": True}, "meta": meta, "acc": "f32", "layout": "RR"}}
    br = SimpleNamespace(so_path=tmp_path / "k.so")
    sent = []

    class FakePool:                       # the worker: records what it was asked to time
        def run(self, fn, shape, args, *rest, timeout_s):
            sent.append(args)
            return SimpleNamespace(status="ok", value={"reference": {}, "env": {}, "candidates": [
                {"status": "ok", "timings": {"screen": {"candidate": {"median_us": 5.0}}}}
                for _ in args]})

    db = ResultsDB(tmp_path / "r.db")
    cands = [P.ScreenCandidate(src, br, (("swizzle", 8),)), P.ScreenCandidate(src, br, (("raster", 1),)),
             P.ScreenCandidate(src, br, (("swizzle", 3),)), P.ScreenCandidate(src, br),
             P.ScreenCandidate(src, br, {"swizzle": 2})]   # a dict reaches the worker as pairs
    rows, _ = P.screen(Shape(256, 256, 256), cands, db=db, pool=FakePool(), gpu=True, audits=audits)
    assert [r.status for r in rows] == ["ok", "audit_rejected", "audit_rejected", "ok", "ok"]
    assert "not declared" in rows[1].detail and "not one of [1, 2, 4, 8]" in rows[2].detail
    assert sent == [[(str(br.so_path), [("swizzle", 8)]), (str(br.so_path), []),
                     (str(br.so_path), [("swizzle", 2)])]]
    assert sorted((r.status, str(r.options)) for r in db.rows(stage="screen")) == [
        ("audit_rejected", "{'raster': 1}"), ("audit_rejected", "{'swizzle': 3}"),
        ("ok", "{'swizzle': 2}"), ("ok", "{'swizzle': 8}"), ("ok", "{}")]
    with pytest.raises(ValueError, match="swizzle"):
        P.ScreenCandidate(src, br, {"swizzle": "8"})
    # finals apply the same check (evaluate_group reusing the audit of the screen)
    (fin,) = P.evaluate_group([EvalRequest(src, Shape(256, 256, 256), options={"raster": 1})],
                              build_results=[br], audits=audits, gpu=False)
    assert fin.status == "audit_rejected" and fin.detail.startswith("options:")
