// Host check of cudal2/templates/streamk.cuh (built by tests/test_streamk.py with the host
// compiler): reads "tiles k_tiles slots" lines on stdin; for each, the grid G = grid(I, slots)
// and the header's own range, segment and contributor math:
//   every (tile, k-tile) exactly once, no empty CTA, per-CTA work within one iteration, each
//   tile's contributors the consecutive CTAs first .. first+count-1 that really touch it (in k
//   order), slots unique and below slots(G, tiles); then the kernel's protocol replayed with CTAs
//   in random orders: partials summed in contributor order are bit-identical across orders and
//   the workspace (slots, semaphores) is zero after every call. The kernel's own path, the Walk
//   the host fills with multiply-high Divisors, gives the same ranges, segments and contributors.
// Prints "ok <tiles> <k_tiles> <slots> <G>" or "FAIL ...: why" per line; first, a line
// "FAIL divisor ..." for any quotient the Divisors get wrong (none: nothing printed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "streamk.cuh"

using namespace cudal2_streamk;

static float part_value(int tile, int kt, int e) {   // one k-tile's contribution to element e
  unsigned long long x = (unsigned long long)tile * 0x9E3779B97F4A7C15ull ^
                         (unsigned long long)kt * 0xBF58476D1CE4E5B9ull ^ (unsigned long long)e * 0x94D049BB133111EBull;
  x ^= x >> 31; x *= 0xD6E8FEB86659FD93ull; x ^= x >> 29;
  return std::ldexp((float)(x >> 40) / (float)(1u << 24) - 0.5f, (int)((x >> 8) % 17) - 8);
}

// quotient(n, divisor(d)) == n / d for every d up to 4096 and around each power of two, at the
// dividends next to multiples of d, next to the powers of two and at 2^31 - 1.
static int check_divisors() {
  std::vector<unsigned> ds;
  for (unsigned d = 1; d <= 4096; ++d) ds.push_back(d);
  for (int b = 12; b < 31; ++b)
    for (long long e = -3; e <= 3; ++e) ds.push_back((unsigned)((1ll << b) + e));
  ds.push_back(2147483647u);
  std::mt19937 rng(11);
  int bad = 0;
  for (unsigned d : ds) {
    const Divisor v = divisor(d);
    std::vector<unsigned long long> ns = {0, 1, d - 1ull, d, d + 1ull, 2147483647ull, 2147483646ull};
    for (int b = 0; b < 31; ++b) ns.insert(ns.end(), {(1ull << b) - 1, 1ull << b});
    for (int i = 0; i < 64; ++i) {
      const unsigned long long k = rng() % (2147483648ull / d + 1);
      ns.insert(ns.end(), {k * d, k * d + d - 1, k * d > 0 ? k * d - 1 : 0});
    }
    for (unsigned long long n : ns) {
      if (n >= 2147483648ull) continue;
      if (quotient((unsigned)n, v) != (unsigned)(n / d) && bad++ < 10)
        std::printf("FAIL divisor %u: %llu / %u gave %u\n", d, n, d, quotient((unsigned)n, v));
    }
  }
  return bad;
}

// The Walk (host-worked Divisors) against the plain math on one grid; why gets what differs.
static void check_walk(int tiles, int k_tiles, int G, std::string& why) {
  const long long I = (long long)tiles * k_tiles;
  const Walk w = walk(tiles, tiles, k_tiles, G);
  if (w.small != (I < (1ll << 31)) || w.q * G + w.r != I) why += "walk fields;";
  for (int c = 0; c <= G; ++c) {
    if (range_begin(c, w) != range_begin(c, I, G)) { why += "walk range_begin;"; return; }
    if (c == G) break;
    for (long long it = range_begin(c, I, G), end = range_begin(c + 1, I, G); it < end;) {
      const Segment a = segment(it, end, w), b = segment(it, end, k_tiles);
      if (a.tile != b.tile || a.kt_begin != b.kt_begin || a.kt_end != b.kt_end || a.next != b.next) {
        why += "walk segment;";
        return;
      }
      it = b.next;
    }
  }
  for (int t = 0; t < tiles; t += 1 + tiles / 4096)
    if ((int)quotient((unsigned)t, w.by_tiles_n) != 0 ||
        (int)quotient((unsigned)t, walk(7, tiles, k_tiles, G).by_tiles_n) != t / 7) {
      why += "walk tiles_n;";
      return;
    }
}

// Grids too large to replay, on both sides of iters = 2^31 (where a segment's tile stops taking
// its Divisor): the Walk's math against the plain one.
static int check_large_walks() {
  const int grids[][3] = {{1 << 20, 2047, 2048}, {1 << 20, 2048, 2048}, {1 << 20, 2049, 2048},
                          {65536, 16, 2047}, {65536, 16, 2048}, {3, 1 << 29, 1000}, {5, 1 << 30, 2047}};
  int bad = 0;
  for (const auto& g : grids) {
    std::string why;
    check_walk(g[0], g[1], grid((long long)g[0] * g[1], g[2]), why);
    if (!why.empty() && bad++ < 10) std::printf("FAIL walk %d %d %d: %s\n", g[0], g[1], g[2], why.c_str());
  }
  return bad;
}

