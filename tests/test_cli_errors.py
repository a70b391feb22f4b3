"""Clean errors, nothing half-done (issue 34, point 6): every `cudal2` error is one line on stderr
naming the file, field or value, exit 2, no traceback; `db merge` checks every source before it
touches the target; shape CSVs tolerate spaces and a BOM in the header and refuse sizes the
kernel ABI cannot take; coverage's default shape lists hold wherever it runs; `--version`;
`cudal2.matmul(input=, other=)`; `--help` without torch. Rows made here are SYNTHETIC."""
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import cudal2
from cudal2 import cli
from cudal2.cli import main
from cudal2.core import knobs
from cudal2.core.identity import source_sha
from cudal2.harness.db import ResultsDB
from cudal2.harness.pipeline import record
from cudal2.harness.types import BASELINES, Evaluation, Shape
from cudal2.runs import coverage as C
from cudal2.runs import merge as merge_mod
from cudal2.runs.report import read_weights
from cudal2.search.tune import read_shapes, shapes_layout

ROOT = Path(__file__).resolve().parents[1]
SRC = "int synthetic_cli_errors_test_kernel;\n"
INT_MAX = 2**31 - 1


def one_line_error(capsys, *needles) -> str:
    """The captured stderr, asserted to be one line without a traceback holding every needle."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert str(n) in err, (n, err)
    return err.strip()


def row(shape=(64, 64, 64), cand_us=4.0, created="2026-01-01T00:00:00"):
    t = {"offline": {"candidate": {"median_us": cand_us}, **{b: {"median_us": 5.0} for b in BASELINES}}}
    return Evaluation(status="ok", source_sha=source_sha(SRC), shape=Shape(*shape), arch="sm_90a",
                      acc="f32", layout="RR", timings=t, stage="final", origin="tune",
                      speedups={"offline": {b: 5.0 / cand_us for b in BASELINES}},
                      correctness={"ok": True}, created=created,
                      env={"gpu": "Fake GPU (synthetic)", "settings": {"timer": "kernel"}})


def make_db(path, rows=(row(),)):
    with ResultsDB(path) as db:
        for ev in rows:
            record(db, replace(ev, id=None), source=SRC)
    return path


def junk(path, text="this is not a database\n"):
    path.write_text(text)
    return path


# --- report on a file that is not a results DB -------------------------------------------------
@pytest.mark.parametrize("flag", [[], ["--compare"], ["--coverage"]])
def test_report_on_a_non_db_or_missing_file_is_one_line(tmp_path, capsys, flag):
    bad = junk(tmp_path / "junk.db")
    assert main(["report", *flag, "--db", str(bad), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "junk.db", "not a usable results DB")
    assert main(["report", *flag, "--db", str(tmp_path / "missing.db"), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "missing.db")
    assert not (tmp_path / "o").exists()                     # nothing written


def test_report_on_a_foreign_sqlite_file_is_one_line(tmp_path, capsys):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    assert main(["report", "--db", str(other)]) == 2
    one_line_error(capsys, "other.db", "not a usable results DB")


# --- db merge: every source checked before the target is created or written ---------------------
def _counts(path):
    with ResultsDB(path, readonly=True) as db:
        return db.count()


@pytest.mark.parametrize("bad_name", ["corrupt.db", "missing.db", "foreign.db"])
def test_merge_with_a_bad_source_creates_no_target(tmp_path, capsys, bad_name):
    good = make_db(tmp_path / "good.db")
    bad = tmp_path / bad_name
    if bad_name == "corrupt.db":
        junk(bad)
    elif bad_name == "foreign.db":
        sqlite3.connect(bad).execute("CREATE TABLE t (x)").connection.close()
    new = tmp_path / "new.db"
    assert main(["db", "merge", str(good), str(bad), "--into", str(new)]) == 2
    one_line_error(capsys, bad_name)
    assert not list(tmp_path.glob("new.db*"))             # no target, no -wal/-shm beside it
    assert main(["db", "merge", str(bad), "--into", str(new)]) == 2
    one_line_error(capsys, bad_name)
    assert not list(tmp_path.glob("new.db*"))


def test_merge_with_a_bad_source_leaves_an_existing_target_untouched(tmp_path, capsys):
    good = make_db(tmp_path / "good.db", [row((128, 128, 128))])
    target = make_db(tmp_path / "target.db")
    before = target.read_bytes()
    bad = junk(tmp_path / "corrupt.db")
    assert main(["db", "merge", str(good), str(bad), "--into", str(target)]) == 2
    one_line_error(capsys, "corrupt.db")
    assert target.read_bytes() == before and _counts(target) == 1
    # the same merge without the bad source goes through
    assert main(["db", "merge", str(good), "--into", str(target)]) == 0
    assert _counts(target) == 2


def test_merge_removes_the_target_it_created_when_writing_fails(tmp_path, monkeypatch):
    good = make_db(tmp_path / "good.db", [row((64, 64, 64)), row((128, 128, 128))])
    calls = []

    def failing_record(db, ev, source=None):
        if calls:
            raise OSError(28, "No space left on device", str(db.path))
        calls.append(ev)
        return record(db, ev, source=source)

    monkeypatch.setattr(merge_mod, "record", failing_record)
    with pytest.raises(OSError):
        merge_mod.merge([good], tmp_path / "new.db", log=lambda *a: None)
    assert calls and not list(tmp_path.glob("new.db*"))


def test_merge_names_the_target_among_the_sources(tmp_path, capsys):
    target = make_db(tmp_path / "t.db")
    before = target.read_bytes()
    assert main(["db", "merge", str(target), "--into", str(target)]) == 2
    one_line_error(capsys, "t.db", "is the target DB")
    assert target.read_bytes() == before


# --- shape CSVs: spaces and a BOM in the header, sizes within the ABI's int range ----------------
HEADERS = {"spaces": "M, N, K, weight\n", "bom": "\ufeffM,N,K,weight\n",
           "both": "\ufeff M , N , K , weight \n"}


@pytest.mark.parametrize("header", sorted(HEADERS))
def test_csv_headers_tolerate_spaces_and_a_bom(tmp_path, header):
    p = tmp_path / "shapes.csv"
    p.write_bytes((HEADERS[header] + "64, 128, 256, 1.0\n").encode("utf-8"))
    assert read_shapes(p) == [Shape(64, 128, 256)]
    assert C.read_shape_list(p) == [((64, 128, 256), "")]
    assert read_weights(p) == {(64, 128, 256): 1.0}
    lay = tmp_path / "lay.csv"
    lay.write_bytes(("\ufeffM, N, K, layout\n1, 2, 3, RC\n").encode("utf-8"))
    assert shapes_layout(lay) == "RC"


def test_a_header_missing_a_column_is_still_named(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("M, N, Q\n1,2,3\n")
    for read in (read_shapes, C.read_shape_list):
        with pytest.raises(ValueError, match=r"s.csv: header must have columns M,N,K \(missing \['K'\]\)"):
            read(p)


@pytest.mark.parametrize("col", "MNK")
def test_sizes_above_the_abi_int_range_are_refused(tmp_path, col):
    sizes = {"M": 64, "N": 64, "K": 64, col: 3_000_000_000}
    p = tmp_path / "big.csv"
    p.write_text(f"M,N,K,weight\n64,64,64,1\n{sizes['M']},{sizes['N']},{sizes['K']},1\n")
    for read in (read_shapes, C.read_shape_list, read_weights):
        with pytest.raises(ValueError, match=rf"big.csv:3: column {col}: 3000000000 .*{INT_MAX}"):
            read(p)
    edge = tmp_path / "edge.csv"                             # INT_MAX itself fits
    edge.write_text(f"M,N,K,weight\n{INT_MAX},1,1,1\n")
    assert read_shapes(edge) == [Shape(INT_MAX, 1, 1)]
    assert C.read_shape_list(edge) == [((INT_MAX, 1, 1), "")]


def test_a_too_large_size_is_one_cli_line(tmp_path, capsys):
    big = tmp_path / "big.csv"
    big.write_text("M,N,K\n3000000000,64,64\n")
    db = make_db(tmp_path / "r.db")
    assert main(["report", "--coverage", "--db", str(db), "--grid", str(big), "--trace", "",
                 "--out", str(tmp_path / "cov")]) == 2
    one_line_error(capsys, "big.csv:2", "column M", "3000000000")
    assert main(["tune", "--shapes", str(big), "--build-only", "--arch", "sm_90a"]) == 2
    one_line_error(capsys, "big.csv:2", "column M", "3000000000")


# --- coverage: the default shape lists wherever the command runs --------------------------------
def test_coverage_defaults_resolve_outside_the_repository(tmp_path, monkeypatch, capsys):
    db = make_db(tmp_path / "r.db")
    monkeypatch.chdir(tmp_path)                              # no shapes.csv here
    assert main(["report", "--coverage", "--db", str(db), "--kernels", str(tmp_path / "none"),
                 "--out", "cov"]) == 0
    cmd = (tmp_path / "cov" / "command.txt").read_text()
    assert str(ROOT / "shapes.csv") in cmd and str(ROOT / "shapes" / "llm_trace.csv") in cmd
    assert "grid: 1 of 1000 shapes measured" in capsys.readouterr().out


def test_coverage_default_missing_from_an_install_is_one_line(tmp_path, monkeypatch, capsys):
    db = make_db(tmp_path / "r.db")
    monkeypatch.setattr(knobs, "repo_root", lambda: tmp_path / "site-packages")
    assert main(["report", "--coverage", "--db", str(db), "--out", str(tmp_path / "cov")]) == 2
    one_line_error(capsys, "--grid", "shapes.csv")


# --- --version and usage errors -----------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys, flag):
    assert main([flag]) == 0
    assert capsys.readouterr().out == f"cudal2 {cudal2.__version__}\n"


@pytest.mark.parametrize("argv,needle", [(["nope"], "'nope'"),
                                         (["report", "--bogus"], "--bogus"),
                                         (["db", "merge", "--into", "x.db"], "sources"),
                                         (["campaign", "prepare", "--out", "o"], "--shapes")])
def test_usage_errors_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    one_line_error(capsys, needle)


def test_a_bad_knob_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CUDAL2_LOG", "chatty")
    assert main(["report", "--db", "x.db"]) == 2
    one_line_error(capsys, "CUDAL2_LOG", "chatty")


# --- the safety net: known error types, one line; bugs keep their traceback ----------------------
FAKE_VERB = textwrap.dedent('''
    import sqlite3

    ERRORS = {
        "value": lambda: ValueError("shapes.csv:3: bad row"),
        "oserror": lambda: FileNotFoundError(2, "No such file or directory", "gone.csv"),
        "sqlite": lambda: sqlite3.DatabaseError("file is not a database"),
        "multiline": lambda: ValueError("first line\\n  second line"),
        "module": lambda: ModuleNotFoundError("No module named 'pandas'", name="pandas"),
        "own_module": lambda: ModuleNotFoundError("No module named 'cudal2.nope'", name="cudal2.nope"),
        "bug": lambda: TypeError("unsupported operand"),
        "sqlite_bug": lambda: sqlite3.ProgrammingError("Cannot operate on a closed database."),
    }

    def configure_parser(parser):
        parser.add_argument("what")

    def run_cli(args):
        raise ERRORS[args.what]()
''')


@pytest.fixture
def boom(tmp_path, monkeypatch):
    (tmp_path / "cudal2_fake_verb.py").write_text(FAKE_VERB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.VERBS, "boom", ("cudal2_fake_verb", "raises what it is told"))
    monkeypatch.delenv("CUDAL2_LOG", raising=False)
    yield
    sys.modules.pop("cudal2_fake_verb", None)


@pytest.mark.parametrize("what,line", [
    ("value", "cudal2 boom: shapes.csv:3: bad row"),
    ("oserror", "cudal2 boom: gone.csv: No such file or directory"),
    ("sqlite", "cudal2 boom: file is not a database"),
    ("multiline", "cudal2 boom: first line; second line"),
    ("module", "cudal2 boom: No module named 'pandas'"),
])
def test_known_errors_become_one_line(boom, capsys, what, line):
    assert main(["boom", what]) == 2
    assert one_line_error(capsys).startswith(line)


@pytest.mark.parametrize("what,exc", [("bug", TypeError), ("sqlite_bug", sqlite3.ProgrammingError),
                                      ("own_module", ModuleNotFoundError)])
def test_programming_errors_keep_their_traceback(boom, what, exc):
    with pytest.raises(exc):
        main(["boom", what])


def test_debug_log_level_reraises_a_known_error(boom, monkeypatch):
    monkeypatch.setenv("CUDAL2_LOG", "debug")
    with pytest.raises(ValueError, match="bad row"):
        main(["boom", "value"])


# --- cudal2.matmul takes torch.matmul's keyword names ------------------------------------------
def test_matmul_accepts_torch_keyword_names():
    import torch
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, generator=g), torch.randn(5, 4, generator=g)
    want = torch.matmul(input=a, other=b)
    assert torch.equal(cudal2.matmul(input=a, other=b), want)
    assert torch.equal(cudal2.matmul(a, other=b), want)
    assert torch.equal(cudal2.matmul(a, b), want)                 # positional calls unchanged
    out = torch.empty(3, 4)
    assert cudal2.matmul(input=a, other=b, out=out) is out and torch.equal(out, want)
    with pytest.raises(TypeError):
        cudal2.matmul(a=a, b=b)                                  # as torch.matmul refuses them


# --- --help without importing torch -------------------------------------------------------------
HELP_PROBE = textwrap.dedent('''
    import contextlib, io, json, sys
    from cudal2.cli import main
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(sys.argv[1:])
    heavy = [m for m in ("torch", "pandas", "matplotlib", "trl", "transformers", "ray") if m in sys.modules]
    print(json.dumps({"code": code, "usage": "usage: cudal2" in out.getvalue(), "heavy": heavy}))
''')
HELP_ARGVS = ([[v, "--help"] for v in cli.VERBS]
              + [["campaign", "prepare", "--help"], ["campaign", "run", "--help"], ["db", "merge", "--help"]]
              + [[v, f, "--help"] for v, f in cli.FLAG_MODULES]
              + [[v, o, "x", "--help"] for v, o in cli.OPTION_MODULES])


@pytest.mark.parametrize("argv", HELP_ARGVS, ids=" ".join)
def test_help_imports_no_torch(argv):
    """`cudal2 VERB --help` builds the verb's parser only: a verb module that loads torch (or
    pandas) on import makes every --help wait seconds for it."""
    env = {k: v for k, v in os.environ.items() if k != "CUDAL2_LOG"}
    res = subprocess.run([sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["code"] == 0 and got["usage"], got
    assert got["heavy"] == [], f"cudal2 {' '.join(argv)} imported {got['heavy']}"


@pytest.mark.parametrize("read", ["tune.read_shapes", "coverage.read_shape_list",
                                  "report.read_weights", "modelbench.read_rows"])
def test_every_shapes_reader_follows_the_one_rule(tmp_path, read):
    """core/shapefile.py is the rule of every shapes CSV reader: a BOM and spaced header names
    read, a size beyond the ABI's int refused naming the row and the column."""
    import importlib
    mod, fn = read.split(".")
    pkg = "cudal2.search" if mod == "tune" else "cudal2.runs"
    reader = getattr(importlib.import_module(f"{pkg}.{mod}"), fn)
    ok = tmp_path / "ok.csv"
    ok.write_text("\ufeffM, N, K, weight\n16, 4096, 4096, 1\n", encoding="utf-8")
    assert reader(ok)
    big = tmp_path / "big.csv"
    big.write_text("M,N,K,weight\n16,4096,4096,1\n3000000000,8,8,1\n")
    with pytest.raises(ValueError, match=r"big.csv:3: column M: 3000000000"):
        reader(big)
