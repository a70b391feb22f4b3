"""The arms, each searching ONE action space: the reward table's entries at a held-out shape
(binaries measured there). Every evaluation is a table read (ShapeSearch), so each arm's winner
and its regret against the table's exhaustive best are exact.

    rl, sft     a policy (a proposer: (shape, n, seed) -> sources, None for a completion with no
                kernel) writes sources; each is built (cached) and its binary key looks the entry
                up; a key the table lacks is a miss: no value, queued for the GPU, counted
    tune        the cost model fitted on the training shapes' rows ranks the entries (prior.py);
                `rank` reads them in that order, `evolve` (cudal2 tune's evolutionary search over
                the table's set) reads the model's favourites, then the unread entries nearest the
                best read so far
    random      entries in a seeded order, without replacement
    exhaustive  every entry: the reference, not an arm that competes
"""
from __future__ import annotations

import random

from cudal2_rl.experiment import prior
from cudal2_rl.experiment.budget import Allowance

POLICY_ARMS = ("rl", "sft")
SEARCH_ARMS = ("tune", "random")
ARMS = POLICY_ARMS + SEARCH_ARMS
REFERENCE = "exhaustive"


def entry_us(e) -> float:
    """An entry's time in the experiment: the table's reference time (the same draw set the
    table's best is taken from, so regret 0 means the table's own best)."""
    return float(e.reference_us)


def draw_seconds(e) -> float:
    return sum(float(d.gpu_seconds or 0.0) for d in e.draws)


class ShapeSearch:
    """One arm's reads at one shape and seed, under its allowance (None: unlimited)."""

    def __init__(self, table, shape, allowance: Allowance | None):
        self.shape = tuple(shape)
        self.entries = table.entries(self.shape)
        self.by_key = {e.binary_key: e for e in self.entries}
        self.allowance = allowance
        self.asked: dict = {}                   # binary key -> Entry, or None (a miss); in order
        self.missed: list[tuple[str, str]] = []   # (key, source) of misses
        self.gpu_seconds = 0.0
        self.repeats = self.samples = self.no_code = self.no_build = 0

    def left(self) -> int:
        if self.allowance is None:
            return len(self.by_key) + len(self.missed) - len(self.asked)
        cap = self.allowance.gpu_seconds
        if cap is not None and self.gpu_seconds >= cap:
            return 0
        return self.allowance.evaluations - len(self.asked)

    def read(self, key: str, source: str | None = None):
        """The entry for binary `key` (None: a miss, or the allowance is spent)."""
        if key in self.asked:
            self.repeats += 1
            return self.asked[key]
        if self.left() <= 0:
            return None
        e = self.asked[key] = self.by_key.get(key)
        if e is None:
            self.missed.append((key, source or ""))
        else:
            self.gpu_seconds += draw_seconds(e)
        return e

    def hits(self) -> list:
        return [e for e in self.asked.values() if e is not None]

    def winner(self):
        return min(self.hits(), key=lambda e: (entry_us(e), e.binary_key), default=None)


def round_seed(seed: int, shape, rnd: int) -> int:
    """A policy's sampling seed for (seed, shape, round): the same in any shard."""
    m, n, k = shape
    return seed * 100003 + rnd * 1009 + m * 7 + n * 3 + k


def run_policy(search: ShapeSearch, propose, keyer, *, seed: int, max_rounds: int) -> None:
    """Draw up to the evaluations left, key each source, read; again while evaluations are
    left (repeats and sources that do not build spend none), at most `max_rounds` rounds."""
    for rnd in range(max_rounds):
        n = search.left()
        if n <= 0:
            return
        for src in propose(search.shape, n, round_seed(seed, search.shape, rnd)):
            search.samples += 1
            key = keyer(src) if src is not None else None
            if src is None:
                search.no_code += 1
            elif key is None:
                search.no_build += 1
            else:
                search.read(key, src)


def run_tune(search: ShapeSearch, model, *, seed: int, strategy: str = "evolve", population: int = 4) -> None:
    ranked = prior.rank(search.entries, model, search.shape, seed)
    if strategy == "rank":
        for e in ranked:
            if search.left() <= 0:
                return
            search.read(e.binary_key)
        return
    for e in ranked[:population]:
        search.read(e.binary_key)
    order = {e.binary_key: i for i, e in enumerate(ranked)}
    while search.left() > 0:
        unread = [e for e in ranked if e.binary_key not in search.asked]
        best = search.winner()
        if not unread or best is None:
            return
        near = prior.entry_config(best.source)
        search.read(min(unread, key=lambda e: (prior.distance(near, prior.entry_config(e.source)),
                                               order[e.binary_key])).binary_key)


def run_random(search: ShapeSearch, *, seed: int) -> None:
    order = sorted(search.by_key)
    random.Random(f"random-{seed}-{search.shape}").shuffle(order)
    for key in order:
        if search.left() <= 0:
            return
        search.read(key)


def run_exhaustive(search: ShapeSearch) -> None:
    for key in sorted(search.by_key):
        search.read(key)
