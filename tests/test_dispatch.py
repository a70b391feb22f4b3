"""Dispatch decisions from synthetic tables (no GPU): plan(), the race verdict rule, lazy
thread-safe loading, the plan/load loop and the on-disk verdict cache."""
import ctypes
import json
import threading
import time

import pytest

from cudal2.runtime import hot as hotpath
from cudal2.runtime import loader, race, resolve
from cudal2.runtime import matmul as mm
from cudal2.runtime import plan as planmod
from cudal2.runtime.loader import KernelLoader
from cudal2.runtime.plan import Decision, TableEntry, log_distance, plan
from cudal2.runtime.race import choose_winner
from cudal2.core.store import KernelIndex
from cudal2.core.vocab import AUDIT_VERSION


def entry(M, N, K, *, arch="sm_90a", acc="f32", layout="RR", sha=None, tuned=True, m_bucket="",
          gpu="", speedup_lo=None):
    sha = sha or f"{M:04x}{N:04x}{K:04x}".ljust(64, "0")
    return TableEntry(arch, acc, layout, M, N, K, f"{arch}/{acc}_{layout}/{M}_{N}_{K}.cu", sha,
                      tuned=tuned, m_bucket=m_bucket, gpu=gpu, speedup_lo=speedup_lo)


def table(*entries):
    return {e.key: e for e in entries}


ANY = {"any_shape": True, "tile": [128, 128, 32]}


def tile_meta(bm, bn, bk):
    return {"any_shape": False, "tile": [bm, bn, bk]}


# -- plan --------------------------------------------------------------------------------------
def test_exact_match_wins():
    t = table(entry(64, 64, 64), entry(128, 128, 128))
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", t)
    assert isinstance(d, Decision)
    assert d.kind == "exact" and d.candidates[0].shape == (128, 128, 128)


def test_exact_with_known_meta_is_resolved_and_unknown_is_marked():
    e = entry(128, 128, 128)
    t = table(e)
    assert plan((128, 128, 128), "RR", "sm_90a", "f32", t).unresolved == (e,)
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", t, metas={e.sha256: tile_meta(64, 64, 32)})
    assert d.kind == "exact" and d.unresolved == ()


def test_bucket_serves_the_m_of_its_bucket_before_the_nearest_race():
    """A kernel exported at M=64 (bucket 33-64) serves M 33..64 of its N and K, if it accepts
    them; outside the bucket, or for another N/K, the nearest-shape race decides."""
    at64 = entry(64, 4096, 4096, layout="RC", m_bucket="33-64")
    at48 = entry(48, 4096, 4096, layout="RC", m_bucket="33-64")
    old = entry(16, 4096, 4096, layout="RC")             # an old row: no bucket, exact only
    t = table(at64, old)
    d = plan((40, 4096, 4096), "RC", "sm_90a", "f32", t)
    assert d.kind == "bucket" and d.candidates == (at64,) and d.unresolved == (at64,)
    assert plan((64, 4096, 4096), "RC", "sm_90a", "f32", t).kind == "exact"
    for shape in ((32, 4096, 4096), (65, 4096, 4096), (40, 4096, 2048), (12, 4096, 4096)):
        assert plan(shape, "RC", "sm_90a", "f32", t, metas={at64.sha256: ANY, old.sha256: ANY}
                    ).kind == "nearest", shape
    # two rows of one bucket: the nearer M first, unless its tile does not divide the shape
    t2 = table(at64, at48)
    assert plan((40, 4096, 4096), "RC", "sm_90a", "f32", t2, metas={at64.sha256: ANY, at48.sha256: ANY}
                ).candidates == (at48,)
    metas = {at64.sha256: ANY, at48.sha256: tile_meta(16, 128, 32)}
    assert plan((40, 4096, 4096), "RC", "sm_90a", "f32", t2, metas=metas).candidates == (at64,)
    metas = {at64.sha256: tile_meta(64, 128, 32), at48.sha256: tile_meta(16, 128, 32)}
    assert plan((40, 4096, 4096), "RC", "sm_90a", "f32", t2, metas=metas).kind == "fallback"
    d = plan((48, 4096, 4096), "RC", "sm_90a", "f32", table(at64), metas={at64.sha256: tile_meta(16, 128, 32)})
    assert d.kind == "bucket" and d.unresolved == ()


