#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "ops/fp4_fragments.h"
#include "ops/linear_quant.h"
#include "ops/moe.h"
#include "ops/moe_quant.h"
#include "ops/quant.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

TEST(Quant, Pow2CeilIsExact) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0000001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(0.5f), 0.5f);
  EXPECT_EQ(pow2_ceil(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -130));
  EXPECT_EQ(pow2_ceil(3e-40f), std::ldexp(1.0f, -131));
}

TEST(Quant, Fp8BlocksMatchTheFormula) {
  Rng rng(5);
  for (int64_t block : {32, 64, 128}) {
    auto x = randn(rng, 2 * block * 3, 5.0);
    x[7] = 0;
    auto y = x;
    fp8_quant_dequant(y.data(), 2, block * 3, block);
    for (size_t b = 0; b < x.size(); b += size_t(block)) {
      double amax = 0;
      for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(double(x[b + i])));
      // s = 2^ceil(log2(max(amax,1e-4)/448)) computed in double
      const double s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4) / 448.0)));
      for (int64_t i = 0; i < block; ++i) {
        const double q = double(x[b + i]) / s;
        EXPECT_LE(std::fabs(q), 448.0 + 1e-9);
        EXPECT_EQ(y[b + i], float(double(round_e4m3(float(q))) * s));
        EXPECT_LE(std::fabs(y[b + i] - x[b + i]), std::fabs(x[b + i]) / 16 + s * std::ldexp(1.0, -9));
      }
    }
  }
}

TEST(Quant, Fp4E8m0ValuesLieOnTheGrid) {
  Rng rng(6);
  auto x = randn(rng, 4 * 32);
  auto y = x;
  fp4_quant_dequant_e8m0(y.data(), 4, 32, 32);
  for (int b = 0; b < 4; ++b) {
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b * 32 + i])));
    const double s = std::exp2(std::ceil(std::log2(amax / 6.0)));
    for (int i = 0; i < 32; ++i) {
      const double v = y[b * 32 + i] / s;  // must be an e2m1 value
      EXPECT_EQ(float(v), round_e2m1(float(v)));
      EXPECT_LE(std::fabs(v), 6.0);
      // nearest grid point: no other e2m1 value is closer to x/s
      const double q = x[b * 32 + i] / s;
      for (uint8_t c = 0; c < 16; ++c) EXPECT_LE(std::fabs(v - q), std::fabs(e2m1_to_f32(c) - q) + 1e-12);
    }
  }
}

TEST(Quant, Fp4E4m3ScaleIsAnE4m3Value) {
  // amax 3.3 → s = e4m3(0.55) = 0.5625; 3.3/0.5625 = 5.87 → 6 → 3.375.
  std::vector<float> x(16, 0.0f);
  x[0] = 3.3f;
  x[1] = -0.3f;  // /0.5625 = -0.533 → -0.5 → -0.28125
  fp4_quant_dequant_e4m3(x.data(), 1, 16, 16);
  EXPECT_EQ(x[0], 3.375f);
  EXPECT_EQ(x[1], -0.28125f);
  EXPECT_EQ(x[2], 0.0f);
}

