// cudal2 reference kernel family "cutlass_sm90": CUTLASS 3.x Hopper GEMM (TMA loads, wgmma,
// warp-specialised persistent kernel, TMA epilogue) assembled with the CollectiveBuilders.
// Kernel ABI 2 (docs/abi.md): tile order, swizzle and (stream-K builds) the K decomposition are
// runtime options, so one build serves every value of them.
//
//   C[M,N] (fp16, row-major, ldc) = A[M,K] (fp16, row-major, lda) @ B
//   B is K x N row-major (ldb >= N) when LAYOUT_RC == 0 ("RR"),
//        N x K row-major, i.e. K x N column-major (ldb >= K), when LAYOUT_RC == 1 ("RC").
//
// sm_90a only. Build with -std=c++17 --expt-relaxed-constexpr -DNDEBUG (without NDEBUG CUTLASS
// serialises the wgmma pipeline) and the CUTLASS include directories.
// TMA needs 16-byte aligned base pointers and leading dimensions that are multiples of 8
// elements; the 16-byte vector accesses need K % 8 == 0 and N % 8 == 0 (declared as
// "divisible": [1, 8, 8] in the meta). M, N, K residues inside a tile are handled by TMA's
// out-of-bounds zero fill and clipped stores, so any M and any N, K that are multiples of 8
// are served ("any_shape": true).
//
// Runtime options (the `options` array, in this order; NULL = every default):
//   swizzle        1, 2, 4, 8   the tile scheduler's max_swizzle_size (tile-group size of the
//                               grouped raster; CUTLASS clamps it by the smaller tile count)
//   raster         0, 1, 2      RasterOrderOptions: 0 heuristic (along M when N has more
//                               tiles), 1 along M, 2 along N
//   splits         1, 2, 4, 8   stream-K builds only: K splits (> 1 forces split-K)
//   decomposition  0, 1, 2, 3   stream-K builds only: DecompositionMode: 0 heuristic,
//                               1 data-parallel, 2 split-K, 3 stream-K
// splits > 1 needs decomposition 0 or 2 (CUTLASS's rule); anything else unlisted is
// cudaErrorInvalidValue.
//
// Host cost per call: the kernel Params (TMA descriptors from cuTensorMapEncodeTiled, scheduler
// divisors) are a pure function of the pointers, shape, strides, options, workspace pointer and
// device, so each host thread keeps the last few in a small cache keyed by exactly those; a
// repeated call skips can_implement, the descriptor encoding and cudaFuncSetAttribute (done
// once per device) and goes straight to the launch. Stream-K/split-K calls that need a
// workspace still clear its barrier flags on the stream every call (cudaMemsetAsync), as
// CUTLASS requires.

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <atomic>
#include <type_traits>

#include <cutlass/cutlass.h>
#include <cutlass/version.h>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#ifndef BM
#define BM 128              // CTA tile M (cooperative: 128 or 256; pingpong: 64 or 128)
#endif
#ifndef BN
#define BN 256              // CTA tile N (multiple of 16, <= 256)
#endif
#ifndef BK
#define BK 64               // CTA tile K (64 = 128 bytes of fp16, one TMA swizzle atom)
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 2         // CTAs per cluster along M (B tiles multicast across them)
#endif
#ifndef CLUSTER_N
#define CLUSTER_N 1         // CTAs per cluster along N (A tiles multicast across them)
#endif
#ifndef SCHEDULE_PINGPONG
#define SCHEDULE_PINGPONG 0 // 0: KernelTmaWarpSpecializedCooperative, 1: ...Pingpong
#endif
#ifndef SCHEDULER_STREAMK
#define SCHEDULER_STREAMK 0 // 0: PersistentScheduler, 1: StreamKScheduler (cooperative only)
#endif
#ifndef ACC_F16
#define ACC_F16 0           // 0: fp32 accumulate, 1: fp16 accumulate
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0         // 0: B row-major K x N ("RR"), 1: B column-major, stored N x K ("RC")
#endif

