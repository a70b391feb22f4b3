// cudal2 kernel family "skinny": C[M,N] = A[M,K] @ B for M <= BM <= 64 (LLM decode, nn.Linear's
// x @ W.t() with B column-major: LAYOUT_RC 1), bound by HBM bandwidth on B, not tensor throughput.
//
// One CTA row covers all M (BM = 16, 32 or 64: M padded with zero rows), so every element of the
// large operand B (K x N) is read from HBM exactly once, by 16-byte cp.async.cg (L2 only, no L1
// allocation; an L2 evict-first policy, since each byte is read once) into a STAGES-deep
// shared-memory pipeline; the small operand A (M x K, at most 64 x K x 2 bytes) is read through
// L2 by every N tile: through the same ring (A_LOAD "ring"), or (A_LOAD "regs", A_REGS 1) into
// registers one k-tile ahead and two shared buffers, so the ring's STAGES hold B alone. Tensor cores: mma.sync m16n8k16 with fp32
// accumulation; rows beyond M are zero and cost tensor issue slots only, which a bandwidth-bound
// kernel has to spare (M = 1 at BM = 16: 16 flop per byte of B, ~54 TFLOP/s at 3.35 TB/s, within
// mma.sync's measured ~290 TFLOP/s on an H100).
//
// K is split across the SMs at run time: the split count fills about two CTAs per SM over the
// N tiles (runtime option "splits", 0 = that choice from M, N, K and the SM count), and the
// splits reduce in fp32 inside the kernel (splitk_fixup.cuh: one launch, deterministic order,
// the workspace left zero for the next call; on sm_90a 2..8 splits reduce inside a thread-block
// cluster through distributed shared memory, with no workspace, and more in clusters of the
// largest count <= 8 that divides them, each cluster's sum then through the workspace, so the
// workspace carries splits / 8 partial tiles, not splits). Runtime option "decomposition"
// (0 heuristic, 2 split-K, 3 stream-K): stream-K (streamk.cuh) runs as many CTAs as are resident
// (the occupancy API, cached per device) over equal contiguous ranges of the tiles x k-tiles
// iterations, so no call ends in a partial wave; the heuristic takes it where split-K would.
//
// Runtime option "pdl" (0, 1): 1 launches with programmatic stream serialisation (sm_90a builds;
// sm_80 builds run it as 0), so the grid may be scheduled while the stream's previous kernel
// drains; the kernel's first instruction waits for that kernel (griddepcontrol.wait) before any
// read of A, B or the workspace. The planner does not time it (the kernel timer's back-to-back
// calls would let it overlap a call of the same kernel, a path no baseline gets); dispatch uses it
// under CUDAL2_PDL=1, and a model replay measures it.
//
// The pipeline, fragment mapping and epilogue are mma_hgemm.cuh's (included below with its
// runtime-split hook); this file adds the ABI 2 entry points. It serves only what its 16-byte
// loads serve and refuses the rest with cudaErrorInvalidValue: M > BM, A or B not 16-byte
// aligned, lda or ldb not a multiple of 8, too small or misaligned a workspace, an unlisted
// option.
//
// The mirror, family "skinny_n" (skinny_n_hgemm.cuh sets CUDAL2_SKINNY_N): N <= BM with M large
// and B column-major (x @ W.t() with few output features: a LoRA down-projection, a router, a
// classifier head). It runs the same kernel on C^T = B^T A^T: B^T (N x K, B's own storage) is
// the small on-chip operand, A (M x K row-major, which is A^T column-major) the streamed one, and
// the epilogue and the split-K fixup store C transposed back into row-major C
// (CUDAL2_STORE_CT). Row-major B (RR) would need column-major loads of the small operand: not
// served.

