"""Per deep-K target of a campaign pack: its screenings (all families, streamk's), and the streamk
(config, options) the H200 budget ranks fastest with ptxas's registers, with its terms.

    python reports/cpu/2026-11-29-deepk-budget/best_packed.py PACK_DIR     # e.g. .gpu_campaign
"""
import json, sys, collections
from cudal2.templates import KernelConfig
from cudal2.templates.budget import budget
from cudal2.core.devices import GPUS
m = json.load(open(sys.argv[1] + "/manifest.json"))
rows = [(128, 64, 12288), (128, 128, 16384), (256, 128, 8192), (1024, 256, 16384), (128, 128, 2048)]
per = collections.defaultdict(lambda: collections.Counter())
best = {}
for c in m["candidates"]:
    sweeps = c["sweeps"]
    sweeps = eval(sweeps) if isinstance(sweeps, str) else sweeps
    for shape, opts in sweeps:
        shape = tuple(shape)
        if shape not in rows:
            continue
        per[shape][c["family"]] += len(opts)
        if c["family"] != "streamk":
            continue
        cfg = KernelConfig("streamk", tuple(tuple(x) for x in c["params"]))
        for o in opts:
            b = budget(cfg, shape, GPUS["H200"], options=o, registers=c["resources"]["registers"])
            if shape not in best or b.t_us < best[shape][0].t_us:
                best[shape] = (b, c["label"], o)
fam_builds = collections.Counter(c["family"] for c in m["candidates"])
print("pack:", m.get("pack_bytes", 0) / 2**20, "MiB,", len(m["candidates"]), "builds", dict(fam_builds))
print("| row | screenings (streamk) | best streamk by the H200 budget | decomposition, grid, waves, slots busy | in flight per SM | reduction | predicted us |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for s in rows:
    b, label, o = best[s]
    tot = sum(per[s].values())
    print(f"| {'x'.join(map(str, s))} | {tot} ({per[s]['streamk']}) | {label.split(',',1)[1]} splits {o['splits']} dec {o['decomposition']} | "
          f"{b.decomposition} {b.splits}, {b.grid} CTAs, {b.waves}, {b.slots_busy:.0%} of {b.slots} | {b.inflight_per_sm/1024:.0f} KiB | "
          f"{b.reduction} {b.reduction_bytes/2**20:.2f} of {b.operand_bytes/2**20:.2f} MiB | {b.t_us:.1f} |")
