"""Multi-turn refinement: discounted per-turn returns, the feedback a turn sees, and a real
two-turn GRPO step through trl's rollout hook (built-in toy policy, real nvcc builds)."""
from __future__ import annotations

import json

import pytest

from cudal2_rl.multiturn import feedback, returns
from cudal2_rl.reward import Attempt


def test_returns_are_discounted_and_a_missing_reward_cuts_the_chain():
    assert returns([0.1, 0.5], 0.4) == pytest.approx([0.1 + 0.4 * 0.5, 0.5])
    assert returns([-0.8, -0.6, 0.3], 0.5) == pytest.approx([-0.8 + 0.5 * (-0.6 + 0.5 * 0.3),
                                                             -0.6 + 0.5 * 0.3, 0.3])
    # a harness error (no reward) passes nothing back to the turns before it
    assert returns([0.2, None, 0.4], 0.4) == pytest.approx([0.2, None, 0.4])


def test_feedback_carries_compiler_ptxas_audit_and_speed():
    bad = Attempt((64, 64, 64), "build_error", -0.8,
                  build={"log_tail": "k.cu(12): error: identifier \"BMX\" is undefined\n1 error"})
    text = feedback(bad)
    assert "build_error" in text and 'identifier "BMX" is undefined' in text
    assert "```cuda" in text                                       # how to answer
    ok = Attempt((64, 64, 64), "ok", 0.1, speedup=0.83, reference=1.2,
                 build={"registers": 96, "shared_bytes": 16384, "spills": 0},
                 audit=["note: uses cp.async"])
    text = feedback(ok)
    assert "speedup 0.83x" in text and "1.20x" in text and "96 registers" in text
    assert "audit: note: uses cp.async" in text
    est = Attempt((64, 64, 64), "not_measured", -0.2, speedup=0.6, estimated=True)
    assert "estimated speedup 0.60x" in feedback(est)
    compact = feedback(bad, "compact")
    assert compact.startswith("result build_error") and compact.endswith("revise")


@pytest.mark.compile
def test_two_turn_grpo_step(tmp_path):
    from cudal2_rl.config import RLConfig
    from cudal2_rl.policy import SMALL_RECIPE, build_builtin
    from cudal2_rl.train import run
    policy = build_builtin(SMALL_RECIPE, log=lambda *a: None)
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n2048,512,4096\n")
    out = tmp_path / "run"
    run(RLConfig(policy=str(policy), shapes=str(shapes), sample=2, steps=1, out=str(out),
                 num_generations=4, prompts_per_step=2, jobs=2, turns=2, gamma=0.4,
                 kernels_dir=str(tmp_path / "gk"), timeout=300, seed=0, launch_bound="keep"))
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    turns = [r for r in recs if r.get("type") == "turns"]
    assert turns and set(turns[0]["rewards"]) <= {"1", "2", 1, 2}
    step = next(r for r in recs if r.get("type") == "step")
    # 2 shapes x 2 trajectories x 2 turns, each its own scored sample
    assert step["summary"]["n"] == 8
    assert {a["turn"] for a in step["attempts"]} == {1, 2}


def test_feedback_carries_time_and_bottleneck_hints():
    """The next turn is told the kernel's time and what limits it: spills, register pressure,
    and where a measured time sits against the measured GPU's roofline."""
    from cudal2.harness.types import Evaluation, Shape
    from cudal2_rl.reward import bottleneck_hints
    ev = Evaluation(status="ok", source_sha="x", shape=Shape(4096, 4096, 4096), arch="sm_90a",
                    acc="f32", layout="RR", env={"gpu": "NVIDIA H100 80GB HBM3"}, stage="final",
                    build={"registers": 232, "spills": 64, "shared_bytes": 0})
    ev.timings = {"offline": {"candidate": {"median_us": 1374.0}}}      # ~100 TFLOP/s at 4096^3
    hints = bottleneck_hints(ev)
    assert any("spills 64 B" in h for h in hints)
    assert any("232 registers" in h and "8 warps" in h for h in hints)
    roof = [h for h in hints if h.startswith("compute-bound")]
    assert roof and "of H100" in roof[0] and "feed the tensor cores" in roof[0]
    a = Attempt((4096, 4096, 4096), "ok", 0.1, speedup=0.14, time_us=1374.0, hints=hints)
    text = feedback(a)
    assert "- time: 1374.0 us (measured)" in text and text.count("- bottleneck:") == len(hints)
    # a skinny shape's time is priced against DRAM bandwidth: memory-bound
    ev2 = Evaluation(status="ok", source_sha="y", shape=Shape(16, 8192, 8192), arch="sm_90a",
                     acc="f32", layout="RR", env={"gpu": "NVIDIA H100 80GB HBM3"}, stage="final")
    ev2.timings = {"offline": {"candidate": {"median_us": 100.0}}}
    assert bottleneck_hints(ev2)[0].startswith("memory-bound")
    # no GPU: the estimate's terms (an FMA-only loop, a poorly filled last wave)
    ev3 = Evaluation(status="not_measured", source_sha="z", shape=Shape(256, 256, 256), arch="sm_90a",
                     acc="f32", layout="RR", env={"estimate": {"kind": "fma", "wave_eff": 0.1}},
                     estimated=True)
    h3 = bottleneck_hints(ev3)
    assert any("no tensor-core instruction" in h for h in h3) and any("10% of the last wave" in h for h in h3)
    est = Attempt((256, 256, 256), "not_measured", -0.2, speedup=0.6, estimated=True, time_us=12.0, hints=h3)
    assert "(estimated, no GPU)" in feedback(est)
