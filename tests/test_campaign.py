"""The campaign's CPU half (plan, build, pack, dry run) and the run half's plumbing without a GPU.

Compiles real mma candidates and the two cuBLAS baseline libraries with nvcc (marked compile);
the pack is built once per module and shared by the tests.
"""
import gzip
import hashlib
import json
import shutil

import pytest

from cudal2.runs import campaign
from cudal2.core.vocab import AUDIT_VERSION

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    shapes = root / "shapes.csv"
    shapes.write_text("M,N,K\n64,64,64\n256,128,512\n")
    out = root / "pack"
    lines = []
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDAL2_CACHE", str(root / "cache"))
    try:
        manifest = campaign.prepare(shapes, "sm_90a", out, families=["mma"], limit_per_shape=2,
                                    jobs=2, include_tuned=False, log=lines.append)
    finally:
        mp.undo()
    return out, manifest, lines, root


def test_prepare_packs_and_dry_runs(pack):
    out, manifest, lines, root = pack
    m = campaign.load_manifest(out)
    assert m["arch"] == "sm_90a" and m["shapes"] == [[64, 64, 64], [256, 128, 512]]
    # per shape: the family's best two by the cost model, its default among them (tune.plan's
    # per-family quota); two shapes share what they can
    assert 1 <= len(m["candidates"]) <= 4
    assert sorted(b["name"] for b in m["baselines"]) == ["cublas", "cublaslt"]
    # the ceilings' kernels (streaming read, launch floor) packed beside them, dry-run checked too
    assert m["stream_read"]["name"] == "stream_read" and m["stream_read"]["libraries"] == []
    assert m["launch_floor"]["name"] == "launch_floor" and m["launch_floor"]["libraries"] == []
    assert ("baseline launch_floor", m["launch_floor"]) in campaign.pack_entries(m)
    for e in m["candidates"] + m["baselines"] + [m["stream_read"], m["launch_floor"]]:
        assert (out / e["dir"] / "kernel.cu.gz").is_file()
        # the build record gzipped (its dependency list is most of it), read back whole
        assert (out / e["dir"] / "build.json.gz").is_file() and not (out / e["dir"] / "build.json").exists()
        assert campaign.pack_build_result(out, {"sha": "0" * 16, **e}, root / "ptx").deps
    # a candidate's library travels gzipped (a decode pack carries hundreds), the others as built
    for e in m["candidates"]:
        assert (out / e["dir"] / "kernel.so.gz").is_file() and not (out / e["dir"] / "kernel.so").exists()
        assert campaign.file_sha(campaign.library_path(out / e["dir"])) == e["so_sha256"]
    for e in m["baselines"] + [m["stream_read"], m["launch_floor"]]:
        assert (out / e["dir"] / "kernel.so").is_file()
    assert 0 < m["pack_bytes"] < 64 << 20
    assert any("dry run" in l and "0 problem(s)" in l for l in lines)
    assert (out / "shapes.csv").is_file()
    with pytest.raises(ValueError, match="not empty"):
        campaign.prepare(out / "shapes.csv", "sm_90a", out, families=["mma"])


