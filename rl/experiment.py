"""`python -m cudal2_rl.experiment`: does RL beat search? (issue 13, item 4; docs/experiment.md)

On held-out shapes that no arm trained on, each arm gets the same budget of FRESH harness
evaluations per shape, and the best kernel each arm found is re-measured against the others:

    rl       the RL-trained policy (--rl-policy, the `policy/` folder of a cudal2_rl.train run),
             best of its samples; its training evaluations (read from the run's log.jsonl) are
             charged to it: ceil(training evaluations / held-out shapes) per shape
    rl_full  derived: the RL arm's search cut where a budget charged its whole training on every
             shape would end (its first budget - training evaluations fresh ones)
    sft      the SFT-only policy (--sft-policy, e.g. `builtin`), best of its samples
    tune     `cudal2 tune`'s search (cudal2.search.tune.search: exhaustive when the space fits
             the budget, else evolutionary) over the template families (--families)
    tune_policy  the same over the policy's own action space (--policy-families)
    random   configs drawn uniformly from the same families' space (seeded)

plus, where affordable (a family's whole space for the shape within --exhaustive-max), an
exhaustive search of that family: the reference the regret is measured against. It is not an
arm and its evaluations are counted apart.

Budget accounting (`Budget`): an evaluation is *fresh* for an arm when the arm asks the harness
for a (kernel, shape) it has not asked for before and no row from before this experiment answers
it (cudal2.harness.pipeline.cached, the one cache rule). A repeat of the arm's own kernel is not
charged; a row from before the experiment is `cached`, not fresh and not charged (reported); a
row another arm made during this experiment is charged to this arm too (every arm pays as if it
ran alone). Extraction failures (no kernel in a completion) never reach the harness and cost no
evaluation, only a sample (reported).

Held-out shapes leave out the grid, every policy arm's warm-start shapes and the RL run's
training shapes (each checked); every arm searches once per --seeds seed; the paired table gives
per-shape time ratios of each policy arm vs each tune arm with a bootstrap over shapes x seeds,
and the table fast_1 per arm (docs/experiment.md, "The decisive rules"). A kernel that differs
from one the arm asked for only in its meta or comments (identity.device_sha) is a repeat.

Every candidate goes through the harness (cudal2.harness.pipeline: build, audit and, on a GPU,
screening; one results DB, written only by pipeline.record). On a GPU each arm's winner per shape
(fastest screened) and the exhaustive winner then meet in ONE fresh finals session (the harness's
tournament, cudal2.harness.tournament, one finalist per arm, a failing one replaced by the arm's
next fastest: full correctness suite, kernel time, interleaved rounds, every baseline) and the speedup vs cuBLASLt autotuned is that session's median of paired per-round
ratios with its bootstrap interval. Without a GPU nothing is run: rows are `not_measured`, priced
from each build (rl.estimate, the RL reward's estimator; baselines from the cost model), and
every output says ESTIMATED; there are no finals.

Outputs in --out: results.db, experiment.json (configuration, held-out shapes, the ledger, every
row id), per_shape.csv, table.csv + table.md (per arm and size bucket: geomean speedup with a
bootstrap interval over shapes, regret), experiment.png, README.md.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cudal2.core.build import BuildSpec, build, build_many
from cudal2.core.identity import device_sha, source_sha
from cudal2.harness import provenance
from cudal2.harness.baselines import BaselineError, build_baselines
from cudal2.harness.db import ResultsDB
from cudal2.harness import tournament
from cudal2.harness.pipeline import (ScreenCandidate, cached, evaluate as pipeline_evaluate,
                                     evaluate_many, gpu_pool, screen)
from cudal2.harness.tournament import Entrant, FinalistPolicy, HarnessBackend
from cudal2.harness.types import BASELINES, EvalRequest, Evaluation, Shape
from cudal2.runs.report import BUCKETS, size_bucket
from cudal2.search.costmodel import CostModel, gpu_for
from cudal2.search.tune import enumerate_space, families_for, read_shapes, search
from cudal2.timing.stats import bootstrap_geomean_ci
from cudal2_rl import extract as _extract
from cudal2_rl.estimate import facts_for_build
from cudal2_rl.policy import (SMALL_RECIPE, BuiltinRecipe, default_max_tokens, default_sampling, default_style,
                             is_builtin, load_policy, sample, sampling_device, warm_start_shapes)
from cudal2_rl.prompts import make_prompt
from cudal2_rl.reward import add_estimate, launch_bound

ARMS = ("rl", "sft", "tune", "tune_policy", "random")
RL_FULL = "rl_full"        # the RL arm with its whole training charged to every shape (derived)
POLICY_ARMS = ("rl", "sft")
REFERENCE = "exhaustive"
MODE = "offline"
ESTIMATED_NOTE = ("ESTIMATED: no GPU was visible, so no kernel ran. Kernels were built and "
                  "audited (real verdicts); their times are estimates from each build's PTX and "
                  "ptxas stats (rl.estimate), baselines from the cost model's roofline. These "
                  "are not measurements.")


# ---- the RL run: training shapes and evaluations ----------------------------------------------
@dataclass
class RLRun:
    """What the experiment needs from a cudal2_rl.train run's log.jsonl."""
    log: Path
    shapes: set = field(default_factory=set)      # training shapes (setup record)
    evaluations: int = 0                          # harness evaluations made in training
    how: str = ""                                 # where `evaluations` came from
    style: str = ""                               # prompt style it trained with
    config: dict = field(default_factory=dict)
    estimated: bool = False                       # its rewards were estimates (no GPU)


def read_rl_run(log_path) -> RLRun:
    """Training shapes and the count of training evaluations from a train run's log.jsonl:
    the `done` record's evaluations + re-measurements when the run finished, else every
    attempt that was not served from the cache (a run cut at its budget)."""
    p = Path(log_path)
    if not p.is_file():
        raise ValueError(f"no RL run log at {p}: the RL arm charges the run's training "
                         "evaluations and excludes its training shapes, so it needs the log.jsonl "
                         "of the cudal2_rl.train run that made the policy (pass --rl-log)")
    run = RLRun(p)
    done = None
    from_steps = 0
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}:{i}: not a JSON line ({exc})") from None
        t = rec.get("type")
        if t == "setup":
            run.shapes |= {tuple(int(x) for x in s) for s in rec.get("shapes") or ()}
            run.style = rec.get("style") or run.style
            run.config = rec.get("config") or run.config
        elif t == "step":
            for a in rec.get("attempts") or ():
                if a.get("sha") and not a.get("cached"):
                    from_steps += 1
            run.estimated = run.estimated or bool(rec.get("estimated"))
        elif t == "done":
            done = rec
    if not run.shapes:
        raise ValueError(f"{p}: no `setup` record with the training shapes: not a cudal2_rl.train log")
    if done is not None:
        run.evaluations = int(done.get("evaluations") or 0) + int(done.get("remeasured") or 0)
        run.how = (f"the run's done record: {done.get('evaluations')} evaluations + "
                   f"{done.get('remeasured') or 0} re-measurements")
    else:
        run.evaluations = from_steps
        run.how = f"{from_steps} uncached attempts in the step records (the run has no done record)"
    return run


# ---- held-out shapes ------------------------------------------------------------------------------
def _key(s) -> tuple[int, int, int]:
    return (s.M, s.N, s.K) if hasattr(s, "M") else tuple(int(x) for x in s)


