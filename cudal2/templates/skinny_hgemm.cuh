// cudal2 kernel family "skinny": C[M,N] = A[M,K] @ B for M <= BM <= 64 (LLM decode, nn.Linear's
// x @ W.t() with B column-major: LAYOUT_RC 1), bound by HBM bandwidth on B, not tensor throughput.
//
// One CTA row covers all M (BM = 16, 32 or 64: M padded with zero rows), so every element of the
// large operand B (K x N) is read from HBM exactly once, by 16-byte cp.async.cg (L2 only, no L1
// allocation) into a STAGES-deep shared-memory pipeline; the small operand A (M x K, at most
// 64 x K x 2 bytes) is read through L2 by every N tile. Tensor cores: mma.sync m16n8k16 with fp32
// accumulation; rows beyond M are zero and cost tensor issue slots only, which a bandwidth-bound
// kernel has to spare (M = 1 at BM = 16: 16 flop per byte of B, ~54 TFLOP/s at 3.35 TB/s, within
// mma.sync's measured ~290 TFLOP/s on an H100).
//
// K is split across the SMs at run time: the split count fills about two CTAs per SM over the
// N tiles (runtime option "splits", 0 = that choice from M, N, K and the SM count), and the
// splits reduce in fp32 inside the kernel (splitk_fixup.cuh: one launch, deterministic order,
// the workspace left zero for the next call).
//
// The pipeline, fragment mapping and epilogue are mma_hgemm.cuh's (included below with its
// runtime-split hook); this file adds the ABI 2 entry points. It serves only what its 16-byte
// loads serve and refuses the rest with cudaErrorInvalidValue: M > BM, A or B not 16-byte
// aligned, lda or ldb not a multiple of 8, too small or misaligned a workspace, an unlisted
// option. The mirror (N <= 64, M large) is not served: with row-major C it needs a transposed
// store and A as the streamed operand, a kernel of its own.

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
#ifndef LAYOUT_RC
#define LAYOUT_RC 1     // 1: B column-major (nn.Linear weight, stored N x K); 0: B row-major
#endif
#define ACC_F16 0
#define SWIZZLE 1
#define SPLITK 1
#define SPLITK_MAX_MN 1
#define CUDAL2_RUNTIME_SPLITK 1
#define CUDAL2_STYLE "mma"
#define CUDAL2_FAMILY "skinny"

#if BM > 64
#error "the skinny family serves M <= 64 (BM 16, 32 or 64)"
#endif

#include "mma_hgemm.cuh"

namespace cudal2_skinny {
using namespace cudal2_hgemm_impl;

constexpr int kMaxSplits = 64;
constexpr int kSplitValues[] = {0, 1, 2, 4, 8, 16, 32, 64};   // runtime option "splits" (0 = auto)

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

static bool option_ok(const int* options) {
  if (options == nullptr) return true;
  for (int v : kSplitValues)
    if (options[0] == v) return true;
  return false;
}

// The split count and K range per split of one call; splits * k_chunk covers K with no empty
// split. asked: the option (0: about two CTAs per SM over the N tiles), sms: the SM count.
static void plan(int N, int K, int asked, int sms, int& splits, int& k_chunk) {
  const int tiles_n = (N + BN - 1) / BN;
  const int k_tiles = (K + BK - 1) / BK;
  int s = asked;
  if (s <= 0) s = (2 * (sms > 0 ? sms : 132) + tiles_n - 1) / tiles_n;
  s = s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : s);
  if (s > k_tiles) s = k_tiles > 0 ? k_tiles : 1;
  const int per = (k_tiles + s - 1) / s;        // whole BK tiles per split
  k_chunk = per * BK;
  splits = K > 0 ? (K + k_chunk - 1) / k_chunk : 1;
}

static size_t workspace_for(int M, int N, int K, const int* options, int sms) {
  int splits, k_chunk;
  plan(N, K, options ? options[0] : 0, sms, splits, k_chunk);
  return cudal2_splitk::workspace_bytes(splits, M, N, (N + BN - 1) / BN);
}

