"""Statistics the harness acts on: medians with bootstrap intervals, paired per-round ratios,
the stopping rule and the clock filter. Pure Python (numpy when present, for speed); unit-tested
on CPU.

Why paired ratios: callables of one shape are timed in the same interleaved rounds, so a clock
dip or a noisy neighbour hits a round's candidate and baselines alike. The speedup is the median
over rounds of baseline_time / candidate_time, with a percentile bootstrap interval of that
median; sampling stops when every interval is tight or the budget ends.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

CONFIDENCE = 0.95
BOOTSTRAP = 1000
# A round is discarded when an SM clock read during it is more than this fraction below the
# median clock of the run (nvbench discards samples taken under throttled clocks).
CLOCK_TOLERANCE = 0.03


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no samples")
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an already sorted sequence."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def bootstrap_median_ci(xs: Sequence[float], *, confidence: float = CONFIDENCE,
                        n_boot: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of `xs` (deterministic for a seed). One
    sample gives a zero-width interval at that value: callers require a minimum count."""
    if not xs:
        raise ValueError("interval of no samples")
    n = len(xs)
    if n == 1:
        return float(xs[0]), float(xs[0])
    alpha = (1.0 - confidence) / 2.0
    try:
        import numpy as np
    except ImportError:              # pragma: no cover - numpy is a dependency
        np = None
    if np is not None:
        rng = np.random.default_rng(seed)
        arr = np.asarray(xs, dtype=float)
        meds = np.median(arr[rng.integers(0, n, size=(n_boot, n))], axis=1)
        lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
        return float(lo), float(hi)
    rng = random.Random(seed)
    meds = sorted(median([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    return quantile(meds, alpha), quantile(meds, 1.0 - alpha)


def bootstrap_geomean_ci(xs: Sequence[float], *, confidence: float = CONFIDENCE,
                         n_boot: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float, float]:
    """(geomean, lo, hi): the geometric mean of positive `xs` (e.g. per-shape speedups) with a
    percentile-bootstrap interval over the items (resampled with replacement; deterministic for
    a seed). One item gives a zero-width interval at its value."""
    if not xs:
        raise ValueError("geomean of no samples")
    if any(not x > 0 for x in xs):
        raise ValueError(f"geomean needs positive values, got {min(xs)!r}")
    logs = [math.log(x) for x in xs]
    n = len(logs)
    g = math.exp(sum(logs) / n)
    if n == 1:
        return g, g, g
    alpha = (1.0 - confidence) / 2.0
    try:
        import numpy as np
    except ImportError:              # pragma: no cover - numpy is a dependency
        np = None
    if np is not None:
        rng = np.random.default_rng(seed)
        arr = np.asarray(logs, dtype=float)
        means = arr[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
        lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
        return g, math.exp(float(lo)), math.exp(float(hi))
    rng = random.Random(seed)
    means = sorted(sum(logs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return g, math.exp(quantile(means, alpha)), math.exp(quantile(means, 1.0 - alpha))


@dataclass(frozen=True)
class Interval:
    """A median with its bootstrap interval and the sample count."""
    median: float
    lo: float
    hi: float
    n: int

    @property
    def rel_halfwidth(self) -> float:
        return (self.hi - self.lo) / 2.0 / abs(self.median) if self.median else math.inf

    def to_dict(self) -> dict:
        return asdict(self)


def interval(xs: Sequence[float], *, confidence: float = CONFIDENCE, n_boot: int = BOOTSTRAP,
             seed: int = 0) -> Interval:
    lo, hi = bootstrap_median_ci(xs, confidence=confidence, n_boot=n_boot, seed=seed)
    return Interval(median(xs), lo, hi, len(xs))


def paired_ratios(numer: Sequence[float | None], denom: Sequence[float | None]) -> list[float]:
    """numer[r] / denom[r] for every round r where both were measured."""
    return [a / b for a, b in zip(numer, denom) if a is not None and b and b > 0]


def kept_rounds(clocks: Sequence[float | None], tolerance: float = CLOCK_TOLERANCE) -> list[bool]:
    """Which rounds to keep: False where the round's lowest SM clock read is more than
    `tolerance` below the median of all rounds' readings (throttled). Rounds without a reading
    are kept (no NVML: nothing to judge by)."""
    known = [c for c in clocks if c]
    if not known:
        return [True] * len(clocks)
    ref = median(known)
    return [not c or c >= (1.0 - tolerance) * ref for c in clocks]


def tight(intervals: Iterable[Interval], target: float) -> bool:
    """The stopping rule: every interval's half-width within `target` of its median."""
    return all(iv.rel_halfwidth <= target for iv in intervals)
