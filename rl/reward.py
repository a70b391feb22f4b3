"""The RL reward: every candidate goes through the harness; its verdict becomes a number.

Mapping (also in docs/rl.md). ``s`` = speedup vs the chosen baseline (default
``cublaslt_autotuned``) in the chosen mode (default ``offline``) = baseline median / candidate
median, from the same interleaved timing run:

=================================  =========================================================
verdict                            reward
=================================  =========================================================
correct and measured (``ok``)      ``clip(log(s), -0.5, 1.0)``  (0 = as fast as the baseline)
built + audited, no GPU            the same formula on the cost model's predicted times,
(``not_measured``)                 flagged *estimated* in the DB row and every log line
no code / two files / not our ABI  -1.0  (extraction, before any build)
too fast (below the physical       -1.0  (a measurement the hardware cannot produce is an
bound)                                   exploit or a broken timer, never a win)
audit rejected                     -0.9  (cheating attempts rank below honest failures)
build failure                      -0.8
crash / timeout / out of memory    -0.7
wrong answer                       -0.6
harness error (not the kernel's)   None  (trl ignores it; no number invented)
=================================  =========================================================

The clip keeps every correct kernel (>= -0.5) above every failure (<= -0.6), so the policy is
first taught to be correct and then to be fast. There is no cheaper path: a reward > -0.6 needs
a build, an audit pass and (with a GPU) the correctness checks and timing, all in one harness
call; an estimate is never given to a kernel that failed the build or the audit.

Caching: the harness's one cache rule (cudal2.harness.pipeline.cached: same source, shape, arch,
GPU model, options, and timed the same way) answers first. A kernel seen before is never rebuilt or
re-timed: its row is reused. Rows are written by the harness's one writer (pipeline.record), which
also prices a no-GPU row with the cost model (the estimator) before storing it. Without a GPU, a kernel already measured
on a GPU model recorded in the DB (`reuse_gpu`, default: the only GPU model the DB has
measurements from) gets that measured result, not an estimate. Every reward for extracted code has a DB
row behind it; extraction failures (no code at all) are logged in the run's log.jsonl only.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from cudal2.core.identity import source_sha      # the DB's key for a kernel text: one definition
from . import extract as _extract

DEFAULT_BASELINE = "cublaslt_autotuned"
DEFAULT_MODE = "offline"
LOG_CLIP = (-0.5, 1.0)

# Fixed penalties by verdict (extraction verdicts and harness statuses).
PENALTIES: dict[str, float] = {
    _extract.NO_CODE: -1.0,
    _extract.TWO_FILES: -1.0,
    _extract.NOT_ABI: -1.0,
    "too_fast": -1.0,
    "audit_rejected": -0.9,
    "build_error": -0.8,
    "crashed": -0.7,
    "timeout": -0.7,
    "oom": -0.7,
    "wrong": -0.6,
}


# Harness statuses reached only after a successful build.
COMPILED = ("ok", "not_measured", "audit_rejected", "wrong", "crashed", "timeout", "oom", "too_fast")


def speedup_reward(speedup: float) -> float:
    """log speedup, clipped so a slow correct kernel still beats any failure."""
    if not speedup or not math.isfinite(speedup) or speedup <= 0:
        return LOG_CLIP[0]
    return float(min(max(math.log(speedup), LOG_CLIP[0]), LOG_CLIP[1]))


def evaluation_speedup(ev, baseline: str = DEFAULT_BASELINE, mode: str = DEFAULT_MODE):
    """The recorded speedup vs `baseline` in `mode`, or None."""
    s = ((getattr(ev, "speedups", None) or {}).get(mode) or {}).get(baseline)
    return float(s) if s else None


def reward_for(ev, baseline: str = DEFAULT_BASELINE, mode: str = DEFAULT_MODE) -> float | None:
    """Map one harness Evaluation to a reward (table in the module docstring)."""
    status = ev.status
    if status in PENALTIES:
        return PENALTIES[status]
    if status in ("ok", "not_measured"):
        s = evaluation_speedup(ev, baseline, mode)
        if s is None:
            # ok without the chosen baseline timed, or no GPU and no estimate: no number invented.
            return None
        return speedup_reward(s)
    return None   # "error": the harness failed, not the kernel


def add_estimate(ev, model, baselines: Iterable[str], mode: str = DEFAULT_MODE) -> bool:
    """Fill a not_measured Evaluation's timings/speedups from the cost model, flag it estimated.
    Returns False (and leaves it alone) when the model cannot price it."""
    if ev.status != "not_measured":
        return False
    try:
        shape = (ev.shape.M, ev.shape.N, ev.shape.K)
        cand = float(model.predict_us(ev.meta or {}, ev.build or {}, shape))
        base = {b: float(model.predict_baseline_us(shape, b)) for b in baselines}
    except Exception as e:   # a meta the model cannot read: leave the row unpriced, say why
        ev.detail = (ev.detail + "; " if ev.detail else "") + f"no estimate: {e}"
        return False
    if not (cand > 0 and all(v > 0 for v in base.values())):
        return False
    ev.timings = {mode: {"candidate": {"median_us": cand, "n": 0, "estimated": True},
                         **{b: {"median_us": v, "n": 0, "estimated": True} for b, v in base.items()}}}
    ev.speedups = {mode: {b: v / cand for b, v in base.items()}}
    ev.estimated = True
    return True


@dataclass
class Attempt:
    """One scored completion, as the logs and the feedback prompts see it."""
    shape: tuple[int, int, int]
    verdict: str                 # extraction verdict or harness status
    reward: float | None
    speedup: float | None = None
    estimated: bool = False
    sha: str = ""
    eval_id: int | None = None
    cached: bool = False
    detail: str = ""
    build: dict = field(default_factory=dict)
    winner_baseline: str = ""    # fastest baseline for this shape (when timed)
    source: str = ""

    @property
    def compiled(self) -> bool:
        return self.verdict in COMPILED

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("source")
        d["shape"] = list(self.shape)
        d["compiled"] = self.compiled
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], **override) -> "Attempt":
        """The inverse of to_dict (a log.jsonl record); `override` sets fields it lacks (source)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["shape"] = tuple(kw["shape"])
        kw["build"] = kw.get("build") or {}
        return cls(**{**kw, **override})


