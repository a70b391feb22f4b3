// cudal2 reference kernel family "mma": HGEMM with raw CUDA tensor-core instructions.
//
//   C[M,N] (fp16, row-major, ldc) = A[M,K] (fp16, row-major, lda) @ B
//   B is K x N row-major (ldb >= N) when LAYOUT_RC == 0 ("RR"),
//        N x K row-major, i.e. K x N column-major (ldb >= K), when LAYOUT_RC == 1 ("RC").
//
// Building blocks (sm_80 and later): mma.sync.aligned.m16n8k16 (f32 or f16 accumulate, chosen by
// ACC_F16), ldmatrix.x4 (.trans for row-major B), a STAGES-deep cp.async pipeline into padded
// shared memory (rows padded by 16 bytes, so the 8 row addresses of every ldmatrix hit distinct
// bank groups), grouped threadblock raster (SWIZZLE) and optional split-K (SPLITK) with fp32
// partial sums in the caller's workspace reduced inside the same kernel by the last CTA of each
// tile (splitk_fixup.cuh): one launch per call, no memset, no second kernel. CUDAL2_STORE_CT
// stores the product transposed (the skinny_n family computes C^T and writes row-major C).
//
// Any M, N, K: tile loads are predicated and zero-filled (cp.async src-size), stores are
// predicated. When A/B are not 16-byte aligned or lda/ldb are not multiples of 8 elements the
// launcher picks the guarded scalar-load instantiation of the same kernel.
//
// Every parameter is a macro with a default, so an instantiation is "#define ..." lines followed
// by this file. Exports the cudal2 kernel ABI: cudal2_hgemm and cudal2_meta (docs/templates.md).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <atomic>

#include "splitk_fixup.cuh"
#include "streamk.cuh"

#ifndef BM
#define BM 128          // threadblock tile rows (M)
#endif
#ifndef BN
#define BN 128          // threadblock tile columns (N)
#endif
#ifndef BK
#define BK 32           // K depth of one pipeline stage
#endif
#ifndef WM
#define WM 64           // warp tile rows
#endif
#ifndef WN
#define WN 64           // warp tile columns
#endif
#ifndef STAGES
#define STAGES 3        // cp.async pipeline depth (>= 2)
#endif
#ifndef SWIZZLE
#define SWIZZLE 8       // grouped raster: this many tile rows share a column sweep (1 = row-major)
#endif
#ifndef SPLITK
#define SPLITK 1        // K split factor; > 1 needs workspace (splitk_fixup.cuh's layout)
#endif
#ifndef CUDAL2_RUNTIME_SPLITK
#define CUDAL2_RUNTIME_SPLITK 0   // 1: the split count is gridDim.y, chosen per call (skinny)
#endif
#ifndef CUDAL2_STORE_CT
#define CUDAL2_STORE_CT 0   // 1: the kernel computes C^T and stores it transposed (skinny_n)
#endif
#ifndef CUDAL2_STREAM_EVICT_FIRST
#define CUDAL2_STREAM_EVICT_FIRST 0   // 1: B, read once (skinny), loaded with an L2 evict-first policy
#endif
#ifndef A_REGS
// 1 (skinny's A_LOAD "regs"): A, the small operand read through L2, skips the cp.async ring. Each
// k-tile of A is loaded into registers one k-tile ahead and stored into one of two A buffers, so
// the STAGES ring holds B alone: more of the streamed operand in flight per byte of shared memory
// (a 64-row A took a third of each 64x128 stage). L2's latency hides behind one k-tile.
#define A_REGS 0
#endif
#ifndef CUDAL2_PDL
#define CUDAL2_PDL 0   // 1: launches may ask for programmatic dependent launch (skinny's option pdl)
#endif
// Programmatic dependent launch exists from sm_90 on: there the kernel waits (griddepcontrol.wait)
// for the stream's previous grid before touching global memory, and a call with pdl asks for the
// launch attribute; other builds ignore the option.
#if CUDAL2_PDL && defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ >= 900
#define CUDAL2_PDL_LAUNCH 1
#else
#define CUDAL2_PDL_LAUNCH 0
#endif
#ifndef SPLITK_MAX_MN
#define SPLITK_MAX_MN 2097152   // split-K serves M*N up to this; sizes the declared workspace
#endif
#ifndef ACC_F16
#define ACC_F16 0       // 0: fp32 accumulate, 1: fp16 accumulate
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0     // 0: B row-major K x N ("RR"), 1: B column-major, stored N x K ("RC")
#endif
#ifndef CUDAL2_STYLE
#define CUDAL2_STYLE "mma"
#endif
#ifndef CUDAL2_FAMILY
#define CUDAL2_FAMILY "mma"
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 800)
#error "cudal2 mma/ptx HGEMM needs sm_80 or later (cp.async, ldmatrix, mma.sync.m16n8k16)"
#endif

#define CUDAL2_STR2(x) #x
#define CUDAL2_STR(x) CUDAL2_STR2(x)

