"""`cudal2 report --explain`: predicted beside measured per shape, ranked by the gap. Every row
here is SYNTHETIC (a fake GPU name, invented times); one test reads the committed H200 DB."""
import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2.cli import main
from cudal2.core.identity import source_sha
from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import record
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.runs import explain as X
from cudal2.runs.report import read_rows

ROOT = Path(__file__).resolve().parents[1]
GPU = "Fake GPU (synthetic)"
SRC_A = "int synthetic_explain_kernel_a;\n"
SRC_B = "int synthetic_explain_kernel_b;\n"
SRC_C = "int synthetic_explain_kernel_c;\n"          # its rows carry no meta
META = {"family": "mma", "style": "mma", "tile": [64, 64, 32], "threads": 128, "stages": 3,
        "params": {"BM": 64, "BN": 64, "BK": 32, "STAGES": 3}}
BUILD = {"registers": 96, "shared_bytes": 0, "spills": 0}


def row(shape, cand_us, bases, *, src=SRC_A, meta=META, stage="final", options=None, iv=None):
    bases = bases if isinstance(bases, dict) else {b: bases for b in BASELINES}
    t = {"offline": {"candidate": {"median_us": cand_us, "lo_us": cand_us * 0.99, "hi_us": cand_us * 1.01},
                     **{b: {"median_us": v} for b, v in bases.items()}}}
    sp = {"offline": {b: v / cand_us for b, v in bases.items()}}
    stats = {"offline": {"speedup": {b: {"median": s, "lo": s - (iv or 0.01), "hi": s + (iv or 0.01), "n": 9}
                                     for b, s in sp["offline"].items()}}}
    return Evaluation(status="ok", source_sha=source_sha(src), shape=Shape(*shape), arch="sm_90a",
                      acc="f32", layout="RR", timings=t, speedups=sp, stats=stats, stage=stage,
                      origin="tune", meta=dict(meta), build=dict(BUILD) if meta else {},
                      options=options or {}, correctness={"ok": True}, created="2026-01-02T00:00:00",
                      env={"gpu": GPU, "settings": {"timer": "kernel"}})


SLOW = {"torch": 16.0, "cublas_nn": 15.0, "cublas_tn": 17.0, "cublaslt_heuristic": 18.0,
        "cublaslt_autotuned": 19.0}
ROWS = [
    (row((16, 4096, 4096), 20.0, SLOW, options={"splits": 4}), SRC_A),   # decode: gap 20/15
    (row((16, 4096, 4096), 30.0, SLOW, src=SRC_B), SRC_B),              # a worse candidate
    (row((16, 4096, 4096), 1.0, SLOW, src=SRC_B, stage="screen"), SRC_B),   # screening: not a final
    (row((128, 128, 128), 5.0, 4.0, src=SRC_B), SRC_B),                  # small: gap 1.25
    (row((1024, 1024, 1024), 11.0, 10.0, src=SRC_C, meta={}), SRC_C),    # no meta: gap 1.1
]
CEILINGS = {"status": "ok", "detail": "", "fake_device": False, "device": {},
            "stream_read": [{"bytes": 1 << 30, "gbs": 4000.0, "ci": [3990, 4010], "copies": 1,
                             "us": {"median": 268.4, "lo": 268.0, "hi": 269.0}},
                            {"bytes": 16 << 20, "gbs": 2000.0, "ci": [1990, 2010], "copies": 8,
                             "us": {"median": 8.4, "lo": 8.3, "hi": 8.5}},
                            {"bytes": 32 << 20, "gbs": 2500.0, "ci": [2490, 2510], "copies": 8,
                             "us": {"median": 13.4, "lo": 13.3, "hi": 13.5}}],
            "device_copy": {"status": "not_measured", "detail": "synthetic"},
            "launch_floor": {"empty": {"median": 2.0, "lo": 1.9, "hi": 2.1},
                             "one_cta": {"median": 2.5, "lo": 2.4, "hi": 2.6},
                             "cublas_smallest": {"median": 3.0, "lo": 2.9, "hi": 3.1, "shape": [64, 64, 64]}}}


def make_db(path, rows=ROWS):
    with ResultsDB(path) as db:
        for ev, src in rows:
            record(db, replace(ev, id=None), source=src)
    return path


