// GPU block-scaled linear and grouped expert GEMV against their CPU twins, on random FP8/FP4
// weights, odd shapes (tails of rows, tokens beyond one 16-token tile, k not a multiple of 128),
// and activation blocks with zeros and outliers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/numeric.h"
#include "gpu_util.h"
#include "ops/block_scaled_data.h"
#include "ops/cuda/gemm/gemm_fp8.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/gemm_fp8.h"
#include "ops/linear_quant.h"
#include "ops/moe_quant.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda {
namespace {


using testing::DeviceBuffer;

struct Weights {
  std::vector<uint8_t> codes, scales;
};

Weights random_weights(std::mt19937& rng, WeightFormat f, int64_t n, int64_t k, int64_t w_block) {
  Weights w;
  w.codes.resize(size_t(weight_code_bytes(f, n, k)));
  w.scales.resize(size_t(weight_scale_bytes(f, n, k, w_block)));
  for (auto& c : w.codes) {
    c = uint8_t(rng());
    if (f == WeightFormat::kFp8 && (c & 0x7f) == 0x7f) c &= 0xfe;  // no NaN codes
  }
  for (auto& s : w.scales) s = uint8_t(127 - 6 + int(rng() % 9));
  return w;
}

// |codes|: the sign bits cleared, so the twin on |x|, |W| gives Σ|x_q||w| (the error scale).
std::vector<uint8_t> abs_codes(std::vector<uint8_t> c, WeightFormat f) {
  for (auto& b : c) b &= f == WeightFormat::kFp8 ? 0x7f : 0x77;
  return c;
}

struct LinCase {
  WeightFormat f;
  int64_t m, n, k, w_block, act_block;
};

void run_linear_case(const LinCase& c, uint32_t seed, std::vector<float>* out = nullptr) {
  SCOPED_TRACE(::testing::Message() << "fmt=" << int(c.f) << " m=" << c.m << " n=" << c.n
                                    << " k=" << c.k << " wb=" << c.w_block << " ab=" << c.act_block);
  std::mt19937 rng(seed);
  const Weights w = random_weights(rng, c.f, c.n, c.k, c.w_block);
  const std::vector<float> x = random_block_activations(rng, c.m, c.k);
  BlockLinearParams p;
  p.m = c.m, p.n = c.n, p.k = c.k, p.format = c.f, p.w_block = c.w_block, p.act_block = c.act_block;
  std::vector<float> ref(static_cast<size_t>(c.m * c.n)), bound(ref.size());
  p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data(), p.y = ref.data();
  FS_ASSERT_OK(block_linear_ref(p));
  std::vector<float> xa(x);
  for (auto& v : xa) v = std::fabs(v);
  const std::vector<uint8_t> wa = abs_codes(w.codes, c.f);
  p.x = xa.data(), p.w = wa.data(), p.y = bound.data();
  FS_ASSERT_OK(block_linear_ref(p));

  DeviceBuffer<float> dx(x), dy(ref.size());
  DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
  p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy.get();
  FS_ASSERT_OK(block_linear_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dy.to_host();
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written or not finite";
    const double err = std::fabs(double(got[i]) - ref[i]);
    worst = std::max(worst, err / (double(bound[i]) + 1e-30));
    ASSERT_LE(err, 1e-4 * bound[i] + 1e-30) << "output " << i << " gpu " << got[i] << " ref " << ref[i];
  }
  ::testing::Test::RecordProperty("worst_rel_to_abs_sum", std::to_string(worst));

  // Same launch again: bitwise identical (fixed reduction order).
  FS_ASSERT_OK(block_linear_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> again = dy.to_host();
  ASSERT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float)));
  if (out) *out = got;
}

TEST(CudaBlockLinear, MatchesCpuTwinOnOddShapes) {
  FS_REQUIRE_GPU();
  const LinCase cases[] = {
      {WeightFormat::kFp8, 1, 1, 32, 32, 32},      {WeightFormat::kFp8, 1, 257, 640, 32, 32},
      {WeightFormat::kFp8, 3, 33, 96, 32, 32},     {WeightFormat::kFp8, 8, 100, 1280, 32, 32},
      {WeightFormat::kFp8, 9, 64, 2304, 32, 32},   {WeightFormat::kFp8, 16, 31, 512, 32, 32},
      {WeightFormat::kFp8, 17, 70, 384, 32, 32},   {WeightFormat::kFp8, 33, 40, 256, 32, 32},
      {WeightFormat::kFp8, 5, 300, 1024, 128, 128}, {WeightFormat::kFp8, 2, 129, 384, 128, 32},
      {WeightFormat::kFp4, 1, 45, 2304, 32, 32},   {WeightFormat::kFp4, 7, 96, 160, 32, 32},
      {WeightFormat::kFp4, 16, 257, 5120, 32, 32},
  };
  uint32_t seed = 1;
  for (const auto& c : cases) run_linear_case(c, seed++);
}

// The bias of a set of results against their exact dots: the mean of sign(exact)·(got − exact) /
// Σ|x_q·w| (negative: on average toward zero) and the fraction of inexact results that moved toward
// zero. An unbiased order gives a mean near 0 and a fraction near 0.5; truncating accumulation
// (round toward zero) gives a negative mean and a fraction near 1, which, unlike random-sign
// errors, adds up coherently over outputs and layers.
struct Bias {
  double sum = 0, toward_zero = 0, inexact = 0, n = 0;
  void add(double got, double exact, double mag) {
    const double d = (exact < 0 ? -1.0 : 1.0) * (got - exact) / mag;
    sum += d, n += 1;
    if (got != exact) inexact += 1, toward_zero += std::fabs(got) < std::fabs(exact);
  }
  double mean() const { return n ? sum / n : 0; }
  double fraction() const { return inexact ? toward_zero / inexact : 0; }
};

// One side's results against their exact dots: the errors in units of Σ|x_q·w| and their bias.
struct ErrorStats {
  std::vector<double> rel;
  Bias bias;
  // Adds a result; returns its error in units of mag.
  double add(float got, double exact, double mag) {
    rel.push_back(std::fabs(double(got) - exact) / mag);
    bias.add(got, exact, mag);
    return rel.back();
  }
  double quantile(double f) const {
    std::vector<double> v(rel);
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(f * double(v.size())))];
  }
};

// The "[error / sum|t|]" and "[error bias]" lines of the CPU twin and the GPU for case `what`.
void print_error_report(const std::string& what, const ErrorStats& cpu, const ErrorStats& gpu) {
  std::printf("[error / sum|t|] %s: cpu p50 %.2e p99 %.2e max %.2e | gpu p50 %.2e p99 %.2e max %.2e\n", what.c_str(),
              cpu.quantile(0.5), cpu.quantile(0.99), cpu.quantile(1.0), gpu.quantile(0.5), gpu.quantile(0.99),
              gpu.quantile(1.0));
  std::printf("[error bias] %s: cpu mean %.2e toward-zero %.3f | gpu mean %.2e toward-zero %.3f\n", what.c_str(),
              cpu.bias.mean(), cpu.bias.fraction(), gpu.bias.mean(), gpu.bias.fraction());
}

// How far the tensor-core GEMV and the CPU twin each are from the exact dot of the same quantised
// operands (products of FP8 values are exact in double, and so is their sum to ~1e-16), in units
// of Σ|x_q·w| (the scale the whole-model sensitivity test perturbs every FP8-activation dot by:
// 1e-7 of it). Prints p50 / p99 / max per side and asserts the GPU within 1e-5 of Σ|x_q·w|: the
// numbers say which kind of perturbation models the GPU's error (docs/cuda.md, "Whole-model parity").
TEST(CudaBlockLinear, ErrorAgainstTheExactDotInUnitsOfTheAbsoluteSum) {
  FS_REQUIRE_GPU();
  struct Shape {
    int64_t m, n, k, block;
  };
  for (const Shape& sh : {Shape{1, 2048, 4096, 32}, Shape{6, 2048, 4096, 32}, Shape{1, 1024, 1024, 32},
                          Shape{1, 2048, 7168, 128}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << sh.m << " n=" << sh.n << " k=" << sh.k << " block=" << sh.block);
    std::mt19937 rng(uint32_t(sh.k + sh.m));
    const Weights w = random_weights(rng, WeightFormat::kFp8, sh.n, sh.k, sh.block);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(sh.m * sh.k));
    for (auto& v : x) v = nd(rng);
    BlockLinearParams p;
    p.m = sh.m, p.n = sh.n, p.k = sh.k, p.w_block = sh.block, p.act_block = sh.block;
    std::vector<float> cpu(size_t(sh.m * sh.n));
    p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data(), p.y = cpu.data();
    FS_ASSERT_OK(block_linear_ref(p));
    DeviceBuffer<float> dx(x), dy(cpu.size());
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
    p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy.get();
    FS_ASSERT_OK(block_linear_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> gpu = dy.to_host();
    std::vector<float> xq(x);
    fp8_quant_dequant(xq.data(), sh.m, sh.k, sh.block);
    const int64_t sc_cols = (sh.k + sh.block - 1) / sh.block;
    ErrorStats ec, eg;
    for (int64_t r = 0; r < sh.m; ++r)
      for (int64_t o = 0; o < sh.n; ++o) {
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < sh.k; ++i) {
          const double wv = double(e4m3_to_f32(w.codes[size_t(o * sh.k + i)])) *
                            double(e8m0_to_f32(w.scales[size_t((o / sh.block) * sc_cols + i / sh.block)]));
          const double t = double(xq[size_t(r * sh.k + i)]) * wv;
          exact += t, mag += std::fabs(t);
        }
        if (mag == 0) continue;
        const size_t j = size_t(r * sh.n + o);
        ec.add(cpu[j], exact, mag);
        ASSERT_LE(eg.add(gpu[j], exact, mag), 1e-5) << "output " << j << " gpu " << gpu[j] << " exact " << exact;
      }
    print_error_report(fmt::format("m={} n={} k={} block={}", sh.m, sh.n, sh.k, sh.block), ec, eg);
  }
}

TEST(CudaBlockLinear, Bf16OutputIsTheRoundedF32Output) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(7);
  const int64_t m = 4, n = 77, k = 256;
  const Weights w = random_weights(rng, WeightFormat::kFp8, n, k, 32);
  const std::vector<float> x = random_block_activations(rng, m, k);
  DeviceBuffer<float> dx(x), dyf(size_t(m * n));
  DeviceBuffer<uint16_t> dyb(size_t(m * n));
  DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
  BlockLinearParams p;
  p.m = m, p.n = n, p.k = k;
  p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dyf.get();
  FS_ASSERT_OK(block_linear_cuda(p, nullptr));
  p.y = dyb.get(), p.bf16_out = true;
  FS_ASSERT_OK(block_linear_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto f = dyf.to_host();
  const auto b = dyb.to_host();
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(b[i], f32_to_bf16(f[i])) << i;
}

