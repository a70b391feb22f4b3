"""The baselines every candidate is timed against, built by our own toolchain.

    torch               torch.matmul (cuBLAS or cuBLASLt, as PyTorch chooses)
    cublas_nn           cublasGemmEx, B row-major                    (baselines/cublas_gemm.cu)
    cublas_tn           cublasGemmEx, B column-major (CUDA-L2's TN)  (baselines/cublas_gemm.cu)
    cublaslt_heuristic  cublasLtMatmul with the heuristic's first algorithm, 32 MiB workspace
    cublaslt_autotuned  every algorithm the heuristic returns (up to 100) timed by kernel time,
                        the best kept; the choice is cached per (GPU, cuBLASLt version, shape, acc,
                        layout, workspace) in the results DB (and a JSON cache outside a DB run)
and PyTorch's own switches, what a PyTorch user would turn on instead (EXTRA_BASELINES):
    torch_cublas / torch_cublaslt   torch.backends.cuda.preferred_blas_library(...)
    torch_tunableop                 torch.cuda.tunable with tuning on, results in the cache dir

Accumulator: the cuBLAS/cuBLASLt baselines use CUBLAS_COMPUTE_16F for an f16 candidate and
CUBLAS_COMPUTE_32F for f32. torch cannot be forced to accumulate in fp16; for an f16 candidate we
set allow_fp16_reduced_precision_reduction (it lets cuBLAS reduce split-K partials in fp16, no
more), for f32 we clear it (docs/measurement.md).

The C sources are data (baselines/*.cu); they export a small C ABI loaded here with ctypes.
Handles, workspaces and the heuristic query are set up outside the timed region.
"""
from __future__ import annotations

import ctypes
import json
import os
import tempfile
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.abi import preload_cuda_runtime
from cudal2.core.build import BuildSpec, build_so
from cudal2.core.toolchain import pip_cuda_roots
from cudal2.core.vocab import gpu_key
from cudal2.harness.types import BASELINES, EXTRA_BASELINES
from cudal2.timing import kerneltime as KT

ALL_BASELINES = BASELINES + EXTRA_BASELINES
SOURCE_DIR = Path(__file__).resolve().parent / "baselines"
SOURCES = {"cublas": "cublas_gemm.cu", "cublaslt": "cublaslt_gemm.cu"}
LIBRARIES = ("cublas", "cublasLt")
WORKSPACE_BYTES = 32 * 1024 * 1024            # Python int: no 32-bit overflow (CUDA-L2 had one)
LT_REQUESTED_ALGOS = 100
EXPORTS = {
    "cublas": ("cudal2_baseline_abi", "cudal2_cublas_create", "cudal2_cublas_destroy",
               "cudal2_cublas_run"),
    "cublaslt": ("cudal2_baseline_abi", "cudal2_lt_version", "cudal2_lt_create",
                 "cudal2_lt_destroy", "cudal2_lt_prepare", "cudal2_lt_algo_workspace",
                 "cudal2_lt_run"),
}


class BaselineError(RuntimeError):
    """A baseline could not be built or set up; the message says which and why."""


def source(lib: str) -> str:
    if lib not in SOURCES:
        raise ValueError(f"unknown baseline library {lib!r}; known: {sorted(SOURCES)}")
    return (SOURCE_DIR / SOURCES[lib]).read_text()


def build_baselines(arch: str, *, cache: Path | None = None) -> dict[str, str]:
    """Build both baseline libraries for `arch` (no GPU needed); {"cublas": so, "cublaslt": so}."""

    return {lib: build_so(BuildSpec(source(lib), arch, libraries=LIBRARIES, name=f"baseline-{lib}"),
                          BaselineError, f"the {lib} baseline", cache=cache) for lib in SOURCES}


# ---- ctypes wrappers ------------------------------------------------------------------------------

_V, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