def recs_of(tmp_path, summary=None, **kw):
    evs = read_rows([make_db(tmp_path / "r.db")])
    return X.explain(evs, ceil=X.ceilings_of(summary), **kw)


def by_shape(recs):
    return {(r["M"], r["N"], r["K"]): r for r in recs}


def test_ranked_by_the_gap_worst_first_best_candidate_per_shape(tmp_path):
    recs = recs_of(tmp_path, {"ceilings": CEILINGS})
    assert [(r["M"], r["N"], r["K"]) for r in recs] == [(16, 4096, 4096), (128, 128, 128), (1024, 1024, 1024)]
    top = recs[0]
    assert top["ours_us"] == 20.0 and top["ours_sha"] == source_sha(SRC_A)[:12]   # not the screen row
    assert top["ours_options"] == "splits=4" and top["ours_family"] == "mma"
    assert top["ours_lo_us"] == pytest.approx(19.8) and top["ours_hi_us"] == pytest.approx(20.2)
    assert top["fastest_baseline"] == "cublas_nn" and top["fastest_us"] == 15.0
    assert top["gap"] == pytest.approx(20 / 15)
    assert top["speedup"] == pytest.approx(15 / 20)
    assert (top["speedup_lo"], top["speedup_hi"]) == (pytest.approx(0.74), pytest.approx(0.76))
    assert top["class"] == "decode" and recs[1]["class"] == "small" and recs[2]["class"] == "other"
    assert top["flop"] == 2 * 16 * 4096 * 4096
    assert (top["a_bytes"], top["b_bytes"], top["c_bytes"]) == (2 * 16 * 4096, 2 * 4096 * 4096, 2 * 16 * 4096)


def test_prediction_from_the_row_and_its_absence_said(tmp_path):
    recs = by_shape(recs_of(tmp_path))
    r = recs[(16, 4096, 4096)]
    assert r["prediction_source"] == "db row" and r["predicted_us"] > 0
    assert r["prediction_error"] == pytest.approx(20.0 / r["predicted_us"])
    none = recs[(1024, 1024, 1024)]
    assert none["predicted_us"] is None and none["prediction_error"] is None
    assert "no meta in the DB row" in none["prediction_note"]
    assert [x["K"] for x in X.by_prediction_error(list(recs.values()))] and none not in X.by_prediction_error(
        list(recs.values()))


def test_prediction_from_the_pack_manifest(tmp_path):
    manifest = {"candidates": [{"sha": source_sha(SRC_C), "dir": "builds/x", "family": "mma",
                                "label": "mma:BK=32,BM=64,BN=64,STAGES=3",
                                "params": [["BK", 32], ["BM", 64], ["BN", 64], ["STAGES", 3]],
                                "resources": BUILD}]}
    r = by_shape(recs_of(tmp_path, manifest=manifest))[(1024, 1024, 1024)]
    assert r["prediction_source"] == "pack manifest" and r["predicted_us"] > 0
    assert r["ours_config"] == "mma:BK=32,BM=64,BN=64,STAGES=3"


def test_decode_fraction_of_the_ceiling_at_the_nearest_size(tmp_path):
    r = by_shape(recs_of(tmp_path, {"ceilings": CEILINGS}))[(16, 4096, 4096)]
    nb = 2 * 4096 * 4096                                        # 32 MiB: the 32 MiB entry
    assert r["weight_bytes"] == nb and r["ceiling_bytes"] == 32 << 20 and r["ceiling_gbs"] == 2500.0
    assert r["ours_gbs"] == pytest.approx(nb / 20e3) and r["base_gbs"] == pytest.approx(nb / 15e3)
    assert r["ours_of_ceiling"] == pytest.approx(nb / 20e3 / 2500)
    assert r["base_of_ceiling"] == pytest.approx(nb / 15e3 / 2500)
    assert r["ceiling_note"] == "nearest size"
    assert by_shape(recs_of(tmp_path / "b", {"ceilings": CEILINGS}))[(128, 128, 128)]["weight_bytes"] is None
    no32 = dict(CEILINGS, stream_read=[e for e in CEILINGS["stream_read"] if e["bytes"] != 32 << 20])
    r = by_shape(recs_of(tmp_path / "c", {"ceilings": no32}))[(16, 4096, 4096)]
    assert r["ceiling_bytes"] == 16 << 20 and r["ceiling_gbs"] == 2000.0     # nearest in log size


