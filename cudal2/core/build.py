"""Compile one kernel file into a shared library, in a content-addressed cache.

A build takes a frozen BuildSpec and returns a BuildResult; it never touches the GPU, so it runs
in CPU pools and in CI. Cache key = sha256 of everything that can change the binary: ABI version,
source, hashes of the template headers it includes, the CUTLASS version when it includes CUTLASS,
nvcc version, flags, arch, linked libraries. Per-key file lock, build in a temp dir, one atomic
rename; a corrupt entry is deleted and rebuilt. Build errors are data (status + log), never a
crash. Failed compiles are cached too, so a repeated bad kernel costs nothing. A successful
build also records its binary key (cudal2.core.binarykey: what the binary is, whatever the text).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cudal2.core import knobs
from cudal2.core.binarykey import KEY_VERSION, binary_key
from cudal2.core.store import atomic_write_bytes
from cudal2.core.toolchain import (
    ToolchainError,
    cutlass_include_dirs,
    detect_arch,
    find_toolchain,
    normalise_arch,
    nvcc_root,
    pip_cuda_roots,
)

ABI_VERSION = 1
# What a cache entry holds; part of the key, so older entries are rebuilt, not misread.
# 2: build.json records the files the compile read (nvcc -MD) and the roots they may come from.
CACHE_FORMAT = 2
BASE_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-O3", "-DNDEBUG", "-std=c++17",
              "--expt-relaxed-constexpr", "-cudart", "shared", "-Xptxas", "-v")
# A device-only build's: the same device compile, without the host library's flags.
DEVICE_FLAGS = ("-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-v")
NVCC_MEMORY_LIMIT = 12 << 30   # bytes of address space per nvcc process tree member
TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
# The system's C/C++ headers a host compiler reads.
SYSTEM_INCLUDE_ROOTS = (Path("/usr/include"), Path("/usr/lib/gcc"), Path("/usr/local/include"))
log = logging.getLogger(__name__)

OK, COMPILE_ERROR, TIMEOUT, TOOLCHAIN_ERROR = "ok", "compile_error", "timeout", "toolchain_error"


@dataclass(frozen=True)
class BuildSpec:
    source: str                          # the .cu text
    arch: str = "sm_90a"
    flags: tuple[str, ...] = ()          # extra nvcc flags, e.g. ("-DBM=128",)
    libraries: tuple[str, ...] = ()      # extra libraries to link (baselines only)
    name: str = "kernel"                 # for logs; not part of the key
    # The device code alone (nvcc -cubin: no host compile, no link): ptxas' registers, spills
    # and stack of exactly the library build's device code at ~60% of its CPU, for checks over
    # a whole space. Nothing loads it: so_path is None.
    device_only: bool = False


@dataclass(frozen=True)
class KernelResources:
    function: str
    registers: int
    shared_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int


@dataclass(frozen=True)
class BuildResult:
    status: str
    key: str
    so_path: Path | None
    ptx_path: Path | None
    log: str
    resources: tuple[KernelResources, ...] = ()
    seconds: float = 0.0
    cached: bool = False
    name: str = "kernel"
    deps: tuple[str, ...] = ()           # every file the compile read (nvcc -MD), the source aside
    include_roots: tuple[str, ...] = ()  # the folders the build allowed headers from
    binary_key: str | None = None        # cudal2.core.binarykey; None: failed, or no cuobjdump

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def spills(self) -> int:
        return sum(r.spill_stores + r.spill_loads for r in self.resources)

    @property
    def max_registers(self) -> int:
        return max((r.registers for r in self.resources), default=0)

    @property
    def max_shared_bytes(self) -> int:
        return max((r.shared_bytes for r in self.resources), default=0)

    def summary(self) -> dict:
        return {"status": self.status, "key": self.key, "seconds": round(self.seconds, 3),
                "cached": self.cached, "registers": self.max_registers,
                "shared_bytes": self.max_shared_bytes, "spills": self.spills,
                "log_tail": trim_log(self.log), "binary_key": self.binary_key}


def trim_log(log: str, lines: int = 20) -> str:
    """The useful end of a compiler log: error lines first, then the last lines."""
    all_lines = [l for l in log.splitlines() if l.strip()]
    errors = [l for l in all_lines if "error" in l.lower()]
    picked = errors[:lines] if errors else all_lines[-lines:]
    return "\n".join(picked)


# --- ptxas -v ------------------------------------------------------------------------------
_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> tuple[KernelResources, ...]:
    """Per entry function: registers, static shared memory, spills, stack (from `ptxas -v`)."""
    found: list[KernelResources] = []
    current: dict | None = None

    def flush():
        if current is not None and "registers" in current:
            found.append(KernelResources(**current))

    for line in log.splitlines():
        entry = _ENTRY_RE.search(line)
        if entry:
            flush()
            current = {"function": entry.group(1), "shared_bytes": 0, "spill_stores": 0,
                       "spill_loads": 0, "stack_bytes": 0}
            continue
        if current is None:
            continue
        props = _PROPS_RE.search(line)
        if props:
            current["stack_bytes"] = int(props.group(1))
            current["spill_stores"] = int(props.group(2))
            current["spill_loads"] = int(props.group(3))
            continue
        used = _USED_RE.search(line)
        if used:
            current["registers"] = int(used.group(1))
            current["shared_bytes"] = int(used.group(2) or 0)
    flush()
    return tuple(found)


# --- cache key -----------------------------------------------------------------------------
def _template_headers(source: str) -> list[Path]:
    names = _INCLUDE_RE.findall(source)
    return sorted(TEMPLATE_DIR / Path(n).name for n in names if (TEMPLATE_DIR / Path(n).name).is_file())


def _cutlass_version() -> str:
    try:
        from importlib.metadata import version
        return version("nvidia-cutlass")
    except Exception:
        return "absent"


def _uses_cutlass(source: str) -> bool:
    texts = [source] + [p.read_text() for p in _template_headers(source)]
    return any(n.startswith(("cutlass/", "cute/")) for t in texts for n in _INCLUDE_RE.findall(t))


def includes_templates(source: str) -> bool:
    """Whether `source` #includes one of our template headers (its build follows theirs)."""
    return bool(_template_headers(source))