def _preload_cublas() -> list[str]:
    """Make libcublas.so.N / libcublasLt.so.N resolvable by soname for a baseline .so built on
    another machine (its RUNPATH names that machine's folders): load the CUDA runtime the way
    cudal2.core.abi does for kernels, then pip's cuBLASLt and cuBLAS (the wheels torch depends on)
    globally. cuBLASLt first: libcublas needs it. Returns what was loaded."""

    preload_cuda_runtime()
    loaded = []
    for stem in ("libcublasLt.so.", "libcublas.so."):
        for root in pip_cuda_roots():
            # sonames only (libcublas.so.13), not versioned file names (libcublas.so.13.1.0)
            libs = [p for p in sorted((root / "lib").glob(stem + "*"))
                    if p.name[len(stem):].isdigit()]
            if libs:
                try:
                    ctypes.CDLL(str(libs[-1]), mode=ctypes.RTLD_GLOBAL)
                    loaded.append(str(libs[-1]))
                    break
                except OSError:
                    continue
    return loaded


def _load(path: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as first:
        if "libcu" not in str(first):            # not a missing CUDA library: nothing to preload
            raise BaselineError(f"cannot load baseline library {path}: {first}") from None
    _preload_cublas()
    try:
        return ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as exc:
        raise BaselineError(f"cannot load baseline library {path}: {exc}") from None


def load_checked(path: str, exports, error: type[Exception]) -> ctypes.CDLL:
    """A project-owned library (a ceilings kernel) loaded as the baselines are, its `exports` and
    baseline ABI 1 checked; `error` naming the file when any of it fails."""
    try:
        lib = _load(str(path))
    except BaselineError as exc:
        raise error(str(exc)) from None
    missing = [s for s in exports if not hasattr(lib, s)]
    if missing:
        raise error(f"{path}: missing symbol(s) {missing}")
    lib.cudal2_baseline_abi.restype = _I
    if lib.cudal2_baseline_abi() != 1:
        raise error(f"{path}: baseline ABI {lib.cudal2_baseline_abi()}, want 1")
    return lib


class CublasLib:
    def __init__(self, path: str):
        self.lib = _load(path)
        L = self.lib
        L.cudal2_cublas_create.argtypes = [ctypes.POINTER(_V), _V, _S]
        L.cudal2_cublas_create.restype = _I
        L.cudal2_cublas_destroy.argtypes = [_V]
        L.cudal2_cublas_destroy.restype = _I
        L.cudal2_cublas_run.argtypes = [_V, _I, _I, _V, _V, _V, _I, _I, _I, _I, _I, _I, _V]
        L.cudal2_cublas_run.restype = _I
        self.run = L.cudal2_cublas_run

    def create(self, ws_ptr: int, ws_bytes: int) -> int:
        h = _V()
        st = self.lib.cudal2_cublas_create(ctypes.byref(h), ws_ptr, ws_bytes)
        if st:
            raise BaselineError(f"cublasCreate/cublasSetWorkspace failed with status {st}")
        return h.value


class CublasLtLib:
    def __init__(self, path: str):
        self.lib = _load(path)
        L = self.lib
        L.cudal2_lt_version.argtypes = []
        L.cudal2_lt_version.restype = _S
        L.cudal2_lt_create.argtypes = [ctypes.POINTER(_V)]
        L.cudal2_lt_create.restype = _I
        L.cudal2_lt_destroy.argtypes = [_V]
        L.cudal2_lt_destroy.restype = _I
        L.cudal2_lt_prepare.argtypes = [_V, _I, _I, _I, _I, _I, _I, _I, _I, _S, _I,
                                        ctypes.POINTER(_I)]
        L.cudal2_lt_prepare.restype = _I
        L.cudal2_lt_algo_workspace.argtypes = [_V, _I]
        L.cudal2_lt_algo_workspace.restype = _S
        L.cudal2_lt_run.argtypes = [_V, _I, _V, _V, _V, _V, _S, _V]
        L.cudal2_lt_run.restype = _I
        self.run = L.cudal2_lt_run

    def version(self) -> int:
        return int(self.lib.cudal2_lt_version())

    def create(self) -> int:
        h = _V()
        st = self.lib.cudal2_lt_create(ctypes.byref(h))
        if st:
            raise BaselineError(f"cublasLtCreate failed with status {st}")
        return h.value

    def prepare(self, h: int, M, N, K, lda, ldb, ldc, b_col_major: bool, compute16: bool,
                ws_bytes: int, requested: int = LT_REQUESTED_ALGOS) -> int:
        got = _I(0)
        st = self.lib.cudal2_lt_prepare(h, M, N, K, lda, ldb, ldc, int(b_col_major),
                                        int(compute16), ws_bytes, requested, ctypes.byref(got))
        if st:
            raise BaselineError(f"cublasLtMatmulAlgoGetHeuristic found no algorithm for "
                                f"{M}x{N}x{K} (status {st})")
        return got.value


# ---- autotune cache -------------------------------------------------------------------------------

DTYPE = "f16"          # A, B and C of every GEMM the kernel ABI describes (docs/abi.md)


def autotune_key(gpu: str, lt_version: int, M: int, N: int, K: int, acc: str, layout: str,
                 dtype: str = DTYPE) -> str:
    """What an autotuned choice depends on, so a choice is reused only where it is valid: the GPU
    model (vocab.gpu_key of its name: an H100's choice never answers on an H200, whose heuristic
    list and timings differ), the cuBLASLt version (the heuristic's list, which the stored index
    points into), the shape, the operand dtype, the accumulator, the B layout, the workspace and
    the number of algorithms asked; 'kernel-time' marks choices made by the kernel timer (older
    choices do not match)."""
    return (f"{gpu_key(gpu)}|cublasLt {lt_version}|{M}x{N}x{K}|{dtype}|{acc}|{layout}"
            f"|ws{WORKSPACE_BYTES}|algos{LT_REQUESTED_ALGOS}|kernel-time")


def legacy_autotune_key(gpu: str, lt_version: int, M: int, N: int, K: int, acc: str,
                        layout: str) -> str:
    """The key before it named the dtype (every choice stored under it was fp16): still read,
    so accumulated DBs keep answering; new choices are stored under autotune_key."""
    return (f"{gpu}|cublasLt {lt_version}|{M}x{N}x{K}|{acc}|{layout}|ws{WORKSPACE_BYTES}"
            f"|algos{LT_REQUESTED_ALGOS}|kernel-time")


class AutotuneCache:
    """{key: {"index": i, "algos": n, "median_us": t}} in a small JSON file, updated atomically
    under a file lock (several workers may tune at once)."""

    def __init__(self, path: Path | None = None):
        if path is None:
            path = knobs.cache_dir() / "baselines" / "cublaslt_autotune.json"
        self.path = Path(path)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict | None:
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) and isinstance(entry.get("index"), int) else None

    def put(self, key: str, entry: dict) -> None:
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            data = self._read()
            data[key] = entry
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


