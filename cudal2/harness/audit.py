"""Static audit of a kernel file: what it includes, what its .so imports, what its PTX computes.

A kernel may only launch its own device code on the caller's stream. The audit checks what can
be checked without running it, on the built artefacts rather than by guessing from source:

1. includes: `#include` lines may not name absolute or `..` paths, and quoted includes may only
   name our template headers (cudal2/templates); then `nvcc -M` lists every file the
   preprocessor actually reads, and each must lie under a toolkit / CUTLASS / system / template
   include root (catches macro-built include paths). The code (comments and literals out) may
   not name the per-thread or legacy default stream, a per-thread (_ptsz) spelling or an L2
   persistence control (check_stream_names): it launches on the stream it is given.
2. imports: the .so's undefined dynamic symbols (`nm -D`) must be on ALLOWED_SYMBOLS, and its
   DT_NEEDED libraries (`readelf -d`) on ALLOWED_LIBRARIES. Shared cudart makes every runtime
   call visible here. cuBLAS/cuBLASLt/cuDNN, threads, processes, streams/events/graphs,
   synchronisation, allocation, copies, files, sockets, dlopen, environment reads are rejected.
3. host machine code: no system-call instructions (syscall, sysenter, int 0x80) in the .so's
   host code (objdump). This is the rule for `asm`: inline asm in device code becomes PTX and is
   checked there; host asm that could reach the kernel without an import is the syscall.
4. driver entry points: a kernel that imports cudaGetDriverEntryPoint* (TMA descriptors need
   cuTensorMapEncodeTiled) may only name driver functions on ALLOWED_DRIVER_ENTRY_POINTS in its
   strings.
5. meta: read in a worker process (loading runs the kernel's static constructors: hostile), then
   checked against the ABI (cudal2.core.abi.parse_meta) and the build arch.
6. accumulator: every tensor-core instruction in the PTX (mma.sync, wgmma.mma_async, wmma.mma)
   with fp16 inputs must accumulate in the type the meta declares. CUDA-L2 shipped fp16-
   accumulate kernels labelled fp32.
7. meta vs binary (cudal2.harness.metacheck): threads vs launch bounds, the claimed shapes vs the
   host entry's own guard; AuditResult.meta_verified lists what the binary confirmed.
8. the dry call (`cudal2 audit`; audit_build with a dry_pool): one call of the ABI (load,
   cudal2_meta, cudal2_workspace, cudal2_hgemm at a tiny shape with dummy pointers, on a stream
   that is none of the default ones) under the call guard (callguard.py) in a worker that sees
   no device; every runtime call, launch off the call's stream or driver entry-point request
   the guard refuses rejects the library, whatever name the code assembled at run time.
The rules' version is AUDIT_VERSION (cudal2.core.vocab); audited_version() says which version a
recorded audit stands for, and a table row serves only at the current one.

Limits (said plainly): the audit stops lazy and accidental cheats, not determined ones; host code
can still compute function addresses, and a library can behave differently without a device (the
dry call sees only what a call does there). Process isolation (worker.py), the call guard armed
in the GPU workers and the dynamic checks in measure.py are the defence in depth.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cudal2.core.abi import meta_problems
from cudal2.core.build import TEMPLATE_DIR, BuildSpec, build, build_many, include_roots
from cudal2.core.identity import code_only
from cudal2.core.toolchain import ToolchainError, detect_arch
from cudal2.core.vocab import AUDIT_VERSION
from cudal2.harness import callguard
from cudal2.harness.cudacalls import DRIVER_ENTRY_POINTS, RUNTIME_ALLOWED
from cudal2.harness.metacheck import audit_meta
from cudal2.harness.worker import WorkerPool, probe_library

# ---- allowlists (why each entry is needed is in docs/harness.md) ------------------------------
_CUDART_ALLOWED = RUNTIME_ALLOWED              # the runtime and driver lists: cudacalls.py
ALLOWED_DRIVER_ENTRY_POINTS = DRIVER_ENTRY_POINTS
_LIBC_ALLOWED = {
    # memory and strings (host-side helpers; host heap is bounded by the worker's RSS limit)
    "memcpy", "memmove", "memset", "memcmp", "memchr", "strlen", "strcmp", "strncmp", "strchr",
    "strrchr", "strstr", "strcpy", "strncpy", "strnlen", "snprintf", "sprintf", "vsnprintf",
    "__memcpy_chk", "__memset_chk", "__memmove_chk", "__snprintf_chk", "__sprintf_chk",
    "__vsnprintf_chk", "__strcpy_chk", "__stack_chk_fail",
    "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
    "abort", "__assert_fail", "__cxa_atexit", "__cxa_finalize", "atexit",
    "__errno_location", "__tls_get_addr",
    # math
    "sqrt", "sqrtf", "ceil", "ceilf", "floor", "floorf", "log2", "log2f", "exp", "expf", "fabs",
    "fabsf", "pow", "powf", "fmin", "fmax", "lround", "round", "roundf",
    # diagnostics on the standard streams (CUTLASS reports TMA descriptor errors on std::cerr);
    # there is no way to open another stream: fopen/open/fdopen are rejected
    "printf", "fprintf", "puts", "fputs", "putchar", "fputc", "fwrite", "fflush", "vfprintf",
    "vprintf", "__printf_chk", "__fprintf_chk", "__vfprintf_chk", "stderr", "stdout",
    # libgcc 128-bit integer helpers
    "__udivti3", "__divti3", "__umodti3", "__modti3", "__multi3", "__mulodi4", "__popcountdi2",
    # toolchain/loader hooks every shared object may carry
    "__gmon_start__", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable",
    "_Jv_RegisterClasses", "_Unwind_Resume",
}
_CXX_ALLOWED_RE = re.compile(
    r"^(__cxa_(guard_acquire|guard_release|guard_abort|begin_catch|end_catch|rethrow|"
    r"allocate_exception|free_exception|throw|pure_virtual|deleted_virtual|call_unexpected|"
    r"get_exception_ptr|bad_cast|bad_typeid|throw_bad_array_new_length)"
    r"|__gxx_personality_v0"
    r"|_Zn[wa][mj](St11align_val_t)?(RKSt9nothrow_t)?"               # operator new / new[]
    r"|_Zd[la]Pv([mj])?(St11align_val_t)?(RKSt9nothrow_t)?"          # operator delete
    r"|_ZSt\d+__throw_\w+"                                          # std::__throw_length_error...
    r"|_ZSt9terminatev|_ZSt28__throw_bad_array_new_lengthv"
    r"|_ZNSt8ios_base4Init[CD][12]Ev"                               # <iostream>'s static init
    r"|_ZSt4c(err|out|log)|_ZNSo\w+|_ZNSolsE\w+|_ZSt16__ostream_insert\w+|_ZStlsISt11char_traits\w+"
    r"|_ZNKSt5ctypeIcE13_M_widen_initEv|_ZSt4endlIcSt11char_traitsIcEERSt13basic_ostream\w+"
    r"|_ZTV(N10__cxxabiv1\w+|St\d+\w*exception\w*)"                  # vtables of exception types
    r"|_ZTI\w*|_ZTS\w*"                                             # typeinfo (data)
    r"|_ZNSt\d+(bad_alloc|exception|bad_array_new_length|logic_error|runtime_error|length_error|"
    r"out_of_range|invalid_argument)\w*"
    r"|_ZNKSt\d+(exception|bad_alloc|logic_error|runtime_error)4whatEv"
    r"|_ZNSt7__cxx1112basic_string\w*|_ZNKSt7__cxx1112basic_string\w*)$")   # std::string helpers
ALLOWED_SYMBOLS = frozenset(_CUDART_ALLOWED | _LIBC_ALLOWED)
ALLOWED_LIBRARIES_RE = re.compile(
    r"^(libcudart\.so(\.\d+)*|libcuda\.so(\.\d+)*|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libc\.so\.6|"
    r"libm\.so\.6|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$")

# Why a symbol is rejected, for a readable reason (checked in order; default: "not allowed").
_DENY_CLASSES = (
    (re.compile(r"^(cublas|cublasLt|cudnn|cusparse|cufft|curand|cusolver|nccl)", re.I),
     "calls a library (cuBLAS/cuBLASLt/cuDNN/...) instead of its own kernel"),
    (re.compile(r"^(pthread_|_ZNSt6thread|thrd_|clone|fork|vfork|posix_spawn|system$|popen|exec|"
                r"daemon|setsid|kill|raise$|signal|sigaction)"),
     "creates threads or processes, or sends signals"),
    (re.compile(r"Synchronize|^cudaDeviceReset|^cudaDeviceSet|^cudaSetDevice|^cudaThreadSynchronize"),
     "synchronises or changes device state"),
    (re.compile(r"^cuda(Stream|Event|Graph|LaunchHostFunc|ThreadExchange|IpcOpen|CtxCreate)"
                r"|^cu(Stream|Event|Graph|Ctx(Create|Destroy|Set|Push|Pop))"),
     "creates or controls streams, events or graphs"),
    (re.compile(r"^cuda(Malloc|Free|HostAlloc|HostRegister|MallocManaged|MemPool|MallocAsync|"
                r"FreeAsync|MallocHost|FreeHost|Array)|^cuMem(Alloc|Free|Create|Map|Pool|Host)"
                r"|^__cudaRegisterManagedVar|^cudaMemcpy|^cuMemcpy|^mmap|^munmap|^mprotect|^brk|^sbrk"),
     "allocates or copies memory itself (the caller owns all device memory)"),
    (re.compile(r"^(open|fopen|freopen|fdopen|creat|read$|write$|pread|pwrite|close$|fclose|fread|"
                r"fwrite|fputs|fprintf|printf|puts|putchar|fflush|stat|lstat|fstat|access|unlink|"
                r"remove|rename|mkdir|opendir|readdir|socket|connect|bind|listen|accept|send|recv|"
                r"getaddrinfo|gethostbyname|ioctl|syscall|getenv|secure_getenv|setenv|putenv|"
                r"time$|clock|gettimeofday|nanosleep|usleep|sleep|sched_|_ZSt4cout|_ZSt4cerr|"
                r"_ZSt4clog|_ZNSo|_ZStlsI|_ZNSt14basic_ofstream|_ZNSt14basic_ifstream|"
                r"_ZNSt13basic_filebuf|__open|__read|__fprintf|__printf|__xstat|__fxstat)"),
     "does file, network, clock, environment or system calls"),
    (re.compile(r"^(dlopen|dlsym|dlvsym|dlmopen|dladdr|dlclose|dlerror|dl_iterate_phdr|_dl_|"
                r"cudaGetProcAddress|cuGetProcAddress|_r_debug)"),
     "loads code or looks up symbols at run time (dlopen/dlsym)"),
)


def classify_symbol(name: str) -> str | None:
    """None if `name` (an undefined dynamic symbol, version suffix stripped) is allowed,
    else why it is rejected."""
    if name in ALLOWED_SYMBOLS or _CXX_ALLOWED_RE.match(name):
        return None
    for pattern, why in _DENY_CLASSES:
        if pattern.search(name):
            return why
    return "is not on the allowlist of calls a GEMM launcher needs"


# ---- results -----------------------------------------------------------------------------------
@dataclass
class AuditResult:
    name: str                      # file name or spec name, for reports
    ok: bool                       # accepted
    verdict: str                   # "ok" | "rejected" | "build_error" | "load_crashed" | "load_timeout" | "error" | "missing" | "unreadable"
    reasons: list[str] = field(default_factory=list)    # why rejected (empty when ok)
    notes: list[str] = field(default_factory=list)      # facts that are not rejections
    imports: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    mma: dict[str, int] = field(default_factory=dict)   # tensor-core instruction -> count
    resources: list[dict] = field(default_factory=list)
    build: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)  # worker outcome of the meta probe
    meta_verified: list[str] = field(default_factory=list)   # meta fields the binary confirmed (metacheck)
    dry_call: dict[str, Any] = field(default_factory=dict)   # the dry call's record (check_dry_call); {} = not made
    audit_version: int = AUDIT_VERSION                        # the rules it was audited under

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the CLI: verdict, reason, ptxas stats."""
        regs = max((r["registers"] for r in self.resources), default=0)
        smem = max((r["shared_bytes"] for r in self.resources), default=0)
        spills = sum(r["spill_stores"] + r["spill_loads"] for r in self.resources)
        stats = f"regs={regs} smem={smem} spills={spills}" if self.resources else "no ptxas stats"
        why = "; ".join(self.reasons) if self.reasons else (self.meta.get("acc", "") and
                                                            f"acc={self.meta.get('acc')} layout={self.meta.get('layout')}")
        if self.ok and self.dry_call.get("status", "ok") != "ok":   # accepted, but not checked by behaviour
            why += f"; dry call {self.dry_call['status']}"
        if self.verdict in ("missing", "unreadable"):    # nothing was built: the file is the news
            return f"{self.name}: {self.verdict.upper()} - {why}"
        return f"{self.name}: {self.verdict.upper() if not self.ok else 'ok'} {stats}" + (f" - {why}" if why else "")


