"""Export: winners from results-DB rows into generated_kernels/ via KernelIndex, refusals named.

Timings here are SYNTHETIC (hand-written test rows), standing in for a GPU run.
"""
import pytest

from cudal2.runs.export import export, select, sources_from
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.core.identity import source_sha as sha256_text
from cudal2.core.store import KernelIndex
from cudal2.core.vocab import AUDIT_VERSION

# Distinct code, not just distinct comments: a source's identity ignores comments and spacing.
SRC = {name: f"// kernel {name}\nstatic const char* kName = \"{name}\";\nextern \"C\" int cudal2_hgemm();\n"
       for name in "abcd"}
SHA = {name: sha256_text(s) for name, s in SRC.items()}


GPU = "NVIDIA H100 80GB HBM3 (synthetic)"    # the GPU name rows record and export keys rows by


def ev(name, shape, cand_us, base_us, *, status="ok", estimated=False, acc="f32", layout="RR",
       correct=True, gpu=GPU, mode="offline", width=0.005,
       e2e=1.05, e2e_width=0.02, stage="final", options=None, intervals=True):
    """A final-stage row: kernel-time medians, paired-ratio speedups with intervals of relative
    half-width `width`, and an end-to-end speedup `e2e` (None: not measured)."""
    timings = {mode: {"candidate": {"median_us": cand_us}, **{b: {"median_us": base_us[i]}
                                                                for i, b in enumerate(BASELINES)}}}
    sp = {b: base_us[i] / cand_us for i, b in enumerate(BASELINES)}
    stats = {}
    if intervals:
        stats[mode] = {"speedup": {b: {"median": v, "lo": v * (1 - width), "hi": v * (1 + width),
                                       "n": 30} for b, v in sp.items()}}
    if e2e is not None:
        stats["e2e_eager_throughput"] = {"speedup": {"torch": {
            "median": e2e, "lo": e2e - e2e_width, "hi": e2e + e2e_width, "n": 10}}}
    return Evaluation(status=status, source_sha=SHA[name], shape=Shape(*shape), arch="sm_90a", acc=acc,
                      layout=layout, timings=timings, speedups={mode: sp}, stats=stats,
                      estimated=estimated, correctness={"ok": correct}, env={"gpu": gpu},
                      meta={"style": "mma"}, origin="tune", stage=stage, options=options or {},
                      audit=dict(GUARDED))


# what the harness records of a kernel audited by this cudal2 and measured with the call guard on
GUARDED = {"ok": True, "audit_version": AUDIT_VERSION,
           "call_guard": {"status": "on", "rules": AUDIT_VERSION, "refused": []}}


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
    assert ds[(64, 64, 64)].speedup_lo == pytest.approx(10 / 9 * 0.995)
    assert not ds[(256, 64, 64)].exported and "does not clear 1.02" in ds[(256, 64, 64)].reason
    assert not ds[(512, 64, 64)].exported and "estimated" in ds[(512, 64, 64)].reason
    assert not ds[(1024, 64, 64)].exported and "status wrong" in ds[(1024, 64, 64)].reason
    assert not ds[(2048, 64, 64)].exported and "does not clear" in ds[(2048, 64, 64)].reason
    # a 0% margin lets the 1% kernel through (its interval's lower end is above 1.0)
    assert {d.key[3] for d in select(_db_rows(), margin=0.0) if d.exported} == {64, 128, 256}