// The fused BF16 roundings (BlockLinearParams::bf16_in, bf16_round_out) against the unfused
// sequence the model ran before: quant_sim kBf16 on a device copy of x, the GEMV, quant_sim kBf16
// on y. memcmp-equal for every flag combination, FP8 (blocks of 32 and 128) and FP4 weights, odd
// shapes, rows 1..16 (one and two 8-token tiles) and beyond one pass (17, 40, 70), under the
// automatic tuning and forced k splits / chunk widths. The pre-quantised input too (xq / xs, the
// prefill launches): gemv_quantize_cuda with bf16_in gives the codes and scales of quantising the
// rounded copy (memcmp), and the launch on them equals quant_sim, gemv_quantize, the GEMV,
// quant_sim on y (and the fused launch quantising inside); at m <= 8 the launch ignores xq and
// quantises x inside, rounding it by bf16_in. The fused result is also within the GEMV's usual
// bound of the CPU twin run with the same flags (same bits would need the twin's summation order).
TEST(CudaBlockLinear, FusedBf16RoundingsEqualQuantSimThenGemv) {
  FS_REQUIRE_GPU();
  namespace cd = detail;
  struct TuningReset {
    ~TuningReset() { detail::set_gemv_tuning(0, 0); }  // also when an assertion returns early
  } reset_tuning;
  struct Case {
    WeightFormat f;
    int64_t n, k, wb, ab;
  };
  const Case shapes[] = {{WeightFormat::kFp8, 77, 640, 32, 32},   {WeightFormat::kFp8, 33, 2304, 32, 32},
                         {WeightFormat::kFp8, 129, 1024, 128, 128}, {WeightFormat::kFp4, 45, 2304, 32, 32},
                         {WeightFormat::kFp4, 31, 160, 32, 32}};
  const int64_t row_counts[] = {1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 40, 70};
  const std::pair<int, int> tunings[] = {{0, 0}, {1, 1}, {3, 2}, {8, 4}};
  std::mt19937 rng(4242);
  int64_t compared = 0;
  for (const auto& t : tunings) {
    cd::set_gemv_tuning(t.first, t.second);
    for (const Case& c : shapes) {
      for (int64_t m : row_counts) {
        if (t.first != 0 && m > 9 && m != 17 && m != 40) continue;  // forced tunings: a few row counts
        const Weights w = random_weights(rng, c.f, c.n, c.k, c.wb);
        std::vector<float> x = random_block_activations(rng, m, c.k);
        for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1.0f + 1.0f / 512;  // mantissas BF16 drops
        DeviceBuffer<float> dx(x);
        DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
        for (int flags = 1; flags < 4; ++flags) {
          const bool bin = flags & 1, bout = flags & 2;
          SCOPED_TRACE(::testing::Message() << "fmt=" << int(c.f) << " m=" << m << " n=" << c.n << " k=" << c.k
                                            << " ab=" << c.ab << " bf16_in=" << bin << " bf16_round_out=" << bout
                                            << " split=" << t.first << " chunk=" << t.second);
          BlockLinearParams p;
          p.m = m, p.n = c.n, p.k = c.k, p.format = c.f, p.w_block = c.wb, p.act_block = c.ab;
          p.w = dw.get(), p.w_scale = ds.get();
          const size_t ny = size_t(m * c.n), nq = size_t(m * c.k), ns = size_t(m * c.k / 32);
          DeviceBuffer<float> xcopy(x), y_ref(ny), y_fused(ny), y_ref_pq(ny), y_fused_pq(ny);
          DeviceBuffer<float> xs0(ns), xs1(ns);
          DeviceBuffer<uint8_t> xq0(nq), xq1(nq);
          // Unfused: the former model sequence, x quantised inside and pre-quantised.
          if (bin) {
            ASSERT_EQ(cd::launch_quant_sim(xcopy.get(), m, c.k, c.k, 1, cd::QuantSim::kBf16, nullptr), cudaSuccess);
          }
          p.x = xcopy.get(), p.y = y_ref.get();
          FS_ASSERT_OK(block_linear_cuda(p, nullptr));
          FS_ASSERT_OK(gemv_quantize_cuda(xcopy.get(), m, c.k, c.ab, false, xq0.get(), xs0.get(), nullptr));
          p.xq = xq0.get(), p.xs = xs0.get(), p.y = y_ref_pq.get();
          FS_ASSERT_OK(block_linear_cuda(p, nullptr));
          if (bout) {
            ASSERT_EQ(cd::launch_quant_sim(y_ref.get(), m, c.n, c.n, 1, cd::QuantSim::kBf16, nullptr), cudaSuccess);
            ASSERT_EQ(cd::launch_quant_sim(y_ref_pq.get(), m, c.n, c.n, 1, cd::QuantSim::kBf16, nullptr), cudaSuccess);
          }
          // Fused, x quantised inside and pre-quantised with bf16_in.
          p.x = dx.get(), p.xq = nullptr, p.xs = nullptr, p.y = y_fused.get();
          p.bf16_in = bin, p.bf16_round_out = bout;
          FS_ASSERT_OK(block_linear_cuda(p, nullptr));
          FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), m, c.k, c.ab, bin, xq1.get(), xs1.get(), nullptr));
          p.xq = xq1.get(), p.xs = xs1.get(), p.y = y_fused_pq.get();
          FS_ASSERT_OK(block_linear_cuda(p, nullptr));
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_TRUE(xq0.to_host() == xq1.to_host()) << "pre-quantised codes";
          const auto s0 = xs0.to_host(), s1 = xs1.to_host();
          ASSERT_EQ(0, std::memcmp(s0.data(), s1.data(), s1.size() * sizeof(float))) << "pre-quantised scales";
          const auto want = y_ref.to_host(), got = y_fused.to_host();
          const auto want_pq = y_ref_pq.to_host(), got_pq = y_fused_pq.to_host();
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
          ASSERT_EQ(0, std::memcmp(want_pq.data(), got_pq.data(), got.size() * sizeof(float))) << "pre-quantised";
          ASSERT_EQ(0, std::memcmp(got.data(), got_pq.data(), got.size() * sizeof(float))) << "pre-quantised vs inside";
          ASSERT_TRUE(dx.to_host() == x) << "x was modified";
          // The CPU twin with the same flags, and its |x|·|W| error scale.
          std::vector<float> ref(got.size()), bound(got.size());
          std::vector<float> xa(x);
          for (auto& v : xa) v = std::fabs(v);
          const std::vector<uint8_t> wa = abs_codes(w.codes, c.f);
          p.xq = nullptr, p.xs = nullptr;
          p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data(), p.y = ref.data();
          FS_ASSERT_OK(block_linear_ref(p));
          p.x = xa.data(), p.w = wa.data(), p.y = bound.data(), p.bf16_round_out = false;
          FS_ASSERT_OK(block_linear_ref(p));
          for (size_t i = 0; i < got.size(); ++i) {
            // One BF16 ulp of slack where the output is rounded (the GEMV's FP32 sum may sit on
            // the other side of a BF16 rounding boundary than the twin's).
            const double slack = bout ? std::fabs(double(ref[i])) * (1.0 / 128) : 0.0;
            ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-4 * bound[i] + slack + 1e-30)
                << "output " << i << " gpu " << got[i] << " twin " << ref[i];
            if (bout) {
              ASSERT_EQ(got[i], round_bf16(got[i])) << "output " << i << " not a BF16 value";
            }
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 150);
}

TEST(CudaBlockLinear, RejectsBadShapesWithNamedField) {
  BlockLinearParams p;
  float dummy = 0;
  uint8_t b = 0;
  p.x = &dummy, p.y = &dummy, p.w = &b, p.w_scale = &b, p.m = 1, p.n = 4, p.k = 48;
  Status s = block_linear_ref(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("k=48"), std::string::npos) << s.message();
  p.k = 64, p.act_block = 64;
  s = validate(p);
  EXPECT_NE(s.message().find("act_block"), std::string::npos) << s.message();
  p.act_block = 128;
  EXPECT_FALSE(validate(p).ok());  // k=64 not a multiple of 128
}

// Random routing of `tokens` tokens to `topk` distinct experts each, grouped by expert.
struct Routing {
  std::vector<int32_t> group_expert, group_start, pair_row;
  std::vector<float> pair_weight;
};
Routing random_routing(std::mt19937& rng, int tokens, int topk, int n_experts) {
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(n_experts));
  std::vector<int32_t> ids(static_cast<size_t>(n_experts));
  for (int t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < topk; ++i) by_expert[size_t(ids[size_t(i)])].push_back(t);
  }
  Routing r;
  r.group_start.push_back(0);
  std::uniform_real_distribution<float> wd(0.1f, 1.5f);
  for (int e = 0; e < n_experts; ++e) {
    if (by_expert[size_t(e)].empty()) continue;
    r.group_expert.push_back(e);
    for (int32_t t : by_expert[size_t(e)]) r.pair_row.push_back(t), r.pair_weight.push_back(wd(rng));
    r.group_start.push_back(int32_t(r.pair_row.size()));
  }
  return r;
}

void run_expert_case(WeightFormat f, int tokens, int topk, int n_experts, int64_t n, int64_t k,
                     float limit, uint32_t seed, std::vector<float>* out = nullptr) {
  SCOPED_TRACE(::testing::Message() << "fmt=" << int(f) << " tokens=" << tokens << " topk=" << topk
                                    << " n=" << n << " k=" << k);
  std::mt19937 rng(seed);
  const Routing r = random_routing(rng, tokens, topk, n_experts);
  const int64_t cb = weight_code_bytes(f, n, k), sb = weight_scale_bytes(f, n, k, 32);
  const Weights wg = random_weights(rng, f, n * n_experts, k, 32);
  const Weights wu = random_weights(rng, f, n * n_experts, k, 32);
  std::vector<float> x = random_block_activations(rng, tokens, k);
  for (auto& v : x) v *= 0.05f;  // keep gate/up inside the SwiGLU's sensitive range
  ExpertGemvParams p;
  p.x = x.data(), p.w = wg.codes.data(), p.w_scale = wg.scales.data();
  p.w_up = wu.codes.data(), p.w_up_scale = wu.scales.data();
  p.expert_stride = cb, p.expert_scale_stride = sb;
  p.group_expert = r.group_expert.data(), p.group_start = r.group_start.data();
  p.pair_row = r.pair_row.data(), p.pair_weight = r.pair_weight.data();
  p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = int64_t(r.pair_row.size());
  p.n_experts = n_experts, p.n = n, p.k = k, p.format = f, p.swiglu_limit = limit;
  std::vector<float> ref(static_cast<size_t>(p.n_pairs * n));
  p.y = ref.data();
  FS_ASSERT_OK(expert_gemv_ref(p, tokens));

  DeviceBuffer<float> dx(x), dy(ref.size()), dpw(r.pair_weight);
  DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales);
  DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
  p.x = dx.get(), p.w = dwg.get(), p.w_scale = dsg.get(), p.w_up = dwu.get(), p.w_up_scale = dsu.get();
  p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = dpr.get();
  p.pair_weight = dpw.get(), p.y = dy.get();
  FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dy.to_host();
  double mean_abs = 0;
  for (float v : ref) mean_abs += std::fabs(v);
  mean_abs /= double(ref.size());
  ASSERT_GT(mean_abs, 0);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "pair output " << i << " not written";
    ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-3 * (std::fabs(ref[i]) + mean_abs))
        << "pair output " << i << " gpu " << got[i] << " ref " << ref[i];
  }
  if (out) *out = got;
}

TEST(CudaExpertGemv, FusedSwigluMatchesCpuTwin) {
  FS_REQUIRE_GPU();
  run_expert_case(WeightFormat::kFp4, 1, 6, 11, 96, 512, 7.0f, 11);
  run_expert_case(WeightFormat::kFp4, 6, 6, 13, 200, 2304, 0.0f, 12);
  run_expert_case(WeightFormat::kFp4, 20, 2, 3, 45, 160, 7.0f, 13);  // groups of > 16 pairs
  run_expert_case(WeightFormat::kFp8, 3, 1, 2, 70, 384, 7.0f, 14);   // shared-expert style
}

TEST(CudaExpertGemv, DownProjectionPerPairRows) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(21);
  const int n_experts = 7, tokens = 5, topk = 3;
  const int64_t n = 130, k = 2304;
  const Routing r = random_routing(rng, tokens, topk, n_experts);
  const int64_t pairs = int64_t(r.pair_row.size());
  const Weights w = random_weights(rng, WeightFormat::kFp4, n * n_experts, k, 32);
  const std::vector<float> h = random_block_activations(rng, pairs, k);
  ExpertGemvParams p;
  p.x = h.data(), p.w = w.codes.data(), p.w_scale = w.scales.data();
  p.expert_stride = weight_code_bytes(WeightFormat::kFp4, n, k);
  p.expert_scale_stride = weight_scale_bytes(WeightFormat::kFp4, n, k, 32);
  p.group_expert = r.group_expert.data(), p.group_start = r.group_start.data();
  p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = n_experts;
  p.n = n, p.k = k;
  std::vector<float> ref(static_cast<size_t>(pairs * n));
  p.y = ref.data();
  FS_ASSERT_OK(expert_gemv_ref(p, pairs));
  DeviceBuffer<float> dh(h), dy(ref.size());
  DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
  DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start);
  p.x = dh.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy.get();
  p.group_expert = dge.get(), p.group_start = dgs.get();
  FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = dy.to_host();
  double scale = 0;
  for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-4 * scale) << i;
}

