"""The measured reward table (rl/table.py) and the rewards it gives without a GPU."""
import gzip
import math

import pytest

from cudal2.harness.db import ResultsDB
from cudal2.harness.types import Evaluation, Shape

GPU = "TEST GPU"      # synthetic rows: test data, not a measurement


def _row(key, shape, us, *, stage="final", gpu=GPU, src="// k\n", status="ok", estimated=False,
         lo=None, hi=None):
    t = {"median_us": us, **({"lo_us": lo, "hi_us": hi} if lo else {})}
    timings = ({"screen": {"candidate": t}} if stage == "screen" else
               {"offline": {"candidate": t, "cublaslt_autotuned": {"median_us": 12.0}}})
    return Evaluation(status=status, source_sha=f"sha-{key}", shape=Shape(*shape), arch="sm_90a",
                      acc="f32", layout="RR", stage=stage, binary_key=key, timings=timings,
                      estimated=estimated,
                      env={"gpu": gpu, "settings": {"timer": "kernel", "operands": "cold"}}), src


def _db(path, rows):
    db = ResultsDB(path)
    for ev, src in rows:
        db.add(ev, source=src)
    db.close()
    return path


S = (256, 256, 256)


def test_entries_draws_reference_and_reward_from_different_draws(tmp_path):
    from cudal2_rl.table import RewardTable
    p = _db(tmp_path / "r.db", [_row("a", S, 10.0), _row("a", S, 8.0, stage="screen", lo=7.9, hi=8.1),
                                _row("b", S, 20.0), _row("c", S, 5.0, estimated=True),
                                _row("d", S, 4.0, status="wrong"), _row("e", S, 1.0, gpu="OTHER")])
    t = RewardTable.open([p], gpu=GPU)
    assert [e.binary_key for e in t.entries(S)] == ["a", "b"]      # measured ok rows of one GPU
    a = t.lookup("a", S)
    assert len(a.draws) == 2 and a.reference_us == 10.0 and a.reward_us == 8.0   # even / odd
    assert t.reference_us(S) == 10.0 and t.best(S).binary_key == "a"
    assert t.lookup("a", (512, 512, 512)) is None and t.lookup(None, S) is None
    assert t.baseline_us(S) == 12.0
    assert "1 shapes, 2 binaries" in t.describe()
    # one draw serves both
    assert t.lookup("b", S).reward_us == t.lookup("b", S).reference_us == 20.0


def test_gz_is_read_in_place_and_the_default_gpu_is_the_one_with_most_rows(tmp_path):
    from cudal2_rl.table import RewardTable
    p = _db(tmp_path / "r.db", [_row("a", S, 10.0), _row("b", S, 11.0), _row("x", S, 9.0, gpu="G2")])
    gz = tmp_path / "r.db.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    before = gz.read_bytes()
    t = RewardTable.open([gz])
    assert t.gpu == GPU and len(t) == 2 and gz.read_bytes() == before
    with pytest.raises(FileNotFoundError, match="no such results DB"):
        RewardTable.open([tmp_path / "absent.db"])


def test_queue_counts_repeats_and_keeps_sources(tmp_path):
    from cudal2_rl.table import Queue
    q = Queue(tmp_path / "q" / "queue.jsonl")
    q.add("k1", S, "s1", "// one\n")
    q.add("k1", S, "s1", "// one\n")
    q.add("k2", (64, 64, 64), "s2", "// two\n")
    again = Queue(tmp_path / "q" / "queue.jsonl").rows()
    assert {(r["binary_key"], r["count"]) for r in again} == {("k1", 2), ("k2", 1)}
    assert (tmp_path / "q" / "sources" / "s1.cu").read_text() == "// one\n"
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        Queue(tmp_path / "bad.jsonl")


