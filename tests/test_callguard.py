"""The call guard (cudal2/harness/callguard.c), without a GPU: a fake CUDA runtime (a tiny C
library exporting the runtime's names) stands in for libcudart, a fake kernel library calls it
through its import table, and the guard, preloaded into a fresh Python, must pass every call on
while disarmed, and while armed record each call, refuse a forbidden one before it reaches the
runtime, and let the driver entry-point door hand out only allowlisted functions."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cudal2.harness import audit, callguard

FAKE_CUDART = r"""
#include <string.h>
int launched, malloced, synced, door_asked;
int cudaLaunchKernel(const void* f, long g, long gz, long b, long bz, void** args, long smem, void* s) {
  launched++; return (int)(smem + 7);          /* 7: the stack arguments arrived intact */
}
int cudaMalloc(void** p, unsigned long n) { malloced++; *p = (void*)0x1000; return 0; }
int cudaStreamSynchronize(void* s) { synced++; return 0; }
int cudaGetDriverEntryPoint(const char* sym, void** fn, unsigned long long flags, int* status) {
  door_asked++; *fn = (void*)0x1234; if (status) *status = 0; return 0;
}
int fake_counts(int which) { return which == 0 ? launched : which == 1 ? malloced : which == 2 ? synced : door_asked; }
"""

FAKE_KERNEL = r"""
int cudaLaunchKernel(const void*, long, long, long, long, void**, long, void*);
int cudaMalloc(void**, unsigned long);
int cudaStreamSynchronize(void*);
int cudaGetDriverEntryPoint(const char*, void**, unsigned long long, int*);
/* what a call does: launch, allocate, synchronise, ask the door for `name` (spelled at run time) */
int run(const char* name, int* rc, void** fn, int* status) {
  void* p = 0;
  rc[0] = cudaLaunchKernel(0, 1, 1, 32, 1, 0, 100, 0);
  rc[1] = cudaMalloc(&p, 64);
  rc[2] = cudaStreamSynchronize(0);
  char assembled[64]; int i = 0;
  for (; name[i] && i < 63; ++i) assembled[i] = name[i];
  assembled[i] = 0;
  *status = -1;
  rc[3] = cudaGetDriverEntryPoint(assembled, fn, 0, status);
  return 0;
}
"""

PROBE = r"""
import ctypes, json, sys
import torch                                   # torch (and its runtime, if any) under the guard
from cudal2.harness.callguard import Guard
from cudal2.harness.measure import call_record
cudart = ctypes.CDLL(sys.argv[2])
kernel = ctypes.CDLL(sys.argv[1])
guard = Guard.active()
assert guard is not None, "the guard is not preloaded"

def call(name):
    rc, fn, status = (ctypes.c_int * 4)(), ctypes.c_void_p(), ctypes.c_int()
    kernel.run(name.encode(), rc, ctypes.byref(fn), ctypes.byref(status))
    return {"rc": list(rc), "fn": fn.value, "status": status.value}

out = {"disarmed": call("cuMemAlloc_v2"), "disarmed_calls": guard.calls()}
counts = lambda: [cudart.fake_counts(i) for i in range(4)]
out["counts_disarmed"] = counts()
with guard.armed():
    out["forbidden_door"] = call("cuMemAlloc_v2")
    out["allowed_door"] = call("cuTensorMapEncodeTiled")
out["counts_armed"] = counts()
out["calls"] = guard.calls()
out["refused"] = guard.refused()
out["record"] = call_record(guard)
guard.reset()                                  # a flood of calls past the log's capacity
with guard.armed():
    for _ in range(1100):
        call("cuTensorMapEncodeTiled")
