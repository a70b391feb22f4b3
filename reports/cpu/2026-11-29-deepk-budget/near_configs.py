"""The streamk budget (cudal2/templates/budget.py) replayed on the nearest committed measurements
of its kernel at the deep-K targets: the H200 RR call of 2026-11-26 timed the mma family
(mma_hgemm.cuh, the kernel body streamk runs) with compile-time split-K, reduced through the
workspace (those builds predate the cluster reduction, so the replay says cluster=False).
Kernel time, screening stage: median [lo, hi] as the DB holds them.

    python reports/cpu/2026-11-29-deepk-budget/near_configs.py
"""
from pathlib import Path
from cudal2.harness.db import ResultsDB
from cudal2.templates import KernelConfig, FAMILIES
from cudal2.templates.budget import budget
from cudal2.core.devices import GPUS
targets = {(128,64,12288),(128,128,16384),(256,128,8192),(1024,256,16384),(128,128,2048)}
rows = {}
for p in sorted(Path('reports/NVIDIA_H200').rglob('results.db*')):
    if p.name not in ('results.db','results.db.gz'): continue
    for ev in ResultsDB(p, readonly=True).rows():
        s = (ev.shape.M, ev.shape.N, ev.shape.K)
        if s in targets and ev.status == 'ok' and (ev.meta or {}).get('family') == 'mma' and ev.layout == 'RR':
            c = ev.timings['screen']['candidate']
            pr = ev.meta['params']
            key = (s, tuple(sorted(pr.items())))
            rows[key] = (c['median_us'], c['lo_us'], c['hi_us'])
for (s, pr), (t, lo, hi) in sorted(rows.items(), key=lambda r: (r[0][0], r[1][0])):
    p = dict(pr)
    q = dict(BM=p['BM'], BN=p['BN'], BK=p['BK'], WM=p['WM'], WN=p['WN'], STAGES=p['STAGES'], LAYOUT='RR', A_LOAD='ring')
    cfg = KernelConfig('streamk', tuple(sorted(q.items())))
    sk = p['SPLITK']
    o = {'splits': sk, 'decomposition': 2 if sk > 1 else 0, 'pdl': 0} if sk > 1 else {'splits': 1, 'decomposition': 0, 'pdl': 0}
    b = budget(cfg, s, GPUS['H200'], options=o, cluster=False)   # built before the cluster reduction
    print(f"{'x'.join(map(str,s))} mma {p['BM']}x{p['BN']}x{p['BK']} w{p['WM']}x{p['WN']} s{p['STAGES']} SPLITK {sk} swz {p['SWIZZLE']}: measured {t:.2f} [{lo:.2f}, {hi:.2f}] us, budget {b.t_us:.2f} us ({b.decomposition} {b.splits}, {b.grid} CTAs, reduction {b.reduction})")
