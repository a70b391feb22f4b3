"""Test tiers by hardware need: unit (pure Python), compile (nvcc, no GPU), gpu (marked, skipped
with a reason on machines without a CUDA device). Nothing here touches the GPU at import time."""

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
