// Host emulation of the two-level split-K reduction (cudal2/templates/mma_hgemm.cuh's cluster
// branch with several clusters per tile), built by tests/test_splitk.py with the host compiler:
// `splits` = cs x groups CTAs per tile, cluster g's ranks summed with the header's own
// cluster_sum4 (rank order, from 0.f) and stored into slab g (store_partial), then the tile's last
// arrival sums the slabs (finish_tile, slab order) into C and clears them. Compared bit for bit
// with that order computed directly; the workspace must be all zero after. Prints "ok <name>" or
// "FAIL <name>: why" per check.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "splitk_fixup.cuh"

using namespace cudal2_splitk;

static int failures = 0;
static void check(bool ok, const std::string& name) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", name.c_str());
  if (!ok) ++failures;
}

int main() {
  std::mt19937 rng(51);
  struct Case { int M, N, BM, BN, m0, n0; };
  const Case cases[] = {{128, 64, 32, 32, 96, 32}, {37, 150, 16, 128, 16, 128}};
  const int plans[][2] = {{8, 2}, {8, 8}, {6, 2}, {5, 4}, {2, 9}};   // (cluster, groups)
  for (const Case& t : cases)
    for (const auto& plan : plans) {
      const int cs = plan[0], groups = plan[1], splits = cs * groups;
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::uniform_int_distribution<int> e(-12, 12);   // the fp32 sum depends on the order
      std::vector<std::vector<float>> part(splits, std::vector<float>((size_t)t.BM * t.BN));
      for (auto& p : part)
        for (float& v : p) v = std::ldexp(u(rng), e(rng));
      std::vector<float> ws(semaphore_offset(groups, t.M, t.N) / sizeof(float), 0.f);
      std::vector<half> ref((size_t)t.M * t.N, __float2half_rn(-3.f)), got = ref;
      for (int r = 0; r < t.BM && t.m0 + r < t.M; ++r)
        for (int c = 0; c < t.BN && t.n0 + c < t.N; ++c) {
          const int i = r * t.BN + c, row = t.m0 + r, col = t.n0 + c;
          float sum = 0.f;
          for (int g = 0; g < groups; ++g) {
            float s = 0.f;
            for (int k = 0; k < cs; ++k) s += part[g * cs + k][i];
            sum += s;
          }
          ref[(size_t)row * t.N + col] = __float2half_rn(sum);
          for (int g = 0; g < groups; ++g) {   // cluster g's sum of this element into its slab
            const Float4 v = cluster_sum4(cs, [&](int q) {
              const float x = part[g * cs + q][i];
              return Float4{x, x, x, x};
            });
            store_partial(ws.data(), g, row, col, t.M, t.N, v.x);
          }
        }
      finish_tile(ws.data(), groups, t.M, t.N, t.m0, t.n0, t.BM, t.BN, got.data(), t.N, 0, 1);
      bool zero = true;
      for (float v : ws) zero = zero && v == 0.f;
      const std::string tag = std::to_string(t.BM) + "x" + std::to_string(t.BN) + "_c" +
                              std::to_string(cs) + "_g" + std::to_string(groups);
      check(std::memcmp(got.data(), ref.data(), got.size() * sizeof(half)) == 0,
            "two_level_bit_identical_" + tag);
      check(zero, "two_level_workspace_zero_after_" + tag);
    }
  return failures ? 1 : 0;
}
