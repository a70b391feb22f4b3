"""The GPU session kit (tools/gpu_session/) on a CPU machine: prefill lists the GPU tests'
kernels, run.sh runs stages without a GPU (--allow-no-gpu) and leaves only what the device tool
returns (<= 8 files in $OUT, each <= 16 MiB, plain names, <= 2 folders deep), collect.sh files
the result under reports/<gpu>/<date>-<stage>/."""
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / "tools" / "gpu_session"


def _sh(args, env=None, timeout=300):
    e = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", *map(str, args)], cwd=REPO, env=e, capture_output=True, text=True,
                           timeout=timeout)


def _device_tool_limits(out: Path):
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) <= 3, rel                         # $OUT/a/b/file at most
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
        assert p.stat().st_size <= 16 << 20, (rel, p.stat().st_size)
    assert sum(p.stat().st_size for p in files) <= 64 << 20


def test_prefill_lists_the_gpu_tests_kernels():
    r = subprocess.run([sys.executable, str(KIT / "prefill.py"), "--list"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    names = {l.split(None, 1)[1] for l in lines}
    assert {"good_naive", "control_ok", "kernel_spins", "kernel_illegal_address",
            "baseline-cublas", "baseline-cublaslt"} <= names
    assert any(l.startswith("test_templates") and "cutlass_sm90" in l for l in lines)
    # the split-K GPU case (builds are named by KernelConfig.name(): ..._k<SPLITK>)
    assert any(l.startswith("test_templates") and l.split()[-1].endswith("_k3") for l in lines)
    assert "include_escape" not in names                         # rejected before nvcc anywhere
    # the GPU tiers of the newer families: skinny and its mirror, lowlat, the split-K builds
    assert {"skinny_n_sm80_f32_rc_16x128x64_w16x32_s4", "skinny_sm80_f32_rc_16x128x64_w16x32_s4",
            "lowlat_sm90a_f32_rr_64x128x64_s3_c1x1"} <= names
    assert any(l.startswith("test_splitk") for l in lines)


def test_run_sh_refuses_without_a_stage_or_gpu(tmp_path):
    r = _sh([KIT / "run.sh"], env={"OUT": str(tmp_path)})
    assert r.returncode == 2 and "name at least one stage" in r.stderr
    r = _sh([KIT / "run.sh", "nosuch"], env={"OUT": str(tmp_path)})
    assert r.returncode == 2 and "unknown stage" in r.stderr
    import torch
    if not torch.cuda.is_available():
        r = _sh([KIT / "run.sh", "tests"], env={"OUT": str(tmp_path / "o")})
        assert r.returncode == 3 and "--allow-no-gpu" in r.stderr + r.stdout


def test_run_and_collect_without_gpu(tmp_path):
    out, work, reports = tmp_path / "out", tmp_path / "work", tmp_path / "reports"
    r = _sh([KIT / "run.sh", "--allow-no-gpu", "overhead", "campaign"],
            env={"OUT": str(out), "GPU_SESSION_WORK": str(work),
                 "GPU_SESSION_PACK": str(tmp_path / "no-pack")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _device_tool_limits(out)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["campaign.tar.gz", "overhead.tar.gz", "provenance.txt", "session.log"]
    prov = (out / "provenance.txt").read_text()
    for field in ("date_utc:", "git_commit:", "torch:", "nvcc:", "command:"):
        assert field in prov
    with tarfile.open(out / "overhead.tar.gz") as t:
        members = t.getnames()
    assert "overhead/overhead_kernel_path.json" in members and "overhead/provenance.txt" in members
    assert not any(m.startswith("overhead/kernels") for m in members)   # the fixture table stays behind
    with tarfile.open(out / "campaign.tar.gz") as t:
        log = t.extractfile("campaign/log.txt").read().decode()
    assert "carry the pack" in log

    r = _sh([KIT / "collect.sh", out, "--reports", reports, "--no-export"])
    assert r.returncode == 0, r.stdout + r.stderr
    (gpu_dir,) = reports.iterdir()
    runs = sorted(p.name for p in gpu_dir.iterdir())
    assert len(runs) == 2 and runs[1].endswith("-overhead") and re.match(r"\d{4}-\d\d-\d\d-", runs[1])
    d = gpu_dir / runs[1]
    assert (d / "provenance.txt").exists() and (d / "overhead_kernel_path.json").exists()
    assert (d / "rc").read_text().strip() == "0"


def _small_pack(tmp_path, shapes: list[str], per_shape: int) -> Path:
    """prepare.sh's pack alone (mma candidates) for these "M,N,K" shapes; skips without nvcc."""
    try:
        from cudal2.core.toolchain import find_toolchain
        find_toolchain()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no CUDA toolchain: {exc}")
    csv_file = tmp_path / "shapes.csv"
    csv_file.write_text("M,N,K\n" + "\n".join(shapes) + "\n")
    root = tmp_path / "root"
    r = _sh([KIT / "prepare.sh", "--root", root, "--shapes", csv_file, "--no-wheels",
             "--no-prefill", "--families", "mma", "--limit-per-shape", str(per_shape)],
            timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "total" in r.stdout and "carry:" in r.stdout
    return root / ".gpu_campaign"


@pytest.mark.compile
def test_campaign_stage_on_a_small_pack(tmp_path):
    """prepare.sh (campaign only, two shapes, one candidate each) -> run.sh campaign without a
    GPU (plumbing: rows not_measured) -> collect.sh remakes its reports."""
    pack = _small_pack(tmp_path, ["128,128,128", "256,512,128"], per_shape=1)
    out = tmp_path / "out"
    r = _sh([KIT / "run.sh", "--allow-no-gpu", "campaign"],
            env={"OUT": str(out), "GPU_SESSION_WORK": str(tmp_path / "work"), "GPU_SESSION_PACK": str(pack),
                 "BUDGET_CAMPAIGN": "200"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _device_tool_limits(out)
    r = _sh([KIT / "collect.sh", out, "--reports", tmp_path / "reports", "--no-export"],
            env={"GPU_SESSION_PACK": str(pack)})
    assert r.returncode == 0, r.stdout + r.stderr
    dbs = list((tmp_path / "reports").rglob("results.db.gz"))
    assert len(dbs) == 1 and (dbs[0].parent / "summary.json").exists()


@pytest.mark.compile
def test_the_verdict_call_rehearsed_with_the_fake_device(tmp_path):
    """rehearse.sh on a small pack and a small RL queue: the whole verdict call (canary, the GPU
    test groups due, the queue's stage, the campaign) on the fake device under a scaled deadline:
    at most 8 files come back, the deadline is kept, the summary is complete with its by-phase
    account, the queued sources have rows in results.db; the call killed at a random point
    leaves a DB that opens and a summary that parses."""
    from cudal2.core.identity import source_sha
    from cudal2.templates import FAMILIES, enumerate_space, instantiate
    pack = _small_pack(tmp_path, ["128,128,128", "256,512,128", "64,64,64"], per_shape=2)
    # the queue (rl/table.py's Queue format): one mma instantiation the pack lacks, at two shapes
    src = instantiate(next(c for c in enumerate_space(FAMILIES["mma"], arch="sm_90a")
                           if dict(c.params)["SPLITK"] == 1))
    sha = source_sha(src)
    (tmp_path / "q" / "sources").mkdir(parents=True)
    (tmp_path / "q" / "sources" / f"{sha}.cu").write_text(src)
    (tmp_path / "q" / "queue.jsonl").write_text("".join(json.dumps(
        {"binary_key": "k", "M": M, "N": N, "K": K, "count": 1, "source_sha": sha,
         "source_file": f"sources/{sha}.cu"}) + "\n" for M, N, K in [(256, 256, 256), (96, 64, 128)]))
    r = _sh([KIT / "rehearse.sh", "--pack", pack, "--queue", tmp_path / "q" / "queue.jsonl",
             "--scale", "0.1", "--work", tmp_path / "w"],
            env={"GPU_SESSION_CACHE": str(pack.parent / ".gpu_cache")}, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "rehearse: passed" in r.stdout and "rows of the 1 queued sources" in r.stdout
    assert "the carry is as it was" in r.stdout
    # its floors stretched by this machine's measured slowdown; the full call's DB projected
    assert re.search(r"runs CPU work [\d.]+x slower", r.stdout)
    assert re.search(r"results.db.gz projected for a full call: [\d.]+ MiB", r.stdout)
    assert "== plan of the" in (tmp_path / "w" / "out" / "session.log").read_text()
    summary = json.loads(next((tmp_path / "w" / "out").glob("summary.json")).read_text())
    call = summary["call"]
    assert {"canary", "tests", "RL queue", "screening", "audit", "bandwidth", "profile"} <= set(call["phases"])
    assert summary["ceilings"]["status"] == "ok" and summary["ceilings"]["stream_read"]
    names = sorted(p.name for p in (tmp_path / "w" / "out").iterdir())
    assert names == ["campaign.tar.gz", "profile.csv", "provenance.txt", "results.db.gz", "session.log",
                     "summary.json", "tests.tar.gz"]
    from cudal2.harness import ncu
    prof = ncu.read_csv(tmp_path / "w" / "out" / "profile.csv")
    assert {r["who"] for r in prof if r["status"] == "ok"} == {"ours", "baseline"}
    assert call["unattributed_fraction"] <= 0.10, call
    _device_tool_limits(tmp_path / "w" / "out")
    # collect.sh files the call under reports/<gpu>/<date>-verdict/ (its DB gzipped)
    r = _sh([KIT / "collect.sh", tmp_path / "w" / "out", "--reports", tmp_path / "reports", "--no-export"])
    assert r.returncode == 0, r.stdout + r.stderr
    (d,) = (tmp_path / "reports").glob("*/*-verdict")
    assert (d / "results.db.gz").is_file() and (d / "summary.json").is_file() and (d / "profile.csv").is_file()
    assert (d / "provenance.txt").is_file() and list((d / "campaign").rglob("export.txt"))


def test_the_carried_build_cache_travels_gzipped_and_is_restored_on_the_machine(tmp_path):
    """prepare.sh gzips the carried cache's build entries (what fits 64 MiB depends on it) and
    run.sh restores them byte for byte before any stage; a second prepare.sh first restores them
    (its prefill reads the cache) and gzips them again."""
    entry = tmp_path / ".gpu_cache" / "builds" / "ab" / ("ab" + "0" * 62)
    entry.mkdir(parents=True)
    files = {"kernel.ptx": b".version 8.0\n" * 5000, "build.json": b'{"status": "ok"}',
             "kernel.so": os.urandom(4096)}
    for name, data in files.items():
        (entry / name).write_bytes(data)
    args = [KIT / "prepare.sh", "--root", tmp_path, "--no-prefill", "--no-campaign", "--no-wheels"]
    for _ in range(2):
        r = _sh(args)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert sorted(p.name for p in entry.iterdir()) == sorted(f"{n}.carry.gz" for n in files)
    assert (entry / "kernel.ptx.carry.gz").stat().st_size < len(files["kernel.ptx"]) // 10
    r = _sh([KIT / "run.sh", "--allow-no-gpu", "campaign"],       # any stage: restored first
            env={"OUT": str(tmp_path / "out"), "GPU_SESSION_CACHE": str(tmp_path / ".gpu_cache"),
                 "GPU_SESSION_PACK": str(tmp_path / "no-pack")})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == files


def test_the_test_groups_due_are_derived_from_committed_records(tmp_path):
    """families.py: a group is due until a committed family_inputs.json holds its current inputs
    as passed; a failing test keeps the families it names (else its group's) out of timing."""
    sys.path.insert(0, str(KIT))
    try:
        import families
    finally:
        sys.path.remove(str(KIT))
    reports = tmp_path / "reports"
    assert families.due(reports) == list(families.GROUPS)          # nothing recorded: all due
    junit = tmp_path / "junit"
    junit.mkdir()
    (junit / "skinny.xml").write_text(
        '<testsuites><testsuite tests="2" failures="0" errors="0" skipped="0">'
        '<testcase classname="tests.test_skinny" name="test_matches_torch[skinny-BK=64]"/>'
        '<testcase classname="tests.test_skinny" name="test_matches_torch[skinny_n-BK=64]"/>'
        '</testsuite></testsuites>')
    (junit / "templates.xml").write_text(
        '<testsuites><testsuite tests="2" failures="1" errors="0" skipped="0">'
        '<testcase classname="tests.test_templates" name="test_kernels_match_torch[mma-f32-RR]"/>'
        '<testcase classname="tests.test_templates" name="test_cutlass_runtime_options_match_torch[128x256]">'
        '<failure message="x"/></testcase></testsuite></testsuites>')
    rec = families.record(junit)
    assert rec["groups"]["skinny"]["result"] == "passed" and rec["groups"]["templates"]["result"] == "failed"
    (reports / "GPU" / "run").mkdir(parents=True)
    (reports / "GPU" / "run" / families.RECORD).write_text(json.dumps(rec))
    assert "skinny" not in families.due(reports) and "templates" in families.due(reports)
    assert families.excluded(junit) == ["cutlass_sm90"]


def _families():
    sys.path.insert(0, str(KIT))
    try:
        import families
    finally:
        sys.path.remove(str(KIT))
    return families


# A GPU test group of its own for families.py: ten tests of SLOW_S seconds each (test_sleep[FAIL]
# fails when FAIL is set), run by run.sh's verdict command line under a loader of the repo
# conftest's pytest_collection_finish (the hook that writes CUDAL2_COLLECTED_FILE)
_SLOW_TESTS = '''
import os, time, pytest
@pytest.mark.gpu
@pytest.mark.parametrize("i", range(10))
def test_sleep(i):
    time.sleep(float(os.environ.get("SLOW_S", "1")))
    assert str(i) != os.environ.get("FAIL")
def test_not_gpu():
    pass
'''
_HOOK_LOADER = f'''
import importlib.util
_spec = importlib.util.spec_from_file_location("_repo_conftest", {str(REPO / "tests" / "conftest.py")!r})
_repo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_repo)
pytest_collection_finish = _repo.pytest_collection_finish
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: a GPU test")
'''


@pytest.fixture
def slow_group(tmp_path, monkeypatch):
    """families.py pointed at tmp_path as its repo, with one group "slow"; run(tdir, ...) runs
    its GPU tests as run.sh's verdict loop does and returns pytest's rc."""
    families = _families()
    (tmp_path / "test_slow_gpu.py").write_text(_SLOW_TESTS)
    (tmp_path / "conftest.py").write_text(_HOOK_LOADER)
    monkeypatch.setattr(families, "REPO", tmp_path)
    monkeypatch.setattr(families, "GROUPS", {"slow": {"families": ["slow"], "test": "test_slow_gpu.py",
                                                      "exclude": ["slow"], "inputs": []}})

    def run(tdir: Path, stop_s=None, deselect=(), **env):
        tdir.mkdir(exist_ok=True)
        (tdir / "slow.deselected").write_text("".join(f"{i}\n" for i in deselect))
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               "-o", "junit_family=xunit2", f"--junitxml={tdir / 'slow.xml'}",
               *[a for i in deselect for a in ("--deselect", i)], "test_slow_gpu.py"]
        if stop_s:
            cmd = ["timeout", "-s", "INT", str(stop_s), *cmd]
        e = dict(os.environ, CUDAL2_COLLECTED_FILE=str(tdir / "slow.collected"), **{"SLOW_S": "0", **env})
        return subprocess.run(cmd, cwd=tmp_path, env=e, capture_output=True, text=True, timeout=60).returncode
    return families, run


def _commit(families, junit: Path, reports: Path, name: str) -> dict:
    """families.py record of a call's junit dir, filed as a committed record under reports/."""
    rec = families.record(junit)
    (reports / "GPU" / name).mkdir(parents=True)
    (reports / "GPU" / name / families.RECORD).write_text(json.dumps(rec))
    return rec["groups"]["slow"]


def test_a_group_stopped_at_its_share_is_partial_and_its_rest_runs_next(slow_group, tmp_path):
    """Issue 66 point 3: a group stopped at its share (SIGINT; pytest's junit then holds only
    the tests that ran, failures=0, and an unnamed testcase) is recorded partial with the ids
    that passed, stays due, and the next call deselects those (done) and runs the rest: that
    record says passed, with earlier_partial, and the group is no longer due."""
    families, run = slow_group
    reports, ids = tmp_path / "reports", [f"test_slow_gpu.py::test_sleep[{i}]" for i in range(10)]
    assert run(tmp_path / "call1", stop_s=4, SLOW_S="1") == 124
    assert (tmp_path / "call1" / "slow.collected").read_text().split() == ids   # not test_not_gpu
    assert families.junit_result(tmp_path / "call1" / "slow.xml") == "partial"  # the junit alone
    rec = _commit(families, tmp_path / "call1", reports, "call1")
    k = len(rec["ran"])
    assert rec["result"] == "partial" and 1 <= k <= 4 and rec["ran"] == ids[:k] and rec["not_run"] == 10 - k
    assert "partial" in families.say(rec)
    assert families.due(reports) == ["slow"] and families.done("slow", reports) == ids[:k]

    assert run(tmp_path / "call2", deselect=families.done("slow", reports)) == 0
    assert (tmp_path / "call2" / "slow.collected").read_text().split() == ids[k:]
    rec = _commit(families, tmp_path / "call2", reports, "call2")
    assert rec == {"families": ["slow"], "inputs_sha": families.inputs_sha("slow"),
                   "result": "passed", "earlier_partial": k}
    assert families.due(reports) == []
    # other inputs: the partial's ids are done no more
    (tmp_path / "test_slow_gpu.py").write_text(_SLOW_TESTS + "\n")
    assert families.done("slow", reports) == [] and families.due(reports) == ["slow"]


def test_a_failure_or_an_interrupted_run_without_ids_is_never_passed(slow_group, tmp_path):
    """A failing test makes the group failed, partial run before or not; an interrupted junit
    with no .collected beside it (an older run.sh) is partial, not passed; a bare node id is
    never done (--deselect matches prefixes)."""
    families, run = slow_group
    assert run(tmp_path / "call1", FAIL="6") == 1
    assert families.record(tmp_path / "call1")["groups"]["slow"]["result"] == "failed"
    assert run(tmp_path / "call2", deselect=["test_slow_gpu.py::test_sleep[0]"], FAIL="6") == 1
    assert families.record(tmp_path / "call2")["groups"]["slow"]["result"] == "failed"
    old = tmp_path / "old"
    old.mkdir()
    (old / "slow.xml").write_text(
        '<testsuites><testsuite tests="2" failures="0" errors="0" skipped="0">'
        '<testcase classname="test_slow_gpu" name="test_sleep[0]"/><testcase time="0.000" />'
        '</testsuite></testsuites>')
    assert families.record(old)["groups"]["slow"] == {
        "families": ["slow"], "inputs_sha": families.inputs_sha("slow"), "result": "partial",
        "ran": [], "not_run": None}
    (tmp_path / "reports" / "GPU" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "GPU" / "r" / families.RECORD).write_text(json.dumps({"groups": {"slow": {
        "inputs_sha": families.inputs_sha("slow"), "result": "partial", "not_run": 1,
        "ran": ["test_slow_gpu.py::test_not", "test_slow_gpu.py::test_sleep[2]"]}}}))
    assert families.done("slow", tmp_path / "reports") == ["test_slow_gpu.py::test_sleep[2]"]


def test_each_group_shares_the_tests_time_by_its_gpu_tests(slow_group, tmp_path):
    """share: a group's part of the time left by its GPU tests among the groups left, at least
    15 s; equal without counts; a group the counts lack weighs their mean; order: largest
    first. count: one pytest --collect-only's GPU tests per group, less those done."""
    families, _ = slow_group
    c = {"a": 30, "b": 10, "c": 10}
    assert families.share(150, ["a", "b", "c"], c) == 90
    assert families.share(60, ["b", "c"], c) == 30
    assert families.share(100, ["c", "a"], c) == 25
    assert families.share(100, ["c", "a"], {"a": 99, "c": 1}) == families.SHARE_FLOOR_S == 15
    assert families.share(90, ["a", "b", "c"], None) == 30
    assert families.share(100, ["a", "new"], {"a": 30, "b": 10}) == 50
    assert families.share(40, ["a", "b"], {"a": 0, "b": 0}) == 20
    assert families.order(["b", "c", "a", "new"], c) == ["a", "new", "b", "c"]
    assert families.order(["b", "a"], None) == ["b", "a"]
    counts = tmp_path / "gpu_tests.json"
    counts.write_text(json.dumps({"templates": 37, "lowlat": 26, "gemv": 6}))
    r = subprocess.run([sys.executable, str(KIT / "families.py"), "share", "--counts", str(counts),
                        "138", "lowlat", "gemv", "templates"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "52", r.stderr
    r = subprocess.run([sys.executable, str(KIT / "families.py"), "order", "--counts", str(counts),
                        "gemv", "harness", "lowlat"], capture_output=True, text=True)
    assert r.stdout.split() == ["lowlat", "harness", "gemv"], r.stderr
    # count on the CPU: the GPU tests are listed (skip-marked or not), the non-GPU one is not
    assert families.count(["slow"], tmp_path / "reports") == {"slow": 10}
    (tmp_path / "reports" / "GPU" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "GPU" / "r" / families.RECORD).write_text(json.dumps({"groups": {"slow": {
        "inputs_sha": families.inputs_sha("slow"), "result": "partial", "not_run": 7,
        "ran": [f"test_slow_gpu.py::test_sleep[{i}]" for i in range(3)]}}}))
    assert families.count(["slow"], tmp_path / "reports") == {"slow": 7}


def test_the_conftest_hook_writes_exactly_the_selected_ids(tmp_path):
    """tests/conftest.py's pytest_collection_finish, in place: with CUDAL2_COLLECTED_FILE the
    node ids pytest selected (after -m gpu and --deselect), one a line."""
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                             "-p", "no:cacheprovider", "-p", "no:xdist", "tests/test_gemv.py"],
                            cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "CUDAL2_COLLECTED_FILE"})
    ids = [l for l in listed.stdout.splitlines() if "::" in l]
    assert len(ids) >= 2, listed.stdout[-2000:]
    f = tmp_path / "collected"
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                        "-p", "no:cacheprovider", "-p", "no:xdist", "--deselect", ids[0], "tests/test_gemv.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CUDAL2_COLLECTED_FILE=str(f)))
    assert r.returncode == 0, r.stdout[-2000:]
    assert f.read_text() == "".join(f"{i}\n" for i in ids[1:])


def test_the_call_names_its_kind_and_what_each_hopper_would_autotune(tmp_path):
    """kind.py: the call names the H200 (the plan's GPU) and says, per lent kind, how many of the
    packs' rows carry a cuBLASLt choice for that GPU model; a choice made on one model never
    counts for the other, a row without one is said to autotune inside the call."""
    from cudal2.harness.baselines import autotune_key, legacy_autotune_key
    from cudal2.runs import campaign
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    choices = {legacy_autotune_key(h200, 130100, 1, 4096, 4096, "f32", "RC"): {"index": 0},
               autotune_key(h200, 130100, 16, 4096, 4096, "f32", "RC"): {"index": 1},
               legacy_autotune_key(h100, 130100, 64, 64, 64, "f32", "RR"): {"index": 2},
               legacy_autotune_key(h100, 130100, 1, 4096, 4096, "f32", "RR"): {"index": 3}}
    packs = []
    for name, shapes, layout in (("rc", [[1, 4096, 4096], [16, 4096, 4096]], "RC"),
                                 ("rr", [[64, 64, 64], [128, 128, 128]], "RR")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps(
            {"schema": campaign.SCHEMA, "arch": "sm_90a", "acc": "f32", "layout": layout, "shapes": shapes,
             "candidates": [], "baselines": [], "lt_choices": choices}))
        packs.append(tmp_path / name)
    sys.path.insert(0, str(KIT))
    try:
        import kind
    finally:
        sys.path.remove(str(KIT))
    manifests = [campaign.load_manifest(p) for p in packs]
    assert kind.coverage(manifests) == {"nvidia-h200": (2, 4, [130100]),
                                        "nvidia-h100-x1": (1, 4, [130100])}
    text = "\n".join(kind.lines(manifests))
    assert 'kind:      "nvidia-h200"' in text and "never no kind" in text
    assert "nvidia-h100-x1  cuBLASLt choices carried for 1 of 4 rows" in text
    assert "3 autotuned inside the call" in text and "2 autotuned inside the call" in text
