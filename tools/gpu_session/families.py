"""Which kernel families' GPU tests a verdict call runs: those whose inputs changed since a
committed GPU test run passed them.

A test group is one GPU test file and the families it covers; its inputs are the files that can
change its verdict (the family's template sources and the test file). A verdict call records,
per group it ran, the sha256 of those inputs and the result (`family_inputs.json`, committed under
reports/<gpu>/ with the junit files); a group is due when no committed record holds its current
inputs with the result "passed".

A group stopped at its time share is "partial": its record names the tests that passed ("ran")
and counts those that never ran ("not_run"); it stays due, and the next call deselects what a
partial record of the same inputs passed (`done`) and runs only the rest.

    python tools/gpu_session/families.py due                 # the groups due, one per line
    python tools/gpu_session/families.py record JUNIT_DIR [--group G]  # family_inputs.json for a
                                                             # call's junit (<g>.xml, <g>.collected)
    python tools/gpu_session/families.py done GROUP          # node ids partial runs already passed
    python tools/gpu_session/families.py count GROUP...      # {group: GPU tests to run}, as JSON
    python tools/gpu_session/families.py order [--counts F] GROUP...      # largest first
    python tools/gpu_session/families.py share [--counts F] LEFT_S GROUP...  # the first's seconds
    python tools/gpu_session/families.py test GROUP          # the group's GPU test file
    python tools/gpu_session/families.py excluded JUNIT_DIR  # families a failing test keeps out of timing
    python tools/gpu_session/families.py backfill COMMIT GROUP...  # a record for a past passed run
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = "family_inputs.json"
SHARE_FLOOR_S = 15      # below this a group's pytest start (~8-10 s) leaves its tests no time
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


def _junit_key(node_id: str) -> tuple[str, str]:
    """(classname, name) of a node id's testcase in pytest's junit XML (its junitxml
    mangle_test_address): tests/test_x.py::C::test_y[p] -> ("tests.test_x.C", "test_y[p]")."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    return ".".join(names[:-1]), names[-1] + bracket + params


def _read_junit(path: Path):
    """(totals, {(classname, name): "passed" | "skipped" | "failed"}, unnamed) of a junit file,
    None when it is missing or unreadable. An unnamed testcase is what pytest writes for the
    test a SIGINT stopped."""
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    cases, unnamed = {}, False
    for tc in root.iter("testcase"):
        if not tc.get("name"):
            unnamed = True
            continue
        bad = tc.find("failure") is not None or tc.find("error") is not None
        cases[(tc.get("classname", ""), tc.get("name"))] = (
            "failed" if bad else "skipped" if tc.find("skipped") is not None else "passed")
    return n, cases, unnamed


def junit_result(path: Path) -> str:
    """passed | failed | partial | no tests | missing, from a pytest junit XML file alone (a run
    with no .collected file): an interrupted run is never passed."""
    j = _read_junit(path)
    if j is None:
        return "missing"
    n, _, unnamed = j
    if n["failures"] or n["errors"]:
        return "failed"
    if unnamed:
        return "partial"
    return "passed" if n["tests"] > n["skipped"] else "no tests"


def _lines(path: Path) -> list[str]:
    return [l for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []


def group_result(junit_dir: Path, group: str) -> dict:
    """The result fields of a group's record: <group>.xml against <group>.collected (the node ids
    the run selected) and <group>.deselected (those a partial run passed before)."""
    xml, collected = junit_dir / f"{group}.xml", junit_dir / f"{group}.collected"
    j = _read_junit(xml)
    if not collected.is_file() or j is None:
        r = junit_result(xml)
        return {"result": r, "ran": [], "not_run": None} if r == "partial" else {"result": r}
    n, cases, _ = j
    if n["failures"] or n["errors"]:
        return {"result": "failed"}
    ids = _lines(collected)
    status = {i: cases.get(_junit_key(i)) for i in ids}
    ran = [i for i in ids if status[i] == "passed"]
    not_run = sum(s is None for s in status.values())
    if not_run:
        return {"result": "partial", "ran": ran, "not_run": not_run}
    earlier = len(_lines(junit_dir / f"{group}.deselected"))
    out = {"result": "passed" if ran or earlier else "no tests"}
    return dict(out, earlier_partial=earlier) if earlier else out


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
        if (junit_dir / f"{g}.xml").exists():
            groups[g] = {"families": GROUPS[g]["families"], "inputs_sha": inputs_sha(g),
                         **group_result(junit_dir, g)}
    return {"groups": groups}


def say(rec: dict) -> str:
    """One line for the session log: a group's result."""
    if rec["result"] == "partial":
        left = "?" if rec["not_run"] is None else rec["not_run"]
        return f"partial: {len(rec['ran'])} passed, {left} not run (stays due)"
    if rec.get("earlier_partial"):
        return f"{rec['result']} ({rec['earlier_partial']} passed in an earlier partial run)"
    return rec["result"]


def done(group: str, root: Path = REPO / "reports") -> list[str]:
    """The node ids committed partial runs of the group's current inputs passed: the next run
    deselects them. Only parametrised ids (ending in "]"): --deselect matches node id prefixes,
    so a bare tests/t.py::test_a would also drop tests/t.py::test_ab."""
    sha = inputs_sha(group)
    ids = {i for r in committed_records(root)
           if r["group"] == group and r.get("inputs_sha") == sha and r.get("result") == "partial"
           for i in r.get("ran", [])}
    return sorted(i for i in ids if i.endswith("]"))


def count(groups: list[str], root: Path = REPO / "reports") -> dict[str, int]:
    """Per group, the GPU tests a verdict call would run: one pytest --collect-only over the
    groups' test files (GPU tests are listed on a CPU too, skip-marked), less done()'s ids."""
    files = {GROUPS[g]["test"]: g for g in groups}
    env = {k: v for k, v in os.environ.items() if k != "CUDAL2_COLLECTED_FILE"}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                        "-p", "no:cacheprovider", "-p", "no:xdist", *files],
                       cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode not in (0, 5):      # 5: no tests selected
        tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"pytest --collect-only of {' '.join(files)} failed (rc {r.returncode}): {tail[0]}")
    ids: dict[str, set] = {g: set() for g in groups}
    for line in r.stdout.splitlines():
        if not line.strip():
            break                       # the id list ends at the first blank line
        f = line.split("::", 1)[0]
        if "::" in line and f in files:
            ids[files[f]].add(line.strip())
    return {g: len(ids[g] - set(done(g, root))) for g in groups}


