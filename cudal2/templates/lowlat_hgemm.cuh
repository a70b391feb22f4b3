// cudal2 reference kernel families "lowlat" (BM 64/128, wgmma) and "lowlat_mma" (BM 16/32,
// mma.sync): a low-latency HGEMM for launch-bound shapes.
//
//   C[M,N] (fp16, row-major, ldc) = A[M,K] (fp16, row-major, lda) @ B, fp32 accumulation
//   B is K x N row-major (ldb >= N) when LAYOUT_RC == 0 ("RR"),
//        N x K row-major, i.e. K x N column-major (ldb >= K), when LAYOUT_RC == 1 ("RC").
//
// What a call costs beyond the math is what this family is cut for (shapes of a few tiles):
//   * one output tile per CTA, a plain grid (x along N, y along M): no cluster, no persistent
//     scheduler, no tile-order options, no workspace;
//   * no tensor maps: every thread loads 16-byte chunks with cp.async (zero-filled outside the
//     matrix), so the host encodes nothing per call: it checks the arguments, computes the grid
//     and calls cudaLaunchKernel once (the > 48 KiB shared-memory opt-in is made once per device);
//   * a STAGES-deep cp.async pipeline, STAGES small (2-4): the prologue loads what the tile needs;
//   * BM >= 64 (sm_90a): one warpgroup per 64 rows issues wgmma.mma_async m64nBNk16 from shared
//     memory written by cp.async in the 128-byte-swizzled layout wgmma's SWIZZLE_128B descriptors
//     read (the layout TMA writes in wgmma_hgemm.cuh: 16-byte unit u of row r stored at unit
//     u ^ (r % 8), 128-byte rows, base aligned to 1 KiB); BK = 64 (one swizzle atom);
//   * BM < 64 (sm_80 and later): BN/32 warps, each a BM x 32 warp tile of mma.sync m16n8k16 fed by
//     ldmatrix from padded shared memory (rows padded by 16 bytes, as mma_hgemm.cuh);
//   * register epilogue: a quad shuffle gathers 8 consecutive columns per lane and each lane
//     writes 16 bytes; 2-byte stores at the residue edge or when C is not 16-byte aligned.
//
// Divisibility (the meta's "divisible"): K % 8 == 0, and N % 8 == 0 for RR (the 16-byte loads
// need lda and ldb multiples of 8 elements and 16-byte aligned bases). The launcher refuses
// anything else with cudaErrorInvalidValue before any CUDA call.
//
// Exports ABI 1 (docs/abi.md): cudal2_hgemm, cudal2_meta.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <atomic>

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
#define STAGES 3        // cp.async pipeline depth (2..4)
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
// wgmma is sm_90a only: a generic compute_90 pass compiles the kernel body out.
#if defined(__CUDA_ARCH__) && (!CUDAL2_LL_WGMMA || defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define CUDAL2_LL_DEVICE 1
#else
#define CUDAL2_LL_DEVICE 0
#endif

#define CUDAL2_STR2(x) #x
#define CUDAL2_STR(x) CUDAL2_STR2(x)

namespace cudal2_lowlat_impl {

using namespace cudal2_wgmma_ptx;   // smem_u32, pack_half2, make_desc, the wgmma wrappers (wgmma_ptx.cuh)

static_assert(ACC_F16 == 0, "the lowlat family implements fp32 accumulation only");
static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM must be 16, 32, 64 or 128");
static_assert(BN == 64 || BN == 128, "BN must be 64 or 128");
static_assert(BK == 64, "BK must be 64");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES must be 2, 3 or 4");

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
// N % 8 == 0 for RR): a chunk is all in or all out. dst(r, u) gives the smem byte address.
template <int ROWS, int CHUNKS, class Dst>
__device__ __forceinline__ void load_tile(const half* g, int ld, int r0, int row_lim, int c0,
                                          int col_lim, Dst dst) {
  constexpr int kTotal = ROWS * CHUNKS;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = (int)threadIdx.x + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int r = idx / CHUNKS, u = idx % CHUNKS;
      const int gr = r0 + r, gc = c0 + u * 8;
      const bool ok = gr < row_lim && gc < col_lim;
      const half* src = ok ? g + (size_t)gr * (size_t)ld + gc : g;
      cp_async_16(dst(r, u), src, ok ? 16 : 0);
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

// Stores the 8 columns [c, c+8) of row r (lane's share after quad_transpose).
__device__ __forceinline__ void store8(half* C, int ldc, int M, int N, int r, int c,
                                       const uint32_t (&w)[4], bool vec16) {
  if (r >= M || c >= N) return;
  half* p = C + (size_t)r * (size_t)ldc + c;
  if (vec16 && c + 8 <= N) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (c + e < N) {
        const uint32_t word = w[e / 2];
        const unsigned short bits = (unsigned short)((e & 1) ? (word >> 16) : (word & 0xFFFFu));
        p[e] = __ushort_as_half(bits);
      }
    }
  }
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

__global__ void __launch_bounds__(kThreads, 1)
lowlat_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
              int M, int N, int K, int lda, int ldb, int ldc, int vec16) {
#if CUDAL2_LL_DEVICE
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + (kAlign - 1)) & ~(uint32_t)(kAlign - 1);
  const uint32_t sA0 = base, sB0 = base + STAGES * kAStage * 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_tiles = (K + BK - 1) / BK;
  const int wg = threadIdx.x / 128, wg_tid = threadIdx.x % 128;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * BK;
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
  const int r0 = m0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += 4) {
      uint32_t v[4], w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = pack_half2(acc[4 * (j0 + q) + 2 * h], acc[4 * (j0 + q) + 2 * h + 1]);
      quad_transpose(v, w, t);
      store8(C, ldc, M, N, r0 + 8 * h, n0 + (j0 + t) * 8, w, vec16 != 0);
    }
  }
