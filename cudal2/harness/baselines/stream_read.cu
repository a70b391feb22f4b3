// Read-only streaming kernel: the device's own HBM bandwidth ceiling (cudal2/harness/bandwidth.py).
//
// Each thread reads 16-byte vectors of one large buffer in a grid-stride loop, UNROLL independent
// loads in flight per iteration (a warp reads 512 contiguous bytes per load), through the
// non-coherent path without an L1 allocation (ld.global.nc.L1::no_allocate) and with an L2
// evict-first policy (createpolicy, sm_80+), so the stream neither thrashes L1 nor keeps its
// tail in L2 for the next call. Every value read is summed and each CTA writes its sum to
// out[blockIdx.x]: no load is dead code. The buffer (several x L2) is what bandwidth.py sizes;
// one call reads it once.
//
// C ABI (loaded with ctypes; the launch enqueues on the caller's stream, no sync, no allocation):
//   int cudal2_baseline_abi(void)                        1
//   int cudal2_stream_read_threads(void)                 threads per CTA
//   int cudal2_stream_read_blocks_per_sm(int* out)       resident CTAs per SM (occupancy API)
//   int cudal2_stream_read_device(int* sms, int* mem_clock_khz, int* bus_bits, int* l2_bytes)
//   int cudal2_stream_read(const void* src, unsigned long long bytes, void* out, int blocks,
//                          void* stream)                 out: blocks x uint32; bytes % 16 == 0
// Each returns a cudaError_t (0 = success).
#include <cuda_runtime.h>
#include <stdint.h>

#ifndef STREAM_THREADS
#define STREAM_THREADS 512
#endif
#ifndef STREAM_UNROLL
#define STREAM_UNROLL 4
#endif

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

__device__ __forceinline__ uint4 load_stream(const uint4* p, uint64_t policy) {
  uint4 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
#else
  (void)policy;
  v = __ldg(p);
#endif
  return v;
}

extern "C" __global__ void __launch_bounds__(STREAM_THREADS)
cudal2_stream_read_kernel(const uint4* __restrict__ src, unsigned long long n_vec,
                          unsigned int* __restrict__ out) {
  const uint64_t policy = evict_first_policy();
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int acc = 0;
  for (; i + (STREAM_UNROLL - 1) * stride < n_vec; i += STREAM_UNROLL * stride) {
    uint4 v[STREAM_UNROLL];
#pragma unroll
    for (int u = 0; u < STREAM_UNROLL; ++u) v[u] = load_stream(src + i + u * stride, policy);
#pragma unroll
    for (int u = 0; u < STREAM_UNROLL; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  for (; i < n_vec; i += stride) {
    const uint4 v = load_stream(src + i, policy);
    acc += v.x + v.y + v.z + v.w;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ unsigned int warp_sum[STREAM_THREADS / 32];
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int s = 0;
    for (int w = 0; w < STREAM_THREADS / 32; ++w) s += warp_sum[w];
    out[blockIdx.x] = s;
  }
}

extern "C" {

int cudal2_baseline_abi(void) { return 1; }

int cudal2_stream_read_threads(void) { return STREAM_THREADS; }

int cudal2_stream_read_blocks_per_sm(int* out) {
  if (!out) return (int)cudaErrorInvalidValue;
  return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, cudal2_stream_read_kernel,
                                                            STREAM_THREADS, 0);
}

// The theoretical peak's inputs (memory clock x bus width x 2) and the L2 size, from the runtime
// (cudaDeviceProp lost memoryClockRate in CUDA 13; the attribute stays).
int cudal2_stream_read_device(int* sms, int* mem_clock_khz, int* bus_bits, int* l2_bytes) {
  int dev = 0;
  cudaError_t st = cudaGetDevice(&dev);
  if (st != cudaSuccess) return (int)st;
  if (sms && (st = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
    return (int)st;
  if (mem_clock_khz &&
      (st = cudaDeviceGetAttribute(mem_clock_khz, cudaDevAttrMemoryClockRate, dev)) != cudaSuccess)
    return (int)st;
  if (bus_bits &&
      (st = cudaDeviceGetAttribute(bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev)) != cudaSuccess)
    return (int)st;
  if (l2_bytes && (st = cudaDeviceGetAttribute(l2_bytes, cudaDevAttrL2CacheSize, dev)) != cudaSuccess)
    return (int)st;
  return 0;
}

int cudal2_stream_read(const void* src, unsigned long long bytes, void* out, int blocks,
                       void* stream) {
  if (!src || !out || blocks < 1 || bytes == 0 || (bytes % 16) != 0 ||
      ((uintptr_t)src % 16) != 0)
    return (int)cudaErrorInvalidValue;
  cudal2_stream_read_kernel<<<blocks, STREAM_THREADS, 0, (cudaStream_t)stream>>>(
      static_cast<const uint4*>(src), bytes / 16, static_cast<unsigned int*>(out));
  return (int)cudaGetLastError();
}

}  // extern "C"