#ifndef BM
#define BM 16           // rows of the padded M tile: the largest M served (16, 32 or 64)
#endif
#ifndef BN
#define BN 128          // columns of B per CTA
#endif
#ifndef BK
#define BK 64           // K depth of one pipeline stage
#endif
#ifndef WM
#define WM 16           // warp tile rows
#endif
#ifndef WN
#define WN 32           // warp tile columns
#endif
#ifndef STAGES
#define STAGES 4        // cp.async pipeline depth
#endif
#ifndef A_REGS
#define A_REGS 0        // A_LOAD "regs" (1): A through registers into two buffers, the ring holds B only
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 1     // 1: B column-major (nn.Linear weight, stored N x K); 0: B row-major
#endif
#define ACC_F16 0
#define SWIZZLE 1
#define SPLITK 1
#define SPLITK_MAX_MN 1
#define CUDAL2_RUNTIME_SPLITK 1
#ifndef CUDAL2_STREAMK_FAMILY
#define CUDAL2_STREAMK_FAMILY 0   // 1: family "streamk" (streamk_hgemm.cuh): any M, a grid of M x N tiles
#endif
#if CUDAL2_STREAMK_FAMILY
#define CUDAL2_STREAM_EVICT_FIRST 0   // every row tile reads B again: keep it in L2
#else
#define CUDAL2_STREAM_EVICT_FIRST 1   // B (the mirror: A) is read once: evict it from L2 first
#endif
#define CUDAL2_PDL 1                  // runtime option pdl: programmatic dependent launch (sm_90a)
#define CUDAL2_STYLE "mma"
#ifndef CUDAL2_SKINNY_N
#define CUDAL2_SKINNY_N 0   // 1: the mirror (N <= BM, B column-major), family skinny_n
#endif
#if CUDAL2_STREAMK_FAMILY
#define CUDAL2_FAMILY "streamk"
#if CUDAL2_SKINNY_N
#error "the streamk family has no mirror"
#endif
#elif CUDAL2_SKINNY_N
#define CUDAL2_FAMILY "skinny_n"
#define CUDAL2_STORE_CT 1
#if !LAYOUT_RC
#error "skinny_n serves B column-major only (LAYOUT_RC 1)"
#endif
#else
#define CUDAL2_FAMILY "skinny"
#endif

#if BM > 64 && !CUDAL2_STREAMK_FAMILY
#error "the skinny family serves M <= 64 (BM 16, 32 or 64)"
#endif

#include "mma_hgemm.cuh"

namespace cudal2_skinny {
using namespace cudal2_hgemm_impl;

constexpr int kMaxSplits = 64;
// runtime option "splits" (0 = auto): every count up to the cluster's 8 (a wave of tiles x splits
// CTAs that fills the SMs is a count the shape picks, not a power of two), then coarser to 64
// streamk: every count to 64 (a deep-K row fills the slots with tiles x splits CTAs, and a few
// tiles leave few counts that do: each one is a grid of its own)
#if CUDAL2_STREAMK_FAMILY
#define CUDAL2_SPLIT_VALUES "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, " \
  "21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, " \
  "45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64]"
static bool split_value_ok(int v) { return v >= 0 && v <= kMaxSplits; }
#else
#define CUDAL2_SPLIT_VALUES "[0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64]"
constexpr int kSplitValues[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64};
static bool split_value_ok(int v) {
  for (int x : kSplitValues)
    if (v == x) return true;
  return false;
}
#endif
// runtime option "decomposition" (docs/abi.md's shared name): 0 heuristic (stream-K where the
// split-K grid would leave a tail, else split-K), 2 split-K, 3 stream-K (ignores "splits")
constexpr int kDecompositionValues[] = {0, 2, 3};
constexpr int kPdlValues[] = {0, 1};   // runtime option "pdl": programmatic dependent launch
constexpr int kOptions = 3;

// SMs of the current device (cached per device; 0 when the query fails).
static int sm_count() {
  static std::atomic<int> cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev >= 0 && dev < 64) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  if (dev >= 0 && dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Resident CTA slots of this build on the current device: CTAs per SM of the kernel with its
// shared memory (cudaOccupancyMaxActiveBlocksPerMultiprocessor) times the SMs; cached per device;
// 0 when a query fails (its error consumed).
static int resident_slots() {
  static std::atomic<int> cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < 64) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  const int sms = sm_count();
  int per_sm = 0;
  if (sms <= 0 || ensure_smem_attribute<true>() != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, reinterpret_cast<const void*>(&hgemm_kernel<true>), kThreads, kSmemBytes) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int slots = per_sm * sms;
  if (slots > 0 && dev >= 0 && dev < 64) cached[dev].store(slots, std::memory_order_relaxed);
  return slots;
}

static bool option_ok(const int* options) {
  if (options == nullptr) return true;
  const bool split_ok = split_value_ok(options[0]);
  bool dec_ok = false, pdl_ok = false;
  for (int v : kDecompositionValues) dec_ok = dec_ok || options[1] == v;
  for (int v : kPdlValues) pdl_ok = pdl_ok || options[2] == v;
  return split_ok && dec_ok && pdl_ok;
}

// Output tiles of the kernel's own (M, N): one row of N tiles for the skinny families (M <= BM).
static long long output_tiles(int M, int N) {
  return (long long)((M + BM - 1) / BM) * ((N + BN - 1) / BN);
}

// The split count and K range per split of one call over `tiles` output tiles; splits * k_chunk
// covers K with no empty split. asked: the option (0: about two CTAs per SM over the tiles), sms:
// the SM count.
static void plan(long long tiles, int K, int asked, int sms, int& splits, int& k_chunk) {
  const int k_tiles = (K + BK - 1) / BK;
  long long s = asked;
  if (s <= 0) s = (2LL * (sms > 0 ? sms : 132) + tiles - 1) / tiles;
  s = s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : s);
  if (s > k_tiles) s = k_tiles > 0 ? k_tiles : 1;
  const int per = (int)((k_tiles + s - 1) / s);   // whole BK tiles per split
  k_chunk = per * BK;
  splits = K > 0 ? (K + k_chunk - 1) / k_chunk : 1;
}