def check_disjoint(heldout, training, what: str = "training") -> None:
    """Raise if any held-out shape is a training shape (naming them)."""
    both = sorted({_key(s) for s in heldout} & {_key(s) for s in training})
    if both:
        raise ValueError(f"held-out set overlaps the {what} shapes on {len(both)} shape(s): "
                         + ", ".join(f"{m}x{n}x{k}" for m, n, k in both[:8])
                         + (" ..." if len(both) > 8 else ""))


def policy_families(name: str, arch: str, *, small_builtin: bool = False) -> list[str]:
    """The template families whose kernels the policy writes (its action space): the built-in
    policy's recipe families; a corpus-taught policy's corpus styles, mapped to the template
    families of that style (CORPUS_FAMILIES)."""
    if is_builtin(name):
        fams = list((SMALL_RECIPE if small_builtin else BuiltinRecipe()).families)
    else:
        from cudal2_rl.corpus import SMALL_TEMPLATES
        from cudal2_rl.policy import ADAPTER_DIR
        folder = ADAPTER_DIR if name in ("smollm2", "") else Path(name).expanduser()
        recipe = folder / "recipe.json"
        rec = json.loads(recipe.read_text()) if recipe.is_file() else {}
        templates = rec.get("templates") or SMALL_TEMPLATES
        fams = list(dict.fromkeys(CORPUS_FAMILIES[t] for t in templates if t in CORPUS_FAMILIES))
    return [f.name for f in families_for(arch, fams)]


# corpus template -> the template family written in the same style (rl/corpus.py's metas:
# wmma* and ptx* are raw mma / inline-PTX mma kernels, wgmma a cp.async + inline-PTX wgmma kernel
# with one tile per CTA as lowlat's, cutlass a CUTLASS 3 builder kernel)
CORPUS_FAMILIES = {"wmma": "mma", "wmma_pipe": "mma", "ptx": "ptx", "ptx_pipe": "ptx",
                   "wgmma": "lowlat", "cutlass": "cutlass_sm90"}


def stratified(shapes, n: int, seed: int) -> list[Shape]:
    """n shapes spread over the size buckets (cudal2.runs.report.BUCKETS): each bucket's shapes
    in a seeded order, taken round-robin from the smallest bucket up; sorted."""
    rng = random.Random(seed)
    by = {name: [] for _, name in BUCKETS}
    for s in shapes:
        by[size_bucket(s.M, s.N, s.K)].append(s)
    for v in by.values():
        rng.shuffle(v)
    out: list[Shape] = []
    while len(out) < n and any(by.values()):
        for name in list(by):
            if by[name] and len(out) < n:
                out.append(by[name].pop(0))
    return sorted(out)


def choose_heldout(*, shapes_file: str, n: int, seed: int, exclude, arch: str,
                   baseline: str = "cublaslt_autotuned", keep_launch_bound: bool = False,
                   explicit: str | None = None, log=print, what: str = "training") -> list[Shape]:
    """The held-out shapes: `explicit` (a shape file, used as is) or `n` drawn from
    `shapes_file`, stratified by size bucket with `seed`, after leaving out `exclude` (training
    shapes) and, unless kept, launch-bound shapes (as training does). Disjointness from
    `exclude` is asserted either way."""
    exclude = {_key(s) for s in exclude}
    if explicit:
        out = sorted(read_shapes(explicit))
        check_disjoint(out, exclude, what)
        return out
    pool = [s for s in read_shapes(shapes_file) if _key(s) not in exclude]
    if not keep_launch_bound:
        bound = launch_bound([_key(s) for s in pool], baseline=baseline, arch=arch)
        if bound:
            log(f"left out {len(bound)} launch-bound shape(s) of {shapes_file} (baseline kernel time "
                f"within 2x the launch floor, by the cost model), e.g. {next(iter(bound.values()))}")
        pool = [s for s in pool if _key(s) not in bound]
    if len(pool) < n:
        raise ValueError(f"{shapes_file}: only {len(pool)} shape(s) left after leaving out "
                         f"{len(exclude)} training shape(s) and launch-bound ones; --heldout {n} "
                         "needs more (another --shapes file, or --keep-launch-bound)")
    out = stratified(pool, n, seed)
    check_disjoint(out, exclude, what)
    return out


# ---- budget accounting ------------------------------------------------------------------------
FRESH, REPEAT, CACHED, OVER = "fresh", "repeat", "cached", "over"


class Budget:
    """Fresh harness evaluations per arm and held-out shape (the module docstring has the rule).
    `allowance(arm)` = per_shape, less the RL arm's training charge
    ceil(rl_training_evaluations / held-out shapes)."""

    def __init__(self, per_shape: int, n_shapes: int, *, rl_training_evaluations: int = 0):
        # fully charged (RL_FULL): every shape carries the whole training, T, not ceil(T / n)
        if per_shape < 1:
            raise ValueError(f"--budget must be >= 1 fresh evaluation per shape, got {per_shape}")
        if n_shapes < 1:
            raise ValueError("no held-out shapes")
        self.per_shape = per_shape
        self.rl_training_evaluations = rl_training_evaluations
        self.rl_charge = math.ceil(rl_training_evaluations / n_shapes) if rl_training_evaluations else 0
        self.spent: dict[tuple, int] = {}
        self.seen: dict[tuple, set] = {}
        self.counts: dict[tuple, dict[str, int]] = {}

    def allowance(self, arm: str) -> int:
        charge = {"rl": self.rl_charge, RL_FULL: self.rl_training_evaluations}.get(arm, 0)
        return max(0, self.per_shape - charge)

    def left(self, arm: str, shape) -> int:
        return self.allowance(arm) - self.spent.get((arm, _key(shape)), 0)

    def admit(self, arm: str, shape, sha: str, *, preexisting: bool) -> str:
        """Classify (and charge) one request of `arm` for kernel `sha` on `shape`; the Harness
        passes the kernel's device_sha, so a kernel that differs from one the arm asked for only
        in its meta or comments is a repeat."""
        k = (arm, _key(shape))
        c = self.counts.setdefault(k, {FRESH: 0, REPEAT: 0, CACHED: 0, OVER: 0})
        seen = self.seen.setdefault(k, set())
        if sha in seen:
            verdict = REPEAT
        elif preexisting:
            verdict = CACHED
        elif self.left(arm, shape) <= 0:
            verdict = OVER
        else:
            verdict = FRESH
            self.spent[k] = self.spent.get(k, 0) + 1
        if verdict != OVER:
            seen.add(sha)
        c[verdict] += 1
        return verdict

    def fresh(self, arm: str, shape) -> int:
        return self.spent.get((arm, _key(shape)), 0)


# ---- the harness, as the experiment uses it -------------------------------------------------------
def row_time(ev) -> float | None:
    """The candidate time an arm ranks its kernels by: screening time on a GPU, the estimate
    without one; None for a kernel that failed."""
    if ev is None:
        return None
    if ev.status == "ok" and ev.stage == "screen":
        t = ((ev.timings or {}).get("screen") or {}).get("candidate") or {}
    elif ev.status == "not_measured" and ev.estimated or ev.status == "ok":
        t = ((ev.timings or {}).get(MODE) or {}).get("candidate") or {}
    else:
        return None
    us = t.get("median_us")
    return float(us) if us and us > 0 else None


