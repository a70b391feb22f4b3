"""The RL-vs-search experiment (docs/experiment.md): does RL learn a better search prior over a
measured space than search does? Every arm searches the reward table's entries at held-out
shapes, so every evaluation is a table read and every regret is exact.

    rlrun.py       the RL run's log: training shapes and the training reads charged to RL
    heldout.py     the held-out shapes (disjointness checks) and shards
    budget.py      evaluations and GPU-seconds per arm and shape; RL's training charge
    prior.py       tune's prior: entries' configs, the cost model fitted on training rows
    arms.py        the arms' searches over one shape's entries (table reads)
    policies.py    the policy arms' proposers (an LM sampled as in training) and the binary keyer
    run.py         one run or shard: every arm, shape and seed -> rows
    statistics.py  ratios to the exhaustive best, paired ratios, nested bootstrap, fast_1
    report.py      the outputs: table.md / README.md (the answer), CSVs, confirm.jsonl
    merge.py       shards of one experiment into one report
    cli.py         the command (`python -m cudal2_rl.experiment`, `... merge`)

The entry points are `python -m cudal2_rl.experiment` (__main__.py) and `python -m cudal2_rl
experiment` (rl/__main__.py); both call cli.main. This file imports nothing, so importing any
one module does not load the others.
"""
