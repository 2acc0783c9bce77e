// Generated text through the output parsers (tokenizer/chat_parser.h, chat_stream.h): a model's
// output is not trusted to follow the DSML format. Byte 0 picks the options (bit 0 V4, bit 1
// thinking, bit 2 strict), byte 1 the streaming piece lengths, the rest is the text. The stream
// parser's final result must be the one-shot parse (same error text on failure), and its deltas
// must add up to that result.
#include <map>

#include "fuzz/targets.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_stream.h"

namespace flashseek::fuzz {

bool run_completion(std::span<const uint8_t> d) {
  if (d.size() < 2) return false;
  tok::ParseOptions o;
  o.family = (d[0] & 1) ? tok::ChatFamily::kV4 : tok::ChatFamily::kV41;
  o.thinking_mode = (d[0] & 2) ? tok::ThinkingMode::kThinking : tok::ThinkingMode::kChat;
  o.strict = d[0] & 4;
  o.tool_call_id_seed = d[1];
  const std::string_view text = as_text(d.subspan(2));
  const auto want = tok::parse_completion(text, o);

  tok::ChatStreamParser p(o);
  tok::ChatDelta all;
  const size_t step = 1 + d[1] % 13;  // piece lengths step, 2·step, 3·step, ... cycling
  for (size_t at = 0, k = 1; at < text.size(); k = k % 5 + 1) {
    const size_t n = std::min(text.size() - at, step * k);
    all.append(p.push(text.substr(at, n)));
    at += n;
  }
  tok::ChatDelta tail;
  auto got = p.finish(&tail);
  all.append(tail);
  FUZZ_CHECK(got.ok() == want.ok(), "stream and one-shot parse disagree on success");
  if (!want.ok()) {
    FUZZ_CHECK(got.status().message() == want.status().message(), "different parse errors");
    return false;
  }
  FUZZ_CHECK(*got == *want, "stream result differs from the one-shot parse");
  FUZZ_CHECK(all.reasoning_content == want->reasoning_content, "reasoning deltas do not add up");
  FUZZ_CHECK(all.content == want->content, "content deltas do not add up");
  std::map<size_t, tok::ToolCall> calls;
  for (const auto& c : all.tool_calls) {
    tok::ToolCall& t = calls[c.index];
    if (!c.id.empty()) t.id = c.id, t.name = c.name;
    t.arguments += c.arguments;
  }
  FUZZ_CHECK(calls.size() == want->tool_calls.size(), "tool-call deltas name another number of calls");
  for (auto& [i, c] : calls) {
    FUZZ_CHECK(i < want->tool_calls.size() && c == want->tool_calls[i], "tool-call deltas do not add up");
  }
  // As the server writes it (server/api_error.h dump_json): invalid UTF-8 replaced, never thrown.
  (void)want->to_openai_message().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return true;
}

std::vector<Bytes> seeds_completion() {
  using namespace tok::chat_tokens;
  const std::string eos(kEos), eth(kThinkEnd);
  auto calls = [](tok::ChatFamily f) {
    const tok::DsmlTags& t = tok::dsml_tags(f);
    return "\n\n" + t.block_open() + "\n" + t.invoke_open() + " name=\"get_weather\">\n" + t.parameter_open() +
           " name=\"city\" string=\"true\">Paris" + t.parameter_close() + ">\n" + t.parameter_open() +
           " name=\"days\" string=\"false\">2" + t.parameter_close() + ">\n" + t.invoke_close() + ">\n" +
           t.block_close();
  };
  const std::string calls41 = calls(tok::ChatFamily::kV41), calls4 = calls(tok::ChatFamily::kV4);
  std::vector<Bytes> out;
  auto add = [&](uint8_t mode, const std::string& text) {
    Bytes b{mode, 3};
    b.insert(b.end(), text.begin(), text.end());
    out.push_back(std::move(b));
  };
  add(0, "Hello there." + eos);
  add(2, "let me think" + eth + "The answer is 4." + eos);
  add(0, "Checking." + calls41);
  add(2, "plan" + eth + calls41 + eos);
  add(4, "strict, closed." + eos);
  add(1, "V4 text" + eos);
  add(3, "r" + eth + "c" + calls4);
  return out;
}

}  // namespace flashseek::fuzz
