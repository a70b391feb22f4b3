"""The experiment's statistics, over per-(arm, shape, seed) rows (run.py's `row`):

- ratio to best: the arm's winner time / the table's exhaustive best at the shape (1 = found it;
  regret = ratio - 1), exact since both are table reads;
- paired: arm a vs arm b on the same (shape, seed): a's winner time / b's (< 1: a faster);
- each a geomean with a percentile-bootstrap interval that resamples shapes, then each drawn
  shape's seeds (shapes are the unit held out; seeds are repeats within one);
- fast_1 (KernelBench): the fraction of (shape, seed) whose winner is faster than cuBLASLt
  autotuned (the table's baseline time); shapes without one are counted apart.
"""
from __future__ import annotations

import math
import random

from cudal2.timing.stats import CONFIDENCE, quantile

N_BOOT = 2000


def nested_bootstrap(groups: dict, *, seed: int = 0, n_boot: int = N_BOOT,
                     confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(geomean, lo, hi) of positive values grouped by shape ({shape: [value per seed]}):
    shapes resampled with replacement, then each drawn shape's values."""
    logs = [[math.log(x) for x in v] for v in groups.values() if v]
    if not logs:
        raise ValueError("bootstrap of no values")
    flat = [x for v in logs for x in v]
    g = math.exp(sum(flat) / len(flat))
    rng = random.Random(seed)
    means = []
    for _ in range(n_boot):
        draw = []
        for _s in logs:
            v = logs[rng.randrange(len(logs))]
            draw += [v[rng.randrange(len(v))] for _ in v]
        means.append(sum(draw) / len(draw))
    means.sort()
    alpha = (1.0 - confidence) / 2.0
    return g, math.exp(quantile(means, alpha)), math.exp(quantile(means, 1.0 - alpha))


def _by_shape(triples) -> dict:
    """{shape: [value per seed]} from (shape, seed, value), in shape then seed order, so the
    bootstrap draws the same whatever order the rows came in (a merge's or one run's)."""
    out: dict = {}
    for shape, _seed, value in sorted(triples):
        out.setdefault(shape, []).append(value)
    return out


def _shape(r) -> tuple:
    return (r["M"], r["N"], r["K"])


def vs_best(rows, arm: str, *, seed: int = 0) -> dict | None:
    """The arm's winner / the exhaustive best, over (shape, seed) with a winner."""
    mine = [r for r in rows if r["arm"] == arm]
    got = [(_shape(r), r["seed"], r["winner_us"] / r["best_us"]) for r in mine if r["winner_us"]]
    if not got:
        return None
    g, lo, hi = nested_bootstrap(_by_shape(got), seed=seed)
    return {"arm": arm, "ratio": g, "lo": lo, "hi": hi, "n": len(got), "no_winner": len(mine) - len(got),
            "found_best": sum(1 for *_k, x in got if x <= 1.0)}


def paired(rows, a: str, b: str, *, seed: int = 0) -> dict | None:
    """a's winner time / b's on the same (shape, seed); (shape, seed) where one has no winner
    are `unpaired`."""
    t = {(_shape(r), r["seed"], r["arm"]): r["winner_us"] for r in rows}
    got, unpaired = [], 0
    for (shape, sd, arm), ta in t.items():
        if arm != a or (shape, sd, b) not in t:
            continue
        tb = t[(shape, sd, b)]
        if ta and tb:
            got.append((shape, sd, ta / tb))
        else:
            unpaired += 1
    if not got:
        return None
    g, lo, hi = nested_bootstrap(_by_shape(got), seed=seed)
    return {"a": a, "b": b, "ratio": g, "lo": lo, "hi": hi, "pairs": len(got),
            "shapes": len({s for s, *_ in got}), "a_faster": sum(1 for *_k, x in got if x < 1.0),
            "b_faster": sum(1 for *_k, x in got if x > 1.0), "unpaired": unpaired}


def fast_1(rows, arm: str) -> dict:
    """{fast_1, n, no_baseline}: winners faster than the baseline among (shape, seed) that have
    a baseline time (no winner counts as not fast)."""
    mine = [r for r in rows if r["arm"] == arm]
    based = [r for r in mine if r.get("baseline_us")]
    fast = sum(1 for r in based if r["winner_us"] and r["winner_us"] < r["baseline_us"])
    return {"fast_1": fast / len(based) if based else None, "n": len(based),
            "no_baseline": len(mine) - len(based)}


def spend(rows, arm: str) -> dict:
    """Mean evaluations and GPU-seconds per (shape, seed), own and charged (RL's training)."""
    mine = [r for r in rows if r["arm"] == arm]
    n = max(1, len(mine))
    return {"evaluations": sum(r["evaluations"] for r in mine) / n,
            "gpu_seconds": sum(r["gpu_seconds"] for r in mine) / n,
            "charged_evaluations": mine[0]["charged_evaluations"] if mine else 0,
            "charged_gpu_seconds": mine[0]["charged_gpu_seconds"] if mine else 0.0,
            "misses": sum(r["misses"] for r in mine), "hits": sum(r["hits"] for r in mine)}


def summarise(rows, arms, *, seed: int = 0) -> dict:
    """Every statistic the report prints: per arm, and each policy arm vs each search arm
    (and rl vs sft: what RL training added)."""
    per_arm = [{"arm": a, "vs_best": vs_best(rows, a, seed=seed), "fast_1": fast_1(rows, a),
                "spend": spend(rows, a)} for a in arms]
    pairs = [(a, b) for a in ("rl", "sft") for b in ("tune", "random") if a in arms and b in arms]
    if "rl" in arms and "sft" in arms:
        pairs.append(("rl", "sft"))
    return {"per_arm": per_arm, "paired": [p for p in (paired(rows, a, b, seed=seed) for a, b in pairs) if p]}
