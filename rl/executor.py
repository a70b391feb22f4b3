"""Where harness evaluations run: an in-process pool (default) or a Ray cluster.

An executor turns a batch of `EvalRequest`s into `Evaluation`s, in order. Everything goes
through the harness (`cudal2.harness.pipeline`: build -> audit -> screen / finals), which loads
kernel code only in its killable worker processes, so the executor itself never runs hostile
code.

- `LocalExecutor`: builds on every core (`jobs`, default CUDAL2_BUILD_JOBS, else all cores),
  one GPU measurement at a time. `evaluate_groups` is what the reward calls: without a GPU it
  builds and audits (rows `not_measured`, priced later from their builds); with one it runs a
  GRPO group the fast way (`GroupRunner`, through the harness's tournament,
  cudal2.harness.tournament): the group's kernels are built in parallel, screened
  (`pipeline.screen`, trusted=False: smoke check + a few kernel-time samples, one fresh worker
  each), and only the fastest screened kernel of each shape goes to finals (full correctness
  suite + one interleaved kernel-time session against the reward's baseline, in a fresh worker).
  Builds of the next shape run while the current shape is measured. The cuBLASLt autotune
  choice is made once per shape and reused (kept in the results DB's `baseline_choices`).
  `remeasure` is a fresh finals run (every baseline) for a new best (winner's curse).
- `RayExecutor`: one actor per GPU (`num_gpus=1`, pinned: Ray sets CUDA_VISIBLE_DEVICES) for
  finals, plus CPU actors for build+audit on machines without a GPU. Works against a cluster
  (`address="auto"` or `ray://...`) or a small local one (`address=None`, used in CI). Point
  `CUDAL2_CACHE` at a shared filesystem so compile workers and GPU workers share builds.

Throughput: every executor counts `fresh` evaluations (rows made by a screen or a final, not
served from the cache) and `gpu_seconds` (wall time the GPU worker pool was busy with them);
the run log prints fresh evaluations per GPU-minute (target >= 60), or "not measured: no GPU".
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from cudal2.core import knobs
from cudal2.core.build import BuildSpec, build, build_many
from cudal2.core.identity import source_sha
from cudal2.harness import evaluate, evaluate_many, provenance
from cudal2.harness.baselines import BaselineError, build_baselines
from cudal2.harness import tournament
from cudal2.harness.cluster import connect_ray, ray_actors
from cudal2.harness.pipeline import gpu_pool
from cudal2.harness.tournament import Entrant, FinalistPolicy, HarnessBackend
from cudal2.harness.types import Evaluation


def visible_gpu_name() -> str:
    """The local GPU model as the results DB keys it ("" with no GPU); never at import."""
    return provenance.gpu_name() or ""


def _evaluate_one(request, pool=None, **kw):
    try:
        return evaluate(request, pool=pool, gpu=pool is not None, **kw)
    except Exception as e:   # the harness's own failure: a row that yields no reward, never a crash
        return _error_row(request, e)


def _error_row(request, e):
    return Evaluation(status="error", source_sha=source_sha(request.source), shape=request.shape,
                      arch=request.arch, origin=request.origin,
                      detail=f"harness error: {type(e).__name__}: {e}"[:500])


class Executor:
    """Interface: evaluate_many(requests) -> list[Evaluation] (same order), evaluate_groups
    (the reward's entry point: screening where it helps), remeasure(request), close()."""
    name = "base"

    def __init__(self):
        self.fresh = 0              # rows made by a screen or a final (not the cache)
        self.gpu_seconds = 0.0      # wall time the GPU pool spent making them
        self.builds = 0

    def evaluate_many(self, requests):
        raise NotImplementedError

    def evaluate_groups(self, requests):
        return self.evaluate_many(requests)

    def remeasure(self, request):
        """A fresh finals run of one request (no cache in between)."""
        return self.evaluate_many([request])[0]

    def attach_db(self, db) -> None:
        """The reward's results DB: cuBLASLt autotune choices are read from and kept there."""

    def gpu_name(self) -> str:
        return ""

    def describe(self) -> str:
        return self.name

    def throughput(self) -> str:
        """Fresh evaluations per GPU-minute, as the run log prints it."""
        if not self.gpu_name():
            return "evaluations per GPU-minute: not measured: no GPU"
        if self.gpu_seconds <= 0:
            return "evaluations per GPU-minute: n/a (no GPU work yet)"
        rate = self.fresh / (self.gpu_seconds / 60.0)
        return (f"evaluations per GPU-minute: {rate:.0f} ({self.fresh} fresh in "
                f"{self.gpu_seconds:.1f} s of GPU work; target >= 60)")

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class GroupRunner:
    """A batch of requests (any shapes) the fast way on a GPU: builds in parallel, then per
    shape (in order, while later shapes still build) the harness's tournament
    (cudal2.harness.tournament.run): screen every audited kernel, the fastest goes to finals
    (RL's policy: one finalist), and if its finals fail the next fastest takes its place (at
    most `finals_per_group` replacements). Rows come back in input order: the finalist's final
    row; a non-finalist's screen row (stage 'screen'), whose `stats['rl']` holds its screened
    speedup relative to the finalist (`screened`: {baseline: speedup}, `finalist`: its sha);
    failures as screening found them.

    `build`, `screen` and `finals` are the harness steps (tests fake them)."""

    def __init__(self, executor, *, finals_per_group: int = 1):
        self.ex = executor
        self.finals_per_group = max(1, finals_per_group)
        self.policy = FinalistPolicy(top=1, within=0.0, cap=1, replacements=self.finals_per_group)
        self.events: list[tuple[str, object]] = []     # ("build"/"screen"/"final", key) in order

    # -- the harness (overridden by tests) -------------------------------------------------
    def build(self, request):
        return build(BuildSpec(request.source, arch=request.arch, name=request.origin or "rl"),
                     timeout=request.build_timeout_s)

    def _backend(self, r0):
        # policy code: screened one fresh worker each, finals never served from a cache here
        # (the reward stores its rows)
        return HarnessBackend(db=None, cache=False, screen_pool=self.ex._gpu_pool(),
                              finals_pool=self.ex._gpu_pool(), gpu=True, trusted=False,
                              baseline_libs=self.ex._baseline_libs(r0.arch), lt_known=self.ex.lt_known,
                              audits=self.ex.audits, screen_timeout_s=r0.timeout_s)

    def screen(self, shape, entrants):
        rows, ref = self._backend(entrants[0].request).screen(shape, entrants)
        if ref.get("torch_us"):
            self.ex.torch_us[shape] = min(ref["torch_us"], self.ex.torch_us.get(shape) or ref["torch_us"])
        return rows, {"torch_us": self.ex.torch_us.get(shape)}

    def finals(self, shape, entrants):
        try:
            return self._backend(entrants[0].request).finals(shape, entrants)
        except Exception as e:  # noqa: BLE001 - the harness's failure: a row, never a crash
            return [_error_row(en.request, e) for en in entrants]

    # -- the pipeline ---------------------------------------------------------------------------
    def run(self, requests) -> list:
        requests = list(requests)
        out: list = [None] * len(requests)
        order: dict = {}
        for i, r in enumerate(requests):
            order.setdefault(r.shape, []).append(i)
        lock = threading.Lock()
        runner = self

        class Steps:              # the tournament's backend: this runner's steps, logged
            def screen(self, shape, entrants):
                rows = runner.screen(shape, entrants)
                with lock:
                    runner.events.append(("screen", shape))
                return rows

            def finals(self, shape, entrants):
                rows = runner.finals(shape, entrants)
                with lock:
                    runner.events += [("final", requests.index(e.request)) for e in entrants]
                return rows

        def build(i):
            br = self.build(requests[i])
            with lock:
                self.events.append(("build", i))
            return br
        with ThreadPoolExecutor(max_workers=max(1, self.ex.jobs)) as pool:
            futures = {i: pool.submit(build, i) for idxs in order.values() for i in idxs}
            for shape, idxs in order.items():
                builds = [futures[i].result() for i in idxs]   # later shapes keep building
                self.ex.builds += len(idxs)
                t0 = time.perf_counter()
                res = tournament.run(shape, [Entrant(requests[i], b) for i, b in zip(idxs, builds)],
                                     Steps(), self.policy)
                rows = res.rows
                self.ex.gpu_seconds += time.perf_counter() - t0
                self.ex.fresh += sum(1 for r in rows if r is not None and r.status != "error")
                won = res.winner()
                finalist = won if won is not None and won[1].status == "ok" else None
                self._anchor(rows, finalist, {k: tournament.screen_us(r) for k, r in enumerate(res.screened)
                                              if tournament.screen_us(r)})
                for k, i in enumerate(idxs):
                    out[i] = rows[k]
        return out

    @staticmethod
    def _anchor(rows, finalist, screen_us) -> None:
        """Screened speedups of the non-finalists, relative to the finalist's final speedup
        (same shape, same screening): s_i = s_final * t_final_screen / t_i_screen."""
        if finalist is None:
            return
        k_fin, fin = finalist
        t_fin = screen_us.get(k_fin)
        for mode, per_base in (fin.speedups or {}).items():
            if per_base:
                break
        else:
            return
        if not t_fin:
            return
        for k, row in enumerate(rows):
            if k == k_fin or row is None or row.stage != "screen" or row.status != "ok":
                continue
            t = screen_us.get(k)
            if t:
                row.stats = {**(row.stats or {}), "rl": {
                    "screened": {b: s * t_fin / t for b, s in per_base.items()}, "mode": mode,
                    "finalist": fin.source_sha, "screen_us": t, "finalist_screen_us": t_fin}}


class LocalExecutor(Executor):
    """In-process; `jobs` parallel builds (default CUDAL2_BUILD_JOBS, else every core); one GPU
    measurement at a time."""
    name = "local"

    def __init__(self, jobs: int | None = None, *, screen: bool = True, finals_per_group: int = 1):
        super().__init__()
        self.jobs = max(1, jobs or knobs.build_jobs())
        self._gpu = visible_gpu_name()
        self._pool = None           # harness WorkerPool for the GPU, created on first use
        self.screen = screen
        self.finals_per_group = finals_per_group
        self.lt_known: dict = {}    # cuBLASLt autotune choices: once per shape, then reused
        self.audits: dict = {}      # audit verdicts by source sha (screening -> finals)
        self.torch_us: dict = {}    # screening's torch reference per shape
        self._libs: dict = {}
        self._db = None

    def gpu_name(self) -> str:
        return self._gpu

    def describe(self) -> str:
        how = ("group screening, finals for each group's fastest" if self._gpu and self.screen
               else "finals for every kernel" if self._gpu else "build + audit only")
        return f"local ({self.jobs} parallel builds, GPU: {self._gpu or 'none'}; {how})"

    def attach_db(self, db) -> None:
        self._db = db
        try:
            self.lt_known.update(db.baseline_choices())
        except Exception:       # noqa: BLE001 - a read-only or old DB: choose again
            pass

    def _gpu_pool(self):
        if self._pool is None:
            self._pool = gpu_pool()          # a fresh process per task, one spare booting
        return self._pool

    def _baseline_libs(self, arch):
        if arch not in self._libs:
            try:
                self._libs[arch] = build_baselines(arch)
            except BaselineError:            # the harness times torch and says why
                self._libs[arch] = None
        return self._libs[arch]

    def _keep_choices(self, before: set) -> None:
        if self._db is None:
            return
        for key in set(self.lt_known) - before:
            try:
                self._db.add_baseline_choice(key, self.lt_known[key])
            except Exception:    # noqa: BLE001
                pass

    def evaluate_many(self, requests):
        """Finals for every request: parallel builds on `jobs` cores, then one measurement at a
        time on the GPU (timings never share the device). Not stored here: the caller prices
        and stores (rl.reward)."""
        requests = list(requests)
        if not requests:
            return []
        if not self._gpu:
            try:
                out = evaluate_many(requests, db=None, jobs=self.jobs, gpu=False)
            except Exception:   # one bad request must not lose the batch: go one by one
                out = [_evaluate_one(r) for r in requests]
            self.builds += len(requests)
            return out
        builds = build_many([BuildSpec(r.source, arch=r.arch, name=r.origin or "rl") for r in requests],
                            jobs=self.jobs, timeout=max(r.build_timeout_s for r in requests))
        self.builds += len(requests)
        before = set(self.lt_known)
        out = []
        for r, br in zip(requests, builds):
            t0 = time.perf_counter()
            out.append(_evaluate_one(r, self._gpu_pool(), build_result=br,
                                     baseline_libs=self._baseline_libs(r.arch), lt_known=self.lt_known))
            self.gpu_seconds += time.perf_counter() - t0
            self.fresh += out[-1].status != "error"
        self._keep_choices(before)
        return out

    def evaluate_groups(self, requests):
        requests = list(requests)
        if not requests or not self._gpu or not self.screen:
            return self.evaluate_many(requests)
        before = set(self.lt_known)
        try:
            return GroupRunner(self, finals_per_group=self.finals_per_group).run(requests)
        finally:
            self._keep_choices(before)

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class RayExecutor(Executor):
    """Evaluations on a Ray cluster: one pinned actor per GPU, else `num_cpus` CPU actors."""
    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 compile_workers: int | None = None):
        super().__init__()
        self._ray, self._owns = connect_ray(address, num_cpus=num_cpus)
        self._actors, self.n_gpus = ray_actors(self._ray, _EvalActor, compile_workers=compile_workers)
        self._gpu = self._ray.get(self._actors[0].gpu_name.remote()) if self.n_gpus else ""

    def gpu_name(self) -> str:
        return self._gpu

    def describe(self) -> str:
        kind = f"{self.n_gpus} GPU actors ({self._gpu})" if self.n_gpus else \
            f"{len(self._actors)} CPU actors, no GPU"
        return f"ray ({kind})"

    def evaluate_many(self, requests):
        requests = list(requests)
        t0 = time.perf_counter()
        refs = [self._actors[i % len(self._actors)].evaluate.remote(r) for i, r in enumerate(requests)]
        out = self._ray.get(refs)
        if self._gpu:      # actors run in parallel: GPU time is wall time x GPUs in use
            self.gpu_seconds += (time.perf_counter() - t0) * min(len(requests), self.n_gpus)
            self.fresh += sum(e.status != "error" for e in out)
        return out

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
        self._lt: dict = {}

    def gpu_name(self) -> str:
        return self._gpu

    def evaluate(self, request):
        if self._gpu and self._pool is None:
            self._pool = gpu_pool()
        return _evaluate_one(request, self._pool, lt_known=self._lt)


def make_executor(kind: str = "local", *, address: str | None = None, jobs: int | None = None,
                  screen: bool = True, finals_per_group: int = 1) -> Executor:
    if kind == "local":
        return LocalExecutor(jobs, screen=screen, finals_per_group=finals_per_group)
    if kind == "ray":
        return RayExecutor(address, num_cpus=jobs)
    raise ValueError(f"unknown executor {kind!r}; use 'local' or 'ray'")
