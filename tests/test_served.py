"""What is served, visibly, and no surprise costs (issue 34, point 2), on CPU with fake loaders
and a stand-in for build_many: a build inside a call is announced at WARNING with its cause,
CUDAL2_BUILD_IN_CALL=0 serves torch until warmup (never marking the kernel broken), `cudal2
warmup` / cudal2.warmup() builds every served kernel and reports each, `cudal2 served` lists the
layered table for an arch and GPU model."""
import logging

import pytest
import torch

import cudal2
from cudal2.core import binaries
from cudal2.core.build import BuildResult
from cudal2.core.store import KernelIndex
from cudal2.core.tables import load_tables
from cudal2.runtime import loader, resolve
from cudal2.runtime import warmup as W
from cudal2.runtime.loader import KernelLoader
from cudal2.runs import served as S
from cudal2.core.vocab import AUDIT_VERSION
from tests.test_dispatch import ANY, FakeLib, store  # noqa: F401 - `store` is a fixture

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
WARNING = ("cudal2: building sm_90a/f32_RR/128_128_128.cu for 128x128x128 RR inside this call "
           "(not built yet: run `cudal2 warmup`; CUDAL2_BUILD_IN_CALL=0 serves torch instead)")


class Builds:
    """A build cache stand-in: is_built for the loader, build_many for warmup."""

    def __init__(self):
        self.built: set[str] = set()
        self.specs: list = []

    def is_built(self, source, arch):
        return source in self.built

    def build_and_load(self, source, arch, name):
        self.built.add(source)
        return FakeLib(dict(ANY, arch=arch, acc="f32", layout="RR"))

    def build_many(self, specs, jobs=None, progress=None):
        self.specs.append((specs, jobs))
        out = []
        for spec in specs:
            ok = "broken" not in spec.source
            if ok:
                self.built.add(spec.source)
            res = BuildResult("ok" if ok else "compile_error", "key", None, None,
                              "" if ok else "kernel.cu(3): error: broken", seconds=1.5,
                              cached=False, name=spec.name)
            out.append(res)
            if progress:
                progress(res)
        return out


@pytest.fixture
def builds(store, monkeypatch):
    idx, add, _ = store
    b = Builds()
    resolve.reset(KernelLoader(b.build_and_load, is_built=b.is_built))
    resolve.state.arch[0] = "sm_90a"
    resolve.state.env[0] = {"gpu": "FakeGPU", "torch": "t", "cuda": "c", "cublas": "b"}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("CUDAL2_BUILD_IN_CALL", raising=False)
    return idx, add, b


def test_a_build_inside_a_call_is_announced_with_its_cause(builds, caplog):
    idx, add, b = builds
    add(128, 128, 128, ANY)
    ready = add(256, 256, 256, ANY)
    idx.write()
    b.built.add(idx.source(ready))                       # in the build cache already: silent
    with caplog.at_level(logging.WARNING, logger="cudal2.runtime"):
        assert resolve.resolve(0, 256, 256, 256, "RR", None, None) is not resolve.TORCH
        assert caplog.records == []
        assert resolve.resolve(0, 128, 128, 128, "RR", None, None) is not resolve.TORCH
    assert [r.getMessage() for r in caplog.records] == [WARNING]
    assert caplog.records[0].levelno == logging.WARNING


def test_build_in_call_0_serves_torch_until_warmup(builds, monkeypatch, caplog):
    """The knob forbids the build: torch serves the shape, the kernel is not marked broken, the
    WARNING says so once; cudal2.warmup() builds it and the shape serves the kernel on its next
    call, with no build inside it."""
    idx, add, b = builds
    row = add(128, 128, 128, ANY)
    idx.write()
    monkeypatch.setenv("CUDAL2_BUILD_IN_CALL", "0")
    with caplog.at_level(logging.WARNING, logger="cudal2.runtime"):
        assert resolve.resolve(0, 128, 128, 128, "RR", None, None) is resolve.TORCH
        assert resolve.resolve(0, 128, 128, 128, "RR", None, None) is resolve.TORCH   # cached
    (said,) = [r.getMessage() for r in caplog.records]
    assert "not built yet and CUDAL2_BUILD_IN_CALL=0" in said and "cudal2 warmup" in said
    assert "128x128x128 RR" in said and row.file in said
    assert row.sha256 not in resolve.state.broken and b.built == set()
    caplog.clear()
    done = cudal2.warmup(arch="sm_90a", gpu="FakeGPU", build=b.build_many)
    assert [(w.row.file, w.status) for w in done] == [(row.file, W.BUILT)]
    with caplog.at_level(logging.WARNING, logger="cudal2.runtime"):
        assert resolve.resolve(0, 128, 128, 128, "RR", None, None) is not resolve.TORCH
    assert caplog.records == []                          # built by warmup: no build in the call


