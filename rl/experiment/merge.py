"""`python -m cudal2_rl.experiment merge OUT... --out DIR`: shards (or reruns after a GPU call
grew the table) of one experiment into one report. Every input must share the setup (held-out
set, arms, seeds, budget, table); where two inputs ran the same shape, the later run wins (it
read a table at least as full). The report names the held-out shapes no input has run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from cudal2_rl.experiment import report
from cudal2_rl.experiment.run import SHARED


def load(folder) -> dict:
    d = Path(folder)
    if not (d / "experiment.json").is_file():
        raise ValueError(f"{d}: no experiment.json: not an experiment output folder")
    doc = json.loads((d / "experiment.json").read_text())
    read = lambda f: [json.loads(x) for x in (d / f).read_text().splitlines() if x.strip()]  # noqa: E731
    return {"dir": d, "setup": doc, "rows": read("rows.jsonl"), "confirm": read("confirm.jsonl")}


def _shared(setup: dict, k: str):
    """The field merge compares; a table compares by GPU and arch (a later run may read more
    DBs: the GPU calls between runs added rows)."""
    v = setup.get(k)
    return {"gpu": v.get("gpu"), "arch": v.get("arch")} if k == "table" and v else v


def check_same(runs: list[dict]) -> None:
    first = runs[0]
    for r in runs[1:]:
        for k in SHARED:
            if _shared(r["setup"], k) != _shared(first["setup"], k):
                raise ValueError(f"{r['dir']}: its {k} differs from {first['dir']}'s: not shards of one experiment")


def _shape(x) -> tuple:
    return (x["M"], x["N"], x["K"])


def merge(folders, out, *, command: str = "") -> dict:
    runs = sorted((load(f) for f in folders), key=lambda r: r["setup"].get("finished") or 0)
    if not runs:
        raise ValueError("merge: no input folders")
    check_same(runs)
    owner = {}                                # shape -> the latest run that has it
    for r in runs:
        for x in r["rows"]:
            owner[_shape(x)] = r
    rows = [x for r in runs for x in r["rows"] if owner[_shape(x)] is r]
    lines = [c for r in runs for c in r["confirm"] if owner.get(_shape(c)) is r]
    out = Path(out)
    (out / "sources").mkdir(parents=True, exist_ok=True)
    for c in lines:
        for e in c["entrants"]:
            src = owner[_shape(c)]["dir"] / e["source_file"]
            if src.resolve() != (out / e["source_file"]).resolve():
                shutil.copyfile(src, out / e["source_file"])
    setup = dict(runs[-1]["setup"])
    heldout = [tuple(s) for s in setup["heldout"]]
    remaining = [s for s in heldout if s not in owner]
    setup["shard"] = f"merged from {len(runs)} run(s)"
    setup["notes"] = list(setup.get("notes", [])) + [
        f"merged {len(runs)} run(s): " + ", ".join(str(r["dir"]) for r in runs)]
    rows.sort(key=lambda x: (_shape(x), x["seed"], x["arm"]))
    report.write_run(out, {**setup, "remaining": [list(s) for s in remaining]}, rows, lines, {})
    return report.write_report(out, setup, rows, remaining=remaining, command=command)
