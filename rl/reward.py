"""The RL reward: every candidate goes through the harness; its verdict becomes a number.

Mapping (also in docs/rl.md). ``s`` = the candidate's kernel-time speedup vs the chosen baseline
(default ``cublaslt_autotuned``) in the chosen mode (default ``offline``): the median over
rounds of paired baseline/candidate time ratios from one interleaved finals session. ``ref`` =
the best known speedup for the shape: ``max(1, s of the best verified kernel so far)``, i.e.
the faster of the baseline and our verified best (a best is verified by a fresh re-measurement,
see below). ``x = log(s / ref)``.

==================================  ===============================================================
verdict                             reward
==================================  ===============================================================
correct and measured (``ok``)       ``x / (1 + x)`` for x >= 0, ``x / (1 - x / 0.55)`` for x < 0:
                                    0 at the best known time, slope 1 around it, strictly
                                    increasing, inside the open interval (-0.55, 1.0)
built + audited, no GPU, and the     the measured reward from the reward table (rl.table):
reward table measured this binary   ``x = log(reference / t)`` with t the binary's reward draws'
at this shape (a table *hit*)       median and reference the shape's best reference draws, so a
                                    lucky draw is never both; the ``ok`` curve above
built + audited, no GPU, not in     -0.55, flat (FLAT_ESTIMATE): with no measured time there is
the table (``not_measured``, a      no speed term; the kernel joins the table's queue for the next
*miss*)                             GPU call; the build-derived estimate (rl.estimate) is
                                    recorded for ranking and search only, never rewarded
refused (the kernel does not serve  -0.575: caught on any machine from the meta the audit checked
the requested shape)                against the kernel's own guard, or from the guard at launch
wrong answer                        -0.6
crash / timeout / out of memory     -0.7
build failure                       -0.8  (a missing or misspelt header included)
no code / two files / not our ABI   -0.85 (extraction, before any build: an honest format failure)
audit rejected                      -0.9  (cheating attempts rank below every honest failure)
too fast (below the physical        -1.0  (a time the hardware cannot produce is an exploit or a
bound)                                     broken timer, never a win)
harness error (not the kernel's)    None  (trl ignores it; no number invented)
==================================  ===============================================================

Why this shape: GRPO only compares completions of one group (one shape), so what matters is
that (1) every correct kernel ranks above every failure, (2) correct kernels never tie unless
they are equally fast. The old ``clip(log s, -0.5, 1)`` put every kernel slower than 0.61x on
the floor: a group of uniformly slow kernels had zero variance and nothing was learned. The
rational squash never flattens (a 10x-slower and a 20x-slower kernel still differ by ~0.02),
keeps correct kernels above -0.55 > -0.6, and is the identity near the best known time, where
the policy competes. Normalising by the best known time per shape puts each shape's frontier at
0 whatever cuBLAS's margin there, so shapes where the baseline is hard to beat still give the
group's kernels the linear part of the curve.

No cheaper path: a reward above -0.6 needs a build, an audit pass and (with a GPU) the
correctness checks and the timing, all in the harness. Without a GPU every kernel that built and
passed the audit gets the same flat reward: a static estimate prices what the code contains, not
what it executes, so dead tensor-core instructions, skipped K work or a flattering meta raised it
(at 4096^3 the corpus WMMA kernel estimated 0.038x, the same with a never-executed wgmma 0.334x;
the kernels are in tests/data/adversarial, tests/test_rl_adversarial.py). The estimate stays
on the row (flagged estimated) for ranking where a GPU verdict follows; estimated rows are never
verified, so they never become a shape's reference or best.

Resolution: rewards of one group (shape, turn) whose speedups differ by less than the
measurement's resolution (the recorded interval's half-width in log terms, at least
RESOLUTION) are tied at the lowest of them (tie_within_resolution), so trl's per-group std
normalisation cannot turn timing noise into an advantage: a group all within the resolution has
zero spread and no advantage. With a GPU and group screening
(rl.executor.LocalExecutor.evaluate_groups) the group's fastest screened kernel gets the full
finals; the others keep a *screened* reward (smoke-checked, timed-output-verified), capped just
below their finalist's, so no kernel outscores its group's fully checked kernel without the full
correctness suite.

Winner's curse: a measured kernel whose speedup beats the shape's reference is re-measured in a
fresh measurement run (a new finals session in a fresh worker, every baseline) before it counts:
its reward, the reference and the export use the re-measurement (the newest row, which the
cache serves from then on). Estimates are never re-measured, never references and never
exported.

Caching: the harness's one cache rule (cudal2.harness.pipeline.cached: same source, shape, arch,
GPU model, options, and timed the same way) answers first. A kernel seen before is never rebuilt
or re-timed: its row is reused. Rows are written by the harness's one writer (pipeline.record),
which prices a no-GPU row with the estimator before storing it. Without a GPU, a kernel already
measured on a GPU model recorded in the DB (`reuse_gpu`, default: the only GPU model the DB has
measurements from) gets that measured result, not an estimate. Every reward for extracted code
has a DB row behind it; extraction failures are logged in the run's log.jsonl only.
"""
from __future__ import annotations

