"""The per-call schedule: CUDA-L2's host-clock timer ("wall"), kept to compare with its tables.

    wall     synchronise, read the host clock, one call, synchronise, read the host clock
             (host dispatch is part of the number: labelled, never mixed with kernel time)

Kernel time, the figure the project ranks, exports and rewards by, is cudal2.timing.kerneltime.
This schedule also runs per-call events around each host call ("offline"/"server" with the
"events" or "graph" per-call timers): those measure the host path whenever a kernel is shorter
than its launch (the first H100 campaign's 17-36 us for every small shape), so the harness no
longer uses them; they stay for comparisons and their tests.

Every mode: warm-up by time; all callables interleaved in a fresh random order each round;
inputs rotate through several buffer sets (a "repetition set" is a run of rounds on one set);
optional L2 flush before each timed call; after the last round of each repetition set each
callable's output is verified (a kernel may behave while checked and cheat while timed). Median,
p10, p90 and the count. The core (`run_schedule`) talks to a `TimerBackend`, so it is unit-tested
on CPU with a fake clock; cudal2.harness.measure adapts the kernel-time backend for the GPU.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from cudal2.harness.provenance import gpu_facts
from cudal2.timing.stats import quantile

# This schedule's arrival processes and per-call timers (not the harness's MODES/TIMERS).
MODES = ("offline", "server", "wall")
TIMERS = ("events", "graph")


@dataclass(frozen=True)
class TimingConfig:
    mode: str = "offline"          # offline | server | wall
    timer: str = "events"          # events | graph (ignored in wall mode: host clock)
    warmup_ms: float = 25.0        # per callable, spent before any timed call
    rounds_per_set: int = 10       # interleaved rounds on one input buffer set
    n_sets: int = 5                # repetition sets (inputs rotate: set i uses buffers i % buffers)
    target_qps: float = 2000.0     # server mode: mean arrival rate
    max_gap_s: float = 0.05        # server mode: cap on one idle gap (keeps runs bounded)
    flush_l2: bool = False         # write a buffer larger than L2 before every timed call
    graph_calls: int = 10          # graph timer: calls captured per graph
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"timing mode {self.mode!r} not in {MODES}")
        if self.timer not in TIMERS:
            raise ValueError(f"timer {self.timer!r} not in {TIMERS}")
        for name in ("rounds_per_set", "n_sets", "graph_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"TimingConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.mode == "server" and not self.target_qps > 0:
            raise ValueError(f"server mode needs target_qps > 0, got {self.target_qps!r}")


@dataclass(frozen=True)
class Stats:
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    mean_us: float
    min_us: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_us: list[float]) -> Stats:
    xs = sorted(samples_us)
    return Stats(quantile(xs, 0.5), quantile(xs, 0.1), quantile(xs, 0.9), len(xs),
                 sum(xs) / len(xs), xs[0])


def interleaved_order(names: list[str], rng: random.Random) -> list[str]:
    """A fresh random order for one round (no callable always runs first or after another)."""
    order = list(names)
    rng.shuffle(order)
    return order


def arrival_gaps(n: int, mode: str, target_qps: float, rng: random.Random,
                 max_gap_s: float = math.inf) -> list[float]:
    """Idle time before each of n calls: 0 back to back (offline, wall), exponential with mean
    1/target_qps for server mode (Poisson arrivals), each capped at max_gap_s."""
    if mode != "server":
        return [0.0] * n
    return [min(rng.expovariate(target_qps), max_gap_s) for _ in range(n)]


class TimerBackend(Protocol):
    """What the scheduling core needs from a device; fakes implement it in tests."""
    def now(self) -> float: ...                            # host seconds
    def synchronize(self) -> None: ...
    def sleep(self, seconds: float) -> None: ...
    def flush_l2(self) -> None: ...
    def start(self) -> object: ...                         # mark on the stream before a call
    def stop(self, token: object) -> object: ...           # mark after; returns a pending handle
    def elapsed_us(self, handle: object) -> float: ...     # resolve (may synchronise)
    def capture(self, fn: Callable[[], None], calls: int) -> Callable[[], None]: ...


@dataclass
class TimingResult:
    stats: dict[str, Stats]
    failures: list[str] = field(default_factory=list)     # verification failures, "who@set: why"
    order_log: list[list[str]] = field(default_factory=list)
    config: TimingConfig | None = None


def run_schedule(callables: dict[str, Callable[[int], None]], config: TimingConfig,
                 backend: TimerBackend, *, n_buffers: int = 1,
                 verify: Callable[[str, int], str | None] | None = None,
                 prepare_set: Callable[[int], None] | None = None) -> TimingResult:
    """Time every callable interleaved. callables[name](buffer_index) launches one call on the
    backend's stream using input buffer set `buffer_index`. prepare_set(buffer_index) runs before
    each repetition set, outside any timed region (e.g. fill outputs with NaN). verify(name,
    buffer_index) checks the output of that name's last call and returns None or a reason."""
    if not callables:
        raise ValueError("nothing to time")
    names = sorted(callables)
    rng = random.Random(config.seed)
    host = config.mode == "wall"
    per_call = 1
    run: dict[str, Callable[[int], None]] = dict(callables)
    if config.timer == "graph" and not host:
        # One graph per (callable, buffer set): captured calls replay the same pointers.
        per_call = config.graph_calls
        graphs = {(nm, b): backend.capture(lambda nm=nm, b=b: callables[nm](b), per_call)
                  for nm in names for b in range(n_buffers)}
        run = {nm: (lambda b, nm=nm: graphs[(nm, b)]()) for nm in names}

    # Warm-up by time: whole interleaved rounds until every callable had warmup_ms.
    t0 = backend.now()
    budget = config.warmup_ms * 1e-3 * len(names)
    rounds = 0
    while rounds < 2 or backend.now() - t0 < budget:
        for nm in interleaved_order(names, rng):
            run[nm](rounds % n_buffers)
        backend.synchronize()
        rounds += 1

    samples: dict[str, list[float]] = {nm: [] for nm in names}
    result = TimingResult({}, config=config)
    n_calls = config.rounds_per_set * len(names)
    for s in range(config.n_sets):
        b = s % n_buffers
        if prepare_set is not None:
            prepare_set(b)
        gaps = arrival_gaps(n_calls, config.mode, config.target_qps, rng, config.max_gap_s)
        pending: list[tuple[str, object]] = []
        i = 0
        for _ in range(config.rounds_per_set):
            order = interleaved_order(names, rng)
            result.order_log.append(order)
            for nm in order:
                gap = gaps[i]
                i += 1
                if gap > 0:
                    backend.synchronize()      # the GPU is idle during the gap
                    backend.sleep(gap)
                if config.flush_l2:
                    backend.flush_l2()
                if host:
                    backend.synchronize()
                    h0 = backend.now()
                    run[nm](b)
                    backend.synchronize()
                    samples[nm].append((backend.now() - h0) * 1e6)
                else:
                    token = backend.start()
                    run[nm](b)
                    pending.append((nm, backend.stop(token)))
        backend.synchronize()
        for nm, handle in pending:
            samples[nm].append(backend.elapsed_us(handle) / per_call)
        if verify is not None:
            for nm in names:
                why = verify(nm, b)
                if why:
                    result.failures.append(f"{nm}@set{s}: {why}")
    result.stats = {nm: summarize(xs) for nm, xs in samples.items()}
    return result


def gpu_env() -> dict:
    """SM clock (MHz), temperature (C), GPU name and driver right now (NVML, else nvidia-smi;
    keys absent when the GPU does not report them). Recorded before and after timing."""

    return gpu_facts()
