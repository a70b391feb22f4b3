// Hostile (GPU): per_thread_stream.cu without the name. It launches on the per-thread default
// stream by its handle's value, (cudaStream_t)2, which no source rule can read, and returns: a
// caller on its own stream (a serving engine, a CUDA graph's capture stream) may read C before
// it is written. The static audit passes it; the call guard sees the launch's stream (not the
// call's): the dry call and the GPU run's first calls refuse it. Expected verdict: audit_rejected
// (tests/test_evaluate.py GPU_HOSTILE).
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

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t elsewhere = reinterpret_cast<cudaStream_t>(static_cast<size_t>(2));
  simt_hgemm<<<grid, block, 0, elsewhere>>>((const __half*)A, (const __half*)B, (__half*)C, M, N,
                                            K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
