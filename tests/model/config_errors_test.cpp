// Malformed configs: each mutation of a valid config must fail with an error naming the field.
#include <cctype>
#include <functional>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/make_tiny.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

using nlohmann::json;

struct Case {
  const char* what;
  std::function<void(json&)> mutate;  // applied to the nested V4.1 HF config of tiny-v41
  const char* must_mention;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.what; }

json tiny_v41_json() { return json::parse(config_to_hf_json(*builtin_config("tiny-v41"))); }

class ConfigErrors : public ::testing::TestWithParam<Case> {};

TEST_P(ConfigErrors, FailsNamingTheField) {
  json j = tiny_v41_json();
  GetParam().mutate(j);
  auto r = parse_config(j.dump(), "config.json");
  ASSERT_FALSE(r.ok()) << GetParam().what;
  EXPECT_NE(r.status().message().find(GetParam().must_mention), std::string::npos)
      << GetParam().what << ": " << r.status().message();
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status().message();
}

json& tc(json& j) { return j["text_config"]; }

const Case kCases[] = {
    {"missing hidden_size", [](json& j) { tc(j).erase("hidden_size"); }, "text_config.hidden_size"},
    {"missing text_config", [](json& j) { j.erase("text_config"); }, "text_config"},
    {"hidden_size is a string", [](json& j) { tc(j)["hidden_size"] = "128"; }, "hidden_size"},
    {"fractional head count", [](json& j) { tc(j)["num_attention_heads"] = 4.5; }, "num_attention_heads"},
    {"compress_ratios not a list", [](json& j) { tc(j)["compress_ratios"] = 2; }, "compress_ratios"},
    {"compress_ratios element", [](json& j) { tc(j)["compress_ratios"][1] = "2"; }, "compress_ratios[1]"},
    {"compress_ratios too short", [](json& j) { tc(j)["compress_ratios"].erase(9); }, "compress_ratios"},
    {"ratio 3", [](json& j) { tc(j)["compress_ratios"][2] = 3; }, "compress_ratios[2]"},
    {"draft stage with a ratio", [](json& j) { tc(j)["compress_ratios"][8] = 1; }, "compress_ratios[8]"},
    {"reuse layer with no kv source",
     [](json& j) { tc(j)["kv_source_layer_ids"] = {3}; tc(j)["index_source_layer_ids"] = {3, 5}; },
     "kv_source_layer_ids"},
    {"kv source that is not an index source", [](json& j) { tc(j)["index_source_layer_ids"] = {3, 5}; },
     "index_source_layer_ids"},
    {"kv source with ratio 0", [](json& j) { tc(j)["kv_source_layer_ids"] = {0, 1, 3}; }, "kv_source_layer_ids"},
    {"reuse ratio differs from its source", [](json& j) { tc(j)["compress_ratios"][2] = 1; }, "compress_ratios[2]"},
    {"candidate budget below index_topk",
     [](json& j) { tc(j)["candidate_topk_blocks"] = 1; tc(j)["candidate_block_size"] = 2; }, "candidate_topk_blocks"},
    {"candidate source not an index source", [](json& j) { tc(j)["candidate_source_layer_id"] = 4; },
     "candidate_source_layer_id"},
    {"index source after candidate reads another kv source",
     [](json& j) {
       tc(j)["compress_ratios"] = {0, 2, 2, 1, 1, 1, 0, 0, 0, 0};
       tc(j)["kv_source_layer_ids"] = {1, 3, 4};
       tc(j)["index_source_layer_ids"] = {1, 3, 4};
     },
     "index_source_layer_ids"},
    {"unsorted index sources", [](json& j) { tc(j)["index_source_layer_ids"] = {3, 1, 5}; }, "index_source_layer_ids"},
    {"layer id out of range", [](json& j) { tc(j)["engram_layer_ids"] = {1, 7}; }, "engram_layer_ids[1]"},
    {"engram table count mismatch", [](json& j) { tc(j)["engram_num_embeddings"] = {152}; }, "engram_num_embeddings"},
    {"missing engram field", [](json& j) { tc(j).erase("engram_head_dim"); }, "engram_head_dim"},
    {"missing dspark field", [](json& j) { tc(j).erase("dspark_markov_rank"); }, "dspark_markov_rank"},
    {"noise token outside vocab", [](json& j) { tc(j)["dspark_noise_token_id"] = 256; }, "dspark_noise_token_id"},
    {"top-k above expert count", [](json& j) { tc(j)["num_experts_per_tok"] = 5; }, "num_experts_per_tok"},
    {"missing rms_norm_eps (never defaulted for V4.1)", [](json& j) { tc(j).erase("rms_norm_eps"); }, "rms_norm_eps"},
    {"rope head dim above head dim", [](json& j) { tc(j)["qk_rope_head_dim"] = 80; }, "qk_rope_head_dim"},
    {"unknown rope scaling", [](json& j) { tc(j)["rope_scaling"]["rope_type"] = "linear"; }, "rope_scaling"},
    {"YaRN mscale", [](json& j) { tc(j)["rope_scaling"]["mscale"] = 1.0; }, "mscale"},
    {"two KV heads", [](json& j) { tc(j)["num_key_value_heads"] = 2; }, "num_key_value_heads"},
    {"non-square weight blocks", [](json& j) { j["quantization_config"]["weight_block_size"] = {32, 64}; },
     "weight_block_size"},
    {"int8 quantisation", [](json& j) { j["quantization_config"]["quant_method"] = "int8"; }, "quant_method"},
    {"unknown expert dtype", [](json& j) { j["quantization_config"]["expert_dtype"] = "int4"; }, "expert_dtype"},
    {"hash layers on V4.1", [](json& j) { tc(j)["num_hash_layers"] = 2; }, "num_hash_layers"},
    {"unknown scoring", [](json& j) { tc(j)["scoring_func"] = "tanh"; }, "scoring_func"},
    {"zero window", [](json& j) { tc(j)["sliding_window"] = 0; }, "sliding_window"},
    {"negative eps", [](json& j) { tc(j)["rms_norm_eps"] = -1e-6; }, "rms_norm_eps"},
    {"absurd expert count", [](json& j) { tc(j)["n_routed_experts"] = 1000000000; }, "n_routed_experts"},
    {"int too wide for 32 bits", [](json& j) { tc(j)["candidate_source_layer_id"] = 1LL << 40; },
     "candidate_source_layer_id"},
};