#endif  // CUDAL2_LL_DEVICE
}

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

__global__ void __launch_bounds__(kThreads)
lowlat_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
              int M, int N, int K, int lda, int ldb, int ldc, int vec16) {
#if CUDAL2_LL_DEVICE
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sA0 = smem_u32(smem_raw), sB0 = sA0 + STAGES * kAStage * 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_tiles = (K + BK - 1) / BK;
  const int lane = threadIdx.x & 31, wn = threadIdx.x >> 5;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * BK;
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
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t v[4], w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = pack_half2(acc[mi][q][2 * h], acc[mi][q][2 * h + 1]);
      quad_transpose(v, w, t);
      store8(C, ldc, M, N, m0 + mi * 16 + (lane >> 2) + 8 * h, n0 + wn * kWN + t * 8, w, vec16 != 0);
    }
  }
#endif  // CUDAL2_LL_DEVICE
}
static_assert(kNI == 4, "the quad-shuffle epilogue takes 4 n8 blocks per warp");
#endif  // CUDAL2_LL_WGMMA

// K == 0: the product of empty sums is C = 0.
__global__ void __launch_bounds__(256) zero_kernel(half* __restrict__ C, int M, int N, int ldc) {
  const size_t total = (size_t)M * (size_t)N;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    C[(i / (size_t)N) * (size_t)ldc + i % (size_t)N] = __float2half_rn(0.f);
  }
}

// Opt in to > 48 KiB of dynamic shared memory once per device (a per-call cudaFuncSetAttribute
// costs microseconds, the order of the whole call on the shapes this family serves).
static cudaError_t ensure_smem_attribute() {
  if (kSmemBytes <= 48 * 1024) return cudaSuccess;
  static std::atomic<unsigned long long> done{0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(reinterpret_cast<const void*>(&lowlat_kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
  if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

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
  static char buf[1024];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"%s\", \"family\": \"%s\", \"arch\": \"%s\", \"acc\": \"f32\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, %d], \"any_shape\": true, "
           "\"divisible\": [1, %d, 8], \"workspace_bytes\": 0, \"threads\": %d, \"stages\": %d, "
           "\"smem_bytes\": %d, \"cluster\": [1, 1, 1], \"instruction\": \"%s\", "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"STAGES\": %d, \"ACC\": \"f32\", "
           "\"LAYOUT\": \"%s\"}}",
           CUDAL2_LL_WGMMA ? "lowlat" : "lowlat_mma", CUDAL2_LL_WGMMA ? "lowlat" : "lowlat_mma",
           arch_name(), LAYOUT_RC ? "RC" : "RR", BM, BN, BK,
           LAYOUT_RC ? 1 : 8, kThreads, STAGES, (int)kSmemBytes,
           CUDAL2_LL_WGMMA ? "wgmma" : "mma.sync", BM, BN, BK, STAGES, LAYOUT_RC ? "RC" : "RR");
  return buf;
}

}  // namespace cudal2_lowlat_impl

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  using namespace cudal2_lowlat_impl;
  (void)workspace;
  (void)workspace_bytes;
  // Every argument check comes before the first CUDA call (and is testable without a GPU).
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
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
  const long long tiles_m = (M + (long long)BM - 1) / BM, tiles_n = (N + (long long)BN - 1) / BN;
  if (tiles_m > 65535 || tiles_n > 2147483647LL) return cudaErrorInvalidValue;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  half* c = reinterpret_cast<half*>(C);
  if (K == 0) {
    void* args[] = {&c, &M, &N, &ldc};
    size_t blocks = ((size_t)M * (size_t)N + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return cudaLaunchKernel(reinterpret_cast<const void*>(&zero_kernel), dim3((unsigned)blocks),
                            dim3(256), args, 0, s);
  }
  const cudaError_t err = ensure_smem_attribute();
  if (err != cudaSuccess) return err;
  int vec16 = reinterpret_cast<uintptr_t>(C) % 16 == 0 && ldc % 8 == 0;
  const half* a = reinterpret_cast<const half*>(A);
  const half* b = reinterpret_cast<const half*>(B);
  void* args[] = {&a, &b, &c, &M, &N, &K, &lda, &ldb, &ldc, &vec16};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&lowlat_kernel),
                          dim3((unsigned)tiles_n, (unsigned)tiles_m), dim3(kThreads), args, kSmemBytes, s);
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_lowlat_impl::build_meta();
  return meta;
}
