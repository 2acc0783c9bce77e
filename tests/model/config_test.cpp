// Config parsing for both families and all three layouts, role derivation (v41 §1.7, v4 §1.2),
// and the errors of malformed configs.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/make_tiny.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

using nlohmann::json;
using testutil::read_file;
using testutil::source_path;

ModelConfig parse_ok(const std::string& text, const std::string& src) {
  auto r = parse_config(text, src);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : ModelConfig{};
}

json real_v41() { return json::parse(read_file(source_path("tests/model/data/v41-flash-config.json"))); }
json real_v4() { return json::parse(read_file(source_path("tests/model/data/v4-flash-config.json"))); }

void expect_same_roles(const ModelConfig& a, const ModelConfig& b) {
  ASSERT_EQ(a.roles.size(), b.roles.size());
  for (size_t l = 0; l < a.roles.size(); ++l) {
    const LayerRole &x = a.roles[l], &y = b.roles[l];
    EXPECT_EQ(x.ratio, y.ratio) << l;
    EXPECT_EQ(x.kv_source, y.kv_source) << l;
    EXPECT_EQ(x.index_source, y.index_source) << l;
    EXPECT_EQ(x.candidate_source, y.candidate_source) << l;
    EXPECT_EQ(x.candidate_filtered, y.candidate_filtered) << l;
    EXPECT_EQ(x.kv_src, y.kv_src) << l;
    EXPECT_EQ(x.idx_src, y.idx_src) << l;
    EXPECT_EQ(x.engram, y.engram) << l;
    EXPECT_EQ(x.hash_routed, y.hash_routed) << l;
    EXPECT_EQ(x.rope_theta, y.rope_theta) << l;
    EXPECT_EQ(x.yarn, y.yarn) << l;
  }
}

TEST(Config, RealV41Fields) {
  ModelConfig c = parse_ok(real_v41().dump(), "v41");
  EXPECT_TRUE(c.is_v41());
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.num_mtp_layers, 3);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_TRUE(c.fp4_experts);
  EXPECT_EQ(c.rope_factor, 16);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.dspark_n_experts_per_tok, 3);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{37, 38, 39}));
  EXPECT_EQ(c.vision_num_layers, 32);
  EXPECT_EQ(c.gate_temp, 1.0);
  EXPECT_EQ(c.num_hash_layers, 0);
}

// The table of model-v41.md §1.7, row by row.
TEST(Config, RealV41Roles) {
  ModelConfig c = parse_ok(real_v41().dump(), "v41");
  ASSERT_EQ(c.roles.size(), 43u);
  for (int l : {0, 1}) {
    EXPECT_EQ(c.role(l).ratio, 0);
    EXPECT_EQ(c.role(l).kv_src, -1);
    EXPECT_FALSE(c.role(l).yarn);
    EXPECT_EQ(c.role(l).rope_theta, 10000);
  }
  EXPECT_TRUE(c.role(1).engram);
  EXPECT_TRUE(c.role(14).engram);
  for (int l = 2; l < 40; ++l) {
    const LayerRole& r = c.role(l);
    EXPECT_EQ(r.ratio, l < 20 ? 2 : 1) << l;
    EXPECT_TRUE(r.yarn) << l;
    EXPECT_EQ(r.rope_theta, 160000) << l;
    const int kv = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    EXPECT_EQ(r.kv_src, kv) << l;
    const int idx = l < 24 ? kv : l < 28 ? 24 : l < 32 ? 28 : l < 36 ? 32 : 36;
    EXPECT_EQ(r.idx_src, idx) << l;
    EXPECT_EQ(r.kv_source, l == kv) << l;
    EXPECT_EQ(r.index_source, l == idx) << l;
    EXPECT_EQ(r.candidate_source, l == 20) << l;
    EXPECT_EQ(r.candidate_filtered, l == 24 || l == 28 || l == 32 || l == 36) << l;
    EXPECT_EQ(r.engram, l == 14) << l;
    EXPECT_FALSE(r.hash_routed);
  }
  for (int l = 40; l < 43; ++l) {
    EXPECT_EQ(c.role(l).ratio, 0);
    EXPECT_FALSE(c.role(l).yarn);
    EXPECT_FALSE(c.role(l).engram);
    EXPECT_EQ(c.role(l).kv_src, -1);
  }
}

