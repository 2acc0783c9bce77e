#include <cmath>

#include <gtest/gtest.h>

#include "ops/engram.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

namespace {
// v41 §8 tiny layout with the multipliers of §8 (numpy PCG64, seeds 10007 and 40028).
std::vector<EngramLayout> tiny_layouts() {
  auto L = engram_layouts(2, 3, 2, 31);
  L[0].multipliers = {29662608052400909, 1873410163432121, 13919202536988139};
  L[1].multipliers = {31841131192811251, 1950019090429101, 28509641033320619};
  return L;
}
std::vector<int64_t> hash_all(const EngramLayout& L, const std::vector<int64_t>& c) {
  std::vector<int64_t> ids(c.size() * L.n_cols());
  engram_hash(L, c.data(), 0, int64_t(c.size()), 0, 2, ids.data());
  return ids;
}
}  // namespace

TEST(Engram, TinyPrimesAndOffsets) {
  auto L = tiny_layouts();
  EXPECT_EQ(L[0].primes, (std::vector<int64_t>{31, 37, 41, 43}));
  EXPECT_EQ(L[1].primes, (std::vector<int64_t>{47, 53, 59, 61}));
  EXPECT_EQ(L[0].offsets, (std::vector<int64_t>{0, 31, 68, 109}));
  EXPECT_EQ(L[1].offsets, (std::vector<int64_t>{0, 47, 100, 159}));
  EXPECT_EQ(L[0].n_rows(), 152);
  EXPECT_EQ(L[1].n_rows(), 220);
}

TEST(Engram, TinyGoldenIdsOfSection8) {
  auto L = tiny_layouts();
  const std::vector<int64_t> c = {5, 17, 200, 3, 99};
  EXPECT_EQ(hash_all(L[0], c), (std::vector<int64_t>{29, 54, 94, 126, 21, 67, 92, 125, 1, 40, 105,
                                                     142, 27, 44, 70, 145, 22, 42, 69, 142}));
  EXPECT_EQ(hash_all(L[1], c), (std::vector<int64_t>{1, 65, 145, 203, 23, 84, 108, 176, 36, 89, 127,
                                                     205, 26, 85, 146, 217, 13, 84, 128, 209}));
  const std::vector<int64_t> dead = {5, 17, kEngramDead, 3, 99};
  EXPECT_EQ(hash_all(L[0], dead), (std::vector<int64_t>{29, 54, 94, 126, 21, 67, 92, 125, 8, 42, 71,
                                                        129, 15, 49, 100, 131, 22, 42, 69, 112}));
  EXPECT_EQ(hash_all(L[1], dead), (std::vector<int64_t>{1, 65, 145, 203, 23, 84, 108, 176, 34, 84, 129,
                                                        167, 5, 86, 150, 167, 13, 84, 144, 169}));
}

TEST(Engram, ChunkedHashingWithLookBackEqualsWhole) {
  auto L = tiny_layouts();
  Rng rng(13);
  std::vector<int64_t> c(40);
  for (auto& v : c) v = int64_t(rng.below(256));
  c[17] = kEngramDead;
  const auto whole = hash_all(L[1], c);
  for (int64_t chunk : {1, 2, 3, 7}) {
    for (int64_t start = 0; start < 40; start += chunk) {
      const int64_t n = std::min<int64_t>(chunk, 40 - start), back = std::min<int64_t>(start, 2);
      std::vector<int64_t> ids(n * 4);
      engram_hash(L[1], c.data() + start - back, back, n, start, 2, ids.data());
      for (int64_t i = 0; i < n * 4; ++i) ASSERT_EQ(ids[i], whole[start * 4 + i]) << chunk << " " << start;
    }
  }
}

