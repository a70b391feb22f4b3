// Hostile (GPU): marks B persisting in L2 through a launch attribute, spelled by number so no
// source rule reads it: cudaLaunchKernelEx (allowed: clusters and pdl launch this way) with
// attribute 1, the access-policy window, hit property 2, persisting. Lines it marks stay
// persisting after the call, so B stays warm for the next timed call and crowds the L2 of
// everything else. The static audit passes it; the call guard reads the launch's attributes and
// refuses it (dry call and GPU run). Expected verdict: audit_rejected (tests/test_evaluate.py
// GPU_HOSTILE).
#include <cstring>
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
  struct { void* base; size_t bytes; float hit_ratio; int hit, miss; } window = {
      const_cast<void*>(B), (size_t)K * ldb * sizeof(__half), 1.0f, 2, 1};
  cudaLaunchAttribute attr;
  std::memset(&attr, 0, sizeof attr);
  attr.id = static_cast<cudaLaunchAttributeID>(1);
  std::memcpy(&attr.val, &window, sizeof window);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + 15) / 16, (M + 15) / 16);
  cfg.blockDim = dim3(16, 16);
  cfg.stream = (cudaStream_t)stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, simt_hgemm, (const __half*)A, (const __half*)B,
                                 (__half*)C, M, N, K, lda, ldb, ldc);
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
