"""THE tournament: screen candidates of one shape, pick finalists by one rule, run the finals as
one interleaved session, replace a finalist that fails. The campaign (cudal2.runs.campaign) and
the RL executor (rl.executor.GroupRunner) call `run`; docs/measurement.md describes it.

    run(shape, entrants, backend, policy)
      1. screen: every entrant without a screening row (one entrant alone is not screened:
         there is nothing to rank)
      2. finalists(): the rule (FinalistPolicy): the `top` fastest screened, plus any within
         `within` of the fastest or of the reference (torch) time, at most `cap`; with
         per_group, the fastest of each group instead (the experiment's arms)
      3. finals: ONE session per shape (and B layout) holding every finalist and every baseline:
         the baselines are set up and timed once, in the same rounds as every finalist
         (measure.measure_group); with `gate_margin` set on the requests, server mode and the
         end-to-end call run only for a finalist past the export rule's kernel-time bar
      4. a finalist that fails (wrong, crashed, timeout, too fast...) gives its place to the next
         screened entrant (of its group; another binary before another option variant of one
         already in finals); the replacements share one further session; at most
         `replacements` such sessions per shape

    deadline (a time.monotonic() value, None: none) is checked before the screening, every
    finals session and every replacement session, and each unit's time limit is cut to what is
    left (pipeline.screen's chunks, evaluate_group's session): a hung final costs at most the
    time left. Finalists whose session never started are in Result.not_reached and keep their
    screening rows; rows the deadline cut are not_measured with a 'budget:' detail
    (pipeline.budget_cut) and never stored.

The backend does the GPU work (HarnessBackend: cudal2.harness.pipeline.screen and
evaluate_group); tests give a fake one. Rows are written only through pipeline.record (inside
screen and evaluate_group, or by HarnessBackend when finals bypass the cache).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from cudal2.core.identity import source_sha
from cudal2.harness import types as T
from cudal2.harness.pipeline import (MIN_SLICE_S, ScreenCandidate, budget_cut, evaluate_group,
                                     record, screen, screen_us)
from cudal2.harness.types import EvalRequest, Evaluation, Shape

# a finalist with one of these final verdicts keeps its place; any other verdict is a failure
KEEPS_PLACE = (T.OK, T.NOT_MEASURED)


@dataclass(frozen=True)
class FinalistPolicy:
    """Who goes to finals. top: the fastest few screened; within: plus any whose screening time
    is within this fraction of the fastest or of the reference time (noise could reorder them);
    cap: at most this many per shape; per_group: each group's fastest instead, top, within and
    cap aside (the experiment: every arm's best meets the others); replacements: sessions of
    replacement finalists allowed per shape after failures."""
    top: int = 2
    within: float = 0.03
    cap: int = 3
    per_group: bool = False
    replacements: int = 1

    def __post_init__(self):
        if self.top < 1 or self.cap < 1 or self.within < 0 or self.replacements < 0:
            raise ValueError(f"FinalistPolicy: top and cap >= 1, within and replacements >= 0; got {self}")


@dataclass(frozen=True)
class Entrant:
    """One (kernel, runtime options) in a shape's tournament: its finals request (modes,
    baselines, options, gate_margin), its BuildResult, the group that entered it and, when it
    was screened before (an arm's search, a resumed campaign), that screening row."""
    request: EvalRequest
    build: object = None
    group: str = ""
    screened: Evaluation | None = None
    layout: str = ""                  # B layout when known before the audit ("" = from the rows)

    @property
    def key(self) -> tuple:
        return (source_sha(self.request.source), self.request.options)


def finalists(screened: list[tuple[float | None, str]], policy: FinalistPolicy,
              reference_us: float | None = None, *, runnable: list[bool] | None = None,
              keys: list[tuple] | None = None) -> tuple[list[int], list[int]]:
    """THE finalist rule. screened[i] = (screening time or None, group). Returns (finalists,
    reserve): indices of the finalists, and the rest of the timed entrants fastest first (who
    replaces a failing finalist). Without any timing (no GPU) the runnable entrants (`runnable`,
    e.g. not_measured rows) stand in input order, so the plumbing runs end to end.

    keys[i]: entrant i's (source sha, runtime options) (Entrant.key). Option variants of one
    binary (one sha, other options) collapse, within a group under per_group: only the fastest
    variant of a binary can be a finalist; its other variants wait in reserve behind every
    entrant of another binary, so a failing finalist is replaced by a different binary first.
    Entrants with the same key are one kernel (run() runs it once), not variants."""
    timed = sorted((t, i) for i, (t, _g) in enumerate(screened) if t)
    untimed = not timed
    if untimed:
        timed = [(0.0, i) for i in range(len(screened)) if runnable and runnable[i]]
    # the fastest variant of each binary stands; the other variants go to the reserve's end
    lead_key: dict = {}
    lead, later = [], []
    for t, i in timed:
        key = keys[i] if keys else (i, ())
        binary = (screened[i][1] if policy.per_group else "", key[0])
        variant = lead_key.setdefault(binary, key) != key
        (later if variant else lead).append((t, i))
    groups: dict[str, list[tuple[float, int]]] = {}
    for t, i in lead:
        groups.setdefault(screened[i][1] if policy.per_group else "", []).append((t, i))
    chosen: list[int] = []
    for ranked in groups.values():
        best = ranked[0][0]
        if policy.per_group:
            chosen += [i for _, i in ranked[:1]]
            continue
        if untimed:
            chosen += [i for _, i in ranked[:policy.top]]
            continue
        bar = max(best, reference_us or 0.0) * (1.0 + policy.within)
        pick = [i for _, i in ranked[:policy.top]] + [i for t, i in ranked[policy.top:] if t <= bar]
        chosen += pick[:policy.cap]
    reserve = [i for _, i in lead + later if i not in chosen]
    return chosen, reserve


class Backend(Protocol):
    """The GPU work of a tournament (HarnessBackend; tests fake it). `run` passes deadline= only
    when it has one, so a backend that never gets a deadline need not take it."""
    def screen(self, shape: Shape, entrants: list[Entrant], *,
               deadline: float | None = None) -> tuple[list[Evaluation], dict]: ...
    def finals(self, shape: Shape, entrants: list[Entrant], *,
               deadline: float | None = None) -> list[Evaluation]: ...


@dataclass
class Result:
    """One shape's tournament. rows[i]: entrant i's final row if it ran in finals, else its
    screening row (None: neither). sessions: finals sessions run (1 unless a finalist failed).
    finalists: entrant indices in the order they entered finals; replaced: (failed, replacement);
    not_reached: entrants picked for a finals session the deadline did not let start (their
    rows stay the screening rows)."""
    shape: Shape
    rows: list
    screened: list
    finalists: list[int] = field(default_factory=list)
    replaced: list[tuple[int, int]] = field(default_factory=list)
    sessions: int = 0
    screened_fresh: int = 0
    screen_s: float = 0.0
    finals_s: float = 0.0
    reference: dict = field(default_factory=dict)
    entrants_group: list = field(default_factory=list)
    not_reached: list[int] = field(default_factory=list)

    def winner(self, group: str | None = None) -> tuple[int, Evaluation] | None:
        """(index, final row) of the group's finalist (every group when None) that kept its
        place, else the last one that ran, else None."""
        mine = [i for i in self.finalists
                if group is None or self.entrants_group[i] == group]
        for i in mine:
            if self.rows[i].status in KEEPS_PLACE:
                return i, self.rows[i]
        return (mine[-1], self.rows[mine[-1]]) if mine else None


def run(shape: Shape, entrants: list[Entrant], backend: Backend,
        policy: FinalistPolicy = FinalistPolicy(), *, reference_us: float | None = None,
        deadline: float | None = None) -> Result:
    """The tournament of one shape (see the module's docstring). deadline: a time.monotonic()
    value no unit of work may run past (None: none). Returns a Result."""
    entrants = list(entrants)
    kw = {} if deadline is None else {"deadline": deadline}
    res = Result(shape=shape, rows=[e.screened for e in entrants],
                 screened=[e.screened for e in entrants],
                 entrants_group=[e.group for e in entrants])
    todo = [i for i, e in enumerate(entrants) if e.screened is None]
    if todo and len(entrants) > 1:
        t0 = time.monotonic()
        rows, ref = backend.screen(shape, [entrants[i] for i in todo], **kw)
        res.screen_s = time.monotonic() - t0
        res.screened_fresh = len(todo)
        res.reference = ref or {}
        if res.reference.get("torch_us"):
            reference_us = min(x for x in (reference_us, res.reference["torch_us"]) if x)
        for i, row in zip(todo, rows):
            res.rows[i] = res.screened[i] = row
    if len(entrants) == 1:
        chosen, reserve = ([0], []) if entrants[0].screened is None or \
            entrants[0].screened.status in (T.OK, T.NOT_MEASURED) else ([], [])
    else:
        chosen, reserve = finalists(
            [(screen_us(r), e.group) for r, e in zip(res.screened, entrants)], policy, reference_us,
            runnable=[r is not None and r.status == T.NOT_MEASURED and not budget_cut(r)
                      for r in res.screened],
            keys=[e.key for e in entrants])
    # one entrant per (kernel, options): a kernel two groups found runs once and answers both
    first: dict[tuple, int] = {}
    session = []
    for i in chosen:
        if entrants[i].key not in first:
            first[entrants[i].key] = i
            session.append(i)
    t0 = time.monotonic()
    sessions_left = 1 + policy.replacements
    while session and sessions_left:
        if deadline is not None and deadline - time.monotonic() < MIN_SLICE_S:
            res.not_reached += session
            break
        sessions_left -= 1
        rows = backend.finals(shape, [entrants[i] for i in session], **kw)
        res.sessions += 1
        res.finalists += session
        for i, row in zip(session, rows):
            res.rows[i] = row
        nxt = []
        for i, row in zip(session, rows):
            if row.status in KEEPS_PLACE:
                continue
            # per group: every group this kernel stood for sends its next fastest
            groups = ({entrants[k].group for k in chosen if entrants[k].key == entrants[i].key}
                      if policy.per_group else {None})
            for grp in sorted(groups, key=str):
                for j in list(reserve):
                    if (grp is None or entrants[j].group == grp) and entrants[j].key not in first:
                        reserve.remove(j)
                        first[entrants[j].key] = j
                        nxt.append(j)
                        res.replaced.append((i, j))
                        break
        session = nxt
    res.finals_s = time.monotonic() - t0
    # entrants that share a finalist's kernel and options get its row
    for i, e in enumerate(entrants):
        j = first.get(e.key)
        if j is not None and j != i and j in res.finalists:
            res.rows[i] = res.rows[j]
            if i in chosen and i not in res.finalists:
                res.finalists.append(i)
    return res


class HarnessBackend:
    """The tournament's GPU work through cudal2.harness.pipeline: screening (`screen`: trusted
    kernels share one warm worker, policy code one fresh worker each) and finals
    (`evaluate_group`: one worker, one interleaved session per B layout; fresh, or kept from
    sessions whose candidates were all ok where finals_pool keeps workers). db: where rows
    go (None: not stored); cache: finals may be answered by stored rows (the cache rule; False:
    always a fresh session, its rows then recorded through the one writer)."""

    def __init__(self, *, db=None, cache: bool = True, screen_pool=None, finals_pool=None,
                 gpu: bool | None = None, trusted: bool = True, baseline_libs=None,
                 lt_known: dict | None = None, audits: dict | None = None,
                 screen_timeout_s: float | None = None, store_screens: bool = True):
        self.db, self.cache, self.screen_pool, self.finals_pool = db, cache, screen_pool, finals_pool
        self.gpu, self.trusted, self.baseline_libs = gpu, trusted, baseline_libs
        self.lt_known, self.audits, self.screen_timeout_s = lt_known, audits, screen_timeout_s
        self.store_screens = store_screens

    def screen(self, shape, entrants, *, deadline=None):
        r0 = entrants[0].request
        return screen(shape, [ScreenCandidate(e.request.source, e.build, e.request.options,
                                              e.request.origin or "screen") for e in entrants],
                      arch=r0.arch, acc=r0.acc, db=self.db if self.store_screens else None,
                      pool=self.screen_pool, gpu=self.gpu, operands=r0.operands,
                      trusted=self.trusted, audits=self.audits, timeout_s=self.screen_timeout_s,
                      deadline=deadline)

    def finals(self, shape, entrants, *, deadline=None):
        by_layout: dict[str, list[int]] = {}
        for k, e in enumerate(entrants):
            lay = e.layout or (e.screened.layout if e.screened is not None else "")
            by_layout.setdefault(lay, []).append(k)
        out: list = [None] * len(entrants)
        for ks in by_layout.values():
            for k, ev in zip(ks, self._session([entrants[k] for k in ks], deadline)):
                out[k] = ev
        return out

    def _session(self, entrants, deadline=None):
        kw = dict(pool=self.finals_pool, build_results=[e.build for e in entrants], gpu=self.gpu,
                  baseline_libs=self.baseline_libs, lt_known=self.lt_known, audits=self.audits,
                  deadline=deadline)
        reqs = [e.request for e in entrants]
        db = self.db if self.cache else None
        try:
            rows = evaluate_group(reqs, db=db, **kw)
        except ValueError:      # B layouts learnt only at the audit: one session each
            rows = [evaluate_group([r], db=db, **dict(kw, build_results=[e.build]))[0]
                    for r, e in zip(reqs, entrants)]
        if not self.cache:
            rows = [ev if budget_cut(ev) else record(self.db, ev, r.source)
                    for ev, r in zip(rows, reqs)]
        return rows
