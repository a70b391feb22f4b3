// cudal2 reference kernel families "lowlat" (BM 64/128, wgmma) and "lowlat_mma" (BM 16/32,
// mma.sync): a low-latency HGEMM for launch-bound shapes.
//
//   C[M,N] (fp16, row-major, ldc) = A[M,K] (fp16, row-major, lda) @ B, fp32 accumulation
//   B is K x N row-major (ldb >= N) when LAYOUT_RC == 0 ("RR"),
//        N x K row-major, i.e. K x N column-major (ldb >= K), when LAYOUT_RC == 1 ("RC").
//
// What a call costs beyond the math is what this family is cut for (shapes of a few tiles):
//   * one output tile per CTA, a plain grid: no cluster, no persistent scheduler, no tile-order
//     options. The grid is (N tiles, M tiles, the K split), in raster order (N fastest:
//     consecutive CTAs share A's row band), so a CTA finds its tile without a division; past
//     65535 M tiles (grid.y's limit) the tiles run along grid.x instead, folded onto grid.y past
//     2^31 - 1 tiles (a C no device can hold, but the meta claims every M and N);
//   * the fewest instructions before the first load: parameters by value, and each thread's
//     copy addresses worked out once, a constant row step per further copy (load_tile);
//   * no tensor maps: every thread loads 16-byte chunks with cp.async (zero-filled outside the
//     matrix), so the host encodes nothing per call: it checks the arguments, computes the grid
//     and calls cudaLaunchKernel once (the > 48 KiB shared-memory opt-in is made once per device,
//     and made again if a launch finds it gone: a cudaDeviceReset drops it);
//   * a STAGES-deep cp.async pipeline: 2-4 stages for a launch-bound shape (the prologue loads
//     what the tile needs), 6 or 8 to keep a decode row's weight in flight (issue 50's budget:
//     7 stages of a 128-column B tile are 112 KiB per CTA, over the 99 KiB an H200 SM needs);
//   * BM >= 64 (sm_90a): one warpgroup per 64 rows issues wgmma.mma_async m64nBNk16 from shared
//     memory written by cp.async in the 128-byte-swizzled layout wgmma's SWIZZLE_128B descriptors
//     read (the layout TMA writes in wgmma_hgemm.cuh: 16-byte unit u of row r stored at unit
//     u ^ (r % 8), 128-byte rows, base aligned to 1 KiB); BK = 64 (one swizzle atom);
//   * BM < 64 (sm_80 and later): BN/32 warps, each a BM x 32 warp tile of mma.sync m16n8k16 fed by
//     ldmatrix from padded shared memory (rows padded by 16 bytes, as mma_hgemm.cuh);
//   * register epilogue: a quad shuffle gathers 8 consecutive columns per lane and each lane
//     writes 16 bytes; 2-byte stores at the residue edge or when C is not 16-byte aligned.
//
// Deep K (few tiles, many k-tiles: 128x64x12288 is 192 serial k-tiles on one or two CTAs): the
// K range splits across CTAs in the same launch (runtime option "splits"; blockIdx.z = split
// index, each split a contiguous range of whole BK k-tiles, none empty). Each split stores its
// fp32 partial tile into the caller's workspace and counts itself in at the tile's semaphore
// (splitk_fixup.cuh); the last to arrive sums the partials IN SPLIT-INDEX ORDER (bit-identical
// run to run), each thread the elements of its own accumulator fragment with every load of one
// split in flight, writes zeros back over them, resets the semaphore, and stores C through the
// same 16-byte epilogue. The workspace is left all zero (meta "workspace_zero_init": true). One
// launch, no memset. splits == 1 runs lowlat_kernel, the kernel without any of this (no
// workspace, no semaphore); splits > 1 runs lowlat_splitk_kernel.
//
// Option "splits": 0 = the launcher's choice (plan_splits: enough CTAs to fill the SMs, at
// most one CTA per SM; no more splits than balance the partial tiles the last CTA reads against
// the k-tiles a split streams; at least kMinKTiles k-tiles per split), 1 = no split, 2..64 = that
// many (at most one per k-tile). cudal2/templates/lowlat.py's lowlat_splits replays the choice.
//
// Divisibility (the meta's "divisible"): K % 8 == 0, and N % 8 == 0 for RR (the 16-byte loads
// need lda and ldb multiples of 8 elements and 16-byte aligned bases). The launcher refuses
// anything else with cudaErrorInvalidValue before any CUDA call, as it does an unlisted option
// and a split call without a 16-byte aligned workspace of cudal2_workspace's bytes.
//
// A build for a target without the wgmma feature (a generic compute_90 or a later arch) cannot
// run the BM >= 64 kernels: their bodies are compiled to a trap, so such a launch fails loudly.
//
// Exports ABI 2 (docs/abi.md): cudal2_hgemm (with options), cudal2_workspace, cudal2_meta.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <atomic>