H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def test_a_row_serves_outright_only_on_the_gpu_model_that_measured_it():
    """Rows for one shape tuned on an H100 and an H200 (both sm_90a) coexist; each GPU gets its
    own outright. On a GPU with no row of its own, a row measured elsewhere (another model's, or
    one naming none: an index older than the column) races torch first, the best measured first;
    so does another GPU's row as a nearest candidate, or at another M of its bucket."""
    h100 = entry(128, 128, 128, gpu=H100, sha="1" * 64, speedup_lo=1.3)
    h200 = entry(128, 128, 128, gpu=H200, sha="2" * 64, speedup_lo=1.1)
    unnamed = entry(128, 128, 128, sha="3" * 64)
    t = table(h100, h200, unnamed)
    assert len(t) == 3
    for gpu, want in ((H100, h100), (" NVIDIA  H200", h200), (None, unnamed)):
        d = plan((128, 128, 128), "RR", "sm_90a", "f32", t, gpu=gpu)
        assert d.kind == "exact" and d.candidates == (want,), gpu
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", t, gpu="NVIDIA GH200 480GB")
    assert d.kind == "other_gpu" and d.candidates == (h100,) and d.unresolved == (h100,)
    assert f"measured on {H100}, not on NVIDIA GH200 480GB: it races torch.matmul first" in d.reason
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", table(unnamed), gpu=H200)
    assert d.kind == "other_gpu" and "a GPU its row does not name" in d.reason
    # another GPU's row as a nearest candidate, or at another M of its bucket: raced as well
    t = table(h100, h200, entry(256, 256, 256, gpu=H200))
    d = plan((192, 192, 192), "RR", "sm_90a", "f32", t, gpu="NVIDIA GH200 480GB", metas={h100.sha256: ANY})
    assert d.kind == "nearest" and h100 in d.candidates
    d = plan((192, 192, 192), "RR", "sm_90a", "f32", t, gpu=H100, metas={h100.sha256: ANY})
    assert d.kind == "nearest" and [c.shape for c in d.candidates] == [(256, 256, 256), h100.shape]
    at64 = entry(64, 4096, 4096, gpu=H100, m_bucket="33-64")
    d = plan((48, 4096, 4096), "RR", "sm_90a", "f32", table(at64), gpu=H200, metas={at64.sha256: ANY})
    assert d.kind == "other_gpu" and d.candidates == (at64,)
    assert plan((48, 4096, 4096), "RR", "sm_90a", "f32", table(at64), gpu=H100,
                metas={at64.sha256: ANY}).kind == "bucket"
    # the GPU's own rows first, then the others' at the shapes it has none of
    assert planmod.for_gpu(t.values(), H200) == [h200, entry(256, 256, 256, gpu=H200)]
    assert planmod.for_gpu(t.values(), "NVIDIA GH200 480GB") == list(t.values())


def test_the_shipped_h100_rows_race_first_on_an_h200():
    """The shipped table's two rows were measured on an H100: outright there; on an H200 (where
    2048x256x12288 ran 1.012 vs torch.matmul and 0.961 vs cuBLASLt autotuned) each races first."""
    from cudal2.core import knobs
    t = planmod.table_from_index(KernelIndex.load(knobs.repo_root() / "generated_kernels"))
    shapes = sorted(e.shape for e in t.values() if e.arch == "sm_90a")
    assert shapes == [(1024, 512, 4096), (2048, 256, 12288)]
    for shape in shapes:
        assert plan(shape, "RR", "sm_90a", "f32", t, gpu=H100).kind == "exact"
        d = plan(shape, "RR", "sm_90a", "f32", t, gpu="NVIDIA H200")
        assert d.kind == "other_gpu" and f"measured on {H100}" in d.reason, d.reason


def test_nearest_by_log_distance_among_accepting_kernels():
    near, mid, far = entry(256, 256, 256), entry(512, 512, 512), entry(4096, 4096, 4096)
    t = table(near, mid, far)
    metas = {e.sha256: ANY for e in (near, mid, far)}
    d = plan((300, 300, 300), "RR", "sm_90a", "f32", t, metas=metas, k=2)
    assert d.kind == "nearest"
    assert [c.shape for c in d.candidates] == [near.shape, mid.shape]
    assert d.distances[0] == pytest.approx(log_distance((300, 300, 300), near.shape))
    assert d.distances[0] < d.distances[1]
    assert "log-space distance" in d.reason


def test_nearest_skips_kernels_whose_tile_does_not_divide():
    near, far = entry(128, 128, 128), entry(512, 512, 512)
    t = table(near, far)
    # 192 is not a multiple of 128: the nearer kernel refuses, the farther (64-tile) accepts.
    metas = {near.sha256: tile_meta(128, 128, 32), far.sha256: tile_meta(64, 64, 32)}
    d = plan((192, 192, 192), "RR", "sm_90a", "f32", t, metas=metas)
    assert d.kind == "nearest" and [c.shape for c in d.candidates] == [far.shape]


def test_nearest_has_a_distance_cap():
    """A kernel farther than NEAREST_MAX_DISTANCE (ln 8) never races: the issue's decode shape
    1x4096x4096 is 7.24 from the shipped 1024x512x4096 kernel; the fallback names the distance.
    Within the cap the farther kernels still race, beyond it they are not candidates."""
    assert planmod.NEAREST_MAX_DISTANCE == pytest.approx(2.079, abs=1e-3)
    prefill = entry(1024, 512, 4096)
    d = plan((1, 4096, 4096), "RR", "sm_90a", "f32", table(prefill), metas={prefill.sha256: ANY})
    assert d.kind == "fallback" and "7.24" in d.reason and "1024x512x4096" in d.reason
    assert "cap 2.08" in d.reason
    near, beyond = entry(256, 256, 256), entry(4096, 4096, 4096)
    t = table(near, beyond)
    metas = {near.sha256: ANY, beyond.sha256: ANY}
    d = plan((512, 512, 512), "RR", "sm_90a", "f32", t, metas=metas)
    assert d.kind == "nearest" and d.candidates == (near,)     # 4096^3 is 3.60 away
    d = plan((2048, 2048, 2048), "RR", "sm_90a", "f32", t, metas=metas)
    assert d.kind == "nearest" and d.candidates == (beyond,)   # 256^3 is 3.60 away
    # one dimension 8x off is the cap itself: still a candidate
    assert plan((128, 256, 256), "RR", "sm_90a", "f32", table(entry(1024, 256, 256)),
                metas={entry(1024, 256, 256).sha256: ANY}).kind == "nearest"
    assert plan((127, 256, 256), "RR", "sm_90a", "f32", table(entry(1024, 256, 256)),
                metas={entry(1024, 256, 256).sha256: ANY}).kind == "fallback"


