"""What the experiment needs from a `cudal2_rl.train` run's log.jsonl: its training shapes (kept
out of the held-out set and used to fit tune's cost model), the prompt style and config it
sampled with, and what its training read from the GPU, which is charged to the RL arm.

The charge: T = the distinct (binary key, shape) rows the run read from the reward table
(a row read twice was measured once) plus, for a run that measured on a GPU through the harness
(an older run without table reads), its harness evaluations; G = the GPU-seconds the table spent on the rows
read. A `done` record with `table_reads` / `table_gpu_seconds` gives them directly; otherwise
they are counted from the step records' attempts (`binary_key`, `shape`, `gpu_seconds`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RLRun:
    log: Path
    shapes: set = field(default_factory=set)       # training shapes (setup record)
    reads: int = 0                                 # T: GPU evaluations training consumed
    gpu_seconds: float = 0.0                       # G: GPU-seconds of the rows read
    how: str = ""                                  # where T came from
    style: str = ""
    config: dict = field(default_factory=dict)


def _records(p: Path):
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}:{i}: not a JSON line ({exc})") from None


def _shape(x) -> tuple[int, int, int]:
    return tuple(int(v) for v in x)


def _attempt_reads(steps: list[dict]) -> tuple[int, float]:
    """Distinct (binary key, shape) reads in the step records' attempts and their GPU-seconds."""
    seen: dict[tuple, float] = {}
    for rec in steps:
        for a in rec.get("attempts") or ():
            if a.get("binary_key") and a.get("shape"):
                seen.setdefault((a["binary_key"], _shape(a["shape"])), float(a.get("gpu_seconds") or 0.0))
    return len(seen), sum(seen.values())


def read_rl_run(log_path) -> RLRun:
    """The RL run behind the RL arm, from its log.jsonl (the module docstring has the charge)."""
    p = Path(log_path)
    if not p.is_file():
        raise ValueError(f"no RL run log at {p}: the RL arm is charged its training reads "
                         "and its training shapes are held out, so pass --rl-log")
    run, steps, done = RLRun(p), [], None
    for rec in _records(p):
        t = rec.get("type")
        if t == "setup":
            run.shapes |= {_shape(s) for s in rec.get("shapes") or ()}
            run.style = rec.get("style") or run.style
            run.config = rec.get("config") or run.config
        elif t == "step":
            steps.append(rec)
        elif t == "done":
            done = rec
    if not run.shapes:
        raise ValueError(f"{p}: no `setup` record with the training shapes: not a cudal2_rl.train log")
    if done is not None and "table_reads" in done:
        run.reads, run.gpu_seconds = int(done["table_reads"]), float(done.get("table_gpu_seconds") or 0.0)
        run.how = f"the done record: {run.reads} table reads, {run.gpu_seconds:.1f} GPU-s"
    else:
        run.reads, run.gpu_seconds = _attempt_reads(steps)
        run.how = f"{run.reads} distinct (binary key, shape) reads in the step records"
    older = done is not None and not run.reads and not any(s.get("estimated") for s in steps)
    if older and done.get("evaluations"):          # a run that measured through the harness
        run.reads = int(done.get("evaluations") or 0) + int(done.get("remeasured") or 0)
        run.how = f"the done record: {run.reads} harness evaluations on a GPU (GPU-seconds not logged)"
    return run
