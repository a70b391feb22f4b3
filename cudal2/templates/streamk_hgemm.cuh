// cudal2 kernel family "streamk": deep K on few output tiles (128x64x12288, 256x128x8192) in one
// launch that covers the GPU, for any M, N, K with K % 8 == 0 (and N % 8 == 0 for RR).
//
// It is skinny_hgemm.cuh's kernel and launcher over a grid of M x N tiles (BM 32, 64 or 128)
// instead of one row of N tiles, with B kept in L2 (every row tile reads it again, so no
// evict-first policy). The runtime options are skinny's:
//   decomposition 3, stream-K (streamk.cuh): as many CTAs as are resident (the occupancy API per
//     device, at most 2048), each an equal contiguous range of the tiles x k-tiles iterations; a
//     tile split across CTAs is reduced by the last to arrive, summing the partials in
//     contributor order (bit-identical whatever the order of arrival; the workspace is left zero);
//   decomposition 2 or a split count, split-K: grid (tiles, splits), reduced inside a
//     thread-block cluster through distributed shared memory on sm_90a (2..8 splits, rank order,
//     no workspace; more splits in clusters of the largest count <= 8 that divides them, whose
//     sums the last arriver adds through the workspace in cluster order), else by the last
//     arriver through the zero-init workspace, the loads of a batch of splits in flight at once;
//   decomposition 0 with splits 0: stream-K where split-K would end in a partial wave, else
//     split-K at about two CTAs per SM over the tiles.
// One launch per call, no memset, no allocation: a workspace the caller zeroed once serves every
// call, captured in a CUDA graph or not (docs/abi.md, "zero-init").
#define CUDAL2_STREAMK_FAMILY 1
#include "skinny_hgemm.cuh"