out["flood"] = {"refused": [len(guard.refused()), guard.refused()[-1]], "dropped": guard.dropped(), "named": len(guard.calls())}
a = torch.randn(8, 8)
out["torch"] = bool(torch.equal(a @ a, torch.matmul(a, a)))
print(json.dumps(out))
"""


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler")
    return cc


def test_the_guard_records_refuses_and_guards_the_door(tmp_path):
    cc = _cc()
    shim = callguard.build(cache=tmp_path / "cache")
    assert callguard.build(cache=tmp_path / "cache") == shim          # cached
    (tmp_path / "cudart.c").write_text(FAKE_CUDART)
    (tmp_path / "kernel.c").write_text(FAKE_KERNEL)
    cudart = tmp_path / "libfakecudart.so"
    kernel = tmp_path / "kernel.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(cudart), str(tmp_path / "cudart.c")], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(kernel), str(tmp_path / "kernel.c"),
                    f"-L{tmp_path}", "-lfakecudart", f"-Wl,-rpath,{tmp_path}"], check=True)
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    r = subprocess.run([sys.executable, "-c", PROBE, str(kernel), str(cudart)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # disarmed: everything reaches the (fake) runtime, nothing is recorded
    assert got["disarmed"] == {"rc": [107, 0, 0, 0], "fn": 0x1234, "status": 0}
    assert got["disarmed_calls"] == [] and got["counts_disarmed"] == [1, 1, 1, 1]
    # armed: the launch is recorded and passed on (its stack arguments intact); the allocation
    # and the synchronisation are refused (cudaErrorNotPermitted) without reaching the runtime;
    # the door refuses a driver function off the allowlist and hands out an allowlisted one
    assert got["forbidden_door"] == {"rc": [107, 800, 800, 500], "fn": None, "status": 1}
    assert got["allowed_door"] == {"rc": [107, 800, 800, 0], "fn": 0x1234, "status": 0}
    assert got["counts_armed"] == [3, 1, 1, 2]
    assert [tuple(c) for c in got["calls"]] == [
        ("cudaLaunchKernel", False), ("cudaMalloc", True), ("cudaStreamSynchronize", True),
        ("cudaGetDriverEntryPoint:cuMemAlloc_v2", True),
        ("cudaLaunchKernel", False), ("cudaMalloc", True), ("cudaStreamSynchronize", True),
        ("cudaGetDriverEntryPoint:cuTensorMapEncodeTiled", False)]
    assert got["torch"] and got["record"]["status"] == "on" and got["record"]["calls_not_named"] == 0
    assert got["record"]["calls"]["cudaMalloc"] == 2 and got["record"]["refused"] == [
        "cudaGetDriverEntryPoint:cuMemAlloc_v2", "cudaMalloc", "cudaStreamSynchronize"]
    # 1100 calls x 4 runtime calls: the log names 4096 and counts the rest; all 2200 refusals
    # are kept (the first 256 by name)
    assert got["flood"] == {"refused": [257, "... 1944 more"], "dropped": 4400 - 4096, "named": 4096}
    assert got["refused"] == ["cudaMalloc", "cudaStreamSynchronize",
                              "cudaGetDriverEntryPoint:cuMemAlloc_v2"] + ["cudaMalloc",
                                                                          "cudaStreamSynchronize"]


def test_one_rule_the_guard_refuses_what_the_audit_rejects():
    """Every runtime call the guard refuses is one the static audit rejects when imported, and
    every call it records is one the audit allows: the two layers apply the same rule."""
    for name in callguard.REFUSED:
        assert audit.classify_symbol(name) is not None, name
    for name in callguard.recorded_calls():
        assert audit.classify_symbol(name) is None, name
    assert "CUDAL2_ENTRY_POINTS" in callguard.header()
    assert '"cuTensorMapEncodeTiled"' in callguard.header()


def test_a_worker_with_the_guard_preloaded_boots_torch_and_sees_it(tmp_path):
    """gpu_pool's environment: the guard is preloaded into the worker and the measuring code
    finds it (torch under the guard: the probe of the first test)."""
    _cc()
    from cudal2.harness.pipeline import _call_guard_env
    from cudal2.harness.worker import WorkerPool
    env = _call_guard_env()
    assert env is not None and "libcudal2_callguard.so" in env["LD_PRELOAD"]
    from tests.test_callguard import _probe_guard as probe      # importable by the worker
    with WorkerPool(env=env, max_tasks=1) as pool:
        out = pool.run(probe, timeout_s=120)
    assert out.status == "ok", out.detail
    assert out.value == {"guard": True, "record": []}


def _probe_guard():
    from cudal2.harness.callguard import Guard
    guard = Guard.active()
    return {"guard": guard is not None, "record": guard.refused() if guard else None}


REAL_PROBE = r"""
import ctypes, json, sys
from cudal2.harness.callguard import Guard
lib = ctypes.CDLL(sys.argv[1])
guard = Guard.active()
f = lib.cudal2_hgemm
f.restype = ctypes.c_int
args = [None, None, None, 64, 64, 64, 64, 64, 64, None, ctypes.c_size_t(0), None]
disarmed = f(*args)
with guard.armed():
    armed = f(*args)
print(json.dumps({"disarmed": disarmed, "armed": armed, "calls": guard.calls(),
                  "refused": guard.refused()}))
