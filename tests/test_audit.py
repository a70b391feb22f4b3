"""The static audit: allowlisted imports, include rules, host syscalls, meta read in a worker,
and the PTX accumulator check. Pure rules first, then the hostile corpus built with nvcc."""
import argparse
from pathlib import Path

import pytest

from cudal2.harness import audit as A

HOSTILE = Path(__file__).parent / "data" / "hostile"


# ---- pure rules ---------------------------------------------------------------------------
@pytest.mark.parametrize("sym", [
    "cudaLaunchKernel", "__cudaLaunchKernel", "__cudaRegisterFatBinary", "cudaFuncSetAttribute",
    "cudaGetDriverEntryPointByVersion", "cudaLaunchKernelExC", "cudaMemsetAsync", "cudaGetLastError",
    "memcpy", "__cxa_guard_acquire", "_Znwm", "_ZdlPvm", "_ZSt20__throw_length_errorPKc",
    "__gxx_personality_v0", "_ZSt4cerr", "_ZNSo5flushEv", "snprintf", "__udivti3"])
def test_allowed_symbols(sym):
    assert A.classify_symbol(sym) is None


@pytest.mark.parametrize("sym, why", [
    ("cublasHgemm", "library"), ("cublasLtMatmul", "library"), ("cudnnCreate", "library"),
    ("pthread_create", "threads"), ("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE", "threads"),
    ("fork", "processes"), ("system", "processes"), ("popen", "processes"), ("execve", "processes"),
    ("cudaStreamCreate", "streams"), ("cudaEventRecord", "events"), ("cudaGraphLaunch", "graphs"),
    ("cudaDeviceSynchronize", "synchronises"), ("cudaStreamSynchronize", "synchronises"),
    ("cudaEventSynchronize", "synchronises"), ("cudaMalloc", "allocates"),
    ("cudaMallocAsync", "allocates"), ("cudaHostAlloc", "allocates"), ("cudaMemcpy", "copies"),
    ("mmap", "allocates"), ("fopen", "file"), ("open", "file"), ("socket", "network"),
    ("connect", "network"), ("getenv", "environment"), ("syscall", "system"),
    ("dlopen", "dlopen"), ("dlsym", "dlopen"), ("cuGetProcAddress", "dlopen"),
    ("exit", "allowlist"), ("cudaSetDevice", "device state")])
def test_rejected_symbols(sym, why):
    reason = A.classify_symbol(sym)
    assert reason is not None and why in reason, (sym, reason)


def test_export_rules():
    """Only the ABI's entry points and what the compiler emits in every library (weak or unique
    C++ symbols of header templates; the kernel's own C++ helpers) may be exported."""
    ok = [("cudal2_hgemm", "FUNC", "GLOBAL"), ("cudal2_meta", "FUNC", "GLOBAL"),
          ("cudal2_workspace", "FUNC", "GLOBAL"), ("_ZNKSt5ctypeIcE8do_widenEc", "FUNC", "WEAK"),
          ("_ZN4cuda3std3__48in_placeE", "OBJECT", "UNIQUE"),
          ("_ZN7cutlass4gemm6kernel13GemmUniversalIvE14get_grid_shapeEv", "FUNC", "WEAK"),
          ("_Z6helperP6__halfP11CUstream_st", "FUNC", "GLOBAL")]
    assert A.check_exports(ok) == []
    (why,) = A.check_exports(ok + [("cudaEventElapsedTime", "FUNC", "GLOBAL")])
    assert "cudaEventElapsedTime" in why and "unmangled" in why
    (why,) = A.check_exports([("calls", "OBJECT", "GLOBAL"), ("cuGetProcAddress_v2", "FUNC", "WEAK")])
    assert "calls" in why and "cuGetProcAddress_v2" in why
    (why,) = A.check_exports([("_ZNSt6thread6detachEv", "FUNC", "GLOBAL"),
                              ("_ZN2at6native2mmERKNS_6TensorES3_", "FUNC", "GLOBAL")])
    assert "another library's namespace" in why and "_ZN2at" in why


