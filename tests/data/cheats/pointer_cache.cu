// Planted bug: memoises by pointer. The first call for a (A, B, C) pointer triple computes and
// keeps the answer in a static device buffer; later calls with the same pointers copy the kept
// answer into C without reading A or B. Passes fresh-buffer checks; must fail "same pointers,
// new values".
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CACHE_ELEMS (1 << 22)
__device__ __half g_cache[CACHE_ELEMS];
static const void* g_a = nullptr;
static const void* g_b = nullptr;
static void* g_c = nullptr;

__global__ void naive_keep(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc, int keep) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
  if (keep) g_cache[(size_t)row * N + col] = __float2half(acc);
}

__global__ void replay(__half* C, int M, int N, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row < M && col < N) C[(size_t)row * ldc + col] = g_cache[(size_t)row * N + col];
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 grid((N + 15) / 16, (M + 15) / 16), block(16, 16);
  cudaStream_t s = (cudaStream_t)stream;
  int fits = (size_t)M * N <= CACHE_ELEMS;
  if (fits && A == g_a && B == g_b && C == g_c) {
    replay<<<grid, block, 0, s>>>((__half*)C, M, N, ldc);
  } else {
    naive_keep<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K,
                                      lda, ldb, ldc, fits);
    g_a = A; g_b = B; g_c = C;
  }
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
