"""The user's own table (issue 34, point 4), on CPU: layered over the shipped one (the faster
measured row wins, provenance kept, a broken user table leaves the shipped one serving), export's
default root, and carried binaries (chosen without a build when their provenance checks out,
refused with the reason when it does not). Built with synthetic rows; no nvcc runs here."""
import hashlib
import json
import logging

import pytest

from cudal2.core import binaries
from cudal2.core.build import BuildResult
from cudal2.core.store import KernelIndex
from cudal2.core.tables import SHIPPED, USER, load_tables, wins
from cudal2.runtime import resolve
from cudal2.runtime.loader import KernelLoader, KernelLoadError
from cudal2.core.vocab import AUDIT_VERSION
from tests.test_dispatch import ANY, FakeLib
from tests.test_export import BASE, SHA, SRC, _db_rows, ev

H100 = "NVIDIA H100 80GB HBM3"


def add(idx, M, lo, *, src=None, gpu="", tuned=True, N=256, K=256):
    """A tuned (or seed) row of `idx` at M x N x K whose lower bound is `lo` (None: a row exported
    before the kernel timer)."""
    kw = dict(tuned=True, mode="offline", report=f"{idx.root.name}-run", speedups={"torch": 1.3},
              speedup_lo=lo, audit=AUDIT_VERSION) if tuned else {}
    return idx.add(src or f"// {idx.root.name} {M} {N} {K} {gpu}\n", arch="sm_90a", acc="f32",
                   layout="RR", M=M, N=N, K=K, family="mma", gpu=gpu, verified="tile", **kw)


@pytest.fixture
def two_tables(tmp_path, monkeypatch):
    """Empty shipped and user tables, named by the knobs (CUDAL2_CACHE in tmp_path)."""
    monkeypatch.setenv("CUDAL2_KERNELS", str(tmp_path / "shipped"))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDAL2_USER_KERNELS", raising=False)
    return KernelIndex(tmp_path / "shipped"), KernelIndex(tmp_path / "cache" / "kernels")


# -- layering ----------------------------------------------------------------------------------

def _record(root, sha):
    """The provenance JSON a carried sm_90a binary has beside it."""
    return json.loads(binaries.paths(root, "sm_90a", sha)[1].read_text())

def test_the_faster_measured_row_serves_and_the_other_is_kept_shadowed(two_tables):
    shipped, user = two_tables
    rows = {  # M: (shipped lo, user lo, which serves)
        64: (1.05, 1.10, USER), 128: (1.20, 1.10, SHIPPED), 256: (None, 1.03, USER),
        512: (1.05, None, SHIPPED), 1024: (1.07, 1.07, USER)}
    for M, (s_lo, u_lo, _) in rows.items():
        add(shipped, M, s_lo)
        add(user, M, u_lo)
    add(shipped, 8, 1.5)                                 # only shipped
    add(user, 16, 1.5)                                   # only user
    add(user, 2048, None, tuned=False)                   # a user seed never serves nor shadows
    add(shipped, 2048, 1.04)
    add(user, 32, 1.5, gpu=H100)                         # another key: both rows stay
    add(shipped, 32, 1.6)
    shipped.write()
    user.write()
    t = load_tables()
    assert t.problems == [] and set(t.indexes) == {SHIPPED, USER}
    served = {(r.M, r.gpu): t.table_of(r) for r in t.rows.values()}
    assert served == {**{(M, ""): want for M, (_, _, want) in rows.items()}, (8, ""): SHIPPED,
                      (16, ""): USER, (2048, ""): SHIPPED, (32, H100): USER, (32, ""): SHIPPED}
    # provenance: each served row reads its source under its own table's root
    for r in t.rows.values():
        assert t.root_of(r) == t.indexes[t.table_of(r)].root
        assert t.source(r).startswith(f"// {t.root_of(r).name} {r.M} ")
    lost = {(s.row.M, s.table, s.by) for s in t.shadowed}
    assert lost == {(M, SHIPPED if want == USER else USER, want) for M, (_, _, want) in rows.items()}
    assert wins(shipped.get("sm_90a", "f32", "RR", 128, 256, 256),
                user.get("sm_90a", "f32", "RR", 128, 256, 256))