#if SCHEDULER_STREAMK && SCHEDULE_PINGPONG
#error "cutlass_sm90: CUTLASS's ping-pong kernel has no stream-K scheduler (use the cooperative schedule)"
#endif

// wgmma and TMA are sm_90a features. (nvcc 13's -arch=sm_90a also emits generic compute_90 PTX,
// for which CUTLASS compiles the kernel body out; the sm_90a cubin is what runs on Hopper.)
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "cudal2 cutlass_sm90 kernels need -arch=sm_90a"
#endif

namespace cudal2_cutlass_impl {

using namespace cute;

using ElementA = cutlass::half_t;
using ElementB = cutlass::half_t;
using ElementD = cutlass::half_t;
using ElementC = void;   // beta == 0: no source tensor is read
using LayoutA = cutlass::layout::RowMajor;
#if LAYOUT_RC
using LayoutB = cutlass::layout::ColumnMajor;
#else
using LayoutB = cutlass::layout::RowMajor;
#endif
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 8;   // 16 bytes of fp16
#if ACC_F16
using ElementAccumulator = cutlass::half_t;
#else
using ElementAccumulator = float;
#endif
using ElementCompute = float;

using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
using ClusterShape = Shape<Int<CLUSTER_M>, Int<CLUSTER_N>, _1>;
#if SCHEDULE_PINGPONG
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#define CUDAL2_SCHEDULE_NAME "pingpong"
#else
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#define CUDAL2_SCHEDULE_NAME "cooperative"
#endif
#if SCHEDULER_STREAMK
using TileSchedulerTag = cutlass::gemm::StreamKScheduler;
#define CUDAL2_SCHEDULER_NAME "streamk"
#else
using TileSchedulerTag = cutlass::gemm::PersistentScheduler;
#define CUDAL2_SCHEDULER_NAME "persistent"
#endif

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute,
    ElementC, LayoutD, kAlign, ElementD, LayoutD, kAlign, EpilogueSchedule>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB,
    LayoutB, kAlign, ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, TileSchedulerTag>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using Params = typename GemmKernel::Params;
using Arguments = typename GemmKernel::Arguments;
using RasterOrderOptions = typename GemmKernel::TileScheduler::RasterOrderOptions;

using StrideA = typename GemmKernel::StrideA;
using StrideB = typename GemmKernel::StrideB;
using StrideC = typename GemmKernel::StrideC;
using StrideD = typename GemmKernel::StrideD;

constexpr int kStages = CollectiveMainloop::DispatchPolicy::Stages;
constexpr int kThreads = GemmKernel::MaxThreadsPerBlock;
constexpr int kSmemBytes = GemmKernel::SharedStorageSize;

// K == 0: the product of empty sums is C = 0.
__global__ void __launch_bounds__(256) zero_kernel(cutlass::half_t* C, int M, int N, int ldc) {
  const size_t total = (size_t)M * (size_t)N;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t m = i / (size_t)N, n = i % (size_t)N;
    C[m * (size_t)ldc + n] = cutlass::half_t(0.f);
  }
}

// ---- runtime options ------------------------------------------------------------------------
constexpr int kSwizzles[] = {1, 2, 4, 8};
constexpr int kSplits[] = {1, 2, 4, 8};

struct Options {
  int swizzle = 1, raster = 0, splits = 1, decomposition = 0;
};

static bool listed(int v, const int* values, int n) {
  for (int i = 0; i < n; ++i)
    if (values[i] == v) return true;
  return false;
}

// NULL = defaults. False for a value the meta does not list (or a combination CUTLASS refuses).
static bool read_options(const int* o, Options& out) {
  out = Options{};
  if (o == nullptr) return true;
  out.swizzle = o[0];
  out.raster = o[1];
#if SCHEDULER_STREAMK
  out.splits = o[2];
  out.decomposition = o[3];
#endif
  if (!listed(out.swizzle, kSwizzles, 4) || out.raster < 0 || out.raster > 2) return false;
  if (!listed(out.splits, kSplits, 4) || out.decomposition < 0 || out.decomposition > 3) return false;
  // CUTLASS's stream-K can_implement: a split count needs the heuristic or split-K decomposition.
  if (out.splits > 1 && out.decomposition != 0 && out.decomposition != 2) return false;
  return true;
}

