// cuBLASLt baseline, fp16 in/out, row-major C[M,N] = A[M,K] @ B[K,N].
//
// As in cublas_gemm.cu the row-major product is the column-major C^T = B^T A^T: Lt's "A" operand
// is our B (N x K column-major view: op N when B is row-major K x N, op T when B is stored
// column-major N x K), Lt's "B" operand is our A (K x M column-major view, op N).
//
// cudal2_lt_prepare builds the descriptors for one problem and runs
// cublasLtMatmulAlgoGetHeuristic once with a workspace limit given in size_t bytes (CUDA-L2's
// `20 * 1024 * 1024 * 1024` overflowed int and gave its heuristic baseline 0 bytes); the
// returned algorithms are kept in the plan. cudal2_lt_run(index) then runs algorithm `index`:
// index 0 is "the heuristic's first choice", timing every index is "autotuned". Creating the
// handle and the plan happens outside the timed region; run only enqueues.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CUDAL2_LT_MAX_ALGOS 128

struct Cudal2Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t results[CUDAL2_LT_MAX_ALGOS];
  int returned = 0;
  int compute16 = 0;
  size_t workspace_limit = 0;
};

static void lt_release_plan(Cudal2Lt* c) {
  if (c->pref) cublasLtMatmulPreferenceDestroy(c->pref);
  if (c->la) cublasLtMatrixLayoutDestroy(c->la);
  if (c->lb) cublasLtMatrixLayoutDestroy(c->lb);
  if (c->lc) cublasLtMatrixLayoutDestroy(c->lc);
  if (c->op) cublasLtMatmulDescDestroy(c->op);
  c->pref = nullptr; c->la = c->lb = c->lc = nullptr; c->op = nullptr; c->returned = 0;
}

#define LT_TRY(expr) do { cublasStatus_t s_ = (expr); if (s_ != CUBLAS_STATUS_SUCCESS) { lt_release_plan(c); return (int)s_; } } while (0)

extern "C" {

int cudal2_baseline_abi(void) { return 1; }

// The cuBLASLt version actually loaded (part of the autotune cache key).
size_t cudal2_lt_version(void) { return cublasLtGetVersion(); }

int cudal2_lt_create(void** out) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  Cudal2Lt* c = new Cudal2Lt();
  cublasStatus_t st = cublasLtCreate(&c->handle);
  if (st != CUBLAS_STATUS_SUCCESS) { delete c; return (int)st; }
  *out = c;
  return 0;
}

int cudal2_lt_destroy(void* h) {
  if (!h) return 0;
  Cudal2Lt* c = static_cast<Cudal2Lt*>(h);
  lt_release_plan(c);
  int st = (int)cublasLtDestroy(c->handle);
  delete c;
  return st;
}

// b_col_major: 0 = B row-major (K x N, ldb >= N), 1 = B stored column-major (N x K, ldb >= K).
// requested: how many algorithms to ask the heuristic for (<= 128); *returned gets the count.
int cudal2_lt_prepare(void* h, int M, int N, int K, int lda, int ldb, int ldc, int b_col_major,
                      int compute16, size_t workspace_bytes, int requested, int* returned) {
  if (!h || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  Cudal2Lt* c = static_cast<Cudal2Lt*>(h);
  lt_release_plan(c);
  if (requested < 1) requested = 1;
  if (requested > CUDAL2_LT_MAX_ALGOS) requested = CUDAL2_LT_MAX_ALGOS;
  c->compute16 = compute16;
  c->workspace_limit = workspace_bytes;
  cublasComputeType_t ct = compute16 ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = compute16 ? CUDA_R_16F : CUDA_R_32F;
  LT_TRY(cublasLtMatmulDescCreate(&c->op, ct, scale));
  cublasOperation_t opa = b_col_major ? CUBLAS_OP_T : CUBLAS_OP_N;   // Lt's A is our B
  cublasOperation_t opb = CUBLAS_OP_N;
  LT_TRY(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  LT_TRY(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  // Lt's A: rows x cols of the stored (column-major) matrix, before op.
  if (b_col_major) {
    LT_TRY(cublasLtMatrixLayoutCreate(&c->la, CUDA_R_16F, K, N, ldb));
  } else {
    LT_TRY(cublasLtMatrixLayoutCreate(&c->la, CUDA_R_16F, N, K, ldb));
  }
  LT_TRY(cublasLtMatrixLayoutCreate(&c->lb, CUDA_R_16F, K, M, lda));
  LT_TRY(cublasLtMatrixLayoutCreate(&c->lc, CUDA_R_16F, N, M, ldc));
  LT_TRY(cublasLtMatmulPreferenceCreate(&c->pref));
  uint64_t ws = (uint64_t)workspace_bytes;
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(c->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ws, sizeof(ws)));
  int got = 0;
  LT_TRY(cublasLtMatmulAlgoGetHeuristic(c->handle, c->op, c->la, c->lb, c->lc, c->lc, c->pref,
                                        requested, c->results, &got));
  c->returned = got;
  *returned = got;
  return got > 0 ? 0 : (int)CUBLAS_STATUS_NOT_SUPPORTED;
}

// Bytes of workspace algorithm `index` needs (from the heuristic result).
size_t cudal2_lt_algo_workspace(void* h, int index) {
  Cudal2Lt* c = static_cast<Cudal2Lt*>(h);
  if (!c || index < 0 || index >= c->returned) return 0;
  return c->results[index].workspaceSize;
}

int cudal2_lt_run(void* h, int index, const void* A, const void* B, void* C, void* workspace,
                  size_t workspace_bytes, void* stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  Cudal2Lt* c = static_cast<Cudal2Lt*>(h);
  if (index < 0 || index >= c->returned) return CUBLAS_STATUS_INVALID_VALUE;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const cublasLtMatmulAlgo_t* algo = &c->results[index].algo;
  if (c->compute16) {
    const __half alpha = __float2half(1.0f), beta = __float2half(0.0f);
    return (int)cublasLtMatmul(c->handle, c->op, &alpha, B, c->la, A, c->lb, &beta, C, c->lc, C,
                               c->lc, algo, workspace, workspace_bytes, s);
  }
  const float alpha = 1.0f, beta = 0.0f;
  return (int)cublasLtMatmul(c->handle, c->op, &alpha, B, c->la, A, c->lb, &beta, C, c->lc, C,
                             c->lc, algo, workspace, workspace_bytes, s);
}

}  // extern "C"