TEST(Quant, HadamardIsOrthonormalAndSylvesterOrdered) {
  std::vector<float> e(8, 0.0f);
  e[1] = 1;
  hadamard_inplace(e.data(), 1, 8);
  // Column 1 of H_8 (Sylvester) = [1,-1,1,-1,1,-1,1,-1] / sqrt(8).
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(e[i], (i % 2 ? -1.0f : 1.0f) / std::sqrt(8.0f));
  Rng rng(7);
  auto x = randn(rng, 128);
  auto y = x;
  hadamard_inplace(y.data(), 1, 128);
  hadamard_inplace(y.data(), 1, 128);  // H is its own inverse
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

// The block-scaled linear's BF16 flags (BlockLinearParams::bf16_in, bf16_round_out; the CPU twin of
// the GEMV's fused roundings) are exactly the roundings around the plain twin: bf16_in == the twin
// on round_bf16(x) (x untouched), bf16_round_out == round_bf16 of the twin's output; with
// bf16_out they are refused. The grouped expert twin's bf16_round_out rounds each written value
// (the plain projection and the fused SwiGLU).
TEST(BlockLinearRef, Bf16FlagsAreRoundingsAroundThePlainTwin) {
  Rng rng(11);
  const int64_t m = 3, n = 19, k = 96;
  std::vector<uint8_t> w(size_t(n * k)), ws(size_t((n + 31) / 32 * (k / 32)));
  for (auto& c : w) c = uint8_t(rng.below(256) & 0xf7);  // no NaN codes (S.1111.111)
  for (auto& c : ws) c = uint8_t(120 + rng.below(8));
  auto x = randn(rng, m * k, 3.0);
  const auto x0 = x;
  std::vector<float> xr(x);
  for (auto& v : xr) v = round_bf16(v);
  ASSERT_NE(xr, x) << "inputs that BF16 rounding leaves unchanged";
  BlockLinearParams p;
  p.m = m, p.n = n, p.k = k, p.w = w.data(), p.w_scale = ws.data();
  std::vector<float> plain(size_t(m * n)), on_rounded(plain.size()), got(plain.size());
  p.x = x.data(), p.y = plain.data();
  ASSERT_TRUE(block_linear_ref(p).ok());
  p.x = xr.data(), p.y = on_rounded.data();
  ASSERT_TRUE(block_linear_ref(p).ok());
  p.x = x.data(), p.y = got.data(), p.bf16_in = true;
  ASSERT_TRUE(block_linear_ref(p).ok());
  EXPECT_EQ(got, on_rounded);
  EXPECT_EQ(x, x0);
  p.bf16_in = false, p.bf16_round_out = true;
  ASSERT_TRUE(block_linear_ref(p).ok());
  int64_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], round_bf16(plain[i])) << i;
    changed += got[i] != plain[i];
  }
  EXPECT_GT(changed, 0);
  p.bf16_out = true;
  EXPECT_FALSE(block_linear_ref(p).ok());

  // Grouped expert twin: 2 experts, 4 pairs of 2 rows.
  const std::vector<int32_t> ge = {0, 1}, gs = {0, 2, 4}, pr = {0, 1, 1, 0};
  const std::vector<float> pw = {0.5f, 1.25f, 0.75f, 1.0f};
  std::vector<uint8_t> w2(size_t(2 * n * k)), ws2(2 * ws.size());
  for (auto& c : w2) c = uint8_t(rng.below(256) & 0xf7);
  for (auto& c : ws2) c = uint8_t(118 + rng.below(6));
  for (const bool gated : {false, true}) {
    ExpertGemvParams q;
    q.x = x.data(), q.w = w2.data(), q.w_scale = ws2.data();
    if (gated) q.w_up = w2.data(), q.w_up_scale = ws2.data(), q.pair_weight = pw.data(), q.swiglu_limit = 7.0f;
    q.expert_stride = n * k, q.expert_scale_stride = int64_t(ws.size());
    q.group_expert = ge.data(), q.group_start = gs.data(), q.pair_row = pr.data();
    q.n_groups = 2, q.n_pairs = 4, q.n_experts = 2, q.n = n, q.k = k, q.format = WeightFormat::kFp8;
    std::vector<float> y0(size_t(4 * n)), y1(y0.size());
    q.y = y0.data();
    ASSERT_TRUE(expert_gemv_ref(q, m).ok());
    q.y = y1.data(), q.bf16_round_out = true;
    ASSERT_TRUE(expert_gemv_ref(q, m).ok());
    for (size_t i = 0; i < y0.size(); ++i) EXPECT_EQ(y1[i], round_bf16(y0[i])) << "gated " << gated << " " << i;
  }
}

