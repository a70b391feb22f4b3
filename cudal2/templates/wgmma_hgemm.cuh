// cudal2 reference kernel family "wgmma": a Hopper (sm_90a) HGEMM in raw CUDA C++ + inline PTX.
//
//   C[M,N] (fp16, row-major, ldc) = A[M,K] (fp16, row-major, lda) @ B, fp32 accumulation
//   B is K x N row-major (ldb >= N) when LAYOUT_RC == 0 ("RR"),
//        N x K row-major, i.e. K x N column-major (ldb >= K), when LAYOUT_RC == 1 ("RC").
//
// Structure (docs/wgmma.md has the diagrams and budgets):
//   * one producer warpgroup (one warp of it issues TMA) and CONSUMERS consumer warpgroups;
//     setmaxnreg moves registers from the producer to the consumers;
//   * a STAGES-deep ring of shared-memory stages, each holding a BM x BK tile of A and a BK x BN
//     tile of B in the 128-byte-swizzled layout wgmma reads; a "full" mbarrier per stage (TMA
//     completes its bytes on it) and an "empty" mbarrier per stage (each consumer warpgroup of
//     every CTA of the cluster arrives once when it has finished reading the stage);
//   * wgmma.mma_async m64nBNk16 (f32 accumulators, B K-major for RC, N-major via the transpose
//     bit for RR); one wgmma group kept in flight, the stage before it released;
//   * clusters of CLUSTER_M CTAs along M share the B tile: each CTA loads 1/CLUSTER_M of it and
//     multicasts it to the cluster;
//   * a persistent grid (one CTA per SM, at most the SMs asked for) walks the output tiles in a
//     runtime-chosen order (grouped raster along M or N with a group size, or a Hilbert curve);
//   * epilogue: fp32 -> fp16, then stmatrix into a swizzled staging buffer and TMA stores
//     (EPILOGUE_TMA 1), or plain clipped stores from registers (EPILOGUE_TMA 0);
//   * split-K in a cluster (CLUSTER_M 1 builds, runtime option "splits"): grid (tiles, splits),
//     one tile per CTA column, launched as clusters of (1, splits, 1). Rank z walks the k-blocks
//     [z * kb / splits, (z + 1) * kb / splits) of its tile, writes its fp32 partial into its own
//     drained pipeline buffers and reduces a slice of the tile from every rank's buffer through
//     distributed shared memory in rank order (splitk_fixup.cuh's cluster reduction): no
//     workspace, no semaphore, bit-identical run to run. For few-tile shapes: decode with
//     33 <= M <= 64 (one BM = 64 tile row), deep K.
//
// Residues: TMA zero-fills every element of a load box that lies outside the matrix (any M, N,
// K); TMA stores and the direct stores clip at M and N. TMA needs 16-byte aligned bases and
// leading dimensions that are multiples of 8 elements: the meta declares "divisible" [1, 8, 8]
// (RC with EPILOGUE_TMA 0: [1, 1, 8]) and the launcher refuses other strides.
//
// Exports ABI 2 (docs/abi.md): cudal2_hgemm(..., options), cudal2_workspace, cudal2_meta.
// Runtime options, in this order: raster (0 heuristic, 1 along M, 2 along N, 3 Hilbert),
// swizzle (group size of rasters 1 and 2), sm_count (0 = every SM), splits (1 = none; 0 = the
// launcher's choice, plan_splits; CLUSTER_M 2 builds declare 1 only).
//
// Host side: the TMA descriptors are encoded per call with cuTensorMapEncodeTiled, reached
// through cudaGetDriverEntryPointByVersion (no -lcuda), and passed as __grid_constant__ kernel
// parameters. No allocation, no synchronisation, the caller's stream only.

#include <cuda.h>            // CUtensorMap and its enums (types only; nothing links to libcuda)
#include <cudaTypedefs.h>    // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <atomic>

#include "splitk_fixup.cuh"
#include "wgmma_ptx.cuh"

#ifndef BM
#define BM 128              // CTA tile rows: 64 * CONSUMERS * (1 or 2)
#endif
#ifndef BN
#define BN 256              // CTA tile columns: 64, 128, 192 or 256 (the wgmma N)
#endif
#ifndef BK
#define BK 64               // K depth of one stage: 64 or 128 (multiples of the 128-byte swizzle atom)
#endif
#ifndef STAGES
#define STAGES 4            // shared-memory pipeline depth
#endif
#ifndef CONSUMERS
#define CONSUMERS 2         // consumer warpgroups (each owns BM / CONSUMERS rows of the tile)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2         // CTAs per cluster along M (1 or 2); they share B tiles by TMA multicast
#endif
#ifndef EPILOGUE_TMA
#define EPILOGUE_TMA 1      // 1: stmatrix + TMA store; 0: direct (clipped) stores from registers
#endif
#ifndef ACC_F16
#define ACC_F16 0           // only 0 (fp32 accumulation) is implemented
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0         // 0: B row-major K x N ("RR"), 1: B column-major, stored N x K ("RC")
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "cudal2 wgmma kernels need sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

// The device code uses sm_90a-only instructions (wgmma, setmaxnreg). A device pass without the
// sm_90a feature (a generic compute_90 PTX, a later arch) compiles the kernel body to a trap, so
// a launch of that code fails loudly instead of returning success with C unwritten.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUDAL2_WGMMA_DEVICE 1
#else
#define CUDAL2_WGMMA_DEVICE 0
#endif

