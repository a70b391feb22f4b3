// Planted bug: accumulates onto C's old contents (beta = 1) instead of overwriting C. Right
// whenever the caller zeroed C; the suite fills C with garbage before every call.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void naive_f32(const __half* A, const __half* B, __half* C, int M, int N, int K,
                          int lda, int ldb, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = __half2float(C[(size_t)row * ldc + col]);   // the planted bug: C += A @ B
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 grid((N + 15) / 16, (M + 15) / 16), block(16, 16);
  naive_f32<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
