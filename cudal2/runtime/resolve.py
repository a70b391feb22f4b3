"""Once per (device, shape, layout): which kernel serves it (plan, load, maybe race), kept in
the serving table the hot path reads. The table of tuned kernels is the shipped one
(knobs.kernels_dir()) with the user's (knobs.user_kernels_dir()) layered over it
(cudal2.core.tables)."""
from __future__ import annotations

import ctypes
import logging
import threading
import time
import warnings

import torch

from cudal2.core import knobs
from cudal2.core.tables import SHIPPED, Tables, load_tables
from cudal2.core.vocab import ARCH_BY_CAPABILITY, gpu_key
from cudal2.runtime import race as R
from cudal2.runtime.loader import KernelLoader, KernelLoadError, KernelNotBuilt, Workspaces, launcher
from cudal2.runtime.plan import MAX_PROBES, SERVED_ACC, Decision, TableEntry, plan

log = logging.getLogger("cudal2.runtime")

TORCH = ("torch",)  # serving-table value: this (device, shape, layout) goes to torch.matmul
RACED = ("nearest", "other_gpu")   # plan() decisions whose candidates race torch before serving

# (dev, M, N, K, layout) -> launcher(...) tuple | TORCH. One dict for the process, cleared (never
# rebound) by reset(), so the hot path can hold it by name.
serving: dict[tuple, object] = {}
workspaces = Workspaces()


class State:
    """What resolving has learned: the table, loaded kernels' metas, broken kernels, arches."""

    def __init__(self, loader: KernelLoader | None = None):
        self.lock = threading.RLock()            # held while resolving a new shape
        self.loader = loader or KernelLoader()
        self.tables: Tables | None = None
        self.table: dict[tuple, TableEntry] | None = None
        self.metas: dict[str, dict] = {}
        self.broken: set[str] = set()
        # serving keys decided without a kernel that was not built (CUDAL2_BUILD_IN_CALL=0):
        # forgotten by redecide_unbuilt() after warmup, so they are decided again
        self.unbuilt: set[tuple] = set()
        self.told_unbuilt: set[str] = set()       # kernels already named at WARNING
        self.arch: dict[int, str | None] = {}
        self.gpu: dict[int, str] = {}             # device -> GPU model name (vocab.gpu_key)
        self.env: dict[int, dict] = {}


state = State()


def reset(loader: KernelLoader | None = None) -> None:
    """Forget the table, verdicts, loaded kernels and the serving table (tests; after exporting
    new kernels)."""
    global state
    state = State(loader)
    serving.clear()
    workspaces.clear()
    R.forget()


def table() -> dict[tuple, TableEntry]:
    """The serving table: the shipped and user tables' tuned rows, layered (loaded once)."""
    if state.table is None:
        tables = load_tables()
        for problem in tables.problems:
            # The library must never break a matmul that torch would compute: say why, serve
            # the other table (torch where neither has a kernel).
            warnings.warn(f"cudal2: {problem}; its shapes use torch.matmul", RuntimeWarning,
                          stacklevel=4)
        if tables.unaudited:
            # after an upgrade whose audit is stricter: say once why those shapes went to torch
            roots = sorted({str(tables.indexes[u.table].root) for u in tables.unaudited})
            warnings.warn(f"cudal2: {len(tables.unaudited)} tuned row(s) not served: their kernels "
                          "were audited under older rules; `cudal2 reaudit --table DIR` audits them "
                          f"again ({', '.join(roots)})", RuntimeWarning, stacklevel=4)
        state.tables, state.table = tables, tables.rows
        log.debug("kernel tables %s: %d tuned kernels served",
                  {n: str(i.root) for n, i in tables.indexes.items()}, len(state.table))
    return state.table


def redecide_unbuilt() -> int:
    """Forget the serving decisions made without a kernel that was not built (the knob
    CUDAL2_BUILD_IN_CALL=0), so their next call decides again (after warmup). Returns how many."""
    with state.lock:
        keys = list(state.unbuilt)
        for key in keys:
            serving.pop(key, None)
        state.unbuilt.clear()
        state.told_unbuilt.clear()
    return len(keys)


def device_arch(dev: int) -> str | None:
    arch = state.arch.get(dev, "?")
    if arch == "?":
        cap = torch.cuda.get_device_capability(dev)
        arch = state.arch[dev] = ARCH_BY_CAPABILITY.get(tuple(cap))
    return arch