class Harness:
    """Arms' requests -> the budget -> cudal2.harness.pipeline -> rows (one DB, one writer).
    Without a GPU: build + audit (evaluate / evaluate_many), priced by `estimate`. With one:
    build, then screening (our templates in one warm worker; policy code one fresh worker per
    kernel, as the RL loop screens it)."""

    def __init__(self, db: ResultsDB, budget: Budget, *, arch: str, acc: str, baseline: str,
                 gpu: str, jobs: int | None = None, timeout_s: float = 120.0, log=print):
        self.db, self.budget, self.arch, self.acc = db, budget, arch, acc
        self.baseline, self.gpu, self.jobs, self.timeout_s, self.log = baseline, gpu, jobs, timeout_s, log
        self.start_rows = db.count()           # rows with an id above this were made here
        self.sources: dict[str, str] = {}
        self.builds: dict[str, object] = {}                # sha -> BuildResult (GPU path)
        self.rows: dict[tuple, Evaluation] = {}            # (sha, shape) -> row made or found here
        self.arm_rows: dict[tuple, list] = {}              # (arm, shape) -> [(sha, verdict, row)]
        self.first_of: dict[tuple, str] = {}               # (arm, shape, device_sha) -> first sha
        self.reference_evaluations = 0
        self._model = None
        self._pools: dict[bool, object] = {}
        self.torch_us: dict[tuple, float] = {}     # screening's torch reference time per shape
        self.finals_notes: list[str] = []
        self.n_measurements = 0

    # -- estimates (no GPU) ----------------------------------------------------------------
    def cost_model(self):
        if self._model is None:
            measured = [e for e in self.db.rows(arch=self.arch) if not e.estimated and e.status == "ok"]
            self.n_measurements = len(measured)
            self._model = CostModel.fit(measured) if measured else CostModel.default(arch=self.arch)
        return self._model

    def estimate(self, ev) -> None:
        """The estimator pipeline.record calls for a not_measured row: the RL reward's
        build-derived estimate (rl.estimate) against the cost model's baseline time."""
        src = self.sources.get(ev.source_sha)
        facts = None
        if src is not None:
            br = build(BuildSpec(src, arch=self.arch, name="experiment"))   # the build cache
            facts = facts_for_build(br) if br.ok else None
        shape = (ev.shape.M, ev.shape.N, ev.shape.K)
        base = {self.baseline: float(self.cost_model().predict_baseline_us(shape, self.baseline))}
        add_estimate(ev, facts, base, gpu_for(self.arch), MODE)

    def _request(self, source: str, shape: Shape, origin: str) -> EvalRequest:
        return EvalRequest(source=source, shape=shape, arch=self.arch, acc=self.acc, modes=(MODE,),
                           baselines=(self.baseline,), origin=origin, timeout_s=self.timeout_s)

    def _pool(self, trusted: bool):
        if trusted not in self._pools:
            # our templates share one warm worker; policy code gets a fresh process per kernel
            self._pools[trusted] = gpu_pool(max_tasks=1000) if trusted else gpu_pool()
        return self._pools[trusted]

    def close(self) -> None:
        for p in self._pools.values():
            p.close()
        self._pools.clear()

    # -- one batch of an arm's kernels for one shape -----------------------------------------
    def run(self, arm: str, shape: Shape, sources: list[str], *, trusted: bool) -> list:
        """Rows for `sources` (None where the arm's budget is spent). The reference
        (exhaustive) batch is not budgeted; every arm's is."""
        origin = f"exp-{arm}"
        out: list = [None] * len(sources)
        todo: dict[str, list[int]] = {}
        ledger: list[tuple[str, str, int]] = []
        alias: list[tuple[int, str]] = []
        for i, src in enumerate(sources):
            sha = source_sha(src)
            self.sources.setdefault(sha, src)
            dev = device_sha(src)
            first = self.first_of.get((arm, _key(shape), dev))
            if first is not None and first != sha and arm != REFERENCE:
                # the same device code as a kernel the arm asked for (only the meta or comments
                # differ): a repeat, answered by that kernel's row, neither charged nor run
                verdict = self.budget.admit(arm, shape, dev, preexisting=False)
                ledger.append((first, verdict, i))
                alias.append((i, first))
                continue
            row = self.rows.get((sha, shape))
            pre = None
            if row is None:
                pre = cached(self.db, self._request(src, shape, origin), self.gpu, sha=sha)
                if pre is not None and (pre.id or 0) > self.start_rows:
                    row, pre = pre, None        # made earlier in this experiment: not "cached"
            if arm == REFERENCE:
                verdict = CACHED if pre is not None else FRESH
            else:
                verdict = self.budget.admit(arm, shape, dev, preexisting=pre is not None)
            if verdict == OVER:
                continue
            self.first_of.setdefault((arm, _key(shape), dev), sha)
            ledger.append((sha, verdict, i))
            if row is not None or pre is not None:
                out[i] = self.rows[(sha, shape)] = row if row is not None else pre
            else:
                todo.setdefault(sha, []).append(i)
        if todo:
            shas = list(todo)
            rows = self._evaluate([sources[todo[s][0]] for s in shas], shape, origin, trusted)
            if arm == REFERENCE:
                self.reference_evaluations += len(shas)
            for sha, row in zip(shas, rows):
                self.rows[(sha, shape)] = row
                for i in todo[sha]:
                    out[i] = row
        for i, first in alias:
            out[i] = self.rows.get((first, shape))
        self.arm_rows.setdefault((arm, _key(shape)), []).extend((sha, v, out[i]) for sha, v, i in ledger)
        return out

    def _evaluate(self, sources: list[str], shape: Shape, origin: str, trusted: bool) -> list:
        reqs = [self._request(s, shape, origin) for s in sources]
        if not self.gpu:
            if len(reqs) == 1:
                return [pipeline_evaluate(reqs[0], db=self.db, gpu=False, estimator=self.estimate)]
            return evaluate_many(reqs, db=self.db, jobs=self.jobs, gpu=False, estimator=self.estimate)
        builds = build_many([BuildSpec(s, arch=self.arch, name=origin) for s in sources], jobs=self.jobs)
        self.builds.update(zip(map(source_sha, sources), builds))     # finals reuse them
        rows, ref = screen(shape, [ScreenCandidate(s, b, (), origin) for s, b in zip(sources, builds)],
                           arch=self.arch, acc=self.acc, db=self.db, pool=self._pool(trusted),
                           gpu=True, trusted=trusted, timeout_s=self.timeout_s,
                           reference_us=self.torch_us.get(_key(shape)))
        if ref.get("torch_us"):       # measured once per shape, reused by later screens
            self.torch_us.setdefault(_key(shape), ref["torch_us"])
        return rows

    def derive_prefix(self, arm: str, of: str, shape: Shape) -> None:
        """`arm` = what `of` had found when its first allowance(arm) fresh evaluations were spent
        (RL_FULL: the RL arm's search cut where a budget charged the whole training would end).
        Its ledger counts come from that prefix; nothing is run."""
        k = (of, _key(shape))
        limit, rows, fresh = self.budget.allowance(arm), [], 0
        c = {FRESH: 0, REPEAT: 0, CACHED: 0, OVER: 0}
        for sha, verdict, row in self.arm_rows.get(k, []):
            if verdict == FRESH:
                if fresh >= limit:
                    break
                fresh += 1
            rows.append((sha, verdict, row))
            c[verdict] += 1
        self.arm_rows[(arm, _key(shape))] = rows
        self.budget.counts[(arm, _key(shape))] = c
        self.budget.spent[(arm, _key(shape))] = fresh

    def best(self, arm: str, shape: Shape):
        """(row, sha) of the arm's fastest kernel for `shape` (screened or estimated), or (None, '')."""
        cands = [(row_time(r), sha, r) for sha, _v, r in self.arm_rows.get((arm, _key(shape)), [])
                 if r is not None and row_time(r) is not None]
        if not cands:
            return None, ""
        t, sha, r = min(cands, key=lambda c: (c[0], c[1]))
        return r, sha

    def finals(self, shape: Shape, arms, lt_known: dict) -> dict[str, Evaluation]:
        """GPU: the harness's tournament (cudal2.harness.tournament) over every arm's screened
        kernels: each arm's fastest (arms: the arms' names, or a dict keyed by them) meets the
        others in ONE fresh interleaved finals session against every baseline; an arm whose
        finalist fails sends its next fastest. Rows recorded through the one writer, never
        served from the cache. Returns {arm: its finalist's final row}."""
        entrants = []
        for arm in arms:
            seen = set()
            for sha, _v, row in self.arm_rows.get((arm, _key(shape)), []):
                if row is None or sha in seen:
                    continue
                seen.add(sha)
                entrants.append(Entrant(EvalRequest(source=self.sources[sha], shape=shape, arch=self.arch,
                                                    acc=self.acc, modes=(MODE,), baselines=BASELINES,
                                                    origin="exp-finals", timeout_s=self.timeout_s),
                                        self.builds.get(sha), group=arm, screened=row))
        try:
            libs = build_baselines(self.arch)
        except BaselineError as exc:          # measure still times torch and says why
            self.log(f"  baselines: {exc}")
            libs = None
        backend = HarnessBackend(db=self.db, cache=False, gpu=True, baseline_libs=libs,
                                 lt_known=lt_known, trusted=False)
        res = tournament.run(shape, entrants, backend, FinalistPolicy(per_group=True),
                             reference_us=self.torch_us.get(_key(shape)))
        if res.sessions > 1:
            self.finals_notes.append(f"{shape}: {len(res.replaced)} failing finalist(s) replaced "
                                     f"by their arm's next fastest")
        out = {}
        for arm in arms:
            won = res.winner(arm)
            if won is not None:
                out[arm] = won[1]
        return out


