"""`python -m rl.train`: GRPO (trl) on a causal LM that writes per-shape HGEMM kernels.

Each step: the policy writes `num_generations` kernels per shape; rl.reward sends them through
the harness (build, audit, check, time; cached in the results DB) and maps verdicts to rewards;
trl's GRPOTrainer updates the policy. A callback prints one line per step (reward mean/max,
reward mean/std/max, trl's reward_std / frac_reward_zero_std / grad_norm / loss, fractions
compiled / correct / faster than the baseline, best verified speedup so far per shape, fresh
evaluations per GPU-minute), appends it to log.jsonl and exports each step's new verified
winners (re-measured in a fresh run) into generated_kernels/ through cudal2.runs.export (the tuner's
path). Without a GPU every kernel that builds and passes the audit gets one flat reward; times
estimated from each build rank kernels in the logs, every such line says so, and nothing
estimated is ever exported. Launch-bound shapes are left out with the reason logged
(--launch-bound). --turns N: multi-turn refinement (rl/multiturn.py).

Outputs in --out: results.db, log.jsonl, reward_curve.png, best_kernels.csv, kernels/ (best
source per shape), sources/ (every evaluated source by sha), queue.jsonl (with a reward table: the
kernels it lacks, for the next GPU call; --queue moves it), policy/ (the trained policy);
checkpoints/ only with --save-checkpoints or --resume.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import time
from pathlib import Path

from cudal2.harness.db import ResultsDB
from cudal2.runs.export import export, sources_from
from cudal2.search.tune import read_shapes
from cudal2_rl.config import RLConfig, add_arguments, from_args
from cudal2_rl.executor import make_executor, visible_gpu_name
from cudal2_rl.extract import completion_text
from cudal2_rl.multiturn import make_rollout
from cudal2_rl.policy import (SMALL_RECIPE, BuiltinRecipe, default_max_tokens, default_sampling, default_style,
                              is_builtin, load_policy)
from cudal2_rl.prompts import make_prompt
from cudal2_rl.reward import Attempt, KernelReward, launch_bound, note_bests, trl_rewards
from cudal2_rl.table import REPORTS, Queue, RewardTable, default_paths


class RunLog:
    """Prints a line and appends a JSON record to log.jsonl (on the main process only: one writer)."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def __call__(self, line: str = "", **record):
        if not self.enabled:
            return
        if line:
            print(line, flush=True)
        if record or line:
            rec = {"time": round(time.time(), 3), **record}
            if line:
                rec.setdefault("line", line)
            with self.path.open("a") as f:
                f.write(json.dumps(rec, default=str) + "\n")


class RankZeroReward:
    """The reward under several training processes (accelerate / DeepSpeed launch): every rank's
    completions are gathered to rank 0, which alone evaluates them (one executor, one results-DB
    writer, one set of sources and bests); the attempts are broadcast back, so each rank returns
    the rewards of its own completions and every rank's copy of the attempts and bests (which
    feedback prompts read) is the same. On rank 0 `inner` is the KernelReward; elsewhere None."""

    def __init__(self, inner, state, estimated: bool):
        self.__name__ = "kernel_reward"
        self.inner, self.state = inner, state
        self.attempts: list = [] if inner is None else inner.attempts
        self.best: dict = {} if inner is None else inner.best
        self.best_estimated: dict = {} if inner is None else inner.best_estimated
        self._estimated = estimated

    @property
    def estimated(self) -> bool:
        return self._estimated

    def __call__(self, prompts=None, completions=None, M=None, N=None, K=None, **columns):
        return trl_rewards(self.score_attempts, completions, M, N, K, columns)

    def score_attempts(self, completions, shapes, *, turn: int = 1) -> list:
        from accelerate.utils import broadcast_object_list, gather_object
        rank, world = self.state.process_index, self.state.num_processes
        texts = [completion_text(c) for c in completions]
        everyone = gather_object([(texts, [tuple(s) for s in shapes])])    # one entry per rank
        per_rank = [None] * world
        if rank == 0:
            flat_c = [c for cs, _ in everyone for c in cs]
            flat_s = [s for _, ss in everyone for s in ss]
            atts = self.inner.score_attempts(flat_c, flat_s, turn=turn)
            i = 0
            for r, (cs, _) in enumerate(everyone):
                per_rank[r] = atts[i:i + len(cs)]
                i += len(cs)
        box = [per_rank]
        broadcast_object_list(box, from_process=0)
        per_rank = box[0]
        if rank != 0:      # mirror rank 0's record (it appended the whole batch and its bests)
            batch = [a for part in per_rank for a in part]
            self.attempts.append(batch)
            note_bests(batch, self.best, self.best_estimated)
        return per_rank[rank]


