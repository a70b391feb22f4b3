// cudal2 kernel family "gemv": C[M,N] = A[M,K] @ B for M <= MAX_M <= 8 (LLM decode), fp16 in
// and out, fp32 accumulate, on CUDA cores (fp32 FMA), not tensor cores: at M = 1..8 a tensor-core
// tile would pad M to 16 rows and the kernel is bound by reading B from HBM anyway.
//
// Every element of B is read from HBM exactly once, by 16-byte ld.global.nc.L1::no_allocate loads
// with an L2 evict-first policy (read once: they leave L2 before A, which every CTA reads again);
// A (at most 8 x K halves) is read through L1 with 16-byte loads. Rows m >= M of the MAX_M rows
// the accumulators are sized for are predicated off (no load, no FMA, no store).
//
// LAYOUT_RC 1 (B column-major: nn.Linear's weight W, N x K, row n contiguous in K). A CTA owns
// BN = WARPS * ROWS output columns, each warp ROWS of them. A lane walks the K range in 16-byte
// chunks (8 halves): chunk c = c_begin + lane + 32 * j, for each of its ROWS weight rows, with
// UNROLL chunks per row (ROWS * UNROLL loads) issued before any is consumed; it multiplies each
// by the matching 8 halves of A[m, 8c .. 8c + 8) (one 16-byte load per row m, reused across the
// ROWS rows) into MAX_M x ROWS fp32 sums, element by element in k order. Then a fixed butterfly
// (__shfl_xor_sync at 16, 8, 4, 2, 1: every lane ends with the same sum) reduces each sum across
// the warp, and lane m * ROWS + r stores C[m, n_r].
//
// LAYOUT_RC 0 (B row-major, K x N, row k contiguous in N; N % 8 == 0). A thread loads 16 bytes:
// 8 consecutive columns of one row k of B. A CTA is TN = 8 * ROWS threads along N by
// TK = 32 * WARPS / TN threads along K, so BN = 8 * TN = 64 * ROWS columns; thread (tn, tk) =
// (tid % TN, tid / TN) owns columns n0 + 8 tn .. + 8 and walks K chunks of 8 rows,
// c = c_begin + tk + TK * j. Per chunk it loads A[m, 8c .. 8c + 8) once per row m (16 bytes) and
// the chunk's 8 rows of B, UNROLL rows issued before any is consumed (8 / UNROLL groups), into
// MAX_M x 8 fp32 sums, rows in k order. The TK partial sums of each output are then reduced
// through shared memory in tk order (s = p[0]; s += p[1]; ...), kRedRows rows of m at a time (the
// buffer is 32 KiB at most), by one thread per output.
//
// Runtime options (kernel ABI 2), in this order:
//   splits (1, 2, 4, 8; sm_80 builds: 1 only): K split across a thread-block cluster of that many
//     CTAs along x (sm_90a). Rank q of the cluster takes chunks [q * chunks / s, (q + 1) * chunks
//     / s) of the K / 8 chunks (equal contiguous ranges to one chunk, none empty); each rank
//     stores its fp32 partial outputs in its own shared memory, a cluster barrier, then rank q
//     reduces the q-th slice of the tile's M x BN outputs by reading every rank's partial through
//     distributed shared memory in rank order 0 .. s - 1 (deterministic), rounds once to fp16 and
//     stores C; a second barrier keeps each rank's partials alive until its peers have read them.
//     No global workspace at all (cudal2_workspace is 0). K < 8 * splits clamps: the call runs the
//     largest listed split count <= K / 8 (1 for K < 16), so no rank is ever empty.
//   unroll (2, 4, 8; default 4): the 16-byte B loads per row a thread issues before consuming any
//     (RC: per weight row; RR: rows of the chunk). The kernel is instantiated for each value; one
//     build serves all three.
//
// Grid: persistent over the N tiles. grid = min(tiles, resident clusters) clusters of `splits`
// CTAs, cluster i looping over tiles t = i, i + clusters, ... The resident count is
// cudaOccupancyMaxActiveBlocksPerMultiprocessor x the SM count (splits 1) or
// cudaOccupancyMaxActiveClusters (splits > 1), per (device, unroll, splits), cached; a failed query
// is the call's error (nothing is guessed), and a cluster that cannot be resident at all is
// refused (cudaErrorInvalidValue).
//
// The work split and the arithmetic order are replayed in Python by cudal2/templates/gemv.py
// (gemv_work, gemv_emulate): a product of two fp16 values is exact in fp32, so the emulation's
// float32 multiply-then-add is the kernel's fma bit for bit.
//
// Refused with cudaErrorInvalidValue before any CUDA call: M > MAX_M, a negative size, K % 8 != 0,
// RR with N % 8 != 0, an unlisted option value; and (M, N > 0) C null, ldc < N or C not 2-byte
// aligned; and (K > 0) A or B null or not 16-byte aligned, lda or ldb not a multiple of 8,
// lda < K, ldb < (RC ? K : N). M == 0 or N == 0: success, nothing launched; K == 0: C = 0.
// Graph-safe: one launch on the caller's stream, no allocation, memset or synchronisation.

