"""generated_kernels/ store: index.csv reading, validation errors that name file and line,
add/write (atomic, identical sources once), the shipped seeds."""
import csv
import io

import pytest

from cudal2.core import store as KI
from cudal2.templates.seeds import SEEDS, write_seeds
from cudal2.core.identity import content_sha as sha256_text
from cudal2.core.vocab import AUDIT_VERSION
from cudal2.core.store import COLUMNS, IndexRow, KernelIndex, KernelIndexError

TUNED = dict(tuned=True, mode="offline", report="reports/h100/x",
             speedups={"torch": 1.3, "cublaslt_autotuned": 1.05})


def test_missing_store_is_empty(tmp_path):
    idx = KernelIndex.load(tmp_path / "nope")
    assert len(idx) == 0 and idx.rows == [] and idx.tuned_rows() == []


def test_add_write_load_roundtrip(tmp_path):
    idx = KernelIndex(tmp_path)
    r1 = idx.add("// k1\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=128, K=256,
                 family="mma", **TUNED)
    idx.add("// k2\n", arch="sm_80", acc="f16", layout="RC", M=64, N=64, K=64, family="ptx")
    assert r1.file == "sm_90a/f32_RR/64_128_256.cu"
    path = idx.write()
    assert path == tmp_path / "index.csv"
    header = path.read_text().splitlines()[0]
    assert header == ",".join(COLUMNS)
    back = KernelIndex.load(tmp_path)
    assert back.rows == idx.rows
    got = back.get("sm_90a", "f32", "RR", 64, 128, 256)
    assert got.tuned and got.speedups == {"torch": 1.3, "cublaslt_autotuned": 1.05}
    assert got.speedup_cublas_nn is None
    assert back.source(got) == "// k1\n"
    assert [r.key for r in back.tuned_rows()] == [got.key]
    assert (tmp_path / got.file).read_text() == "// k1\n"


def test_identical_sources_are_stored_once(tmp_path):
    idx = KernelIndex(tmp_path)
    a = idx.add("// same\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    b = idx.add("// same\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=128, K=128)
    c = idx.add("// same\n", arch="sm_80", acc="f32", layout="RR", M=128, N=128, K=128)
    assert a.file == b.file == "sm_90a/f32_RR/64_64_64.cu"
    assert c.file == "sm_80/f32_RR/128_128_128.cu"  # another arch dir keeps its own copy
    idx.write()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.cu")) == [
        "sm_80/f32_RR/128_128_128.cu", "sm_90a/f32_RR/64_64_64.cu"]


