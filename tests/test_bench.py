"""`cudal2 bench`: shape parsing, stratified sampling, job collection, and the report writer on a
synthetic results table (SYNTHETIC: made up by this test, never measured); the CLI without a GPU
builds, audits and says it measured nothing."""
import argparse
import csv
import json
import math
from pathlib import Path

import pytest

from cudal2.runs import bench
from cudal2.harness.types import BASELINES, Evaluation, Shape

REPO = Path(__file__).resolve().parent.parent
CHEATS = Path(__file__).parent / "data" / "cheats"


def test_parse_shapes_from_strings_and_files(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text("M,N,K\n64,128,256\n1,2,3\n")
    got = bench.parse_shapes(["4096,4096,512", "8x16x32", str(f), "64x128x256"])
    assert got == [Shape(4096, 4096, 512), Shape(8, 16, 32), Shape(64, 128, 256), Shape(1, 2, 3)]
    with pytest.raises(ValueError, match="neither"):
        bench.parse_shapes(["nope.csv"])


def test_stratified_sample_keeps_bucket_shares():
    grid = [Shape(m, n, k) for m in (64, 256, 1024, 4096, 16384) for n in (64, 1024, 16384)
            for k in (64, 1024, 16384)]
    s = bench.stratified_sample(grid, 20, seed=0)
    assert len(s) == 20 and len(set(s)) == 20
    assert s == [x for x in grid if x in s]                    # input order kept
    assert s == bench.stratified_sample(grid, 20, seed=0)      # deterministic per seed
    assert s != bench.stratified_sample(grid, 20, seed=1)
    full = {b: sum(bench.size_bucket(*x.__dict__.values()) == b for x in grid) for _, b in bench.BUCKETS}
    part = {b: sum(bench.size_bucket(x.M, x.N, x.K) == b for x in s) for _, b in bench.BUCKETS}
    for b in full:
        if full[b]:
            assert part[b] >= 1
            assert abs(part[b] / 20 - full[b] / len(grid)) < 0.1
    assert bench.stratified_sample(grid[:3], 10) == grid[:3]


def test_collect_jobs_from_files_and_errors(tmp_path):
    jobs = bench.collect_jobs([str(CHEATS / "good_naive.cu")], [Shape(64, 64, 64), Shape(1, 2, 3)],
                              "sm_90a")
    assert [j.shape for j in jobs] == [Shape(64, 64, 64), Shape(1, 2, 3)]
    assert "cudal2_hgemm" in jobs[0].source
    assert len(bench.collect_jobs([str(CHEATS)], [Shape(64, 64, 64)], "sm_90a")) == len(
        list(CHEATS.glob("*.cu")))
    with pytest.raises(ValueError, match="need --shapes"):
        bench.collect_jobs([str(CHEATS / "good_naive.cu")], None, "sm_90a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .cu files"):
        bench.collect_jobs([str(tmp_path / "empty")], [Shape(1, 1, 1)], "sm_90a")


def test_collect_jobs_from_an_index(tmp_path):
    from cudal2.core.store import KernelIndex

    idx = KernelIndex(tmp_path)
    src = (CHEATS / "good_naive.cu").read_text()
    idx.add(src, arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.add(src, arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64)
    idx.add(src, arch="sm_80", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.write()
    jobs = bench.collect_jobs([str(tmp_path / "index.csv")], None, "sm_90a")
    assert sorted(j.shape for j in jobs) == [Shape(64, 64, 64), Shape(128, 64, 64)]
    assert all(j.source == src and j.acc == "f32" for j in jobs)
    jobs = bench.collect_jobs([str(tmp_path)], [Shape(128, 64, 64)], "sm_90a")
    assert [j.shape for j in jobs] == [Shape(128, 64, 64)]


# ---- the report on a SYNTHETIC table ----------------------------------------------------------------

def synthetic_evaluations():
    """SYNTHETIC (tests only): candidate and baseline medians chosen to make known aggregates."""
    evs = []
    spec = [  # shape, candidate us, {baseline: us}
        (Shape(64, 64, 64), 2.0, 4.0),               # <1e9 flop: 2x faster
        (Shape(1024, 1024, 1024), 10.0, 5.0),        # 1e9-1e11: 2x slower
        (Shape(8192, 8192, 8192), 2000.0, 2200.0),   # >=1e12: 1.1x
    ]
    for shape, cand, base in spec:
        t = {"candidate": {"median_us": cand, "p10_us": cand, "p90_us": cand, "n": 50}}
        t.update({b: {"median_us": base, "p10_us": base, "p90_us": base, "n": 50} for b in BASELINES})
        evs.append(Evaluation("ok", "f" * 64, shape, "sm_90a", "f32", "RR",
                              correctness={"ok": True}, timings={"offline": t},
                              speedups={"offline": {b: base / cand for b in BASELINES}},
                              origin="synthetic.cu"))
    evs.append(Evaluation("wrong", "e" * 64, Shape(128, 128, 128), "sm_90a", "f32", "RR",
                          correctness={"ok": False}, detail="random_tol: 5 outputs",
                          origin="synthetic_bad.cu"))
    evs.append(Evaluation("too_fast", "d" * 64, Shape(16384, 8192, 8192), "sm_90a", "f32", "RR",
                          correctness={"ok": True}, detail="below the bound",
                          timings={"offline": {"candidate": {"median_us": 1.0},
                                               "torch": {"median_us": 1000.0}}},
                          origin="synthetic_fast.cu"))
    return evs


def test_summarize_aggregates_on_synthetic_rows():
    s = bench.summarize(synthetic_evaluations(), "offline", peak_tflops=989.4,
                        weights={(64, 64, 64): 3.0, (1024, 1024, 1024): 1.0})
    assert s["n_shapes"] == 3                      # wrong and too_fast rows never count
    a = s["baselines"]["torch"]
    assert a["n"] == 3 and a["below_1"] == 1
    assert a["geomean"] == pytest.approx((2.0 * 0.5 * 1.1) ** (1 / 3))
    assert a["mean"] == pytest.approx((2.0 + 0.5 + 1.1) / 3)
    assert a["min"] == pytest.approx(0.5)
    assert a["flop_weighted"] == pytest.approx((4 + 5 + 2200) / (2 + 10 + 2000))
    assert a["time_weighted"] == pytest.approx(4.0 / (3.0 / 2.0 + 1.0 / 0.5))
    assert a["buckets"]["<1e9"]["geomean"] == pytest.approx(2.0)
    assert a["buckets"][">=1e12"]["n"] == 1
    fr = s["large_fraction_of_peak"]
    assert fr["n"] == 1
    assert fr["median"] == pytest.approx(2 * 8192**3 / 2000e-6 / 989.4e12)


def test_write_report_folder_on_synthetic_rows(tmp_path):
    pytest.importorskip("matplotlib")
    evs = synthetic_evaluations()
    paths = bench.write_report(evs, tmp_path / "rep", modes=("offline",), title="SYNTHETIC test",
                               command="cudal2 bench --synthetic", provenance={"gpu": "none"},
                               peak_tflops=989.4, synthetic=True)
    md = paths["summary"].read_text()
    assert "SYNTHETIC DATA" in md and "## offline" in md
    assert "| torch | 3 | 1.032 | 1.200 | 0.500 | 1 | 1.098 |" in md
    assert "too_fast 1" in md and "wrong 1" in md
    assert "fraction of dense fp16 peak" in md
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 5 and {r["status"] for r in rows} == {"ok", "wrong", "too_fast"}
    assert rows[0]["offline_candidate_us"] == "2.000"
    er = list(csv.DictReader(paths["eval_results"][0].open()))
    assert [r["mnk"] for r in er] == ["64_64_64", "1024_1024_1024", "8192_8192_8192"]
    assert float(er[1]["cublaslt_autotuned"]) == pytest.approx(0.5)
    assert len(paths["pngs"]) == 2 and all(p.stat().st_size > 1000 for p in paths["pngs"])
    prov = json.loads(paths["provenance"].read_text())
    assert prov["synthetic"] is True and prov["command"] == "cudal2 bench --synthetic"
    assert paths["command"].read_text().strip() == "cudal2 bench --synthetic"


def test_report_with_no_measured_rows_says_so(tmp_path):
    evs = [e for e in synthetic_evaluations() if e.status != "ok"]
    md = bench.summary_markdown(evs, ("offline",), BASELINES, title="t")
    assert "0 measured shapes" in md
    assert math.isnan(bench.summarize(evs, "offline")["baselines"]["torch"]["geomean"])


# ---- the CLI -----------------------------------------------------------------------------------------

def _args(argv):
    p = argparse.ArgumentParser()
    bench.configure_parser(p)
    return p.parse_args(argv)


def test_parser_options_and_modes():
    a = _args(["--kernels", "x.cu", "--shapes", "1,2,3", "--mode", "both"])
    assert bench._modes(a) == ("offline", "e2e", "server")
    assert bench._modes(_args(["--kernels", "x", "--mode", "wall"])) == ("wall",)
    assert bench._modes(_args(["--kernels", "x", "--mode", "all"])) == ("offline", "server", "e2e", "wall")
    with pytest.raises(ValueError, match="unknown baseline"):
        bench._list("torch,cudnn", BASELINES, "baseline(s)")


def test_bad_input_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("CUDAL2_ARCH", "sm_90a")
    rc = bench.run_cli(_args(["--kernels", str(CHEATS / "good_naive.cu"), "--shapes", "nope"]))
    assert rc == 2 and "neither a readable CSV" in capsys.readouterr().err


@pytest.mark.compile
def test_cli_without_gpu_builds_audits_and_measures_nothing(tmp_path, capsys, monkeypatch, tmp_cache):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is about machines without a GPU")
    from cudal2.core.toolchain import ToolchainError, find_toolchain
    try:
        find_toolchain()
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    monkeypatch.setenv("CUDAL2_ARCH", "sm_90a")
    monkeypatch.chdir(tmp_path)
    argv = ["--kernels", str(CHEATS / "good_naive.cu"), "--shapes", "64,64,64",
            "--db", str(tmp_path / "r.db")]
    rc = bench.run_cli(_args(argv))
    out = capsys.readouterr().out
    assert "not measured: no GPU" in out
    assert rc == 0
    assert not (tmp_path / "reports").exists()         # no numbers, no report
    assert bench.run_cli(_args(argv + ["--require-gpu"])) == 3


@pytest.mark.compile
def test_killed_bench_resumes_and_skips_recorded_rows(tmp_path):
    """SIGKILL `cudal2 bench` mid-run: the rows already written survive (one commit per
    evaluation) and a rerun evaluates only the missing ones."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from cudal2.core.toolchain import ToolchainError, find_toolchain
    try:
        find_toolchain()
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    db = tmp_path / "r.db"
    shapes = [f"{m},{n},64" for m in (64, 128, 192, 256) for n in (64, 128)]
    cmd = [sys.executable, "-m", "cudal2", "bench", "--kernels", str(CHEATS / "good_naive.cu"),
           "--shapes", *shapes, "--db", str(db)]
    env = dict(os.environ, CUDAL2_ARCH="sm_90a")

    def rows():
        if not db.exists():
            return []
        with sqlite3.connect(db) as con:
            try:
                return con.execute("SELECT id, M, N FROM evaluations ORDER BY id").fetchall()
            except sqlite3.OperationalError:        # schema not created yet
                return []

    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not rows() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)    # its own session: bench and its workers
        proc.wait()
    before = rows()
    assert 1 <= len(before) < len(shapes), f"the kill came too late: {len(before)} rows"
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    after = rows()
    assert after[:len(before)] == before                      # recorded rows kept, not redone
    assert len(after) == len(shapes)                          # only the missing ones added
    assert len({(m, n) for _, m, n in after}) == len(shapes)  # no shape evaluated twice