// Expert parallel: a group whose expert is -1 (another rank's expert, as tp_remap_experts marks
// it) writes zeros and reads no weights, on the device and in the twin; the other groups are as
// before. Decode (one pair per group, the k split over a cluster) and grouped (several pairs).
TEST(CudaExpertGemv, OtherRanksExpertGroupsGiveZeros) {
  FS_REQUIRE_GPU();
  for (const int tokens : {1, 9}) {
    SCOPED_TRACE(tokens);
    std::mt19937 rng(31 + tokens);
    const int n_experts = 5, topk = 3;
    const int64_t n = 96, k = 2304;
    Routing r = random_routing(rng, tokens, topk, n_experts);
    for (size_t g = 0; g < r.group_expert.size(); g += 2) r.group_expert[g] = -1;
    const int64_t pairs = int64_t(r.pair_row.size());
    const Weights w = random_weights(rng, WeightFormat::kFp4, n * n_experts, k, 32);
    const std::vector<float> x = random_block_activations(rng, tokens, k);
    ExpertGemvParams p;
    p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data();
    p.expert_stride = weight_code_bytes(WeightFormat::kFp4, n, k);
    p.expert_scale_stride = weight_scale_bytes(WeightFormat::kFp4, n, k, 32);
    p.group_expert = r.group_expert.data(), p.group_start = r.group_start.data(), p.pair_row = r.pair_row.data();
    p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = n_experts;
    p.n = n, p.k = k;
    std::vector<float> ref(static_cast<size_t>(pairs * n), std::nanf(""));
    p.y = ref.data();
    FS_ASSERT_OK(expert_gemv_ref(p, tokens));
    DeviceBuffer<float> dx(x), dy(std::vector<float>(ref.size(), std::nanf("")));
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy.get();
    p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = dpr.get();
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dy.to_host();
    double scale = 0;
    for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
    ASSERT_GT(scale, 0);
    int64_t zeros = 0;
    for (size_t g = 0; g < r.group_expert.size(); ++g)
      for (int64_t i = r.group_start[g]; i < r.group_start[g + 1]; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = size_t(i * n + j);
          if (r.group_expert[g] < 0) {
            ASSERT_EQ(ref[at], 0.0f);
            ASSERT_EQ(got[at], 0.0f) << "pair " << i << " of another rank's expert";
            ++zeros;
          } else {
            ASSERT_LE(std::fabs(double(got[at]) - ref[at]), 1e-4 * scale) << at;
          }
        }
    EXPECT_GT(zeros, 0);
  }
}

// Every forced k split (cluster of 1..8 CTAs summing disjoint k ranges through distributed
// shared memory) and every k-chunk width gives the twin's result, uneven splits included.
TEST(CudaBlockLinear, EveryKSplitAndChunkMatchesTwin) {
  FS_REQUIRE_GPU();
  const LinCase cases[] = {
      {WeightFormat::kFp8, 1, 70, 2304, 32, 32},  // 72 blocks: uneven splits for 5, 7
      {WeightFormat::kFp8, 6, 45, 1280, 32, 32},
      {WeightFormat::kFp4, 3, 33, 2304, 32, 32},
      {WeightFormat::kFp8, 12, 40, 1024, 128, 128},  // V4 blocks: chunk stays 4
  };
  uint32_t seed = 100;
  for (int split = 1; split <= 8; ++split) {
    for (int chunk : {1, 2, 4}) {
      SCOPED_TRACE(::testing::Message() << "split=" << split << " chunk=" << chunk);
      detail::set_gemv_tuning(split, chunk);
      for (const auto& c : cases) run_linear_case(c, seed++);
    }
  }
  detail::set_gemv_tuning(0, 0);
}

// Two matrices stacked in one launch (BlockLinearParams::y2 / n2, wq_a + wkv in the model): the
// first matrix's rows land in y, the second's in y2, each bit for bit what that matrix launched
// alone gives with the stack's tuning shape (tune_n), also over more tokens through the token
// passes and the tiled kernel on pre-quantised x (which the model runs for wider steps), with
// BF16-rounded outputs and V4's 128-blocks. The CPU twin's split output equals its one-output
// rows exactly, and the GPU is within the twin's bound. Launches the stacked kernels do not take
// (more than 8 tokens, pre-quantised x, FP4) are refused.
TEST(CudaBlockLinear, StackedPairEqualsTheTwoLaunches) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t m, n1, n2, k, block;
    bool round_out;
  };
  const Case cases[] = {
      {1, 96, 33, 640, 32, false}, {6, 96, 33, 640, 32, true},    {8, 1280, 512, 1024, 32, true},
      {3, 64, 70, 384, 32, false}, {8, 128, 17, 512, 32, true},    {5, 256, 100, 512, 128, false},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n1=" << c.n1 << " n2=" << c.n2 << " k=" << c.k
                                      << " block=" << c.block << " round=" << c.round_out);
    std::mt19937 rng(seed++);
    const int64_t n = c.n1 + c.n2, wide = 200;  // wide: tokens of the alone launches over xq
    const Weights w = random_weights(rng, WeightFormat::kFp8, n, c.k, c.block);
    const std::vector<float> xw = random_block_activations(rng, wide, c.k);
    const std::vector<float> x(xw.begin(), xw.begin() + c.m * c.k);  // the stacked launch's tokens
    BlockLinearParams p;
    p.m = c.m, p.n = n, p.k = c.k, p.format = WeightFormat::kFp8, p.w_block = c.block, p.act_block = c.block;
    p.bf16_round_out = c.round_out;
    // CPU twin: the stacked launch's split output against its one-output rows.
    std::vector<float> whole(size_t(c.m * n)), y1(size_t(c.m * c.n1)), y2(size_t(c.m * c.n2));
    p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data(), p.y = whole.data();
    FS_ASSERT_OK(block_linear_ref(p));
    p.y = y1.data(), p.y2 = y2.data(), p.n2 = c.n2;
    FS_ASSERT_OK(block_linear_ref(p));
    for (int64_t t = 0; t < c.m; ++t)
      for (int64_t r = 0; r < n; ++r) {
        const float split = r < c.n1 ? y1[size_t(t * c.n1 + r)] : y2[size_t(t * c.n2 + r - c.n1)];
        ASSERT_EQ(std::memcmp(&split, &whole[size_t(t * n + r)], 4), 0) << "cpu token " << t << " row " << r;
      }
    // GPU: the stacked launch; then each matrix alone with the stack's tuning shape, over the same
    // tokens (x quantised inside) and over `wide` tokens of pre-quantised x (token passes, tiled).
    DeviceBuffer<float> dx(xw), dy1(y1.size()), dy2(y2.size());
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dxq(size_t(wide * c.k));
    DeviceBuffer<float> dxs(size_t(wide * c.k / 32));
    FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), wide, c.k, c.block, false, dxq.get(), dxs.get(), nullptr));
    BlockLinearParams g = p;
    g.x = dx.get(), g.w = dw.get(), g.w_scale = ds.get(), g.y = dy1.get(), g.y2 = dy2.get(), g.tune_n = n;
    FS_ASSERT_OK(block_linear_cuda(g, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> s1 = dy1.to_host(), s2 = dy2.to_host();
    for (const int mode : {0, 1, 2}) {  // alone: x inside, token passes over xq, tiled over xq
      SCOPED_TRACE(::testing::Message() << "alone, mode " << mode);
      const int64_t m = mode == 0 ? c.m : mode == 1 ? 40 : wide;
      BlockLinearParams ga = g;
      ga.y2 = nullptr, ga.n2 = 0, ga.m = m;
      if (mode > 0) ga.xq = dxq.get(), ga.xs = dxs.get(), ga.tiled = mode == 2;
      BlockLinearParams gb = ga;
      DeviceBuffer<float> da(size_t(m * c.n1)), db(size_t(m * c.n2));
      ga.n = c.n1, ga.y = da.get();
      gb.n = c.n2, gb.y = db.get();
      gb.w = dw.get() + c.n1 * c.k, gb.w_scale = ds.get() + (c.n1 / c.block) * (c.k / c.block);
      FS_ASSERT_OK(block_linear_cuda(ga, nullptr));
      FS_ASSERT_OK(block_linear_cuda(gb, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> a = da.to_host(), b = db.to_host();
      for (size_t i = 0; i < s1.size(); ++i)  // the first c.m tokens' rows
        ASSERT_EQ(std::memcmp(&s1[i], &a[i], 4), 0) << "first matrix, output " << i << ": " << s1[i] << " vs " << a[i];
      for (size_t i = 0; i < s2.size(); ++i)
        ASSERT_EQ(std::memcmp(&s2[i], &b[i], 4), 0) << "second matrix, output " << i << ": " << s2[i] << " vs " << b[i];
    }
    // Within the twin's bound (the error scale: the twin on |x|, |W|).
    std::vector<float> xa(x), bound(whole.size());
    for (auto& v : xa) v = std::fabs(v);
    const std::vector<uint8_t> wa = abs_codes(w.codes, WeightFormat::kFp8);
    BlockLinearParams pb = p;
    pb.y2 = nullptr, pb.n2 = 0, pb.bf16_round_out = false;
    pb.x = xa.data(), pb.w = wa.data(), pb.y = bound.data();
    FS_ASSERT_OK(block_linear_ref(pb));
    const double ulp = c.round_out ? 1.0 / 128 : 0;  // one BF16 rounding step apart at most
    for (int64_t t = 0; t < c.m; ++t)
      for (int64_t r = 0; r < n; ++r) {
        const float got = r < c.n1 ? s1[size_t(t * c.n1 + r)] : s2[size_t(t * c.n2 + r - c.n1)];
        const double ref = whole[size_t(t * n + r)], mag = bound[size_t(t * n + r)];
        ASSERT_LE(std::fabs(got - ref), 1e-4 * mag + ulp * std::fabs(ref) + 1e-30) << "token " << t << " row " << r;
      }
    // What the stacked kernels do not take is refused, naming the limit.
    BlockLinearParams over = g;
    over.m = 9;
    EXPECT_NE(block_linear_cuda(over, nullptr).message().find("at most 8 token rows"), std::string::npos);
    over.m = c.m, over.xq = dxq.get(), over.xs = dxs.get();
    EXPECT_FALSE(block_linear_cuda(over, nullptr).ok());
  }
  // Bad stacks are refused with the field named.
  BlockLinearParams bad;
  float dummy = 0;
  uint8_t byte = 0;
  bad.x = &dummy, bad.y = &dummy, bad.w = &byte, bad.w_scale = &byte, bad.m = 1, bad.n = 64, bad.k = 64;
  bad.n2 = 8;  // y2 missing
  EXPECT_NE(validate(bad).message().find("y2"), std::string::npos);
  bad.y2 = &dummy, bad.n2 = 64;  // nothing left for y
  EXPECT_NE(validate(bad).message().find("n2"), std::string::npos);
  bad.n2 = 8, bad.tune_n = -1;
  EXPECT_NE(validate(bad).message().find("tune_n"), std::string::npos);
  bad.tune_n = 72;
  EXPECT_TRUE(validate(bad).ok()) << validate(bad).message();
}

TEST(CudaExpertGemv, FusedSwigluEveryKSplit) {
  FS_REQUIRE_GPU();
  for (int split : {1, 2, 3, 8}) {
    for (int chunk : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "split=" << split << " chunk=" << chunk);
      detail::set_gemv_tuning(split, chunk);
      run_expert_case(WeightFormat::kFp4, 6, 6, 13, 200, 2304, 7.0f, 40 + split);
      run_expert_case(WeightFormat::kFp8, 3, 1, 2, 70, 384, 7.0f, 50 + split);
      run_expert_case(WeightFormat::kFp4, 20, 2, 3, 45, 160, 7.0f, 60 + split);  // groups of > 8 pairs
    }
  }
  detail::set_gemv_tuning(0, 0);
}

// The grouped expert GEMV as the model's routed experts run it (GpuModel::moe_native: plain
// projections, MXFP4 weights, FP8 activation blocks of 32 (V4.1) or 128 (V4), the k split fixed
// by split_groups = top-k), measured as CudaBlockLinear.ErrorAgainstTheExactDotInUnitsOfTheAbsoluteSum
// measures the block-scaled linear: |result − exact dot of the quantised operands| / Σ|x_q·w| for
// the GPU and for the CPU twin, p50 / p99 / max printed (the whole-model bound perturbs every dot
// by 1e-7 of Σ|x_q·w|; on the well-conditioned checkpoints nearly all of that bound is the routed
// experts', docs/cuda.md "Whole-model parity"). Asserts the GPU within 1e-5 of Σ|x_q·w|.
TEST(CudaExpertGemv, ErrorAgainstTheExactDotInUnitsOfTheAbsoluteSum) {
  FS_REQUIRE_GPU();
  struct Shape {
    int tokens, topk, n_experts;
    int64_t n, k, act_block;
  };
  for (const Shape& sh : {Shape{1, 6, 16, 1024, 4096, 32}, Shape{6, 6, 16, 1024, 4096, 32},
                          Shape{1, 6, 16, 4096, 1024, 32}, Shape{1, 6, 16, 1024, 4096, 128}}) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << sh.tokens << " n=" << sh.n << " k=" << sh.k
                                      << " act_block=" << sh.act_block);
    std::mt19937 rng(uint32_t(sh.k + sh.n + sh.tokens + sh.act_block));
    const Routing r = random_routing(rng, sh.tokens, sh.topk, sh.n_experts);
    const WeightFormat f = WeightFormat::kFp4;
    const int64_t cb = weight_code_bytes(f, sh.n, sh.k), sb = weight_scale_bytes(f, sh.n, sh.k, 32);
    const Weights w = random_weights(rng, f, sh.n * sh.n_experts, sh.k, 32);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(sh.tokens * sh.k));
    for (auto& v : x) v = nd(rng);
    ExpertGemvParams p;
    p.x = x.data(), p.w = w.codes.data(), p.w_scale = w.scales.data();
    p.expert_stride = cb, p.expert_scale_stride = sb;
    p.group_expert = r.group_expert.data(), p.group_start = r.group_start.data(), p.pair_row = r.pair_row.data();
    p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = int64_t(r.pair_row.size());
    p.n_experts = sh.n_experts, p.n = sh.n, p.k = sh.k, p.format = f, p.w_block = 32, p.act_block = sh.act_block;
    p.split_groups = sh.topk;
    std::vector<float> cpu(size_t(p.n_pairs * sh.n));
    p.y = cpu.data();
    FS_ASSERT_OK(expert_gemv_ref(p, sh.tokens));
    DeviceBuffer<float> dx(x), dy(cpu.size());
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales);
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy.get();
    p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = dpr.get();
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> gpu = dy.to_host();
    std::vector<float> xq(x);
    fp8_quant_dequant(xq.data(), sh.tokens, sh.k, sh.act_block);
    ErrorStats ec, eg;
    for (size_t g = 0; g + 1 < r.group_start.size(); ++g) {
      const int64_t e = r.group_expert[g];
      const uint8_t* codes = w.codes.data() + e * cb;
      const uint8_t* scales = w.scales.data() + e * sb;
      for (int32_t s = r.group_start[g]; s < r.group_start[g + 1]; ++s) {
        const float* xr = xq.data() + int64_t(r.pair_row[size_t(s)]) * sh.k;
        for (int64_t o = 0; o < sh.n; ++o) {
          double exact = 0, mag = 0;
          for (int64_t i = 0; i < sh.k; ++i) {
            const uint8_t nib = uint8_t((codes[o * (sh.k / 2) + i / 2] >> (4 * (i & 1))) & 0xF);
            const double wv = double(e2m1_to_f32(nib)) * double(e8m0_to_f32(scales[o * (sh.k / 32) + i / 32]));
            const double t = double(xr[i]) * wv;
            exact += t, mag += std::fabs(t);
          }
          if (mag == 0) continue;
          const size_t j = size_t(int64_t(s) * sh.n + o);
          ec.add(cpu[j], exact, mag);
          ASSERT_LE(eg.add(gpu[j], exact, mag), 1e-5)
              << "pair " << s << " output " << o << " gpu " << gpu[j] << " exact " << exact;
        }
      }
    }
    ASSERT_FALSE(eg.rel.empty());
    print_error_report(fmt::format("expert gemv fp4 tokens={} n={} k={} act_block={}", sh.tokens, sh.n, sh.k,
                                   sh.act_block),
                       ec, eg);
  }
}