def pick_shapes(path, sample: int, seed: int, exclude=()) -> list[tuple[int, int, int]]:
    """The shapes of `path` (a CSV, or a list of shapes) less `exclude`; `sample` of them drawn
    with `seed` (0 = all)."""
    skip = set(map(tuple, exclude))
    shapes = [s for s in all_shapes(path) if s not in skip]
    if sample and sample < len(shapes):
        shapes = sorted(random.Random(seed).sample(shapes, sample))
    return shapes


def all_shapes(path) -> list[tuple[int, int, int]]:
    if isinstance(path, (list, tuple)):
        return [tuple(int(x) for x in s) for s in path]
    return [(s.M, s.N, s.K) for s in read_shapes(path)]


def open_table(cfg: RLConfig, log: "RunLog"):
    """The reward table (rl.table) the run's rewards come from without a GPU, or None for
    --table none. A table with nothing for this arch is an error naming it: the run does not
    fall back to estimates."""
    if cfg.table == "none":
        return None
    paths = [Path(p) for p in cfg.table.split(",") if p] if cfg.table else default_paths()
    if not paths:
        where = "holds no results.db.gz" if REPORTS.is_dir() else "is absent (no committed DBs here)"
        raise ValueError(f"reward table: {REPORTS} {where}; name results DBs with --table, or "
                         "--table none")
    table = RewardTable.open(paths, gpu=cfg.table_gpu or None, arch=cfg.arch, acc=cfg.acc)
    if not len(table):
        raise ValueError(f"{table.describe()}: nothing measured for {cfg.arch}"
                         + (f" on {cfg.table_gpu}" if cfg.table_gpu else "")
                         + f" in {', '.join(map(str, paths))}: a GPU call must fill it first")
    log(table.describe(), type="table", paths=[str(p) for p in paths], gpu=table.gpu)
    return table


def choose_shapes(cfg: RLConfig, log: "RunLog", db_path: Path, gpu: str,
                  table=None) -> list[tuple[int, int, int]]:
    """The training shapes (--shapes, else the table's): launch-bound shapes (baseline kernel
    time within 2x the launch floor) are left out with the reason logged (--launch-bound skip)
    or kept and said so."""
    source = cfg.shapes or (table.shapes() if table is not None else "")
    if not source:
        raise ValueError("no training shapes: --shapes FILE, or a reward table (--table) to train on "
                         "the shapes it measured")
    everything = all_shapes(source)
    db = None
    if gpu and db_path.exists():
        db = ResultsDB(db_path, readonly=True)
    bound = launch_bound(everything, db=db, gpu=gpu, baseline=cfg.baseline, mode=cfg.mode,
                         floor_us=cfg.launch_floor_us, arch=cfg.arch, table=table)
    if cfg.launch_bound == "skip" and bound:
        for shape, why in bound.items():
            log(type="launch_bound", shape=list(shape), left_out=True, reason=why)
        ex = next(iter(bound.values()))
        log(f"left out {len(bound)}/{len(everything)} launch-bound shape(s) of "
            f"{cfg.shapes or 'the reward table'}: their "
            f"baseline kernel time is within 2x the launch floor ({cfg.launch_floor_us:g} us), where "
            f"candidates differ by launch noise (e.g. {ex}); every reason is in log.jsonl; "
            "--launch-bound keep trains on them", type="launch_bound_summary", left_out=len(bound))
        shapes = pick_shapes(source, cfg.sample, cfg.seed, exclude=bound)
        if not shapes:
            raise ValueError(f"every shape of {cfg.shapes or 'the reward table'} is launch-bound (baseline kernel time "
                             f"< 2 x {cfg.launch_floor_us:g} us); use --launch-bound keep")
        return shapes
    shapes = pick_shapes(source, cfg.sample, cfg.seed)
    for s in shapes:
        if s in bound:
            log(f"kept launch-bound shape {bound[s]}: finals sample as the harness does (until the "
                "interval is 0.5% tight, 60 rounds or 4 s)", type="launch_bound", shape=list(s),
                left_out=False, reason=bound[s])
    return shapes


