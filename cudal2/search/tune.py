"""Search over the reference kernel families, per shape (`cudal2 tune`).

The space of a family is the product of its `space()` filtered by `valid()` for the arch. A config is built
once and serves every shape it `serves()` (kernels take M, N, K at run time), so the build farm
works on the *union* of candidates over a shape list, deduplicated by source, never once per
shape. Per shape the search is exhaustive when the accepted space fits the evaluation budget,
otherwise evolutionary (population seeded by the cost model's ranking, mutate the best one
parameter at a time) or purely cost-model-ranked. Evaluations go through
`cudal2.harness.evaluate` (cached in the results DB); without a GPU the harness answers
`not_measured` and the search falls back to cost-model estimates, which it labels as such.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cudal2 import templates
from cudal2.core import knobs
from cudal2.core.build import BuildSpec, build_many
from cudal2.core.devices import gpu_for
from cudal2.core.identity import source_sha
from cudal2.core.toolchain import ToolchainError, detect_arch, find_toolchain
from cudal2.core.shapefile import check_sizes, open_csv, reader as shape_reader
from cudal2.core.vocab import INSTRUCTIONS, LAYOUTS
from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import evaluate as pipeline_evaluate, gpu_pool
from cudal2.harness.provenance import gpu_visible
from cudal2.harness.types import BASELINES, MODES, EvalRequest, Shape
from cudal2.search.costmodel import CostModel, kernel_facts
from cudal2.templates.budget import (DEEPK, TILED, budget, is_decode, is_deep_k,
                                     problems_on_arch, ruled)
from cudal2.templates.streamk import streamk_register_estimate
from cudal2.templates import MAX_ENUMERATE, enumerate_space  # noqa: F401  (tune's public names)

MAX_OPTIONS = 8                # runtime-option combinations a plan keeps per (shape, build)
# A decode shape (a budgeted family's small dimension <= 64): each budgeted family's builds
# whose budget holds for some option, best budget time first, join the shape's picks, each with
# every option whose budget holds (issue 50: hundreds of candidates per decode row for one call).
DECODE_BUILDS = 24
# ... and while a decode row holds fewer than DECODE_SCREENINGS (config, options) pairs, the next
# admissible configs by budget time join too, at most DECODE_MAX_BUILDS per family: a
# row whose best configs admit few options (few split counts fill its waves) still gets the
# search the issue asks for.
# The plan aims DECODE_MARGIN over it: campaign prepare's recheck with ptxas's registers drops a
# few (fewer registers than the estimate can put one more CTA on an SM, and a split-K grid then
# ends in a partial wave: 6 of 5811 planned screenings of the 2026-11-29 RC pack).
DECODE_SCREENINGS = 200
DECODE_MARGIN = 1.05
DECODE_MAX_BUILDS = 64
# Families a decode shape is not planned for: the general mma.sync kernels pad M to 64+ rows and
# read B by tiles. On the H200's 24 RC decode rows (2026-11-26, rc-call1, screening kernel time)
# the best mma screening was 1.47-3.77x the row's best (median 2.05x), ptx 1.53-5.45x (median 2.22x);
# the streaming families and the low-latency ones won every row. cutlass_sm90's pipeline depth is
# CUTLASS's choice at compile time (the shared memory its epilogue leaves), so its configs
# cannot declare the streaming budget a decode candidate must meet (issue 50).
DECODE_SKIP = ("mma", "ptx", "cutlass_sm90", "streamk")
# The deep-K families (issue 51) are planned where their work is: a deep-K row
# (budget.is_deep_k: few tiles, deep K). Elsewhere a grid of the whole output's tiles has the GPU
# to itself, and a launch-bound shape's K is short: lowlat's plain grid serves it with less. On a
# deep-K row each keeps the options whose budget covers the resident slots with a reduction no
# larger than the operands, one per distinct grid (on a row where the family has fewer such
# options than DEEP_K_SCREENINGS, 128x128x2048 among the targets: those within the reduction's
# bound); its best DEEP_K_BUILDS configs by budget time join the picks, then the configs other
# rows already build, then more until the row holds DEEP_K_SCREENINGS (config, options) pairs
# (at most DEEP_K_MAX_BUILDS new builds of the family).
DEEP_K_BUILDS = 8
DEEP_K_SCREENINGS = 100
# An option must meet the rule DEEP_K_REGISTER_SPREAD registers either side of the estimate
# (_registers_around), so campaign prepare's recheck with ptxas's figure keeps it.
DEEP_K_REGISTER_SPREAD = 48
DEEP_K_MAX_BUILDS = 40


# --- shape files -----------------------------------------------------------------------------
def read_shapes(path) -> list[Shape]:
    """`M,N,K[,...]` CSV (extra columns ignored) -> shapes, in file order, duplicates dropped."""
    seen, out = set(), []
    with open_csv(path) as f:
        for i, row in enumerate(shape_reader(f, path), start=2):
            try:
                s = Shape(*check_sizes((int(row["M"]), int(row["N"]), int(row["K"])), path, i))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{i}: bad shape row {row}: {exc}") from None
            if s not in seen:
                seen.add(s)
                out.append(s)
    return out


def shapes_layout(path, requested: str | None = None) -> str:
    """The B layout to plan for a shapes file: its `layout` column (one value for every row,
    e.g. RC in a `cudal2 shapes --model` file) or `requested`; RR when neither says. A file whose
    rows disagree, or a request that contradicts the file, is a ValueError naming both."""
    with open_csv(path) as f:
        found = {(r.get("layout") or "").strip() for r in shape_reader(f, path, ())} - {""}
    bad = sorted(found - set(LAYOUTS))
    if bad:
        raise ValueError(f"{path}: layout column holds {bad}; layouts are {LAYOUTS}")
    if len(found) > 1:
        raise ValueError(f"{path}: rows have layouts {sorted(found)}; plan one layout per file")
    if found and requested and requested not in found:
        raise ValueError(f"{path}: its rows say layout {found.pop()}, but --layout {requested} was asked")
    return found.pop() if found else (requested or "RR")


# --- the space ---------------------------------------------------------------------------------
def families_for(arch: str, names: Iterable[str] | None = None) -> list[Any]:
    """The families to search: `names` (all must exist and support `arch`) or every one that does."""
    fams = templates.FAMILIES
    if names:
        out = []
        for n in names:
            if n not in fams:
                raise ValueError(f"unknown family {n!r}; known: {sorted(fams)}")
            if arch not in fams[n].arches:
                raise ValueError(f"family {n!r} does not target {arch} (it targets {fams[n].arches})")
            out.append(fams[n])
        return out
    return [f for f in fams.values() if arch in f.arches]


def config_meta(config) -> dict:
    """What the cost model reads from a config before it is built."""
    d = {k: v for k, v in config.params}
    d["style"] = config.family
    return d


@dataclass
class Candidate:
    family: str
    config: Any
    source: str
    shapes: list[Shape] = field(default_factory=list)   # the shapes this one build serves
    build: Any = None                                     # BuildResult once built
    # per served shape: the runtime options (kernel ABI 2) worth timing, best predicted first;
    # [{}] for ABI 1 builds (one way to call them)
    options: dict[Shape, list[dict]] = field(default_factory=dict)
    # the deep-K rows where no option of the family covers the slots: the reduction's bound alone
    reduction_only: set = field(default_factory=set)

    @property
    def label(self) -> str:
        return self.config.label()

    def keep_within_budget(self, arch: str) -> int:
        """Once built: drop the decode shapes' options whose streaming budget fails with ptxas's
        registers (the plan screened them with the family's estimate), and the shapes left with
        none. Returns how many (shape, options) screenings were dropped."""
        if self.build is None or not self.build.ok:
            return 0
        dropped = 0
        for shape in list(self.shapes):
            if not ruled(self.family, shape.M, shape.N, shape.K):
                continue
            kept = [o for o in self.options.get(shape, [{}]) if not problems_on_arch(
                self.config, shape, arch, options=o, registers=self.build.max_registers,
                slots=shape not in self.reduction_only)]
            dropped += len(self.options.get(shape, [{}])) - len(kept)
            if kept:
                self.options[shape] = kept
            else:
                self.shapes.remove(shape)
                self.options.pop(shape, None)
        return dropped


@dataclass
class BuildPlan:
    arch: str
    shapes: list[Shape]
    candidates: list[Candidate]            # unique by source
    per_shape: dict[Shape, list[Candidate]]
    pairs: int                             # (shape, candidate) pairs: what per-shape builds would cost
    evaluations: int = 0                   # (shape, candidate, options) triples: what the GPU times
    acc: str = "f32"
    layout: str = "RR"

    def sweeps(self, shape: Shape) -> list[tuple[Candidate, dict]]:
        """What to time for `shape`: (candidate, runtime options) pairs, per candidate in the
        order plan() ranked them (best predicted first)."""
        return [(c, o) for c in self.per_shape.get(shape, []) for o in c.options.get(shape, [{}])]


def plan(shapes: list[Shape], arch: str, *, families: Iterable[str] | None = None,
         limit_per_shape: int | None = None, model: CostModel | None = None,
         acc: str = "f32", layout: str = "RR", max_options: int | None = MAX_OPTIONS,
         per_family: int | None = None, progress: Callable | None = None,
         decode_builds: int = DECODE_BUILDS, jobs: int | None = None) -> BuildPlan:
    """Candidates for every shape, deduplicated: one Candidate per distinct source, planned for
    one (accumulator, layout) target. Runtime options are not build parameters, so a build is
    planned once and carries, per shape it serves, the option combinations worth timing:
    all of them (after dropping combinations CUTLASS runs identically on that shape) when there
    are at most `max_options` (None: no cap), else the cost model's best `max_options`.
    With `limit_per_shape` each shape keeps its best configs by the cost model's prior, a
    config scored by its best option combination. With `per_family` every family that serves a
    shape gets that many of its own best configs (its first default among them when it serves
    the shape), and `limit_per_shape` becomes the least a shape gets, filled with the best of the
    rest: the prior's error is largest across families, so none is left untimed. `progress(shape)`
    is called as each shape is planned (ranking the options is the slow part: ~85 s for a
    Llama-3 8B file). On a decode shape the streaming families (cudal2.templates.budget) keep
    only the options whose budget holds (in flight per SM, the last wave's fill), and their best
    `decode_builds` configs of each family by budget time join the picks with all of those
    options, then more while the row holds fewer than DECODE_SCREENINGS (`_decode_picks`).
    jobs > 1: the rows' options are ranked in that many forked processes (`_ranked_rows`; the
    same plan, in about 1/jobs of the time)."""
    model = model or CostModel.default()
    fams = families_for(arch, families)
    by_source: dict[str, Candidate] = {}
    per_shape: dict[Shape, list[Candidate]] = {}
    pairs = evaluations = 0
    # enumerate_space keeps the configs valid for this arch (a deep pipeline may fit sm_90a's
    # shared memory only), so `serves` below may skip re-validating each config for each shape
    spaces = [(fam, enumerate_space(fam, arch=arch, acc=acc, layout=layout)) for fam in fams]
    src_of: dict[Any, str] = {}
    priced = _Options(model, selecting=bool(limit_per_shape or per_family))
    for shape, (fitting, ranked, relaxed) in zip(shapes, _ranked_rows(shapes, spaces, arch, priced, jobs)):
        decode = [fc for fc in fitting if is_decode(fc[0].name, shape.M, shape.N, shape.K)]
        deep = [fc for fc in fitting if fc[0].name in DEEPK and is_deep_k(shape.M, shape.N, shape.K)]
        times = {cfg: r[0][0] for cfg, r in ranked.items() if r}
        if per_family:
            fitting = _pick_per_family(fitting, shape, model, per_family, limit_per_shape or 0,
                                       src_of, times=times)
        elif limit_per_shape:
            fitting = _pick(fitting, shape, model, limit_per_shape, src_of, times=times)
        if decode:
            fitting = _decode_picks(fitting, decode, ranked, decode_builds, max_options)
        if deep:
            fitting = _decode_picks(fitting, deep, ranked, DEEP_K_BUILDS, max_options,
                                    target=DEEP_K_SCREENINGS, most=DEEP_K_MAX_BUILDS,
                                    built=frozenset(src_of))
        cands = []
        for fam, cfg in fitting:
            src = src_of.get(cfg)
            if src is None:
                src = src_of[cfg] = fam.instantiate(cfg)
            cand = by_source.get(src)
            if cand is None:
                cand = by_source[src] = Candidate(fam.name, cfg, src)
            if shape not in cand.shapes:
                cand.shapes.append(shape)
            if fam.name in relaxed:
                cand.reduction_only.add(shape)
            opts = [o for _, o in ranked[cfg]]
            keep_all = not max_options or ruled(fam.name, shape.M, shape.N, shape.K)
            cand.options[shape] = opts if keep_all else opts[:max_options]
            evaluations += len(cand.options[shape])
            cands.append(cand)
        per_shape[shape] = cands
        pairs += len(cands)
        if progress is not None:
            progress(shape)
    return BuildPlan(arch, list(shapes), list(by_source.values()), per_shape, pairs, evaluations,
                     acc, layout)


class _Options:
    """A config's runtime options ranked at a row by the cost model. What does not depend on the
    row is kept across rows: each config's meta, and per (config, decode row) its option space
    and their facts."""

    def __init__(self, model: CostModel, selecting: bool):
        self.model, self.selecting = model, selecting
        self.metas: dict[Any, dict] = {}
        self.spaces: dict[Any, list[dict]] = {}
        self.facts: dict[Any, list] = {}

    def rank(self, fam, cfg, shape: Shape, decode: bool) -> list[tuple[float, dict]]:
        """(predicted us, options) of `cfg` at `shape`, best first (NaN: one way to call it, and
        no selection asked for a ranking)."""
        key = (cfg, decode)
        if cfg not in self.metas:
            self.metas[cfg] = config_meta(cfg)
        if key not in self.spaces:
            self.spaces[key] = fam.option_space(cfg, decode=decode)
            self.facts[key] = [kernel_facts(self.metas[cfg], None, o) for o in self.spaces[key]]
        if self.selecting or len(self.spaces[key]) > 1:
            return self.model.rank_options(self.metas[cfg], None, shape, self.spaces[key],
                                           facts=self.facts[key])
        return [(float("nan"), dict(self.spaces[key][0]))]


def _rank_row(shape: Shape, spaces: list, arch: str, priced: _Options) -> tuple[list, dict, set]:
    """One row's (family, config) pairs that serve it with an option left, each config's ranked
    options (a ruled row's: those within the budget, _within_budget), and the deep-K families
    ranked within the reduction's bound alone (_reduction_only)."""
    M, N, K = shape.M, shape.N, shape.K
    # the budget's row rules depend on the family and the row alone: once per family here
    decode_of = {fam.name: is_decode(fam.name, M, N, K) for fam, _ in spaces}
    ruled_of = {fam.name: ruled(fam.name, M, N, K) for fam, _ in spaces}
    fitting = [(fam, c) for fam, cfgs in spaces for c in cfgs if fam.serves(c, M, N, K, checked=True)]
    if any(decode_of[fam.name] for fam, _ in fitting):
        fitting = [fc for fc in fitting if fc[0].name not in DECODE_SKIP]
    if not is_deep_k(M, N, K):
        fitting = [fc for fc in fitting if fc[0].name not in DEEPK]
    ranked: dict[Any, list[tuple[float, dict]]] = {}
    unranked: dict[Any, list[tuple[float, dict]]] = {}     # a ruled row's before the rule
    for fam, cfg in fitting:
        ranked[cfg] = priced.rank(fam, cfg, shape, decode_of[fam.name])
        if ruled_of[fam.name]:
            unranked[cfg] = ranked[cfg]
            ranked[cfg] = _within_budget(cfg, shape, arch, ranked[cfg])
    relaxed = _reduction_only(fitting, ranked, unranked, shape, arch)
    return [fc for fc in fitting if ranked[fc[1]]], ranked, relaxed


_FORKED: tuple = ()     # what a forked ranking process reads: (shapes, spaces, arch, _Options, index)


def _ranked_rows(shapes: list[Shape], spaces: list, arch: str, priced: _Options, jobs: int | None):
    """Each row's _rank_row, in the rows' order: in this process, or with jobs > 1 in that many
    forked processes. A row's ranking reads the row and the spaces alone (what the plan picks
    from it depends on the rows before and stays here), and the same code on the same inputs
    computes the same floats in any process: the plan is the same."""
    jobs = min(jobs or 1, len(shapes))
    if (jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods()
            or multiprocessing.current_process().daemon):      # a pool's worker has no children
        for shape in shapes:
            yield _rank_row(shape, spaces, arch, priced)
        return
    global _FORKED
    index = {cfg: (fi, ci) for fi, (_, cfgs) in enumerate(spaces) for ci, cfg in enumerate(cfgs)}
    _FORKED = (shapes, spaces, arch, priced, index)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for fitting, ranked, relaxed in pool.imap(_rank_forked, range(len(shapes))):
                # the configs are sent as their places in `spaces`: back to this process's objects
                yield ([(spaces[fi][0], spaces[fi][1][ci]) for fi, ci in fitting],
                       {spaces[fi][1][ci]: r for (fi, ci), r in ranked}, relaxed)
    finally:
        _FORKED = ()


def _rank_forked(i: int) -> tuple[list, list, set]:
    """_rank_row of row `i` in a forked process, its configs as their places in the spaces."""
    shapes, spaces, arch, priced, index = _FORKED
    fitting, ranked, relaxed = _rank_row(shapes[i], spaces, arch, priced)
    return [index[cfg] for _, cfg in fitting], [(index[cfg], r) for cfg, r in ranked.items()], relaxed


def _within_budget(cfg, shape: Shape, arch: str, ranked: list, slots: bool = True) -> list:
    """A ruled row's (budget.ruled) ranked options of a budgeted config that meet the budget on
    every GPU of `arch` (slots: problems_on_arch's); of a tile grid's options that the budget
    runs alike (wgmma's raster and swizzle on a grid one tile tall order its tiles the same;
    streamk's split count 0 and the one it picks), the first."""
    kept, seen = [], set()
    for t, o in ranked:
        if cfg.family in TILED + DEEPK:   # the alike first: one budget, not one per GPU
            b = budget(cfg, shape, gpu_for(arch), options=o)
            key = (b.decomposition, b.grid, b.splits, b.units, round(b.t_us, 6))
            if key in seen:
                continue
            seen.add(key)
        if not any(problems_on_arch(cfg, shape, arch, options=o, slots=slots, registers=r)
                   for r in _registers_around(cfg)):
            kept.append((t, o))
    return kept


def _reduction_only(fitting: list, ranked: dict, unranked: dict, shape: Shape, arch: str) -> set:
    """The deep-K families whose options that cover the slots on this row are fewer than the
    sweep's DEEP_K_SCREENINGS (128x128x2048: 64 in the whole sm_90a RR space): their options
    re-ranked within the reduction's bound alone (in `ranked`; by budget time, so those that
    cover the slots still come first); their names."""
    out = set()
    for name in DEEPK:
        mine = [cfg for fam, cfg in fitting if fam.name == name and cfg in unranked]
        if mine and sum(len(ranked[cfg]) for cfg in mine) < DEEP_K_SCREENINGS:
            out.add(name)
            for cfg in mine:
                ranked[cfg] = _within_budget(cfg, shape, arch, unranked[cfg], slots=False)
    return out


def _registers_around(cfg) -> tuple[int, ...]:
    """The register counts a deep-K family's option must meet the rule at before its build: the
    estimate and DEEP_K_REGISTER_SPREAD either side (its fit's residuals), so that ptxas's
    figure, somewhere in between, keeps it (a stream-K grid is the resident slots: one CTA per
    SM more doubles its reduction). Other families: the estimate (0)."""
    if cfg.family not in DEEPK:
        return (0,)
    r = streamk_register_estimate(cfg.as_dict())
    return (r, max(32, r - DEEP_K_REGISTER_SPREAD), min(255, r + DEEP_K_REGISTER_SPREAD))


def _decode_picks(fitting: list, decode: list, ranked: dict, builds: int,
                  max_options: int | None, target: int = DECODE_SCREENINGS,
                  most: int = DECODE_MAX_BUILDS, built: frozenset = frozenset()) -> list:
    """A decode (or deep-K) row's picks: `fitting` plus each budgeted family's best `builds`
    configs by budget time, then, while the row holds fewer than `target` x DECODE_MARGIN
    (config, options) pairs, the configs other rows already build (`built`: they add
    screenings, not builds), then the next best across the families (at most `most` new builds
    a family)."""
    budgeted = {fam.name for fam, _ in decode}       # every option kept (plan's keep_all)

    def screenings(picks):
        return sum(len(ranked[cfg]) if fam.name in budgeted or not max_options
                   else min(len(ranked[cfg]), max_options) for fam, cfg in picks)

    order = sorted(decode, key=lambda fc: ranked[fc[1]][0][0])
    taken: dict[str, int] = {}
    picks = list(fitting)
    for fc in order:
        n = taken.get(fc[0].name, 0)
        if n < builds:
            taken[fc[0].name] = n + 1
            if fc not in picks:
                picks.append(fc)
    for fc in sorted(order, key=lambda fc: fc[1] not in built):   # stable: by time within each
        if screenings(picks) >= target * DECODE_MARGIN:
            break
        n = taken.get(fc[0].name, 0)
        if fc not in picks and (fc[1] in built or n < most):
            taken[fc[0].name] = n + (fc[1] not in built)
            picks.append(fc)
    return picks


def _pick(fitting: list, shape: Shape, model: CostModel, limit: int, chosen_elsewhere,
          per_tie: int = 2, times: dict | None = None) -> list:
    """A shape's `limit` candidates: best predicted first, among near-ties (within 2%) a config
    another shape already chose (one build serves more shapes), and at most `per_tie` from one
    near-tie group before the next group gets a turn: configs the model cannot tell apart (on
    the H100 plan, four cluster shapes of one tile) would otherwise fill every slot; and a
    slot for the best config of the highest-ceiling instruction serving the shape. `times`:
    each config's predicted time (default: the model at its default options)."""
    ranked = []
    for fc in fitting:
        t = times[fc[1]] if times and fc[1] in times else model.predict_us(config_meta(fc[1]), None, shape)
        ranked.append(((round(math.log(t) / math.log(1.02)), fc[1] not in chosen_elsewhere), fc))
    ranked.sort(key=lambda r: r[0])
    first, rest, per_group = [], [], {}
    for (group, _), fc in ranked:
        n = per_group.get(group, 0)
        (first if n < per_tie else rest).append(fc)
        per_group[group] = n + 1
    order = first + rest
    picked = order[:limit]
    # The instruction with the highest ceiling that serves the shape always gets a slot: the
    # prior's error is largest across instructions (H100 campaign of 2026-11-23: four skinny
    # deep-K shapes were packed with mma.sync split-K alone, predicted 11 us, measured 40 us,
    # 0.2-0.57x cuBLAS; no wgmma build was timed on them). Its best config replaces the last
    # slot; the other way round (mma.sync where wgmma builds lead) would spend a slot on a
    # ceiling measured at ~0.3 of the peak.
    top = max((INSTRUCTIONS.index(f.instruction) for f, _ in order), default=0)
    if len(picked) >= 2 and all(INSTRUCTIONS.index(f.instruction) < top for f, _ in picked):
        picked[-1] = next(fc for fc in order if INSTRUCTIONS.index(fc[0].instruction) == top)
    return picked


def _pick_per_family(fitting: list, shape: Shape, model: CostModel, quota: int, least: int,
                     chosen_elsewhere, times: dict) -> list:
    """Every family's best `quota` configs for the shape (by `_pick` within the family, so
    near-tie spreading holds), its first default among them when it serves the shape (the
    H100 campaign of 2026-11-23 never timed the wgmma 128x256 default: the prior ranked it
    below smaller tiles everywhere), then the best of the rest until the shape has `least`;
    best predicted first."""
    by_family: dict[str, list] = {}
    for fc in fitting:
        by_family.setdefault(fc[0].name, []).append(fc)
    picked = []
    for group in by_family.values():
        mine = _pick(group, shape, model, quota, chosen_elsewhere, times=times)
        fam, some = group[0][0], group[0][1]
        default = fam.default().with_(LAYOUT=some.get("LAYOUT"))
        default = default.with_(ACC=some.get("ACC")) if "ACC" in some.as_dict() else default
        served = next((fc for fc in group if fc[1] == default), None)
        if served is not None and served not in mine:
            mine = (mine[:-1] if len(mine) >= quota else mine) + [served]
        picked += mine
    if len(picked) < least:
        rest = [fc for fc in fitting if fc not in picked]
        picked += _pick(rest, shape, model, least - len(picked), chosen_elsewhere, times=times)
    return sorted(picked, key=lambda fc: times[fc[1]])


# --- the build farm ------------------------------------------------------------------------------
class _PeakRss:
    """Peak summed RSS of this process's children (the nvcc trees), sampled."""

    def __init__(self, period: float = 0.25):
        self.peak = 0
        self._stop = threading.Event()
        self._period = period
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            import psutil
        except ImportError:
            return
        me = psutil.Process()
        while not self._stop.wait(self._period):
            total = 0
            for p in me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


@dataclass
class BuildReport:
    arch: str
    shapes: int
    pairs: int                  # (shape, candidate) pairs
    unique: int                 # distinct sources = builds needed
    cached: int                 # of those, answered by the cache
    compiled: int
    failed: int
    seconds: float
    peak_rss_bytes: int         # summed RSS of concurrent compiler processes (sampled)
    max_child_rss_bytes: int    # largest single child process (getrusage)
    jobs: int
    failures: list[str] = field(default_factory=list)

    def text(self) -> str:
        return (f"{self.unique} unique candidates for {self.shapes} shapes ({self.pairs} shape x "
                f"candidate pairs) on {self.arch}: {self.compiled} compiled, {self.cached} cached, "
                f"{self.failed} failed, {self.seconds:.1f} s with {self.jobs} jobs, peak compiler "
                f"memory {self.peak_rss_bytes / 2**30:.2f} GiB (largest process "
                f"{self.max_child_rss_bytes / 2**30:.2f} GiB)")


def build_plan(p: BuildPlan, *, jobs: int | None = None, progress: Callable | None = None,
               timeout: float = 900) -> BuildReport:
    """Build every candidate of a plan in parallel (cudal2.core.build.build_many); fills cand.build."""

    jobs = jobs or knobs.build_jobs()
    try:   # resolve the toolchain once, before the build threads race to set it up
        find_toolchain()
    except ToolchainError:
        pass   # every build then reports toolchain_error with the reason
    # base flags only (families need no others), so these builds share cache entries with everyone else's
    specs = [BuildSpec(c.source, arch=p.arch, name=c.label) for c in p.candidates]
    start = time.perf_counter()
    with _PeakRss() as peak:
        results = build_many(specs, jobs=jobs, timeout=timeout, progress=progress)
    seconds = time.perf_counter() - start
    for c, r in zip(p.candidates, results):
        c.build = r
    failures = [f"{c.label}: {r.status}" for c, r in zip(p.candidates, results) if not r.ok]
    return BuildReport(
        arch=p.arch, shapes=len(p.shapes), pairs=p.pairs, unique=len(results),
        cached=sum(r.cached for r in results), compiled=sum(not r.cached and r.ok for r in results),
        failed=len(failures), seconds=seconds, peak_rss_bytes=peak.peak,
        max_child_rss_bytes=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        jobs=jobs, failures=failures)


# --- search ------------------------------------------------------------------------------------------
@dataclass
class Trial:
    config: Any
    family: str
    status: str
    time_us: float | None        # measured median, or the model's estimate when `estimated`
    estimated: bool
    source_sha: str = ""


@dataclass
class SearchResult:
    shape: Shape
    strategy: str
    trials: list[Trial]
    seconds: float

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.time_us is not None]
        return min(ok, key=lambda t: (t.estimated, t.time_us)) if ok else None


def _mutate(cfg, family, space: dict, rng: random.Random, tries: int = 20, arch: str | None = None):
    """One parameter moved to a neighbouring value (or, sometimes, any value): local search."""
    names = [n for n in space if len(space[n]) > 1]
    for _ in range(tries):
        n = rng.choice(names)
        vals = list(space[n])
        cur = cfg.get(n)
        i = vals.index(cur) if cur in vals else 0
        j = i + rng.choice((-1, 1)) if rng.random() < 0.8 else rng.randrange(len(vals))
        if 0 <= j < len(vals) and vals[j] != cur:
            new = cfg.with_(**{n: vals[j]})
            if family.valid(new, arch):
                return new
    return None


def search(shape: Shape, arch: str, *, families: Iterable[str] | None = None,
           acc: str = "f32", layout: str = "RR",
           budget_evals: int = 32, budget_s: float = 600.0, strategy: str = "auto",
           population: int = 8, seed: int = 0, model: CostModel | None = None,
           modes: tuple[str, ...] = ("offline",), baselines: tuple[str, ...] = BASELINES,
           db=None, pool=None, evaluate: Callable | None = None, log: Callable = print) -> SearchResult:
    """Search one shape. strategy: auto | exhaustive | evolutionary | model."""

    evaluate = evaluate or pipeline_evaluate
    if strategy not in ("auto", "exhaustive", "evolutionary", "model"):
        raise ValueError(f"unknown strategy {strategy!r}")
    model = model or CostModel.default()
    rng = random.Random(seed)
    fams = {f.name: f for f in families_for(arch, families)}
    space = {name: [c for c in enumerate_space(f, arch=arch, acc=acc, layout=layout)
                    if f.serves(c, shape.M, shape.N, shape.K, checked=True)]
             for name, f in fams.items()}
    everything = [(n, c) for n, cs in space.items() for c in cs]
    if not everything:
        raise ValueError(f"no candidate of {sorted(fams)} serves shape {shape} on {arch}")
    if strategy == "auto":
        strategy = "exhaustive" if len(everything) <= budget_evals else "evolutionary"
    ranked = sorted(everything, key=lambda nc: model.predict_us(config_meta(nc[1]), None, shape))
    mode = modes[0]
    start = time.perf_counter()
    trials: list[Trial] = []
    done: set = set()

    def run(name, cfg) -> Trial | None:
        if cfg in done or len(trials) >= budget_evals or time.perf_counter() - start > budget_s:
            return None
        done.add(cfg)
        src = fams[name].instantiate(cfg)
        ev = evaluate(EvalRequest(source=src, shape=shape, arch=arch, modes=modes,
                                  baselines=baselines, origin="tune"), db=db, pool=pool)
        med = ((ev.timings.get(mode) or {}).get("candidate") or {}).get("median_us")
        if ev.status == "ok" and med and not ev.estimated:
            t = Trial(cfg, name, ev.status, float(med), False, ev.source_sha)
        elif ev.status == "not_measured":          # built and audited, no GPU: the model guesses
            t = Trial(cfg, name, ev.status, model.predict_us(config_meta(cfg), ev.build, shape), True,
                      ev.source_sha)
        else:
            t = Trial(cfg, name, ev.status, None, False, ev.source_sha or source_sha(src))
        trials.append(t)
        log(f"  {shape} {cfg.label()} -> {t.status}"
            + (f" {t.time_us:.2f} us{' (estimated)' if t.estimated else ''}" if t.time_us else ""))
        return t

    def out_of_budget() -> bool:
        return len(trials) >= budget_evals or time.perf_counter() - start > budget_s

    if strategy in ("exhaustive", "model"):
        for name, cfg in ranked:
            if out_of_budget():
                break
            run(name, cfg)
    else:  # evolutionary: seed with the model's favourites, then mutate the best survivors
        for name, cfg in ranked[:population]:
            run(name, cfg)
        stale = 0
        while not out_of_budget() and stale < 50:
            pop = sorted((t for t in trials if t.time_us is not None),
                         key=lambda t: (t.estimated, t.time_us))[:population]
            if not pop:
                break
            parent = pop[min(int(rng.expovariate(1.0)), len(pop) - 1)]   # bias toward the best
            fam = fams[parent.family]
            child = _mutate(parent.config, fam, fam.space(), rng, arch=arch)
            if child is None or child in done or not fam.serves(child, shape.M, shape.N, shape.K):
                stale += 1
                continue
            stale = 0
            run(parent.family, child)
    return SearchResult(shape, strategy, trials, time.perf_counter() - start)


# --- CLI -------------------------------------------------------------------------------------------
def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", required=True, help="CSV with M,N,K columns (shapes/stratified_100.csv)")
    parser.add_argument("--arch", default=None, help="sm_80 | sm_90a (default: CUDAL2_ARCH, else the visible GPU)")
    parser.add_argument("--families", nargs="+", default=None, help="template families (default: all for the arch)")
    parser.add_argument("--acc", default="f32", choices=("f32", "f16"), help="accumulator the kernels must use")
    parser.add_argument("--layout", default=None, choices=("RR", "RC"),
                        help="B layout: RR = row-major K x N, RC = column-major (x @ W^T of nn.Linear); "
                             "default: the shapes file's layout column, else RR")
    parser.add_argument("--build-only", action="store_true",
                        help="build every candidate for the shape list (no GPU) and report counts, time, memory")
    parser.add_argument("--limit-per-shape", type=int, default=None,
                        help="keep the N best configs per shape by the cost model's prior")
    parser.add_argument("--max-options", type=int, default=MAX_OPTIONS,
                        help="runtime-option combinations (kernel ABI 2) kept per shape and build, the "
                             f"cost model's best (default {MAX_OPTIONS}; 0 = all)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: all cores)")
    parser.add_argument("--budget-evals", type=int, default=32, help="evaluations per shape")
    parser.add_argument("--budget-s", type=float, default=600.0, help="seconds per shape")
    parser.add_argument("--strategy", default="auto", choices=("auto", "exhaustive", "evolutionary", "model"))
    parser.add_argument("--modes", nargs="+", default=["offline"], choices=MODES)
    parser.add_argument("--db", default="results.db", help="results DB (SQLite)")
    parser.add_argument("--cost-model", default=None, help="a fitted cost model JSON (default: the roofline prior)")
    parser.add_argument("--seed", type=int, default=0)


def run_cli(args: argparse.Namespace) -> int:
    try:
        shapes = read_shapes(args.shapes)
        args.layout = shapes_layout(args.shapes, args.layout)
        arch = detect_arch(args.arch)
        model = CostModel.load(args.cost_model) if args.cost_model else CostModel.default(
            "A100" if arch.startswith("sm_8") else "H100")
        if args.build_only:
            p = plan(shapes, arch, families=args.families, limit_per_shape=args.limit_per_shape, model=model,
                     acc=args.acc, layout=args.layout, max_options=args.max_options or None)
        else:
            families_for(arch, args.families)
    except ValueError as exc:
        print(f"cudal2 tune: {exc}", file=sys.stderr)
        return 2
    if args.build_only:
        print(f"tune --build-only: {len(shapes)} shapes from {args.shapes}, {len(p.candidates)} unique "
              f"candidates ({p.pairs} shape x candidate pairs, {p.evaluations} with their runtime "
              f"options) for {arch}")
        n = [0]

        def progress(r):
            n[0] += 1
            print(f"  [{n[0]}/{len(p.candidates)}] {r.name}: {r.status}"
                  f"{' (cached)' if r.cached else f' {r.seconds:.1f} s'}", flush=True)

        rep = build_plan(p, jobs=args.jobs, progress=progress)
        print(rep.text())
        for f in rep.failures[:20]:
            print(f"  failed: {f}")
        print(f"builds are in the cache ({_cache_dir()}); `cudal2 tune --shapes {args.shapes}` on a GPU "
              f"machine times them")
        return 0 if rep.failed < rep.unique else 1
    import contextlib

    db = ResultsDB(args.db)
    # our own templates are trusted: one GPU worker serves several kernels (a fresh CUDA
    # context per kernel is the harness default, meant for hostile RL kernels)
    pool_cm = gpu_pool(max_tasks=16) if gpu_visible() else contextlib.nullcontext(None)
    print(f"tune: {len(shapes)} shapes, budget {args.budget_evals} evaluations / {args.budget_s:.0f} s "
          f"per shape, strategy {args.strategy}, results in {args.db}")
    with pool_cm as pool:
        for i, shape in enumerate(shapes, 1):
            print(f"[{i}/{len(shapes)}] {shape}")
            try:
                res = search(shape, arch, families=args.families, acc=args.acc, layout=args.layout,
                             budget_evals=args.budget_evals, budget_s=args.budget_s,
                             strategy=args.strategy, model=model, modes=tuple(args.modes), db=db,
                             pool=pool, seed=args.seed)
            except ValueError as exc:
                print(f"  skipped: {exc}")
                continue
            b = res.best
            print(f"  {res.strategy}: {len(res.trials)} evaluations in {res.seconds:.0f} s; best "
                  + (f"{b.config.label()} {b.time_us:.2f} us{' (ESTIMATED, no GPU)' if b.estimated else ''}"
                     if b else "none"))
    print(f"results in {args.db}; `cudal2 export --db {args.db}` copies the winners into your kernel table ($CUDAL2_CACHE/kernels)")
    return 0


def _cache_dir():
    return knobs.cache_dir()
