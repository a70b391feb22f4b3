"""Kernel time: GPU time per call with the host out of the bracket (the figure for ranking,
export and reward).

One sample of a callable:

    spin (a GPU busy-wait long enough for the host to queue everything below)
    [one untimed call on the previous operand set: finals' `precall`]
    start event
    N back-to-back calls, each on the next operand set (sets whose total exceeds 3x L2: cold)
    stop event

and its time is (stop - start) / N. The spin keeps the host's launch path out of the bracket:
while the GPU spins, the host enqueues the N calls, so the GPU runs them back to back. If the
start event has already completed when the host has queued the stop event, the GPU may have
waited for the host inside the bracket: the sample is "starved", its spin doubles and it is taken
again. N is sized so one sample holds about `sample_us` of GPU work; every callable of a shape
uses the same N and the same operand sets (nvbench's blocking kernel, ThunderKittens' rotated
buffers).

Rounds interleave all callables in a fresh random order; a round is discarded as throttled when
an SM clock read during it fell more than 3% below the run's median clock, or when the GPU
reported a slowdown other than its steady power cap (SEVERE_THROTTLE); each round's SM clock,
power draw and throttle reasons are kept in the session; speedups are medians of paired
per-round ratios with bootstrap intervals (cudal2.timing.stats), and sampling stops when every
interval's half-width is within `target` of its median, or at the round/time budget.

Cold operands come one of two ways, chosen per shape by `cold_plan` (the cheaper on the GPU
that keeps every timed call's A and B out of L2): "rotate", the N calls of a sample cycle
through operand sets whose total exceeds 3x L2; or "flush", an L2 flush (a write over 2x L2)
before each sample's spin, outside the bracket, and N + 1 distinct sets, so each timed call reads
operands no call has touched since the flush.

The offline session of a gated finals group (`stop_below`: the export bar, 1 + margin) also
stops once no candidate can reach the bar: every candidate's speedup interval against some
baseline lies wholly below it (STOPPED_BELOW_BAR).

`time_after_gaps` is server mode: single calls after fixed idle gaps (L2 flushed), timed the same
way (a short spin ahead of the start event), so the host path stays out of the number.

The scheduling core talks to a `KernelBackend`; tests drive it with a fake clock, `CudaKernelBackend`
is the real one (torch's current stream).
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from cudal2.timing import stats as S

# Operand sets: their total footprint (A + B of one layout) exceeds this many L2 sizes (cold).
COLD_L2_MULTIPLE = 3
MAX_SPIN_US = 50_000.0
COLD_METHODS = ("rotate", "flush")
# The cold-operand rule (cold_plan). A flush writes FLUSH_L2_MULTIPLE x L2 (CudaKernelBackend.
# flush_l2) once per sample; filling the rotated sets moves about ROTATE_FILL_BYTES_PER_BYTE GPU
# bytes per operand byte (fp32 normal draws written and read back, fp16 written; B's column-major
# copy read and written). The flush is chosen when a session's flushes, at its fewest samples
# (every callable x min_rounds), move fewer bytes than filling the rotated sets: the threshold is
# the break-even sample count rotate_bytes / flush_bytes_per_sample.
FLUSH_L2_MULTIPLE = 2
ROTATE_FILL_BYTES_PER_BYTE = 3
STOPPED_BELOW_BAR = "no finalist can reach the export bar"


@dataclass(frozen=True)
class KernelTimeConfig:
    sample_us: float = 500.0       # GPU work per sample
    max_calls: int = 200           # calls per sample, at most (the launch queue holds ~1000)
    warmup_ms: float = 10.0        # per callable, untimed, after calibration
    min_rounds: int = 6
    max_rounds: int = 60
    budget_s: float = 4.0          # host seconds for the timed rounds of one session
    target: float = 0.005          # stop when every interval's half-width <= target * median
    confidence: float = S.CONFIDENCE
    clock_tolerance: float = S.CLOCK_TOLERANCE
    operands: str = "cold"         # cold (sets > 3x L2) | hot (one set): recorded, the caller sizes sets
    verify_every: int = 1          # check timed outputs every k rounds (and the last)
    early_stop: float | None = None  # screening: stop once a candidate's median is this factor
    #                                  above `reference_us` after min_rounds (clearly slower)
    precall: bool = False          # one untimed call after the spin, before the start event
    cold: str = "rotate"           # COLD_METHODS: rotate the sets, or flush L2 before each sample
    #                                (then n_sets must exceed the calls per sample: cold_plan)
    stop_below: float | None = None  # finals with a gate: stop once every candidate's speedup
    #                                  interval vs some baseline lies below this bar (pairs)
    seed: int = 0

    def __post_init__(self):
        if self.operands not in ("cold", "hot"):
            raise ValueError(f"operands must be 'cold' or 'hot', got {self.operands!r}")
        if self.cold not in COLD_METHODS:
            raise ValueError(f"KernelTimeConfig.cold must be one of {COLD_METHODS}, got {self.cold!r}")
        if self.stop_below is not None and not self.stop_below > 0:
            raise ValueError(f"KernelTimeConfig.stop_below must be > 0 or None, got {self.stop_below!r}")
        for name in ("max_calls", "min_rounds", "max_rounds", "verify_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"KernelTimeConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_rounds < self.min_rounds:
            raise ValueError("KernelTimeConfig.max_rounds must be >= min_rounds")
        if not (self.sample_us > 0 and self.target > 0 and self.budget_s > 0):
            raise ValueError("KernelTimeConfig.sample_us, target and budget_s must be > 0")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# Screening: a few rounds, loose target, stop early when clearly slower than the best so far.
SCREEN_CONFIG = KernelTimeConfig(sample_us=200.0, warmup_ms=2.0, min_rounds=3, max_rounds=8,
                                 budget_s=0.5, target=0.02, early_stop=1.15)
# Finals: every timed call follows a call of the same kind (one untimed call after the spin),
# so no timed call is the first after the GPU sat in the one-thread spin.
# 200 us of GPU work per sample: the host's enqueue time, not the GPU's, bounds a tiny kernel's
# sample (N x ~30 us of torch's launch path on the H100 machine), and 0.2 ms is still 400x the
# events' resolution.
FINAL_CONFIG = KernelTimeConfig(precall=True, sample_us=200.0, max_calls=64)


def n_operand_sets(bytes_per_set: int, l2_bytes: int, operands: str = "cold",
                   max_bytes: int = 8 << 30) -> int:
    """How many operand sets a session rotates through: enough that their total exceeds
    COLD_L2_MULTIPLE x L2 (and at least 2), bounded by `max_bytes`; one set for hot operands."""
    if operands == "hot":
        return 1
    want = max(2, math.ceil(COLD_L2_MULTIPLE * l2_bytes / max(bytes_per_set, 1)))
    return max(2, min(want, max_bytes // max(bytes_per_set, 1)))


@dataclass(frozen=True)
class ColdPlan:
    """How a session keeps operands cold (cold_plan): the method, the operand sets to allocate,
    and the estimate it was chosen by (GPU bytes moved)."""
    method: str                    # "rotate" | "flush" | "hot" (one set, L2-resident on purpose)
    n_sets: int
    rotate_sets: int               # what rotation needs: total > COLD_L2_MULTIPLE x L2
    rotate_bytes: float            # filling those sets
    flush_bytes: float             # the flushes over the session's fewest samples, plus the fill
    samples: int                   # of N + 1 sets

    def to_dict(self) -> dict:
        return {"method": self.method, "operand_sets": self.n_sets, "rotate_sets": self.rotate_sets,
                "est_rotate_bytes": self.rotate_bytes, "est_flush_bytes": self.flush_bytes,
                "est_samples": self.samples}


def cold_plan(bytes_per_set: int, l2_bytes: int, operands: str = "cold", *, samples: int,
              max_calls: int, fill_bytes_per_set: int | None = None,
              max_bytes: int = 8 << 30) -> ColdPlan:
    """THE cold-operand rule, one per shape for every callable (candidates and baselines alike).
    bytes_per_set: what one call reads (A and one B layout); fill_bytes_per_set: what one set
    allocates (default the same); samples: the fewest samples the session takes (callables x
    min_rounds); max_calls: the most calls one sample makes. Rotation costs filling
    `n_operand_sets` sets once; the flush costs FLUSH_L2_MULTIPLE x L2 per sample plus filling
    max_calls + 1 sets. The cheaper wins (ties: rotate, the method every earlier row used)."""
    fill = fill_bytes_per_set or bytes_per_set
    if operands == "hot":
        return ColdPlan("hot", 1, 1, float(fill), float(fill), samples)
    rot = n_operand_sets(bytes_per_set, l2_bytes, operands, max_bytes)
    flush_sets = max_calls + 1
    rotate_bytes = float(rot) * fill * ROTATE_FILL_BYTES_PER_BYTE
    flush_bytes = (float(samples) * FLUSH_L2_MULTIPLE * l2_bytes
                   + float(flush_sets) * fill * ROTATE_FILL_BYTES_PER_BYTE)
    if rot > flush_sets and flush_bytes < rotate_bytes:
        return ColdPlan("flush", flush_sets, rot, rotate_bytes, flush_bytes, samples)
    return ColdPlan("rotate", rot, rot, rotate_bytes, flush_bytes, samples)


class KernelBackend(Protocol):
    """What the kernel timer needs from a device; tests implement it with a fake clock."""
    def now(self) -> float: ...                         # host seconds
    def synchronize(self) -> None: ...
    def sleep(self, seconds: float) -> None: ...
    def flush_l2(self) -> None: ...
    def spin(self, us: float) -> None: ...              # enqueue a GPU busy-wait of ~us
    def record(self) -> object: ...                     # an event on the stream
    def done(self, event) -> bool: ...                  # has the GPU passed this event?
    def elapsed_us(self, start, stop) -> float: ...     # resolve two events (may synchronise)
    def sm_clock_mhz(self) -> float | None: ...         # live SM clock, None if unknown
    # optional: power_state() -> {"power_w": float | None, "throttle": [reason, ...]} or None


# NVML's clocks-event reasons by bit, in the names a session records
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake", 0x100: "display_clocks"}
# a round that saw one of these is discarded: the GPU slowed down for heat or an external
# signal. sw_power_cap is not among them: a large GEMM runs at its power cap every round
# (paired ratios cancel a steady cap; the clock rule catches a deep dip)
SEVERE_THROTTLE = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass
class Calibration:
    """Per callable: GPU time per call and host enqueue time per call (µs), from a probe."""
    gpu_us: dict[str, float]
    host_us: dict[str, float]
    calls: int                                          # N, shared by every callable
    spin_us: dict[str, float]


@dataclass
class KernelTimes:
    """A timed session: per-call µs of each callable in each round (None: not measured)."""
    names: list[str]
    per_round: dict[str, list[float | None]]
    clocks: list[float | None]                          # lowest SM clock read in each round
    calls_per_sample: int
    spin_us: dict[str, float]
    config: KernelTimeConfig
    n_sets: int = 1
    starved: int = 0                                    # samples retaken: the GPU caught up
    stopped: str = ""                                   # tight | budget | max_rounds | early_stop
    #                                                     | failed | STOPPED_BELOW_BAR
    below_bar: dict = field(default_factory=dict)       # candidate -> (baseline, hi) when stopped below the bar
    failures: list[str] = field(default_factory=list)   # "who@round r: why"
    seconds: float = 0.0
    power: list = field(default_factory=list)           # per round: {power_w, throttle} or None

    @property
    def rounds(self) -> int:
        return len(self.clocks)

    def kept(self) -> list[bool]:
        by_clock = S.kept_rounds(self.clocks, self.config.clock_tolerance)
        return [k and not self.throttled(r) for r, k in enumerate(by_clock)]

    def throttled(self, r: int) -> bool:
        """Did the GPU report a severe slowdown (SEVERE_THROTTLE) during round r?"""
        p = self.power[r] if r < len(self.power) else None
        return bool(p and set(p.get("throttle") or ()) & set(SEVERE_THROTTLE))

    def _kept_values(self, name: str) -> list[float | None]:
        return [v if k else None for v, k in zip(self.per_round[name], self.kept())]

    def time(self, name: str) -> S.Interval:
        xs = [v for v in self._kept_values(name) if v is not None]
        if not xs:
            xs = [v for v in self.per_round[name] if v is not None]   # every round throttled
        return S.interval(xs, confidence=self.config.confidence, seed=self.config.seed)

    def ratio(self, numer: str, denom: str) -> S.Interval:
        """Median over kept rounds of numer_time / denom_time (a speedup when numer is a
        baseline and denom the candidate), with its bootstrap interval."""
        xs = S.paired_ratios(self._kept_values(numer), self._kept_values(denom))
        if not xs:
            xs = S.paired_ratios(self.per_round[numer], self.per_round[denom])
        return S.interval(xs, confidence=self.config.confidence, seed=self.config.seed)

    def ratio_of_best(self, numers: Sequence[str], denom: str) -> S.Interval:
        """Per round, the fastest of `numers` over `denom` (cuBLAS NN/TN's better one: CUDA-L2's
        "max" column)."""
        kept = self.kept()
        xs = []
        for r in range(self.rounds):
            vals = [self.per_round[n][r] for n in numers if self.per_round[n][r] is not None]
            d = self.per_round[denom][r]
            if vals and d and kept[r]:
                xs.append(min(vals) / d)
        return S.interval(xs, confidence=self.config.confidence, seed=self.config.seed)

    def stats_dict(self, name: str) -> dict:
        """The timings[mode][who] entry: median, interval, quantiles, n, mean, min (µs)."""
        xs = sorted(v for v in self._kept_values(name) if v is not None) or sorted(
            v for v in self.per_round[name] if v is not None)
        iv = self.time(name)
        return {"median_us": iv.median, "lo_us": iv.lo, "hi_us": iv.hi,
                "p10_us": S.quantile(xs, 0.1), "p90_us": S.quantile(xs, 0.9), "n": len(xs),
                "mean_us": sum(xs) / len(xs), "min_us": xs[0]}

    def session_dict(self) -> dict:
        kept = self.kept()
        clocks = [c for c in self.clocks if c]
        watts = [p["power_w"] for p in self.power if p and p.get("power_w")]
        return {"rounds": self.rounds, "kept": sum(kept), "discarded_throttled": len(kept) - sum(kept),
                "calls_per_sample": self.calls_per_sample, "operand_sets": self.n_sets,
                "spin_us": {k: round(v, 1) for k, v in self.spin_us.items()},
                "starved_retakes": self.starved, "stopped": self.stopped,
                "cold": self.config.cold if self.config.operands == "cold" else "hot",
                **({"below_bar": {c: {"baseline": b, "hi": hi, "bar": self.config.stop_below}
                                  for c, (b, hi) in self.below_bar.items()}}
                   if self.below_bar else {}),
                "seconds": round(self.seconds, 3),
                "sm_clock_mhz": {"median": S.median(clocks), "min": min(clocks),
                                 "max": max(clocks)} if clocks else None,
                "power_w": {"median": S.median(watts), "min": min(watts),
                            "max": max(watts)} if watts else None,
                "per_round": {"sm_clock_mhz": list(self.clocks),
                              "power_w": [(p or {}).get("power_w") for p in self.power],
                              "throttle": [(p or {}).get("throttle") or [] for p in self.power],
                              "kept": kept},
                "config": self.config.to_dict()}


def calibrate(callables: dict[str, Callable[[int], None]], config: KernelTimeConfig,
              backend: KernelBackend, *, n_sets: int, probe_calls: int = 3) -> Calibration:
    """Probe each callable (a spin, then `probe_calls` calls): GPU µs per call from events, host
    µs per call from the host clock; then N for `sample_us` of work and each callable's spin,
    long enough that the GPU never catches up with the host: spin >= N * (host - gpu) per call."""
    gpu, host = {}, {}
    for fn in callables.values():      # first calls (lazy loads, handles) stay out of the probe
        fn(0)
    backend.synchronize()
    for name, fn in callables.items():
        backend.spin(200.0 + 100.0 * probe_calls)
        s = backend.record()
        h0 = backend.now()
        for i in range(probe_calls):
            fn(i % n_sets)
        h1 = backend.now()
        e = backend.record()
        gpu[name] = max(backend.elapsed_us(s, e) / probe_calls, 1e-3)
        host[name] = max((h1 - h0) * 1e6 / probe_calls, 1e-3)
    typical = S.median(list(gpu.values()))
    calls = int(min(config.max_calls, max(1, round(config.sample_us / typical))))
    spin = {n: min(MAX_SPIN_US, 1.5 * max(host[n], calls * (host[n] - gpu[n])) + 20.0)
            for n in callables}
    return Calibration(gpu, host, calls, spin)


def _warmup(callables, backend: KernelBackend, cal: Calibration, config: KernelTimeConfig,
            n_sets: int, rng: random.Random) -> None:
    """Untimed interleaved rounds until every callable had warmup_ms of GPU time (clocks,
    caches, lazy module loads)."""
    names = list(callables)
    per_round_us = sum(cal.gpu_us[n] * cal.calls for n in names)
    rounds = max(1, math.ceil(config.warmup_ms * 1e3 * len(names) / max(per_round_us, 1e-3)))
    i = 0
    for _ in range(min(rounds, 50)):
        rng.shuffle(names)
        for n in names:
            for _ in range(cal.calls):
                callables[n](i % n_sets)
                i += 1
        backend.synchronize()


def time_kernels(callables: dict[str, Callable[[int], None]], config: KernelTimeConfig,
                 backend: KernelBackend, *, n_sets: int = 1,
                 pairs: Sequence[tuple[str, str]] = (),
                 verify: Callable[[str, int], str | None] | None = None,
                 prepare: Callable[[str], None] | None = None,
                 reference_us: float | None = None,
                 calibration: Calibration | None = None) -> KernelTimes:
    """Time every callable by kernel time, interleaved, until the stopping rule holds.

    callables[name](i) enqueues one call on operand set i (0 <= i < n_sets). pairs: (numer,
    denom) ratios whose intervals the stopping rule watches (baseline, candidate); without pairs
    each callable's own time interval is watched. verify(name, i) checks name's output after its
    last call, made on set i (None or a reason). prepare(name) runs before each of name's
    samples, outside the bracket (e.g. NaN into its output). reference_us + config.early_stop:
    a single candidate stops once clearly slower than the reference (screening)."""
    if not callables:
        raise ValueError("nothing to time")
    for a, b in pairs:
        if a not in callables or b not in callables:
            raise ValueError(f"pair ({a}, {b}) names a callable not being timed")
    names = sorted(callables)
    rng = random.Random(config.seed)
    t_start = backend.now()
    cal = calibration or calibrate(callables, config, backend, n_sets=n_sets)
    _warmup(callables, backend, cal, config, n_sets, rng)
    spin = dict(cal.spin_us)
    flush = config.cold == "flush" and config.operands == "cold"
    # with a flush, every timed call of a sample needs its own set, and the pre-call (on the set
    # before the first) one more: N + 1 distinct sets, so at most n_sets - 1 calls
    N = min(cal.calls, n_sets - 1) if flush else cal.calls
    if N < 1:
        raise ValueError(f"cold='flush' needs more operand sets than calls per sample (n_sets={n_sets})")
    bar_pairs: dict[str, list[str]] = {}
    if config.stop_below is not None:
        for b, c in pairs:
            bar_pairs.setdefault(c, []).append(b)
    out = KernelTimes(names, {n: [] for n in names}, [], N, spin, config, n_sets=n_sets)
    power_state = getattr(backend, "power_state", None)
    offset = 0
    t0 = backend.now()
    while True:
        order = list(names)
        rng.shuffle(order)
        round_clock: float | None = None
        pending = []
        for name in order:
            fn = callables[name]
            for attempt in range(4):
                if prepare is not None:
                    prepare(name)
                if flush:                     # before the spin: outside the bracket
                    backend.flush_l2()
                backend.spin(spin[name])
                if config.precall:            # warms what a first call pays (not its operands)
                    fn((offset - 1) % n_sets)
                s = backend.record()
                for i in range(N):
                    fn((offset + i) % n_sets)
                e = backend.record()
                starved = backend.done(s)
                clock = backend.sm_clock_mhz()
                if not starved or attempt == 3:
                    break
                # the GPU reached the start event before the host finished queueing: retake,
                # on the next sets (the failed attempt just pulled these into L2)
                out.starved += 1
                backend.synchronize()
                spin[name] = min(MAX_SPIN_US, 2 * spin[name])
                offset = (offset + N) % n_sets
            last_set = (offset + N - 1) % n_sets
            offset = (offset + N) % n_sets
            if clock:
                round_clock = clock if round_clock is None else min(round_clock, clock)
            pending.append((name, s, e, last_set))
        # power and throttle reasons once a round, read while its last sample still runs
        out.power.append(power_state() if power_state is not None else None)
        backend.synchronize()
        r = out.rounds
        for name, s, e, last_set in pending:
            out.per_round[name].append(backend.elapsed_us(s, e) / N)
        out.clocks.append(round_clock)
        if verify is not None and (r % config.verify_every == 0):
            for name, _, _, last_set in pending:
                why = verify(name, last_set)
                if why:
                    out.failures.append(f"{name}@round {r}: {why}")
        rounds = out.rounds
        if out.failures:
            out.stopped = "failed"
            break
        if rounds >= config.min_rounds:
            if reference_us is not None and config.early_stop and len(names) == 1:
                if out.time(names[0]).lo > config.early_stop * reference_us:
                    out.stopped = "early_stop"
                    break
            ivs = [out.ratio(a, b) for a, b in pairs] if pairs else [out.time(n) for n in names]
            if S.tight(ivs, config.target):
                out.stopped = "tight"
                break
            if bar_pairs:
                below = _below_bar(out, bar_pairs, config.stop_below)
                if below is not None:
                    out.stopped, out.below_bar = STOPPED_BELOW_BAR, below
                    break
            if backend.now() - t0 > config.budget_s:
                out.stopped = "budget"
                break
        if rounds >= config.max_rounds:
            out.stopped = "max_rounds"
            break
    if verify is not None and (out.rounds - 1) % config.verify_every and not out.failures:
        for name, _, _, last_set in pending:           # the last round is always checked
            why = verify(name, last_set)
            if why:
                out.failures.append(f"{name}@round {out.rounds - 1}: {why}")
    out.seconds = backend.now() - t_start
    return out


def _below_bar(kt: KernelTimes, bar_pairs: dict[str, list[str]], bar: float) -> dict | None:
    """{candidate: (baseline, interval's upper end)} when EVERY candidate has a baseline whose
    speedup interval (the same bootstrap interval, the same confidence, as the export rule's)
    lies wholly below `bar`: none can clear the bar against every baseline. Else None."""
    out = {}
    for c, bases in bar_pairs.items():
        his = {b: kt.ratio(b, c).hi for b in bases}
        worst = min(his, key=his.get)
        if not his[worst] < bar:
            return None
        out[c] = (worst, his[worst])
    return out


@dataclass(frozen=True)
class ServerConfig:
    """Server mode: single calls after idle gaps of fixed lengths, L2 flushed before each."""
    gaps_ms: tuple[float, ...] = (1.0, 10.0)
    min_rounds: int = 5
    max_rounds: int = 20
    budget_s: float = 0.6          # per gap
    target: float = 0.02
    confidence: float = S.CONFIDENCE
    clock_tolerance: float = 1.0   # idle gaps lower the clock by design: nothing is discarded
    flush_l2: bool = True
    seed: int = 0

    def __post_init__(self):
        if not self.gaps_ms or any(not g >= 0 for g in self.gaps_ms):
            raise ValueError(f"ServerConfig.gaps_ms must be non-negative, got {self.gaps_ms!r}")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def as_kernel_config(self) -> KernelTimeConfig:
        return KernelTimeConfig(min_rounds=self.min_rounds, max_rounds=self.max_rounds,
                                budget_s=self.budget_s, target=self.target,
                                confidence=self.confidence, clock_tolerance=self.clock_tolerance,
                                seed=self.seed)


def gap_key(gap_ms: float) -> str:
    """The timings key of one server gap: 'server_1ms', 'server_10ms', 'server_0.5ms'."""
    return f"server_{gap_ms:g}ms"


def time_after_gaps(callables: dict[str, Callable[[int], None]], config: ServerConfig,
                    backend: KernelBackend, *, calibration: Calibration, n_sets: int = 1,
                    pairs: Sequence[tuple[str, str]] = (),
                    verify: Callable[[str, int], str | None] | None = None) -> dict[str, KernelTimes]:
    """For each gap: rounds of (sync, idle `gap`, L2 flush, short spin, start, ONE call, stop)
    per callable in random order. Returns {gap_key: KernelTimes}."""
    names = sorted(callables)
    rng = random.Random(config.seed)
    kcfg = config.as_kernel_config()
    spin1 = {n: min(MAX_SPIN_US, 1.5 * calibration.host_us[n] + 20.0) for n in names}
    out: dict[str, KernelTimes] = {}
    i = 0
    for gap in config.gaps_ms:
        res = KernelTimes(names, {n: [] for n in names}, [], 1, spin1, kcfg, n_sets=n_sets)
        t0 = backend.now()
        while True:
            order = list(names)
            rng.shuffle(order)
            clock = None
            row = {}
            for name in order:
                backend.synchronize()
                backend.sleep(gap / 1e3)
                if config.flush_l2:
                    backend.flush_l2()
                backend.spin(spin1[name])
                s = backend.record()
                callables[name](i % n_sets)
                e = backend.record()
                c = backend.sm_clock_mhz()
                backend.synchronize()
                row[name] = (backend.elapsed_us(s, e), i % n_sets)
                i += 1
                if c:
                    clock = c if clock is None else min(clock, c)
            for name in names:
                res.per_round[name].append(row[name][0])
            res.clocks.append(clock)
            if verify is not None:
                for name in names:
                    why = verify(name, row[name][1])
                    if why:
                        res.failures.append(f"{name}@{gap_key(gap)} round {res.rounds - 1}: {why}")
            if res.failures:
                res.stopped = "failed"
                break
            if res.rounds >= kcfg.min_rounds:
                ivs = [res.ratio(a, b) for a, b in pairs] if pairs else [res.time(n) for n in names]
                if S.tight(ivs, kcfg.target):
                    res.stopped = "tight"
                    break
                if backend.now() - t0 > kcfg.budget_s:
                    res.stopped = "budget"
                    break
            if res.rounds >= kcfg.max_rounds:
                res.stopped = "max_rounds"
                break
        res.seconds = backend.now() - t0
        out[gap_key(gap)] = res
        if res.failures:
            break
    return out


class CudaKernelBackend:
    """KernelBackend on torch's current CUDA stream: torch.cuda._sleep for the spin, CUDA events,
    NVML for the SM clock (absent NVML: no clock, nothing discarded)."""

    def __init__(self, stream=None, l2_bytes: int | None = None):
        import torch

        self.torch = torch
        self.stream = stream or torch.cuda.current_stream()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = int(l2_bytes or getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self._flush_buf = None
        self._nvml = _nvml_handle()
        clk = self.sm_clock_mhz() or 0.0
        self._cycles_per_us = max(clk, 2000.0)     # over-estimate: a longer spin is harmless

    def now(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def flush_l2(self) -> None:
        if self._flush_buf is None:   # 2x L2, so nothing of the previous call stays resident
            self._flush_buf = self.torch.empty(2 * self.l2_bytes // 4, dtype=self.torch.int32,
                                               device="cuda")
        self._flush_buf.zero_()

    def spin(self, us: float) -> None:
        with self.torch.cuda.stream(self.stream):
            self.torch.cuda._sleep(int(us * self._cycles_per_us))

    def record(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return ev

    def done(self, event) -> bool:
        return bool(event.query())

    def elapsed_us(self, start, stop) -> float:
        stop.synchronize()
        return start.elapsed_time(stop) * 1e3

    def sm_clock_mhz(self) -> float | None:
        if self._nvml is None:
            return None
        try:
            import pynvml
            return float(pynvml.nvmlDeviceGetClockInfo(self._nvml, pynvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - not reported: no clock filtering
            return None

    def power_state(self) -> dict | None:
        """Power draw (W) and the clocks-event (throttle) reasons now, from NVML; None
        without NVML (nothing recorded, nothing discarded for it)."""
        if self._nvml is None:
            try:          # torch's own reading (it needs NVML or amdsmi underneath)
                return {"power_w": self.torch.cuda.power_draw() / 1000.0, "throttle": []}
            except Exception:  # noqa: BLE001 - no power reading here
                return None
        import pynvml
        out: dict = {"power_w": None, "throttle": []}
        try:
            out["power_w"] = pynvml.nvmlDeviceGetPowerUsage(self._nvml) / 1000.0
        except Exception:  # noqa: BLE001 - a GPU that does not report power
            pass
        read = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        try:
            out["throttle"] = throttle_names(int(read(self._nvml))) if read else []
        except Exception:  # noqa: BLE001 - not supported: no reasons
            pass
        return out


def visible_gpu_index() -> int:
    """Physical index of the first GPU this process may use (CUDA_VISIBLE_DEVICES)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    try:
        return int(first)
    except ValueError:      # UUID form: NVML/nvidia-smi index 0 is the best guess we have
        return 0


def _nvml_handle():
    """An NVML handle for the GPU torch uses (by PCI bus id), or None."""
    try:
        import pynvml
        import torch
        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = getattr(props, "pci_bus_id", None)
        dom = getattr(props, "pci_domain_id", 0) or 0
        dev = getattr(props, "pci_device_id", 0) or 0
        if bus is not None:
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0".encode())
        return pynvml.nvmlDeviceGetHandleByIndex(visible_gpu_index())
    except Exception:  # noqa: BLE001 - no NVML, or no match: clocks unknown
        return None