def test_export_rule_uses_the_interval_and_the_end_to_end_call():
    # median 1.05 but an interval down to 0.99: noise could explain it
    (d,) = select([ev("a", (64, 64, 64), 9.5, BASE, width=0.06)])
    assert not d.exported and "does not clear" in d.reason
    # kernel time wins, but the user's call is slower than torch.matmul
    (d,) = select([ev("a", (64, 64, 64), 5.0, BASE, e2e=0.9)])
    assert not d.exported and "end-to-end" in d.reason and "slower" in d.reason
    # an end-to-end tie within noise is not slower
    (d,) = select([ev("a", (64, 64, 64), 5.0, BASE, e2e=0.99, e2e_width=0.03)])
    assert d.exported
    (d,) = select([ev("a", (64, 64, 64), 5.0, BASE, e2e=None)])
    assert not d.exported and "end-to-end call not measured" in d.reason
    # rows timed before the kernel timer have no interval; screening rows never export
    (d,) = select([ev("a", (64, 64, 64), 5.0, BASE, intervals=False)])
    assert not d.exported and "before the kernel timer" in d.reason
    assert select([ev("a", (64, 64, 64), 5.0, BASE, stage="screen")]) == []
    # the best lower bound wins among passing rows, with its options
    rows = [ev("a", (64, 64, 64), 5.0, BASE, options={"swizzle": 1}),
            ev("a", (64, 64, 64), 4.0, BASE, options={"swizzle": 8})]
    (d,) = select(rows)
    assert d.exported and d.options == {"swizzle": 8}


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
    r = idx.get("sm_90a", "f32", "RR", 64, 64, 64, GPU)
    assert r.speedup_cublaslt_autotuned == pytest.approx(1.1111, abs=1e-4)
    assert r.speedup_torch == pytest.approx(12 / 9, abs=1e-4)
    assert r.speedup_lo == pytest.approx(10 / 9 * 0.995, abs=1e-4)
    assert r.report == "reports/H100/test-run" and r.family == "mma"
    assert idx.source(r) == SRC["a"]


def test_export_options_travel_and_failing_tuned_rows_leave(tmp_path):
    root = tmp_path / "gk"
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    export([ev("a", (64, 64, 64), 5.0, BASE, options={"swizzle": 8, "raster": 1}),
            ev("b", (128, 64, 64), 5.0, BASE)], by_sha.get, root=root, report="run1")
    idx = KernelIndex.load(root)
    r = idx.get("sm_90a", "f32", "RR", 64, 64, 64, GPU)
    assert r.options == "raster=1;swizzle=8" and r.options_dict == {"raster": 1, "swizzle": 8}
    # run2 measures the same kernel and options again: now it ties cuBLAS -> it leaves the table
    res = export([ev("a", (64, 64, 64), 10.0, BASE, options={"swizzle": 8, "raster": 1})],
                 by_sha.get, root=root, report="run2")
    assert not res.exported and res.removed and "removed" in res.refused[0].reason
    idx = KernelIndex.load(root)
    assert idx.get("sm_90a", "f32", "RR", 64, 64, 64, GPU) is None
    assert idx.get("sm_90a", "f32", "RR", 128, 64, 64, GPU) is not None      # untouched
    # a refused row for a kernel the table does not serve removes nothing when the tuned row
    # has kernel-time evidence (an interval) behind it
    res = export([ev("c", (128, 64, 64), 10.0, BASE)], by_sha.get, root=root, report="run3")
    assert not res.removed and KernelIndex.load(root).get("sm_90a", "f32", "RR", 128, 64, 64, GPU)
    # ... but a row exported before the kernel timer (no interval) goes when finals of its shape
    # find nothing that clears the rule
    idx = KernelIndex.load(root)
    idx.add(SRC["d"], arch="sm_90a", acc="f32", layout="RR", M=256, N=64, K=64, family="mma",
            tuned=True, mode="offline", report="old-timer run", speedups={"torch": 1.2})
    idx.write()
    res = export([ev("c", (256, 64, 64), 10.0, BASE)], by_sha.get, root=root, report="run4")
    assert res.removed and "no kernel-time interval" in res.refused[0].reason
    assert KernelIndex.load(root).get("sm_90a", "f32", "RR", 256, 64, 64, GPU) is None


