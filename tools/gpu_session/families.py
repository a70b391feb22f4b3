"""Which kernel families' GPU tests a verdict call runs: those whose inputs changed since a
committed GPU test run passed them.

A test group is one GPU test file and the families it covers; its inputs are the files that can
change its verdict (the family's template sources and the test file). A verdict call records,
per group it ran, the sha256 of those inputs and the result (`family_inputs.json`, committed under
reports/<gpu>/ with the junit files); a group is due when no committed record holds its current
inputs with the result "passed".

    python tools/gpu_session/families.py due                 # the groups due, one per line
    python tools/gpu_session/families.py record JUNIT_DIR    # family_inputs.json for a call's junit
    python tools/gpu_session/families.py test GROUP          # the group's GPU test file
    python tools/gpu_session/families.py excluded JUNIT_DIR  # families a failing test keeps out of timing
    python tools/gpu_session/families.py backfill COMMIT GROUP...  # a record for a past passed run
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = "family_inputs.json"
T = "cudal2/templates/"
H = "cudal2/harness/"

GROUPS: dict[str, dict] = {
    "lowlat": {"families": ["lowlat", "lowlat_mma"], "test": "tests/test_lowlat.py",
               "exclude": ["lowlat", "lowlat_mma"],
               "inputs": [T + "lowlat_hgemm.cuh", T + "lowlat.py", T + "splitk_fixup.cuh",
                          T + "wgmma_ptx.cuh"]},
    # the skinny kernel's body is mma_hgemm.cuh's, reduced by splitk_fixup.cuh / streamk.cuh
    "skinny": {"families": ["skinny", "skinny_n"], "test": "tests/test_skinny.py",
               "exclude": ["skinny", "skinny_n"],
               "inputs": [T + "skinny_hgemm.cuh", T + "skinny_n_hgemm.cuh", T + "skinny.py",
                          T + "mma_hgemm.cuh", T + "splitk_fixup.cuh", T + "streamk.cuh"]},
    # deep K on few tiles: skinny's kernel and launcher over M x N tiles (issue 51)
    "streamk": {"families": ["streamk"], "test": "tests/test_streamk_family.py",
                "exclude": ["streamk"],
                "inputs": [T + "streamk_hgemm.cuh", T + "streamk.py", T + "skinny_hgemm.cuh",
                           T + "mma_hgemm.cuh", T + "splitk_fixup.cuh", T + "streamk.cuh"]},
    # a self-contained header: no shared template, no workspace
    "gemv": {"families": ["gemv"], "test": "tests/test_gemv.py", "exclude": ["gemv"],
             "inputs": [T + "gemv_hgemm.cuh", T + "gemv.py"]},
    # the graph probe goes through the runtime's hot path and its workspaces
    "splitk": {"families": ["mma split-K", "ptx split-K"], "test": "tests/test_splitk.py",
               "exclude": ["split-K"],
               "inputs": [T + "splitk_fixup.cuh", T + "mma_hgemm.cuh", T + "ptx_hgemm.cuh",
                          T + "streamk.cuh", "tests/data/splitk_graph_replay.py",
                          "cudal2/runtime/loader.py", "cudal2/runtime/hot.py"]},
    "wgmma": {"families": ["wgmma"], "test": "tests/test_wgmma.py",
              "exclude": ["wgmma"],
              "inputs": [T + "wgmma_hgemm.cuh", T + "wgmma_ptx.cuh", T + "wgmma.py"]},
    "templates": {"families": ["mma", "ptx", "cutlass"], "test": "tests/test_templates.py",
                  "exclude": ["mma", "ptx", "cutlass_sm90"],
                  "inputs": [T + "mma_hgemm.cuh", T + "ptx_hgemm.cuh", T + "cutlass_sm90.cuh",
                             T + "mma.py", T + "cutlass_sm90.py", T + "family.py"]},
    # the harness's run-time checks against the GPU hostile corpus: each cheat's verdict. Last:
    # the families' groups go first; a failure here keeps no family out of the timing
    "harness": {"families": ["harness"], "test": "tests/test_hostile_gpu.py", "exclude": [],
                "inputs": [H + f for f in ("callguard.c", "callguard.py", "cudacalls.py",
                                           "check.py", "measure.py", "audit.py", "pipeline.py")]
                + sorted(f"tests/data/hostile/{p.name}"
                         for p in (REPO / "tests/data/hostile").glob("*.cu"))},
}


def inputs_sha(group: str, read=lambda p: (REPO / p).read_bytes()) -> str:
    """sha256 over the group's input files (path and bytes), its test file included."""
    g = GROUPS[group]
    h = hashlib.sha256()
    for p in sorted(set(g["inputs"] + [g["test"]])):
        h.update(p.encode() + b"\0" + read(p) + b"\0")
    return h.hexdigest()


