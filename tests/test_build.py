"""The build step: nvcc into the content-addressed cache (needs nvcc, no GPU)."""
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.core import abi
from cudal2.core.build import (BuildSpec, build, build_file, build_many, cache_key, parse_ptxas,
                          trim_log)
from cudal2.core.toolchain import ToolchainError, find_toolchain

DATA = Path(__file__).parent / "data"
TINY = (DATA / "tiny_abi.cu").read_text()

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4mainv' for 'sm_90a'
ptxas info    : Function properties for _Z4mainv
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'reduce' for 'sm_90a'
ptxas info    : Function properties for reduce
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""


def test_parse_ptxas_per_entry_function():
    first, second = parse_ptxas(PTXAS_LOG)
    assert (first.function, first.registers, first.shared_bytes) == ("_Z4mainv", 255, 49152)
    assert (first.spill_stores, first.spill_loads, first.stack_bytes) == (8, 12, 16)
    assert (second.function, second.registers, second.shared_bytes, second.spill_stores) == ("reduce", 32, 0, 0)


def test_trim_log_keeps_errors():
    log = "\n".join(["noise"] * 50 + ["kernel.cu(3): error: expected a ';'"] + ["more"] * 5)
    assert trim_log(log) == "kernel.cu(3): error: expected a ';'"


def test_key_covers_source_flags_arch():
    spec = BuildSpec(TINY, arch="sm_90a")
    base = cache_key(spec, "13.0.88")
    assert base == cache_key(BuildSpec(TINY, arch="sm_90a", name="other name"), "13.0.88")
    assert base != cache_key(BuildSpec(TINY + " ", arch="sm_90a"), "13.0.88")
    assert base != cache_key(BuildSpec(TINY, arch="sm_80"), "13.0.88")
    assert base != cache_key(BuildSpec(TINY, arch="sm_90a", flags=("-DX=1",)), "13.0.88")
    assert base != cache_key(spec, "13.5.37")


@pytest.mark.compile
def test_build_then_cache_hit(tmp_cache):
    first = build(BuildSpec(TINY, arch="sm_90a"))
    assert first.ok, first.log
    assert not first.cached and first.so_path.exists() and first.ptx_path.exists()
    assert first.resources and first.spills == 0
    second = build(BuildSpec(TINY, arch="sm_90a"))
    assert second.cached and second.so_path == first.so_path and second.key == first.key
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(first.so_path)], capture_output=True, text=True).stdout
    assert "cudal2_hgemm" in symbols and "cudal2_meta" in symbols


@pytest.mark.compile
def test_a_device_only_build_is_the_librarys_device_code(tmp_cache):
    """device_only: nvcc -cubin, no host compile or link: the same SASS and ptxas figures as the
    library build, under a key of its own (the library's key unchanged), cached, never loadable;
    a library build of the same spec in the cache answers for it, with no compile."""
    from dataclasses import replace
    from cudal2.core.build import DEVICE_FLAGS
    from cudal2.core.toolchain import find_cuobjdump
    from cudal2.templates.buildspace import disassemble
    dev = build(replace(BuildSpec(TINY, arch="sm_90a"), device_only=True))
    lib = build(BuildSpec(TINY, arch="sm_90a"))
    assert lib.ok and dev.ok and not dev.cached and not lib.cached, dev.log
    assert dev.so_path is None and dev.binary_key is None and dev.key != lib.key
    assert lib.key == cache_key(BuildSpec(TINY, arch="sm_90a"), find_toolchain().version)
    assert dev.resources == lib.resources and "-cubin" in dev.log and "-shared" not in dev.log
    assert all(f in dev.log for f in DEVICE_FLAGS)
    cubin = tmp_cache / "builds" / dev.key[:2] / dev.key / "kernel.cubin"
    cuobjdump = find_cuobjdump()       # in the build extra; the SASS comparison needs it
    if cuobjdump:
        code = [[ln.split("/*")[1] for ln in disassemble(p, cuobjdump).splitlines() if ln.strip().startswith("/*0")]
                for p in (lib.so_path, cubin)]
        assert code[0] and code[0] == code[1]
    again = build(replace(BuildSpec(TINY, arch="sm_90a"), device_only=True))
    assert again.cached and again.resources == dev.resources
    cubin.unlink()
    # the library's entry answers for its device code: no second compile of the same source
    answered = build(replace(BuildSpec(TINY, arch="sm_90a"), device_only=True))
    assert answered.cached and answered.resources == lib.resources and answered.so_path is None
    assert answered.key == dev.key and not cubin.exists()
    other = replace(BuildSpec(TINY + "\n// not built as a library\n", arch="sm_90a"), device_only=True)
    assert not build(other).cached and not build(replace(other, device_only=False)).cached