def uses_cutlass(source: str) -> bool:
    """Whether `source` (or a template header it includes) includes CUTLASS or CuTe."""
    return _uses_cutlass(source)


def include_roots(*, header_dirs: bool = False) -> list[Path]:
    """Folders a kernel build may read headers from: the toolkit (nvcc's root, /usr/local/cuda*,
    CUDA/CCCL headers from pip), CUTLASS, our templates and the system's C/C++ headers. With
    header_dirs, the -I style folders themselves (where a quoted "cutlass/gemm.h" resolves),
    for the audit's check of a source's quoted includes before it is built."""
    tc = find_toolchain()
    root = nvcc_root(Path(tc.nvcc))
    cuda = [root, *Path("/usr/local").glob("cuda*")]
    try:
        cutlass = list(cutlass_include_dirs())
    except Exception:  # noqa: BLE001 - no CUTLASS here: a kernel including it fails to build
        cutlass = []
    if header_dirs:
        roots = [*tc.include_dirs, TEMPLATE_DIR, *cutlass, Path("/usr/include")]
        for c in cuda:
            roots += [c / "include", *c.glob("targets/*/include")]
        roots += list(Path("/usr/include/c++").glob("*"))
    else:
        roots = [*cuda, *tc.include_dirs, TEMPLATE_DIR, *cutlass, *pip_cuda_roots(),
                 *SYSTEM_INCLUDE_ROOTS]
    return sorted({r.resolve() for r in roots if r.exists()})


def parse_deps(text: str, source_name: str = "kernel.cu") -> tuple[str, ...]:
    """The files a Makefile-style dependency file (nvcc -MD) lists, the source itself aside."""
    body = text.replace("\\\n", " ").split(":", 1)[-1].split()
    return tuple(sorted({str(Path(d).resolve()) for d in body if d != source_name}))


def cache_key(spec: BuildSpec, nvcc_version: str) -> str:
    h = hashlib.sha256()
    if spec.device_only:        # a library build's key stays what it was
        h.update(b"device_only\x00")
    for part in (f"abi={ABI_VERSION}", f"format={CACHE_FORMAT}", f"arch={normalise_arch(spec.arch)}",
                 f"nvcc={nvcc_version}",
                 "flags=" + "\x00".join(BASE_FLAGS + spec.flags), "libs=" + ",".join(spec.libraries)):
        h.update(part.encode() + b"\x00")
    for header in _template_headers(spec.source):
        h.update(header.name.encode() + hashlib.sha256(header.read_bytes()).digest())
    if _uses_cutlass(spec.source):
        h.update(f"cutlass={_cutlass_version()}".encode())
    h.update(spec.source.encode())
    return h.hexdigest()