// The gated twin (w_up) is the model's swiglu over the two one-matrix twins' outputs, bit for bit:
// without roundings; with bf16_round_gate_up (gate and up rounded as bf16_round_out rounds them)
// and bf16_round_out on the result; with and without a clamp that binds; the expert twin's
// bf16_round_gate_up the same per pair.
TEST(BlockLinearRef, GatedIsSwigluOfTheTwoLinears) {
  Rng rng(77);
  const int64_t m = 3, n = 40, k = 96;
  std::vector<uint8_t> wg(size_t(n * k)), wu(wg.size()), ws(size_t((n + 31) / 32 * (k / 32)));
  for (auto& c : wg) c = uint8_t(rng.below(256) & 0xf7);
  for (auto& c : wu) c = uint8_t(rng.below(256) & 0xf7);
  for (auto& c : ws) c = uint8_t(120 + rng.below(8));
  const auto x = randn(rng, m * k, 3.0);
  for (const bool round : {false, true})
    for (const float limit : {0.0f, 2.0f}) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " limit " << limit);
      BlockLinearParams p;
      p.m = m, p.n = n, p.k = k, p.x = x.data(), p.w_scale = ws.data(), p.bf16_round_out = round;
      std::vector<float> g(size_t(m * n)), u(g.size()), want(g.size()), got(g.size());
      p.w = wg.data(), p.y = g.data();
      ASSERT_TRUE(block_linear_ref(p).ok());
      p.w = wu.data(), p.y = u.data();
      ASSERT_TRUE(block_linear_ref(p).ok());
      for (int64_t t = 0; t < m; ++t) swiglu(g.data() + t * n, u.data() + t * n, want.data() + t * n, n, limit, 1.0f);
      int64_t clamped = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        if (round) want[i] = round_bf16(want[i]);
        clamped += limit > 0 && (g[i] > limit || std::fabs(u[i]) > limit);
      }
      if (limit > 0) {
        EXPECT_GT(clamped, 0) << "the clamp never binds";
      }
      p.w = wg.data(), p.w_up = wu.data(), p.w_up_scale = ws.data(), p.swiglu_limit = limit;
      p.bf16_round_gate_up = round, p.y = got.data();
      ASSERT_TRUE(block_linear_ref(p).ok());
      EXPECT_EQ(got, want);
      // The expert twin, one expert, a pair per row: the same values.
      const std::vector<int32_t> ge = {0}, gs = {0, int32_t(m)};
      ExpertGemvParams q;
      q.x = x.data(), q.w = wg.data(), q.w_scale = ws.data(), q.w_up = wu.data(), q.w_up_scale = ws.data();
      q.group_expert = ge.data(), q.group_start = gs.data();
      q.n_groups = 1, q.n_pairs = m, q.n_experts = 1, q.n = n, q.k = k, q.format = WeightFormat::kFp8;
      q.swiglu_limit = limit, q.bf16_round_gate_up = round, q.bf16_round_out = round;
      std::vector<float> ye(g.size());
      q.y = ye.data();
      ASSERT_TRUE(expert_gemv_ref(q, m).ok());
      EXPECT_EQ(ye, want);
    }
  BlockLinearParams bad;
  bad.m = 1, bad.n = n, bad.k = k, bad.x = x.data(), bad.w = wg.data(), bad.w_scale = ws.data();
  std::vector<float> y(static_cast<size_t>(n));
  bad.y = y.data(), bad.bf16_round_gate_up = true;
  EXPECT_FALSE(block_linear_ref(bad).ok()) << "bf16_round_gate_up without w_up";
  bad.bf16_round_gate_up = false, bad.w_up = wu.data();
  EXPECT_FALSE(block_linear_ref(bad).ok()) << "w_up without its scales";
}

