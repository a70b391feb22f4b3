"""A kernel's time without a GPU, from what its build shows (never from what it claims).

Without a GPU the RL reward still needs a number for a kernel that built and passed the audit.
The kernel's `cudal2_meta` is its own claim (a naive scalar kernel can declare a 128x256 CUTLASS
tile), so nothing here reads it. Everything comes from the build's device code and ptxas:

- the PTX instruction mix of each kernel entry's hottest loop (the backward-branch loop with the
  most arithmetic): tensor-core instructions (``wgmma.mma_async``, ``mma.sync``, ``wmma``) or
  scalar FMA (``fma.rn.f32``, ``fma.rn.f16x2``), and its global traffic (``cp.async`` sizes,
  ``ld.global`` widths; TMA ``cp.async.bulk.tensor`` sizes are set by the host, so a TMA kernel's
  operand reuse is taken from its wgmma shape);
- flops per byte loaded in that loop = the CTA tile's operand reuse BM*BN/(BM+BN), hence an
  equivalent square tile (2 x reuse) for wave quantisation;
- the ``cp.async.wait_group`` depth (pipeline stages), ``.maxntid``/``.reqntid`` (threads per
  CTA, where declared), ptxas registers and spills (occupancy, local-memory traffic).

The time is a roofline on the target GPU's peaks (cudal2.search.costmodel's GpuSpec): tensor or FMA
peak x the instruction class's efficiency x how well the tile feeds it x occupancy, against
DRAM traffic, plus launch cost. A kernel file is priced by its slowest entry that has an
arithmetic loop, so an entry that is never launched cannot raise the estimate (a dead loop
inside a launched entry can: static code cannot tell; estimates only stand in for a GPU, rank
kernels on CPU and are never exported). Two sources with the same device code (e.g. the same kernel with two different metas)
get the same estimate. It is an estimate: rows carry ``estimated = 1`` and every log says so.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

# Fraction of the dense fp16 tensor peak an instruction class's main loop reaches when fed
# (a prior, not measured here): wgmma ~ CUTLASS/cuBLAS; mma.sync tops out near 2/3 of Hopper's
# peak; scalar FMA runs on the CUDA cores (H100 SXM: 67 TFLOP/s fp32, 134 fp16x2 of 989).
CLASS_EFF = {"wgmma": 0.80, "mma": 0.55, "wmma": 0.45, "fma_f16x2": 0.135 * 0.7,
             "fma_f16": 0.068 * 0.7, "fma_f32": 0.068 * 0.7}
CLASS_RANK = {"wgmma": 4, "mma": 3, "wmma": 3, "fma_f16x2": 1, "fma_f16": 1, "fma_f32": 1}
# pipeline depth -> fraction of load latency hidden (1 = loads not overlapped with math)
DEPTH_EFF = {1: 0.75, 2: 0.9}
TMA_REUSE_M = 128            # a TMA kernel's tile rows (two consumer warpgroups of 64 rows)
DEFAULT_THREADS = 256        # when the kernel declares no launch bounds
MEM_EXPOSED = 0.6            # as cudal2.search.costmodel: part of the shorter of compute/memory not hidden

_ENTRY = re.compile(r"^[ \t]*(?:\.(?:visible|weak)[ \t]+)?\.entry[ \t]+([\w$.]+)", re.M)
_LABEL = re.compile(r"^\s*(\$?[\w$]+):")
_BRA = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w$]+)\s*;")
_NTID = re.compile(r"\.(?:maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_MMA_SHAPE = re.compile(r"\.m(\d+)n(\d+)k(\d+)\b")
_WAIT = re.compile(r"cp\.async\.wait_group\s+(\d+)")
_CP_ASYNC = re.compile(r"^cp\.async\.(?:ca|cg)\.shared(?:::\w+)?\.global\S*\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(\d+)")
_TMA_LOAD = re.compile(r"\.shared(?:::\w+)?\.global")
_LD_GLOBAL = re.compile(r"^ld\.global(?:\.\w+)*?(?:\.v(\d))?\.([busf])(\d+)\b")


def _op(line: str) -> str:
    s = line.strip()
    if s.startswith("@"):
        s = s.split(None, 1)[1] if " " in s or "\t" in s else ""
    return s


@dataclass
class LoopCounts:
    """Per-thread arithmetic and global traffic of one loop body (static instruction counts)."""
    flops: float = 0.0           # per thread per iteration
    bytes: float = 0.0           # global bytes loaded per thread per iteration
    tma: int = 0                 # TMA loads (their size is the host's)
    kind: str = ""               # strongest arithmetic class in the loop
    wgmma_n: int = 0             # widest wgmma N
    depth: int = 1               # cp.async pipeline depth (wait_group N -> N + 2)

    def add(self, line: str) -> None:
        s = _op(line)
        if not s or s.startswith(("//", "$", ".")):
            return
        cls = flops = None
        if s.startswith("wgmma.mma_async"):
            m = _MMA_SHAPE.search(s)
            if m:
                M, N, K = map(int, m.groups())
                flops, cls = 2.0 * M * N * K / 128, "wgmma"
                self.wgmma_n = max(self.wgmma_n, N)
        elif s.startswith("mma.sync"):
            m = _MMA_SHAPE.search(s)
            if m:
                M, N, K = map(int, m.groups())
                flops, cls = 2.0 * M * N * K / 32, "mma"
        elif s.startswith("wmma.mma"):
            m = _MMA_SHAPE.search(s)
            M, N, K = map(int, m.groups()) if m else (16, 16, 16)
            flops, cls = 2.0 * M * N * K / 32, "wmma"
        elif s.startswith(("fma.rn.f16x2", "fma.rn.bf16x2", "fma.rn.ftz.f16x2")):
            flops, cls = 4.0, "fma_f16x2"
        elif s.startswith(("fma.rn.f16", "fma.rn.bf16")):
            flops, cls = 2.0, "fma_f16"
        elif s.startswith(("fma.rn.f32", "fma.rn.ftz.f32", "mad.rn.f32", "mad.f32")):
            flops, cls = 2.0, "fma_f32"
        elif s.startswith("cp.async.bulk.tensor"):
            if _TMA_LOAD.search(s.split()[0]):      # global -> shared (a store is .global.shared)
                self.tma += 1
        elif s.startswith("cp.async.wait_group"):
            m = _WAIT.match(s)
            if m:
                self.depth = max(self.depth, int(m.group(1)) + 2)
        else:
            m = _CP_ASYNC.match(s)
            if m:
                self.bytes += int(m.group(1))
            else:
                m = _LD_GLOBAL.match(s)
                if m:
                    self.bytes += int(m.group(1) or 1) * int(m.group(3)) / 8
        if cls:
            self.flops += flops
            if CLASS_RANK[cls] > CLASS_RANK.get(self.kind, 0):
                self.kind = cls


@dataclass
class EntryFacts:
    name: str
    threads: int | None          # declared launch bounds (maxntid/reqntid), None = unknown
    hot: LoopCounts              # the hottest loop (or the whole body when it has no loop)
    registers: int = 0
    spills: int = 0
    shared_bytes: int = 0        # static (ptxas); dynamic shared memory is the host's


@dataclass
class BuildFacts:
    """What the estimate reads, per entry with an arithmetic loop."""
    entries: list[EntryFacts] = field(default_factory=list)
    kind: str = ""               # the weakest arithmetic class; "" = no arithmetic loop found

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "entries": [
            {"name": e.name[:80], "threads": e.threads, "registers": e.registers,
             "spills": e.spills, "kind": e.hot.kind, "flops_per_thread": e.hot.flops,
             "global_bytes_per_thread": e.hot.bytes, "tma_loads": e.hot.tma,
             "wgmma_n": e.hot.wgmma_n, "depth": e.hot.depth} for e in self.entries]}


def _entries(ptx: str):
    ms = list(_ENTRY.finditer(ptx))
    for i, m in enumerate(ms):
        yield m.group(1), ptx[m.start():ms[i + 1].start() if i + 1 < len(ms) else len(ptx)]


def _counts(lines) -> LoopCounts:
    c = LoopCounts()
    for l in lines:
        c.add(l)
    return c


def hottest_loop(body: str) -> LoopCounts:
    """Counts of the backward-branch loop with the most flops per iteration (ties: the
    shortest); the whole body when no loop holds arithmetic (fully unrolled kernels)."""
    lines = body.splitlines()
    labels: dict[str, int] = {}
    best: tuple[float, int, LoopCounts] | None = None
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
            continue
        b = _BRA.search(line)
        if b and b.group(1) in labels:
            a = labels[b.group(1)]
            c = _counts(lines[a:i + 1])
            if c.flops and (best is None or c.flops > best[0] or (c.flops == best[0] and i - a < best[1])):
                best = (c.flops, i - a, c)
    if best is not None:
        hot = best[2]
        if hot.tma == 0 and not hot.bytes:      # warp-specialised: loads live in another loop
            whole = _counts(lines)
            hot.tma = whole.tma
        return hot
    return _counts(lines)


def ptx_facts(ptx: str, resources=()) -> BuildFacts:
    """BuildFacts of a PTX file; `resources`: the build's ptxas KernelResources (or dicts)."""
    res = {}
    for r in resources or ():
        d = r if isinstance(r, dict) else asdict(r)
        res[d["function"]] = d
    entries = []
    for name, body in _entries(ptx):
        hot = hottest_loop(body)
        if not hot.flops:
            continue
        m = _NTID.search(body[:4000])
        threads = None
        if m:
            threads = 1
            for g in m.groups():
                threads *= int(g or 1)
        r = res.get(name, {})
        entries.append(EntryFacts(name, threads, hot, int(r.get("registers") or 0),
                                  int((r.get("spill_stores") or 0) + (r.get("spill_loads") or 0)),
                                  int(r.get("shared_bytes") or 0)))
    if not entries:
        return BuildFacts()
    # every entry with an arithmetic loop is a candidate GEMM; the kind shown is the weakest
    # (the estimate prices the slowest entry)
    return BuildFacts(entries, min((e.hot.kind for e in entries), key=lambda k: CLASS_EFF[k]))


