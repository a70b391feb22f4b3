/* A fake of the CUDA runtime calls a GEMM launcher makes, with the shared-memory opt-in kept per
 * function (tests/test_lowlat_runtime.py, tests/test_templates.py; the fixture reset_fake_cudart in
 * tests/conftest.py builds it): loaded with RTLD_GLOBAL before a kernel .so, it records every
 * launch (grid, block, dynamic shared memory, the lowlat split kernel's k-tiles per split) and
 * refuses a launch whose dynamic shared memory exceeds the function's opt-in, as the runtime does;
 * fake_device_reset() drops every opt-in, as cudaDeviceReset does. */
#include <stddef.h>
typedef struct { unsigned x, y, z; } dim3_t;
static int sms = 132, no_device, fail_with, pending;
static int attempts, launches, memsets, setattrs;
static dim3_t last_grid, last_block;
static size_t last_smem;
static int last_kt_per;
static const void* opted_fn[16];
static int opted_bytes[16], n_opted;

static int opted(const void* f) {
  for (int i = 0; i < n_opted; ++i) if (opted_fn[i] == f) return opted_bytes[i];
  return 48 * 1024;
}
int cudaGetDevice(int* dev) { if (no_device) return 100; *dev = 0; return 0; }
int cudaDeviceGetAttribute(int* v, int attr, int dev) { (void)dev; *v = attr == 16 ? sms : 0; return 0; }
int cudaFuncSetAttribute(const void* f, int attr, int value) {
  ++setattrs;
  if (attr != 8) return 1;             /* cudaFuncAttributeMaxDynamicSharedMemorySize */
  for (int i = 0; i < n_opted; ++i) if (opted_fn[i] == f) { opted_bytes[i] = value; return 0; }
  opted_fn[n_opted] = f; opted_bytes[n_opted++] = value;
  return 0;
}
int cudaLaunchKernel(const void* f, dim3_t grid, dim3_t block, void** args, size_t smem, void* s) {
  (void)s;
  ++attempts;
  if (fail_with) { pending = fail_with; return fail_with; }
  if ((int)smem > opted(f)) { pending = 1; return 1; }   /* cudaErrorInvalidValue, as the runtime */
  ++launches;
  last_grid = grid; last_block = block; last_smem = smem;
  last_kt_per = grid.z > 1 ? *(int*)args[11] : 0;       /* lowlat_splitk_kernel's kt_per */
  return 0;
}
int cudaMemsetAsync(void* p, int v, size_t n, void* s) { (void)p; (void)v; (void)n; (void)s; ++memsets; return 0; }
int cudaGetLastError(void) { int e = pending; pending = 0; return e; }
int cudaPeekAtLastError(void) { return pending; }

void fake_set(int sm_count, int without_device, int fail) { sms = sm_count; no_device = without_device; fail_with = fail; }
void fake_device_reset(void) { n_opted = 0; }
void fake_counts(int* out) {
  out[0] = attempts; out[1] = launches; out[2] = memsets; out[3] = setattrs; out[4] = pending;
  out[5] = (int)last_grid.x; out[6] = (int)last_grid.y; out[7] = (int)last_grid.z;
  out[8] = (int)last_block.x; out[9] = (int)last_smem; out[10] = last_kt_per;
}