static void apply_options(Arguments& args, const Options& o) {
  args.scheduler.max_swizzle_size = o.swizzle;
  args.scheduler.raster_order = static_cast<RasterOrderOptions>(o.raster);
#if SCHEDULER_STREAMK
  using Decomposition = typename GemmKernel::TileScheduler::DecompositionMode;
  args.scheduler.splits = o.splits;
  args.scheduler.decomposition_mode = static_cast<Decomposition>(o.decomposition);
#endif
}

// ---- device facts, queried once per device ---------------------------------------------------
// SM count per device (the persistent and stream-K schedulers size their grid and split their
// work with it). 0 when it cannot be read (no device).
static int sm_count(int dev) {
  static std::atomic<int> cache[64];
  if (dev >= 0 && dev < 64) {
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < 64 && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

// The >48 KiB dynamic shared memory opt-in, once per device (a bit per device).
static cudaError_t opt_in_smem(int dev) {
  static std::atomic<unsigned long long> done{0};
  const unsigned long long bit = (dev >= 0 && dev < 64) ? (1ull << dev) : 0ull;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  if (kSmemBytes >= (48 << 10)) {
    cudaError_t err = cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return err;
    }
  }
  if (bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

// ---- arguments --------------------------------------------------------------------------------
static Arguments make_arguments(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                                int ldb, int ldc, int dev, int sms, const Options& o) {
  StrideA sA = cute::make_stride(int64_t(lda), cute::Int<1>{}, int64_t(0));
#if LAYOUT_RC
  StrideB sB = cute::make_stride(int64_t(ldb), cute::Int<1>{}, int64_t(0));   // (N, K, L)
#else
  StrideB sB = cute::make_stride(cute::Int<1>{}, int64_t(ldb), int64_t(0));   // (N, K, L)
#endif
  StrideD sD = cute::make_stride(int64_t(ldc), cute::Int<1>{}, int64_t(0));
  StrideC sC = sD;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = dev;
  hw.sm_count = sms;
  Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {reinterpret_cast<const ElementA*>(A), sA, reinterpret_cast<const ElementB*>(B), sB},
      {{ElementCompute(1), ElementCompute(0)}, nullptr, sC, reinterpret_cast<ElementD*>(C), sD},
      hw};
  apply_options(args, o);
  return args;
}

// SM count the workspace query assumes when no device can be read (an H100 SXM's): the answer
// only informs, since nothing can be launched there either.
constexpr int kFallbackSms = 132;

// ---- the per-thread Params cache ------------------------------------------------------------------
// Params hold TMA descriptors (cuTensorMapEncodeTiled of the pointers, shape and strides), the
// scheduler's divisors (shape, options, SM count) and the workspace pointer: a pure function of
// the key below, so a hit may launch them as they are. Never caches outputs.
static_assert(std::is_trivially_copyable<Params>::value, "Params must be trivially copyable");
constexpr int kKeyLen = 15;
constexpr int kCacheEntries = 8;
struct CacheEntry {
  long long key[kKeyLen];
  size_t need;            // workspace bytes this call needs
  int valid;
  alignas(alignof(Params)) unsigned char params[sizeof(Params)];
};
struct ThreadCache {
  CacheEntry entry[kCacheEntries];
  unsigned next;
};
static thread_local ThreadCache t_cache;   // zero-initialised, trivially destructible

static CacheEntry* cache_find(const long long* key) {
  for (int i = 0; i < kCacheEntries; ++i) {
    CacheEntry& e = t_cache.entry[i];
    if (e.valid && memcmp(e.key, key, sizeof(e.key)) == 0) return &e;
  }
  return nullptr;
}

}  // namespace cudal2_cutlass_impl

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream, const int* options) {
  using namespace cudal2_cutlass_impl;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  Options opt;
  if (!read_options(options, opt)) return cudaErrorInvalidValue;
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N) return cudaErrorInvalidValue;
  if (K == 0) {
    cutlass::half_t* d = reinterpret_cast<cutlass::half_t*>(C);
    void* args[] = {&d, &M, &N, &ldc};
    size_t blocks = ((size_t)M * (size_t)N + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return cudaLaunchKernel(reinterpret_cast<const void*>(&zero_kernel),
                            dim3((unsigned)blocks), dim3(256), args, 0, s);
  }
  if (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N))
    return cudaErrorInvalidValue;
  // TMA: 16-byte aligned bases and strides; vector width 8 along the contiguous dimensions.
  // With these checks and the option checks above, CUTLASS's can_implement cannot fail (it
  // checks the same alignment and the scheduler's splits/decomposition rule), so it runs only
  // when Params are built.
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
       reinterpret_cast<uintptr_t>(C)) % 16 != 0)
    return cudaErrorInvalidValue;
  if (lda % 8 != 0 || ldb % 8 != 0 || ldc % 8 != 0 || K % 8 != 0 || N % 8 != 0)
    return cudaErrorInvalidValue;

  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;

  long long key[kKeyLen] = {
      (long long)(uintptr_t)A, (long long)(uintptr_t)B, (long long)(uintptr_t)C,
      // the persistent scheduler never uses a workspace: its pointer is not part of Params
      SCHEDULER_STREAMK ? (long long)(uintptr_t)workspace : 0LL,
      M, N, K, lda, ldb, ldc, dev, opt.swizzle, opt.raster, opt.splits, opt.decomposition};
  CacheEntry* hit = cache_find(key);
  if (hit == nullptr) {
    const int sms = sm_count(dev);
    if (sms <= 0) return cudaErrorInvalidDevice;
    Arguments args = make_arguments(A, B, C, M, N, K, lda, ldb, ldc, dev, sms, opt);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    const size_t need = Gemm::get_workspace_size(args);
    if (need > workspace_bytes || (need > 0 && workspace == nullptr)) return cudaErrorInvalidValue;
    if ((err = opt_in_smem(dev)) != cudaSuccess) return err;
    if (need > 0 &&
        GemmKernel::initialize_workspace(args, workspace, s) != cutlass::Status::kSuccess) {
      const cudaError_t last = cudaGetLastError();
      return last != cudaSuccess ? last : cudaErrorInvalidValue;
    }
    Params params = GemmKernel::to_underlying_arguments(args, need > 0 ? workspace : nullptr);
    CacheEntry& e = t_cache.entry[t_cache.next++ % kCacheEntries];
    memcpy(e.key, key, sizeof(key));
    e.need = need;
    memcpy(e.params, &params, sizeof(Params));
    e.valid = 1;
    hit = &e;
  } else {
    if (hit->need > workspace_bytes || (hit->need > 0 && workspace == nullptr))
      return cudaErrorInvalidValue;
    if (hit->need > 0) {   // stream-K / split-K barrier flags start at zero on every call
      Arguments args = make_arguments(A, B, C, M, N, K, lda, ldb, ldc, dev, sm_count(dev), opt);
      if (GemmKernel::initialize_workspace(args, workspace, s) != cutlass::Status::kSuccess) {
        const cudaError_t last = cudaGetLastError();
        return last != cudaSuccess ? last : cudaErrorInvalidValue;
      }
    }
  }
  Params& params = *reinterpret_cast<Params*>(hit->params);
  if (Gemm::run(params, s) != cutlass::Status::kSuccess) {
    const cudaError_t last = cudaGetLastError();
    return last != cudaSuccess ? last : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

extern "C" size_t cudal2_workspace(int M, int N, int K, const int* options) {
  using namespace cudal2_cutlass_impl;
  Options opt;
  if (!read_options(options, opt) || M <= 0 || N <= 0 || K <= 0) return 0;
#if SCHEDULER_STREAMK
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    dev = 0;
  }
  int sms = sm_count(dev);
  if (sms <= 0) sms = kFallbackSms;
  // Pointers and strides do not enter the size: only the shape, options and SM count do.
  Arguments args = make_arguments(nullptr, nullptr, nullptr, M, N, K, K, LAYOUT_RC ? K : N, N, dev,
                                  sms, opt);
  return Gemm::get_workspace_size(args);
#else
  return 0;   // the persistent scheduler and the TMA epilogue without a source need none
#endif
}

