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
def reset_fake_cudart(tmp_path_factory):
    """tests/data/reset_fake_cudart.c built as a shared library: a fake CUDA runtime whose
    shared-memory opt-in is kept per function and dropped by a fake device reset."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path_factory.mktemp("reset_fake_cudart") / "libreset_fake_cudart.so"
    src = Path(__file__).parent / "data" / "reset_fake_cudart.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(so)],
                   check=True, capture_output=True, text=True)
    return so
