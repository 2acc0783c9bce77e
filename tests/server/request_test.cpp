#include "server/request.h"

#include <gtest/gtest.h>

namespace flashseek::server {
namespace {

using json = nlohmann::json;

ParseLimits limits() {
  ParseLimits l;
  l.vocab_size = 1000;
  return l;
}

json chat_body() {
  return json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})");
}

TEST(ParseRequest, ChatDefaultsAndFields) {
  json body = chat_body();
  body["temperature"] = 0;
  body["max_completion_tokens"] = 7;
  body["stop"] = json::array({"END", 5});
  body["seed"] = -3;
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  body["thinking"] = {{"type", "enabled"}};
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  ParsedRequest r;
  auto err = parse_request(body, Endpoint::kChat, limits(), r);
  ASSERT_FALSE(err) << err->message;
  EXPECT_EQ(r.temperature, 0);
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.stop_strings, std::vector<std::string>{"END"});
  EXPECT_EQ(r.stop_ids, std::vector<int32_t>{5});
  EXPECT_EQ(*r.seed, uint64_t(-3));
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.chat.thinking);
  EXPECT_TRUE(r.stream && r.include_usage);
}

TEST(ParseRequest, ContentPartsAreJoined) {
  json body = chat_body();
  body["messages"][0]["content"] = json::parse(R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])");
  ParsedRequest r;
  ASSERT_FALSE(parse_request(body, Endpoint::kChat, limits(), r));
  EXPECT_EQ(r.messages[0]["content"], "a\nb");
}

TEST(ParseRequest, ReasoningEffortMapsToThinking) {
  for (auto [effort, thinking] : std::vector<std::pair<json, bool>>{
           {"none", false}, {"low", true}, {"max", true}, {50, true}}) {
    json body = chat_body();
    body["reasoning_effort"] = effort;
    ParsedRequest r;
    ASSERT_FALSE(parse_request(body, Endpoint::kChat, limits(), r)) << effort;
    EXPECT_EQ(r.chat.thinking, thinking) << effort;
  }
}

TEST(ParseRequest, CompletionPromptForms) {
  ParsedRequest r;
  json body = {{"model", "m"}, {"prompt", "text"}};
  ASSERT_FALSE(parse_request(body, Endpoint::kCompletions, limits(), r));
  EXPECT_EQ(*r.prompt_text, "text");
  body["prompt"] = json::array({1, 2, 3});
  ASSERT_FALSE(parse_request(body, Endpoint::kCompletions, limits(), r));
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  body["prompt"] = json::array({json::array({4, 5})});
  ASSERT_FALSE(parse_request(body, Endpoint::kCompletions, limits(), r));
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{4, 5}));
}

// Each bad body must be rejected with a 400 naming the right field.
TEST(ParseRequest, RejectsBadFieldsNamingThem) {
  struct Case {
    const char* patch;
    const char* param;
  };
  const Case cases[] = {
      {R"({"n": 2})", "n"},
      {R"({"temperature": 2.5})", "temperature"},
      {R"({"temperature": "hot"})", "temperature"},
      {R"({"top_p": 0})", "top_p"},
      {R"({"top_k": -2})", "top_k"},
      {R"({"max_tokens": 0})", "max_tokens"},
      {R"({"max_tokens": 1.5})", "max_tokens"},
      {R"({"seed": "x"})", "seed"},
      {R"({"stop": [""]})", "stop"},
      {R"({"stop": [1000]})", "stop"},
      {R"({"stop": {"a": 1}})", "stop"},
      {R"({"stream": "yes"})", "stream"},
      {R"({"stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"top_logprobs": 3})", "top_logprobs"},
      {R"({"logprobs": true, "top_logprobs": 99})", "top_logprobs"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {R"({"tools": [{"type": "function"}]})", "tools[0]"},
      {R"({"tool_choice": "sometimes"})", "tool_choice"},
      {R"({"thinking": {"type": "maybe"}})", "thinking"},
      {R"({"reasoning_effort": 500})", "reasoning_effort"},
      {R"({"presence_penalty": 1})", "presence_penalty"},
      {R"({"model": 7})", "model"},
  };
  for (const auto& c : cases) {
    json body = chat_body();
    body.merge_patch(json::parse(c.patch));
    ParsedRequest r;
    auto err = parse_request(body, Endpoint::kChat, limits(), r);
    ASSERT_TRUE(err) << c.patch;
    EXPECT_EQ(err->http_status, 400) << c.patch;
    EXPECT_EQ(err->param, c.param) << c.patch << ": " << err->message;
  }
  ParsedRequest r;
  auto err = parse_request(json::array(), Endpoint::kChat, limits(), r);
  ASSERT_TRUE(err);
  err = parse_request({{"model", "m"}, {"prompt", json::array({-1})}}, Endpoint::kCompletions,
                      limits(), r);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "prompt");
  err = parse_request({{"model", "m"}, {"prompt", json::array({"a", "b"})}},
                      Endpoint::kCompletions, limits(), r);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "prompt");
}

TEST(ApiError, BodyIsOpenAiShape) {
  auto j = json::parse(bad_request("bad", "x", "c").body());
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "x");
  EXPECT_EQ(j["error"]["code"], "c");
  EXPECT_TRUE(json::parse(bad_request("m").body())["error"]["param"].is_null());
  // Invalid UTF-8 in a message must not make serialisation throw.
  EXPECT_NO_THROW(bad_request(std::string("\xff\xfe")).body());
}

}  // namespace
}  // namespace flashseek::server
