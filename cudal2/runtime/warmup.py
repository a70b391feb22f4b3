"""Build every kernel the table serves here before any call has to (`cudal2 warmup`,
`cudal2.warmup()`): after it, no first call builds (docs/dispatch.md, "Building and warmup").

A kernel whose table carries a binary that checks out here (cudal2.core.binaries) needs no
build; one whose rows did not pass this cudal2's audit is refused (not built, not served: `cudal2
reaudit`); every other one is built into the build cache (cudal2.core.build.build_many, CUDAL2_BUILD_JOBS
nvcc processes at a time; a kernel already built is a cache hit). In a running process the
shapes that went to torch because building inside a call was forbidden (CUDAL2_BUILD_IN_CALL=0)
are decided again on their next call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from cudal2.core import binaries, knobs
from cudal2.core.build import BuildSpec, build_many, trim_log
from cudal2.core.store import IndexRow
from cudal2.core.tables import Tables, load_tables, why_unaudited
from cudal2.core.toolchain import detect_arch
from cudal2.core.vocab import gpu_key
from cudal2.runtime import resolve
from cudal2.runtime.plan import served_rows

BUILT, CACHED, CARRIED, FAILED, REFUSED = "built", "cached", "carried", "failed", "refused"


@dataclass(frozen=True)
class Warmed:
    row: IndexRow        # the first table row the kernel serves (its file names it)
    table: str           # the row's table: shipped | user
    rows: int            # how many served rows share this kernel
    status: str          # BUILT | CACHED | CARRIED | FAILED | REFUSED (not audited under these rules)
    detail: str = ""     # seconds for a build; why for a failure (or a refused carried binary)


def visible_gpu() -> str | None:
    """The current GPU's model name as dispatch names it (resolve.device_gpu), None without one."""
    if not torch.cuda.is_available():
        return None
    return resolve.device_gpu(torch.cuda.current_device()) or None


def target(arch: str | None = None, gpu: str | None = None) -> tuple[str, str | None]:
    """(arch, GPU model) to warm or list: `arch`, else CUDAL2_ARCH, else the visible GPU's (a
    ToolchainError says to pass one); `gpu`, else the visible GPU's name, else None (every
    GPU model's rows of the arch)."""
    return detect_arch(arch), (gpu_key(gpu) if gpu else visible_gpu())


def kernels(tables: Tables, arch: str, gpu: str | None) -> dict[str, list[IndexRow]]:
    """sha256 -> the served rows of that kernel (one build serves them all)."""
    out: dict[str, list[IndexRow]] = {}
    for row in served_rows(tables.rows.values(), arch, gpu):
        out.setdefault(row.sha256, []).append(row)
    return out


def warmup(arch: str | None = None, gpu: str | None = None, *, tables: Tables | None = None,
           build: Callable | None = None, jobs: int | None = None,
           progress: Callable | None = None) -> list[Warmed]:
    """Build (or find built, or carried) every kernel the layered table serves on `arch` / `gpu`
    (see target()); one Warmed per kernel, carried ones first. `progress(BuildResult)` is called
    as each build finishes; `build`: default build_many. Then the shapes this process sent to
    torch because building was forbidden are decided again."""
    arch, gpu = target(arch, gpu)
    tables = tables or load_tables()
    out, todo = [], []
    for sha, rows in kernels(tables, arch, gpu).items():
        so, why = binaries.check(tables.root_of(rows[0]), arch, sha, cuda=torch.version.cuda)
        if so is not None:
            out.append(Warmed(rows[0], tables.table_of(rows[0]), len(rows), CARRIED, str(so)))
        else:
            todo.append((rows, why))
    specs = [BuildSpec(tables.source(rows[0]), arch=arch, name=rows[0].file) for rows, _ in todo]
    build = build or build_many
    results = build(specs, jobs=jobs or knobs.build_jobs(), progress=progress) if specs else []
    out += [_warmed(rows, why, res, tables) for (rows, why), res in zip(todo, results)]
    resolve.redecide_unbuilt()
    return out + refused(tables, arch, gpu)


def refused(tables: Tables, arch: str, gpu: str | None) -> list[Warmed]:
    """One REFUSED per kernel whose rows would serve here but did not pass this cudal2's audit
    (cudal2.core.tables): not built, not served, the line says how to audit it again."""
    by_sha: dict[str, list] = {}
    for u in tables.unaudited:
        if served_rows([u.row], arch, gpu):
            by_sha.setdefault(u.row.sha256, []).append(u)
    return [Warmed(us[0].row, us[0].table, len(us), REFUSED,
                   why_unaudited(us[0], tables.indexes[us[0].table].root)) for us in by_sha.values()]


def _warmed(rows: list[IndexRow], refused: str, res, tables: Tables) -> Warmed:
    notes = [f"carried binary refused: {refused}"] if refused else []
    if not res.ok:
        status = FAILED
        notes.append(f"build {res.status}: " + trim_log(res.log, 3).replace("\n", " | "))
    elif res.cached:
        status = CACHED
    else:
        status = BUILT
        notes.append(f"{res.seconds:.1f} s")
    return Warmed(rows[0], tables.table_of(rows[0]), len(rows), status, "; ".join(notes))
