"""The verdict call's profile stage: ncu's raw-page parser on recorded-format output
(tests/data/ncu/: one launch in base units; split-K's two launches in ncu's auto units; counters
refused; no kernel; an unknown metric; the target's own failure), the compact CSV, the shape
order and the budget cut (pure), and tools/gpu_session/profile.py end to end on the fake device
with tools/gpu_session/fake_ncu.py against a tiny real pack and a campaign's DB (compile)."""
import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.harness import ncu
from cudal2.harness.types import Evaluation, Shape

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "ncu"
KIT = REPO / "tools" / "gpu_session"


def _module(name: str):
    """A kit script as a module (its own name: `profile` is also the standard library's)."""
    spec = importlib.util.spec_from_file_location(f"gpu_session_{name}", KIT / f"{name}.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


profile = _module("profile")
fake_ncu = _module("fake_ncu")
BASE = {"M": 4096, "N": 4096, "K": 4096, "layout": "RR", "who": "ours", "name": "abc"}


# ---- the parser ----------------------------------------------------------------------------------

def test_one_launch_in_base_units():
    p = ncu.parse((DATA / "ok_one_launch.txt").read_text())
    assert p.status == "ok" and p.passes == 9 and len(p.launches) == 1
    ln = p.launches[0]
    assert ln.kernel.startswith("void cutlass::device_kernel<") and ln.grid == "132,1,1"
    assert ln.metrics[ncu.DURATION] == 171488 and ln.metrics[ncu.DRAM_BYTES] == 118742016
    (row,) = ncu.rows(BASE, p)
    assert list(row) == list(ncu.COLUMNS)
    assert row["launch"] == 0 and row["status"] == "ok" and row["duration_us"] == "171.488"
    assert row["dram_gbs"] == f"{118742016 / 171488:.1f}" and row["dram_pct_peak"] == "14.35"
    assert row["l2_hit_pct"] == "80.12" and row["achieved_occupancy_pct"] == "11.71"
    assert row["registers"] == "168" and row["smem_bytes"] == "197632"
    assert (row["grid"], row["block"]) == ("132x1x1", "384x1x1")
    assert [row[f"stall_{i}"] for i in (1, 2, 3)] == ["wait:21.4", "long_scoreboard:12.3", "barrier:7.9"]


def test_split_k_two_launches_in_auto_units():
    p = ncu.parse((DATA / "splitk_two_launches.txt").read_text())
    assert p.status == "ok" and [ln.index for ln in p.launches] == [0, 1] and p.passes == 9
    main, fix = ncu.rows(BASE, p)
    assert main["kernel"].startswith("void cudal2_mma_hgemm_splitk") and "fixup" in fix["kernel"]
    assert main["duration_us"] == "24.580" and main["dram_bytes"] == "3410000"     # usecond, Mbyte
    assert main["smem_bytes"] == "32770" and main["grid"] == "8x1x4"               # Kbyte/block
    assert fix["launch"] == 1 and fix["stall_1"] == "long_scoreboard:61.0" and fix["stall_3"] == ""


@pytest.mark.parametrize("name, status, says", [
    ("refused.txt", "counters_refused", "ERR_NVGPUCTRPERM"),
    ("no_kernel.txt", "no_kernel", "no kernel"),
    ("target_error.txt", "error", "profile_target: cublaslt_autotuned: no recorded"),
    ("unknown_metric.txt", "error", "does not know metric smsp__warp_issue_stalled_misc"),
])
def test_each_failure_is_one_status_and_one_line(name, status, says):
    p = ncu.parse((DATA / name).read_text())
    assert p.status == status and says in p.detail and "\n" not in p.detail and not p.launches
    (row,) = ncu.rows(BASE, p)
    assert row["status"] == status and row["launch"] == "" and row["duration_us"] == ""
    if name == "unknown_metric.txt":
        assert p.missing_metric == ncu.stall_metric("misc")


@pytest.mark.parametrize("text", [
    fake_ncu.INIT_FAILED,                   # the line ncu printed under gVisor on an H200
    "==PROF== Connected to process 9137 (/usr/bin/python3.11)\n==ERROR== Unknown Error on device 0."
    "\n==PROF== Disconnected from process 9137",
])
def test_a_profiler_that_cannot_start_answers_for_the_device(text):
    """ncu's own error, the target silent: the device's failure, not the target's (the stage
    stops on it); the target's own failure and ncu's exit-code line stay an error of that target."""
    p = ncu.parse(text)
    assert p.status == "profiler_failed" and p.detail.startswith("ncu: ==ERROR== ")
    assert "\n" not in p.detail and p.status in ncu.DEVICE_STATUSES
    assert ncu.parse((DATA / "target_error.txt").read_text()).status == "error"


def test_ncu_absent_is_said_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("NCU", raising=False)
    cmd, why = profile.find_ncu(str(tmp_path / "no" / "ncu"))
    assert cmd is None and why.startswith("ncu absent:") and "\n" not in why
    monkeypatch.setenv("PATH", str(tmp_path))
    if not Path("/usr/local/cuda/bin/ncu").is_file():
        assert profile.find_ncu(None)[0] is None
    assert profile.find_ncu(str(KIT / "fake_ncu.py"))[0] == [sys.executable, str(KIT / "fake_ncu.py")]


def test_the_command_line_and_the_fake_agree():
    cmd = ncu.command("ncu", ["python", "-m", "x", "--shape", "1x2x3"], log_file="/tmp/l")
    assert cmd[:9] == ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv",
                       "--page", "raw", "--print-units"]
    assert cmd[cmd.index("--metrics") + 1] == ",".join(ncu.METRICS)
    assert cmd[cmd.index("--target-processes") + 1] == "all" and cmd[-5:-3] == ["python", "-m"]
    opts, target = fake_ncu.parse(cmd[1:])          # every option the stage passes, known
    assert target == ["python", "-m", "x", "--shape", "1x2x3"] and opts["--csv"] is True