def test_a_failing_remeasure_removes_only_the_options_that_failed(tmp_path):
    """(kernel, options) is what was exported: other options of the same build failing the
    rule leave the tuned row and its options in the table."""
    root = tmp_path / "gk"
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    export([ev("a", (64, 64, 64), 5.0, BASE, options={"swizzle": 8})], by_sha.get, root=root,
           report="run1")
    res = export([ev("a", (64, 64, 64), 10.0, BASE, options={"swizzle": 1})], by_sha.get,
                 root=root, report="run2")
    assert not res.exported and not res.removed
    assert KernelIndex.load(root).get("sm_90a", "f32", "RR", 64, 64, 64, GPU).options == "swizzle=8"


def test_options_travel_from_the_results_db_through_the_cli(tmp_path, capsys):
    """The winning row's options, as the results DB stored them, are what index.csv records."""
    from cudal2.cli import main
    from cudal2.harness.db import ResultsDB
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(ev("a", (64, 64, 64), 5.0, BASE, options={"swizzle": 1}), source=SRC["a"])
        db.add(ev("a", (64, 64, 64), 4.0, BASE, options={"swizzle": 8, "raster": 2}), source=SRC["a"])
    assert main(["export", "--db", str(tmp_path / "r.db"), "--report", "r", "--out",
                 str(tmp_path / "gk")]) == 0
    row = KernelIndex.load(tmp_path / "gk").get("sm_90a", "f32", "RR", 64, 64, 64, GPU)
    assert row.options_dict == {"raster": 2, "swizzle": 8} and "1 exported" in capsys.readouterr().out


def test_export_refuses_unknown_source(tmp_path):
    root = tmp_path / "gk"
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    res = export([ev("c", (128, 64, 64), 5.0, BASE)], lambda sha: None, root=root, report="run3")
    assert not res.exported and "not found" in res.refused[0].reason
    with pytest.raises(ValueError, match="report"):
        export([], by_sha.get, root=root, report="")


def test_sources_from_dir(tmp_path):
    (tmp_path / f"{SHA['a']}.cu").write_text(SRC["a"])
    find = sources_from(None, [tmp_path])
    assert find(SHA["a"]) == SRC["a"] and find(SHA["b"]) is None


def test_each_gpus_rows_export_into_its_own_row(tmp_path):
    """An H100 and an H200 are both sm_90a: each GPU's measurements of one shape export into a
    row keyed by that GPU's name, and the two rows coexist; --gpu still picks one GPU's rows."""
    rows = [ev("a", (64, 64, 64), 9.0, BASE), ev("b", (64, 64, 64), 8.0, BASE, gpu="NVIDIA  H200 ")]
    assert {(d.gpu, d.source_sha) for d in select(rows)} == {(GPU, SHA["a"]), ("NVIDIA H200", SHA["b"])}
    (d,) = select(rows, gpu="H200")
    assert d.exported and d.source_sha == SHA["b"]
    root = tmp_path / "gk"
    export(rows, {v: SRC[k] for k, v in SHA.items()}.get, root=root, report="two GPUs")
    idx = KernelIndex.load(root)
    assert [(r.gpu, idx.source(r)) for r in idx.rows] == [(GPU, SRC["a"]), ("NVIDIA H200", SRC["b"])]
    assert idx.get("sm_90a", "f32", "RR", 64, 64, 64) is None          # no any-GPU row was made


def _texts(root):
    return {p.name: p.read_text() for p in sorted(root.glob("*.csv"))}