"""


@pytest.mark.compile
def test_the_guard_passes_an_nvcc_kernels_calls_to_the_real_runtime(tmp_path):
    """An nvcc-built kernel library (shared cudart) under the guard: its launch sequence is
    recorded, nothing is refused, and the runtime's own answer comes back unchanged (on a
    machine without a GPU, the same error armed and disarmed)."""
    _cc()
    from pathlib import Path

    from cudal2.core.build import BuildSpec, build
    src = (Path(__file__).parent / "data" / "hostile" / "control_ok.cu").read_text()
    br = build(BuildSpec(src, arch="sm_90a", name="control_ok"))
    assert br.ok, br.log[-2000:]
    env = {**os.environ, "LD_PRELOAD": str(callguard.build(cache=tmp_path / "cache"))}
    r = subprocess.run([sys.executable, "-c", REAL_PROBE, str(br.so_path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    names = [n for n, _ in got["calls"]]
    assert got["armed"] == got["disarmed"] and got["refused"] == [], got
    assert {"cudaLaunchKernel", "__cudaLaunchKernel"} & set(names) and "cudaGetLastError" in names, got


# ---- `cudal2 audit`'s dry call: the guard before a GPU sees the library ----------------------
HOSTILE = Path(__file__).parent / "data" / "hostile"
DOOR = "door_assembled_name.cu"
FORBIDDEN = "cuCtxSynchronize"          # what DOOR assembles at run time (its header says how)

# Every kernel of tests/data/hostile -> (the dry call's verdicts that are right, what a rejection
# names, why). "rejected": the guard refused a request; "passes": nothing forbidden seen without
# a device (the behaviour needs one, or is no CUDA call: the static audit's, or measure's, to
# catch); crashed / timeout / oom / error: the worker's verdict, before any call; None: never
# dry-called (why says).
DRY_CALL = {
    DOOR: ({"rejected"}, f"cudaGetDriverEntryPoint:{FORBIDDEN}",
           "a forbidden driver function by a name assembled at run time: the static audit passes it"),
    "allocates.cu": ({"rejected"}, "cudaMalloc", "allocates inside the call"),
    "synchronises.cu": ({"rejected"}, "cudaDeviceSynchronize", "synchronises after its launch"),
    "private_stream.cu": ({"rejected"}, "cudaStreamCreateWithFlags", "creates a stream"),
    "graph_capture.cu": ({"rejected"}, "cudaStreamBeginCapture, cudaStreamEndCapture, "
                         "cudaGraphInstantiate, cudaGraphLaunch", "captures and replays a graph"),
    "control_ok.cu": ({"passes"}, "", "honest"),
    "fp16_acc_claims_f32.cu": ({"passes"}, "", "its PTX is the static audit's"),
    "kernel_spins.cu": ({"passes"}, "", "needs a device (the worker's time limit)"),
    "kernel_illegal_address.cu": ({"passes"}, "", "needs a device (a sticky fault)"),
    "timer_globaltimer.cu": ({"passes"}, "", "needs a device (measure's checked timed outputs)"),
    "timer_clock64.cu": ({"passes"}, "", "needs a device (measure's checked timed outputs)"),
    "timer_call_count.cu": ({"passes"}, "", "needs a device (measure's checked timed outputs)"),
    "keeps_previous_output.cu": ({"passes"}, "", "needs a device (fresh C before each call)"),
    "pointer_keyed_cache.cu": ({"passes"}, "", "needs a device (fresh inputs)"),
    "ones_only.cu": ({"passes"}, "", "needs a device (random inputs)"),
    "per_thread_stream.cu": ({"passes"}, "", "needs a device (no call names the other stream)"),
    "thread_launch.cu": ({"passes"}, "", "launches from a thread the guard does not arm (it arms "
                         "the calling thread); the static audit rejects std::thread"),
    "reads_file.cu": ({"passes"}, "", "fopen is no CUDA call: the static audit's"),
    "dlopen_lib.cu": ({"passes"}, "", "dlopen/dlsym are no CUDA calls: the static audit's"),
    "host_asm.cu": ({"passes"}, "", "a raw system call is no CUDA call: the static audit's"),
    "exports_runtime_name.cu": ({"passes"}, "", "an export, not a call: the static audit's"),
    "calls_cublas.cu": ({"passes", "error"}, "", "cuBLAS is no runtime call the guard wraps (and "
                        "without libcublas on its runpath it does not load): the static audit's"),
    "ctor_segv.cu": ({"crashed"}, "", "its constructor segfaults while loading"),
    "ctor_abort.cu": ({"crashed"}, "", "its constructor aborts while loading"),
    "ctor_exit.cu": ({"crashed"}, "", "its constructor exits the worker"),
    "ctor_fork.cu": ({"crashed"}, "", "its constructor forks (the sandbox's verdict)"),
    "meta_segv.cu": ({"crashed"}, "", "cudal2_meta segfaults"),
    "meta_wild_pointer.cu": ({"crashed"}, "", "cudal2_meta returns a wild pointer"),
    "ctor_hang.cu": ({"timeout"}, "", "its constructor spins"),
    "meta_hang.cu": ({"timeout"}, "", "cudal2_meta spins"),
    "ctor_oom.cu": ({"oom"}, "", "its constructor eats host memory"),
    "meta_garbage.cu": ({"error"}, "", "its meta is not JSON"),
    "meta_not_utf8.cu": ({"error"}, "", "its meta is not UTF-8"),
    "system_call.cu": (None, "", "runs a shell command (nvidia-smi -lgc), which the guard does not "
                       "police: never run on a test machine; the static audit rejects it"),
    "include_absolute.cu": (None, "", "rejected before it is built (#include rules)"),
    "include_escape.cu": (None, "", "rejected before it is built (#include rules)"),
}


def _so(name):
    from cudal2.core.build import build_file
    res = build_file(HOSTILE / name, arch="sm_90a")
    assert res.ok, res.log[-2000:]
    return res.so_path


@pytest.fixture(scope="module")
def dry_pool():
    _cc()
    with audit.dry_call_pool() as pool:
        yield pool


def test_every_hostile_kernel_has_a_dry_call_verdict():
    assert set(DRY_CALL) == {p.name for p in HOSTILE.glob("*.cu")}


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(n for n, (want, _, _) in DRY_CALL.items() if want))
def test_the_dry_call_over_the_hostile_corpus(name, dry_pool):
    """Each hostile kernel's dry call (audit.check_dry_call, the guard preloaded, no device) gets
    the verdict DRY_CALL states; one that crashes, hangs or eats memory costs only its worker."""
    want, names, why = DRY_CALL[name]
    timeout = 3 if want == {"timeout"} else 60
    reasons, notes, record = audit.check_dry_call(_so(name), dry_pool, timeout_s=timeout,
                                                  mem_limit_bytes=512 << 20)
    got = record["status"] if record["status"] != "ok" else "rejected" if reasons else "passes"
    assert got in want, (name, why, reasons, notes)
    if got == "rejected":
        assert len(reasons) == 1 and f"refused {names} in a dry call" in reasons[0], reasons
    if got not in ("passes", "rejected"):
        assert "record is lost" in notes[0] and not reasons, notes
        again = audit.check_dry_call(_so("control_ok.cu"), dry_pool)
        assert again[0] == [] and again[2]["status"] == "ok", again


@pytest.mark.compile
def test_cudal2_audit_rejects_a_driver_function_fetched_by_an_assembled_name(tmp_path, capsys):
    """DOOR names no forbidden driver function anywhere the static audit reads (source, .so
    strings) and passes it; `cudal2 audit`'s dry call sees the door request and rejects it, and
    still accepts control_ok.cu and a template kernel."""
    from cudal2.cli import main
    from cudal2.core.build import build_file
    from cudal2.harness.worker import WorkerPool
    from cudal2.templates import FAMILIES
    br = build_file(HOSTILE / DOOR, arch="sm_90a")
    assert br.ok, br.log[-2000:]
    assert FORBIDDEN not in (HOSTILE / DOOR).read_text()
    assert FORBIDDEN.encode() not in Path(br.so_path).read_bytes()
    with WorkerPool(max_tasks=1) as pool:
        static = audit.audit_build((HOSTILE / DOOR).read_text(), br, "sm_90a", pool=pool)
    assert static.ok and not static.dry_call, static.line()
    mma = FAMILIES["mma"]
    template = tmp_path / "mma_default.cu"
    template.write_text(mma.build_spec(mma.default(), "sm_90a").source)
    files = [str(HOSTILE / DOOR), str(HOSTILE / "control_ok.cu"), str(template)]
    assert main(["audit", *files, "--arch", "sm_90a"]) == 1
    out, err = capsys.readouterr()
    lines = dict(zip(files, out.strip().splitlines()))
    assert "REJECTED" in lines[files[0]] and f"refused cudaGetDriverEntryPoint:{FORBIDDEN}" in lines[files[0]]
    assert ": ok " in lines[files[1]] and ": ok " in lines[files[2]], out
    assert "dry call" not in out.replace(lines[files[0]], "") and "2 accepted, 1 rejected" in err


@pytest.mark.compile
def test_cudal2_audit_says_when_it_could_not_make_the_dry_call(monkeypatch, capsys):
    """Without the guard (no host C compiler) the audit says so on stderr and on each accepted
    line, and accepts what the static rules accept: DOOR too."""
    from cudal2.cli import main

    def no_compiler(cache=None):
        raise callguard.CallGuardError("the call guard needs a host C compiler (cc, gcc or clang)")
    monkeypatch.setattr(callguard, "build", no_compiler)
    files = [str(HOSTILE / DOOR), str(HOSTILE / "control_ok.cu")]
    assert main(["audit", *files, "--arch", "sm_90a"]) == 0
    out, err = capsys.readouterr()
    assert "no dry calls: the call guard could not be built" in err and "host C compiler" in err
    assert [line.endswith("; dry call off") for line in out.strip().splitlines()] == [True, True], out