# ---- the arms -----------------------------------------------------------------------------------
@dataclass
class PolicyArm:
    arm: str
    name: str                  # what the user passed
    model: object
    tok: object
    style: str
    max_new_tokens: int
    temperature: float = 1.0
    min_p: float = 0.05
    samples: dict = field(default_factory=dict)       # shape -> completions drawn
    no_code: dict = field(default_factory=dict)       # shape -> extraction failures


def arm_settings(name: str, run_config: dict | None = None) -> tuple[str, int, float, float]:
    """(prompt style, new tokens, temperature, min_p) an arm samples with: what its policy saw
    in training (the RL run's config where it set them, else the defaults of the policy it
    started from), so the default small model gets the brief prompt it was warm-started on and
    is not drawn at temperature 1, where it builds 0 of 16."""
    cfg = run_config or {}
    base = cfg.get("policy") or name
    temperature, min_p = default_sampling(base, cfg.get("temperature"), cfg.get("min_p"))
    return (default_style(base), int(cfg.get("max_completion_length") or 0) or default_max_tokens(base),
            temperature, min_p)


def load_arm_policy(arm: str, name: str, *, style: str = "", max_new_tokens: int = 0,
                    small_builtin: bool = False, run_config: dict | None = None,
                    log=print) -> PolicyArm:
    recipe = SMALL_RECIPE if small_builtin else BuiltinRecipe()
    try:
        import transformers
        transformers.utils.logging.disable_progress_bar()
    except Exception:       # noqa: BLE001 - cosmetic only
        pass
    try:
        model, tok = load_policy(name, recipe=recipe, log=log)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--{arm}-policy {name!r}: {exc}") from None
    model.to(sampling_device()).eval()
    d_style, d_tokens, temperature, min_p = arm_settings(name, run_config)
    return PolicyArm(arm, name, model, tok, style or d_style, max_new_tokens or d_tokens, temperature, min_p)


def run_policy_arm(pa: PolicyArm, shape: Shape, harness: Harness, *, samples: int, max_rounds: int,
                   arch: str, acc: str, baseline: str, seed: int):
    """Best of B: draw up to `samples` completions a round (no more than the fresh evaluations
    left), extract, evaluate; again while budget is left (repeats and extraction failures
    spend none), at most `max_rounds` rounds."""
    prompt = make_prompt(pa.style, shape, arch, acc, baseline=baseline)
    for rnd in range(max_rounds):
        left = harness.budget.left(pa.arm, shape)
        if left <= 0:
            break
        k = min(samples, left)
        texts = sample(pa.model, pa.tok, [prompt], n=k, max_new_tokens=pa.max_new_tokens,
                       temperature=pa.temperature, min_p=pa.min_p,
                       seed=seed * 100003 + rnd * 1009 + shape.M * 7 + shape.N * 3 + shape.K)
        pa.samples[shape] = pa.samples.get(shape, 0) + len(texts)
        srcs = []
        for t in texts:
            ex = _extract.extract(t)
            if ex.ok:
                srcs.append(ex.source)
            else:
                pa.no_code[shape] = pa.no_code.get(shape, 0) + 1
        if srcs:
            harness.run(pa.arm, shape, srcs, trusted=False)


def fitting_space(shape: Shape, arch: str, families, acc: str) -> list[tuple]:
    """(family, config) for every config of `families` that serves `shape`."""
    out = []
    for fam in families_for(arch, families):
        out += [(fam, c) for c in enumerate_space(fam, arch=arch, acc=acc)
                if fam.serves(c, shape.M, shape.N, shape.K)]
    return out


def run_random_arm(shape: Shape, harness: Harness, *, arch: str, acc: str, families, seed: int):
    space = fitting_space(shape, arch, families, acc)
    rng = random.Random(f"random-{seed}-{shape.M}x{shape.N}x{shape.K}")
    k = min(harness.budget.left("random", shape), len(space))
    picks = rng.sample(space, k)
    harness.run("random", shape, [fam.instantiate(c) for fam, c in picks], trusted=True)


def run_tune_arm(shape: Shape, harness: Harness, *, arch: str, acc: str, families, seed: int, log,
                 arm: str = "tune"):
    """cudal2.search.tune.search with the experiment's harness as its evaluate function (arm
    tune_policy: the same over the policy's own families)."""

    def evaluate(req, db=None, pool=None):
        row = harness.run(arm, shape, [req.source], trusted=True)[0]
        if row is None:      # search never asks past its budget_evals; say so if it did
            return Evaluation(status="error", source_sha=source_sha(req.source), shape=shape,
                              arch=arch, detail="experiment budget spent")
        if row.stage == "screen" and row.status == "ok":
            # search ranks by timings[modes[0]]: hand it the screening time under that key
            # (a copy for search's ranking only; the stored row is unchanged)
            row = dataclasses.replace(row, timings={MODE: (row.timings or {}).get("screen") or {}})
        return row

    model = CostModel.default(arch=arch)
    return search(shape, arch, families=families, acc=acc, budget_evals=harness.budget.left(arm, shape),
                  budget_s=1e9, strategy="auto", seed=seed, model=model, modes=(MODE,),
                  baselines=(harness.baseline,), db=None, evaluate=evaluate, log=log)


