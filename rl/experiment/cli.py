"""The command: `python -m cudal2_rl.experiment [run options]` runs the experiment (or one
`--shard i/n` of it) over a reward table on the CPU; `python -m cudal2_rl.experiment merge OUT...
--out DIR` merges shards. docs/experiment.md."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cudal2_rl.experiment import arms as A
from cudal2_rl.experiment import heldout as H
from cudal2_rl.experiment import prior
from cudal2_rl.experiment.budget import Budget
from cudal2_rl.experiment.rlrun import read_rl_run
from cudal2_rl.experiment.run import Setup, execute


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", nargs="+", required=True, help="results DB(s) the reward table reads")
    p.add_argument("--gpu", default=None, help="the table's GPU model (default: the one with most rows)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--acc", default="f32", choices=("f32", "f16"))
    p.add_argument("--layout", default=None)
    p.add_argument("--arms", nargs="+", default=list(A.ARMS), choices=A.ARMS)
    p.add_argument("--rl-policy", default=None, help="the policy/ folder of a cudal2_rl.train run")
    p.add_argument("--rl-log", default=None, help="that run's log.jsonl (default <rl-policy>/../log.jsonl)")
    p.add_argument("--sft-policy", default="builtin", help="'builtin', a model folder or a cached HF name")
    p.add_argument("--small-builtin", action="store_true", help="'builtin' means the small test recipe")
    p.add_argument("--train-shapes", nargs="*", default=[], help="more training shape files: held out "
                   "of the test set, and fitted by tune's cost model")
    p.add_argument("--heldout", type=int, default=0, help="held-out shapes drawn, stratified by size "
                   "(0 = every eligible table shape)")
    p.add_argument("--heldout-shapes", default=None, help="an explicit held-out shape file")
    p.add_argument("--seed", type=int, default=0, help="the held-out draw's and the bootstrap's seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="each arm searches once per seed")
    p.add_argument("--budget", type=int, default=16, help="evaluations per arm and shape")
    p.add_argument("--budget-gpu-s", type=float, default=None, help="also cap the GPU-seconds of rows read")
    p.add_argument("--max-rounds", type=int, default=4, help="sampling rounds per shape for a policy arm")
    p.add_argument("--tune-strategy", default="evolve", choices=("evolve", "rank"))
    p.add_argument("--population", type=int, default=4, help="tune's evolve: the model's favourites read first")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th held-out shape from i (merge them)")
    p.add_argument("--allow-small", action="store_true", help="allow < 32 shapes or < 3 seeds: a pilot")
    p.add_argument("--out", default="runs/experiment")


def _grid() -> set:
    from cudal2_rl.policy import grid_shapes
    return set(grid_shapes())


def exclusions(args, arms, rl_run, notes: list) -> dict[str, set]:
    """{what: shapes} kept out of the held-out set: the grid, each policy's warm start, the RL
    run's training shapes and any --train-shapes."""
    from cudal2.search.tune import read_shapes
    from cudal2_rl.policy import warm_start_shapes
    out = {"the grid": _grid()}
    starts = {"sft": args.sft_policy, "rl": rl_run.config.get("policy") if rl_run else None}
    for arm, name in starts.items():
        if arm in arms and name:
            out[f"{arm} warm start"], where = warm_start_shapes(name, small_builtin=args.small_builtin)
            notes.append(f"{arm} warm start: {len(out[f'{arm} warm start'])} shapes from {where}")
    if rl_run:
        out["RL training"] = set(rl_run.shapes)
    for f in args.train_shapes:
        out[f"training ({f})"] = {H.key(s) for s in read_shapes(f)}
    return out


def proposers(args, arms, rl_run, notes: list) -> dict:
    from cudal2_rl.experiment.policies import arm_settings, lm_proposer
    out = {}
    for arm in (a for a in A.POLICY_ARMS if a in arms):
        name = args.rl_policy if arm == "rl" else args.sft_policy
        st = arm_settings(name, rl_run.config if arm == "rl" else None, style=rl_run.style if arm == "rl" else "")
        st.temperature = args.temperature if args.temperature is not None else st.temperature
        st.min_p = args.min_p if args.min_p is not None else st.min_p
        notes.append(f"{arm}: {name} ({st.style} prompts, {st.max_new_tokens} tokens, "
                     f"temperature {st.temperature:g}, min_p {st.min_p:g})")
        out[arm] = lm_proposer(st, arch=args.arch, acc=args.acc, small_builtin=args.small_builtin)
    return out


