"""One run of the experiment (or one shard of it): per held-out shape of the shard and per seed,
every arm searches the table's entries under its allowance and the exhaustive reference reads
them all; one row per (arm, shape, seed). Misses go to the GPU queue."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cudal2.core.identity import source_sha
from cudal2_rl.experiment import arms as A
from cudal2_rl.experiment.budget import Budget
from cudal2_rl.experiment.heldout import shard as shard_of


@dataclass
class Setup:
    """What every shard of one experiment shares (merge checks it agrees)."""
    heldout: list                 # the whole held-out set, sorted (M, N, K)
    arms: list
    seeds: list
    budget: Budget
    table: dict                   # gpu, arch, paths
    max_rounds: int = 4
    tune_strategy: str = "evolve"
    population: int = 4
    boot_seed: int = 0
    pilot: bool = False
    shard: tuple = (0, 1)
    notes: list = field(default_factory=list)

    def shapes(self) -> list:
        return shard_of([tuple(s) for s in self.heldout], *self.shard)

    def to_json(self) -> dict:
        d = asdict(self)
        d["budget"] = self.budget.to_json()
        d["heldout"] = [list(s) for s in self.heldout]
        return d


SHARED = ("heldout", "arms", "seeds", "budget", "table", "max_rounds", "tune_strategy",
          "population", "boot_seed")


def row(arm: str, search: A.ShapeSearch, seed: int, setup: Setup, best_us: float, baseline_us) -> dict:
    w = search.winner()
    m, n, k = search.shape
    ch_e, ch_g = setup.budget.charged(arm) if arm != A.REFERENCE else (0, 0.0)
    return {"arm": arm, "M": m, "N": n, "K": k, "seed": seed, "entries": len(search.by_key),
            "evaluations": len(search.asked), "hits": len(search.hits()), "misses": len(search.missed),
            "repeats": search.repeats, "samples": search.samples, "no_code": search.no_code,
            "no_build": search.no_build, "gpu_seconds": round(search.gpu_seconds, 6),
            "charged_evaluations": ch_e, "charged_gpu_seconds": round(ch_g, 6),
            "winner_key": w.binary_key if w else "", "winner_sha": w.source_sha if w else "",
            "winner_us": A.entry_us(w) if w else None, "best_us": best_us, "baseline_us": baseline_us}


def search_arm(arm: str, table, shape, seed: int, setup: Setup, *, proposers, keyer, model) -> A.ShapeSearch:
    s = A.ShapeSearch(table, shape, None if arm == A.REFERENCE else setup.budget.allowance(arm))
    if arm in A.POLICY_ARMS:
        A.run_policy(s, proposers[arm], keyer, seed=seed, max_rounds=setup.max_rounds)
    elif arm == "tune":
        A.run_tune(s, model, seed=seed, strategy=setup.tune_strategy, population=setup.population)
    elif arm == "random":
        A.run_random(s, seed=seed)
    else:
        A.run_exhaustive(s)
    return s


def run(table, setup: Setup, *, proposers: dict, keyer, model, queue=None, log=print) -> list[dict]:
    """The rows of this shard; winners' sources are looked up again by report.confirm."""
    rows = []
    todo = [s for s in setup.shapes() if table.entries(s)]      # the others remain (no rows yet)
    for i, shape in enumerate(todo, 1):
        best_us = min(A.entry_us(e) for e in table.entries(shape))
        base = table.baseline_us(shape)
        for seed in setup.seeds:
            for arm in setup.arms + [A.REFERENCE]:
                s = search_arm(arm, table, shape, seed, setup, proposers=proposers, keyer=keyer, model=model)
                rows.append(row(arm, s, seed, setup, best_us, base))
                for key, src in s.missed:
                    if queue is not None and src:
                        queue.add(key, shape, source_sha(src), src)
        log(f"[{i}/{len(todo)}] {shape}: " + "; ".join(
            f"{r['arm']} {r['winner_us'] / best_us:.3f}x best" if r["winner_us"] else f"{r['arm']} no value"
            for r in rows[-len(setup.arms) - 1:]))
    return rows


def execute(table, setup: Setup, *, proposers: dict, keyer, model, out, queue=None,
            command: str = "", log=print) -> dict:
    """Run this shard and write its outputs (report.py); returns the summary document."""
    from pathlib import Path
    from cudal2_rl.experiment import report
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(table, setup, proposers=proposers, keyer=keyer, model=model, queue=queue, log=log)
    lines, sources = report.confirm(table, rows)
    done = {(r["M"], r["N"], r["K"]) for r in rows}
    remaining = [tuple(s) for s in setup.heldout if tuple(s) not in done]
    report.write_run(out, {**setup.to_json(), "remaining": [list(s) for s in remaining]}, rows, lines, sources)
    return report.write_report(out, setup.to_json(), rows, remaining=remaining, command=command)