# --- building ------------------------------------------------------------------------------
def _entry_dir(cache: Path, key: str) -> Path:
    return cache / "builds" / key[:2] / key


def _load_entry(entry: Path, name: str, key_on_load: bool = True) -> BuildResult | None:
    """A finished cache entry, or None if absent; a corrupt one is deleted. An entry keyed
    before this KEY_VERSION (or never) is keyed now when `key_on_load`, else it loads without a
    key: taking one runs cuobjdump, which a user's call (dispatch) must not wait for."""
    meta_path = entry / "build.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        out = entry / ("kernel.cubin" if meta.get("device_only") else "kernel.so")
        if meta["status"] == OK and not out.exists():
            raise ValueError(f"{out.name} missing")
        so = out if meta["status"] == OK and not meta.get("device_only") else None
        ptx = entry / "kernel.ptx"
        if so is not None and meta.get("binary_key_version") != KEY_VERSION:
            meta = (_add_binary_key(meta, so, meta_path) if key_on_load     # built before keys, or this key
                    else {k: v for k, v in meta.items() if k != "binary_key"})
        return result_from_json(meta, so_path=so, ptx_path=ptx if ptx.exists() else None,
                                name=name)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _key_of(so: Path, arch: str, nvcc: str) -> str | None:
    """The binary key of a built library, or None (logged) when it cannot be taken."""
    try:
        return binary_key(so, arch=arch, nvcc=nvcc)
    except Exception as exc:  # noqa: BLE001 - a key is extra: it never fails a build or a load
        log.debug("no binary key for %s: %s", so, exc)
        return None


def _add_binary_key(meta: dict, so: Path, meta_path: Path) -> dict:
    """`meta` with the library's binary key, written back to build.json atomically (when the
    key could be taken and the cache is writable)."""
    key = _key_of(so, meta.get("arch", ""), meta.get("nvcc", ""))
    if key is None:
        return meta
    meta = {**meta, "binary_key": key, "binary_key_version": KEY_VERSION}
    try:
        atomic_write_bytes(meta_path, json.dumps(meta).encode())
    except OSError as exc:      # a read-only cache: the key is used, not stored
        log.debug("binary key of %s not stored: %s", so, exc)
    return meta


def result_from_json(meta: dict, *, so_path, ptx_path, name: str = "kernel") -> BuildResult:
    """A BuildResult from a cache entry's build.json (also a campaign pack's copy of one)."""
    return BuildResult(status=meta["status"], key=meta["key"], so_path=so_path, ptx_path=ptx_path,
                       log=meta.get("log", ""),
                       resources=tuple(KernelResources(**r) for r in meta.get("resources", ())),
                       seconds=float(meta.get("seconds", 0.0)), cached=True, name=name,
                       deps=tuple(meta.get("deps", ())),
                       include_roots=tuple(meta.get("include_roots", ())),
                       binary_key=meta.get("binary_key"))


def _limit_memory() -> None:
    # Generated source can make the compiler explode (template recursion): cap its address
    # space. nvcc creates no CUDA context, so RLIMIT_AS is safe here (a CUTLASS SM90 kernel
    # needs ~3.4 GB resident).
    import resource
    limit = NVCC_MEMORY_LIMIT
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run_nvcc(cmd: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_limit_memory)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out + f"\n[cudal2] nvcc killed after {timeout:.0f} s"


def _nvcc_command(spec: BuildSpec, tc) -> tuple[list[str], str]:
    """The nvcc command line of a build in its work folder, and the file it writes."""
    arch = normalise_arch(spec.arch)
    compute = arch.replace("sm_", "compute_")
    includes = ["-I", str(TEMPLATE_DIR)]
    if _uses_cutlass(spec.source):
        for d in cutlass_include_dirs():
            includes += ["-I", str(d)]
    out = "kernel.cubin" if spec.device_only else "kernel.so"
    head = [*DEVICE_FLAGS, "-cubin"] if spec.device_only else list(BASE_FLAGS)
    link = [] if spec.device_only else tc.link_flags(spec.libraries)
    # -MD -MF: the compile writes the files it read (the audit checks them; no second nvcc)
    return ([str(tc.nvcc), *head, "-gencode", f"arch={compute},code={arch}", *tc.compile_flags(),
             *includes, *spec.flags, "--keep", "--keep-dir", "keep", "-MD", "-MF", "kernel.d",
             "kernel.cu", "-o", out, *link], out)


