"""Which shapes are held out, and which shard runs which: held-out shapes are table shapes off
the 1000-shape grid, outside every policy's warm-start shapes and the RL run's training shapes
(each checked: an overlap is an error naming the shapes), drawn stratified by size bucket."""
from __future__ import annotations

import random

from cudal2.runs.report import BUCKETS, size_bucket

MIN_SHAPES = 32       # below this (or below MIN_SEEDS seeds) a run is a pilot (--allow-small)
MIN_SEEDS = 3


def key(s) -> tuple[int, int, int]:
    return (s.M, s.N, s.K) if hasattr(s, "M") else tuple(int(x) for x in s)


def name(s) -> str:
    m, n, k = key(s)
    return f"{m}x{n}x{k}"


def check_disjoint(heldout, other, what: str) -> None:
    """Raise if a held-out shape is one of `other` (naming up to 8 of them)."""
    both = sorted({key(s) for s in heldout} & {key(s) for s in other})
    if both:
        raise ValueError(f"held-out set overlaps the {what} shapes on {len(both)} shape(s): "
                         + ", ".join(map(name, both[:8])) + (" ..." if len(both) > 8 else ""))


def stratified(shapes, n: int, seed: int) -> list[tuple]:
    """n shapes spread over the size buckets: each bucket's shapes in a seeded order, taken
    round-robin from the smallest bucket up; sorted."""
    rng = random.Random(seed)
    by = {b: [] for _, b in BUCKETS}
    for s in sorted(map(key, shapes)):
        by[size_bucket(*s)].append(s)
    for v in by.values():
        rng.shuffle(v)
    out: list[tuple] = []
    while len(out) < n and any(by.values()):
        for b in by:
            if by[b] and len(out) < n:
                out.append(by[b].pop(0))
    return sorted(out)


def choose(table_shapes, exclude: dict[str, set], *, n: int, seed: int, explicit=None) -> list[tuple]:
    """The held-out shapes: `explicit` (as given: shapes the table has no rows for yet remain
    until a GPU call measures them) or `n` (0 = all) drawn from the table's shapes outside every
    set in `exclude` ({what: shapes}); checked disjoint from each set either way."""
    if explicit is not None:
        out = sorted({key(s) for s in explicit})
    else:
        banned = set().union(*exclude.values()) if exclude else set()
        pool = sorted({key(s) for s in table_shapes} - banned)
        if n and len(pool) < n:
            raise ValueError(f"the table has {len(pool)} shape(s) outside the grid, warm-start and "
                             f"training sets; --heldout {n} needs more")
        out = stratified(pool, n or len(pool), seed)
    for what, shapes in exclude.items():
        check_disjoint(out, shapes, what)
    return out


def check_size(n_shapes: int, n_seeds: int, allow_small: bool) -> bool:
    """True when the run is a pilot (too small to answer); raise unless --allow-small."""
    small = n_shapes < MIN_SHAPES or n_seeds < MIN_SEEDS
    if small and not allow_small:
        raise ValueError(f"{n_shapes} held-out shape(s) x {n_seeds} seed(s): the experiment needs "
                         f">= {MIN_SHAPES} shapes and >= {MIN_SEEDS} seeds (--allow-small runs a pilot)")
    return small


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n), 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: want i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: want 0 <= i < n")
    return i, n


def shard(shapes: list[tuple], i: int, n: int) -> list[tuple]:
    """Shard i of n: every n-th shape of the sorted held-out set, starting at i."""
    return sorted(shapes)[i::n]