namespace cudal2_hgemm_impl {

constexpr int kWarpsM = BM / WM;
constexpr int kWarpsN = BN / WN;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kMI = WM / 16;   // m16 fragments per warp tile
constexpr int kNI = WN / 8;    // n8 fragments per warp tile
constexpr int kPad = 8;        // halfs of padding per shared-memory row (16 bytes)
constexpr int kAStride = BK + kPad;            // A tile: BM rows of BK (k contiguous)
#if LAYOUT_RC
constexpr int kBRows = BN, kBCols = BK;        // B tile: BN rows of BK (k contiguous)
#else
constexpr int kBRows = BK, kBCols = BN;        // B tile: BK rows of BN (n contiguous)
#endif
constexpr int kBStride = kBCols + kPad;
constexpr int kAStage = BM * kAStride;         // halfs per stage
constexpr int kBStage = kBRows * kBStride;
constexpr int kABufs = A_REGS ? 2 : STAGES;    // A buffers: the ring's stages, or two (A_REGS)
constexpr size_t kSmemBytes = ((size_t)kABufs * kAStage + (size_t)STAGES * kBStage) * sizeof(half);
constexpr int kAChunks = BM * BK / 8 / kThreads;   // 16-byte chunks of an A k-tile per thread
// Stream-K's last arriver: contributors whose fragments (kMI * kNI float4 per thread) it requests
// at once, 64 floats in flight per thread (the build meta's "fixup_batch": "streamk").
constexpr int kStreamkBatch = kMI * kNI >= 16 ? 1 : 16 / (kMI * kNI);

static_assert(BM % WM == 0 && BN % WN == 0, "warp tile must divide the block tile");
static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16x16");
static_assert(BK % 16 == 0, "BK must be a multiple of 16 (mma k16)");
static_assert(kThreads <= 1024, "too many threads per block");
static_assert((BM * BK / 8) % kThreads == 0, "A tile 16-byte chunks must split evenly over threads");
static_assert((BK * BN / 8) % kThreads == 0, "B tile 16-byte chunks must split evenly over threads");
static_assert(STAGES >= 2, "STAGES must be >= 2");
static_assert(SWIZZLE >= 1, "SWIZZLE must be >= 1");
static_assert(SPLITK >= 1 && SPLITK <= 65535, "SPLITK must be in [1, 65535]");
static_assert(SPLITK_MAX_MN >= 1, "SPLITK_MAX_MN must be >= 1");
// Workspace the caller must provide (fixed, so the ABI 1 meta can declare it): the fixup's
// partial slabs for an M x N output with M*N <= SPLITK_MAX_MN plus one semaphore per tile. Tiles
// of such an output: ceil(M/BM)*ceil(N/BN) <= MN/(BM*BN) + M/BM + N/BN + 1, and M/BM + N/BN <=
// SPLITK_MAX_MN/min(BM, BN) + 1 for M, N >= 1.
constexpr long long kMaxSplitTiles = (long long)SPLITK_MAX_MN / (BM * BN) +
                                     (long long)SPLITK_MAX_MN / (BM < BN ? BM : BN) + 3;
static unsigned long long workspace_declared() {
  return cudal2_splitk::workspace_bytes(SPLITK, 1, SPLITK_MAX_MN, kMaxSplitTiles);
}

#if ACC_F16
typedef uint32_t AccFrag[kMI][kNI][2];   // packed half2: {row g, cols 2t..2t+1}, {row g+8, ...}
#else
typedef float AccFrag[kMI][kNI][4];      // {g,2t} {g,2t+1} {g+8,2t} {g+8,2t+1}
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; bytes < 16 copies that many and zero-fills the rest (0 = pure zero-fill).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
// The same with an L2 cache policy (createpolicy): the bytes of a streamed operand, read once,
// are the first L2 lines evicted, so they do not push out what is read again (A, the partials).
__device__ __forceinline__ void cp_async_16_hint(uint32_t dst, const void* src, int bytes,
                                                 uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 8 halves from global (gr, gc) by guarded 2-byte loads: zero where !row_ok or col >= col_lim.
__device__ __forceinline__ uint4 load_chunk_guarded(const half* g, int ld, int gr, int gc,
                                                    bool row_ok, int col_lim) {
  const unsigned short* p =
      reinterpret_cast<const unsigned short*>(g) + (size_t)gr * (size_t)ld + gc;
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = (row_ok && gc + 2 * j < col_lim) ? p[2 * j] : 0u;
    const uint32_t hi = (row_ok && gc + 2 * j + 1 < col_lim) ? p[2 * j + 1] : 0u;
    w[j] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Copies a ROWS x COLS tile (COLS contiguous in global and shared memory) starting at global
// (r0, c0); elements at row >= row_lim or col >= col_lim read as zero. VEC: 16-byte cp.async
// (needs 16-byte aligned base and ld % 8 == 0); else guarded 2-byte loads and 16-byte smem stores.
// HINT: the 16-byte copies carry the L2 cache policy `policy`.
template <int ROWS, int COLS, bool VEC, bool HINT = false>
__device__ __forceinline__ void load_tile(half* smem, int sstride, const half* g, int ld, int r0,
                                          int row_lim, int c0, int col_lim, int tid,
                                          uint64_t policy = 0) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kIters = ROWS * kChunksPerRow / kThreads;
  static_assert(kThreads % kChunksPerRow == 0, "a thread's chunks share one column");
  // A thread keeps one column c and steps kRowStep rows per chunk: one unsigned division (no
  // sign fix-ups) for all its chunks, the fewest instructions before the first load.
  constexpr int kRowStep = kThreads / kChunksPerRow;
  const int r_t = (int)((unsigned)tid / kChunksPerRow), c = (int)((unsigned)tid % kChunksPerRow) * 8;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int r = r_t + i * kRowStep;
    const int gr = r0 + r, gc = c0 + c;
    half* dst = smem + r * sstride + c;
    if (VEC) {
      int valid = (gr < row_lim) ? (col_lim - gc) : 0;
      valid = valid < 0 ? 0 : (valid > 8 ? 8 : valid);
      const half* src = valid > 0 ? g + (size_t)gr * (size_t)ld + gc : g;
      if (HINT)
        cp_async_16_hint(smem_u32(dst), src, valid * 2, policy);
      else
        cp_async_16(smem_u32(dst), src, valid * 2);
    } else {
      *reinterpret_cast<uint4*>(dst) = load_chunk_guarded(g, ld, gr, gc, gr < row_lim, col_lim);
    }
  }
}

#if A_REGS
// A_REGS: this thread's chunks of the A k-tile at (r0, c0), in load_tile's order and zero fill,
// loaded through L2 (ld.global.cg) into registers that store_a_regs later writes to a buffer.
template <bool VEC>
__device__ __forceinline__ void load_a_regs(uint4 (&r)[kAChunks], const half* g, int ld, int r0,
                                            int row_lim, int c0, int col_lim, int tid) {
  constexpr int kChunksPerRow = BK / 8;
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads;
    const int gr = r0 + idx / kChunksPerRow, gc = c0 + (idx % kChunksPerRow) * 8;
    const bool row_ok = gr < row_lim;
    if (VEC && row_ok && gc + 8 <= col_lim) {
      r[i] = __ldcg(reinterpret_cast<const uint4*>(g + (size_t)gr * (size_t)ld + gc));
    } else {   // a K residue, or unaligned operands
      r[i] = load_chunk_guarded(g, ld, gr, gc, row_ok, col_lim);
    }
  }
}
__device__ __forceinline__ void store_a_regs(half* smem, const uint4 (&r)[kAChunks], int tid) {
  constexpr int kChunksPerRow = BK / 8;
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads;
    *reinterpret_cast<uint4*>(smem + (idx / kChunksPerRow) * kAStride + (idx % kChunksPerRow) * 8) = r[i];
  }
}
#endif

