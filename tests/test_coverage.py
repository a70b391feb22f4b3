"""Coverage across calls and machines: `cudal2 db merge`, `cudal2 report --coverage`, the
planner's order by expected gain. Rows made here are SYNTHETIC (a fake GPU name); one test reads
a committed H100 DB."""
import csv
import gzip
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2.cli import main
from cudal2.core.identity import source_sha
from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import record
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.runs import coverage as C
from cudal2.runs.merge import merge
from cudal2.search.costmodel import CostModel

ROOT = Path(__file__).resolve().parents[1]
SRC = "int synthetic_coverage_test_kernel;\n"
GPU = "Fake GPU (synthetic)"


def row(shape, cand_us, base_us, *, timer="kernel", stage="final", layout="RR", status="ok",
        created="2026-01-01T00:00:00"):
    bases = base_us if isinstance(base_us, dict) else {b: base_us for b in BASELINES}
    t = {"offline": {"candidate": {"median_us": cand_us}, **{b: {"median_us": v} for b, v in bases.items()}}}
    sp = {"offline": {b: v / cand_us for b, v in bases.items()}}
    return Evaluation(status=status, source_sha=source_sha(SRC), shape=Shape(*shape), arch="sm_90a",
                      acc="f32", layout=layout, timings=t, speedups=sp, stage=stage, origin="tune",
                      correctness={"ok": status == "ok"}, created=created,
                      env={"gpu": GPU, "settings": {"timer": timer}})


def make_db(path, rows):
    db = ResultsDB(path)
    for ev in rows:
        record(db, replace(ev, id=None), source=SRC)     # a fresh row each time
    db.close()
    return path


ROWS = [
    row((64, 64, 64), 5.0, 4.0),                                    # <1e9: 0.8 vs every baseline
    row((64, 64, 64), 4.0, {"torch": 6.0, "cublaslt_autotuned": 5.0}),  # best: vs fastest 1.25
    row((1024, 1024, 1024), 10.0, 11.0),                            # 1e9-1e11: 1.1
    row((2048, 2048, 2048), 1.0, 10.0, timer="events"),             # per-call events: not counted
    row((4096, 4096, 4096), 1.0, 10.0, stage="screen"),             # ranking only: not counted
    row((8192, 8192, 8192), 1.0, 10.0, status="wrong"),             # wrong: not counted
    row((1, 4096, 4096), 2.0, 3.0, layout="RC"),                    # a trace shape, in its layout
]


def test_coverage_over_a_small_db(tmp_path):
    db = make_db(tmp_path / "r.db", ROWS)
    grid = tmp_path / "grid.csv"
    grid.write_text("M,N,K\n64,64,64\n1024,1024,1024\n2048,2048,2048\n4096,4096,4096\n"
                    "8192,8192,8192\n1,4096,4096\n")
    trace = tmp_path / "trace.csv"
    trace.write_text("M,N,K,weight,layout\n1,4096,4096,0.5,RC\n64,64,64,0.5,RC\n")
    out = tmp_path / "cov"
    assert main(["report", "--coverage", "--db", str(db), "--grid", str(grid), "--trace", str(trace),
                 "--kernels", str(tmp_path / "no_kernels"), "--out", str(out)]) == 0
    table = {(r["list"], r["bucket"]): r for r in csv.DictReader((out / "buckets.csv").open())}
    assert table[("grid", "all")]["shapes"] == "6" and table[("grid", "all")]["measured"] == "3"
    assert table[("grid", "<1e9")]["measured"] == "2"              # 64^3 and 1x4096x4096 (any layout)
    assert table[("grid", "1e11-1e12")]["measured"] == "0"         # events, screen rows: no
    assert table[("grid", ">=1e12")]["measured"] == "0"            # a wrong row: no
    assert table[("grid", "1e9-1e11")]["geomean_vs_fastest"] == "1.100"
    per = {(r["list"], r["M"], r["N"], r["K"]): r for r in csv.DictReader((out / "coverage.csv").open())}
    g = per[("grid", "64", "64", "64")]
    assert g["best_us"] == "4.00" and g["vs_fastest_baseline"] == "1.250" and g["vs_cublaslt_autotuned"] == "1.250"
    assert per[("trace", "1", "4096", "4096")]["measured"] == "1"
    assert per[("trace", "64", "64", "64")]["measured"] == "0"     # measured in RR only
    assert table[("trace", "all")]["exported"] == "0"
    md = (out / "coverage.md").read_text()
    assert "| grid | all | 6 | 3 | 0 |" in md and str(db) in md
    assert (out / "command.txt").read_text().startswith("cudal2 report")