def run_reference(shape: Shape, harness: Harness, *, arch: str, acc: str, families, cap: int):
    """Exhaustive search of each family whose space for `shape` has at most `cap` configs.
    Returns {family: configs evaluated or the reason it was not affordable}."""
    out = {}
    for fam in families_for(arch, families):
        space = [c for c in enumerate_space(fam, arch=arch, acc=acc) if fam.serves(c, shape.M, shape.N, shape.K)]
        if len(space) > cap:
            out[fam.name] = f"not affordable: {len(space)} configs > --exhaustive-max {cap}"
            continue
        harness.run(REFERENCE, shape, [fam.instantiate(c) for c in space], trusted=True)
        out[fam.name] = len(space)
    return out


def reference_note(reference: dict, cap: int) -> str:
    """One line: per family, on how many shapes the exhaustive reference ran, and where it was
    not affordable (with the space sizes)."""
    parts = []
    fams = sorted({f for r in reference.values() for f in r})
    for f in fams:
        ran = [r[f] for r in reference.values() if isinstance(r.get(f), int)]
        sizes = [int(r[f].split()[2]) for r in reference.values() if isinstance(r.get(f), str)]
        if ran:
            parts.append(f"{f} exhaustive on {len(ran)} shape(s) ({sum(ran)} configs)")
        if sizes:
            parts.append(f"{f} not affordable on {len(sizes)} shape(s) (space {min(sizes)}-{max(sizes)} "
                         f"configs > --exhaustive-max {cap})")
    return "; ".join(parts) if parts else "no exhaustive reference"


# ---- results ------------------------------------------------------------------------------------
def shape_rows(shape: Shape, seed: int, fin: dict, arms, budget: Budget, policies: dict,
               baseline: str) -> list[dict]:
    """per_shape.csv's rows for one (seed, shape): each arm's winner (its finals row on a GPU)."""
    out = []
    ref_us = candidate_us(fin.get(REFERENCE))
    for arm in arms:
        ev = fin.get(arm)
        s, lo, hi = speedup_of(ev, baseline)
        c = budget.counts.get((arm, _key(shape)), {})
        us = candidate_us(ev)
        pa = policies.get(arm)
        out.append({
            "M": shape.M, "N": shape.N, "K": shape.K, "bucket": size_bucket(shape.M, shape.N, shape.K),
            "seed": seed, "arm": arm, "budget": budget.allowance(arm), "fresh": budget.fresh(arm, shape),
            "cached": c.get(CACHED, 0), "repeats": c.get(REPEAT, 0), "over": c.get(OVER, 0),
            "samples": pa.samples.get(shape, 0) if pa else "", "no_code": pa.no_code.get(shape, 0) if pa else "",
            "winner_sha": ev.source_sha[:16] if ev is not None else "",
            "winner_status": ev.status if ev is not None else "no kernel",
            "correct": correct(ev), "vs_lt": speedup_of(ev, FAST_BASELINE)[0],
            "time_us": us, "speedup": s, "lo": lo, "hi": hi,
            "regret": (us / ref_us - 1.0) if us and ref_us else None,
            "row_id": ev.id if ev is not None else ""})
    return out


def speedup_of(ev, baseline: str) -> tuple[float | None, float | None, float | None]:
    """(speedup, lo, hi) vs `baseline` of a finals row (the paired-ratio median and its
    bootstrap interval) or an estimated row (no interval)."""
    if ev is None:
        return None, None, None
    s = ((ev.speedups or {}).get(MODE) or {}).get(baseline)
    if not s:
        return None, None, None
    iv = (((ev.stats or {}).get(MODE) or {}).get("speedup") or {}).get(baseline) or {}
    return float(s), iv.get("lo"), iv.get("hi")


def candidate_us(ev) -> float | None:
    t = (((ev.timings or {}).get(MODE) or {}).get("candidate") or {}).get("median_us") if ev else None
    return float(t) if t else None


def summarise(per_shape: list[dict], arms, *, seed: int = 0) -> list[dict]:
    """Per arm and size bucket (and all): geomean speedup with a bootstrap interval over shapes,
    mean regret where an exhaustive reference exists, fresh evaluations used."""
    rows = []
    for arm in arms:
        mine = [r for r in per_shape if r["arm"] == arm]
        for _, bucket in BUCKETS + ((None, "all"),):
            sub = [r for r in mine if bucket == "all" or r["bucket"] == bucket]
            if not sub:
                continue
            sp = [r["speedup"] for r in sub if r["speedup"]]
            g = lo = hi = None
            if sp:
                g, lo, hi = bootstrap_geomean_ci(sp, seed=seed)
            reg = [r["regret"] for r in sub if r["regret"] is not None]
            f1, _n = fast_1(sub, arm)
            rows.append({"arm": arm, "bucket": bucket, "shapes": len(sub), "with_kernel": len(sp),
                         "fast_1": f1,
                         "geomean_speedup": g, "lo": lo, "hi": hi,
                         "mean_regret": sum(reg) / len(reg) if reg else None, "regret_shapes": len(reg),
                         "fresh_per_shape": sum(r["fresh"] for r in sub) / len(sub),
                         "budget_per_shape": sub[0]["budget"]})
    return rows


FAST_BASELINE = "cublaslt_autotuned"      # KernelBench's fast_1 is against the strongest library


def correct(ev) -> bool:
    """The winner passed: a measured final row (status ok), or, without a GPU, a built and
    audited kernel whose estimate stands in (status not_measured, estimated)."""
    return ev is not None and (ev.status == "ok" or (ev.status == "not_measured" and bool(ev.estimated)))


def fast_1(per_shape: list[dict], arm: str) -> tuple[float | None, int]:
    """(fraction, n) of the arm's (shape, seed) rows whose winner is correct and faster than
    cuBLASLt autotuned (KernelBench's fast_1; no kernel counts as not fast)."""
    mine = [r for r in per_shape if r["arm"] == arm]
    if not mine:
        return None, 0
    return sum(1 for r in mine if r.get("correct") and (r.get("vs_lt") or 0) > 1.0) / len(mine), len(mine)


def paired(per_shape: list[dict], a: str, b: str, *, seed: int = 0, n_boot: int = 2000) -> dict | None:
    """Arm `a` vs arm `b` on the same (shape, seed): ratio = b's winner time / a's (> 1: a is
    faster), both against the same baseline. Geomean over every pair with a percentile bootstrap
    over shapes x seeds: shapes resampled, then each drawn shape's seeds resampled."""
    t = {(r["M"], r["N"], r["K"], r.get("seed", 0), r["arm"]): r.get("time_us") for r in per_shape}
    by_shape: dict[tuple, list[float]] = {}
    unpaired = 0
    for (m, n, k, sd, arm), ta in t.items():
        if arm != a:
            continue
        tb = t.get((m, n, k, sd, b))
        if ta and tb:
            by_shape.setdefault((m, n, k), []).append(math.log(tb / ta))
        elif (m, n, k, sd, b) in t:
            unpaired += 1
    if not by_shape:
        return None
    logs = [x for v in by_shape.values() for x in v]
    g = math.exp(sum(logs) / len(logs))
    rng = random.Random(seed)
    shapes = list(by_shape.values())
    means = []
    for _ in range(n_boot):
        draw = []
        for _s in range(len(shapes)):
            v = shapes[rng.randrange(len(shapes))]
            draw += [v[rng.randrange(len(v))] for _ in v]
        means.append(sum(draw) / len(draw))
    means.sort()
    lo, hi = means[int(0.025 * (n_boot - 1))], means[int(math.ceil(0.975 * (n_boot - 1)))]
    return {"a": a, "b": b, "ratio": g, "lo": math.exp(lo), "hi": math.exp(hi), "pairs": len(logs),
            "shapes": len(by_shape), "unpaired": unpaired,
            "a_faster": sum(1 for x in logs if x > 0)}