def test_splitk_kernels_refuse_outputs_beyond_their_workspace():
    e = entry(128, 128, 128)
    meta = {"any_shape": True, "tile": [128, 128, 32], "splitk_max_mn": 128 * 128}
    t = table(e)
    assert plan((128, 64, 512), "RR", "sm_90a", "f32", t, metas={e.sha256: meta}).kind == "nearest"
    assert plan((256, 256, 64), "RR", "sm_90a", "f32", t, metas={e.sha256: meta}).kind == "fallback"


def test_family_flags_are_the_builders_own():
    """Every template family compiles with the builder's base flags alone, so a table kernel that
    dispatch builds from its source shares the tuner's cache entry (no per-family flags travel)."""
    from cudal2.core.build import BASE_FLAGS
    from cudal2.templates import FAMILIES

    for name, fam in FAMILIES.items():
        assert set(fam.flags) <= set(BASE_FLAGS), name


def test_no_kernel_accepts_falls_back():
    e = entry(128, 128, 128)
    d = plan((100, 100, 100), "RR", "sm_90a", "f32", table(e), metas={e.sha256: tile_meta(128, 128, 32)})
    assert d.kind == "fallback" and d.candidates == () and "accepts" in d.reason


def test_unknown_meta_candidate_or_rejected():
    e = entry(128, 128, 128)
    d = plan((256, 256, 256), "RR", "sm_90a", "f32", table(e))
    assert d.kind == "nearest" and d.unresolved == (e,)
    d = plan((256, 256, 256), "RR", "sm_90a", "f32", table(e), unknown_meta="reject")
    assert d.kind == "fallback"


def test_untuned_never_serves():
    e = entry(128, 128, 128, tuned=False)
    t = table(e)
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", t, metas={e.sha256: ANY})
    assert d.kind == "fallback"


def test_untuned_rows_never_reach_the_table(tmp_path):
    idx = KernelIndex(tmp_path)
    idx.add("// seed\n", arch="sm_90a", acc="f32", layout="RR", M=64, N=64, K=64, family="mma")
    idx.add("// tuned\n", arch="sm_90a", acc="f32", layout="RR", M=128, N=128, K=128,
            family="mma", tuned=True, mode="offline", report="r1", speedups={"torch": 1.2},
            audit=AUDIT_VERSION)
    idx.add("// tuned, older rules\n", arch="sm_90a", acc="f32", layout="RR", M=256, N=128,
            K=128, family="mma", tuned=True, mode="offline", report="r1", speedups={"torch": 1.2})
    idx.write()
    t = planmod.table_from_index(KernelIndex.load(tmp_path))
    assert [e.shape for e in t.values()] == [(128, 128, 128)]     # nor rows of older audits
    assert plan((64, 64, 64), "RR", "sm_90a", "f32", t).kind == "nearest"  # not exact: untuned


@pytest.mark.parametrize("arch,acc,layout", [("sm_80", "f32", "RR"), ("sm_90a", "f16", "RR"),
                                             ("sm_90a", "f32", "RC")])
def test_arch_acc_layout_mismatch_falls_back(arch, acc, layout):
    e = entry(128, 128, 128)  # sm_90a f32 RR
    d = plan((128, 128, 128), layout, arch, acc, table(e), metas={e.sha256: ANY})
    assert d.kind == "fallback"
    assert "sm_90a/f32_RR" in d.reason  # says what the table does have


def test_other_layout_entry_serves_its_own_layout():
    rc = entry(128, 128, 128, layout="RC")
    d = plan((128, 128, 128), "RC", "sm_90a", "f32", table(entry(128, 128, 128), rc))
    assert d.kind == "exact" and d.candidates[0].layout == "RC"


@pytest.mark.parametrize("shape,layout,arch", [((0, 64, 64), "RR", "sm_90a"),
                                               ((64, 64, 64), "CC", "sm_90a"),
                                               ((64, 64, 64), "RR", None),
                                               ((2**31, 64, 64), "RR", "sm_90a")])  # ABI ints
def test_degenerate_requests_fall_back(shape, layout, arch):
    d = plan(shape, layout, arch, "f32", table(entry(64, 64, 64)))
    assert d.kind == "fallback" and d.reason


def test_empty_table_falls_back():
    d = plan((64, 64, 64), "RR", "sm_90a", "f32", {})
    assert d.kind == "fallback" and "empty" in d.reason