def test_replacing_a_shared_file_never_breaks_the_other_row(tmp_path):
    idx = KernelIndex(tmp_path)
    idx.add("// v1\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.add("// v1\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64)
    new = idx.add("// v2\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64, **TUNED)
    assert new.file != "sm_90a/f32_RR/64_64_64.cu"
    idx.write(prune=True)
    back = KernelIndex.load(tmp_path)  # verify=True: every sha matches
    assert back.source(back.get("sm_90a", "f32", "RR", 128, 64, 64)) == "// v1\n"
    assert back.source(back.get("sm_90a", "f32", "RR", 64, 64, 64)) == "// v2\n"


def test_prune_removes_unreferenced_files_only(tmp_path):
    idx = KernelIndex(tmp_path)
    idx.add("// a\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.add("// b\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=128, K=128)
    idx.write()
    idx.remove("sm_90a", "f32", "RR", 128, 128, 128)
    idx.write(prune=True)
    assert [p.name for p in tmp_path.rglob("*.cu")] == ["64_64_64.cu"]


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    idx = KernelIndex(tmp_path)
    idx.add("// a\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.write()
    before = (tmp_path / "index.csv").read_text()
    idx.add("// b\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    idx.write()
    assert (tmp_path / "index.csv").read_text() != before
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def _write_index(root, rows):
    root.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    (root / "index.csv").write_text(buf.getvalue())


def _good_row(root, **over):
    src = "// k\n"
    (root / "sm_90a" / "f32_RR").mkdir(parents=True, exist_ok=True)
    (root / "sm_90a" / "f32_RR" / "64_64_64.cu").write_text(src)
    row = IndexRow("sm_90a", "f32", "RR", 64, 64, 64, "sm_90a/f32_RR/64_64_64.cu",
                   sha256_text(src)).to_csv()
    row.update(over)
    return row


@pytest.mark.parametrize("over,message", [
    ({"arch": "sm_70"}, "arch 'sm_70'"),
    ({"acc": "f64"}, "acc 'f64'"),
    ({"layout": "CC"}, "layout 'CC'"),
    ({"M": "0"}, "M must be a positive integer"),
    ({"N": "abc"}, "N must be an integer"),
    ({"tuned": "yes"}, "tuned must be 0 or 1"),
    ({"tuned": "1"}, "tuned=1 but no speedup"),
    ({"tuned": "1", "speedup_torch": "0.9", "mode": "offline", "report": "r"}, "not faster"),
    ({"tuned": "1", "speedup_torch": "1.2", "report": "r"}, "mode is empty"),
    ({"tuned": "1", "speedup_torch": "1.2", "mode": "offline"}, "report is empty"),
    ({"speedup_cublas_nn": "fast"}, "speedup_cublas_nn must be empty or a number"),
    ({"speedup_cublas_nn": "-1"}, "positive finite"),
    ({"mode": "turbo"}, "mode 'turbo'"),
    ({"file": "../evil.cu"}, "must be 'sm_90a/f32_RR/<name>.cu'"),
    ({"file": "sm_80/f32_RR/64_64_64.cu"}, "matching the row's arch"),
    ({"sha256": "xyz"}, "64 lowercase hex"),
    ({"sha256": "0" * 64}, "hashes to"),
    ({"file": "sm_90a/f32_RR/missing.cu"}, "does not exist"),
    ({"gpu": "NVIDIA  H100"}, "gpu 'NVIDIA  H100' must be a GPU name with single spaces"),
    ({"config": "mma:BM=128"}, "config 'mma:BM=128' must be empty or a config name"),
    ({"verified": "tile;size"}, "verified 'tile;size' must be empty or 'field;...' sorted"),
    ({"verified": "tile;threads"}, "verified 'tile;threads' must be empty or 'field;...' sorted"),
    ({"audit": "v2"}, "audit must be an integer, got 'v2'"),
    ({"audit": "-1"}, "audit must be empty or a non-negative integer"),
])
def test_validation_names_file_line_and_problem(tmp_path, over, message):
    _write_index(tmp_path, [_good_row(tmp_path), _good_row(tmp_path, **{"M": "128", **over})])
    with pytest.raises(KernelIndexError) as exc:
        KernelIndex.load(tmp_path)
    text = str(exc.value)
    assert str(tmp_path / "index.csv") in text and "line 3" in text
    assert message in text


def test_options_column_roundtrips_and_old_indexes_read(tmp_path):
    """A row's runtime options survive write/load in one canonical spelling; an index written
    before the options column reads as rows without options."""
    idx = KernelIndex(tmp_path)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64,
            options={"swizzle": 8, "raster": 1}, **TUNED)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64, **TUNED)
    idx.write()
    back = KernelIndex.load(tmp_path)
    r = back.get("sm_90a", "f32", "RR", 64, 64, 64)
    assert r.options == "raster=1;swizzle=8" and r.options_dict == {"raster": 1, "swizzle": 8}
    assert back.get("sm_90a", "f32", "RR", 128, 64, 64).options_dict == {}
    assert "raster=1;swizzle=8" in (tmp_path / "index.csv").read_text()
    old = [",".join(c for c in COLUMNS if c not in KI.OPTIONAL_COLUMNS)] + [
        ",".join(v for c, v in row.to_csv().items() if c not in KI.OPTIONAL_COLUMNS)
        for row in back.rows]
    (tmp_path / "index.csv").write_text("\n".join(old) + "\n")
    assert [x.options for x in KernelIndex.load(tmp_path).rows] == ["", ""]
    assert [(x.m_bucket, x.bucket) for x in KernelIndex.load(tmp_path).rows] == [("", None)] * 2
    assert [x.gpu for x in KernelIndex.load(tmp_path).rows] == ["", ""]     # any GPU of the arch
    # no config, nothing verified: dispatch trusts none of these kernels' metas
    assert [(x.config, x.verified, x.trusted_meta) for x in KernelIndex.load(tmp_path).rows] == [
        ("", "", frozenset())] * 2
    # audited before audit versions: the first rules
    assert [(x.audit, x.audit_version) for x in KernelIndex.load(tmp_path).rows] == [(None, 1)] * 2


def test_audit_column_roundtrips(tmp_path):
    """The audit version a row's kernel passed survives write/load; empty stays empty (v1)."""
    idx = KernelIndex(tmp_path)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64, audit=2, **TUNED)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64, audit=0, **TUNED)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=256, N=64, K=64, **TUNED)
    idx.write()
    back = {r.M: (r.audit, r.audit_version) for r in KernelIndex.load(tmp_path).rows}
    assert back == {64: (2, 2), 128: (0, 0), 256: (None, 1)}
    assert (tmp_path / "index.csv").read_text().splitlines()[0].endswith(",verified,audit")