def test_coverage_over_a_committed_db(tmp_path):
    """The third H100 session's second call (a gzipped DB): every shape it timed by kernel time
    in finals counts (49 of the stratified 100, all on the grid)."""
    gz = (ROOT / "reports/NVIDIA_H100_80GB_HBM3/2026-11-23-campaign-s3-call2/reports/"
          "NVIDIA_H100_80GB_HBM3/2026-11-23-0624-campaign/results.db.gz")
    evs = ResultsDB(gz, readonly=True).rows()
    grid = C.read_shape_list(ROOT / "shapes.csv")
    cov = C.coverage(evs, {"grid": grid, "trace": C.read_shape_list(ROOT / "shapes/llm_trace.csv")})
    measured = [c for c in cov if c.grid == "grid" and c.measured]
    assert len(grid) == 1000 and len(measured) == 49
    assert all(c.vs_fastest and c.vs_autotuned and c.vs_fastest <= c.vs_autotuned for c in measured)
    assert not any(c.measured for c in cov if c.grid == "trace")   # the trace (RC) was never timed


def test_merge_accumulates_without_duplicates(tmp_path):
    a = make_db(tmp_path / "a.db", ROWS[:4])
    b = make_db(tmp_path / "b.db", ROWS[2:])                      # two rows in common with a
    with ResultsDB(b) as bdb:                                    # closed: its WAL checkpointed
        bdb.add_baseline_choice("k1", {"index": 3})
    bgz = tmp_path / "b.db.gz"
    bgz.write_bytes(gzip.compress((tmp_path / "b.db").read_bytes()))
    into = tmp_path / "acc" / "c.db"
    res = merge([a, bgz], into, log=lambda *x: None)
    assert res["added"] == len(ROWS) and res["skipped"] == 2 and res["choices_added"] == 1
    assert merge([a, b], into, log=lambda *x: None)["added"] == 0  # a second merge adds nothing
    with ResultsDB(into, readonly=True) as c:
        assert c.count() == len(ROWS) and c.source(source_sha(SRC)) == SRC
        assert sorted((e.shape, e.stage, e.layout, e.created) for e in c.rows()) == \
            sorted((e.shape, e.stage, e.layout, e.created) for e in ROWS)
        assert c.baseline_choices() == {"k1": {"index": 3}}
    assert main(["db", "merge", str(a), "--into", str(into)]) == 0
    assert main(["db", "merge", str(a), "--into", str(tmp_path / "x.db.gz")]) == 2
    assert main(["db", "merge", str(into), "--into", str(into)]) == 2


def test_planner_orders_unmeasured_shapes_by_expected_gain(tmp_path):
    evs = ROWS[:3]                  # <1e9 measured at 1.25 (best of 64^3), 1e9-1e11 at 1.1
    shapes = [Shape(64, 64, 64), Shape(64, 128, 64), Shape(1024, 1024, 1024), Shape(2048, 1024, 1024),
              Shape(1024, 2048, 2048), Shape(4096, 4096, 4096), Shape(128, 64, 64)]
    ranked = C.order_by_gain(shapes, evs, CostModel.default(arch="sm_90a"))
    order = [s for s, _ in ranked]
    assert Shape(64, 64, 64) not in order and Shape(1024, 1024, 1024) not in order   # measured
    # <1e9 (1.25) first, then 1e9-1e11 (1.1), then the unmeasured bucket at parity (1.0);
    # within a bucket the larger baseline time first
    assert order == [Shape(64, 128, 64), Shape(128, 64, 64),      # a tie: by shape
                     Shape(1024, 2048, 2048), Shape(2048, 1024, 1024), Shape(4096, 4096, 4096)]
    assert [round(g, 3) for _, g in ranked] == [1.25, 1.25, 1.1, 1.1, 1.0]


def test_campaign_flags_parse():
    import argparse
    from cudal2.runs import campaign
    p = argparse.ArgumentParser()
    campaign.configure_parser(p)
    a = p.parse_args(["prepare", "--shapes", "shapes.csv", "--out", "pack", "--order", "gain",
                      "--limit-shapes", "20", "--db", "a.db", "b.db.gz", "--max-pack-mib", "64"])
    assert (a.order, a.limit_shapes, a.db, a.max_pack_mib) == ("gain", 20, ["a.db", "b.db.gz"], 64.0)
    a = p.parse_args(["run", "pack", "--db", "all.db"])
    assert a.db == "all.db" and a.budget_s == 0.0


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else None]


def test_readme_own_gpu_commands_exist():
    """Every `cudal2 ...` command of the README's "On your own GPU" section parses with the real
    CLI's parser (its verb, sub-command and flags exist)."""
    import argparse
    import importlib
    import shlex
    from cudal2.cli import VERBS, module_for
    sec = _section((ROOT / "README.md").read_text(), "On your own GPU")
    cmds = [l.strip() for l in sec.splitlines() if l.strip().startswith("cudal2 ")]
    assert {c.split()[1] for c in cmds} >= {"campaign", "export", "report"}
    for cmd in cmds:
        argv = shlex.split(cmd.split(" #")[0])[1:]
        verb, rest = argv[0], argv[1:]
        assert verb in VERBS, cmd
        module, rest = module_for(verb, rest)                  # as `cudal2` picks it
        parser = argparse.ArgumentParser(prog=f"cudal2 {verb}", exit_on_error=False)
        importlib.import_module(module).configure_parser(parser)
        try:
            parser.parse_args(rest)
        except SystemExit as exc:                 # pragma: no cover - the failure message
            pytest.fail(f"README command does not parse: {cmd} ({exc})")