namespace cudal2_wgmma_impl {

using namespace cudal2_wgmma_ptx;   // smem_u32, make_desc, the wgmma wrappers (wgmma_ptx.cuh)
// the cluster's device side (splitk_fixup.cuh): rank, size, barrier, DSMEM loads
using cudal2_splitk::cluster_barrier;
using cudal2_splitk::cluster_ctarank;
using cudal2_splitk::cluster_nctarank;
using cudal2_splitk::ld_peer4;

constexpr int kConsumers = CONSUMERS;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kWgM = BM / kConsumers;              // rows per consumer warpgroup
constexpr int kMI = kWgM / 64;                     // m64 blocks per consumer warpgroup
constexpr int kAcc = BN / 2;                       // fp32 accumulators per thread per m64 block
constexpr int kKChunks = BK / 64;                  // 128-byte (64-element) chunks along K
constexpr int kNChunks = BN / 64;                  // 64-column chunks along N
constexpr int kCM = CLUSTER_M;
constexpr int kABytes = BM * BK * 2;               // A tile bytes per stage
constexpr int kBBytes = BN * BK * 2;               // B tile bytes per stage
constexpr int kStageBytes = kABytes + kBBytes;     // = TMA transaction bytes per CTA per stage
constexpr int kSmemLimit = 232448;                 // sm_90 opt-in maximum per block
constexpr int kSmemFixed = STAGES * kStageBytes + 3 * STAGES * 8 + 1024;  // stages, barriers, tile ids, alignment slack
// TMA-store epilogue: each consumer stages its kWgM x BN slab of C in rounds of kEpiChunks
// 64-column chunks: the whole slab when it fits next to the stages, else 2 chunks, else 1.
constexpr int epi_chunks() {
  return kSmemFixed + BM * 128 * kNChunks <= kSmemLimit ? kNChunks
       : (kNChunks >= 2 && kSmemFixed + BM * 128 * 2 <= kSmemLimit) ? 2 : 1;
}
constexpr int kEpiChunks = epi_chunks();
constexpr int kEpiBytesPerWg = EPILOGUE_TMA ? kWgM * 128 * kEpiChunks : 0;
constexpr int kEpiOffset = STAGES * kStageBytes;
constexpr int kBarOffset = kEpiOffset + kConsumers * kEpiBytesPerWg;
constexpr int kSmemBytes = kBarOffset + 3 * STAGES * 8 + 1024;   // barriers, tile ids, base alignment slack

// Registers per thread after setmaxnreg (multiples of 8; 128 * (producer + CONSUMERS * consumer)
// must stay within the 64K-register file). One consumer (256 threads) needs no reallocation:
// every thread may have 255 registers from the start. The producer keeps 48 (2 consumers: the
// whole file): with 40 (32 at CONSUMERS 3) its tile walk plus the split's k-range spilled 8-44
// bytes in BK = 128, 2-stage builds (`cudal2 templates --build-space wgmma`).
constexpr int kProducerRegs = 48;
constexpr int kConsumerRegs = kConsumers == 1 ? 240 : (kConsumers == 2 ? 232 : 152);

static_assert(ACC_F16 == 0, "the wgmma family implements fp32 accumulation only");
static_assert(kConsumers >= 1 && kConsumers <= 3, "CONSUMERS must be 1, 2 or 3");
static_assert(BM % (64 * kConsumers) == 0 && (kMI == 1 || kMI == 2),
              "BM must be 64 or 128 rows per consumer warpgroup");
static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256, "BN must be 64, 128, 192 or 256");
static_assert(BK == 64 || BK == 128, "BK must be 64 or 128");
static_assert(STAGES >= 2, "STAGES must be >= 2");
static_assert(kCM == 1 || kCM == 2, "CLUSTER_M must be 1 or 2");
static_assert(BN / kCM % 8 == 0 && BK / kCM % 8 == 0, "multicast slices must be whole 8-row swizzle atoms");
static_assert(kMI * kAcc <= (kConsumers == 3 ? 96 : 128), "too many accumulator registers per thread");
static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "register file");
static_assert(kSmemBytes <= kSmemLimit, "stages + epilogue staging exceed the shared memory of an SM");

// Split-K in the cluster: each rank's fp32 partial tile goes into its own stage (and staging)
// buffers, drained by then, kRedRows rows at a time at a stride of BN + 8 floats (the 8 rows of
// an accumulator fragment's float2 stores fall in distinct banks); as many rows as fit, BM or BM
// halved until it fits.
constexpr int kRedStride = BN + 8;
constexpr int red_rows() {
  int r = BM;
  while (r > 1 && r * kRedStride * 4 > kBarOffset) r /= 2;
  return r;
}
constexpr int kRedRows = red_rows();
constexpr int kRedChunks = BM / kRedRows;
constexpr int kRedBarrier = 1 + kConsumers;   // named barrier of every consumer thread (1..3: per warpgroup)
static_assert(kRedRows >= 16 && kRedRows * kRedStride * 4 <= kBarOffset, "a reduction chunk must fit the stages");

// Runtime options (ABI 2), in call order.
constexpr int kOptRaster = 0, kOptSwizzle = 1, kOptSmCount = 2, kOptSplits = 3;
static const int kRasterValues[] = {0, 1, 2, 3};
static const int kSwizzleValues[] = {1, 2, 4, 8, 16};
static const int kSmCountValues[] = {0, 64, 96, 114, 120, 128, 130, 132};
#if CLUSTER_M == 1
static const int kSplitsValues[] = {0, 1, 2, 3, 4, 6, 8};
#define CUDAL2_SPLITS_JSON "[0, 1, 2, 3, 4, 6, 8]"
#else   // the cluster's CTAs share B along M: no split-K
static const int kSplitsValues[] = {1};
#define CUDAL2_SPLITS_JSON "[1]"
#endif
constexpr int kDefaultRaster = 0, kDefaultSwizzle = 8, kDefaultSmCount = 0, kDefaultSplits = 1;