# ---- source rules ------------------------------------------------------------------------------
_INCLUDE_LINE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?P<form>[<"])(?P<path>[^>"\n]*)[>"]', re.M)
_INCLUDE_ANY_RE = re.compile(r'^[ \t]*#[ \t]*include\b(?P<rest>.*)$', re.M)


MAX_SOURCE_BYTES = 1 << 20        # a kernel file is a few tens of KB; more is an attack on the compiler


def check_includes(source: str, *, missing: bool = True) -> list[str]:
    """Reasons the source reaches outside its own text through #include lines, or is too big
    to be a kernel (empty = fine). `missing=False` leaves out quoted includes that are merely
    not found (a misspelt header): the compile in an empty folder fails on them, so they are the
    compiler's verdict (a build error), while escapes (absolute paths, '..', computed paths)
    stay rejections before nvcc sees the file."""
    reasons = []
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        return [f"source is {size} bytes (> {MAX_SOURCE_BYTES} allowed for one kernel file)"]
    templates = {p.name for p in TEMPLATE_DIR.glob("*.cuh")}
    for m in _INCLUDE_ANY_RE.finditer(source):
        line = m.group(0).strip()
        lm = _INCLUDE_LINE_RE.match(m.group(0))
        if lm is None:
            reasons.append(f"#include with a computed or malformed path: {line[:120]!r}")
            continue
        path = lm.group("path").strip()
        if path.startswith("/") or "\\" in path:
            reasons.append(f"#include of an absolute path: {line[:120]!r}")
        elif ".." in Path(path).parts:
            reasons.append(f"#include that climbs out with '..': {line[:120]!r}")
        elif missing and lm.group("form") == '"' and path not in templates and not _under_roots(path):
            reasons.append(f"#include \"{path}\" is neither one of our template headers "
                           f"({', '.join(sorted(templates)) or 'none'}) nor a toolkit/CUTLASS/"
                           "system header")
    return reasons


# Names a kernel needs only to work outside the stream it is given, or to leave the L2 cache in a
# state that outlives the call: the per-thread and legacy default streams (handles, the macros
# and flags that make a file or a driver lookup per-thread, any _ptsz/_ptds spelling) and the
# L2 persistence controls. The call guard checks the same by behaviour (callguard.c).
_STREAM_NAMES_RE = re.compile(
    r"\b(cudaStreamPerThread|cudaStreamLegacy|CU_STREAM_PER_THREAD|CU_STREAM_LEGACY"
    r"|(__CUDART_API|CUDA_API)_PER_THREAD_DEFAULT_STREAM|cudaEnablePerThreadDefaultStream"
    r"|CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM|\w+_pt(sz|ds))\b")
_L2_PERSIST_RE = re.compile(
    r"\b(accessPolicyWindow|cuda(Launch|Stream|KernelNode)AttributeAccessPolicyWindow"
    r"|CU_(LAUNCH|STREAM|KERNEL_NODE)_ATTRIBUTE_ACCESS_POLICY_WINDOW|cudaAccessPropertyPersisting"
    r"|CU_ACCESS_PROPERTY_PERSISTING|cudaLimitPersistingL2CacheSize"
    r"|CU_LIMIT_PERSISTING_L2_CACHE_SIZE)\b")


def check_stream_names(source: str) -> list[str]:
    """Reasons the code (comments and literals out) names a default stream other than the one
    it is given, or an L2 persistence control (empty = fine)."""
    code = code_only(source)
    reasons = []
    for pattern, why in ((_STREAM_NAMES_RE, "names a default stream (a kernel launches on the "
                          "stream it is given, nothing else)"),
                         (_L2_PERSIST_RE, "names an L2 persistence control (state that outlives "
                          "the call)")):
        found = sorted({m.group(0) for m in pattern.finditer(code)})
        if found:
            reasons.append(f"{why}: {', '.join(found[:6])}")
    return reasons


def check_source(source: str, *, missing: bool = True) -> list[str]:
    """Every rule read from the source text: check_includes, then check_stream_names."""
    return check_includes(source, missing=missing) or check_stream_names(source)


def _under_roots(path: str) -> bool:
    """A quoted include is fine when it names a header inside an include root (e.g.
    "cutlass/cutlass.h"): the build compiles in an empty folder, so it resolves there."""
    try:
        roots = include_roots(header_dirs=True)
    except Exception:          # no toolchain: only the template names are known
        return False
    return any((r / path).is_file() for r in roots)


def check_dependencies(build_result) -> list[str]:
    """Every file the compile read (the build's own nvcc -MD list) must lie under one of the
    include roots the build allowed (recorded with it, so a build carried to another machine is
    judged by where it was made). Returns the reasons (empty = fine)."""
    deps, roots = build_result.deps, [Path(r) for r in build_result.include_roots]
    if not deps or not roots:
        return ["the build recorded no dependency list: rebuild it with this cudal2"]
    out = [f"reads {d} during compilation, outside the toolkit/CUTLASS/system/template "
           "include roots" for d in deps if not any(Path(d).is_relative_to(r) for r in roots)]
    return out[:10]


# ---- binary rules ------------------------------------------------------------------------------
def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"audit needs `{name}` (GNU binutils: apt-get install binutils)")
    return path


