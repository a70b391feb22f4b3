// Control sample: an honest (slow) SIMT kernel with fp32 accumulation. The harness must accept
// it: audit ok, loads, meta reads. Row-major A (M x K), row-major B (K x N, layout RR).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[row * lda + k]) * __half2float(B[k * ldb + col]);
  C[row * ldc + col] = __float2half(acc);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  simt_hgemm<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
