// Hostile (GPU): caches results across calls keyed on the input pointers (CUDA-L1's caching
// exploit). The first call for an (A, B, shape) computes C and keeps a copy in a static device
// buffer; a later call with the same A and B pointers copies the kept answer into whatever C it
// is given, without reading A or B. Statically clean (launches only). Expected verdict: wrong
// (same pointers, new values; tests/test_evaluate.py GPU_HOSTILE).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc, const int* skip) {
  if (skip && *skip) return;
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
}

#define CACHE_ELEMS (1 << 22)
__device__ __half g_kept[CACHE_ELEMS];
static const void* g_a = nullptr;
static const void* g_b = nullptr;
static int g_m = -1, g_n = -1, g_k = -1;

__global__ void keep(const __half* C, int M, int N, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row < M && col < N) g_kept[(size_t)row * N + col] = C[(size_t)row * ldc + col];
}

__global__ void replay(__half* C, int M, int N, int ldc) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  if (row < M && col < N) C[(size_t)row * ldc + col] = g_kept[(size_t)row * N + col];
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  cudaStream_t s = (cudaStream_t)stream;
  int fits = (size_t)M * N <= CACHE_ELEMS;
  if (fits && A == g_a && B == g_b && M == g_m && N == g_n && K == g_k) {
    replay<<<grid, block, 0, s>>>((__half*)C, M, N, ldc);
    return (int)cudaGetLastError();
  }
  simt_hgemm<<<grid, block, 0, s>>>((const __half*)A, (const __half*)B, (__half*)C, M, N, K,
                                    lda, ldb, ldc, nullptr);
  if (fits) {
    keep<<<grid, block, 0, s>>>((const __half*)C, M, N, ldc);
    g_a = A; g_b = B; g_m = M; g_n = N; g_k = K;
  }
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