def test_decode_without_ceilings_uses_the_large_buffer_figure_and_says_so(tmp_path):
    large = {"status": "ok", "gbs": 4000.0, "ci": [3990.0, 4010.0], "bytes": 1 << 30}
    ceil = X.ceilings_of({"bandwidth": large})
    assert "large-buffer figure" in ceil.line() and "predates" in ceil.floor_line()
    r = by_shape(recs_of(tmp_path, {"bandwidth": large}))[(16, 4096, 4096)]
    assert r["ceiling_gbs"] == 4000.0 and r["ours_of_ceiling"] == pytest.approx(2 * 4096 * 4096 / 20e3 / 4000)
    assert "not the row's size" in r["ceiling_note"]
    r = by_shape(recs_of(tmp_path / "n", {}))[(16, 4096, 4096)]           # neither: nothing invented
    assert r["ceiling_gbs"] is None and r["ours_of_ceiling"] is None and r["ours_gbs"] is not None
    assert "no 'ceilings'" in r["ceiling_note"]
    fake = X.ceilings_of({"ceilings": dict(CEILINGS, fake_device=True)})
    assert not fake.stream and not fake.floor and "fake device" in fake.line()
    refused = X.ceilings_of({"ceilings": dict(CEILINGS, launch_floor={"status": "error", "detail": "boom"})})
    assert refused.floor is None and "launch_floor error: boom" in refused.floor_line()


def test_small_shape_time_above_the_launch_floor(tmp_path):
    recs = by_shape(recs_of(tmp_path, {"ceilings": CEILINGS}))
    r = recs[(128, 128, 128)]
    assert r["floor_us"] == 2.0 and r["ours_above_floor_us"] == pytest.approx(3.0)
    assert r["base_above_floor_us"] == pytest.approx(2.0)
    assert recs[(1024, 1024, 1024)]["floor_us"] is None           # 2.1e9 FLOP: no floor column
    r = by_shape(recs_of(tmp_path / "n", {}))[(128, 128, 128)]
    assert r["floor_us"] is None and "no 'ceilings'" in r["floor_note"]


PROFILE_HEAD = ",".join(X.PROFILE_COLUMNS)


def prof_row(shape, who, name, kernel, status="ok", dur=10.0, detail=""):
    M, N, K = shape
    return (f"{M},{N},{K},RR,{who},{name},0,{kernel},{status},{detail},{dur},1000,100,55.5,40,"
            f"33.3,96,16384,\"(8, 4, 1)\",\"(128, 1, 1)\",long_scoreboard:40,wait:20,")


def test_profile_join_and_its_absence(tmp_path):
    p = tmp_path / "profile.csv"
    p.write_text("\n".join([PROFILE_HEAD,
                            prof_row((16, 4096, 4096), "ours", "ours", "hgemm_main", dur=18.0),
                            prof_row((16, 4096, 4096), "ours", "ours", "splitk_fixup", dur=2.0),
                            prof_row((16, 4096, 4096), "baseline", "torch", "sm90_gemv_torch", dur=16.0),
                            prof_row((16, 4096, 4096), "baseline", "cublas_nn", "sm90_gemv", dur=15.0),
                            prof_row((128, 128, 128), "ours", "ours", "", status="counters_refused",
                                     detail="ERR_NVGPUCTRPERM")]) + "\n")
    prof = X.read_profile(p)
    recs = by_shape(recs_of(tmp_path, profile=prof))
    r = recs[(16, 4096, 4096)]
    assert r["ours_prof_kernel"] == "hgemm_main" and r["ours_prof_launches"] == 2
    assert r["ours_prof_duration_us"] == pytest.approx(20.0) and r["ours_prof_dram_pct_peak"] == 55.5
    assert r["ours_prof_stalls"] == "long_scoreboard:40 wait:20" and r["ours_prof_grid"] == "(8, 4, 1)"
    assert r["baseline_prof_kernel"] == "sm90_gemv"                    # the fastest baseline's row
    s = recs[(128, 128, 128)]
    assert s["ours_prof_kernel"] is None and "counters_refused: ERR_NVGPUCTRPERM" in s["ours_prof_note"]
    assert s["baseline_prof_note"] == "no row for this shape in the profile"
    # absent: the columns are empty and the page says why in one line
    out = tmp_path / "o"
    (tmp_path / "call").mkdir()
    db = make_db(tmp_path / "call" / "r.db")
    assert main(["report", "--explain", "--db", str(db), "--out", str(out)]) == 0
    md = (out / "explain.md").read_text()
    assert "no profile.csv in this call" in md and "| shape | who | kernel |" not in md
    (tmp_path / "call" / "profile.csv").write_text(p.read_text())   # found beside the DB
    assert main(["report", "--explain", "--db", str(db), "--out", str(tmp_path / "o2")]) == 0
    assert "| 16x4096x4096 | ours | hgemm_main | 2 |" in (tmp_path / "o2" / "explain.md").read_text()
    first = next(csv.DictReader((out / "explain.csv").open()))
    assert first["ours_prof_kernel"] == "" and first["ours_prof_note"] == "no profile.csv in this call"
    # every launch refused: one line with the status
    p.write_text(PROFILE_HEAD + "\n" + prof_row((16, 4096, 4096), "ours", "ours", "", status="counters_refused") + "\n")
    assert main(["report", "--explain", "--db", str(db), "--profile", str(p), "--out", str(out)]) == 0
    assert "profile status counters_refused" in (out / "explain.md").read_text()