def test_a_broken_user_table_leaves_the_shipped_one_serving(two_tables):
    shipped, user = two_tables
    add(shipped, 128, 1.1)
    shipped.write()
    add(user, 128, 1.5)
    add(user, 256, 1.5)
    user.write()
    (user.root / "sm_90a" / "f32_RR" / "256_256_256.cu").write_text("// edited by hand\n")
    t = load_tables()
    (problem,) = t.problems
    assert str(user.index_path) in problem and "256_256_256.cu" in problem and "(user)" in problem
    assert [(t.table_of(r), r.M) for r in t.rows.values()] == [(SHIPPED, 128)]
    # the dispatcher says so once, naming the file, and serves the shipped row
    resolve.reset(KernelLoader(lambda s, a, n: FakeLib(dict(ANY, arch="sm_90a", acc="f32",
                                                                 layout="RR"))))
    try:
        with pytest.warns(RuntimeWarning, match="ignoring the kernel table .*cache/kernels/index.csv"):
            tbl = resolve.table()
        assert [r.M for r in tbl.values()] == [128]
        resolve.state.arch[0] = "sm_90a"
        assert resolve.decide(0, 128, 256, 256, "RR", None, None) is not resolve.TORCH
    finally:
        resolve.reset()
    (user.root / "index.csv").write_text("not,a,table\n")        # unreadable header: same
    t = load_tables()
    assert len(t.problems) == 1 and "header" in t.problems[0] and len(t.rows) == 1


def test_one_folder_named_twice_is_one_table(two_tables, monkeypatch):
    shipped, _ = two_tables
    add(shipped, 128, 1.1)
    shipped.write()
    monkeypatch.setenv("CUDAL2_USER_KERNELS", str(shipped.root))
    t = load_tables()
    assert list(t.indexes) == [SHIPPED] and len(t.rows) == 1 and t.shadowed == []


# -- export's default root ---------------------------------------------------------------------
def test_export_writes_the_user_table_by_default_and_never_the_shipped_one(tmp_path, monkeypatch,
                                                                           capsys):
    """No --out: the rows go to $CUDAL2_CACHE/kernels; the shipped table (the real
    generated_kernels/ here, CUDAL2_KERNELS unset) is byte for byte untouched."""
    from cudal2.cli import main
    from cudal2.core import knobs
    from cudal2.harness.db import ResultsDB
    from cudal2.runs.export import export
    monkeypatch.delenv("CUDAL2_KERNELS", raising=False)
    monkeypatch.delenv("CUDAL2_USER_KERNELS", raising=False)
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    shipped = knobs.kernels_dir()
    before = {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()}
    db_path = tmp_path / "results.db"
    with ResultsDB(db_path) as db:
        for e in _db_rows():
            db.add(e, source=SRC[next(k for k, v in SHA.items() if v == e.source_sha)])
    assert main(["export", "--db", str(db_path), "--report", "reports/test/run"]) == 0
    assert f"into {tmp_path / 'cache' / 'kernels'}" in capsys.readouterr().out
    user = KernelIndex.load(tmp_path / "cache" / "kernels")
    assert {r.shape for r in user.tuned_rows()} == {(64, 64, 64), (128, 64, 64)}
    res = export([ev("c", (4096, 64, 64), 5.0, BASE)], {SHA["c"]: SRC["c"]}.get,
                 report="synthetic")                    # the function's default root too
    assert res.index_path == tmp_path / "cache" / "kernels" / "index.csv"
    assert {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()} == before
    # dispatch layers what was exported over the shipped table
    t = load_tables()
    assert {r.shape for r in t.rows.values() if t.table_of(r) == USER} == {
        (64, 64, 64), (128, 64, 64), (4096, 64, 64)}


# -- carried binaries ----------------------------------------------------------------------------
CUDA = "12.4"


@pytest.fixture
def carried(two_tables, tmp_path):
    """A user table with one tuned kernel carrying a (fake) built library."""
    _, user = two_tables
    row = add(user, 128, 1.2, gpu=H100)
    user.write()
    so = tmp_path / "kernel.so"
    so.write_bytes(b"\x7fELF a library nvcc built")
    path = binaries.carry(user.root, "sm_90a", row.sha256, so, nvcc="12.4.131", gpus=[H100])
    return user, row, path


