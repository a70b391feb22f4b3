"""Where GPU work runs beyond one GPU: every visible GPU of this machine (one worker pool pinned
per GPU with CUDA_VISIBLE_DEVICES) or a Ray cluster (one actor per GPU; Ray pins it). The
campaign spreads its shapes over them; the RL executor's RayExecutor connects through here too.
Results always come back to the calling process, whose one writer (pipeline.record) stores them.
"""
from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
# the settings a Ray worker needs to find the same caches and kernels as the driver
_FORWARDED = ("CUDAL2_CACHE", "CUDAL2_ARCH", "CUDAL2_KERNELS", "CUDAL2_USER_KERNELS",
              "CUDAL2_BUILD_IN_CALL")


def visible_devices() -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names a worker can be pinned to: the entries
    of the caller's own CUDA_VISIBLE_DEVICES when set (so a pinned parent stays within its
    GPUs), else 0..n-1 for torch's device count ([] without torch or a GPU)."""
    try:
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no driver: no GPU
        n = 0
    own = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return own[:n] if own else [str(i) for i in range(n)]


def connect_ray(address: str | None = None, *, num_cpus: int | None = None):
    """(ray, owns): Ray initialised against `address` ("auto", "ray://..."), or a small local
    cluster of `num_cpus` CPUs when address is None (tests, one machine). owns: this call
    started it (the caller shuts it down). Workers get the repository on PYTHONPATH and the
    driver's CUDAL2_CACHE / CUDAL2_ARCH / CUDAL2_KERNELS."""
    import ray
    if ray.is_initialized():
        return ray, False
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)}}
    for k in _FORWARDED:
        if os.environ.get(k):
            env["env_vars"][k] = os.environ[k]
    kw = dict(runtime_env=env, ignore_reinit_error=True, logging_level="ERROR", log_to_driver=False)
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(num_cpus=num_cpus or 2, include_dashboard=False, **kw)
    return ray, True


def ray_actors(ray, cls, *args, compile_workers: int | None = None) -> tuple[list, int]:
    """(actors, GPUs): one actor of `cls` per GPU of the cluster (num_gpus=1: Ray pins it with
    CUDA_VISIBLE_DEVICES), else one per CPU (at most compile_workers) on a cluster without GPUs."""
    res = ray.cluster_resources()
    n_gpus = int(res.get("GPU", 0))
    remote = ray.remote(cls)
    if n_gpus:
        return [remote.options(num_gpus=1, num_cpus=1).remote(*args) for _ in range(n_gpus)], n_gpus
    n = compile_workers or max(1, int(res.get("CPU", 1)))
    return [remote.options(num_cpus=1).remote(*args) for _ in range(n)], 0
