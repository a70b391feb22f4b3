// cudal2 split-K fixup: the reduction of K-split partial tiles inside the GEMM kernel itself, so a
// split-K call is ONE launch (no memset, no second reduce kernel on the caller's stream).
//
// Protocol, per output tile (BM x BN) computed by `splits` CTAs (one per K slice):
//   1. every CTA stores its fp32 partial tile into the caller's workspace (store_partial);
//   2. every CTA arrives at the tile's semaphore (a 32-bit counter in the workspace):
//      __threadfence (release: its partial is visible at gpu scope before the count moves),
//      atomicAdd, and the CTA that sees splits - 1 before its own add is the last one;
//   3. in the last CTA thread 0 fences again (acquire) before the CTA barrier; then for every
//      element of the tile the CTA sums the partials (reduce_element: the loads of kFixupBatch
//      splits in flight at once), rounds once to fp16 into
//      C, writes zeros back over every partial it read and resets the semaphore to 0.
//
// Modes (SPLITK_DETERMINISTIC):
//   1 (default) each split has its own partial slab; the last CTA sums slabs 0, 1, ..., splits-1
//     IN SPLIT-INDEX ORDER, so C is bit-identical run to run whatever order the CTAs arrive in.
//   0 every split adds its partial into ONE slab with fp32 atomics (arrival order: the result may
//     differ in the last bits between runs); 1/splits of the workspace and of the fixup traffic.
//
// Workspace contract (docs/abi.md, meta "workspace_zero_init": true): the bytes a call is given
// are all zero when it starts and all zero again when it ends (the last CTA of each tile clears
// what the tile used). The caller zeroes a workspace ONCE when it allocates it and never between
// calls; such a workspace may be shared by every zero-init kernel on one stream whatever their
// shapes. A semaphore found above splits - 1 (a caller that broke the contract) traps: a launch
// error, not a silent wrong answer.
//
// Layout of the workspace: [partials: slabs * M * N floats][pad to 16 bytes][tiles semaphores].
// The index arithmetic below is __host__ __device__ so tests/test_splitk.py runs this very code
// on the host with CTAs arriving in random orders (tests/splitk_emulate.cpp).

#ifndef CUDAL2_SPLITK_FIXUP_CUH
#define CUDAL2_SPLITK_FIXUP_CUH

#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__CUDACC__)
#include <atomic>
#endif

#ifndef SPLITK_DETERMINISTIC
#define SPLITK_DETERMINISTIC 1   // 1: sum partials in split-index order (bit-identical runs)
#endif

#if defined(__CUDACC__)
#define CUDAL2_HD __host__ __device__ __forceinline__
#else
#define CUDAL2_HD inline
#endif

namespace cudal2_splitk {

// Partial slabs in the workspace: one per split (deterministic) or one shared (atomic).
CUDAL2_HD int slabs(int splits) { return SPLITK_DETERMINISTIC ? splits : 1; }

CUDAL2_HD size_t semaphore_offset(int splits, int M, int N) {
  const size_t partial = (size_t)slabs(splits) * (size_t)M * (size_t)N * sizeof(float);
  return (partial + 15) / 16 * 16;
}

// Bytes one call needs: 0 without a split.
CUDAL2_HD size_t workspace_bytes(int splits, int M, int N, long long tiles) {
  if (splits <= 1) return 0;
  return semaphore_offset(splits, M, N) + (size_t)tiles * sizeof(unsigned int);
}

CUDAL2_HD float* partials(void* ws) { return reinterpret_cast<float*>(ws); }
CUDAL2_HD unsigned int* semaphores(void* ws, int splits, int M, int N) {
  return reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(ws) +
                                         semaphore_offset(splits, M, N));
}

// Index of element (row, col) of split z's partial.
CUDAL2_HD size_t partial_index(int z, int row, int col, int M, int N) {
  return SPLITK_DETERMINISTIC ? ((size_t)z * (size_t)M + (size_t)row) * (size_t)N + (size_t)col
                              : (size_t)row * (size_t)N + (size_t)col;
}

// The arrival that makes the count reach `splits` is the last one.
CUDAL2_HD bool is_last_arrival(unsigned int before, int splits) {
  return before == (unsigned int)(splits - 1);
}

// Loads that bypass L1 (the partials were written by other SMs) on the device.
CUDAL2_HD float load_partial(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}

