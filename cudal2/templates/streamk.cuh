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
static_assert((long long)kMaxCtas * kMaxCtas < (1ll << 31), "Walk's range start: c * r < 2^31");

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
// The segment from `it` given its tile (it / k_tiles, however the caller divided).
CUDAL2_SK_HD Segment segment_in(long long it, long long end, int k_tiles, int tile) {
  Segment s;
  s.tile = tile;
  s.kt_begin = (int)(it - (long long)tile * k_tiles);
  const long long room = end - it;
  s.kt_end = room < (long long)(k_tiles - s.kt_begin) ? s.kt_begin + (int)room : k_tiles;
  s.next = it + (s.kt_end - s.kt_begin);
  return s;
}
CUDAL2_SK_HD Segment segment(long long it, long long end, int k_tiles) {
  return segment_in(it, end, k_tiles, (int)(it / k_tiles));
}

// ---- the same math with the divisions worked out by the host ----------------------------------
// A divisor fixed for a call, as a multiply-high and a shift (Granlund and Montgomery, as
// CUTLASS's FastDivmod): the host works it out once, and a CTA divides in two instructions,
// not a ~20-instruction division with a reciprocal on the way to its first load. Exact for
// n in [0, 2^31) and d in [1, 2^31): with l = ceil(log2 d), mul = ceil(2^(31+l) / d) < 2^32 and
// the error n * (mul - 2^(31+l)/d) / 2^(31+l) < 2^-l <= 1/d never carries past the next integer.
struct Divisor {
  unsigned mul, shift;   // mul == 0: d == 1
};
CUDAL2_SK_HD Divisor divisor(unsigned d) {
  if (d <= 1) return Divisor{0u, 0u};
  unsigned l = 0;
  while ((1ull << l) < d) ++l;
  return Divisor{(unsigned)(((1ull << (31 + l)) + d - 1) / d), l - 1};
}
CUDAL2_SK_HD unsigned quotient(unsigned n, Divisor v) {
  if (v.mul == 0) return n;
#if defined(__CUDA_ARCH__)
  return __umulhi(n, v.mul) >> v.shift;
#else
  return (unsigned)(((unsigned long long)n * v.mul) >> 32) >> v.shift;
#endif
}

// What the CTAs of one call would otherwise divide by before their first load, worked out by the
// host and passed to the kernel by value: the N tiles (a tile index's row) and, for a stream-K
// call (G > 0), its grid and k-tiles per tile. A CTA's range start c * iters / G is c * q + c *
// r / G with iters = q * G + r: c * r < G^2 <= 2^22, so by_G is exact for every call; a segment's
// tile it / k_tiles takes by_k_tiles while iters < 2^31 (small), else the division above. The
// contributor math runs after the main loop and divides as above.
struct Walk {
  long long iters, q;   // iters = tiles * k_tiles = q * G + r
  int G, r, k_tiles, small;   // G == 0: not a stream-K call
  Divisor by_tiles_n, by_G, by_k_tiles;
};
CUDAL2_SK_HD Walk walk(int tiles_n, long long tiles, int k_tiles, int G) {
  Walk w;
  w.iters = tiles * k_tiles;
  w.G = G;
  w.q = G > 0 ? w.iters / G : 0;
  w.r = G > 0 ? (int)(w.iters % G) : 0;
  w.k_tiles = k_tiles;
  w.small = w.iters < (1ll << 31);
  w.by_tiles_n = divisor((unsigned)tiles_n);
  w.by_G = divisor(G > 0 ? (unsigned)G : 1u);
  w.by_k_tiles = divisor(k_tiles > 0 ? (unsigned)k_tiles : 1u);
  return w;
}
CUDAL2_SK_HD long long range_begin(int c, const Walk& w) {
  return c * w.q + quotient((unsigned)(c * w.r), w.by_G);
}
CUDAL2_SK_HD Segment segment(long long it, long long end, const Walk& w) {
  return w.small ? segment_in(it, end, w.k_tiles, (int)quotient((unsigned)it, w.by_k_tiles))
                 : segment(it, end, w.k_tiles);
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
