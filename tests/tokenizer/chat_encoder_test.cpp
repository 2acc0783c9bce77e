// Chat encoder: the worked examples of spec model-v41.md §7.4 (exact strings) and the rules of
// §7.3/§7.5/§7.7 on hand-built conversations, V4.1 and V4.
#include <gtest/gtest.h>

#include <string>

#include "tokenizer/chat_encoder.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;
const std::string BOS(kBos), EOS(kEos), SYS(kSystem), USR(kUser), AST(kAssistant), TH(kThinkStart),
    ETH(kThinkEnd);
const std::string kEffort50 =
    "Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

ChatOptions opts(ThinkingMode mode, ChatFamily family = ChatFamily::kV41) {
  ChatOptions o;
  o.family = family;
  o.thinking_mode = mode;
  return o;
}

std::string encode_ok(const ChatJson& msgs, const ChatOptions& o) {
  auto r = encode_messages(msgs, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->prompt : std::string();
}

std::string encode_err(const ChatJson& msgs, const ChatOptions& o) {
  auto r = encode_messages(msgs, o);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

const ChatJson kSysHi = ChatJson::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"}])");

TEST(ChatEncoderSpecExamples, ChatModeWithSystem) {
  EXPECT_EQ(encode_ok(kSysHi, opts(ThinkingMode::kChat)), BOS + SYS + "S" + USR + "Hi" + AST + ETH);
}

TEST(ChatEncoderSpecExamples, ThinkingModeDefaultEffort) {
  EXPECT_EQ(encode_ok(kSysHi, opts(ThinkingMode::kThinking)),
            BOS + SYS + kEffort50 + "S" + USR + "Hi" + AST + TH);
}

TEST(ChatEncoderSpecExamples, ThinkingHistoryReasoningDropped) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"u1"},
      {"role":"assistant","reasoning_content":"r1","content":"c1"},{"role":"user","content":"u2"}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kThinking)),
            BOS + SYS + kEffort50 + USR + "u1" + AST + ETH + "c1" + EOS + USR + "u2" + AST + TH);
}

TEST(ChatEncoderSpecExamples, ChatModeWithoutSystemHasNoSystemToken) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"Hi"}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)), BOS + USR + "Hi" + AST + ETH);
}

TEST(ChatEncoder, BosEmittedOnceOrNotAtAll) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},
      {"role":"user","content":"c"}])");
  const std::string p = encode_ok(msgs, opts(ThinkingMode::kThinking));
  EXPECT_EQ(p.find(BOS), 0u);
  EXPECT_EQ(p.find(BOS, 1), std::string::npos);
  ChatOptions o = opts(ThinkingMode::kThinking);
  o.add_bos = false;
  EXPECT_EQ(encode_ok(msgs, o), p.substr(BOS.size()));
}

TEST(ChatEncoder, DropThinkingFalseKeepsHistoryReasoning) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"u1"},
      {"role":"assistant","reasoning_content":"r1","content":"c1"},{"role":"user","content":"u2"}])");
  ChatOptions o = opts(ThinkingMode::kThinking);
  o.drop_thinking = false;
  EXPECT_EQ(encode_ok(msgs, o),
            BOS + SYS + kEffort50 + USR + "u1" + AST + TH + "r1" + ETH + "c1" + EOS + USR + "u2" +
                AST + TH);
}

TEST(ChatEncoder, ChatModeNeverRendersReasoning) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"u1"},
      {"role":"assistant","reasoning_content":"r1","content":"c1"},{"role":"user","content":"u2"}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)),
            BOS + USR + "u1" + AST + ETH + "c1" + EOS + USR + "u2" + AST + ETH);
}

TEST(ChatEncoder, DeveloperBeforeLastUserIsDeletedInThinkingMode) {
  auto msgs = ChatJson::parse(R"([{"role":"developer","content":"dev"},{"role":"assistant","content":"a"},
      {"role":"user","content":"u"}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kThinking)),
            BOS + SYS + kEffort50 + "a" + EOS + USR + "u" + AST + TH);
  // Chat mode keeps it (rendered like a user turn).
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)),
            BOS + USR + "dev" + AST + ETH + "a" + EOS + USR + "u" + AST + ETH);
}

TEST(ChatEncoder, LastAssistantKeepsReasoningAndPrefixWithoutEos) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"q"},
      {"role":"assistant","reasoning_content":"think","content":"part","wo_eos":true}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kThinking)),
            BOS + SYS + kEffort50 + USR + "q" + AST + TH + "think" + ETH + "part");
}

TEST(ChatEncoder, EffortValues) {
  auto line = [](int b) {
    return "Reasoning Effort: " + std::to_string(b) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  };
  const ChatJson msgs = ChatJson::parse(R"([{"role":"user","content":"x"}])");
  const std::pair<ChatJson, int> ok_cases[] = {{1, 1}, {100, 100}, {37, 37}, {"low", 25},
                                               {"high", 50}, {"xhigh", 75}, {"max", 100}};
  for (const auto& [effort, budget] : ok_cases) {
    ChatOptions o = opts(ThinkingMode::kThinking);
    o.reasoning_effort = effort;
    EXPECT_EQ(encode_ok(msgs, o), BOS + SYS + line(budget) + USR + "x" + AST + TH) << effort.dump();
    o.thinking_mode = ThinkingMode::kChat;  // chat mode: no effort line, value still validated
    EXPECT_EQ(encode_ok(msgs, o), BOS + USR + "x" + AST + ETH);
  }
  for (const ChatJson bad : {ChatJson(0), ChatJson(101), ChatJson(-3), ChatJson("medium"),
                             ChatJson("none"), ChatJson(50.0), ChatJson(true)}) {
    ChatOptions o = opts(ThinkingMode::kChat);
    o.reasoning_effort = bad;
    EXPECT_NE(encode_err(msgs, o).find("reasoning_effort"), std::string::npos) << bad.dump();
  }
}