import math
import statistics
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from cudal2.core.build import BuildSpec, build
from cudal2.core.identity import source_sha  # the DB's key for a kernel text: one definition
from cudal2.harness.pipeline import cached, record
from cudal2.harness.types import BASELINES, EvalRequest, Shape
from cudal2.search.costmodel import CostModel, gpu_for
from cudal2_rl import extract as _extract
from cudal2_rl.estimate import estimate_us, facts_for_build

DEFAULT_BASELINE = "cublaslt_autotuned"
DEFAULT_MODE = "offline"
CORRECT_FLOOR = -0.55        # correct kernels lie strictly above this ...
CORRECT_CEIL = 1.0           # ... and strictly below this
FLAT_ESTIMATE = CORRECT_FLOOR   # built + audited, nothing to price: the slowest correct kernel's

# Fixed penalties by verdict (extraction verdicts and harness statuses).
PENALTIES: dict[str, float] = {
    "too_fast": -1.0,
    "audit_rejected": -0.9,
    _extract.NO_CODE: -0.85,
    _extract.TWO_FILES: -0.85,
    _extract.NOT_ABI: -0.85,
    "build_error": -0.8,
    "crashed": -0.7,
    "timeout": -0.7,
    "oom": -0.7,
    "wrong": -0.6,
    "refused": -0.575,       # refusing the shape: above a wrong answer, below every correct kernel
}
CHEATING = ("too_fast", "audit_rejected")

# Harness statuses reached only after a successful build.
COMPILED = ("ok", "not_measured", "audit_rejected", "wrong", "crashed", "timeout", "oom", "too_fast",
            "refused")
SCREENED_MARGIN = 1e-3       # a screened reward stays this far below its finalist's
# Relative speed difference below which two measured kernels tie when a row records no interval:
# finals stop once the speedup interval is 0.5% tight (cudal2.harness.measure).
RESOLUTION = 0.005


def correct_reward(x: float) -> float:
    """The reward of a correct kernel at x = log(speedup / reference): strictly increasing,
    slope 1 at 0, inside (CORRECT_FLOOR, CORRECT_CEIL)."""
    if x >= 0:
        return x / (1.0 + x / CORRECT_CEIL)
    return x / (1.0 - x / -CORRECT_FLOOR)