#if defined(CUDAL2_PTX_KSTEP)
// The ptx family supplies cudal2_ptx_kstep (one asm block per k16 step) before including us.
#else
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

#if ACC_F16
__device__ __forceinline__ void mma16816(uint32_t (&c)[2], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, "
      "{%0,%1};\n"
      : "+r"(c[0]), "+r"(c[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// One k16 step of the warp tile: ldmatrix A (kMI x4) and B (kNI/2 x4), then kMI*kNI mma.
// a_addr[mi]: this lane's ldmatrix row address for fragment mi; b_addr[p]: for n16 pair p.
__device__ __forceinline__ void warp_kstep(AccFrag& acc, const uint32_t (&a_addr)[kMI],
                                           const uint32_t (&b_addr)[kNI / 2]) {
  uint32_t a[kMI][4];
  uint32_t b[kNI / 2][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) ldmatrix_x4(a[mi], a_addr[mi]);
#pragma unroll
  for (int p = 0; p < kNI / 2; ++p) {
#if LAYOUT_RC
    ldmatrix_x4(b[p], b_addr[p]);
#else
    ldmatrix_x4_trans(b[p], b_addr[p]);
#endif
  }
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
      mma16816(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
}
#endif  // CUDAL2_PTX_KSTEP

// Tile index -> (tile_m, tile_n) with grouped raster: SWIZZLE tile rows are swept together
// column by column so their A rows and B columns stay in L2.
// by_tiles_n: the host's Divisor of tiles_n (streamk.cuh).
__device__ __forceinline__ void tile_coords(int pid, int tiles_m, int tiles_n,
                                            cudal2_streamk::Divisor by_tiles_n, int& tm, int& tn) {
  if (SWIZZLE == 1) {   // row-major: a multiply-high and a shift
    const unsigned q = cudal2_streamk::quotient((unsigned)pid, by_tiles_n);
    tm = (int)q;
    tn = pid - (int)q * tiles_n;
    return;
  }
  const int group = SWIZZLE * tiles_n;
  const int first_m = (pid / group) * SWIZZLE;
  const int rows = min(tiles_m - first_m, SWIZZLE);
  const int in_group = pid % group;
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}

// The cluster split-K reduction (splitk_fixup.cuh, "The cluster reduction"): sm_90a builds
// launch a split tile's CTAs as one thread-block cluster of (1, splits, 1) when splits <= 8 and
// such a cluster can be resident; they reduce through distributed shared memory, with no
// workspace. Runtime-split builds (skinny, streamk) also launch more splits as clusters of a
// count that divides them, each cluster's sum then through the workspace ("Two levels"). Other
// builds, split counts no cluster divides or no resident cluster: the global fixup.
#ifndef CUDAL2_CLUSTER_SPLITK
#if defined(__CUDA_ARCH_LIST__) && __CUDA_ARCH_LIST__ >= 900
#define CUDAL2_CLUSTER_SPLITK 1
#else
#define CUDAL2_CLUSTER_SPLITK 0
#endif
#endif

#if CUDAL2_CLUSTER_SPLITK
// One chunk of the fp32 tile in shared memory: kClusterRows rows at a stride of BN + 8 floats
// (the 8 rows of a fragment's float2 stores fall in distinct banks per half-warp), as many rows
// as the pipeline's buffers hold (BM, or BM halved until it fits).
constexpr int kCStride = BN + 8;
constexpr int cluster_rows() {
  int r = BM;
  while (r > 1 && (size_t)r * kCStride * sizeof(float) > kSmemBytes) r /= 2;
  return r;
}
constexpr int kClusterRows = cluster_rows();
static_assert(BM % kClusterRows == 0 && (size_t)kClusterRows * kCStride * sizeof(float) <= kSmemBytes,
              "a chunk of the cluster reduction must fit the pipeline's shared memory");
static_assert(BN % 4 == 0, "the cluster reduction reads 4 floats at a time");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
using cudal2_splitk::cluster_barrier;    // splitk_fixup.cuh: the cluster's device side
using cudal2_splitk::cluster_ctarank;
using cudal2_splitk::cluster_nctarank;
using cudal2_splitk::ld_peer4;
#endif
#endif  // CUDAL2_CLUSTER_SPLITK

// grid.x = tiles_m * tiles_n, grid.y = split index (streamk == 0). Each block computes one BM x BN
// tile of the K range [z*k_chunk, min(K, (z+1)*k_chunk)) and stores fp16 C (one split), or
// reduces the splits: inside its cluster (sm_90a, launched with cluster dims (1, splits, 1)) or
// through the workspace, where the last split of a tile to finish reduces them into C
// (splitk_fixup.cuh). walk.G > 0 (skinny builds' stream-K): grid.x CTAs share the tiles x
// k-tiles iterations as equal contiguous ranges (streamk.cuh). walk carries the host's Divisors
// of the call (the N tiles; stream-K's grid and k-tiles), so no CTA runs a division before its
// first load.
// Split-K builds carry the fixup too: "at least one CTA per SM" lets ptxas spend the registers
// that keeps it from spilling (ptx f16 SPLITK=2 spilled 32 bytes at its own choice of 128).
#if SPLITK > 1 || CUDAL2_RUNTIME_SPLITK
#define CUDAL2_HGEMM_BOUNDS __launch_bounds__(kThreads, 1)
#else
#define CUDAL2_HGEMM_BOUNDS __launch_bounds__(kThreads)
#endif
template <bool VEC>
__global__ void CUDAL2_HGEMM_BOUNDS
    hgemm_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
                 void* __restrict__ ws, int M, int N, int K, int lda, int ldb, int ldc,
                 int k_chunk, int c_vec2, cudal2_streamk::Walk walk) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  half* sA = reinterpret_cast<half*>(smem_raw);
  half* sB = sA + kABufs * kAStage;
#if CUDAL2_PDL_LAUNCH && defined(__CUDA_ARCH__)
  // Launched early (pdl): the previous grid's writes (A, B, the workspace) are visible only after
  // this; it returns at once for a launch without the attribute. No launch_dependents: the next
  // grid starts when this one ends.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / kWarpsN;
  const int wn = warp % kWarpsN;
  const int g = lane >> 2;
  const int t = lane & 3;

  const int tiles_m = (M + BM - 1) / BM;
  const int tiles_n = (N + BN - 1) / BN;

  // Per-lane ldmatrix byte offsets inside one stage (see docs/templates.md for the mapping).
  const uint32_t sA_base = smem_u32(sA);
  const uint32_t sB_base = smem_u32(sB);
  const uint32_t a_lane = ((wm * WM + (lane & 15)) * kAStride + (lane >> 4) * 8) * 2;
#if LAYOUT_RC
  const uint32_t b_lane = ((wn * WN + (lane & 7) + (lane >> 4) * 8) * kBStride + ((lane >> 3) & 1) * 8) * 2;
  constexpr uint32_t kBPairStep = 16 * kBStride * 2;   // next n16 pair: 16 rows down
  constexpr uint32_t kBKStep = 16 * 2;                 // next k16: 16 halfs right
#else
  const uint32_t b_lane = (((lane & 7) + ((lane >> 3) & 1) * 8) * kBStride + wn * WN + (lane >> 4) * 8) * 2;
  constexpr uint32_t kBPairStep = 16 * 2;              // next n16 pair: 16 halfs right
  constexpr uint32_t kBKStep = 16 * kBStride * 2;      // next k16: 16 rows down
#endif

  AccFrag acc;

  // The main loop of one tile over the K range [k_begin, k_end): acc from zero, the pipeline
  // drained (no copy in flight) when it returns.
  auto mainloop = [&](int m0, int n0, int k_begin, int k_end) {
    const int k_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
        for (int r = 0; r < (int)(sizeof(acc[0][0]) / sizeof(acc[0][0][0])); ++r) acc[mi][ni][r] = 0;

    auto load_stage = [&](int stage, int kt) {
      const int k0 = k_begin + kt * BK;
#if CUDAL2_STREAM_EVICT_FIRST   // made per stage, so no register holds it across the main loop
      const uint64_t b_policy = evict_first_policy();
#else
      const uint64_t b_policy = 0;
#endif
#if !A_REGS
      load_tile<BM, BK, VEC>(sA + stage * kAStage, kAStride, A, lda, m0, M, k0, k_end, tid);
#endif
#if LAYOUT_RC
      load_tile<BN, BK, VEC, CUDAL2_STREAM_EVICT_FIRST>(sB + stage * kBStage, kBStride, B, ldb, n0,
                                                        N, k0, k_end, tid, b_policy);
#else
      load_tile<BK, BN, VEC, CUDAL2_STREAM_EVICT_FIRST>(sB + stage * kBStage, kBStride, B, ldb, k0,
                                                        k_end, n0, N, tid, b_policy);
#endif
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();   // always commit so group counting stays uniform
    }
#if A_REGS
    uint4 a_regs[kAChunks];
    if (k_tiles > 0) {   // A's k-tile 0 into buffer 0: visible after the loop's first barrier
      load_a_regs<VEC>(a_regs, A, lda, m0, M, k_begin, k_end, tid);
      store_a_regs(sA, a_regs, tid);
    }
#endif

    for (int kt = 0; kt < k_tiles; ++kt) {
#if A_REGS   // A's next k-tile in flight to registers while this one is computed
      if (kt + 1 < k_tiles) load_a_regs<VEC>(a_regs, A, lda, m0, M, k_begin + (kt + 1) * BK, k_end, tid);
#endif
      cp_async_wait<STAGES - 2>();
      __syncthreads();   // stage kt visible to all; stage kt-1 fully consumed by all warps
      const int next = kt + STAGES - 1;
      if (next < k_tiles) load_stage(next % STAGES, next);
      cp_async_commit();

      const int stage = kt % STAGES;
      const uint32_t a_stage = sA_base + (A_REGS ? kt & 1 : stage) * kAStage * 2 + a_lane;
      const uint32_t b_stage = sB_base + stage * kBStage * 2 + b_lane;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t a_addr[kMI];
        uint32_t b_addr[kNI / 2];
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) a_addr[mi] = a_stage + mi * 16 * kAStride * 2 + kk * 32;
#pragma unroll
        for (int p = 0; p < kNI / 2; ++p) b_addr[p] = b_stage + p * kBPairStep + kk * kBKStep;
#if defined(CUDAL2_PTX_KSTEP)
        cudal2_ptx_kstep(acc, a_addr, b_addr);
#else
        warp_kstep(acc, a_addr, b_addr);
#endif
      }
#if A_REGS   // buffer (kt + 1) & 1 was last read in k-tile kt - 1, before this k-tile's barrier
      if (kt + 1 < k_tiles) store_a_regs(sA + ((kt + 1) & 1) * kAStage, a_regs, tid);
#endif
    }
    cp_async_wait<0>();   // no copies may be in flight when the block exits
  };

  // Epilogue of the tile at (m0, n0): split z's fp32 partial into the workspace (global fixup,
  // partial == true) or fp16 C, predicated, straight from the accumulator fragments.
  auto epilogue = [&](int m0, int n0, bool partial, int z) {
    float* const part = cudal2_splitk::partials(ws);
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int col = n0 + wn * WN + ni * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + wm * WM + mi * 16 + g + 8 * h;
          if (row >= M) continue;
#if ACC_F16
          const __half2 v = *reinterpret_cast<const __half2*>(&acc[mi][ni][h]);
          const float v0 = __low2float(v), v1 = __high2float(v);
#else
          const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
#endif
          if (partial) {
#if CUDAL2_STORE_CT   // partials indexed by C's own (row, col): the fixup writes C row-major
            if (col < N) cudal2_splitk::store_partial(part, z, col, row, N, M, v0);
            if (col + 1 < N) cudal2_splitk::store_partial(part, z, col + 1, row, N, M, v1);
#else
            if (col < N) cudal2_splitk::store_partial(part, z, row, col, M, N, v0);
            if (col + 1 < N) cudal2_splitk::store_partial(part, z, row, col + 1, M, N, v1);
#endif
          } else if (CUDAL2_STORE_CT) {
            // element (row, col) of this kernel's product is C[col][row]: lanes g = 0..7 of one
            // t write 8 consecutive halfs of a row of C
            if (col < N) C[(size_t)col * (size_t)ldc + row] = __float2half_rn(v0);
            if (col + 1 < N) C[(size_t)(col + 1) * (size_t)ldc + row] = __float2half_rn(v1);
          } else {
            half* c = C + (size_t)row * (size_t)ldc + col;
            if (c_vec2 && col + 1 < N) {
#if ACC_F16
              *reinterpret_cast<__half2*>(c) = v;
#else
              *reinterpret_cast<__half2*>(c) = __floats2half2_rn(v0, v1);
#endif
            } else {
              if (col < N) c[0] = __float2half_rn(v0);
              if (col + 1 < N) c[1] = __float2half_rn(v1);
            }
          }
        }
      }
    }
  };

  // The work of this CTA: one tile and one K range (split z of gridDim.y), or on stream-K
  // (skinny builds, walk.G > 0) a walk over segments of (tile, k-tile) iterations. Split-K runs
  // as a single segment of the same loop, so the main loop and the epilogue are inlined once.
