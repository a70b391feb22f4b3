// Host check of cudal2/templates/streamk.cuh (built by tests/test_streamk.py with the host
// compiler): reads "tiles k_tiles slots" lines on stdin; for each, the grid G = grid(I, slots)
// and the header's own range, segment and contributor math:
//   every (tile, k-tile) exactly once, no empty CTA, per-CTA work within one iteration, each
//   tile's contributors the consecutive CTAs first .. first+count-1 that really touch it (in k
//   order), slots unique and below slots(G, tiles); then the kernel's protocol replayed with CTAs
//   in random orders: partials summed in contributor order are bit-identical across orders and
//   the workspace (slots, semaphores) is zero after every call.
// Prints "ok <tiles> <k_tiles> <slots> <G>" or "FAIL ...: why" per line.
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

int main() {
  int tiles, k_tiles, slots_in;
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
