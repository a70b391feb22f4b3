// The launch floor: the least a kernel costs by kernel time (cudal2/harness/floor.py).
//
// Two kernels of one CTA of 32 threads: an empty one (what a launch alone costs back to back on
// a stream) and one whose threads each load one word and store it plus one (the smallest kernel
// that touches memory; its output proves it ran). The floor is what every timed GEMM pays before
// its first instruction, so the smallest shapes' times can be read against it.
//
// C ABI (loaded with ctypes; a launch enqueues on the caller's stream, no sync, no allocation):
//   int cudal2_baseline_abi(void)                                    1
//   int cudal2_launch_floor_threads(void)                            threads of each launch (32)
//   int cudal2_launch_empty(void* stream)                            <<<1, 32>>>, no work
//   int cudal2_launch_one_cta(const void* src, void* dst, void* stream)
//                                                 <<<1, 32>>>: dst[i] = src[i] + 1, 32 uint32 each
// Each returns a cudaError_t (0 = success).
#include <cuda_runtime.h>
#include <stdint.h>

#define FLOOR_THREADS 32

extern "C" __global__ void __launch_bounds__(FLOOR_THREADS) cudal2_empty_kernel() {}

extern "C" __global__ void __launch_bounds__(FLOOR_THREADS)
cudal2_one_cta_kernel(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst) {
  dst[threadIdx.x] = src[threadIdx.x] + 1u;
}

extern "C" {

int cudal2_baseline_abi(void) { return 1; }

int cudal2_launch_floor_threads(void) { return FLOOR_THREADS; }

int cudal2_launch_empty(void* stream) {
  cudal2_empty_kernel<<<1, FLOOR_THREADS, 0, (cudaStream_t)stream>>>();
  return (int)cudaGetLastError();
}

int cudal2_launch_one_cta(const void* src, void* dst, void* stream) {
  if (!src || !dst || ((uintptr_t)src % 4) != 0 || ((uintptr_t)dst % 4) != 0)
    return (int)cudaErrorInvalidValue;
  cudal2_one_cta_kernel<<<1, FLOOR_THREADS, 0, (cudaStream_t)stream>>>(
      static_cast<const unsigned int*>(src), static_cast<unsigned int*>(dst));
  return (int)cudaGetLastError();
}

}  // extern "C"