def _winner_baseline(ev, mode: str) -> str:
    t = (ev.timings or {}).get(mode) or {}
    base = {w: r.get("median_us") for w, r in t.items() if w != "candidate" and r and r.get("median_us")}
    return min(base, key=base.get) if base else ""


class KernelReward:
    """trl reward function: ``reward(prompts, completions, M, N, K, **columns) -> list[float|None]``.

    Sends each extracted kernel through `executor` (a rl.executor.Executor), caches through the
    results DB, prices no-GPU rows with the cost model, and keeps `attempts` (every scored
    completion) and `best` (best kernel per shape) for logs, feedback prompts and export.
    """

    def __init__(self, executor, db, *, arch: str = "sm_90a", baseline: str = DEFAULT_BASELINE,
                 mode: str = DEFAULT_MODE, baselines: tuple[str, ...] | None = None,
                 gpu: str | None = None, cost_model=None, timeout_s: float = 120.0,
                 sources_dir=None, reuse_gpu: str | None = None):
        from cudal2.harness.types import BASELINES
        if baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r}; known: {BASELINES}")
        self.__name__ = "kernel_reward"     # trl logs rewards under the function's name
        self.executor, self.db, self.arch = executor, db, arch
        self.baseline, self.mode = baseline, mode
        self.baselines = tuple(baselines) if baselines else BASELINES
        if baseline not in self.baselines:
            self.baselines = self.baselines + (baseline,)
        self.gpu = gpu if gpu is not None else executor.gpu_name()
        self.timeout_s = timeout_s
        self.sources_dir = sources_dir              # every evaluated source saved as <sha>.cu
        # Without a GPU, rows measured on a GPU model are still the best answer for a kernel seen
        # there: reuse them (default: the one GPU model this DB has measurements from, if one).
        self.reuse_gpu = reuse_gpu if reuse_gpu is not None else (
            self._single_measured_gpu() if not self.gpu else "")
        self.evaluations: dict[tuple[str, tuple], Any] = {}   # (sha, shape) -> Evaluation
        self._cost_model = cost_model
        self.attempts: list[list[Attempt]] = []     # one list per reward call (= per step)
        self.best: dict[tuple[int, int, int], Attempt] = {}
        self.n_evaluated = 0                        # harness calls (cache misses)
        self.n_cached = 0
        self._lock = threading.Lock()

    def _single_measured_gpu(self) -> str:
        gpus = {(e.env or {}).get("gpu") for e in self.db.rows(arch=self.arch, estimated=False)
                if e.status in PENALTIES or e.status == "ok"}
        gpus.discard(None)
        gpus.discard("")
        return gpus.pop() if len(gpus) == 1 else ""

    # -- cost model -----------------------------------------------------------------------
    @property
    def estimated(self) -> bool:
        return not self.gpu

    def cost_model(self):
        """The cost model fitted to this DB's measured rows for our arch (the prior without)."""
        if self._cost_model is None:
            from cudal2.search.costmodel import CostModel
            measured = [e for e in self.db.rows(arch=self.arch) if not e.estimated and e.status == "ok"]
            # the measured rows name their GPU (an H200 is not priced as an H100); none: the arch's
            self._cost_model = CostModel.fit(measured) if measured else CostModel.default(arch=self.arch)
            self.n_measurements = len(measured)
        return self._cost_model

    def estimate_note(self) -> str:
        if not self.estimated:
            return ""
        self.cost_model()
        n = getattr(self, "n_measurements", 0)
        return (f"(estimated: no GPU — rewards from the cost model fitted to {n} measurements"
                + (", i.e. its analytic roofline prior" if n == 0 else "") + ")")

    # -- scoring ----------------------------------------------------------------------------
    def __call__(self, prompts=None, completions=None, M=None, N=None, K=None, **columns):
        if completions is None or M is None or N is None or K is None:
            raise ValueError("KernelReward needs completions and the M, N, K dataset columns")
        shapes = [(int(m), int(n), int(k)) for m, n, k in zip(M, N, K)]
        return self.score(completions, shapes)

    def _request(self, source: str, shape):
        from cudal2.harness.types import EvalRequest, Shape
        return EvalRequest(source=source, shape=Shape(*shape), arch=self.arch, modes=(self.mode,),
                           baselines=self.baselines, origin="rl", timeout_s=self.timeout_s)

    def _estimate(self, ev) -> None:
        add_estimate(ev, self.cost_model(), self.baselines, self.mode)

    def score(self, completions, shapes) -> list[float | None]:
        from cudal2.harness.pipeline import cached, record
        exts = [_extract.extract(c) for c in completions]
        attempts: list[Attempt | None] = [None] * len(exts)
        pending: dict[tuple[str, tuple], list[int]] = {}   # one harness call per (sha, shape)
        for i, (ex, shape) in enumerate(zip(exts, shapes)):
            if not ex.ok:
                attempts[i] = Attempt(shape, ex.verdict, PENALTIES[ex.verdict], detail=ex.detail,
                                      source=ex.source)
                continue
            pending.setdefault((source_sha(ex.source), shape), []).append(i)
        evals: dict[tuple[str, tuple], tuple[Any, bool]] = {}
        misses = []
        for key in pending:
            sha, shape = key
            req = self._request(exts[pending[key][0]].source, shape)
            hit = None
            if self.reuse_gpu:      # no GPU here, but this kernel may have been measured on one
                hit = cached(self.db, req, self.reuse_gpu, sha=sha)
            if hit is None:
                hit = cached(self.db, req, self.gpu, sha=sha)
            if hit is not None:
                evals[key] = (hit, True)
            else:
                misses.append(key)
        if misses:
            reqs = [self._request(exts[pending[k][0]].source, k[1]) for k in misses]
            results = self.executor.evaluate_many(reqs)
            for key, ev, req in zip(misses, results, reqs):
                ev.origin = ev.origin or "rl"
                # the harness's one writer: prices a no-GPU row, then stores it (a row an
                # executor's harness already stored keeps its id)
                record(self.db, ev, req.source, estimator=self._estimate)
                evals[key] = (ev, False)
            self.n_evaluated += len(misses)
        self.n_cached += len(pending) - len(misses)
        for key, idxs in pending.items():
            ev, cached = evals[key]
            self.evaluations[key] = ev
            self._save_source(key[0], exts[idxs[0]].source)
            r = reward_for(ev, self.baseline, self.mode)
            for j, i in enumerate(idxs):
                attempts[i] = Attempt(
                    key[1], ev.status, r, evaluation_speedup(ev, self.baseline, self.mode),
                    bool(ev.estimated), key[0], ev.id, cached or j > 0, ev.detail,
                    dict(ev.build or {}), _winner_baseline(ev, self.mode), exts[i].source)
        with self._lock:
            self.attempts.append(attempts)
            for a in attempts:
                if a.reward is None or a.speedup is None or a.verdict not in ("ok", "not_measured"):
                    continue
                cur = self.best.get(a.shape)
                if cur is None or a.speedup > cur.speedup:
                    self.best[a.shape] = a
        return [a.reward for a in attempts]

    def _save_source(self, sha: str, source: str) -> None:
        if self.sources_dir is None:
            return
        from pathlib import Path
        p = Path(self.sources_dir) / f"{sha}.cu"
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(source)
            tmp.replace(p)

    # -- summaries ----------------------------------------------------------------------------
    def step_summary(self, attempts: list[Attempt] | None = None) -> dict[str, Any]:
        """Reward mean/max and the compiled / correct / faster fractions of one step."""
        attempts = self.attempts[-1] if attempts is None else attempts
        rs = [a.reward for a in attempts if a.reward is not None]
        n = max(len(attempts), 1)
        measured = not self.estimated
        return {
            "n": len(attempts),
            "reward_mean": sum(rs) / len(rs) if rs else None,
            "reward_max": max(rs) if rs else None,
            "frac_compiled": sum(a.compiled for a in attempts) / n,
            # without a GPU nothing is checked for correctness: say so instead of guessing
            "frac_correct": sum(a.verdict == "ok" for a in attempts) / n if measured else None,
            "frac_faster": sum(1 for a in attempts if a.speedup and a.speedup > 1.0
                               and a.verdict in ("ok", "not_measured")) / n,
            "estimated": self.estimated,
            "cached": sum(a.cached for a in attempts),
            "verdicts": {v: sum(a.verdict == v for a in attempts) for v in sorted({a.verdict for a in attempts})},
        }
