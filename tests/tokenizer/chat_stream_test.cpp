// Streaming output parser: for texts rendered by the encoder (random conversations included),
// their truncations and malformed variants, feeding the text split at every byte position,
// byte by byte, and at random points gives deltas whose concatenation equals the one-shot parse;
// held-back delimiters and UTF-8 validity of every delta.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tokenizer/chat_encoder.h"
#include "tokenizer/chat_stream.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;
const std::string EOS(kEos), ETH(kThinkEnd);

struct Streamed {
  ChatDelta all;
  std::vector<ChatDelta> deltas;
  Result<ParsedMessage> final_msg = parse_error("not run");
};

Streamed stream(const std::string& text, const std::vector<size_t>& cuts, const ParseOptions& o) {
  Streamed s;
  ChatStreamParser p(o);
  size_t prev = 0;
  for (size_t cut : cuts) {
    s.deltas.push_back(p.push(std::string_view(text).substr(prev, cut - prev)));
    prev = cut;
  }
  s.deltas.push_back(p.push(std::string_view(text).substr(prev)));
  ChatDelta tail;
  s.final_msg = p.finish(&tail);
  s.deltas.push_back(tail);
  for (const ChatDelta& d : s.deltas) s.all.append(d);
  return s;
}

// Rebuilds the calls of a delta sequence: id/name from the first entry, arguments appended.
std::vector<ToolCall> assemble(const ChatDelta& all) {
  std::map<size_t, ToolCall> calls;
  for (const ToolCallDelta& d : all.tool_calls) {
    ToolCall& c = calls[d.index];
    if (!d.id.empty()) {
      EXPECT_TRUE(c.id.empty()) << "call " << d.index << " started twice";
      c.id = d.id;
      c.name = d.name;
    }
    c.arguments += d.arguments;
  }
  std::vector<ToolCall> out;
  for (auto& [i, c] : calls) {
    EXPECT_EQ(i, out.size());
    out.push_back(c);
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// The streaming invariant for one split.
void check_split(const std::string& text, const std::vector<size_t>& cuts, const ParseOptions& o,
                 bool check_utf8) {
  const Result<ParsedMessage> want = parse_completion(text, o);
  const Streamed s = stream(text, cuts, o);
  ASSERT_EQ(s.final_msg.ok(), want.ok());
  if (!want.ok()) {
    EXPECT_EQ(s.final_msg.status().message(), want.status().message());
    return;
  }
  EXPECT_EQ(*s.final_msg, *want);
  EXPECT_EQ(s.all.reasoning_content, want->reasoning_content);
  EXPECT_EQ(s.all.content, want->content);
  EXPECT_EQ(assemble(s.all), want->tool_calls);
  if (check_utf8) {
    for (const ChatDelta& d : s.deltas) {
      EXPECT_TRUE(valid_utf8(d.reasoning_content) && valid_utf8(d.content));
      for (const auto& t : d.tool_calls) EXPECT_TRUE(valid_utf8(t.arguments)) << t.arguments;
    }
  }
}

// Every 2-piece split, byte by byte, and a few random multi-piece splits.
void check_all_splits(const std::string& text, const ParseOptions& o, std::mt19937& rng) {
  for (size_t k = 0; k <= text.size(); ++k) check_split(text, {k}, o, false);
  std::vector<size_t> bytes;
  for (size_t k = 1; k < text.size(); ++k) bytes.push_back(k);
  check_split(text, bytes, o, /*check_utf8=*/true);
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<size_t> cuts;
    for (size_t k = 1; k < text.size(); ++k) {
      if (rng() % 7 == 0) cuts.push_back(k);
    }
    check_split(text, cuts, o, true);
  }
}

// --- random assistant messages ------------------------------------------------------------
const char* const kPieces[] = {"a", "Z", " ", "\n", "\n\n", "<", ">", "/", "\"", "=", "{", "}",
                               "é", "日本", "😀", "｜", "think", "DSML", "\\", "\t", "calls"};

std::string random_text(std::mt19937& rng, size_t max_pieces) {
  std::string s;
  const size_t n = rng() % (max_pieces + 1);
  for (size_t i = 0; i < n; ++i) s += kPieces[rng() % std::size(kPieces)];
  return s;
}

ChatJson random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 1 ? 6 : 8)) {
    case 0: return static_cast<int64_t>(rng() % 2001) - 1000;
    case 1: return std::ldexp(static_cast<double>(rng() % 100000) - 50000.0, static_cast<int>(rng() % 60) - 40);
    case 2: return rng() % 2 == 0;
    case 3: return nullptr;
    case 4: case 5: return random_text(rng, 6);
    case 6: {
      ChatJson a = ChatJson::array();
      for (size_t i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      ChatJson o = ChatJson::object();
      for (size_t i = rng() % 4; i > 0; --i) o["k" + random_text(rng, 2)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

ChatJson random_assistant(std::mt19937& rng) {
  ChatJson m = {{"role", "assistant"}, {"reasoning_content", random_text(rng, 12)},
                {"content", random_text(rng, 12)}};
  const size_t n_calls = rng() % 4;
  if (n_calls > 0) m["tool_calls"] = ChatJson::array();
  for (size_t c = 0; c < n_calls; ++c) {
    ChatJson args = ChatJson::object();
    for (size_t i = rng() % 5; i > 0; --i) args["p" + std::to_string(i) + random_text(rng, 2)] = random_value(rng, 0);
    m["tool_calls"].push_back({{"type", "function"},
                               {"function", {{"name", "fn_" + random_text(rng, 3)}, {"arguments", args}}}});
  }
  return m;
}

std::string render_assistant(const ChatJson& assistant, ChatFamily family, ThinkingMode mode) {
  ChatOptions o;
  o.family = family;
  o.thinking_mode = mode;
  ChatJson msgs = ChatJson::array({ChatJson{{"role", "user"}, {"content", "q"}}});
  const size_t prefix = encode_messages(msgs, o)->prompt.size();
  msgs.push_back(assistant);
  return encode_messages(msgs, o)->prompt.substr(prefix);
}

TEST(ChatStream, RandomRenderedMessagesAtEverySplit) {
  std::mt19937 rng(1234);
  int with_calls = 0, parsed_ok = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const ChatFamily family = iter % 3 == 2 ? ChatFamily::kV4 : ChatFamily::kV41;
    const ThinkingMode mode = iter % 2 == 0 ? ThinkingMode::kThinking : ThinkingMode::kChat;
    const ChatJson msg = random_assistant(rng);
    const std::string text = render_assistant(msg, family, mode);
    ParseOptions o;
    o.family = family;
    o.thinking_mode = mode;
    o.tool_call_id_seed = static_cast<uint64_t>(iter);
    auto parsed = parse_completion(text, o);
    // Random text may spell a special token ("</think>", "｜DSML｜") by accident: skip those.
    if (!parsed.ok()) continue;
    ++parsed_ok;
    if (mode == ThinkingMode::kThinking) EXPECT_EQ(parsed->reasoning_content, msg["reasoning_content"]);
    EXPECT_EQ(parsed->content, msg["content"]);
    const size_t n_calls = msg.contains("tool_calls") ? msg["tool_calls"].size() : 0;
    ASSERT_EQ(parsed->tool_calls.size(), n_calls) << text;
    for (size_t c = 0; c < n_calls; ++c) {
      EXPECT_EQ(parsed->tool_calls[c].arguments, py_json_dumps(msg["tool_calls"][c]["function"]["arguments"]));
      EXPECT_EQ(ChatJson::parse(parsed->tool_calls[c].arguments), msg["tool_calls"][c]["function"]["arguments"]);
    }
    with_calls += n_calls > 0;
    check_all_splits(text, o, rng);
    // Every truncation of the text (max_tokens) streams like its one-shot parse.
    for (size_t len = 0; len < text.size(); len += 1 + rng() % 5) check_split(text.substr(0, len), {len / 2}, o, false);
  }
  EXPECT_GE(parsed_ok, 55);
  EXPECT_GT(with_calls, 20);
}

TEST(ChatStream, MalformedAndEdgeTextsAtEverySplit) {
  std::mt19937 rng(99);
  const std::string open = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n";
  const std::string close = "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::string texts[] = {
      "plain answer" + EOS,
      "no eos at all \n\n<",
      "content then partial marker\n\n<｜DSML｜ ca",
      "r1 </thin r2" + ETH + "c" + EOS,
      "r\n\n<｜DSML｜ calls>\n" + ETH,  // calls inside reasoning: error
      "a" + EOS + "junk",
      open + "<｜DSML｜ parameter name=\"k\" string=\"true\">v <｜DSML｜ x </｜DSML｜ paramete</｜DSML｜ parameter>\n" + close + EOS,
      open + "<｜DSML｜ parameter name=\"k\" string=\"true\">1</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"k\" string=\"true\">2</｜DSML｜ parameter>\n" + close,
      open + "<｜DSML｜ parameter name=\"k\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜ parameter>\n" + close + EOS,
      open + "<｜DSML｜ parameter name=\"k\" string=\"true\">x/｜DSML｜ parameter>\n" + close,
      "\n\n<｜DSML｜ calls>\n" + close,
      "😀日本\n\n" + open + close,
  };
  for (const ThinkingMode mode : {ThinkingMode::kChat, ThinkingMode::kThinking}) {
    ParseOptions o;
    o.thinking_mode = mode;
    for (const std::string& t : texts) check_all_splits(t, o, rng);
  }
}

TEST(ChatStream, HoldsBackPossibleDelimiters) {
  ParseOptions o;
  o.thinking_mode = ThinkingMode::kThinking;
  ChatStreamParser p(o);
  EXPECT_EQ(p.push("Hello</th").reasoning_content, "Hello");
  ChatDelta d = p.push("ink>Hi\n\n<｜DS");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "Hi");
  d = p.push("ML｜ calls>\n<｜DSML｜ invoke name=\"get\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">ab<");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get");
  EXPECT_EQ(d.tool_calls[0].id, make_tool_call_id(0, 0));
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\": \"ab");  // the "<" may open the close tag
  d = p.push("/｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "\"}");
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  d = p.push_token(kEosId, "");  // specials skipped by the detokenizer: the id restores EOS
  EXPECT_TRUE(d.empty());
  auto final_msg = p.finish();
  ASSERT_TRUE(final_msg.ok()) << final_msg.status().to_string();
  EXPECT_EQ(final_msg->stop, ParseStop::kEos);
  EXPECT_EQ(final_msg->tool_calls[0].arguments, "{\"q\": \"ab\"}");
}

