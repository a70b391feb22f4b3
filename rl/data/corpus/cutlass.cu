// HGEMM, CUTLASS 3 SM90: TMA + wgmma warp-specialized kernel from the collective builders.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
using namespace cute;

using CtaTile = Shape<_${BM}, _${BN}, _${BK}>;
using ClusterShape = Shape<_${CLUSTER_M}, _${CLUSTER_N}, _1>;
using Acc = ${ACC_T};
using LayoutB = cutlass::layout::${LAYOUT_B};  // B row-major (RR) or column-major (RC)
using Schedule = cutlass::gemm::${SCHEDULE};
using EpiSchedule = cutlass::epilogue::${EPI_SCHEDULE};
constexpr int RASTER = ${RASTER}, SWIZZLE = ${SWIZZLE};  // tile order: 1 along M, 2 along N; group size
using half_t = cutlass::half_t;
using RowMajor = cutlass::layout::RowMajor;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, CtaTile, ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto,
    Acc, float, void, RowMajor, 8, half_t, RowMajor, 8, EpiSchedule>::CollectiveOp;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, half_t, RowMajor, 8, half_t, LayoutB, 8, Acc, CtaTile, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<(int)sizeof(typename Epilogue::SharedStorage)>, Schedule>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t ws_bytes, void* stream) {
  auto sA = make_stride(int64_t(lda), _1{}, int64_t(0));
  auto sB = ${STRIDE_B};
  auto sD = make_stride(int64_t(ldc), _1{}, int64_t(0));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
      {(const half_t*)A, sA, (const half_t*)B, sB}, {{1.f, 0.f}, nullptr, sD, (half_t*)C, sD}, hw};
  args.scheduler.raster_order = decltype(args.scheduler.raster_order)(RASTER);
  args.scheduler.max_swizzle_size = SWIZZLE;
  Gemm gemm;
  if (Gemm::get_workspace_size(args) > ws_bytes || gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, ws, (cudaStream_t)stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.run((cudaStream_t)stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaSuccess;
}

extern "C" const char* cudal2_meta(void) {
  return "${META}";
}
