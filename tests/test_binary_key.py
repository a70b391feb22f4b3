"""The binary key (cudal2.core.binarykey): what a built kernel is, whatever its text; where it is
kept (build.json, DB rows, binary_keys) and the backfill of rows recorded before keys.
Compile tier: nvcc, cuobjdump and objdump, no GPU."""
import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from cudal2.core.binarykey import binary_key, binary_parts
from cudal2.core.build import BuildSpec, build, build_many, cache_key
from cudal2.core.toolchain import ToolchainError, find_cuobjdump, find_toolchain
from cudal2.harness.db import ResultsDB
from cudal2.harness.types import Evaluation, Shape

DATA = Path(__file__).parent / "data" / "binkey"
KERNELS = ("base", "cosmetic", "internal", "internal_cosmetic", "dead_branch", "dead_mma", "skip_k", "half_launch", "other_meta")


def _toolchain_reason():
    try:
        find_toolchain()
    except ToolchainError as exc:
        return f"no nvcc: {exc}"
    if find_cuobjdump() is None or shutil.which("objdump") is None:
        return "cuobjdump or objdump not found"
    return None


needs_tools = pytest.mark.skipif(_toolchain_reason() is not None, reason=str(_toolchain_reason()))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("binkey_cache")


@pytest.fixture(scope="module")
def built(cache):
    """{name: BuildResult} of every tests/data/binkey kernel, built once for the module."""
    specs = [BuildSpec((DATA / f"{n}.cu").read_text(), name=n) for n in KERNELS]
    results = dict(zip(KERNELS, build_many(specs, jobs=2, cache=cache)))
    assert all(r.ok for r in results.values()), {n: r.log[-500:] for n, r in results.items() if not r.ok}
    return results


# --- the key ----------------------------------------------------------------------------------
@needs_tools
def test_build_records_the_key(built):
    base = built["base"]
    assert base.binary_key and len(base.binary_key) == 64
    assert base.binary_key == binary_key(base.so_path, arch="sm_90a", nvcc=find_toolchain().version)
    assert json.loads((base.so_path.parent / "build.json").read_text())["binary_key"] == base.binary_key
    assert base.summary()["binary_key"] == base.binary_key


@needs_tools
def test_cosmetic_rewrite_keeps_the_key(built):
    # comments, every kernel/function/variable renamed, unused constexpr and static const
    assert built["cosmetic"].key != built["base"].key            # another source...
    assert built["cosmetic"].binary_key == built["base"].binary_key   # ...the same binary
    # an internal-linkage device variable is registered by a name that hashes the whole file
    assert built["internal_cosmetic"].key != built["internal"].key
    assert built["internal_cosmetic"].binary_key == built["internal"].binary_key
    assert built["internal"].binary_key != built["base"].binary_key


@needs_tools
@pytest.mark.parametrize("variant, part", [
    ("dead_branch", "device_functions"),    # a never-taken branch doing real work
    ("dead_mma", "device_functions"),       # an unused tensor-core op kept by asm volatile
    ("skip_k", "device_functions"),         # the K loop's step doubled
    ("half_launch", "host_functions"),      # the host grid halved
    ("other_meta", "rodata"),               # another meta string
])
def test_a_real_change_gets_a_new_key(built, variant, part):
    assert built[variant].binary_key != built["base"].binary_key
    nvcc = find_toolchain().version
    a, b = (binary_parts(built[n].so_path, arch="sm_90a", nvcc=nvcc) for n in ("base", variant))
    assert a[part] != b[part]


@needs_tools
def test_arch_and_nvcc_are_part_of_the_key(built):
    so = built["base"].so_path
    assert len({binary_key(so, arch="sm_90a", nvcc="13.0.88"), binary_key(so, arch="sm_80", nvcc="13.0.88"),
                binary_key(so, arch="sm_90a", nvcc="12.8.0")}) == 3


@needs_tools
def test_the_key_drops_names_and_addresses(built):
    parts = binary_parts(built["base"].so_path, arch="sm_90a", nvcc="x")
    text = json.dumps(parts)
    assert "naive_gemm" not in text and "dot_step" not in text and "/*0000*/" not in text
    assert any('"tile": [16, 16, 1]' in s for s in parts["rodata"])          # the meta stays


@needs_tools
def test_a_family_file_shares_the_instantiations_key(cache):
    """The short file the policy may write (the #define lines + #include of the family header)
    is the binary instantiate() writes out in full."""
    from cudal2.templates import FAMILIES, instantiate
    fam = FAMILIES["mma"]
    cfg = fam.default()
    inst, short = build_many([BuildSpec(instantiate(cfg), name="inst"),
                              BuildSpec(fam.short_source(cfg), name="short")], jobs=2, cache=cache)
    assert inst.ok and short.ok
    assert inst.key != short.key and inst.binary_key == short.binary_key