def _fmt_shape(s) -> str:
    return f"{s[0]}x{s[1]}x{s[2]}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _fmt(x, spec="+.3f") -> str:
    return "n/a" if x is None else format(x, spec)


def step_line(step: int, steps: int, summ: dict, trl: dict, reward, cfg: RLConfig, best_txt: str) -> str:
    """The one line a step prints: our reward statistics, trl's group statistics and gradient,
    what compiled / was correct / was faster, the best per shape, and how the rewards were made."""
    line = (f"step {step}/{steps}  reward mean {_fmt(summ.get('reward_mean'))} "
            f"std {_fmt(summ.get('reward_std'), '.3f')} max {_fmt(summ.get('reward_max'))}  "
            f"trl: reward_std {_fmt(trl.get('reward_std'), '.3f')} "
            f"frac_reward_zero_std {_fmt(trl.get('frac_reward_zero_std'), '.2f')} "
            f"grad_norm {_fmt(trl.get('grad_norm'), '.4g')} loss {_fmt(trl.get('loss'), '.4g')}  "
            f"compiled {_pct(summ.get('frac_compiled'))} "
            f"correct {_pct(summ.get('frac_correct'))}"
            f"{' (no GPU: not checked)' if reward.estimated else ''} "
            f"faster-than-{cfg.baseline} {_pct(summ.get('frac_faster'))}  best: {best_txt}")
    return line


def _bests_line(reward, shapes) -> str:
    """How many shapes got a kernel: correct and re-measured on a GPU; without one, built and
    audited, and how many of those a binary the reward table measured."""
    if not reward.estimated:
        return f"{len(reward.best)}/{len(shapes)} shapes with a correct kernel"
    ranked = reward.best_estimated.values()
    return (f"{len(ranked)}/{len(shapes)} shapes with a built kernel, "
            f"{sum(a.table == 'hit' for a in ranked)} of them measured (reward table)")


def _best_how(a) -> str:
    """How a shape's best so far was timed, for the step line."""
    if a.table == "hit":
        return " (measured: reward table" + (", vs its fastest binary there: no baseline time in it)"
                                             if a.versus else ")")
    return " (estimated)" if a.estimated else " (re-measured)"


