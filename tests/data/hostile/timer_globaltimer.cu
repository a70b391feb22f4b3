// Hostile (GPU): detects the timer by the clock. A one-thread kernel reads %globaltimer
// before each call's work; when the previous call started less than 200 us ago (a timing
// loop's back-to-back calls), the GEMM kernel returns without computing, leaving C as it was.
// Statically clean: launches only, on the caller's stream. Expected verdict: wrong (the timed
// calls' outputs are checked; tests/test_evaluate.py GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__device__ unsigned long long g_last;
__device__ int g_skip;

__global__ void stamp() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  g_skip = g_last != 0 && now - g_last < 200000ull;
  g_last = now;
}

__global__ void guarded_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                              int lda, int ldb, int ldc) {
  if (g_skip) return;
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t s = (cudaStream_t)stream;
  stamp<<<1, 1, 0, s>>>();
  guarded_hgemm<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K,
                                       lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
