"""The results DB: append-only, schema versioned, cache lookups, and a writer killed mid-stream
loses at most the row in flight; a rerun resumes and skips what is recorded."""
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.harness.db import SCHEMA_VERSION, DBError, ResultsDB
from cudal2.harness.types import Evaluation, Shape

REPO = Path(__file__).resolve().parents[1]
SHA = "a" * 64


def _ev(status="ok", shape=Shape(64, 128, 256), gpu="NVIDIA H100 80GB HBM3", sha=SHA, **kw):
    base = dict(
        status=status, source_sha=sha, shape=shape, arch="sm_90a", acc="f32", layout="RR",
        build={"status": "ok", "registers": 128, "shared_bytes": 49152, "spills": 0, "seconds": 1.5},
        audit={"ok": True, "reasons": []},
        correctness={"ok": status == "ok", "max_abs_err": 0.01, "max_rel_err": 0.002},
        timings={"offline": {"candidate": {"median_us": 10.0, "p10_us": 9.5, "p90_us": 11.0, "n": 100},
                             "cublas_nn": {"median_us": 12.0, "p10_us": 11.0, "p90_us": 13.0, "n": 100}}},
        speedups={"offline": {"cublas_nn": 1.2, "torch": 1.1}},
        env={"gpu": gpu, "driver": "550.54", "sm_clock_mhz": 1980, "temp_c": 41, "torch": "2.13",
             "nvcc": "13.0.88", "git_commit": "abc"},
        origin="test")
    base.update(kw)
    return Evaluation(**base)


def _find(db, shape=Shape(64, 128, 256), arch="sm_90a", gpu="NVIDIA H100 80GB HBM3", **kw):
    rows = db.rows(source_sha=SHA, shape=shape, arch=arch, gpu=gpu or "", **kw)
    return rows[-1] if rows else None


