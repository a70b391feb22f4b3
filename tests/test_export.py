"""Export: winners from results-DB rows into generated_kernels/ via KernelIndex, refusals named.

Timings here are SYNTHETIC (hand-written test rows), standing in for a GPU run.
"""
import pytest

from cudal2.export import export, select, sources_from
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.kernels import KernelIndex, sha256_text

SRC = {name: f"// kernel {name}\nextern \"C\" int cudal2_hgemm();\n" for name in "abcd"}
SHA = {name: sha256_text(s) for name, s in SRC.items()}


def ev(name, shape, cand_us, base_us, *, status="ok", estimated=False, acc="f32", layout="RR",
       correct=True, gpu="NVIDIA H100 80GB HBM3 (synthetic)", mode="offline"):
    timings = {mode: {"candidate": {"median_us": cand_us}, **{b: {"median_us": base_us[i]}
                                                                for i, b in enumerate(BASELINES)}}}
    return Evaluation(status=status, source_sha=SHA[name], shape=Shape(*shape), arch="sm_90a", acc=acc,
                      layout=layout, timings=timings, estimated=estimated,
                      correctness={"ok": correct}, env={"gpu": gpu}, meta={"style": "mma"}, origin="tune")


BASE = [12.0, 11.0, 11.5, 13.0, 10.0]      # best baseline: cublaslt_autotuned at 10 us


def _db_rows():
    return [
        ev("a", (64, 64, 64), 9.0, BASE),              # wins by 10%
        ev("b", (64, 64, 64), 9.5, BASE),              # slower than a: not chosen
        ev("a", (128, 64, 64), 9.0, BASE),             # same source, second shape: one file
        ev("c", (256, 64, 64), 9.9, BASE),             # 1% ahead: under the 2% margin
        ev("d", (512, 64, 64), 5.0, BASE, estimated=True),   # estimated: refused
        ev("d", (1024, 64, 64), 5.0, BASE, status="wrong"),  # wrong: refused
        ev("b", (2048, 64, 64), 20.0, BASE),           # slower than cuBLAS: refused
    ]


def test_select_reasons():
    ds = {d.key[3:]: d for d in select(_db_rows())}
    assert ds[(64, 64, 64)].exported and ds[(64, 64, 64)].source_sha == SHA["a"]
    assert ds[(64, 64, 64)].best_baseline == "cublaslt_autotuned"
    assert ds[(64, 64, 64)].speedups["cublaslt_autotuned"] == pytest.approx(10 / 9)
    assert not ds[(256, 64, 64)].exported and "2%" in ds[(256, 64, 64)].reason
    assert not ds[(512, 64, 64)].exported and "estimated" in ds[(512, 64, 64)].reason
    assert not ds[(1024, 64, 64)].exported and "status wrong" in ds[(1024, 64, 64)].reason
    assert not ds[(2048, 64, 64)].exported and "did not beat" in ds[(2048, 64, 64)].reason
    # a 0% margin lets the 1% kernel through
    assert {d.key[3] for d in select(_db_rows(), margin=0.0) if d.exported} == {64, 128, 256}


def test_export_writes_sources_once_and_tuned_rows(tmp_path):
    root = tmp_path / "gk"
    res = export(_db_rows(), {v: SRC[k] for k, v in SHA.items()}.get,
                 root=root, report="reports/H100/test-run")
    assert sorted(d.key[3] for d in res.exported) == [64, 128]
    idx = KernelIndex.load(root)            # verify=True: files exist and match their sha
    rows = idx.rows
    assert len(rows) == 2 and all(r.tuned and r.mode == "offline" for r in rows)
    assert rows[0].file == rows[1].file     # identical sources stored once
    assert len(list(root.glob("sm_90a/f32_RR/*.cu"))) == 1
    r = idx.get("sm_90a", "f32", "RR", 64, 64, 64)
    assert r.speedup_cublaslt_autotuned == pytest.approx(1.1111, abs=1e-4)
    assert r.speedup_torch == pytest.approx(12 / 9, abs=1e-4)
    assert r.report == "reports/H100/test-run" and r.family == "mma"
    assert idx.source(r) == SRC["a"]


def test_export_refuses_unknown_source_and_keeps_better_existing(tmp_path):
    root = tmp_path / "gk"
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    export([ev("a", (64, 64, 64), 5.0, BASE)], by_sha.get, root=root, report="run1")   # 2x
    res = export([ev("b", (64, 64, 64), 9.0, BASE)], by_sha.get, root=root, report="run2")
    assert not res.exported and "kept the tuned kernel" in res.refused[0].reason
    assert KernelIndex.load(root).get("sm_90a", "f32", "RR", 64, 64, 64).sha256 == SHA["a"]
    res = export([ev("c", (128, 64, 64), 5.0, BASE)], lambda sha: None, root=root, report="run3")
    assert not res.exported and "not found" in res.refused[0].reason
    with pytest.raises(ValueError, match="report"):
        export([], by_sha.get, root=root, report="")


def test_sources_from_dir(tmp_path):
    (tmp_path / f"{SHA['a']}.cu").write_text(SRC["a"])
    find = sources_from(None, [tmp_path])
    assert find(SHA["a"]) == SRC["a"] and find(SHA["b"]) is None


def test_several_gpus_need_a_choice():
    rows = [ev("a", (64, 64, 64), 9.0, BASE), ev("b", (64, 64, 64), 8.0, BASE, gpu="NVIDIA H200")]
    (d,) = select(rows)
    assert not d.exported and "--gpu" in d.reason
    (d,) = select(rows, gpu="H200")
    assert d.exported and d.source_sha == SHA["b"]


def test_export_cli_from_a_test_db(tmp_path, capsys):
    """The real path: rows and sources in a results DB, `cudal2 export` through the CLI."""
    from cudal2.cli import main
    from cudal2.harness.db import ResultsDB
    db_path = tmp_path / "results.db"
    with ResultsDB(db_path) as db:
        for e in _db_rows():
            name = next(k for k, v in SHA.items() if v == e.source_sha)
            db.add(e, source=SRC[name])
    root = tmp_path / "gk"
    assert main(["export", "--db", str(db_path), "--report", "reports/test/run", "--out", str(root),
                 "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "2 exported" in out and "refused" in out and "did not beat" in out and "estimated" in out
    idx = KernelIndex.load(root)
    assert {r.shape for r in idx.tuned_rows()} == {(64, 64, 64), (128, 64, 64)}
    assert idx.source(idx.rows[0]) == SRC["a"]          # the source came out of the DB
    # a dry run writes nothing
    root2 = tmp_path / "gk2"
    assert main(["export", "--db", str(db_path), "--report", "x", "--out", str(root2), "--dry-run"]) == 0
    assert not (root2 / "index.csv").exists()
    assert main(["export", "--db", str(tmp_path / "nope.db"), "--report", "x"]) == 2
