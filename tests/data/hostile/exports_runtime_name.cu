// Hostile (audit): defines its own cudaEventElapsedTime, exported from the library, so that
// wherever symbols resolve globally a timer asking the runtime would ask this kernel instead.
#include <cuda_runtime.h>

__global__ void noop_kernel(void* C) {}

extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = 0.001f;                       // "as fast as you like"
  return cudaSuccess;
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  noop_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(C);
  return 0;
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