#if CUDAL2_RUNTIME_SPLITK
  static_assert(!ACC_F16, "the stream-K partials are the fp32 accumulators");
  constexpr int kFrags = kMI * kNI;                 // float4 fragments per thread
  constexpr int kTileFloats = BM * BN;              // = kThreads * kFrags * 4
  static_assert(kTileFloats == kThreads * kFrags * 4, "the warps cover the tile once");
  const int tiles = tiles_m * tiles_n;
  const bool streamk = walk.G > 0;   // the launcher's grid.x then
  const int G = (int)gridDim.x, cta = (int)blockIdx.x;
  // split-K: the one segment [0, 1); stream-K: this CTA's range of the tiles x k-tiles iterations
  long long it = 0, end = 1;
  if (streamk) {
    it = cudal2_streamk::range_begin(cta, walk);
    end = cudal2_streamk::range_begin(cta + 1, walk);
  }
  while (it < end) {
    cudal2_streamk::Segment sg = {(int)blockIdx.x, 0, 0, end};
    if (streamk) sg = cudal2_streamk::segment(it, end, walk);
    const int tile = sg.tile;
#else
  {
    const int tile = (int)blockIdx.x;
#endif
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, walk.by_tiles_n, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    const int z = blockIdx.y;
    const int splits = (SPLITK > 1 || CUDAL2_RUNTIME_SPLITK) ? (int)gridDim.y : 1;
    int k_begin = z * k_chunk;
    int k_end = min(K, k_begin + k_chunk);
#if CUDAL2_RUNTIME_SPLITK
    if (streamk) {
      k_begin = sg.kt_begin * BK;
      k_end = min(K, sg.kt_end * BK);
    }
#endif
    mainloop(m0, n0, k_begin, k_end);

    bool to_c = splits <= 1;   // fp16 C straight from the accumulators
    bool to_ws = false;        // split z's partial into the workspace (the global fixup)
    int slabs = splits;        // partial tiles the last arrival sums (two levels: the clusters')
#if CUDAL2_RUNTIME_SPLITK
    if (streamk) {
      const int first = cudal2_streamk::first_contributor(tile, walk.k_tiles, walk.iters, G);
      const int count = cudal2_streamk::contributors(tile, walk.k_tiles, walk.iters, G);
      to_c = count == 1;   // the whole tile in this range: C directly
      if (!to_c) {
        float* const part = cudal2_splitk::partials(ws);
        unsigned int* const sems = reinterpret_cast<unsigned int*>(
            reinterpret_cast<char*>(ws) + cudal2_streamk::semaphore_offset(G, tiles, kTileFloats));
        // this CTA's partial, in fragment order (coalesced 16-byte stores), into its own slot
        float4* mine = reinterpret_cast<float4*>(
            part + cudal2_streamk::slot(cta, tile) * (long long)kTileFloats);
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNI; ++ni)
            mine[(mi * kNI + ni) * kThreads + tid] =
                make_float4(acc[mi][ni][0], acc[mi][ni][1], acc[mi][ni][2], acc[mi][ni][3]);
        unsigned int* sem = sems + tile;
        to_c = cudal2_splitk::arrive(sem, count);    // CTA-uniform: true in the last arrival
        if (to_c) {
          // the contributors' partials summed IN CONTRIBUTOR ORDER from 0.f, then cleared
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
              for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
          // kStreamkBatch contributors' fragments requested before the first add: a round
          // trip per batch, not per contributor
          for (int q0 = 0; q0 < count; q0 += kStreamkBatch) {
            float4 v[kStreamkBatch][kMI * kNI];
#pragma unroll
            for (int u = 0; u < kStreamkBatch; ++u) {
              const float4* src = reinterpret_cast<const float4*>(
                  part + cudal2_streamk::slot(first + min(q0 + u, count - 1), tile) *
                             (long long)kTileFloats);
#pragma unroll
              for (int f = 0; f < kMI * kNI; ++f)
                v[u][f] = q0 + u < count ? __ldcg(src + f * kThreads + tid)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < kStreamkBatch; ++u) {
              if (q0 + u >= count) break;
              float4* dst = reinterpret_cast<float4*>(
                  part + cudal2_streamk::slot(first + q0 + u, tile) * (long long)kTileFloats);
#pragma unroll
              for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni) {
                  const float4 w = v[u][mi * kNI + ni];
                  acc[mi][ni][0] += w.x;
                  acc[mi][ni][1] += w.y;
                  acc[mi][ni][2] += w.z;
                  acc[mi][ni][3] += w.w;
                  dst[(mi * kNI + ni) * kThreads + tid] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
          }
          cudal2_splitk::release_tile(sem);
        }
      }
    } else
#else
    if (to_c) {   // one split: fp16 C (mma builds keep the order they always had)
      epilogue(m0, n0, false, 0);
      return;
    }
#endif
    if (!to_c) {
#if CUDAL2_CLUSTER_SPLITK && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (cluster_nctarank() > 1) {   // the tile's splits are clusters: reduce through DSMEM
        // cluster dims (1, cs, 1) over grid.y = splits: split z is rank z % cs of cluster z / cs.
        // One cluster (cs == splits) writes C; several (two-level) each write the sum of their
        // ranks into the workspace slab of their own, and the tile's last arriving CTA sums the
        // slabs in cluster order (splitk_fixup.cuh's finish_tile)
        const int cs = (int)cluster_nctarank(), rank = z % cs, group = z / cs;
#if CUDAL2_RUNTIME_SPLITK
        const int groups = splits / cs;
#else
        constexpr int groups = 1;   // the mma launcher clusters all SPLITK <= 8 splits of a tile
        if (cs != splits) __trap();
#endif
        if (splits % cs != 0 || cluster_ctarank() != (uint32_t)rank || (groups > 1 && !ws)) __trap();
        float* const sC = reinterpret_cast<float*>(smem_raw);
        const uint32_t sC_base = smem_u32(sC);
        constexpr int kUnitsPerRow = BN / 4;
        constexpr int kUnits = kClusterRows * kUnitsPerRow;
        const int u_begin = cudal2_splitk::cluster_slice_begin(rank, cs, kUnits);
        const int u_end = cudal2_splitk::cluster_slice_begin(rank + 1, cs, kUnits);
        float* const part = cudal2_splitk::partials(ws);
        __syncthreads();   // every warp is done reading the pipeline's buffers
#pragma unroll 1
        for (int r0 = 0; r0 < BM; r0 += kClusterRows) {
          // this CTA's partial rows [r0, r0 + kClusterRows) of the tile into its own shared memory
#pragma unroll
          for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int r = wm * WM + mi * 16 + g + 8 * h - r0;
                if (r < 0 || r >= kClusterRows) continue;
#if ACC_F16
                const __half2 v = *reinterpret_cast<const __half2*>(&acc[mi][ni][h]);
                const float2 f = make_float2(__low2float(v), __high2float(v));
#else
                const float2 f = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
#endif
                *reinterpret_cast<float2*>(sC + r * kCStride + wn * WN + ni * 8 + 2 * t) = f;
              }
          cluster_barrier();   // every rank's chunk written (release) and visible here (acquire)
          for (int u = u_begin + tid; u < u_end; u += kThreads) {
            const int r = u / kUnitsPerRow, c4 = (u % kUnitsPerRow) * 4;
            const uint32_t local = sC_base + (uint32_t)(r * kCStride + c4) * 4u;
            const cudal2_splitk::Float4 s = cudal2_splitk::cluster_sum4(
                cs, [&](int q) { return ld_peer4(local, (uint32_t)q); });
            const int row = m0 + r0 + r, col = n0 + c4;
            if (row >= M) continue;
            const float v[4] = {s.x, s.y, s.z, s.w};
            if (groups > 1) {   // this cluster's sum into its slab, in C's own (row, col)
#pragma unroll
              for (int j = 0; j < 4; ++j)
                if (col + j < N)
#if CUDAL2_STORE_CT
                  cudal2_splitk::store_partial(part, group, col + j, row, N, M, v[j]);
#else
                  cudal2_splitk::store_partial(part, group, row, col + j, M, N, v[j]);
#endif
              continue;
            }
#if CUDAL2_STORE_CT   // element (row, col) of this kernel's product is C[col][row]
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (col + j < N) C[(size_t)(col + j) * (size_t)ldc + row] = __float2half_rn(v[j]);
#else
            half* c = C + (size_t)row * (size_t)ldc + col;
            if (c_vec2 && col + 3 < N) {
              reinterpret_cast<__half2*>(c)[0] = __floats2half2_rn(v[0], v[1]);
              reinterpret_cast<__half2*>(c)[1] = __floats2half2_rn(v[2], v[3]);
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j)
                if (col + j < N) c[j] = __float2half_rn(v[j]);
            }
#endif
          }
          cluster_barrier();   // the peers are done reading: the chunk may be overwritten, or exit
        }
        if (groups == 1) return;
        slabs = groups;   // every cluster's slab written: the last CTA sums them (below)
      } else
