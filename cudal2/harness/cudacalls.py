"""The CUDA calls a kernel library may make: one rule for the two layers that apply it.

The static audit (audit.py) rejects a library that imports a runtime function outside
RUNTIME_ALLOWED, or names a driver function outside DRIVER_ENTRY_POINTS in its strings; the call
guard (callguard.py, callguard.c) records the RUNTIME_ALLOWED calls a library makes at run time,
refuses its REFUSED ones, and lets the driver entry-point door hand out only DRIVER_ENTRY_POINTS.
Why each entry is needed is in docs/harness.md. A leaf module, so that the audit can use the
guard (its dry call) and the guard these lists without an import loop.
"""
from __future__ import annotations

# The CUDA runtime functions a GEMM launcher may import and call.
RUNTIME_ALLOWED = frozenset({
    # launch (nvcc's <<<>>> lowering, CUDA 12 and 13 spellings) and registration of the fatbinary
    "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz",
    "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernel_ptsz",
    "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "__cudaGetKernel",
    "__cudaPushCallConfiguration", "__cudaPopCallConfiguration",
    "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary",
    "__cudaRegisterFunction", "__cudaRegisterVar", "__cudaRegisterLinkedBinary",
    "__cudaRegisterTexture", "__cudaRegisterSurface", "__cudaInitModule",
    # function and device attributes (smem carve-out, cluster dims, SM count)
    "cudaFuncSetAttribute", "cudaFuncGetAttributes", "cudaFuncSetCacheConfig",
    "cudaGetDevice", "cudaDeviceGetAttribute", "cudaGetDeviceProperties",
    "cudaGetDeviceProperties_v2", "cudaGetDeviceCount",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyMaxActiveClusters",
    "cudaOccupancyMaxPotentialClusterSize",
    # TMA descriptors: the driver's cuTensorMapEncode* reached through the runtime
    "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
    # error queries
    "cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorString", "cudaGetErrorName",
    # zeroing the caller's workspace for split-K, ordered on the caller's stream (no sync, no
    # allocation; the alternative is one more kernel launch doing the same thing)
    "cudaMemsetAsync", "cudaMemsetAsync_ptsz",
})

# The driver functions the driver entry-point door (cudaGetDriverEntryPoint*, cuGetProcAddress*)
# may hand out.
DRIVER_ENTRY_POINTS = frozenset({
    "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuTensorMapReplaceAddress",
    "cuGetErrorString", "cuGetErrorName", "cuDeviceGetAttribute", "cuCtxGetDevice",
    "cuFuncSetAttribute", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
})