def test_excluded_kernels_are_skipped():
    a, b = entry(128, 128, 128), entry(256, 256, 256)
    d = plan((128, 128, 128), "RR", "sm_90a", "f32", table(a, b), metas={b.sha256: ANY},
             exclude={a.sha256})
    assert d.kind == "nearest" and d.candidates == (b,)


def test_plan_is_deterministic_on_ties():
    a, b = entry(128, 256, 256), entry(256, 128, 256)  # same distance from 181^3-ish
    t = table(b, a)
    metas = {a.sha256: ANY, b.sha256: ANY}
    d1 = plan((181, 181, 256), "RR", "sm_90a", "f32", t, metas=metas, k=1)
    d2 = plan((181, 181, 256), "RR", "sm_90a", "f32", table(a, b), metas=metas, k=1)
    assert d1.candidates == d2.candidates == (a,)


# -- race verdict ------------------------------------------------------------------------------
def test_choose_winner_needs_the_interval_to_clear_the_margin():
    """The race's rule is the export rule: the lower end of torch-time / kernel-time must clear
    1 + WIN_MARGIN; ties and noise go to torch; the best lower end wins."""
    def sp(**lo):
        return {"speedups": {k: {"median": v + 0.01, "lo": v, "hi": v + 0.02, "n": 10}
                             for k, v in lo.items()}}
    assert choose_winner(sp(k=1.10)) == "k"
    assert choose_winner(sp(k=1.01)) == "torch"                  # median 1.02, lower end 1.01
    assert choose_winner(sp(k1=1.05, k2=1.20)) == "k2"
    assert choose_winner({"speedups": {}}) == "torch"           # everything disqualified


def test_race_disqualifies_wrong_kernels_and_times_the_rest():
    """The race on CPU tensors with the fake GPU of test_kerneltime: a wrong kernel is out, a
    faster one wins by its interval."""
    import torch

    from tests.test_kerneltime import FakeGpu
    gpu = FakeGpu({"torch": 10.0, "fast": 5.0, "bad": 1.0})
    a, b = torch.randn(8, 16), torch.randn(16, 4)

    def kernel(name, wrong=False):
        def run(c):
            gpu.call(name)
            c.copy_((a @ b).half() * (0 if wrong else 1))
        return run
    res = race.race({"torch": kernel("torch"), "fast": kernel("fast"), "bad": kernel("bad", wrong=True)},
                    a.half(), b.half(), 8, 4, backend=gpu)
    assert set(res["wrong"]) == {"bad"} and set(res["speedups"]) == {"fast"}
    assert res["speedups"]["fast"]["median"] == pytest.approx(2.0)
    assert choose_winner(res) == "fast"


# -- lazy loading ------------------------------------------------------------------------------
def test_loader_builds_once_under_concurrency():
    calls = []
    lock = threading.Lock()

    def fake_build_and_load(source, arch, name):
        with lock:
            calls.append((source, arch))
        time.sleep(0.05)  # a slow build: every thread arrives while it runs
        return object()

    kl = KernelLoader(fake_build_and_load)
    got = []
    barrier = threading.Barrier(16)

    def worker():
        barrier.wait()
        got.append(kl.get("abc", lambda: "src", "sm_90a"))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [("src", "sm_90a")]
    assert len(got) == 16 and all(g is got[0] for g in got)
    # A different kernel builds separately.
    kl.get("def", lambda: "src2", "sm_90a")
    assert len(calls) == 2


def test_loader_remembers_failures():
    n = []

    def broken(source, arch, name):
        n.append(1)
        raise loader.KernelLoadError("nvcc said no")

    kl = KernelLoader(broken)
    for _ in range(3):
        with pytest.raises(loader.KernelLoadError, match="nvcc said no"):
            kl.get("x", lambda: "s", "sm_90a")
    assert len(n) == 1