# ---- the runners (GPU) ----------------------------------------------------------------------------

class BaselineRunners:
    """Set up once per (shape, acc, layout) in the worker: handles, a 32 MiB workspace per
    library, the Lt plan. `launcher(name)` returns fn(a, b_rr, b_rc, c) that enqueues one call
    on torch's current stream and returns a status (0 = ok)."""

    def __init__(self, libs: dict[str, str], M: int, N: int, K: int, acc: str, layout: str):
        import torch

        self.torch = torch
        self.M, self.N, self.K, self.acc, self.layout = M, N, K, acc, layout
        self.compute16 = acc == "f16"
        self.cublas = CublasLib(libs["cublas"]) if "cublas" in libs else None
        self.lt = CublasLtLib(libs["cublaslt"]) if "cublaslt" in libs else None
        self._ws_cublas = torch.empty(WORKSPACE_BYTES if self.cublas else 1, dtype=torch.uint8,
                                      device="cuda")
        self._ws_lt = torch.empty(WORKSPACE_BYTES if self.lt else 1, dtype=torch.uint8,
                                  device="cuda")
        self.h_cublas = self.cublas.create(self._ws_cublas.data_ptr(), WORKSPACE_BYTES) \
            if self.cublas else None
        self.h_lt = self.lt.create() if self.lt else None
        self.lt_algos = 0
        self.lt_autotuned_index: int | None = None
        self.notes: dict[str, str] = {}
        if self.lt:
            # Lt runs on the candidate's B layout with contiguous leading dimensions.
            rc = layout == "RC"
            try:
                self.lt_algos = self.lt.prepare(self.h_lt, M, N, K, K, K if rc else N, N, rc,
                                                self.compute16, WORKSPACE_BYTES)
            except BaselineError as exc:
                self.notes["cublaslt_heuristic"] = self.notes["cublaslt_autotuned"] = str(exc)

    # torch.matmul under the candidate's accumulator setting (what torch allows)
    def _torch_call(self, a, b, c):
        torch = self.torch
        flag = torch.backends.cuda.matmul
        saved = flag.allow_fp16_reduced_precision_reduction
        flag.allow_fp16_reduced_precision_reduction = self.compute16
        try:
            torch.matmul(a, b, out=c)
        finally:
            flag.allow_fp16_reduced_precision_reduction = saved
        return 0

    def _torch_blas(self, which: str):
        torch = self.torch

        def call(a, b_rr, b_rc, c):
            saved = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library(which)
            try:
                return self._torch_call(a, b_rr, c)
            finally:
                torch.backends.cuda.preferred_blas_library(saved)
        return call

    def setup_tunableop(self, a, b, c) -> None:
        """Tune torch's GEMM for this shape once (outside timing), results file in the cache."""

        tunable = self.torch.cuda.tunable
        d = knobs.cache_dir() / "tunableop"
        d.mkdir(parents=True, exist_ok=True)
        tunable.set_filename(str(d / "tunableop_results%d.csv"))
        tunable.enable(True)
        tunable.tuning_enable(True)
        try:
            self._torch_call(a, b, c)
            self.torch.cuda.synchronize()
            tunable.write_file()
        finally:
            tunable.tuning_enable(False)
            tunable.enable(False)

    def _tunableop(self, a, b_rr, b_rc, c):
        tunable = self.torch.cuda.tunable
        tunable.enable(True)          # tuned result in memory; tuning stays off while timed
        try:
            return self._torch_call(a, b_rr, c)
        finally:
            tunable.enable(False)

    def launcher(self, name: str):
        torch = self.torch
        M, N, K = self.M, self.N, self.K
        c16 = int(self.compute16)
        if name == "torch":
            return lambda a, b_rr, b_rc, c: self._torch_call(a, b_rr, c)
        if name in ("torch_cublas", "torch_cublaslt"):
            return self._torch_blas(name.split("_", 1)[1])
        if name == "torch_tunableop":
            return self._tunableop
        if name in ("cublas_nn", "cublas_tn"):
            if not self.cublas:
                raise BaselineError("the cublas baseline library was not given")
            run, h = self.cublas.run, self.h_cublas
            if name == "cublas_nn":
                return lambda a, b_rr, b_rc, c: run(h, 0, c16, a.data_ptr(), b_rr.data_ptr(),
                                                    c.data_ptr(), M, N, K, K, N, N,
                                                    torch.cuda.current_stream().cuda_stream)
            return lambda a, b_rr, b_rc, c: run(h, 1, c16, a.data_ptr(), b_rc.data_ptr(),
                                                c.data_ptr(), M, N, K, K, K, N,
                                                torch.cuda.current_stream().cuda_stream)
        if name in ("cublaslt_heuristic", "cublaslt_autotuned"):
            if not self.lt or not self.lt_algos:
                raise BaselineError(self.notes.get(name, "the cublaslt baseline library was not given"))
            return self.lt_launcher(0 if name == "cublaslt_heuristic" else self.lt_autotuned_index)
        raise BaselineError(f"unknown baseline {name!r}; known: {ALL_BASELINES}")

    def lt_launcher(self, index: int | None):
        if index is None:
            raise BaselineError("cublaslt_autotuned: call autotune() first")
        torch = self.torch
        run, h, ws = self.lt.run, self.h_lt, self._ws_lt
        rc = self.layout == "RC"
        return lambda a, b_rr, b_rc, c: run(h, index, a.data_ptr(),
                                            (b_rc if rc else b_rr).data_ptr(), c.data_ptr(),
                                            ws.data_ptr(), WORKSPACE_BYTES,
                                            torch.cuda.current_stream().cuda_stream)

    def autotune(self, pool, gpu: str, *, verify=None, cache: "AutotuneCache | None" = None,
                 known: dict | None = None, backend=None, device="cuda",
                 cold: str = "rotate") -> dict:
        """Time every heuristic algorithm by kernel time on the operand pool (cold operands, by
        the session's method `cold`: kerneltime.cold_plan) and keep the fastest whose output
        verifies: a short screening session over all of them, then a tight one over the five
        fastest. `known` ({key: entry}, e.g. from the results DB) and `cache` answer first: a
        known key skips the timing entirely. Returns the entry {key, index, algos, median_us,
        source}."""

        if not self.lt or not self.lt_algos:
            raise BaselineError(self.notes.get("cublaslt_autotuned", "no cublaslt library"))
        version = self.lt.version()
        key = autotune_key(gpu, version, self.M, self.N, self.K, self.acc, self.layout)
        old = legacy_autotune_key(gpu, version, self.M, self.N, self.K, self.acc, self.layout)
        hit = (known or {}).get(key) or (known or {}).get(old)
        source = "results DB"
        if hit is None and cache is not None:
            hit, source = cache.get(key) or cache.get(old), "autotune cache"
        if hit is not None and isinstance(hit.get("index"), int) and hit["index"] < self.lt_algos:
            self.lt_autotuned_index = hit["index"]
            self.notes["cublaslt_autotuned"] = (f"algorithm {hit['index']} of {self.lt_algos} "
                                                f"({source})")
            return dict(hit, key=key, source=source)
        torch = self.torch
        c = torch.empty(self.M, self.N, dtype=torch.float16, device=device)
        fns, bad = {}, []
        for i in range(self.lt_algos):
            f = self.lt_launcher(i)
            if f(pool.a(0), pool.b_rr(0), pool.b_rc(0), c) != 0 or (verify is not None and verify(c, 0)):
                bad.append(i)
                continue
            fns[f"algo{i}"] = (lambda s, f=f: f(pool.a(s), pool.b_rr(s), pool.b_rc(s), c))
        if not fns:
            raise BaselineError(f"no cuBLASLt algorithm of {self.lt_algos} ran correctly")
        backend = backend or KT.CudaKernelBackend()
        first = KT.time_kernels(fns, KT.KernelTimeConfig(sample_us=200.0, warmup_ms=1.0,
                                                        min_rounds=2, max_rounds=2, cold=cold),
                                backend, n_sets=pool.n_sets)
        top = sorted(fns, key=lambda k: first.time(k).median)[:5]
        final = KT.time_kernels({k: fns[k] for k in top}, KT.KernelTimeConfig(
            min_rounds=5, max_rounds=20, budget_s=2.0, target=0.01, cold=cold), backend,
            n_sets=pool.n_sets)
        best = min(top, key=lambda k: final.time(k).median)
        entry = {"index": int(best[4:]), "algos": self.lt_algos,
                 "median_us": final.time(best).median, "timer": "kernel",
                 "screened": len(fns), "rejected": bad}
        if cache is not None:
            cache.put(key, entry)
        self.lt_autotuned_index = entry["index"]
        self.notes["cublaslt_autotuned"] = (f"tuned: algorithm {entry['index']} of {self.lt_algos} "
                                            f"({len(fns)} ran correctly, kernel time)")
        return dict(entry, key=key, source="tuned now")

    def close(self) -> None:
        if self.h_cublas:
            self.cublas.lib.cudal2_cublas_destroy(self.h_cublas)
            self.h_cublas = None
        if self.h_lt:
            self.lt.lib.cudal2_lt_destroy(self.h_lt)
            self.h_lt = None