TEST(ChatEncoder, EffortTableFromJson) {
  auto t = EffortTable::from_json(ChatJson::parse(R"({"low":10,"max":90,"default":"max"})"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->resolve(nullptr), 90);
  EXPECT_EQ(*t->resolve("low"), 10);
  EXPECT_FALSE(t->resolve("high").ok());
  EXPECT_FALSE(EffortTable::from_json(ChatJson::parse(R"({"low":0})")).ok());
  EXPECT_FALSE(EffortTable::from_json(ChatJson::parse(R"({"low":5,"default":"x"})")).ok());
  EXPECT_FALSE(EffortTable::from_json(ChatJson::parse("[1]")).ok());
}

TEST(ChatEncoder, LatestReminderAndMidConversationSystem) {
  auto msgs = ChatJson::parse(R"([{"role":"system","content":"S"},{"role":"latest_reminder","content":"date"},
      {"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"system","content":"S2"}])");
  // V4.1: a system message at i > 0 gets <｜System｜> and opens the assistant turn.
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)),
            BOS + SYS + "S" + std::string(kLatestReminder) + "date" + USR + "u" + AST + ETH + "a" +
                EOS + SYS + "S2" + AST + ETH);
  // V4: no system token; a trailing system message does not open an assistant turn.
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat, ChatFamily::kV4)),
            BOS + "S" + std::string(kLatestReminder) + "date" + USR + "u" + AST + ETH + "a" + EOS +
                "S2");
}

TEST(ChatEncoder, QuickInstructionTasks) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":"u","task":"query"}])");
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)), BOS + USR + "u<｜query｜>");
  msgs = ChatJson::parse(R"([{"role":"user","content":"u","task":"action"},
      {"role":"assistant","reasoning_content":"hidden","content":"act"}])");
  // The action turn opens with AST + think token + <｜action｜>; its answer has no thinking part.
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kThinking)),
            BOS + SYS + kEffort50 + USR + "u" + AST + TH + "<｜action｜>act" + EOS);
  EXPECT_EQ(encode_ok(msgs, opts(ThinkingMode::kChat)),
            BOS + USR + "u" + AST + ETH + "<｜action｜>act" + EOS);
  encode_err(ChatJson::parse(R"([{"role":"user","content":"u","task":"bogus"}])"),
             opts(ThinkingMode::kChat));
}

TEST(ChatEncoder, ContentPartsAndImages) {
  auto msgs = ChatJson::parse(R"([{"role":"user","content":[{"type":"text","text":"look"},
      {"type":"image_url","image_url":{"url":"http://x/a.png"}},{"type":"text","text":"there"}]}])");
  auto r = encode_messages(msgs, opts(ThinkingMode::kChat));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt, BOS + USR + "look\n\n" + std::string(kImage) + "\n\nthere" + AST + ETH);
  ASSERT_EQ(r->images.size(), 1u);
  EXPECT_EQ(r->images[0]["url"], "http://x/a.png");
  // V4 has no image input.
  EXPECT_NE(encode_err(msgs, opts(ThinkingMode::kChat, ChatFamily::kV4)).find("image"),
            std::string::npos);
  // Text-only parts work in both families.
  auto text_parts = ChatJson::parse(R"([{"role":"user","content":[{"type":"text","text":"a"},
      {"type":"text","text":"b"}]}])");
  EXPECT_EQ(encode_ok(text_parts, opts(ThinkingMode::kChat)), BOS + USR + "a\n\nb" + AST + ETH);
  EXPECT_EQ(encode_ok(text_parts, opts(ThinkingMode::kChat, ChatFamily::kV4)),
            BOS + USR + "a\n\nb" + AST + ETH);
}

TEST(ChatEncoder, InvalidInputIsAnError) {
  const ChatOptions o = opts(ThinkingMode::kChat);
  EXPECT_NE(encode_err(ChatJson::parse(R"({"role":"user"})"), o).find("array"), std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"wizard","content":"x"}])"), o).find("messages[0].role"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"content":"x"}])"), o).find("role"), std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"user","content":"a<｜deepseek_image｜>"}])"), o)
                .find("image placeholder"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"user","content":[{"type":"text","text":"<｜deepseek_image｜>"}]}])"), o)
                .find("content[0].text"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"developer","content":""}])"), o).find("developer"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"user","content":5}])"), o).find("content"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"user","content":[{"type":"image_url"}]}])"), o)
                .find("no url"),
            std::string::npos);
  EXPECT_NE(encode_err(ChatJson::parse(R"([{"role":"system","content":"s","tools":{"a":1}}])"), o)
                .find("tools"),
            std::string::npos);
}

}  // namespace
}  // namespace flashseek::tok