def test_pack_size_limit_is_the_users_flag(pack, tmp_path, monkeypatch):
    """No pack-size limit by default (the fixture's pack passed without one); --max-pack-mib
    refuses a larger pack, naming the flag."""
    out, manifest, _, root = pack
    monkeypatch.setenv("CUDAL2_CACHE", str(root / "cache"))       # the fixture's builds: cached
    with pytest.raises(RuntimeError, match="--max-pack-mib"):
        campaign.prepare(out / "shapes.csv", "sm_90a", tmp_path / "p", families=["mma"],
                         limit_per_shape=2, jobs=2, include_tuned=False, log=lambda *a: None,
                         max_pack_bytes=manifest["pack_bytes"] // 2)
    import argparse
    parser = argparse.ArgumentParser()
    campaign.configure_parser(parser)
    args = parser.parse_args(["prepare", "--shapes", "s.csv", "--out", "o"])
    assert args.max_pack_mib is None
    assert parser.parse_args(["prepare", "--shapes", "s.csv", "--out", "o",
                              "--max-pack-mib", "64"]).max_pack_mib == 64.0
    assert parser.parse_args(["run", "pack"]).budget_s == 0.0              # 0: no limit


def test_prepare_order_gain_packs_the_unmeasured_shapes(pack, tmp_path, monkeypatch):
    """--order gain --db: a shape the DB measured by kernel time is left out of the pack."""
    from cudal2.core.identity import source_sha
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.pipeline import record
    from cudal2.harness.types import BASELINES, Evaluation, Shape
    out, _, _, root = pack
    monkeypatch.setenv("CUDAL2_CACHE", str(root / "cache"))       # the fixture's builds: cached
    src = "int measured_kernel;"
    t = {"offline": {"candidate": {"median_us": 5.0}, **{b: {"median_us": 4.0} for b in BASELINES}}}
    ev = Evaluation(status="ok", source_sha=source_sha(src), shape=Shape(64, 64, 64), arch="sm_90a",
                    acc="f32", layout="RR", timings=t, correctness={"ok": True},
                    env={"gpu": "Fake GPU (synthetic)", "settings": {"timer": "kernel"}})
    with ResultsDB(tmp_path / "done.db") as db:
        record(db, ev, source=src)
    lines = []
    m = campaign.prepare(out / "shapes.csv", "sm_90a", tmp_path / "p", families=["mma"],
                         limit_per_shape=2, jobs=2, include_tuned=False, log=lines.append,
                         order="gain", measured_dbs=[tmp_path / "done.db"], limit_shapes=5)
    assert m["shapes"] == [[256, 128, 512]]
    assert any("order gain: 1 of 2 shapes measured already" in l for l in lines)


def test_dry_run_catches_a_corrupt_pack(pack, tmp_path):
    out, _, _, _ = pack
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    m = json.loads((bad / "manifest.json").read_text())
    gz = bad / m["candidates"][0]["dir"] / "kernel.so.gz"
    gz.write_bytes(b"not gzip")
    problems = campaign.dry_run(bad, log=lambda *a: None)
    assert any("does not unpack" in p for p in problems), problems
    gz.write_bytes(gzip.compress(b"\x7fELF not really"))
    problems = campaign.dry_run(bad, log=lambda *a: None)
    assert any("does not match its sha256" in p for p in problems)
    # a library that hashes right but is not a shared object fails to load in the worker
    m["candidates"][0]["so_sha256"] = hashlib.sha256(b"\x7fELF not really").hexdigest()
    (bad / "manifest.json").write_text(json.dumps(m))
    problems = campaign.dry_run(bad, log=lambda *a: None)
    assert any("loading" in p and "error" in p for p in problems)
    (bad / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="schema"):
        campaign.load_manifest(bad)


def test_pack_build_result_is_the_carried_binary(pack, tmp_path):
    out, m, _, _ = pack
    c = m["candidates"][0]
    br = campaign.pack_build_result(out, c, tmp_path / "ptx")
    # the gzipped library unpacked into the run's folder, the pack left as carried
    assert br.ok and br.cached and br.so_path.is_relative_to(tmp_path / "ptx")
    assert campaign.file_sha(br.so_path) == c["so_sha256"] and not (out / c["dir"] / "kernel.so").exists()
    assert br.ptx_path is not None and "mma.sync" in br.ptx_path.read_text()
    assert br.max_registers == c["resources"]["registers"] > 0


def test_run_without_gpu_is_plumbing_only(pack, tmp_path, monkeypatch):
    """No GPU: refused unless --allow-no-gpu; then every row is not_measured (screening rows and
    finals), nothing is exported, the DB, CSV and throughput are written and the budget is
    honoured; a resumed run re-times nothing the first recorded (the harness's cache rule)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this test covers the no-GPU path")
    out, m, _, _ = pack
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        campaign.run(out, tmp_path / "r0", budget_s=60)
    gk = tmp_path / "gk"
    summary = campaign.run(out, tmp_path / "reports", budget_s=120, allow_no_gpu=True,
                           kernels_root=gk, log=lambda *a: None)
    assert summary["shapes_planned"] == summary["shapes_done"] == 2
    assert {k.split()[-1] for k in summary["statuses"]} == {"not_measured"}
    assert summary["exported"] == 0 and "screen all" in summary["throughput"]
    run_dir = tmp_path / "reports" / "no-gpu"
    (d,) = list(run_dir.iterdir())
    assert (d / "results.db").is_file() and (d / "evaluations.csv").is_file()
    assert not (gk / "index.csv").exists()
    from cudal2.harness.db import ResultsDB
    with ResultsDB(d / "results.db") as db1:
        stages = sorted({e.stage for e in db1.rows()})
        n1 = db1.count()
    assert "screen" in stages and set(stages) <= {"final", "screen"}
    # a zero budget stops before the first shape, cleanly
    s0 = campaign.run(out, tmp_path / "r1", budget_s=0.001, allow_no_gpu=True, log=lambda *a: None)
    assert s0["shapes_done"] == 0
    # resuming from the first run's DB (another lease): its rows come along, nothing is redone
    campaign.run(out, tmp_path / "r2", budget_s=120, allow_no_gpu=True,
                 resume_db=d / "results.db", log=lambda *a: None)
    (d2,) = list((tmp_path / "r2" / "no-gpu").iterdir())
    with ResultsDB(d2 / "results.db") as db2:
        assert db2.count() == n1
    with pytest.raises(ValueError, match="no such file"):
        campaign.run(out, tmp_path / "r3", budget_s=60, allow_no_gpu=True,
                     resume_db=tmp_path / "missing.db", log=lambda *a: None)
    # --db: calls append to one DB (created by the first) and re-time nothing it holds
    acc = tmp_path / "acc" / "results.db"
    for i in (4, 5):
        campaign.run(out, tmp_path / f"r{i}", allow_no_gpu=True, db_path=acc, log=lambda *a: None)
        with ResultsDB(acc, readonly=True) as dba:
            assert dba.count() == n1
    with pytest.raises(ValueError, match="gzipped"):
        campaign.run(out, tmp_path / "r6", allow_no_gpu=True, db_path=tmp_path / "x.db.gz",
                     log=lambda *a: None)


def test_sweeps_and_throughput_table():
    assert campaign._sweep({"sweeps": [[[64, 64, 64], [{"swizzle": 8}, {"swizzle": 1}]]]},
                           (64, 64, 64)) == [{"swizzle": 8}, {"swizzle": 1}]
    assert campaign._sweep({"sweeps": [[[64, 64, 64], [{}]]]}, (128, 64, 64)) == [{}]
    t = campaign.Throughput()
    t.add("screen", "<1e9", 30, 1.5)
    t.add("final", "<1e9", 2, 3.0)
    tab = t.table()
    assert tab["screen <1e9"]["per_gpu_minute"] == pytest.approx(1200.0)
    assert tab["final all"]["per_gpu_minute"] == pytest.approx(40.0)
    assert any("per GPU-minute" in line for line in t.lines())


def test_the_call_account_sums_to_the_wall_time(tmp_path):
    """Phases before the campaign (a script's JSON), the campaign's steps and the finals' measure
    phases, with the rest named: they sum to the call's wall time."""
    from cudal2.runs.account import HANDOVER, UNATTRIBUTED, Account
    f = tmp_path / "call.json"
    f.write_text('{"start": 1000.0, "phases": {"canary": 2.0, "tests": 30.0}}')
    a = Account.from_file(f)
    a.add("screening", 10.0)
    a.add_finals(20.0, {"offline": 9.0, "correctness": 4.0})
    t = a.table(now=1070.0)
    assert t["wall_s"] == 70.0
    assert t["phases"][HANDOVER] == 7.0 and t["phases"]["tests"] == 30.0
    assert t["phases"][UNATTRIBUTED] == pytest.approx(8.0)
    assert sum(t["phases"].values()) == pytest.approx(t["wall_s"])
    assert "unattributed" in a.line(now=1070.0)
    f.write_text("{}")
    with pytest.raises(ValueError, match="not a call account"):
        Account.from_file(f)


def test_prepare_adds_the_tuned_tables_kernels_first(tmp_path, monkeypatch):
    """The tuned rows of the kernel table join the pack with their shapes, timed first, so a
    campaign re-measures what dispatch serves."""
    from cudal2.core.store import KernelIndex
    from cudal2.templates import FAMILIES, instantiate
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "gk"
    idx = KernelIndex(root)
    src = instantiate(FAMILIES["mma"].config(BM=64, BN=64, WM=32, WN=32))
    idx.add(src, arch="sm_90a", acc="f32", layout="RR", M=128, N=64, K=64, family="mma", tuned=True,
            mode="offline", report="synthetic", speedups={"torch": 1.1}, audit=AUDIT_VERSION)
    idx.write()
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n64,64,64\n")
    m = campaign.prepare(shapes, "sm_90a", tmp_path / "pack", families=["mma"], limit_per_shape=1,
                         jobs=2, kernels_root=root, log=lambda *a: None)
    assert m["tuned_shapes"] == [[128, 64, 64]] and m["shapes"][0] == [128, 64, 64]
    tuned = [c for c in m["candidates"] if [128, 64, 64] in c["shapes"]]
    assert tuned and any(campaign._sweep(c, (128, 64, 64)) == [{}] for c in tuned)
    order = campaign._per_shape(m, __import__("cudal2.search.costmodel", fromlist=["CostModel"]).CostModel.default())
    assert order[0][0] == (128, 64, 64)


def test_a_priority_pack_runs_its_shapes_in_file_order(tmp_path):
    """run_order "file" (the verdict call's ranked lists) takes the shapes as listed, so a budget
    cut drops the least important; "buckets" (the default) takes one of each size bucket in turn,
    and a manifest from before the field reads as buckets."""
    from cudal2.search.costmodel import CostModel
    shapes = [[64, 64, 64], [128, 64, 12288], [4096, 4096, 4096], [128, 128, 2048], [8192, 8192, 8192]]
    cands = [{"sha": "a", "family": "mma", "params": [], "resources": {}, "shapes": shapes, "sweeps": []}]
    m = {"shapes": shapes, "tuned_shapes": [], "candidates": cands}
    model = CostModel.default()
    assert [s for s, _ in campaign._per_shape(dict(m, run_order="file"), model)] == list(map(tuple, shapes))
    buckets = [s for s, _ in campaign._per_shape(m, model)]
    assert buckets[:3] == [(64, 64, 64), (4096, 4096, 4096), (8192, 8192, 8192)]
    assert buckets == [s for s, _ in campaign._per_shape(dict(m, run_order="buckets"), model)]
    with pytest.raises(ValueError, match="--run-order 'size'"):
        (tmp_path / "s.csv").write_text("M,N,K\n64,64,64\n")
        campaign.prepare(tmp_path / "s.csv", "sm_90a", tmp_path / "pack", run_order="size")


# What the GPU image lacks (it has torch, numpy, pandas, matplotlib; pandas is blocked too, as
# docs/tuning.md promises the run half does without it).
_GPU_IMAGE_BLOCKER = '''
import sys
BLOCKED = {"trl", "ray", "cutlass_library", "cutlass", "transformers", "peft", "psutil", "scipy",
           "tokenizers", "datasets", "accelerate", "pandas"}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in the GPU image)")
sys.meta_path.insert(0, _Block())
# A probe (importlib.util.find_spec, as torch._dynamo does at import) sees "not installed".
import importlib.util
_find_spec = importlib.util.find_spec
def _probe(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _find_spec(name, package)
importlib.util.find_spec = _probe
'''


def test_run_needs_only_the_gpu_images_packages(pack, tmp_path):
    """`campaign check` and `campaign run --allow-no-gpu` in a fresh interpreter (and its
    workers) where trl, ray, CUTLASS, transformers, psutil, scipy and pandas cannot be imported."""
    import os
    import subprocess
    import sys
    import torch
    if torch.cuda.is_available():
        pytest.skip("the no-GPU plumbing run")
    out, _, _, _ = pack
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_GPU_IMAGE_BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    probe = subprocess.run([sys.executable, "-c", "import trl"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked" in probe.stderr           # the blocker is active
    for args in (["check", str(out)],
                 ["run", str(out), "--allow-no-gpu", "--budget-s", "120", "--out", str(tmp_path / "rep"),
                  "--kernels-out", str(tmp_path / "gk")]):
        r = subprocess.run([sys.executable, "-m", "cudal2", "campaign", *args], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "blocked" not in r.stdout + r.stderr
    (d,) = list((tmp_path / "rep" / "no-gpu").iterdir())
    assert (d / "results.db").is_file() and (d / "summary.json").is_file()


def test_run_without_a_toolchain(pack, tmp_path, monkeypatch):
    """The GPU image may have no nvcc: the run half must not need it (the audit's include check
    ran at prepare time and the manifest says so)."""
    import torch
    import cudal2.core.toolchain as tc
    if torch.cuda.is_available():
        pytest.skip("the no-GPU plumbing run")

    def no_nvcc(*a, **k):
        raise RuntimeError("no nvcc on this machine (simulated GPU image)")
    import cudal2.harness.provenance as prov
    import cudal2.search.tune as tune
    for mod in (tc, campaign, prov, tune):    # every module that calls it by name
        monkeypatch.setattr(mod, "find_toolchain", no_nvcc)
    out, m, _, _ = pack
    summary = campaign.run(out, tmp_path / "rep", budget_s=60, allow_no_gpu=True,
                           kernels_root=tmp_path / "gk", log=lambda *a: None)
    assert {k.split()[-1] for k in summary["statuses"]} == {"not_measured"}


def test_run_spreads_shapes_over_every_gpu_lane(pack, tmp_path, monkeypatch):
    """Two fake GPUs (devices=["0", "1"], no GPU here): one lane each, its worker pools pinned
    with CUDA_VISIBLE_DEVICES, the shapes shared between them, every row stored by this
    process's one writer."""
    import threading
    import time as _t
    out, _, _, _ = pack
    seen = []
    real = campaign._LocalLane.run

    def slow_run(self, shape, entrants, policy, deadline=None):   # a GPU's time: the other lane takes the next shape
        seen.append((self.name, self.screen_pool._env.get("CUDA_VISIBLE_DEVICES"),
                     self.final_pool._env.get("CUDA_VISIBLE_DEVICES"), threading.get_ident()))
        _t.sleep(0.5)
        return real(self, shape, entrants, policy, deadline)
    monkeypatch.setattr(campaign._LocalLane, "run", slow_run)
    summary = campaign.run(out, tmp_path / "rep", budget_s=120, allow_no_gpu=True,
                           devices=["0", "1"], log=lambda *a: None)
    assert summary["shapes_done"] == 2 and summary["lanes"] == {"GPU 0": 1, "GPU 1": 1}
    assert sorted((n, s, f) for n, s, f, _ in seen) == [("GPU 0", "0", "0"), ("GPU 1", "1", "1")]
    assert len({t for *_, t in seen}) == 2
    from cudal2.harness.db import ResultsDB
    (d,) = list((tmp_path / "rep" / "no-gpu").iterdir())
    with ResultsDB(d / "results.db") as db:
        assert {e.shape for e in db.rows()} == {campaign.Shape(64, 64, 64), campaign.Shape(256, 128, 512)}


def test_run_on_a_local_ray_cluster(pack, tmp_path):
    """--executor ray on a local two-CPU cluster: one actor per CPU (no GPU here) runs whole
    tournaments, the driver records their rows (the one writer)."""
    pytest.importorskip("ray")
    out, _, _, _ = pack
    summary = campaign.run(out, tmp_path / "rep", budget_s=120, allow_no_gpu=True, executor="ray",
                           address=None, ray_cpus=2, log=lambda *a: None)
    assert summary["shapes_done"] == 2 and sum(summary["lanes"].values()) == 2
    assert all(k.startswith("ray actor") for k in summary["lanes"])
    assert {k.split()[-1] for k in summary["statuses"]} == {"not_measured"}
    from cudal2.harness.db import ResultsDB
    (d,) = list((tmp_path / "rep" / "no-gpu").iterdir())
    with ResultsDB(d / "results.db") as db:
        rows = db.rows()
    assert {e.stage for e in rows} == {"screen", "final"}
    assert {e.shape for e in rows} == {campaign.Shape(64, 64, 64), campaign.Shape(256, 128, 512)}


def test_a_model_shapes_file_packs_rc_builds(pack, tmp_path):
    """`cudal2 shapes --model` rows say RC: prepare plans RC builds for them without --layout
    (the build cache of the module's pack is reused: the baselines are not built again)."""
    from cudal2.runs import shapes as S
    from cudal2.search.tune import shapes_layout
    _, _, _, root = pack
    model = S.Model("tiny", hidden=64, heads=2, kv_heads=1, head_dim=32, layers=2,
                    intermediate=64, vocab=128)
    csv_path = S.write_rows(S.model_rows(model, [64]), tmp_path / "tiny.csv")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDAL2_CACHE", str(root / "cache"))
    try:
        m = campaign.prepare(csv_path, "sm_90a", tmp_path / "pack", families=["mma"],
                             limit_per_shape=1, jobs=2, include_tuned=False, log=lambda *a: None)
    finally:
        mp.undo()
    # qkv and lm_head are 64x128x64, o and down 64x64x64 (gate_up: 64x128x64 too)
    assert m["layout"] == "RC" and m["shapes"] == [[64, 128, 64], [64, 64, 64]]
    assert m["candidates"]
    for c in m["candidates"]:       # the packed source is built for B column-major
        src = campaign.read_source(tmp_path / "pack" / c["dir"])
        assert dict(c["params"])["LAYOUT"] == "RC" and "#define LAYOUT_RC 1" in src
    with pytest.raises(ValueError, match="layout RC"):
        shapes_layout(csv_path, "RR")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("M,N,K,layout\n64,64,64,RC\n64,64,64,RR\n")
    with pytest.raises(ValueError, match="one layout per file"):
        shapes_layout(mixed)
    assert shapes_layout(tmp_path / "tiny.csv") == "RC"


def test_run_on_the_fake_device_accounts_for_the_whole_call(pack, tmp_path, monkeypatch):
    """The fake device (a CPU rehearsal): every step runs as on a GPU, the by-phase account sums
    to the call's wall time with little unattributed, the live folder holds a DB that opens and
    the summary after every shape, and nothing it made is exported or counted as measured."""
    import json
    from cudal2.harness import provenance
    from cudal2.harness.db import ResultsDB
    from cudal2.harness.types import unmeasured
    out, _, _, _ = pack
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.05")
    provenance.gpu_visible.cache_clear()
    provenance.gpu_name.cache_clear()
    try:
        summary = campaign.run([out], tmp_path / "rep", budget_s=300, live_dir=tmp_path / "live",
                               kernels_root=tmp_path / "gk", finals_per_shape=1, log=lambda *a: None)
    finally:
        monkeypatch.delenv("CUDAL2_FAKE_DEVICE")
        provenance.gpu_visible.cache_clear()
        provenance.gpu_name.cache_clear()
    assert summary["complete"] and summary["shapes_done"] == 2
    assert summary["statuses"].get("ok", 0) >= 2 and summary["exported"] == 0
    # one finals worker start for both shapes' sessions (kept while every candidate is ok), and
    # one for the ceilings, which keep no worker (issue 66 point 7; it was a start per session)
    assert summary["finals_workers"] == {"sessions": 2, "started": 2}
    call = summary["call"]
    assert sum(call["phases"].values()) == pytest.approx(call["wall_s"], rel=0.01)
    assert {"audit", "screening", "offline", "correctness", "finals hand-over", "DB",
            "bandwidth"} <= set(call["phases"])
    # 64x64x64 is a decode row (M <= 64): the streaming ceiling, once, answered by the fake device
    bw = summary["bandwidth"]
    assert bw["status"] == "ok" and bw["fake_device"] and bw["decode_rows"] == 1
    assert bw["ci"][0] < bw["gbs"] < bw["ci"][1] and bw["bytes"] >= 1 << 30 and bw["method"]
    assert call["phases"]["DB"] > 0
    assert call["unattributed_fraction"] < 0.10
    live = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert live["complete"] and live["shapes_done"] == 2
    with ResultsDB(tmp_path / "live" / "results.db.gz", readonly=True) as db:
        finals = [ev for ev in db.rows() if ev.stage == "final"]
    assert finals and all(unmeasured(ev, "offline").startswith("fake device") for ev in finals)
    assert not (tmp_path / "gk" / "index.csv").exists()
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["results.db.gz", "summary.json"]


def test_largest_shapes_screen_only_the_best_options():
    class Model:
        def predict_us(self, meta, resources, shape, options=None):
            return (options or {}).get("x", 0)
    c = {"family": "cutlass_sm90", "params": [], "resources": {},
         "sweeps": [[[8192, 8192, 8192], [{"x": 3}, {"x": 1}, {"x": 2}]], [[64, 64, 64], [{"x": 3}, {"x": 1}, {"x": 2}]]]}
    assert campaign._screened_options(c, (8192, 8192, 8192), Model()) == [{"x": 1}, {"x": 2}]
    assert len(campaign._screened_options(c, (64, 64, 64), Model())) == 3


def test_a_tournament_that_raises_costs_its_shape_not_the_run(pack, tmp_path, monkeypatch):
    out, _, _, _ = pack
    real = campaign._LocalLane.run

    def flaky(self, shape, entrants, policy, deadline=None):
        if shape.M == 64:
            raise RuntimeError("a harness bug")
        return real(self, shape, entrants, policy, deadline)
    monkeypatch.setattr(campaign._LocalLane, "run", flaky)
    lines = []
    summary = campaign.run(out, tmp_path / "rep", budget_s=120, allow_no_gpu=True, log=lines.append)
    assert summary["complete"] and summary["statuses"]["shape error"] == 1
    assert summary["shapes_done"] == 1 and any("a harness bug" in ln for ln in lines)


def test_a_phase_after_the_campaign_joins_the_call_account(tmp_path):
    """run.sh's profile stage runs after the campaign wrote summary.json: `account extend` adds
    its phase and moves the wall time on, the phases and unattributed still summing to it; a
    summary without a call account is left as it is."""
    from cudal2.runs import account
    call = account.Account(start=1000.0, before={"canary": 10.0, "screening": 50.0}).table(now=1100.0)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"shapes_done": 3, "call": call}))
    assert account.main(["extend", str(path), "profile", "30", "--start", "1000"]) == 0
    got = json.loads(path.read_text())
    assert got["shapes_done"] == 3 and got["call"]["phases"]["profile"] == 30.0
    assert got["call"]["phases"]["canary"] == 10.0 and got["call"]["wall_s"] > 1000
    assert sum(got["call"]["phases"].values()) == pytest.approx(got["call"]["wall_s"], rel=1e-3)
    path.write_text(json.dumps({"shapes_done": 0}))
    assert account.main(["extend", str(path), "profile", "30", "--start", "1000"]) == 0
    assert json.loads(path.read_text()) == {"shapes_done": 0}
