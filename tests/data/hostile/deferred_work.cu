// Hostile (GPU): defers repeated work. The first call on a set of pointers computes C; a repeat
// call on the same pointers and shape (a benchmark loop, a decode step on reused buffers) only
// counts itself and returns, and every 16th repeat launches one kernel for all of them (the
// result is the same): the "super-batching" of repeated calls seen in the field, fast by a
// factor of the batch and wrong whenever C was changed in between. Statically clean, nothing
// the call guard refuses. Expected verdict: wrong (C is refilled with garbage before every checked
// call: the repeat of the same inputs finds garbage; tests/test_evaluate.py GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
}

static const void* g_a = nullptr;
static const void* g_b = nullptr;
static void* g_c = nullptr;
static int g_shape[3] = {-1, -1, -1};
static int g_pending = 0;

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  bool repeat = A == g_a && B == g_b && C == g_c && M == g_shape[0] && N == g_shape[1] &&
                K == g_shape[2];
  if (repeat && ++g_pending < 16) return 0;
  g_a = A; g_b = B; g_c = C; g_shape[0] = M; g_shape[1] = N; g_shape[2] = K; g_pending = 0;
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  simt_hgemm<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
