// cudal2 stream-K range math: the (tile, k-tile) iteration space of one GEMM call handed out as
// equal contiguous ranges over a grid that equals the resident CTA slots, so no call ends in a
// partial wave (the skinny families' decomposition 3, skinny_hgemm.cuh).
//
// Iterations: I = tiles * k_tiles, iteration i = (tile i / k_tiles, k-tile i % k_tiles). CTA c of
// a grid of G (1 <= G <= I: never an empty CTA) owns [c*I/G, (c+1)*I/G): every iteration exactly
// once, sizes differing by at most one. A CTA walks its range segment by segment (a segment: the
// part of the range inside one tile), runs the main loop over the segment's k-tiles, then
//   - a tile whose k-tiles all lie in one CTA's range (one contributor) is written to C directly;
//   - otherwise every contributor stores its fp32 partial into its own slot of the workspace and
//     arrives at the tile's semaphore with the tile's contributor count; the last to arrive sums
//     the slots IN CONTRIBUTOR ORDER (contributor 0 holds the lowest k-tiles), so the result is
//     bit-identical whatever order the CTAs arrive in, writes C and clears the slots and the
//     semaphore (the zero-init workspace contract of splitk_fixup.cuh / docs/abi.md).
// No CTA waits for another: an early contributor stores, arrives and moves on, so the grid needs
// no co-residency guarantee beyond what any launch has.
//
// Contributors of one tile are consecutive CTAs (ranges are contiguous and none is empty), so a
// partial is named by (c, t): slot c + t is unique (walking the iteration space, each new segment
// moves to the next CTA, the next tile or both) and below G + tiles - 1.
//
// Everything here is __host__ __device__: tests/test_streamk.py runs this very code on the host.

#ifndef CUDAL2_STREAMK_CUH
#define CUDAL2_STREAMK_CUH

#include <stddef.h>

#if defined(__CUDACC__)
#define CUDAL2_SK_HD __host__ __device__ __forceinline__
#else
#define CUDAL2_SK_HD inline
#endif

namespace cudal2_streamk {

// The most CTAs a stream-K grid uses (a bound the workspace can be sized for without a device).
constexpr int kMaxCtas = 2048;

// The grid of a call: the resident slots, never more CTAs than iterations (no empty CTA), >= 1.
CUDAL2_SK_HD int grid(long long iters, int slots) {
  long long g = slots < 1 ? 1 : slots;
  if (g > kMaxCtas) g = kMaxCtas;
  if (g > iters) g = iters;
  return g < 1 ? 1 : (int)g;
}

// First iteration of CTA c (c == G: the end of the space).
CUDAL2_SK_HD long long range_begin(int c, long long iters, int G) {
  return (long long)c * iters / G;
}

// The CTA whose range holds iteration `it`: the largest c with range_begin(c) <= it.
CUDAL2_SK_HD int cta_of(long long it, long long iters, int G) {
  return (int)(((it + 1) * (long long)G - 1) / iters);
}

// The contributors of tile t: CTAs first .. first + count - 1, in k order.
CUDAL2_SK_HD int first_contributor(int t, int k_tiles, long long iters, int G) {
  return cta_of((long long)t * k_tiles, iters, G);
}
CUDAL2_SK_HD int contributors(int t, int k_tiles, long long iters, int G) {
  return cta_of((long long)(t + 1) * k_tiles - 1, iters, G) - first_contributor(t, k_tiles, iters, G) + 1;
}

// Workspace slot of CTA c's partial of tile t, and the slots a call may use.
CUDAL2_SK_HD long long slot(int c, int t) { return (long long)c + t; }
CUDAL2_SK_HD long long slots(int G, int tiles) { return (long long)G + tiles - 1; }

// One segment of a CTA's range: tile `tile`, k-tiles [kt_begin, kt_end) of it; `next` is the
// first iteration after it (the next segment starts there while next < the range's end).
struct Segment {
  int tile, kt_begin, kt_end;
  long long next;
};
CUDAL2_SK_HD Segment segment(long long it, long long end, int k_tiles) {
  Segment s;
  s.tile = (int)(it / k_tiles);
  s.kt_begin = (int)(it % k_tiles);
  const long long room = end - it;
  s.kt_end = room < (long long)(k_tiles - s.kt_begin) ? s.kt_begin + (int)room : k_tiles;
  s.next = it + (s.kt_end - s.kt_begin);
  return s;
}

// Workspace layout: [slots * tile_floats fp32 partials][pad to 16 bytes][tiles semaphores].
CUDAL2_SK_HD size_t semaphore_offset(int G, int tiles, int tile_floats) {
  const size_t part = (size_t)slots(G, tiles) * (size_t)tile_floats * sizeof(float);
  return (part + 15) / 16 * 16;
}
// Bytes one call needs: 0 when no tile can have two contributors (one CTA, or one k-tile per
// tile: every segment is then a whole tile).
CUDAL2_SK_HD size_t workspace_bytes(int G, int tiles, int k_tiles, int tile_floats) {
  if (G <= 1 || k_tiles <= 1) return 0;
  return semaphore_offset(G, tiles, tile_floats) + (size_t)tiles * sizeof(unsigned int);
}

}  // namespace cudal2_streamk

#endif  // CUDAL2_STREAMK_CUH