#endif
      to_ws = true;   // in-kernel split-K fixup through the workspace: the last CTA writes C
    }
#if CUDAL2_RUNTIME_SPLITK
    if (to_c || to_ws) epilogue(m0, n0, to_ws, z);   // one inlined copy for every path
#else
    epilogue(m0, n0, true, z);
#endif
    if (to_ws || slabs < splits) {   // every split (or cluster) arrives; the last sums the slabs
      float* const part = cudal2_splitk::partials(ws);
      unsigned int* sem = cudal2_splitk::semaphores(ws, slabs, M, N) + blockIdx.x;
      if (cudal2_splitk::arrive(sem, splits)) {
#if CUDAL2_STORE_CT   // the tile in C's coordinates: BN rows of C from n0, BM columns from m0
        cudal2_splitk::finish_tile(part, slabs, N, M, n0, m0, BN, BM, C, ldc, tid, kThreads);
#else
        cudal2_splitk::finish_tile(part, slabs, M, N, m0, n0, BM, BN, C, ldc, tid, kThreads);
#endif
        cudal2_splitk::release_tile(sem);
      }
    }
#if CUDAL2_RUNTIME_SPLITK
    it = sg.next;
    if (it < end) __syncthreads();   // the next segment's prologue overwrites the buffers
#endif
  }
}

