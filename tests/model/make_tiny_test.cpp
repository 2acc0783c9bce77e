// make-tiny -> Checkpoint round trip: the written checkpoint validates against its config and
// every tensor dequantises to exactly the values the generator intended.
#include <cmath>
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/make_tiny.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

using Expected = std::map<std::string, std::pair<Shape, std::vector<float>>>;

Expected make(const std::string& config, const MakeTinyOptions& opt, const std::string& dir) {
  Expected exp;
  auto cfg = builtin_config(config);
  EXPECT_TRUE(cfg.ok());
  Status st = make_tiny_checkpoint(*cfg, opt, dir, [&](const std::string& n, const Shape& s, const std::vector<float>& v) {
    exp[n] = {s, v};
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return exp;
}

// Bitwise float equality (NaN-safe, keeps -0 distinct from +0).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void expect_round_trip(const Checkpoint& ck, const Expected& exp) {
  size_t checked = 0;
  for (const auto& [name, sv] : exp) {
    auto shape = ck.logical_shape(name);
    ASSERT_TRUE(shape.ok()) << shape.status().to_string();
    EXPECT_EQ(*shape, sv.first) << name;
    auto got = ck.dequant_f32(name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), sv.second.size()) << name;
    size_t bad = 0;
    for (size_t i = 0; i < got->size(); ++i)
      if (!same_bits((*got)[i], sv.second[i]) && bad++ < 3)
        ADD_FAILURE() << name << "[" << i << "]: loaded " << (*got)[i] << " generated " << sv.second[i];
    ++checked;
  }
  EXPECT_EQ(checked, expected_weights(ck.config()).size());
}

class MakeTinyRoundTrip : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(MakeTinyRoundTrip, LoadsValidatesAndMatches) {
  const auto [config, bf16] = GetParam();
  testutil::TempDir d;
  MakeTinyOptions opt;
  opt.seed = 7;
  opt.bf16 = bf16;
  Expected exp = make(config, opt, d.path());
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE(ck->validation().warnings.empty()) << ck->validation().warnings[0];
  EXPECT_GE(ck->shards().files().size(), 2u);
  expect_round_trip(*ck, exp);
}

INSTANTIATE_TEST_SUITE_P(Configs, MakeTinyRoundTrip,
                         ::testing::Combine(::testing::Values("tiny-v4", "tiny-v41"), ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n.replace(n.find('-'), 1, "_");
                           return n + (std::get<1>(info.param) ? "_bf16" : "_fp8");
                         });

TEST(MakeTiny, ReleaseDtypes) {
  testutil::TempDir d;
  make("tiny-v41", {}, d.path());
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto dt = [&](const char* n) { return ck->find(n)->dtype; };
  auto sh = [&](const char* n) { return ck->find(n)->shape; };
  EXPECT_EQ(dt("layers.0.attn.wq_a.weight"), DType::kF8E4M3);
  EXPECT_EQ(dt("layers.0.attn.wq_a.scale"), DType::kF8E8M0);
  EXPECT_EQ(sh("layers.0.attn.wq_a.scale"), (Shape{2, 4}));  // [64, 128] in 32x32 blocks
  EXPECT_EQ(dt("layers.0.ffn.experts.3.w2.weight"), DType::kI8);
  EXPECT_EQ(sh("layers.0.ffn.experts.3.w2.weight"), (Shape{128, 32}));
  EXPECT_EQ(sh("layers.0.ffn.experts.3.w2.scale"), (Shape{128, 2}));
  EXPECT_EQ(dt("layers.4.engram.embed.weight"), DType::kF8E4M3);
  EXPECT_EQ(sh("layers.4.engram.embed.scale"), (Shape{220, 1}));
  EXPECT_EQ(sh("layers.1.engram.wkv.weight"), (Shape{640, 128}));
  EXPECT_EQ(sh("mtp.0.main_proj.weight"), (Shape{128, 384}));
  EXPECT_EQ(sh("mtp.2.confidence_head.proj.weight"), (Shape{1, 136}));
  EXPECT_FALSE(ck->has("layers.3.attn.compressor.wgate.weight")) << "ratio-1 source has no wgate";
  EXPECT_TRUE(ck->has("layers.1.attn.compressor.wgate.weight"));
  EXPECT_TRUE(ck->has("layers.5.attn.indexer.wq_b.weight"));
  EXPECT_FALSE(ck->has("layers.5.attn.indexer.wk.weight"));
  EXPECT_FALSE(ck->has("hc_head_fn")) << "V4.1 has no hc_head";
  EXPECT_TRUE(std::filesystem::exists(d / "inference/config.json"));
  EXPECT_TRUE(std::filesystem::exists(d / "engram_token_map.json"));
}

