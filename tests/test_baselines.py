"""Baselines: sources build and link cuBLAS/cuBLASLt (compile), the autotune cache (unit), and
on a GPU every baseline computes the same product as torch."""
import json
import shutil
import subprocess

import pytest

from cudal2.harness import baselines
from cudal2.harness.baselines import AutotuneCache


def test_sources_are_data_files_with_the_exported_abi():
    for lib, symbols in baselines.EXPORTS.items():
        text = baselines.source(lib)
        assert 'extern "C"' in text
        for sym in symbols:
            assert sym in text, (lib, sym)
    with pytest.raises(ValueError, match="unknown baseline library"):
        baselines.source("cudnn")


def test_workspace_is_a_proper_32_mib():
    assert baselines.WORKSPACE_BYTES == 33554432    # CUDA-L2's int overflow gave 0 bytes
    assert baselines.LT_REQUESTED_ALGOS >= 16


def test_autotune_cache_roundtrip_and_corruption(tmp_path):
    cache = AutotuneCache(tmp_path / "at.json")
    key = baselines.autotune_key("NVIDIA H100", 130000, 64, 128, 256, "f32", "RR")
    assert "64x128x256" in key and "f32" in key and "NVIDIA H100" in key
    assert cache.get(key) is None
    cache.put(key, {"index": 3, "algos": 17, "median_us": 5.5})
    other = baselines.autotune_key("NVIDIA H100", 130000, 64, 128, 256, "f16", "RR")
    cache.put(other, {"index": 1, "algos": 9, "median_us": 4.0})
    assert AutotuneCache(tmp_path / "at.json").get(key)["index"] == 3
    assert cache.get(other)["index"] == 1
    (tmp_path / "at.json").write_text("{not json")
    assert cache.get(key) is None                  # a corrupt file is ignored, then rewritten
    cache.put(key, {"index": 0, "algos": 1, "median_us": 1.0})
    assert json.loads((tmp_path / "at.json").read_text())[key]["index"] == 0


def _need_nvcc_readelf_and_cublas():
    """Skip, naming what is missing, unless the baselines can be built and inspected here."""
    from cudal2.core.toolchain import ToolchainError, find_toolchain, has_cublas

    if not shutil.which("readelf"):
        pytest.skip("readelf not installed")
    try:
        tc = find_toolchain()
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    if not has_cublas(tc):
        pytest.skip("cuBLAS libraries not installed (pip install nvidia-cublas)")