@needs_tools
def test_an_entry_built_before_keys_or_this_key_version_gets_its_key_on_load(tmp_path):
    spec = BuildSpec((DATA / "base.cu").read_text())
    first = build(spec, cache=tmp_path)
    meta_path = first.so_path.parent / "build.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "binary_key": "stale", "binary_key_version": 0}))
    del meta["binary_key"], meta["binary_key_version"]     # and one from before keys
    assert build(spec, cache=tmp_path).binary_key == first.binary_key
    meta_path.write_text(json.dumps(meta))
    again = build(spec, cache=tmp_path)
    assert again.cached and again.binary_key == first.binary_key
    assert json.loads(meta_path.read_text())["binary_key"] == first.binary_key


@needs_tools
def test_no_key_without_cuobjdump(tmp_path, monkeypatch):
    import cudal2.core.binarykey as BK
    monkeypatch.setattr(BK, "find_cuobjdump", lambda: None)
    r = build(BuildSpec((DATA / "base.cu").read_text()), cache=tmp_path)
    assert r.ok and r.binary_key is None
    assert "binary_key" not in json.loads((r.so_path.parent / "build.json").read_text())


@needs_tools
def test_cli_build_prints_the_key(built, cache, monkeypatch, capsys):
    from cudal2.cli import main
    monkeypatch.setenv("CUDAL2_CACHE", str(cache))
    assert main(["build", "--arch", "sm_90a", str(DATA / "base.cu")]) == 0
    assert f"binary_key={built['base'].binary_key}" in capsys.readouterr().out
    assert main(["build", "--arch", "sm_90a", "--json", str(DATA / "cosmetic.cu")]) == 0
    assert json.loads(capsys.readouterr().out)["binary_key"] == built["base"].binary_key


# --- the DB -------------------------------------------------------------------------------------
def _ev(sha="a" * 64, nvcc="13.0.88", key=None, build_key="k"):
    return Evaluation(status="not_measured", source_sha=sha, shape=Shape(64, 64, 64), arch="sm_90a",
                      env={"nvcc": nvcc}, build={"status": "ok", "key": build_key}, binary_key=key)


def test_rows_carry_the_key_from_the_column_else_binary_keys(tmp_path):
    with ResultsDB(tmp_path / "r.db") as db:
        assert db.schema_version == 4
        db.add(_ev(key="f" * 64), source="x")
        db.add(_ev(), source="x")                          # recorded before keys
        db.add(_ev(nvcc="12.8.0"), source="x")             # another toolchain
        assert [e.binary_key for e in db.rows()] == ["f" * 64, None, None]
        assert db.add_binary_key("a" * 64, "sm_90a", "13.0.88", "e" * 64, "test")
        assert not db.add_binary_key("a" * 64, "sm_90a", "13.0.88", "d" * 64, "test")   # first stands
        assert [e.binary_key for e in db.rows()] == ["f" * 64, "e" * 64, None]
        assert [e.binary_key for e in db.rows(source_sha="a" * 64, arch="sm_90a")][1] == "e" * 64
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db._conn.execute("UPDATE evaluations SET binary_key = 'x'")


def test_a_schema_2_db_migrates_and_reads_without_keys(tmp_path):
    import cudal2.harness.db as D
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied TEXT NOT NULL)")
    for v, script in enumerate(D.MIGRATIONS[:2]):
        for stmt in D._statements(script):
            con.execute(stmt)
        con.execute("INSERT INTO schema_version VALUES (?, 'then')", (v + 1,))
    con.commit()
    con.close()
    with ResultsDB(path, readonly=True) as db:             # as committed: read as it is
        assert db.rows() == [] and db.binary_keys() == {}
    with ResultsDB(path) as db:
        assert db.schema_version == 4
        db.add(_ev(), source="x")
        assert db.rows()[0].binary_key is None


def test_a_key_of_another_version_reads_as_none_and_the_backfill_replaces_it(tmp_path, monkeypatch):
    """A key normalised by another KEY_VERSION names no binary today: rows read without it (so a
    reward table never matches it) until today's key is recorded over it."""
    import cudal2.harness.db as D
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev(key="f" * 64), source="x")            # recorded with the row
        db.add(_ev(sha="b" * 64), source="y")            # recorded before keys
        assert db.add_binary_key("b" * 64, "sm_90a", "13.0.88", "e" * 64, "test")
        monkeypatch.setattr(D, "KEY_VERSION", D.KEY_VERSION + 1)
        assert [e.binary_key for e in db.rows()] == [None, None] and db.binary_keys() == {}
        assert db.add_binary_key("b" * 64, "sm_90a", "13.0.88", "d" * 64, "today")      # replaces
        assert not db.add_binary_key("b" * 64, "sm_90a", "13.0.88", "c" * 64, "today")  # first stands
        assert [e.binary_key for e in db.rows()] == [None, "d" * 64]
        assert db.binary_keys() == {("b" * 64, "sm_90a", "13.0.88"): "d" * 64}


