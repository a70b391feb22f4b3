"""Cost model: a candidate's time for a shape from static facts, before any GPU sees it.

Two layers. A roofline prior from the kernel's static features (tile and wave quantisation,
occupancy from ptxas registers / shared memory, bytes moved vs flops, split-K, spills, launch
cost) on the target GPU's peaks; then a small least-squares correction on log-time, fitted to
measured rows of the results DB. numpy only. It ranks candidates for `cudal2 tune` and serves
the RL reward when no GPU is present, so every number it produces is an *estimate* (callers
must mark such rows `estimated=True`).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace as _replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from cudal2.core.devices import ARCH_GPU, GPUS, GpuSpec, gpu_for  # noqa: F401  (the device table)
from cudal2.templates.budget import BUDGETED, as_built, budget, ruled
from cudal2.templates.family import KernelConfig
from cudal2.templates.lowlat import lowlat_splits
from cudal2.templates.skinny import STREAMK_MAX_CTAS, skinny_plan, skinny_splits  # noqa: F401
from cudal2.templates.wgmma import wgmma_splits

SCHEMA = "cudal2.costmodel/1"  # a format name: kept when the module moved


# Fraction of tensor peak a family's main loop reaches at full occupancy (the prior only; the
# fitted correction learns the rest). wgmma-based CUTLASS ~ cuBLAS; mma.sync tops out lower.
STYLE_EFF = {"cutlass": 0.80, "cutlass_sm90": 0.80, "ptx": 0.55, "mma": 0.50}
# Hopper's dense peak is wgmma's; mma.sync issues at a fraction of it. Best measured on the
# H100 (reports/NVIDIA_H100_80GB_HBM3, 2026-11-22/23): ptx 290 TFLOP/s (8192x8192x4096, 0.29 of
# peak), mma 110 (1024x256x16384, where ptx measured 115). 0.55 let the prior plan mma.sync
# split-K alone for skinny deep-K shapes (predicted 11 us, measured 40 us).
STYLE_EFF_BY_GPU = {"H100": {**STYLE_EFF, "ptx": 0.30, "mma": 0.28},
                    "H200": {**STYLE_EFF, "ptx": 0.30, "mma": 0.28}}
# The low-latency families (cudal2/templates/lowlat.py): lowlat issues wgmma but waits for each
# stage's wgmma before the next (no warp specialisation): 0.5 is a prior, not measured;
# lowlat_mma issues mma.sync: the mma family's measured H100 ceiling.
STYLE_EFF.update({"lowlat": 0.50, "lowlat_mma": 0.50})
for _eff in STYLE_EFF_BY_GPU.values():
    _eff.update({"lowlat": 0.50, "lowlat_mma": 0.28})
# The fixed cost of a persistent TMA/cluster kernel (tensor maps encoded on the host per call,
# cluster launch, barrier and scheduler set-up) over a plain one-tile-per-CTA launch. Measured
# as a gap to cuBLAS, not to our own plain kernels: on the H100 campaign of 2026-11-23
# (reports/NVIDIA_H100_80GB_HBM3/2026-11-23-campaign-s3-call2) every shape under 1e9 FLOP ran
# +0.40 to +0.72 us (median +0.53) over cuBLAS's 3.36-6.04 us with CUTLASS/wgmma builds. The
# styles below pay it; the others (one cudaLaunchKernel, no tensor map, like cuBLAS) do not,
# which is a prior for lowlat/lowlat_mma until a GPU measures them.
PERSISTENT_SETUP_US = 0.53
PERSISTENT_STYLES = ("cutlass", "wgmma")
MEM_EXPOSED = 0.6            # fraction of min(compute, memory) not hidden by the other (H100 campaign: see dram_bytes)
BASELINE_EFF = 0.80          # "ideal cuBLAS": ~80% of peak (cuBLAS at 8192^3 bf16: 792-795 of 989 TFLOP/s)
# wgmma tiles above a 128x128 tile's operand reuse (64, see _feed_eff) keep the tensor cores fed
# better: + TILE_GAIN per doubling of the reuse, at most TILE_GAIN_MAX (a prior, not measured:
# the first campaign timed only 128x128 and smaller CUTLASS tiles).
TILE_GAIN = 0.06
TILE_GAIN_MAX = 1.10
# Stream-K / split-K fixup: one CTA reads and writes a tile of partial sums through L2 at about
# this rate (GB/s), once per extra peer of the tile; a call that needs a workspace also clears
# its barrier flags with a memset on the stream (WORKSPACE_US).
FIXUP_SM_GBPS = 80.0
WORKSPACE_US = 1.5
# A bandwidth-bound skinny kernel (M <= 64) streams B once at about this fraction of DRAM peak
# (a prior: a device copy reached ~3.0 of the H100's 3.35 TB/s; the skinny family is not yet
# measured). How it splits K is the kernel's own choice (skinny_plan).
SKINNY_BW_EFF = 0.85
SK_MIN_ITERS = 8             # CUTLASS's min_iters_per_sk_unit_: fewer k tiles are never split
# Split-K reduced in a thread-block cluster (mma_hgemm.cuh, sm_90a, 2..8 splits): a peer's fp32
# partial tile is read through distributed shared memory at about this rate per SM (GB/s; a prior,
# not measured: a few times the L2 rate of FIXUP_SM_GBPS).
DSMEM_SM_GBPS = 320.0
CLUSTER_SPLITS_MAX = 8
CLUSTER_GPUS = ("H100", "H200")

FEATURES = ("bias", "log_prior", "log_wave_eff", "log_occupancy", "spills", "log_stages",
            "log_splitk", "log_intensity", "compute_bound", "style_mma", "style_ptx")
BASELINE_FEATURES = ("bias", "log_prior", "log_intensity", "compute_bound")


def _shape(shape) -> tuple[int, int, int]:
    if hasattr(shape, "M"):
        return int(shape.M), int(shape.N), int(shape.K)
    M, N, K = shape
    return int(M), int(N), int(K)


@dataclass(frozen=True)
class KernelFacts:
    """What the model needs to know about a kernel, read from its meta / config and ptxas."""
    style: str
    BM: int
    BN: int
    BK: int
    threads: int
    stages: int
    splitk: int
    registers: int       # per thread; 0 = unknown
    shared_bytes: int    # per CTA; 0 = unknown
    spills: int          # bytes
    swizzle: int = 1     # raster band width in tiles (mma/ptx grouped raster, CUTLASS max_swizzle_size)
    cluster_m: int = 1   # thread-block cluster (CUTLASS): CTAs along M share B tiles by multicast
    cluster_n: int = 1   # ... CTAs along N share A tiles
    raster: int = 0      # CUTLASS raster option: 0 heuristic, 1 along M, 2 along N
    scheduler: str = ""  # CUTLASS tile scheduler: "persistent" | "streamk" ("" = not CUTLASS)
    splits: int = 1      # CUTLASS runtime K splits (stream-K builds)
    decomposition: int = 0   # CUTLASS runtime decomposition: 0 heuristic, 1 DP, 2 split-K, 3 stream-K
    fixup_in_kernel: bool = False   # split-K reduced inside the kernel (workspace_zero_init): one launch
    skinny: bool = False     # the skinny families: split-K or stream-K chosen per call (skinny_plan)
    asked_splits: int = 0    # the "splits" option of a per-call splitter (skinny, lowlat; 0 = its choice)
    mirror: bool = False     # skinny_n: the kernel computes C^T (its BM bounds N; shapes swap M, N)
    lowlat: bool = False     # lowlat/lowlat_mma: split count chosen per call (lowlat_splits)
    dsmem_fixup: bool = False   # split-K reduced inside a thread-block cluster (set per call)
    cluster_split: bool = False  # wgmma (CLUSTER_M 1): split count chosen per call (wgmma_splits)
    # a streaming family's config and call options: its prior is the streaming budget's time
    budgeted: tuple = ()     # (family, params pairs, options pairs, budget.as_built's reduction pairs)

    @functools.cached_property
    def roofline(self) -> "KernelFacts":
        """These facts as the roofline reads them (without `budgeted`): a config's options that
        only the budget tells apart (wgmma's sm_count, raster) share one roofline."""
        return _replace(self, budgeted=()) if self.budgeted else self


def _meta_get(meta: dict, *names, default=None):
    for n in names:
        if n in meta and meta[n] not in (None, ""):
            return meta[n]
    return default


def declared_options(meta: Any) -> dict[str, int]:
    """The defaults of the runtime options a cudal2_meta declares (kernel ABI 2), {} otherwise."""
    out = {}
    for o in (meta.get("options") or []) if isinstance(meta, dict) else []:
        if isinstance(o, dict) and "name" in o and "default" in o:
            out[str(o["name"])] = int(o["default"])
    return out


def kernel_facts(meta: Any, resources: Any = None, options: dict | None = None) -> KernelFacts:
    """Normalise a cudal2_meta dict, a KernelConfig (or its params dict) and ptxas resources
    (a dict with registers/shared_bytes/spills, a BuildResult, or KernelResources) into facts.
    `options`: the runtime options of the call ({name: int}, kernel ABI 2); names left out take
    the meta's declared defaults (a config, which declares none, takes CUTLASS's defaults)."""
    if hasattr(meta, "params") and hasattr(meta, "family"):      # KernelConfig
        d = dict(meta.params)
        d.setdefault("style", meta.family)
        meta = d
    meta = dict(meta or {})
    tile = meta.get("tile")
    family = _meta_get(meta, "family", "style")
    skinny = family in ("skinny", "skinny_n")
    mirror = family == "skinny_n"
    lowlat = family in ("lowlat", "lowlat_mma")
    wgmma = family == "wgmma"
    if tile and len(tile) >= 2:
        BM, BN = int(tile[0]), int(tile[1])
        if mirror:      # a meta's tile is in C's terms; the facts keep the kernel's (C^T's)
            BM, BN = BN, BM
        BK = int(tile[2]) if len(tile) > 2 else 32
    else:
        BM = int(_meta_get(meta, "BM", "bm", default=128))
        BN = int(_meta_get(meta, "BN", "bn", default=128))
        BK = int(_meta_get(meta, "BK", "bk", default=32))
    threads = _meta_get(meta, "threads", "THREADS")
    if threads is None:
        warps = _meta_get(meta, "warps", "WARPS")
        if warps is None and _meta_get(meta, "WM") is not None and _meta_get(meta, "WN") is not None:
            # WM/WN are the warp tile (rows, columns): warps = (BM / WM) * (BN / WN)
            warps = max(1, BM // max(int(meta["WM"]), 1)) * max(1, BN // max(int(meta["WN"]), 1))
        threads = 32 * int(warps) if warps else (384 if str(meta.get("style", "")).startswith("cutlass") else 128)
    stages = int(_meta_get(meta, "stages", "STAGES", default=2))
    splitk = int(_meta_get(meta, "splitk", "split_k", "SPLITK", default=1))
    style = str(_meta_get(meta, "style", "family", default="mma"))
    regs = smem = spills = 0
    if resources is not None:
        if isinstance(resources, dict):
            regs = int(resources.get("registers") or 0)
            smem = int(resources.get("shared_bytes") or 0)
            spills = int(resources.get("spills") or 0)
        elif hasattr(resources, "max_registers"):                 # BuildResult
            regs, smem, spills = resources.max_registers, resources.max_shared_bytes, resources.spills
        else:                                                       # KernelResources or a tuple of them
            rs = resources if isinstance(resources, (tuple, list)) else (resources,)
            regs = max((r.registers for r in rs), default=0)
            smem = max((r.shared_bytes for r in rs), default=0)
            spills = sum(r.spill_stores + r.spill_loads for r in rs)
    # dynamic shared memory is invisible to ptxas; the meta declares it
    smem = max(int(smem or 0), int(_meta_get(meta, "smem_bytes", default=0) or 0))
    params = meta["params"] if isinstance(meta.get("params"), dict) else {}
    opts = {**declared_options(meta), **dict(options or {})}
    swizzle = opts.get("swizzle")
    if swizzle is None:
        swizzle = _meta_get(meta, "SWIZZLE", "swizzle")
    if swizzle is None:                                             # cudal2_meta nests the config
        swizzle = params.get("SWIZZLE")
    cluster = meta.get("cluster")
    if isinstance(cluster, (list, tuple)) and len(cluster) >= 2:
        cm, cn = int(cluster[0]), int(cluster[1])
    else:
        cm = int(_meta_get(meta, "CLUSTER_M", default=params.get("CLUSTER_M", 1)) or 1)
        cn = int(_meta_get(meta, "CLUSTER_N", default=params.get("CLUSTER_N", 1)) or 1)
    scheduler = ""
    if style.startswith("cutlass"):
        scheduler = str(_meta_get(meta, "scheduler", "SCHEDULER",
                                  default=params.get("SCHEDULER", "persistent")))
    streamk = scheduler == "streamk"
    cluster_split = wgmma and cm == 1     # its splits reduce in a cluster (wgmma_hgemm.cuh)
    asked = 0
    if skinny or lowlat:
        asked = int(opts.get("splits", 0) or 0)
    elif cluster_split:
        asked = int(opts.get("splits", 1))
    # an in-kernel fixup: declared by a build's meta; a config of a family that has one (mma/ptx)
    fixup = bool(meta.get("workspace_zero_init")) or (
        "workspace_bytes" not in meta and style in ("mma", "ptx", "skinny", "skinny_n"))
    return KernelFacts(style, max(BM, 1), max(BN, 1), max(BK, 1), max(int(threads), 32),
                       max(stages, 1), max(splitk, 1), int(regs or 0), int(smem or 0), int(spills or 0),
                       max(int(swizzle or 1), 1), max(cm, 1), max(cn, 1), int(opts.get("raster", 0) or 0),
                       scheduler, max(int(opts.get("splits", 1) or 1), 1) if streamk else 1,
                       int(opts.get("decomposition", 0) or 0) if streamk or skinny else 0,
                       fixup or skinny or lowlat or cluster_split, skinny, asked, mirror, lowlat,
                       cluster_split=cluster_split, budgeted=_budgeted(family, meta, params, opts))


def _budgeted(family, meta: dict, params: dict, opts: dict) -> tuple:
    """KernelFacts.budgeted of a streaming family's meta or config (() otherwise): a build's
    meta nests its config in "params", a config's dict is the params itself."""
    if family not in BUDGETED:
        return ()
    p = params or {k: v for k, v in meta.items() if k.isupper()}
    opts, how = as_built(meta, opts)
    return (family, tuple(sorted(p.items())), tuple(sorted(opts.items())), tuple(sorted(how.items())))


def _dsmem_reduces(f: KernelFacts, gpu: GpuSpec, splits: int) -> bool:
    """Split-K reduced inside a cluster through distributed shared memory (mma_hgemm.cuh on
    sm_90a, 2..8 splits): no partials through L2 or DRAM. The lowlat family has no cluster path."""
    return (f.fixup_in_kernel and not f.lowlat and not f.style.startswith("cutlass")
            and gpu.name in CLUSTER_GPUS and 2 <= splits <= CLUSTER_SPLITS_MAX)


def occupancy(f: KernelFacts, gpu: GpuSpec) -> int:
    """CTAs resident per SM (>= 1): the tightest of registers, shared memory and threads.
    Our CUTLASS SM90 kernels are persistent (one CTA per SM) with StageCountAutoCarveout, which
    fills shared memory with stages: one."""
    if f.style.startswith("cutlass"):
        return 1
    limits = [gpu.max_ctas_per_sm, gpu.max_threads_per_sm // f.threads]
    if f.registers:
        limits.append(gpu.regs_per_sm // (max(f.registers, 1) * f.threads))
    smem = f.shared_bytes or f.stages * (f.BM + f.BN) * f.BK * 2   # estimate when ptxas is silent
    limits.append(gpu.smem_per_sm // max(smem, 1))
    return max(1, min(limits))


@dataclass(frozen=True)
class CutlassSchedule:
    """How CUTLASS 3's SM90 persistent / stream-K tile scheduler lays a problem out (host code of
    cutlass/gemm/kernel/tile_scheduler_params.h, replayed): tile counts padded to whole clusters
    and swizzle groups (padded tiles are computed on zeros: real work), the resolved raster,
    the persistent grid, and the decomposition the call runs."""
    tiles_m: int             # CTA tiles along M after cluster and swizzle padding
    tiles_n: int
    log_swizzle: int         # the swizzle CUTLASS keeps (clamped by the smaller tile count)
    along_m: bool            # resolved raster: consecutive work walks along M
    grid: int                # persistent CTAs (one per SM at most)
    k_tiles: int             # BK tiles per output tile
    mode: str                # "dp" | "splitk" | "streamk"
    splits: int = 1          # K splits per output tile (split-K)
    sk_tiles: int = 0        # output tiles shared by stream-K units
    sk_units: int = 0        # stream-K work units (CTAs)

    def effective(self) -> tuple:
        """What the call runs: options with the same value behave the same."""
        return (self.log_swizzle, self.along_m, self.mode, self.splits, self.sk_tiles, self.sk_units)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _max_ctas(cluster_size: int, sms: int) -> int:
    """CUTLASS's get_max_cta_occupancy: whole clusters per GPC (18 SMs on GH100)."""
    per_gpc = 18
    gpcs = 1 if sms < per_gpc else sms // per_gpc
    ctas = gpcs * (per_gpc - per_gpc % cluster_size)
    resid = 0 if sms < per_gpc else sms % per_gpc
    ctas += resid - resid % cluster_size
    return min(sms, ctas)


def cutlass_schedule(f: KernelFacts, shape, sms: int) -> CutlassSchedule:
    """The CUTLASS SM90 scheduler's layout of `shape` for a kernel's facts (tile, cluster,
    scheduler) and runtime options (swizzle, raster, splits, decomposition) on `sms` SMs."""
    M, N, K = _shape(shape)
    cm, cn = f.cluster_m, f.cluster_n
    bm = _round_up(max(math.ceil(M / f.BM), 1), cm)
    bn = _round_up(max(math.ceil(N / f.BN), 1), cn)
    small = min(bm, bn)
    sw = f.swizzle
    log_sw = 3 if sw >= 8 and small >= 6 else 2 if sw >= 4 and small >= 3 else 1 if sw >= 2 and small >= 2 else 0
    tm, tn = _round_up(bm, (1 << log_sw) * cm), _round_up(bn, (1 << log_sw) * cn)
    along_m = {1: True, 2: False}.get(f.raster, tn > tm)
    if min(tm // cm, tn // cn) == 1:      # one row or column of clusters: every raster is one order
        along_m = tn > tm
    k_tiles = max(math.ceil(K / f.BK), 1)
    cs = cm * cn
    per_device = _max_ctas(cs, sms) if cs > 1 else sms
    tiles = tm * tn
    if f.scheduler != "streamk":
        return CutlassSchedule(tm, tn, log_sw, along_m, max(1, min(per_device, tiles)), k_tiles, "dp")
    cpw = per_device                                      # stream-K grids are not truncated
    dec, splits = f.decomposition, f.splits
    if dec == 2 or (dec == 0 and splits > 1):             # split-K (CUTLASS's adjust_split_count)
        s = max(1, min(splits, sms, k_tiles))
        return CutlassSchedule(tm, tn, log_sw, along_m, cpw, k_tiles, "splitk" if s > 1 else "dp", s)
    sk = 0
    full, total = tiles // cpw, -(-tiles // cpw)
    if dec != 1 and full != total and k_tiles > SK_MIN_ITERS:
        sk = tiles - (full - 1 if full > 1 else 0) * cpw
        if dec == 0 and 2 * (tiles - full * cpw) >= cpw:  # the heuristic: a tail over half full
            sk = 0
        sk = sk // cs * cs
    units = min(cpw // cs * cs, (k_tiles * sk // SK_MIN_ITERS) // cs * cs) if sk else 0
    if sk == 0 or units == 0:
        return CutlassSchedule(tm, tn, log_sw, along_m, cpw, k_tiles, "dp")
    if dec == 0 and sk < units and units % sk == 0:       # the heuristic's split-K of the sk tiles
        return CutlassSchedule(tm, tn, log_sw, along_m, cpw, k_tiles, "splitk", units // sk, sk, units)
    return CutlassSchedule(tm, tn, log_sw, along_m, cpw, k_tiles, "streamk", 1, sk, units)


def dram_bytes(f: KernelFacts, shape, gpu: GpuSpec, slots: int) -> tuple[float, float]:
    """(bytes the kernel moves through DRAM, the ideal: each operand read once, C written once).
    The CTAs resident at once (one wave) read the A strips of the tile rows and the B strips of
    the tile columns they cover; the next wave covers other tiles and, unless an operand fits
    in half the L2, reads its strips again. Which tiles a wave covers follows the raster: a
    band of `swizzle` tiles in the minor dimension swept along the major one (mma/ptx: along N;
    CUTLASS: the raster option, its heuristic walking along the dimension with fewer tiles, with
    the swizzle CUTLASS keeps, in whole clusters). On the first H100 campaign a 128x128 CUTLASS
    tile without swizzle fell from 620 to 320 TFLOP/s as shapes grew; this is the term that
    predicts it."""
    M, N, K = _shape(shape)
    if f.style.startswith("cutlass"):
        sch = cutlass_schedule(f, shape, gpu.sms)
        tm, tn, along_m = sch.tiles_m, sch.tiles_n, sch.along_m
        splits = sch.splits if sch.mode == "splitk" and not sch.sk_tiles else 1
        band_w = (1 << sch.log_swizzle) * (f.cluster_n if along_m else f.cluster_m)
        wave = max(1, min(tm * tn, sch.grid // splits))
        if sch.mode == "splitk":
            peers = sch.splits - 1
            partials = 8.0 * f.BM * f.BN * peers * (sch.sk_tiles or tm * tn)
        elif sch.mode == "streamk":
            partials = 8.0 * f.BM * f.BN * sch.sk_tiles * max(1, -(-sch.sk_units // sch.sk_tiles) - 1)
        else:
            partials = 0.0
    else:
        tm, tn = math.ceil(M / f.BM), math.ceil(N / f.BN)
        partials = 8.0 * M * N * f.splitk if f.splitk > 1 and not f.dsmem_fixup else 0.0
        wave = max(1, min(tm * tn, slots // f.splitk))        # output tiles in flight at once
        along_m, band_w = False, f.swizzle
    ideal = 2.0 * (M * K + K * N + M * N) + partials
    t_major, t_minor = (tm, tn) if along_m else (tn, tm)
    band = min(band_w, t_minor)
    if band * t_major >= wave:
        minor, major = band, min(t_major, math.ceil(wave / band))
    else:                                                     # a wave spans several bands
        minor, major = min(t_minor, math.ceil(wave / t_major)), t_major
    rows, cols = (major, minor) if along_m else (minor, major)
    waves = math.ceil(tm * tn / wave)
    half_l2 = gpu.l2_bytes / 2
    a_bytes = 2.0 * M * K if 2.0 * M * K <= half_l2 else waves * 2.0 * K * min(M, rows * f.BM)
    b_bytes = 2.0 * K * N if 2.0 * K * N <= half_l2 else waves * 2.0 * K * min(N, cols * f.BN)
    return max(ideal, a_bytes + b_bytes + 2.0 * M * N + partials), ideal


def _feed_eff(f: KernelFacts) -> float:
    """How well a tile keeps the tensor cores fed from L2: operand reuse BM*BN / (bytes of A and
    B a CTA loads per k step, with a cluster's multicast sharing them) against a 128x128 tile's
    64. Below it the main loop starves (sqrt); above it wgmma tiles gain a little (TILE_GAIN)."""
    reuse = f.BM * f.BN / (f.BM / f.cluster_n + f.BN / f.cluster_m)
    if reuse <= 64.0 or not f.style.startswith("cutlass"):
        return min(1.0, math.sqrt(reuse / 64.0))
    return min(TILE_GAIN_MAX, 1.0 + TILE_GAIN * math.log2(reuse / 64.0))


def _cutlass_compute(f: KernelFacts, shape, gpu: GpuSpec, sm_tflops: float) -> tuple[float, float, int]:
    """(main-loop + fixup us, extra launch us, work units) of a CUTLASS SM90 kernel."""
    sch = cutlass_schedule(f, shape, gpu.sms)
    t_k = 2.0 * f.BM * f.BN * f.BK / (sm_tflops * 1e6)       # one k tile on one SM, us
    t_fix = 8.0 * f.BM * f.BN / (FIXUP_SM_GBPS * 1e3)         # one partial tile in and out, us
    tiles, cpw = sch.tiles_m * sch.tiles_n, sch.grid
    if sch.mode == "dp":
        return math.ceil(tiles / cpw) * sch.k_tiles * t_k, 0.0, tiles
    if sch.mode == "splitk" and not sch.sk_tiles:
        units = tiles * sch.splits
        waves = math.ceil(units / cpw)
        t = waves * math.ceil(sch.k_tiles / sch.splits) * t_k + waves * (sch.splits - 1) * t_fix
        return t, WORKSPACE_US, units
    # stream-K (or the heuristic's split-K of the stream-K tiles): data-parallel waves, then the
    # stream-K tiles' k tiles spread over the units, and the peers' fixup
    dp = tiles - sch.sk_tiles
    peers = max(2, -(-sch.sk_units // sch.sk_tiles))
    t = (math.ceil(dp / cpw) * sch.k_tiles * t_k
         + math.ceil(sch.sk_tiles * sch.k_tiles / sch.sk_units) * t_k + (peers - 1) * t_fix)
    return t, WORKSPACE_US, dp + sch.sk_units


def _roofline(f: KernelFacts, shape, gpu: GpuSpec) -> tuple[float, int, float, int, float]:
    """The roofline prior of a kernel on `shape`: (prior_us, CTAs per SM, wave efficiency, K
    splits, arithmetic intensity), the terms _features reads."""
    M, N, K = _shape(shape)
    if f.mirror:        # skinny_n runs the skinny kernel on C^T = B^T A^T
        M, N = N, M
        shape = (M, N, K)
    occ = occupancy(f, gpu)
    # Compute: padded tile work, spread over the SMs actually busy in each wave.
    eff = STYLE_EFF_BY_GPU.get(gpu.name, STYLE_EFF).get(f.style, 0.5)
    # Small tiles re-load operands from L2 more per flop: below a 128x128 tile's reuse
    # (BM*BN/(BM+BN) = 64) the main loop is fed, not compute, bound; clusters share loads.
    eff *= _feed_eff(f)
    # One CTA alone on an SM reaches a fraction of the SM's peak that grows with its warps.
    per_sm_fill = min(1.0, occ * f.threads / 256)
    sm_tflops = gpu.tflops * eff * per_sm_fill / gpu.sms
    extra_us = 0.0
    splits = f.splitk
    if f.style.startswith("cutlass"):
        compute_us, extra_us, ctas = _cutlass_compute(f, shape, gpu, sm_tflops)
        slots = gpu.sms                                 # persistent: one CTA per SM
        sch = cutlass_schedule(f, shape, gpu.sms)
        splits = sch.splits if sch.mode == "splitk" else 1
    else:
        slots = gpu.sms * occ
        tm, tn = math.ceil(M / f.BM), math.ceil(N / f.BN)
        t_k = 2.0 * f.BM * f.BN * f.BK / (sm_tflops * 1e6)     # one k tile on a whole SM, us
        mode, n = (skinny_plan(N, K, f.BN, f.BK, gpu.sms, slots, f.asked_splits, f.decomposition)
                   if f.skinny else ("splitk", f.splitk))
        if f.lowlat:       # the split count is the kernel's per-call choice
            n = lowlat_splits(M, N, K, f.BM, f.BN, f.BK, gpu.sms, f.asked_splits)[0]
        elif f.cluster_split:
            n = wgmma_splits(M, N, K, f.BM, f.BN, f.BK, gpu.sms, f.asked_splits)
        if mode == "streamk":     # the grid is the resident slots: no partial wave
            iters = tm * tn * math.ceil(K / f.BK)
            ctas = n
            peers = max(1, -(-n // (tm * tn)))
            compute_us = math.ceil(ctas / gpu.sms) * math.ceil(iters / ctas) * t_k
            extra_us = 8.0 * f.BM * f.BN * (peers - 1) / (FIXUP_SM_GBPS * 1e3)
        else:
            dsmem = _dsmem_reduces(f, gpu, n)
            if (n, dsmem) != (f.splitk, f.dsmem_fixup):   # replace() is most of a plan's pricing
                f = _replace(f, splitk=n, dsmem_fixup=dsmem)
            ctas = tm * tn * f.splitk
            t_cta = 2.0 * f.BM * f.BN * math.ceil(K / f.splitk) / (sm_tflops * 1e6)
            full, rem = divmod(ctas, slots)
            # Full waves keep `occ` CTAs per SM; the tail wave spreads the rest over the SMs.
            compute_us = full * occ * t_cta + (math.ceil(rem / gpu.sms) * t_cta if rem else 0.0)
            # split-K adds a second (reduction) kernel on the stream, unless the kernel reduces
            # in itself (splitk_fixup.cuh: the last CTA of a tile reads the peers' partials, or
            # each CTA of a cluster a slice of every peer's through distributed shared memory)
            if f.splitk > 1 and not f.fixup_in_kernel:
                extra_us = gpu.launch_us * 0.5
            elif f.splitk > 1:
                rate = DSMEM_SM_GBPS if f.dsmem_fixup else FIXUP_SM_GBPS
                extra_us = 8.0 * f.BM * f.BN * (f.splitk - 1) / (rate * 1e3)
        splits = f.splitk
    waves = math.ceil(ctas / slots)
    wave_eff = ctas / (waves * slots)
    # Memory: what the raster makes the waves read (dram_bytes), output once, split-K partials twice.
    moved, bytes_moved = dram_bytes(f, shape, gpu, slots)
    mem_us = moved / (gpu.tbps * 0.9 * 1e6)           # ~90% of DRAM peak is reachable
    if f.skinny:   # the roofline of a streaming kernel: B once, A and C (the fp32 partials of
        # an M <= 64 output stay in L2: their cost is the fixup term in extra_us)
        moved = 2.0 * (K * N + M * K + M * N)
        mem_us = moved / (gpu.tbps * SKINNY_BW_EFF * 1e6)
    spill_us = f.spills * ctas * 1e-6          # spills cost local-memory traffic per CTA
    # Main loop and DRAM traffic overlap only partly: MEM_EXPOSED of the shorter one stays exposed.
    if f.style.startswith(PERSISTENT_STYLES):
        extra_us += PERSISTENT_SETUP_US
    prior = (gpu.launch_us + extra_us + max(compute_us, mem_us)
             + MEM_EXPOSED * min(compute_us, mem_us) + spill_us)
    return prior, occ, wave_eff, splits, 2.0 * M * N * K / bytes_moved


@functools.lru_cache(maxsize=4096)
def _config(family: str, params: tuple) -> KernelConfig:
    """KernelFacts.budgeted's config, made once: KernelConfig validates its names on each
    construction, and a plan prices each config's options at each of its rows."""
    return KernelConfig(family, params)


def _ruled_prior(f: KernelFacts, shape) -> tuple | None:
    """Where the calibrated budget (cudal2.templates.budget) is the prior, a decode row of a
    budgeted family or a deep-K row of a deep-K family, budget()'s arguments; None elsewhere
    (the budget was never compared with a measurement there)."""
    if not f.budgeted or not ruled(f.budgeted[0], *_shape(shape)):
        return None
    family, params, opts, how = f.budgeted
    return _config(family, params), dict(opts), dict(how)


@functools.lru_cache(maxsize=4096)
def _roofline_prior(f: KernelFacts, shape, gpu: GpuSpec) -> float:
    """_roofline's prior, once for options the roofline does not tell apart (a plan prices a
    config's options at a row one after another: wgmma's 102 are ~15 rooflines)."""
    return _roofline(f, shape, gpu)[0]


def prior_us(f: KernelFacts, shape, gpu: GpuSpec) -> float:
    """The prior alone (_features' first value): on a ruled row the budget's time, without the
    roofline it replaces (an unfitted model's prediction, what a plan ranks by)."""
    ruled_row = _ruled_prior(f, shape)
    if ruled_row is None:
        return _roofline_prior(f.roofline, shape, gpu)
    cfg, opts, how = ruled_row
    return budget(cfg, _shape(shape), gpu, options=opts, registers=f.registers,
                  smem_bytes=f.shared_bytes, **how).t_us


def _features(f: KernelFacts, shape, gpu: GpuSpec) -> tuple[float, np.ndarray]:
    """(prior_us, feature vector in FEATURES order)."""
    prior, occ, wave_eff, splits, intensity = _roofline(f, shape, gpu)
    if _ruled_prior(f, shape) is not None:
        prior = prior_us(f, shape, gpu)
    ridge = gpu.tflops * 1e12 / (gpu.tbps * 1e12)
    x = np.array([
        1.0, math.log(prior), math.log(wave_eff), math.log(occ), float(f.spills > 0),
        math.log(f.stages), math.log(splits), math.log(intensity), float(intensity > ridge),
        float(f.style == "mma"), float(f.style == "ptx"),
    ])
    return prior, x


def baseline_prior_us(shape, gpu: GpuSpec) -> tuple[float, np.ndarray]:
    M, N, K = _shape(shape)
    flops = 2.0 * M * N * K
    bytes_moved = 2.0 * (M * K + K * N + M * N)
    compute_us = flops / (gpu.tflops * BASELINE_EFF * 1e6)
    mem_us = bytes_moved / (gpu.tbps * 0.9 * 1e6)
    prior = gpu.launch_us + max(compute_us, mem_us)
    intensity = flops / bytes_moved
    ridge = gpu.tflops / gpu.tbps
    return prior, np.array([1.0, math.log(prior), math.log(intensity), float(intensity > ridge)])


def _fit_ridge(X: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """Least squares on log-time residuals with a ridge pull towards zero (= the prior)."""
    A = X.T @ X + lam * np.eye(X.shape[1])
    return np.linalg.solve(A, X.T @ y)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties), numpy only. nan if < 3 points."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) != len(b):
        raise ValueError("spearman: sequences differ in length")
    if len(a) < 3:
        return float("nan")

    def ranks(v):
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):                    # average ranks over ties
            idx = v == val
            if idx.sum() > 1:
                r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra ** 2).sum() * (rb ** 2).sum()))
    return float((ra * rb).sum() / den) if den else float("nan")


@dataclass(frozen=True)
class Sample:
    """One measured (kernel, shape) time: the unit the model is fitted on."""
    meta: dict
    resources: dict
    shape: tuple[int, int, int]
    median_us: float
    gpu: str = ""
    who: str = "candidate"         # "candidate" or a baseline name
    arch: str = ""                 # the build target: the spec to use when `gpu` is not a known name
    options: dict = field(default_factory=dict)   # runtime options of the call (kernel ABI 2)


def samples_from_evaluations(evaluations: Iterable, mode: str = "offline",
                             include_baselines: bool = True) -> list[Sample]:
    """Measured samples from harness Evaluations: status ok, not estimated, with a median.
    Estimated rows are skipped: fitting a model to its own guesses teaches it nothing."""
    out = []
    for ev in evaluations:
        if getattr(ev, "estimated", False):
            continue
        t = (getattr(ev, "timings", None) or {}).get(mode) or {}
        shape = _shape(ev.shape)
        gpu = (getattr(ev, "env", None) or {}).get("gpu", "") or ""
        cand = t.get("candidate") or {}
        arch = getattr(ev, "arch", "") or ""
        if ev.status == "ok" and cand.get("median_us"):
            out.append(Sample(dict(getattr(ev, "meta", None) or {}), dict(ev.build or {}), shape,
                              float(cand["median_us"]), gpu, "candidate", arch,
                              dict(getattr(ev, "options", None) or {})))
        if include_baselines:
            for who, rec in t.items():
                if who != "candidate" and rec and rec.get("median_us"):
                    out.append(Sample({}, {}, shape, float(rec["median_us"]), gpu, who, arch))
    return out


@dataclass
class CostModel:
    """Roofline prior x exp(fitted correction). `weights` is empty until fitted."""
    gpu: str = "H100"
    weights: list[float] = field(default_factory=list)
    baseline_weights: dict[str, list[float]] = field(default_factory=dict)
    n_fit: int = 0
    n_fit_baselines: dict[str, int] = field(default_factory=dict)
    synthetic: bool = False        # fitted on synthetic data (tests only)
    ridge: float = 1.0

    @classmethod
    def default(cls, gpu: str | None = None, arch: str | None = None) -> "CostModel":
        """The prior alone (no measurements yet), for a GPU name or, failing that, an arch
        (cudal2.search.costmodel.gpu_for; neither = H100)."""
        return cls(gpu=gpu_for(arch=arch, gpu=gpu).name)

    @property
    def spec(self) -> GpuSpec:
        return gpu_for(gpu=self.gpu)

    # -- prediction ---------------------------------------------------------------------
    def predict_us(self, meta: Any, resources: Any, shape, options: dict | None = None) -> float:
        """Estimated median time (us) of one call of the kernel on `shape` with these runtime
        options ({name: int}, kernel ABI 2; None or missing names: the declared defaults)."""
        return self.predict_facts_us(kernel_facts(meta, resources, options), shape)

    def predict_facts_us(self, facts: KernelFacts, shape, spec: GpuSpec | None = None) -> float:
        """predict_us from a kernel's facts (kernel_facts), which do not depend on the shape.
        spec: self.spec, when the caller holds it (rank_options: one lookup for many calls)."""
        spec = spec or self.spec
        if not self.weights:         # the prior alone: no feature vector to weigh
            return prior_us(facts, shape, spec)
        prior, x = _features(facts, shape, spec)
        return float(math.exp(float(np.dot(self.weights, x))))

    def rank_options(self, meta: Any, resources: Any, shape, candidates: Iterable[dict], *,
                     facts: list | None = None) -> list[tuple[float, dict]]:
        """(predicted us, options) for each option combination, fastest first; combinations that
        run the same schedule on this shape (CUTLASS clamps the swizzle by the tile counts, the
        heuristic raster resolves to one of the others) are kept once, the first listed.
        facts: kernel_facts of each combination, in order, when the caller keeps them (a plan
        ranks one kernel's options for many shapes)."""
        out, seen = [], set()
        candidates = list(candidates)
        facts = facts or [kernel_facts(meta, resources, o) for o in candidates]
        spec = self.spec
        for opts, f in zip(candidates, facts):
            key = (cutlass_schedule(f, shape, spec.sms).effective()
                   if f.style.startswith("cutlass") else tuple(sorted(opts.items())))
            if key in seen:
                continue
            seen.add(key)
            out.append((self.predict_facts_us(f, shape, spec), dict(opts)))
        out.sort(key=lambda r: r[0])
        return out

    def predict_baseline_us(self, shape, baseline: str = "cublaslt_autotuned") -> float:
        """An ideal cuBLAS (~80% of peak, roofline + launch), corrected per baseline by DB data."""
        prior, x = baseline_prior_us(shape, self.spec)
        w = self.baseline_weights.get(baseline)
        if not w:
            return prior
        return float(math.exp(float(np.dot(w, x))))

    # -- fitting ------------------------------------------------------------------------
    @classmethod
    def fit(cls, data: Iterable, *, gpu: str | None = None, mode: str = "offline",
            ridge: float | str = "cv", synthetic: bool = False, min_samples: int = 8) -> "CostModel":
        """Fit the correction to measurements: Evaluations (harness rows) or Samples.
        With fewer than `min_samples` candidate rows the candidate correction stays at the prior.
        A GPU without a spec of its own (an L4, say) takes the spec of the samples' arch.
        ridge "cv": the strength is chosen by rank correlation on held-out shapes (5 folds)
        among RIDGE_GRID, whose last value keeps the prior; a number fixes it."""
        data = list(data)
        samples = [d for d in data if isinstance(d, Sample)]
        evs = [d for d in data if not isinstance(d, Sample)]
        samples += samples_from_evaluations(evs, mode=mode)
        if ridge == "cv":
            ridge = _choose_ridge(samples, gpu=gpu, min_samples=min_samples)
        if gpu is None:
            gpus = {s.gpu for s in samples if s.gpu}
            gpu = next(iter(gpus)) if len(gpus) == 1 else "H100"
        arches = {s.arch for s in samples if s.arch}
        arch = next(iter(arches)) if len(arches) == 1 else None
        model = cls(gpu=gpu_for(arch=arch, gpu=gpu).name, synthetic=synthetic, ridge=ridge)
        spec = model.spec
        cand = [s for s in samples if s.who == "candidate"]
        if len(cand) >= min_samples:
            X = np.array([_features(kernel_facts(s.meta, s.resources, s.options), s.shape, spec)[1]
                          for s in cand])
            y = np.log([s.median_us for s in cand])
            # Fit the residual over the prior: w_prior starts at (0, 1, 0...) = the prior itself.
            base = np.zeros(len(FEATURES))
            base[1] = 1.0
            delta = _fit_ridge(X, y - X @ base, ridge)
            model.weights = (base + delta).tolist()
            model.n_fit = len(cand)
        by_base: dict[str, list[Sample]] = {}
        for s in samples:
            if s.who != "candidate":
                by_base.setdefault(s.who, []).append(s)
        for who, ss in by_base.items():
            if len(ss) < 3:
                continue
            X = np.array([baseline_prior_us(s.shape, spec)[1] for s in ss])
            y = np.log([s.median_us for s in ss])
            base = np.zeros(len(BASELINE_FEATURES))
            base[1] = 1.0
            model.baseline_weights[who] = (base + _fit_ridge(X, y - X @ base, ridge)).tolist()
            model.n_fit_baselines[who] = len(ss)
        return model

    # -- evaluation ---------------------------------------------------------------------
    def rank_correlation(self, data: Iterable, mode: str = "offline") -> float:
        """Spearman between predicted and measured candidate times (nan with < 3 rows)."""
        data = list(data)
        samples = [d for d in data if isinstance(d, Sample)]
        samples += samples_from_evaluations([d for d in data if not isinstance(d, Sample)],
                                            mode=mode, include_baselines=False)
        cand = [s for s in samples if s.who == "candidate"]
        pred = [self.predict_us(s.meta, s.resources, s.shape, s.options) for s in cand]
        return spearman(pred, [s.median_us for s in cand])

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "gpu": self.gpu, "features": list(FEATURES),
                "baseline_features": list(BASELINE_FEATURES), "weights": self.weights,
                "baseline_weights": self.baseline_weights, "n_fit": self.n_fit,
                "n_fit_baselines": self.n_fit_baselines, "synthetic": self.synthetic,
                "ridge": self.ridge}

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "CostModel":
        d = json.loads(Path(path).read_text())
        if d.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a cost model file (schema {d.get('schema')!r}, want {SCHEMA})")
        if d.get("features") != list(FEATURES):
            raise ValueError(f"{path}: fitted with features {d.get('features')}, this code uses "
                             f"{list(FEATURES)}; refit it")
        return cls(gpu=d["gpu"], weights=d["weights"], baseline_weights=d["baseline_weights"],
                   n_fit=d["n_fit"], n_fit_baselines=d.get("n_fit_baselines", {}),
                   synthetic=d.get("synthetic", False), ridge=d.get("ridge", 1.0))


# Ridge strengths tried by fit(ridge="cv"); the last is so strong that the fit stays the prior
# (on the first H100 campaign a weak ridge ranked held-out shapes worse than the prior did).
RIDGE_GRID = (1.0, 10.0, 100.0, 1e3, 1e4, 1e12)


def _choose_ridge(samples: list, *, gpu, min_samples: int, folds: int = 5) -> float:
    """The RIDGE_GRID value with the best mean Spearman over shape-grouped folds (ties: the
    stronger ridge). Too little data for folds: 1.0 (the historic default)."""
    shapes = sorted({s.shape for s in samples if s.who == "candidate"})
    if len(shapes) < 2 * folds or sum(s.who == "candidate" for s in samples) < 2 * min_samples:
        return 1.0
    order = np.random.default_rng(0).permutation(len(shapes))
    fold_of = {shapes[i]: k % folds for k, i in enumerate(order)}
    scores = {}
    for lam in RIDGE_GRID:
        rs = []
        for k in range(folds):
            train = [s for s in samples if fold_of.get(s.shape, -1) != k]
            test = [s for s in samples if fold_of.get(s.shape) == k and s.who == "candidate"]
            r = CostModel.fit(train, gpu=gpu, ridge=lam, min_samples=min_samples).rank_correlation(test)
            if np.isfinite(r):
                rs.append(r)
        scores[lam] = float(np.mean(rs)) if rs else float("-inf")
    best = max(scores.values())
    return max(lam for lam, v in scores.items() if v >= best - 1e-9)


def held_out_rank_correlation(data: Iterable, *, holdout: float = 0.3, seed: int = 0,
                              mode: str = "offline", synthetic: bool = False) -> dict:
    """Fit on a random split of the *shapes*, report Spearman on the other shapes (the honest
    number: a model that memorised a shape's timings earns nothing here)."""
    data = list(data)
    samples = [d for d in data if isinstance(d, Sample)]
    samples += samples_from_evaluations([d for d in data if not isinstance(d, Sample)], mode=mode)
    shapes = sorted({s.shape for s in samples if s.who == "candidate"})
    if len(shapes) < 2:
        return {"shapes": len(shapes), "train": 0, "test": 0, "spearman": float("nan"),
                "spearman_prior": float("nan")}
    rng = np.random.default_rng(seed)
    n_test = max(1, int(round(len(shapes) * holdout)))
    test_idx = set(rng.choice(len(shapes), size=n_test, replace=False).tolist())
    test_shapes = {shapes[i] for i in test_idx}
    train = [s for s in samples if s.shape not in test_shapes]
    test = [s for s in samples if s.shape in test_shapes and s.who == "candidate"]
    model = CostModel.fit(train, synthetic=synthetic)
    return {"shapes": len(shapes), "train": sum(s.who == "candidate" for s in train),
            "test": len(test), "spearman": model.rank_correlation(test),
            "spearman_prior": CostModel.default(model.gpu).rank_correlation(test)}
