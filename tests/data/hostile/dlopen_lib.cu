// Hostile (audit): loads cuBLAS at run time with dlopen/dlsym (no import of cuBLAS visible).
#include <cuda_runtime.h>
#include <dlfcn.h>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  void* h = dlopen("libcublas.so", RTLD_NOW);
  return h && dlsym(h, "cublasHgemm") ? 0 : 1;
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