def _make_callback(reward, cfg: RLConfig, shapes, log: RunLog, out: Path, state: dict, executor=None):
    from transformers import TrainerCallback

    class StepLogger(TrainerCallback):
        """One log line per optimiser step, printed when trl logs the step's metrics (reward std,
        frac_reward_zero_std, grad_norm come from there); export of new verified winners."""

        def on_step_end(self, args, tstate, control, **kw):
            step = tstate.global_step
            new = reward.attempts[state["seen"]:]
            state["seen"] = len(reward.attempts)
            attempts = [a for batch in new for a in batch if a is not None]
            summ = reward.step_summary(attempts) if attempts else {"n": 0}
            # without a GPU: the best estimates, a ranking (flagged), never references
            best_now = dict(reward.best_estimated if reward.estimated else reward.best)
            improved = [s for s, a in best_now.items()
                        if s not in state["best"] or a.speedup > state["best"][s]]
            state["best"] = {s: a.speedup for s, a in best_now.items()}
            best_txt = ", ".join(f"{_fmt_shape(s)} {best_now[s].speedup:.2f}x"
                                 + _best_how(best_now[s]) if s in best_now
                                 else f"{_fmt_shape(s)} -" for s in shapes[:8])
            if len(shapes) > 8:
                best_txt += f", ... ({len(best_now)}/{len(shapes)} shapes with a verified kernel)"
            state["pending"] = {"step": step, "summ": summ, "attempts": attempts,
                                "best": best_now, "best_txt": best_txt, "improved": improved}
            if not getattr(args, "logging_steps", 1) == 1:     # trl will not log this step
                self._emit(args, {})

        def on_log(self, args, tstate, control, logs=None, **kw):
            if state.get("pending") and logs and ("loss" in logs or "reward" in logs):
                self._emit(args, logs)

        def _emit(self, args, trl_logs: dict):
            p = state.pop("pending")
            step, summ, attempts = p["step"], p["summ"], p["attempts"]
            line = step_line(step, cfg.steps, summ, trl_logs, reward, cfg, p["best_txt"])
            errors = [a for a in attempts if a.verdict == "error"]
            if errors:   # the harness failed (not the kernel): no reward, and the cause must show
                line += f"  HARNESS ERRORS {len(errors)}/{len(attempts)} (no reward): {errors[0].detail[:200]}"
            if executor is not None:
                line += "  " + executor.throughput()
            if reward.estimated:
                line += "  " + reward.estimate_note()
                if reward.table is not None:
                    line += "  " + table_note(summ, reward)
            trl_keep = {k: trl_logs.get(k) for k in ("reward", "reward_std", "frac_reward_zero_std",
                                                      "grad_norm", "loss") if k in trl_logs}
            log(line, type="step", step=step, summary=summ, trl=trl_keep,
                best={_fmt_shape(s): {"speedup": a.speedup, "sha": a.sha, "estimated": a.estimated,
                                      "verified": a.verified}
                      for s, a in p["best"].items()},
                attempts=[a.to_dict() for a in attempts], estimated=reward.estimated,
                throughput=executor.throughput() if executor is not None else None)
            state["steps"].append({"step": step, **summ, **{f"trl_{k}": v for k, v in trl_keep.items()},
                                   "best_mean": (sum(state["best"].values()) / len(state["best"])
                                                 if state["best"] else None)})
            if cfg.export and p["improved"]:
                _export(reward, cfg, p["improved"], log, out, step)

    return StepLogger()


def table_note(summ: dict, reward) -> str:
    """What the reward table answered this step; with no hit, what is missing and where the
    kernels wait for a GPU."""
    hits, misses = summ.get("table_hits", 0), summ.get("table_misses", 0)
    line = (f"table: {hits} hit(s), {misses} miss(es) queued ({len(reward.queue.rows())} "
            "kernel x shape in the queue)")
    if not hits:
        line += (f" (no speed term this step: the table ({reward.table.describe()}) lacks the "
                 f"kernels the policy wrote; they wait in {reward.queue.path} for the next GPU call)")
    return line


def _quiet_progress(trainer, log: RunLog):
    """Keep transformers' progress bar, but send trl's per-step metric dicts to log.jsonl
    instead of the terminal (our step line says what matters)."""
    from transformers.trainer_callback import ProgressCallback

    class QuietProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                log(type="trl", step=state.global_step, metrics=logs)
                shown = {k: logs[k] for k in ("reward_std", "grad_norm", "loss") if k in logs}
                if shown:       # GRPO learns only where rewards differ within a group
                    print(f"  step {state.global_step} trl: " + "  ".join(
                        f"{k} {v:.4g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in shown.items()),
                        flush=True)

    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgress())


def _quiet_libraries():
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    try:
        import datasets
        datasets.utils.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except Exception:
        pass
    try:
        import transformers
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass


