"""Per deep-K target: the streamk (config, options) of the whole sm_90a RR space that the H200
budget ranks fastest among those its rule keeps (Budget.deep_k_problems; 128x128x2048: the
reduction bound alone, as the planner does), with ptxas's registers from a space build's CSV.
`--old` prices every build as before the batched and two-level reducers (budget's batched=False,
two_level=False), for comparison.

    python reports/cpu/2026-11-29-deepk-two-level/best_in_space.py SPACE.csv.gz [--old]
"""
import csv
import gzip
import sys

from cudal2.core.devices import GPUS
from cudal2.templates import FAMILIES
from cudal2.templates.budget import budget
from cudal2.templates.family import enumerate_space

old = "--old" in sys.argv
regs = {r["label"]: int(r["registers"]) for r in csv.DictReader(gzip.open(sys.argv[1], "rt")) if r["registers"]}
how = {"batched": False, "two_level": False} if old else {}
ROWS = [(128, 64, 12288), (128, 128, 16384), (256, 128, 8192), (1024, 256, 16384), (128, 128, 2048)]
MEASURED = {(128, 64, 12288): 7.67, (128, 128, 16384): 8.34, (256, 128, 8192): 8.28,
            (1024, 256, 16384): 20.69, (128, 128, 2048): 6.50}   # H200 2026-11-26, fastest baseline
options = [{"splits": s, "decomposition": 2 if s else 3} for s in range(65)]
space = [c for c in enumerate_space(FAMILIES["streamk"], arch="sm_90a", layout="RR") if c.label() in regs]
print(f"{len(space)} RR configs with ptxas registers; reducers: {'before' if old else 'today'}")
print("| row | best streamk (H200 budget) | options | grid, slots busy | reduction | time terms | predicted | fastest baseline, measured | predicted ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for shape in ROWS:
    best = None
    for c in space:
        for o in options:
            b = budget(c, shape, GPUS["H200"], options=o, registers=regs[c.label()], **how)
            if not b.deep_k_problems(slots=shape != (128, 128, 2048)) and (best is None or b.t_us < best.t_us):
                best = b
    p = dict(kv.split("=") for kv in best.label.split(":", 1)[1].split(","))
    name = f"{p['BM']}x{p['BN']}x{p['BK']} w{p['WM']}x{p['WN']} s{p['STAGES']} ({best.registers} regs)"
    print(f"| {'x'.join(map(str, shape))} | {name} | splits {best.options['splits']} dec {best.options['decomposition']} | "
          f"{best.decomposition} {best.splits}, {best.grid} CTAs, {best.slots_busy:.0%} of {best.slots} | "
          f"{best.reduction} {best.reduction_bytes / 2**20:.2f} of {best.operand_bytes / 2**20:.2f} MiB | "
          f"floor {best.t_floor_us:.2f} + waves {best.t_stream_us:.2f} + reduction {best.t_reduce_us:.2f} | "
          f"{best.t_us:.2f} us | {MEASURED[shape]:.2f} us | {MEASURED[shape] / best.t_us:.2f} |")