static const char* build_meta() {
  static char buf[1536];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"%s\", \"family\": \"%s\", \"arch\": \"%s\", \"abi\": 2, \"acc\": \"f32\", "
           "\"layout\": \"%s\", \"tile\": [%d, %d, %d], \"warp_tile\": [%d, %d], \"warps\": %d, "
           "\"threads\": %d, \"stages\": %d, \"smem_bytes\": %d, \"any_shape\": true, "
           "\"max_m\": %d, \"divisible\": [1, %d, 8], "
           "\"workspace_bytes\": %llu, \"workspace_zero_init\": true, "
           "\"splitk_fixup\": \"%s\", \"options\": [{\"name\": \"splits\", "
           "\"values\": [0, 1, 2, 4, 8, 16, 32, 64], \"default\": 0}], "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"WM\": %d, \"WN\": %d, "
           "\"STAGES\": %d, \"LAYOUT\": \"%s\"}}",
           CUDAL2_STYLE, CUDAL2_FAMILY, arch_name(), LAYOUT_RC ? "RC" : "RR", BM, BN, BK, WM, WN,
           kWarpsM * kWarpsN, kThreads, STAGES, (int)kSmemBytes, BM, LAYOUT_RC ? 1 : 8,
           // for information: a 64 x 16384 x 16384 call at the most splits
           (unsigned long long)cudal2_splitk::workspace_bytes(kMaxSplits, BM, 16384,
                                                              (16384 + BN - 1) / BN),
           SPLITK_DETERMINISTIC ? "deterministic" : "atomic", BM, BN, BK, WM, WN, STAGES,
           LAYOUT_RC ? "RC" : "RR");
  return buf;
}

}  // namespace cudal2_skinny

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  using namespace cudal2_skinny;
  if (M <= 0 || N <= 0 || K <= 0 || !option_ok(options)) return 0;
  const int sms = (options && options[0] > 0) ? 1 : sm_count();   // the SMs matter for 0 only
  // no device to ask: the bound over every split count the launcher could pick
  return sms > 0 ? workspace_for(M, N, K, options, sms)
                 : cudal2_splitk::workspace_bytes(kMaxSplits, M, N, (N + BN - 1) / BN);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream, const int* options) {
  using namespace cudal2_skinny;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (M < 0 || N < 0 || K < 0 || M > BM || !option_ok(options)) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N || reinterpret_cast<uintptr_t>(C) % 2 != 0) return cudaErrorInvalidValue;
  // 16-byte loads only: both operands aligned, leading dimensions multiples of 8 elements
  if (K > 0 && (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N) ||
                lda % 8 != 0 || ldb % 8 != 0 ||
                (reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0))
    return cudaErrorInvalidValue;
  const long long tiles = (N + BN - 1) / BN;
  int splits = 1, k_chunk = 0;
  if (K > 0) {
    const int sms = (options && options[0] > 0) ? 1 : sm_count();   // the SMs matter for 0 only
    if (sms <= 0) return cudaErrorInvalidDevice;
    plan(N, K, options ? options[0] : 0, sms, splits, k_chunk);
  }
  void* ws = nullptr;
  if (splits > 1) {
    if (workspace == nullptr || workspace_bytes < cudal2_splitk::workspace_bytes(splits, M, N, tiles) ||
        reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return cudaErrorInvalidValue;
    ws = workspace;
  }
  int c_vec2 = (reinterpret_cast<uintptr_t>(C) % 4 == 0) && (ldc % 2 == 0);
  const half* a = reinterpret_cast<const half*>(A);
  const half* b = reinterpret_cast<const half*>(B);
  half* c = reinterpret_cast<half*>(C);
  void* args[] = {&a, &b, &c, &ws, &M, &N, &K, &lda, &ldb, &ldc, &k_chunk, &c_vec2};
  return launch_gemm<true>(dim3((unsigned)tiles, (unsigned)splits), args, s);   // one launch
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_skinny::build_meta();
  return meta;
}