struct Params {
  int M, N, K;
  int num_k_blocks;        // ceil(K / BK)
  int tiles_cm, tiles_n;   // cluster-tile grid: ceil(ceil(M / BM) / CLUSTER_M) x ceil(N / BN)
  int total;               // tiles_cm * tiles_n
  int raster;              // resolved: 1 along M, 2 along N, 3 Hilbert
  int swizzle;             // group size for rasters 1 and 2
  int hilbert_dim;         // power of two >= max(tiles_cm, tiles_n) (raster 3)
  int splits;              // K splits (= gridDim.y = the cluster's CTAs); 1: the persistent grid
  __half* C;               // direct epilogue only
  int ldc;
  int c_vec2;              // direct epilogue: C 4-byte aligned and ldc even (half2 stores)
};

// ---- PTX wrappers (the ones shared with lowlat are in wgmma_ptx.cuh) -----------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

// One arrival plus the transaction bytes the phase must receive before it completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Spin until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "CUDAL2_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra CUDAL2_WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// Arrive once on the barrier at the same shared-memory offset in CTA `cta` of the cluster
// (CLUSTER_M == 1: the CTA's own barrier).
__device__ __forceinline__ void mbar_arrive_cta(uint64_t* bar, uint32_t cta) {
  if constexpr (kCM == 1) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
  } else {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(smem_u32(bar)), "r"(cta) : "memory");
  }
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}