def test_config_and_verified_columns_roundtrip(tmp_path):
    """What dispatch may trust of a kernel's meta: every field for a family instantiation
    (config), the audit's confirmed fields otherwise (verified, one canonical spelling)."""
    idx = KernelIndex(tmp_path)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64,
            verified=["tile", "threads"], **TUNED)
    idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64,
            config="mma_sm80_f32_rr_128x128x32_w64x64_s3_g8_k1", **TUNED)
    idx.write()
    back = {r.M: r for r in KernelIndex.load(tmp_path).rows}
    assert (back[64].verified, back[64].config) == ("threads;tile", "")
    assert back[64].trusted_meta == {"threads", "tile"}
    assert back[128].trusted_meta == set(KI.META_FIELDS) and back[128].verified == ""


@pytest.mark.parametrize("options,message", [
    ("swizzle", "option 'swizzle' is not name=integer"),
    ("swizzle=eight", "option 'swizzle=eight' is not name=integer"),
    ("Swizzle=8", "option 'Swizzle=8' is not name=integer"),
    ("swizzle=8;raster=1", "must be 'name=value;...' sorted by name"),
])
def test_malformed_options_name_the_entry_file_and_line(tmp_path, options, message):
    """dispatch passes these to the kernel: a malformed entry stops the load, named."""
    _write_index(tmp_path, [_good_row(tmp_path, options=options)])
    with pytest.raises(KernelIndexError) as exc:
        KernelIndex.load(tmp_path)
    assert f"{tmp_path / 'index.csv'} line 2" in str(exc.value) and message in str(exc.value)


def test_bad_header_and_duplicates(tmp_path):
    (tmp_path / "index.csv").write_text("arch,acc,layout,bogus\n")
    with pytest.raises(KernelIndexError, match=r"missing \[.*'M'.*unknown \['bogus'\]"):
        KernelIndex.load(tmp_path)
    row = _good_row(tmp_path)
    _write_index(tmp_path, [row, row])
    with pytest.raises(KernelIndexError, match="line 3: duplicate row for sm_90a f32 RR 64x64x64"):
        KernelIndex.load(tmp_path)


def test_verify_false_skips_file_checks(tmp_path):
    _write_index(tmp_path, [_good_row(tmp_path, sha256="0" * 64)])
    assert len(KernelIndex.load(tmp_path, verify=False)) == 1
    idx = KernelIndex.load(tmp_path, verify=False)
    with pytest.raises(KernelIndexError, match="does not match its sha256"):
        idx.source(idx.rows[0])


def test_add_rejects_bad_input_with_clear_errors(tmp_path):
    idx = KernelIndex(tmp_path)
    with pytest.raises(KernelIndexError, match="source is empty"):
        idx.add("  \n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    with pytest.raises(KernelIndexError, match="unknown baseline"):
        idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64,
                speedups={"magma": 2.0})
    with pytest.raises(KernelIndexError, match="arch"):
        idx.add("// k\n", arch="sm_75", acc="f32", layout="RR", M=64, N=64, K=64)
    with pytest.raises(KernelIndexError, match="not faster"):
        idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64,
                tuned=True, mode="offline", report="r", speedups={"torch": 1.0})
    assert len(idx) == 0