def undefined_symbols(so_path: str | Path) -> list[str]:
    out = subprocess.run([_tool("nm"), "-D", "--undefined-only", str(so_path)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if parts:
            names.add(parts[-1].split("@")[0])
    return sorted(names)


def needed_libraries(so_path: str | Path) -> list[str]:
    out = subprocess.run([_tool("readelf"), "-d", "-W", str(so_path)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


_SYSCALL_INSN_RE = re.compile(r"\t(syscall|sysenter|int\s+\$0x80)\b")


def host_syscalls(so_path: str | Path) -> int:
    """Count of system-call instructions in the .so's host code."""
    out = subprocess.run([_tool("objdump"), "-d", "--no-show-raw-insn", str(so_path)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return len(_SYSCALL_INSN_RE.findall(out))


def driver_entry_names(so_path: str | Path) -> list[str]:
    """Driver function names (cuXxx) spelled in the .so's strings."""
    data = Path(so_path).read_bytes()
    return sorted({m.decode() for m in re.findall(rb"(?<![A-Za-z0-9_])cu[A-Z][A-Za-z0-9_]{3,60}(?=\x00)", data)})


def check_binary(so_path: str | Path) -> tuple[list[str], list[str], list[str], list[str]]:
    """(reasons, notes, imports, needed) for a built .so."""
    reasons: list[str] = []
    notes: list[str] = []
    imports = undefined_symbols(so_path)
    needed = needed_libraries(so_path)
    by_why: dict[str, list[str]] = {}
    for sym in imports:
        why = classify_symbol(sym)
        if why:
            by_why.setdefault(why, []).append(sym)
    for why, syms in by_why.items():
        reasons.append(f"{why}: {', '.join(syms[:6])}{' ...' if len(syms) > 6 else ''}")
    bad_libs = [l for l in needed if not ALLOWED_LIBRARIES_RE.match(l)]
    if bad_libs:
        reasons.append(f"links libraries outside the CUDA runtime and C/C++ runtime: {', '.join(bad_libs)}")
    n = host_syscalls(so_path)
    if n:
        reasons.append(f"host code contains {n} raw system-call instruction(s) (asm outside device code)")
    if any(s.startswith(("cudaGetDriverEntryPoint", "cuGetProcAddress")) for s in imports):
        names = driver_entry_names(so_path)
        bad = [x for x in names if x not in ALLOWED_DRIVER_ENTRY_POINTS
               and not x.startswith(("cuda", "cudal2", "cute", "cutlass", "cub"))]
        if bad:
            reasons.append(f"names driver functions outside the allowlist (via the driver entry "
                           f"point): {', '.join(bad[:6])}")
        notes.append(f"driver entry points named: {', '.join(n for n in names if n in ALLOWED_DRIVER_ENTRY_POINTS) or 'none'}")
    return reasons, notes, imports, needed


# ---- exports: nothing but the ABI -------------------------------------------------------------
ABI_EXPORTS = frozenset({"cudal2_hgemm", "cudal2_meta", "cudal2_workspace"})
# Namespaces of the libraries the worker and cudal2.matmul run beside: a kernel has no business
# defining a function there (it could stand in for theirs wherever symbols resolve globally).
_FOREIGN_NAMESPACES = ("__cxxabiv1", "__gnu_cxx", "at", "c10", "torch", "caffe2", "pybind11", "cuda",
                       "cub", "thrust", "cutlass", "cute", "nvrtc")
_FOREIGN_NAMESPACE_RE = re.compile(                          # std:: and its abbreviations, then
    r"^_ZN?K?(St|Sa|Sb|Ss|Si|So|Sd|"                         # <length><name> of the others
    + "|".join(f"{len(n)}{n}" for n in _FOREIGN_NAMESPACES) + ")")
_DYNSYM_RE = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\d+\s+(\w+)\s+(\w+)\s+\w+\s+(\w+)\s+(\S+)")


def exported_symbols(so_path: str | Path) -> list[tuple[str, str, str]]:
    """(name, type, binding) of every symbol the .so defines in its dynamic table (readelf
    --dyn-syms: FUNC/OBJECT/IFUNC..., GLOBAL/WEAK/UNIQUE), version suffix stripped."""
    out = subprocess.run([_tool("readelf"), "-W", "--dyn-syms", str(so_path)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    syms = []
    for line in out.splitlines():
        m = _DYNSYM_RE.match(line)
        if m and m.group(3) != "UND" and m.group(1) not in ("SECTION", "FILE", "NOTYPE") \
                and m.group(2) != "LOCAL":
            syms.append((m.group(4).split("@")[0], m.group(1), m.group(2)))
    return syms


def check_exports(exports: list[tuple[str, str, str]]) -> list[str]:
    """A kernel library exports nothing but the ABI's entry points. What the compiler emits in
    every library is allowed: weak or unique C++ (mangled) symbols, the vague-linkage copies of
    header templates and inline functions and variables (CUTLASS, libcu++, libstdc++); and the
    kernel's own mangled helpers, outside other libraries' namespaces. Rejected: any other
    C-linkage name (a C-linkage name is where every CUDA, driver and libc function lives: an
    exported cudaEventElapsedTime, say, would stand in for the runtime's) and C++ functions
    defined in std, at, c10, torch, cuda, cutlass... (docs/harness.md, rule 7)."""
    c_names, foreign = [], []
    for name, typ, bind in exports:
        if name in ABI_EXPORTS:
            continue
        if not name.startswith("_Z"):
            c_names.append(name)
        elif bind == "GLOBAL" and typ in ("FUNC", "IFUNC") and _FOREIGN_NAMESPACE_RE.match(name):
            foreign.append(name)
    reasons = []
    if c_names:
        reasons.append(f"exports unmangled symbols outside the ABI (C-linkage functions or global variables: make them static): "
                       f"{', '.join(sorted(c_names)[:6])}{' ...' if len(c_names) > 6 else ''}")
    if foreign:
        reasons.append(f"defines functions in another library's namespace: "
                       f"{', '.join(sorted(foreign)[:3])}{' ...' if len(foreign) > 3 else ''}")
    return reasons


# ---- PTX accumulator rule ----------------------------------------------------------------------
_MMA_RE = re.compile(r"\b(mma\.sync\.aligned\.[\w.]+|wgmma\.mma_async\.[\w.]+|wmma\.mma\.sync\.[\w.]+)")
_F16IN = ("f16", "bf16")


def mma_accumulators(ptx: str) -> dict[str, dict[str, int]]:
    """{acc type: {instruction: count}} for tensor-core instructions with 16-bit float inputs.

    mma.sync.aligned.<shape>.<alay>.<blay>.<d>.<a>.<b>.<c>  (d = accumulator out)
    wgmma.mma_async.sync.aligned.<shape>.<d>.<a>.<b>
    wmma.mma.sync.aligned.<alay>.<blay>.<shape>.<d>.<c>     (f16 inputs implied)"""
    found: dict[str, dict[str, int]] = {}
    for m in _MMA_RE.finditer(ptx):
        insn = m.group(1)
        parts = insn.split(".")
        types = [p for p in parts if re.fullmatch(r"(f16|bf16|f32|f64|tf32|s32|s8|u8|s4|u4|b1|e4m3|e5m2)", p)]
        acc = None
        if insn.startswith("mma.sync") and len(types) >= 3 and types[1] in _F16IN:
            acc = types[0]
        elif insn.startswith("wgmma") and len(types) >= 3 and types[1] in _F16IN:
            acc = types[0]
        elif insn.startswith("wmma") and len(types) >= 2 and set(types) <= {"f16", "f32"}:
            acc = "f32" if "f32" in types else "f16"
            if types[0] != types[1]:
                acc = "mixed"
        if acc is None:
            acc = "other"
        found.setdefault(acc, {})
        found[acc][insn] = found[acc].get(insn, 0) + 1
    return found


def check_accumulator(ptx: str, declared: str) -> tuple[list[str], list[str], dict[str, int]]:
    """Reject fp16 accumulation when the meta declares fp32. Returns (reasons, notes, counts)."""
    found = mma_accumulators(ptx)
    counts = {insn: n for d in found.values() for insn, n in d.items()}
    reasons, notes = [], []
    if declared == "f32":
        bad = {**found.get("f16", {}), **found.get("mixed", {})}
        if bad:
            reasons.append("declares acc f32 but its PTX accumulates in fp16: "
                           + ", ".join(f"{k} x{v}" for k, v in list(bad.items())[:3]))
    elif declared == "f16" and "f32" in found:
        notes.append("declares acc f16 but accumulates in fp32 (more accurate; compared against "
                     "fp16-accumulate baselines)")
    if "other" in found:
        notes.append("tensor-core instructions with non-fp16 inputs: "
                     + ", ".join(list(found["other"])[:3]))
    if not found:
        notes.append("no tensor-core instructions in the PTX (SIMT kernel)")
    return reasons, notes, counts


# ---- meta -------------------------------------------------------------------------------------
def check_meta(meta: dict, arch: str) -> list[str]:
    """The ABI's meta rules, all of them, plus "built for this arch"."""
    return meta_problems(meta, arch)


def probe_meta(so_path: str | Path, pool=None, timeout_s: float = 30,
               mem_limit_bytes: int = 4 << 30):
    """Load the .so in a worker and read its meta. Returns the WorkerOutcome."""
    own = pool is None
    pool = pool or WorkerPool(rlimit_data=False, max_tasks=1)
    try:
        return pool.run(probe_library, str(so_path), timeout_s=timeout_s,
                        mem_limit_bytes=mem_limit_bytes)
    finally:
        if own:
            pool.close()


# ---- the dry call under the call guard ---------------------------------------------------------
def dry_call_pool() -> WorkerPool:
    """Workers for the dry call: the call guard preloaded, no device visible (nothing a call does
    can launch or touch device memory), a fresh process per library. Raises
    callguard.CallGuardError (or OSError) when the guard cannot be built (no host C compiler)."""
    return WorkerPool(max_tasks=1, device="", env=callguard.preload_env())


def check_dry_call(so_path: str | Path, pool, *, timeout_s: float = 30,
                   mem_limit_bytes: int = 4 << 30) -> tuple[list[str], list[str], dict]:
    """One dry call of the library under the call guard (callguard.dry_call in `pool`, a
    dry_call_pool()). Returns (reasons: one line naming every request the guard refused, notes,
    the record). A dry call that crashes, hangs or raises costs its worker and is a note: the
    guard's record is lost, and the GPU run arms the guard again."""
    out = pool.run(callguard.dry_call, str(so_path), timeout_s=timeout_s,
                   mem_limit_bytes=mem_limit_bytes)
    if out.status != "ok":
        return [], [f"dry call {out.status}: {out.detail[:200]} (the call guard's record is lost: "
                    "unchecked until a GPU run)"], {"status": out.status, "detail": out.detail[:500]}
    v = out.value
    at = "x".join(map(str, v["shape"]))
    record = {"status": "ok", **v}
    refused = list(dict.fromkeys(v["refused"]))
    if refused:
        return [f"the call guard refused {', '.join(refused[:6])}{' ...' if len(refused) > 6 else ''}"
                f" in a dry call (cudal2_hgemm at {at}, dummy pointers, no device): forbidden by "
                "the ABI"], [], record
    return [], [f"dry call: cudal2_hgemm at {at} returned {v['rc']} without a device; "
                f"{len(v['calls'])} runtime call(s) recorded, none refused"], record


def audited_version(audit: dict | None) -> int:
    """The audit version a recorded audit (AuditResult.to_dict(), or an Evaluation's audit)
    stands for: the version of its rules (1 when it predates versions) as far as the call guard
    also watched the library's calls under them (a dry call, or the GPU run's guard: its
    `rules`), else 0 (its calls never watched). A table row serves only at AUDIT_VERSION."""
    audit = audit or {}
    if not audit.get("ok", True):
        return 0
    watched = [rec.get("rules", 1) for rec in (audit.get("dry_call") or {}, audit.get("call_guard") or {})
               if rec.get("status") in ("ok", "on")]
    return min(int(audit.get("audit_version") or 1), max(watched, default=0))


def open_dry_pool():
    """(dry_call_pool(), None), or (None, why) when the call guard cannot be built."""
    try:
        return dry_call_pool(), None
    except (callguard.CallGuardError, OSError, subprocess.SubprocessError) as exc:
        return None, f"the call guard could not be built ({str(exc)[:200]})"


# ---- the audit --------------------------------------------------------------------------------
def audit_build(source: str, build_result, arch: str = "sm_90a", *, name: str = "kernel",
                pool=None, meta: dict | None = None, probe_timeout_s: float = 30,
                dry_pool=None) -> AuditResult:
    """Audit an already-built kernel. `meta` skips the worker probe when the caller already
    read it in a worker; otherwise the .so is loaded in `pool` (a fresh worker if None).
    `dry_pool` (dry_call_pool()): a library the static rules accept gets the dry call too."""
    res = AuditResult(name=name, ok=False, verdict="rejected",
                      build=build_result.summary() if build_result is not None else {})
    res.reasons += check_source(source)
    if res.reasons:
        return res
    if build_result is None or not build_result.ok:
        res.verdict = "build_error"
        res.reasons.append(f"build {getattr(build_result, 'status', 'missing')}: "
                           + (build_result.summary()["log_tail"].splitlines() or [""])[-1][:300]
                           if build_result is not None else "not built")
        return res
    res.resources = [asdict(r) for r in build_result.resources]
    res.reasons += check_dependencies(build_result)
    r, n, res.imports, res.needed = check_binary(build_result.so_path)
    res.reasons += r
    res.notes += n
    res.reasons += check_exports(exported_symbols(build_result.so_path))
    if meta is None:
        out = probe_meta(build_result.so_path, pool=pool, timeout_s=probe_timeout_s)
        res.load = {"status": out.status, "detail": out.detail, "seconds": round(out.seconds, 3)}
        if out.status == "ok":
            meta = out.value["meta"]
            if not out.value["symbols"].get("cudal2_hgemm"):
                res.reasons.append("does not export cudal2_hgemm (extern \"C\" required)")
            if meta.get("abi") == 2 and not out.value["symbols"].get("cudal2_workspace"):
                res.reasons.append("meta says abi 2 but cudal2_workspace is not exported "
                                   "(extern \"C\" required)")
        elif out.status == "error":
            res.reasons.append(f"meta unreadable: {out.detail}")
        else:
            res.verdict = {"crashed": "load_crashed", "timeout": "load_timeout",
                           "oom": "load_oom"}.get(out.status, "error")
            res.reasons.append(f"loading the library or calling cudal2_meta {out.status}: {out.detail}")
            return res
    if meta is not None:
        res.meta = meta
        res.reasons += check_meta(meta, arch)
        ptx_path = build_result.ptx_path
        if ptx_path is None or not Path(ptx_path).is_file():
            res.reasons.append("no PTX kept by the build: the accumulator cannot be verified")
        elif meta.get("acc") in ("f32", "f16"):
            r, n, res.mma = check_accumulator(Path(ptx_path).read_text(errors="replace"), meta["acc"])
            res.reasons += r
            res.notes += n
        audit_meta(res, meta, build_result, pool)      # threads / tile vs the binary (metacheck)
    if not res.reasons and dry_pool is not None:
        r, n, res.dry_call = check_dry_call(build_result.so_path, dry_pool, timeout_s=probe_timeout_s)
        res.reasons += r
        res.notes += n
    res.ok = not res.reasons
    if res.ok:
        res.verdict = "ok"
    return res


def audit_source(source: str, arch: str = "sm_90a", *, name: str = "kernel", pool=None,
                 build_timeout: float = 900) -> AuditResult:
    """Build (cached) and audit one kernel source."""
    pre = check_source(source)
    if pre:
        return AuditResult(name=name, ok=False, verdict="rejected", reasons=pre)
    br = build(BuildSpec(source=source, arch=arch, name=name), timeout=build_timeout)
    return audit_build(source, br, arch, name=name, pool=pool)


def audit_file(path: str | Path, arch: str = "sm_90a", *, pool=None) -> AuditResult:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return AuditResult(name=str(path), ok=False, verdict="missing",
                           reasons=[f"no such file: {path}"])
    except OSError as e:                # permission, a directory, an I/O error
        return AuditResult(name=str(path), ok=False, verdict="unreadable",
                           reasons=[f"cannot read {path}: {e.strerror or e}"])
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return AuditResult(name=str(path), ok=False, verdict="rejected",
                           reasons=[f"source is not UTF-8 ({e.reason} at byte {e.start})"])
    return audit_source(source, arch, name=str(path), pool=pool)


# ---- CLI: cudal2 audit FILE... [--arch sm_90a] [--json] ---------------------------------------
def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="kernel .cu files")
    parser.add_argument("--arch", default=None,
                        help="target arch (default: CUDAL2_ARCH, else the visible GPU, else sm_90a)")
    parser.add_argument("--json", action="store_true", help="one JSON object per file")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print notes and imports")


def run_cli(args: argparse.Namespace) -> int:
    try:
        arch = detect_arch(args.arch)
    except (ToolchainError, RuntimeError, ValueError):
        arch = args.arch or "sm_90a"
    print(f"auditing {len(args.files)} file(s) for {arch}", file=sys.stderr)
    sources: dict[str, str | None] = {}
    results: dict[str, AuditResult] = {}
    for f in args.files:
        try:
            sources[f] = Path(f).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            results[f] = audit_file(f, arch)           # gives the precise reason
            sources[f] = None
        else:
            pre = check_source(sources[f])
            if pre:
                results[f] = AuditResult(name=f, ok=False, verdict="rejected", reasons=pre)
    todo = [f for f in args.files if f not in results]
    builds = build_many([BuildSpec(sources[f], arch=arch, name=f) for f in todo])
    rejected = 0
    dry_pool, off = open_dry_pool()
    if off:
        print(f"no dry calls: {off}; run-time calls are unchecked until a GPU run", file=sys.stderr)
    with WorkerPool(max_tasks=1) as pool, dry_pool or contextlib.nullcontext():
        for f in args.files:                            # every library in a fresh process
            res = results.get(f) or audit_build(sources[f], builds[todo.index(f)], arch, name=f,
                                                pool=pool, dry_pool=dry_pool)
            if off and res.ok:
                res.dry_call = {"status": "off", "detail": off}
                res.notes.append(f"dry call off: {off}")
            rejected += not res.ok
            if args.json:
                print(json.dumps(res.to_dict()), flush=True)
                continue
            print(res.line(), flush=True)
            if args.verbose:
                for n in res.notes:
                    print(f"  note: {n}")
                print(f"  imports: {' '.join(res.imports)}")
                print(f"  needed: {' '.join(res.needed)}")
    print(f"{len(args.files) - rejected} accepted, {rejected} rejected", file=sys.stderr)
    return 1 if rejected else 0
