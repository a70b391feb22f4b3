"""Plain data passed between the harness stages (docs/internals.md, "Harness").

Frozen dataclasses for requests and keys; `Evaluation` is one results-DB row and round-trips
through `to_dict()` / `from_dict()` (JSON-safe) so it can cross the worker pipe and the DB.
Fields are only ever added here, never renamed: the DB and helper modules code against them.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from cudal2.core.vocab import ACCS, LAYOUTS, normalise_options  # noqa: F401 - the shared vocabulary

# Baselines every candidate is timed against (docs/measurement.md).
BASELINES = ("torch", "cublas_nn", "cublas_tn", "cublaslt_heuristic", "cublaslt_autotuned")
# PyTorch's own switches, timed when asked for (cudal2.harness.baselines describes them).
EXTRA_BASELINES = ("torch_cublas", "torch_cublaslt", "torch_tunableop")
# What to measure (docs/measurement.md): kernel time back to back (offline), single calls after
# fixed idle gaps (server), the end-to-end call as users make it (e2e), CUDA-L2's host clock (wall).
MODES = ("offline", "server", "e2e", "wall")
# GPU timers for kernel time: spin + N back-to-back calls on cold operands between two events.
TIMERS = ("kernel",)
OPERANDS = ("cold", "hot")
DEFAULT_SERVER_GAPS_MS = (1.0, 10.0)
STAGES = ("final", "screen")

# Evaluation.status values.
OK = "ok"
BUILD_ERROR = "build_error"
AUDIT_REJECTED = "audit_rejected"
WRONG = "wrong"
CRASHED = "crashed"
TIMEOUT = "timeout"
TOO_FAST = "too_fast"            # faster than the physical lower bound: a verdict, never a win
NOT_MEASURED = "not_measured"    # no GPU: built and audited only, no number invented
OOM = "oom"                      # the worker went over its host-memory limit
ERROR = "error"                  # the harness itself failed (reason in `detail`)
REFUSED = "refused"              # the kernel does not serve the requested shape (its meta, which
                                 # the audit checks against its guard, or the guard at launch)
STATUSES = (OK, BUILD_ERROR, AUDIT_REJECTED, WRONG, CRASHED, TIMEOUT, TOO_FAST, NOT_MEASURED,
            OOM, REFUSED, ERROR)
# Statuses that say something about the kernel (cacheable); ERROR is the harness's fault.
FINAL_STATUSES = tuple(s for s in STATUSES if s != ERROR)


@dataclass(frozen=True, order=True)
class Shape:
    M: int
    N: int
    K: int

    def __post_init__(self):
        for name in ("M", "N", "K"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"Shape.{name} must be a positive int, got {v!r}")

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def __str__(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    @classmethod
    def parse(cls, text: str) -> "Shape":
        """'4096x4096x512' or '4096,4096,512' -> Shape."""
        parts = text.replace(",", "x").lower().split("x")
        if len(parts) != 3:
            raise ValueError(f"shape {text!r} is not MxNxK")
        try:
            return cls(*(int(p) for p in parts))
        except ValueError as e:
            raise ValueError(f"shape {text!r}: {e}") from None


@dataclass(frozen=True)
class EvalRequest:
    source: str
    shape: Shape
    arch: str = "sm_90a"
    acc: str | None = None                 # default: the kernel's declared meta acc
    modes: tuple[str, ...] = ("offline",)
    baselines: tuple[str, ...] = BASELINES
    seeds: int = 3
    timeout_s: float = 60                  # measurement (worker) wall time
    build_timeout_s: float = 300           # nvcc wall time: a compile bomb costs this once, then the DB row
    origin: str = ""                       # "rl", "tune", "bench", ...
    mem_limit_bytes: int | None = None     # host RSS limit for the worker; None = harness default
    timer: str = "kernel"                  # TIMERS
    operands: str = "cold"                 # cold: operand sets > 3x L2 rotate; hot: one set
    server_gaps_ms: tuple[float, ...] = DEFAULT_SERVER_GAPS_MS   # server mode's idle gaps
    extra_baselines: tuple[str, ...] = ()  # EXTRA_BASELINES timed besides `baselines`
    options: tuple[tuple[str, int], ...] = ()   # ABI 2 runtime options (a dict is accepted)
    # server mode and the end-to-end call only for a candidate whose kernel-time speedup interval
    # clears 1 + gate_margin against every baseline (the export rule's bar); None: for every one
    gate_margin: float | None = None

    def __post_init__(self):
        if not isinstance(self.source, str):
            raise TypeError("EvalRequest.source must be the .cu text (str)")
        try:
            self.source.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"EvalRequest.source is not valid UTF-8 text ({e.reason} at "
                             f"character {e.start})") from None
        if not isinstance(self.shape, Shape):
            raise TypeError(f"EvalRequest.shape must be a Shape, got {type(self.shape).__name__}")
        if self.acc is not None and self.acc not in ACCS:
            raise ValueError(f"EvalRequest.acc must be one of {ACCS} or None, got {self.acc!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown timing mode(s) {bad}; known: {MODES}")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad:
            raise ValueError(f"unknown baseline(s) {bad}; known: {BASELINES}")
        bad = [b for b in self.extra_baselines if b not in EXTRA_BASELINES]
        if bad:
            raise ValueError(f"unknown extra baseline(s) {bad}; known: {EXTRA_BASELINES}")
        if self.timer not in TIMERS:
            raise ValueError(f"EvalRequest.timer must be one of {TIMERS}, got {self.timer!r}")
        if self.operands not in OPERANDS:
            raise ValueError(f"EvalRequest.operands must be one of {OPERANDS}, got {self.operands!r}")
        gaps = tuple(float(g) for g in self.server_gaps_ms)
        if not gaps or any(not g >= 0 for g in gaps):
            raise ValueError(f"EvalRequest.server_gaps_ms must be non-negative ms, got {self.server_gaps_ms!r}")
        object.__setattr__(self, "server_gaps_ms", gaps)
        object.__setattr__(self, "options", normalise_options(self.options))
        if self.seeds < 1:
            raise ValueError(f"EvalRequest.seeds must be >= 1, got {self.seeds!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"EvalRequest.timeout_s must be > 0, got {self.timeout_s!r}")
        if not self.build_timeout_s > 0:
            raise ValueError(f"EvalRequest.build_timeout_s must be > 0, got {self.build_timeout_s!r}")
        if self.gate_margin is not None and not self.gate_margin >= 0:
            raise ValueError(f"EvalRequest.gate_margin must be >= 0 or None, got {self.gate_margin!r}")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Evaluation:
    """One results-DB row. Dicts hold JSON-safe values only."""
    status: str
    source_sha: str
    shape: Shape
    arch: str
    acc: str = ""                 # declared (meta) or requested accumulator; "" when unknown
    layout: str = ""              # "RR" | "RC"; "" when unknown (never loaded)
    # build: status, seconds, registers, shared_bytes, spills, log_tail, key, cached
    build: dict[str, Any] = field(default_factory=dict)
    # audit: ok, reasons (list[str]), imports (list[str]), needed (list[str])
    audit: dict[str, Any] = field(default_factory=dict)
    # correctness: ok, max_abs_err, max_rel_err, checks (dict[name, {ok, detail}])
    correctness: dict[str, Any] = field(default_factory=dict)
    # timings[mode_key][who] = {"median_us", "lo_us", "hi_us", "p10_us", "p90_us", "n", ...};
    # who = "candidate" or a baseline; mode keys: offline, server_<gap>ms, e2e_<kind>, wall, screen
    timings: dict[str, dict[str, dict]] = field(default_factory=dict)
    # speedups[mode_key][baseline] = median over rounds of baseline time / candidate time
    speedups: dict[str, dict[str, float]] = field(default_factory=dict)
    estimated: bool = False       # True when a number came from a model, not a measurement
    # env: gpu, driver, sm_clock_mhz, temp_c, torch, nvcc, git_commit, hostname
    env: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=_now)
    origin: str = ""
    detail: str = ""              # one line: why this status (crash signal, reject reason, ...)
    meta: dict[str, Any] = field(default_factory=dict)   # the kernel's cudal2_meta, if read
    id: int | None = None         # DB row id once stored
    # the runtime options the kernel was called with (ABI 2; {} = defaults / ABI 1)
    options: dict[str, int] = field(default_factory=dict)
    # stats[mode_key] = {"speedup": {baseline: {median, lo, hi, n}}, "session": {rounds, kept,
    #   calls_per_sample, sm_clock_mhz, stopped, ...}}: the intervals and how the session ran
    stats: dict[str, Any] = field(default_factory=dict)
    stage: str = "final"          # "final" (reported, exported, rewarded) | "screen" (ranking only)
    # sha256 of the built binary (cudal2.core.binarykey): identical binaries share it whatever
    # their source text; None when unknown (a build that failed, a row recorded before keys)
    binary_key: str | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Evaluation.status {self.status!r} not in {STATUSES}")
        if self.stage not in STAGES:
            raise ValueError(f"Evaluation.stage {self.stage!r} not in {STAGES}")
        self.options = dict(normalise_options(self.options))

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = [self.shape.M, self.shape.N, self.shape.K]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evaluation":
        d = dict(d)
        s = d.pop("shape")
        shape = s if isinstance(s, Shape) else (Shape(**s) if isinstance(s, dict) else Shape(*s))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(shape=shape, **{k: v for k, v in d.items() if k in known})


# -- reading an Evaluation: the one test of "measured" that reports and export share -----------
def medians(ev, mode: str) -> dict[str, float]:
    """{who: median_us} of one evaluation in `mode`: "candidate" and each baseline timed."""
    t = (ev.timings or {}).get(mode) or {}
    return {who: float(r["median_us"]) for who, r in t.items() if r and r.get("median_us")}


def unmeasured(ev, mode: str) -> str | None:
    """None if `ev` holds a measured time of a correct candidate in `mode`, else why not."""
    if ev.estimated:
        return "estimated (a cost-model number, not a measurement)"
    if (ev.env or {}).get("fake_device"):
        return "fake device (a CPU rehearsal, not a measurement)"
    if ev.status != OK:
        return f"status {ev.status}"
    if (ev.correctness or {}).get("ok") is False:
        return "failed the correctness check"
    if "candidate" not in medians(ev, mode):
        return f"no candidate time in mode {mode!r}"
    return None


def on_gpu(ev, gpu: str | None) -> bool:
    """Whether `ev` was measured on `gpu` (a case-insensitive substring; None = any)."""
    return not gpu or gpu.lower() in str((ev.env or {}).get("gpu", "")).lower()