int main() {
  int tiles, k_tiles, slots_in;
  if (check_divisors() || check_large_walks()) return 1;
  std::mt19937 rng(7);
  int failures = 0;
  while (std::scanf("%d %d %d", &tiles, &k_tiles, &slots_in) == 3) {
    const long long I = (long long)tiles * k_tiles;
    const int G = grid(I, slots_in);
    std::string why;
    if (G < 1 || G > I || G > slots_in || G > kMaxCtas) why += "grid out of range;";
    std::vector<int> seen(I, 0);
    long long lo = I, hi = 0;
    std::map<int, std::vector<int>> touching;                // tile -> CTAs, in walk order
    std::vector<std::vector<Segment>> segs(G);
    std::set<long long> used_slots;
    for (int c = 0; c < G; ++c) {
      long long it = range_begin(c, I, G);
      const long long end = range_begin(c + 1, I, G);
      lo = std::min(lo, end - it);
      hi = std::max(hi, end - it);
      if (end <= it) why += "empty CTA;";
      while (it < end) {
        const Segment s = segment(it, end, k_tiles);
        if (s.kt_end <= s.kt_begin || s.next <= it || s.next > end) { why += "bad segment;"; break; }
        for (int kt = s.kt_begin; kt < s.kt_end; ++kt) ++seen[(long long)s.tile * k_tiles + kt];
        touching[s.tile].push_back(c);
        segs[c].push_back(s);
        const long long sl = slot(c, s.tile);
        if (!used_slots.insert(sl).second || sl < 0 || sl >= slots(G, tiles)) why += "slot clash;";
        it = s.next;
      }
    }
    for (long long i = 0; i < I; ++i)
      if (seen[i] != 1) { why += "iteration not covered once;"; break; }
    check_walk(tiles, k_tiles, G, why);
    if (hi - lo > 1) why += "unequal ranges;";
    for (int t = 0; t < tiles; ++t) {
      const int first = first_contributor(t, k_tiles, I, G), count = contributors(t, k_tiles, I, G);
      const std::vector<int>& cs = touching[t];
      bool ok = (int)cs.size() == count;
      for (int i = 0; ok && i < count; ++i) ok = cs[i] == first + i;
      if (!ok) { why += "contributors of tile " + std::to_string(t) + ";"; break; }
    }
    // the protocol: CTAs' segments in random orders, partials per slot, the last arrival sums
    // its tile's slots in contributor order and clears them
    const int E = 8;   // elements per tile
    std::vector<float> ws((size_t)slots(G, tiles) * E, 0.f);
    std::vector<unsigned> sem(tiles, 0);
    std::vector<float> first_out;
    for (int call = 0; call < 3 && why.empty(); ++call) {
      std::vector<std::pair<int, int>> order;   // (cta, segment index)
      for (int c = 0; c < G; ++c)
        for (int j = 0; j < (int)segs[c].size(); ++j) order.push_back({c, j});
      std::shuffle(order.begin(), order.end(), rng);
      // a CTA's segments stay in order (it walks them one after another)
      std::map<int, int> next_seg;
      std::vector<std::pair<int, int>> ordered;
      for (auto [c, j] : order) ordered.push_back({c, next_seg[c]++});
      std::vector<float> out((size_t)tiles * E, NAN);
      for (auto [c, j] : ordered) {
        const Segment& s = segs[c][j];
        float acc[E];
        for (int e = 0; e < E; ++e) {
          acc[e] = 0.f;
          for (int kt = s.kt_begin; kt < s.kt_end; ++kt) acc[e] += part_value(s.tile, kt, e);
        }
        const int count = contributors(s.tile, k_tiles, I, G);
        if (count == 1) {
          for (int e = 0; e < E; ++e) out[(size_t)s.tile * E + e] = acc[e];
          continue;
        }
        for (int e = 0; e < E; ++e) ws[(size_t)slot(c, s.tile) * E + e] = acc[e];
        const unsigned before = sem[s.tile]++;
        if (before >= (unsigned)count) { why += "semaphore overflow;"; break; }
        if (before != (unsigned)count - 1) continue;
        const int first = first_contributor(s.tile, k_tiles, I, G);
        for (int e = 0; e < E; ++e) {
          float sum = 0.f;
          for (int q = 0; q < count; ++q) {
            float& p = ws[(size_t)slot(first + q, s.tile) * E + e];
            sum += p;
            p = 0.f;
          }
          out[(size_t)s.tile * E + e] = sum;
        }
        sem[s.tile] = 0;
      }
      for (float v : out)
        if (std::isnan(v)) { why += "tile never written;"; break; }
      if (std::any_of(ws.begin(), ws.end(), [](float v) { return v != 0.f; }) ||
          std::any_of(sem.begin(), sem.end(), [](unsigned v) { return v != 0; }))
        why += "workspace not zero;";
      if (call == 0) first_out = out;
      else if (std::memcmp(first_out.data(), out.data(), out.size() * 4) != 0) why += "not bit-identical;";
    }
    if (why.empty()) std::printf("ok %d %d %d %d\n", tiles, k_tiles, slots_in, G);
    else { std::printf("FAIL %d %d %d %d: %s\n", tiles, k_tiles, slots_in, G, why.c_str()); ++failures; }
  }
  return failures ? 1 : 0;
}