// Opt in to > 48 KiB of dynamic shared memory once per (device, kernel variant). again: the
// device dropped it (a cudaDeviceReset clears function attributes): forget it and make it anew.
// known (when given): whether an earlier call had made it.
template <bool VEC>
static cudaError_t ensure_smem_attribute(bool again = false, bool* known = nullptr) {
  if (known) *known = false;
  if (kSmemBytes <= 48 * 1024) return cudaSuccess;
  static std::atomic<unsigned long long> done{0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev >= 0 && dev < 64 ? (1ull << dev) : 0ull;
  if (again) done.fetch_and(~bit, std::memory_order_acq_rel);
  if (bit && (done.load(std::memory_order_acquire) & bit)) {
    if (known) *known = true;
    return cudaSuccess;
  }
  err = cudaFuncSetAttribute(reinterpret_cast<const void*>(&hgemm_kernel<VEC>),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
  if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

// Whether a cluster of `splits` CTAs of this kernel (dims (1, splits, 1), its shared memory) can
// be resident on the current device (cudaOccupancyMaxActiveClusters > 0): asked once per (device,
// split count) and cached. Builds without the cluster reduction, more than 8 splits, no device or
// a failed query (its error consumed, so it is not left for the caller's next launch): false,
// and the call takes the global fixup.
template <bool VEC>
static bool cluster_resident(int splits) {
#if CUDAL2_CLUSTER_SPLITK
  static std::atomic<int> cached[64][cudal2_splitk::kClusterMax + 1];
  if (splits < 2 || splits > cudal2_splitk::kClusterMax) return false;
  if (ensure_smem_attribute<VEC>() != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return cudal2_splitk::cluster_resident(cached, reinterpret_cast<const void*>(&hgemm_kernel<VEC>),
                                         kThreads, kSmemBytes, splits);
#else
  (void)splits;
  return false;
#endif
}

// The one launch of a call: the 16-byte-load (VEC) or guarded instantiation of hgemm_kernel;
// cluster_y > 1 (sm_90a, the tile's splits reduced in a cluster): cluster dims (1, cluster_y, 1)
// over grid.y == cluster_y; pdl (CUDAL2_PDL_LAUNCH builds): programmatic stream serialisation.
// Either makes it one cudaLaunchKernelEx.
template <bool VEC>
static cudaError_t launch_once(dim3 grid, void** args, cudaStream_t s, int cluster_y, bool pdl) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
#if CUDAL2_CLUSTER_SPLITK
  if (cluster_y > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = (unsigned)cluster_y;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
#else
  (void)cluster_y;
#endif
#if CUDAL2_PDL_LAUNCH
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
#else
  (void)pdl;
#endif
  if (n > 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(&hgemm_kernel<VEC>), args);
  }
  return cudaLaunchKernel(reinterpret_cast<const void*>(&hgemm_kernel<VEC>), grid, dim3(kThreads),
                          args, kSmemBytes, s);
}

// A launch refused with cudaErrorInvalidValue after the opt-in was made (a device reset dropped
// it; the arguments were checked before) consumes that error, opts in anew and is retried once.
template <bool VEC>
static cudaError_t launch_gemm(dim3 grid, void** args, cudaStream_t s, int cluster_y = 1,
                               bool pdl = false) {
  bool known = false;
  cudaError_t err = ensure_smem_attribute<VEC>(false, &known);
  if (err != cudaSuccess) return err;
  err = launch_once<VEC>(grid, args, s, cluster_y, pdl);
  if (err == cudaErrorInvalidValue && known) {
    (void)cudaGetLastError();                        // this launch's error, not the caller's
    err = ensure_smem_attribute<VEC>(true);
    if (err == cudaSuccess) err = launch_once<VEC>(grid, args, s, cluster_y, pdl);
  }
  return err;
}

static const char* arch_name() {
#if defined(CUDAL2_ARCH_NAME)
  return CUDAL2_ARCH_NAME;
#elif !defined(__CUDA_ARCH_LIST__)
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

#if !CUDAL2_RUNTIME_SPLITK   // the skinny family (skinny_hgemm.cuh) has its own entry points
static const char* build_meta() {
  static char buf[1536];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"%s\", \"family\": \"%s\", \"arch\": \"%s\", \"acc\": \"%s\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, %d], \"warp_tile\": [%d, %d], \"warps\": %d, "
           "\"threads\": %d, \"stages\": %d, \"smem_bytes\": %d, \"any_shape\": true, "
           "\"workspace_bytes\": %llu, \"workspace_per_mn\": %d, \"workspace_zero_init\": %s, "
           "\"splitk\": %d, \"splitk_max_mn\": %d, \"splitk_fixup\": \"%s\", "
           "\"cluster_splitk_max\": %d, "
           "\"vector_loads_need\": {\"ptr_align_bytes\": 16, \"ld_multiple\": 8}, "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"WM\": %d, \"WN\": %d, "
           "\"STAGES\": %d, \"SWIZZLE\": %d, \"SPLITK\": %d, \"SPLITK_MAX_MN\": %d, "
           "\"ACC\": \"%s\", \"LAYOUT\": \"%s\"}}",
           CUDAL2_STYLE, CUDAL2_FAMILY, arch_name(), ACC_F16 ? "f16" : "f32",
           LAYOUT_RC ? "RC" : "RR", BM, BN, BK, WM, WN, kWarpsM * kWarpsN, kThreads, STAGES,
           (int)kSmemBytes, workspace_declared(),
           SPLITK > 1 ? cudal2_splitk::slabs(SPLITK) * 4 : 0, SPLITK > 1 ? "true" : "false",
           SPLITK, SPLITK > 1 ? SPLITK_MAX_MN : 0,
           SPLITK > 1 ? (SPLITK_DETERMINISTIC ? "deterministic" : "atomic") : "none",
           CUDAL2_CLUSTER_SPLITK ? cudal2_splitk::kClusterMax : 0, BM, BN, BK, WM, WN, STAGES,
           SWIZZLE, SPLITK, SPLITK_MAX_MN, ACC_F16 ? "f16" : "f32", LAYOUT_RC ? "RC" : "RR");
  return buf;
}
#endif

}  // namespace cudal2_hgemm_impl

#if !CUDAL2_RUNTIME_SPLITK
extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  using namespace cudal2_hgemm_impl;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N) return cudaErrorInvalidValue;
  half* c = reinterpret_cast<half*>(C);
  // K == 0 (C = 0) runs the same kernel with one split and no k tiles: its epilogue stores zeros.
  if (K > 0 && (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N)))
    return cudaErrorInvalidValue;
  // fp16 operands are at least 2-byte aligned (the guarded path loads 2 bytes at a time).
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
       reinterpret_cast<uintptr_t>(C)) % 2 != 0)
    return cudaErrorInvalidValue;

  const long long tiles = (long long)((M + BM - 1) / BM) * (long long)((N + BN - 1) / BN);
  if (tiles > 2147483647LL) return cudaErrorInvalidValue;
  const int splits = K > 0 ? SPLITK : 1;
  // K range per split, rounded up to whole BK tiles so every split starts 16-byte aligned.
  const int per_split = (K + splits - 1) / splits;
  int k_chunk = ((per_split + BK - 1) / BK) * BK;
  const bool vec = (reinterpret_cast<uintptr_t>(A) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(B) % 16 == 0) && (lda % 8 == 0) && (ldb % 8 == 0);
  void* ws = nullptr;
  int cluster_y = 1;   // > 1: the splits reduce inside a cluster (sm_90a), no workspace
  if (splits > 1) {
    if ((size_t)M * (size_t)N > (size_t)SPLITK_MAX_MN) return cudaErrorInvalidValue;
    if (vec ? cluster_resident<true>(splits) : cluster_resident<false>(splits)) {
      cluster_y = splits;
    } else {
      const size_t need = cudal2_splitk::workspace_bytes(splits, M, N, tiles);
      if (workspace == nullptr || workspace_bytes < need ||
          (reinterpret_cast<uintptr_t>(workspace) % 16) != 0)
        return cudaErrorInvalidValue;
      ws = workspace;
    }
  }

  int c_vec2 = (reinterpret_cast<uintptr_t>(C) % 4 == 0) && (ldc % 2 == 0);
  cudal2_streamk::Walk walk = cudal2_streamk::walk((N + BN - 1) / BN, tiles, 1, 0);   // no stream-K
  const half* a = reinterpret_cast<const half*>(A);
  const half* b = reinterpret_cast<const half*>(B);
  void* args[] = {&a, &b, &c, &ws, &M, &N, &K, &lda, &ldb, &ldc, &k_chunk, &c_vec2, &walk};
  const dim3 grid((unsigned)tiles, (unsigned)splits);
  return vec ? launch_gemm<true>(grid, args, s, cluster_y) : launch_gemm<false>(grid, args, s, cluster_y);
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_hgemm_impl::build_meta();   // thread-safe one-time init
  return meta;
}
#endif