def paired_table(per_shape: list[dict], arms, *, seed: int = 0) -> list[dict]:
    """Every policy arm (rl, rl_full, sft) against every tune arm present."""
    out = []
    for a in (x for x in ("rl", RL_FULL, "sft") if x in arms):
        for b in (x for x in ("tune", "tune_policy") if x in arms):
            p = paired(per_shape, a, b, seed=seed)
            if p is not None:
                out.append(p)
    return out


def _f(x, spec=".3f") -> str:
    return "" if x is None else format(x, spec)


def write_outputs(out: Path, *, per_shape: list[dict], table: list[dict], estimated: bool,
                  baseline: str, meta: dict, command: str) -> dict:
    est = " (ESTIMATED, no GPU: not measurements)" if estimated else ""
    kind = "estimated" if estimated else "measured"
    with (out / "per_shape.csv").open("w", newline="") as f:
        cols = ["M", "N", "K", "bucket", "seed", "arm", "budget", "fresh", "cached", "repeats", "over",
                "samples", "no_code", "winner_sha", "winner_status", "correct", "vs_lt", "time_us", "speedup", "lo", "hi",
                "regret", "row_id", "values"]
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in per_shape:
            w.writerow({**r, "values": kind, **{k: _f(r[k], ".4f") for k in ("time_us", "speedup", "lo", "hi", "regret", "vs_lt")}})
    with (out / "table.csv").open("w", newline="") as f:
        cols = ["arm", "bucket", "shapes", "with_kernel", "fast_1", "geomean_speedup", "lo", "hi",
                "mean_regret", "regret_shapes", "fresh_per_shape", "budget_per_shape", "values"]
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in table:
            w.writerow({**r, "values": kind, **{k: _f(r[k], ".4f") for k in
                                                 ("geomean_speedup", "lo", "hi", "mean_regret", "fresh_per_shape", "fast_1")}})
    title = f"RL vs search on {meta['n_shapes']} held-out shapes: geomean speedup vs {baseline}{est}"
    md = [f"# {title}", ""]
    if estimated:
        md += [f"**{ESTIMATED_NOTE}**", ""]
    md += ["| arm | bucket | shapes x seeds | with a kernel | fast_1 | geomean speedup | 95% interval | mean regret (shapes) | fresh evals / shape (budget) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        iv = f"[{_f(r['lo'])}, {_f(r['hi'])}]" if r["lo"] is not None else ""
        reg = f"{_f(r['mean_regret'])} ({r['regret_shapes']})" if r["mean_regret"] is not None else "n/a"
        md.append(f"| {r['arm']} | {r['bucket']} | {r['shapes']} | {r['with_kernel']} | {_f(r.get('fast_1'), '.2f')} | "
                  f"{_f(r['geomean_speedup'])} | {iv} | {reg} | {_f(r['fresh_per_shape'], '.1f')} ({r['budget_per_shape']}) |")
    md += ["", "Speedup = " + ("the estimated baseline time / the estimated kernel time of each arm's "
                               "best-estimated kernel" if estimated else
                               "the median over interleaved rounds of baseline time / kernel time in one "
                               "fresh finals session per shape holding every arm's winner (kernel timer)")
           + "; geomean over shapes with a kernel, interval = percentile bootstrap over those shapes "
           "(cudal2.timing.stats.bootstrap_geomean_ci). Regret = the arm's winner time / the exhaustive "
           "winner's - 1, only where an exhaustive search was affordable.", ""]
    if meta.get("paired"):
        md += ["## Paired: the same shape and seed, the same baseline", "",
               "| arm | vs | geomean time ratio (>1: arm faster) | 95% interval (shapes x seeds) | pairs (shapes) | arm faster | unpaired |",
               "|---|---|---|---|---|---|---|"]
        md += [f"| {p['a']} | {p['b']} | {_f(p['ratio'])} | [{_f(p['lo'])}, {_f(p['hi'])}] | {p['pairs']} "
               f"({p['shapes']}) | {p['a_faster']} | {p['unpaired']} |" for p in meta["paired"]]
        md += ["", "Ratio = the tune arm's winner time / the policy arm's on the same (shape, seed); "
               "interval = percentile bootstrap resampling shapes, then each drawn shape's seeds. "
               "Unpaired: (shape, seed) where one of the two found no kernel (fast_1 counts those). "
               f"fast_1 = the fraction of (shape, seed) whose winner is correct and faster than {FAST_BASELINE} "
               "(KernelBench)" + (" -- estimated: 'correct' means built and audited" if estimated else "") + ".", ""]
    md += [f"- {line}" for line in meta["notes"]]
    md += ["", f"Made by: `{command}`"]
    (out / "table.md").write_text("\n".join(md) + "\n")
    png = plot(table, out / "experiment.png", estimated=estimated, baseline=baseline)
    readme = [f"# {title}", "",
              (f"**{ESTIMATED_NOTE}**" if estimated else
               "Measured: every number is from kernel-timer finals on the GPU named in experiment.json."),
              "", f"Command: `{command}`", "",
              "Files: `table.md` / `table.csv` (per arm and size bucket), `per_shape.csv` (per arm and "
              "held-out shape: budget, fresh evaluations, the winner and its numbers), `experiment.png`, "
              "`experiment.json` (configuration, held-out shapes, the budget ledger, row ids), `results.db` "
              "(every harness row; `cudal2 report --compare --db` reads it).", ""]
    readme += [f"- {line}" for line in meta["notes"]]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    return {"md": "\n".join(md), "png": png}


def plot(table: list[dict], path: Path, *, estimated: bool, baseline: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    buckets = [b for _, b in BUCKETS + ((None, "all"),) if any(r["bucket"] == b for r in table)]
    arms = list(dict.fromkeys(r["arm"] for r in table))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(buckets) + 2), 4.5))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        xs, ys, err = [], [], [[], []]
        for i, b in enumerate(buckets):
            r = next((r for r in table if r["arm"] == arm and r["bucket"] == b), None)
            if r is None or r["geomean_speedup"] is None:
                continue
            xs.append(i + (j - (len(arms) - 1) / 2) * width)
            ys.append(r["geomean_speedup"])
            err[0].append(r["geomean_speedup"] - r["lo"])
            err[1].append(r["hi"] - r["geomean_speedup"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=arm)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([f"{b} flop" if b != "all" else "all" for b in buckets])
    ax.set_ylabel(f"geomean speedup vs {baseline}")
    ax.set_title("RL vs search, held-out shapes" + (" - ESTIMATED (no GPU), not measured" if estimated
                                                     else " (kernel-timer finals)"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- the command --------------------------------------------------------------------------------
def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rl-policy", default=None, help="the RL-trained policy: the policy/ folder of a "
                   "cudal2_rl.train run (its log.jsonl next to it names the training shapes and "
                   "evaluations); omit to leave the RL arm out")
    p.add_argument("--rl-log", default=None, help="that run's log.jsonl (default: <rl-policy>/../log.jsonl)")
    p.add_argument("--sft-policy", default="builtin", help="the SFT-only policy: 'builtin', a local model "
                   "folder, or a HF name in the local cache ('' = leave the SFT arm out)")
    p.add_argument("--small-builtin", action="store_true", help="'builtin' means the small test recipe")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="arms to run")
    p.add_argument("--shapes", default="shapes/llm_trace.csv", help="shapes to draw the held-out set from "
                   "(grid shapes and every policy's warm-start shapes are left out)")
    p.add_argument("--heldout", type=int, default=32, help="held-out shapes drawn (stratified by size bucket)")
    p.add_argument("--heldout-shapes", default=None, help="an explicit held-out shape file instead of drawing")
    p.add_argument("--exclude-shapes", nargs="*", default=[], help="more training shape files to keep out "
                   "of the held-out set (e.g. an SFT corpus's shapes)")
    p.add_argument("--keep-launch-bound", action="store_true", help="allow launch-bound shapes in the held-out set")
    p.add_argument("--budget", type=int, default=16, help="fresh harness evaluations per arm per held-out shape")
    p.add_argument("--samples", type=int, default=0, help="completions drawn per round by a policy arm "
                   "(0 = the budget)")
    p.add_argument("--max-rounds", type=int, default=4, help="sampling rounds per shape for a policy arm "
                   "that repeats itself")
    p.add_argument("--families", nargs="+", default=["mma", "ptx"], help="template families for tune, "
                   "random and exhaustive (default: the built-in policy's families)")
    p.add_argument("--policy-families", nargs="+", default=None, help="the tune_policy arm's families: "
                   "the policy's own action space (default: what the RL (else SFT) policy was taught to "
                   "write, policy_families)")
    p.add_argument("--exhaustive-max", type=int, default=64, help="exhaustive search of a family's space "
                   "for a shape only up to this many configs")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--acc", default="f32", choices=("f32", "f16"))
    p.add_argument("--baseline", default="cublaslt_autotuned", choices=BASELINES)
    p.add_argument("--temperature", type=float, default=None, help="every policy arm's sampling "
                   "temperature (default: what the arm's policy sampled with in training)")
    p.add_argument("--min-p", type=float, default=None, help="every policy arm's min_p (default: as "
                   "--temperature)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per harness evaluation")
    p.add_argument("--jobs", type=int, default=0, help="parallel builds (0 = CUDAL2_BUILD_JOBS)")
    p.add_argument("--db", default=None, help="results DB (default --out/results.db)")
    p.add_argument("--budget-s", type=float, default=0, help="wall-clock limit: shapes not started by then "
                   "are left out of every arm and listed (0 = none)")
    p.add_argument("--seed", type=int, default=0, help="the held-out draw's seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="each arm's search is run once "
                   "per seed (policy sampling, tune, random); intervals are over shapes x seeds")
    p.add_argument("--out", default="runs/experiment")


def run(args, *, command: str = "") -> dict:
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = provenance.gpu_name() or "" if provenance.gpu_visible() else ""
    estimated = not gpu
    log_lines: list[str] = []

    def log(line: str = "") -> None:
        print(line, flush=True)
        log_lines.append(line)

    arms = [a for a in ARMS if a in args.arms]
    if not args.rl_policy and "rl" in arms:
        arms.remove("rl")
        log("RL arm left out: no --rl-policy")
    if not args.sft_policy and "sft" in arms:
        arms.remove("sft")
        log("SFT arm left out: --sft-policy ''")
    if not arms:
        raise ValueError("no arm to run")
    if estimated:
        log(f"cudal2_rl.experiment: {ESTIMATED_NOTE}")
    notes: list[str] = []
    # training shapes: the RL run's (asserted disjoint), plus any declared
    exclude: set = set()
    rl_run = None
    if "rl" in arms:
        rl_log = Path(args.rl_log) if args.rl_log else Path(args.rl_policy).expanduser().parent / "log.jsonl"
        rl_run = read_rl_run(rl_log)
        exclude |= rl_run.shapes
        notes.append(f"RL run {rl_log}: {len(rl_run.shapes)} training shape(s), {rl_run.evaluations} "
                     f"training evaluations ({rl_run.how})"
                     + ("; its rewards were ESTIMATED (no GPU), charged as if they were fresh GPU "
                        "evaluations" if rl_run.estimated else ""))
    for f in args.exclude_shapes:
        exclude |= {_key(s) for s in read_shapes(f)}
    # held out from every warm start: the grid (the built-in SFT's) and each policy's own
    warm: dict[str, set] = {"the grid": set(_grid())}
    for arm, name in (("sft", args.sft_policy), ("rl", rl_run.config.get("policy") if rl_run else None)):
        if arm in arms and name:
            shapes_w, where = warm_start_shapes(name)
            warm[f"{arm} warm start"] = shapes_w
            notes.append(f"{arm} warm-start shapes: {len(shapes_w)} from {where}")
    for v in warm.values():
        exclude |= v
    heldout = choose_heldout(shapes_file=args.shapes, n=args.heldout, seed=args.seed, exclude=exclude,
                             arch=args.arch, baseline=args.baseline, keep_launch_bound=args.keep_launch_bound,
                             explicit=args.heldout_shapes, log=log,
                             what="grid, warm-start or training")
    if rl_run is not None:
        check_disjoint(heldout, rl_run.shapes, "RL training")
    for what, shapes_w in warm.items():
        check_disjoint(heldout, shapes_w, what)
    notes.append(f"held-out: {len(heldout)} shape(s) "
                 + (f"from {args.heldout_shapes}" if args.heldout_shapes else
                    f"drawn from {args.shapes} (stratified by size bucket, seed {args.seed})")
                 + f", disjoint from {len(exclude)} grid, warm-start and training shape(s) (checked: "
                 + ", ".join(f"{w} {len(v)}" for w, v in warm.items())
                 + (f", RL training {len(rl_run.shapes)}" if rl_run else "") + ")")
    budget = Budget(args.budget, len(heldout),
                    rl_training_evaluations=rl_run.evaluations if rl_run else 0)
    notes.append(f"budget: {args.budget} fresh harness evaluations per arm per shape"
                 + (f"; the RL arm is charged ceil({budget.rl_training_evaluations} training evaluations / "
                    f"{len(heldout)} shapes) = {budget.rl_charge} per shape, leaving it "
                    f"{budget.allowance('rl')}" if "rl" in arms else ""))
    if "rl" in arms and budget.allowance("rl") == 0:
        notes.append("the RL arm's training already spent its whole budget: it evaluates nothing here")
    policies: dict[str, PolicyArm] = {}
    if "sft" in arms:
        policies["sft"] = load_arm_policy("sft", args.sft_policy, small_builtin=args.small_builtin, log=log)
        if is_builtin(args.sft_policy):
            grid = {(m, n, k) for m, n, k in _grid()}
            seen = [s for s in heldout if _key(s) in grid]
            if seen:
                notes.append(f"the built-in SFT warm start paired {len(seen)}/{len(heldout)} held-out "
                             "shapes with the cost model's top configs (its corpus covers the whole "
                             "1000-shape grid; tune and random start from the same cost model); "
                             "`--shapes shapes/llm_trace.csv --exclude-shapes shapes.csv` holds out "
                             "shapes off that grid")
    if "rl" in arms:
        cfg = rl_run.config or {}
        policies["rl"] = load_arm_policy("rl", args.rl_policy, style=rl_run.style,
                                         small_builtin=args.small_builtin, run_config=cfg, log=log)
    for pa in policies.values():
        if args.temperature is not None:
            pa.temperature = args.temperature
        if args.min_p is not None:
            pa.min_p = args.min_p
        notes.append(f"{pa.arm} policy {pa.name} ({pa.style} prompts, {pa.max_new_tokens} new tokens, "
                     f"temperature {pa.temperature:g}, min_p {pa.min_p:g})")
    if "tune_policy" in arms:
        own = args.policy_families or policy_families(
            (rl_run.config.get("policy") if rl_run else "") or args.sft_policy or "builtin", args.arch,
            small_builtin=args.small_builtin)
        notes.append(f"tune_policy searches the policy's own action space: {' '.join(own)}")
    if "rl" in arms:
        arms.insert(arms.index("rl") + 1, RL_FULL)
        notes.append(f"{RL_FULL}: the RL arm's search cut where a budget charged its whole training "
                     f"({budget.rl_training_evaluations} evaluations) on every shape would end: "
                     f"{budget.allowance(RL_FULL)} fresh per shape (rl: amortised, {budget.rl_charge} per shape)")
    notes.append(f"tune, random and exhaustive search the families {' '.join(args.families)} on {args.arch}")

    db_path = Path(args.db) if args.db else out / "results.db"
    db = ResultsDB(db_path)
    harness = Harness(db, budget, arch=args.arch, acc=args.acc, baseline=args.baseline, gpu=gpu,
                      jobs=args.jobs or None, timeout_s=args.timeout, log=log)
    log(f"cudal2_rl.experiment: arms {', '.join(arms)} on {len(heldout)} held-out shape(s) "
        f"({', '.join(map(str, heldout))}), {args.budget} fresh evaluations per arm and shape, "
        f"{'GPU ' + gpu if gpu else 'no GPU (estimated)'}; results DB {db_path}")
    samples = args.samples or args.budget
    reference: dict[tuple, dict] = {}
    cut: list[tuple] = []
    per_shape: list[dict] = []
    ledger: list[dict] = []
    lt_known = db.baseline_choices()
    seeds = list(dict.fromkeys(args.seeds))
    todo = [(sd, shape) for sd in seeds for shape in heldout]
    try:
        for i, (sd, shape) in enumerate(todo, 1):
            if args.budget_s and time.time() - t0 > args.budget_s:
                cut = [(x, _key(s)) for x, s in todo[i - 1:]]
                log(f"--budget-s {args.budget_s:g} reached: {len(cut)} (seed, shape) run(s) not started, "
                    "left out of every arm")
                break
            if shape == heldout[0]:          # a seed starts: every arm searches afresh
                budget = Budget(args.budget, len(heldout), rl_training_evaluations=budget.rl_training_evaluations)
                harness.budget = budget
                harness.arm_rows = {k: v for k, v in harness.arm_rows.items() if k[0] == REFERENCE}
                harness.first_of = {}
                for pa in policies.values():
                    pa.samples, pa.no_code = {}, {}
            ts = time.time()
            for arm in arms:
                if arm in policies:
                    run_policy_arm(policies[arm], shape, harness, samples=samples, max_rounds=args.max_rounds,
                                   arch=args.arch, acc=args.acc, baseline=args.baseline, seed=sd)
                    if arm == "rl":
                        harness.derive_prefix(RL_FULL, "rl", shape)
                elif arm in ("tune", "tune_policy"):
                    run_tune_arm(shape, harness, arch=args.arch, acc=args.acc, seed=sd, log=lambda *a: None,
                                 families=args.families if arm == "tune" else own, arm=arm)
                elif arm == "random":
                    run_random_arm(shape, harness, arch=args.arch, acc=args.acc, families=args.families,
                                   seed=sd)
            if _key(shape) not in reference:
                reference[_key(shape)] = run_reference(shape, harness, arch=args.arch, acc=args.acc,
                                                       families=args.families, cap=args.exhaustive_max)
            winners = {a: harness.best(a, shape)[1] for a in arms + [REFERENCE]}
            winners = {a: s for a, s in winners.items() if s}
            if gpu and winners:
                fin = harness.finals(shape, winners, lt_known)
            else:
                fin = {a: harness.best(a, shape)[0] for a in winners}
            per_shape += shape_rows(shape, sd, fin, arms, budget, policies, args.baseline)
            ledger += [{"arm": a, "seed": sd, "shape": list(_key(shape)), **budget.counts.get((a, _key(shape)), {}),
                        "fresh_charged": budget.fresh(a, shape)} for a in arms]
            log(f"[{i}/{len(todo)}] seed {sd} {shape} ({size_bucket(shape.M, shape.N, shape.K)}) in "
                f"{time.time() - ts:.0f}s: " + "; ".join(
                    f"{a} {budget.fresh(a, shape)}/{budget.allowance(a)} fresh, "
                    + (f"{_f(speedup_of(fin.get(a), args.baseline)[0])}x" if fin.get(a) is not None else "no kernel")
                    for a in arms))
    finally:
        harness.close()
    done = [s for s in heldout if any(r["M"] == s.M and r["N"] == s.N and r["K"] == s.K for r in per_shape)]
    table = summarise(per_shape, arms, seed=args.seed)
    pairs = paired_table(per_shape, arms, seed=args.seed)
    notes.append("regret: " + reference_note(reference, args.exhaustive_max))
    notes.append(f"reference (exhaustive) evaluations, not charged to any arm: {harness.reference_evaluations}")
    if gpu:
        notes.append(f"finals: one fresh interleaved kernel-timer session per shape holding every arm's "
                     f"winner and every baseline ({gpu})")
    else:
        notes.append("no finals: no GPU (winners are each arm's best-estimated kernel)")
    notes += harness.finals_notes
    if cut:
        notes.append(f"--budget-s cut {len(cut)} (seed, shape) run(s), left out of every arm: "
                     + ", ".join(f"seed {x} {m}x{n}x{k}" for x, (m, n, k) in cut))
    cmd = command or "python -m cudal2_rl.experiment " + " ".join(sys.argv[1:])
    meta = {"n_shapes": len(done), "notes": notes, "seeds": seeds, "paired": pairs}
    res = write_outputs(out, per_shape=per_shape, table=table, estimated=estimated, baseline=args.baseline,
                        meta=meta, command=cmd)
    doc = {"command": cmd, "estimated": estimated, "gpu": gpu, "arms": arms, "config": vars(args),
           "heldout": [_key(s) for s in done], "cut": [[x, *s] for x, s in cut], "seeds": seeds,
           "heldout_excluded": {w: len(v) for w, v in warm.items()},
           "paired": pairs,
           "training_shapes_excluded": sorted(exclude),
           "rl_run": dataclasses.asdict(rl_run) if rl_run else None,
           "budget": {"per_shape": budget.per_shape, "rl_charge": budget.rl_charge,
                      "rl_training_evaluations": budget.rl_training_evaluations,
                      "allowance": {a: budget.allowance(a) for a in arms},
                      "ledger": ledger},
           "reference": {f"{m}x{n}x{k}": v for (m, n, k), v in reference.items()},
           "reference_evaluations": harness.reference_evaluations,
           "per_shape": per_shape, "table": table, "notes": notes, "log": log_lines,
           "seconds": round(time.time() - t0, 1)}
    (out / "experiment.json").write_text(json.dumps(doc, indent=1, default=str))
    print()
    print(res["md"])
    print(f"\noutputs in {out}: table.md, table.csv, per_shape.csv, experiment.png, README.md, "
          f"experiment.json, {db_path.name}" + ("  -- ESTIMATED (no GPU), not measured" if estimated else ""))
    return doc


def _grid():
    from cudal2_rl.policy import grid_shapes
    return grid_shapes()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cudal2_rl.experiment",
                                description="Does RL beat search? Arms at an equal budget of fresh "
                                            "evaluations on held-out shapes (docs/experiment.md).")
    configure_parser(p)
    args = p.parse_args(argv)
    try:
        run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"cudal2_rl.experiment: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
