"""Finding the pieces a build needs: nvcc, CUDA/cuBLAS headers and libraries, CUTLASS headers,
and the target arch.

nvcc comes from CUDA_HOME, then PATH, then the `nvidia-cuda-nvcc` PyPI package (so a machine
without a toolkit builds too). Libraries that pip installs only as `libX.so.13` get a `libX.so`
link in a small shim folder under the cache, so `-lcudart` / `-lcublas` resolve. A missing piece
raises one ToolchainError naming what is missing and how to get it.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from cudal2.core import knobs

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")

# Headers and libraries that a pip install provides under site-packages/nvidia/<cuXX>/.
_LIBS = ("cudart", "cublas", "cublasLt")
_CUBLAS_HEADERS = ("cublas.h", "cublas_v2.h", "cublas_api.h", "cublasLt.h")


class ToolchainError(RuntimeError):
    """A build prerequisite is missing; the message says which and how to get it."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    version: str                      # e.g. "13.0.88"
    include_dirs: tuple[Path, ...]    # extra -I dirs (cuBLAS headers when they come from pip)
    lib_dirs: tuple[Path, ...]        # where libcudart.so / libcublas.so / libcublasLt.so resolve

    def compile_flags(self) -> list[str]:
        flags: list[str] = []
        for d in self.include_dirs:
            flags += ["-I", str(d)]
        return flags

    def link_flags(self, libraries: tuple[str, ...] = ()) -> list[str]:
        flags: list[str] = []
        for d in self.lib_dirs:
            flags += ["-L", str(d), f"-Xlinker=-rpath,{d}"]
        for lib in libraries:
            flags.append(f"-l{lib}")
        return flags


def pip_cuda_roots() -> list[Path]:
    """site-packages/nvidia/cu*/ folders that pip's nvidia-* wheels installed."""
    roots: list[Path] = []
    try:
        import nvidia  # namespace package from the nvidia-* wheels
    except ImportError:
        return roots
    for base in getattr(nvidia, "__path__", []):
        for sub in sorted(Path(base).glob("cu*")):
            if sub.is_dir():
                roots.append(sub)
        # older wheels: nvidia/cuda_runtime/lib, nvidia/cublas/lib ...
        for sub in ("cuda_runtime", "cublas", "cuda_nvcc"):
            if (Path(base) / sub).is_dir():
                roots.append(Path(base) / sub)
    return roots