#ifndef MAX_M
#define MAX_M 8         // the largest M served: accumulators for MAX_M rows (1, 2, 4 or 8)
#endif
#ifndef WARPS
#define WARPS 8         // warps per CTA (4, 8 or 16)
#endif
#ifndef ROWS
#define ROWS 2          // RC: weight rows (output columns) per warp; RR: TN = 8 * ROWS threads along N
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 1     // 1: B column-major (nn.Linear weight, stored N x K); 0: B row-major
#endif
#ifndef ACC_F16
#define ACC_F16 0
#endif
#if ACC_F16
#error "the gemv family accumulates in fp32 only (ACC f32)"
#endif
#if MAX_M != 1 && MAX_M != 2 && MAX_M != 4 && MAX_M != 8
#error "MAX_M must be 1, 2, 4 or 8"
#endif
#if WARPS != 4 && WARPS != 8 && WARPS != 16
#error "WARPS must be 4, 8 or 16"
#endif
#if ROWS != 1 && ROWS != 2 && ROWS != 4
#error "ROWS must be 1, 2 or 4"
#endif

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <atomic>

// K split across a cluster exists from sm_90 on (the host pass sees the build's arch list too).
#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ >= 900
#define CUDAL2_GEMV_CLUSTER 1
#else
#define CUDAL2_GEMV_CLUSTER 0
#endif
#define CUDAL2_GEMV_STR2(x) #x
#define CUDAL2_GEMV_STR(x) CUDAL2_GEMV_STR2(x)

namespace cudal2_gemv {

constexpr int kThreads = WARPS * 32;
#if LAYOUT_RC
constexpr int kTileN = WARPS * ROWS;            // BN: output columns per CTA
constexpr int kRedFloats = 0;
#else
constexpr int kLanesN = 8 * ROWS;               // TN: threads along N, 8 columns each
constexpr int kLanesK = kThreads / kLanesN;     // TK: threads along K
constexpr int kTileN = 8 * kLanesN;             // BN
// rows of m reduced per round: the partial buffer (kThreads x 8 x kRedRows floats) stays <= 32 KiB
constexpr int kRedRows = MAX_M < 1024 / kThreads ? MAX_M : 1024 / kThreads;
constexpr int kRedFloats = kThreads * 8 * kRedRows;
#endif
constexpr int kStaticSmem = kRedFloats * 4;
constexpr int kPartBytes = MAX_M * kTileN * 4;  // dynamic: a rank's partial outputs (splits > 1)
constexpr int kClusterMax = 8;
constexpr int kUnrollValues[] = {2, 4, 8};       // runtime option "unroll"
#if CUDAL2_GEMV_CLUSTER
constexpr int kSplitValues[] = {1, 2, 4, 8};     // runtime option "splits"
#else
constexpr int kSplitValues[] = {1};
#endif

struct Params {
  const half* A;
  const half* B;
  half* C;
  int M, N, K, lda, ldb, ldc;
  int tiles, splits;
};

// ---- device helpers -------------------------------------------------------------------------
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// 16 bytes of B, read once: no L1 allocation, evicted first from L2. volatile keeps the loads in
// the order written (all of a group before the FMAs that consume the first one).
__device__ __forceinline__ uint4 ld_stream(const half* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}
// 16 bytes of A (small, read by every CTA): through L1.
__device__ __forceinline__ uint4 ld_small(const half* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// The low (hi = false) or high half of a 32-bit word, as float. Bit operations only: taking the
// address of a register array to reinterpret it can leave that array in local memory.
__device__ __forceinline__ float half_of(uint32_t w, bool hi) {
  return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffffu)));
}
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  f[0] = half_of(v.x, false), f[1] = half_of(v.x, true);
  f[2] = half_of(v.y, false), f[3] = half_of(v.y, true);
  f[4] = half_of(v.z, false), f[5] = half_of(v.z, true);
  f[6] = half_of(v.w, false), f[7] = half_of(v.w, true);
}
// Element e (compile-time after unrolling) of 8 packed halves, as float.
__device__ __forceinline__ float half_at(const uint4& v, int e) {
  return half_of(e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w, (e & 1) != 0);
}