def test_the_fake_table_is_what_the_parser_reads():
    launches = [{"kernel": "void k<1, 2>(int)", "grid": "4,2,1", "block": "128,1,1", "duration_ns": 12345.6},
                {"kernel": "void fixup(int)", "grid": "64,1,1", "block": "256,1,1", "duration_ns": 999.0}]
    text = "\n".join(["==PROF== Connected to process 1 (python)",
                      *fake_ncu.table(launches, list(ncu.METRICS), 1)])
    p = ncu.parse(text)
    assert p.status == "ok" and [ln.kernel for ln in p.launches] == ["void k<1, 2>(int)", "void fixup(int)"]
    assert p.launches[0].metrics[ncu.DURATION] == 12346 and p.launches[0].grid == "4,2,1"


def test_the_csv_is_written_whole_with_exactly_its_columns(tmp_path):
    out = tmp_path / "p" / "profile.csv"
    ncu.write_csv(out, [ncu.status_row(BASE, "budget", "budget: not reached\nbefore the deadline")])
    with out.open(newline="") as f:
        r = csv.reader(f)
        assert next(r) == list(ncu.COLUMNS)
    (row,) = ncu.read_csv(out)
    assert row["status"] == "budget" and row["detail"] == "budget: not reached before the deadline"
    assert [p.name for p in out.parent.iterdir()] == ["profile.csv"]      # no temporary left
    with pytest.raises(ValueError, match="status"):
        ncu.status_row(BASE, "fine", "")


# ---- what is profiled, in which order, within the budget ----------------------------------------

def _final(shape, sha, cand, status="ok", stage="final", options=None, **bases):
    t = {"candidate": {"median_us": cand}, **{b: {"median_us": v} for b, v in bases.items()}}
    return Evaluation(status=status, source_sha=sha, shape=Shape(*shape), arch="sm_90a", acc="f32",
                      layout="RR", timings={"offline": t}, stage=stage, options=options or {})


