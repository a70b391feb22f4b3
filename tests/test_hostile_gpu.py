"""The GPU half of the hostile corpus (tests/data/hostile): kernels that pass the static audit
by design and cheat at run time, each with the verdicts that count as caught. The CPU half here
builds and audits them (a file that stops building or starts failing the audit is seen without
a GPU); on a GPU each goes through evaluate() and must get its verdict, the harness alive
throughout. Its own file so that the GPU kit's "harness" test group (tools/gpu_session/
families.py) runs just this when the harness or the corpus changes. The static and dry-call
verdicts of the whole corpus are in tests/test_audit.py and tests/test_callguard.py."""
from pathlib import Path

import pytest

from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import evaluate, evaluate_many
from cudal2.harness.types import EvalRequest, Shape

HOSTILE = Path(__file__).parent / "data" / "hostile"


def _req(name, shape=Shape(128, 128, 64), **kw):
    return EvalRequest((HOSTILE / name).read_text(), shape, arch="sm_90a", origin=name, **kw)


# The GPU hostile corpus: kernels that pass the static audit by design (no forbidden import or
# name) and cheat at run time, as the field's exploits did (CUDA-L1's stream and caching
# exploits, KernelBench's timer games, Sakana's memory reuse, batched repeats, a shared-memory
# slip that passed allclose).
# file -> the verdicts that count as caught (the file's header says why).
GPU_HOSTILE = {
    "timer_globaltimer.cu": {"wrong"},          # skips the work between back-to-back calls
    "timer_clock64.cu": {"wrong"},
    "timer_call_count.cu": {"wrong"},           # computes the first 64 calls, then 1 in 8
    "keeps_previous_output.cu": {"wrong"},      # same pointers as last call: does nothing
    "pointer_keyed_cache.cu": {"wrong"},        # replays the answer kept for (A, B)
    "ones_only.cu": {"wrong"},                  # right for 0/1 and constant inputs only
    "deferred_work.cu": {"wrong"},              # repeats on the same pointers batched for later
    "smem_unwritten.cu": {"wrong"},             # bits of C from shared memory it never wrote
    # a forbidden driver function by a name assembled at run time: the call guard's door
    # (`cudal2 audit`'s dry call rejects it on the CPU; evaluate's audit is static only)
    "door_assembled_name.cu": {"audit_rejected"},
    # work outside the call's stream, spelled so no source rule reads it: the call guard refuses
    # the launch during the first calls, which run on a stream of the harness's own
    "per_thread_handle.cu": {"audit_rejected"},     # (cudaStream_t)2, the per-thread stream
    "default_stream.cu": {"audit_rejected"},        # <<<grid, block>>>: stream 0
    "l2_launch_window.cu": {"audit_rejected"},      # an L2 access-policy launch attribute
}
# ... and what the verdict's detail must name, where one check is the one that must catch it
CAUGHT_BY = {
    "per_thread_handle.cu": "on cudaStreamPerThread",
    "default_stream.cu": "on cudaStreamLegacy",
    "l2_launch_window.cu": "L2 access-policy window",
    "door_assembled_name.cu": "cuCtxSynchronize",
    "smem_unwritten.cu": "determinism: bits differ",
}


@pytest.mark.compile
def test_gpu_hostile_corpus_passes_the_static_audit(tmp_path):
    """Each builds and passes the audit (only a GPU run can catch them): the CPU half of the
    corpus, so a file that stops building or starts failing the audit is seen without a GPU."""
    db = ResultsDB(tmp_path / "r.db")
    names = sorted(GPU_HOSTILE)
    for name, ev in zip(names, evaluate_many([_req(n) for n in names], db=db, gpu=False)):
        assert ev.status == "not_measured" and ev.audit["ok"], (name, ev.status, ev.detail)


@pytest.mark.gpu
@pytest.mark.compile
def test_gpu_hostile_corpus_verdicts(tmp_path):
    """On a GPU every one gets its verdict, and the harness stays alive throughout: the control
    kernel measured last is still accepted."""
    from cudal2.harness.pipeline import gpu_pool
    db = ResultsDB(tmp_path / "r.db")
    got = {}
    with gpu_pool(max_tasks=1) as pool:
        for name in sorted(GPU_HOSTILE):
            ev = evaluate(_req(name, shape=Shape(256, 256, 512), baselines=("torch",),
                               timeout_s=300), db=db, pool=pool)
            got[name] = (ev.status, ev.detail[:200])
        good = evaluate(_req("control_ok.cu", baselines=(), timeout_s=300), db=db, pool=pool)
    assert {n: s for n, (s, _) in got.items() if s not in GPU_HOSTILE[n]} == {}, got
    assert {n: d for n, (_, d) in got.items() if CAUGHT_BY.get(n, "") not in d} == {}, got
    assert good.status in ("ok", "too_fast"), good.detail