// The same box lands at the same offset in every CTA of `mask`, completing bytes on each CTA's
// barrier at the same offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      int x, int y, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y),
        "h"(mask)
      : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(src)), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma_tile_n(float (&d)[kAcc], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (BN == 256) wgmma_m64n256<TRANS_B>(d, desc_a, desc_b, scale_d);
  else if constexpr (BN == 192) wgmma_m64n192<TRANS_B>(d, desc_a, desc_b, scale_d);
  else if constexpr (BN == 128) wgmma_m64n128<TRANS_B>(d, desc_a, desc_b, scale_d);
  else wgmma_m64n64<TRANS_B>(d, desc_a, desc_b, scale_d);
}

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// Split-K, the consumers' side: the tile's `splits` CTAs are this cluster (rank z = split z).
// Chunk by chunk of kRedRows rows: every consumer thread stores its accumulators of those rows
// into this CTA's shared memory; a cluster barrier (release / acquire) makes every rank's chunk
// visible; each consumer thread sums units (4 floats of a row) of rank z's slice from ranks 0, 1,
// ..., splits - 1 in that order (cluster_sum4: the same additions as the deterministic global
// fixup) and stores them to C, clipped; a second barrier keeps every rank's chunk alive until
// its peers have read it. The producer warpgroup arrives at the same 2 * kRedChunks barriers.
__device__ __forceinline__ void cluster_reduce(float (&acc)[kMI][kAcc], uint8_t* smem, int cw,
                                               int wg_tid, int row0, int col0, int z, int splits,
                                               const Params& p) {
  if (cluster_nctarank() != (uint32_t)splits) __trap();   // launched without its cluster
  float* const red = reinterpret_cast<float*>(smem);
  const uint32_t red_base = smem_u32(red);
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int ct = cw * 128 + wg_tid;                  // index among the consumer threads
  constexpr int kUnitsPerRow = BN / 4;
  constexpr int kUnits = kRedRows * kUnitsPerRow;
  const int u_begin = cudal2_splitk::cluster_slice_begin(z, splits, kUnits);
  const int u_end = cudal2_splitk::cluster_slice_begin(z + 1, splits, kUnits);
  named_barrier_sync(kRedBarrier, 128 * kConsumers);   // every consumer's wgmma has read the stages
#pragma unroll 1
  for (int r0 = 0; r0 < BM; r0 += kRedRows) {
    // accumulator layout as in the direct epilogue: rows 16w + l/4 (+8), columns 8j + 2(l%4) + {0,1}
    const int row_in = cw * kWgM + warp * 16 + (lane >> 2) - r0;   // + 64 mi + 8 h
    const int off = row_in * kRedStride + 2 * (lane & 3);           // + compile-time offsets
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_in + mi * 64 + 8 * h;
        if (kRedChunks > 1 && (r < 0 || r >= kRedRows)) continue;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
          *reinterpret_cast<float2*>(red + off + (mi * 64 + 8 * h) * kRedStride + 8 * j) =
              make_float2(acc[mi][4 * j + 2 * h], acc[mi][4 * j + 2 * h + 1]);
      }
    cluster_barrier();   // every rank's chunk written (release) and visible here (acquire)
    for (int u = u_begin + ct; u < u_end; u += 128 * kConsumers) {
      const int r = u / kUnitsPerRow, c4 = (u % kUnitsPerRow) * 4;
      const uint32_t local = red_base + (uint32_t)(r * kRedStride + c4) * 4u;
      const cudal2_splitk::Float4 sum = cudal2_splitk::cluster_sum4(
          splits, [&](int q) { return ld_peer4(local, (uint32_t)q); });
      const int row = row0 + r0 + r, col = col0 + c4;
      if (row >= p.M) continue;
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
      __half* c = p.C + (size_t)row * (size_t)p.ldc + col;
      if (p.c_vec2 && col + 3 < p.N) {
        reinterpret_cast<__half2*>(c)[0] = __floats2half2_rn(v[0], v[1]);
        reinterpret_cast<__half2*>(c)[1] = __floats2half2_rn(v[2], v[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (col + q < p.N) c[q] = __float2half_rn(v[q]);
      }
    }
    cluster_barrier();   // the peers are done reading: the chunk may be overwritten, or the CTA exit
  }
}

// ---- tile order -------------------------------------------------------------------------------
// Point d of the Hilbert curve filling an n x n square (n a power of two) -> (x, y).
__device__ __forceinline__ void hilbert_d2xy(int n, int d, int& x, int& y) {
  x = y = 0;
  for (int s = 1; s < n; s *= 2) {
    const int rx = 1 & (d >> 1);
    const int ry = 1 & (d ^ rx);
    if (ry == 0) {
      if (rx == 1) { x = s - 1 - x; y = s - 1 - y; }
      const int t = x; x = y; y = t;
    }
    x += s * rx;
    y += s * ry;
    d >>= 2;
  }
}

// The tiles of one cluster: global tile indices cid, cid + nclusters, cid + 2 * nclusters, ...
// mapped to (cluster row cm, column n) by the raster. Only the producer warp runs this (all 32
// lanes: the Hilbert walk is warp-collective); it hands each tile to the consumers through the
// stage it loads.
struct TileSched {
  int next_t, step, total, tiles_cm, tiles_n, raster, swz, hdim;
  int hd, hg;   // Hilbert cursor: next curve point to test, in-range points before it

  __device__ TileSched(const Params& p, int cid, int nclusters)
      : next_t(cid), step(nclusters), total(p.total), tiles_cm(p.tiles_cm), tiles_n(p.tiles_n),
        raster(p.raster), swz(p.swizzle), hdim(p.hilbert_dim), hd(0), hg(0) {}

  __device__ bool next(int& cm, int& n) {
    const int t = next_t;
    if (t >= total) return false;
    next_t += step;
    if (raster == 3) return hilbert(t, cm, n);
    if (raster == 1) {            // bands of `swz` tile-columns, each swept along M
      const int band = t / (swz * tiles_cm);
      const int first_n = band * swz;
      const int w = min(swz, tiles_n - first_n);
      const int idx = t - band * swz * tiles_cm;
      cm = idx / w;
      n = first_n + idx % w;
    } else {                      // 2: bands of `swz` tile-rows, each swept along N
      const int band = t / (swz * tiles_n);
      const int first_m = band * swz;
      const int h = min(swz, tiles_cm - first_m);
      const int idx = t - band * swz * tiles_n;
      n = idx / h;
      cm = first_m + idx % h;
    }
    return true;
  }

  // The t-th curve point that lies inside the tile grid (t only grows from call to call). The
  // 32 lanes test 32 consecutive curve points at a time.
  __device__ bool hilbert(int t, int& cm, int& n) {
    const int lane = threadIdx.x & 31;
    const int npts = hdim * hdim;
    while (hd < npts) {
      const int d = hd + lane;
      int x = 0, y = 0;
      bool in = false;
      if (d < npts) {
        hilbert_d2xy(hdim, d, x, y);
        in = x < tiles_cm && y < tiles_n;
      }
      const unsigned mask = __ballot_sync(0xffffffffu, in);
      const int cnt = __popc(mask);
      if (hg + cnt > t) {
        unsigned m = mask;
        for (int i = hg; i < t; ++i) m &= m - 1;   // drop the in-range points before t
        const int pos = __ffs(m) - 1;
        cm = __shfl_sync(0xffffffffu, x, pos);
        n = __shfl_sync(0xffffffffu, y, pos);
        hd += pos + 1;
        hg = t + 1;
        return true;
      }
      hg += cnt;
      hd += 32;
    }
    return false;
  }
};

// ---- the kernel ------------------------------------------------------------------------------
// Shared memory (base aligned to 1 KiB, the period of the 128-byte swizzle):
//   stage s at s * kStageBytes: A [BK/64][BM][64] then B, RC: [BK/64][BN][64], RR: [BN/64][BK][64]
//   (each [rows][64] block is 128-byte rows, swizzled by TMA exactly as wgmma's SWIZZLE_128B
//   descriptors read them); epilogue staging per consumer [kEpiChunks][kWgM][64] (also swizzled);
//   then full[STAGES], empty[STAGES] (mbarriers) and tile[STAGES] (the tile a stage belongs to).
#if CLUSTER_M > 1
#define CUDAL2_CLUSTER_DIMS __cluster_dims__(CLUSTER_M, 1, 1)
#else
#define CUDAL2_CLUSTER_DIMS
#endif

__global__ void __launch_bounds__(kThreads, 1) CUDAL2_CLUSTER_DIMS
wgmma_hgemm_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                   const __grid_constant__ CUtensorMap tmC, const Params p) {
#if CUDAL2_WGMMA_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  uint64_t* empty = full + STAGES;
  int2* stage_tile = reinterpret_cast<int2*>(empty + STAGES);

  const int wg = threadIdx.x / 128;        // 0: producer, 1..CONSUMERS: consumers
  const int wg_tid = threadIdx.x % 128;
  const uint32_t rank = kCM > 1 ? cluster_ctarank() : 0;   // position along M in the cluster
  const int cid = blockIdx.x / kCM;
  const int nclusters = gridDim.x / kCM;
  // split-K (CLUSTER_M 1): split z = blockIdx.y walks the k-blocks [kb_begin, kb_end) of each tile
  const int z = kCM == 1 ? (int)blockIdx.y : 0;
  const int splits = kCM == 1 ? p.splits : 1;
  const int kb_begin = (int)((long long)z * p.num_k_blocks / splits);
  const int kb_end = (int)((long long)(z + 1) * p.num_k_blocks / splits);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);                       // the producer's arrive.expect_tx (+ bytes)
      mbar_init(&empty[s], kConsumers * kCM);       // every consumer warpgroup of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // The peer CTA multicasts into this CTA's stages and arrives on its barriers: both CTAs'
  // barriers must be initialised before anyone starts.
  if constexpr (kCM > 1) cluster_barrier(); else __syncthreads();

  if (wg == 0) {
    // ================= producer: one warp issues every TMA load =================
    if constexpr (kConsumers > 1) setmaxnreg_dec<kProducerRegs>();
    if (wg_tid < 32) {
      const bool leader = wg_tid == 0;
      if (leader) { prefetch_tensormap(&tmA); prefetch_tensormap(&tmB); }
      TileSched sched(p, cid, nclusters);
      int stage = 0;
      uint32_t phase = 0;
      int cm = 0, n = 0;
      while (sched.next(cm, n)) {
        const int m0 = (cm * kCM + (int)rank) * BM;
        const int n0 = n * BN;
        for (int kb = kb_begin; kb < kb_end; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);      // fresh barrier: parity 1 passes at once
          if (leader) {
            uint8_t* sa = smem + stage * kStageBytes;
            uint8_t* sb = sa + kABytes;
            const int k0 = kb * BK;
            if (kb == kb_begin) stage_tile[stage] = make_int2(cm, n);
            mbar_arrive_expect_tx(&full[stage], kStageBytes);
#pragma unroll
            for (int c = 0; c < kKChunks; ++c)
              tma_load_2d(sa + c * BM * 128, &tmA, &full[stage], k0 + 64 * c, m0);
#if LAYOUT_RC
            // B stored N x K (K-major): [BK/64][BN][64]; this CTA loads rows
            // [rank * BN/CM, (rank+1) * BN/CM) of each chunk for the whole cluster.
            constexpr int kRows = BN / kCM;
#pragma unroll
            for (int c = 0; c < kKChunks; ++c) {
              uint8_t* dst = sb + c * BN * 128 + rank * kRows * 128;
              if constexpr (kCM > 1)
                tma_load_2d_multicast(dst, &tmB, &full[stage], k0 + 64 * c, n0 + (int)rank * kRows,
                                      (uint16_t)((1u << kCM) - 1));
              else
                tma_load_2d(dst, &tmB, &full[stage], k0 + 64 * c, n0);
            }
#else
            // B stored K x N (N-major): [BN/64][BK][64]; this CTA loads K rows
            // [rank * BK/CM, (rank+1) * BK/CM) of each 64-column chunk for the whole cluster.
            constexpr int kRows = BK / kCM;
#pragma unroll
            for (int c = 0; c < kNChunks; ++c) {
              uint8_t* dst = sb + c * BK * 128 + rank * kRows * 128;
              if constexpr (kCM > 1)
                tma_load_2d_multicast(dst, &tmB, &full[stage], n0 + 64 * c, k0 + (int)rank * kRows,
                                      (uint16_t)((1u << kCM) - 1));
              else
                tma_load_2d(dst, &tmB, &full[stage], n0 + 64 * c, k0);
            }
#endif
          }
          __syncwarp();
          if (++stage == STAGES) { stage = 0; phase ^= 1; }
        }
      }
      // End of work: the next stage carries tile (-1, -1) and no bytes.
      mbar_wait(&empty[stage], phase ^ 1);
      if (leader) {
        stage_tile[stage] = make_int2(-1, -1);
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&full[stage])) : "memory");
      }
      __syncwarp();
    }
    // split-K: the cluster barriers of the consumers' reduction count every thread of the cluster
    if constexpr (kCM == 1) {
      if (splits > 1)
        for (int c = 0; c < 2 * kRedChunks; ++c) cluster_barrier();
    }
  } else {
    // ================= consumers: wgmma on the stages, then the epilogue =================
    if constexpr (kConsumers > 1) setmaxnreg_inc<kConsumerRegs>();
    const int cw = wg - 1;                  // consumer index: rows [cw * kWgM, (cw+1) * kWgM)
    const int warp = wg_tid / 32, lane = wg_tid % 32;
    if (EPILOGUE_TMA && cw == 0 && wg_tid == 0) prefetch_tensormap(&tmC);
    float acc[kMI][kAcc];
    int stage = 0;
    uint32_t phase = 0;
    while (true) {
      mbar_wait(&full[stage], phase);
      const int2 tile = stage_tile[stage];
      if (tile.x < 0) break;
      const int m_tile = tile.x * kCM + (int)rank;
      int prev_stage = stage;
      const int nkb = kb_end - kb_begin;      // >= 1: the launcher keeps splits <= k-blocks
      for (int kb = 0; kb < nkb; ++kb) {
        if (kb > 0) mbar_wait(&full[stage], phase);
        const uint32_t sa = smem_u32(smem + stage * kStageBytes);
        const uint32_t sb = sa + kABytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
#if LAYOUT_RC
          // K-major B: 8-row groups 1024 B apart (SBO); k16 steps advance 32 B inside the atom.
          const uint64_t db = make_desc(sb + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
#else
          // N-major B (transposed): 64-column chunks BK*128 B apart (LBO), 8-k-row groups 1024 B
          // apart (SBO); a k16 step is 16 rows = 2048 B.
          const uint64_t db = make_desc(sb + kk * 16 * 128, BK * 128, 1024);
#endif
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi) {
            const uint64_t da =
                make_desc(sa + (kk / 4) * BM * 128 + (cw * kWgM + mi * 64) * 128 + (kk % 4) * 32, 16, 1024);
            wgmma_tile_n<LAYOUT_RC ? 0 : 1>(acc[mi], da, db, (kb > 0 || kk > 0) ? 1 : 0);
          }
        }
        wgmma_commit();
        // Keep one wgmma group in flight: the group of the previous stage is now complete, so
        // that stage can be handed back (to every CTA of the cluster that wrote into it).
        wgmma_wait<1>();
        if (kb > 0 && wg_tid < kCM) mbar_arrive_cta(&empty[prev_stage], wg_tid);
        prev_stage = stage;
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
      }
      wgmma_wait<0>();
      if (wg_tid < kCM) mbar_arrive_cta(&empty[prev_stage], wg_tid);
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) fence_acc(acc[mi]);

      if constexpr (kCM == 1) {
        if (splits > 1) {   // the cluster sums the splits into C (one tile per CTA: grid.x = tiles)
          cluster_reduce(acc, smem, cw, wg_tid, m_tile * BM, tile.y * BN, z, splits, p);
          continue;
        }
      }
      const int row_base = m_tile * BM + cw * kWgM;   // first row of this warpgroup's slab
      const int col_base = tile.y * BN;