def test_include_rules():
    assert A.check_includes("#include <cuda_runtime.h>\n#include <cstdint>\n") == []
    assert A.check_includes('#include "mma_hgemm.cuh"\n') == []          # our template by name
    r = A.check_includes('#include "../secret.h"\n')
    assert len(r) == 1 and "'..'" in r[0]
    r = A.check_includes("#include </etc/passwd>\n")
    assert len(r) == 1 and "absolute" in r[0]
    r = A.check_includes("#  include SOME_MACRO\n")
    assert len(r) == 1 and "computed" in r[0]
    r = A.check_includes('#include "my_local_helpers.h"\n')
    assert len(r) == 1 and "neither" in r[0]
    # before the build, a header that is merely not found is left to the compiler (a build
    # error, as a misspelt header is); escapes are still refused
    assert A.check_includes('#include "mma_hgem.cuh"\n#include "my_local_helpers.h"\n',
                            missing=False) == []
    for esc in ('#include "../secret.h"\n', "#include </etc/passwd>\n", "#include SOME_MACRO\n"):
        assert len(A.check_includes(esc, missing=False)) == 1, esc
    big = "// x\n" * (A.MAX_SOURCE_BYTES // 4)
    assert "bytes" in A.check_includes(big)[0]


@pytest.mark.parametrize("code, named", [
    ("k<<<g, b, 0, cudaStreamPerThread>>>(x);", "cudaStreamPerThread"),
    ("k<<<g, b, 0, cudaStreamLegacy>>>(x);", "cudaStreamLegacy"),
    ("cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, a, 0);", "CU_STREAM_PER_THREAD"),
    ("#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1", "CUDA_API_PER_THREAD_DEFAULT_STREAM"),
    ("#define __CUDART_API_PER_THREAD_DEFAULT_STREAM", "__CUDART_API_PER_THREAD_DEFAULT_STREAM"),
    ("cudaGetDriverEntryPoint(n, &f, cudaEnablePerThreadDefaultStream, &q);",
     "cudaEnablePerThreadDefaultStream"),
    ("cudaLaunchKernel_ptsz(f, g, b, a, 0, 0);", "cudaLaunchKernel_ptsz"),
    ("v.accessPolicyWindow.hitRatio = 1;", "accessPolicyWindow"),
    ("cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);", "cudaLimitPersistingL2CacheSize"),
])
def test_stream_and_l2_names_in_code_are_rejected(code, named):
    """A kernel launches on the stream it is given: code naming a default stream, a per-thread
    spelling or an L2 persistence control is rejected before it is built; the same words in a
    comment or a string literal are not code."""
    (why,) = A.check_source(f"int f() {{\n  {code}\n}}\n")
    assert named in why, why
    assert A.check_source(f"// never {named}\nconst char* s = \"{named}\";\n/* {named} */\n") == []
    assert A.check_source("k<<<g, b, 0, (cudaStream_t)stream>>>(x);  // the caller's stream\n") == []


MMA_F32 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
MMA_F16 = "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"
WG_F32 = "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"
WG_F16 = "wgmma.mma_async.sync.aligned.m64n128k16.f16.f16.f16"


@pytest.mark.parametrize("ptx, declared, rejected", [
    (f"{MMA_F32} {{..}};\n{MMA_F32} ..;", "f32", False),
    (f"{MMA_F32} ..;\n{MMA_F16} ..;", "f32", True),        # one fp16 path is enough to reject
    (f"{MMA_F16} ..;", "f16", False),
    (f"{WG_F32} ..;", "f32", False),
    (f"{WG_F16} ..;", "f32", True),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16 ..;", "f32", True),
    ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 ..;", "f32", False),
    ("fma.rn.f32 %f1, %f2, %f3, %f4;", "f32", False),      # SIMT: nothing to check statically
])
def test_accumulator_rule(ptx, declared, rejected):
    reasons, notes, counts = A.check_accumulator(ptx, declared)
    assert bool(reasons) == rejected, (reasons, notes)
    if rejected:
        assert "fp16" in reasons[0]


def test_meta_rules():
    good = {"style": "mma", "arch": "sm_90a", "acc": "f32", "layout": "RR", "tile": [128, 128, 32],
            "any_shape": True, "workspace_bytes": 0}
    assert A.check_meta(good, "sm_90a") == []
    assert "differs" in A.check_meta(good, "sm_80")[0]
    assert any("lacks" in r for r in A.check_meta({"style": "mma"}, "sm_90a"))
    assert any("tile" in r for r in A.check_meta({**good, "tile": [0, 1]}, "sm_90a"))
    assert any("workspace" in r for r in A.check_meta({**good, "workspace_bytes": -1}, "sm_90a"))
    assert any("acc" in r for r in A.check_meta({**good, "acc": "f8"}, "sm_90a"))


def test_meta_rules_for_runtime_options():
    """ABI 2 options are audited as docs/abi.md states them: a malformed declaration never loads."""
    good = {"style": "cutlass", "arch": "sm_90a", "acc": "f32", "layout": "RR",
            "tile": [128, 128, 64], "any_shape": True, "workspace_bytes": 0, "abi": 2,
            "options": [{"name": "swizzle", "values": [1, 2, 4, 8], "default": 1},
                        {"name": "raster", "values": [0, 1, 2], "default": 0}]}
    assert A.check_meta(good, "sm_90a") == []
    swz = good["options"][0]
    for meta, why in (({**good, "abi": 1}, 'declares options but not "abi": 2'),
                      ({k: v for k, v in good.items() if k != "abi"}, 'not "abi": 2'),
                      ({**good, "options": [swz, swz]}, "'swizzle' declared twice"),
                      ({**good, "options": [{**swz, "default": 3}]}, "must be"),
                      ({**good, "options": [{**swz, "values": [True, 2]}]}, "must be"),
                      ({**good, "options": [{**swz, "name": ""}]}, "must be"),
                      # index.csv stores 'name=value;...': a name it cannot hold never passes
                      ({**good, "options": [{**swz, "name": "SM_count"}]}, "lower-case word"),
                      ({**good, "options": [{**swz, "name": "a=1;b"}]}, "lower-case word"),
                      ({**good, "options": {"swizzle": [1, 8]}}, "options must be a list"),
                      ({**good, "abi": 3}, "abi must be one of")):
        assert any(why in r for r in A.check_meta(meta, "sm_90a")), (meta, why)
    # loading applies the same rules and refuses on the first
    import json
    from cudal2.core.abi import AbiError, parse_meta
    with pytest.raises(AbiError, match="declared twice"):
        parse_meta(json.dumps({**good, "options": [swz, swz]}))


# ---- the hostile corpus (nvcc; no GPU) ----------------------------------------------------
# file -> fragment of the expected reason. Every one must be rejected; the pool stays alive.
REJECTED = {
    "calls_cublas.cu": "cuBLAS",
    "allocates.cu": "allocates",
    "synchronises.cu": "synchronises",
    "private_stream.cu": "streams",
    "graph_capture.cu": "graphs",
    "thread_launch.cu": "threads",
    "system_call.cu": "processes",
    "reads_file.cu": "file",
    "dlopen_lib.cu": "dlopen",
    "host_asm.cu": "system-call instruction",
    "include_escape.cu": "'..'",
    "include_absolute.cu": "absolute",
    "fp16_acc_claims_f32.cu": "accumulates in fp16",
    "meta_garbage.cu": "not JSON",
    "meta_not_utf8.cu": "not UTF-8",
    "exports_runtime_name.cu": "cudaEventElapsedTime",
    "per_thread_stream.cu": "names a default stream",
    "legacy_stream.cu": "names a default stream",
    "l2_persist_stream.cu": "names an L2 persistence control",
}
LOAD_VERDICTS = {
    "ctor_segv.cu": ("load_crashed", "SIGSEGV"),
    "ctor_abort.cu": ("load_crashed", "SIGABRT"),
    "ctor_exit.cu": ("load_crashed", "exited"),
    "ctor_fork.cu": ("load_crashed", "created processes"),
    "meta_segv.cu": ("load_crashed", "SIGSEGV"),
    "meta_wild_pointer.cu": ("load_crashed", "SIGSEGV"),
}


@pytest.fixture(scope="module")
def pool():
    from cudal2.harness.worker import WorkerPool
    with WorkerPool(max_tasks=1) as p:
        yield p


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(REJECTED))
def test_hostile_file_rejected(name, pool):
    res = A.audit_file(HOSTILE / name, "sm_90a", pool=pool)
    assert not res.ok and res.verdict == "rejected", res.line()
    assert any(REJECTED[name] in r for r in res.reasons), res.reasons


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(LOAD_VERDICTS))
def test_hostile_load_is_a_verdict(name, pool):
    verdict, detail = LOAD_VERDICTS[name]
    res = A.audit_file(HOSTILE / name, "sm_90a", pool=pool)
    assert res.verdict == verdict and not res.ok, res.line()
    assert any(detail in r for r in res.reasons), res.reasons


