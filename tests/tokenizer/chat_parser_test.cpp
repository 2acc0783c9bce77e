// One-shot output parser (spec model-v41.md §7.6): round trips through the encoder's assistant
// rendering, lenient vs strict endings, truncation, and every format error.
#include <gtest/gtest.h>

#include "tokenizer/chat_encoder.h"
#include "tokenizer/chat_parser.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;
const std::string EOS(kEos), ETH(kThinkEnd);

// Text the model would generate for `assistant`: the encoder's rendering of it after a user turn.
std::string render_assistant(const ChatJson& assistant, ChatFamily family, ThinkingMode mode) {
  ChatOptions o;
  o.family = family;
  o.thinking_mode = mode;
  ChatJson msgs = ChatJson::array({ChatJson{{"role", "user"}, {"content", "q"}}});
  const std::string prefix = encode_messages(msgs, o)->prompt;
  msgs.push_back(assistant);
  auto full = encode_messages(msgs, o);
  EXPECT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_EQ(full->prompt.substr(0, prefix.size()), prefix);
  return full->prompt.substr(prefix.size());
}

ParseOptions popts(ThinkingMode mode, ChatFamily family = ChatFamily::kV41, bool strict = false) {
  ParseOptions o;
  o.family = family;
  o.thinking_mode = mode;
  o.strict = strict;
  return o;
}

Status parse_status(std::string_view text, const ParseOptions& o) {
  auto r = parse_completion(text, o);
  return r.ok() ? Status() : r.status();
}

TEST(ChatParser, RoundTripReasoningContentAndToolCalls) {
  const ChatJson args_a = ChatJson::parse(
      R"({"s":"multi\nline \"quoted\" <tag> 日本語","i":42,"f":-0.5,"b":false,"n":null,"arr":[1,[2,{"x":"y"}]],"o":{"k":"v"}})");
  const ChatJson args_b = ChatJson::object();
  ChatJson assistant = {{"role", "assistant"}, {"reasoning_content", "Let me think.\nStep 2 </th"},
                        {"content", "I'll call two tools."}};
  assistant["tool_calls"] = ChatJson::array(
      {{{"id", "x"}, {"type", "function"}, {"function", {{"name", "alpha"}, {"arguments", args_a.dump()}}}},
       {{"id", "y"}, {"type", "function"}, {"function", {{"name", "beta"}, {"arguments", args_b}}}}});
  for (ChatFamily family : {ChatFamily::kV41, ChatFamily::kV4}) {
    const std::string text = render_assistant(assistant, family, ThinkingMode::kThinking);
    for (bool strict : {false, true}) {
      auto r = parse_completion(text, popts(ThinkingMode::kThinking, family, strict));
      ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n" << text;
      EXPECT_EQ(r->reasoning_content, assistant["reasoning_content"]);
      EXPECT_EQ(r->content, assistant["content"]);
      EXPECT_EQ(r->stop, ParseStop::kEos);
      ASSERT_EQ(r->tool_calls.size(), 2u);
      EXPECT_EQ(r->tool_calls[0].name, "alpha");
      EXPECT_EQ(r->tool_calls[1].name, "beta");
      // The arguments text is exactly Python's json.dumps of the original object.
      EXPECT_EQ(r->tool_calls[0].arguments, py_json_dumps(args_a));
      EXPECT_EQ(r->tool_calls[1].arguments, "{}");
      EXPECT_EQ(ChatJson::parse(r->tool_calls[0].arguments), args_a);
      EXPECT_NE(r->tool_calls[0].id, r->tool_calls[1].id);
      EXPECT_EQ(r->tool_calls[0].id, make_tool_call_id(0, 0));
    }
  }
}

TEST(ChatParser, ChatModeContentAndEndings) {
  auto r = parse_completion("Hello there." + EOS, popts(ThinkingMode::kChat));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->content, "Hello there.");
  EXPECT_EQ(r->reasoning_content, "");
  EXPECT_EQ(r->stop, ParseStop::kEos);
  // EOS stripped by the caller: lenient accepts it, strict (reference) does not.
  r = parse_completion("Hello", popts(ThinkingMode::kChat));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, ParseStop::kEnd);
  EXPECT_EQ(parse_status("Hello", popts(ThinkingMode::kChat, ChatFamily::kV41, true)).code(),
            StatusCode::kParseError);
  // Tool calls may end without EOS even in strict mode (as in the reference).
  const std::string calls = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  r = parse_completion(calls, popts(ThinkingMode::kChat, ChatFamily::kV41, true));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->stop, ParseStop::kEnd);
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].arguments, "{}");
  EXPECT_TRUE(r->to_openai_message()["content"].is_null());
}