@pytest.mark.compile
def test_build_error_is_data(tmp_cache):
    res = build(BuildSpec(TINY + "\nthis is not C++;\n", arch="sm_80"))
    assert res.status == "compile_error" and not res.ok and res.so_path is None
    assert "error" in res.summary()["log_tail"]
    again = build(BuildSpec(TINY + "\nthis is not C++;\n", arch="sm_80"))
    assert again.cached and again.status == "compile_error"  # failures are cached too


@pytest.mark.compile
def test_corrupt_entry_is_rebuilt(tmp_cache):
    first = build(BuildSpec(TINY, arch="sm_80"))
    (first.so_path.parent / "build.json").write_text("{not json")
    again = build(BuildSpec(TINY, arch="sm_80"))
    assert again.ok and not again.cached


def _build_in_child(args):
    cache, source = args
    os.environ["CUDAL2_CACHE"] = cache
    res = build(BuildSpec(source, arch="sm_80"))
    return res.ok, res.cached, res.key


@pytest.mark.compile
def test_two_concurrent_builders_build_once(tmp_cache):
    source = TINY + "\n// concurrent builders\n"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(_build_in_child, [(str(tmp_cache), source)] * 2)
    assert all(ok for ok, _, _ in results)
    assert len({key for _, _, key in results}) == 1
    assert sorted(cached for _, cached, _ in results) == [False, True]  # one built, one waited
    assert len(list((tmp_cache / "builds").glob("*/*/kernel.so"))) == 1


@pytest.mark.compile
def test_build_many_dedups_and_keeps_order(tmp_cache):
    a, b = BuildSpec(TINY, arch="sm_80"), BuildSpec(TINY + "//b\n", arch="sm_80")
    results = build_many([a, b, a], jobs=2)
    assert [r.ok for r in results] == [True] * 3
    assert results[0].key == results[2].key != results[1].key


@pytest.mark.compile
def test_abi_loads_meta_without_gpu(tmp_cache):
    res = build(BuildSpec(TINY, arch="sm_90a"))
    lib = abi.load_library(res.so_path)
    assert lib.meta["style"] == "mma" and lib.meta["acc"] == "f32"
    assert abi.load_library(res.so_path) is lib


@pytest.mark.compile
def test_abi_missing_symbol_is_named(tmp_cache):
    res = build(BuildSpec("extern \"C\" int something(void) { return 0; }\n", arch="sm_80"))
    assert res.ok, res.log
    with pytest.raises(abi.AbiError, match="missing symbol cudal2_hgemm"):
        abi.KernelLibrary(res.so_path)


def test_abi_meta_validation():
    with pytest.raises(abi.AbiError, match="not valid JSON"):
        abi.parse_meta("{")
    with pytest.raises(abi.AbiError, match="lacks"):
        abi.parse_meta('{"style": "mma"}')
    good = json.loads((DATA / "tiny_meta.json").read_text())
    assert abi.parse_meta(json.dumps(good))["layout"] == "RR"


def test_unreadable_file_is_data(tmp_path):
    res = build_file(tmp_path / "absent.cu")
    assert res.status == "toolchain_error" and "cannot read kernel file" in res.log


