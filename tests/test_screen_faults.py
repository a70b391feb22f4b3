"""Faults cost one candidate (issue 30, item 3), through the real pipeline.screen, WorkerPool and
worker processes on the fake device (cudal2/harness/fakedevice.py: CUDAL2_FAKE_DEVICE makes a
CPU worker answer as a device; CUDAL2_FAKE_FAULTS makes one library's launch raise the CUDA
error a device fault raises, or never return). Each candidate is a tiny host .so exporting the
kernel ABI (cc), so the worker really loads it and measure.screen's own except-path and
poisoning run. Then the tournament: a hung finalist is cut at its slice, and the deadline holds.
"""
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudal2.core.identity import source_sha
from cudal2.harness import pipeline as P, tournament as TN
from cudal2.harness.db import ResultsDB
from cudal2.harness.types import EvalRequest, Evaluation, Shape
from cudal2.harness.worker import WorkerPool, _selftest_echo

pytest.importorskip("cudal2.harness.fakedevice")
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a host C compiler for the fake kernels")

META = json.loads((Path(__file__).parent / "data" / "tiny_meta.json").read_text())
SHAPE = Shape(256, 256, 256)
KERNEL_C = r"""
#include <stddef.h>
static const char META[] = "%s";
const char* cudal2_meta(void) { return META; }
int cudal2_variant(void) { return %d; }
int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb,
                 int ldc, void* ws, size_t ws_bytes, void* stream) { return 0; }
"""


def _kernels(tmp_path, n):
    """n distinct fake kernel libraries: (source text, build with so_path, so sha256)."""
    meta = json.dumps(META).replace("\\", "\\\\").replace('"', '\\"')
    out = []
    for k in range(n):
        c = tmp_path / f"k{k}.c"
        c.write_text(KERNEL_C % (meta, k))
        so = tmp_path / f"k{k}.so"
        subprocess.run([CC, "-shared", "-fPIC", "-O0", "-o", str(so), str(c)], check=True)
        out.append((f"int fake_kernel_{k};\n", SimpleNamespace(so_path=so),
                    hashlib.sha256(so.read_bytes()).hexdigest()))
    return out


def _audits(kernels):
    return {source_sha(src): {"ok": True, "status": "error", "detail": "", "build": {},
                              "audit": {"ok": True}, "meta": META, "acc": "f32", "layout": "RR"}
            for src, _, _ in kernels}


def _pool(faults, **kw):
    env = dict(os.environ, CUDAL2_FAKE_DEVICE="0.01",
               CUDAL2_FAKE_FAULTS=",".join(f"{sha[:16]}:{kind}" for sha, kind in faults))
    # spare workers boot while a hang runs out, so a replaced worker costs no boot in the clock;
    # torch preloaded as gpu_pool does, else each worker's first finals task imports it inside
    # its time limit (2 s below: seconds on a loaded 2-core machine, a spurious timeout)
    return WorkerPool(1, env=env, preload=("torch", "cudal2.harness.measure", "cudal2.harness.pipeline"),
                      **{"max_tasks": 1000, "spare": 2, **kw})


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(P.provenance, "collect", lambda gpu=None: {"gpu": "FakeGPU" if gpu else None})
    monkeypatch.setattr(P.provenance, "gpu_name", lambda: "FakeGPU")
    # slices a CPU worker keeps easily (a fake screening takes milliseconds)
    monkeypatch.setattr(P, "SCREEN_CHUNK", 4)
    monkeypatch.setattr(P, "SCREEN_CANDIDATE_S", 1.0)
    monkeypatch.setattr(P, "SCREEN_TASK_S", 1.0)
    monkeypatch.setattr(P, "SCREEN_SETUP_S", 2.0)


def test_a_trap_and_a_hang_cost_their_own_candidates_and_the_deadline_holds(tmp_path, fake_gpu):
    ks = _kernels(tmp_path, 12)
    trap, hang = 2, 5
    # chunks of 4: [0 1 T 3] -> 3 not reached, on in a fresh worker: [3 4 H 6] hangs -> one by
    # one: 3, 4, H (its own slice), 6; then [7 8 9 10]
    db = ResultsDB(tmp_path / "r.db")
    audits = _audits(ks)
    cands = [P.ScreenCandidate(src, br) for src, br, _ in ks[:9]]
    with _pool([(ks[trap][2], "trap"), (ks[hang][2], "hang")]) as pool:
        t0 = time.monotonic()
        rows, ref = P.screen(SHAPE, cands, db=db, pool=pool, gpu=True, audits=audits,
                             deadline=t0 + 120)
        took = time.monotonic() - t0
        statuses = [r.status for r in rows]
        assert statuses == ["ok", "ok", "crashed", "ok", "ok", "timeout", "ok", "ok", "ok"], \
            [(r.status, r.detail) for r in rows]
        assert "illegal instruction" in rows[trap].detail
        assert "no reply within" in rows[hang].detail
        assert ref.get("torch_us")
        # worker replaced three times: the trap (poisoned), the hung chunk, the hang alone
        assert pool.restarts == 3
        # the hang cost its chunk's slice (1 + 4 x 1 s) and its own (1 + 1 s), set-ups aside
        assert took < 60, took
        assert db.count() == 9

        # a deadline inside a hung chunk: the chunk is stopped there, the rest is not reached,
        # nothing of it is stored, and the call returns at the deadline
        pool.run(_selftest_echo, 1)                       # a warm worker: no boot in the clock
        again = [P.ScreenCandidate(src, br) for src, br, _ in ks[3:]]   # 3 4 H 6 | 7 8 9 10 | 11
        t0 = time.monotonic()
        cut, _ = P.screen(SHAPE, again, db=db, pool=pool, gpu=True, audits=audits,
                          deadline=t0 + 2.5)
        took = time.monotonic() - t0
        assert took < 2.5 + 2.0, took
        assert all(P.budget_cut(r) and r.status == "not_measured" for r in cut)
        assert [r.detail.split(" (")[0] for r in cut] == (
            ["budget: stopped at the deadline"] * 4 + [P.NOT_REACHED] * 5)
        assert db.count() == 9