namespace cudal2_cutlass_impl {

// An upper bound of the workspace (for information; callers ask cudal2_workspace): stream-K
// and the heuristic's split-K cover fewer than two waves of tiles, on at most 144 SMs (a full
// GH100), each with a BM x BN accumulator tile of partials and its barrier flags. Explicit
// split-K (splits > 1 or decomposition 2) covers every output tile instead: workspace_per_mn
// bytes per (tile-padded) output element.
constexpr size_t kAccBytes = sizeof(ElementAccumulator);
#if SCHEDULER_STREAMK
constexpr size_t kWorkspaceBound = 2ull * 144 * ((size_t)BM * BN * kAccBytes + 2 * 4) + 1024;
constexpr size_t kWorkspacePerMn = kAccBytes;
#else
constexpr size_t kWorkspaceBound = 0;
constexpr size_t kWorkspacePerMn = 0;
#endif

static int build_meta_json(char* buf, size_t size) {
  const char* acc = ACC_F16 ? "f16" : "f32";
  const char* layout = LAYOUT_RC ? "RC" : "RR";
  return snprintf(
      buf, size,
      "{\"style\": \"cutlass\", \"family\": \"cutlass_sm90\", \"abi\": 2, \"arch\": \"sm_90a\", "
      "\"acc\": \"%s\", \"layout\": \"%s\", \"tile\": [%d, %d, %d], \"cluster\": [%d, %d, 1], "
      "\"schedule\": \"%s\", \"scheduler\": \"%s\", \"warps\": %d, \"threads\": %d, "
      "\"stages\": %d, \"smem_bytes\": %d, \"any_shape\": true, \"divisible\": [1, 8, 8], "
      "\"alignment\": {\"elements\": 8, \"ptr_align_bytes\": 16, \"ld_multiple\": 8}, "
      "\"workspace_bytes\": %llu, \"workspace_per_mn\": %llu, "
      "\"options\": [{\"name\": \"swizzle\", \"values\": [1, 2, 4, 8], \"default\": 1}, "
      "{\"name\": \"raster\", \"values\": [0, 1, 2], \"default\": 0}%s], "
      "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"CLUSTER_M\": %d, \"CLUSTER_N\": %d, "
      "\"SCHEDULE\": \"%s\", \"SCHEDULER\": \"%s\", \"ACC\": \"%s\", \"LAYOUT\": \"%s\"}, "
      "\"cutlass\": \"%d.%d.%d\"}",
      acc, layout, BM, BN, BK, CLUSTER_M, CLUSTER_N, CUDAL2_SCHEDULE_NAME, CUDAL2_SCHEDULER_NAME,
      kThreads / 32, kThreads, kStages, kSmemBytes, (unsigned long long)kWorkspaceBound,
      (unsigned long long)kWorkspacePerMn,
      SCHEDULER_STREAMK ? ", {\"name\": \"splits\", \"values\": [1, 2, 4, 8], \"default\": 1}, "
                          "{\"name\": \"decomposition\", \"values\": [0, 1, 2, 3], \"default\": 0}"
                        : "",
      BM, BN, BK, CLUSTER_M, CLUSTER_N, CUDAL2_SCHEDULE_NAME, CUDAL2_SCHEDULER_NAME, acc, layout,
      CUTLASS_MAJOR, CUTLASS_MINOR, CUTLASS_PATCH);
}

static const char* build_meta() {
  static char buf[2048];
  build_meta_json(buf, sizeof(buf));
  return buf;
}

}  // namespace cudal2_cutlass_impl

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_cutlass_impl::build_meta();   // thread-safe one-time init
  return meta;
}