# -- the plan/load loop and the verdict cache, with a fake loader and no GPU -------------------
class FakeLib:
    def __init__(self, meta):
        self.meta = meta
        self.launch = self.raw_launch = lambda *args: 0

    def options(self, chosen=None):
        return None

    def workspace_bytes(self, M, N, K, options=None):
        return int(self.meta.get("workspace_bytes") or 0)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A tuned table on disk and a dispatcher whose 'device 0' is an sm_90a GPU named FakeGPU."""
    root = tmp_path / "kernels"
    monkeypatch.setenv("CUDAL2_KERNELS", str(root))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    idx = KernelIndex(root)
    metas = {}

    def add(M, N, K, meta, layout="RR", arch="sm_90a", gpu="", verified=("threads", "tile")):
        src = f"// kernel {M} {N} {K} {layout} {arch} {gpu}\n"
        row = idx.add(src, arch=arch, acc="f32", layout=layout, M=M, N=N, K=K, family="mma",
                      tuned=True, mode="offline", report="synthetic", speedups={"torch": 1.5},
                      gpu=gpu, verified=verified, audit=AUDIT_VERSION)
        metas[src] = dict(meta, arch=arch, acc="f32", layout=layout, workspace_bytes=0)
        return row

    built = []

    def fake_build_and_load(source, arch, name):
        built.append(name)
        if metas[source].get("broken"):
            raise loader.KernelLoadError(f"{name}: compile_error")
        return FakeLib(metas[source])

    resolve.reset(KernelLoader(fake_build_and_load))
    resolve.state.arch[0] = "sm_90a"
    resolve.state.env[0] = {"gpu": "FakeGPU", "torch": "t", "cuda": "c", "cublas": "b"}
    yield idx, add, built
    resolve.reset()


def test_decide_bucket_serves_without_a_race(store, monkeypatch):
    idx, add, built = store
    row = add(64, 256, 128, ANY, layout="RC")
    idx.replace_row(__import__("dataclasses").replace(row, m_bucket="33-64"))
    idx.write()
    monkeypatch.setattr(race, "race", lambda *a, **k: pytest.fail("a bucket kernel never races"))
    served = resolve.decide(0, 40, 256, 128, "RC", None, None)
    assert served is not resolve.TORCH and built == ["sm_90a/f32_RC/64_256_128.cu"]


@pytest.mark.parametrize("trust", ["unverified", "audited", "instantiation", "old index"])
def test_decide_serves_an_unconfirmed_tile_at_its_measured_shape_only(store, monkeypatch, trust):
    """index.csv's config / verified columns reach plan(): a kernel whose tile the audit did not
    confirm (a policy's claim) serves the shape it was measured at and nothing else, neither a
    bucket neighbour nor a nearest shape; one whose tile the audit confirmed, or that is an
    instantiation of our own families, serves both as before. An index written before the
    columns reads, and its rows are unconfirmed."""
    import csv
    import dataclasses
    idx, add, built = store
    verified = {"audited": "threads;tile", "instantiation": ""}.get(trust, "threads")
    row = add(64, 256, 128, ANY, verified=verified)
    idx.replace_row(dataclasses.replace(
        row, m_bucket="33-64", config="mma_sm90a_f32_rr_x" if trust == "instantiation" else ""))
    idx.write()
    if trust == "old index":             # the columns of before: no config, no verified
        path = idx.root / "index.csv"
        recs = list(csv.DictReader(path.open()))
        cols = [c for c in recs[0] if c not in ("config", "verified")]
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            w.writerows(recs)
        assert "verified" not in path.read_text()
    trusted = trust in ("audited", "instantiation")
    monkeypatch.setattr(race, "read_verdict", lambda key: {"key": key, "winner": row.sha256})
    for shape in ((64, 256, 128), (40, 256, 128), (256, 256, 128)):   # exact, bucket, nearest
        resolve.reset(resolve.state.loader)
        resolve.state.arch[0] = "sm_90a"
        resolve.state.env[0] = {"gpu": "FakeGPU", "torch": "t", "cuda": "c", "cublas": "b"}
        served = resolve.decide(0, *shape, "RR", None, None)
        assert (served is not resolve.TORCH) == (trusted or shape == (64, 256, 128)), shape


def test_decide_serves_a_row_outright_only_on_the_gpu_model_that_measured_it(store, monkeypatch):
    """The dispatcher asks the device's name once (faked here): each GPU loads its own row of the
    shape without a race. On a GPU model that measured no row of the shape (the shipped H100 rows
    on an H200), the row measured elsewhere races torch.matmul first and serves only if it won."""
    idx, add, built = store
    own = {g: add(128, 128, 128, ANY, gpu=g).file for g in (H100, H200)}
    unnamed = add(128, 128, 128, ANY).file
    idx.write()
    assert len(set(own.values()) | {unnamed}) == 3
    raced = []

    def verdict(winner):
        def read(key):
            raced.append(key["candidates"])
            return {"key": key, "winner": winner(key)}
        return read
    monkeypatch.setattr(race, "read_verdict", verdict(lambda key: key["candidates"][0]))
    for gpu, want in ((H100, own[H100]), (H200, own[H200]), ("NVIDIA H20", unnamed)):
        resolve.reset(resolve.state.loader)
        resolve.state.arch[0], resolve.state.gpu[0] = "sm_90a", gpu
        resolve.state.env[0] = {"gpu": gpu, "torch": "t", "cuda": "c", "cublas": "b"}
        built.clear()
        assert resolve.decide(0, 128, 128, 128, "RR", None, None) is not resolve.TORCH
        assert built == [want], gpu
    assert len(raced) == 1         # the H20's race alone; H100 and H200 served their own rows
    monkeypatch.setattr(race, "read_verdict", verdict(lambda key: "torch"))
    resolve.reset(resolve.state.loader)
    resolve.state.arch[0], resolve.state.gpu[0] = "sm_90a", "NVIDIA H20"
    assert resolve.decide(0, 128, 128, 128, "RR", None, None) is resolve.TORCH   # it lost: torch


def test_decide_exact_loads_one_kernel(store):
    idx, add, built = store
    add(128, 128, 128, ANY)
    add(256, 256, 256, ANY)
    idx.write()
    served = resolve.decide(0, 128, 128, 128, "RR", None, None)
    assert served is not resolve.TORCH and served[1] == 0
    assert built == ["sm_90a/f32_RR/128_128_128.cu"]


def test_decide_skips_broken_and_non_accepting_then_races_from_disk_verdict(store):
    idx, add, built = store
    near = add(128, 128, 128, {"any_shape": False, "tile": [128, 128, 32], "broken": True})
    mid = add(256, 256, 256, tile_meta(128, 128, 32))  # 192 not divisible: refuses
    far = add(512, 512, 512, tile_meta(64, 64, 64))  # accepts 192
    idx.write()
    key = dict(resolve.state.env[0], shape=[192, 192, 192], layout="RR", acc="f32",
               candidates=sorted([far.sha256]))
    path = race.verdict_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key, "winner": far.sha256}))
    served = resolve.decide(0, 192, 192, 192, "RR", None, None)
    assert served is not resolve.TORCH
    assert set(built) == {near.file, mid.file, far.file}
    assert near.sha256 in resolve.state.broken


def test_decide_disk_verdict_for_torch_serves_torch(store):
    idx, add, built = store
    k = add(128, 128, 128, ANY)
    idx.write()
    key = dict(resolve.state.env[0], shape=[100, 100, 100], layout="RR", acc="f32",
               candidates=[k.sha256])
    p = race.verdict_path(key)
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"key": key, "winner": "torch"}))
    assert resolve.decide(0, 100, 100, 100, "RR", None, None) is resolve.TORCH


def test_decide_without_kernels_serves_torch(store):
    idx, add, built = store
    add(128, 128, 128, ANY, arch="sm_80")
    idx.write()
    assert resolve.decide(0, 128, 128, 128, "RR", None, None) is resolve.TORCH
    assert built == []


def test_meta_that_contradicts_the_index_is_refused(store):
    idx, add, built = store
    row = add(128, 128, 128, ANY)
    idx.write()
    src = idx.source(row)
    lib = FakeLib(dict(ANY, arch="sm_90a", acc="f16", layout="RR", workspace_bytes=0))
    resolve.reset(KernelLoader(lambda s, a, n: lib))
    resolve.state.arch[0] = "sm_90a"
    assert src  # the row is real
    assert resolve.decide(0, 128, 128, 128, "RR", None, None) is resolve.TORCH
    assert row.sha256 in resolve.state.broken


def test_broken_index_warns_and_serves_torch(store, tmp_path):
    idx, add, built = store
    add(128, 128, 128, ANY)
    idx.write()
    (idx.root / "index.csv").write_text("arch,acc\nsm_90a,f32\n")
    with pytest.warns(RuntimeWarning, match="ignoring the kernel table"):
        assert resolve.decide(0, 128, 128, 128, "RR", None, None) is resolve.TORCH


class Abi2Lib(FakeLib):
    """An ABI 2 library: options() as abi.KernelLibrary makes it (one int per declared option,
    in meta order); raw_launch records its arguments."""

    def __init__(self, meta, calls):
        super().__init__(meta)
        self.raw_launch = lambda *args: calls.append(args) or 0

    def options(self, chosen=None):
        from cudal2.core.abi import option_values
        values = option_values(self.meta, chosen)
        return (ctypes.c_int * max(len(values), 1))(*values)


def test_each_shape_launches_with_the_options_recorded_for_it(store, monkeypatch):
    """index.csv options -> resolve -> hot path: one build serves two shapes with their own
    options array; options the kernel does not declare serve torch, never a wrong launch."""
    import torch
    idx, _, _ = store
    kw = dict(arch="sm_90a", acc="f32", layout="RR", family="cutlass_sm90", tuned=True,
              mode="offline", report="synthetic", speedups={"torch": 1.5}, audit=AUDIT_VERSION)
    idx.add("// one build\n", M=32, N=16, K=64, options={"swizzle": 8, "raster": 2}, **kw)
    idx.add("// one build\n", M=64, N=16, K=64, **kw)                     # defaults
    idx.add("// one build\n", M=16, N=16, K=64, options={"splits": 4}, **kw)  # not declared
    idx.write()
    calls = []
    meta = dict(ANY, arch="sm_90a", acc="f32", layout="RR", workspace_bytes=0, abi=2,
                options=[{"name": "swizzle", "values": [1, 2, 4, 8], "default": 1},
                         {"name": "raster", "values": [0, 1, 2], "default": 0}])
    resolve.reset(KernelLoader(lambda s, a, n: Abi2Lib(meta, calls)))
    resolve.state.arch[-1] = "sm_90a"                      # CPU tensors: device index -1
    monkeypatch.setattr(hotpath, "_cur_device", lambda: -1)
    monkeypatch.setattr(hotpath, "_raw_stream", lambda dev: 1234)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("CUDAL2_DISABLE", raising=False)
    b = torch.randn(64, 16, dtype=torch.float16)
    for M in (32, 64, 32):
        mm._cuda_matmul(torch.randn(M, 64, dtype=torch.float16), b, None)
    assert [len(c) for c in calls] == [13, 13, 13]
    assert [list(c[12]) for c in calls] == [[8, 2], [1, 0], [8, 2]]
    assert calls[2][12] is calls[0][12]                   # built once, reused by the hot path
    a = torch.randn(16, 64, dtype=torch.float16)
    with pytest.warns(RuntimeWarning, match="not declared by the kernel"):
        assert torch.equal(mm._cuda_matmul(a, b, None), torch.matmul(a, b))
    assert len(calls) == 3 and resolve.serving[(-1, 16, 16, 64, "RR")] is resolve.TORCH


def test_nearest_keeps_each_shapes_options_apart(store):
    """One build tabled at two shapes with different options: the race and its stored verdict
    name (build, options) pairs, and the winner launches with its own shape's options."""
    idx, _, _ = store
    kw = dict(arch="sm_90a", acc="f32", layout="RR", family="cutlass_sm90", tuned=True,
              mode="offline", report="synthetic", speedups={"torch": 1.5}, verified="tile",
              audit=AUDIT_VERSION)
    near = idx.add("// one build\n", M=512, N=512, K=512, options={"swizzle": 1}, **kw)
    far = idx.add("// one build\n", M=1024, N=1024, K=1024, options={"swizzle": 8}, **kw)
    idx.write()
    assert near.sha256 == far.sha256
    meta = dict(ANY, arch="sm_90a", acc="f32", layout="RR", workspace_bytes=0, abi=2,
                options=[{"name": "swizzle", "values": [1, 2, 4, 8], "default": 1}])
    ids = [f"{near.sha256}@swizzle=1", f"{far.sha256}@swizzle=8"]
    for winner, want in ((ids[0], [1]), (ids[1], [8])):
        resolve.reset(KernelLoader(lambda s, a, n: Abi2Lib(meta, [])))   # forgets verdicts read
        resolve.state.arch[0] = "sm_90a"
        resolve.state.env[0] = {"gpu": "FakeGPU", "torch": "t", "cuda": "c", "cublas": "b"}
        key = dict(resolve.state.env[0], shape=[640, 640, 640], layout="RR", acc="f32",
                   candidates=sorted(ids))
        p = race.verdict_path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"key": key, "winner": winner}))
        served = resolve.decide(0, 640, 640, 640, "RR", None, None)
        assert served is not resolve.TORCH and list(served[3]) == want


