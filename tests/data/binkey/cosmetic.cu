/* The same binary as base.cu written differently: comments, every kernel, function and
   variable renamed, and constants nothing uses. Its binary key must equal base.cu's. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

constexpr int kNeverUsed = 42;            // unused: emits nothing
static const float kAlsoUnused = 3.5f;    // unused: emits nothing

// one product of the inner sum
__device__ float product_term(const half* lhs, const half* rhs, int kk, int j, int width) {
    return __half2float(lhs[kk]) * __half2float(rhs[(size_t)kk * width + j]);
}

__global__ void matmul_simple_v2(const half* X, const half* Y, half* Z, int rows, int width,
                                 int depth) {
    int i = blockIdx.y * blockDim.y + threadIdx.y;   // the output row
    int j = blockIdx.x * blockDim.x + threadIdx.x;   // the output column
    if (i >= rows || j >= width) return;
    const half* x_row = X + (size_t)i * depth;
    float sum = 0.0f;
    for (int kk = 0; kk < depth; kk += 1) {
        sum += product_term(x_row, Y, kk, j, width);
    }
    Z[(size_t)i * width + j] = __float2half(sum);
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K,
                            int lda, int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
    dim3 threads(16, 16);
    dim3 blocks((N + 15) / 16, (M + 15) / 16);   // ceil-divided tiles
    matmul_simple_v2<<<blocks, threads, 0, (cudaStream_t)stream>>>(
        (const half*)A, (const half*)B, (half*)C, M, N, K);
    return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
    // identical meta text
    return "{\"style\": \"mma\", \"family\": \"binkey\", \"arch\": \"sm_90a\", \"acc\": \"f32\", "
           "\"layout\": \"RR\", \"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