// The heuristic's test: stream-K over `slots` CTAs walks fewer k-tiles per CTA than split-K's
// grid (tiles x splits, k_chunk / BK k-tiles each) does over its waves, i.e. split-K would end
// in a partial wave that stream-K does not have.
static bool streamk_shorter(long long tiles, int k_tiles, int splits, int k_chunk, int slots) {
  if (slots <= 0) return false;
  const long long iters = tiles * k_tiles;
  const int G = cudal2_streamk::grid(iters, slots);
  const long long sk = (iters + G - 1) / G;
  const long long grid = tiles * splits;
  const long long sp = (grid + slots - 1) / slots * (k_chunk / BK);
  return sk < sp;
}

// How one call runs: split-K through the workspace (kGlobal), split-K reduced in clusters
// (kCluster, sm_90a: clusters of `cluster` splits, the largest count of at most 8 that divides
// the splits; one cluster per tile needs no workspace, several sum their clusters' slabs through
// it) or stream-K (kStreamK).
enum Mode { kGlobal = 0, kCluster = 1, kStreamK = 2 };
struct Call {
  Mode mode;
  int splits, k_chunk;   // split-K: grid (tiles, splits)
  int ctas;              // stream-K: grid (ctas)
  size_t ws;             // workspace bytes the call needs
  int cluster;           // kCluster: CTAs per cluster (splits of a tile reduced through DSMEM)
};

// The cluster of a split count: its largest divisor of at most kClusterMax (1: none).
static int cluster_of(int splits) {
  for (int c = splits < cudal2_splitk::kClusterMax ? splits : cudal2_splitk::kClusterMax; c > 1; --c)
    if (splits % c == 0) return c;
  return 1;
}

