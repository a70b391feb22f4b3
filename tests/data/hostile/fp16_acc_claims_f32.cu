// Hostile (audit): accumulates in fp16 (mma.sync ...f16.f16.f16.f16) while its meta declares
// "acc": "f32". CUDA-L2's 0/1 check cannot see this; the PTX's mma types can.
// One warp per 16x8 output tile, K stepped by 16; row-major A, column-major B (layout RC).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

__global__ void mma_f16acc(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc) {
  int lane = threadIdx.x, m0 = blockIdx.y * 16, n0 = blockIdx.x * 8;
  int g = lane / 4, t = lane % 4;
  uint32_t acc[2] = {0u, 0u};
  for (int k0 = 0; k0 < K; k0 += 16) {
    __half2 a[4], b[2];
    a[0] = __halves2half2(A[(m0 + g) * lda + k0 + 2 * t], A[(m0 + g) * lda + k0 + 2 * t + 1]);
    a[1] = __halves2half2(A[(m0 + g + 8) * lda + k0 + 2 * t], A[(m0 + g + 8) * lda + k0 + 2 * t + 1]);
    a[2] = __halves2half2(A[(m0 + g) * lda + k0 + 2 * t + 8], A[(m0 + g) * lda + k0 + 2 * t + 9]);
    a[3] = __halves2half2(A[(m0 + g + 8) * lda + k0 + 2 * t + 8], A[(m0 + g + 8) * lda + k0 + 2 * t + 9]);
    b[0] = __halves2half2(B[(n0 + g) * ldb + k0 + 2 * t], B[(n0 + g) * ldb + k0 + 2 * t + 1]);
    b[1] = __halves2half2(B[(n0 + g) * ldb + k0 + 2 * t + 8], B[(n0 + g) * ldb + k0 + 2 * t + 9]);
    const uint32_t* ar = reinterpret_cast<const uint32_t*>(a);
    const uint32_t* br = reinterpret_cast<const uint32_t*>(b);
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
        : "+r"(acc[0]), "+r"(acc[1])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
  }
  const __half2* c = reinterpret_cast<const __half2*>(acc);
  *reinterpret_cast<__half2*>(&C[(m0 + g) * ldc + n0 + 2 * t]) = c[0];
  *reinterpret_cast<__half2*>(&C[(m0 + g + 8) * ldc + n0 + 2 * t]) = c[1];
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  dim3 grid(N / 8, M / 16);
  mma_f16acc<<<grid, 32, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                    (__half*)C, M, N, K, lda, ldb, ldc);
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RC\", "
         "\"tile\": [16, 8, 16], \"any_shape\": false, \"workspace_bytes\": 0}";
}
