"""The tune arm's prior: cudal2's cost model fitted on the training shapes' table rows, ranking a
held-out shape's entries by the time it predicts from each entry's config. An entry's config is
read from its source: a template instantiation's banner (`// config: family:K=V,...`, checked
byte for byte by cudal2.templates.config_of) or a short family file (`#define` lines and
`#include "<family header>"`, read by cudal2_rl.corpus.parse_family_file). Entries with no
config (a raw kernel file) are invisible to the model: they rank after every config, in a seeded
order."""
from __future__ import annotations

import random
from functools import lru_cache

from cudal2.search.costmodel import CostModel, Sample
from cudal2.search.tune import config_meta
from cudal2.templates import KernelConfig, config_of

from ..corpus import parse_family_file


@lru_cache(maxsize=4096)
def entry_config(source: str) -> KernelConfig | None:
    """The config an entry's source instantiates, or None (module docstring)."""
    return config_of(source) or parse_family_file(source)


def fit(table, training_shapes) -> CostModel:
    """The cost model fitted on the table's rows at the training shapes (reference times)."""
    samples = []
    for shape in sorted(set(training_shapes) & set(table.shapes())):
        for e in table.entries(shape):
            cfg = entry_config(e.source)
            if cfg is not None:
                samples.append(Sample(config_meta(cfg), {}, tuple(shape), float(e.reference_us),
                                      table.gpu or "", "candidate", table.arch))
    return CostModel.fit(samples, gpu=table.gpu or None)


def rank(entries, model: CostModel, shape, seed: int) -> list:
    """`entries` by predicted time, fastest first; entries without a config after, seeded."""
    known, unknown = [], []
    for e in sorted(entries, key=lambda e: e.binary_key):
        cfg = entry_config(e.source)
        if cfg is None:
            unknown.append(e)
        else:
            known.append((model.predict_us(config_meta(cfg), None, tuple(shape)), e.binary_key, e))
    random.Random(f"tune-{seed}-{shape}").shuffle(unknown)
    return [e for *_, e in sorted(known, key=lambda t: t[:2])] + unknown


def distance(a: KernelConfig | None, b: KernelConfig | None) -> float:
    """Parameters that differ between two configs of one family (inf across families or
    without a config): the neighbourhood tune's local search moves in."""
    if a is None or b is None or a.family != b.family:
        return float("inf")
    da, db = a.as_dict(), b.as_dict()
    return float(sum(da.get(k) != db.get(k) for k in set(da) | set(db)))
