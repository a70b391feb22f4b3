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
with guard.armed(stream=0):                    # a call on the legacy default stream (handle 0)
    out["forbidden_door"] = call("cuMemAlloc_v2")
    out["allowed_door"] = call("cuTensorMapEncodeTiled")
out["counts_armed"] = counts()
out["calls"] = guard.calls()
out["refused"] = guard.refused()
out["record"] = call_record(guard)
guard.reset()                                  # a flood of calls past the log's capacity
with guard.armed(stream=0):
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


# ---- stream discipline: every launch and memset on the call's stream -------------------------
STREAM_CUDART = r"""
#include <string.h>
typedef struct { unsigned x, y, z; } dim3;
struct attr { int id; char pad[4]; char value[64]; };
struct config { dim3 grid, block; unsigned long smem; void* stream; struct attr* attrs; unsigned n; };
int reached;                                   /* calls that got past the guard */
int cudaLaunchKernel(const void* f, dim3 g, dim3 b, void** a, unsigned long smem, void* s) { return ++reached, 0; }
int cudaLaunchKernel_ptsz(const void* f, dim3 g, dim3 b, void** a, unsigned long smem, void* s) { return ++reached, 0; }
int __cudaLaunchKernel(const void* f, dim3 g, dim3 b, void** a, unsigned long smem, void* s) { return ++reached, 0; }
int cudaMemsetAsync(void* p, int v, unsigned long n, void* s) { return ++reached, 0; }
int cudaLaunchKernelExC(const struct config* c, const void* f, void** a) { return ++reached, 0; }
static int drv_launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned smem, void* s, void** p, void** e) { return ++reached, 0; }
int cudaGetDriverEntryPoint(const char* sym, void** fn, unsigned long long flags, int* status) {
  *fn = strcmp(sym, "cuLaunchKernel") == 0 ? (void*)drv_launch : (void*)0x1234;
  if (status) *status = 0;
  return 0;
}
int fake_reached(void) { return reached; }
"""

STREAM_KERNEL = r"""
typedef struct { unsigned x, y, z; } dim3;
struct attr { int id; char pad[4]; char value[64]; };
struct config { dim3 grid, block; unsigned long smem; void* stream; struct attr* attrs; unsigned n; };
int cudaLaunchKernel(const void*, dim3, dim3, void**, unsigned long, void*);
int cudaLaunchKernel_ptsz(const void*, dim3, dim3, void**, unsigned long, void*);
int __cudaLaunchKernel(const void*, dim3, dim3, void**, unsigned long, void*);
int cudaMemsetAsync(void*, int, unsigned long, void*);
int cudaLaunchKernelExC(const struct config*, const void*, void**);
int cudaGetDriverEntryPoint(const char*, void**, unsigned long long, int*);
typedef int (*drv_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      void*, void**, void**);
/* one launch through `how` on `stream`: 0 cudaLaunchKernel, 1 its _ptsz, 2 __cudaLaunchKernel
 * (<<<>>>), 3 cudaMemsetAsync, 4 cudaLaunchKernelExC, 5 the same with an L2 access-policy
 * window, 6 the driver's cuLaunchKernel from the door (legacy), 7 the same asked per-thread */
int launch(int how, void* stream) {
  dim3 one = {1, 1, 1};
  struct attr window = {1};                    /* cudaLaunchAttributeAccessPolicyWindow */
  struct config c = {one, one, 0, stream, how == 5 ? &window : 0, how == 5};
  void* fn = 0;
  switch (how) {
    case 0: return cudaLaunchKernel(0, one, one, 0, 0, stream);
    case 1: return cudaLaunchKernel_ptsz(0, one, one, 0, 0, stream);
    case 2: return __cudaLaunchKernel(0, one, one, 0, 0, stream);
    case 3: return cudaMemsetAsync(0, 0, 16, stream);
    case 4: case 5: return cudaLaunchKernelExC(&c, 0, 0);
    default:
      cudaGetDriverEntryPoint("cuLaunchKernel", &fn, how == 7 ? 2 : 0, 0);
      return ((drv_fn)fn)(0, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0);
  }
}
"""

STREAM_PROBE = r"""
import ctypes, json, sys
from cudal2.harness.callguard import Guard
cudart = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
kernel = ctypes.CDLL(sys.argv[1])
kernel.launch.argtypes = [ctypes.c_int, ctypes.c_void_p]
guard = Guard.active()
CALL = 0x5EED0000
out = {}
for expect in (CALL, 0, None):                 # a call on its own stream, on the legacy one, none
    for how in range(8):
        for stream in (CALL, 0, 1, 2, 0x777):
            guard.reset()
            before = cudart.fake_reached()
            with guard.armed(stream=expect):
                rc = kernel.launch(how, stream)
            out[f"{expect} {how} {stream}"] = [rc, cudart.fake_reached() - before, guard.refused()]
out["disarmed"] = [kernel.launch(how, 2) for how in range(8)]
print(json.dumps(out))
"""


