// Host emulation of cudal2/templates/splitk_fixup.cuh (built by tests/test_splitk.py with nvcc,
// run on the CPU): the CTAs of a split-K grid arrive in random orders and run the header's own
// __host__ __device__ code (store_partial, is_last_arrival, finish_tile), as hgemm_kernel does.
// Prints one line per check: "ok <name>" or "FAIL <name>: why"; "distinct <n>" for the number of
// different outputs seen across arrival orders.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "splitk_fixup.cuh"

using namespace cudal2_splitk;

static int failures = 0;
static void check(bool ok, const char* name, const std::string& why = "") {
  if (ok) std::printf("ok %s\n", name);
  else { std::printf("FAIL %s: %s\n", name, why.c_str()); ++failures; }
}

struct Shape { int M, N, BM, BN, splits; };

// One split's partial of element (row, col): magnitudes over 2^-12 .. 2^12 so the fp32 sum
// depends on the order of the additions.
static float partial_value(int z, int row, int col, unsigned seed) {
  uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)z * 0xBF58476D1CE4E5B9ull +
               (uint64_t)row * 0x94D049BB133111EBull + (uint64_t)col * 0x2545F4914F6CDD1Dull;
  x ^= x >> 31; x *= 0xD6E8FEB86659FD93ull; x ^= x >> 29;                  // splitmix-style hash
  const float u = (float)(x >> 40) / (float)(1u << 24) * 2.f - 1.f;        // [-1, 1)
  return std::ldexp(u, (int)((x >> 8) % 25) - 12);
}

// One call: every (tile, split) CTA in `order` stores its partial and arrives; the last of a tile
// finishes it. Returns false when an arrival found a semaphore past splits - 1 (the kernel traps).
static bool run_call(const Shape& s, std::vector<unsigned char>& ws, std::vector<half>& C,
                     const std::vector<std::pair<int, int>>& order, unsigned seed) {
  const int tiles_n = (s.N + s.BN - 1) / s.BN;
  float* part = partials(ws.data());
  unsigned int* sem = semaphores(ws.data(), s.splits, s.M, s.N);
  for (auto [tile, z] : order) {
    const int m0 = tile / tiles_n * s.BM, n0 = tile % tiles_n * s.BN;
    for (int r = m0; r < std::min(s.M, m0 + s.BM); ++r)
      for (int c = n0; c < std::min(s.N, n0 + s.BN); ++c)
        store_partial(part, z, r, c, s.M, s.N, partial_value(z, r, c, seed));
    const unsigned int before = sem[tile]++;           // atomicAdd in arrive()
    if (before >= (unsigned)s.splits) return false;    // __trap() in arrive()
    if (is_last_arrival(before, s.splits)) {
      finish_tile(part, s.splits, s.M, s.N, m0, n0, s.BM, s.BN, C.data(), s.N, 0, 1);
      sem[tile] = 0;                                   // release_tile()
    }
  }
  return true;
}

static std::vector<std::pair<int, int>> ctas(const Shape& s) {
  const int tiles = ((s.M + s.BM - 1) / s.BM) * ((s.N + s.BN - 1) / s.BN);
  std::vector<std::pair<int, int>> out;
  for (int t = 0; t < tiles; ++t)
    for (int z = 0; z < s.splits; ++z) out.push_back({t, z});
  return out;
}

static bool all_zero(const std::vector<unsigned char>& ws) {
  return std::all_of(ws.begin(), ws.end(), [](unsigned char b) { return b == 0; });
}

int main() {
  // split counts below, at and past the reducer's load batch (kFixupBatch), and a partial batch
  const Shape shapes[] = {{37, 150, 16, 64, 5}, {64, 128, 64, 64, 16}, {1, 70, 16, 64, 3},
                          {130, 40, 64, 32, 2}, {40, 72, 32, 64, 21}};
  std::mt19937 rng(12345);
  std::set<std::vector<unsigned short>> outputs_seen;
  for (const Shape& s : shapes) {
    const int tiles = ((s.M + s.BM - 1) / s.BM) * ((s.N + s.BN - 1) / s.BN);
    // the caller zeroes the workspace once, at allocation; it is never zeroed again
    std::vector<unsigned char> ws(workspace_bytes(s.splits, s.M, s.N, tiles), 0);
    // the reference: the fp32 sum in split-index order, rounded once to fp16
    std::vector<unsigned short> ref(s.M * s.N);
    for (int r = 0; r < s.M; ++r)
      for (int c = 0; c < s.N; ++c) {
        float sum = 0.f;
        for (int z = 0; z < s.splits; ++z) sum += partial_value(z, r, c, 7);
        half h = __float2half_rn(sum);
        std::memcpy(&ref[r * s.N + c], &h, 2);
      }
    std::set<std::vector<unsigned short>> seen;
    bool zero_after = true, exact = true, close = true;
    auto order = ctas(s);
    for (int call = 0; call < 40; ++call) {
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<half> C(s.M * s.N, __float2half_rn(-7.f));
      if (!run_call(s, ws, C, order, 7)) { check(false, "no_trap", "a fresh call trapped"); break; }
      std::vector<unsigned short> bits(s.M * s.N);
      std::memcpy(bits.data(), C.data(), bits.size() * 2);
      seen.insert(bits);
      zero_after = zero_after && all_zero(ws);
      for (int i = 0; i < s.M * s.N; ++i) {
        half hr, hc;
        std::memcpy(&hr, &ref[i], 2);
        std::memcpy(&hc, &bits[i], 2);
        const float fr = __half2float(hr), fc = __half2float(hc);
        exact = exact && bits[i] == ref[i];
        close = close && std::fabs(fr - fc) <= 1e-2f * (1.f + std::fabs(fr));
      }
    }
    char name[96];
    std::snprintf(name, sizeof name, "workspace_zero_after_every_call_%dx%d_s%d", s.M, s.N, s.splits);
    check(zero_after, name);
    std::snprintf(name, sizeof name, "close_to_reference_%dx%d_s%d", s.M, s.N, s.splits);
    check(close, name);
#if SPLITK_DETERMINISTIC
    std::snprintf(name, sizeof name, "bit_identical_across_orders_%dx%d_s%d", s.M, s.N, s.splits);
    check(seen.size() == 1 && exact, name, std::to_string(seen.size()) + " distinct outputs");
#endif
    std::printf("distinct %zu\n", seen.size());
    // a workspace left with a semaphore at splits (a caller that broke the contract) traps
    unsigned int* sem = semaphores(ws.data(), s.splits, s.M, s.N);
    sem[0] = (unsigned)s.splits;
    std::vector<half> C(s.M * s.N);
    std::snprintf(name, sizeof name, "stale_semaphore_traps_%dx%d_s%d", s.M, s.N, s.splits);
    check(!run_call(s, ws, C, order, 7), name);
  }
  // one workspace shared by calls of different shapes (dispatch's per-stream workspace)
  {
    std::vector<unsigned char> ws(1 << 20, 0);
    bool ok = true;
    for (const Shape& s : shapes) {
      std::vector<half> C(s.M * s.N);
      auto order = ctas(s);
      std::shuffle(order.begin(), order.end(), rng);
      ok = ok && run_call(s, ws, C, order, 3) && all_zero(ws);
    }
    check(ok, "shared_workspace_across_shapes");
  }
  return failures ? 1 : 0;
}