def test_build_in_call_0_keeps_a_nearest_candidate_out_of_that_decision_only(builds, monkeypatch):
    idx, add, b = builds
    add(128, 128, 128, ANY)
    idx.write()
    monkeypatch.setenv("CUDAL2_BUILD_IN_CALL", "0")
    assert resolve.decide(0, 192, 192, 192, "RR", None, None) is resolve.TORCH
    assert (0, 192, 192, 192, "RR") in resolve.state.unbuilt and not resolve.state.broken
    assert resolve.redecide_unbuilt() == 1 and resolve.state.unbuilt == set()


def test_a_bad_knob_value_serves_torch_and_says_so(builds, monkeypatch):
    idx, add, _ = builds
    add(128, 128, 128, ANY)
    idx.write()
    monkeypatch.setenv("CUDAL2_BUILD_IN_CALL", "maybe")
    with pytest.warns(RuntimeWarning, match="CUDAL2_BUILD_IN_CALL must be 0 or 1, got 'maybe'"):
        assert resolve.resolve(0, 128, 128, 128, "RR", None, None) is resolve.TORCH


# -- warmup --------------------------------------------------------------------------------------
@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A shipped and a user table for sm_90a: kernels for H100, H200 and any GPU, one shared by
    two rows, one that does not compile, one the user table carries, and rows that never serve
    on sm_90a (sm_80, f16 accumulate, an untuned seed)."""
    monkeypatch.setenv("CUDAL2_KERNELS", str(tmp_path / "shipped"))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDAL2_USER_KERNELS", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    shipped, user = KernelIndex(tmp_path / "shipped"), KernelIndex(tmp_path / "cache" / "kernels")

    def add(idx, M, src, *, lo=1.1, gpu="", arch="sm_90a", acc="f32", tuned=True, m_bucket=""):
        kw = dict(tuned=True, mode="offline", report="run", speedup_lo=lo, audit=AUDIT_VERSION,
                  speedups={"torch": 1.4, "cublaslt_autotuned": lo + 0.02}) if tuned else {}
        return idx.add(src, arch=arch, acc=acc, layout="RR", M=M, N=4096, K=4096,
                       family="cutlass_sm90", gpu=gpu, config="cutlass_sm90_x", m_bucket=m_bucket, **kw)
    add(shipped, 64, "// shared\n", m_bucket="33-64")
    add(shipped, 128, "// shared\n")
    add(shipped, 256, "// h100\n", gpu=H100, lo=1.3)
    add(shipped, 512, "// h200\n", gpu=H200)
    add(shipped, 1024, "// broken\n")
    add(shipped, 2048, "// shipped 2048\n", lo=1.05)
    add(shipped, 64, "// sm80\n", arch="sm_80")
    add(shipped, 4096, "// seed\n", tuned=False)
    add(user, 2048, "// mine\n", lo=1.25)                # faster: shadows the shipped 2048 row
    carried = add(user, 8, "// carried\n")
    shipped.write()
    user.write()
    so = tmp_path / "built.so"
    so.write_bytes(b"a library")
    binaries.carry(user.root, "sm_90a", carried.sha256, so, nvcc="12.6.20")
    return shipped, user


def test_warmup_builds_every_served_kernel_and_reports_each(tables, monkeypatch):
    monkeypatch.setenv("CUDAL2_BUILD_JOBS", "3")
    b = Builds()
    done = W.warmup(arch="sm_90a", gpu=H100, build=b.build_many)
    got = {w.row.file.split("/")[-1]: (w.status, w.table, w.rows) for w in done}
    assert got == {"8_4096_4096.cu": (W.CARRIED, "user", 1),
                   "64_4096_4096.cu": (W.BUILT, "shipped", 2),     # one build, two rows
                   "256_4096_4096.cu": (W.BUILT, "shipped", 1),    # H100's own
                   "512_4096_4096.cu": (W.BUILT, "shipped", 1),    # H200's: it races here first
                   "1024_4096_4096.cu": (W.FAILED, "shipped", 1),
                   "2048_4096_4096.cu": (W.BUILT, "user", 1)}      # the faster row only
    ((specs, jobs),) = b.specs
    assert jobs == 3 and sorted(s.source for s in specs) == [
        "// broken\n", "// h100\n", "// h200\n", "// mine\n", "// shared\n"]
    assert all(s.arch == "sm_90a" for s in specs)
    failed = next(w for w in done if w.status == W.FAILED)
    assert "compile_error" in failed.detail and "error: broken" in failed.detail
    # without a GPU model every GPU's rows of the arch are built
    assert len(W.warmup(arch="sm_90a", gpu=None, build=Builds().build_many)) == 6
    # a GPU's own row shadows the others' at its shape: the H200's row of 512 is the H200's only
    shipped, _ = tables
    shipped.add("// h100 512\n", arch="sm_90a", acc="f32", layout="RR", M=512, N=4096, K=4096,
                gpu=H100, tuned=True, mode="offline", report="run", speedup_lo=1.2, speedups={"torch": 1.3},
                audit=AUDIT_VERSION)
    shipped.write()
    sources = lambda b: sorted(s.source for specs, _ in b.specs for s in specs)
    W.warmup(arch="sm_90a", gpu=H100, build=(b := Builds()).build_many)
    assert "// h100 512\n" in sources(b) and "// h200\n" not in sources(b)


def test_warmup_cli_reports_and_fails_when_a_build_fails(tables, monkeypatch, capsys):
    from cudal2.cli import main
    b = Builds()
    monkeypatch.setattr(W, "build_many", b.build_many)
    monkeypatch.setattr(W, "visible_gpu", lambda: None)
    assert main(["warmup", "--arch", "sm_90a", "--gpu", H200]) == 1
    out = capsys.readouterr().out
    assert "carried  sm_90a/f32_RR/8_4096_4096.cu [user]" in out
    assert "built    sm_90a/f32_RR/64_4096_4096.cu [shipped] (+1 rows)" in out
    assert "failed   sm_90a/f32_RR/1024_4096_4096.cu [shipped]: build compile_error" in out
    assert "6 kernels: 4 built, 0 cached, 1 carried, 1 failed" in out


# -- rows audited under older rules ------------------------------------------------------------
def test_rows_audited_under_older_rules_serve_nothing_until_reaudited(tables, monkeypatch, capsys):
    """A tuned row whose kernel passed an older audit (before stream discipline; or whose calls
    the call guard never watched: 0) does not serve, whatever its speed: the other table's row of
    its key serves instead (or torch); `cudal2 served` lists it with the command that audits it
    again, and warmup refuses it without building."""
    from cudal2.cli import main
    shipped, user = tables
    kw = dict(arch="sm_90a", acc="f32", layout="RR", N=4096, K=4096, family="cutlass_sm90",
              tuned=True, mode="offline", report="run", speedups={"torch": 2.0}, speedup_lo=1.9)
    user.add("// faster, old rules\n", M=128, audit=1, **kw)   # shadows nothing: shipped serves
    shipped.add("// never watched\n", M=8192, audit=0, **kw)
    shipped.add("// before versions\n", M=16384, **kw)          # no audit column value: v1
    user.write()
    shipped.write()
    t = load_tables()
    assert {(r.M, t.table_of(r)) for r in t.rows.values() if r.M in (128, 8192, 16384)} == {
        (128, "shipped")}
    resolve.reset()             # dispatch says once why those shapes go to torch
    with pytest.warns(RuntimeWarning, match=r"3 tuned row\(s\) not served: .*`cudal2 reaudit"):
        resolve.table()
    resolve.reset()
    assert sorted((u.row.M, u.table, u.row.audit_version) for u in t.unaudited) == [
        (128, "user", 1), (8192, "shipped", 0), (16384, "shipped", 1)]
    text = "\n".join(S.report(t, "sm_90a", H100, lambda row: "not built"))
    assert "not served (3: not audited under this cudal2's rules):" in text
    assert "sm_90a/f32_RR/128_4096_4096.cu [user]: audited under rules v1, this cudal2" in text
    assert f"needs v{AUDIT_VERSION} (launches on the caller's stream only): not served until " \
           f"`cudal2 reaudit --table {user.root}`" in text
    assert "its calls were never watched by the call guard" in text
    b = Builds()
    done = W.warmup(arch="sm_90a", gpu=H100, build=b.build_many)
    refused = {w.row.M: w for w in done if w.status == W.REFUSED}
    assert sorted(refused) == [128, 8192, 16384] and "cudal2 reaudit" in refused[128].detail
    assert not {"// faster, old rules\n", "// never watched\n", "// before versions\n"} & {
        spec.source for specs, _ in b.specs for spec in specs}
    monkeypatch.setattr(W, "build_many", Builds().build_many)
    monkeypatch.setattr(W, "visible_gpu", lambda: None)
    main(["warmup", "--arch", "sm_90a", "--gpu", H100])
    out = capsys.readouterr().out
    assert "refused  sm_90a/f32_RR/8192_4096_4096.cu [shipped]: its calls were never watched" in out
    assert out.rstrip().endswith("1 failed, 3 refused"), out


# -- served --------------------------------------------------------------------------------------
def test_served_lists_the_layered_table_for_an_arch_and_gpu(tables):
    t = load_tables()
    lines = S.report(t, "sm_90a", H100, lambda row: "not built")
    text = "\n".join(lines)
    assert lines[0].startswith("sm_90a, GPU NVIDIA H100 80GB HBM3: 7 rows served (tables: shipped ")
    header = lines[1].split()
    assert header[:4] == ["table", "layout", "shape", "serves"]
    rows = {l.split()[2]: l.split() for l in lines[2:9]}
    assert rows["64x4096x4096"][:8] == ["shipped", "RR", "64x4096x4096", "33-64", "cutlass_sm90",
                                        "cutlass_sm90_x", "1.100", "cublaslt_autotuned"]
    # the H100's own row serves outright; the H200's and the unnamed rows race torch first
    assert " ".join(rows["64x4096x4096"][8:]) == "not recorded, races torch first not built"
    assert rows["256x4096x4096"][6:] == ["1.300", "cublaslt_autotuned", "NVIDIA", "H100", "80GB", "HBM3", "not", "built"]
    assert " ".join(rows["512x4096x4096"][8:]) == "NVIDIA H200, races torch first not built"
    assert rows["2048x4096x4096"][0] == "user" and "1.250" in rows["2048x4096x4096"]
    assert "shadowed (1: a faster measured row of the other table serves):" in text
    assert "shipped  RR      2048x4096x4096" in text.split("shadowed")[1]
    assert "by user" in text
    # the real readiness of a row: the carried one says so, the others what a call would cost
    ready = S.readiness(t, "sm_90a", "12.4")
    assert {ready(r) for r in t.rows.values() if r.M == 8} == {"carried"}
    assert {ready(r) for r in t.rows.values() if r.M == 128} <= {"not built", "no nvcc"}


def test_served_without_a_gpu_needs_an_arch(tables, monkeypatch, capsys):
    from cudal2.cli import main
    monkeypatch.delenv("CUDAL2_ARCH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["served"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--arch" in err and "CUDAL2_ARCH" in err
    monkeypatch.setenv("CUDAL2_ARCH", "sm_90a")
    monkeypatch.setattr(S, "readiness", lambda t, arch, cuda: lambda row: "built")
    assert main(["served", "--gpu", H200]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sm_90a, GPU NVIDIA H200: 7 rows served") and "512x4096x4096" in out


def test_measured_on_names_the_gpu_and_whether_the_row_races_first():
    """The shipped rows name the H100 that measured them: outright there, raced first on an H200.
    A row naming no GPU falls back on its report's folder (reports/<gpu>/...)."""
    from cudal2.core import knobs
    from cudal2.core.store import KernelIndex, with_fields
    from cudal2.runs.served import measured_on
    rows = [r for r in KernelIndex.load(knobs.repo_root() / "generated_kernels") if r.tuned]
    assert {r.gpu for r in rows} == {H100}
    row = rows[0]
    assert measured_on(row) == measured_on(row, H100) == H100
    assert measured_on(row, "NVIDIA H200") == f"{H100}, races torch first"
    unnamed = with_fields(row, gpu="")
    assert measured_on(unnamed) == f"{H100} (by its report)"
    assert measured_on(with_fields(unnamed, report="runs/mine"), H100) == "not recorded, races torch first"