#if EPILOGUE_TMA
      // stmatrix.x4 writes a 16x16 block per warp: lane l gives row (l % 8) of 8x8 matrix l / 8;
      // matrices 0..3 = rows +0/+8 of columns +0/+8, i.e. accumulators {0,1}, {2,3}, {4,5}, {6,7}
      // of a 16-column group. Rows are 128 B, 16-byte units XOR-swizzled by (row % 8) (TMA's
      // SWIZZLE_128B), so the 8 row addresses of each matrix hit 8 different bank groups.
      uint8_t* epi = smem + kEpiOffset + cw * kEpiBytesPerWg;
      const uint32_t epi_addr = smem_u32(epi);
      const int row_in = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
      const int col_in = (lane >> 4) * 8;
#pragma unroll
      for (int c0 = 0; c0 < kNChunks; c0 += kEpiChunks) {
        constexpr int kMaxCh = kEpiChunks;
        const int nch = (kNChunks - c0) < kMaxCh ? (kNChunks - c0) : kMaxCh;
        if (wg_tid == 0) bulk_wait_read_all();      // the staging buffer's last TMA store has read it
        named_barrier_sync(1 + cw, 128);
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
          for (int gg = 0; gg < 4 * kMaxCh; ++gg) {
            if (gg < 4 * nch) {
              const int g = c0 * 4 + gg;            // 16-column group of the tile
              const int r = mi * 64 + row_in;
              const int cc = gg * 16 + col_in;      // column inside this round
              const uint32_t addr = epi_addr + (cc >> 6) * (kWgM * 128) + r * 128 +
                                    ((((cc & 63) >> 3) ^ (r & 7)) << 4);
              stmatrix_x4(addr, pack_half2(acc[mi][g * 8 + 0], acc[mi][g * 8 + 1]),
                          pack_half2(acc[mi][g * 8 + 2], acc[mi][g * 8 + 3]),
                          pack_half2(acc[mi][g * 8 + 4], acc[mi][g * 8 + 5]),
                          pack_half2(acc[mi][g * 8 + 6], acc[mi][g * 8 + 7]));
            }
          }
        }
        fence_proxy_async_smem();
        named_barrier_sync(1 + cw, 128);
        if (wg_tid == 0) {
          for (int ch = 0; ch < nch; ++ch)
            tma_store_2d(&tmC, epi + ch * (kWgM * 128), col_base + (c0 + ch) * 64, row_base);
          bulk_commit();
        }
      }
