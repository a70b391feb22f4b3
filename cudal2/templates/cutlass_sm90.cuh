// cudal2 reference kernel family "cutlass_sm90": CUTLASS 3.x Hopper GEMM (TMA loads, wgmma,
// warp-specialised persistent kernel, TMA epilogue) assembled with the CollectiveBuilders.
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
// out-of-bounds zero fill and clipped stores.

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <atomic>

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
#ifndef SWIZZLE
#define SWIZZLE 1           // persistent tile scheduler max_swizzle_size (1, 2, 4 or 8)
#endif
#ifndef ACC_F16
#define ACC_F16 0           // 0: fp32 accumulate, 1: fp16 accumulate
#endif
#ifndef LAYOUT_RC
#define LAYOUT_RC 0         // 0: B row-major K x N ("RR"), 1: B column-major, stored N x K ("RC")
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

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>,
                                                        CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

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

// SM count per device, queried once (the persistent scheduler sizes its grid with it).
static int sm_count(int dev) {
  static std::atomic<int> cache[64];
  if (dev >= 0 && dev < 64) {
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
  if (dev >= 0 && dev < 64 && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

static const char* build_meta() {
  static char buf[1536];
  snprintf(buf, sizeof(buf),
           "{\"style\": \"cutlass\", \"family\": \"cutlass_sm90\", \"arch\": \"sm_90a\", "
           "\"acc\": \"%s\", \"layout\": \"%s\", \"tile\": [%d, %d, %d], \"cluster\": [%d, %d, 1], "
           "\"schedule\": \"%s\", \"warps\": %d, \"threads\": %d, \"stages\": %d, "
           "\"smem_bytes\": %d, \"any_shape\": false, \"divisible\": [1, 8, 8], "
           "\"alignment\": {\"elements\": 8, \"ptr_align_bytes\": 16, \"ld_multiple\": 8}, "
           "\"workspace_bytes\": 0, \"workspace_per_mn\": 0, "
           "\"params\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"CLUSTER_M\": %d, \"CLUSTER_N\": %d, "
           "\"SCHEDULE\": \"%s\", \"SWIZZLE\": %d, \"ACC\": \"%s\", \"LAYOUT\": \"%s\"}, "
           "\"cutlass\": \"%d.%d.%d\"}",
           ACC_F16 ? "f16" : "f32", LAYOUT_RC ? "RC" : "RR", BM, BN, BK, CLUSTER_M, CLUSTER_N,
           CUDAL2_SCHEDULE_NAME, kThreads / 32, kThreads, kStages, kSmemBytes, BM, BN, BK,
           CLUSTER_M, CLUSTER_N, CUDAL2_SCHEDULE_NAME, SWIZZLE, ACC_F16 ? "f16" : "f32",
           LAYOUT_RC ? "RC" : "RR", CUTLASS_MAJOR, CUTLASS_MINOR, CUTLASS_PATCH);
  return buf;
}

}  // namespace cudal2_cutlass_impl

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda,
                            int ldb, int ldc, void* workspace, size_t workspace_bytes,
                            void* stream) {
  using namespace cudal2_cutlass_impl;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr || ldc < N) return cudaErrorInvalidValue;
  cutlass::half_t* d = reinterpret_cast<cutlass::half_t*>(C);
  if (K == 0) {
    void* args[] = {&d, &M, &N, &ldc};
    size_t blocks = ((size_t)M * (size_t)N + 255) / 256;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return cudaLaunchKernel(reinterpret_cast<const void*>(&zero_kernel), dim3((unsigned)blocks),
                            dim3(256), args, 0, s);
  }
  if (A == nullptr || B == nullptr || lda < K || ldb < (LAYOUT_RC ? K : N))
    return cudaErrorInvalidValue;
  // TMA: 16-byte aligned bases and strides; vector width 8 along the contiguous dimensions.
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
       reinterpret_cast<uintptr_t>(C)) % 16 != 0)
    return cudaErrorInvalidValue;
  if (lda % 8 != 0 || ldb % 8 != 0 || ldc % 8 != 0 || K % 8 != 0 || N % 8 != 0)
    return cudaErrorInvalidValue;

  StrideA sA = cute::make_stride(int64_t(lda), cute::Int<1>{}, int64_t(0));
#if LAYOUT_RC
  StrideB sB = cute::make_stride(int64_t(ldb), cute::Int<1>{}, int64_t(0));   // (N, K, L)
#else
  StrideB sB = cute::make_stride(cute::Int<1>{}, int64_t(ldb), int64_t(0));   // (N, K, L)
#endif
  StrideD sD = cute::make_stride(int64_t(ldc), cute::Int<1>{}, int64_t(0));
  StrideC sC = sD;

  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = dev;
  hw.sm_count = sm_count(dev);

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {reinterpret_cast<const ElementA*>(A), sA, reinterpret_cast<const ElementB*>(B), sB},
      {{ElementCompute(1), ElementCompute(0)}, nullptr, sC, d, sD},
      hw};
  args.scheduler.max_swizzle_size = SWIZZLE;

  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  const size_t need = Gemm::get_workspace_size(args);
  if (need > workspace_bytes || (need > 0 && workspace == nullptr)) return cudaErrorInvalidValue;
  Gemm gemm;
  if (gemm.initialize(args, need > 0 ? workspace : nullptr, s) != cutlass::Status::kSuccess)
    return cudaErrorInvalidValue;
  if (gemm.run(s) != cutlass::Status::kSuccess) {
    const cudaError_t last = cudaGetLastError();
    return last != cudaSuccess ? last : cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

extern "C" const char* cudal2_meta(void) {
  static const char* meta = cudal2_cutlass_impl::build_meta();   // thread-safe one-time init
  return meta;
}