def _compile(spec: BuildSpec, key: str, entry: Path, timeout: float) -> BuildResult:
    tc = find_toolchain()
    arch = normalise_arch(spec.arch)
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=key[:12] + ".", dir=entry.parent))
    try:
        (work / "kernel.cu").write_text(spec.source)
        (work / "keep").mkdir()
        cmd, out = _nvcc_command(spec, tc)
        start = time.perf_counter()
        code, log = _run_nvcc(cmd, work, timeout)
        seconds = time.perf_counter() - start
        log = f"$ {' '.join(cmd)}\n{log}"
        if code is None:  # timeouts are not cached: a busy machine may finish next time
            return BuildResult(TIMEOUT, key, None, None, log, seconds=seconds, name=spec.name)
        status = OK if code == 0 and (work / out).exists() else COMPILE_ERROR
        resources = parse_ptxas(log)
        if (work / "keep" / "kernel.ptx").exists():
            shutil.move(str(work / "keep" / "kernel.ptx"), work / "kernel.ptx")
        shutil.rmtree(work / "keep", ignore_errors=True)
        if status != OK:
            (work / out).unlink(missing_ok=True)
        deps_file = work / "kernel.d"
        deps = parse_deps(deps_file.read_text()) if deps_file.exists() else ()
        deps_file.unlink(missing_ok=True)
        library = status == OK and not spec.device_only
        bkey = _key_of(work / out, arch, tc.version) if library else None
        # none now: the next load tries again
        keyed = {"binary_key": bkey, "binary_key_version": KEY_VERSION} if bkey else {}
        (work / "build.json").write_text(json.dumps({**keyed,
            "status": status, "key": key, "log": log, "seconds": seconds, "name": spec.name,
            "arch": arch, "nvcc": tc.version, "resources": [asdict(r) for r in resources],
            "deps": list(deps), "include_roots": [str(r) for r in include_roots()],
            **({"device_only": True} if spec.device_only else {})}))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(work, entry)  # atomic: readers see all of the entry or none of it
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = _load_entry(entry, spec.name)
    assert result is not None
    return replace(result, cached=False)


def _library_answer(spec: BuildSpec, key: str, cache: Path, tc) -> BuildResult | None:
    """A device-only build answered by the library build of the same spec already in the cache:
    its device code is the same (its ptxas figures, its PTX), so it is not compiled again."""
    if not spec.device_only:
        return None
    lib = _load_entry(_entry_dir(cache, cache_key(replace(spec, device_only=False), tc.version)),
                      spec.name, key_on_load=False)
    if lib is None or not lib.ok:
        return None
    return replace(lib, key=key, so_path=None, binary_key=None)


def build(spec: BuildSpec, *, timeout: float = 900, cache: Path | None = None,
          key_on_load: bool = True) -> BuildResult:
    """Build (or fetch from the cache) one kernel. Never raises on bad source. key_on_load=False:
    a cache hit keyed under another KEY_VERSION comes back without a key (_load_entry)."""
    from filelock import FileLock

    try:
        tc = find_toolchain()
        key = cache_key(spec, tc.version)
    except (ToolchainError, ValueError) as exc:
        return BuildResult(TOOLCHAIN_ERROR, "", None, None, str(exc), name=spec.name)
    cache = Path(cache) if cache else knobs.cache_dir()
    entry = _entry_dir(cache, key)
    hit = _load_entry(entry, spec.name, key_on_load) or _library_answer(spec, key, cache, tc)
    if hit is not None:
        return hit
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        hit = _load_entry(entry, spec.name, key_on_load)  # another builder may have finished meanwhile
        if hit is not None:
            return hit
        try:
            return _compile(spec, key, entry, timeout)
        except ToolchainError as exc:
            return BuildResult(TOOLCHAIN_ERROR, key, None, None, str(exc), name=spec.name)