def _readelf(path, flag):
    return subprocess.run(["readelf", flag, "-W", str(path)], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_baselines_build_link_cublas_and_export_symbols(arch):
    _need_nvcc_readelf_and_cublas()
    libs = baselines.build_baselines(arch)
    for lib, so in libs.items():
        needed = _readelf(so, "-d")
        # each library links what it calls (the linker drops the other with --as-needed)
        want = "libcublas.so" if lib == "cublas" else "libcublasLt.so"
        assert f"Shared library: [{want}" in needed, (lib, needed)
        dyn = _readelf(so, "--dyn-syms")
        for sym in baselines.EXPORTS[lib]:
            assert any(line.split()[-1] == sym and " FUNC " in line and " UND " not in line
                       for line in dyn.splitlines() if line.strip()), (lib, sym)


_LOAD_CARRIED = """
import ctypes, os, sys
from cudal2.harness import baselines
try:
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL | os.RTLD_NOW)
    print("loaded without help")
except OSError as exc:
    print("plain dlopen failed:", exc)
lib = baselines.CublasLib(sys.argv[1])
print("loaded", lib.run.__name__)
"""


@pytest.mark.compile
def test_a_carried_baseline_finds_cublas_by_soname(tmp_path):
    """A baseline .so built on another machine (RUNPATH names a folder that does not exist here)
    still loads: pip's cuBLAS(Lt) and cudart are preloaded by soname."""
    import sys

    _need_nvcc_readelf_and_cublas()
    so = baselines.build_baselines("sm_90a")["cublas"]
    data = open(so, "rb").read()
    runpath = _readelf(so, "-d").split("Library runpath: [", 1)[1].split("]", 1)[0].encode()
    assert runpath in data
    # same length, so the ELF stays valid: the build machine's folder, gone
    carried = tmp_path / "carried.so"
    carried.write_bytes(data.replace(runpath, b"/" + b"x" * (len(runpath) - 1)))
    out = subprocess.run([sys.executable, "-c", _LOAD_CARRIED, str(carried)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "plain dlopen failed: libcu" in out.stdout, out.stdout
    assert "loaded cudal2_cublas_run" in out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("acc", ["f32", "f16"])
@pytest.mark.parametrize("layout", ["RR", "RC"])
def test_every_baseline_matches_the_reference_on_gpu(acc, layout, tmp_path):
    import torch

    from cudal2.core.toolchain import detect_arch

    from cudal2.harness.measure import OperandPool

    M, N, K = 256, 384, 512
    libs = baselines.build_baselines(detect_arch())
    run = baselines.BaselineRunners(libs, M, N, K, acc, layout)
    pool = OperandPool(M, N, K, 2, "cuda")
    a, b, b_rc = pool.a(0), pool.b_rr(0), pool.b_rc(0)

    def verify(c, i):
        return pool.verify(c, i, acc=acc)
    entry = run.autotune(pool, torch.cuda.get_device_name(), verify=verify,
                         cache=AutotuneCache(tmp_path / "at.json"))
    assert entry["source"] == "tuned now" and entry["timer"] == "kernel"
    again = baselines.BaselineRunners(libs, M, N, K, acc, layout)
    assert again.autotune(pool, torch.cuda.get_device_name(), known={entry["key"]: entry},
                          verify=verify)["source"] == "results DB"
    again.close()
    names = ["torch", "cublas_nn", "cublas_tn", "cublaslt_heuristic", "cublaslt_autotuned",
             "torch_cublas", "torch_cublaslt"]
    for name in names:
        c = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
        assert run.launcher(name)(a, b, b_rc, c) == 0, name
        torch.cuda.synchronize()
        assert verify(c, 0) is None, name
    assert run.lt_algos >= 1
    run.close()


# ---- cuBLASLt autotune: the key, and a known key skips the timing ----------------------------------

def test_autotune_key_names_gpu_model_shape_dtype_acc_layout():
    k = baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RC")
    parts = k.split("|")
    assert parts[:6] == ["NVIDIA H100 80GB HBM3", "cublasLt 130100", "64x128x256", "f16", "f32", "RC"]
    # another GPU model, cuBLASLt, shape, accumulator or layout is another key
    for other in (baselines.autotune_key("NVIDIA H200", 130100, 64, 128, 256, "f32", "RC"),
                  baselines.autotune_key("NVIDIA H100 80GB HBM3", 130200, 64, 128, 256, "f32", "RC"),
                  baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 512, "f32", "RC"),
                  baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f16", "RC"),
                  baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RR"),
                  baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RC",
                                         dtype="bf16")):
        assert other != k
    # the GPU name is spelled as the kernel table spells it (whitespace runs collapsed)
    assert baselines.autotune_key(" NVIDIA  H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RC") == k


class _FakeLt:
    def version(self):
        return 130100


class _Pool:
    """Operand sets of nothing: the fake launches ignore them."""
    n_sets = 65

    def a(self, i):
        return None
    b_rr = b_rc = a


def _runners(algos=4):
    """BaselineRunners without a GPU: a fake cuBLASLt, algorithms that launch nothing."""
    import torch

    r = baselines.BaselineRunners.__new__(baselines.BaselineRunners)
    r.torch, r.M, r.N, r.K, r.acc, r.layout = torch, 64, 128, 256, "f32", "RR"
    r.lt, r.lt_algos, r.lt_autotuned_index, r.notes = _FakeLt(), algos, None, {}
    r.lt_launcher = lambda i: (lambda a, b_rr, b_rc, c: 0)
    return r


def test_a_known_autotune_key_skips_the_timing_entirely(monkeypatch):
    from cudal2.timing import kerneltime as KT

    def no_timing(*a, **kw):
        raise AssertionError("a known key must not be timed again")
    monkeypatch.setattr(KT, "time_kernels", no_timing)
    key = baselines.autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RR")
    r = _runners()
    e = r.autotune(None, "NVIDIA H100 80GB HBM3", known={key: {"index": 2, "algos": 4}})
    assert e["source"] == "results DB" and e["key"] == key and r.lt_autotuned_index == 2
    # a choice stored under the key before it named the dtype (all fp16) still answers
    old = baselines.legacy_autotune_key("NVIDIA H100 80GB HBM3", 130100, 64, 128, 256, "f32", "RR")
    r = _runners()
    assert r.autotune(None, "NVIDIA H100 80GB HBM3", known={old: {"index": 1}})["source"] == "results DB"
    assert r.lt_autotuned_index == 1
    # an H100's choice does not answer on an H200: the H200 tunes (here: reaches the timer)
    with pytest.raises(AssertionError, match="must not be timed"):
        _runners().autotune(_Pool(), "NVIDIA H200", known={key: {"index": 2}}, device="cpu",
                            backend=object())
    # an index past what today's heuristic returns is not reused either
    with pytest.raises(AssertionError, match="must not be timed"):
        _runners(algos=2).autotune(_Pool(), "NVIDIA H100 80GB HBM3", known={key: {"index": 3}},
                                   device="cpu", backend=object())


def test_autotune_times_by_the_sessions_cold_method(monkeypatch):
    from cudal2.timing import kerneltime as KT

    seen = []

    class Fake:
        def __init__(self, fns, cfg):
            self.fns = fns
            seen.append(cfg.cold)

        def time(self, k):
            return KT.S.Interval(1.0 + int(k[4:]), 1.0, 1.0, 1)

    monkeypatch.setattr(KT, "time_kernels", lambda fns, cfg, backend, n_sets: Fake(fns, cfg))
    e = _runners().autotune(_Pool(), "NVIDIA H100 80GB HBM3", device="cpu", cold="flush",
                            backend=object())
    assert e["source"] == "tuned now" and e["index"] == 0 and "|f16|" in e["key"]
    assert seen == ["flush", "flush"]
