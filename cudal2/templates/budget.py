"""The streaming budget of a decode kernel: what a config keeps in flight, how its grid covers the
GPU, what its reduction moves, and the time those imply, before any GPU sees it (issue 50).

A decode GEMM (M <= 64) is a read of its weight. Little's law says how much of it each SM must
keep requested and not yet arrived for the chip to stream at 80% of its reachable peak P, with a
latency that grows with the load: 4 x L x P / SMs (GpuSpec.inflight_needed_per_sm; on an H200,
4 x 0.75 us x 4.464 TB/s / 132 = 99.1 KiB per SM; on an H100 69.1 KiB). A config answers it with:

- CTAs resident per SM: the occupancy rule (threads, registers per warp in 256-register units,
  shared memory plus the driver's per-CTA reserve, the CTA cap), from ptxas registers when the
  build is known, else the family's register estimate (a planner that has not built yet;
  `campaign prepare` checks again with ptxas's figure);
- the grid as waves of CTAs: work units (a CTA of a split-K grid, a stream-K CTA, a persistent
  GEMV's tile rounds, a persistent wgmma grid's tiles), how many run at once, and how full the
  last wave keeps the SMs;
- bytes of the streamed operand in flight per CTA and per SM at steady state: the skinny
  families' cp.async pipeline keeps STAGES - 1 stages of B requested (with A_LOAD "regs" the
  ring holds B alone, so more stages fit the same shared memory); the GEMV's threads each
  keep `unroll` 16-byte loads per weight row (cudal2.templates.gemv); the tile grids (lowlat,
  lowlat_mma, wgmma: TILED) keep STAGES - 1 stages of the large operand's tile;
- the reduction: none, inside a thread-block cluster (distributed shared memory), or through an
  L2 workspace (split-K's and stream-K's partial tiles), its bytes and its time;
- the predicted time: the stream floor, then per wave the latency of the first request plus the
  CTA's bytes at min(its in-flight bytes / latency, the reachable peak / the wave's CTAs) or its
  arithmetic at the SM's rate (padded tensor-core rows; the GEMV's fp32 FMAs), plus the
  reduction. The latency, the floor and the fixup rate are fitted on the committed H200 decode
  rows (cudal2.core.devices; reports/cpu/2026-11-29-decode-budget).

`budget()` is the one implementation: the cost model prices the streaming families with it,
`cudal2 templates --explain CONFIG --shape MxNxK` prints it, and `Budget.problems()` is the rule
the planner screens decode candidates with (too little in flight, a last wave that leaves SMs
idle).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from cudal2.core.devices import GPUS, GPUS_OF_ARCH, GpuSpec
from cudal2.templates import gemv
from cudal2.templates.family import KernelConfig
from cudal2.templates.lowlat import lowlat_smem_bytes, lowlat_splits
from cudal2.templates.skinny import (FIXUP_BATCH, STREAMK_MAX_CTAS, skinny_plan,
                                     cluster_of, skinny_register_estimate, skinny_smem_bytes,
                                     streamk_fixup_batch)
from cudal2.templates.streamk import streamk_register_estimate
from cudal2.templates.wgmma import _wgmma_smem_bytes, wgmma_splits

STREAMING = ("skinny", "skinny_n", "gemv")   # the streaming families: a decode row is their work
TILED = ("lowlat", "lowlat_mma", "wgmma")    # tile grids that also serve decode rows
DEEPK = ("streamk",)                         # deep K on few tiles, over the resident slots (issue 51)
BUDGETED = STREAMING + TILED + DEEPK         # the families the budget models
# Before a build: the most registers ptxas gave any committed build of the family (lowlat 166,
# lowlat_mma 128, wgmma 168: its launch bound; setmaxnreg moves them between warpgroups).
TILED_REGISTER_ESTIMATE = {"lowlat": 168, "lowlat_mma": 128, "wgmma": 168}
DECODE_MAX_M = 64                            # a decode row: the small dimension <= 64 ...
DECODE_MIN_BYTES = 16 << 20                  # ... streaming at least what an H200 keeps in flight (13 MB)
WAVE_FILL_MIN = 0.90                         # the last wave keeps at least this share of the SMs busy
# A deep-K row (issue 51): few output tiles (at most DEEP_K_MAX_TILES of 128 x 128) over a K of at
# least DEEP_K_MIN_K, so one CTA per tile would walk K serially on a few SMs. A streamk candidate
# there keeps SLOTS_BUSY_MIN of the resident slots busy over its waves and moves no more bytes
# in its reduction than the operands hold.
DEEP_K_MIN_K = 2048
DEEP_K_MAX_TILES = 16        # 1024x256: the widest target (a 32-tile row packs ~18 more builds)
SLOTS_BUSY_MIN = 0.90


@dataclass(frozen=True)
class Budget:
    """One config at one shape on one GPU: the terms of issue 50's budget, and the time."""
    family: str
    label: str
    shape: tuple[int, int, int]
    gpu: str
    options: dict
    threads: int
    registers: int
    registers_known: bool
    smem_bytes: int
    ctas_per_sm: int
    occupancy_limit: str          # what bounds ctas_per_sm
    decomposition: str            # "split-K" | "stream-K" | "persistent"
    splits: int
    grid: int                     # CTAs launched
    units: int                    # equal work units (a CTA, or a persistent CTA's tile)
    at_once: int                  # units running at once (the resident slots the grid takes)
    waves: int
    last_wave_fill: float         # SMs busy in the last wave / SMs
    inflight_per_cta: int         # bytes of the streamed operand requested, not yet arrived
    inflight_per_sm: float        # ... per busy SM in the first wave
    inflight_needed_per_sm: float
    stream_bytes: float           # the streamed operand, read once
    other_bytes: float            # the small operand and C
    reduction: str                # "none" | "cluster" | "workspace" | "cluster+workspace"
    reduction_bytes: float        # fp32 partials written and read
    t_floor_us: float
    t_stream_us: float            # the waves (stream or arithmetic, whichever is longer per wave)
    t_reduce_us: float
    wave_terms: tuple = field(default=(), repr=False)   # per wave: (units, bytes/unit, rate, us)
    refusal: str = ""             # a reason the config cannot serve the shape, whatever its budget
    slots: int = 0                # resident CTA slots: ctas_per_sm x SMs

    @property
    def slots_busy(self) -> float:
        """The share of the resident slots the grid's units keep busy over its waves."""
        return self.units / max(1, self.waves * self.slots)

    @property
    def operand_bytes(self) -> float:
        """A and B, once."""
        M, N, K = self.shape
        return 2.0 * (M + N) * K

    @property
    def t_us(self) -> float:
        return self.t_floor_us + self.t_stream_us + self.t_reduce_us

    @property
    def gbps(self) -> float:
        """The streamed operand's bytes over the predicted time (GB/s = 1e3 bytes/us)."""
        return self.stream_bytes / self.t_us / 1e3

    def problems(self) -> list[str]:
        """Why this config cannot stream this shape at the device's rate; empty when it can."""
        out = [self.refusal] if self.refusal else []
        if self.inflight_per_sm < self.inflight_needed_per_sm:
            out.append(f"{self.inflight_per_sm / 1024:.1f} KiB in flight per SM < the "
                       f"{self.inflight_needed_per_sm / 1024:.1f} KiB {self.gpu} needs")
        if self.last_wave_fill < WAVE_FILL_MIN:
            out.append(f"the last of {self.waves} wave(s) keeps {self.last_wave_fill:.0%} of the SMs "
                       f"busy (< {WAVE_FILL_MIN:.0%})")
        return out

    def deep_k_problems(self, slots: bool = True) -> list[str]:
        """Why this config does not cover the GPU on a deep-K row (issue 51); empty when it
        does: fewer than SLOTS_BUSY_MIN of the resident slots busy, or a reduction that moves
        more bytes than the operands hold. slots False: the reduction's bound alone (a row
        where no config can keep the slots busy within it)."""
        out = [self.refusal] if self.refusal else []
        if slots and self.slots_busy < SLOTS_BUSY_MIN:
            out.append(f"{self.units} units over {self.waves} wave(s) of {self.slots} slots keep "
                       f"{self.slots_busy:.0%} of them busy (< {SLOTS_BUSY_MIN:.0%})")
        if self.reduction_bytes > self.operand_bytes:
            out.append(f"the reduction moves {self.reduction_bytes / 2**20:.2f} MiB > the "
                       f"operands' {self.operand_bytes / 2**20:.2f} MiB")
        return out

    def lines(self) -> list[str]:
        """The budget as `cudal2 templates --explain` prints it."""
        M, N, K = self.shape
        regs = f"{self.registers}" + ("" if self.registers_known else " (estimate: not built)")
        out = [
            f"{self.label} at {M}x{N}x{K} on {self.gpu}, options {self.options or 'defaults'}",
            f"  CTA: {self.threads} threads, {regs} registers, {self.smem_bytes} B shared -> "
            f"{self.ctas_per_sm} per SM (bound by {self.occupancy_limit})",
            f"  grid: {self.decomposition}, {self.splits} split(s), {self.grid} CTAs, {self.units} "
            f"units, {self.at_once} at once, {self.waves} wave(s), last wave {self.last_wave_fill:.0%} "
            f"of the SMs, {self.slots_busy:.0%} of the {self.slots} slots busy",
            f"  in flight: {self.inflight_per_cta / 1024:.1f} KiB per CTA, "
            f"{self.inflight_per_sm / 1024:.1f} KiB per SM (needed {self.inflight_needed_per_sm / 1024:.1f})",
            f"  bytes: {self.stream_bytes / 2**20:.2f} MiB streamed, {self.other_bytes / 2**20:.2f} MiB "
            f"other, reduction {self.reduction} {self.reduction_bytes / 2**20:.2f} MiB",
            f"  time: {self.t_us:.2f} us = floor {self.t_floor_us:.2f} + waves {self.t_stream_us:.2f} "
            f"+ reduction {self.t_reduce_us:.2f}  ({self.gbps:.0f} GB/s on the streamed operand)",
        ]
        for i, (n, b, rate, us) in enumerate(self.wave_terms[:4]):
            out.append(f"    wave {i + 1}: {n} units x {b / 1024:.1f} KiB at {rate:.1f} GB/s each: {us:.2f} us")
        problems = self.deep_k_problems() if self.family in DEEPK else self.problems()
        out.append("  budget: " + ("; ".join(problems) if problems else "met"))
        return out