#else
      // Accumulator layout (m64nNk16, f32): thread (warp w, lane l) holds, for each 8-column
      // block j, columns 8j + 2(l%4) + {0,1} of rows 16w + l/4 (acc 4j+0, 4j+1) and
      // 16w + l/4 + 8 (acc 4j+2, 4j+3).
      const int r0 = row_base + warp * 16 + (lane >> 2);
      const int c_0 = col_base + 2 * (lane & 3);
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + mi * 64 + h * 8;
          if (r < p.M) {
            __half* row = p.C + (size_t)r * (size_t)p.ldc;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              const int c = c_0 + 8 * j;
              const float v0 = acc[mi][4 * j + 2 * h], v1 = acc[mi][4 * j + 2 * h + 1];
              if (p.c_vec2 && c + 1 < p.N) {
                *reinterpret_cast<__half2*>(row + c) = __floats2half2_rn(v0, v1);
              } else {
                if (c < p.N) row[c] = __float2half_rn(v0);
                if (c + 1 < p.N) row[c + 1] = __float2half_rn(v1);
              }
            }
          }
        }
      }
#endif
    }
#if EPILOGUE_TMA
    if (wg_tid == 0) bulk_wait_all();
#endif
  }
  // Neither CTA of a cluster may leave while the other can still arrive on its barriers.
  if constexpr (kCM > 1) cluster_barrier();
#elif defined(__CUDA_ARCH__)
  __trap();   // no wgmma/setmaxnreg on this target: fail the launch, never return an unwritten C
#endif  // CUDAL2_WGMMA_DEVICE
}

// K == 0: the product of empty sums is C = 0.
__global__ void __launch_bounds__(256) zero_kernel(__half* __restrict__ C, int M, int N, int ldc) {
  const size_t total = (size_t)M * (size_t)N;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t m = i / (size_t)N, n = i % (size_t)N;
    C[m * (size_t)ldc + n] = __float2half_rn(0.f);
  }
}

// ---- host side -------------------------------------------------------------------------------
// cuTensorMapEncodeTiled from the driver, looked up once (no -lcuda: the runtime hands it out).
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn(cudaError_t* err) {
  static std::atomic<void*> cached{nullptr};
  void* fn = cached.load(std::memory_order_acquire);
  if (fn != nullptr) return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                         cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    *err = e != cudaSuccess ? e : cudaErrorNotSupported;
    return nullptr;
  }
  cached.store(fn, std::memory_order_release);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A 2-D fp16 tensor map: `inner` contiguous elements per line, `outer` lines `ld` elements
// apart; box = box_inner x box_outer elements, 128-byte swizzle, zero fill out of bounds.
static bool encode_2d(PFN_cuTensorMapEncodeTiled_v12000 fn, CUtensorMap* map, const void* base,
                      uint64_t inner, uint64_t outer, uint64_t ld, uint32_t box_inner, uint32_t box_outer) {
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {ld * 2};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(base), dims, strides, box,
            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Per device, looked up once: SM count, co-resident clusters, the shared-memory opt-in.
struct DeviceInfo {
  std::atomic<int> sms{0};
  std::atomic<int> max_ctas{0};   // CTAs that can be resident at once (whole clusters)
};
static DeviceInfo g_devices[64];

static cudaError_t device_info(int dev, int* sms, int* max_ctas) {
  DeviceInfo* info = (dev >= 0 && dev < 64) ? &g_devices[dev] : nullptr;
  if (info != nullptr) {
    const int s = info->sms.load(std::memory_order_acquire);
    const int c = info->max_ctas.load(std::memory_order_acquire);
    if (s > 0 && c > 0) { *sms = s; *max_ctas = c; return cudaSuccess; }
  }
  cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(&wgmma_hgemm_kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  int s = 0;
  err = cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  int c = s - s % kCM;
  if (kCM > 1) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCM;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(s - s % kCM));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(&wgmma_hgemm_kernel),
                                       &cfg) == cudaSuccess && clusters > 0) {
      if (clusters * kCM < c) c = clusters * kCM;
    } else {
      (void)cudaGetLastError();   // not fatal: fall back to the SM count; clear the error
    }
  }
  if (c < kCM) c = kCM;
  if (info != nullptr) {
    info->sms.store(s, std::memory_order_release);
    info->max_ctas.store(c, std::memory_order_release);
  }
  *sms = s;
  *max_ctas = c;
  return cudaSuccess;
}