@pytest.mark.compile
def test_hang_in_meta_times_out(pool):
    from cudal2.core.build import build_file
    br = build_file(HOSTILE / "meta_hang.cu")
    out = A.probe_meta(br.so_path, pool=pool, timeout_s=2)
    assert out.status == "timeout"
    assert pool.run("cudal2.harness.worker:_selftest_echo", 7).value == 7


@pytest.mark.compile
def test_control_kernel_accepted(pool):
    res = A.audit_file(HOSTILE / "control_ok.cu", "sm_90a", pool=pool)
    assert res.ok and res.verdict == "ok", res.line()
    assert res.meta["acc"] == "f32" and res.resources and res.resources[0]["registers"] > 0
    assert "libcudart" in " ".join(res.needed)
    assert "regs=" in res.line()


@pytest.mark.compile
def test_non_utf8_source_rejected(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_bytes(b"// \xff\xfe\n__global__ void k() {}\n")
    res = A.audit_file(bad)
    assert not res.ok and "UTF-8" in res.reasons[0]


@pytest.mark.compile
def test_linked_cublas_rejected_by_needed(pool):
    """DT_NEEDED: a library linked to cuBLAS is rejected even if it imports nothing from it."""
    from cudal2.core.build import BuildSpec, build
    src = (HOSTILE / "control_ok.cu").read_text()
    br = build(BuildSpec(src, "sm_90a", flags=("-Xlinker=--no-as-needed",), libraries=("cublas",),
                         name="linked-cublas"))
    assert br.ok, br.log[-2000:]
    if not any("cublas" in n for n in A.needed_libraries(br.so_path)):
        pytest.skip("the linker dropped the unused cuBLAS dependency (--as-needed)")
    res = A.audit_build(src, br, "sm_90a", pool=pool)
    assert not res.ok and any("links libraries" in r and "cublas" in r for r in res.reasons)


def _reference(family, **changes):
    from cudal2.core.build import build
    from cudal2.templates import FAMILIES
    cfg = FAMILIES[family].default().with_(**changes) if changes else FAMILIES[family].default()
    spec = FAMILIES[family].build_spec(cfg, "sm_90a")
    return spec, build(spec)


@pytest.mark.compile
@pytest.mark.parametrize("family, changes", [("mma", {}), ("mma", {"ACC": "f16"}), ("ptx", {})])
def test_reference_kernels_accepted(family, changes, pool):
    spec, br = _reference(family, **changes)
    assert br.ok, br.log[-2000:]
    res = A.audit_build(spec.source, br, "sm_90a", pool=pool)
    assert res.ok, res.line()
    assert res.mma and all(f".{res.meta['acc']}.f16.f16" in k for k in res.mma)


@pytest.mark.compile
def test_reference_cutlass_sm90_accepted(pool):
    """The CUTLASS 3 TMA/wgmma kernel needs the driver entry point (cuTensorMapEncodeTiled),
    cluster launch (cudaLaunchKernelExC) and prints diagnostics on std::cerr: all allowed.
    Shares its build with tests/test_templates.py through the build cache."""
    spec, br = _reference("cutlass_sm90")
    assert br.ok, br.log[-2000:]
    res = A.audit_build(spec.source, br, "sm_90a", pool=pool)
    assert res.ok, res.line()
    assert "cudaGetDriverEntryPointByVersion" in res.imports or "cudaGetDriverEntryPoint" in res.imports
    assert any(k.startswith("wgmma.mma_async") and ".f32.f16.f16" in k for k in res.mma)


@pytest.mark.compile
def test_cli_exit_codes(capsys):
    p = argparse.ArgumentParser()
    A.configure_parser(p)
    assert A.run_cli(p.parse_args([str(HOSTILE / "control_ok.cu"), "--arch", "sm_90a"])) == 0
    out = capsys.readouterr().out
    assert "control_ok.cu: ok regs=" in out
    rc = A.run_cli(p.parse_args([str(HOSTILE / "control_ok.cu"), str(HOSTILE / "synchronises.cu"),
                                 "--arch", "sm_90a"]))
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and len(out) == 2
    assert "synchronises.cu: REJECTED" in out[1] and "cudaDeviceSynchronize" in out[1]


def test_dependency_check_reads_the_builds_own_list():
    """The audit judges the files the compile read (recorded by the build with nvcc -MD) against
    the include roots the build allowed; a build without a list is refused."""
    from cudal2.core.build import BuildResult, parse_deps
    deps = parse_deps("kernel.so : kernel.cu \\\n /usr/include/stdio.h \\\n /opt/secret/x.h\n")
    assert deps == ("/opt/secret/x.h", "/usr/include/stdio.h")
    br = BuildResult("ok", "k", None, None, "", deps=deps, include_roots=("/usr/include",))
    (why,) = A.check_dependencies(br)
    assert "/opt/secret/x.h" in why and "outside" in why
    ok = BuildResult("ok", "k", None, None, "", deps=deps[1:], include_roots=("/usr/include",))
    assert A.check_dependencies(ok) == []
    assert "no dependency list" in A.check_dependencies(BuildResult("ok", "k", None, None, ""))[0]


@pytest.mark.compile
def test_a_build_records_what_it_read(tmp_cache):
    from cudal2.core.build import TEMPLATE_DIR, build
    from cudal2.templates import FAMILIES
    spec = FAMILIES["mma"].build_spec(FAMILIES["mma"].default(), "sm_90a")
    br = build(spec)
    assert br.ok and any(d.endswith("cuda_runtime.h") for d in br.deps)
    assert str(TEMPLATE_DIR.resolve()) in br.include_roots
    assert A.check_dependencies(br) == []
    assert build(spec).deps == br.deps               # the cache entry keeps the list


def test_cli_says_first_that_a_file_is_missing_or_unreadable(tmp_path, capsys):
    """A missing or unreadable file is the news: the line leads with it (no build, no
    ptxas stats), names the file, and the exit code is 1."""
    import os
    p = argparse.ArgumentParser()
    A.configure_parser(p)
    missing = tmp_path / "missing.cu"
    folder = tmp_path / "folder.cu"          # unreadable as a file for every user, root included
    folder.mkdir()
    unreadable = [folder]
    if os.geteuid() != 0:                    # root reads a mode-0 file
        locked = tmp_path / "locked.cu"
        locked.write_text("// a kernel\n")
        locked.chmod(0)
        unreadable.append(locked)
    rc = A.run_cli(p.parse_args([str(missing), *map(str, unreadable), "--arch", "sm_90a"]))
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and len(out) == 1 + len(unreadable), out
    assert out[0] == f"{missing}: MISSING - no such file: {missing}"
    assert "ptxas" not in "".join(out)
    for line, f in zip(out[1:], unreadable):
        assert line.startswith(f"{f}: UNREADABLE - cannot read {f}: "), line
    assert out[1].endswith("Is a directory")
    if len(unreadable) > 1:
        assert out[2].endswith("Permission denied")
    res = A.audit_file(missing)
    assert res.verdict == "missing" and not res.ok and str(missing) in res.reasons[0]


def test_audited_version_counts_only_rules_the_call_guard_applied():
    """A recorded audit stands for its rules' version only as far as the call guard watched the
    library's calls under them (a dry call, or the GPU run's guard record): a static audit alone,
    a guard that was off, one of older rules, or a rejection stands for less."""
    from cudal2.core.vocab import AUDIT_VERSION as V
    on = {"status": "on", "rules": V}
    assert A.audited_version({"ok": True, "audit_version": V, "call_guard": on}) == V
    assert A.audited_version({"ok": True, "audit_version": V,
                              "dry_call": {"status": "ok", "rules": V}}) == V
    assert A.audited_version({"ok": True, "audit_version": V}) == 0              # never watched
    assert A.audited_version({"ok": True, "audit_version": V,
                              "call_guard": {"status": "off: no compiler"}}) == 0
    assert A.audited_version({"ok": True, "audit_version": V,
                              "call_guard": {"status": "on"}}) == 1                # a v1 guard
    assert A.audited_version({"ok": True, "call_guard": on}) == 1                  # v1 rules
    assert A.audited_version({"ok": False, "audit_version": V, "call_guard": on}) == 0
    assert A.audited_version(None) == 0
    assert A.AuditResult(name="k", ok=True, verdict="ok").audit_version == V
