"""The SASS instructions each kernel entry lays out before its first global load, for the default
config of the small-shape families and of mma/ptx, at the checked-out commit:

    python reports/cpu/2026-11-30-prologue/prologue.py [--arch sm_90a] > OUT.md

Builds through the build cache (nvcc, no GPU). Before 2026-11-30 the package had no
`prologue_lengths`, so this script carries its own reading of the SASS (the same rule: LDG, LDGSTS,
UTMALDG or UBLKCP; a static count) and runs at any commit of the package."""
from __future__ import annotations

import argparse
import re
import subprocess

from cudal2.core.build import build
from cudal2.core.toolchain import find_cuobjdump
from cudal2.templates import FAMILIES

FAMILY_ORDER = ("lowlat", "lowlat_mma", "streamk", "skinny", "skinny_n", "mma", "ptx")
LOAD = re.compile(r"\b(LDG|LDGSTS|UTMALDG|UBLKCP)\b")


def lengths(so: str, tool: str) -> dict[str, tuple[int, int]]:
    """entry -> (instructions before its first global load, all its instructions)."""
    out: dict[str, list] = {}
    fn = None
    for line in subprocess.run([tool, "-sass", so], capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"^\s*Function : (\S+)", line)
        if m:
            fn = m.group(1)
            out[fn] = [None, 0]
            continue
        m = re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+([^;]+);", line)
        if fn and m:
            if out[fn][0] is None and LOAD.search(m.group(1)):
                out[fn][0] = out[fn][1]
            out[fn][1] += 1
    return {f: (a, b) for f, (a, b) in out.items() if a is not None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    arch = ap.parse_args().arch
    tool = find_cuobjdump()
    print(f"| config | arch | entry | before first load | instructions |\n| --- | --- | --- | --- | --- |")
    for name in FAMILY_ORDER:
        fam = FAMILIES[name]
        if arch not in fam.arches:
            continue
        cfg = fam.default()
        r = build(fam.build_spec(cfg, arch))
        assert r.ok, r.log[-2000:]
        for fn, (first, total) in sorted(lengths(str(r.so_path), tool).items()):
            entry = re.search(r"impl\d+([A-Za-z_]+?)[IE]", fn).group(1)
            entry += "<true>" if "ILb1E" in fn else "<false>" if "ILb0E" in fn else ""
            print(f"| {cfg.label()} | {arch} | `{entry}` | {first} | {total} |")


if __name__ == "__main__":
    main()