def test_two_exports_of_one_shape_keep_the_faster_and_record_the_loser(tmp_path):
    """Two models' campaigns (two DBs) measured one shape on one GPU: whatever the order of the
    exports, the row keeps the higher lower bound (b: 10/8*0.995 over a: 10/9*0.995) and
    settled.csv keeps the loser's kernel, figure, report (and DB where known)."""
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    model_a = [ev("a", (64, 64, 64), 9.0, BASE), ev("a", (128, 64, 64), 9.0, BASE)]
    model_b = [ev("b", (64, 64, 64), 8.0, BASE)]
    ab, ba = tmp_path / "ab", tmp_path / "ba"
    export(model_a, by_sha.get, root=ab, report="reports/A", db="a.db")
    res = export(model_b, by_sha.get, root=ab, report="reports/B", db="b.db")
    assert [d.key[3] for d in res.exported] == [64] and "replaces the table's" in res.exported[0].reason
    export(model_b, by_sha.get, root=ba, report="reports/B", db="b.db")
    res = export(model_a, by_sha.get, root=ba, report="reports/A", db="a.db")
    assert [d.key[3] for d in res.exported] == [128] and not res.refused
    (kept,) = res.kept
    assert kept.key[3] == 64 and "is no slower than this" in kept.reason
    for root, lost_db in ((ab, ""), (ba, "a.db")):
        idx = KernelIndex.load(root)
        row = idx.get("sm_90a", "f32", "RR", 64, 64, 64, GPU)
        assert idx.source(row) == SRC["b"] and row.report == "reports/B"
        assert row.speedup_lo == pytest.approx(10 / 8 * 0.995, abs=1e-4)
        (rec,) = idx.settled()
        assert (rec["M"], rec["gpu"], rec["rule"]) == ("64", GPU, "speedup_lo")
        assert (rec["kept_source_sha"], rec["kept_report"]) == (SHA["b"], "reports/B")
        assert (rec["lost_source_sha"], rec["lost_report"], rec["lost_db"]) == (SHA["a"], "reports/A", lost_db)
        assert float(rec["lost_speedup_lo"]) == pytest.approx(10 / 9 * 0.995, abs=1e-4)
        assert "cublaslt_autotuned=1.1111" in rec["lost_speedups"]
    assert (ab / "index.csv").read_text() == (ba / "index.csv").read_text()
    # a tie keeps the table's row: the first export's kernel stays
    tie = tmp_path / "tie"
    export([ev("c", (64, 64, 64), 8.0, BASE)], by_sha.get, root=tie, report="reports/C")
    export(model_b, by_sha.get, root=tie, report="reports/B")
    assert KernelIndex.load(tie).source(KernelIndex.load(tie).rows[0]) == SRC["c"]
    # a row exported before the kernel timer (no interval) loses to one with, and is recorded
    idx = KernelIndex(tmp_path / "old")
    idx.add(SRC["d"], arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64, tuned=True,
            mode="offline", report="old-timer run", speedups={"torch": 3.0}, gpu=GPU)
    idx.write()
    export(model_b, by_sha.get, root=tmp_path / "old", report="reports/B")
    idx = KernelIndex.load(tmp_path / "old")
    assert idx.source(idx.rows[0]) == SRC["b"]
    assert [(r["lost_source_sha"], r["lost_speedup_lo"], r["lost_report"]) for r in idx.settled()] == [
        (SHA["d"], "", "old-timer run")]


def test_export_twice_is_idempotent(tmp_path):
    """The same rows exported again change no byte of index.csv, settled.csv or the kernels."""
    by_sha = {v: SRC[k] for k, v in SHA.items()}
    root = tmp_path / "gk"
    export([ev("a", (64, 64, 64), 9.0, BASE)], by_sha.get, root=root, report="reports/A", db="a.db")
    export([ev("b", (64, 64, 64), 8.0, BASE)] + _db_rows(), by_sha.get, root=root,
           report="reports/B", db="b.db")
    before = _texts(root), sorted(p.name for p in root.rglob("*.cu"))
    assert set(before[0]) == {"index.csv", "settled.csv"}
    for _ in range(2):
        export([ev("b", (64, 64, 64), 8.0, BASE)] + _db_rows(), by_sha.get, root=root,
               report="reports/B", db="b.db")
        assert (_texts(root), sorted(p.name for p in root.rglob("*.cu"))) == before


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
    assert "2 exported" in out and "refused" in out and "does not clear" in out and "estimated" in out
    idx = KernelIndex.load(root)
    assert {r.shape for r in idx.tuned_rows()} == {(64, 64, 64), (128, 64, 64)}
    assert idx.source(idx.rows[0]) == SRC["a"]          # the source came out of the DB
    # a dry run writes nothing
    root2 = tmp_path / "gk2"
    assert main(["export", "--db", str(db_path), "--report", "x", "--out", str(root2), "--dry-run"]) == 0
    assert not (root2 / "index.csv").exists()
    assert main(["export", "--db", str(tmp_path / "nope.db"), "--report", "x"]) == 2