// The call's plan for the kernel's own (M, N) (the mirror's transposed one) and K > 0. Returns
// cudaErrorInvalidDevice when it needs the device and cannot ask it.
static cudaError_t decide(int M, int N, int K, const int* options, Call& c) {
  const int asked = options ? options[0] : 0;
  const int dec = options ? options[1] : 0;
  const long long tiles = output_tiles(M, N);
  const int k_tiles = (K + BK - 1) / BK;
  c = Call{kGlobal, 1, k_tiles * BK, 0, 0, 1};
  const bool need_sms = asked == 0 || dec == 3;
  const int sms = need_sms ? sm_count() : 1;
  if (sms <= 0) return cudaErrorInvalidDevice;
  bool streamk = dec == 3;
  if (!streamk) plan(tiles, K, asked, sms, c.splits, c.k_chunk);
  if (dec == 0 && asked == 0) {
    const int slots = resident_slots();
    if (slots <= 0) return cudaErrorInvalidDevice;
    streamk = streamk_shorter(tiles, k_tiles, c.splits, c.k_chunk, slots);
  }
  if (streamk) {
    const int slots = resident_slots();
    if (slots <= 0) return cudaErrorInvalidDevice;
    c.mode = kStreamK;
    c.ctas = cudal2_streamk::grid(tiles * k_tiles, slots);
    c.splits = 1;
    c.ws = cudal2_streamk::workspace_bytes(c.ctas, (int)tiles, k_tiles, BM * BN);
    return cudaSuccess;
  }
  const int cluster = cluster_of(c.splits);
  if (cluster > 1 && cluster_resident<true>(cluster)) {
    c.mode = kCluster;
    c.cluster = cluster;
    if (cluster < c.splits) c.ws = cudal2_splitk::workspace_bytes(c.splits / cluster, M, N, tiles);
    return cudaSuccess;
  }
  c.ws = cudal2_splitk::workspace_bytes(c.splits, M, N, tiles);
  return cudaSuccess;
}

// The call's shape in the kernel's own terms: (M, N) of the product it computes (the mirror
// computes C^T, N x M).
struct KernelShape { int M, N; };
static KernelShape kernel_shape(int M, int N) {
  return CUDAL2_SKINNY_N ? KernelShape{N, M} : KernelShape{M, N};
}

