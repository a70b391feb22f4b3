"""End-to-end call: what a user feels, reported next to kernel time and never mixed into it.

`cudal2.matmul(a, b)` against `torch.matmul(a, b)` as users call them (output allocated by the
call), four ways, host clock:

    eager_throughput  N calls between two synchronisations, per call
    eager_latency     synchronise, one call, synchronise
    graph_throughput  N calls captured in one CUDA graph, one replay between two synchronisations, per call
    graph_latency     a one-call graph replayed between two synchronisations

Rounds interleave the contenders in random order; each figure is the median of per-round ratios
(torch / cudal2) with a bootstrap interval, like kernel time (cudal2.timing.stats).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from cudal2.timing import stats as S

KINDS = ("eager_throughput", "eager_latency", "graph_throughput", "graph_latency")


@dataclass(frozen=True)
class E2EConfig:
    calls: int = 50                # N for the throughput figures
    min_rounds: int = 5
    max_rounds: int = 25
    budget_s: float = 1.5
    target: float = 0.02
    graphs: bool = True
    seed: int = 0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class HostBackend:
    """What the e2e schedule needs: a host clock, synchronisation and (optionally) graph capture
    of a function called `calls` times. Tests pass a fake."""

    def __init__(self):
        import time

        import torch
        self.torch = torch
        self._now = time.perf_counter

    def now(self) -> float:
        return self._now()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def capture(self, fn: Callable[[int], object], calls: int) -> Callable[[], None]:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):          # eager calls first: no lazy init inside capture
            for i in range(min(calls, 2)):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(i)
        return graph.replay


def measure_e2e(contenders: dict[str, Callable[[int], object]], config: E2EConfig, backend, *,
                reference: str = "torch") -> dict:
    """contenders[name](i) makes one user-level call on operand set i. Returns
    {"timings": {kind: {name: {median_us, lo_us, hi_us, n}}},
     "speedups": {kind: {name: {median, lo, hi, n}}} (reference time / name's time, per round),
     "session": {...}}."""
    if reference not in contenders:
        raise ValueError(f"e2e needs the reference contender {reference!r}")
    names = sorted(contenders)
    kinds = list(KINDS if config.graphs else KINDS[:2])
    graphs: dict[tuple[str, str], Callable[[], None]] = {}
    if config.graphs:
        try:
            for n in names:
                graphs[(n, "graph_throughput")] = backend.capture(contenders[n], config.calls)
                graphs[(n, "graph_latency")] = backend.capture(contenders[n], 1)
        except Exception as exc:  # noqa: BLE001 - a path that cannot be captured: say so, go on
            kinds = KINDS[:2]
            graphs = {}
            graph_note = f"graph capture failed: {type(exc).__name__}: {exc}"[:300]
        else:
            graph_note = ""
    else:
        graph_note = "graphs off"
    for n in names:                                    # warm-up
        for i in range(3):
            contenders[n](i)
    backend.synchronize()
    rng = random.Random(config.seed)
    per_round = {k: {n: [] for n in names} for k in kinds}
    t0 = backend.now()
    rounds = 0
    stopped = ""
    while True:
        for kind in kinds:
            order = list(names)
            rng.shuffle(order)
            for n in order:
                fn = contenders[n]
                if kind == "eager_throughput":
                    backend.synchronize()
                    h0 = backend.now()
                    for i in range(config.calls):
                        fn(i)
                    backend.synchronize()
                    us = (backend.now() - h0) * 1e6 / config.calls
                elif kind == "eager_latency":
                    backend.synchronize()
                    h0 = backend.now()
                    fn(rounds)
                    backend.synchronize()
                    us = (backend.now() - h0) * 1e6
                else:
                    replay = graphs[(n, kind)]
                    backend.synchronize()
                    h0 = backend.now()
                    replay()
                    backend.synchronize()
                    us = (backend.now() - h0) * 1e6 / (config.calls if kind == "graph_throughput" else 1)
                per_round[kind][n].append(us)
        rounds += 1
        if rounds >= config.min_rounds:
            ivs = [S.interval(S.paired_ratios(per_round[k][reference], per_round[k][n]),
                              seed=config.seed)
                   for k in kinds for n in names if n != reference]
            if S.tight(ivs, config.target):
                stopped = "tight"
                break
            if backend.now() - t0 > config.budget_s:
                stopped = "budget"
                break
        if rounds >= config.max_rounds:
            stopped = "max_rounds"
            break
    timings, speedups = {}, {}
    for k in kinds:
        timings[k] = {n: S.interval(per_round[k][n], seed=config.seed).to_dict() for n in names}
        for n in names:
            t = timings[k][n]
            t["median_us"], t["lo_us"], t["hi_us"] = t.pop("median"), t.pop("lo"), t.pop("hi")
        speedups[k] = {n: S.interval(S.paired_ratios(per_round[k][reference], per_round[k][n]),
                                     seed=config.seed).to_dict()
                       for n in names if n != reference}
    return {"timings": timings, "speedups": speedups,
            "session": {"rounds": rounds, "stopped": stopped, "graph_note": graph_note,
                        "seconds": round(backend.now() - t0, 3), "config": config.to_dict()}}