#if CUDAL2_GEMV_CLUSTER && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster: release its shared-memory writes, acquire the peers'.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The float at the same shared-memory address in CTA `rank` of the cluster (mapa + DSMEM load).
__device__ __forceinline__ float ld_peer(uint32_t local, uint32_t rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

// ---- the cluster reduction (splits > 1): every rank's s_part holds its partials of the tile ---
__device__ __forceinline__ void cluster_reduce(const Params& p, const float* s_part, int n0,
                                               int rank) {
#if CUDAL2_GEMV_CLUSTER && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster_barrier();   // every rank's partials written (release) and visible here (acquire)
  const int items = p.M * kTileN;   // item i = m * kTileN + col, also its index in s_part
  const int i_begin = rank * items / p.splits, i_end = (rank + 1) * items / p.splits;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(s_part));
  for (int i = i_begin + (int)threadIdx.x; i < i_end; i += kThreads) {
    const uint32_t local = base + 4u * (uint32_t)i;
    float s = ld_peer(local, 0);
    for (int q = 1; q < p.splits; ++q) s += ld_peer(local, (uint32_t)q);   // rank order
    const int m = i / kTileN, n = n0 + i % kTileN;
    if (n < p.N) p.C[(size_t)m * p.ldc + n] = __float2half_rn(s);
  }
  cluster_barrier();   // the peers are done reading: s_part may be overwritten, or the CTA exit
#else
  (void)p, (void)s_part, (void)n0, (void)rank;
#endif
}

// ---- the kernel ------------------------------------------------------------------------------
#if LAYOUT_RC
// One tile of the RC kernel: columns [n0, n0 + kTileN), K chunks [cb, ce).
template <int UNROLL>
__device__ __forceinline__ void tile_rc(const Params& p, int n0, int cb, int ce, uint64_t policy,
                                        float* s_part) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nw = n0 + warp * ROWS;   // this warp's first column
  float acc[MAX_M][ROWS];
#pragma unroll
  for (int m = 0; m < MAX_M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.f;
  const half* brow[ROWS];
  bool row_ok[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    row_ok[r] = nw + r < p.N;
    brow[r] = p.B + (size_t)(row_ok[r] ? nw + r : 0) * (size_t)p.ldb;
  }
  for (int base = cb; base < ce; base += 32 * UNROLL) {
    uint4 bv[UNROLL][ROWS];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {   // every load of the group before any FMA
      const int c = base + lane + 32 * u;
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        bv[u][r] = (c < ce && row_ok[r]) ? ld_stream(brow[r] + (size_t)c * 8, policy)
                                         : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      // past the range B and A read as zero: +0 products leave a sum bit-identical (a sum that
      // starts at +0 is never -0), and no branch splits the warp
      const int c = base + lane + 32 * u;
      const bool live = c < ce;
      float b[ROWS][8];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) unpack8(bv[u][r], b[r]);
#pragma unroll
      for (int m = 0; m < MAX_M; ++m) {
        if (m >= p.M) continue;   // uniform
        float a[8];
        unpack8(live ? ld_small(p.A + (size_t)m * p.lda + (size_t)c * 8) : make_uint4(0u, 0u, 0u, 0u), a);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[m][r] = __fmaf_rn(a[e], b[r][e], acc[m][r]);
      }
    }
  }
  // the butterfly: lane l adds lane l ^ off's sum, off = 16 .. 1; every lane ends with the total
