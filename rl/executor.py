"""Where harness evaluations run: an in-process pool (default) or a Ray cluster.

An executor turns a batch of `EvalRequest`s into `Evaluation`s, in order. Both run
`cudal2.harness.evaluate()` (build -> audit -> check -> time), which loads kernel code only in its
killable worker processes, so the executor itself never runs hostile code.

- `LocalExecutor`: `cudal2.harness.evaluate_many` in this process: parallel nvcc builds on
  `jobs` cores, then one GPU measurement at a time, so timings never overlap.
- `RayExecutor`: one actor per GPU (`num_gpus=1`, pinned: Ray sets CUDA_VISIBLE_DEVICES) for
  check+time, plus CPU actors for build+audit on machines without a GPU. Works against a cluster
  (`address="auto"` or `ray://...`) or a small local one (`address=None`, used in CI). Point
  `CUDAL2_CACHE` at a shared filesystem so compile workers and GPU workers share builds.
"""
from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[1])


def visible_gpu_name() -> str:
    """The local GPU model as the results DB keys it ("" with no GPU); never at import."""
    from cudal2.harness import provenance
    return provenance.gpu_name() or ""


def _evaluate_one(request, pool=None):
    from cudal2.harness import evaluate
    try:
        return evaluate(request, pool=pool, gpu=pool is not None)
    except Exception as e:   # the harness's own failure: a row that yields no reward, never a crash
        from cudal2.harness.types import Evaluation
        from cudal2.core.identity import source_sha
        return Evaluation(status="error", source_sha=source_sha(request.source), shape=request.shape,
                          arch=request.arch, origin=request.origin,
                          detail=f"harness error: {type(e).__name__}: {e}"[:500])


class Executor:
    """Interface: evaluate_many(requests) -> list[Evaluation] (same order); close()."""
    name = "base"

    def evaluate_many(self, requests):
        raise NotImplementedError

    def gpu_name(self) -> str:
        return ""

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalExecutor(Executor):
    """In-process thread pool; `jobs` parallel evaluations (default CUDAL2_BUILD_JOBS)."""
    name = "local"

    def __init__(self, jobs: int | None = None):
        from cudal2.core import knobs
        self.jobs = max(1, jobs or knobs.build_jobs())
        self._gpu = visible_gpu_name()
        self._pool = None           # harness WorkerPool for the GPU, created on first use

    def gpu_name(self) -> str:
        return self._gpu

    def describe(self) -> str:
        return f"local ({self.jobs} parallel builds, GPU: {self._gpu or 'none'})"

    def evaluate_many(self, requests):
        """cudal2.harness.evaluate_many: parallel builds on `jobs` cores, then one measurement
        at a time on the GPU (timings never share the device). Not stored here: the caller
        adds estimates first, then stores (rl.reward)."""
        from cudal2.harness import evaluate_many
        requests = list(requests)
        if not requests:
            return []
        if self._gpu and self._pool is None:
            from cudal2.harness.pipeline import gpu_pool
            self._pool = gpu_pool()
        try:
            return evaluate_many(requests, db=None, pool=self._pool, jobs=self.jobs,
                                 gpu=bool(self._gpu), executor=None)
        except Exception:       # one bad request must not lose the batch: go one by one
            return [_evaluate_one(r, self._pool) for r in requests]

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class RayExecutor(Executor):
    """Evaluations on a Ray cluster: one pinned actor per GPU, else `num_cpus` CPU actors."""
    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 compile_workers: int | None = None):
        import ray
        self._ray = ray
        self._owns = False
        if not ray.is_initialized():
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)}}
            for k in ("CUDAL2_CACHE", "CUDAL2_ARCH", "CUDAL2_KERNELS"):
                if os.environ.get(k):
                    env["env_vars"][k] = os.environ[k]
            kw = dict(runtime_env=env, ignore_reinit_error=True, logging_level="ERROR",
                      log_to_driver=False)
            if address:
                ray.init(address=address, **kw)
            else:
                ray.init(num_cpus=num_cpus or 2, include_dashboard=False, **kw)
            self._owns = True
        res = ray.cluster_resources()
        self.n_gpus = int(res.get("GPU", 0))
        actor_cls = ray.remote(_EvalActor)
        if self.n_gpus:
            self._actors = [actor_cls.options(num_gpus=1, num_cpus=1).remote()
                            for _ in range(self.n_gpus)]
        else:
            n = compile_workers or max(1, int(res.get("CPU", 1)))
            self._actors = [actor_cls.options(num_cpus=1).remote() for _ in range(n)]
        self._gpu = ray.get(self._actors[0].gpu_name.remote()) if self.n_gpus else ""

    def gpu_name(self) -> str:
        return self._gpu

    def describe(self) -> str:
        kind = f"{self.n_gpus} GPU actors ({self._gpu})" if self.n_gpus else \
            f"{len(self._actors)} CPU actors, no GPU"
        return f"ray ({kind})"

    def evaluate_many(self, requests):
        requests = list(requests)
        refs = [self._actors[i % len(self._actors)].evaluate.remote(r) for i, r in enumerate(requests)]
        return self._ray.get(refs)

    def close(self):
        for a in getattr(self, "_actors", []):
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self._actors = []
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns = False


class _EvalActor:
    """One Ray worker: a harness WorkerPool on its (pinned) GPU, or plain build+audit on CPU."""

    def __init__(self):
        self._gpu = visible_gpu_name()
        self._pool = None

    def gpu_name(self) -> str:
        return self._gpu

    def evaluate(self, request):
        if self._gpu and self._pool is None:
            from cudal2.harness.pipeline import gpu_pool
            self._pool = gpu_pool()
        return _evaluate_one(request, self._pool)


def make_executor(kind: str = "local", *, address: str | None = None, jobs: int | None = None) -> Executor:
    if kind == "local":
        return LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(address, num_cpus=jobs)
    raise ValueError(f"unknown executor {kind!r}; use 'local' or 'ray'")