// Test names from the case description, letters and digits only (ctest-friendly).
std::string case_name(const char* what) {
  std::string n;
  for (const char* c = what; *c; ++c) n += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Mutations, ConfigErrors, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param.what); });

TEST(ConfigErrorsMisc, BadJsonAndWrongTopLevel) {
  auto a = parse_config("{\"text_config\": ", "broken.json");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kParseError);
  EXPECT_NE(a.status().message().find("broken.json"), std::string::npos);
  auto b = parse_config("[1, 2]", "list.json");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("object"), std::string::npos);
}

// Issue 14: a deep value used to be dumped into the type error ("vocab_size: expected an
// integer, got [[[...") and the 1M-level dump overflowed the stack; now the raw text is refused.
// A member of the wrong type is an error naming it, never an exception: the format detection
// once read model_type with nlohmann's value(), which throws on a number (found by fuzzing,
// tests/fuzz/corpus/config).
TEST(ConfigErrorsMisc, NonStringModelTypeIsAnErrorNotAnException) {
  for (const char* text : {R"({"model_type": 129280, "dim": 182})", R"({"model_type": [1], "vocab_size": 10})",
                           R"({"model_type": {"a": 1}})"}) {
    Result<ModelConfig> r = parse_config(text, "typed.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("typed.json"), std::string::npos) << r.status().message();
  }
}

TEST(ConfigErrorsMisc, DeepConfigIsRejectedBeforeParsing) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  auto a = parse_config(R"({"vocab_size":)" + deep + "}", "deep.json");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kParseError);
  EXPECT_NE(a.status().message().find("deep.json"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("nested deeper than 16 levels"), std::string::npos) << a.status().message();
  // Through load_config, from a file.
  testutil::TempDir d;
  testutil::write_file(d / "config.json", R"({"text_config":)" + deep + "}");
  auto b = load_config(d.path());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(d / "config.json"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("nested deeper"), std::string::npos) << b.status().message();
}

TEST(ConfigErrorsMisc, OversizeConfigFileIsRefused) {
  testutil::TempDir d;
  // 16 MiB + 1 bytes of valid JSON (a valid config padded with spaces): only the size bound
  // can refuse it.
  std::string text = config_to_hf_json(*builtin_config("tiny-v41"));
  ASSERT_TRUE(parse_config(text, "ok.json").ok());
  text.insert(text.size() - 1, (16u << 20) + 1 - text.size(), ' ');
  testutil::write_file(d / "config.json", text);
  auto r = load_config(d.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange) << r.status().to_string();
  EXPECT_NE(r.status().message().find("config.json: larger than the limit"), std::string::npos)
      << r.status().message();
}

TEST(ConfigErrorsMisc, V4HashLayersBeyondLayers) {
  json j = json::parse(config_to_hf_json(*builtin_config("tiny-v4")));
  j["num_hash_layers"] = 5;
  auto r = parse_config(j.dump(), "v4.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_hash_layers"), std::string::npos) << r.status().message();
  j = json::parse(config_to_hf_json(*builtin_config("tiny-v4")));
  j["compress_ratios"][1] = 2;
  r = parse_config(j.dump(), "v4.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compress_ratios[1]"), std::string::npos) << r.status().message();
  j = json::parse(config_to_hf_json(*builtin_config("tiny-v4")));
  j.erase("num_hash_layers");
  r = parse_config(j.dump(), "v4.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_hash_layers"), std::string::npos) << r.status().message();
}

// The strict §3.3 bound (K*B - (B-1) >= topk) only warns when the full budget still covers topk.
TEST(ConfigErrorsMisc, StrictCandidateBoundWarns) {
  json j = tiny_v41_json();
  tc(j)["candidate_topk_blocks"] = 1;
  tc(j)["candidate_block_size"] = 4;  // 4 - 3 = 1 < index_topk 4 <= 4
  auto r = parse_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_NE(r->warnings[0].find("candidate_topk_blocks"), std::string::npos);
  auto clean = parse_config(tiny_v41_json().dump(), "config.json");
  EXPECT_TRUE(clean->warnings.empty());
}

}  // namespace
}  // namespace flashseek::model
