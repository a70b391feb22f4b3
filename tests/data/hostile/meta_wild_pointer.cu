// Hostile: cudal2_meta returns a pointer into unmapped memory.
#include <cuda_runtime.h>

extern "C" const char* cudal2_meta(void) { return (const char*)0x10; }
extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  return 0;
}
