"""Test tiers by hardware need: unit (pure Python), compile (nvcc, no GPU), gpu (marked, skipped
with a reason on machines without a CUDA device). Nothing here touches the GPU at import time."""

import shutil
import subprocess
from pathlib import Path

import pytest


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if "gpu" in item.keywords:
            if not checked:
                reason, checked = _gpu_reason(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty build cache for this test only."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDAL2_CACHE", str(d))
    return d


@pytest.fixture(scope="session")
def fake_runtime(tmp_path_factory):
    """fake_runtime(name): tests/data/<name>.c, a fake of the CUDA runtime calls a kernel's
    launcher makes, built as a shared library once per session; its path. Loaded with
    RTLD_GLOBAL before a kernel .so, its symbols win over libcudart's. Skips without a C compiler."""
    built = {}

    def lib(name: str) -> Path:
        if name not in built:
            cc = shutil.which("gcc") or shutil.which("cc")
            if cc is None:
                pytest.skip("no C compiler")
            so = tmp_path_factory.mktemp(name) / f"lib{name}.so"
            src = Path(__file__).parent / "data" / f"{name}.c"
            subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(so)],
                           check=True, capture_output=True, text=True)
            built[name] = so
        return built[name]
    return lib


@pytest.fixture(scope="session")
def reset_fake_cudart(fake_runtime):
    """The fake runtime whose shared-memory opt-in is kept per function and dropped by a fake
    device reset (tests/data/reset_fake_cudart.c)."""
    return fake_runtime("reset_fake_cudart")