#pragma unroll
  for (int m = 0; m < MAX_M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
#pragma unroll
  for (int m = 0; m < MAX_M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (m >= p.M || lane != (m * ROWS + r) % 32) continue;
      if (p.splits > 1)
        s_part[m * kTileN + warp * ROWS + r] = acc[m][r];
      else if (nw + r < p.N)
        p.C[(size_t)m * p.ldc + nw + r] = __float2half_rn(acc[m][r]);
    }
}
#else
// One tile of the RR kernel: columns [n0, n0 + kTileN), K chunks [cb, ce).
template <int UNROLL>
__device__ __forceinline__ void tile_rr(const Params& p, int n0, int cb, int ce, uint64_t policy,
                                        float* s_red, float* s_part) {
  const int tn = threadIdx.x % kLanesN, tk = threadIdx.x / kLanesN;
  const int col = n0 + 8 * tn;
  const bool col_ok = col < p.N;   // N % 8 == 0: the whole 8-column group is inside
  float acc[MAX_M][8];
#pragma unroll
  for (int m = 0; m < MAX_M; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
  const half* bcol = p.B + (col_ok ? col : 0);
  for (int c = col_ok ? cb + tk : ce; c < ce; c += kLanesK) {
    uint4 av[MAX_M];
#pragma unroll
    for (int m = 0; m < MAX_M; ++m)
      av[m] = m < p.M ? ld_small(p.A + (size_t)m * p.lda + (size_t)c * 8) : make_uint4(0u, 0u, 0u, 0u);
    const half* brow = bcol + (size_t)c * 8 * (size_t)p.ldb;
    // not unrolled: unrolled, the compiler hoisted all 8 row loads of the chunk whatever UNROLL
    // (the same registers for 2, 4 and 8); as a loop, a group's loads wait for the previous
    // group's FMAs. half_at's runtime index selects, it does not index an array.
#pragma unroll 1
    for (int g = 0; g < 8; g += UNROLL) {
      uint4 bv[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) bv[u] = ld_stream(brow + (size_t)(g + u) * p.ldb, policy);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float b[8];
        unpack8(bv[u], b);
#pragma unroll
        for (int m = 0; m < MAX_M; ++m) {
          if (m >= p.M) continue;
          const float a = half_at(av[m], g + u);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][j] = __fmaf_rn(a, b[j], acc[m][j]);
        }
      }
    }
  }
  // the TK partials of each output, summed in tk order, kRedRows rows of m per round
#pragma unroll
  for (int m0 = 0; m0 < MAX_M; m0 += kRedRows) {
    if (m0 >= p.M) continue;   // uniform: every thread skips the round
    __syncthreads();   // the previous round's (or tile's) readers are done with s_red
#pragma unroll
    for (int r = 0; r < kRedRows; ++r) {
      float4* dst = reinterpret_cast<float4*>(s_red + (tk * kRedRows + r) * kTileN + 8 * tn);
      dst[0] = make_float4(acc[m0 + r][0], acc[m0 + r][1], acc[m0 + r][2], acc[m0 + r][3]);
      dst[1] = make_float4(acc[m0 + r][4], acc[m0 + r][5], acc[m0 + r][6], acc[m0 + r][7]);
    }
    __syncthreads();
    const int items = (p.M - m0 < kRedRows ? p.M - m0 : kRedRows) * kTileN;   // rows m < M
    for (int i = threadIdx.x; i < items; i += kThreads) {
      const int r = i / kTileN, cc = i % kTileN, m = m0 + r;
      float s = s_red[r * kTileN + cc];
      for (int q = 1; q < kLanesK; ++q) s += s_red[(q * kRedRows + r) * kTileN + cc];
      if (p.splits > 1)
        s_part[m * kTileN + cc] = s;
      else if (n0 + cc < p.N)
        p.C[(size_t)m * p.ldc + n0 + cc] = __float2half_rn(s);
    }
  }
}
#endif