// model-v4.md §1.2: SWA 0,1; CSA even 2..42; HCA odd 3..41; MTP entry 43 SWA; hash 0..2.
TEST(Config, RealV4Roles) {
  ModelConfig c = parse_ok(real_v4().dump(), "v4");
  EXPECT_FALSE(c.is_v41());
  EXPECT_EQ(c.weight_block_size, 128);
  EXPECT_TRUE(c.fp4_experts);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  ASSERT_EQ(c.roles.size(), 44u);
  for (int l = 0; l < 44; ++l) {
    const LayerRole& r = c.role(l);
    const int want = (l < 2 || l == 43) ? 0 : (l % 2 == 0 ? 4 : 128);
    EXPECT_EQ(r.ratio, want) << l;
    EXPECT_EQ(r.index_source, want == 4) << l;
    EXPECT_EQ(r.kv_source, want > 0) << l;
    EXPECT_EQ(r.yarn, want > 0) << l;
    EXPECT_EQ(r.rope_theta, want > 0 ? 160000 : 10000) << l;
    EXPECT_EQ(r.hash_routed, l < 3) << l;
  }
  EXPECT_EQ(c.role(42).ratio, 4) << "layer 42 is CSA; the trailing 0 belongs to MTP";
}

TEST(Config, ReferenceNamesMatchHfNames) {
  for (const char* name : {"tiny-v4", "tiny-v41", "demo"}) {
    auto c = builtin_config(name);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ModelConfig hf = parse_ok(config_to_hf_json(*c), "hf");
    ModelConfig ref = parse_ok(config_to_ref_json(*c), "ref");
    expect_same_roles(*c, hf);
    expect_same_roles(*c, ref);
    EXPECT_EQ(config_to_hf_json(hf), config_to_hf_json(*c)) << name;
    EXPECT_EQ(config_to_hf_json(ref), config_to_hf_json(*c)) << name;
  }
}

// The real configs survive a trip through both writers (reference names for inference/config.json).
TEST(Config, RealConfigsRoundTripThroughReferenceNames) {
  for (const json& j : {real_v41(), real_v4()}) {
    ModelConfig c = parse_ok(j.dump(), "real");
    ModelConfig ref = parse_ok(config_to_ref_json(c), "ref");
    ModelConfig hf = parse_ok(config_to_hf_json(c), "hf");
    expect_same_roles(c, ref);
    expect_same_roles(c, hf);
    EXPECT_EQ(config_to_hf_json(ref), config_to_hf_json(c));
    EXPECT_EQ(config_to_hf_json(hf), config_to_hf_json(c));
  }
}

TEST(Config, TinyV41RolesPerSpec) {
  auto c = builtin_config("tiny-v41");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->role(0).ratio, 0);
  EXPECT_TRUE(c->role(1).kv_source && c->role(1).index_source && c->role(1).engram);
  EXPECT_EQ(c->role(2).kv_src, 1);
  EXPECT_FALSE(c->role(2).kv_source);
  EXPECT_TRUE(c->role(3).candidate_source && c->role(3).kv_source);
  EXPECT_EQ(c->role(4).kv_src, 3);
  EXPECT_TRUE(c->role(4).engram);
  EXPECT_TRUE(c->role(5).candidate_filtered);
  EXPECT_EQ(c->role(5).kv_src, 3);
  EXPECT_EQ(c->role(5).idx_src, 5);
  EXPECT_EQ(c->role(6).ratio, 0);
  EXPECT_TRUE(c->role(6).rope_theta == 10000 && !c->role(6).yarn);
}

TEST(Config, FixtureConfigsAgree) {
  const std::string dir = testutil::fixture_dir();
  ASSERT_FALSE(dir.empty()) << "could not extract the fixture";
  auto hf = load_config(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  auto ref = parse_config(read_file(dir + "/inference/config.json"), "inference/config.json");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_FALSE(hf->fp8_weights) << "the fixture has no quantization_config";
  EXPECT_FALSE(ref->fp8_weights);
  EXPECT_FALSE(hf->fp4_experts);
  EXPECT_EQ(hf->index_n_heads, 8);
  EXPECT_EQ(hf->image_token_id, 253);
  EXPECT_EQ(hf->n_experts_per_tok, 4);
  expect_same_roles(*hf, *ref);
  // inference/config.json has no max_seq_len (a runtime cap there); everything else must agree.
  EXPECT_EQ(hf->max_position_embeddings, 1024);
  ref->max_position_embeddings = hf->max_position_embeddings;
  EXPECT_EQ(config_to_hf_json(*hf), config_to_hf_json(*ref));
  EXPECT_EQ(hf->warnings.size(), 1u) << "its candidate budget 128*4-3 = 509 < 512 only warns";
}

TEST(Config, LoadFallsBackToInferenceConfig) {
  testutil::TempDir d;
  std::filesystem::create_directories(d / "inference");
  auto c = builtin_config("tiny-v41");
  testutil::write_file(d / "inference/config.json", config_to_ref_json(*c));
  auto r = load_config(d.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_layers, 7);
  testutil::TempDir empty;
  auto missing = load_config(empty.path());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace flashseek::model