def _export(reward, cfg: RLConfig, improved, log: RunLog, out: Path, step: int):
    """New best kernels -> generated_kernels/ through cudal2.runs.export (measured winners only)."""
    if reward.estimated:
        log(f"  export: {len(improved)} shape(s) improved without a GPU (estimates, or reward-table hits of "
            f"binaries a GPU already timed); nothing exported (export admits winners measured in this run, "
            f"and there is no GPU)", type="export", step=step, exported=0)
        return
    # verified rows only: a new best counts (and exports) after its fresh re-measurement
    evs = [ev for (sha, shape), ev in reward.evaluations.items()
           if shape in set(improved) and reward.verified(ev)]
    res = export(evs, sources_from(reward.db, [out / "sources"]), root=cfg.kernels_dir or None,
                 mode=cfg.mode, report=str(out), gpu=reward.gpu or None)
    for d in res.decisions:
        log(f"  export {'+' if d.exported else '-'} {d.key[3]}x{d.key[4]}x{d.key[5]}: {d.reason}",
            type="export", step=step, exported=d.exported, reason=d.reason, sha=d.source_sha)


def _dataset(shapes, cfg: RLConfig, style: str, reward, prompt_shapes: dict | None = None):
    """One row per shape (M, N, K columns for the reward); the prompt is built when a row is read,
    so full-style prompts carry feedback from the attempts so far. `prompt_shapes` learns each
    prompt's shape (multi-turn rollouts see prompts only)."""
    from datasets import Dataset

    ds = Dataset.from_dict({"M": [s[0] for s in shapes], "N": [s[1] for s in shapes],
                            "K": [s[2] for s in shapes]})

    def attempts_for(shape):
        return [a for batch in reward.attempts for a in batch if a is not None and a.shape == shape]

    def transform(batch):
        out = {"M": batch["M"], "N": batch["N"], "K": batch["K"], "prompt": []}
        for m, n, k in zip(batch["M"], batch["N"], batch["K"]):
            shape = (int(m), int(n), int(k))
            text = make_prompt(style, shape, cfg.arch, cfg.acc, baseline=cfg.baseline,
                               best=reward.best, attempts=attempts_for(shape) if style == "full" else None)
            out["prompt"].append([{"role": "user", "content": text}])
            if prompt_shapes is not None:
                prompt_shapes[text] = shape
        return out

    return ds.with_transform(transform)


def checkpoint_args(cfg: RLConfig) -> dict:
    """trl/transformers save settings: checkpoints (the weights plus the optimizer's two moments
    per weight) only when asked, or when resuming (a run that resumes
    is one that is continued); a demo keeps only its outputs and the final policy."""
    if not (cfg.save_checkpoints or cfg.resume):
        return {"save_strategy": "no"}
    return {"save_strategy": "steps", "save_steps": cfg.save_steps or max(1, min(50, cfg.steps)),
            "save_total_limit": 2}


def _last_checkpoint(d: Path):
    from transformers.trainer_utils import get_last_checkpoint
    return get_last_checkpoint(str(d)) if d.is_dir() else None


def _restore(reward, out: Path):
    """On --resume: the best kernel per shape from the previous log, sources from sources/."""
    logp = out / "log.jsonl"
    if not logp.exists():
        return 0
    n = 0
    for line in logp.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") != "step":
            continue
        for a in rec.get("attempts", []):
            if a.get("speedup") is None or a.get("verdict") not in ("ok", "not_measured"):
                continue
            if not a.get("verified", a.get("estimated")):     # unconfirmed measurements never lead
                continue
            shape = tuple(a["shape"])
            src = out / "sources" / f"{a['sha']}.cu"
            att = Attempt.from_dict(a, cached=True, source=src.read_text() if src.exists() else "")
            if shape not in reward.best or att.speedup > reward.best[shape].speedup:
                reward.best[shape] = att
                n += 1
    return n