def ctas_per_sm(threads: int, registers: int, smem_bytes: int, gpu: GpuSpec) -> tuple[int, str]:
    """CTAs resident per SM and the limit that sets it (the CUDA occupancy rule: registers are
    allocated per warp in units of 256, shared memory per CTA with the driver's reserve)."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    limits = {
        "the CTA cap": gpu.max_ctas_per_sm,
        "threads": gpu.max_threads_per_sm // max(threads, 1),
        "registers": gpu.regs_per_sm // (regs_per_warp * warps),
        "shared memory": gpu.smem_per_sm // (smem_bytes + gpu.smem_per_cta_reserved),
    }
    name = min(limits, key=limits.get)
    return max(1, limits[name]), name


@dataclass(frozen=True)
class _Grid:
    """How one call covers the GPU, in the budget's terms."""
    decomposition: str
    splits: int
    grid: int
    units: int
    unit_bytes: float        # streamed bytes of one unit
    unit_flops: float        # arithmetic of one unit, at the instruction's rate
    inflight: int            # per CTA
    reduction: str
    reduction_bytes: float
    reduce_trips: int        # dependent round trips of the slowest reducing thread
    persistent: bool = False
    cluster_trips: int = 0   # "cluster+workspace": its trips through DSMEM before the workspace's