def build_so(spec: BuildSpec, error: type[Exception], what: str, *, cache: Path | None = None) -> str:
    """The .so of a project-owned library (a baseline, a ceilings kernel) built through the cache;
    `error` naming `what`, the status and the log's tail when it did not build."""
    res = build(spec, cache=cache)
    if not res.ok:
        tail = "\n".join(res.log.splitlines()[-15:])
        raise error(f"building {what} for {spec.arch} failed ({res.status}):\n{tail}")
    return str(res.so_path)


def lookup(spec: BuildSpec, *, cache: Path | None = None) -> BuildResult | None:
    """The cache entry `build(spec)` would return without compiling, or None when there is none
    (dispatch asks this before a build it would otherwise run inside a user's call). Raises
    ToolchainError without nvcc: the key holds its version."""
    key = cache_key(spec, find_toolchain().version)
    return _load_entry(_entry_dir(Path(cache) if cache else knobs.cache_dir(), key), spec.name,
                       key_on_load=False)


def build_many(specs: list[BuildSpec], *, jobs: int | None = None, timeout: float = 900,
               cache: Path | None = None, progress=None) -> list[BuildResult]:
    """Build many specs in parallel on CPU cores (nvcc processes); results in input order.
    Identical specs are built once. `progress(result)` is called as each build finishes."""
    jobs = jobs or knobs.build_jobs()
    unique: dict[BuildSpec, int] = {}
    for spec in specs:
        unique.setdefault(spec, len(unique))
    order = list(unique)
    results: list[BuildResult | None] = [None] * len(order)

    def one(i: int) -> None:
        results[i] = build(order[i], timeout=timeout, cache=cache)
        if progress is not None:
            progress(results[i])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, range(len(order))))
    return [results[unique[s]] for s in specs]  # type: ignore[misc]


def build_file(path: str | os.PathLike, arch: str = "sm_90a", flags: tuple[str, ...] = (),
               **kwargs) -> BuildResult:
    path = Path(path)
    try:
        source = path.read_text()
    except OSError as exc:
        return BuildResult(TOOLCHAIN_ERROR, "", None, None, f"cannot read kernel file {path}: {exc}", name=str(path))
    return build(BuildSpec(source=source, arch=arch, flags=flags, name=str(path)), **kwargs)


# --- CLI: cudal2 build FILE... --arch sm_90a -------------------------------------------------
def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="kernel .cu files")
    parser.add_argument("--arch", default=None, help="sm_80 | sm_90a (default: CUDAL2_ARCH, else the visible GPU)")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="extra -D macro for nvcc")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    parser.add_argument("--json", action="store_true", help="print one JSON object per file")
    parser.add_argument("--log", action="store_true", help="print the compiler log of failed builds")


def run_cli(args: argparse.Namespace) -> int:
    try:
        arch = detect_arch(args.arch)
    except (ToolchainError, ValueError) as exc:   # no GPU and no --arch, or an unknown arch
        print(f"cudal2 build: {exc}", file=sys.stderr)
        return 2
    flags = tuple(f"-D{d}" for d in args.defines)
    specs = []
    for f in args.files:
        try:
            specs.append(BuildSpec(Path(f).read_text(), arch=arch, flags=flags, name=f))
        except OSError as exc:
            print(f"{f}: cannot read: {exc}", file=sys.stderr)
            return 2
    print(f"building {len(specs)} file(s) for {arch} in {knobs.cache_dir()}", file=sys.stderr)
    failed = 0
    for spec, res in zip(specs, build_many(specs, jobs=args.jobs)):
        failed += not res.ok
        if args.json:
            print(json.dumps({"file": spec.name, "so": str(res.so_path) if res.so_path else None, **res.summary()}))
            continue
        where = res.so_path if res.ok else res.status
        print(f"{spec.name}: {res.status} {'(cached) ' if res.cached else ''}{res.seconds:.1f}s "
              f"regs={res.max_registers} smem={res.max_shared_bytes} spills={res.spills}"
              + (f" binary_key={res.binary_key}" if res.ok else "") + f" -> {where}")
        if not res.ok and args.log:
            print(res.log)
        elif not res.ok:
            print("  " + trim_log(res.log, 8).replace("\n", "\n  "))
    return 1 if failed else 0