def test_cli_writes_the_page_csv_and_a_table(tmp_path, capsys):
    db = make_db(tmp_path / "r.db")
    summ = tmp_path / "summary.json"
    summ.write_text(json.dumps({"gpu": GPU, "ceilings": CEILINGS}))
    out = tmp_path / "out"
    assert main(["report", "--explain", "--db", str(db), "--summary", str(summ), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "16x4096x4096" in text and "explain over 3 shapes" in text
    md = (out / "explain.md").read_text()
    assert "Ranked by the gap" in md and "Ranked by prediction error" in md and "issue 51 is not built" in md
    assert md.index("16x4096x4096") < md.index("128x128x128") < md.index("1024x1024x1024")
    rows = list(csv.DictReader((out / "explain.csv").open()))
    assert [r["rank"] for r in rows] == ["1", "2", "3"] and rows[0]["ceiling_gbs"] == "2500"
    # the streaming budget's group: filled for a row a streaming family won, else it says why not
    assert all(c in rows[0] for c in ("budget_us", "budget_inflight_kib", "budget_note"))
    assert all(r["budget_note"] for r in rows)


def _one_line(capsys, *needles):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)


def test_cli_errors_are_one_line_naming_the_file(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["report", "--explain", "--db", str(tmp_path / "missing.db"), "--out", str(out)]) == 2
    _one_line(capsys, "missing.db")
    db = make_db(tmp_path / "r.db")
    bad = tmp_path / "p.csv"
    bad.write_text("M,N,K\n1,2,3\n")
    assert main(["report", "--explain", "--db", str(db), "--profile", str(bad), "--out", str(out)]) == 2
    _one_line(capsys, "p.csv", "missing column(s)", "layout")
    junk = tmp_path / "s.json"
    junk.write_text("{not json")
    assert main(["report", "--explain", "--db", str(db), "--summary", str(junk), "--out", str(out)]) == 2
    _one_line(capsys, "s.json", "not JSON")
    assert main(["report", "--explain", "--db", str(db), "--pack", str(tmp_path / "no.json"),
                 "--out", str(out)]) == 2
    _one_line(capsys, "no.json")
    assert not out.exists()


H200_RC = ROOT / "reports/NVIDIA_H200/2026-11-26-campaign-rc-call1"


@pytest.mark.skipif(not H200_RC.exists(), reason="the committed H200 call is not in this checkout")
def test_on_the_committed_h200_rc_db():
    run = H200_RC / "reports/NVIDIA_H200/2026-11-26-0905-campaign"
    evs = read_rows([run / "results.db.gz"])
    summary = json.loads((run / "summary.json").read_text())
    recs = X.explain(evs, ceil=X.ceilings_of(summary),
                     manifest=json.loads((H200_RC / "pack_manifest.json").read_text()))
    assert len(recs) == 26 and all(r["gap"] > 1 for r in recs)     # every kernel of ours lost
    assert [r["gap"] for r in recs] == sorted((r["gap"] for r in recs), reverse=True)
    assert all(r["predicted_us"] for r in recs)                      # meta + ptxas in every row
    assert all(r["ceiling_gbs"] is None for r in recs)               # the call predates "ceilings"