@pytest.mark.compile
def test_pip_nvcc_without_toolkit(tmp_cache, monkeypatch):
    """A machine without a toolkit: nvcc, headers and cudart from pip's nvidia-* packages."""
    from cudal2.core import toolchain
    pip_roots = [r for r in toolchain.pip_cuda_roots() if (r / "bin" / "nvcc").exists()]
    if not pip_roots:
        pytest.skip("nvidia-cuda-nvcc is not installed")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    tc = find_toolchain()
    assert str(tc.nvcc).startswith(str(pip_roots[0]))
    res = build(BuildSpec(TINY + "// pip nvcc\n", arch="sm_90a"))
    assert res.ok, res.log


def test_missing_nvcc_is_one_clear_error(tmp_cache, monkeypatch):
    from cudal2.core import toolchain
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(toolchain, "pip_cuda_roots", lambda: [])
    with pytest.raises(ToolchainError, match="nvcc not found.*pip install nvidia-cuda-nvcc"):
        find_toolchain()
    res = build(BuildSpec(TINY, arch="sm_90a"))
    assert res.status == "toolchain_error" and "nvcc not found" in res.log


def test_arch_detection(monkeypatch):
    from cudal2.core import toolchain
    assert toolchain.detect_arch("sm_90") == "sm_90a"
    assert toolchain.detect_arch("80") == "sm_80"
    monkeypatch.setenv("CUDAL2_ARCH", "sm_90a")
    assert toolchain.detect_arch() == "sm_90a"
    with pytest.raises(ValueError, match="unsupported arch"):
        toolchain.detect_arch("sm_35")


def test_missing_cutlass_is_one_clear_error(tmp_cache, monkeypatch, request):
    """A CUTLASS kernel on a machine without nvidia-cutlass: the build says what to install, as
    data; a kernel that does not include CUTLASS never needs it."""
    from cudal2.core.toolchain import cutlass_include_dirs
    monkeypatch.setitem(sys.modules, "cutlass_library", None)   # import fails
    cutlass_include_dirs.cache_clear()          # an earlier test may have found it already
    request.addfinalizer(cutlass_include_dirs.cache_clear)
    with pytest.raises(ToolchainError, match="pip install nvidia-cutlass"):
        cutlass_include_dirs()
    res = build(BuildSpec("#include <cutlass/cutlass.h>\n" + TINY, arch="sm_90a"))
    assert res.status == "toolchain_error" and "nvidia-cutlass" in res.log and res.so_path is None


def test_cli_build_arch_errors_are_messages(monkeypatch, tmp_path, capsys):
    from cudal2.cli import main
    kernel = tmp_path / "k.cu"
    kernel.write_text(TINY)
    monkeypatch.delenv("CUDAL2_ARCH", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["build", str(kernel)]) == 2
    assert "no GPU visible" in capsys.readouterr().err
    assert main(["build", str(kernel), "--arch", "sm_35"]) == 2
    assert "unsupported arch 'sm_35'" in capsys.readouterr().err


@pytest.mark.compile
def test_cli_build(tmp_cache, tmp_path):
    from cudal2.cli import main
    kernel = tmp_path / "k.cu"
    kernel.write_text(TINY)
    assert main(["build", str(kernel), "--arch", "sm_90a", "--json"]) == 0
    bad = tmp_path / "bad.cu"
    bad.write_text("nope")
    assert main(["build", str(bad), "--arch", "sm_90a"]) == 1


# Kept out of tests/data/hostile/, which the GPU kit builds and benches whole.
BOMB = (DATA / "build_bombs" / "compile_bomb.cu").read_text()


@pytest.mark.compile
def test_compile_that_exhausts_time_is_one_verdict(tmp_cache):
    res = build(BuildSpec(BOMB, arch="sm_80"), timeout=3)
    assert res.status == "timeout" and "nvcc killed after 3 s" in res.log
    assert not list((tmp_cache / "builds").glob("*/*/build.json"))  # a busy machine may finish later
    assert build(BuildSpec(TINY + "// after the bomb\n", arch="sm_80")).ok  # the builder lives on