def test_export_keeps_each_rows_m_bucket_and_old_rows_read_without_one(tmp_path):
    """A row exported at M carries M's token bucket (powers of two: 33-64 for 64, 3-4 for 4)."""
    root = tmp_path / "gk"
    rows = [ev("a", (64, 4096, 4096), 9.0, BASE), ev("b", (4, 4096, 4096), 9.0, BASE),
            ev("c", (1, 4096, 4096), 9.0, BASE)]
    export(rows, {v: SRC[k] for k, v in SHA.items()}.get, root=root, report="synthetic")
    idx = KernelIndex.load(root)
    assert [(r.M, r.m_bucket, r.bucket) for r in idx.rows] == [
        (1, "1-1", (1, 1)), (4, "3-4", (3, 4)), (64, "33-64", (33, 64))]
    assert "m_bucket" in (root / "index.csv").read_text().splitlines()[0]
    # a bucket that does not hold the row's M is refused, named
    from cudal2.core.store import KernelIndexError, with_fields
    with pytest.raises(KernelIndexError, match="m_bucket '1-64' must be empty or '33-64'"):
        with_fields(idx.get("sm_90a", "f32", "RR", 64, 4096, 4096, GPU), m_bucket="1-64")


def test_config_of_names_only_byte_identical_instantiations():
    """templates.config_of: an instantiation of a family config gives that config back; a source
    that only carries the banner (one byte changed, a banner for another config, an invalid or
    unknown config) gives None."""
    from cudal2.templates import config_of, default_configs, instantiate
    for config in default_configs():
        assert config_of(instantiate(config)) == config, config.label()
    src = instantiate(default_configs()[0])
    assert config_of(src + " ") is None
    assert config_of(src.replace("#define", "#define  ", 1)) is None
    other = default_configs()[1]
    assert config_of(src.replace(default_configs()[0].label(), other.label(), 1)) is None
    assert config_of(src.replace("config: mma:", "config: nosuch:", 1)) is None
    assert config_of(src.replace("BM=", "BM=x", 1)) is None
    assert config_of("// config: mma:BM=128\n") is None and config_of(SRC["a"]) is None


def test_export_records_the_audit_version_each_row_stands_for(tmp_path):
    """Column audit: the winner's audit as far as the call guard watched its calls under this
    cudal2's rules (harness.audit.audited_version). A row measured with the guard on serves; one
    whose calls were never watched (0), or watched under older rules (1), is written but does not
    serve until `cudal2 reaudit`."""
    from cudal2.core.tables import load_tables
    guarded = ev("a", (64, 64, 64), 9.0, BASE)
    unwatched = ev("b", (128, 64, 64), 9.0, BASE)
    unwatched.audit = {"ok": True, "audit_version": AUDIT_VERSION,
                       "call_guard": {"status": "off: no host C compiler"}}
    older = ev("c", (256, 64, 64), 9.0, BASE)
    older.audit = {"ok": True, "call_guard": {"status": "on", "refused": []}}
    root = tmp_path / "gk"
    export([guarded, unwatched, older], {SHA[k]: SRC[k] for k in "abc"}.get, root=root,
           report="synthetic")
    assert {r.M: r.audit for r in KernelIndex.load(root).rows} == {64: AUDIT_VERSION, 128: 0, 256: 1}
    t = load_tables(shipped=root, user=tmp_path / "none")
    assert [r.M for r in t.rows.values()] == [64]
    assert sorted(u.row.M for u in t.unaudited) == [128, 256]