template <size_t N>
static bool listed(int v, const int (&values)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (values[i] == v) return true;
  return false;
}

// raster 0 (heuristic): bands of `swizzle` tile rows swept along N (raster 2). On an H100 this
// was the best or within noise of the best order at 4096^3 and 8192^3 for 128x256 tiles; the
// Hilbert curve measured 1-2% slower there (docs/wgmma.md). Raster 3 on a grid whose curve
// would be longer than 4096 x 4096 points falls back to raster 2 as well.
static int resolve_raster(int raster, int hdim) {
  if (raster == 3 && hdim <= 4096) return 3;
  return raster == 1 ? 1 : 2;
}

// The split count of a call (splits option `asked`; 0: the launcher's choice): with one CTA per
// SM, the fewest (waves x k-blocks per split) over 1..8 splits, ties to fewer; never more splits
// than k-blocks. cudal2/templates/wgmma.py's wgmma_splits replays it for the cost model.
static int plan_splits(int asked, long long tiles, int num_k_blocks, int sms) {
  if (kCM > 1) return 1;
  int s = asked;
  if (asked == 0) {
    long long best = 0;
    for (int c = 1; c <= cudal2_splitk::kClusterMax; ++c) {
      const long long cost = ((tiles * c + sms - 1) / sms) * ((num_k_blocks + c - 1) / c);
      if (c == 1 || cost < best) { best = cost; s = c; }
    }
  }
  if (s > num_k_blocks) s = num_k_blocks;
  return s < 1 ? 1 : s;
}

// Whether a cluster of `splits` CTAs of this kernel can be resident (splitk_fixup.cuh; the
// shared-memory opt-in is made by device_info first).
static bool cluster_resident(int splits) {
  static std::atomic<int> cached[64][cudal2_splitk::kClusterMax + 1];
  return cudal2_splitk::cluster_resident(cached, reinterpret_cast<const void*>(&wgmma_hgemm_kernel),
                                         kThreads, kSmemBytes, splits);
}

static const char* arch_name() {
#if !defined(__CUDA_ARCH_LIST__)
  return "unknown";
#elif __CUDA_ARCH_LIST__ == 900
  return "sm_90a";
#else
  return "sm_unknown";
#endif
}

#define CUDAL2_STR2(x) #x
#define CUDAL2_STR(x) CUDAL2_STR2(x)

static const char* build_meta() {
  static char buf[2048];
  const bool n_div8 = !LAYOUT_RC || EPILOGUE_TMA;   // ldb (RR) or ldc (TMA store) is N
  snprintf(buf, sizeof(buf),
           "{\"style\": \"wgmma\", \"family\": \"wgmma\", \"abi\": 2, \"arch\": \"%s\", "
           "\"acc\": \"f32\", \"layout\": \"%s\", \"tile\": [%d, %d, %d], \"any_shape\": true, "
           "\"divisible\": [1, %d, 8], "
           "\"alignment\": {\"elements\": 8, \"ptr_align_bytes\": 16, \"ld_multiple\": 8}, "
           "\"workspace_bytes\": 0, \"workspace_per_mn\": 0, "
           "\"options\": [{\"name\": \"raster\", \"values\": [0, 1, 2, 3], \"default\": %d}, "
           "{\"name\": \"swizzle\", \"values\": [1, 2, 4, 8, 16], \"default\": %d}, "
           "{\"name\": \"sm_count\", \"values\": [0, 64, 96, 114, 120, 128, 130, 132], \"default\": %d}, "
           "{\"name\": \"splits\", \"values\": " CUDAL2_SPLITS_JSON ", \"default\": %d}], "
           "\"cluster_splitk_max\": %d, "
           "\"warps\": %d, \"threads\": %d, \"stages\": %d, \"smem_bytes\": %d, "
           "\"cluster\": [%d, 1, 1], \"consumers\": %d, \"epilogue\": \"%s\", \"epilogue_chunks\": %d, "
           "\"registers\": {\"producer\": %d, \"consumer\": %d}, "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"STAGES\": %d, \"CONSUMERS\": %d, "
           "\"CLUSTER_M\": %d, \"EPILOGUE\": \"%s\", \"ACC\": \"f32\", \"LAYOUT\": \"%s\"}}",
           arch_name(), LAYOUT_RC ? "RC" : "RR", BM, BN, BK, n_div8 ? 8 : 1, kDefaultRaster,
           kDefaultSwizzle, kDefaultSmCount, kDefaultSplits, kCM == 1 ? cudal2_splitk::kClusterMax : 0,
           kThreads / 32, kThreads, STAGES, kSmemBytes, kCM,
           kConsumers, EPILOGUE_TMA ? "tma" : "direct", EPILOGUE_TMA ? kEpiChunks : 0, kProducerRegs, kConsumerRegs, BM, BN, BK,
           STAGES, kConsumers, kCM, EPILOGUE_TMA ? "tma" : "direct", LAYOUT_RC ? "RC" : "RR");
  return buf;
}

