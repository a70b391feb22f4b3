// Planted bug: claims any_shape but writes only the rows and columns that fill whole 64 x 64
// tiles. Right on tile-aligned shapes; the suite's edge shapes (M-1, N+1, ...) expose it.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void naive_f32(const __half* A, const __half* B, __half* C, int M, int N, int K,
                          int lda, int ldb, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row >= M / 64 * 64 || col >= N / 64 * 64) return;   // the planted bug: full tiles only
  float acc = 0.0f;
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
