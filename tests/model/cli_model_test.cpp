// `flashseek make-tiny` and `flashseek inspect` end to end (needs FLASHSEEK_BIN, set by ctest).
#include <cstdio>
#include <cmath>
#include <cstdlib>

#include <gtest/gtest.h>

#include "model/checkpoint.h"
#include "model/make_tiny.h"
#include "model_test_util.h"
#include "test_util.h"

namespace flashseek::model {
namespace {

struct CmdResult {
  int code;
  std::string out;
};

// The built binary (FLASHSEEK_BIN overrides the build path, tests/test_util.h).
CmdResult run(const std::string& args) {
  auto r = flashseek::testing::run_command(flashseek::testing::flashseek_bin() + " " + args);
  return {r.exit_code, r.output};
}

TEST(CliModel, MakeTinyDemoLoadsAndInspects) {
  testutil::TempDir d;
  CmdResult r = run("make-tiny --config demo --seed 3 --out " + d.path());
  ASSERT_EQ(r.code, 0) << r.out;
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config().vocab_size, 129280);
  EXPECT_EQ(ck->config().engram_compressed_vocab_size, 129280);
  EXPECT_EQ(ck->config().image_token_id, 129264);
  EXPECT_EQ(ck->config().dspark_noise_token_id, 128799);
  EXPECT_EQ(ck->find("embed.weight")->shape, (Shape{129280, 128}));
  EXPECT_EQ(ck->find("mtp.2.markov_head.embed.weight")->shape, (Shape{129280, 8}));
  auto map = nlohmann::json::parse(testutil::read_file(d / "engram_token_map.json"));
  EXPECT_EQ(map["map"].size(), 129280u);
  EXPECT_EQ(map["map"][129279], 129279);
  CmdResult i = run("inspect --json --ckpt " + d.path());
  ASSERT_EQ(i.code, 0) << i.out;
  auto j = nlohmann::json::parse(i.out);
  EXPECT_TRUE(j["valid"].get<bool>());
  EXPECT_EQ(j["total"]["tensors"], int64_t(ck->shards().size()));
}

TEST(CliModel, MakeTinyFromConfigFileAndBf16) {
  testutil::TempDir d;
  CmdResult r = run("make-tiny --config " + testutil::fixture_dir() + "/config.json --dtype bf16 --seed 1 --out " + d.path());
  ASSERT_EQ(r.code, 0) << r.out;
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->find("layers.0.attn.wq_a.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ck->find("layers.1.engram.embed.weight")->dtype, DType::kF8E4M3);
}

// --well-conditioned reaches make_tiny: wo_b comes out 2^-kWellConditionedShift times the
// standard one of the same seed, wq_a unchanged.
TEST(CliModel, MakeTinyWellConditioned) {
  testutil::TempDir s, w;
  ASSERT_EQ(run("make-tiny --config tiny-v4 --seed 2 --out " + s.path()).code, 0);
  CmdResult r = run("make-tiny --config tiny-v4 --seed 2 --well-conditioned --out " + w.path());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("well-conditioned"), std::string::npos) << r.out;
  auto cs = Checkpoint::open(s.path());
  auto cw = Checkpoint::open(w.path());
  ASSERT_TRUE(cs.ok() && cw.ok());
  for (const char* name : {"layers.0.attn.wo_b.weight", "layers.0.attn.wq_a.weight"}) {
    auto a = cs->dequant_f32(name);
    auto b = cw->dequant_f32(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    ASSERT_EQ(a->size(), b->size());
    const float f = std::string(name).find("wo_b") != std::string::npos ? std::ldexp(1.0f, -kWellConditionedShift) : 1;
    size_t same = 0;
    for (size_t i = 0; i < a->size(); ++i) same += (*a)[i] * f == (*b)[i];
    EXPECT_EQ(same, a->size()) << name;
  }
}

TEST(CliModel, BadInputsFailWithAMessage) {
  testutil::TempDir d;
  CmdResult a = run("make-tiny --config no-such-config --out " + d.path());
  EXPECT_NE(a.code, 0);
  EXPECT_NE(a.out.find("no-such-config"), std::string::npos) << a.out;
  CmdResult b = run("inspect --ckpt " + d.path());
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.out.find(d.path()), std::string::npos) << b.out;
  CmdResult c = run("inspect");
  EXPECT_NE(c.code, 0);
  // An invalid checkpoint: inspect reports the errors and exits 1.
  ASSERT_EQ(run("make-tiny --config tiny-v41 --out " + d.path()).code, 0);
  auto cfg = nlohmann::json::parse(testutil::read_file(d / "config.json"));
  cfg["text_config"]["o_lora_rank"] = 64;  // every wo_a/wo_b no longer matches the config
  testutil::write_file(d / "config.json", cfg.dump());
  CmdResult e = run("inspect --ckpt " + d.path());
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("layers.0.attn.wo_a.weight"), std::string::npos) << e.out;
}

}  // namespace
}  // namespace flashseek::model