def test_roundtrip_and_key_columns(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        ev = _ev(options={"swizzle": 8}, stats={"offline": {"speedup": {"cublas_nn": {
            "median": 1.2, "lo": 1.15, "hi": 1.25, "n": 30}}}}, stage="final")
        rid = db.add(ev, source="__global__ void k() {}")
        assert rid == ev.id == 1
        got = _find(db)
        assert got is not None and got.to_dict() == ev.to_dict()
        assert got.options == {"swizzle": 8} and got.stage == "final"
        # the key is (source, shape, arch, gpu model, options): any difference misses
        assert _find(db, shape=Shape(64, 128, 512)) is None
        assert _find(db, arch="sm_80") is None
        assert _find(db, gpu="NVIDIA A100") is None
        assert _find(db, gpu=None) is None
        assert _find(db, options={}) is None and _find(db, options={"swizzle": 8}) is not None
        assert db.source(SHA) == "__global__ void k() {}"
        assert db.schema_version == SCHEMA_VERSION
        r = db._conn.execute("SELECT speedup_lo, options, stage FROM evaluations").fetchone()
        assert tuple(r) == (1.15, '{"swizzle": 8}', "final")


def test_baseline_choices_latest_per_key(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        db.add_baseline_choice("k1", {"index": 3, "algos": 40})
        db.add_baseline_choice("k2", {"index": 0, "algos": 1})
        db.add_baseline_choice("k1", {"index": 5, "algos": 40})
        assert db.baseline_choices() == {"k1": {"index": 5, "algos": 40}, "k2": {"index": 0, "algos": 1}}
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db._conn.execute("UPDATE baseline_choices SET key = 'x'")


def test_a_version_1_db_migrates_and_keeps_its_rows(tmp_path):
    from cudal2.harness import db as D

    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied TEXT NOT NULL)")
    for stmt in D._statements(D.MIGRATIONS[0]):
        con.execute(stmt)
    con.execute("INSERT INTO schema_version VALUES (1, 'then')")
    con.execute("INSERT INTO sources VALUES (?, 's', 'then')", (SHA,))
    cols = ("source_sha, M, N, K, arch, acc, layout, status, created, build, audit, correctness, "
            "timings, speedups, env, meta")
    con.execute(f"INSERT INTO evaluations ({cols}) VALUES (?, 1, 2, 3, 'sm_90a', 'f32', 'RR', 'ok', "
                "'then', '{}', '{}', '{}', '{}', '{}', '{}', '{}')", (SHA,))
    con.commit()
    con.close()
    before = path.read_bytes()
    with ResultsDB(path, readonly=True) as db:             # a committed report's DB: read as is
        (row,) = db.rows()
        assert row.status == "ok" and row.options == {} and row.stage == "final"
        assert db.schema_version == 1 and db.baseline_choices() == {}
        with pytest.raises(sqlite3.OperationalError):
            db.add(row, source="s")
    assert path.read_bytes() == before
    with ResultsDB(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        (row,) = db.rows()
        assert row.status == "ok" and row.options == {} and row.stage == "final" and row.stats == {}


def test_a_gzipped_db_reads_as_is_and_refuses_writes(tmp_path):
    """Large committed campaign DBs are kept as results.db.gz (collect.sh): they open read-only."""
    import gzip
    path = tmp_path / "r.db"
    with ResultsDB(path) as db:                             # WAL mode, as runs write them
        db.add(_ev("ok"), source="s")
        db.add_baseline_choice("k1", {"index": 3, "algos": 40})
    gz = tmp_path / "results.db.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with ResultsDB(gz) as db:
        assert db.readonly
        (row,) = db.rows()
        assert row.status == "ok" and db.baseline_choices() == {"k1": {"index": 3, "algos": 40}}
        with pytest.raises(sqlite3.OperationalError):
            db.add(row, source="s")
    (tmp_path / "bad.db.gz").write_bytes(b"not gzip")
    with pytest.raises(DBError, match="bad.db.gz"):
        ResultsDB(tmp_path / "bad.db.gz")
    (tmp_path / "notdb.db.gz").write_bytes(gzip.compress(b"hello"))
    with pytest.raises(DBError, match="notdb.db.gz"):
        ResultsDB(tmp_path / "notdb.db.gz")


def test_no_gpu_rows_keyed_by_empty_gpu(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev("not_measured", gpu=None, timings={}, speedups={}), source="s")
        assert _find(db, gpu=None).status == "not_measured"
        assert _find(db) is None


def test_rows_are_in_insertion_order(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev("wrong"), source="s")
        db.add(_ev("ok"), source="s")
        db.add(_ev("error", detail="harness bug"))
        assert [e.status for e in db.rows()] == ["wrong", "ok", "error"]
        assert db.count() == 3


def test_sources_stored_once(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        for n in (64, 128, 256):
            db.add(_ev(shape=Shape(n, n, n)), source="same text")
        assert db._conn.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 1
        with pytest.raises(ValueError, match="not in the DB"):
            db.add(_ev(sha="b" * 64))            # unknown source and none given


def test_append_only(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev(), source="s")
        for sql in ("UPDATE evaluations SET status = 'ok'", "DELETE FROM evaluations",
                    "UPDATE sources SET text = 'x'", "DELETE FROM sources"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db._conn.execute(sql)
        assert db.count() == 1


def test_wal_and_schema_version(tmp_path):
    path = tmp_path / "r.db"
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [r[0] for r in con.execute("SELECT version FROM schema_version")] == list(range(1, SCHEMA_VERSION + 1))
    con.execute("INSERT INTO schema_version VALUES (?, 'future')", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(DBError, match="newer"):
        ResultsDB(path)


def test_not_a_db(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DBError, match="not a usable results DB"):
        ResultsDB(bad)


def test_rows_filters_and_dataframe(tmp_path):
    pytest.importorskip("pandas")
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev("ok", shape=Shape(64, 64, 64)), source="s")
        db.add(_ev("wrong", shape=Shape(128, 64, 64)))
        db.add(_ev("ok", shape=Shape(128, 64, 64), gpu="NVIDIA A100-SXM4-80GB"))
        assert len(db.rows()) == 3
        assert [e.status for e in db.rows(status="ok")] == ["ok", "ok"]
        assert len(db.rows(M=128, gpu="NVIDIA A100-SXM4-80GB")) == 1
        assert len(db.rows(status=["ok", "wrong"], shape=Shape(128, 64, 64))) == 2
        with pytest.raises(ValueError, match="unknown filter"):
            db.rows(colour="red")
        df = db.to_dataframe()
        assert len(df) == 3
        assert list(df["offline_candidate_median_us"]) == [10.0] * 3
        assert list(df["speedup_offline_cublas_nn"]) == [1.2] * 3
        assert set(df["gpu"]) == {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}


_WRITER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from cudal2.harness.db import ResultsDB
from cudal2.harness.types import Evaluation, Shape
db = ResultsDB(sys.argv[2])
for n in range(1, int(sys.argv[3]) + 1):
    shape = Shape(n, 64, 64)
    if db.rows(source_sha="c" * 64, shape=shape, arch="sm_90a", gpu=""):
        continue                                   # resume: skip what is recorded
    ev = Evaluation(status="not_measured", source_sha="c" * 64, shape=shape, arch="sm_90a",
                    build={"log_tail": "x" * 2000}, env={"gpu": None})
    db.add(ev, source="kernel text")
    print(n, flush=True)
    time.sleep(float(sys.argv[4]))
print("done", flush=True)
"""


def test_killed_writer_loses_at_most_one_row_and_resumes(tmp_path):
    path = tmp_path / "r.db"
    total = 60
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(REPO), str(path), str(total), "0.01"],
                            stdout=subprocess.PIPE, text=True)
    written = 0
    for line in proc.stdout:
        written = int(line)
        if written >= 15:
            break
    os.kill(proc.pid, signal.SIGKILL)               # mid-stream, no chance to clean up
    proc.wait()
    with ResultsDB(path) as db:
        assert db._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ns = sorted(e.shape.M for e in db.rows())
        assert ns == list(range(1, len(ns) + 1))    # a prefix, no holes, no partial row
        assert written <= len(ns) <= written + 1    # at most the row in flight is lost/added
        assert all(e.build["log_tail"] == "x" * 2000 for e in db.rows())
    out = subprocess.run([sys.executable, "-c", _WRITER, str(REPO), str(path), str(total), "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), out.stderr
    resumed = [int(x) for x in out.stdout.split() if x.isdigit()]
    assert resumed and resumed[0] == len(ns) + 1    # skipped everything already recorded
    with ResultsDB(path) as db:
        assert sorted(e.shape.M for e in db.rows()) == list(range(1, total + 1))


def test_concurrent_writers(tmp_path):
    """Two processes append to one WAL database at once; nothing is lost."""
    path = tmp_path / "r.db"
    ResultsDB(path).close()
    code = _WRITER.replace('"c" * 64', 'sys.argv[5] * 64')
    procs = [subprocess.Popen([sys.executable, "-c", code, str(REPO), str(path), "30", "0", ch],
                              stdout=subprocess.DEVNULL) for ch in "de"]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    with ResultsDB(path) as db:
        assert db.count() == 60


def _foreign_files(tmp_path):
    """(file, what the error says) for each kind of file a results DB path may hold by mistake."""
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    truncated = tmp_path / "truncated.db"          # an SQLite header, then nothing usable
    truncated.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    other = tmp_path / "other.db"                  # someone else's SQLite DB (rollback journal)
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    con.execute("INSERT INTO notes (text) VALUES ('keep me')")
    con.commit()
    con.close()
    lookalike = tmp_path / "lookalike.db"          # has schema_version, lacks our tables
    con = sqlite3.connect(lookalike)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied TEXT NOT NULL)")
    con.execute("INSERT INTO schema_version VALUES (1, 'x')")
    con.commit()
    con.close()
    newer = tmp_path / "newer.db"                  # a results DB of a newer cudal2
    ResultsDB(newer).close()
    con = sqlite3.connect(newer)
    con.execute("INSERT INTO schema_version VALUES (?, 'future')", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    return [(garbage, "not an SQLite file"), (truncated, "not a usable results DB"),
            (other, "another schema, tables: notes"), (lookalike, "another schema"),
            (newer, f"schema version {SCHEMA_VERSION + 1} is newer")]


def test_a_foreign_or_corrupt_db_is_named_and_left_untouched(tmp_path):
    """A non-SQLite file, a corrupt one, an SQLite file of another schema and a results DB of a
    newer schema: each gives a DBError naming the file, and its bytes (and the folder: no -wal
    or -shm files) are as they were, writable or read-only."""
    for path, why in _foreign_files(tmp_path):
        before = path.read_bytes()
        siblings = sorted(p.name for p in tmp_path.iterdir())
        for readonly in (False, True):
            try:
                ResultsDB(path, readonly=readonly).close()
            except DBError as e:
                assert str(path) in str(e), e
                if not readonly:
                    assert why in str(e), (path.name, str(e))
            else:
                assert readonly and path.name == "newer.db", path   # a newer DB reads as is
        assert path.read_bytes() == before, f"{path.name} was modified"
        assert sorted(p.name for p in tmp_path.iterdir()) == siblings, path.name
    empty = tmp_path / "empty.db"                  # an empty file is a new DB
    empty.write_bytes(b"")
    ResultsDB(empty).close()
    assert ResultsDB(empty, readonly=True).schema_version == SCHEMA_VERSION


def test_write_seconds_counts_the_time_spent_writing(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        assert db.write_seconds == 0.0
        db.rows()                                        # reading is not writing
        assert db.write_seconds == 0.0
        db.add(_ev(), source="src")
        after_add = db.write_seconds
        assert after_add > 0.0
        db.add_baseline_choice("k1", {"index": 3})
        assert db.write_seconds > after_add               # cumulative
        db.baseline_choices()
        db.count()
        total = db.write_seconds
    with ResultsDB(tmp_path / "r.db", readonly=True) as ro:
        assert ro.write_seconds == 0.0 and ro.count() == 1
    assert total < 5.0