#include "splitk_fixup.cuh"
#include "wgmma_ptx.cuh"

#ifndef BM
#define BM 64           // tile rows: 16 or 32 (mma.sync), 64 or 128 (wgmma, sm_90a)
#endif
#ifndef BN
#define BN 128          // tile columns: 64 or 128
#endif
#ifndef BK
#define BK 64           // K depth of one stage (64: one 128-byte swizzle atom)
#endif
#ifndef STAGES
#define STAGES 3        // cp.async pipeline depth (2..8)
#endif
#ifndef ACC_F16
#define ACC_F16 0       // fp32 accumulation only
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0     // 0: B row-major K x N ("RR"), 1: B column-major, stored N x K ("RC")
#endif

#define CUDAL2_LL_WGMMA (BM >= 64)

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 800)
#error "cudal2 lowlat HGEMM needs sm_80 or later"
#endif
#if CUDAL2_LL_WGMMA && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "cudal2 lowlat with BM >= 64 issues wgmma: build it for sm_90a"
#endif
// wgmma is sm_90a only: a device pass without the feature (generic compute_90, a later arch)
// compiles the kernel bodies to a trap (CUDAL2_LL_TRAP).
#if defined(__CUDA_ARCH__) && (!CUDAL2_LL_WGMMA || defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define CUDAL2_LL_DEVICE 1
#else
#define CUDAL2_LL_DEVICE 0
#endif
#if defined(__CUDA_ARCH__) && !CUDAL2_LL_DEVICE
#define CUDAL2_LL_TRAP 1
#else
#define CUDAL2_LL_TRAP 0
#endif

#define CUDAL2_STR2(x) #x
#define CUDAL2_STR(x) CUDAL2_STR2(x)

namespace cudal2_lowlat_impl {

using namespace cudal2_wgmma_ptx;   // smem_u32, pack_half2, make_desc, the wgmma wrappers (wgmma_ptx.cuh)

static_assert(ACC_F16 == 0, "the lowlat family implements fp32 accumulation only");
static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM must be 16, 32, 64 or 128");
static_assert(BN == 64 || BN == 128, "BN must be 64 or 128");
static_assert(BK == 64, "BK must be 64");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES must be 2..8 (cp.async.wait_group takes 0..7)");
static_assert(SPLITK_DETERMINISTIC, "lowlat reduces its splits in split-index order (one slab per split)");

#if CUDAL2_LL_WGMMA
constexpr int kThreads = 128 * (BM / 64);      // one warpgroup per 64 rows
constexpr int kAStage = BM * BK;               // halfs: [BM][64], 128-byte swizzled rows
constexpr int kBStage = BN * BK;               // RC: [BN][64]; RR: [BN/64][BK][64]
constexpr int kAlign = 1024;                   // the 128-byte swizzle repeats every 1 KiB
#else
constexpr int kWN = 32;                        // warp tile columns
constexpr int kThreads = (BN / kWN) * 32;
constexpr int kMI = BM / 16, kNI = kWN / 8;
constexpr int kPad = 8;                        // halfs of row padding (16 bytes)
constexpr int kAStride = BK + kPad;
#if LAYOUT_RC
constexpr int kBRows = BN, kBCols = BK;
#else
constexpr int kBRows = BK, kBCols = BN;
#endif
constexpr int kBStride = kBCols + kPad;
constexpr int kAStage = BM * kAStride;
constexpr int kBStage = kBRows * kBStride;
constexpr int kAlign = 16;
#endif
constexpr size_t kSmemBytes = (size_t)STAGES * (kAStage + kBStage) * sizeof(half) + (kAlign > 16 ? kAlign : 0);

// ---- K split (runtime option "splits") ---------------------------------------------------------
constexpr int kMaxSplits = 64;
constexpr int kSplitValues[] = {0, 1, 2, 4, 8, 16, 32, 64};   // 0: plan_splits chooses
constexpr int kMinKTiles = 4;                                 // the chosen splits: >= 4 k-tiles each
constexpr long long kPartialBytes = (long long)BM * BN * 4;   // one split's fp32 partial tile
constexpr long long kKTileBytes = (long long)(BM + BN) * BK * 2;   // one k-tile of A and B
constexpr long long kMaxGridX = 2147483647LL, kMaxGridY = 65535;

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Copies a ROWS x 8*CHUNKS tile (contiguous along the chunks) from global (r0, c0), rows at
// >= row_lim or columns >= col_lim zero-filled. col_lim - c0 is a multiple of 8 (K % 8 == 0,
// N % 8 == 0 for RR): a chunk is all in or all out. dst(r, u) gives the smem byte address. The
// limits are compared as offsets from (r0, c0): no int overflow next to INT_MAX.
// kThreads is a multiple of CHUNKS, so a thread keeps one chunk column u and steps kRowStep rows
// per copy: its divisions and its address are worked out once (unsigned, no sign fix-ups), and
// each further copy adds a constant row step (the fewest instructions before the first load).
template <int ROWS, int CHUNKS, class Dst>
__device__ __forceinline__ void load_tile(const half* g, int ld, int r0, int row_lim, int c0,
                                          int col_lim, Dst dst) {
  static_assert(kThreads % CHUNKS == 0, "a thread's copies share one chunk column");
  constexpr int kRowStep = kThreads / CHUNKS;
  const unsigned tid = threadIdx.x;
  const int rt = (int)(tid / CHUNKS), u = (int)(tid % CHUNKS);
  const int rows = row_lim - r0;
  const bool col_ok = u * 8 < col_lim - c0;
  const half* src0 = g + ((size_t)r0 + rt) * (size_t)ld + ((size_t)c0 + u * 8);
  const size_t step = (size_t)kRowStep * (size_t)ld;
#pragma unroll
  for (int i = 0; i < (ROWS + kRowStep - 1) / kRowStep; ++i) {
    const int r = rt + i * kRowStep;
    if (ROWS % kRowStep == 0 || r < ROWS) {
      const bool ok = col_ok && r < rows;
      cp_async_16(dst(r, u), ok ? src0 + i * step : g, ok ? 16 : 0);
    }
  }
}

// Epilogue helper: a quad (lanes 4q..4q+3) holds, for 4 consecutive 8-column blocks j0..j0+3,
// columns 2t, 2t+1 of each block in lane t (packed half2 v[j]). After the transpose lane t holds
// the 8 columns of block j0+t (w[0..3] = columns 0-1, 2-3, 4-5, 6-7): one 16-byte store.
__device__ __forceinline__ uint32_t pick4(const uint32_t (&v)[4], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
}
__device__ __forceinline__ void quad_transpose(const uint32_t (&v)[4], uint32_t (&w)[4], int t) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // lane s sends v[(s + r) % 4]; lane t receives from lane (t - r) % 4 the value for block t
    const uint32_t got = __shfl_sync(0xffffffffu, pick4(v, (t + r) & 3), ((t - r) & 3) | (threadIdx.x & 28));
    const int from = (t - r) & 3;
    if (from == 0) w[0] = got;
    if (from == 1) w[1] = got;
    if (from == 2) w[2] = got;
    if (from == 3) w[3] = got;
  }
}

