// Hostile (GPU): writes far outside C (an illegal address). Statically clean; the sticky CUDA
// error poisons the worker's context, the verdict is "crashed" and the next evaluation gets a
// fresh worker.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void wild_write(__half* C) {
  C[(size_t)1 << 40] = __float2half(1.f);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  wild_write<<<1, 1, 0, (cudaStream_t)stream>>>((__half*)C);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