def device_gpu(dev: int) -> str:
    """The GPU model's name, asked once per device (the table's gpu column spells it the same
    way); '' when the runtime cannot name it: then only rows naming no GPU serve outright."""
    name = state.gpu.get(dev)
    if name is None:
        try:
            name = torch.cuda.get_device_name(dev)
        except Exception:  # noqa: BLE001 - never fail a matmul over a name
            name = ""
        name = state.gpu[dev] = gpu_key(name)
    return name


def _cublas_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11"):
        try:
            return f"{dist}=={version(dist)}"
        except PackageNotFoundError:
            continue
    return f"cuda{torch.version.cuda}"


def device_env(dev: int) -> dict:
    env = state.env.get(dev)
    if env is None:
        env = state.env[dev] = {"gpu": device_gpu(dev), "torch": torch.__version__,
                                "cuda": str(torch.version.cuda), "cublas": _cublas_version()}
    return env


def load(e: TableEntry, call: str = ""):
    """Load a table kernel (its table's carried binary, the build cache, else a build if the knob
    allows); check its meta against its row. Raises KernelLoadError (KernelNotBuilt)."""
    tables = state.tables
    name = e.file if tables.table_of(e) == SHIPPED else f"{e.file} ({tables.table_of(e)} table)"
    # Keyed by source and arch: one source may in principle serve several arch directories.
    lib = state.loader.get(f"{e.sha256}:{e.arch}", lambda: tables.source(e), e.arch, name=name,
                           carried=(tables.root_of(e), e.sha256), call=call)
    meta = lib.meta
    for f in ("arch", "acc", "layout"):
        if meta.get(f) != getattr(e, f):
            raise KernelLoadError(f"{e.file}: meta {f}={meta.get(f)!r}, index says {getattr(e, f)!r}")
    state.metas[e.sha256] = meta
    return lib


def serve_kernel(lib, M: int, N: int, K: int, layout: str, *, options=None,
                 dev: int | None = None) -> None:
    """Serve (dev, M, N, K, layout) with a loaded kernel from now on, as an exact table hit
    would (the harness's end-to-end measurement of a candidate; tests)."""
    dev = torch.cuda.current_device() if dev is None else dev
    if isinstance(options, ctypes.Array):     # an options array made by lib.options()
        names = [o["name"] for o in lib.meta.get("options") or []]
        options = dict(zip(names, list(options)))
    with state.lock:
        serving[(dev, M, N, K, layout)] = launcher(lib, M, N, K, options)


def resolve(dev: int, M: int, N: int, K: int, layout: str, a, b):
    """First call for (dev, M, N, K, layout): decide, load, maybe race; cache the outcome."""
    key = (dev, M, N, K, layout)
    with state.lock:
        hit = serving.get(key)
        if hit is not None:
            return hit
        if torch.cuda.is_current_stream_capturing():
            return TORCH  # never race (or build) inside a CUDA graph capture; decide later
        try:
            served = decide(dev, M, N, K, layout, a, b)
        except Exception as exc:  # never fail a matmul torch can do; say why once
            warnings.warn(f"cudal2: dispatch for {M}x{N}x{K} {layout} failed ({exc!r}); using "
                          "torch.matmul for this shape", RuntimeWarning, stacklevel=4)
            served = TORCH
        serving[key] = served
        return served