// A case of the packed-expert tests: the routing (group 1's expert another rank's where asked) and
// random FP4 gate and up stacks of n_experts [n, k] matrices with their code and scale strides.
struct Fp4Case {
  Routing r;
  int64_t cb, sb;
  Weights wg, wu;
};
Fp4Case make_fp4_case(std::mt19937& rng, int tokens, int topk, int n_experts, int64_t n, int64_t k, bool other_rank) {
  const WeightFormat f = WeightFormat::kFp4;
  Fp4Case c;
  c.r = random_routing(rng, tokens, topk, n_experts);
  if (other_rank) c.r.group_expert[1] = -1;
  c.cb = weight_code_bytes(f, n, k), c.sb = weight_scale_bytes(f, n, k, 32);
  c.wg = random_weights(rng, f, n * n_experts, k, 32);
  c.wu = random_weights(rng, f, n * n_experts, k, 32);
  return c;
}

// got == want bit for bit, every output finite (a caller that fills the output with NaN first
// catches a missing store) and more than half of them nonzero.
void expect_written_bitwise(const std::vector<float>& want, const std::vector<float>& got, const char* a, const char* b) {
  ASSERT_EQ(want.size(), got.size());
  int64_t nonzero = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written";
    ASSERT_EQ(std::memcmp(&want[i], &got[i], 4), 0) << "output " << i << ": " << a << " " << want[i] << " " << b << " " << got[i];
    nonzero += got[i] != 0;
  }
  ASSERT_GT(nonzero, int64_t(want.size() / 2));
}

// FP4 experts in the fragment order (ExpertGemvParams::w_packed, ops/fp4_fragments.h): bitwise
// the row-major launch's outputs at every k split and chunk, for decode groups (one-token passes,
// the gated SwiGLU), a verify block, groups of more than 8 pairs (16-token passes), another rank's
// expert, the down projection over per-pair rows, and pre-quantised x in groups of more than 16
// rows (32-token passes; the row-major launch without the tiled kernel, which packed launches
// never take). Every output written and finite. Packed launches that break the layout's rules
// are refused.
TEST(CudaGemvPacked, SameBitsAsRowMajor) {
  FS_REQUIRE_GPU();
  struct Case {
    int tokens, topk, n_experts;
    int64_t n, k;
    bool gated, per_pair, xq, other_rank;
  };
  const Case cases[] = {
      {1, 6, 13, 96, 512, true, false, false, false},    // decode
      {6, 6, 16, 64, 2304, true, false, false, true},    // verify block, one group another rank's
      {20, 2, 3, 160, 192, true, false, false, false},   // groups of > 8 pairs
      {5, 3, 7, 128, 2304, false, true, false, false},   // down: per-pair rows
      {40, 2, 2, 64, 256, false, false, true, false},    // pre-quantised x, 32-token passes
  };
  const WeightFormat f = WeightFormat::kFp4;
  int compared = 0;
  for (const Case& c : cases) {
    std::mt19937 rng(uint32_t(c.tokens * 131 + c.n + c.k));
    const Fp4Case fc = make_fp4_case(rng, c.tokens, c.topk, c.n_experts, c.n, c.k, c.other_rank);
    const Routing& r = fc.r;
    const int64_t cb = fc.cb, sb = fc.sb;
    const Weights &wg = fc.wg, &wu = fc.wu;
    Weights pg = wg, pu = wu;
    for (int e = 0; e < c.n_experts; ++e) {
      FS_ASSERT_OK(pack_fp4_fragments(wg.codes.data() + e * cb, wg.scales.data() + e * sb, c.n, c.k,
                                      pg.codes.data() + e * cb, pg.scales.data() + e * sb));
      FS_ASSERT_OK(pack_fp4_fragments(wu.codes.data() + e * cb, wu.scales.data() + e * sb, c.n, c.k,
                                      pu.codes.data() + e * cb, pu.scales.data() + e * sb));
    }
    const int64_t pairs = int64_t(r.pair_row.size()), rows = c.per_pair ? pairs : c.tokens;
    std::vector<float> x = random_block_activations(rng, rows, c.k);
    for (auto& v : x) v *= 0.05f;
    DeviceBuffer<float> dx(x), dpw(r.pair_weight), dxs(size_t(rows * c.k / 32));
    DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales);
    DeviceBuffer<uint8_t> dpg(pg.codes), dpsg(pg.scales), dpu(pu.codes), dpsu(pu.scales), dxq(size_t(rows * c.k));
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    if (c.xq) FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), rows, c.k, 32, false, dxq.get(), dxs.get(), nullptr));
    for (int split : {0, 1, 2, 3, 8})
      for (int chunk : {0, 1, 2, 4}) {
        SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " n=" << c.n << " k=" << c.k << " gated="
                                          << c.gated << " xq=" << c.xq << " split=" << split << " chunk=" << chunk);
        detail::set_gemv_tuning(split, chunk);
        ExpertGemvParams p;
        p.x = dx.get(), p.group_expert = dge.get(), p.group_start = dgs.get();
        p.pair_row = c.per_pair ? nullptr : dpr.get();
        p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = c.n_experts;
        p.n = c.n, p.k = c.k, p.format = f, p.expert_stride = cb, p.expert_scale_stride = sb, p.swiglu_limit = 7.0f;
        if (c.xq) p.xq = dxq.get(), p.xs = dxs.get(), p.tiled = false;
        DeviceBuffer<float> d0(size_t(pairs * c.n)), d1(size_t(pairs * c.n));
        p.w = dwg.get(), p.w_scale = dsg.get(), p.y = d0.get();
        if (c.gated) p.w_up = dwu.get(), p.w_up_scale = dsu.get(), p.pair_weight = dpw.get();
        FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
        p.w = dpg.get(), p.w_scale = dpsg.get(), p.y = d1.get(), p.w_packed = true;
        if (c.gated) p.w_up = dpu.get(), p.w_up_scale = dpsu.get();
        FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_NO_FATAL_FAILURE(expect_written_bitwise(d0.to_host(), d1.to_host(), "row-major", "packed"));
        ++compared;
      }
    // Refusals: an expert stride off the 16-byte grid, a shape outside the fragment order.
    detail::set_gemv_tuning(0, 0);
    ExpertGemvParams bad;
    DeviceBuffer<float> dy(size_t(pairs * c.n));
    bad.x = dx.get(), bad.group_expert = dge.get(), bad.group_start = dgs.get(), bad.pair_row = dpr.get();
    bad.n_groups = int64_t(r.group_expert.size()), bad.n_pairs = pairs, bad.n_experts = c.n_experts;
    bad.n = c.n, bad.k = c.k, bad.format = f, bad.w = dpg.get(), bad.w_scale = dpsg.get(), bad.y = dy.get();
    bad.expert_stride = cb - 8, bad.expert_scale_stride = sb, bad.w_packed = true;
    EXPECT_FALSE(expert_gemv_cuda(bad, nullptr).ok()) << "expert stride not a multiple of 16";
    bad.expert_stride = cb, bad.n = c.n - 32 + 8;
    EXPECT_FALSE(expert_gemv_cuda(bad, nullptr).ok()) << "n not a multiple of 32";
  }
  detail::set_gemv_tuning(0, 0);
  EXPECT_EQ(compared, 5 * 20);
}