// Split z's contribution to element (row, col).
CUDAL2_HD void store_partial(float* ws, int z, int row, int col, int M, int N, float v) {
  float* p = ws + partial_index(z, row, col, M, N);
#if SPLITK_DETERMINISTIC
  *p = v;
#elif defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

// Splits whose partials one reducing thread requests before it adds the first: a batch is one
// round trip through L2, not kFixupBatch dependent ones (the build meta's "fixup_batch").
constexpr int kFixupBatch = 4;

struct Float4 { float x, y, z, w; };

// Four consecutive floats of a partial (16-byte aligned): one ld.global.cg.v4 on the device.
CUDAL2_HD Float4 load_partial4(const float* p) {
#if defined(__CUDA_ARCH__)
  const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
  return Float4{v.x, v.y, v.z, v.w};
#else
  return Float4{p[0], p[1], p[2], p[3]};
#endif
}

// The sum of every split's contribution to (row, col), and the partials cleared back to zero.
CUDAL2_HD float reduce_element(float* ws, int splits, int row, int col, int M, int N) {
  float sum = 0.f;
#if SPLITK_DETERMINISTIC
  for (int z0 = 0; z0 < splits; z0 += kFixupBatch) {
    float v[kFixupBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kFixupBatch; ++u)   // the batch's loads, all issued before any add
      v[u] = z0 + u < splits ? load_partial(ws + partial_index(z0 + u, row, col, M, N)) : 0.f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kFixupBatch; ++u) {  // split-index order, whoever arrived last
      if (z0 + u >= splits) break;
      sum += v[u];
      ws[partial_index(z0 + u, row, col, M, N)] = 0.f;
    }
  }
#else
  float* p = ws + partial_index(0, row, col, M, N);
  sum = load_partial(p);
  *p = 0.f;
#endif
  return sum;
}

#if SPLITK_DETERMINISTIC
// reduce_element for the four elements (row, col .. col + 3), col % 4 == 0 and N % 4 == 0: each
// split's four in one 16-byte load, each element summed in split-index order as reduce_element
// sums it (the same bits), the partials cleared.
CUDAL2_HD Float4 reduce_unit(float* ws, int splits, int row, int col, int M, int N) {
  Float4 sum = {0.f, 0.f, 0.f, 0.f};
  for (int z0 = 0; z0 < splits; z0 += kFixupBatch) {
    Float4 v[kFixupBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kFixupBatch; ++u)   // the batch's loads, all issued before any add
      v[u] = z0 + u < splits ? load_partial4(ws + partial_index(z0 + u, row, col, M, N))
                             : Float4{0.f, 0.f, 0.f, 0.f};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kFixupBatch; ++u) {
      if (z0 + u >= splits) break;
      sum.x += v[u].x;
      sum.y += v[u].y;
      sum.z += v[u].z;
      sum.w += v[u].w;
      float* p = ws + partial_index(z0 + u, row, col, M, N);
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<float4*>(p) = make_float4(0.f, 0.f, 0.f, 0.f);
#else
      p[0] = p[1] = p[2] = p[3] = 0.f;
#endif
    }
  }
  return sum;
}
#endif

// The last CTA's share of the tile [m0, m0+rows) x [n0, n0+cols) (clipped to M x N): elements
// first, first + stride, ... (threadIdx.x / blockDim.x on the device, 0 / 1 on the host); four
// consecutive columns at a time (reduce_unit: a thread's loads four times wider) where the
// partials' rows keep them 16-byte aligned, else element by element.
CUDAL2_HD void finish_tile(float* ws, int splits, int M, int N, int m0, int n0, int rows,
                           int cols, half* C, int ldc, int first, int stride) {
  const int r_end = M - m0 < rows ? M - m0 : rows;
  const int c_end = N - n0 < cols ? N - n0 : cols;
  if (r_end <= 0 || c_end <= 0) return;
#if SPLITK_DETERMINISTIC
  if (N % 4 == 0 && n0 % 4 == 0 && cols % 4 == 0) {   // then c_end % 4 == 0 too
    const int units = c_end / 4;   // per row
    for (int i = first; i < r_end * units; i += stride) {
      const int row = m0 + i / units, col = n0 + i % units * 4;
      half* c = C + (size_t)row * (size_t)ldc + col;
      const Float4 s = reduce_unit(ws, splits, row, col, M, N);
      c[0] = __float2half_rn(s.x);
      c[1] = __float2half_rn(s.y);
      c[2] = __float2half_rn(s.z);
      c[3] = __float2half_rn(s.w);
    }
    return;
  }
#endif
  for (int i = first; i < r_end * c_end; i += stride) {
    const int row = m0 + i / c_end, col = n0 + i % c_end;
    C[(size_t)row * (size_t)ldc + col] = __float2half_rn(reduce_element(ws, splits, row, col, M, N));
  }
}