def _reward_with(table, queue, evs):
    """KernelReward's no-GPU table path on given harness verdicts (the harness is stood in for)."""
    from cudal2_rl.reward import KernelReward

    class Exec:
        def gpu_name(self):
            return ""

        def evaluate_many(self, reqs):
            return [evs[r.source] for r in reqs]

    r = KernelReward(Exec(), None, table=table, queue=queue, reuse_gpu="")
    r._estimate = lambda ev, src: None
    return r


def _completion(name):
    return ("```cuda\nstatic const char* tag = \"" + name + "\";\n#include <cuda_runtime.h>\nextern \"C\" const char* cudal2_meta(void)"
            " { return \"{}\"; }\nextern \"C\" int cudal2_hgemm(const void* A, const void* B, void* C,"
            " int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t wsb, void* s)"
            " { return 0; }\n```")


def test_hit_miss_refusal_ordering_and_the_queue(tmp_path):
    from cudal2_rl import extract
    from cudal2_rl.reward import FLAT_ESTIMATE, PENALTIES
    from cudal2_rl.table import Queue, RewardTable
    p = _db(tmp_path / "r.db", [_row("fast", S, 10.0), _row("fast", S, 10.2), _row("slow", S, 30.0)])
    table, queue = RewardTable.open([p]), Queue(tmp_path / "queue.jsonl")
    names = ["fast", "slow", "unknown", "elsewhere", "refuses", "wrong"]
    texts = [_completion(n) for n in names]
    srcs = [extract.extract(t).source for t in texts]
    evs = {}
    for n, src in zip(names, srcs):
        status = {"refuses": "refused", "wrong": "wrong"}.get(n, "not_measured")
        key = {"elsewhere": "other-shape-key"}.get(n, n)
        evs[src] = Evaluation(status=status, source_sha=n, shape=Shape(*S), arch="sm_90a",
                              binary_key=key)
    _db(tmp_path / "x.db", [_row("other-shape-key", (512, 512, 512), 1.0)])
    reward = _reward_with(table, queue, evs)
    got = dict(zip(names, reward.score_attempts(texts, [S] * len(texts))))
    assert got["fast"].table == "hit" and got["slow"].table == "hit"
    # the best's reward is its reward draw (10.2) against the reference draw (10.0): just below 0
    assert got["fast"].reward == pytest.approx(math.log(10.0 / 10.2) / (1 - math.log(10.0 / 10.2) / 0.55))
    assert got["fast"].reward > got["slow"].reward > FLAT_ESTIMATE
    assert got["unknown"].table == "miss" and got["unknown"].reward == FLAT_ESTIMATE
    assert got["elsewhere"].table == "miss"          # measured, but at another shape: no reward
    assert PENALTIES["wrong"] < got["refuses"].reward == PENALTIES["refused"] < FLAT_ESTIMATE
    assert {r["binary_key"] for r in queue.rows()} == {"unknown", "other-shape-key"}


@pytest.mark.compile
def test_a_kernel_refusing_the_shape_is_refused_on_the_cpu():
    """The corpus WMMA kernel with a 128-row tile at M = 64: its own guard (which the audit
    checks its meta against) refuses the shape; caught before anything runs, on any machine."""
    from cudal2.harness import pipeline
    from cudal2.harness.types import EvalRequest
    from cudal2_rl.corpus import variants
    from cudal2_rl.reward import PENALTIES, reward_for
    v = next(v for v in variants("wmma") if v.meta()["tile"][0] == 128)
    ok = pipeline.evaluate(EvalRequest(source=v.source(), shape=Shape(128, 128, 128), arch="sm_90a"))
    refused = pipeline.evaluate(EvalRequest(source=v.source(), shape=Shape(64, 128, 128), arch="sm_90a"))
    assert ok.status in ("not_measured", "ok"), ok.detail
    assert refused.status == "refused" and "64x128x128" in refused.detail
    assert reward_for(refused) == PENALTIES["refused"]
    # the audit verdict screening and campaigns cache per source is shape-free: a refusal at the
    # shape it happened to be asked with must not refuse the kernel at every other shape
    verdict = pipeline.audit_verdict(EvalRequest(source=v.source(), shape=Shape(1, 1, 1),
                                                 arch="sm_90a"), "sha", None)
    assert verdict["ok"], verdict["detail"]