TEST(ChatParser, ThinkingModeTruncatedReasoning) {
  auto r = parse_completion("still thinking", popts(ThinkingMode::kThinking));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_content, "still thinking");
  EXPECT_EQ(r->stop, ParseStop::kTruncated);
  EXPECT_FALSE(parse_completion("still thinking", popts(ThinkingMode::kThinking, ChatFamily::kV41, true)).ok());
  r = parse_completion("r" + ETH + "c" + EOS, popts(ThinkingMode::kThinking));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_content, "r");
  EXPECT_EQ(r->content, "c");
}

TEST(ChatParser, TruncatedInsideToolCallKeepsWhatWasWritten) {
  const std::string text =
      "ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"a\">\n<｜DSML｜ parameter name=\"x\" "
      "string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"b\">\n"
      "<｜DSML｜ parameter name=\"p\" string=\"true\">hal";
  auto r = parse_completion(text, popts(ThinkingMode::kChat));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->stop, ParseStop::kTruncated);
  EXPECT_EQ(r->content, "ok");
  ASSERT_EQ(r->tool_calls.size(), 2u);
  EXPECT_EQ(r->tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(r->tool_calls[1].arguments, "{\"p\": \"hal");
  EXPECT_FALSE(parse_completion(text, popts(ThinkingMode::kChat, ChatFamily::kV41, true)).ok());
}

TEST(ChatParser, FormatErrors) {
  const ParseOptions chat = popts(ThinkingMode::kChat);
  const ParseOptions think = popts(ThinkingMode::kThinking);
  const std::string open = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n";
  const std::string close = "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::pair<std::string, ParseOptions> bad[] = {
      {"r\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>" + ETH, think},  // calls inside reasoning
      {"a" + EOS + "b", chat},                                      // text after EOS
      {"a<think>b" + EOS, chat},                                     // special token in content
      {"a</think>b", chat},
      {"x<｜begin▁of▁sentence｜>" + ETH + "c", think},              // special token in reasoning
      {"a ｜DSML｜ b", chat},
      {open + "<｜DSML｜ parameter name=\"k\" string=\"true\">1</｜DSML｜ parameter>\n"
                "<｜DSML｜ parameter name=\"k\" string=\"true\">2</｜DSML｜ parameter>\n" + close,
       chat},                                                        // duplicate parameter
      {open + "<｜DSML｜ parameter name=\"k\" string=\"maybe\">1</｜DSML｜ parameter>\n" + close, chat},
      {open + "<｜DSML｜ parameter name=\"k\" string=\"true\">1/｜DSML｜ parameter>\n" + close, chat},
      {open + "<｜DSML｜ parameter name=\"k\" string=\"true\">1</｜DSML｜ parameter>" + close, chat},
      {"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nam=\"f\">\n" + close, chat},   // bad header
      {"\n\n<｜DSML｜ calls>x\n" + close, chat},                     // junk after the block tag
      {open + close + "trailing", chat},                            // text after the block
      {open + close + EOS + "x", chat},
      {"\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", chat},     // V4 tags under V4.1
  };
  for (const auto& [text, o] : bad) {
    const Status st = parse_status(text, o);
    EXPECT_EQ(st.code(), StatusCode::kParseError) << text;
  }
  // The V4 spelling parses under V4.
  EXPECT_TRUE(parse_completion("\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>",
                               popts(ThinkingMode::kChat, ChatFamily::kV4)).ok());
}

TEST(ChatParser, ToolCallIdsAreDeterministicAndSeeded) {
  EXPECT_EQ(make_tool_call_id(7, 0), make_tool_call_id(7, 0));
  EXPECT_NE(make_tool_call_id(7, 0), make_tool_call_id(7, 1));
  EXPECT_NE(make_tool_call_id(7, 0), make_tool_call_id(8, 0));
  EXPECT_EQ(make_tool_call_id(1, 2).size(), 5u + 16u);
  EXPECT_EQ(make_tool_call_id(1, 2).substr(0, 5), "call_");
}

TEST(ChatParser, OpenAiMessageShape) {
  ParsedMessage m;
  m.content = "hi";
  m.reasoning_content = "r";
  m.tool_calls.push_back({"call_1", "f", "{\"a\": 1}"});
  const ChatJson j = m.to_openai_message();
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["content"], "hi");
  EXPECT_EQ(j["reasoning_content"], "r");
  EXPECT_EQ(j["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
}

}  // namespace
}  // namespace flashseek::tok