def test_a_row_that_would_not_serve_never_replaces_one_that_does(tmp_path):
    """Settling by audit before figures: a faster winner whose calls the call guard never watched
    (it would not serve) loses to the table's audited row, recorded with rule `audit`; an
    audited winner replaces a faster row audited under older rules."""
    root = tmp_path / "gk"
    idx = KernelIndex(root)
    kw = dict(arch="sm_90a", acc="f32", layout="RR", N=64, K=64, tuned=True, mode="offline",
              report="earlier", speedups={"torch": 1.05}, gpu=GPU)
    idx.add(SRC["a"], M=64, speedup_lo=1.04, audit=AUDIT_VERSION, **kw)   # serves, slower
    idx.add(SRC["a"], M=128, speedup_lo=1.50, audit=1, **kw)              # faster, older rules
    idx.write()
    unwatched = ev("b", (64, 64, 64), 5.0, BASE)
    unwatched.audit = {"ok": True, "audit_version": AUDIT_VERSION}
    guarded = ev("b", (128, 64, 64), 9.0, BASE)
    res = export([unwatched, guarded], {SHA["b"]: SRC["b"]}.get, root=root, report="new")
    table = KernelIndex.load(root)
    back = {r.M: (table.source(r) == SRC["b"], r.audit) for r in table.rows}
    assert back == {64: (False, AUDIT_VERSION), 128: (True, AUDIT_VERSION)}
    kept = {d.key[3]: d for d in res.decisions}
    assert "passed this cudal2's audit and this one did not (audit v0): kept" in kept[64].reason
    assert "replaces the table's" in kept[128].reason and "audited under older rules" in kept[128].reason
    rules = sorted((r["M"], r["rule"]) for r in KernelIndex.load(root).settled())
    assert rules == [("128", "audit"), ("64", "audit")]


def test_export_writes_config_and_what_the_audit_verified(tmp_path):
    """Columns config and verified: the winner's audit record (meta_verified) travels to its row;
    a family instantiation is named by its config (its meta is ours), a source that only looks
    like one is not; a row already in the table gets its config when its source is one."""
    from cudal2.templates import FAMILIES, instantiate
    config = FAMILIES["mma"].default()
    inst = instantiate(config)
    srcs = {sha256_text(s): s for s in (SRC["a"], inst, inst + "static const int kEdited = 1;\n")}
    policy = ev("a", (64, 64, 64), 9.0, BASE)
    policy.audit = {"ok": True, "meta_verified": ["threads"]}
    ours = ev("a", (128, 64, 64), 9.0, BASE)
    ours.source_sha, ours.audit = sha256_text(inst), {"ok": True, "meta_verified": ["tile", "threads"]}
    lookalike = ev("a", (256, 64, 64), 9.0, BASE)
    lookalike.source_sha = sha256_text(inst + "static const int kEdited = 1;\n")
    root = tmp_path / "gk"
    old = KernelIndex(root)                      # a row written before the column: no config
    old.add(inst, arch="sm_90a", acc="f32", layout="RR", M=512, N=512, K=512, family="mma")
    old.write()
    export([policy, ours, lookalike], srcs.get, root=root, report="synthetic")
    idx = KernelIndex.load(root)
    got = {r.M: (r.config, r.verified, sorted(r.trusted_meta)) for r in idx.rows}
    assert got == {64: ("", "threads", ["threads"]),
                   128: (config.name(), "threads;tile", ["threads", "tile", "workspace"]),
                   256: ("", "", []),
                   512: (config.name(), "", ["threads", "tile", "workspace"])}
    assert (root / "index.csv").read_text().splitlines()[0].endswith(",config,verified,audit")