TEST(Engram, ReleaseLayoutGoldenVector) {
  auto L = engram_layouts(2, 4, 8, 16000000);
  EXPECT_EQ(L[0].primes.front(), 16000057);
  EXPECT_EQ(L[0].primes.back(), 16000463);
  EXPECT_EQ(L[1].primes.front(), 16000477);
  EXPECT_EQ(L[0].n_rows(), 384006168);
  EXPECT_EQ(L[1].n_rows(), 384016682);
  EXPECT_EQ(L[0].offsets.back(), 368005705);
  EXPECT_EQ(L[1].offsets.back(), 368015793);
  L[0].multipliers = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
  L[1].multipliers = {67716810739261, 51510806800915, 30921347202721, 82619226485591};
  const std::vector<int64_t> c = {100, 2000, 30000, 99091};
  auto ids0 = hash_all(L[0], c), ids1 = hash_all(L[1], c);
  const std::vector<int64_t> want1 = {1366601, 30393351, 40301195, 48268534, 65235997, 94629699,
      110777382, 114229692, 140958730, 155600021, 163297022, 182635322, 198236697, 211122706,
      238808373, 250800175, 270552685, 282599932, 294225275, 311306823, 329238612, 349952030,
      366403215, 378426074};
  const std::vector<int64_t> want14 = {4335667, 16427214, 33118625, 52841340, 71681435, 87106396,
      105010532, 117775959, 141143835, 151538940, 161045104, 186255822, 199647072, 219509024,
      228746144, 240011174, 264051739, 282938475, 289012507, 312356685, 325213417, 336591217,
      354778622, 368165612};
  EXPECT_EQ(std::vector<int64_t>(ids0.begin() + 72, ids0.end()), want1);
  EXPECT_EQ(std::vector<int64_t>(ids1.begin() + 72, ids1.end()), want14);
  const std::vector<int64_t> pos0 = {4052413, 23667694, 42906971, 52829082, 75741025, 88719377,
                                     111210122, 112422857};
  EXPECT_EQ(std::vector<int64_t>(ids0.begin(), ids0.begin() + 8), pos0);
  EXPECT_EQ(ids0[23], 378065828);
}

TEST(Engram, GateMatchesDoubleAndDeadAddsNothing) {
  Rng rng(14);
  const int64_t hc = 4, D = 40;
  auto x = randn(rng, hc * D), kv = randn(rng, (hc + 1) * D), w = randn(rng, hc * D);
  auto y = x;
  engram_gate({y.data(), kv.data(), w.data(), hc, D, 1e-20f});
  for (int64_t c = 0; c < hc; ++c) {
    double sxx = 0, skk = 0, dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      sxx += double(x[c * D + d]) * x[c * D + d];
      skk += double(kv[c * D + d]) * kv[c * D + d];
      dot += double(x[c * D + d]) * w[c * D + d] * kv[c * D + d];
    }
    const double z = dot / std::sqrt(sxx / D) / std::sqrt(skk / D) / std::sqrt(double(D));
    const double g = 1 / (1 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(z), 1e-6)), z)));
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(y[c * D + d], x[c * D + d] + g * kv[hc * D + d], 1e-5);
  }
  auto z = x;
  engram_gate({z.data(), kv.data(), w.data(), hc, D, 1e-20f, true});
  EXPECT_EQ(z, x);
}

}  // namespace flashseek::ops

namespace flashseek::ops {

// numpy default_rng(10007·L).integers(0, bound, n) · 2 + 1, against the values the spec pins
// (v41 §4.4 release layout, §8 tiny layout).
TEST(Engram, MultipliersReproduceNumpyPcg64) {
  EXPECT_EQ(engram_multipliers(1, 99092, 4),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(engram_multipliers(14, 99092, 4),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  EXPECT_EQ(engram_multipliers(1, 256, 3),
            (std::vector<int64_t>{29662608052400909, 1873410163432121, 13919202536988139}));
  EXPECT_EQ(engram_multipliers(4, 256, 3),
            (std::vector<int64_t>{31841131192811251, 1950019090429101, 28509641033320619}));
  for (int64_t m : engram_multipliers(7, 129280, 4)) EXPECT_EQ(m % 2, 1);
}

}  // namespace flashseek::ops