def _skinny_grid(p: dict, M: int, N: int, K: int, gpu: GpuSpec, slots: int, options: dict,
                 cluster: bool, threads: int, batched: bool, two_level: bool) -> _Grid:
    """skinny_hgemm.cuh's decide() replayed in the kernel's own (M, N) (the mirror's C^T).
    The workspace's reducer (splitk_fixup.cuh's finish_tile) walks its share of the tile's
    elements, each through every split in order (a load and a clearing store): a round trip per
    element and split, or per element and batch of splits (stream-K: of contributors) in a
    build whose reducer batches its loads (`batched`)."""
    BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["STAGES"]
    per_thread = -(-min(M, BM) * BN // threads)
    tiles, k_tiles = -(-N // BN), -(-K // BK)
    mode, n = skinny_plan(N, K, BN, BK, gpu.sms, slots, int(options.get("splits", 0)),
                          int(options.get("decomposition", 0)))
    tile_partial = 4.0 * M * BN
    kt_bytes, kt_flops = 2.0 * BN * BK, 2.0 * BM * BN * BK      # padded rows cost tensor issue
    inflight = int((S - 1) * BN * BK * 2)
    if mode == "streamk":
        G = min(n, STREAMK_MAX_CTAS)
        per = -(-tiles * k_tiles // G)
        peers = -(-G // tiles) if G > tiles else 1
        rb = 2.0 * tile_partial * tiles * (peers - 1)
        return _Grid("stream-K", 1, G, G, per * kt_bytes, per * kt_flops, inflight,
                     "workspace" if peers > 1 else "none", rb,
                     per_thread * _batches(peers, streamk_fixup_batch(p) if batched else 1))
    splits = n
    per = -(-k_tiles // splits)
    red, groups, trips = _split_reduction(splits, gpu, cluster, two_level, batched)
    rb = 2.0 * tile_partial * tiles * (groups if red == "cluster+workspace" else splits - 1)
    return _Grid("split-K", splits, tiles * splits, tiles * splits, per * kt_bytes,
                 per * kt_flops, inflight, red, rb, per_thread * trips,
                 cluster_trips=per_thread * (red == "cluster+workspace"))


def _batches(partials: int, batch: int) -> int:
    """Dependent round trips of a reducer that loads `batch` of its `partials` at once."""
    return -(-partials // batch)


def _split_reduction(splits: int, gpu: GpuSpec, cluster: bool, two_level: bool,
                     batched: bool) -> tuple[str, int, int]:
    """How the splits of a tile reduce (skinny_hgemm.cuh's decide()): (the reduction, the
    partial slabs through the workspace, the reducer's dependent round trips). On a GPU with
    clusters, splits that a cluster of at most cluster_max divides (cluster_of) reduce in it
    through DSMEM; several clusters of a tile (`two_level` builds) then sum their clusters' slabs
    through the workspace; a split count no cluster divides (or an older build's above
    cluster_max) reduces through the workspace alone."""
    if splits <= 1:
        return "none", 0, 0
    cs = cluster_of(splits, gpu.cluster_max) if cluster else 1
    if not two_level and splits > gpu.cluster_max:
        cs = 1
    batch = FIXUP_BATCH if batched else 1
    if cs == splits:
        return "cluster", 0, 1
    if cs > 1:
        return "cluster+workspace", splits // cs, _batches(splits // cs, batch)
    return "workspace", splits, _batches(splits, batch)


def _streamk_grid(p: dict, M: int, N: int, K: int, gpu: GpuSpec, slots: int, options: dict,
                  cluster: bool, batched: bool, two_level: bool) -> _Grid:
    """The streamk family's call (skinny_hgemm.cuh's decide() over M x N tiles, streamk.cuh's
    ranges; streamk_work enumerates the same split). Each k-tile of a tile reads BM + BN rows of
    BK (A's and B's through L2 after their first read); the reduction: every contributor of a
    split tile stores its fp32 partial tile and the last reads them all, a round trip per
    contributor (stream-K: each thread loads its fragments of one partial at once; split-K
    through the workspace: one per split, which the five committed H200 mma split-K rows at the
    deep-K targets bear out, -0.39..+0.30 in log; a trip per element and split, as
    _skinny_grid prices it, put them 3-4x over), or a cluster reads its peers' through DSMEM.
    A `batched` build's reducer loads a batch of partials at once (FIXUP_BATCH splits, or
    streamk_fixup_batch contributors): a round trip per batch."""
    BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["STAGES"]
    tiles_m = -(-M // BM)
    tiles, k_tiles = tiles_m * -(-N // BN), -(-K // BK)
    mode, n = skinny_plan(N, K, BN, BK, gpu.sms, slots, int(options.get("splits", 0)),
                          int(options.get("decomposition", 0)), tiles_m)
    kt_bytes, kt_flops = 2.0 * (BM + BN) * BK, 2.0 * BM * BN * BK
    inflight = int((S - 1) * kt_bytes)
    partial = 4.0 * BM * BN
    if mode == "streamk":
        iters, G = tiles * k_tiles, n
        t = np.arange(tiles, dtype=np.int64)
        first = (t * k_tiles * G + G - 1) // iters          # streamk.cuh's cta_of, per tile
        count = ((t + 1) * k_tiles * G - 1) // iters - first + 1
        summed = count[count > 1]
        per = -(-iters // G)
        return _Grid("stream-K", 1, G, G, per * kt_bytes, per * kt_flops, inflight,
                     "workspace" if summed.size else "none", 2.0 * partial * float(summed.sum()),
                     _batches(int(summed.max()), streamk_fixup_batch(p) if batched else 1)
                     if summed.size else 0)
    per = -(-k_tiles // n)
    red, groups, trips = _split_reduction(n, gpu, cluster, two_level, batched)
    return _Grid("split-K", n, tiles * n, tiles * n, per * kt_bytes, per * kt_flops, inflight, red,
                 2.0 * partial * tiles * (groups if red == "cluster+workspace" else n)
                 if n > 1 else 0.0, trips, cluster_trips=int(red == "cluster+workspace"))


def _gemv_grid(p: dict, M: int, N: int, K: int, gpu: GpuSpec, slots: int, options: dict) -> _Grid:
    """The GEMV's persistent grid (cudal2.templates.gemv's replica of the kernel's split)."""
    splits, unroll = int(options.get("splits", 1)), int(options.get("unroll", 4))
    n_ctas, most = _gemv_split(tuple(p.items()), M, N, K, splits, slots)
    BN = gemv.gemv_tile_cols(p)
    tiles = -(-N // BN)
    rounds = max(1, -(-tiles // max(1, n_ctas // splits)))
    unit_bytes = most / rounds
    # fp32 FMAs per weight for each row of A, plus the half -> float conversion of the weight
    unit_flops = unit_bytes / 2.0 * 2.0 * (M + 0.5)
    rb = 2.0 * 4.0 * M * BN * tiles * (splits - 1)
    return _Grid("persistent", splits, n_ctas, tiles * splits, unit_bytes, unit_flops,
                 gemv.gemv_inflight_bytes(p, unroll), "cluster" if splits > 1 else "none", rb,
                 -(-M * BN // (splits * gemv.gemv_threads(p))) * splits if splits > 1 else 0,
                 persistent=True)


# The split replayed tile by tile (a list as long as the tiles, thousands on a vocabulary row),
# the same for each of a config's `unroll` options: once per split.
@functools.lru_cache(maxsize=1024)
def _gemv_split(params: tuple, M: int, N: int, K: int, splits: int, slots: int) -> tuple[int, float]:
    """(CTAs the GEMV launches, the most bytes of B one of them streams) for a config's params."""
    p = dict(params)
    work = gemv.gemv_work(M, N, K, p, splits, slots)
    BN = gemv.gemv_tile_cols(p)
    per_cta: dict[int, float] = {}
    for cta, tile, k0, k1 in work:
        cols = min(BN, N - tile * BN)
        per_cta[cta] = per_cta.get(cta, 0.0) + 2.0 * cols * (k1 - k0)
    return len({w[0] for w in work}), max(per_cta.values())


def _tile_grid(family: str, p: dict, M: int, N: int, K: int, gpu: GpuSpec, options: dict) -> _Grid:
    """lowlat's and wgmma's grid: an output tile per CTA, K split in the same launch by the
    kernel's own plan (lowlat_splits, wgmma_splits, replayed); without a split wgmma runs a
    persistent grid of sm_count CTAs (0: every SM) over the tiles. lowlat's splits reduce through
    the workspace, the last arriver reading every split's fragment with the loads of one split
    in flight: a round trip per split; wgmma's in a cluster (a slice of every peer's through
    DSMEM). The streamed operand is the large one: B when M is the small dimension, else A."""
    BM, BN, BK, S = p["BM"], p["BN"], p["BK"], p["STAGES"]
    k_tiles = -(-K // BK)
    cm = p.get("CLUSTER_M", 1)
    tiles = -(-M // (BM * cm)) * cm * -(-N // BN)     # a cluster along M takes whole pairs
    kt_bytes = 2.0 * (BN if M <= N else BM) * BK
    kt_flops = 2.0 * BM * BN * BK                      # padded rows cost tensor issue
    inflight = int((S - 1) * kt_bytes)
    tile_partial = 4.0 * min(M, BM) * min(N, BN)
    if family == "wgmma":
        splits = wgmma_splits(M, N, K, BM, BN, BK, gpu.sms, int(options.get("splits", 1)), cm)
        per = -(-k_tiles // splits)
        if splits == 1:
            grid = min(tiles, int(options.get("sm_count", 0)) or gpu.sms)
            return _Grid("persistent", 1, grid, tiles, per * kt_bytes, per * kt_flops, inflight,
                         "none", 0.0, 0, persistent=True)
        return _Grid("split-K", splits, tiles * splits, tiles * splits, per * kt_bytes,
                     per * kt_flops, inflight, "cluster", 2.0 * tile_partial * tiles * (splits - 1),
                     splits)
    splits, per = lowlat_splits(M, N, K, BM, BN, BK, gpu.sms, int(options.get("splits", 0)))
    return _Grid("split-K", splits, tiles * splits, tiles * splits, per * kt_bytes,
                 per * kt_flops, inflight, "workspace" if splits > 1 else "none",
                 2.0 * tile_partial * tiles * (splits - 1), splits if splits > 1 else 0)


def _waves(g: _Grid, slots: int, gpu: GpuSpec, ctas_sm: int, arith_tflops: float):
    """Per wave: (units, bytes per unit, GB/s per unit, us). A wave's units keep X bytes
    requested; each round trip of X takes the latency plus X at the reachable peak (the latency
    a request sees grows with the load: X / (L + X / peak) streams at X / (X + L x peak) of it),
    so a wave takes L for its first bytes, L per round trip of a unit's in-flight bytes, and its
    bytes at the peak; or its arithmetic at the SM's rate, when that is longer."""
    at_once = min(g.units, slots if not g.persistent else g.grid)
    L = gpu.dram_latency_ns * 1e-3
    peak = gpu.stream_bytes_per_us
    sm_flops = arith_tflops * 1e6 / gpu.sms                               # flop/us per SM

    def wave(n: int) -> tuple:
        per_sm = min(ctas_sm, -(-n // gpu.sms))
        trips = g.unit_bytes / max(g.inflight, 1)
        stream = L * trips + n * g.unit_bytes / peak
        us = L + max(stream, g.unit_flops * per_sm / sm_flops)
        if "workspace" in g.reduction:      # each CTA stores its partial, fences, arrives
            us += gpu.fixup_store_us
        return n, g.unit_bytes, g.unit_bytes / us / 1e3, us

    if g.units <= 0:
        return [], at_once
    # every wave but the last runs `at_once` units: the same terms, worked out once
    full, rest = divmod(g.units, at_once)
    return [wave(at_once)] * full + ([wave(rest)] if rest else []), at_once


def budget(config: KernelConfig, shape, gpu: GpuSpec, *, options: dict | None = None,
           registers: int = 0, smem_bytes: int = 0, cluster: bool = True,
           batched: bool = True, two_level: bool = True) -> Budget:
    """The budget of `config` (a BUDGETED family) at `shape` (M, N, K) on `gpu`. options: the
    runtime options of the call (missing: the build's defaults); registers / smem_bytes: ptxas's
    and the meta's figures (0: the family's estimate and formula); cluster: whether the build
    reduces splits in a cluster (a Hopper build of today; False replays an older build);
    batched: whether its workspace reducer loads a batch of partials at once (False replays a
    build from before the batch, one partial per round trip); two_level: whether splits beyond
    one cluster reduce as clusters, then through the workspace (False: an older build's, through
    the workspace alone). as_built says all three for a build."""
    if config.family not in BUDGETED:
        raise ValueError(f"the streaming budget models {', '.join(BUDGETED)}, not {config.family}")
    M, N, K = (int(shape.M), int(shape.N), int(shape.K)) if hasattr(shape, "M") else map(int, shape)
    options = dict(options or {})
    b = _budget(config, (M, N, K), gpu, tuple(sorted(options.items())), registers, smem_bytes,
                cluster, batched, two_level)
    # the caller's own record, with its options as given (their order is what `lines` prints):
    # a copy of the frozen fields, not a recomputation
    mine = object.__new__(Budget)
    mine.__dict__.update(b.__dict__, options=options)
    return mine


_label = functools.lru_cache(maxsize=4096)(KernelConfig.label)    # a config's, once (a plan asks per option)


# A plan prices each option of a config at a row on the planning GPU (the cost model's prior,
# its options sorted), then screens the same options on every GPU of the arch
# (problems_on_arch, in the option space's order): the second look is a cache hit. A plan's
# reuse is within one (config, row), hundreds of calls apart at most.
@functools.lru_cache(maxsize=1 << 14)
def _budget(config: KernelConfig, shape: tuple[int, int, int], gpu: GpuSpec, option_items: tuple,
            registers: int, smem_bytes: int, cluster: bool, batched: bool, two_level: bool) -> Budget:
    """budget() of hashable arguments (options as sorted items: the terms read them by name)."""
    family = config.family
    p = config.as_dict()
    M, N, K = shape
    options = dict(option_items)
    km, kn = (N, M) if family == "skinny_n" else (M, N)       # the mirror computes C^T
    threads, smem, regs, arith = _cta(family, p, gpu, int(options.get("splits", 1)))
    smem, regs = smem_bytes or smem, registers or regs
    occ, limit = ctas_per_sm(threads, regs, smem, gpu)
    slots = occ * gpu.sms
    cluster = cluster and gpu.cluster_max > 0
    if family == "gemv":
        g = _gemv_grid(p, km, kn, K, gpu, slots, options)
    elif family in TILED:
        g = _tile_grid(family, p, km, kn, K, gpu, options)
    elif family in DEEPK:
        g = _streamk_grid(p, km, kn, K, gpu, slots, options, cluster, batched, two_level)
    else:
        g = _skinny_grid(p, km, kn, K, gpu, slots, options, cluster, threads, batched, two_level)
    waves, at_once = _waves(g, slots, gpu, occ, arith)
    first_per_sm = min(occ, waves[0][0] / min(gpu.sms, waves[0][0]))
    last = waves[-1][0]
    # the reducer reads its peers' partials in a fixed order: a round trip per batch (L2, or
    # DSMEM); two levels: the cluster's through DSMEM, then the clusters' slabs through L2
    per_peer = gpu.dsmem_peer_us if g.reduction == "cluster" else gpu.fixup_peer_us
    t_reduce = 0.0
    if g.reduction != "none":
        # the partials' bytes cross L2 (DRAM once they outgrow it): at the streaming peak
        moved = g.reduction_bytes if "workspace" in g.reduction else 0.0
        t_reduce = (g.reduce_trips * per_peer + g.cluster_trips * gpu.dsmem_peer_us
                    + moved / gpu.stream_bytes_per_us)
    small, big = _small_big(family, M, N)
    stream, other = 2.0 * big * K, 2.0 * (small * K + km * kn)
    if family in DEEPK:      # both operands stream; C is the rest
        stream, other = 2.0 * (M + N) * K, 2.0 * M * N
    return Budget(
        family=family, label=_label(config), shape=(M, N, K), gpu=gpu.name, options=options,
        threads=threads, registers=regs, registers_known=bool(registers), smem_bytes=smem,
        ctas_per_sm=occ, occupancy_limit=limit, decomposition=g.decomposition, splits=g.splits,
        grid=g.grid, units=g.units, at_once=at_once, waves=len(waves),
        last_wave_fill=_persistent_fill(g, gpu) if g.persistent else min(1.0, last / gpu.sms),
        inflight_per_cta=g.inflight, inflight_per_sm=g.inflight * first_per_sm,
        inflight_needed_per_sm=gpu.inflight_needed_per_sm(),
        stream_bytes=stream, other_bytes=other,
        reduction=g.reduction, reduction_bytes=g.reduction_bytes,
        t_floor_us=gpu.stream_floor_us, t_stream_us=sum(w[3] for w in waves), t_reduce_us=t_reduce,
        wave_terms=tuple(waves), refusal=_refusal(family, p, km, kn), slots=slots)


def _cta(family: str, p: dict, gpu: GpuSpec, splits: int) -> tuple[int, int, int, float]:
    """A config's CTA before a build says: (threads, shared bytes, registers, the TFLOP/s of its
    instruction). Registers: the family's estimate (an upper bound for skinny); the GEMV's
    shared memory grows with its `splits` option."""
    if family == "gemv":
        return (gemv.gemv_threads(p), gemv.gemv_smem_bytes(p, splits), gemv.gemv_register_estimate(p),
                gpu.fp32_tflops)
    if family == "wgmma":
        return (128 * (p["CONSUMERS"] + 1), _wgmma_smem_bytes(p), TILED_REGISTER_ESTIMATE[family],
                gpu.tflops)
    if family in TILED:
        wg = p["BM"] >= 64                     # lowlat: a warpgroup per 64 rows; else BN/32 warps
        return (128 * (p["BM"] // 64) if wg else 32 * (p["BN"] // 32), lowlat_smem_bytes(p),
                TILED_REGISTER_ESTIMATE[family], gpu.tflops if wg else gpu.mma_sync_tflops)
    estimate = streamk_register_estimate if family in DEEPK else skinny_register_estimate
    return (32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]), skinny_smem_bytes(p), estimate(p),
            gpu.mma_sync_tflops)


def _refusal(family: str, p: dict, M: int, N: int) -> str:
    """Why a config cannot serve a decode row whatever its budget: wgmma's 2-CTA cluster shares
    B between two row tiles, and a row of M <= BM rows has one (its pair computes nothing)."""
    if family == "wgmma" and p.get("CLUSTER_M", 1) > 1 and M <= p["BM"] and M <= N:
        return f"CLUSTER_M={p['CLUSTER_M']} pairs row tiles, and {M} rows are one tile"
    return ""


def _persistent_fill(g: _Grid, gpu: GpuSpec) -> float:
    """A persistent grid's last round: the CTAs still working over the SMs."""
    clusters = max(1, g.grid // g.splits)
    tiles = g.units // g.splits
    rounds = -(-tiles // clusters)
    last_ctas = (tiles - (rounds - 1) * clusters) * g.splits
    return min(1.0, last_ctas / gpu.sms)


def as_built(meta: dict, options: dict) -> tuple[dict, dict]:
    """How a build of a streaming family runs a call, from its meta: (the options as it runs
    them, budget()'s keywords for its reduction: cluster, batched, two_level). A build's meta
    (one with "params") that declares no "decomposition" option predates stream-K and runs
    split-K; one without "cluster_splitk_max" reduces through the workspace; one without
    "fixup_batch" loads a partial per round trip; one without "cluster_groups" reduces more
    splits than a cluster holds through the workspace alone. A config's dict (no "params") is
    today's templates: the options as given, and every path where the GPU has it."""
    if not isinstance(meta.get("params"), dict):
        return dict(options), {"cluster": True, "batched": True, "two_level": True}
    declared = {o.get("name") for o in meta.get("options") or [] if isinstance(o, dict)}
    out = dict(options)
    if meta.get("family") in ("skinny", "skinny_n") and "decomposition" not in declared:
        out["decomposition"] = 2
    return out, {"cluster": bool(meta.get("cluster_splitk_max")), "batched": "fixup_batch" in meta,
                 "two_level": bool(meta.get("cluster_groups"))}


def problems_on_arch(config: KernelConfig, shape, arch: str, *, options: dict | None = None,
                     registers: int = 0, smem_bytes: int = 0, slots: bool = True) -> list[str]:
    """The budget's problems on every GPU a build for `arch` may run on (an sm_90a build meets
    the H200's larger need as well as the H100's): the rule the planner screens decode
    candidates with (Budget.problems), and a deep-K family's candidates on a deep-K row
    (Budget.deep_k_problems; slots False: its reduction bound alone)."""
    out = []
    for name in GPUS_OF_ARCH.get(arch, ()):
        b = budget(config, shape, GPUS[name], options=options, registers=registers,
                   smem_bytes=smem_bytes)
        out += [f"{name}: {p}" for p in (b.deep_k_problems(slots) if config.family in DEEPK
                                         else b.problems())]
    return out


def replayable(family: str, M: int, N: int) -> bool:
    """A shape the budget can replay: a budgeted family whose small dimension (a streaming
    family's own; a tile grid's smaller of M and N) is at most DECODE_MAX_M (what `cudal2 report
    --budget` fits on)."""
    return family in BUDGETED and _small_big(family, M, N)[0] <= DECODE_MAX_M


def is_decode(family: str, M: int, N: int, K: int) -> bool:
    """A decode row the budget rules: replayable, and its streamed operand at least
    DECODE_MIN_BYTES (a smaller one cannot hold the chip's in-flight need: it is bound by the
    launch, not by streaming)."""
    return replayable(family, M, N) and 2 * K * _small_big(family, M, N)[1] >= DECODE_MIN_BYTES


def is_deep_k(M: int, N: int, K: int) -> bool:
    """A deep-K row (issue 51): at most DEEP_K_MAX_TILES output tiles of 128 x 128 over a K of
    at least DEEP_K_MIN_K."""
    return K >= DEEP_K_MIN_K and -(-M // 128) * -(-N // 128) <= DEEP_K_MAX_TILES


@functools.lru_cache(maxsize=4096)     # asked for each option a plan prices: once a (family, row)
def ruled(family: str, M: int, N: int, K: int) -> bool:
    """A row where the budget's rule screens this family's candidates (problems_on_arch), and
    its time is the cost model's prior: a decode row of a budgeted family, a deep-K row of a
    deep-K family (elsewhere the budget was never compared with a measurement)."""
    return is_decode(family, M, N, K) or (family in DEEPK and is_deep_k(M, N, K))


def _small_big(family: str, M: int, N: int) -> tuple[int, int]:
    """(the small dimension, the streamed operand's rows) of a family on (M, N)."""
    if family in TILED or family in DEEPK:
        return min(M, N), max(M, N)
    return (N, M) if family == "skinny_n" else (M, N)
