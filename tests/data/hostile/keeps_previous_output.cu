// Hostile (GPU): leaves the previous call's output in place. A call with the same A, B and C
// pointers and shape as the one before does nothing and returns success: a benchmark that
// reuses its buffers reads the old, right answer (Sakana's memory-reuse exploit). Statically
// clean. Expected verdict: wrong (fresh or refilled C before checked calls; tests/test_evaluate.py
// GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc, const int* skip) {
  if (skip && *skip) return;
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
static int g_m = -1, g_n = -1, g_k = -1;

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t s = (cudaStream_t)stream;
  if (A == g_a && B == g_b && C == g_c && M == g_m && N == g_n && K == g_k) return 0;
  g_a = A; g_b = B; g_c = C; g_m = M; g_n = N; g_k = K;
  simt_hgemm<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K,
                                    lda, ldb, ldc, nullptr);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
