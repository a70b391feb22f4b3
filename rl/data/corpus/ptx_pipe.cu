// HGEMM, inline PTX: cp.async + ldmatrix + mma.sync m16n8k16, f32 accumulate, layout RR.
#include <cuda_fp16.h>
#include <stdint.h>

constexpr int BM = ${BM}, BN = ${BN}, BK = ${BK}, WM = ${WM}, WN = ${WN};
constexpr int STAGES = ${STAGES}, GROUP_M = ${GROUP_M};
constexpr int THREADS = BM / WM * (BN / WN) * 32, MI = WM / 16, NI = WN / 8;
constexpr int AS = BK + 8, BS = BN + 8, SMEM = STAGES * (BM * AS + BK * BS) * 2;

__device__ __forceinline__ void cp16(half* d, const half* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(d)), "l"(s));
}

__global__ void __launch_bounds__(THREADS) hgemm(const half* A, const half* B, half* C, int M, int N, int K, int lda, int ldb, int ldc) {
  extern __shared__ __align__(128) half sA[];
  half* sB = sA + STAGES * BM * AS;
  int group = GROUP_M * (N / BN), first = blockIdx.x / group * GROUP_M, gm = min(M / BM - first, GROUP_M);
  int m0 = (first + blockIdx.x % group % gm) * BM, n0 = blockIdx.x % group / gm * BN;
  int t = threadIdx.x, lane = t % 32, wm = t / 32 / (BN / WN) * WM, wn = t / 32 % (BN / WN) * WN, KT = K / BK;
  auto load = [&](int s, int k) {
    for (int c = t; c < BM * BK / 8; c += THREADS)
      cp16(sA + s * BM * AS + c / (BK / 8) * AS + c % (BK / 8) * 8, A + (size_t)(m0 + c / (BK / 8)) * lda + k + c % (BK / 8) * 8);
    for (int c = t; c < BK * BN / 8; c += THREADS)
      cp16(sB + s * BK * BS + c / (BN / 8) * BS + c % (BN / 8) * 8, B + (size_t)(k + c / (BN / 8)) * ldb + n0 + c % (BN / 8) * 8);
  };
  float acc[MI][NI][4] = {};
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s * BK);
    asm volatile("cp.async.commit_group;");
  }
  for (int kt = 0; kt < KT; ++kt) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
    __syncthreads();
    if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * BK);
    asm volatile("cp.async.commit_group;");
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[MI][4], b[NI][2];
      for (int i = 0; i < MI; ++i) {
        uint32_t p = __cvta_generic_to_shared(sA + kt % STAGES * BM * AS + (wm + i * 16 + lane % 16) * AS + kk + lane / 16 * 8);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3]) : "r"(p));
      }
      for (int j = 0; j < NI; j += 2) {
        uint32_t p = __cvta_generic_to_shared(sB + kt % STAGES * BK * BS + (kk + lane % 16) * BS + wn + j * 8 + lane / 16 * 8);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1]) : "r"(p));
      }
      for (int i = 0; i < MI; ++i)
        for (int j = 0; j < NI; ++j)
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                       : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                       : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
  }
  for (int i = 0; i < MI; ++i)
    for (int j = 0; j < NI; ++j) {
      half* c = C + (size_t)(m0 + wm + i * 16 + lane / 4) * ldc + n0 + wn + j * 8 + lane % 4 * 2;
      *(half2*)c = __floats2half2_rn(acc[i][j][0], acc[i][j][1]);
      *(half2*)(c + 8 * ldc) = __floats2half2_rn(acc[i][j][2], acc[i][j][3]);
    }
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t ws_bytes, void* stream) {
  if (M % BM || N % BN || K % BK) return cudaErrorInvalidValue;
  cudaFuncSetAttribute(hgemm, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  hgemm<<<M / BM * (N / BN), THREADS, SMEM, (cudaStream_t)stream>>>((const half*)A, (const half*)B, (half*)C, M, N, K, lda, ldb, ldc);
  return cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "${META}";
}
