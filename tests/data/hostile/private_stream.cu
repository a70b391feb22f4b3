// Hostile (audit): launches on a private stream and returns early (events on the caller stream see nothing).
#include <cuda_runtime.h>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  static cudaStream_t mine = nullptr;
  if (!mine) cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
  noop_kernel<<<1, 1, 0, mine>>>(C);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
