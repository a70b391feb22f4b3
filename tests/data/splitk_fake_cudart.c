/* A fake of the CUDA runtime calls a split-K / stream-K GEMM launcher makes (tests/test_splitk.py,
 * tests/test_skinny.py): loaded with RTLD_GLOBAL before a kernel .so, it answers cudaGetDevice /
 * cudaDeviceGetAttribute / cudaFuncSetAttribute and the occupancy queries (CTAs per SM, resident
 * clusters: both set by the test), and records every cudaLaunchKernel, cudaLaunchKernelExC (with
 * its cluster dims and programmatic stream serialisation) and cudaMemset* instead of running it, so a CPU test counts the launches of
 * one cudal2_hgemm call and reads their grids. tests/data/fake_cudart.c's calls and layout, plus
 * what a cluster launch needs (cudaLaunchConfig_t / cudaLaunchAttribute as driver_types.h lays
 * them out: 64-bit pointers and size_t), and the driver entry point of cuTensorMapEncodeTiled (a
 * fake that fills no tensor map: the wgmma family's launcher encodes its operands per call). */
#include <stddef.h>

typedef struct { unsigned x, y, z; } fake_dim3;

typedef struct {
  int id;                     /* cudaLaunchAttributeID: 4 = cudaLaunchAttributeClusterDimension,
                                 6 = cudaLaunchAttributeProgrammaticStreamSerialization */
  char pad[8 - sizeof(int)];
  union { char pad[64]; struct { unsigned x, y, z; } clusterDim; int pdl; } val;
} fake_attr;

typedef struct {
  fake_dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  void* stream;
  fake_attr* attrs;
  unsigned numAttrs;
} fake_config;

static int launches, ex_launches, memsets, occupancy_queries, cluster_queries;
static fake_dim3 last_grid, last_cluster;
static int last_pdl;
static size_t last_smem;
static int sm_count = 132, blocks_per_sm = 2, max_clusters = 16;
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
  (void)f; (void)block; (void)args; (void)stream;
  if (fail_with) { pending = fail_with; return fail_with; }
  ++launches;
  last_grid = grid;
  last_smem = smem;
  last_cluster.x = last_cluster.y = last_cluster.z = 1;
  last_pdl = 0;
  return 0;
}
static fake_dim3 cluster_of(const fake_config* cfg) {
  fake_dim3 c = {1, 1, 1};
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == 4) {
      c.x = cfg->attrs[i].val.clusterDim.x;
      c.y = cfg->attrs[i].val.clusterDim.y;
      c.z = cfg->attrs[i].val.clusterDim.z;
    }
  return c;
}
int cudaLaunchKernelExC(const fake_config* cfg, const void* f, void** args) {
  (void)f; (void)args;
  if (fail_with) { pending = fail_with; return fail_with; }
  ++launches;
  ++ex_launches;
  last_grid = cfg->gridDim;
  last_smem = cfg->dynamicSmemBytes;
  last_cluster = cluster_of(cfg);
  last_pdl = 0;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == 6) last_pdl = cfg->attrs[i].val.pdl;
  /* the runtime refuses a grid its cluster does not divide */
  if (last_grid.x % last_cluster.x || last_grid.y % last_cluster.y || last_grid.z % last_cluster.z) {
    pending = 1;
    return 1;
  }
  return 0;
}
int cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* f, int block, size_t smem) {
  (void)f; (void)block; (void)smem;
  ++occupancy_queries;
  *n = blocks_per_sm;
  return 0;
}
int cudaOccupancyMaxActiveClusters(int* n, const void* f, const fake_config* cfg) {
  (void)f; (void)cfg;
  ++cluster_queries;
  *n = max_clusters;
  return 0;
}
int cudaMemsetAsync(void* p, int v, size_t n, void* s) { (void)p; (void)v; (void)n; (void)s; ++memsets; return 0; }
int cudaMemset(void* p, int v, size_t n) { (void)p; (void)v; (void)n; ++memsets; return 0; }

/* cuTensorMapEncodeTiled as cudaTypedefs.h declares it: CUDA_SUCCESS, the map left as it is */
static int fake_encode_tiled(void* map, int dtype, unsigned rank, void* base, const unsigned long long* dims,
                             const unsigned long long* strides, const unsigned* box,
                             const unsigned* elem_strides, int interleave, int swizzle, int l2, int oob) {
  (void)map; (void)dtype; (void)rank; (void)base; (void)dims; (void)strides; (void)box;
  (void)elem_strides; (void)interleave; (void)swizzle; (void)l2; (void)oob;
  return 0;
}
int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                     unsigned long long flags, int* status) {
  (void)symbol; (void)version; (void)flags;
  *fn = (void*)&fake_encode_tiled;
  if (status) *status = 0;   /* cudaDriverEntryPointSuccess */
  return 0;
}

int cudaGetLastError(void) { int e = pending; pending = 0; return e; }
int cudaPeekAtLastError(void) { return pending; }

void fake_fail_launches(int err) { fail_with = err; }
int fake_launches(void) { return launches; }
int fake_ex_launches(void) { return ex_launches; }
int fake_memsets(void) { return memsets; }
int fake_occupancy_queries(void) { return occupancy_queries; }
int fake_cluster_queries(void) { return cluster_queries; }
void fake_last_grid(unsigned* xyz) { xyz[0] = last_grid.x; xyz[1] = last_grid.y; xyz[2] = last_grid.z; }
void fake_last_cluster(unsigned* xyz) { xyz[0] = last_cluster.x; xyz[1] = last_cluster.y; xyz[2] = last_cluster.z; }
void fake_set_sm_count(int n) { sm_count = n; }
void fake_set_blocks_per_sm(int n) { blocks_per_sm = n; }
void fake_set_max_clusters(int n) { max_clusters = n; }
int fake_last_pdl(void) { return last_pdl; }
void fake_reset(void) { launches = ex_launches = memsets = last_pdl = 0; }