// The ring kernel (ExpertGemvParams::ring_stages: the packed FP4 weights streamed through a
// shared-memory ring by bulk copies) gives the register kernel's bits at every stage count and k
// split: decode (one token, gated), a verify block with another rank's expert, groups of more than
// 8 pairs (several passes through the ring), the down projection over per-pair rows; k splits
// whose ranks start at odd chunks (the x scales' 16-byte superset copies). Each ring launch is
// counted (it ran), and a launch it does not take (x not pre-quantised) still gives the bits.
TEST(CudaGemvPacked, RingSameBitsAsRegisters) {
  FS_REQUIRE_GPU();
  struct Case {
    int tokens, topk, n_experts;
    int64_t n, k;
    bool gated, per_pair, other_rank;
  };
  const Case cases[] = {
      {1, 6, 13, 96, 512, true, false, false},     // decode
      {6, 6, 16, 64, 2304, true, false, true},     // verify block, one group another rank's
      {16, 1, 2, 160, 384, true, false, false},    // 8 pairs a group on average: some take 2+ passes
      {5, 3, 7, 128, 2304, false, true, false},    // down: per-pair rows
  };
  const WeightFormat f = WeightFormat::kFp4;
  int compared = 0;
  for (const Case& c : cases) {
    std::mt19937 rng(uint32_t(c.tokens * 71 + c.n + c.k));
    // Random bytes serve as the fragment order directly (the ring and the register kernel read them alike).
    const Fp4Case fc = make_fp4_case(rng, c.tokens, c.topk, c.n_experts, c.n, c.k, c.other_rank);
    const Routing& r = fc.r;
    const int64_t cb = fc.cb, sb = fc.sb;
    const Weights &pg = fc.wg, &pu = fc.wu;
    const int64_t pairs = int64_t(r.pair_row.size()), rows = c.per_pair ? pairs : c.tokens;
    int64_t most = 0;
    for (size_t g = 0; g + 1 < r.group_start.size(); ++g) most = std::max<int64_t>(most, r.group_start[g + 1] - r.group_start[g]);
    if (c.tokens == 16) {
      ASSERT_GT(most, 8) << "the routing should give a group of several passes";
    }
    std::vector<float> x = random_block_activations(rng, rows, c.k);
    for (auto& v : x) v *= 0.05f;
    DeviceBuffer<float> dx(x), dpw(r.pair_weight), dxs(size_t(rows * c.k / 32));
    DeviceBuffer<uint8_t> dpg(pg.codes), dpsg(pg.scales), dpu(pu.codes), dpsu(pu.scales), dxq(size_t(rows * c.k));
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), rows, c.k, 32, false, dxq.get(), dxs.get(), nullptr));
    for (int split : {0, 1, 3, 8}) {
      detail::set_gemv_tuning(split, 2);
      ExpertGemvParams p;
      p.x = dx.get(), p.group_expert = dge.get(), p.group_start = dgs.get();
      p.pair_row = c.per_pair ? nullptr : dpr.get();
      p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = c.n_experts;
      p.n = c.n, p.k = c.k, p.format = f, p.expert_stride = cb, p.expert_scale_stride = sb, p.swiglu_limit = 7.0f;
      p.xq = dxq.get(), p.xs = dxs.get(), p.tiled = false, p.w_packed = true;
      p.w = dpg.get(), p.w_scale = dpsg.get();
      if (c.gated) p.w_up = dpu.get(), p.w_up_scale = dpsu.get(), p.pair_weight = dpw.get();
      DeviceBuffer<float> d0(std::vector<float>(size_t(pairs * c.n), std::nanf("")));
      p.y = d0.get();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> want = d0.to_host();
      for (int stages : {1, 2, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " n=" << c.n << " k=" << c.k
                                          << " gated=" << c.gated << " split=" << split << " stages=" << stages);
        DeviceBuffer<float> d1(std::vector<float>(size_t(pairs * c.n), std::nanf("")));
        p.y = d1.get(), p.ring_stages = stages;
        const int64_t before = detail::gemv_ring_launches();
        FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(detail::gemv_ring_launches(), before + 1) << "the ring kernel did not run";
        ASSERT_NO_FATAL_FAILURE(expect_written_bitwise(want, d1.to_host(), "registers", "ring"));
        ++compared;
      }
      // x quantised inside (no xq): the ring does not apply; the register kernel's bits.
      DeviceBuffer<float> d2(std::vector<float>(size_t(pairs * c.n), std::nanf("")));
      p.y = d2.get(), p.ring_stages = 4, p.xq = nullptr, p.xs = nullptr;
      const int64_t before = detail::gemv_ring_launches();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(detail::gemv_ring_launches(), before);
      EXPECT_TRUE(d2.to_host() == want);
      p.xq = dxq.get(), p.xs = dxs.get(), p.ring_stages = 9;
      EXPECT_FALSE(expert_gemv_cuda(p, nullptr).ok()) << "9 ring stages";
      p.ring_stages = -1;
      EXPECT_FALSE(expert_gemv_cuda(p, nullptr).ok()) << "-1 ring stages";
    }
  }
  detail::set_gemv_tuning(0, 0);
  EXPECT_EQ(compared, 4 * 4 * 4);
}

// The device pack (the model's load-time pass over a stack of experts) == the host pack, byte for
// byte; refusals of bad shapes, misaligned codes and overlapping buffers.
TEST(CudaGemvPacked, DevicePackEqualsHostPack) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{32, 64}, {3 * 96, 320}, {2 * 2304, 5120}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    std::vector<uint8_t> codes(size_t(n * k / 2)), scales(size_t(n * k / 32));
    for (auto& c : codes) c = uint8_t(rng());
    for (auto& c : scales) c = uint8_t(rng());
    std::vector<uint8_t> hc(codes.size()), hs(scales.size());
    FS_ASSERT_OK(pack_fp4_fragments(codes.data(), scales.data(), n, k, hc.data(), hs.data()));
    DeviceBuffer<uint8_t> dc(codes), ds(scales), oc(codes.size()), os(scales.size());
    FS_ASSERT_OK(pack_fp4_fragments_cuda(dc.get(), ds.get(), n, k, oc.get(), os.get(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(oc.to_host() == hc);
    EXPECT_TRUE(os.to_host() == hs);
  }
  DeviceBuffer<uint8_t> a(4096), b(4096), s(256), t(256);
  EXPECT_FALSE(pack_fp4_fragments_cuda(a.get(), s.get(), 40, 64, b.get(), t.get(), nullptr).ok()) << "n";
  EXPECT_FALSE(pack_fp4_fragments_cuda(a.get(), s.get(), 32, 32, b.get(), t.get(), nullptr).ok()) << "k";
  EXPECT_FALSE(pack_fp4_fragments_cuda(a.get() + 4, s.get(), 32, 64, b.get(), t.get(), nullptr).ok()) << "alignment";
  EXPECT_FALSE(pack_fp4_fragments_cuda(a.get(), s.get(), 32, 64, a.get() + 512, t.get(), nullptr).ok()) << "overlap";
}

// The FP8 device pack and unpack (the model's load-time pass over dense FP8 matrices, and the
// row-major copy its prefill GEMMs read) == the host pack / unpack, byte for byte, and unpack
// inverts pack; refusals of bad shapes, misaligned codes and overlapping buffers.
TEST(CudaGemvPacked, Fp8DevicePackAndUnpackEqualHost) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(6);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{32, 32}, {96, 416}, {7 * 32, 1056}, {1024, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    std::vector<uint8_t> codes(size_t(n * k));
    for (auto& c : codes) c = uint8_t(rng());
    std::vector<uint8_t> hp(codes.size());
    FS_ASSERT_OK(pack_fp8_fragments(codes.data(), n, k, hp.data()));
    DeviceBuffer<uint8_t> dc(codes), dp(codes.size()), du(codes.size());
    FS_ASSERT_OK(pack_fp8_fragments_cuda(dc.get(), n, k, dp.get(), nullptr));
    FS_ASSERT_OK(unpack_fp8_fragments_cuda(dp.get(), n, k, du.get(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dp.to_host() == hp) << "device pack != host pack";
    EXPECT_TRUE(du.to_host() == codes) << "unpack(pack(w)) != w";
    EXPECT_FALSE(hp == codes) << "the order moved nothing";
  }
  DeviceBuffer<uint8_t> a(8192), b(8192);
  EXPECT_FALSE(pack_fp8_fragments_cuda(a.get(), 40, 64, b.get(), nullptr).ok()) << "n";
  EXPECT_FALSE(unpack_fp8_fragments_cuda(a.get(), 32, 48, b.get(), nullptr).ok()) << "k";
  EXPECT_FALSE(pack_fp8_fragments_cuda(a.get() + 4, 32, 64, b.get(), nullptr).ok()) << "alignment";
  EXPECT_FALSE(unpack_fp8_fragments_cuda(a.get(), 32, 64, a.get() + 1024, nullptr).ok()) << "overlap";
  EXPECT_FALSE(pack_fp8_fragments_cuda(nullptr, 32, 64, b.get(), nullptr).ok()) << "null";
}

// The BF16 expansion of FP4 experts in the fragment order (GemmExpandBf16Params::w_fragments, the
// prefill GEMM's route for packed experts) == the row-major expansion, BF16 for BF16, on the
// device and in the CPU twin, with skipped (row-less) matrices; and refused off the layout's shapes.
TEST(CudaGemvPacked, ExpandBf16ReadsTheFragmentOrder) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(8);
  const int64_t count = 3, n = 64, k = 192;
  Weights w = random_weights(rng, WeightFormat::kFp4, count * n, k, 32);
  Weights pk = w;
  FS_ASSERT_OK(pack_fp4_fragments(w.codes.data(), w.scales.data(), count * n, k, pk.codes.data(), pk.scales.data()));
  const std::vector<int32_t> rs = {0, 4, 4, 9};  // matrix 1 has no rows: skipped
  GemmExpandBf16Params p;
  p.count = count, p.n = n, p.k = k, p.w_format = WeightFormat::kFp4, p.w_block = 32;
  std::vector<uint16_t> cpu_rm(size_t(count * n * k), 0x7fff), cpu_fr(cpu_rm);
  p.w = w.codes.data(), p.w_scale = w.scales.data(), p.y = cpu_rm.data(), p.row_start = rs.data();
  FS_ASSERT_OK(gemm_expand_bf16_ref(p));
  p.w = pk.codes.data(), p.w_scale = pk.scales.data(), p.y = cpu_fr.data(), p.w_fragments = true;
  FS_ASSERT_OK(gemm_expand_bf16_ref(p));
  EXPECT_TRUE(cpu_rm == cpu_fr);
  DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dpw(pk.codes), dps(pk.scales);
  DeviceBuffer<uint16_t> y0(cpu_rm.size()), y1(cpu_rm.size());
  DeviceBuffer<int32_t> drs(rs);
  GemmExpandBf16Params g = p;
  g.row_start = drs.get();
  g.w = dw.get(), g.w_scale = ds.get(), g.y = y0.get(), g.w_fragments = false;
  FS_ASSERT_OK(gemm_expand_bf16_cuda(g, nullptr));
  g.w = dpw.get(), g.w_scale = dps.get(), g.y = y1.get(), g.w_fragments = true;
  FS_ASSERT_OK(gemm_expand_bf16_cuda(g, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> a = y0.to_host(), b = y1.to_host();
  for (int64_t e : {0, 2})  // the expanded matrices: equal to each other and to the twin
    for (int64_t i = e * n * k; i < (e + 1) * n * k; ++i) {
      ASSERT_EQ(a[size_t(i)], b[size_t(i)]) << "value " << i;
      ASSERT_EQ(a[size_t(i)], cpu_rm[size_t(i)]) << "value " << i;
    }
  g.n = 48;
  EXPECT_FALSE(gemm_expand_bf16_cuda(g, nullptr).ok()) << "n not a multiple of 32";
  g.n = n, g.w_format = WeightFormat::kFp8;
  EXPECT_FALSE(gemm_expand_bf16_cuda(g, nullptr).ok()) << "FP8";
}

// FP8 matrices in the fragment order (BlockLinearParams / ExpertGemvParams::w_packed): bitwise the
// row-major launch's outputs at every k split and chunk, for both scale tiles (32, 128), one-token
// and verify-sized launches, 16-token passes, pre-quantised x in 32-token passes (the row-major
// launch without the tiled kernel), and the shared expert's gated launch; every output written;
// the twin reads the packed matrix as the same matrix. A stacked launch (y2) and rows off the
// 32-row grid are refused with w_packed.
TEST(CudaGemvPacked, Fp8SameBitsAsRowMajor) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t m, n, k, block;
    bool xq;
  };
  int compared = 0;
  for (const Case c : {Case{1, 96, 256, 32, false}, Case{6, 1280, 1024, 128, false}, Case{20, 160, 384, 32, false},
                       Case{40, 64, 256, 32, true}}) {
    std::mt19937 rng(uint32_t(c.m * 7 + c.n + c.k));
    const Weights w = random_weights(rng, WeightFormat::kFp8, c.n, c.k, c.block);
    std::vector<uint8_t> pk(w.codes.size());
    FS_ASSERT_OK(pack_fp8_fragments(w.codes.data(), c.n, c.k, pk.data()));
    const std::vector<float> x = random_block_activations(rng, c.m, c.k);
    DeviceBuffer<float> dx(x), dxs(size_t(c.m * c.k / 32));
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dp(pk), dxq(size_t(c.m * c.k));
    if (c.xq) FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), c.m, c.k, c.block, false, dxq.get(), dxs.get(), nullptr));
    BlockLinearParams p;
    p.m = c.m, p.n = c.n, p.k = c.k, p.format = WeightFormat::kFp8, p.w_block = c.block, p.act_block = c.block;
    p.x = dx.get(), p.w_scale = ds.get();
    if (c.xq) p.xq = dxq.get(), p.xs = dxs.get(), p.tiled = false;
    for (int split : {0, 1, 2, 3, 8})
      for (int chunk : {0, 1, 2, 4}) {
        if (c.block == 128 && chunk != 0 && chunk != 4) continue;  // V4's act_block 128 takes 4 only
        SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " block=" << c.block
                                          << " split=" << split << " chunk=" << chunk);
        detail::set_gemv_tuning(split, chunk);
        DeviceBuffer<float> d0(size_t(c.m * c.n)), d1(size_t(c.m * c.n));
        BlockLinearParams a = p, b = p;
        a.w = dw.get(), a.y = d0.get();
        b.w = dp.get(), b.y = d1.get(), b.w_packed = true;
        FS_ASSERT_OK(block_linear_cuda(a, nullptr));
        FS_ASSERT_OK(block_linear_cuda(b, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> ya = d0.to_host(), yb = d1.to_host();
        for (size_t i = 0; i < ya.size(); ++i) {
          ASSERT_TRUE(std::isfinite(yb[i])) << "output " << i << " not written";
          ASSERT_EQ(std::memcmp(&ya[i], &yb[i], 4), 0) << "output " << i << ": " << ya[i] << " vs " << yb[i];
        }
        ++compared;
      }
    detail::set_gemv_tuning(0, 0);
    // The twin on the packed matrix: the row-major twin's bits.
    BlockLinearParams h = p;
    h.xq = nullptr, h.xs = nullptr;
    std::vector<float> ra(size_t(c.m * c.n)), rb(ra.size());
    h.x = x.data(), h.w = w.codes.data(), h.w_scale = w.scales.data(), h.y = ra.data();
    FS_ASSERT_OK(block_linear_ref(h));
    h.w = pk.data(), h.y = rb.data(), h.w_packed = true;
    FS_ASSERT_OK(block_linear_ref(h));
    ASSERT_EQ(0, std::memcmp(ra.data(), rb.data(), ra.size() * 4));
    // Refusals: a stacked output; rows off the 32-row grid.
    BlockLinearParams bad = p;
    DeviceBuffer<float> dy(size_t(c.m * c.n)), dy2(size_t(c.m * c.n));
    bad.w = dp.get(), bad.y = dy.get(), bad.w_packed = true, bad.xq = nullptr, bad.xs = nullptr;
    bad.y2 = dy2.get(), bad.n2 = 32;
    EXPECT_FALSE(block_linear_cuda(bad, nullptr).ok()) << "y2";
    bad.y2 = nullptr, bad.n2 = 0, bad.n = c.n - 8;
    EXPECT_FALSE(block_linear_cuda(bad, nullptr).ok()) << "n % 32";
  }
  EXPECT_GE(compared, 50);
  // The shared expert's gated launch (one group of every token), FP8 gate and up packed.
  {
    std::mt19937 rng(77);
    const int64_t n = 128, k = 512, m = 6;
    const Weights wg = random_weights(rng, WeightFormat::kFp8, n, k, 32), wu = random_weights(rng, WeightFormat::kFp8, n, k, 32);
    std::vector<uint8_t> pg(wg.codes.size()), pu(wu.codes.size());
    FS_ASSERT_OK(pack_fp8_fragments(wg.codes.data(), n, k, pg.data()));
    FS_ASSERT_OK(pack_fp8_fragments(wu.codes.data(), n, k, pu.data()));
    std::vector<float> x = random_block_activations(rng, m, k);
    for (auto& v : x) v *= 0.05f;
    const std::vector<int32_t> ge = {0}, gs = {0, int32_t(m)};
    DeviceBuffer<float> dx(x), d0(size_t(m * n)), d1(size_t(m * n));
    DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales), dpg(pg), dpu(pu);
    DeviceBuffer<int32_t> dge(ge), dgs(gs);
    ExpertGemvParams q;
    q.x = dx.get(), q.group_expert = dge.get(), q.group_start = dgs.get(), q.n_groups = 1, q.n_pairs = m;
    q.n_experts = 1, q.n = n, q.k = k, q.format = WeightFormat::kFp8, q.swiglu_limit = 7.0f;
    q.w_scale = dsg.get(), q.w_up_scale = dsu.get();
    ExpertGemvParams a = q, b = q;
    a.w = dwg.get(), a.w_up = dwu.get(), a.y = d0.get();
    b.w = dpg.get(), b.w_up = dpu.get(), b.y = d1.get(), b.w_packed = true;
    FS_ASSERT_OK(expert_gemv_cuda(a, nullptr));
    FS_ASSERT_OK(expert_gemv_cuda(b, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> ya = d0.to_host(), yb = d1.to_host();
    for (size_t i = 0; i < ya.size(); ++i) {
      ASSERT_TRUE(std::isfinite(yb[i])) << i;
      ASSERT_EQ(std::memcmp(&ya[i], &yb[i], 4), 0) << "shared expert output " << i;
    }
  }
}

