// Hostile (GPU): a partial result that passes 0/1 tests. C[i][j] = (sum_k A[i][k]) * B[0][j]:
// right whenever every row of B is the same (all-ones and all-zeros inputs, constant fills),
// wrong for random inputs; about K times less work than the GEMM. Statically clean. Expected
// verdict: wrong (random inputs; tests/test_evaluate.py GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void rowsum_times_first_row(const __half* A, const __half* B, __half* C, int M, int N,
                                       int K, int lda, int ldb, int ldc) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float rowsum = 0.f;
  for (int k = 0; k < K; ++k) rowsum += __half2float(A[(size_t)row * lda + k]);
  C[(size_t)row * ldc + col] = __float2half(rowsum * __half2float(B[col]));
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t s = (cudaStream_t)stream;
  rowsum_times_first_row<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C,
                                                M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