def _reuse(e: EntryFacts) -> float:
    """Flops per global byte of the entry's hottest loop = the CTA tile's BM*BN/(BM+BN)."""
    h = e.hot
    if h.bytes > 0:
        return h.flops / h.bytes                    # per thread on both sides
    if h.tma or h.kind == "wgmma":                  # TMA: sizes are the host's; the wgmma N is not
        n = max(h.wgmma_n, 8)
        return TMA_REUSE_M * n / (TMA_REUSE_M + n)
    return 0.5                                      # no visible loads: as a naive kernel


def entry_time_us(e: EntryFacts, shape, gpu) -> tuple[float, dict]:
    """(estimated kernel time in us, the terms) of one GEMM entry on `gpu` (a costmodel.GpuSpec)."""
    M, N, K = shape
    h = e.hot
    reuse = max(_reuse(e), 1e-3)
    eff = CLASS_EFF[h.kind]
    feed = min(1.0, math.sqrt(reuse / 64.0))        # below a 128x128 tile's reuse the loop starves
    depth = 3 if (h.tma or h.kind == "wgmma") else h.depth
    hide = DEPTH_EFF.get(depth, 1.0)
    threads = e.threads or DEFAULT_THREADS
    tile = int(min(256, max(16, 2 * reuse))) if h.kind in ("wgmma", "mma", "wmma") else 16
    limits = [2048 // threads, 32]
    if e.registers:
        limits.append(65536 // max(e.registers * threads, 1))
    stage_bytes = 2.0 * 2 * tile * 32                # a tile's A+B stage at BK = 32
    smem = e.shared_bytes + (depth * stage_bytes if h.kind in ("wgmma", "mma", "wmma") else 0)
    limits.append(int(gpu.smem_per_sm // max(smem, 1)))
    occ = max(1, min(limits))
    fill = min(1.0, occ * threads / 256)
    spill = 1.0 / (1.0 + e.spills / 256.0)
    rate_tflops = gpu.tflops * eff * feed * hide * fill * spill
    # wave quantisation on the equivalent square tile
    ctas = math.ceil(M / tile) * math.ceil(N / tile)
    slots = gpu.sms * occ
    waves = math.ceil(ctas / slots)
    wave_eff = ctas / (waves * slots)
    flops = 2.0 * M * N * K
    compute_us = flops / (rate_tflops * 1e6 * max(wave_eff, 1e-3))
    mem_us = 2.0 * (M * K + K * N + M * N) / (gpu.tbps * 0.9 * 1e6)
    us = gpu.launch_us + max(compute_us, mem_us) + MEM_EXPOSED * min(compute_us, mem_us)
    return us, {"kind": h.kind, "reuse": round(reuse, 2), "tile": tile, "depth": depth,
                "threads": threads, "occupancy": occ, "wave_eff": round(wave_eff, 3),
                "compute_us": round(compute_us, 3), "mem_us": round(mem_us, 3)}


def estimate_us(facts: BuildFacts, shape, gpu) -> tuple[float | None, dict]:
    """(estimated time, why) for a kernel's BuildFacts: its slowest GEMM entry; (None, why)
    when the device code shows no arithmetic loop."""
    if not facts.entries:
        return None, {"why": "no arithmetic (tensor-core or FMA) loop in the device code"}
    priced = [entry_time_us(e, shape, gpu) for e in facts.entries]
    us, terms = max(priced, key=lambda p: p[0])
    return us, {**terms, "entries": len(priced)}


_CACHE: dict[str, BuildFacts] = {}


def facts_for_build(build_result) -> BuildFacts | None:
    """BuildFacts of a BuildResult (its kept PTX and ptxas resources), cached by build key."""
    key = getattr(build_result, "key", "")
    if key and key in _CACHE:
        return _CACHE[key]
    ptx_path = getattr(build_result, "ptx_path", None)
    if not ptx_path:
        return None
    from pathlib import Path
    p = Path(ptx_path)
    if not p.is_file():
        return None
    facts = ptx_facts(p.read_text(errors="replace"), getattr(build_result, "resources", ()))
    if key:
        _CACHE[key] = facts
    return facts