def speedup_reward(speedup: float | None, reference: float = 1.0) -> float | None:
    """correct_reward(log(speedup / reference)); None for a speedup that is no number."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return None
    return float(correct_reward(math.log(speedup / max(reference, 1e-12))))


def evaluation_speedup(ev, baseline: str = DEFAULT_BASELINE, mode: str = DEFAULT_MODE):
    """The recorded speedup vs `baseline` in `mode` (a final's paired median, an estimate, or a
    screened row's speedup relative to its group's finalist), or None."""
    s = ((getattr(ev, "speedups", None) or {}).get(mode) or {}).get(baseline)
    if not s and getattr(ev, "stage", "final") == "screen":
        rl = (getattr(ev, "stats", None) or {}).get("rl") or {}
        if rl.get("mode", mode) == mode:
            s = (rl.get("screened") or {}).get(baseline)
    return float(s) if s else None


def reward_for(ev, baseline: str = DEFAULT_BASELINE, mode: str = DEFAULT_MODE,
               reference: float = 1.0) -> float | None:
    """Map one harness Evaluation to a reward (table in the module docstring)."""
    status = ev.status
    if status in PENALTIES:
        return PENALTIES[status]
    if status == "not_measured" or (status == "ok" and getattr(ev, "estimated", False)):
        return FLAT_ESTIMATE        # no measured time: no speed term (the estimate ranks, never rewards)
    if status == "ok":
        s = evaluation_speedup(ev, baseline, mode)
        return None if s is None else speedup_reward(s, reference)   # None: baseline not timed
    return None   # "error": the harness failed, not the kernel


def measurement_resolution(ev, baseline: str = DEFAULT_BASELINE, mode: str = DEFAULT_MODE) -> float:
    """The resolution of a measured speedup in log terms: half the width of its recorded
    interval (stats[mode]["speedup"][baseline] lo..hi), at least log(1 + RESOLUTION)."""
    floor = math.log1p(RESOLUTION)
    iv = ((((getattr(ev, "stats", None) or {}).get(mode) or {}).get("speedup") or {}).get(baseline)
          or {})
    lo, hi = iv.get("lo"), iv.get("hi")
    if lo and hi and lo > 0 and hi >= lo:
        return max(floor, 0.5 * math.log(hi / lo))
    return floor


def table_resolution(entry) -> float:
    """A table entry's resolution in log terms: half the widest interval of its draws, at
    least log(1 + RESOLUTION)."""
    floor = math.log1p(RESOLUTION)
    widths = [0.5 * math.log(d.hi_us / d.lo_us) for d in entry.draws
              if d.lo_us and d.hi_us and 0 < d.lo_us <= d.hi_us]
    return max([floor, *widths])


def tie_within_resolution(attempts) -> int:
    """Ties the rewards of measured kernels of one group (shape, turn) whose speedups lie within
    the measurement's resolution of each other: sorted by speedup, each run of kernels within
    the resolution of the run's slowest gets the run's lowest reward (a tie never raises a
    reward). Only measured speedups take part (estimated rows already share the flat reward).
    Changes `attempts` in place; returns how many rewards it lowered."""
    groups: dict[tuple, list] = {}
    for a in attempts:
        if (a is not None and a.reward is not None and a.speedup and a.speedup > 0
                and (a.verdict == "ok" or getattr(a, "table", "") == "hit") and not a.estimated):
            groups.setdefault((a.shape, a.turn), []).append(a)
    changed = 0
    for members in groups.values():
        members.sort(key=lambda a: a.speedup)
        i = 0
        while i < len(members):
            anchor = members[i]
            j = i + 1
            while j < len(members) and math.log(members[j].speedup / anchor.speedup) < max(
                    anchor.resolution, members[j].resolution):
                j += 1
            run = members[i:j]
            low = min(a.reward for a in run)
            for a in run:
                if a.reward != low:
                    a.reward = low
                    changed += 1
            i = j
    return changed


def add_estimate(ev, facts, baseline_us: dict[str, float], gpu_spec,
                 mode: str = DEFAULT_MODE) -> bool:
    """Fill a not_measured Evaluation's timings/speedups from the build-derived estimate
    (rl.estimate: `facts` are the build's BuildFacts, never the meta) and the baselines'
    predicted times; flag it estimated. Returns False (and says why in `detail`) when the
    build shows nothing to price. Either way the reward is the flat FLAT_ESTIMATE: the estimate
    ranks (search, outputs), it never rewards."""
    if ev.status != "not_measured":
        return False
    ev.estimated = True
    if facts is None:
        ev.detail = (ev.detail + "; " if ev.detail else "") + "no estimate: the build kept no PTX"
        return False
    shape = (ev.shape.M, ev.shape.N, ev.shape.K)
    cand, why = estimate_us(facts, shape, gpu_spec)
    ev.env = {**(ev.env or {}), "estimate": {"from": "build (PTX + ptxas)", **why}}
    if cand is None or not cand > 0 or not all(v > 0 for v in baseline_us.values()):
        ev.detail = (ev.detail + "; " if ev.detail else "") + f"no estimate: {why.get('why', 'unpriced')}"
        return False
    ev.timings = {mode: {"candidate": {"median_us": cand, "n": 0, "estimated": True},
                         **{b: {"median_us": v, "n": 0, "estimated": True} for b, v in baseline_us.items()}}}
    ev.speedups = {mode: {b: v / cand for b, v in baseline_us.items()}}
    return True


def bottleneck_hints(ev, mode: str = DEFAULT_MODE) -> list[str]:
    """What limits a kernel, in words the policy can act on: ptxas spills and register pressure
    (from its build), and where its time sits against the GPU's roofline (measured rows, against
    the measured GPU's peaks) or the estimate's terms (no GPU: instruction class, wave fill)."""
    from cudal2.harness.bounds import fraction_of_peak, gemm_bytes, peak_for_name
    out = []
    b = ev.build or {}
    if b.get("spills"):
        out.append(f"ptxas spills {b['spills']} B to local memory: keep fewer values live per thread "
                   "(a smaller warp tile or fewer accumulators)")
    regs = int(b.get("registers") or 0)
    if regs > 128:
        out.append(f"{regs} registers per thread: at most {65536 // (regs * 32)} warps fit on an SM "
                   "(65536 registers), too few to hide latency without a deep pipeline")
    M, N, K = ev.shape.M, ev.shape.N, ev.shape.K
    t = _median_us(ev, mode)
    est = (ev.env or {}).get("estimate") or {}
    if ev.estimated:
        if est.get("kind") == "fma":
            out.append("the main loop has no tensor-core instruction (FMA only): use mma.sync or wgmma")
        if est.get("wave_eff") is not None and est["wave_eff"] < 0.75:
            out.append(f"the CTA tiles fill {100 * est['wave_eff']:.0f}% of the last wave of SMs: a tile "
                       "that divides the problem better, or split-K for small M x N")
    elif t:
        peak = peak_for_name((ev.env or {}).get("gpu", ""))
        if peak is not None:
            compute = fraction_of_peak(t, M, N, K, peak)
            memory = gemm_bytes(M, N, K) / (t * 1e-6) / (peak.tbytes_per_s * 1e12)
            if memory >= compute:
                out.append(f"memory-bound: {100 * memory:.0f}% of {peak.name} DRAM bandwidth for the "
                           f"minimum traffic, {100 * compute:.0f}% of its tensor peak: wider loads, "
                           "fewer passes over A and B (larger tiles), split-K only if M x N is small")
            else:
                out.append(f"compute-bound: {100 * compute:.0f}% of {peak.name}'s tensor peak"
                           + (": near the roofline" if compute >= 0.6 else ": feed the tensor cores "
                              "better (deeper cp.async/TMA pipeline, larger CTA tile, wgmma on sm_90)"))
    return out


def _median_us(ev, mode: str):
    return ((((ev.timings or {}).get(mode) or {}).get("candidate") or {}).get("median_us")
            if ev.timings else None)


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
    stage: str = "final"         # "final" (full checks) | "screen" (smoke + timed-output checks)
    verified: bool = False       # a measured speedup confirmed by a fresh re-measurement
    reference: float = 1.0       # the shape's best known speedup the reward was taken against
    audit: list = field(default_factory=list)   # the audit's reasons / notes, for feedback
    turn: int = 1                # multi-turn refinement: which turn wrote it
    resolution: float = 0.0      # the measured speedup's resolution in log terms (0: not measured)
    time_us: float | None = None     # the kernel's median time (measured, or estimated: see `estimated`)
    hints: list = field(default_factory=list)   # bottleneck hints for feedback (bottleneck_hints)
    table: str = ""              # no GPU: "hit" (rewarded from the reward table), "miss" (queued), ""
    table_rows: list = field(default_factory=list)   # the table's (db, row id) behind a hit
    binary_key: str = ""         # a hit's binary, and the GPU-seconds the table spent on it
    gpu_seconds: float = 0.0
    versus: str = ""             # what `speedup` is against: "" the run's baseline; "table best"
                                 # for a hit at a shape whose table rows hold no baseline time

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


def _audit_lines(ev) -> list:
    a = ev.audit or {}
    return [str(x)[:300] for x in (a.get("reasons") or [])][:4] + \
        [f"note: {x}"[:300] for x in (a.get("notes") or [])][:2]


def launch_bound(shapes, *, db=None, gpu: str = "", baseline: str = DEFAULT_BASELINE,
                 mode: str = DEFAULT_MODE, floor_us: float = 3.0, arch: str = "sm_90a",
                 cost_model=None, table=None) -> dict[tuple[int, int, int], str]:
    """Shapes whose baseline kernel time is within 2x the launch floor: there every candidate
    sits within launch noise of every other, so a group cannot be ranked by speed. Returns
    {shape: reason}. The baseline time is the DB's measured median for the shape on `gpu` when
    there is one (kernel time, finals), else the reward table's (`table`), else the cost model's
    estimate (said in the reason)."""
    out = {}
    measured: dict[tuple, list[float]] = {}
    if db is not None and gpu:
        for e in db.rows(arch=arch, gpu=gpu, status="ok"):
            t = (((e.timings or {}).get(mode) or {}).get(baseline) or {}).get("median_us")
            if t and not e.estimated and e.stage == "final":
                measured.setdefault((e.shape.M, e.shape.N, e.shape.K), []).append(float(t))
    for s in shapes:
        s = tuple(s)
        table_us = table.baseline_us(s, baseline) if table is not None else None
        if s in measured:
            t, how = statistics.median(measured[s]), f"measured on {gpu}"
        elif table_us:
            t, how = table_us, f"measured on {table.gpu}, from the reward table"
        else:
            if cost_model is None:
                cost_model = CostModel.default(arch=arch)
            t, how = float(cost_model.predict_baseline_us(s, baseline)), "estimated by the cost model"
        if t < 2 * floor_us:
            out[s] = (f"{s[0]}x{s[1]}x{s[2]}: {baseline} kernel time {t:.1f} us ({how}) is within "
                      f"2x the launch floor ({floor_us:g} us): candidates differ by launch noise")
    return out


def note_bests(attempts, best: dict, best_estimated: dict) -> None:
    """Fold a batch of attempts into the best per shape: verified (re-measured) bests are
    references; estimates and, without a GPU, reward-table hits only rank, for outputs, and a
    hit (a GPU measured it) ranks above every estimate."""
    for a in attempts:
        if a is None or a.reward is None or a.speedup is None or a.verdict not in ("ok", "not_measured"):
            continue
        bests = best if a.verified else best_estimated if a.estimated or a.table == "hit" else None
        if bests is None:
            continue
        cur = bests.get(a.shape)
        if cur is None or (a.table == "hit", a.speedup) > (cur.table == "hit", cur.speedup):
            bests[a.shape] = a


def trl_rewards(score_attempts, completions, M, N, K, columns) -> list[float | None]:
    """trl's reward-function call: the M, N, K dataset columns as shapes, scored by
    `score_attempts`; a multi-turn rollout's returns (scored during the rollout) as they are."""
    if completions is None or M is None or N is None or K is None:
        raise ValueError("KernelReward needs completions and the M, N, K dataset columns")
    if columns.get("turn_return") is not None:
        return [None if r is None else float(r) for r in columns["turn_return"]]
    shapes = [(int(m), int(n), int(k)) for m, n, k in zip(M, N, K)]
    return [a.reward for a in score_attempts(completions, shapes)]


class KernelReward:
    """trl reward function: ``reward(prompts, completions, M, N, K, **columns) -> list[float|None]``.

    Sends each extracted kernel through `executor` (a rl.executor.Executor), caches through the
    results DB, prices no-GPU rows from their builds, re-measures a new best before it counts,
    and keeps `attempts` (every scored completion) and `best` (best verified kernel per shape)
    for logs, feedback prompts and export.
    """

    def __init__(self, executor, db, *, arch: str = "sm_90a", baseline: str = DEFAULT_BASELINE,
                 mode: str = DEFAULT_MODE, baselines: tuple[str, ...] | None = None,
                 gpu: str | None = None, cost_model=None, timeout_s: float = 120.0,
                 sources_dir=None, reuse_gpu: str | None = None, remeasure: bool = True,
                 table=None, queue=None):
        if baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r}; known: {BASELINES}")
        self.__name__ = "kernel_reward"     # trl logs rewards under the function's name
        self.executor, self.db, self.arch = executor, db, arch
        self.baseline, self.mode = baseline, mode
        # RL times only the reward's baseline (a shorter finals session); a re-measurement of a
        # new best times every baseline, so the export rule sees them all
        self.baselines = tuple(baselines) if baselines else (baseline,)
        if baseline not in self.baselines:
            self.baselines = self.baselines + (baseline,)
        self.all_baselines = tuple(dict.fromkeys(self.baselines + BASELINES))
        self.gpu = gpu if gpu is not None else executor.gpu_name()
        attach = getattr(executor, "attach_db", None)
        if attach is not None:      # cuBLASLt autotune choices live in the DB, once per shape
            attach(db)
        self.timeout_s = timeout_s
        self.sources_dir = sources_dir              # every evaluated source saved as <sha>.cu
        # no GPU: measured rewards come from the reward table (rl.table), misses join the queue
        self.table, self.queue = table, queue
        self.table_reads: dict[tuple, float] = {}   # (binary key, shape) read -> its GPU-seconds
        self.remeasure = remeasure
        # Without a GPU, rows measured on a GPU model are still the best answer for a kernel seen
        # there: reuse them (default: the one GPU model this DB has measurements from, if one).
        self.reuse_gpu = reuse_gpu if reuse_gpu is not None else (
            self._single_measured_gpu() if not self.gpu else "")
        self.evaluations: dict[tuple[str, tuple], Any] = {}   # (sha, shape) -> Evaluation
        self._cost_model = cost_model
        self.n_measurements = 0
        self.attempts: list[list[Attempt]] = []     # one list per reward call (= per step)
        self.best: dict[tuple[int, int, int], Attempt] = {}   # verified (re-measured) bests only
        # the fastest estimated kernel per shape: a ranking for outputs, never a reference
        self.best_estimated: dict[tuple[int, int, int], Attempt] = {}
        self.n_evaluated = 0                        # harness calls (cache misses)
        self.n_cached = 0
        self.n_remeasured = 0
        self._lock = threading.Lock()

    def _single_measured_gpu(self) -> str:
        gpus = {(e.env or {}).get("gpu") for e in self.db.rows(arch=self.arch, estimated=False)
                if e.status in PENALTIES or e.status == "ok"}
        gpus.discard(None)
        gpus.discard("")
        return gpus.pop() if len(gpus) == 1 else ""

    # -- estimates (no GPU) -----------------------------------------------------------------
    @property
    def estimated(self) -> bool:
        return not self.gpu

    def cost_model(self):
        """The cost model for the baselines' predicted times: fitted to this DB's measured rows
        for our arch (its analytic prior without). Kernels are priced from their builds."""
        if self._cost_model is None:
            measured = [e for e in self.db.rows(arch=self.arch) if not e.estimated and e.status == "ok"]
            self._cost_model = CostModel.fit(measured) if measured else CostModel.default(arch=self.arch)
            self.n_measurements = len(measured)
        return self._cost_model

    def estimate_note(self) -> str:
        if not self.estimated:
            return ""
        self.cost_model()
        n = self.n_measurements
        return ("(estimated: no GPU — kernel times from each build's PTX instruction mix and ptxas "
                f"stats, baseline times from the cost model fitted to {n} measurements"
                + (", i.e. its analytic roofline prior" if n == 0 else "") + ")")

    def _estimate(self, ev, source: str) -> None:
        """The estimator pipeline.record calls for a not_measured row."""
        facts = None
        try:        # the build the harness made, from the build cache (no compile here)
            br = build(BuildSpec(source, arch=self.arch, name="rl"))
            facts = facts_for_build(br) if br.ok else None
        except Exception as e:   # noqa: BLE001 - a missing PTX leaves the flat reward, says why
            ev.detail = (ev.detail + "; " if ev.detail else "") + f"no estimate: {e}"[:300]
        model = self.cost_model()
        base = {b: float(model.predict_baseline_us((ev.shape.M, ev.shape.N, ev.shape.K), b))
                for b in self.baselines}
        add_estimate(ev, facts, base, gpu_for(self.arch), self.mode)

    # -- the reference: the best known time per shape --------------------------------------
    def reference(self, shape) -> float:
        """max(1, the best verified speedup for `shape`): the baseline or our verified best."""
        b = self.best.get(tuple(shape))
        return max(1.0, b.speedup) if b is not None and b.speedup else 1.0

    # -- scoring ----------------------------------------------------------------------------
    def __call__(self, prompts=None, completions=None, M=None, N=None, K=None, **columns):
        return trl_rewards(self.score_attempts, completions, M, N, K, columns)

    def _request(self, source: str, shape, *, every_baseline: bool = False):
        return EvalRequest(source=source, shape=Shape(*shape), arch=self.arch, modes=(self.mode,),
                           baselines=self.all_baselines if every_baseline else self.baselines,
                           origin="rl", timeout_s=self.timeout_s)

    def _lookup(self, req, sha):
        hit = None
        if self.reuse_gpu:      # no GPU here, but this kernel may have been measured on one
            hit = cached(self.db, req, self.reuse_gpu, sha=sha)
        if hit is None:
            hit = cached(self.db, req, self.gpu, sha=sha)
        return hit

    def score(self, completions, shapes, *, turn: int = 1) -> list[float | None]:
        """Rewards for completions (one per shape), attempts logged as one batch."""
        return [a.reward for a in self.score_attempts(completions, shapes, turn=turn)]

    def score_attempts(self, completions, shapes, *, turn: int = 1) -> list[Attempt]:
        exts = [_extract.extract(c) for c in completions]
        attempts: list[Attempt | None] = [None] * len(exts)
        pending: dict[tuple[str, tuple], list[int]] = {}   # one harness call per (sha, shape)
        for i, (ex, shape) in enumerate(zip(exts, shapes)):
            if not ex.ok:
                attempts[i] = Attempt(shape, ex.verdict, PENALTIES[ex.verdict], detail=ex.detail,
                                      source=ex.source, turn=turn)
                continue
            pending.setdefault((source_sha(ex.source), shape), []).append(i)
        evals: dict[tuple[str, tuple], tuple[Any, bool]] = {}
        misses = []
        for key in pending:
            sha, shape = key
            hit = self._lookup(self._request(exts[pending[key][0]].source, shape), sha)
            if hit is not None:
                evals[key] = (hit, True)
            else:
                misses.append(key)
        if misses:
            reqs = [self._request(exts[pending[k][0]].source, k[1]) for k in misses]
            groups = getattr(self.executor, "evaluate_groups", None)
            results = groups(reqs) if groups is not None else self.executor.evaluate_many(reqs)
            for key, ev, req in zip(misses, results, reqs):
                ev.origin = ev.origin or "rl"
                # the harness's one writer: prices a no-GPU row from its build, then stores it
                record(self.db, ev, req.source, estimator=lambda e, s=req.source: self._estimate(e, s))
                evals[key] = (ev, False)
            self.n_evaluated += len(misses)
        self.n_cached += len(pending) - len(misses)
        # winner's curse: a measured kernel that would beat its shape's best known time is
        # measured again in a fresh run; the re-measurement is what counts
        for key, (ev, was_cached) in list(evals.items()):
            ev2 = self._confirm(ev, exts[pending[key][0]].source, key[1])
            if ev2 is not ev:
                evals[key] = (ev2, was_cached)
        self._cap_screened(evals)
        for key, idxs in pending.items():
            ev, was_cached = evals[key]
            self.evaluations[key] = ev
            self._save_source(key[0], exts[idxs[0]].source)
            ref = self.reference(key[1])
            r = reward_for(ev, self.baseline, self.mode, ref)
            cap = ((ev.stats or {}).get("rl") or {}).get("reward_cap")
            if cap is not None and r is not None and ev.stage == "screen":
                r = min(r, cap)
            entry = self._from_table(ev, key[1], exts[idxs[0]].source)
            for j, i in enumerate(idxs):
                attempts[i] = Attempt(
                    key[1], ev.status, r, evaluation_speedup(ev, self.baseline, self.mode),
                    bool(ev.estimated), key[0], ev.id, was_cached or j > 0, ev.detail,
                    dict(ev.build or {}), _winner_baseline(ev, self.mode), exts[i].source,
                    ev.stage, self.verified(ev), ref, _audit_lines(ev), turn,
                    0.0 if ev.estimated else measurement_resolution(ev, self.baseline, self.mode),
                    _median_us(ev, self.mode), bottleneck_hints(ev, self.mode))
                if self.table is not None and ev.status == "not_measured":
                    self._table_attempt(attempts[i], entry)
        tie_within_resolution(attempts)
        with self._lock:
            self.attempts.append(attempts)
            note_bests(attempts, self.best, self.best_estimated)
        return attempts  # type: ignore[return-value]

    def _from_table(self, ev, shape, source: str):
        """No GPU here: the table's entry for this binary at this shape, or None; a kernel the
        table lacks joins the queue the next GPU call screens."""
        if self.table is None or ev.status != "not_measured":
            return None
        entry = self.table.lookup(ev.binary_key, shape)
        if entry is None and self.queue is not None and ev.binary_key:
            self.queue.add(ev.binary_key, shape, ev.source_sha, source)
        return entry

    def _table_attempt(self, a: Attempt, entry) -> None:
        """A hit's reward is its measured time against the table's best at the shape (reward and
        reference from different draws); a miss keeps the flat reward, no speed term."""
        if entry is None:
            a.table = "miss"
            return
        ref_us = self.table.reference_us(a.shape)
        base = self.table.baseline_us(a.shape, self.baseline)
        a.table, a.estimated, a.time_us = "hit", False, entry.reward_us
        a.reward = float(correct_reward(math.log(ref_us / entry.reward_us)))
        a.speedup = base / entry.reward_us if base else ref_us / entry.reward_us
        a.versus = "" if base else "table best"
        a.reference = (base / ref_us) if base else 1.0
        a.resolution = table_resolution(entry)
        a.table_rows = [[d.db, d.row_id] for d in entry.draws]
        a.binary_key, a.gpu_seconds = entry.binary_key, entry.gpu_seconds
        self.table_reads[(entry.binary_key, a.shape)] = entry.gpu_seconds

    def verified(self, ev) -> bool:
        """A final measured row that is a re-measurement (an estimate never is)."""
        if ev.status != "ok" or ev.stage != "final" or ev.estimated:
            return False
        return bool((ev.env or {}).get("rl_remeasure_of"))

    def _confirm(self, ev, source: str, shape):
        """A fresh re-measurement of a measured final that beats the shape's reference."""
        s = evaluation_speedup(ev, self.baseline, self.mode)
        if (not self.remeasure or not self.gpu or ev.estimated or ev.status != "ok"
                or ev.stage != "final" or s is None or s <= self.reference(shape)
                or self.verified(ev)):
            return ev
        req = self._request(source, shape, every_baseline=True)
        again = getattr(self.executor, "remeasure", None)
        ev2 = again(req) if again is not None else self.executor.evaluate_many([req])[0]
        ev2.origin = ev2.origin or "rl"
        ev2.env = {**(ev2.env or {}), "rl_remeasure_of": ev.id or -1,
                   "rl_first_speedup": s}
        record(self.db, ev2, source)
        self.n_remeasured += 1
        return ev2

    def _cap_screened(self, evals) -> None:
        """A screened (non-finalist) row's reward stays below its group's finalist's."""
        finals = {}
        for (sha, shape), (ev, _) in evals.items():
            if ev.stage == "final" and ev.status == "ok":
                finals[(sha, shape)] = ev
        for (sha, shape), (ev, _) in evals.items():
            rl = (ev.stats or {}).get("rl") or {}
            if ev.stage != "screen" or ev.status != "ok" or not rl.get("finalist"):
                continue
            fin = finals.get((rl["finalist"], shape))
            if fin is None:
                continue
            r_fin = reward_for(fin, self.baseline, self.mode, self.reference(shape))
            if r_fin is not None:
                ev.stats = {**ev.stats, "rl": {**rl, "reward_cap": r_fin - SCREENED_MARGIN}}

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
        """Reward mean/std/max, per-group variance and the compiled / correct / faster fractions
        of one step (a group = the attempts at one shape and turn)."""
        attempts = self.attempts[-1] if attempts is None else attempts
        rs = [a.reward for a in attempts if a.reward is not None]
        n = max(len(attempts), 1)
        measured = not self.estimated
        groups: dict[tuple, list[float]] = {}
        for a in attempts:
            if a.reward is not None:
                groups.setdefault((a.shape, a.turn), []).append(a.reward)
        multi = [g for g in groups.values() if len(g) > 1]
        return {
            "n": len(attempts),
            "reward_mean": sum(rs) / len(rs) if rs else None,
            "reward_std": statistics.pstdev(rs) if len(rs) > 1 else (0.0 if rs else None),
            "reward_max": max(rs) if rs else None,
            "groups": len(multi),
            "frac_group_zero_std": (sum(1 for g in multi if max(g) - min(g) < 1e-12) / len(multi)
                                    if multi else None),
            "frac_compiled": sum(a.compiled for a in attempts) / n,
            # without a GPU nothing is checked for correctness: say so instead of guessing
            "frac_correct": sum(a.verdict == "ok" for a in attempts) / n if measured else None,
            "frac_faster": sum(1 for a in attempts if a.speedup and a.speedup > 1.0
                               and a.verdict in ("ok", "not_measured")) / n,
            "estimated": self.estimated,
            "cached": sum(a.cached for a in attempts),
            "table_hits": sum(a.table == "hit" for a in attempts),
            "table_misses": sum(a.table == "miss" for a in attempts),
            "verdicts": {v: sum(a.verdict == v for a in attempts) for v in sorted({a.verdict for a in attempts})},
        }