TEST(MakeTiny, V4HashTablesHaveDistinctIds) {
  testutil::TempDir d;
  make("tiny-v4", {}, d.path());
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  for (const char* name : {"layers.0.ffn.gate.tid2eid", "layers.1.ffn.gate.tid2eid"}) {
    auto ids = ck->read_ints(name);
    ASSERT_TRUE(ids.ok());
    ASSERT_EQ(ids->size(), 1024u * 2);
    for (size_t r = 0; r < 1024; ++r) {
      const int64_t a = (*ids)[2 * r], b = (*ids)[2 * r + 1];
      ASSERT_TRUE(a >= 0 && a < 8 && b >= 0 && b < 8 && a != b) << name << " row " << r;
    }
  }
  EXPECT_FALSE(ck->has("layers.2.ffn.gate.tid2eid"));
  EXPECT_TRUE(ck->has("layers.2.ffn.gate.bias"));
  EXPECT_TRUE(ck->has("mtp.0.e_proj.weight"));
  EXPECT_EQ(ck->find("layers.1.attn.compressor.ape")->shape, (Shape{4, 256}));
  EXPECT_EQ(ck->find("layers.2.attn.compressor.ape")->shape, (Shape{128, 128}));
  EXPECT_EQ(ck->find("layers.0.attn.wq_b.scale")->shape, (Shape{16, 1}));
}

// Some expert gate/up pre-activations must pass the ±10 SwiGLU clamp for unit-RMS inputs.
TEST(MakeTiny, ExpertPreActivationsReachTheClamp) {
  testutil::TempDir d;
  Expected exp = make("tiny-v41", {}, d.path());
  const auto& w = exp.at("layers.2.ffn.experts.0.w1.weight");
  const int64_t out = w.first[0], in = w.first[1];
  int over = 0;
  Rng rng(3);
  for (int t = 0; t < 64; ++t) {
    std::vector<double> x(static_cast<size_t>(in));
    for (auto& v : x) v = rng.normal();
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += x[size_t(i)] * w.second[size_t(o * in + i)];
      over += std::fabs(acc) > 10.0;
    }
  }
  EXPECT_GT(over, 0);
  EXPECT_LT(over, 64 * out / 2) << "most activations should stay inside the clamp";
}

TEST(MakeTiny, DeterministicForASeed) {
  testutil::TempDir a, b, c;
  MakeTinyOptions o1, o2;
  o1.seed = o2.seed = 11;
  make("tiny-v41", o1, a.path());
  make("tiny-v41", o2, b.path());
  MakeTinyOptions o3;
  o3.seed = 12;
  make("tiny-v41", o3, c.path());
  for (const auto& e : std::filesystem::directory_iterator(a.path())) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    EXPECT_EQ(testutil::read_file(a / n), testutil::read_file(b / n)) << n;
    if (n.find(".safetensors") != std::string::npos && n.find("index") == std::string::npos) {
      EXPECT_NE(testutil::read_file(a / n), testutil::read_file(c / n)) << n;
    }
  }
}

// --well-conditioned shrinks exactly the residual branches' outputs (attention wo_b, routed and
// shared experts' w2, Engram wkv) by 2^-kWellConditionedShift and leaves every other tensor bit
// for bit as the standard checkpoint of the same seed; the result still round-trips.
TEST(MakeTiny, WellConditionedScalesOnlyTheResidualBranches) {
  for (const char* config : {"tiny-v41", "tiny-v4"}) {
    testutil::TempDir a, b;
    MakeTinyOptions std_opt, wc_opt;
    std_opt.seed = wc_opt.seed = 5;
    wc_opt.well_conditioned = true;
    const Expected s = make(config, std_opt, a.path());
    const Expected w = make(config, wc_opt, b.path());
    ASSERT_EQ(s.size(), w.size()) << config;
    const float f = std::ldexp(1.0f, -kWellConditionedShift);
    int scaled = 0, wo_b = 0, w2 = 0, engram = 0;
    for (const auto& [name, sv] : s) {
      const auto it = w.find(name);
      ASSERT_NE(it, w.end()) << name;
      const auto& wv = it->second.second;
      ASSERT_EQ(wv.size(), sv.second.size()) << name;
      const auto ends = [&](const char* suf) {
        const std::string x(suf);
        return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
      };
      const bool branch = ends("attn.wo_b.weight") || ends("engram.wkv.weight") ||
                          (ends("w2.weight") && name.find("experts.") != std::string::npos);
      wo_b += ends("attn.wo_b.weight");
      w2 += ends("w2.weight") && name.find("experts.") != std::string::npos;
      engram += ends("engram.wkv.weight");
      scaled += branch;
      size_t bad = 0;
      for (size_t i = 0; i < wv.size(); ++i) {
        const float want = branch ? sv.second[i] * f : sv.second[i];
        if (!same_bits(wv[i], want) && bad++ < 3)
          ADD_FAILURE() << config << " " << name << "[" << i << "]: " << wv[i] << " want " << want;
      }
    }
    EXPECT_GT(wo_b, 0) << config;
    EXPECT_GT(w2, 0) << config;
    if (std::string(config) == "tiny-v41") EXPECT_GT(engram, 0) << config;
    EXPECT_EQ(scaled, wo_b + w2 + engram);
    auto ck = Checkpoint::open(b.path());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    expect_round_trip(*ck, w);
  }
}

}  // namespace
}  // namespace flashseek::model
