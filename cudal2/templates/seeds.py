"""Seed rows of the kernel table: reference instantiations of the template families for a few
shapes, tuned=0, real kernels for the build/check/time pipeline and the GPU tests to work on.
They never serve in dispatch (`python -m cudal2.templates --seed-store [DIR]`)."""
from __future__ import annotations

import os
from pathlib import Path

from cudal2.core.store import KernelIndex
from cudal2.templates import FAMILIES, instantiate

# (arch, family, changes to the family default, shapes)
SEEDS = (
    ("sm_90a", "mma", {}, ((128, 128, 128), (1024, 1024, 1024))),
    ("sm_90a", "mma", {"LAYOUT": "RC"}, ((128, 128, 128), (1024, 1024, 1024))),
    ("sm_90a", "cutlass_sm90", {}, ((4096, 4096, 4096),)),
    ("sm_80", "mma", {}, ((128, 128, 128), (1024, 1024, 1024))),
    ("sm_80", "mma", {"ACC": "f16"}, ((1024, 1024, 1024),)),
)


def write_seeds(root: str | os.PathLike | None = None) -> Path:
    """(Re)write the seed rows into the store at `root` (default: knobs.kernels_dir()): untuned
    rows are replaced by the current templates' seeds, tuned rows are kept. Returns the index
    path."""
    idx = KernelIndex.load(root)
    for r in idx.rows:
        if not r.tuned:
            idx.remove(*r.key)
    for arch, family, changes, shapes in SEEDS:
        config = FAMILIES[family].default().with_(**changes)
        src = instantiate(config)
        acc, layout = config.get("ACC"), config.get("LAYOUT")
        for M, N, K in shapes:
            old = idx.get(arch, acc, layout, M, N, K)
            if old is not None and old.tuned:
                continue  # a measured kernel is never replaced by a seed
            idx.add(src, arch=arch, acc=acc, layout=layout, M=M, N=N, K=K, family=family,
                    config=config.name())
    return idx.write(prune=True)