// Stores the 8 columns [c, c+8) of row r of the tile whose top-left element Ct points at (lane's
// share after quad_transpose); rows, cols: what is left of C from the tile's corner.
__device__ __forceinline__ void store8(half* Ct, int ldc, int rows, int cols, int r, int c,
                                       const uint32_t (&w)[4], bool vec16) {
  if (r >= rows || c >= cols) return;
  half* p = Ct + (size_t)r * (size_t)ldc + c;
  if (vec16 && c + 8 <= cols) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (c + e < cols) {
        const uint32_t word = w[e / 2];
        const unsigned short bits = (unsigned short)((e & 1) ? (word >> 16) : (word & 0xFFFFu));
        p[e] = __ushort_as_half(bits);
      }
    }
  }
}

// The CTA's output tile, in raster order (N fastest: consecutive CTAs share A's row band), and
// t, its index tm * tiles_n + tn (its semaphore). Up to 65535 M tiles the grid is (tiles_n,
// tiles_m): the tile is (blockIdx.y, blockIdx.x), no division. Past that the tiles run along
// grid.x, folded onto grid.y past 2^31 - 1 tiles, where the tail of the last grid row has no
// tile (false); gridDim.x is then never tiles_n (the launcher's rule).
__device__ __forceinline__ bool cta_tile(int M, int N, int& m0, int& n0, long long& t) {
  const int tiles_n = (N - 1) / BN + 1;
  if (gridDim.x == (unsigned)tiles_n) {
    m0 = (int)blockIdx.y * BM;
    n0 = (int)blockIdx.x * BN;
    t = (long long)blockIdx.y * tiles_n + blockIdx.x;
    return true;
  }
  t = (long long)blockIdx.y * gridDim.x + blockIdx.x;
  const long long tm = t / tiles_n;
  if (tm >= (long long)((M - 1) / BM + 1)) return false;
  m0 = (int)tm * BM;
  n0 = (int)(t - tm * tiles_n) * BN;
  return true;
}