def decide(dev, M, N, K, layout, a, b):
    arch = device_arch(dev)
    acc = SERVED_ACC  # torch.matmul accumulates fp16 GEMMs in fp32: f16-accumulate kernels never serve
    tbl = table()
    # what the audit confirmed of each kernel's meta (index columns config / verified): a kernel
    # whose tile is only its own claim serves the shape it was measured at, nothing else
    verified: dict[str, set[str]] = {}
    for e in tbl.values():
        verified.setdefault(e.sha256, set()).update(e.trusted_meta)
    probes = 0
    call = f"{M}x{N}x{K} {layout}"
    knobs.build_in_call()        # a bad value is the user's error (resolve says so), not a kernel's
    unbuilt: set[str] = set()    # not built, building forbidden: out of this decision only
    # plan() is pure; a kernel's meta (tile, any_shape) is known only once it is loaded, so load
    # what plan() marks unresolved and plan again. Each round learns a meta or marks a kernel
    # broken or unbuilt, and after MAX_PROBES loads unknown kernels are skipped, so this ends.
    while True:
        d = plan((M, N, K), layout, arch, acc, tbl, metas=state.metas,
                 exclude=state.broken | unbuilt,
                 unknown_meta="candidate" if probes < MAX_PROBES else "reject",
                 gpu=device_gpu(dev), verified=verified)   # this GPU's rows outright; others race
        if d.kind in ("exact", "bucket") and d.candidates[0].sha256 not in state.metas:
            pending = d.candidates
        elif d.kind in RACED and d.unresolved:
            pending = d.unresolved
        else:
            break
        for e in pending:
            probes += 1
            try:
                load(e, call)
            except KernelNotBuilt as exc:
                unbuilt.add(e.sha256)
                _tell_unbuilt(e, call, exc)
            except Exception as exc:  # noqa: BLE001 - a broken kernel is skipped, torch serves
                state.broken.add(e.sha256)
                log.warning("cudal2: tuned kernel %s unusable, skipping it: %s", e.file, exc)
    if unbuilt:
        state.unbuilt.add((dev, M, N, K, layout))
    log.debug("cudal2 dispatch %s %dx%dx%d %s on cuda:%d: %s (%s)", arch, M, N, K, layout, dev,
              d.kind, d.reason)
    if d.kind == "fallback":
        return TORCH
    if d.kind in ("exact", "bucket"):   # measured here at its shape, or at its bucket's M: no race
        e = d.candidates[0]
        return launcher(load(e), M, N, K, e.options_dict)
    return _race(dev, M, N, K, layout, a, b, d)


def _tell_unbuilt(e: TableEntry, call: str, exc: Exception) -> None:
    if e.sha256 not in state.told_unbuilt:
        state.told_unbuilt.add(e.sha256)
        log.warning("cudal2: %s; %s (and any shape that needs that kernel) is decided without "
                    "it, torch unless a built kernel serves, until `cudal2 warmup` or "
                    "cudal2.warmup() builds it", exc, call)


def _contender_id(e) -> str:
    """One (build, options) pair: a build tabled at several shapes may carry other options at
    each, and the race, its stored verdict and the launch must keep them apart."""
    return e.sha256 + (f"@{e.options}" if e.options else "")


def _race(dev, M, N, K, layout, a, b, d: Decision):
    """Serve the decision's candidates (nearest kernels, or a row measured on another GPU model)
    only if one beats torch.matmul here; the verdict is kept (race.py)."""
    entries: dict[str, object] = {}
    for e in d.candidates:              # nearest first: a pair seen again farther away adds nothing
        entries.setdefault(_contender_id(e), e)
    libs = {cid: load(e) for cid, e in entries.items()}  # loaded by decide: dict gets
    opts_by_sha = {cid: e.options_dict for cid, e in entries.items()}
    key = dict(device_env(dev), shape=[M, N, K], layout=layout, acc="f32",
               candidates=sorted(libs))
    verdict = R.read_verdict(key)
    if verdict is None:
        contenders = {"torch": lambda c: torch.matmul(a, b, out=c)}
        stream = torch.cuda.current_stream(dev).cuda_stream
        lda, ldb = a.stride(0), (b.stride(0) if layout == "RR" else b.stride(1))
        for sha, lib in libs.items():
            _, ws_bytes, _, opts, ws_zero = launcher(lib, M, N, K, opts_by_sha.get(sha))

            def run(c, fn=lib.launch, ws_bytes=ws_bytes, sha=sha, opts=opts, ws_zero=ws_zero):
                ws = workspaces.get(dev, stream, ws_bytes, ws_zero) if ws_bytes else 0
                rc = fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, lda, ldb, N, ws,
                        ws_bytes, stream, opts)
                if rc:
                    raise KernelLoadError(f"kernel {sha[:12]} returned cudaError {rc}")
            contenders[sha] = run
        with torch.no_grad():
            result = R.race(contenders, a, b, M, N)
        verdict = {"key": key, "winner": R.choose_winner(result),
                   "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "speedups": result["speedups"],
                   "time_us": result["time_us"], "wrong": result["wrong"],
                   "session": result["session"]}
        for sha, err in result["wrong"].items():
            log.warning("cudal2: kernel %s gives wrong results on %dx%dx%d (max err %.3g); "
                        "not serving it", sha[:12], M, N, K, err)
        R.write_verdict(key, verdict)
    log.debug("cudal2 race %dx%dx%d %s: winner %s, speedups %s", M, N, K, layout,
              verdict["winner"], verdict.get("speedups"))
    lib = libs.get(verdict["winner"])
    if lib is None:
        return TORCH
    return launcher(lib, M, N, K, opts_by_sha[verdict["winner"]])
