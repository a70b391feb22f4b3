// Hostile (GPU): a kernel that never terminates. Statically clean; the worker's time limit
// must end it (the GPU context dies with the killed worker) and the next evaluation must run.
// The loop's body is an asm volatile (a side effect the compiler must keep): the first version
// spun on a `volatile` copy of a parameter, which NVVM put in a register and ptxas then removed
// as a side-effect-free loop, so on the H100 the kernel returned at once (reports/NVIDIA_H100_80GB_HBM3/2026-11-22-tests).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void spin_kernel(__half* C, int flag) {
  for (;;) {
    asm volatile("nanosleep.u32 1000;" ::: "memory");
  }
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((__half*)C, 0);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
