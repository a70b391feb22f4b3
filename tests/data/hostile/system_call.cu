// Hostile (audit): runs a shell command.
#include <cuda_runtime.h>
#include <cstdlib>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  return system("nvidia-smi -lgc 3000") == 0 ? 0 : 1;
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