def _weights(groups: list[str], counts: dict | None) -> list[float]:
    """Each group's GPU test count; equal without counts; a group the counts lack gets their mean."""
    known = [counts[g] for g in groups if counts and g in counts]
    if not known:
        return [1.0] * len(groups)
    mean = sum(known) / len(known)
    return [float(counts.get(g, mean)) for g in groups]


def order(groups: list[str], counts: dict | None) -> list[str]:
    """The groups largest first (ties in the order given)."""
    w = dict(zip(groups, _weights(groups, counts)))
    return sorted(groups, key=lambda g: -w[g])


def share(left_s: float, groups: list[str], counts: dict | None) -> int:
    """Seconds for groups[0] of the left_s the groups have left: its part of their GPU tests,
    at least SHARE_FLOOR_S (run.sh bounds it by what is left and what the campaign keeps)."""
    w = _weights(groups, counts)
    s = left_s * w[0] / sum(w) if sum(w) > 0 else left_s / len(groups)
    return max(SHARE_FLOOR_S, int(s))


def load_counts(path: str | None) -> dict | None:
    """gpu_tests.json (prepare.sh's count) or None: absent or unreadable means equal shares."""
    if not path or not Path(path).is_file():
        return None
    try:
        return {str(k): int(v) for k, v in json.loads(Path(path).read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        print(f"families.py: {path} unreadable ({exc}); equal shares", file=sys.stderr)
        return None


def _backfill(commit: str, groups: list[str]) -> dict:
    def read(p):
        return subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{p}"],
                              capture_output=True, check=True).stdout
    return {"commit": commit, "groups": {g: {"families": GROUPS[g]["families"],
            "inputs_sha": inputs_sha(g, read), "result": "passed"} for g in groups}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("due")
    for name in ("test", "done"):
        sub.add_parser(name).add_argument("group", choices=sorted(GROUPS))
    sub.add_parser("excluded").add_argument("junit_dir")
    r = sub.add_parser("record")
    r.add_argument("junit_dir")
    r.add_argument("--group", choices=sorted(GROUPS), help="print this group's result line, not the JSON")
    sub.add_parser("count").add_argument("groups", nargs="+", choices=sorted(GROUPS))
    o = sub.add_parser("order")
    o.add_argument("--counts", help="gpu_tests.json (absent: the order given)")
    o.add_argument("groups", nargs="*", help="none: nothing printed")   # argparse refuses [] with choices
    sh = sub.add_parser("share")
    sh.add_argument("--counts", help="gpu_tests.json (absent: equal shares)")
    sh.add_argument("left_s", type=float)
    sh.add_argument("groups", nargs="+", choices=sorted(GROUPS))
    b = sub.add_parser("backfill")
    b.add_argument("commit")
    b.add_argument("groups", nargs="+", choices=sorted(GROUPS))
    args = ap.parse_args(argv)
    if args.cmd == "due":
        print("\n".join(due()))
    elif args.cmd == "test":
        print(GROUPS[args.group]["test"])
    elif args.cmd == "done":
        print("\n".join(done(args.group)))
    elif args.cmd == "excluded":
        print(" ".join(excluded(Path(args.junit_dir))))
    elif args.cmd == "record":
        d = Path(args.junit_dir)
        rec = record(d)
        (d / RECORD).write_text(json.dumps(rec, indent=1) + "\n")
        if args.group:
            print(say(rec["groups"][args.group]) if args.group in rec["groups"] else "missing")
        else:
            print((d / RECORD).read_text(), end="")
    elif args.cmd == "count":
        try:
            print(json.dumps(count(args.groups)))
        except RuntimeError as exc:
            print(f"families.py count: {exc}", file=sys.stderr)
            return 1
    elif args.cmd == "order":
        if set(args.groups) - set(GROUPS):
            ap.error(f"order: unknown groups {sorted(set(args.groups) - set(GROUPS))}")
        print("\n".join(order(args.groups, load_counts(args.counts))))
    elif args.cmd == "share":
        print(share(args.left_s, args.groups, load_counts(args.counts)))
    else:
        print(json.dumps(_backfill(args.commit, args.groups), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