// The split-K fixup of one CTA of a split call (splitk_fixup.cuh's protocol). acc: this
// thread's E accumulators; element e is at tile row base_r + off_r(e), column base_c + off_c(e).
// Stores the partial of split z, arrives at tile t's semaphore; false in every CTA but the last.
// The last CTA leaves in acc the sum of the splits' partials in split-index order (from 0.f, as
// reduce_element sums), each thread reading the elements it holds, every load of
// kU splits in flight (64 registers), zeros written back; its semaphore reset.
template <int E, class Off>
__device__ __forceinline__ bool split_fixup(float (&acc)[E], void* ws, int splits, int z,
                                            long long t, int M, int N, int m0, int n0, int base_r,
                                            int base_c, Off off) {
  float* const part = cudal2_splitk::partials(ws);
  const int rows = M - m0, cols = N - n0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int r = base_r + off(e, 0), c = base_c + off(e, 1);
    if (r < rows && c < cols) cudal2_splitk::store_partial(part, z, m0 + r, n0 + c, M, N, acc[e]);
  }
  unsigned int* sem = cudal2_splitk::semaphores(ws, splits, M, N) + t;
  if (!cudal2_splitk::arrive(sem, splits)) return false;
  constexpr int kU = E >= 64 ? 1 : 64 / E;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int z0 = 0; z0 < splits; z0 += kU) {
    float v[kU][E];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int r = base_r + off(e, 0), c = base_c + off(e, 1);
        v[u][e] = (z0 + u < splits && r < rows && c < cols)
                      ? cudal2_splitk::load_partial(
                            part + cudal2_splitk::partial_index(z0 + u, m0 + r, n0 + c, M, N))
                      : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (z0 + u < splits) {
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += v[u][e];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int r = base_r + off(e, 0), c = base_c + off(e, 1);
        if (z0 + u < splits && r < rows && c < cols)
          cudal2_splitk::store_partial(part, z0 + u, m0 + r, n0 + c, M, N, 0.f);
      }
    }
  }
  cudal2_splitk::release_tile(sem);
  return true;
}

#if CUDAL2_LL_WGMMA
// ---- wgmma path ------------------------------------------------------------------------------
// m64nBNk16 f32 += f16 * f16 from shared memory (wgmma_ptx.cuh), scale-d = 1 throughout: the
// accumulators start at 0. TRANS_B = 1: B is N-major in shared memory ("RR").
template <int TRANS_B>
__device__ __forceinline__ void wgmma_tile_n(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (BN == 128) wgmma_m64n128<TRANS_B>(d, desc_a, desc_b, 1);
  else wgmma_m64n64<TRANS_B>(d, desc_a, desc_b, 1);
}

// Byte offset of 16-byte unit u of row r in a [rows][64] block of 128-byte swizzled rows.
__device__ __forceinline__ uint32_t swz(int r, int u) { return (uint32_t)(r * 128 + ((u ^ (r & 7)) << 4)); }

// One CTA: the tile cta_tile names, k-tiles [kt0, kt0 + k_tiles) of it; SPLIT: split z of
// `splits` (blockIdx.z of gridDim.z), reduced through the workspace.
template <bool SPLIT>
__device__ __forceinline__ void lowlat_body(const half* __restrict__ A, const half* __restrict__ B,
                                            half* __restrict__ C, int M, int N, int K, int lda,
                                            int ldb, int ldc, int vec16, void* ws, int kt_per) {
#if CUDAL2_LL_DEVICE
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int m0, n0;
  long long tile;
  if (!cta_tile(M, N, m0, n0, tile)) return;
  const uint32_t base = (smem_u32(smem_raw) + (kAlign - 1)) & ~(uint32_t)(kAlign - 1);
  const uint32_t sA0 = base, sB0 = base + STAGES * kAStage * 2;
  const int all_k_tiles = (K - 1) / BK + 1;
  const int z = SPLIT ? (int)blockIdx.z : 0;
  const int kt0 = SPLIT ? z * kt_per : 0;
  const int k_tiles = SPLIT ? min(kt_per, all_k_tiles - kt0) : all_k_tiles;
  const int wg = threadIdx.x / 128, wg_tid = threadIdx.x % 128;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = (kt0 + kt) * BK;
    const uint32_t sa = sA0 + stage * kAStage * 2, sb = sB0 + stage * kBStage * 2;
    load_tile<BM, 8>(A, lda, m0, M, k0, K, [&](int r, int u) { return sa + swz(r, u); });
#if LAYOUT_RC
    load_tile<BN, 8>(B, ldb, n0, N, k0, K, [&](int r, int u) { return sb + swz(r, u); });
#else
    // row r = k of the tile, unit u = 8 columns: 64-column chunk u / 8 is its own [BK][64] block
    load_tile<BK, BN / 8>(B, ldb, k0, K, n0, N,
                          [&](int r, int u) { return sb + (u >> 3) * (BK * 128) + swz(r, u & 7); });
#endif
  };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    fence_proxy_async_smem();   // this thread's cp.async bytes -> visible to wgmma (async proxy)
    __syncthreads();            // every thread's bytes of stage kt in; stage kt-1 fully read
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();
    const int stage = kt % STAGES;
    const uint32_t sa = sA0 + stage * kAStage * 2 + wg * 64 * 128, sb = sB0 + stage * kBStage * 2;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint64_t da = make_desc(sa + kk * 32, 16, 1024);