def test_shapes_go_worst_first_with_the_best_finalist_and_the_fastest_baseline():
    evs = [_final((64, 64, 64), "a" * 64, 10.0, torch=5.0, cublas_nn=8.0),          # 2.0x slower
           _final((64, 64, 64), "b" * 64, 6.0, torch=5.0, cublas_nn=8.0, options={"splits": 2}),
           _final((64, 64, 64), "c" * 64, 1.0, status="wrong", torch=5.0),           # failed
           _final((64, 64, 64), "d" * 64, 1.0, stage="screen", torch=5.0),           # screening
           _final((128, 128, 128), "e" * 64, 9.0, torch=10.0, cublaslt_autotuned=4.5),  # 2.0x
           _final((256, 256, 256), "f" * 64, 3.0, cublas_tn=6.0, torch_tunableop=1.0)]  # 0.5x
    ps = profile.picks(evs)
    assert [(p.M, p.sha[0], p.baseline) for p in ps] == [
        (128, "e", "cublaslt_autotuned"), (64, "b", "torch"), (256, "f", "cublas_tn")]
    assert ps[1].ratio == pytest.approx(1.2) and ps[1].options == {"splits": 2}
    assert [p.M for p in profile.picks(evs, limit=1)] == [128]
    assert profile.our_name("b" * 64, {"splits": 2, "a": 1}) == "bbbbbbbbbbbb:a=1;splits=2"
    packs = profile.Packs({"b" * 64: "/p/b.so"}, {"cublas": "/p/c.so"}, {})
    ts = profile.targets(ps, packs, "/tmp/lt.json")
    assert [(t.base["who"], t.base["name"]) for t in ts][:4] == [
        ("ours", "eeeeeeeeeeee"), ("baseline", "cublaslt_autotuned"),
        ("ours", "bbbbbbbbbbbb:splits=2"), ("baseline", "torch")]
    assert "in no pack" in ts[0].problem and "no cublaslt" in ts[1].problem
    assert not ts[2].problem and not ts[3].problem and "--lt-choices" in ts[3].args


def test_the_budget_cuts_whole_targets_and_a_refusal_answers_for_the_rest():
    ts = [profile.Target(dict(BASE, M=m, who=w)) for m in (1, 2, 3) for w in ("ours", "baseline")]
    clock = [0.0]
    ran = []

    def run(t, left):
        ran.append((t.base["M"], t.base["who"], left))
        clock[0] += 10.0
        return [ncu.status_row(t.base, "no_kernel", "x")]
    seen = []
    # 22 s: two targets run (22 s and 12 s left), the third would start with 2 s < MIN_START_S
    rows = profile.profile_all(ts, run, deadline=22.0, now=lambda: clock[0],
                               on_rows=lambda r: seen.append(len(r)))
    assert ran == [(1, "ours", 22.0), (1, "baseline", 12.0)]
    assert [r["status"] for r in rows] == ["no_kernel"] * 2 + ["budget"] * 4
    assert rows[2]["detail"] == "budget: not reached before the deadline" and seen[-1] == 6

    def refused(t, left):
        ran.append(t.base["M"])
        return [ncu.status_row(t.base, "counters_refused", "refused")]
    ran.clear()
    rows = profile.profile_all(ts, refused, deadline=1e9)
    assert ran == [1] and {r["status"] for r in rows} == {"counters_refused"} and len(rows) == 6

    def cannot_start(t, left):
        ran.append(t.base["M"])
        return [ncu.status_row(t.base, "profiler_failed", "ncu: ==ERROR== Failed to initialize")]
    ran.clear()
    rows = profile.profile_all(ts, cannot_start, deadline=1e9)
    assert ran == [1] and {r["status"] for r in rows} == {"profiler_failed"} and len(rows) == 6
    assert {r["detail"] for r in rows} == {"ncu: ==ERROR== Failed to initialize"}


def test_cublaslt_autotuned_is_the_recorded_algorithm_or_nothing(tmp_path):
    """The finals' key first (when it names this cuBLASLt), else the key the finals would look
    up for this GPU; nothing recorded: an error, never another algorithm."""
    from cudal2.harness import profile_target as PT
    from cudal2.harness.baselines import autotune_key

    class Lt:
        def version(self):
            return 130100

    class Runners:
        lt, lt_algos = Lt(), 8
    key = autotune_key("NVIDIA H200", 130100, 64, 64, 64, "f32", "RR")
    f = tmp_path / "lt.json"
    f.write_text(json.dumps({key: {"index": 5}, "other": {"index": 2}}))
    a = PT.parse_args(["--shape", "64x64x64", "--baseline", "cublaslt_autotuned", "--lt-choices", str(f)])
    assert PT._lt_index(Runners(), a, ["NVIDIA  H200"]) == 5          # gpu_key's spelling
    a.lt_key = key
    assert PT._lt_index(Runners(), a, []) == 5
    a.shape, a.lt_key = Shape(64, 64, 128), None
    with pytest.raises(PT.TargetError, match="no recorded cuBLASLt choice for 64x64x128"):
        PT._lt_index(Runners(), a, ["NVIDIA H200"])


