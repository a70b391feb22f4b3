// Hostile (audit): makes its operands persist in L2 past the call. It carves out persisting L2
// (cudaDeviceSetLimit) and sets an access-policy window on the caller's stream, which outlives the
// call: every later kernel on that stream (a baseline's, the user's) then runs with B pinned in
// L2, and the next timed call of this kernel finds B warm. Expected verdict: audit_rejected (the
// source names L2 persistence controls; it imports stream and device-state calls); the dry call
// and the GPU run's call guard refuse both calls.
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
  cudaStream_t s = (cudaStream_t)stream;
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 32u << 20);
  cudaStreamAttrValue value = {};
  value.accessPolicyWindow.base_ptr = const_cast<void*>(B);
  value.accessPolicyWindow.num_bytes = (size_t)K * ldb * sizeof(__half);
  value.accessPolicyWindow.hitRatio = 1.0f;
  value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &value);
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  simt_hgemm<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K, lda,
                                    ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