#if LAYOUT_RC
      const uint64_t db = make_desc(sb + kk * 32, 16, 1024);             // K-major B
#else
      const uint64_t db = make_desc(sb + kk * 16 * 128, BK * 128, 1024);  // N-major B
#endif
      wgmma_tile_n<LAYOUT_RC ? 0 : 1>(acc, da, db);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(acc);
  }
  cp_async_wait<0>();

  // Accumulators (m64nN f32): warp w, lane l holds for 8-column block j columns 8j + 2(l%4) +
  // {0,1} of rows 16w + l/4 (acc 4j, 4j+1) and 16w + l/4 + 8 (acc 4j+2, 4j+3).
  const int warp = wg_tid / 32, lane = wg_tid % 32, t = lane & 3;
  const int r0 = wg * 64 + warp * 16 + (lane >> 2);   // tile-local row
  if constexpr (SPLIT) {
    auto off = [](int e, int col) { return col ? 8 * (e >> 2) + (e & 1) : 8 * ((e >> 1) & 1); };
    if (!split_fixup(acc, ws, (int)gridDim.z, z, tile, M, N, m0, n0, r0, 2 * t, off)) return;
  }
  half* Ct = C + (size_t)m0 * (size_t)ldc + n0;
  const int rows = M - m0, cols = N - n0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += 4) {
      uint32_t v[4], w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = pack_half2(acc[4 * (j0 + q) + 2 * h], acc[4 * (j0 + q) + 2 * h + 1]);
      quad_transpose(v, w, t);
      store8(Ct, ldc, rows, cols, r0 + 8 * h, (j0 + t) * 8, w, vec16 != 0);
    }
  }
#elif CUDAL2_LL_TRAP
  __trap();   // no wgmma on this target: fail the launch, never return an unwritten C
#endif  // CUDAL2_LL_DEVICE
}

#define CUDAL2_LL_BOUNDS __launch_bounds__(kThreads, 1)
#define CUDAL2_LL_SPLIT_BOUNDS __launch_bounds__(kThreads, 1)

#else
// ---- mma.sync path -----------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool SPLIT>
__device__ __forceinline__ void lowlat_body(const half* __restrict__ A, const half* __restrict__ B,
                                            half* __restrict__ C, int M, int N, int K, int lda,
                                            int ldb, int ldc, int vec16, void* ws, int kt_per) {
#if CUDAL2_LL_DEVICE
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int m0, n0;
  long long tile;
  if (!cta_tile(M, N, m0, n0, tile)) return;
  const uint32_t sA0 = smem_u32(smem_raw), sB0 = sA0 + STAGES * kAStage * 2;
  const int all_k_tiles = (K - 1) / BK + 1;
  const int z = SPLIT ? (int)blockIdx.z : 0;
  const int kt0 = SPLIT ? z * kt_per : 0;
  const int k_tiles = SPLIT ? min(kt_per, all_k_tiles - kt0) : all_k_tiles;
  const int lane = threadIdx.x & 31, wn = threadIdx.x >> 5;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = (kt0 + kt) * BK;
    const uint32_t sa = sA0 + stage * kAStage * 2, sb = sB0 + stage * kBStage * 2;
    load_tile<BM, BK / 8>(A, lda, m0, M, k0, K, [&](int r, int u) { return sa + (r * kAStride + u * 8) * 2; });
#if LAYOUT_RC
    load_tile<BN, BK / 8>(B, ldb, n0, N, k0, K, [&](int r, int u) { return sb + (r * kBStride + u * 8) * 2; });
#else
    load_tile<BK, BN / 8>(B, ldb, k0, K, n0, N, [&](int r, int u) { return sb + (r * kBStride + u * 8) * 2; });
#endif
  };

  float acc[kMI][kNI][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  // Per-lane ldmatrix byte offsets inside one stage (the mapping of mma_hgemm.cuh).
  const uint32_t a_lane = ((lane & 15) * kAStride + (lane >> 4) * 8) * 2;
#if LAYOUT_RC
  const uint32_t b_lane = ((wn * kWN + (lane & 7) + (lane >> 4) * 8) * kBStride + ((lane >> 3) & 1) * 8) * 2;
  constexpr uint32_t kBPairStep = 16 * kBStride * 2, kBKStep = 16 * 2;
#else
  const uint32_t b_lane = (((lane & 7) + ((lane >> 3) & 1) * 8) * kBStride + wn * kWN + (lane >> 4) * 8) * 2;
  constexpr uint32_t kBPairStep = 16 * 2, kBKStep = 16 * kBStride * 2;
#endif

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();
    const int stage = kt % STAGES;
    const uint32_t a_stage = sA0 + stage * kAStage * 2 + a_lane;
    const uint32_t b_stage = sB0 + stage * kBStage * 2 + b_lane;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t a[kMI][4], b[kNI / 2][4];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) ldmatrix_x4(a[mi], a_stage + mi * 16 * kAStride * 2 + kk * 32);
