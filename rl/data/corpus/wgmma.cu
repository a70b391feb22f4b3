// HGEMM, inline PTX wgmma.mma_async m64n64k16 (f32 accumulate, sm_90a), one output tile per CTA.
// cp.async 16-byte loads (zero-filled past the matrix) into 128-byte-swizzled shared memory, the
// layout SWIZZLE_128B descriptors read: 16-byte unit u of a 128-byte row r sits at unit u ^ (r % 8).
// One warpgroup (128 threads) per 64 rows; any M, N, K with N, K multiples of 8.
#include <cuda_fp16.h>
#include <stdint.h>

constexpr int BM = ${BM}, BN = ${BN}, BK = 64, STAGES = ${STAGES};
constexpr bool RC = ${RC};  // B column-major (stored N x K)
constexpr int THREADS = BM / 64 * 128;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, SMEM = STAGES * (A_BYTES + B_BYTES) + 1024;

__device__ __forceinline__ uint32_t swz(int r, int u) { return r * 128 + ((u ^ (r & 7)) << 4); }

// rows x (8 * units) halfs from global (r0, c0), one 16-byte chunk per cp.async; chunks at rows >= rlim
// or columns >= clim read 0 bytes and are zero-filled (clim - c0 is a multiple of 8).
template <int ROWS, int UNITS, class Dst>
__device__ __forceinline__ void load(const half* g, int ld, int r0, int rlim, int c0, int clim, Dst dst) {
  for (int i = threadIdx.x; i < ROWS * UNITS; i += THREADS) {
    int r = i / UNITS, u = i % UNITS;
    bool in = r0 + r < rlim && c0 + u * 8 < clim;
    const half* src = in ? g + (size_t)(r0 + r) * ld + c0 + u * 8 : g;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst(r, u)), "l"(src), "r"(in ? 16 : 0) : "memory");
  }
}

// Shared-memory matrix descriptor: address, leading and stride byte offsets (16-byte units), 128B swizzle.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
         (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{.reg .pred p; setp.ne.b32 p, %35, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, %34;}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "n"(RC ? 0 : 1), "r"(1));  // scale-d 1 (acc starts at 0); trans-b 1: N-major B (RR)
}

__global__ void __launch_bounds__(THREADS, 1) hgemm(const half* A, const half* B, half* C, int M, int N, int K, int lda, int ldb, int ldc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma exists on sm_90a only
  constexpr int NB = BN / 64;            // n64 instructions per k16 step
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t sA = ((uint32_t)__cvta_generic_to_shared(smem) + 1023) & ~1023u, sB = sA + STAGES * A_BYTES;  // 1 KiB: the swizzle's period
  int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, KT = (K + BK - 1) / BK, wg = threadIdx.x / 128;
  auto stage = [&](int s, int kt) {
    uint32_t a = sA + s * A_BYTES, b = sB + s * B_BYTES;
    load<BM, 8>(A, lda, m0, M, kt * BK, K, [&](int r, int u) { return a + swz(r, u); });
    if (RC) load<BN, 8>(B, ldb, n0, N, kt * BK, K, [&](int r, int u) { return b + swz(r, u); });
    else    load<BK, BN / 8>(B, ldb, kt * BK, K, n0, N, [&](int r, int u) { return b + u / 8 * BK * 128 + swz(r, u % 8); });  // [NB][BK][64]
  };
  float acc[NB][32] = {};
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) stage(s, s);
    asm volatile("cp.async.commit_group;");
  }
  for (int kt = 0; kt < KT; ++kt) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes -> visible to wgmma
    __syncthreads();                                                // stage kt in, stage kt-1 read by all
    if (kt + STAGES - 1 < KT) stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    asm volatile("cp.async.commit_group;");
    uint32_t a = sA + kt % STAGES * A_BYTES + wg * 64 * 128, b = sB + kt % STAGES * B_BYTES;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int kk = 0; kk < BK / 16; ++kk)
      for (int j = 0; j < NB; ++j)
        wgmma(acc[j], desc(a + kk * 32, 16, 1024),
              RC ? desc(b + j * 64 * 128 + kk * 32, 16, 1024) : desc(b + j * BK * 128 + kk * 16 * 128, BK * 128, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int j = 0; j < NB; ++j)
      for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(acc[j][i])::"memory");  // no acc use moves above the wait
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  // m64n64 f32 fragment: warp w, lane l holds columns 8i + 2(l%4) + {0,1} of rows 16w + l/4 (acc 4i, 4i+1)
  // and 16w + l/4 + 8 (acc 4i+2, 4i+3).
  int lane = threadIdx.x % 32, r = m0 + wg * 64 + threadIdx.x % 128 / 32 * 16 + lane / 4;
  for (int j = 0; j < NB; ++j)
    for (int i = 0; i < 8; ++i) {
      int c = n0 + j * 64 + i * 8 + lane % 4 * 2;  // even, N % 8 == 0: c < N means c + 1 < N
      if (c >= N) continue;
      if (r < M) *(half2*)(C + (size_t)r * ldc + c) = __floats2half2_rn(acc[j][4 * i], acc[j][4 * i + 1]);
      if (r + 8 < M) *(half2*)(C + (size_t)(r + 8) * ldc + c) = __floats2half2_rn(acc[j][4 * i + 2], acc[j][4 * i + 3]);
    }
#endif
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t ws_bytes, void* stream) {
  // every check before the first CUDA call; 16-byte chunks need aligned bases and multiples of 8
  if (M < 0 || N < 0 || K < 0 || N % 8 || K % 8 || lda % 8 || ldb % 8 || ldc % 2 || lda < K || ldb < (RC ? K : N) || ldc < N ||
      ((uintptr_t)A | (uintptr_t)B) % 16 || (uintptr_t)C % 4 || (M + BM - 1) / BM > 65535)
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(hgemm, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (err != cudaSuccess) return err;
  hgemm<<<dim3((N + BN - 1) / BN, (M + BM - 1) / BM), THREADS, SMEM, (cudaStream_t)stream>>>((const half*)A, (const half*)B, (half*)C, M, N, K, lda, ldb, ldc);
  return cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "${META}";
}