# ---- end to end on the fake device ---------------------------------------------------------------

@pytest.fixture(scope="module")
def call(tmp_path_factory):
    """A tiny real pack (mma, one shape, split-K builds among them) and the DB of a campaign run
    over it on the fake device: what the verdict call has when the profile stage starts."""
    try:
        from cudal2.core.toolchain import find_toolchain
        find_toolchain()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no CUDA toolchain: {exc}")
    from cudal2.harness import provenance
    from cudal2.runs import campaign
    root = tmp_path_factory.mktemp("profile")
    (root / "shapes.csv").write_text("M,N,K\n128,128,128\n")
    m = campaign.prepare(root / "shapes.csv", "sm_90a", root / "pack", families=["mma"],
                         limit_per_shape=3, jobs=2, include_tuned=False, log=lambda *a: None)
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDAL2_FAKE_DEVICE", "0.02")
    provenance.gpu_visible.cache_clear()
    provenance.gpu_name.cache_clear()
    try:
        campaign.run([root / "pack"], root / "rep", budget_s=120, modes=("offline",),
                     finals_per_shape=1, db_path=root / "results.db", kernels_root=root / "gk",
                     log=lambda *a: None)
    finally:
        mp.undo()
        provenance.gpu_visible.cache_clear()
        provenance.gpu_name.cache_clear()
    return root, m