# -- the hot path's argument marshalling, with CPU tensors standing in for CUDA ones ------------
@pytest.fixture
def hot(monkeypatch):
    """_cuda_matmul/_launch on CPU tensors: device index -1, stream 0, a recording launcher."""
    import torch
    resolve.reset()
    monkeypatch.setattr(hotpath, "_cur_device", lambda: -1)
    monkeypatch.setattr(hotpath, "_raw_stream", lambda dev: 1234)
    monkeypatch.delenv("CUDAL2_DISABLE", raising=False)
    calls = []

    def launcher(rc=0):
        def fn(*args):
            # abi.raw_launch's convention: pointers arrive as c_void_p, workspace_bytes as
            # c_size_t, the six ints as ints. Recorded as plain ints.
            assert all(isinstance(x, ctypes.c_void_p) for x in args[:3] + args[9:10] + args[11:])
            assert isinstance(args[10], ctypes.c_size_t)
            assert all(type(x) is int for x in args[3:9])
            calls.append(tuple(x if type(x) is int else (x.value or 0) for x in args))
            return rc
        return fn

    def serve(M, N, K, layout, rc=0, ws=0):
        resolve.serving[(-1, M, N, K, layout)] = (launcher(rc), ws, ctypes.c_size_t(ws), None, False)

    yield torch, serve, calls
    resolve.reset()