// ---- The cluster reduction (sm_90a): no workspace, no semaphore --------------------------------
// When the `splits` CTAs of one tile form a thread-block cluster (dims (1, splits, 1), rank =
// blockIdx.y = split index, splits <= kClusterMax), each CTA writes its fp32 partial tile into its
// OWN shared memory (the drained pipeline buffers, `rows` rows at a time: a chunk), the cluster
// barrier makes every rank's chunk visible, and rank r reduces the units (4 consecutive floats of
// one row) [cluster_slice_begin(r), cluster_slice_begin(r + 1)) of the chunk by reading ranks 0,
// 1, ..., splits-1 through distributed shared memory IN RANK ORDER (cluster_sum4): from 0.f, the
// same fp32 additions in the same order as reduce_element's split-index sum, so the two paths give
// the same bits. A second cluster barrier keeps every rank's shared memory alive (and unchanged)
// until its peers have read it. mma_hgemm.cuh holds the device side; tests/data/
// splitk_cluster_emulate.cu runs this code on the host against finish_tile.
// Two levels (runtime-split builds, sm_90a): splits = cs x groups, cluster dims (1, cs, 1), split z
// rank z % cs of cluster z / cs. Each cluster sums its ranks as above and stores the sum into the
// workspace slab of its own (store_partial, slab = cluster), every CTA arrives at the tile's
// semaphore, and the last sums the `groups` slabs in cluster order (finish_tile): the workspace
// carries groups partial tiles, not splits (tests/data/splitk_two_level_emulate.cu).
constexpr int kClusterMax = 8;   // portable cluster size: the most splits reduced in a cluster

// First unit of rank `rank`'s slice of a chunk of `units` units (rank == splits: the end).
CUDAL2_HD int cluster_slice_begin(int rank, int splits, int units) {
  return (int)((long long)rank * units / splits);
}

// The rank-ordered sum of one unit: load(z) is rank z's four floats.
template <class Load>
CUDAL2_HD Float4 cluster_sum4(int splits, Load load) {
  Float4 s = {0.f, 0.f, 0.f, 0.f};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int z = 0; z < kClusterMax; ++z) {   // rank (= split-index) order
    if (z >= splits) break;
    const Float4 v = load(z);
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
  }
  return s;
}

#if defined(__CUDACC__)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// The cluster's device side (sm_90 and later; the host pass sees the declarations only).
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster: release its shared-memory writes, acquire the peers'.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Four floats at the same shared-memory address in CTA `rank` of the cluster (mapa + DSMEM load).
__device__ __forceinline__ Float4 ld_peer4(uint32_t local, uint32_t rank) {
  uint32_t remote;
  Float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
#endif

// Whether a cluster of `splits` CTAs of `kernel` (dims (1, splits, 1), `threads` threads and
// `smem` bytes of dynamic shared memory, its opt-in already made) can be resident on the current
// device: cudaOccupancyMaxActiveClusters > 0, asked once per (device, split count) and kept in
// the caller's `cache` (one per kernel; 0 unknown, 1 yes, 2 no). No device or a failed query (its
// error consumed, so it is not left for the caller's next launch): false.
inline bool cluster_resident(std::atomic<int> (&cache)[64][kClusterMax + 1], const void* kernel,
                             int threads, size_t smem, int splits) {
  if (splits < 2 || splits > kClusterMax) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool cacheable = dev >= 0 && dev < 64;
  if (cacheable) {
    const int c = cache[dev][splits].load(std::memory_order_relaxed);
    if (c) return c == 1;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = (unsigned)splits;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, (unsigned)splits, 1);
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (cacheable) cache[dev][splits].store(n > 0 ? 1 : 2, std::memory_order_relaxed);
  return n > 0;
}

// Step 2 for the whole CTA (every thread calls it after storing its partials): true in the
// CTA that arrived last, which then runs finish_tile and release_tile.
__device__ __forceinline__ bool arrive(unsigned int* sem, int splits) {
  __shared__ int s_last;
  __syncthreads();                       // every partial of this CTA is stored
  if (threadIdx.x == 0) {
    __threadfence();                     // release: partials visible before the count moves
    const unsigned int before = atomicAdd(sem, 1u);
    if (before >= (unsigned int)splits) __trap();   // workspace not zero at entry: contract broken
    s_last = is_last_arrival(before, splits);
    if (s_last) __threadfence();         // acquire: the peers' partials before this CTA reads them
  }
  __syncthreads();                       // (the reads are ld.global.cg: L2, never a stale L1 line)
  return s_last;
}

// After finish_tile: the semaphore back to 0 for the next call (no other CTA touches it now).
__device__ __forceinline__ void release_tile(unsigned int* sem) {
  if (threadIdx.x == 0) *sem = 0u;
}
#endif

}  // namespace cudal2_splitk

#endif  // CUDAL2_SPLITK_FIXUP_CUH