def test_a_schema_3_db_read_as_committed_has_only_version_1_keys(tmp_path):
    import cudal2.harness.db as D
    path = tmp_path / "v3.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied TEXT NOT NULL)")
    for v, script in enumerate(D.MIGRATIONS[:3]):
        for stmt in D._statements(script):
            con.execute(stmt)
        con.execute("INSERT INTO schema_version VALUES (?, 'then')", (v + 1,))
    con.execute("INSERT INTO binary_keys VALUES (?, 'sm_90a', '13.0.88', ?, 'then', 'then')", ("b" * 64, "e" * 64))
    con.commit()
    con.close()
    with ResultsDB(path, readonly=True) as db:
        assert db.binary_keys() == ({("b" * 64, "sm_90a", "13.0.88"): "e" * 64} if D.KEY_VERSION == 1 else {})


# --- the backfill ---------------------------------------------------------------------------------
@needs_tools
def test_backfill_keys_only_what_today_rebuilds(tmp_path, built, cache, monkeypatch):
    from cudal2.core.identity import source_sha
    from cudal2.runs.backfill import backfill
    monkeypatch.setenv("CUDAL2_CACHE", str(cache))
    nvcc = find_toolchain().version
    base, meta = (DATA / "base.cu").read_text(), (DATA / "other_meta.cu").read_text()
    family = '#define BM 64\n#include "mma_hgemm.cuh"\n'
    path = tmp_path / "results.db"
    with ResultsDB(path) as db:
        for src, nv, bkey in ((base, nvcc, "stale"), (base, nvcc, "stale"),   # self-contained
                              (meta, "12.8.0", "x"),                        # another nvcc
                              (family, nvcc, "stale")):                     # headers since changed
            db.add(_ev(sha=source_sha(src), nvcc=nv, build_key=bkey), source=src)
    plain = tmp_path / "plain.db"
    shutil.copy(path, plain)
    zipped = tmp_path / "results.db.gz"
    with ResultsDB(path) as db:
        db.backup_to(tmp_path / "flat.db")
    zipped.write_bytes(gzip.compress((tmp_path / "flat.db").read_bytes()))
    report = backfill([plain, zipped], jobs=2, log=lambda *a: None)
    for p in (plain, zipped):
        r = report[str(p)]
        assert (r["rows"], r["rows_keyed"], r["sources_keyed"], r["added"]) == (4, 2, 1, 1)
        assert r["skipped"] == {f"nvcc 12.8.0 is not today's {nvcc}": 1,
                                "template headers changed since": 1}
        with ResultsDB(p) as db:
            keys = [e.binary_key for e in db.rows()]
        assert keys == [built["base"].binary_key] * 2 + [None, None]
    before = zipped.read_bytes()
    again = backfill([zipped], jobs=2, log=lambda *a: None)[str(zipped)]
    assert again["added"] == 0 and again["skipped"]["keyed already"] == 1
    assert zipped.read_bytes() == before                      # nothing new: the file is left as it is


@needs_tools
def test_backfill_takes_a_recorded_build_key_for_a_family_file(tmp_path, cache, monkeypatch):
    from cudal2.core.identity import source_sha
    from cudal2.runs.backfill import backfill
    monkeypatch.setenv("CUDAL2_CACHE", str(cache))
    from cudal2.templates import FAMILIES
    fam = FAMILIES["mma"]
    src = fam.short_source(fam.default())
    nvcc = find_toolchain().version
    with ResultsDB(tmp_path / "r.db") as db:
        db.add(_ev(sha=source_sha(src), nvcc=nvcc,
                   build_key=cache_key(BuildSpec(src), nvcc)), source=src)
    r = backfill([tmp_path / "r.db"], jobs=2, log=lambda *a: None)[str(tmp_path / "r.db")]
    assert r["rows_keyed"] == 1 and r["skipped"] == {}


@needs_tools
def test_a_call_never_waits_for_a_key(tmp_path, monkeypatch):
    """An entry keyed under another KEY_VERSION loads for dispatch (lookup, the loader's build)
    without running cuobjdump and without its stale key; the harness's build keys it."""
    import cudal2.core.build as B
    spec = BuildSpec((DATA / "base.cu").read_text())
    first = build(spec, cache=tmp_path)
    meta_path = first.so_path.parent / "build.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "binary_key": "stale", "binary_key_version": 0}))

    keyed = []      # recorded, not raised, and any signature: _key_of swallows any error a key raises
    monkeypatch.setattr(B, "binary_key", lambda *a, **k: keyed.append(a))
    loads = [B.lookup(spec, cache=tmp_path), build(spec, cache=tmp_path, key_on_load=False)]
    assert keyed == [], "a dispatch load ran the binary key (cuobjdump)"
    assert [r.binary_key for r in loads] == [None, None]
    assert json.loads(meta_path.read_text())["binary_key"] == "stale"      # left for the harness
    monkeypatch.undo()
    assert build(spec, cache=tmp_path).binary_key == first.binary_key
