// The official V4 encoder's own test cases (release `encoding/tests/test_input_N.json` ->
// `test_output_N.txt`) and random differential cases made with it. The files are not committed
// (third-party data), so these two checks are not part of the suite (gtest DISABLED_, which ctest
// lists as disabled rather than passing or skipping on every machine). Run them by hand with
// FLASHSEEK_DSV4_ENCODING_DIR=<release encoding/> and FLASHSEEK_DSV4_CASES=<cases.json> set:
//   build/tests/test_tokenizer --gtest_also_run_disabled_tests --gtest_filter='ChatGoldenV4.*'
// Asked for without their data they fail, naming the variable. Plus a V4/V4.1 parity property
// that needs no data (always runs).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tokenizer/chat_encoder.h"
#include "tokenizer/chat_parser.h"

namespace flashseek::tok {
namespace {

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

struct OfficialCase {
  int n;
  ThinkingMode mode;
};

TEST(ChatGoldenV4, DISABLED_OfficialEncoderCases) {
  const char* dir = std::getenv("FLASHSEEK_DSV4_ENCODING_DIR");
  ASSERT_NE(dir, nullptr) << "set FLASHSEEK_DSV4_ENCODING_DIR to the release's encoding/ folder";
  for (const OfficialCase c : {OfficialCase{1, ThinkingMode::kThinking},
                               OfficialCase{2, ThinkingMode::kThinking},
                               OfficialCase{3, ThinkingMode::kThinking},
                               OfficialCase{4, ThinkingMode::kChat}}) {
    std::string input, gold;
    const std::string base = std::string(dir) + "/tests/test_";
    ASSERT_TRUE(read_file(base + "input_" + std::to_string(c.n) + ".json", input)) << c.n;
    ASSERT_TRUE(read_file(base + "output_" + std::to_string(c.n) + ".txt", gold)) << c.n;
    ChatJson data = ChatJson::parse(input);
    ChatJson messages = data;
    if (data.is_object()) {  // case 1: {"tools", "messages"}, tools go to the first message
      messages = data["messages"];
      messages[0]["tools"] = data["tools"];
    }
    ChatOptions o;
    o.family = ChatFamily::kV4;
    o.thinking_mode = c.mode;
    auto r = encode_messages(messages, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->prompt, gold) << "case " << c.n;

    // Every assistant turn rendered with its reasoning parses back to that message.
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatJson& m = messages[i];
      if (m.value("role", "") != "assistant" || c.mode != ThinkingMode::kThinking) continue;
      const std::string rc = m.value("reasoning_content", "");
      const size_t at = gold.find(rc + "</think>");
      if (rc.empty() || at == std::string::npos) continue;  // dropped from history
      const size_t end = gold.find("<｜end▁of▁sentence｜>", at);
      ParseOptions po;
      po.family = ChatFamily::kV4;
      po.thinking_mode = ThinkingMode::kThinking;
      po.strict = true;
      auto parsed = parse_completion(gold.substr(at, end + chat_tokens::kEos.size() - at), po);
      ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
      EXPECT_EQ(parsed->reasoning_content, rc);
      EXPECT_EQ(parsed->content, m.value("content", ""));
      EXPECT_EQ(parsed->tool_calls.size(), m.contains("tool_calls") ? m["tool_calls"].size() : 0u);
    }
  }
}

// Random differential cases produced by the official V4 encoder/parser with
// data/chat/make_v4_reference_cases.py (file given by FLASHSEEK_DSV4_CASES; run by hand, above).
// Known, documented deviation: in strict mode we reject an unclosed tool-call block, which the
// reference accepts when the text stops right at certain tag boundaries.
TEST(ChatGoldenV4, DISABLED_RandomReferenceCases) {
  const char* path = std::getenv("FLASHSEEK_DSV4_CASES");
  ASSERT_NE(path, nullptr) << "set FLASHSEEK_DSV4_CASES to a file of data/chat/make_v4_reference_cases.py";
  std::string body;
  ASSERT_TRUE(read_file(path, body)) << path;
  const ChatJson cases = ChatJson::parse(body);
  size_t n_encode = 0, n_parse = 0, n_unclosed = 0;
  for (const ChatJson& c : cases["encode"]) {
    ChatOptions o;
    o.family = ChatFamily::kV4;
    o.thinking_mode = c["mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
    o.drop_thinking = c["drop_thinking"].get<bool>();
    o.reasoning_effort = c["effort"];
    auto r = encode_messages(c["messages"], o);
    ASSERT_EQ(r.ok(), c.contains("out")) << c["messages"].dump();
    if (r.ok()) EXPECT_EQ(r->prompt, c["out"].get<std::string>()) << c["messages"].dump();
    ++n_encode;
  }
  for (const ChatJson& c : cases["parse"]) {
    ParseOptions o;
    o.family = ChatFamily::kV4;
    o.strict = true;
    o.thinking_mode = c["mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
    const std::string text = c["text"];
    auto r = parse_completion(text, o);
    if (!c.contains("out")) {
      EXPECT_FALSE(r.ok()) << ChatJson(text).dump();
    } else if (!r.ok() && r.status().message().find("not closed") != std::string::npos) {
      ++n_unclosed;
    } else {
      ASSERT_TRUE(r.ok()) << r.status().to_string() << " " << ChatJson(text).dump();
      const ChatJson& want = c["out"];
      EXPECT_EQ(r->reasoning_content, want["reasoning_content"]);
      EXPECT_EQ(r->content, want["content"]);
      ASSERT_EQ(r->tool_calls.size(), want["tool_calls"].size()) << ChatJson(text).dump();
      for (size_t i = 0; i < r->tool_calls.size(); ++i) {
        EXPECT_EQ(r->tool_calls[i].name, want["tool_calls"][i]["function"]["name"]);
        EXPECT_EQ(r->tool_calls[i].arguments, want["tool_calls"][i]["function"]["arguments"]);
      }
    }
    ++n_parse;
  }
  EXPECT_GT(n_encode, 0u);
  EXPECT_GT(n_parse, 0u);
  EXPECT_LT(n_unclosed * 20, n_parse);  // the deviation stays a rare boundary case
}

// Spec §7.3: for plain chat turns without system or tools (chat mode) both encoders agree.
TEST(ChatGoldenV4, PlainChatTurnsIdenticalInV4AndV41) {
  const ChatJson msgs = ChatJson::parse(R"([{"role":"user","content":"你好"},
      {"role":"assistant","content":"Hi!","reasoning_content":"r"},{"role":"user","content":"2+2?"},
      {"role":"assistant","content":"4"},{"role":"user","content":"thanks"}])");
  ChatOptions v4, v41;
  v4.family = ChatFamily::kV4;
  auto a = encode_messages(msgs, v4);
  auto b = encode_messages(msgs, v41);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->prompt, b->prompt);
}

}  // namespace
}  // namespace flashseek::tok
