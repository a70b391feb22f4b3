"""Adversarial kernels against the reward, through the project's own path (extract -> build ->
audit -> reward) without a GPU: each trick the static estimate fell for scores no higher than the
honest kernel it derives from. The kernels (tests/data/adversarial/, README there) derive from the
corpus WMMA kernel: a wgmma under a never-true branch, every K step reusing the first K slice
(wrong), a meta claiming a 128x128 tile and 256 threads, and both code tricks together."""
from pathlib import Path

import pytest

from cudal2_rl import reward as R

DATA = Path(__file__).parent / "data" / "adversarial"
TRICKS = ("dead_wgmma", "skip_k", "flattering_meta", "dead_wgmma_skip_k")
SHAPE = (4096, 4096, 4096)


def test_the_honest_kernel_is_the_corpus_wmma_kernel():
    from cudal2_rl.corpus import Variant, render
    v = Variant("wmma", (("WM", 32), ("WN", 32), ("WARPS_M", 2), ("WARPS_N", 2), ("GROUP_M", 8)))
    assert (DATA / "honest.cu").read_text() == render(v)


@pytest.mark.compile
def test_adversarial_kernels_score_no_higher_than_the_honest_one(tmp_path):
    from cudal2.harness.db import ResultsDB
    from cudal2_rl.executor import LocalExecutor
    ex = LocalExecutor(jobs=1)
    if ex.gpu_name():
        pytest.skip("a GPU is visible: rewards are measured (the GPU tier checks these kernels)")
    names = ("honest",) + TRICKS
    # as completions: the honest kernel in a fenced block, the tricks as raw files
    comps = [f"```cuda\n{(DATA / f'{n}.cu').read_text()}```" if n == "honest"
             else (DATA / f"{n}.cu").read_text() for n in names]
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"), timeout_s=300)
    rs = rf(prompts=[""] * len(comps), completions=comps, M=[SHAPE[0]] * len(comps),
            N=[SHAPE[1]] * len(comps), K=[SHAPE[2]] * len(comps))
    ex.close()
    got = dict(zip(names, rf.attempts[-1]))
    honest = got["honest"]
    assert honest.verdict == "not_measured" and honest.reward == R.FLAT_ESTIMATE
    for n in TRICKS:
        assert got[n].reward <= honest.reward, (n, got[n].verdict, got[n].reward)
    # the code tricks built and passed the audit: the reward is flat, whatever the estimate says
    for n in ("dead_wgmma", "skip_k", "dead_wgmma_skip_k"):
        assert got[n].verdict == "not_measured" and got[n].reward == honest.reward
    # ... and the estimate (kept for ranking) does fall for them: the reason it is no reward
    assert got["dead_wgmma"].speedup > honest.speedup
    assert got["dead_wgmma_skip_k"].speedup > honest.speedup
    # the flattering meta is a lie the binary shows: rejected, below every honest failure
    liar = got["flattering_meta"]
    assert liar.verdict == "audit_rejected" and liar.reward == R.PENALTIES["audit_rejected"]
    assert any("threads 256" in x for x in liar.audit)
    # nothing estimated became a reference or a best
    assert rf.best == {} and rf.reference(SHAPE) == 1.0
