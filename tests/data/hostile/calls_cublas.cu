// Hostile (audit): computes C with cuBLAS instead of its own kernel.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  static cublasHandle_t h = nullptr;
  if (!h) cublasCreate(&h);
  cublasSetStream(h, (cudaStream_t)stream);
  __half one = __float2half(1.f), zero = __float2half(0.f);
  return (int)cublasHgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, (const __half*)B, ldb,
                          (const __half*)A, lda, &zero, (__half*)C, ldc);
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