// minBlocks 1: without it ptxas spilled a few values live across the main loop (4-24 bytes, at
// 40-128 registers) to reach an occupancy step; the loads in flight, not the CTAs, hide latency.
template <int UNROLL>
__global__ void __launch_bounds__(kThreads, 1) gemv_kernel(Params p) {
  extern __shared__ __align__(16) float s_part[];   // [MAX_M][kTileN]: splits > 1 only
#if !LAYOUT_RC
  __shared__ __align__(16) float s_red[kRedFloats];
#endif
  const int splits = p.splits;
  const int cluster = blockIdx.x / splits, rank = blockIdx.x % splits;
  const int clusters = gridDim.x / splits;
#if CUDAL2_GEMV_CLUSTER && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // cluster dims (splits, 1, 1): the ranks of a cluster are consecutive blockIdx.x
  if (splits > 1 && (cluster_nctarank() != (uint32_t)splits || cluster_ctarank() != (uint32_t)rank))
    __trap();
#endif
  // 32-bit: chunks < 2^28 and rank < 8 (a 64-bit division would be a call, with a stack frame)
  const int chunks = p.K / 8;
  const int cb = rank * chunks / splits, ce = (rank + 1) * chunks / splits;
  const uint64_t policy = evict_first_policy();
  for (int t = cluster; t < p.tiles; t += clusters) {   // uniform across the cluster
    const int n0 = t * kTileN;
#if LAYOUT_RC
    tile_rc<UNROLL>(p, n0, cb, ce, policy, s_part);
#else
    tile_rr<UNROLL>(p, n0, cb, ce, policy, s_red, s_part);
#endif
    if (splits > 1) cluster_reduce(p, s_part, n0, rank);
  }
}

// ---- host ------------------------------------------------------------------------------------
static bool listed(int v, const int* values, int n) {
  for (int i = 0; i < n; ++i)
    if (values[i] == v) return true;
  return false;
}

static bool option_ok(const int* options) {
  if (options == nullptr) return true;
  return listed(options[0], kSplitValues, (int)(sizeof(kSplitValues) / sizeof(int))) &&
         listed(options[1], kUnrollValues, 3);
}

// The split count a call runs: the option, halved until every rank has a chunk (K / 8 >= splits).
static int run_splits(int K, const int* options) {
  int s = options ? options[0] : 1;
  while (s > 1 && s > K / 8) s /= 2;
  return s;
}

static int unroll_index(const int* options) {
  const int u = options ? options[1] : 4;
  return u == 2 ? 0 : (u == 4 ? 1 : 2);
}

static const void* kernel_of(int ui) {
  if (ui == 0) return reinterpret_cast<const void*>(&gemv_kernel<2>);
  if (ui == 1) return reinterpret_cast<const void*>(&gemv_kernel<4>);
  return reinterpret_cast<const void*>(&gemv_kernel<8>);
}

static int split_index(int s) { return s == 1 ? 0 : (s == 2 ? 1 : (s == 4 ? 2 : 3)); }

// The resident clusters of `splits` CTAs of variant `ui` on the current device (CTAs when
// splits is 1): cached per (device, variant, splits). A failed query returns its error (consumed,
// so it is not left for the caller's next launch); n = 0: no such cluster fits.
static cudaError_t resident(int ui, int splits, int& n) {
  static std::atomic<int> cached[64][3][4];
  n = 0;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  const bool cacheable = dev >= 0 && dev < 64;
  const int si = split_index(splits);
  if (cacheable) {
    const int c = cached[dev][ui][si].load(std::memory_order_relaxed);
    if (c > 0) {
      n = c;
      return cudaSuccess;
    }
  }
  if (splits == 1) {
    int sms = 0, per_sm = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(ui), kThreads, 0);
    n = per_sm * sms;
  } else {
#if CUDAL2_GEMV_CLUSTER
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)splits;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)splits, 1, 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = kPartBytes;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&n, kernel_of(ui), &cfg);
#else
    err = cudaErrorInvalidValue;   // unreachable: option_ok lists splits 1 only