def _stage(root, out, *args, env=None, timeout=300):
    e = dict(os.environ, CUDAL2_FAKE_DEVICE="0.02", **(env or {}))
    r = subprocess.run([sys.executable, str(KIT / "profile.py"), "--db", str(root / "results.db"),
                        "--pack", str(root / "pack"), "--out", str(out), *map(str, args)],
                       env=e, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profile: "), r.stdout
    return lines[0], ncu.read_csv(out)


@pytest.mark.compile
def test_the_stage_on_the_fake_device(call, tmp_path):
    root, _ = call
    fake = KIT / "fake_ncu.py"
    line, rows = _stage(root, tmp_path / "ok.csv", "--ncu", fake)
    assert "2 of 2 targets profiled over 1 shapes" in line and "up to 7 replay passes" in line
    assert [(r["who"], r["status"]) for r in rows][0] == ("ours", "ok") and rows[-1]["who"] == "baseline"
    assert all(r["status"] == "ok" and r["kernel"] and float(r["duration_us"]) > 0 for r in rows)
    assert rows[-1]["name"] in ("torch", "cublas_nn", "cublas_tn", "cublaslt_heuristic", "cublaslt_autotuned")
    with (tmp_path / "ok.csv").open() as f:
        assert f.readline().strip() == ",".join(ncu.COLUMNS)

    line, rows = _stage(root, tmp_path / "refused.csv", "--ncu", fake, env={"CUDAL2_FAKE_NCU": "refuse"})
    assert "ERR_NVGPUCTRPERM" in line and [r["status"] for r in rows] == ["counters_refused"] * 2

    line, rows = _stage(root, tmp_path / "initfail.csv", "--ncu", fake, env={"CUDAL2_FAKE_NCU": "initfail"})
    assert "LibraryNotLoaded" in line and "stopped after one ncu process" in line
    assert [r["status"] for r in rows] == ["profiler_failed"] * 2 and "LibraryNotLoaded" in rows[1]["detail"]

    line, rows = _stage(root, tmp_path / "absent.csv", "--ncu", tmp_path / "nowhere" / "ncu")
    assert line.startswith("profile: ncu absent") and [r["status"] for r in rows] == ["ncu_absent"] * 2

    miss = ncu.stall_metric("drain")
    line, rows = _stage(root, tmp_path / "miss.csv", "--ncu", fake, env={"CUDAL2_FAKE_NCU": f"unknown={miss}"})
    assert f"ncu lacked {miss}" in line and {r["status"] for r in rows} == {"ok"}

    line, rows = _stage(root, tmp_path / "hang.csv", "--ncu", fake, "--timeout-s", 2,
                        env={"CUDAL2_FAKE_NCU": "hang"}, timeout=60)
    assert [r["status"] for r in rows] == ["timeout"] * 2

    line, rows = _stage(root, tmp_path / "none.csv", "--ncu", fake, "--budget-s", 1)
    assert [r["status"] for r in rows] == ["budget"] * 2 and "0 of 2" in line


@pytest.mark.compile
def test_a_stopped_stage_leaves_a_whole_csv_and_no_process(call, tmp_path):
    """SIGTERM (run.sh's timeout) mid-profile: the ncu process group killed, every target a row,
    exit 0."""
    import signal
    import time
    root, _ = call
    out = tmp_path / "p.csv"
    p = subprocess.Popen([sys.executable, str(KIT / "profile.py"), "--db", str(root / "results.db"),
                          "--pack", str(root / "pack"), "--out", str(out), "--ncu", str(KIT / "fake_ncu.py")],
                         env=dict(os.environ, CUDAL2_FAKE_DEVICE="0.02", CUDAL2_FAKE_NCU="hang",
                                  TMPDIR=str(tmp_path)),   # where the packed libraries unpack
                         stdout=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while not _running("fake_ncu.py", "profile_target", str(tmp_path)):   # a target started
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0 and p.stdout.read().startswith("profile: ")
    assert [r["status"] for r in ncu.read_csv(out)] == ["budget"] * 2
    assert "SIGTERM" in ncu.read_csv(out)[0]["detail"]
    time.sleep(0.5)
    assert not _running("fake_ncu.py", "profile_target", str(tmp_path))
    assert not list(tmp_path.glob("cudal2-pack-*"))      # the unpacked libraries removed at exit


def _running(*words) -> bool:
    """A process whose command line holds every word (ours only: the test's own paths)."""
    for c in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = c.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(w in text for w in words):
            return True
    return False


@pytest.mark.compile
def test_a_split_k_call_profiles_as_two_launches(call, tmp_path, monkeypatch):
    root, m = call
    monkeypatch.setenv("CUDAL2_FAKE_DEVICE", "0.02")
    split = next(c for c in m["candidates"] if dict(map(tuple, c["params"])).get("SPLITK", 1) > 1)
    packs = profile.read_packs([root / "pack"])
    t = profile.Target(dict(BASE, who="ours", name=split["sha"][:12]),
                       ["--shape", "128x128x128", "--layout", "RR", "--kernel", packs.kernels[split["sha"]]])
    run = profile.Runner([sys.executable, str(KIT / "fake_ncu.py")], tmp_path, 60)
    rows = run(t, 60)
    assert [(r["launch"], r["status"]) for r in rows] == [(0, "ok"), (1, "ok")]
    assert "fixup" in rows[1]["kernel"]


# ---- on a GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_the_target_makes_one_call_on_a_gpu():
    """profile_target without ncu: torch's GEMM warmed up, then one call between the profiler
    markers; exit 0 and nothing on stderr."""
    r = subprocess.run([sys.executable, "-m", "cudal2.harness.profile_target", "--shape", "256x256x256",
                        "--baseline", "torch"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and "profile_target:" not in r.stderr, r.stderr


@pytest.mark.gpu
def test_real_ncu_profiles_the_call_or_says_why(tmp_path):
    """The real ncu around the real target: the parser reads its raw page (one launch or more,
    each with a kernel name and a duration), or the counters are refused in one line."""
    cmd, why = profile.find_ncu(None)
    if cmd is None:
        pytest.skip(why)
    t = profile.Target(dict(BASE, who="baseline", name="torch"),
                       ["--shape", "1024x1024x1024", "--baseline", "torch"])
    run = profile.Runner(cmd, tmp_path, 120)
    rows = run(t, 120)
    assert rows[0]["status"] in ("ok", "counters_refused"), rows
    if rows[0]["status"] == "ok":
        assert all(r["kernel"] and float(r["duration_us"]) > 0 and r["grid"] for r in rows), rows
        assert rows[0]["registers"] and rows[0]["stall_1"], rows
