"""One timing harness for every mode; modes differ only by the arrival process.

    offline  closed loop: calls back to back, GPU times by CUDA events on the launch stream
    server   Poisson arrivals: a host sleep drawn from an exponential distribution (mean 1/QPS)
             before each call, with the GPU idle, so clocks and caches cool as in serving;
             the call itself is still timed with events
    wall     CUDA-L2's method, for comparison with its tables: synchronise, read the host clock,
             one call, synchronise, read the host clock (host dispatch is part of the number)

Every mode: warm-up by time; all callables interleaved in a fresh random order each round;
inputs rotate through several buffer sets (a "repetition set" is a run of rounds on one set);
optional L2 flush before each timed call; optional CUDA-graph timer (N calls captured, replayed,
divided by N); after the last round of each repetition set each callable's output is verified
(a kernel may behave while checked and cheat while timed). Median, p10, p90 and the count.

The scheduling core (`run_schedule`) talks to a `TimerBackend`, so it is unit-tested on CPU with
a fake clock; `CudaBackend` is the real one.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from .types import MODES, TIMERS


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


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an already sorted list."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


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


class CudaBackend:
    """TimerBackend on torch's current CUDA stream (needs a GPU)."""

    def __init__(self, stream=None, l2_bytes: int | None = None):
        import torch

        self.torch = torch
        self.stream = stream or torch.cuda.current_stream()
        if l2_bytes is None:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2_bytes = getattr(props, "L2_cache_size", 0) or 64 * 2**20
        self._flush_buf = None
        self._l2_bytes = int(l2_bytes)

    def now(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def flush_l2(self) -> None:
        if self._flush_buf is None:   # 2x L2, so nothing of the previous call stays resident
            self._flush_buf = self.torch.empty(2 * self._l2_bytes // 4, dtype=self.torch.int32,
                                               device="cuda")
        self._flush_buf.zero_()

    def start(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return ev

    def stop(self, token):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return (token, ev)

    def elapsed_us(self, handle) -> float:
        start, end = handle
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    def capture(self, fn: Callable[[], None], calls: int) -> Callable[[], None]:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(self.stream)
        with torch.cuda.stream(side):     # one eager call first: lazy init must not be captured
            fn()
        self.stream.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                fn()
        self.stream.wait_stream(side)

        def replay():
            with torch.cuda.stream(self.stream):
                graph.replay()
        return replay


def time_interleaved(callables: dict[str, Callable[[int], None]], config: TimingConfig, *,
                     n_buffers: int = 1, verify=None, prepare_set=None,
                     backend: TimerBackend | None = None) -> TimingResult:
    """The public entry: run_schedule on the CUDA backend unless one is given."""
    return run_schedule(callables, config, backend or CudaBackend(), n_buffers=n_buffers,
                        verify=verify, prepare_set=prepare_set)


def gpu_env() -> dict:
    """SM clock (MHz), temperature (C), GPU name and driver right now (NVML, else nvidia-smi;
    keys absent when the GPU does not report them). Recorded before and after timing."""
    from .provenance import gpu_facts

    return gpu_facts()
