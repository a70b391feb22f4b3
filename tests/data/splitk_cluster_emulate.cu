// Host emulation of the cluster split-K reduction (cudal2/templates/splitk_fixup.cuh, "The
// cluster reduction"), built by tests/test_splitk.py with the host compiler: for 1..8 splits and
// random fp32 partials, each rank's slice of every chunk (cluster_slice_begin) is reduced with the
// header's own cluster_sum4 reading the ranks' "shared memory" in rank order, as hgemm_kernel does
// through DSMEM, and compared bit for bit with the global fixup (store_partial + finish_tile, the
// split-index-order sum). Prints "ok <name>" or "FAIL <name>: why" per check.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "splitk_fixup.cuh"

using namespace cudal2_splitk;

static int failures = 0;
static void check(bool ok, const std::string& name, const std::string& why = "") {
  if (ok) std::printf("ok %s\n", name.c_str());
  else { std::printf("FAIL %s: %s\n", name.c_str(), why.c_str()); ++failures; }
}

int main() {
  std::mt19937 rng(2024);
  // (M, N) of the call, the tile (BM, BN) at (m0, n0), the chunk rows (kClusterRows)
  struct Case { int M, N, BM, BN, m0, n0, rows; };
  const Case cases[] = {{128, 128, 128, 128, 0, 0, 64}, {37, 150, 16, 128, 16, 128, 16},
                        {300, 70, 256, 64, 256, 0, 64}, {64, 256, 64, 256, 0, 0, 32}};
  for (const Case& cs : cases) {
    for (int splits = 1; splits <= kClusterMax; ++splits) {
      const int stride = cs.BN + 8;   // kCStride
      // random partials, magnitudes 2^-12 .. 2^12: the fp32 sum depends on the order
      std::vector<std::vector<float>> tile(splits, std::vector<float>((size_t)cs.BM * cs.BN));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::uniform_int_distribution<int> e(-12, 12);
      for (auto& t : tile)
        for (float& v : t) v = std::ldexp(u(rng), e(rng));
      // the global fixup: every split stores its partial, the last sums in split-index order
      std::vector<float> ws((size_t)splits * cs.M * cs.N, 0.f);
      for (int z = 0; z < splits; ++z)
        for (int r = 0; r < cs.BM && cs.m0 + r < cs.M; ++r)
          for (int c = 0; c < cs.BN && cs.n0 + c < cs.N; ++c)
            store_partial(ws.data(), z, cs.m0 + r, cs.n0 + c, cs.M, cs.N, tile[z][r * cs.BN + c]);
      std::vector<float> ref_sum((size_t)cs.BM * cs.BN, NAN);
      {
        std::vector<float> copy = ws;   // reduce_element clears what it reads
        for (int r = 0; r < cs.BM && cs.m0 + r < cs.M; ++r)
          for (int c = 0; c < cs.BN && cs.n0 + c < cs.N; ++c)
            ref_sum[r * cs.BN + c] = reduce_element(copy.data(), splits, cs.m0 + r, cs.n0 + c, cs.M, cs.N);
      }
      std::vector<half> ref_c((size_t)cs.M * cs.N, __float2half_rn(-3.f));
      finish_tile(ws.data(), splits, cs.M, cs.N, cs.m0, cs.n0, cs.BM, cs.BN, ref_c.data(), cs.N, 0, 1);
      // the cluster: chunk by chunk, rank z's shared memory holds its rows at `stride`
      std::vector<half> got_c((size_t)cs.M * cs.N, __float2half_rn(-3.f));
      std::vector<int> covered((size_t)cs.BM * cs.BN, 0);
      bool sums_equal = true, slices_ok = true;
      const int units_per_row = cs.BN / 4, units = cs.rows * units_per_row;
      for (int r0 = 0; r0 < cs.BM; r0 += cs.rows) {
        std::vector<std::vector<float>> smem(splits, std::vector<float>((size_t)cs.rows * stride, NAN));
        for (int z = 0; z < splits; ++z)
          for (int r = 0; r < cs.rows; ++r)
            for (int c = 0; c < cs.BN; ++c) smem[z][r * stride + c] = tile[z][(r0 + r) * cs.BN + c];
        // the slices of the ranks: consecutive, disjoint, covering [0, units)
        if (cluster_slice_begin(0, splits, units) != 0 || cluster_slice_begin(splits, splits, units) != units)
          slices_ok = false;
        for (int rank = 0; rank < splits; ++rank) {
          const int b = cluster_slice_begin(rank, splits, units), en = cluster_slice_begin(rank + 1, splits, units);
          if (en < b || en - b > units / splits + 1) slices_ok = false;
          for (int un = b; un < en; ++un) {
            const int r = un / units_per_row, c4 = (un % units_per_row) * 4;
            const Float4 s = cluster_sum4(splits, [&](int q) {
              const float* p = &smem[q][r * stride + c4];
              return Float4{p[0], p[1], p[2], p[3]};
            });
            const float v[4] = {s.x, s.y, s.z, s.w};
            for (int j = 0; j < 4; ++j) {
              const int tr = r0 + r, tc = c4 + j;
              ++covered[tr * cs.BN + tc];
              const int row = cs.m0 + tr, col = cs.n0 + tc;
              if (row >= cs.M || col >= cs.N) continue;
              if (std::memcmp(&v[j], &ref_sum[tr * cs.BN + tc], 4) != 0) sums_equal = false;
              got_c[(size_t)row * cs.N + col] = __float2half_rn(v[j]);
            }
          }
        }
      }
      bool once = true;
      for (int n : covered) once = once && n == 1;
      const std::string tag = std::to_string(cs.BM) + "x" + std::to_string(cs.BN) + "_r" +
                              std::to_string(cs.rows) + "_s" + std::to_string(splits);
      check(slices_ok && once, "slices_disjoint_and_cover_" + tag);
      check(sums_equal, "fp32_sum_bit_identical_" + tag);
      check(std::memcmp(got_c.data(), ref_c.data(), got_c.size() * sizeof(half)) == 0,
            "fp16_c_bit_identical_" + tag);
    }
  }
  return failures ? 1 : 0;
}