def test_hot_path_rr_and_rc_arguments(hot):
    torch, serve, calls = hot
    a = torch.randn(32, 64, dtype=torch.float16)
    b_rr = torch.randn(64, 16, dtype=torch.float16)
    b_rc = torch.randn(16, 64, dtype=torch.float16).t()          # (64, 16) column-major
    serve(32, 16, 64, "RR")
    serve(32, 16, 64, "RC")
    c = mm._cuda_matmul(a, b_rr, None)
    assert c.shape == (32, 16) and c.dtype == torch.float16
    assert calls[-1] == (a.data_ptr(), b_rr.data_ptr(), c.data_ptr(), 32, 16, 64, 64, 16, 16, 0, 0, 1234)
    c = mm._cuda_matmul(a, b_rc, None)
    assert calls[-1][6:9] == (64, 64, 16)                         # lda, ldb = K (RC), ldc
    out = torch.empty(32, 24, dtype=torch.float16)[:, :16]        # ldc 24, row-major rows
    assert mm._cuda_matmul(a, b_rr, out) is out
    assert calls[-1][2] == out.data_ptr() and calls[-1][8] == 24
    assert len(calls) == 3


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_hot_path_declines_what_kernels_cannot_take(hot):
    torch, serve, calls = hot
    serve(32, 16, 64, "RR")
    a = torch.randn(32, 64, dtype=torch.float16)
    b = torch.randn(64, 16, dtype=torch.float16)
    cases = [
        (a.t().contiguous().t(), b, None),                        # A column-major
        (torch.randn(32, 66, dtype=torch.float16)[:, 1:65], b, None),  # misaligned pointer
        (a, torch.randn(64, 20, dtype=torch.float16)[:, :16], None),   # ldb 20 not a multiple of 8
        (a, b, torch.empty(32, 16, dtype=torch.float32)),          # out of another dtype
        (a, b, torch.empty(16, 32, dtype=torch.float16).t()),      # out column-major
        (a, b, torch.empty(32, 17, dtype=torch.float16)),          # out of another shape
        (a.float(), b.float(), None),
    ]
    for x, y, out in cases:
        try:
            got = mm._cuda_matmul(x, y, out)
        except RuntimeError as exc:  # what torch.matmul itself raises for this out=
            with pytest.raises(type(exc), match="dtype"):
                torch.matmul(x, y, out=out.clone())
            continue
        assert torch.equal(got, torch.matmul(x, y))
    assert calls == []


