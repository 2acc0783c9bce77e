// The `flashseek run` contract helpers: id parsing (list / @file), id range checks, JSON shape.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/run_contract.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

TEST(RunContract, ParsesIdLists) {
  EXPECT_EQ(*parse_token_ids("1,2,3"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*parse_token_ids(" 7 , 8\n9,"), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(*parse_token_ids("-4"), (std::vector<int32_t>{-4}));  // range is checked separately
  for (const char* bad : {"1,x,3", "1.5", "99999999999", "", " , ", "3a"}) {
    auto r = parse_token_ids(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_NE(parse_token_ids("1,x").status().message().find("item 1 ('x')"), std::string::npos);
}

TEST(RunContract, ParsesIdFiles) {
  flashseek::testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() / name) << text;
    return "@" + (dir.path() / name).string();
  };
  EXPECT_EQ(*parse_token_ids(write("a.json", "[5, 6, 7]")), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(*parse_token_ids(write("b.json", R"({"prompt_ids": [1]})")),
            (std::vector<int32_t>{1}));
  EXPECT_FALSE(parse_token_ids(write("c.json", "[1, \"2\"]")).ok());
  EXPECT_FALSE(parse_token_ids(write("d.json", "[1, 2")).ok());
  EXPECT_FALSE(parse_token_ids(write("e.json", R"({"x": 1})")).ok());
  auto missing = parse_token_ids("@" + (dir.path() / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
}

TEST(RunContract, ChecksVocabularyRange) {
  EXPECT_TRUE(check_token_ids({0, 9}, 10, "prompt").ok());
  auto st = check_token_ids({0, 10}, 10, "prompt");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("id 10 at position 1"), std::string::npos);
  EXPECT_FALSE(check_token_ids({-1}, 10, "prompt").ok());
}

TEST(RunContract, JsonShape) {
  GenerationResult r;
  r.tokens = {4, 2};
  r.logprobs = {{{4, -0.5f}, {{4, -0.5f}, {3, -1.5f}}}, {{2, -3.0f}, {{1, -0.1f}, {0, -2.5f}}}};
  r.prompt_logprobs = {std::nullopt, PositionLogprobs{{9, -4.0f}, {{9, -4.0f}, {8, -4.5f}}}};
  r.finish = FinishReason::kLength;
  auto j = nlohmann::json::parse(run_result_json(r, {.prompt_logprobs = true, .logprobs = true}));
  ASSERT_EQ(j.size(), 3u);  // exactly the contract's keys
  EXPECT_EQ(j["tokens"], nlohmann::json::array({4, 2}));
  ASSERT_EQ(j["prompt_logprobs"].size(), 2u);
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
  EXPECT_EQ(j["prompt_logprobs"][1].size(), 2u);
  EXPECT_EQ(j["prompt_logprobs"][1][0]["id"], 9);
  ASSERT_EQ(j["logprobs"].size(), 2u);
  EXPECT_EQ(j["logprobs"][0].size(), 2u);  // chosen token 4 is in the top-2
  ASSERT_EQ(j["logprobs"][1].size(), 3u);  // chosen token 2 is not: appended after the top-2
  EXPECT_EQ(j["logprobs"][1][2]["id"], 2);
  EXPECT_FLOAT_EQ(j["logprobs"][1][2]["logprob"].get<float>(), -3.0f);
  // K = 0: the keys stay, with empty arrays.
  auto k0 = nlohmann::json::parse(run_result_json(r, {}));
  EXPECT_TRUE(k0["prompt_logprobs"].empty());
  EXPECT_TRUE(k0["logprobs"].empty());
  EXPECT_EQ(k0["tokens"].size(), 2u);
}

}  // namespace
}  // namespace flashseek::engine