#endif
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
    return err;
  }
  if (n > 0 && cacheable) cached[dev][ui][si].store(n, std::memory_order_relaxed);
  return cudaSuccess;
}

static cudaError_t launch(int ui, int clusters, int splits, Params& p, cudaStream_t s) {
  void* args[] = {&p};
  const dim3 grid((unsigned)(clusters * splits), 1, 1);
#if CUDAL2_GEMV_CLUSTER
  if (splits > 1) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)splits;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = kPartBytes;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, kernel_of(ui), args);
  }
#endif
  return cudaLaunchKernel(kernel_of(ui), grid, dim3(kThreads), args, 0, s);
}

static const char* arch_name() {
#if !defined(__CUDA_ARCH_LIST__)
  return "unknown";
#elif __CUDA_ARCH_LIST__ == 800
  return "sm_80";
#elif __CUDA_ARCH_LIST__ == 900
  return "sm_90a";
#else
  return "sm_" CUDAL2_GEMV_STR(__CUDA_ARCH_LIST__);
#endif
}

static const char* build_meta() {
  static char buf[1280];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"gemv\", \"family\": \"gemv\", \"arch\": \"%s\", \"abi\": 2, \"acc\": \"f32\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, 8], \"warps\": %d, \"threads\": %d, "
           "\"smem_bytes\": %d, \"cluster_smem_bytes\": %d, \"any_shape\": true, \"max_m\": %d, "
           "\"divisible\": [1, %d, 8], \"workspace_bytes\": 0, \"cluster_splitk_max\": %d, "
           "\"options\": [{\"name\": \"splits\", \"values\": [%s], \"default\": 1}, "
           "{\"name\": \"unroll\", \"values\": [2, 4, 8], \"default\": 4}], "
           "\"params\": {\"MAX_M\": %d, \"WARPS\": %d, \"ROWS\": %d, \"ACC\": \"f32\", "
           "\"LAYOUT\": \"%s\"}}",
           arch_name(), LAYOUT_RC ? "RC" : "RR", MAX_M, kTileN, WARPS, kThreads, kStaticSmem,
           CUDAL2_GEMV_CLUSTER ? kPartBytes : 0, MAX_M, LAYOUT_RC ? 1 : 8,
           CUDAL2_GEMV_CLUSTER ? kClusterMax : 0, CUDAL2_GEMV_CLUSTER ? "1, 2, 4, 8" : "1",
           MAX_M, WARPS, ROWS, LAYOUT_RC ? "RC" : "RR");
  return buf;
}

}  // namespace cudal2_gemv

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  (void)M, (void)N, (void)K, (void)options;
  return 0;   // the splits reduce inside a cluster: never a workspace
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream, const int* options) {
  using namespace cudal2_gemv;
  (void)workspace, (void)workspace_bytes;
  if (M < 0 || N < 0 || K < 0 || M > MAX_M || K % 8 != 0 || (!LAYOUT_RC && N % 8 != 0) ||
      !option_ok(options))
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N || reinterpret_cast<uintptr_t>(C) % 2 != 0) return cudaErrorInvalidValue;
  // 16-byte loads only: both operands aligned, leading dimensions multiples of 8 elements
  if (K > 0 && (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N) ||
                lda % 8 != 0 || ldb % 8 != 0 ||
                (reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0))
    return cudaErrorInvalidValue;
  const int ui = unroll_index(options);
  const int splits = run_splits(K, options);
  int n = 0;
  const cudaError_t err = resident(ui, splits, n);
  if (err != cudaSuccess) return err;
  if (n <= 0) return cudaErrorInvalidValue;   // not one such cluster fits on this device
  const int tiles = (N + kTileN - 1) / kTileN;
  const int clusters = tiles < n ? tiles : n;
  Params p{reinterpret_cast<const half*>(A), reinterpret_cast<const half*>(B),
           reinterpret_cast<half*>(C), M, N, K, lda, ldb, ldc, tiles, splits};
  return launch(ui, clusters, splits, p, reinterpret_cast<cudaStream_t>(stream));
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_gemv::build_meta();   // thread-safe one-time init
  return meta;
}
