"""The ground floor: what every other layer stands on and which imports nothing above it.

knobs (CUDAL2_* environment), vocab (arches, capabilities, layouts, accumulators), identity
(a kernel source's id), toolchain (nvcc, headers, libraries), abi (loading a kernel .so: the
ABI of docs/abi.md), build (nvcc into the content-addressed cache), store (generated_kernels/).
"""
