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
  GEMV's tile rounds), how many run at once, and how full the last wave keeps the SMs;
- bytes of the streamed operand in flight per CTA and per SM at steady state: the skinny
  families' cp.async pipeline keeps STAGES - 1 stages of B requested (with A_LOAD "regs" the
  ring holds B alone, so more stages fit the same shared memory); the GEMV's threads each
  keep `unroll` 16-byte loads per weight row (cudal2.templates.gemv);
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

import math
from dataclasses import dataclass, field

from cudal2.core.devices import GPUS, GPUS_OF_ARCH, GpuSpec
from cudal2.templates import gemv
from cudal2.templates.family import KernelConfig
from cudal2.templates.skinny import (STREAMK_MAX_CTAS, skinny_plan, skinny_register_estimate,
                                     skinny_smem_bytes)

STREAMING = ("skinny", "skinny_n", "gemv")   # the families the budget models
DECODE_MAX_M = 64                            # a decode row: the small dimension <= 64 ...
DECODE_MIN_BYTES = 16 << 20                  # ... streaming at least what an H200 keeps in flight (13 MB)
WAVE_FILL_MIN = 0.90                         # the last wave keeps at least this share of the SMs busy


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
    reduction: str                # "none" | "cluster" | "workspace"
    reduction_bytes: float        # fp32 partials written and read
    t_floor_us: float
    t_stream_us: float            # the waves (stream or arithmetic, whichever is longer per wave)
    t_reduce_us: float
    wave_terms: tuple = field(default=(), repr=False)   # per wave: (units, bytes/unit, rate, us)

    @property
    def t_us(self) -> float:
        return self.t_floor_us + self.t_stream_us + self.t_reduce_us

    @property
    def gbps(self) -> float:
        """The streamed operand's bytes over the predicted time (GB/s = 1e3 bytes/us)."""
        return self.stream_bytes / self.t_us / 1e3

    def problems(self) -> list[str]:
        """Why this config cannot stream this shape at the device's rate; empty when it can."""
        out = []
        if self.inflight_per_sm < self.inflight_needed_per_sm:
            out.append(f"{self.inflight_per_sm / 1024:.1f} KiB in flight per SM < the "
                       f"{self.inflight_needed_per_sm / 1024:.1f} KiB {self.gpu} needs")
        if self.last_wave_fill < WAVE_FILL_MIN:
            out.append(f"the last of {self.waves} wave(s) keeps {self.last_wave_fill:.0%} of the SMs "
                       f"busy (< {WAVE_FILL_MIN:.0%})")
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
            f"of the SMs",
            f"  in flight: {self.inflight_per_cta / 1024:.1f} KiB per CTA, "
            f"{self.inflight_per_sm / 1024:.1f} KiB per SM (needed {self.inflight_needed_per_sm / 1024:.1f})",
            f"  bytes: {self.stream_bytes / 2**20:.2f} MiB streamed, {self.other_bytes / 2**20:.2f} MiB "
            f"other, reduction {self.reduction} {self.reduction_bytes / 2**20:.2f} MiB",
            f"  time: {self.t_us:.2f} us = floor {self.t_floor_us:.2f} + waves {self.t_stream_us:.2f} "
            f"+ reduction {self.t_reduce_us:.2f}  ({self.gbps:.0f} GB/s on the streamed operand)",
        ]
        for i, (n, b, rate, us) in enumerate(self.wave_terms[:4]):
            out.append(f"    wave {i + 1}: {n} units x {b / 1024:.1f} KiB at {rate:.1f} GB/s each: {us:.2f} us")
        problems = self.problems()
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


