// Planted bug: a correct product, plus full 16x16 tiles written without bounds checks on the
// columns (as a kernel that assumes N % 16 == 0 and ldc == N would). With a padded ldc, or an
// odd N, it writes past the end of each row of C.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void naive_oob(const __half* A, const __half* B, __half* C, int M, int N, int K,
                          int lda, int ldb, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row >= M) return;
  float acc = 0.0f;
  if (col < N)
    for (int k = 0; k < K; ++k)
      acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  // BUG: columns N..N+15 of the last tile are written too (no col < N test)
  C[(size_t)row * ldc + col] = __float2half(acc);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 grid((N + 15) / 16 + 1, (M + 15) / 16), block(16, 16);   // BUG: one tile too many
  naive_oob<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