@pytest.mark.compile
def test_compile_that_exhausts_memory_is_one_verdict(tmp_cache, monkeypatch):
    from cudal2.core import build as build_mod
    monkeypatch.setattr(build_mod, "NVCC_MEMORY_LIMIT", 1 << 30)  # 1 GiB instead of 12 for speed
    res = build(BuildSpec(BOMB, arch="sm_80"), timeout=300)
    assert res.status == "compile_error" and "out of memory" in res.log


_FAILING_LAUNCH = r"""
#include <cuda_fp16.h>
#include <cuda_runtime.h>
__global__ void one(half* c) { c[threadIdx.x] = __float2half(1.f); }
extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes, void* stream) {
  void* args[] = {&C};   // returns the launch's error as it is, leaving it pending (many launchers do)
  return (int)cudaLaunchKernel((const void*)&one, dim3(1), dim3(32), args, 0, (cudaStream_t)stream);
}
""" + TINY[TINY.index('extern "C" const char* cudal2_meta'):]

_PENDING_RUN = r"""
import ctypes, json, sys
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # before the kernel's libcudart
from cudal2.core import abi
lib = abi.load_library(sys.argv[2])
fake.fake_fail_launches(209)
vp, P = ctypes.c_void_p, 1 << 20
out = {"launch": lib.launch(P, P, P, 8, 8, 8, 8, 8, 8, 0, 0, 0), "after_launch": fake.cudaPeekAtLastError()}
out["raw"] = lib.raw_launch(vp(P), vp(P), vp(P), 8, 8, 8, 8, 8, 8, vp(0), ctypes.c_size_t(0), vp(0))
out["after_raw"] = fake.cudaPeekAtLastError()
out["cleared"] = abi.clear_cuda_error()
out["after_clear"] = fake.cudaPeekAtLastError()
print(json.dumps(out))
"""


@pytest.mark.compile
def test_a_failed_launch_leaves_no_cuda_error_pending(tmp_cache, fake_runtime):
    """A launcher that returns a launch error leaves it pending in the CUDA runtime, where torch's
    next launch check would raise it (an H200 run: one kernel's error 209 failed the next test).
    KernelLibrary.launch clears it after any non-zero return, and abi.clear_cuda_error (the
    dispatch hot path's, which calls the raw function) clears what a raw call left. Checked
    against tests/data/fake_cudart.c, whose launches fail on demand."""
    fake = fake_runtime("fake_cudart")
    res = build(BuildSpec(_FAILING_LAUNCH, arch="sm_90a", name="failing_launch"))
    assert res.ok, res.log
    r = subprocess.run([sys.executable, "-c", _PENDING_RUN, str(fake), str(res.so_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"launch": 209, "after_launch": 0, "raw": 209, "after_raw": 209,
                                    "cleared": 209, "after_clear": 0}, r.stdout


def test_a_test_run_builds_in_a_cache_of_its_own(tmp_path, monkeypatch, request):
    """tests/conftest.py: whatever CUDAL2_CACHE the user set, the tests build into theirs
    (CUDAL2_TEST_CACHE, else pytest's cache folder), so a run never grows the user's folder."""
    import conftest
    from cudal2.core import knobs
    assert knobs.cache_dir() != Path.home() / ".cache" / "cudal2"
    assert knobs.cache_dir() == conftest._test_cache(request.config)
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "user"))
    monkeypatch.setenv("CUDAL2_TEST_CACHE", str(tmp_path / "tests"))
    conftest.pytest_configure(request.config)
    assert knobs.cache_dir() == tmp_path / "tests"
    monkeypatch.delenv("CUDAL2_TEST_CACHE")
    no_cache = type("Config", (), {})()               # -p no:cacheprovider: no config.cache
    assert conftest._test_cache(no_cache) != tmp_path / "user"
