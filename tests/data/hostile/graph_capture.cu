// Hostile (audit): captures a CUDA graph keyed on the pointers and replays it.
#include <cuda_runtime.h>

__global__ void noop_kernel(void* C) {}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  static cudaGraphExec_t exec = nullptr;
  if (!exec) {
    cudaGraph_t g;
    cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeGlobal);
    noop_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(C);
    cudaStreamEndCapture((cudaStream_t)stream, &g);
    cudaGraphInstantiate(&exec, g, 0);
  }
  return (int)cudaGraphLaunch(exec, (cudaStream_t)stream);
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