def loader_with(built, loaded, cuda=CUDA):
    def build_and_load(source, arch, name):
        built.append(name)
        return FakeLib(dict(ANY, arch="sm_90a", acc="f32", layout="RR"))

    def load_binary(so):
        loaded.append(so)
        return FakeLib(dict(ANY, arch="sm_90a", acc="f32", layout="RR"))
    return KernelLoader(build_and_load, load_binary=load_binary, cuda=lambda: cuda)


def test_carry_records_provenance_and_prune_drops_what_left_the_table(carried, tmp_path):
    user, row, so = carried
    rec = _record(user.root, row.sha256)
    assert so == user.root / "bin" / "sm_90a" / f"{row.sha256}.so"
    assert rec == {"format": 1, "arch": "sm_90a", "source_sha256": row.sha256,
                   "so_sha256": hashlib.sha256(so.read_bytes()).hexdigest(), "nvcc": "12.4.131",
                   "cuda": "12.4", "gpus": [H100]}
    assert binaries.check(user.root, "sm_90a", row.sha256, cuda="12.8") == (so, "")
    assert binaries.prune(user.root, {("sm_90a", row.sha256)}) == []
    assert len(binaries.prune(user.root, set())) == 2 and not so.exists()


def test_a_carried_binary_serves_without_building(carried):
    user, row, so = carried
    built, loaded = [], []
    resolve.reset(loader_with(built, loaded))
    try:
        resolve.state.arch[0] = "sm_90a"
        resolve.state.gpu[0] = H100
        assert resolve.decide(0, 128, 256, 256, "RR", None, None) is not resolve.TORCH
        assert (built, loaded) == ([], [so])
    finally:
        resolve.reset()


@pytest.mark.parametrize("spoil,why", [
    ("so", "sha256"), ("arch", "built for arch 'sm_80', this GPU is sm_90a"),
    ("cuda", "built with CUDA 13.0, this torch runs CUDA 12.4"), ("source", "built from source"),
    ("record", "unreadable provenance"), ("torch", "this torch has no CUDA")])
def test_a_carried_binary_that_does_not_check_out_is_refused_with_the_reason(carried, caplog,
                                                                             spoil, why):
    user, row, so = carried
    _, rec_path = binaries.paths(user.root, "sm_90a", row.sha256)
    rec = json.loads(rec_path.read_text())
    cuda = CUDA
    if spoil == "so":
        so.write_bytes(so.read_bytes() + b" patched")
    elif spoil == "record":
        rec_path.write_text("{not json")
    elif spoil == "torch":
        cuda = None
    else:
        field, value = {"arch": ("arch", "sm_80"), "cuda": ("cuda", "13.0"),
                        "source": ("source_sha256", "0" * 64)}[spoil]
        rec[field] = value
        rec_path.write_text(json.dumps(rec))
    built, loaded = [], []
    kl = loader_with(built, loaded, cuda)
    with caplog.at_level(logging.WARNING, logger="cudal2.runtime"):
        for _ in range(2):   # the second call is a dict get: said once
            kl.get(row.sha256, lambda: user.source(row), "sm_90a", name=row.file,
                   carried=(user.root, row.sha256))
    assert loaded == [] and built == [row.file]
    said = [r.getMessage() for r in caplog.records if "carried binary" in r.getMessage()]
    assert len(said) == 1 and why in said[0] and row.file in said[0], said


def test_a_carried_binary_that_does_not_load_falls_back_to_building(carried, caplog):
    user, row, so = carried
    built = []

    def load_binary(path):
        raise OSError("libcudart.so.12: cannot open shared object file")
    kl = KernelLoader(lambda s, a, n: built.append(n) or "lib", load_binary=load_binary,
                      cuda=lambda: CUDA)
    with caplog.at_level(logging.WARNING, logger="cudal2.runtime"):
        assert kl.get("k", lambda: user.source(row), "sm_90a", name=row.file,
                      carried=(user.root, row.sha256)) == "lib"
    assert built == [row.file] and "libcudart.so.12" in caplog.text