def _skinny_grid(p: dict, M: int, N: int, K: int, gpu: GpuSpec, slots: int, options: dict,
                 cluster: bool, threads: int) -> _Grid:
    """skinny_hgemm.cuh's decide() replayed in the kernel's own (M, N) (the mirror's C^T).
    The workspace's reducer (splitk_fixup.cuh's finish_tile) walks its share of the tile's
    elements, each through every split in order (a load and a clearing store): a round trip per
    element and split."""
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
                     "workspace" if peers > 1 else "none", rb, per_thread * peers)
    splits = n
    per = -(-k_tiles // splits)
    in_cluster = cluster and 2 <= splits <= gpu.cluster_max
    rb = 2.0 * tile_partial * tiles * (splits - 1)
    red = "none" if splits == 1 else ("cluster" if in_cluster else "workspace")
    return _Grid("split-K", splits, tiles * splits, tiles * splits, per * kt_bytes,
                 per * kt_flops, inflight, red, rb,
                 per_thread * (1 if in_cluster else splits) if splits > 1 else 0)


def _gemv_grid(p: dict, M: int, N: int, K: int, gpu: GpuSpec, slots: int, options: dict) -> _Grid:
    """The GEMV's persistent grid (cudal2.templates.gemv's replica of the kernel's split)."""
    splits, unroll = int(options.get("splits", 1)), int(options.get("unroll", 4))
    work = gemv.gemv_work(M, N, K, p, splits, slots)
    BN = gemv.gemv_tile_cols(p)
    ctas = sorted({w[0] for w in work})
    per_cta: dict[int, float] = {}
    for cta, tile, k0, k1 in work:
        cols = min(BN, N - tile * BN)
        per_cta[cta] = per_cta.get(cta, 0.0) + 2.0 * cols * (k1 - k0)
    tiles = -(-N // BN)
    rounds = max(1, -(-tiles // max(1, len(ctas) // splits)))
    unit_bytes = max(per_cta.values()) / rounds
    # fp32 FMAs per weight for each row of A, plus the half -> float conversion of the weight
    unit_flops = unit_bytes / 2.0 * 2.0 * (M + 0.5)
    rb = 2.0 * 4.0 * M * BN * tiles * (splits - 1)
    return _Grid("persistent", splits, len(ctas), tiles * splits, unit_bytes, unit_flops,
                 gemv.gemv_inflight_bytes(p, unroll), "cluster" if splits > 1 else "none", rb,
                 -(-M * BN // (splits * gemv.gemv_threads(p))) * splits if splits > 1 else 0,
                 persistent=True)


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
    out, left = [], g.units
    while left > 0:
        n = min(left, at_once)
        per_sm = min(ctas_sm, -(-n // gpu.sms))
        trips = g.unit_bytes / max(g.inflight, 1)
        stream = L * trips + n * g.unit_bytes / peak
        us = L + max(stream, g.unit_flops * per_sm / sm_flops)
        if g.reduction == "workspace":      # each CTA stores its partial, fences, arrives
            us += gpu.fixup_store_us
        out.append((n, g.unit_bytes, g.unit_bytes / us / 1e3, us))
        left -= n
    return out, at_once


def budget(config: KernelConfig, shape, gpu: GpuSpec, *, options: dict | None = None,
           registers: int = 0, smem_bytes: int = 0, cluster: bool = True) -> Budget:
    """The budget of `config` (a STREAMING family) at `shape` (M, N, K) on `gpu`. options: the
    runtime options of the call (missing: the build's defaults); registers / smem_bytes: ptxas's
    and the meta's figures (0: the family's estimate and formula); cluster: whether the build
    reduces splits in a cluster (a Hopper build of today; False replays an older build)."""
    family = config.family
    if family not in STREAMING:
        raise ValueError(f"the streaming budget models {', '.join(STREAMING)}, not {family}")
    p = config.as_dict()
    M, N, K = (int(shape.M), int(shape.N), int(shape.K)) if hasattr(shape, "M") else map(int, shape)
    options = dict(options or {})
    km, kn = (N, M) if family == "skinny_n" else (M, N)       # the mirror computes C^T
    if family == "gemv":
        threads = gemv.gemv_threads(p)
        smem = smem_bytes or gemv.gemv_smem_bytes(p, int(options.get("splits", 1)))
        arith = gpu.fp32_tflops
    else:
        threads = 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
        smem = smem_bytes or skinny_smem_bytes(p)
        arith = gpu.mma_sync_tflops
    # before a build says: the family's estimate (an upper bound for skinny)
    regs = registers or (gemv.gemv_register_estimate(p) if family == "gemv" else skinny_register_estimate(p))
    occ, limit = ctas_per_sm(threads, regs, smem, gpu)
    slots = occ * gpu.sms
    cluster = cluster and gpu.cluster_max > 0
    g = (_gemv_grid(p, km, kn, K, gpu, slots, options) if family == "gemv"
         else _skinny_grid(p, km, kn, K, gpu, slots, options, cluster, threads))
    waves, at_once = _waves(g, slots, gpu, occ, arith)
    first_per_sm = min(occ, waves[0][0] / min(gpu.sms, waves[0][0]))
    last = waves[-1][0]
    # the reducer reads its peers' partials in a fixed order: a round trip each (L2, or DSMEM)
    per_peer = gpu.dsmem_peer_us if g.reduction == "cluster" else gpu.fixup_peer_us
    t_reduce = 0.0
    if g.reduction != "none":
        # the partials' bytes cross L2 (DRAM once they outgrow it): at the streaming peak
        moved = g.reduction_bytes if g.reduction == "workspace" else 0.0
        t_reduce = g.reduce_trips * per_peer + moved / gpu.stream_bytes_per_us
    return Budget(
        family=family, label=config.label(), shape=(M, N, K), gpu=gpu.name, options=options,
        threads=threads, registers=regs, registers_known=bool(registers), smem_bytes=smem,
        ctas_per_sm=occ, occupancy_limit=limit, decomposition=g.decomposition, splits=g.splits,
        grid=g.grid, units=g.units, at_once=at_once, waves=len(waves),
        last_wave_fill=_persistent_fill(g, gpu) if g.persistent else min(1.0, last / gpu.sms),
        inflight_per_cta=g.inflight, inflight_per_sm=g.inflight * first_per_sm,
        inflight_needed_per_sm=gpu.inflight_needed_per_sm(),
        stream_bytes=2.0 * kn * K, other_bytes=2.0 * (km * K + km * kn),
        reduction=g.reduction, reduction_bytes=g.reduction_bytes,
        t_floor_us=gpu.stream_floor_us, t_stream_us=sum(w[3] for w in waves), t_reduce_us=t_reduce,
        wave_terms=tuple(waves))


def _persistent_fill(g: _Grid, gpu: GpuSpec) -> float:
    """A persistent grid's last round: the CTAs still working over the SMs."""
    clusters = max(1, g.grid // g.splits)
    tiles = g.units // g.splits
    rounds = -(-tiles // clusters)
    last_ctas = (tiles - (rounds - 1) * clusters) * g.splits
    return min(1.0, last_ctas / gpu.sms)


def as_built(meta: dict, options: dict) -> tuple[dict, bool]:
    """How a build of a streaming family runs a call, from its meta: (the options as it runs
    them, whether it reduces splits in a cluster). A build's meta (one with "params") that
    declares no "decomposition" option predates stream-K and runs split-K; one without
    "cluster_splitk_max" reduces through the workspace. A config's dict (no "params") is today's
    templates: the options as given, a cluster where the GPU has one."""
    if not isinstance(meta.get("params"), dict):
        return dict(options), True
    declared = {o.get("name") for o in meta.get("options") or [] if isinstance(o, dict)}
    out = dict(options)
    if meta.get("family") != "gemv" and "decomposition" not in declared:
        out["decomposition"] = 2
    return out, bool(meta.get("cluster_splitk_max"))


def problems_on_arch(config: KernelConfig, shape, arch: str, *, options: dict | None = None,
                     registers: int = 0, smem_bytes: int = 0) -> list[str]:
    """The budget's problems on every GPU a build for `arch` may run on (an sm_90a build meets
    the H200's larger need as well as the H100's): the rule the planner screens decode
    candidates with."""
    out = []
    for name in GPUS_OF_ARCH.get(arch, ()):
        b = budget(config, shape, GPUS[name], options=options, registers=registers,
                   smem_bytes=smem_bytes)
        out += [f"{name}: {p}" for p in b.problems()]
    return out


def replayable(family: str, M: int, N: int) -> bool:
    """A shape the budget can replay: a streaming family's small dimension is at most
    DECODE_MAX_M (what `cudal2 report --budget` fits on)."""
    return family in STREAMING and (N if family == "skinny_n" else M) <= DECODE_MAX_M


def is_decode(family: str, M: int, N: int, K: int) -> bool:
    """A decode row the budget rules: replayable, and its streamed operand at least
    DECODE_MIN_BYTES (a smaller one cannot hold the chip's in-flight need: it is bound by the
    launch, not by streaming)."""
    return replayable(family, M, N) and 2 * K * (M if family == "skinny_n" else N) >= DECODE_MIN_BYTES
