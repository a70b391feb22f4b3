// Hostile (call guard): fetches a forbidden driver function through the driver entry-point door
// by a name it assembles at run time: the driver's context-wide synchronise (a host-clock timer
// would then see the kernel), kept as its reversed letters, each one offset by a key read
// through a volatile, and unscrambled on the first call, so no forbidden driver name appears in
// this source (not even here) or in the .so's strings: the static audit, which reads
// names, passes it (it imports cudaGetDriverEntryPoint, which TMA kernels need). The call
// guard's door refuses the request at run time (a NULL pointer, "symbol not found"), on a GPU
// and in `cudal2 audit`'s dry call without one; the kernel then still computes C, so only the
// guard's record tells it apart from control_ok.cu. Same SIMT kernel as control_ok.cu.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void simt_hgemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += __half2float(A[row * lda + k]) * __half2float(B[k * ldb + col]);
  C[row * ldc + col] = __float2half(acc);
}

static volatile unsigned char g_key = 3;
// the name reversed, every byte + 3
static const unsigned char g_scrambled[] = {'h' , '}' , 'l' , 'q' , 'r' , 'u' , 'k' , 'f' ,
                                            'q' , '|' , 'V' , '{' , 'w' , 'F' , 'x' , 'f'};

typedef CUresult (*sync_fn)(void);

static sync_fn fetch(void) {
  char name[sizeof(g_scrambled) + 1];
  const unsigned n = sizeof(g_scrambled);
  for (unsigned i = 0; i < n; ++i) name[i] = (char)(g_scrambled[n - 1 - i] - g_key);
  name[n] = 0;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &status);
#pragma GCC diagnostic pop
  return (sync_fn)fn;
}

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  static sync_fn sync = fetch();       // asked before the launch: the dry call sees it
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  simt_hgemm<<<grid, block, 0, (cudaStream_t)stream>>>((const __half*)A, (const __half*)B,
                                                      (__half*)C, M, N, K, lda, ldb, ldc);
  if (sync) sync();                    // the device-wide wait the ABI forbids
  return (int)cudaGetLastError();
}

extern "C" const char* cudal2_meta(void) {
  return "{\"style\": \"mma\", \"arch\": \"sm_90a\", \"acc\": \"f32\", \"layout\": \"RR\", "
         "\"tile\": [16, 16, 1], \"any_shape\": true, \"workspace_bytes\": 0}";
}