def committed_records(root: Path = REPO / "reports") -> list[dict]:
    out = []
    for f in sorted(root.rglob(RECORD)):
        try:
            out += list(json.loads(f.read_text()).get("groups", {}).items())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{f}: not a {RECORD} ({exc})") from None
    return [dict(v, group=k) for k, v in out]


def due(root: Path = REPO / "reports") -> list[str]:
    """The groups whose current inputs no committed record passed."""
    passed = {(r["group"], r.get("inputs_sha")) for r in committed_records(root) if r.get("result") == "passed"}
    return [g for g in GROUPS if (g, inputs_sha(g)) not in passed]


def junit_result(path: Path) -> str:
    """passed | failed | no tests | missing, from a pytest junit XML file."""
    if not path.is_file():
        return "missing"
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return "missing"
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    if n["failures"] or n["errors"]:
        return "failed"
    return "passed" if n["tests"] > n["skipped"] else "no tests"


def _family_of(test_id: str, group: str) -> list[str]:
    """The families a failing test names: its parameters' leading family name (longest first),
    split-K for a split-K test, cutlass_sm90 for a CUTLASS test, else every family of its group."""
    from cudal2.templates import FAMILIES
    name, _, params = test_id.partition("[")
    for fam in sorted(FAMILIES, key=len, reverse=True):
        if params.startswith(fam + "-") or params.startswith(fam + "_sm"):
            return [fam]
    if "split_k" in name:
        return ["split-K"]
    if "cutlass" in name:
        return ["cutlass_sm90"]
    return list(GROUPS[group]["exclude"])


def excluded(junit_dir: Path) -> list[str]:
    """Families (pack names, and split-K) a failing GPU test in junit_dir keeps out of timing."""
    out: list[str] = []
    for g in GROUPS:
        f = junit_dir / f"{g}.xml"
        if not f.is_file():
            continue
        try:
            cases = list(ET.parse(f).getroot().iter("testcase"))
        except ET.ParseError:
            cases = []
        for tc in cases:
            if tc.find("failure") is not None or tc.find("error") is not None:
                out += [x for x in _family_of(tc.get("name", ""), g) if x not in out]
    return out


def record(junit_dir: Path) -> dict:
    """family_inputs.json for the groups whose junit (<group>.xml) is in junit_dir."""
    groups = {}
    for g in GROUPS:
        f = junit_dir / f"{g}.xml"
        if f.exists():
            groups[g] = {"families": GROUPS[g]["families"], "inputs_sha": inputs_sha(g),
                         "result": junit_result(f)}
    return {"groups": groups}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("due")
    te = sub.add_parser("test")
    te.add_argument("group", choices=sorted(GROUPS))
    x = sub.add_parser("excluded")
    x.add_argument("junit_dir")
    r = sub.add_parser("record")
    r.add_argument("junit_dir")
    b = sub.add_parser("backfill")
    b.add_argument("commit")
    b.add_argument("groups", nargs="+", choices=sorted(GROUPS))
    args = ap.parse_args(argv)
    if args.cmd == "due":
        print("\n".join(due()))
    elif args.cmd == "test":
        print(GROUPS[args.group]["test"])
    elif args.cmd == "excluded":
        print(" ".join(excluded(Path(args.junit_dir))))
    elif args.cmd == "record":
        d = Path(args.junit_dir)
        (d / RECORD).write_text(json.dumps(record(d), indent=1) + "\n")
        print((d / RECORD).read_text(), end="")
    else:
        def read(p):
            return subprocess.run(["git", "-C", str(REPO), "show", f"{args.commit}:{p}"],
                                  capture_output=True, check=True).stdout
        out = {"commit": args.commit, "groups": {g: {"families": GROUPS[g]["families"],
               "inputs_sha": inputs_sha(g, read), "result": "passed"} for g in args.groups}}
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
