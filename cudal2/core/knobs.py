"""Every environment knob cudal2 reads, declared once, typed, named CUDAL2_*.

Knobs are read through these functions when needed, never at import, so a test or a user can
set them at any time. The README's knob table lists the same names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    help: str


KNOBS: tuple[Knob, ...] = (
    Knob("CUDAL2_CACHE", "~/.cache/cudal2", "build cache and on-disk dispatch verdicts"),
    Knob("CUDAL2_DISABLE", "0", "1: cudal2.matmul is exactly torch.matmul"),
    Knob("CUDAL2_KERNELS", "<repo>/generated_kernels", "the tuned kernel table that dispatch serves"),
    Knob("CUDAL2_PDL", "0", "1: dispatch launches the kernels that offer option pdl (the skinny "
         "families, sm_90a) with programmatic dependent launch; the tuner never times it: "
         "compare `cudal2 bench --model` with 0 and 1"),
    Knob("CUDAL2_ARCH", "", "target arch when no GPU is visible (sm_80, sm_90a)"),
    Knob("CUDAL2_BUILD_JOBS", "<cpu count>", "parallel nvcc processes for build_many"),
    Knob("CUDAL2_LOG", "warning", "log level of the cudal2 logger"),
    Knob("CUDAL2_ADAPTER", "<repo>/rl/data/adapter", "the LoRA adapter the default policy (smollm2) merges"),
    Knob("CUDAL2_FAKE_DEVICE", "", "a time scale (e.g. 0.1): GPU workers answer as a fake device "
         "(synthetic timings, sleeps scaled), for CPU rehearsals of GPU runs; nothing it makes exports"),
    Knob("CUDA_HOME", "", "CUDA toolkit root, searched first for nvcc (standard name)"),
)


def _get(name: str) -> str:
    return os.environ.get(name, "").strip()


def _flag(name: str) -> bool:
    return _get(name).lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    value = _get("CUDAL2_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "cudal2"


def disabled() -> bool:
    return _flag("CUDAL2_DISABLE")


def pdl() -> bool:
    """CUDAL2_PDL: 0 (default) or 1; anything else is refused, not read as either."""
    value = _get("CUDAL2_PDL") or "0"
    if value not in ("0", "1"):
        raise ValueError(f"CUDAL2_PDL must be 0 or 1, got {value!r}")
    return value == "1"


def kernels_dir() -> Path:
    """CUDAL2_KERNELS, else the table that ships with the package: cudal2/generated_kernels in an
    installed wheel (packaged from the repository's top-level generated_kernels/), the
    repository's generated_kernels/ in a source checkout or editable install."""
    value = _get("CUDAL2_KERNELS")
    if value:
        return Path(value).expanduser()
    packaged = Path(__file__).resolve().parents[1] / "generated_kernels"
    return packaged if packaged.is_dir() else _REPO_ROOT / "generated_kernels"


def default_arch() -> str | None:
    return _get("CUDAL2_ARCH") or None


def build_jobs() -> int:
    value = _get("CUDAL2_BUILD_JOBS")
    if value:
        try:
            jobs = int(value)
        except ValueError:
            raise ValueError(f"CUDAL2_BUILD_JOBS must be an integer, got {value!r}") from None
        if jobs < 1:
            raise ValueError(f"CUDAL2_BUILD_JOBS must be >= 1, got {jobs}")
        return jobs
    return os.cpu_count() or 1


def log_level() -> str:
    return _get("CUDAL2_LOG") or "warning"


def adapter_dir() -> Path | None:
    """CUDAL2_ADAPTER: a LoRA adapter folder for the default policy (e.g. one trained on a GPU);
    None: the adapter that ships in rl/data/adapter."""
    value = _get("CUDAL2_ADAPTER")
    return Path(value).expanduser() if value else None


def fake_device_scale() -> float | None:
    """CUDAL2_FAKE_DEVICE: the time scale of the fake device (cudal2/harness/fakedevice.py), or
    None when unset (the real GPU, if any)."""
    value = _get("CUDAL2_FAKE_DEVICE")
    if not value:
        return None
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"CUDAL2_FAKE_DEVICE must be a time scale (a number > 0), got {value!r}") from None
    if not scale > 0:
        raise ValueError(f"CUDAL2_FAKE_DEVICE must be > 0, got {value!r}")
    return scale


def repo_root() -> Path:
    return _REPO_ROOT