def test_hot_path_never_writes_into_an_operand(hot):
    torch, serve, calls = hot
    serve(16, 16, 16, "RR")
    buf = torch.randn(16, 32, dtype=torch.float16)
    a, out = buf[:, :16], buf[:, 16:]                              # out overlaps a's storage rows
    b = torch.randn(16, 16, dtype=torch.float16)
    want = torch.matmul(a, b)
    mm._cuda_matmul(a, b, out)
    assert calls == [] and torch.equal(out, want)


def test_hot_path_disable_grad_and_errors(hot, monkeypatch):
    torch, serve, calls = hot
    serve(32, 16, 64, "RR")
    a = torch.randn(32, 64, dtype=torch.float16)
    b = torch.randn(64, 16, dtype=torch.float16)
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    assert torch.equal(mm._cuda_matmul(a, b, None), torch.matmul(a, b)) and calls == []
    monkeypatch.delenv("CUDAL2_DISABLE")
    # Needs grad: the custom op (CPU impl here: torch.matmul), gradients flow.
    ag = a.float().requires_grad_()
    bg = b.float().requires_grad_()
    mm._cuda_matmul(ag.half(), bg.half(), None).float().sum().backward()
    assert ag.grad is not None and bg.grad is not None
    # A kernel that reports a CUDA error: one warning, torch's answer, and torch from then on.
    serve(32, 16, 64, "RR", rc=700)
    with pytest.warns(RuntimeWarning, match="cudaError 700"):
        assert torch.equal(mm._cuda_matmul(a, b, None), torch.matmul(a, b))
    assert resolve.serving[(-1, 32, 16, 64, "RR")] is resolve.TORCH


def test_hot_path_workspace_is_cached_per_stream(hot, monkeypatch):
    torch, serve, calls = hot
    monkeypatch.setattr(hotpath, "_workspace", lambda dev, stream, n, zero: calls.append(("ws", stream, n)) or 4096)
    serve(32, 16, 64, "RR", ws=1 << 16)
    a = torch.randn(32, 64, dtype=torch.float16)
    b = torch.randn(64, 16, dtype=torch.float16)
    mm._cuda_matmul(a, b, None)
    assert calls[0] == ("ws", 1234, 1 << 16)
    assert calls[1][9:11] == (4096, 1 << 16)


def test_hot_path_leading_dimensions_beyond_c_int_go_to_torch(hot):
    """ctypes would truncate them silently: such calls are torch's."""
    torch, serve, calls = hot
    serve(1, 16, 8, "RR")
    a = torch.randn(8, dtype=torch.float16).as_strided((1, 8), (2**31, 1))  # one row: lda unused
    b = torch.randn(8, 16, dtype=torch.float16)
    assert torch.equal(mm._cuda_matmul(a, b, None), torch.matmul(a, b)) and calls == []
    mm._cuda_matmul(torch.randn(1, 8, dtype=torch.float16), b, None)   # lda 8: the kernel's
    assert len(calls) == 1 and calls[0][6] == 8


def test_pdl_knob_sets_the_option_where_a_kernel_declares_it(monkeypatch):
    """CUDAL2_PDL=1: the serving table launches kernels that declare option pdl with pdl 1 (the
    tuned options kept otherwise); kernels without it are untouched; a value other than 0 or 1 is
    refused with the knob's name."""
    from cudal2.runtime.loader import launcher

    class Lib:
        raw_launch = object()

        def __init__(self, names):
            self.meta = {"options": [{"name": n, "values": [0, 1], "default": 0} for n in names]}

        def options(self, chosen):
            return None if chosen is None else dict(chosen)

        def workspace_bytes(self, M, N, K, opts):
            return 0

    monkeypatch.setenv("CUDAL2_PDL", "1")
    assert launcher(Lib(["splits", "pdl"]), 1, 8, 8, {"splits": 4})[3] == {"splits": 4, "pdl": 1}
    assert launcher(Lib(["splits"]), 1, 8, 8, None)[3] is None
    monkeypatch.setenv("CUDAL2_PDL", "0")
    assert launcher(Lib(["splits", "pdl"]), 1, 8, 8, {"splits": 4})[3] == {"splits": 4}
    monkeypatch.delenv("CUDAL2_PDL")
    assert launcher(Lib(["splits", "pdl"]), 1, 8, 8, None)[3] is None
    monkeypatch.setenv("CUDAL2_PDL", "yes")
    with pytest.raises(ValueError, match="CUDAL2_PDL must be 0 or 1"):
        launcher(Lib(["pdl"]), 1, 8, 8, None)