def test_a_hung_finalist_is_cut_at_its_slice_and_the_deadline_holds(tmp_path, fake_gpu):
    ks = _kernels(tmp_path, 3)
    audits = _audits(ks)

    def entrants(timeout_s):
        out = []
        for k, (src, br, _) in enumerate(ks):
            req = EvalRequest(src, SHAPE, arch="sm_90a", acc="f32", timeout_s=timeout_s,
                              baselines=("torch",))
            row = Evaluation(status="ok", source_sha=source_sha(src), shape=SHAPE, arch="sm_90a",
                             stage="screen", timings={"screen": {"candidate": {"median_us": 10.0 + k}}})
            out.append(TN.Entrant(req, br, screened=row))
        return out

    db = ResultsDB(tmp_path / "r.db")
    policy = TN.FinalistPolicy(top=1, within=0.0, cap=1, replacements=1)
    with _pool([(ks[0][2], "hang")]) as pool:
        backend = TN.HarnessBackend(db=db, finals_pool=pool, gpu=True, baseline_libs={},
                                    lt_known={}, audits=audits)
        # far deadline: the hung finalist (kernel 0) gets its own request's limit, 2 s, a
        # timeout verdict; the next binary (1) replaces it
        t0 = time.monotonic()
        res = TN.run(SHAPE, entrants(2.0), backend, policy, deadline=t0 + 60)
        took = time.monotonic() - t0
        assert [res.rows[i].status for i in res.finalists] == ["timeout", "ok"], \
            [(res.rows[i].status, res.rows[i].detail) for i in res.finalists]
        assert res.finalists == [0, 1] and res.replaced == [(0, 1)] and took < 30
        assert "no reply within 2 s" in res.rows[0].detail

        # near deadline: the session is cut at the time left (not the request's 60 s); no
        # verdict on the kernel, nothing stored, no replacement session started
        pool.run(_selftest_echo, 1)
        backend.db = db = ResultsDB(tmp_path / "r2.db")     # kernel 0's timeout is stored in r.db
        t0 = time.monotonic()
        res = TN.run(SHAPE, entrants(60.0), backend, TN.FinalistPolicy(top=1, within=0.0, cap=1),
                     deadline=t0 + 2.5)
        took = time.monotonic() - t0
        assert took < 2.5 + 2.0, took
        assert res.sessions == 1 and P.budget_cut(res.rows[0])
        assert res.rows[0].detail.startswith("budget: stopped at the deadline")
        assert db.count() == 0


def test_a_kept_finals_worker_serves_clean_sessions_and_a_failed_one_retires_it(tmp_path, fake_gpu):
    """Finals in a pool that keeps its worker (the campaign's, issue 66 point 7): sessions whose
    every candidate was ok share one worker start; a session with a wrong candidate retires the
    worker (no restart: it did not fault) and the next session starts a fresh one; a trap still
    poisons its worker and costs its own candidate only."""
    ks = _kernels(tmp_path, 4)
    audits = _audits(ks)
    db = ResultsDB(tmp_path / "r.db")

    def session(k, n):                  # kernel k alone at a shape of its own (no cache hit)
        src, br, _ = ks[k]
        req = EvalRequest(src, Shape(64, 64 * n, 64), arch="sm_90a", acc="f32", timeout_s=30.0,
                          baselines=("torch",))
        return P.evaluate_group([req], db=db, pool=pool, build_results=[br], gpu=True,
                                baseline_libs={}, lt_known={}, audits=audits)[0]

    with _pool([(ks[2][2], "wrong"), (ks[3][2], "trap")], max_tasks=64, spare=0) as pool:
        assert [session(k, n).status for k, n in ((0, 1), (1, 2), (0, 3))] == ["ok"] * 3
        assert (pool.started, pool.restarts) == (1, 0)
        wrong = session(2, 4)
        assert wrong.status == "wrong" and "injected wrong answer" in wrong.detail
        assert session(1, 5).status == "ok"
        assert (pool.started, pool.restarts) == (2, 0)
        trap = session(3, 6)
        assert trap.status == "crashed" and "illegal instruction" in trap.detail
        assert session(0, 7).status == "ok" and session(1, 8).status == "ok"
        assert (pool.started, pool.restarts) == (3, 1)
