// cuBLAS baseline (cublasGemmEx), fp16 in/out, row-major C[M,N] = A[M,K] @ B[K,N].
//
// Row-major matrices are column-major transposes, so C^T = B^T A^T is one column-major GEMM with
// m = N, n = M and the operands swapped. Two variants, as CUDA-L2 defines them:
//   NN: B row-major (K x N, ldb >= N)                 -> cublasGemmEx(OP_N, OP_N, N, M, K, B, ldb, A, lda)
//   TN: B column-major (stored N x K, ldb >= K)        -> cublasGemmEx(OP_T, OP_N, N, M, K, B, ldb, A, lda)
// compute16 = 1 uses CUBLAS_COMPUTE_16F (fp16 accumulate, half scalars), else CUBLAS_COMPUTE_32F.
// Handle creation and the workspace binding happen in cudal2_cublas_create, outside any timed
// region; a run call enqueues the GEMM (no sync, no allocation), binding the stream (and the
// workspace again, which cublasSetStream drops) only when the stream changed.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

struct Cudal2Cublas {
  cublasHandle_t handle;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  bool stream_set = false;
};

// cublasSetStream resets the handle to cuBLAS's default workspace pool (cuBLAS docs), so the
// caller's workspace is bound again after every stream change; the same stream is not re-set.
static cublasStatus_t bind_stream(Cudal2Cublas* ctx, cudaStream_t stream) {
  if (ctx->stream_set && ctx->stream == stream) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t st = cublasSetStream(ctx->handle, stream);
  if (st == CUBLAS_STATUS_SUCCESS && ctx->workspace_bytes > 0)
    st = cublasSetWorkspace(ctx->handle, ctx->workspace, ctx->workspace_bytes);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  ctx->stream = stream;
  ctx->stream_set = true;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

int cudal2_baseline_abi(void) { return 1; }

// workspace: caller-owned device memory bound to the handle (cublasSetWorkspace), may be 0 bytes.
int cudal2_cublas_create(void** out, void* workspace, size_t workspace_bytes) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  Cudal2Cublas* ctx = new Cudal2Cublas();
  cublasStatus_t st = cublasCreate(&ctx->handle);
  if (st != CUBLAS_STATUS_SUCCESS) { delete ctx; return (int)st; }
  ctx->workspace = workspace;
  ctx->workspace_bytes = workspace_bytes;
  if (workspace_bytes > 0) {
    st = cublasSetWorkspace(ctx->handle, workspace, workspace_bytes);
    if (st != CUBLAS_STATUS_SUCCESS) { cublasDestroy(ctx->handle); delete ctx; return (int)st; }
  }
  *out = ctx;
  return 0;
}

int cudal2_cublas_destroy(void* h) {
  if (!h) return 0;
  Cudal2Cublas* ctx = static_cast<Cudal2Cublas*>(h);
  int st = (int)cublasDestroy(ctx->handle);
  delete ctx;
  return st;
}

// variant: 0 = NN (B row-major), 1 = TN (B column-major). Returns a cublasStatus_t (0 = success).
int cudal2_cublas_run(void* h, int variant, int compute16, const void* A, const void* B, void* C,
                      int M, int N, int K, int lda, int ldb, int ldc, void* stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  Cudal2Cublas* ctx = static_cast<Cudal2Cublas*>(h);
  cublasStatus_t st = bind_stream(ctx, static_cast<cudaStream_t>(stream));
  if (st != CUBLAS_STATUS_SUCCESS) return (int)st;
  cublasOperation_t opb = variant == 1 ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (compute16) {
    const __half alpha = __float2half(1.0f), beta = __float2half(0.0f);
    st = cublasGemmEx(ctx->handle, opb, CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16F, ldb, A,
                      CUDA_R_16F, lda, &beta, C, CUDA_R_16F, ldc, CUBLAS_COMPUTE_16F,
                      CUBLAS_GEMM_DEFAULT);
  } else {
    const float alpha = 1.0f, beta = 0.0f;
    st = cublasGemmEx(ctx->handle, opb, CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16F, ldb, A,
                      CUDA_R_16F, lda, &beta, C, CUDA_R_16F, ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  }
  return (int)st;
}

}  // extern "C"