def test_replace_row_and_with_fields(tmp_path):
    idx = KernelIndex(tmp_path)
    r = idx.add("// k\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64)
    tuned = KI.with_fields(r, tuned=True, mode="server", report="r", speedup_torch=1.4)
    idx.replace_row(tuned)
    assert idx.get(*r.key).tuned
    with pytest.raises(KernelIndexError, match="cannot change the source"):
        idx.replace_row(KI.with_fields(r, sha256="a" * 64))


# -- the shipped store ---------------------------------------------------------------------------
def test_shipped_store_is_valid_and_seeds_never_serve():
    from cudal2.runtime import plan as planmod
    from cudal2.core import knobs
    idx = KernelIndex.load(knobs.repo_root() / "generated_kernels")  # verify=True
    seeds = {(a, fam, tuple(sorted(ch.items())), s) for a, fam, ch, shapes in SEEDS for s in shapes}
    assert len(idx) >= len(seeds)
    for arch, family, changes, shape in seeds:
        from cudal2.templates import FAMILIES
        cfg = FAMILIES[family].default().with_(**dict(changes))
        row = idx.get(arch, cfg.get("ACC"), cfg.get("LAYOUT"), *shape)
        assert row is not None and row.family == family, (arch, family, shape)
    untuned = [r for r in idx.rows if not r.tuned]
    table = planmod.table_from_index(idx)
    assert all(r.key not in table for r in untuned)


def test_shipped_rows_name_their_config_exactly_when_their_source_is_an_instantiation():
    """The shipped table's trust: a row's config is the family config its source instantiates
    byte for byte (those kernels' metas are ours), empty for a source that is not one (it
    serves its measured shape only)."""
    from cudal2.core import knobs
    from cudal2.runs.export import config_name
    idx = KernelIndex.load(knobs.repo_root() / "generated_kernels")
    assert [(r.file, r.config) for r in idx.rows] == [(r.file, config_name(idx.source(r)))
                                                      for r in idx.rows]


def test_write_seeds_into_a_fresh_store_keeps_tuned_rows(tmp_path):
    idx = KernelIndex(tmp_path)
    idx.add("// measured\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=128, K=128, **TUNED)
    idx.write()
    write_seeds(tmp_path)
    back = KernelIndex.load(tmp_path)
    assert back.source(back.get("sm_90a", "f32", "RR", 128, 128, 128)) == "// measured\n"
    assert back.get("sm_90a", "f32", "RR", 1024, 1024, 1024).family == "mma"
    assert back.get("sm_90a", "f32", "RR", 1024, 1024, 1024).config.startswith("mma_")
    assert KI.main([str(tmp_path)]) == 0


@pytest.mark.compile
def test_seed_builds_loads_and_its_meta_matches_its_row(tmp_path, monkeypatch):
    """The real loader (nvcc build + ctypes load, no GPU): a seed marked tuned in a temp store is
    served for its exact shape; its meta agrees with the index row."""
    from cudal2.core.abi import meta_accepts
    from cudal2.runtime import resolve
    from cudal2.core import knobs
    shipped = KernelIndex.load(knobs.repo_root() / "generated_kernels")
    seed = shipped.get("sm_90a", "f32", "RR", 128, 128, 128)
    store = KernelIndex(tmp_path / "k")
    store.add(shipped.source(seed), arch="sm_90a", acc="f32", layout="RR", M=128, N=128, K=128,
              family=seed.family, audit=AUDIT_VERSION, **TUNED)
    store.write()
    monkeypatch.setenv("CUDAL2_KERNELS", str(tmp_path / "k"))
    resolve.reset()
    try:
        resolve.state.arch[0] = "sm_90a"
        served = resolve.decide(0, 128, 128, 128, "RR", None, None)
        assert served is not resolve.TORCH
        meta = resolve.state.metas[seed.sha256]
        assert (meta["arch"], meta["acc"], meta["layout"]) == ("sm_90a", "f32", "RR")
        assert meta_accepts(meta, 128, 128, 128)
    finally:
        resolve.reset()
