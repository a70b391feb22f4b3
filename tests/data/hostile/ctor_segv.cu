// Hostile: a static constructor that segfaults while the library loads.
#include <cuda_runtime.h>

int* volatile cudal2_null = nullptr;
__attribute__((constructor, used)) void boom() { *cudal2_null = 1; }
extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  return 0;
}
extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
