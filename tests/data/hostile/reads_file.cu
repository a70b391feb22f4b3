// Hostile (audit): reads a file from disk (e.g. a cached answer).
#include <cuda_runtime.h>
#include <cstdio>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  FILE* f = fopen("/tmp/answer.bin", "rb");
  if (f) fclose(f);
  return 0;
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