// Tensor maps of the last call on this thread: a benchmark loop over the same operands encodes
// them once.
struct MapCache {
  const void* a; const void* b; const void* c;
  int M, N, K, lda, ldb, ldc;
  bool valid;
  CUtensorMap ma, mb, mc;
};

}  // namespace cudal2_wgmma_impl

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  (void)M; (void)N; (void)K; (void)options;
  return 0;
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes, void* stream,
                            const int* options) {
  using namespace cudal2_wgmma_impl;
  (void)workspace; (void)workspace_bytes;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  int raster = kDefaultRaster, swz = kDefaultSwizzle, sm_count = kDefaultSmCount, asked = kDefaultSplits;
  if (options != nullptr) {
    raster = options[kOptRaster];
    swz = options[kOptSwizzle];
    sm_count = options[kOptSmCount];
    asked = options[kOptSplits];
  }
  if (!listed(raster, kRasterValues) || !listed(swz, kSwizzleValues) || !listed(sm_count, kSmCountValues) ||
      !listed(asked, kSplitsValues))
    return cudaErrorInvalidValue;
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N) return cudaErrorInvalidValue;
  __half* c = reinterpret_cast<__half*>(C);
  if (reinterpret_cast<uintptr_t>(C) % 2 != 0) return cudaErrorInvalidValue;
  if (K == 0) {
    void* args[] = {&c, &M, &N, &ldc};
    size_t blocks = ((size_t)M * (size_t)N + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return cudaLaunchKernel(reinterpret_cast<const void*>(&zero_kernel), dim3((unsigned)blocks),
                            dim3(256), args, 0, s);
  }
  if (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N)) return cudaErrorInvalidValue;
  // TMA: 16-byte aligned bases, leading dimensions in multiples of 16 bytes.
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0 || lda % 8 != 0 ||
      ldb % 8 != 0)
    return cudaErrorInvalidValue;
  if (EPILOGUE_TMA && (reinterpret_cast<uintptr_t>(C) % 16 != 0 || ldc % 8 != 0)) return cudaErrorInvalidValue;

  const long long tiles_m = (M + (long long)BM - 1) / BM;
  const long long tiles_cm = (tiles_m + kCM - 1) / kCM;
  const long long tiles_n = (N + (long long)BN - 1) / BN;
  if (tiles_cm * tiles_n > 0x3fffffffLL) return cudaErrorInvalidValue;
  int hdim = 1;
  while (hdim < tiles_cm || hdim < tiles_n) hdim *= 2;

  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int sms = 0, max_ctas = 0;
  err = device_info(dev, &sms, &max_ctas);
  if (err != cudaSuccess) return err;

  static thread_local MapCache cache = {};
  if (!(cache.valid && cache.a == A && cache.b == B && cache.c == C && cache.M == M && cache.N == N &&
        cache.K == K && cache.lda == lda && cache.ldb == ldb && cache.ldc == ldc)) {
    cache.valid = false;
    PFN_cuTensorMapEncodeTiled_v12000 fn = encode_tiled_fn(&err);
    if (fn == nullptr) return err;
    bool ok = encode_2d(fn, &cache.ma, A, (uint64_t)K, (uint64_t)M, (uint64_t)lda, 64, BM);
#if LAYOUT_RC
    ok = ok && encode_2d(fn, &cache.mb, B, (uint64_t)K, (uint64_t)N, (uint64_t)ldb, 64, BN / kCM);
#else
    ok = ok && encode_2d(fn, &cache.mb, B, (uint64_t)N, (uint64_t)K, (uint64_t)ldb, 64, BK / kCM);
#endif
    if (EPILOGUE_TMA)
      ok = ok && encode_2d(fn, &cache.mc, C, (uint64_t)N, (uint64_t)M, (uint64_t)ldc, 64, kWgM);
    else
      memset(&cache.mc, 0, sizeof(cache.mc));
    if (!ok) return cudaErrorInvalidValue;
    cache.a = A; cache.b = B; cache.c = C;
    cache.M = M; cache.N = N; cache.K = K; cache.lda = lda; cache.ldb = ldb; cache.ldc = ldc;
    cache.valid = true;
  }

  Params p;
  p.M = M; p.N = N; p.K = K;
  p.num_k_blocks = (K + BK - 1) / BK;
  p.tiles_cm = (int)tiles_cm;
  p.tiles_n = (int)tiles_n;
  p.total = (int)(tiles_cm * tiles_n);
  p.raster = resolve_raster(raster, hdim);
  p.swizzle = swz;
  p.hilbert_dim = hdim;
  p.C = c;
  p.ldc = ldc;
  p.c_vec2 = (reinterpret_cast<uintptr_t>(C) % 4 == 0) && (ldc % 2 == 0);
  p.splits = plan_splits(asked, p.total, p.num_k_blocks, sms);
  while (p.splits > 1 && !cluster_resident(p.splits)) --p.splits;

  void* args[] = {&cache.ma, &cache.mb, &cache.mc, &p};
  if (p.splits > 1) {   // one CTA per (tile, split), each tile's splits one cluster
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = (unsigned)p.splits;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)p.total, (unsigned)p.splits, 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(&wgmma_hgemm_kernel), args);
  }

  int ctas = sm_count == 0 ? sms : (sm_count < sms ? sm_count : sms);
  if (ctas > max_ctas) ctas = max_ctas;
  ctas -= ctas % kCM;
  if (ctas < kCM) ctas = kCM;
  if ((long long)ctas > (long long)p.total * kCM) ctas = p.total * kCM;
  return cudaLaunchKernel(reinterpret_cast<const void*>(&wgmma_hgemm_kernel), dim3((unsigned)ctas),
                          dim3(kThreads), args, kSmemBytes, s);
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_wgmma_impl::build_meta();   // thread-safe one-time init
  return meta;
}