TEST(CudaExpertGemv, TwinRejectsBadIndices) {
  std::vector<float> x(64, 1.0f), y(64);
  std::vector<uint8_t> w(64 * 32, 0x22), s(64 * 2, 127);
  std::vector<int32_t> ge = {5}, gs = {0, 1}, pr = {0};
  ExpertGemvParams p;
  p.x = x.data(), p.w = w.data(), p.w_scale = s.data(), p.y = y.data();
  p.group_expert = ge.data(), p.group_start = gs.data(), p.pair_row = pr.data();
  p.n_groups = 1, p.n_pairs = 1, p.n_experts = 2, p.n = 1, p.k = 64;
  p.expert_stride = 32, p.expert_scale_stride = 2;
  const Status st = expert_gemv_ref(p, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("group_expert[0]=5"), std::string::npos) << st.message();
}

// The grouped expert GEMV's bf16_round_out (the routed experts' gate, up and down projections in
// reference numerics) == the GEMV then quant_sim kBf16 on its output, memcmp-equal: decode-style
// groups of one pair (the cluster k split), grouped pairs (more pairs than experts), groups of more
// than 8 pairs, another rank's expert (zeros), the fused SwiGLU variant, and pre-quantised rows
// (xq / xs: prefill-sized groups, token rows through pair_row as for gate / up and per-pair rows as
// for down; also equal to the fused launch quantising inside); the twin with the same flag within
// its usual bound.
TEST(CudaExpertGemv, Bf16RoundOutEqualsGemvThenQuantSim) {
  FS_REQUIRE_GPU();
  namespace cd = detail;
  struct Case {
    WeightFormat f;
    int tokens, topk, n_experts;
    int64_t n, k;
    bool gated, other_rank, preq, per_pair;
  };
  const Case cases[] = {{WeightFormat::kFp4, 1, 6, 16, 200, 2304, false, false, false, false},
                        {WeightFormat::kFp4, 6, 6, 13, 96, 512, false, true, false, false},
                        {WeightFormat::kFp4, 20, 2, 3, 45, 160, false, false, false, false},
                        {WeightFormat::kFp8, 3, 1, 2, 70, 384, false, false, false, false},
                        {WeightFormat::kFp4, 5, 3, 7, 130, 2304, true, false, false, false},
                        {WeightFormat::kFp4, 40, 2, 3, 45, 160, false, false, true, false},
                        {WeightFormat::kFp4, 97, 6, 16, 96, 512, false, true, true, true},
                        {WeightFormat::kFp4, 64, 2, 4, 130, 1024, false, false, true, true}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "fmt=" << int(c.f) << " tokens=" << c.tokens << " topk=" << c.topk
                                      << " n=" << c.n << " k=" << c.k << " gated=" << c.gated
                                      << " preq=" << c.preq << " per_pair=" << c.per_pair);
    std::mt19937 rng(seed++);
    Routing r = random_routing(rng, c.tokens, c.topk, c.n_experts);
    if (c.other_rank) r.group_expert[0] = -1;
    const int64_t pairs = int64_t(r.pair_row.size());
    if (c.preq) {
      ASSERT_GT(pairs, 8 * int64_t(r.group_expert.size())) << "the case must take the pre-quantised passes";
    }
    const int64_t rows = c.per_pair ? pairs : c.tokens;
    const int64_t cb = weight_code_bytes(c.f, c.n, c.k), sb = weight_scale_bytes(c.f, c.n, c.k, 32);
    const Weights wg = random_weights(rng, c.f, c.n * c.n_experts, c.k, 32);
    const Weights wu = random_weights(rng, c.f, c.n * c.n_experts, c.k, 32);
    std::vector<float> x = random_block_activations(rng, rows, c.k);
    for (auto& v : x) v *= 0.05f;
    DeviceBuffer<float> dx(x), dpw(r.pair_weight), y0(size_t(pairs * c.n)), y1(size_t(pairs * c.n));
    DeviceBuffer<float> y2(size_t(pairs * c.n)), dxs(size_t(rows * c.k / 32));
    DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales), dxq(size_t(rows * c.k));
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    ExpertGemvParams p;
    p.x = dx.get(), p.w = dwg.get(), p.w_scale = dsg.get();
    if (c.gated) p.w_up = dwu.get(), p.w_up_scale = dsu.get(), p.pair_weight = dpw.get(), p.swiglu_limit = 7.0f;
    p.expert_stride = cb, p.expert_scale_stride = sb;
    p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = c.per_pair ? nullptr : dpr.get();
    p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = c.n_experts;
    p.n = c.n, p.k = c.k, p.format = c.f, p.split_groups = c.topk;
    if (c.preq) {
      FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), rows, c.k, 32, false, dxq.get(), dxs.get(), nullptr));
      p.xq = dxq.get(), p.xs = dxs.get();
    }
    p.y = y0.get();
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cd::launch_quant_sim(y0.get(), pairs, c.n, c.n, 1, cd::QuantSim::kBf16, nullptr), cudaSuccess);
    p.y = y1.get(), p.bf16_round_out = true;
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    p.xq = nullptr, p.xs = nullptr, p.y = y2.get();  // quantising inside
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto want = y0.to_host(), got = y1.to_host(), inside = y2.to_host();
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(inside.data(), got.data(), got.size() * sizeof(float)));
    // The twin with the same flag: outputs are BF16 values within the GEMV bound plus one BF16 ulp.
    std::vector<float> ref(got.size());
    p.x = x.data(), p.w = wg.codes.data(), p.w_scale = wg.scales.data();
    p.w_up = c.gated ? wu.codes.data() : nullptr, p.w_up_scale = c.gated ? wu.scales.data() : nullptr;
    p.group_expert = r.group_expert.data(), p.group_start = r.group_start.data();
    p.pair_row = c.per_pair ? nullptr : r.pair_row.data();
    p.pair_weight = c.gated ? r.pair_weight.data() : nullptr, p.y = ref.data();
    FS_ASSERT_OK(expert_gemv_ref(p, rows));
    double mean_abs = 0;
    for (float v : ref) mean_abs += std::fabs(v);
    mean_abs /= double(ref.size());
    ASSERT_GT(mean_abs, 0);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(ref[i], round_bf16(ref[i])) << i;
      ASSERT_EQ(got[i], round_bf16(got[i])) << i;
      ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-3 * (std::fabs(ref[i]) + mean_abs) + std::fabs(ref[i]) / 128)
          << "pair output " << i << " gpu " << got[i] << " twin " << ref[i];
    }
  }
}