def test_export_with_binaries_carries_every_tuned_kernel(two_tables, tmp_path):
    """carry_binaries (export --with-binaries) with a stand-in for build_many: one build per
    kernel of the table, its library and record stored, a failed build named, stale binaries
    pruned."""
    from cudal2.runs.export import carry_binaries
    _, user = two_tables
    good = add(user, 128, 1.2, gpu=H100)
    add(user, 256, 1.2, src=user.source(good))          # the same kernel: one build
    bad = add(user, 512, 1.2, src="// does not compile\n")
    add(user, 1024, None, tuned=False)                   # a seed: not carried
    user.write()
    stale = user.root / "bin" / "sm_90a" / f"{'f' * 64}.so"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    calls = []

    def fake_build_many(specs, jobs=None):
        calls.append((len(specs), jobs))
        out = []
        for spec in specs:
            if "does not compile" in spec.source:
                out.append(BuildResult("compile_error", "k", None, None, "error: nope"))
                continue
            so = tmp_path / f"{len(out)}.so"
            so.write_bytes(spec.source.encode())
            out.append(BuildResult("ok", "k", so, None, ""))
        return out
    got = carry_binaries(user.root, build=fake_build_many, jobs=3, nvcc="12.4.131")
    assert calls == [(2, 3)]
    assert sorted(s for _, _, s in got) == ["build compile_error", "carried"]
    assert binaries.check(user.root, "sm_90a", good.sha256, cuda="12.1")[0] is not None
    assert _record(user.root, good.sha256)["gpus"] == [H100]
    assert not binaries.paths(user.root, "sm_90a", bad.sha256)[1].exists() and not stale.exists()


def test_loader_errors_name_no_nvcc_without_a_toolchain(monkeypatch):
    """The real cache lookup without nvcc: not built, and nothing to build it with, said in one
    line (torch serves)."""
    from cudal2.core.toolchain import ToolchainError
    from cudal2.runtime import loader as L

    def no_nvcc(spec, cache=None):
        raise ToolchainError("nvcc not found")
    monkeypatch.setattr(L, "lookup", no_nvcc)
    with pytest.raises(KernelLoadError, match="k.cu: not built here and no nvcc to build it"):
        KernelLoader().get("x", lambda: "// src\n", "sm_90a", name="k.cu")


def test_export_cli_with_binaries(tmp_path, monkeypatch, capsys):
    """`cudal2 export --with-binaries` (no --out): the rows and their libraries land in the user
    table; the summary counts them."""
    from types import SimpleNamespace

    from cudal2.cli import main
    from cudal2.harness.db import ResultsDB
    from cudal2.runs import export as export_mod
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_KERNELS", str(tmp_path / "shipped"))
    monkeypatch.delenv("CUDAL2_USER_KERNELS", raising=False)
    db_path = tmp_path / "results.db"
    with ResultsDB(db_path) as db:
        for e in _db_rows():
            db.add(e, source=SRC[next(k for k, v in SHA.items() if v == e.source_sha)])

    def fake_build_many(specs, jobs=None):
        out = []
        for i, spec in enumerate(specs):
            so = tmp_path / f"{i}.so"
            so.write_bytes(spec.source.encode())
            out.append(BuildResult("ok", "k", so, None, ""))
        return out
    monkeypatch.setattr(export_mod, "build_many", fake_build_many)
    monkeypatch.setattr(export_mod, "find_toolchain", lambda: SimpleNamespace(version="12.8.93"))
    assert main(["export", "--db", str(db_path), "--report", "r", "--with-binaries"]) == 0
    out = capsys.readouterr().out
    user = tmp_path / "cache" / "kernels"
    assert f"1 binaries carried under {user / 'bin'}, 0 failed" in out     # one source, two rows
    (rec,) = [json.loads(p.read_text()) for p in (user / "bin" / "sm_90a").glob("*.json")]
    assert rec["nvcc"] == "12.8.93" and rec["cuda"] == "12.8" and rec["source_sha256"] in (
        user / "index.csv").read_text()
    assert not (tmp_path / "shipped").exists()
