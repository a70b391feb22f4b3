// Hostile: cudal2_meta returns bytes that are not UTF-8.
#include <cuda_runtime.h>

extern "C" const char* cudal2_meta(void) { return "{\"style\": \"\xff\xfe\"}"; }
extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  return 0;
}
