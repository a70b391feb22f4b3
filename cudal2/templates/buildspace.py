"""Build every valid config of a family's space for every arch it claims and record, per (config,
arch), what the compile checks assert on a covering set: it builds, no spills and no stack, the
SASS holds the tensor-core instruction the family claims, and the host imports no Memset/Memcpy;
and, for reading, its entries' longest prologue (SASS instructions before the first global load)
(`cudal2 templates --build-space FAMILY... --csv OUT.csv`; docs/templates.md). The space is the
one the tuner searches (`enumerate_space`) over the family's ACC and LAYOUT choices; builds go
through the build cache, CUDAL2_BUILD_JOBS at a time."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from cudal2.core import knobs
from cudal2.core.build import BuildResult, build_many
from cudal2.core.toolchain import find_cuobjdump
from cudal2.harness.audit import undefined_symbols
from cudal2.templates.family import FAMILIES, MAX_ENUMERATE, KernelConfig, Value, enumerate_space

# The SASS mnemonic of each main-loop instruction a family may claim (Family.instruction): the
# tensor-core ones, and fp32 FMA on CUDA cores (the gemv family).
SASS_MNEMONIC = {"mma.sync": "HMMA", "wgmma": "HGMMA", "fma": "FFMA"}

COLUMNS = ("config", "label", "family", "arch", "ok", "status", "registers", "spills", "stack_bytes",
           "static_smem_bytes", "instruction", "sass_mnemonic", "sass_has_instruction",
           "memset_memcpy_imports", "prologue_instructions", "cached", "build_seconds", "bad")


def space_targets(families: Iterable[str], arch: str | None = None,
                  where: dict[str, Value] | None = None) -> list[tuple[KernelConfig, str]]:
    """(config, arch) for every valid config of each family, over its ACC and LAYOUT choices, for
    every arch it claims (or only `arch`, which each family must claim); `where` keeps the configs
    with those parameter values (a slice of the space). Raises ValueError naming an unknown family,
    an arch a family does not claim, a parameter it does not have, or a space too large to list."""
    where = dict(where or {})
    out: list[tuple[KernelConfig, str]] = []
    for name in families:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
        fam = FAMILIES[name]
        if arch is not None and arch not in fam.arches:
            raise ValueError(f"family {name} does not claim {arch} (it claims {', '.join(fam.arches)})")
        unknown = sorted(set(where) - set(fam.default().as_dict()))
        if unknown:
            raise ValueError(f"family {name} has no parameter {', '.join(unknown)} "
                             f"(it has {', '.join(fam.default().as_dict())})")
        size = 1
        for values in fam.space().values():
            size *= len(values)
        if size > MAX_ENUMERATE:
            raise ValueError(f"family {name}: its space has {size} combinations, more than the "
                             f"{MAX_ENUMERATE} enumerate_space lists (it would sample, not cover)")
        choices = fam.choices()
        for a in (arch,) if arch is not None else fam.arches:
            seen: set[KernelConfig] = set()
            for acc in choices.get("ACC", ("f32",)):
                for layout in choices.get("LAYOUT", ("RR", "RC")):
                    for cfg in enumerate_space(fam, arch=a, acc=acc, layout=layout):
                        if cfg not in seen and all(cfg.get(k) == v for k, v in where.items()):
                            seen.add(cfg)
                            out.append((cfg, a))
    return out


def disassemble(so_path: Path, cuobjdump: str) -> str:
    """The SASS of the .so's cubins (cuobjdump -sass); RuntimeError when it cannot be read."""
    proc = subprocess.run([cuobjdump, "-sass", str(so_path)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or "Function" not in proc.stdout:
        raise RuntimeError(f"{cuobjdump} could not disassemble {so_path}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def sass_mnemonics(sass: str) -> set[str]:
    """The main-loop mnemonics (HMMA, HGMMA, FFMA) in a SASS listing."""
    return set(re.findall(r"\b(HMMA|HGMMA|FFMA)\b", sass))


# A global load: a plain one, cp.async (LDGSTS), a TMA or bulk copy.
_GLOBAL_LOAD = re.compile(r"\b(LDG|LDGSTS|UTMALDG|UBLKCP)\b")
_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+([^;]+);")


def prologue_lengths(sass: str) -> dict[str, int]:
    """Per kernel entry of a SASS listing that loads from global memory: the instructions laid out
    before its first global load. A static count (branches not followed, so a path the call does
    not take counts too): what a launch-bound call's first load waits behind, comparable build to
    build."""
    out: dict[str, int] = {}
    fn, count, done = None, 0, False
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            fn, count, done = m.group(1), 0, False
            continue
        m = _INSTRUCTION.match(line)
        if fn is None or done or not m:
            continue
        if _GLOBAL_LOAD.search(m.group(1)):
            out[fn], done = count, True
        count += 1
    return out


def row_of(cfg: KernelConfig, arch: str, r: BuildResult, cuobjdump: str) -> dict:
    """One CSV row: the build's resources, the SASS check, the host imports; `bad` says why the
    row fails (empty when it passes)."""
    fam = FAMILIES[cfg.family]
    mnemonic = SASS_MNEMONIC.get(fam.instruction, "")
    row = {"config": cfg.name(), "label": cfg.label(), "family": cfg.family, "arch": arch,
           "ok": int(r.ok), "status": r.status, "instruction": fam.instruction,
           "sass_mnemonic": mnemonic, "cached": int(r.cached), "build_seconds": round(r.seconds, 2)}
    why = []
    if r.ok:
        stack = max((x.stack_bytes for x in r.resources), default=0)
        row.update(registers=r.max_registers, spills=r.spills, stack_bytes=stack,
                   static_smem_bytes=r.max_shared_bytes)
        try:
            sass = disassemble(r.so_path, cuobjdump)
        except RuntimeError as exc:   # this row unreadable: say so, keep the others
            sass, unreadable = "", str(exc)
        else:
            unreadable = ""
        has = bool(mnemonic) and mnemonic in sass_mnemonics(sass)
        imports = [s for s in undefined_symbols(r.so_path) if "Memset" in s or "Memcpy" in s]
        row.update(sass_has_instruction=int(has), memset_memcpy_imports=" ".join(imports),
                   prologue_instructions=max(prologue_lengths(sass).values(), default=""))
        if r.spills:
            why.append("spills")
        if stack:
            why.append("stack")
        if unreadable:
            why.append(unreadable)
        elif not has:
            why.append(f"no {mnemonic or fam.instruction} in SASS")
        if imports:
            why.append("imports " + " ".join(imports))
    else:
        why.append(f"build {r.status}")
    row["bad"] = "; ".join(why)
    return {c: row.get(c, "") for c in COLUMNS}


def build_space(targets: list[tuple[KernelConfig, str]], *, jobs: int | None = None,
                progress: Callable[[BuildResult], None] | None = None) -> list[dict]:
    """Build every (config, arch) (cached, `jobs` nvcc at a time) and inspect each: rows in
    target order. Raises RuntimeError when cuobjdump is missing (the SASS check needs it); a
    cubin it cannot read makes that row bad."""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        raise RuntimeError("cuobjdump not found ($CUOBJDUMP, PATH, next to nvcc, or pip "
                           "nvidia-cuda-cuobjdump): the SASS check needs it")
    jobs = jobs or knobs.build_jobs()
    specs = [FAMILIES[c.family].build_spec(c, a) for c, a in targets]
    results = build_many(specs, jobs=jobs, progress=progress)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda t: row_of(t[0][0], t[0][1], t[1], cuobjdump), zip(targets, results)))


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def summary(rows: list[dict]) -> dict:
    return {"rows": len(rows), "built": sum(r["ok"] == 1 for r in rows),
            "failed": sum(r["ok"] != 1 for r in rows),
            "spills": sum(r["ok"] == 1 and (r["spills"] > 0 or r["stack_bytes"] > 0) for r in rows),
            "missing_instruction": sum(r["ok"] == 1 and r["sass_has_instruction"] != 1 for r in rows),
            "memset_memcpy": sum(bool(r["memset_memcpy_imports"]) for r in rows),
            "bad": sum(bool(r["bad"]) for r in rows)}


def run_build_space(families: list[str], arch: str | None, csv_path: Path, *,
                    where: dict[str, Value] | None = None, jobs: int | None = None) -> int:
    """The CLI: enumerate, build, write the CSV, print the summary; 0 when every row is good,
    1 when any is bad, 2 for bad arguments."""
    try:
        targets = space_targets(families, arch, where)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not targets:
        print(f"error: no valid config of {', '.join(families)} matches", file=sys.stderr)
        return 2
    print(f"building {len(targets)} (config, arch) of {', '.join(families)} "
          f"({jobs or knobs.build_jobs()} at a time)", file=sys.stderr)
    done = [0]

    def progress(r: BuildResult) -> None:
        done[0] += 1
        print(f"  [{done[0]}/{len(targets)}] {r.name} {r.status}{' (cached)' if r.cached else ''}",
              file=sys.stderr)
    try:
        rows = build_space(targets, jobs=jobs, progress=progress)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_csv(rows, csv_path)
    s = summary(rows)
    print(f"{s['rows']} rows -> {csv_path}: {s['built']} built, {s['failed']} failed, "
          f"{s['spills']} with spills or stack, {s['missing_instruction']} missing the instruction, "
          f"{s['memset_memcpy']} importing Memset/Memcpy")
    for r in rows:
        if r["bad"]:
            print(f"  BAD {r['config']} {r['arch']}: {r['bad']}")
    return 1 if s["bad"] else 0
