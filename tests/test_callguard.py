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