def write_outputs(reward, shapes, steps: list[dict], out: Path, cfg: RLConfig) -> dict:
    """best_kernels.csv, kernels/<M>_<N>_<K>.cu, reward_curve.png."""
    kdir = out / "kernels"
    kdir.mkdir(exist_ok=True)
    rows = []
    per_shape = {}
    for batch in reward.attempts:
        for a in batch:
            if a is not None:
                per_shape.setdefault(a.shape, []).append(a)
    for s in shapes:
        atts = per_shape.get(s, [])
        best = reward.best.get(s) or reward.best_estimated.get(s)   # estimated: a ranking, flagged
        fname = ""
        if best is not None and best.source:
            fname = f"kernels/{s[0]}_{s[1]}_{s[2]}.cu"
            (out / fname).write_text(best.source)
        rows.append({"M": s[0], "N": s[1], "K": s[2], "attempts": len(atts),
                     "compiled": sum(a.compiled for a in atts),
                     "distinct_sources": len({a.sha for a in atts if a.sha}),
                     "best_speedup": f"{best.speedup:.4f}" if best else "",
                     "baseline": cfg.baseline, "mode": cfg.mode,
                     "estimated": int(best.estimated) if best else "",
                     "table_hit": int(best.table == "hit") if best else "",
                     "best_verdict": best.verdict if best else "",
                     "best_reward": f"{best.reward:.4f}" if best and best.reward is not None else "",
                     "sha256": best.sha if best else "", "file": fname,
                     "eval_id": best.eval_id if best else ""})
    with (out / "best_kernels.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["M", "N", "K"])
        w.writeheader()
        w.writerows(rows)
    plot_curve(steps, out / "reward_curve.png", estimated=reward.estimated, baseline=cfg.baseline)
    return {"rows": rows}


def plot_curve(steps: list[dict], path: Path, *, estimated: bool, baseline: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [s["step"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("reward_mean", "reward mean"), ("reward_max", "reward max")):
        ys = [s.get(key) for s in steps]
        ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
    ax.plot(xs, [s.get("frac_compiled", float("nan")) for s in steps], marker=".", ls="--",
            label="fraction compiled")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"reward (log speedup vs {baseline}, clipped)")
    title = "cudal2 RL reward"
    if estimated:
        title += " (ESTIMATED: no GPU, cost-model rewards)"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: RLConfig) -> dict:
    t0 = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.num_generations < 2:
        raise ValueError("--num-generations must be >= 2 (GRPO compares completions within a group)")
    if cfg.steps < 1:
        raise ValueError("--steps must be >= 1")
    if cfg.prompt_style and cfg.prompt_style not in ("full", "brief", "compact"):
        raise ValueError(f"--prompt-style must be full, brief or compact, got {cfg.prompt_style!r}")
    if cfg.turns < 1 or cfg.num_generations % cfg.turns:
        raise ValueError(f"--turns must be >= 1 and divide --num-generations ({cfg.num_generations})")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    # under `accelerate launch` (or DeepSpeed): rank 0 alone evaluates kernels and writes the DB,
    # the log and the outputs (RankZeroReward); every rank trains on its share of each batch
    pstate = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch
        from accelerate import PartialState
        # transformers makes the same state from use_cpu (below): on a CPU, gloo processes
        pstate = PartialState(cpu=not torch.cuda.is_available())
    main = pstate is None or pstate.is_main_process
    log = RunLog(out / "log.jsonl", enabled=main)
    db_path = Path(cfg.db) if cfg.db else out / "results.db"
    table = open_table(cfg, log)      # every rank: the training shapes come from it
    shapes = choose_shapes(cfg, log, db_path, visible_gpu_name(), table)
    if main:
        print(f"cudal2_rl.train: {cfg.steps} GRPO steps on {len(shapes)} shape(s) "
              f"({', '.join(_fmt_shape(s) for s in shapes[:6])}{' ...' if len(shapes) > 6 else ''}) "
              f"from {cfg.shapes or 'the reward table'}, policy {cfg.policy}, arch {cfg.arch}, acc {cfg.acc}, "
              f"reward vs {cfg.baseline} ({cfg.mode}); output -> {out}", flush=True)

    _quiet_libraries()
    import torch


    recipe = SMALL_RECIPE if cfg.small_builtin else BuiltinRecipe(arch=cfg.arch, accs=(cfg.acc,))
    model, tok = load_policy(cfg.policy, recipe=recipe, log=print if main else (lambda *a: None))
    builtin = is_builtin(cfg.policy)
    style = cfg.prompt_style or default_style(cfg.policy)
    temperature, min_p = default_sampling(cfg.policy, cfg.temperature, cfg.min_p)
    executor = reward = None
    if main:
        executor = make_executor(cfg.executor, address=cfg.address or None, jobs=cfg.jobs or None,
                                 screen=cfg.screen, finals_per_group=cfg.finals_per_group)
        db = ResultsDB(db_path)
        queue = Queue(cfg.queue or out / "queue.jsonl") if table is not None else None
        reward = KernelReward(executor, db, arch=cfg.arch, baseline=cfg.baseline, mode=cfg.mode,
                              timeout_s=cfg.timeout, sources_dir=out / "sources",
                              table=table, queue=queue)
    reward_fn = reward
    if pstate is not None:
        from accelerate.utils import broadcast_object_list
        box = [reward.estimated if main else None]
        broadcast_object_list(box, from_process=0)
        reward_fn = RankZeroReward(reward, pstate, estimated=box[0])
        log(f"{pstate.num_processes} training processes ({pstate.distributed_type}, backend "
            f"{pstate.backend}): rank 0 evaluates every rank's completions and alone writes the "
            "results DB, the log and the outputs", type="distributed", processes=pstate.num_processes,
            backend=str(pstate.backend))
    if main:
        log(f"executor: {executor.describe()}; results DB: {db_path}", type="setup",
            executor=executor.describe(), db=str(db_path), shapes=[list(s) for s in shapes],
            policy=cfg.policy, style=style, config=vars(cfg))
    if main and reward.estimated:
        log("no GPU is visible here: kernels are built and audited but not run; "
            + ("a kernel whose binary the reward table measured at the shape gets its measured "
               f"reward ({table.describe()}), one it lacks the flat reward and a place in the queue "
               f"{reward.queue.path} for the next GPU call; "
               if table is not None else "every kernel that passes gets one flat reward; ")
            + "kernel times estimated from each build rank them in the logs only "
            + reward.estimate_note() + ". " + executor.throughput(), type="estimated")

    from trl import GRPOConfig, GRPOTrainer
    per_step = cfg.prompts_per_step or min(len(shapes), 4)
    use_cpu = not torch.cuda.is_available()
    # --prompts-per-step counts shapes per optimiser step over all processes where it divides;
    # multi-turn rollouts build trajectories from whole groups, so there each rank holds whole groups
    world = pstate.num_processes if pstate is not None else 1
    batch = per_step * cfg.num_generations
    if cfg.turns > 1 and (batch // world) % cfg.num_generations:
        world = 1
    gargs = GRPOConfig(
        output_dir=str(out / "checkpoints"), max_steps=cfg.steps,
        per_device_train_batch_size=batch // world if batch % world == 0 else batch,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length or default_max_tokens(cfg.policy),
        learning_rate=cfg.learning_rate or (5e-4 if builtin else 1e-6),
        temperature=temperature, min_p=min_p or None, beta=cfg.beta, logging_steps=1,
        **checkpoint_args(cfg),
        report_to="none", use_cpu=use_cpu, bf16=False, seed=cfg.seed, data_seed=cfg.seed,
        use_vllm=cfg.vllm, disable_tqdm=False, log_level="warning",
        top_k=0)
    if cfg.vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise SystemExit("--vllm: vLLM is not installed here (pip install vllm)") from None
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig
        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    state = {"seen": 0, "best": {}, "steps": []}
    resume = None
    if cfg.resume:
        resume = _last_checkpoint(out / "checkpoints")
        if resume is None:
            print(f"--resume: no checkpoint in {out / 'checkpoints'}; starting fresh")
        elif main:
            n = _restore(reward, out)
            state["best"] = {s: a.speedup for s, a in reward.best.items()}
            for line in (out / "log.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if rec.get("type") == "step":
                    state["steps"].append({"step": rec["step"], **rec["summary"]})
            log(f"resuming from {resume} ({n} best kernels restored from the log)", type="resume")
    prompt_shapes: dict = {}
    rollout = None
    if cfg.turns > 1:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        rollout = make_rollout(reward_fn, turns=cfg.turns, gamma=cfg.gamma, style=style,
                               prompt_shapes=prompt_shapes, log=log)
        log(f"multi-turn: {cfg.turns} turns per trajectory, {cfg.num_generations // cfg.turns} "
            f"trajectories per group, discount {cfg.gamma:g}", type="multiturn")
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=gargs,
                          train_dataset=_dataset(shapes, cfg, style, reward_fn, prompt_shapes),
                          processing_class=tok, peft_config=peft_config, rollout_func=rollout,
                          callbacks=[_make_callback(reward, cfg, shapes, log, out, state, executor)]
                          if main else [])
    if main:
        _quiet_progress(trainer, log)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        if executor is not None:
            executor.close()
    trainer.save_model(str(out / "policy"))     # every rank calls it; the main process writes
    if not main:
        return {"seconds": time.time() - t0, "steps": [], "best": reward_fn.best, "reward": reward_fn}
    if checkpoint_args(cfg)["save_strategy"] == "no":
        try:                    # transformers makes output_dir even when it saves nothing there
            (out / "checkpoints").rmdir()
        except OSError:         # not empty (an earlier run's checkpoints) or already absent
            pass
    write_outputs(reward, shapes, state["steps"], out, cfg)
    secs = time.time() - t0
    log(f"done in {secs:.0f}s: {reward.n_evaluated} harness evaluations, {reward.n_cached} cache hits, "
        f"{reward.n_remeasured} new bests re-measured; {executor.throughput()}; {_bests_line(reward, shapes)}"
        + (f"  {reward.estimate_note()}" if reward.estimated else ""),
        type="done", seconds=round(secs, 1), evaluations=reward.n_evaluated, cached=reward.n_cached,
        table_reads=len(reward.table_reads), table_gpu_seconds=round(sum(reward.table_reads.values()), 3),
        remeasured=reward.n_remeasured, fresh=executor.fresh, gpu_seconds=round(executor.gpu_seconds, 3))
    _show_written(reward, out)
    print("outputs: " + ", ".join(output_list(reward, db_path, out)))
    return {"seconds": secs, "steps": state["steps"], "best": reward.best, "reward": reward}


def output_list(reward, db_path, out: Path) -> list[str]:
    """Every path the run wrote, as the closing line names them."""
    paths = [f"{db_path} (results DB)", str(out / "log.jsonl"), str(out / "reward_curve.png"),
             str(out / "best_kernels.csv"), f"{out / 'kernels'}/ (best source per shape)",
             f"{out / 'sources'}/ (every evaluated source)"]
    if reward.queue is not None and reward.queue.path.is_file():
        paths.append(f"{reward.queue.path} (the kernels the table lacks: the next GPU call screens them)")
    if (out / "checkpoints").is_dir():
        paths.append(f"{out / 'checkpoints'}/ (optimizer checkpoints for --resume)")
    return paths + [f"{out / 'policy'}/ (trained policy)"]


def _show_written(reward, out: Path, head: int = 14) -> None:
    """What the policy wrote: the head of one best kernel, or when none built, of the last
    completion the harness saw with its verdict (the main job's point is to show this)."""
    shown = next(iter(sorted((out / "kernels").glob("*.cu"))), None)
    if shown is not None:
        lines = shown.read_text().splitlines()
        print(f"the policy wrote ({shown}, {len(lines)} lines):\n" + "\n".join(lines[:head]) + "\n  ...")
        return
    last = next((a for batch in reversed(reward.attempts) for a in reversed(batch) if a.source.strip()), None)
    if last is None:
        return
    lines = last.source.splitlines()
    why = f": {last.detail.splitlines()[0][:160]}" if last.detail else ""
    print(f"the policy wrote (no kernel built; last completion for {'x'.join(map(str, last.shape))}, "
          f"verdict {last.verdict}{why}; {len(lines)} lines):\n" + "\n".join(lines[:head]) + "\n  ...")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)


def run_cli(args) -> int:
    try:
        run(from_args(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"cudal2_rl.train: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.train",
                                     description="GRPO training of a kernel-writing policy against the cudal2 harness.")
    configure_parser(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
