"""Reports: per-shape best per origin, aggregates, time weighting, compare tables.

All timings are SYNTHETIC test rows (no GPU measurement exists in the repo yet).
"""
import csv
import math

import pytest

from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.runs.report import (aggregate, collect, read_weights, size_bucket, write_compare,
                           write_summary)


SHA = __import__("hashlib").sha256(b"// synthetic test source\n").hexdigest()


def ev(shape, cand, base, origin, sha=SHA, status="ok", estimated=False):
    t = {"offline": {"candidate": {"median_us": cand}, **{b: {"median_us": base} for b in BASELINES}}}
    return Evaluation(status=status, source_sha=sha, shape=Shape(*shape), arch="sm_90a", acc="f32",
                      layout="RR", timings=t, estimated=estimated, origin=origin,
                      env={"gpu": "H100 (synthetic)"})


ROWS = [
    ev((64, 64, 64), 5.0, 10.0, "tune"), ev((64, 64, 64), 4.0, 10.0, "rl"),
    ev((64, 64, 64), 1.0, 10.0, "rl", estimated=True),          # ignored: estimated
    ev((64, 64, 64), 0.5, 10.0, "rl", status="wrong"),          # ignored: wrong
    ev((8192, 8192, 8192), 2000.0, 1000.0, "tune"),            # search loses 2x on a big shape
]


def test_buckets():
    assert size_bucket(64, 64, 64) == "<1e9"
    assert size_bucket(1024, 1024, 1024) == "1e9-1e11"
    assert size_bucket(4096, 4096, 4096) == "1e11-1e12"
    assert size_bucket(8192, 8192, 8192) == ">=1e12"


def test_collect_and_aggregate():
    rows = collect(ROWS)
    assert [r.shape for r in rows] == [(64, 64, 64), (8192, 8192, 8192)]
    assert rows[0].best["rl"].median_us == 4.0 and rows[0].best["search"].median_us == 5.0
    a = aggregate(rows, "search")["torch"]
    assert a["n"] == 2 and a["below_1"] == 1
    assert a["geomean"] == pytest.approx(math.sqrt(2.0 * 0.5))
    assert a["flop_weighted"] == pytest.approx((10 + 1000) / (5 + 2000))
    assert a["min"] == pytest.approx(0.5)
    assert a["buckets"] == {"<1e9": {"n": 1, "geomean": pytest.approx(2.0)},
                            ">=1e12": {"n": 1, "geomean": pytest.approx(0.5)}}
    w = {(64, 64, 64): 0.75, (8192, 8192, 8192): 0.25}
    a = aggregate(rows, None, w)["torch"]         # best of any origin: 2.5x and 0.5x
    assert a["time_weighted"] == pytest.approx(1 / (0.75 / 2.5 + 0.25 / 0.5))


def test_compare_and_summary_files(tmp_path):
    rows = collect(ROWS)
    paths = write_compare(rows, tmp_path / "cmp", mode="offline")
    recs = list(csv.DictReader(paths["csv"].open()))
    assert recs[0]["rl_us"] == "4.00" and recs[0]["search_us"] == "5.00"
    assert recs[1]["rl_us"] == "" and recs[1]["search_vs_torch"] == "0.500"
    md = paths["md"].read_text()
    assert "## search" in md and "## rl" in md and "head to head" in md
    s = write_summary(rows, tmp_path / "sum", mode="offline", weights={(64, 64, 64): 1.0})
    text = s["summary"].read_text()
    assert "| torch | 2 |" in text and ">=1e12" in text


def test_trace_weights_file():
    w = read_weights("shapes/llm_trace.csv")
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-4)
    assert (4096, 28672, 4096) in w           # Llama-3 8B gate_up at 4096 tokens


def test_bad_weights_file_is_named(tmp_path):
    p = tmp_path / "w.csv"
    p.write_text("M,N,K\n1,2,3\n")
    with pytest.raises(ValueError, match=r"missing \['weight'\]"):
        read_weights(p)
    p.write_text("M,N,K,weight\n1,2,3,0.5\n4,x,6,0.5\n")
    with pytest.raises(ValueError, match=r"w.csv:3: bad weighted shape row"):
        read_weights(p)


def test_report_cli_compare_from_a_test_db(tmp_path, capsys):
    from cudal2.cli import main
    from cudal2.harness.db import ResultsDB
    db_path = tmp_path / "results.db"
    with ResultsDB(db_path) as db:
        for e in ROWS:
            db.add(e, source="// synthetic test source\n")
    out = tmp_path / "cmp"
    assert main(["report", "--compare", "--db", str(db_path), "--out", str(out)]) == 0
    assert (out / "compare.csv").is_file() and "## rl" in (out / "compare.md").read_text()
    out2 = tmp_path / "sum"
    assert main(["report", "--db", str(db_path), "--out", str(out2), "--weights", "shapes/llm_trace.csv"]) == 0
    assert "geomean" in (out2 / "summary.md").read_text()
    assert (out2 / "command.txt").is_file()
    assert main(["report", "--db", str(db_path), "--out", str(out2), "--weights", str(tmp_path / "no.csv")]) == 2
    assert "--weights" in capsys.readouterr().err