// A gated launch (gate ‖ up, the SwiGLU in the epilogue) is the gate launch, the up launch and the
// swiglu kernel, memcmp-equal, without and with the reference roundings (bf16_round_gate_up on gate
// and up, bf16_round_out on h): so the model may run its experts either way. Routed experts
// (grouped, FP4): one token's six pairs with the cluster k split, grouped pairs, another rank's
// expert, pre-quantised rows through the tiled kernel and through the passes. The shared expert
// (dense): FP8 for one token, a verify block and a prefill chunk (tiled and passes), V4's 128
// blocks, FP4, and a shape whose FP8 tuning takes 4-block chunks (the gated launch must take its
// one-matrix launches' tuning).
TEST(CudaGemvGated, EqualsGateAndUpLaunchesThenSwiglu) {
  FS_REQUIRE_GPU();
  struct ExpertCase {
    WeightFormat f;
    int tokens, topk, n_experts;
    int64_t n, k;
    bool other_rank, preq, tiled;
  };
  const ExpertCase ecases[] = {{WeightFormat::kFp4, 1, 6, 16, 200, 2304, false, false, false},
                               {WeightFormat::kFp4, 6, 6, 13, 96, 512, true, false, false},
                               {WeightFormat::kFp4, 97, 6, 16, 96, 512, true, true, true},
                               {WeightFormat::kFp4, 64, 2, 4, 130, 1024, false, true, false},
                               {WeightFormat::kFp8, 5, 2, 3, 70, 384, false, false, false}};
  uint32_t seed = 1300;
  for (const ExpertCase& c : ecases)
    for (const bool round : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "experts fmt=" << int(c.f) << " tokens=" << c.tokens << " n=" << c.n
                                        << " k=" << c.k << " preq=" << c.preq << " tiled=" << c.tiled
                                        << " round=" << round);
      std::mt19937 rng(seed++);
      Routing r = random_routing(rng, c.tokens, c.topk, c.n_experts);
      if (c.other_rank) r.group_expert[0] = -1;
      const int64_t pairs = int64_t(r.pair_row.size());
      const Weights wg = random_weights(rng, c.f, c.n * c.n_experts, c.k, 32);
      const Weights wu = random_weights(rng, c.f, c.n * c.n_experts, c.k, 32);
      std::vector<float> x = random_block_activations(rng, c.tokens, c.k);
      for (auto& v : x) v *= 0.05f;
      const size_t ny = size_t(pairs * c.n);
      DeviceBuffer<float> dx(x), dpw(r.pair_weight), fused(ny), g(ny), u(ny), h(ny), dxs(size_t(c.tokens * c.k / 32));
      DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales), dxq(size_t(c.tokens * c.k));
      DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
      ExpertGemvParams p;
      p.x = dx.get(), p.expert_stride = weight_code_bytes(c.f, c.n, c.k);
      p.expert_scale_stride = weight_scale_bytes(c.f, c.n, c.k, 32);
      p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = dpr.get();
      p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = c.n_experts;
      p.n = c.n, p.k = c.k, p.format = c.f, p.split_groups = c.topk, p.tiled = c.tiled;
      if (c.preq) {
        ASSERT_GT(pairs, 8 * int64_t(r.group_expert.size())) << "the case must take the pre-quantised passes";
        FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), c.tokens, c.k, 32, false, dxq.get(), dxs.get(), nullptr));
        p.xq = dxq.get(), p.xs = dxs.get();
      }
      p.bf16_round_out = round;
      p.w = dwg.get(), p.w_scale = dsg.get(), p.y = g.get();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      p.w = dwu.get(), p.w_scale = dsu.get(), p.y = u.get();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      ASSERT_EQ(detail::launch_swiglu(g.get(), u.get(), h.get(), dpw.get(), pairs, c.n, 7.0f, round, nullptr),
                cudaSuccess);
      p.w = dwg.get(), p.w_scale = dsg.get(), p.w_up = dwu.get(), p.w_up_scale = dsu.get();
      p.pair_weight = dpw.get(), p.swiglu_limit = 7.0f, p.bf16_round_gate_up = round, p.y = fused.get();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto want = h.to_host(), got = fused.to_host();
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
      double mean_abs = 0;
      for (float v : got) mean_abs += std::fabs(v);
      ASSERT_GT(mean_abs, 0);
    }
  struct DenseCase {
    WeightFormat f;
    int64_t m, n, k, w_block, act_block;
    bool preq, tiled;
  };
  const DenseCase dcases[] = {{WeightFormat::kFp8, 1, 2304, 5120, 32, 32, false, false},
                              {WeightFormat::kFp8, 6, 200, 1024, 32, 32, false, false},
                              {WeightFormat::kFp8, 70, 96, 512, 32, 32, true, true},
                              {WeightFormat::kFp8, 40, 96, 512, 32, 32, true, false},
                              {WeightFormat::kFp8, 3, 128, 1024, 128, 128, false, false},
                              {WeightFormat::kFp8, 2, 64, 16384, 32, 32, false, false},
                              {WeightFormat::kFp4, 5, 100, 768, 32, 32, false, false}};
  for (const DenseCase& c : dcases)
    for (const bool round : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dense fmt=" << int(c.f) << " m=" << c.m << " n=" << c.n << " k=" << c.k
                                        << " preq=" << c.preq << " tiled=" << c.tiled << " round=" << round);
      std::mt19937 rng(seed++);
      const Weights wg = random_weights(rng, c.f, c.n, c.k, c.w_block);
      const Weights wu = random_weights(rng, c.f, c.n, c.k, c.w_block);
      std::vector<float> x = random_block_activations(rng, c.m, c.k);
      for (auto& v : x) v *= 0.05f;
      const size_t ny = size_t(c.m * c.n);
      DeviceBuffer<float> dx(x), fused(ny), g(ny), u(ny), h(ny), dxs(size_t(c.m * c.k / 32));
      DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales), dxq(size_t(c.m * c.k));
      BlockLinearParams p;
      p.x = dx.get(), p.m = c.m, p.n = c.n, p.k = c.k, p.format = c.f, p.w_block = c.w_block;
      p.act_block = c.act_block, p.tiled = c.tiled;
      if (c.preq) {
        FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), c.m, c.k, c.act_block, false, dxq.get(), dxs.get(), nullptr));
        p.xq = dxq.get(), p.xs = dxs.get();
      }
      p.bf16_round_out = round;
      p.w = dwg.get(), p.w_scale = dsg.get(), p.y = g.get();
      FS_ASSERT_OK(block_linear_cuda(p, nullptr));
      p.w = dwu.get(), p.w_scale = dsu.get(), p.y = u.get();
      FS_ASSERT_OK(block_linear_cuda(p, nullptr));
      ASSERT_EQ(detail::launch_swiglu(g.get(), u.get(), h.get(), nullptr, c.m, c.n, 7.0f, round, nullptr), cudaSuccess);
      p.w = dwg.get(), p.w_scale = dsg.get(), p.w_up = dwu.get(), p.w_up_scale = dsu.get();
      p.swiglu_limit = 7.0f, p.bf16_round_gate_up = round, p.y = fused.get();
      FS_ASSERT_OK(block_linear_cuda(p, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto want = h.to_host(), got = fused.to_host();
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
      // And the gated twin within the GEMV's bound (plus one BF16 ulp of each rounding).
      std::vector<float> ref(ny);
      p.x = x.data(), p.w = wg.codes.data(), p.w_scale = wg.scales.data(), p.w_up = wu.codes.data();
      p.w_up_scale = wu.scales.data(), p.xq = nullptr, p.xs = nullptr, p.y = ref.data();
      FS_ASSERT_OK(block_linear_ref(p));
      double mean_abs = 0;
      for (float v : ref) mean_abs += std::fabs(v);
      mean_abs /= double(ny);
      ASSERT_GT(mean_abs, 0);
      for (size_t i = 0; i < ny; ++i)
        ASSERT_LE(std::fabs(double(got[i]) - ref[i]), 1e-3 * (std::fabs(ref[i]) + mean_abs) + std::fabs(ref[i]) / 64)
            << "output " << i << " gpu " << got[i] << " twin " << ref[i];
    }
}

// ---- pre-quantised activations (prefill-sized launches) ----------------------------------------

// gemv_quantize_cuda's codes times scales against the CPU's FP8 quantisation of x (rounded to
// BF16 first with bf16_in), bit for bit; x on the device is left as it was.
void expect_quantize_is_cpus(const std::vector<float>& x, int64_t m, int64_t k, int64_t ab, bool bf16_in) {
  std::vector<float> want(x);
  if (bf16_in)
    for (float& v : want) v = round_bf16(v);
  fp8_quant_dequant(want.data(), m, k, ab);
  DeviceBuffer<float> dx(x), dxs(size_t(m * k / 32));
  DeviceBuffer<uint8_t> dxq(size_t(m * k));
  FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), m, k, ab, bf16_in, dxq.get(), dxs.get(), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto q = dxq.to_host();
  const auto s = dxs.to_host();
  for (int64_t i = 0; i < m * k; ++i) {
    const float got = e4m3_to_f32(q[size_t(i)]) * s[size_t(i / 32)];
    ASSERT_EQ(0, std::memcmp(&got, &want[size_t(i)], 4)) << i << ": " << got << " vs " << want[size_t(i)];
  }
  ASSERT_TRUE(dx.to_host() == x) << "x was modified";
}

// gemv_quantize_cuda gives exactly the CPU's FP8 quantisation (ops::fp8_quant_dequant): each
// code times its block's scale is the dequantised value, bit for bit; zero blocks, outliers,
// act_block 32 and 128, rows not a multiple of anything.
TEST(CudaGemvPrequant, QuantisationIsTheCpusBitForBit) {
  FS_REQUIRE_GPU();
  const std::tuple<int64_t, int64_t, int64_t> cases[] = {{1, 32, 32}, {3, 96, 32}, {37, 2304, 32}, {5, 512, 128},
                                                          {129, 4096, 128}};
  for (const auto& [m, k, ab] : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " ab=" << ab);
    std::mt19937 rng(uint32_t(m * 131 + k + ab));
    std::vector<float> x = random_block_activations(rng, m, k);
    for (int64_t i = 0; i < 32 && i < k; ++i) x[size_t(i)] = 0.0f;  // an all-zero block
    x[size_t(k / 2)] = 3.0e4f;                                         // an outlier
    expect_quantize_is_cpus(x, m, k, ab, false);
  }
  DeviceBuffer<float> dx(size_t(64)), dxs(size_t(2));
  DeviceBuffer<uint8_t> dxq(size_t(64));
  EXPECT_FALSE(gemv_quantize_cuda(dx.get(), 1, 48, 32, false, dxq.get(), dxs.get(), nullptr).ok());  // k % 32
  EXPECT_FALSE(gemv_quantize_cuda(dx.get(), 1, 32, 128, false, dxq.get(), dxs.get(), nullptr).ok());  // k % act_block
  EXPECT_FALSE(gemv_quantize_cuda(dx.get(), 0, 32, 32, false, dxq.get(), dxs.get(), nullptr).ok());
}

// gemv_quantize_cuda with bf16_in: the CPU's FP8 quantisation of x rounded to BF16 first
// (round_bf16, then fp8_quant_dequant), bit for bit; x itself is left as it was.
TEST(CudaGemvPrequant, Bf16InQuantisesTheRoundedInput) {
  FS_REQUIRE_GPU();
  const std::tuple<int64_t, int64_t, int64_t> cases[] = {{1, 32, 32}, {7, 160, 32}, {37, 2304, 32}, {9, 1024, 128}};
  for (const auto& [m, k, ab] : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " ab=" << ab);
    std::mt19937 rng(uint32_t(m * 977 + k + ab));
    std::vector<float> x = random_block_activations(rng, m, k);
    x[size_t(k / 2)] = 3.0e4f + 7.0f;  // an outlier whose low mantissa bits BF16 drops
    std::vector<float> r(x);
    for (float& v : r) v = round_bf16(v);
    ASSERT_NE(r, x);
    expect_quantize_is_cpus(x, m, k, ab, true);
  }
}