#pragma unroll
      for (int p = 0; p < kNI / 2; ++p) {
#if LAYOUT_RC
        ldmatrix_x4(b[p], b_stage + p * kBPairStep + kk * kBKStep);
#else
        ldmatrix_x4_trans(b[p], b_stage + p * kBPairStep + kk * kBKStep);
#endif
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
          mma16816(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
    }
  }
  cp_async_wait<0>();

  // m16n8 accumulators: lane l holds columns 2(l%4) + {0,1} of rows l/4 (e 0,1) and l/4 + 8 (e 2,3).
  const int t = lane & 3;
  if constexpr (SPLIT) {
    // element e of the flattened [kMI][kNI][4]: mi = e / (4 kNI), ni = e / 4 % kNI, h = e / 2 % 2
    auto off = [](int e, int col) {
      return col ? 8 * ((e >> 2) % kNI) + (e & 1) : 16 * (e / (4 * kNI)) + 8 * ((e >> 1) & 1);
    };
    float(&flat)[kMI * kNI * 4] = *reinterpret_cast<float(*)[kMI * kNI * 4]>(&acc[0][0][0]);
    if (!split_fixup(flat, ws, (int)gridDim.z, z, tile, M, N, m0, n0, lane >> 2, wn * kWN + 2 * t, off))
      return;
  }
  half* Ct = C + (size_t)m0 * (size_t)ldc + n0;
  const int rows = M - m0, cols = N - n0;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t v[4], w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = pack_half2(acc[mi][q][2 * h], acc[mi][q][2 * h + 1]);
      quad_transpose(v, w, t);
      store8(Ct, ldc, rows, cols, mi * 16 + (lane >> 2) + 8 * h, wn * kWN + t * 8, w, vec16 != 0);
    }
  }
#endif  // CUDAL2_LL_DEVICE
}
static_assert(kNI == 4, "the quad-shuffle epilogue takes 4 n8 blocks per warp");

#define CUDAL2_LL_BOUNDS __launch_bounds__(kThreads)
// the split build carries the fixup: "one CTA per SM" lets ptxas keep it out of local memory
#define CUDAL2_LL_SPLIT_BOUNDS __launch_bounds__(kThreads, 1)
#endif  // CUDAL2_LL_WGMMA

// splits == 1: one CTA per tile over all of K, C written directly (no workspace).
__global__ void CUDAL2_LL_BOUNDS
lowlat_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
              int M, int N, int K, int lda, int ldb, int ldc, int vec16) {
  lowlat_body<false>(A, B, C, M, N, K, lda, ldb, ldc, vec16, nullptr, 0);
}

// splits > 1 (gridDim.z): split blockIdx.z of each tile takes k-tiles [z kt_per, (z+1) kt_per).
__global__ void CUDAL2_LL_SPLIT_BOUNDS
lowlat_splitk_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
                     int M, int N, int K, int lda, int ldb, int ldc, int vec16, void* ws,
                     int kt_per) {
  lowlat_body<true>(A, B, C, M, N, K, lda, ldb, ldc, vec16, ws, kt_per);
}

// K == 0: the product of empty sums is C = 0.
__global__ void __launch_bounds__(256) zero_kernel(half* __restrict__ C, int M, int N, int ldc) {
  const size_t total = (size_t)M * (size_t)N;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    C[(i / (size_t)N) * (size_t)ldc + i % (size_t)N] = __float2half_rn(0.f);
  }
}

// ---- host --------------------------------------------------------------------------------------
// One launch of `fn` with kSmemBytes of dynamic shared memory. The > 48 KiB opt-in is made once
// per (device, kernel) (a per-call cudaFuncSetAttribute costs microseconds, the order of the
// whole call on the shapes this family serves), remembered in `done`. A cudaDeviceReset drops
// the opt-in while the bit stays: the launch then fails with cudaErrorInvalidValue (too much
// dynamic shared memory). So on that error the launcher consumes it (cudaGetLastError: the retry
// must not leave it pending), opts in again and retries once; the arguments were checked before,
// so nothing else makes this launch invalid.
static cudaError_t launch_optin(const void* fn, std::atomic<unsigned long long>& done, dim3 grid,
                                void** args, cudaStream_t s) {
  if (kSmemBytes <= 48 * 1024) return cudaLaunchKernel(fn, grid, dim3(kThreads), args, kSmemBytes, s);
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev >= 0 && dev < 64 ? (1ull << dev) : 0ull;
  const bool known = bit && (done.load(std::memory_order_acquire) & bit);
  if (!known) {
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
    if (err != cudaSuccess) return err;
    if (bit) done.fetch_or(bit, std::memory_order_acq_rel);
  }
  err = cudaLaunchKernel(fn, grid, dim3(kThreads), args, kSmemBytes, s);
  if (err == cudaErrorInvalidValue && known) {
    (void)cudaGetLastError();                        // this launch's error, not the caller's
    done.fetch_and(~bit, std::memory_order_acq_rel);
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
    if (err != cudaSuccess) return err;
    done.fetch_or(bit, std::memory_order_acq_rel);
    err = cudaLaunchKernel(fn, grid, dim3(kThreads), args, kSmemBytes, s);
  }
  return err;
}