// The FP4 fragment order (ops/fp4_fragments.h): a bijection of code words and scale bytes (every
// output byte written once, the round trip is the identity), each word and scale where the layout
// says, the lane-major units the GEMV's loads assume (lane l's 16 bytes of a block at 32l + 16j of
// its unit), and refusals of bad shapes and overlapping buffers.
TEST(Fp4Fragments, PackIsTheStatedPermutationAndUnpackInvertsIt) {
  Rng rng(91);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{32, 64}, {96, 320}, {64, 2304}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    std::vector<uint8_t> codes(size_t(n * k / 2)), scales(size_t(n * k / 32));
    for (auto& c : codes) c = uint8_t(rng.below(256));
    for (auto& c : scales) c = uint8_t(rng.below(256));
    std::vector<uint8_t> pc(codes.size(), 0), ps(scales.size(), 0), mark_c(codes.size(), 0xAB), mark_s(scales.size(), 0xAB);
    ASSERT_TRUE(pack_fp4_fragments(codes.data(), scales.data(), n, k, pc.data(), ps.data()).ok());
    // Every destination written: pack a second time over a marked buffer, compare.
    ASSERT_TRUE(pack_fp4_fragments(codes.data(), scales.data(), n, k, mark_c.data(), mark_s.data()).ok());
    EXPECT_EQ(pc, mark_c);
    EXPECT_EQ(ps, mark_s);
    std::vector<int> hits(pc.size() / 4, 0);
    for (int64_t row = 0; row < n; ++row)
      for (int64_t kb = 0; kb < k / 32; ++kb) {
        ASSERT_EQ(ps[size_t(fp4_fragment_scale(row, kb, k))], scales[size_t(row * (k / 32) + kb)]);
        for (int q = 0; q < 4; ++q) {
          const int64_t f = fp4_fragment_word(row, kb, q, k);
          ASSERT_EQ(f % 4, 0);
          ++hits[size_t(f / 4)];
          ASSERT_EQ(0, std::memcmp(&pc[size_t(f)], &codes[size_t(row * (k / 2) + kb * 16 + q * 4)], 4));
          // The GEMV's view: thread (g, q) of the row's tile reads block kb's 4 words as one 16-byte
          // vector, word 2mt + h for row 16mt + 8h + g.
          const int64_t r = row % 32, g = r % 8, unit = (row / 32) * (k / 64) + kb / 2;
          const int64_t vec = (unit * 32 + 4 * g + q) * 32 + (kb % 2) * 16;
          ASSERT_EQ(f, vec + 4 * (2 * (r / 16) + (r / 8) % 2));
        }
      }
    for (const int h : hits) ASSERT_EQ(h, 1);
    std::vector<uint8_t> uc(codes.size()), us(scales.size());
    ASSERT_TRUE(unpack_fp4_fragments(pc.data(), ps.data(), n, k, uc.data(), us.data()).ok());
    EXPECT_EQ(uc, codes);
    EXPECT_EQ(us, scales);
  }
  std::vector<uint8_t> a(32 * 64), b(a.size()), s(256), t(256);
  EXPECT_FALSE(pack_fp4_fragments(a.data(), s.data(), 33, 64, b.data(), t.data()).ok()) << "n not a multiple of 32";
  EXPECT_FALSE(pack_fp4_fragments(a.data(), s.data(), 32, 96, b.data(), t.data()).ok()) << "k not a multiple of 64";
  EXPECT_FALSE(pack_fp4_fragments(a.data(), s.data(), 32, 64, a.data() + 8, t.data()).ok()) << "overlap";
  EXPECT_FALSE(unpack_fp4_fragments(a.data(), nullptr, 32, 64, b.data(), t.data()).ok()) << "null scales";
}

// The FP8 fragment order: each 8-byte piece where the layout says (the GEMV's two 16-byte loads
// per thread and block: pieces 2mt + h of rows 16mt + 8h + g), a bijection, the round trip the
// identity; the linear twin on a packed matrix gives the row-major twin's bits; refusals.
TEST(Fp4Fragments, Fp8PieceOrderAndTheLinearTwin) {
  Rng rng(93);
  const int64_t n = 64, k = 96, m = 3;
  std::vector<uint8_t> codes(size_t(n * k));
  for (auto& c : codes) c = uint8_t(rng.below(256) & 0xf7);  // no NaN codes
  std::vector<uint8_t> pk(codes.size());
  ASSERT_TRUE(pack_fp8_fragments(codes.data(), n, k, pk.data()).ok());
  std::vector<int> hits(codes.size() / 8, 0);
  for (int64_t row = 0; row < n; ++row)
    for (int64_t kb = 0; kb < k / 32; ++kb)
      for (int q = 0; q < 4; ++q) {
        const int64_t f = fp8_fragment_piece(row, kb, q, k), r = row % 32;
        ASSERT_EQ(f % 8, 0);
        ++hits[size_t(f / 8)];
        ASSERT_EQ(0, std::memcmp(&pk[size_t(f)], &codes[size_t(row * k + kb * 32 + q * 8)], 8));
        const int64_t vec = (((row / 32) * (k / 32) + kb) * 32 + 4 * (r % 8) + q) * 32;  // the lane's 32 bytes
        ASSERT_EQ(f, vec + 8 * (2 * (r / 16) + (r / 8) % 2));
      }
  for (const int h : hits) ASSERT_EQ(h, 1);
  std::vector<uint8_t> back(codes.size());
  ASSERT_TRUE(unpack_fp8_fragments(pk.data(), n, k, back.data()).ok());
  EXPECT_EQ(back, codes);
  std::vector<uint8_t> ws(size_t((n / 32) * (k / 32)));
  for (auto& c : ws) c = uint8_t(120 + rng.below(8));
  const auto x = randn(rng, m * k, 2.0);
  BlockLinearParams p;
  p.m = m, p.n = n, p.k = k, p.x = x.data(), p.w_scale = ws.data();
  std::vector<float> a(size_t(m * n)), b(a.size());
  p.w = codes.data(), p.y = a.data();
  ASSERT_TRUE(block_linear_ref(p).ok());
  p.w = pk.data(), p.y = b.data(), p.w_packed = true;
  ASSERT_TRUE(block_linear_ref(p).ok());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  EXPECT_FALSE(pack_fp8_fragments(codes.data(), 40, 96, pk.data()).ok()) << "n % 32";
  EXPECT_FALSE(pack_fp8_fragments(codes.data(), 32, 96, codes.data() + 8).ok()) << "overlap";
  p.n = 48;
  EXPECT_NE(validate(p).message().find("w_packed"), std::string::npos) << "n % 32";
}