def _wmma128():
    from cudal2_rl.corpus import variants
    return next(v for v in variants("wmma") if v.meta()["tile"][0] == 128).source()


_GUARD = "  if (M % BM ||"


@pytest.mark.compile
def test_a_guard_that_refuses_a_shape_its_meta_claims_is_refused_on_the_cpu():
    """The meta says 384 rows are served (tile 128) but the guard refuses M = 384: the audit's
    probes (the claimed tile, the control shape) pass, so only the guard, called at the
    requested shape in a worker without a device, catches it."""
    from cudal2.harness import pipeline
    from cudal2.harness.types import EvalRequest
    src = _wmma128()
    assert src.count(_GUARD) == 1
    sly = src.replace(_GUARD, "  if (M == 384 || M % BM ||")
    got = pipeline.evaluate(EvalRequest(source=sly, shape=Shape(384, 128, 128), arch="sm_90a"), gpu=False)
    assert got.status == "refused" and "guard refuses 384x128x128" in got.detail, got.detail
    served = pipeline.evaluate(EvalRequest(source=sly, shape=Shape(512, 128, 128), arch="sm_90a"), gpu=False)
    assert served.status == "not_measured", served.detail


@pytest.mark.compile
def test_a_guard_that_refuses_every_call_without_a_device_is_not_refused():
    """cudaErrorInvalidValue at every shape without a device (as CUTLASS's initialize answers):
    the audit leaves the tile unverified, and no shape is called refused on that answer."""
    from cudal2.harness import pipeline
    from cudal2.harness.types import EvalRequest
    src = _wmma128()
    blind = src.replace(_GUARD, "  { int d; if (cudaGetDevice(&d) != cudaSuccess) return cudaErrorInvalidValue; }\n" + _GUARD)
    got = pipeline.evaluate(EvalRequest(source=blind, shape=Shape(256, 128, 128), arch="sm_90a"), gpu=False)
    assert got.status == "not_measured", got.detail
    assert "tile" not in got.audit["meta_verified"]


def test_a_gpu_launch_the_guard_refuses_is_refused_not_crashed():
    """On a GPU the guard's cudaErrorInvalidValue comes back from the launch: finals and
    screening word it differently; both are `refused`, another error code is a crash."""
    from cudal2.harness import pipeline
    for detail, want in [("kernel returned cudaError 1", "refused"),
                         ("kernel returned cudaError 1 (smoke, ones)", "refused"),
                         ("kernel returned cudaError 13", "crashed"),
                         ("kernel returned cudaError 700 (smoke, ones)", "crashed")]:
        ev = Evaluation(status="error", source_sha="s", shape=Shape(*S), arch="sm_90a")
        assert pipeline._apply(ev, {"status": "launch_error", "detail": detail}, "G").status == want


def test_only_the_default_options_count_and_a_merged_copy_is_one_draw(tmp_path):
    """A campaign screens other runtime options of the same binary (another configuration, which
    a policy's file does not run): left out. The same row in two DBs is one draw."""
    from cudal2_rl.table import RewardTable
    meta = {"abi": 2, "options": [{"name": "splits", "values": [1, 2], "default": 1}]}

    def opt(ev, options):
        ev.meta, ev.options = meta, options
        return ev

    a1, src = _row("a", S, 10.0)
    rows = [(opt(a1, {}), src), (opt(_row("a", S, 11.0)[0], {"splits": 1}), src),
            (opt(_row("a", S, 2.0)[0], {"splits": 2}), src)]
    p = _db(tmp_path / "r.db", rows)
    copy = tmp_path / "copy.db"
    copy.write_bytes(p.read_bytes())
    t = RewardTable.open([p, copy], gpu=GPU)
    a = t.lookup("a", S)
    assert sorted(d.us for d in a.draws) == [10.0, 11.0]