// The linear with pre-quantised x (32-token passes, cached weights) is bitwise the plain launch,
// and every row is bitwise what that row alone gives (m = 1: the decode): batch invariance.
TEST(CudaGemvPrequant, LinearIsTheSameBitsAsQuantisingInside) {
  FS_REQUIRE_GPU();
  const LinCase cases[] = {
      {WeightFormat::kFp8, 9, 77, 256, 32, 32},      {WeightFormat::kFp8, 33, 130, 2304, 32, 32},
      {WeightFormat::kFp8, 100, 1000, 4096, 32, 32}, {WeightFormat::kFp8, 257, 64, 1024, 128, 128},
      {WeightFormat::kFp8, 70, 200, 512, 128, 32},   {WeightFormat::kFp4, 41, 96, 2304, 32, 32},
      {WeightFormat::kFp4, 300, 33, 512, 32, 32},    {WeightFormat::kFp8, 17, 4096, 1024, 32, 32},
  };
  for (const LinCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "fmt=" << int(c.f) << " m=" << c.m << " n=" << c.n << " k=" << c.k
                                      << " wb=" << c.w_block << " ab=" << c.act_block);
    std::mt19937 rng(uint32_t(c.m * 7 + c.n * 3 + c.k));
    const Weights w = random_weights(rng, c.f, c.n, c.k, c.w_block);
    const std::vector<float> x = random_block_activations(rng, c.m, c.k);
    DeviceBuffer<float> dx(x), dy0(size_t(c.m * c.n)), dy1(size_t(c.m * c.n)), dy2(size_t(c.n));
    DeviceBuffer<float> dxs(size_t(c.m * c.k / 32));
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dxq(size_t(c.m * c.k));
    BlockLinearParams p;
    p.m = c.m, p.n = c.n, p.k = c.k, p.format = c.f, p.w_block = c.w_block, p.act_block = c.act_block;
    p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy0.get();
    FS_ASSERT_OK(block_linear_cuda(p, nullptr));
    FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), c.m, c.k, c.act_block, false, dxq.get(), dxs.get(), nullptr));
    p.xq = dxq.get(), p.xs = dxs.get(), p.y = dy1.get();
    FS_ASSERT_OK(block_linear_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto plain = dy0.to_host(), preq = dy1.to_host();
    ASSERT_EQ(0, std::memcmp(plain.data(), preq.data(), plain.size() * 4));
    for (const int64_t r : {int64_t(0), c.m / 2, c.m - 1}) {  // each row alone, as a decode step
      BlockLinearParams one = p;
      one.m = 1, one.x = dx.get() + r * c.k, one.xq = nullptr, one.xs = nullptr, one.y = dy2.get();
      FS_ASSERT_OK(block_linear_cuda(one, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto row = dy2.to_host();
      ASSERT_EQ(0, std::memcmp(row.data(), preq.data() + r * c.n, size_t(c.n) * 4)) << "row " << r;
    }
    std::vector<float> twin(size_t(c.m * c.n));  // and within the twin's bound (the CPU ignores xq)
    BlockLinearParams h = p;
    h.x = x.data(), h.w = w.codes.data(), h.w_scale = w.scales.data(), h.y = twin.data(), h.xq = nullptr, h.xs = nullptr;
    FS_ASSERT_OK(block_linear_ref(h));
    double scale = 0;
    for (float v : twin) scale = std::max(scale, double(std::fabs(v)));
    for (size_t i = 0; i < twin.size(); ++i) ASSERT_LE(std::fabs(double(preq[i]) - twin[i]), 1e-4 * scale + 1e-30) << i;
  }
}

// The grouped expert GEMV with pre-quantised rows (prefill: more than 8 pairs per group; token rows
// through pair_row as for gate / up, and per-pair rows as for down) is bitwise the plain launch.
TEST(CudaGemvPrequant, ExpertGemvIsTheSameBitsAsQuantisingInside) {
  FS_REQUIRE_GPU();
  const std::tuple<int, int, int, int64_t, int64_t, bool> cases[] = {
      {97, 6, 16, 96, 512, false}, {300, 6, 9, 70, 2304, false}, {64, 2, 4, 130, 1024, true}, {211, 6, 16, 33, 2304, true}};
  for (const auto& [tokens, topk, n_experts, n, k, per_pair] : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens=" << tokens << " experts=" << n_experts << " n=" << n << " k=" << k
                                      << " per_pair=" << per_pair);
    std::mt19937 rng(uint32_t(tokens * 17 + n + k));
    const Routing r = random_routing(rng, tokens, topk, n_experts);
    const int64_t pairs = int64_t(r.pair_row.size());
    ASSERT_GT(pairs, 8 * int64_t(r.group_expert.size())) << "the case must take the wide pre-quantised passes";
    const int64_t rows = per_pair ? pairs : tokens;
    const Weights w = random_weights(rng, WeightFormat::kFp4, n * n_experts, k, 32);
    const std::vector<float> x = random_block_activations(rng, rows, k);
    DeviceBuffer<float> dx(x), dy0(size_t(pairs * n)), dy1(size_t(pairs * n)), dxs(size_t(rows * k / 32));
    DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dxq(size_t(rows * k));
    DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
    ExpertGemvParams p;
    p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get();
    p.expert_stride = weight_code_bytes(WeightFormat::kFp4, n, k);
    p.expert_scale_stride = weight_scale_bytes(WeightFormat::kFp4, n, k, 32);
    p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = per_pair ? nullptr : dpr.get();
    p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = n_experts;
    p.n = n, p.k = k, p.split_groups = topk;
    p.y = dy0.get();
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), rows, k, 32, false, dxq.get(), dxs.get(), nullptr));
    p.xq = dxq.get(), p.xs = dxs.get(), p.y = dy1.get();
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto plain = dy0.to_host(), preq = dy1.to_host();
    ASSERT_EQ(0, std::memcmp(plain.data(), preq.data(), plain.size() * 4));
    p.tiled = false, p.y = dy1.get();  // the GEMV's token passes over the pre-quantised rows
    FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto passes = dy1.to_host();
    ASSERT_EQ(0, std::memcmp(plain.data(), passes.data(), plain.size() * 4)) << "passes over xq";
  }
}

// The tiled prefill kernel (pre-quantised x, more than 8 tokens) adds each output's blocks in the
// GEMV's order for every k split and chunk width the tuning can pick: bitwise the plain launch
// (the GEMV's wide passes) for odd row counts (not a multiple of the 64-row CTA tile), token counts
// across several 64-token tiles, FP8 (32- and 128-row scale blocks) and FP4, and the grouped gated
// launch with routing weights, a SwiGLU limit and a group routed to another rank (expert -1).
TEST(CudaGemvPrequant, TiledIsTheGemvsBitsForEveryTuning) {
  FS_REQUIRE_GPU();
  const LinCase cases[] = {{WeightFormat::kFp8, 150, 97, 2048, 128, 32}, {WeightFormat::kFp4, 77, 160, 1024, 32, 32},
                           {WeightFormat::kFp8, 65, 64, 512, 128, 128}};
  for (const LinCase& c : cases)
    for (int split : {1, 2, 3, 8})
      for (int chunk : {1, 2, 4}) {
        if (c.act_block == 128 && chunk != 4) continue;  // V4's act_block 128 always takes 4
        SCOPED_TRACE(::testing::Message() << "fmt=" << int(c.f) << " m=" << c.m << " n=" << c.n << " k=" << c.k
                                          << " split=" << split << " chunk=" << chunk);
        std::mt19937 rng(uint32_t(c.m + c.n + c.k + split * 10 + chunk));
        const Weights w = random_weights(rng, c.f, c.n, c.k, c.w_block);
        const std::vector<float> x = random_block_activations(rng, c.m, c.k);
        DeviceBuffer<float> dx(x), dy0(size_t(c.m * c.n)), dy1(size_t(c.m * c.n)), dy2(size_t(c.m * c.n));
        DeviceBuffer<float> dxs(size_t(c.m * c.k / 32));
        DeviceBuffer<uint8_t> dw(w.codes), ds(w.scales), dxq(size_t(c.m * c.k));
        BlockLinearParams p;
        p.m = c.m, p.n = c.n, p.k = c.k, p.format = c.f, p.w_block = c.w_block, p.act_block = c.act_block;
        p.x = dx.get(), p.w = dw.get(), p.w_scale = ds.get(), p.y = dy0.get();
        detail::set_gemv_tuning(split, chunk);
        FS_ASSERT_OK(block_linear_cuda(p, nullptr));
        FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), c.m, c.k, c.act_block, false, dxq.get(), dxs.get(), nullptr));
        p.xq = dxq.get(), p.xs = dxs.get(), p.y = dy1.get();
        FS_ASSERT_OK(block_linear_cuda(p, nullptr));
        p.tiled = false, p.y = dy2.get();  // the GEMV's 32-token passes over the pre-quantised x
        FS_ASSERT_OK(block_linear_cuda(p, nullptr));
        detail::set_gemv_tuning(0, 0);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto plain = dy0.to_host(), tiled = dy1.to_host(), passes = dy2.to_host();
        ASSERT_EQ(0, std::memcmp(plain.data(), tiled.data(), plain.size() * 4));
        ASSERT_EQ(0, std::memcmp(plain.data(), passes.data(), plain.size() * 4)) << "passes over xq";
      }
  // Grouped, gated (gate ‖ up with SwiGLU and routing weights), token rows through pair_row.
  // FP4 (the routed experts) and FP8 with 128 x 128 scale blocks (a gated FP8 matrix).
  for (const WeightFormat f : {WeightFormat::kFp4, WeightFormat::kFp8})
  for (int split : {1, 3})
    for (int chunk : {1, 2, 4}) {
      SCOPED_TRACE(::testing::Message() << "gated fmt=" << int(f) << " split=" << split << " chunk=" << chunk);
      const int64_t wb = f == WeightFormat::kFp4 ? 32 : 128;
      std::mt19937 rng(uint32_t(400 + split * 10 + chunk));
      const int tokens = 150, topk = 4, n_experts = 6;
      const int64_t n = 96, k = 1024;
      Routing r = random_routing(rng, tokens, topk, n_experts);
      r.group_expert[1] = -1;  // its pairs belong to another rank: zeros
      const int64_t pairs = int64_t(r.pair_row.size());
      const Weights wg = random_weights(rng, f, n * n_experts, k, wb);
      const Weights wu = random_weights(rng, f, n * n_experts, k, wb);
      std::vector<float> x = random_block_activations(rng, tokens, k);
      for (auto& v : x) v *= 0.05f;
      DeviceBuffer<float> dx(x), dy0(size_t(pairs * n)), dy1(size_t(pairs * n)), dxs(size_t(tokens * k / 32));
      DeviceBuffer<float> dpw(r.pair_weight), dy2(size_t(pairs * n));
      DeviceBuffer<uint8_t> dwg(wg.codes), dsg(wg.scales), dwu(wu.codes), dsu(wu.scales), dxq(size_t(tokens * k));
      DeviceBuffer<int32_t> dge(r.group_expert), dgs(r.group_start), dpr(r.pair_row);
      ExpertGemvParams p;
      p.x = dx.get(), p.w = dwg.get(), p.w_scale = dsg.get(), p.w_up = dwu.get(), p.w_up_scale = dsu.get();
      p.expert_stride = weight_code_bytes(f, n, k);
      p.expert_scale_stride = weight_scale_bytes(f, n, k, wb);
      p.group_expert = dge.get(), p.group_start = dgs.get(), p.pair_row = dpr.get(), p.pair_weight = dpw.get();
      p.n_groups = int64_t(r.group_expert.size()), p.n_pairs = pairs, p.n_experts = n_experts;
      p.n = n, p.k = k, p.format = f, p.w_block = wb, p.swiglu_limit = 7.0f, p.split_groups = topk;
      p.y = dy0.get();
      detail::set_gemv_tuning(split, chunk);
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      FS_ASSERT_OK(gemv_quantize_cuda(dx.get(), tokens, k, 32, false, dxq.get(), dxs.get(), nullptr));
      p.xq = dxq.get(), p.xs = dxs.get(), p.y = dy1.get();
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      p.tiled = false, p.y = dy2.get();  // the GEMV's passes over the pre-quantised x
      FS_ASSERT_OK(expert_gemv_cuda(p, nullptr));
      detail::set_gemv_tuning(0, 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto plain = dy0.to_host(), tiled = dy1.to_host(), passes = dy2.to_host();
      ASSERT_EQ(0, std::memcmp(plain.data(), tiled.data(), plain.size() * 4));
      ASSERT_EQ(0, std::memcmp(plain.data(), passes.data(), plain.size() * 4)) << "passes over xq";
      for (int64_t q = r.group_start[1]; q < r.group_start[2]; ++q)
        for (int64_t o = 0; o < n; ++o) ASSERT_EQ(tiled[size_t(q * n + o)], 0.0f) << "pair " << q;
    }
}

}  // namespace
}  // namespace flashseek::ops::cuda