def test_the_guard_lets_launches_onto_the_calls_stream_only(tmp_path):
    """Every launch path a kernel library can reach (the runtime's launches, <<<>>>'s
    __cudaLaunchKernel, the per-thread spelling, the memset, cudaLaunchKernelExC, the driver's
    cuLaunchKernel handed out by the door, asked legacy or per-thread) reaches the runtime only
    on the stream of the call being made; the per-thread and legacy default streams and any
    other handle are refused and named, as is an L2 access-policy window and any launch outside
    a call. Disarmed, all of them pass."""
    cc = _cc()
    shim = callguard.build(cache=tmp_path / "cache")
    (tmp_path / "cudart.c").write_text(STREAM_CUDART)
    (tmp_path / "kernel.c").write_text(STREAM_KERNEL)
    cudart, kernel = tmp_path / "libfakecudart.so", tmp_path / "kernel.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(cudart), str(tmp_path / "cudart.c")], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(kernel), str(tmp_path / "kernel.c"),
                    f"-L{tmp_path}", "-lfakecudart", f"-Wl,-rpath,{tmp_path}"], check=True)
    r = subprocess.run([sys.executable, "-c", STREAM_PROBE, str(kernel), str(cudart)],
                       env={**os.environ, "LD_PRELOAD": str(shim)}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    call, names = 0x5EED0000, ["cudaLaunchKernel", "cudaLaunchKernel_ptsz", "__cudaLaunchKernel",
                               "cudaMemsetAsync", "cudaLaunchKernelExC", "cudaLaunchKernelExC",
                               "cuLaunchKernel", "cuLaunchKernel"]
    per_thread_api = {1, 7}
    for how, name in enumerate(names):
        for stream, named in ((call, None), (0, "0"), (1, "cudaStreamLegacy"),
                              (2, "cudaStreamPerThread"), (0x777, "another")):
            # on the call's own stream: reaches the runtime, unless it sets an L2 window
            rc, reached, refused = got[f"{call} {how} {stream}"]
            if stream == call and how != 5:
                assert (rc, reached, refused) == (0, 1, []), (name, stream, got)
                continue
            why = ("L2 access-policy window" if how == 5 else
                   "on cudaStreamPerThread" if stream == 2 or (stream == 0 and how in per_thread_api)
                   else "on cudaStreamLegacy" if stream in (0, 1)
                   else "on another stream than the call's")
            assert (rc, reached, refused) == (800, 0, [f"{name}:{why}"]), (name, stream, got)
        # a call made on the legacy stream (handle 0): 0 and cudaStreamLegacy are that stream,
        # except through a per-thread API, where 0 is the per-thread stream
        for stream in (0, 1):
            rc, reached, refused = got[f"0 {how} {stream}"]
            ok = how != 5 and not (stream == 0 and how in per_thread_api)
            assert (rc == 0 and reached == 1) == ok, (name, stream, got[f"0 {how} {stream}"])
        # outside a call, nothing launches
        rc, reached, refused = got[f"None {how} {call}"]
        assert rc == 800 and reached == 0 and refused[0].startswith(f"{name}:"), refused
        if how != 5:
            assert refused == [f"{name}:outside cudal2_hgemm"]
    assert got["disarmed"] == [0] * 8


FAMILY_DRIVE = r"""
import ctypes, json, sys
from cudal2.core.abi import KernelLibrary, meta_accepts
from cudal2.harness.callguard import Guard
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # before the kernels' libcudart
guard = Guard.active()
CALL, OTHER, P = 0x5EED0000, 0x0DD0000, 1 << 20
out = []
for so in json.loads(sys.argv[2]):
    lib = KernelLibrary(so)
    meta = lib.meta
    choices = [{}] + [{o["name"]: v} for o in meta.get("options") or [] for v in o.get("values", [])]
    for M, N, K in ((16, 4096, 4096), (4096, 16, 4096), (128, 128, 16384), (256, 256, 512)):
        if not meta_accepts(meta, M, N, K):
            continue
        for chosen in choices:
            opts = lib.options(chosen)
            ws = lib.workspace_bytes(M, N, K, opts)
            row = []
            for expect in (CALL, OTHER):             # the call's own stream, then a wrong guess
                guard.reset()
                fake.fake_reset()
                with guard.armed(stream=expect):
                    rc = lib.launch(P, P, P, M, N, K, K, K if meta["layout"] == "RC" else N, N,
                                    P if ws else 0, ws, CALL, opts)
                row.append([rc, fake.fake_launches() + fake.fake_memsets(), guard.refused()])
            out.append([so, [M, N, K], chosen, row])
print(json.dumps(out))
"""


@pytest.mark.compile
def test_our_families_launch_on_the_calls_stream_only(tmp_path, fake_runtime):
    """Every family's launcher, with each runtime option it declares, compiled by nvcc against
    the real runtime prototypes, run under the guard against a fake runtime (launches counted,
    nothing runs): the guard reads the stream the launcher passes (cudaLaunchKernel,
    cudaLaunchKernelExC with clusters and pdl, the memset, <<<>>>) as the call's own, refuses
    nothing, and each call launches; told another stream was the call's, it refuses the same
    launches. So the guard neither passes work elsewhere nor refuses our own kernels on a GPU."""
    from cudal2.core.build import build_many
    from cudal2.templates import FAMILIES
    _cc()
    specs = [FAMILIES[f].build_spec(cfg, "sm_90a") for f in
             ("mma", "ptx", "wgmma", "lowlat", "lowlat_mma", "skinny", "skinny_n")
             for cfg in FAMILIES[f].defaults()[:2]]
    built = build_many(specs)
    assert all(b.ok for b in built), [b.log[-1500:] for b in built if not b.ok]
    env = {**os.environ, "LD_PRELOAD": str(callguard.build(cache=tmp_path / "cache")),
           "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", FAMILY_DRIVE, str(fake_runtime("splitk_fake_cudart")),
                        json.dumps([str(b.so_path) for b in built])], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len({so for so, *_ in got}) == len(built), "a family served none of the shapes"
    launched = 0
    for so, shape, chosen, ((rc, n, refused), (rc_wrong, n_wrong, refused_wrong)) in got:
        where = (so.rsplit("/", 1)[-1], shape, chosen)
        assert refused == [], (where, refused)
        if rc == 0:
            launched += 1
            assert n >= 1, where
            assert rc_wrong != 0 and refused_wrong and all(
                x.endswith(":on another stream than the call's") for x in refused_wrong), (where, refused_wrong)
    assert launched >= len(got) // 2, got


@pytest.mark.compile
def test_the_guards_view_of_a_launch_config_matches_the_cuda_headers(tmp_path):
    """callguard.c reads a launch's stream and attributes from cudaLaunchConfig_t and
    CUlaunchConfig by offset (it is built without CUDA headers): the offsets it assumes are the
    headers' (stream at 32, attributes at 40, their count at 48, an attribute 72 bytes with its
    value at 8)."""
    from cudal2.core.toolchain import ToolchainError, find_toolchain
    try:
        nvcc = find_toolchain().nvcc
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    src = tmp_path / "offsets.cu"
    src.write_text(r"""
#include <cstddef>
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
int main() {
  std::printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n",
              offsetof(cudaLaunchConfig_t, stream), offsetof(cudaLaunchConfig_t, attrs),
              offsetof(cudaLaunchConfig_t, numAttrs), sizeof(cudaLaunchAttribute),
              offsetof(cudaLaunchAttribute, val), offsetof(CUlaunchConfig, hStream),
              offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
              sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value));
  std::printf("%d %d\n", (int)cudaLaunchAttributeAccessPolicyWindow,
              (int)CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW);
}
""")
    exe = tmp_path / "offsets"
    subprocess.run([str(nvcc), "-o", str(exe), str(src)], check=True, capture_output=True,
                   timeout=300)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines[0].split() == ["32", "40", "48", "72", "8", "32", "40", "48", "72", "8"]
    assert lines[1].split() == ["1", "1"]


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
with guard.armed(stream=0):                    # args' stream: None, the legacy default stream
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
    "private_stream.cu": ({"rejected"}, "cudaStreamCreateWithFlags, __cudaLaunchKernel:on "
                          "cudaStreamLegacy", "creates a stream (refused, so it launches on 0)"),
    "per_thread_stream.cu": ({"rejected"}, "__cudaLaunchKernel:on cudaStreamPerThread",
                             "launches on the per-thread default stream (named: the static "
                             "audit rejects it too)"),
    "per_thread_handle.cu": ({"rejected"}, "__cudaLaunchKernel:on cudaStreamPerThread",
                             "the per-thread stream by its handle's value: the static audit "
                             "passes it"),
    "legacy_stream.cu": ({"rejected"}, "__cudaLaunchKernel:on cudaStreamLegacy",
                         "launches on the legacy stream (named: the static audit rejects it too)"),
    "default_stream.cu": ({"rejected"}, "__cudaLaunchKernel:on cudaStreamLegacy",
                          "launches with <<<grid, block>>>, stream 0: the static audit passes it"),
    "l2_persist_stream.cu": ({"rejected"}, "cudaDeviceSetLimit, cudaStreamSetAttribute",
                             "an L2 persistence window left on the caller's stream"),
    "l2_launch_window.cu": ({"rejected"}, "cudaLaunchKernelExC:L2 access-policy window",
                            "an access-policy launch attribute spelled by number: the static "
                            "audit passes it"),
    "deferred_work.cu": ({"passes"}, "", "needs a device (the repeat finds garbage in C)"),
    "smem_unwritten.cu": ({"passes"}, "", "needs a device (bit repeatability)"),
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