static const char* build_meta() {
  static char buf[2048];
  // the largest M (the mirror: N) served; the streamk family serves any
  char limit[32] = "";
  if (!CUDAL2_STREAMK_FAMILY) snprintf(limit, sizeof(limit), "\"%s\": %d, ", CUDAL2_SKINNY_N ? "max_n" : "max_m", BM);
  // the tile in C's terms: the mirror's BM bounds N and its BN tiles M
  snprintf(buf, sizeof(buf),
           "{\"style\": \"%s\", \"family\": \"%s\", \"arch\": \"%s\", \"abi\": 2, \"acc\": \"f32\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, %d], \"warp_tile\": [%d, %d], \"warps\": %d, "
           "\"threads\": %d, \"stages\": %d, \"smem_bytes\": %d, \"any_shape\": true, "
           "%s\"divisible\": [1, %d, 8], "
           "\"workspace_bytes\": %llu, \"workspace_zero_init\": true, "
           "\"splitk_fixup\": \"%s\", \"cluster_splitk_max\": %d, \"streamk\": true, "
           "\"fixup_batch\": {\"splits\": %d, \"streamk\": %d}, \"cluster_groups\": %s, "
           "\"options\": [{\"name\": \"splits\", "
           "\"values\": " CUDAL2_SPLIT_VALUES ", \"default\": 0}, "
           "{\"name\": \"decomposition\", \"values\": [0, 2, 3], \"default\": 0}, "
           "{\"name\": \"pdl\", \"values\": [0, 1], \"default\": 0}], \"pdl\": %s, "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"WM\": %d, \"WN\": %d, "
           "\"STAGES\": %d, \"LAYOUT\": \"%s\", \"A_LOAD\": \"%s\"}}",
           CUDAL2_STYLE, CUDAL2_FAMILY, arch_name(), LAYOUT_RC ? "RC" : "RR",
           CUDAL2_SKINNY_N ? BN : BM, CUDAL2_SKINNY_N ? BM : BN, BK, WM, WN,
           kWarpsM * kWarpsN, kThreads, STAGES, (int)kSmemBytes,
           limit, LAYOUT_RC ? 1 : 8,
           // for information: a 64 x 16384 x 16384 call at the most splits
           (unsigned long long)cudal2_splitk::workspace_bytes(kMaxSplits, BM, 16384,
                                                              (16384 + BN - 1) / BN),
           SPLITK_DETERMINISTIC ? "deterministic" : "atomic",
           CUDAL2_CLUSTER_SPLITK ? cudal2_splitk::kClusterMax : 0, cudal2_splitk::kFixupBatch,
           kStreamkBatch, CUDAL2_CLUSTER_SPLITK ? "true" : "false",
           CUDAL2_PDL_LAUNCH ? "true" : "false",
           BM, BN, BK, WM, WN, STAGES,
           LAYOUT_RC ? "RC" : "RR", A_REGS ? "regs" : "ring");
  return buf;
}

}  // namespace cudal2_skinny

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  using namespace cudal2_skinny;
  if (M <= 0 || N <= 0 || K <= 0 || !option_ok(options)) return 0;
  const KernelShape k = kernel_shape(M, N);
  Call c;
  if (decide(k.M, k.N, K, options, c) == cudaSuccess) return c.ws;
  // no device to ask: the bound over every plan the launcher could pick
  const long long tiles = output_tiles(k.M, k.N);
  const int k_tiles = (K + BK - 1) / BK;
  const size_t split = cudal2_splitk::workspace_bytes(kMaxSplits, k.M, k.N, tiles);
  const size_t sk = cudal2_streamk::workspace_bytes(
      cudal2_streamk::grid(tiles * k_tiles, cudal2_streamk::kMaxCtas), (int)tiles, k_tiles, BM * BN);
  return split > sk ? split : sk;
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream, const int* options) {
  using namespace cudal2_skinny;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const KernelShape k = kernel_shape(M, N);
  if (M < 0 || N < 0 || K < 0 || (!CUDAL2_STREAMK_FAMILY && k.M > BM) || !option_ok(options))
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N || reinterpret_cast<uintptr_t>(C) % 2 != 0) return cudaErrorInvalidValue;
  // 16-byte loads only: both operands aligned, leading dimensions multiples of 8 elements
  if (K > 0 && (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N) ||
                lda % 8 != 0 || ldb % 8 != 0 ||
                (reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0))
    return cudaErrorInvalidValue;
  const long long tiles = output_tiles(k.M, k.N);
  if (tiles > 2147483647LL) return cudaErrorInvalidValue;   // grid.x
  Call c{kGlobal, 1, 0, 0, 0, 1};   // K == 0: one split with no k-tiles writes zeros
  if (K > 0) {
    const cudaError_t err = decide(k.M, k.N, K, options, c);
    if (err != cudaSuccess) return err;
  }
  void* ws = nullptr;
  if (c.ws > 0) {
    if (workspace == nullptr || workspace_bytes < c.ws ||
        reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return cudaErrorInvalidValue;
    ws = workspace;
  }
  // the mirror stores C transposed, two bytes at a time
  int c_vec2 = !CUDAL2_SKINNY_N && (reinterpret_cast<uintptr_t>(C) % 4 == 0) && (ldc % 2 == 0);
  // the mirror's small operand is B (its N x K storage is B^T row-major), its streamed one A
  const half* a = reinterpret_cast<const half*>(CUDAL2_SKINNY_N ? B : A);
  const half* b = reinterpret_cast<const half*>(CUDAL2_SKINNY_N ? A : B);
  int lda_k = CUDAL2_SKINNY_N ? ldb : lda, ldb_k = CUDAL2_SKINNY_N ? lda : ldb;
  int m_k = k.M, n_k = k.N;
  half* cp = reinterpret_cast<half*>(C);
  int k_chunk = c.k_chunk;
  // the call's divisors, worked out here once rather than in every CTA (streamk.cuh)
  cudal2_streamk::Walk walk = cudal2_streamk::walk((n_k + BN - 1) / BN, tiles, (K + BK - 1) / BK,
                                                   c.mode == kStreamK ? c.ctas : 0);
  void* args[] = {&a, &b, &cp, &ws, &m_k, &n_k, &K, &lda_k, &ldb_k, &ldc, &k_chunk, &c_vec2, &walk};
  const bool pdl = options != nullptr && options[2] == 1;
  if (c.mode == kStreamK)   // one launch
    return launch_gemm<true>(dim3((unsigned)c.ctas, 1), args, s, 1, pdl);
  return launch_gemm<true>(dim3((unsigned)tiles, (unsigned)c.splits), args, s,
                           c.mode == kCluster ? c.cluster : 1, pdl);
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_skinny::build_meta();
  return meta;
}