def _nvcc_candidates() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        found.append(("CUDA_HOME", Path(cuda_home) / "bin" / "nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        found.append(("PATH", Path(on_path)))
    for root in pip_cuda_roots():
        found.append(("nvidia-cuda-nvcc", root / "bin" / "nvcc"))
    return found


def _nvcc_version(nvcc: Path) -> str:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"nvcc at {nvcc} does not run: {exc}") from exc
    match = re.search(r"V(\d+\.\d+\.\d+)", out.stdout)
    if out.returncode != 0 or not match:
        raise ToolchainError(f"nvcc at {nvcc} gave no version (exit {out.returncode}): {out.stderr.strip()[:300]}")
    return match.group(1)


def _find_file(names: tuple[str, ...], dirs: list[Path]) -> Path | None:
    for d in dirs:
        for name in names:
            if (d / name).exists():
                return d / name
    return None


def nvcc_root(nvcc: Path) -> Path:
    # /usr/local/bin/nvcc may be a wrapper script: ask the resolved path, else the parent.
    real = nvcc.resolve()
    if real.parent.name == "bin" and (real.parent.parent / "include").is_dir():
        return real.parent.parent
    try:
        text = nvcc.read_text(errors="ignore") if nvcc.stat().st_size < 4096 else ""
    except OSError:
        text = ""
    match = re.search(r"(/\S+)/bin/nvcc", text)
    if match and Path(match.group(1)).is_dir():
        return Path(match.group(1))
    return real.parent.parent


def _shim_dir(entries: dict[str, Path]) -> Path:
    """A folder of symlinks (libcudart.so -> .../libcudart.so.13, cublas headers ...)."""
    digest = hashlib.sha256(repr(sorted((k, str(v)) for k, v in entries.items())).encode()).hexdigest()[:16]
    shim = knobs.cache_dir() / "toolchain" / digest
    if not all((shim / name).exists() for name in entries):
        tmp = shim.with_name(f"{shim.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True, exist_ok=True)
        for name, target in entries.items():
            link = tmp / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        try:
            os.replace(tmp, shim)
        except OSError:  # another builder made it first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    return shim


@functools.lru_cache(maxsize=None)
def _find_toolchain(cache_key: str) -> Toolchain:
    tried: list[str] = []
    nvcc = version = None
    for origin, path in _nvcc_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            nvcc, version = path, _nvcc_version(path)
            break
        tried.append(f"{origin}: {path}")
    if nvcc is None:
        raise ToolchainError(
            "nvcc not found (tried " + (", ".join(tried) or "CUDA_HOME, PATH, nvidia-cuda-nvcc")
            + "). Install a CUDA toolkit and set CUDA_HOME, or `pip install nvidia-cuda-nvcc "
            "nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl` (or `pip install cudal2[build]`).")

    root = nvcc_root(nvcc)
    search_lib = [root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"]
    search_inc = [root / "include", root / "targets" / "x86_64-linux" / "include"]
    for pip_root in pip_cuda_roots():
        search_lib.append(pip_root / "lib")
        search_inc.append(pip_root / "include")

    entries: dict[str, Path] = {}
    for lib in _LIBS:
        found = _find_file((f"lib{lib}.so",), search_lib) or next(
            (p for d in search_lib if d.is_dir() for p in sorted(d.glob(f"lib{lib}.so.*"))), None)
        if found is not None:
            entries[f"lib/lib{lib}.so"] = found
    if "lib/libcudart.so" not in entries:
        raise ToolchainError(
            f"libcudart not found next to nvcc ({root}) or in pip's nvidia packages: "
            "`pip install nvidia-cuda-runtime` (or use a full CUDA toolkit).")
    # cuBLAS headers only when the toolkit lacks them: linking the headers one by one keeps
    # the pip copy of cuda_runtime.h from shadowing nvcc's own.
    if not _find_file(("cublas_v2.h",), [root / "include"]):
        for header in _CUBLAS_HEADERS:
            found = _find_file((header,), search_inc)
            if found is not None:
                entries[f"include/{header}"] = found
    shim = _shim_dir(entries)
    include_dirs = (shim / "include",) if any(k.startswith("include/") for k in entries) else ()
    return Toolchain(nvcc=nvcc, version=version, include_dirs=include_dirs, lib_dirs=(shim / "lib",))


def find_toolchain() -> Toolchain:
    """The toolchain for this process (memoised per CUDA_HOME/PATH/cache dir)."""
    key = "|".join([os.environ.get("CUDA_HOME", ""), os.environ.get("PATH", ""), str(knobs.cache_dir())])
    return _find_toolchain(key)


def has_cublas(tc: Toolchain) -> bool:
    return all((d / "libcublas.so").exists() and (d / "libcublasLt.so").exists() for d in tc.lib_dirs)


@functools.lru_cache(maxsize=None)
def cutlass_include_dirs() -> tuple[Path, ...]:
    """CUTLASS/CuTe headers from the nvidia-cutlass package (module `cutlass_library`)."""
    try:
        import cutlass_library
    except ImportError:
        raise ToolchainError(
            "CUTLASS headers not found: the module cutlass_library is missing. "
            "`pip install nvidia-cutlass` (or `pip install cudal2[build]`).") from None
    source = Path(cutlass_library.__file__).resolve().parent / "source"
    dirs = (source / "include", source / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").exists():
        raise ToolchainError(f"nvidia-cutlass is installed but {dirs[0]}/cutlass/cutlass.h is missing: reinstall nvidia-cutlass.")
    return dirs


def normalise_arch(arch: str) -> str:
    arch = arch.strip().lower()
    if arch in ("sm_90", "sm90", "90", "hopper", "sm90a", "90a"):
        return "sm_90a"  # wgmma/TMA need the arch-specific target
    if re.fullmatch(r"\d+a?", arch):
        arch = "sm_" + arch
    if arch not in ARCHES:
        raise ValueError(f"unsupported arch {arch!r}: choose one of {', '.join(ARCHES)}")
    return arch


def find_cuobjdump() -> str | None:
    """cuobjdump (SASS disassembly) from $CUOBJDUMP, PATH, next to nvcc, or pip's
    nvidia-cuda-cuobjdump wheel (site-packages/nvidia/*/bin); None when there is none. The
    compile checks read the SASS through it (the tensor-core instruction a family claims)."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    try:
        cand = nvcc_root(find_toolchain().nvcc) / "bin" / "cuobjdump"
        if cand.is_file():
            return str(cand)
    except ToolchainError:
        pass
    try:
        import nvidia  # namespace package from the nvidia-* wheels
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for cand in sorted(Path(base).glob("*/bin/cuobjdump")):
            return str(cand)
    return None


def detect_arch(explicit: str | None = None) -> str:
    """explicit > CUDAL2_ARCH > the visible GPU; else a clear error."""
    if explicit:
        return normalise_arch(explicit)
    from_env = knobs.default_arch()
    if from_env:
        return normalise_arch(from_env)
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return normalise_arch(f"{major}{minor}" + ("a" if major >= 9 else ""))
    except ImportError:
        pass
    raise ToolchainError("no GPU visible, so no arch to target (it is the GPU's: sm_90a for an "
                         "H100/H200, sm_80 for an A100): pass --arch ARCH or set CUDAL2_ARCH "
                         f"({', '.join(ARCHES)})")
