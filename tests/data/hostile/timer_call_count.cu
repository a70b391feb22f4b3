// Hostile (GPU): detects the timer by the call count. The first 64 calls compute (the
// correctness suite's); after that only every 8th call does, the rest return at once leaving C
// as it was (a timing loop's repeated calls). Statically clean. Expected verdict: wrong (the
// timed calls' outputs are checked; tests/test_evaluate.py GPU_HOSTILE).
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

static unsigned long g_calls = 0;

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t s = (cudaStream_t)stream;
  ++g_calls;
  if (g_calls > 64 && g_calls % 8 != 0) return 0;
  simt_hgemm<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K,
                                    lda, ldb, ldc, nullptr);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
