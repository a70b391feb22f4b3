"""The in-kernel split-K fixup (cudal2/templates/splitk_fixup.cuh) and the families using it.

CPU: the header's own __host__ __device__ code runs in a host program (tests/data/splitk_emulate.cu)
with CTAs arriving in random orders: deterministic mode is bit-identical across orders, the
workspace is all zero after every call and a stale semaphore traps. The binaries of split-K
builds launch one kernel per call: their only kernels are hgemm_kernel's two instantiations,
their imports hold no memset, and a call on a fake device pointer is refused or launched once.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cudal2.templates import FAMILIES, template_dir

DATA = Path(__file__).parent / "data"


def _emulate(tmp_path, deterministic: int) -> str:
    """Builds the emulation with the host C++ compiler (cuda_fp16.h is host-usable) and runs it."""
    import shutil
    from cudal2.core.toolchain import find_toolchain, nvcc_root, pip_cuda_roots
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    tc = find_toolchain()
    roots = [nvcc_root(tc.nvcc), Path(tc.nvcc).resolve().parent.parent, *pip_cuda_roots()]
    fp16 = [d for r in roots for d in (r / "include", *r.glob("targets/*/include"))
            if (d / "cuda_fp16.h").is_file()]
    if not fp16:
        pytest.skip("cuda_fp16.h not found")
    exe = tmp_path / f"emulate{deterministic}"
    subprocess.run([cxx, "-std=c++17", "-O1", "-x", "c++", f"-DSPLITK_DETERMINISTIC={deterministic}",
                    "-I", str(template_dir()), "-I", str(fp16[0]),
                    *tc.compile_flags(), str(DATA / "splitk_emulate.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.compile
def test_deterministic_fixup_is_bit_identical_whatever_the_arrival_order(tmp_path):
    out = _emulate(tmp_path, 1)
    oks = re.findall(r"^ok (\S+)", out, re.M)
    # 4 shapes x (zero after, close, bit-identical, stale traps) + the shared workspace
    assert len(oks) == 17, out
    assert sum(o.startswith("bit_identical") for o in oks) == 4
    assert re.findall(r"^distinct (\d+)", out, re.M) == ["1"] * 4


@pytest.mark.compile
def test_atomic_fixup_keeps_the_workspace_contract(tmp_path):
    out = _emulate(tmp_path, 0)
    oks = re.findall(r"^ok (\S+)", out, re.M)
    assert len(oks) == 13 and "shared_workspace_across_shapes" in oks, out
    # arrival-order accumulation really is order-dependent (why it is not the default)
    assert max(int(n) for n in re.findall(r"^distinct (\d+)", out, re.M)) > 1, out


def _entries(ptx: str) -> list[str]:
    """The __global__ functions of a build (its PTX's .entry directives)."""
    return re.findall(r"\.entry\s+(\w+)", ptx)


# the split-K corners tests/test_templates.py builds too (one build each in the cache)
SPLIT_CASES = [
    FAMILIES["mma"].default().with_(ACC="f16", LAYOUT="RC", SPLITK=4, BK=64, STAGES=4, SWIZZLE=1),
    FAMILIES["ptx"].default().with_(ACC="f16", LAYOUT="RC", SPLITK=2),
]


@pytest.mark.compile
@pytest.mark.parametrize("cfg", SPLIT_CASES, ids=lambda c: c.family)
def test_split_k_build_is_one_kernel_and_no_memset(cfg):
    from cudal2.core.build import build
    from cudal2.harness import audit
    r = build(FAMILIES[cfg.family].build_spec(cfg, "sm_90a"))
    assert r.ok and r.spills == 0, r.log[-2000:]
    names = _entries(r.ptx_path.read_text())
    # the main kernel's two instantiations (16-byte loads, guarded loads): no reduce or zero kernel
    assert len(names) == 2 and all("hgemm_kernel" in n for n in names), names
    ptx = r.ptx_path.read_text()
    assert "mma.sync.aligned.m16n8k16" in ptx and "atom.global.add.u32" in ptx, cfg.label()
    from test_wgmma import _cuobjdump
    tool = _cuobjdump()
    if tool:   # the tensor-core instruction in the SASS (needs cuobjdump)
        sass = subprocess.run([tool, "-sass", str(r.so_path)], capture_output=True, text=True,
                              check=True).stdout
        assert "HMMA.16816" in sass
    imports = audit.undefined_symbols(r.so_path)
    assert not [s for s in imports if "Memset" in s or "Memcpy" in s], imports
    launches = [s for s in imports if "Launch" in s]
    assert launches, imports


@pytest.mark.compile
@pytest.mark.parametrize("cfg", SPLIT_CASES, ids=lambda c: c.family)
def test_split_k_meta_declares_the_zero_init_workspace(cfg):
    from cudal2.core.abi import load_library
    from cudal2.core.build import build
    lib = load_library(build(FAMILIES[cfg.family].build_spec(cfg, "sm_90a")).so_path)
    m = lib.meta
    p = cfg.as_dict()
    assert m["workspace_zero_init"] is True and m["splitk_fixup"] == "deterministic"
    X, BM, BN = p["SPLITK_MAX_MN"], p["BM"], p["BN"]
    tiles = X // (BM * BN) + X // min(BM, BN) + 3
    assert m["workspace_bytes"] == -(-p["SPLITK"] * 4 * X // 16) * 16 + 4 * tiles
    # too small a workspace for 64 x 64 (partials + one semaphore) is refused before any access
    P = 1 << 20
    need = p["SPLITK"] * 64 * 64 * 4 + 4
    assert lib.launch(P, P, P, 64, 64, 64, 64, 64, 64, P, need - 1, 0) == 1
    assert lib.launch(P, P, P, 64, 64, 64, 64, 64, 64, P + 8, need, 0) == 1   # not 16-byte aligned
