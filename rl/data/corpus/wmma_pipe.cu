// HGEMM, raw CUDA C++: WMMA tensor cores + cp.async pipeline, layout RR, optional split-K.
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#include <stdint.h>
using namespace nvcuda::wmma;

constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK}, WM = ${WM}, WN = ${WN};
constexpr int STAGES = ${STAGES}, GROUP_M = ${GROUP_M}, SPLITS = ${SPLITS};
constexpr size_t MAX_MN = ${MAX_MN};
constexpr int THREADS = BM / WM * (BN / WN) * 32, FM = WM / 16, FN = WN / 16;
constexpr int AS = BK + 8, BS = BN + 8, SMEM = STAGES * (BM * AS + BK * BS) * 2;
using Acc = ${ACC_T};

template <typename T>
__global__ void __launch_bounds__(THREADS) hgemm(const half* A, const half* B, half* C, float* ws, int M, int N, int K, int lda, int ldb, int ldc) {
  extern __shared__ __align__(128) half sA[];
  half* sB = sA + STAGES * BM * AS;
  int group = GROUP_M * (N / BN), first = blockIdx.x / group * GROUP_M, gm = min(M / BM - first, GROUP_M);
  int m0 = (first + blockIdx.x % group % gm) * BM, n0 = blockIdx.x % group / gm * BN;
  int t = threadIdx.x, wm = t / 32 / (BN / WN) * WM, wn = t / 32 % (BN / WN) * WN;
  int KT = K / SPLITS / BK, k0 = blockIdx.z * KT * BK;
  auto load = [&](int s, int k) {
    for (int c = t; c < BM * BK / 8; c += THREADS)
      __pipeline_memcpy_async(sA + s * BM * AS + c / (BK / 8) * AS + c % (BK / 8) * 8, A + (size_t)(m0 + c / (BK / 8)) * lda + k + c % (BK / 8) * 8, 16);
    for (int c = t; c < BK * BN / 8; c += THREADS)
      __pipeline_memcpy_async(sB + s * BK * BS + c / (BN / 8) * BS + c % (BN / 8) * 8, B + (size_t)(k + c / (BN / 8)) * ldb + n0 + c % (BN / 8) * 8, 16);
  };
  fragment<accumulator, 16, 16, 16, T> acc[FM][FN];
  for (int i = 0; i < FM; ++i)
    for (int j = 0; j < FN; ++j) fill_fragment(acc[i][j], T(0));
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, k0 + s * BK);
    __pipeline_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    __pipeline_wait_prior(STAGES - 2);
    __syncthreads();
    if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, k0 + (kt + STAGES - 1) * BK);
    __pipeline_commit();
    for (int kk = 0; kk < BK; kk += 16) {
      fragment<matrix_a, 16, 16, 16, half, row_major> a[FM];
      fragment<matrix_b, 16, 16, 16, half, row_major> b[FN];
      for (int i = 0; i < FM; ++i) load_matrix_sync(a[i], sA + kt % STAGES * BM * AS + (wm + i * 16) * AS + kk, AS);
      for (int j = 0; j < FN; ++j) load_matrix_sync(b[j], sB + kt % STAGES * BK * BS + kk * BS + wn + j * 16, BS);
      for (int i = 0; i < FM; ++i)
        for (int j = 0; j < FN; ++j) mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  float* tmp = (float*)sA + t / 32 * 256;
  for (int i = 0; i < FM; ++i)
    for (int j = 0; j < FN; ++j) {
      int r = m0 + wm + i * 16, c = n0 + wn + j * 16;
      if constexpr (sizeof(T) == 2) {
        store_matrix_sync(C + (size_t)r * ldc + c, acc[i][j], ldc, mem_row_major);
      } else if constexpr (SPLITS > 1) {
        store_matrix_sync(ws + (size_t)blockIdx.z * M * N + (size_t)r * N + c, acc[i][j], N, mem_row_major);
      } else {
        store_matrix_sync(tmp, acc[i][j], 16, mem_row_major);
        __syncwarp();
        for (int e = t % 32; e < 256; e += 32) C[(size_t)(r + e / 16) * ldc + c + e % 16] = __float2half(tmp[e]);
        __syncwarp();
      }
    }
}

__global__ void reduce_splits(const float* ws, half* C, int M, int N, int ldc) {
  size_t i = (size_t)blockIdx.x * 256 + threadIdx.x, mn = (size_t)M * N;
  if (i >= mn) return;
  float s = 0.f;
  for (int z = 0; z < SPLITS; ++z) s += ws[z * mn + i];
  C[i / N * ldc + i % N] = __float2half(s);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t ws_bytes, void* stream) {
  if (M % BM || N % BN || K % (BK * SPLITS) || (uintptr_t)C % 32 || (uintptr_t)ws % 32) return cudaErrorInvalidValue;
  if (SPLITS > 1 && ((size_t)M * N > MAX_MN || ws_bytes < SPLITS * (size_t)M * N * 4)) return cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  cudaFuncSetAttribute(hgemm<Acc>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  hgemm<Acc><<<dim3(M / BM * (N / BN), 1, SPLITS), THREADS, SMEM, s>>>((const half*)A, (const half*)B, (half*)C, (float*)ws, M, N, K, lda, ldb, ldc);
  if (SPLITS > 1) reduce_splits<<<(M * N + 255) / 256, 256, 0, s>>>((float*)ws, (half*)C, M, N, ldc);
  return cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "${META}";
}
