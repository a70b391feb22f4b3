/* A fake of the CUDA runtime calls a GEMM launcher makes (tests/test_splitk.py): loaded with
 * RTLD_GLOBAL before a kernel .so, it answers cudaGetDevice / cudaDeviceGetAttribute /
 * cudaFuncSetAttribute and records every cudaLaunchKernel and cudaMemset* instead of running
 * it, so a CPU test counts the launches of one cudal2_hgemm call and reads their grids.
 * fake_fail_launches(err) makes every launch fail with err, left pending as the runtime leaves it
 * (cudaGetLastError returns and clears it, cudaPeekAtLastError only reads it). */
#include <stddef.h>

typedef struct { unsigned x, y, z; } fake_dim3;

static int launches, memsets;
static fake_dim3 last_grid;
static int sm_count = 132;
static int fail_with, pending;

int cudaGetDevice(int* dev) { *dev = 0; return 0; }
int cudaDeviceGetAttribute(int* value, int attr, int dev) {
  (void)dev;
  *value = attr == 16 ? sm_count : 0;   /* 16: cudaDevAttrMultiProcessorCount */
  return 0;
}
int cudaFuncSetAttribute(const void* f, int attr, int value) { (void)f; (void)attr; (void)value; return 0; }
int cudaLaunchKernel(const void* f, fake_dim3 grid, fake_dim3 block, void** args, size_t smem,
                     void* stream) {
  (void)f; (void)block; (void)args; (void)smem; (void)stream;
  if (fail_with) { pending = fail_with; return fail_with; }
  ++launches;
  last_grid = grid;
  return 0;
}
int cudaMemsetAsync(void* p, int v, size_t n, void* s) { (void)p; (void)v; (void)n; (void)s; ++memsets; return 0; }
int cudaMemset(void* p, int v, size_t n) { (void)p; (void)v; (void)n; ++memsets; return 0; }

int cudaGetLastError(void) { int e = pending; pending = 0; return e; }
int cudaPeekAtLastError(void) { return pending; }

void fake_fail_launches(int err) { fail_with = err; }
int fake_launches(void) { return launches; }
int fake_memsets(void) { return memsets; }
void fake_last_grid(unsigned* xyz) { xyz[0] = last_grid.x; xyz[1] = last_grid.y; xyz[2] = last_grid.z; }
void fake_set_sm_count(int n) { sm_count = n; }
void fake_reset(void) { launches = memsets = 0; }