def plan(args, table, arms: list, notes: list) -> tuple[Setup, object, object]:
    """(setup, the RL run or None, tune's cost model) for this command line and table."""
    from cudal2.search.tune import read_shapes
    rl_run = None
    if "rl" in arms:
        rl_run = read_rl_run(args.rl_log or Path(args.rl_policy).expanduser().parent / "log.jsonl")
        notes.append(f"RL run {rl_run.log}: {len(rl_run.shapes)} training shapes; charged {rl_run.how}")
    excl = exclusions(args, arms, rl_run, notes)
    explicit = read_shapes(args.heldout_shapes) if args.heldout_shapes else None
    heldout = H.choose(table.shapes(), excl, n=args.heldout, seed=args.seed, explicit=explicit)
    bare = [s for s in heldout if not table.entries(s)]
    notes.append(f"held-out: {len(heldout)} shapes ({len(bare)} without table rows yet: they remain), "
                 "disjoint from (checked) " + ", ".join(f"{w} ({len(v)})" for w, v in excl.items()))
    pilot = H.check_size(len(heldout), len(set(args.seeds)), args.allow_small)
    budget = Budget(args.budget, args.budget_gpu_s, rl_run.reads if rl_run else 0,
                    rl_run.gpu_seconds if rl_run else 0.0, n_shapes=len(heldout))
    training = set().union(*(v for w, v in excl.items() if w.startswith(("RL training", "training"))))
    if "tune" in arms and not training & set(table.shapes()):
        raise ValueError("tune's cost model needs training shapes with table rows: pass --rl-policy or --train-shapes")
    model = prior.fit(table, training)
    notes.append(f"tune: cost model fitted on {model.n_fit} table rows at {len(training & set(table.shapes()))} "
                 f"training shapes, strategy {args.tune_strategy}")
    setup = Setup(heldout, arms, list(dict.fromkeys(args.seeds)), budget,
                  {"gpu": table.gpu, "arch": table.arch, "paths": [str(p) for p in table.paths]},
                  args.max_rounds, args.tune_strategy, args.population, args.seed, pilot,
                  H.parse_shard(args.shard), notes)
    return setup, rl_run, model


def run_command(args, command: str) -> dict:
    from cudal2_rl.experiment.policies import Keyer
    from cudal2_rl.table import Queue, RewardTable
    arms = [a for a in args.arms if not (a == "rl" and not args.rl_policy) and not (a == "sft" and not args.sft_policy)]
    if not arms:
        raise ValueError("no arm to run (the RL arm needs --rl-policy)")
    table = RewardTable.open(args.table, gpu=args.gpu, arch=args.arch, acc=args.acc, layout=args.layout)
    notes = [f"table: {table.describe()}"]
    setup, rl_run, model = plan(args, table, arms, notes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return execute(table, setup, proposers=proposers(args, arms, rl_run, notes), keyer=Keyer(table, args.arch),
                   model=model, out=out, queue=Queue(out / "queue.jsonl"), command=command)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    merging = bool(argv) and argv[0] == "merge"
    p = argparse.ArgumentParser(prog="python -m cudal2_rl.experiment" + (" merge" if merging else ""),
                                description="Does RL learn a better search prior over a measured space "
                                            "than search does? (docs/experiment.md)")
    if merging:
        p.add_argument("runs", nargs="+", help="experiment output folders (shards or reruns)")
        p.add_argument("--out", required=True)
    else:
        configure_parser(p)
    args = p.parse_args(argv[1:] if merging else argv)
    command = "python -m cudal2_rl.experiment " + " ".join(argv)
    try:
        if merging:
            from cudal2_rl.experiment.merge import merge
            doc = merge(args.runs, args.out, command=command)
        else:
            doc = run_command(args, command)
    except (ValueError, FileNotFoundError) as exc:
        print(f"cudal2_rl.experiment: error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "table.md").read_text())
    return 0 if doc else 1