// SMs of the current device, cached per device (err: the runtime's answer when it cannot say).
static int sm_count(cudaError_t& err) {
  static std::atomic<int> cached[64];
  int dev = 0;
  err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return 0;
  if (dev >= 0 && dev < 64) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return 0;
  if (n <= 0) {
    err = cudaErrorInvalidDevice;
    return 0;
  }
  if (dev >= 0 && dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

static bool option_ok(const int* options) {
  if (options == nullptr) return true;
  for (int v : kSplitValues)
    if (options[0] == v) return true;
  return false;
}
static int option_splits(const int* options) { return options ? options[0] : 0; }

// The split count of a call (K >= 1) and the k-tiles per split (kt_per): every split a
// non-empty range of whole k-tiles, splits * kt_per covering them. asked: the option (0: the
// launcher's choice on `sms` SMs). lowlat.py's lowlat_splits is this function in Python.
static int plan_splits(int M, int N, int K, int asked, int sms, int& kt_per) {
  const long long k_tiles = (K - 1) / BK + 1;
  const long long tiles = ((M - 1LL) / BM + 1) * ((N - 1LL) / BN + 1);
  long long s = asked;
  if (asked == 0) {
    s = sms / tiles;                    // fill the SMs, at most one CTA each
    if (s > kMaxSplits) s = kMaxSplits;
    // the last CTA reads s partial tiles while each split streams k_tiles / s k-tiles
    while (s > 1 && s * s * kPartialBytes > k_tiles * kKTileBytes) --s;
    if (s > k_tiles / kMinKTiles) s = k_tiles / kMinKTiles;
  }
  if (s > k_tiles) s = k_tiles;
  if (s < 1) s = 1;
  const long long per = (k_tiles + s - 1) / s;
  kt_per = (int)per;
  return (int)((k_tiles + per - 1) / per);
}

static size_t split_workspace(int M, int N, int splits) {
  const long long tiles = ((M - 1LL) / BM + 1) * ((N - 1LL) / BN + 1);
  return cudal2_splitk::workspace_bytes(splits, M, N, tiles);
}

// For information (the meta's workspace_bytes): the launcher's choice runs one CTA per SM at
// most, so its partials are at most 256 SMs' tiles (a bound for every GPU of today) plus their
// semaphores. Option values > 1 need what cudal2_workspace says.
constexpr unsigned long long kInfoWorkspace = 256ull * kPartialBytes + 16 + 128 * 4;

static const char* arch_name() {
#if !defined(__CUDA_ARCH_LIST__)
  return "unknown";
#elif __CUDA_ARCH_LIST__ == 800
  return "sm_80";
#elif __CUDA_ARCH_LIST__ == 860
  return "sm_86";
#elif __CUDA_ARCH_LIST__ == 890
  return "sm_89";
#elif __CUDA_ARCH_LIST__ == 900
  return "sm_90a";
#else
  return "sm_" CUDAL2_STR(__CUDA_ARCH_LIST__);
#endif
}

static const char* build_meta() {
  static char buf[1536];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"%s\", \"family\": \"%s\", \"arch\": \"%s\", \"abi\": 2, \"acc\": \"f32\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, %d], \"any_shape\": true, "
           "\"divisible\": [1, %d, 8], \"workspace_bytes\": %llu, \"workspace_zero_init\": true, "
           "\"splitk_fixup\": \"deterministic\", \"options\": [{\"name\": \"splits\", "
           "\"values\": [0, 1, 2, 4, 8, 16, 32, 64], \"default\": 0}], "
           "\"threads\": %d, \"stages\": %d, "
           "\"smem_bytes\": %d, \"cluster\": [1, 1, 1], \"instruction\": \"%s\", "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"STAGES\": %d, \"ACC\": \"f32\", "
           "\"LAYOUT\": \"%s\"}}",
           CUDAL2_LL_WGMMA ? "lowlat" : "lowlat_mma", CUDAL2_LL_WGMMA ? "lowlat" : "lowlat_mma",
           arch_name(), LAYOUT_RC ? "RC" : "RR", BM, BN, BK,
           LAYOUT_RC ? 1 : 8, kInfoWorkspace, kThreads, STAGES, (int)kSmemBytes,
           CUDAL2_LL_WGMMA ? "wgmma" : "mma.sync", BM, BN, BK, STAGES, LAYOUT_RC ? "RC" : "RR");
  return buf;
}

}  // namespace cudal2_lowlat_impl

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  using namespace cudal2_lowlat_impl;
  if (M <= 0 || N <= 0 || K <= 0 || !option_ok(options)) return 0;
  const int asked = option_splits(options);
  int sms = 1, kt_per = 0;                       // the SMs matter for option 0 only
  if (asked == 0) {
    cudaError_t err;
    sms = sm_count(err);
    // no device to ask: the bound over every split count the launcher could choose
    if (sms <= 0) return split_workspace(M, N, plan_splits(M, N, K, kMaxSplits, 1, kt_per));
  }
  const int splits = plan_splits(M, N, K, asked, sms, kt_per);
  return splits > 1 ? split_workspace(M, N, splits) : 0;
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream, const int* options) {
  using namespace cudal2_lowlat_impl;
  // Every argument check comes before the first CUDA call (and is testable without a GPU).
  if (M < 0 || N < 0 || K < 0 || !option_ok(options)) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N || reinterpret_cast<uintptr_t>(C) % 2 != 0) return cudaErrorInvalidValue;
  if (K > 0) {
    if (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N)) return cudaErrorInvalidValue;
    // 16-byte cp.async chunks: aligned bases, leading dimensions and K (and N for RR) multiples
    // of 8 elements, so a chunk never straddles the matrix edge.
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0 || lda % 8 != 0 ||
        ldb % 8 != 0 || K % 8 != 0 || (!LAYOUT_RC && N % 8 != 0))
      return cudaErrorInvalidValue;
  }
  // (tiles_n, tiles_m) up to 65535 M tiles (cta_tile divides nothing); past that the tiles run
  // along grid.x, folded onto grid.y past 2^31 - 1: every int M and N whose C has fewer than
  // (2^31 - 1) * 65535 tiles, i.e. every C smaller than 2^57 bytes. A fold's grid.x exceeds
  // tiles_n (y == 1: x is all the tiles; y > 1: x >= tiles / y > tiles_n), which is how cta_tile
  // tells the two apart.
  const long long tiles_m = (M - 1LL) / BM + 1, tiles_n = (N - 1LL) / BN + 1;
  long long grid_x = tiles_n, grid_y = tiles_m;
  if (tiles_m > kMaxGridY) {
    const long long tiles = tiles_m * tiles_n;
    grid_y = (tiles + kMaxGridX - 1) / kMaxGridX;
    if (grid_y > kMaxGridY) return cudaErrorInvalidValue;
    grid_x = (tiles + grid_y - 1) / grid_y;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  half* c = reinterpret_cast<half*>(C);
  if (K == 0) {
    void* args[] = {&c, &M, &N, &ldc};
    size_t blocks = ((size_t)M * (size_t)N + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return cudaLaunchKernel(reinterpret_cast<const void*>(&zero_kernel), dim3((unsigned)blocks),
                            dim3(256), args, 0, s);
  }
  const int asked = option_splits(options);
  int sms = 1;                                   // the SMs matter for option 0 only
  if (asked == 0) {
    cudaError_t err;
    sms = sm_count(err);
    if (sms <= 0) return err;
  }
  int kt_per = 0;
  int splits = plan_splits(M, N, K, asked, sms, kt_per);
  if (splits > 1 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
                     workspace_bytes < split_workspace(M, N, splits)))
    return cudaErrorInvalidValue;
  int vec16 = reinterpret_cast<uintptr_t>(C) % 16 == 0 && ldc % 8 == 0;
  const half* a = reinterpret_cast<const half*>(A);
  const half* b = reinterpret_cast<const half*>(B);
  const dim3 grid((unsigned)grid_x, (unsigned)grid_y, (unsigned)splits);
  if (splits == 1) {
    static std::atomic<unsigned long long> done{0};
    void* args[] = {&a, &b, &c, &M, &N, &K, &lda, &ldb, &ldc, &vec16};
    return launch_optin(reinterpret_cast<const void*>(&lowlat_kernel), done, grid, args, s);
  }
  static std::atomic<unsigned long long> done_split{0};
  void* ws = workspace;
  void* args[] = {&a, &b, &c, &M, &N, &K, &lda, &ldb, &ldc, &vec16, &ws, &kt_per};
  return launch_optin(reinterpret_cast<const void*>(&lowlat_splitk_kernel), done_split, grid, args, s);
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_lowlat_impl::build_meta();
  return meta;
}
