"""Where and with what a result was made: GPU, driver, clocks, versions, commit, host, time.

Nothing runs at import. The harness process never creates a CUDA context (only workers touch
the GPU), so GPU facts come from NVML (pynvml) or `nvidia-smi`; torch is asked for the GPU name
only when neither exists. Static facts are cached per process; clocks and temperature are live.
"""
from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path

from cudal2.core.toolchain import find_toolchain
from cudal2.harness import fakedevice
from cudal2.timing.kerneltime import visible_gpu_index

_REPO = Path(__file__).resolve().parents[2]


def _nvml(index: int) -> dict:
    try:
        import pynvml
    except ImportError:
        return {}
    out: dict = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        out["gpu"] = name.decode() if isinstance(name, bytes) else name
        drv = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        for key, fn in (("sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                        ("temp_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))):
            try:
                out[key] = int(fn())
            except Exception:  # noqa: BLE001 - not reported by this GPU
                pass
    except Exception:  # noqa: BLE001
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def _nvidia_smi(index: int) -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        r = subprocess.run([exe, f"--id={index}",
                            "--query-gpu=name,driver_version,clocks.sm,temperature.gpu",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=15)
        fields = [f.strip() for f in r.stdout.strip().splitlines()[0].split(",")]
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    out: dict = {}
    if len(fields) >= 2:
        out["gpu"], out["driver"] = fields[0], fields[1]
    for key, val in zip(("sm_clock_mhz", "temp_c"), fields[2:4]):
        try:
            out[key] = int(float(val))
        except ValueError:     # "[N/A]"
            pass
    return out


def gpu_facts() -> dict:
    """Live GPU facts (gpu, driver, sm_clock_mhz, temp_c) for the first visible GPU; {} if none."""
    idx = visible_gpu_index()
    return _nvml(idx) or _nvidia_smi(idx)


@functools.lru_cache(maxsize=1)
def gpu_visible() -> bool:
    """True when torch sees a CUDA GPU (no context is created by the check), or the fake device
    is on (cudal2/harness/fakedevice.py: CPU rehearsals)."""
    if fakedevice.enabled():
        return True
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


@functools.lru_cache(maxsize=1)
def gpu_name() -> str | None:
    """The GPU model the workers will run on (the results-DB cache key), or None."""
    if not gpu_visible():
        return None
    if fakedevice.enabled():
        return fakedevice.FAKE_GPU
    name = gpu_facts().get("gpu")
    if name:
        return name
    try:                        # last resort: asks the runtime (no kernel launched)
        import torch
        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        return None


@functools.lru_cache(maxsize=1)
def _static() -> dict:
    out: dict = {"hostname": socket.gethostname(), "python": platform.python_version()}
    try:
        import torch
        out["torch"] = torch.__version__
    except ImportError:
        out["torch"] = None
    try:
        out["nvcc"] = find_toolchain().version
    except Exception:  # noqa: BLE001 - no toolchain: still record the rest
        out["nvcc"] = None
    out["git_commit"] = git_commit()
    return out


def git_commit() -> str | None:
    """HEAD of the cudal2 checkout, with '-dirty' when tracked files differ; None outside git."""
    git = shutil.which("git")
    if git is None or not (_REPO / ".git").exists():
        return None
    try:
        head = subprocess.run([git, "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=15)
        if head.returncode != 0:
            return None
        dirty = subprocess.run([git, "-C", str(_REPO), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=30).returncode == 1
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def collect(*, gpu: bool | None = None) -> dict:
    """Everything a results row records about the environment. `gpu=False` skips GPU queries."""
    env = dict(_static())
    env["time"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if gpu if gpu is not None else gpu_visible():
        facts = gpu_facts()
        env.update(facts)
        env.setdefault("gpu", gpu_name())
    else:
        env.update(gpu=None, driver=None)
    return env