TEST(ChatStream, HeldTextIsReleasedWhenItIsNotADelimiter) {
  ChatStreamParser p(ParseOptions{});
  EXPECT_EQ(p.push("x\n\n<").content, "x");
  EXPECT_EQ(p.push("b>").content, "\n\n<b>");
  EXPECT_EQ(p.push("\xE6\x97").content, "");  // first two bytes of 日
  EXPECT_EQ(p.push("\xA5!").content, "日!");
  ChatDelta tail;
  auto r = p.finish(&tail);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(tail.empty());
  EXPECT_EQ(r->content, "x\n\n<b>日!");
}

TEST(ChatStream, OpenAiDeltaShape) {
  ChatDelta d;
  d.content = "c";
  d.tool_calls.push_back({0, "call_x", "f", ""});
  d.tool_calls.push_back({1, "", "", "{\"a\""});
  const ChatJson j = d.to_openai_delta();
  EXPECT_EQ(j["content"], "c");
  EXPECT_FALSE(j.contains("reasoning_content"));
  EXPECT_EQ(j["tool_calls"][0]["id"], "call_x");
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "");
  EXPECT_EQ(j["tool_calls"][1]["index"], 1);
  EXPECT_FALSE(j["tool_calls"][1].contains("id"));
  EXPECT_FALSE(j["tool_calls"][1]["function"].contains("name"));
}

}  // namespace
}  // namespace flashseek::tok