// The expert twin reads w_packed experts as the same matrices: bitwise the row-major outputs
// (gated and one-matrix, another rank's expert, an empty group); the flag needs the fragment
// order's shape.
TEST(Fp4Fragments, ExpertTwinReadsPackedExpertsAsTheSameMatrices) {
  Rng rng(92);
  const int64_t n = 64, k = 128, experts = 3, m = 4;
  const int64_t cb = n * k / 2, sb = n * k / 32;
  std::vector<uint8_t> wg(size_t(experts * cb)), wu(wg.size()), sg(size_t(experts * sb)), su(sg.size());
  for (auto* v : {&wg, &wu}) for (auto& c : *v) c = uint8_t(rng.below(256));
  for (auto* v : {&sg, &su}) for (auto& c : *v) c = uint8_t(120 + rng.below(8));
  std::vector<uint8_t> pg(wg.size()), pu(wu.size()), psg(sg.size()), psu(su.size());
  for (int64_t e = 0; e < experts; ++e) {
    ASSERT_TRUE(pack_fp4_fragments(&wg[size_t(e * cb)], &sg[size_t(e * sb)], n, k, &pg[size_t(e * cb)], &psg[size_t(e * sb)]).ok());
    ASSERT_TRUE(pack_fp4_fragments(&wu[size_t(e * cb)], &su[size_t(e * sb)], n, k, &pu[size_t(e * cb)], &psu[size_t(e * sb)]).ok());
  }
  const auto x = randn(rng, m * k, 1.0);
  const std::vector<int32_t> ge = {2, -1, 0, 1}, gs = {0, 2, 3, 3, 6}, pr = {0, 3, 1, 2, 0, 1};
  for (const bool gated : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "gated " << gated);
    ExpertGemvParams q;
    q.x = x.data(), q.group_expert = ge.data(), q.group_start = gs.data(), q.pair_row = pr.data();
    q.n_groups = 4, q.n_pairs = 6, q.n_experts = experts, q.n = n, q.k = k, q.format = WeightFormat::kFp4;
    q.expert_stride = cb, q.expert_scale_stride = sb, q.swiglu_limit = 7.0f;
    std::vector<float> want(size_t(6 * n)), got(want.size(), -1.0f);
    q.w = wg.data(), q.w_scale = sg.data(), q.y = want.data();
    if (gated) q.w_up = wu.data(), q.w_up_scale = su.data();
    ASSERT_TRUE(expert_gemv_ref(q, m).ok());
    q.w = pg.data(), q.w_scale = psg.data(), q.y = got.data(), q.w_packed = true;
    if (gated) q.w_up = pu.data(), q.w_up_scale = psu.data();
    ASSERT_TRUE(expert_gemv_ref(q, m).ok());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4));
    double nz = 0;
    for (const float v : want) nz += v != 0;
    EXPECT_GT(nz, double(4 * n)) << "the case computes little";
  }
  ExpertGemvParams bad;
  float dummy = 0;
  uint8_t byte = 0;
  int32_t zero = 0;
  bad.x = &dummy, bad.y = &dummy, bad.w = &byte, bad.w_scale = &byte, bad.group_expert = &zero, bad.group_start = &zero;
  bad.n_groups = 1, bad.n_pairs = 1, bad.n_experts = 1, bad.n = 32, bad.k = 96, bad.w_packed = true;
  EXPECT_NE(validate(bad).message().find("w_packed"), std::string::npos) << "k = 96";
  bad.k = 64, bad.n = 40, bad.format = WeightFormat::kFp8, bad.w_block = 32;
  EXPECT_NE(validate(bad).message().find("w_packed"), std::string::npos) << "FP8, n = 40";
  bad.n = 32;
  EXPECT_TRUE(validate(bad).ok()) << "FP8: " << validate(bad).message();
  bad.format = WeightFormat::kFp4;
  EXPECT_TRUE(validate(bad).ok()) << validate(bad).message();
}

}  // namespace flashseek::ops
