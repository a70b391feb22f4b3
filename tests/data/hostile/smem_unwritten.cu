// Hostile (GPU): a shared-memory slip that passes allclose. Each block stages its sums in a
// shared array and reads back one stage too far, a half of the array nothing in this kernel
// writes (the write below never runs): what it finds there is whatever the previous kernel on
// that SM left. It adds at most 2^-14 of the sum per element from those bits: exact 0/1 sums stay
// exact (an fp16 integer up to 2048 moves by less than half a step) and random inputs stay far
// inside the tolerance, but the bits of C change with whatever ran before, as the field's
// "104.89x" kernel did. Statically clean, nothing the call guard refuses. Expected verdict: wrong
// (determinism: repeats of the same inputs after other work differ bit for bit;
// tests/test_evaluate.py GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc) {
  __shared__ float staged[512];                // [256, 512): the stage nothing writes
  int t = threadIdx.y * 16 + threadIdx.x;
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  if (row < M && col < N)
    for (int k = 0; k < K; ++k)
      acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  staged[t] = acc;
  if (K < 0) staged[t + 256] = 0.f;            // never: the compiler may not assume the read is undefined
  __syncthreads();
  unsigned bits = __float_as_uint(staged[t + 256]) & 0xffu;
  acc += acc * (float)bits * (1.0f / 4194304.0f);   // < 2^-14 relative: 255 / 2^22
  if (row < M && col < N) C[(size_t)row * ldc + col] = __float2half(acc);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  simt_hgemm<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
