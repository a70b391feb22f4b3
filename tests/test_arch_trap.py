"""A kernel that needs sm_90a (wgmma, setmaxnreg) compiled for a target without the feature (a
generic compute_90 PTX pass, which nvcc emits for -arch=compute_90 and the driver could JIT for
any later GPU) must not compile to an empty body that "succeeds" with C unwritten: its body is
a trap, so a launch of that code fails loudly (lowlat_hgemm.cuh: CUDAL2_LL_TRAP;
wgmma_hgemm.cuh: the #elif of CUDAL2_WGMMA_DEVICE). cudal2.core.build only builds sm_90a for
Hopper (normalise_arch maps sm_90 to it), so the generic pass is compiled here directly with
nvcc -ptx (device code only, a few seconds, no GPU)."""
from __future__ import annotations

import re
import subprocess

import pytest

from cudal2.templates import FAMILIES, template_dir


def _entries(ptx: str) -> dict[str, str]:
    ms = list(re.finditer(r"^\.visible \.entry (\S+)\(", ptx, re.M))
    return {m.group(1): ptx[m.start():(ms[i + 1].start() if i + 1 < len(ms) else len(ptx))]
            for i, m in enumerate(ms)}


def _ptx(tmp_path, source: str, gencode: str) -> str:
    from cudal2.core.toolchain import ToolchainError, find_toolchain
    try:
        tc = find_toolchain()
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    (tmp_path / "k.cu").write_text(source)
    cmd = [str(tc.nvcc), "-std=c++17", "--expt-relaxed-constexpr", "-ptx", "-gencode", gencode,
           *tc.compile_flags(), "-I", str(template_dir()), "k.cu", "-o", "k.ptx"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return (tmp_path / "k.ptx").read_text()


CASES = [pytest.param(FAMILIES["lowlat"].default(), ("lowlat_kernel", "lowlat_splitk_kernel"), id="lowlat"),
         pytest.param(FAMILIES["lowlat"].default().with_(BM=128, LAYOUT="RC"),
                      ("lowlat_kernel", "lowlat_splitk_kernel"), id="lowlat-128-rc"),
         pytest.param(FAMILIES["wgmma"].default(), ("wgmma_hgemm_kernel",), id="wgmma")]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,kernels", CASES)
def test_generic_compute_90_body_traps(cfg, kernels, tmp_path):
    src = FAMILIES[cfg.family].instantiate(cfg)
    generic = _entries(_ptx(tmp_path, src, "arch=compute_90,code=compute_90"))
    for k in kernels:
        body = next((b for n, b in generic.items() if k in n), None)
        assert body is not None, (k, list(generic))
        assert "trap;" in body, f"{k}: the compute_90 body does not trap"
        assert "wgmma.mma_async" not in body and "mma.sync" not in body
    # the zero kernel (K == 0) needs no feature: it still writes C
    zero = next(b for n, b in generic.items() if "zero_kernel" in n)
    assert "trap;" not in zero and "st.global" in zero


@pytest.mark.compile
def test_sm90a_plain_lowlat_kernel_has_no_trap(tmp_path):
    """The trap is the featureless target's only: the sm_90a lowlat_kernel (splits == 1) has none
    (lowlat_splitk_kernel's is the zero-init contract's, splitk_fixup.cuh)."""
    cfg = FAMILIES["lowlat"].default()
    ptx = _entries(_ptx(tmp_path, FAMILIES["lowlat"].instantiate(cfg), "arch=compute_90a,code=compute_90a"))
    plain = next(b for n, b in ptx.items() if "lowlat_kernel" in n)
    assert "trap;" not in plain and "wgmma.mma_async" in plain
