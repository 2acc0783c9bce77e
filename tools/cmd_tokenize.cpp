// flashseek tokenize: text -> ids, or ids -> text with --decode (logic in src/tokenizer).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_ids.h"
#include "tokenizer/tokenizer_locate.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

struct TokenizeOpts {
  std::string text, file, tokenizer, added_tokens;
  bool decode = false, json = false, has_text = false;
};

Result<std::string> read_input(const TokenizeOpts& o) {
  if (o.has_text) return o.text;
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return not_found("cannot read --file '{}'", o.file);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error("error while reading --file '{}'", o.file);
  return data;
}

int fail(const Status& st) {
  std::fprintf(stderr, "flashseek tokenize: error: %s\n", st.message().c_str());
  return 1;
}

int run(const TokenizeOpts& o) {
  auto input = read_input(o);
  if (!input.ok()) return fail(input.status());
  auto tok = tok::load_v41_tokenizer(o.tokenizer, o.added_tokens);
  if (!tok.ok()) return fail(tok.status());
  if (o.decode) {
    auto ids = tok::parse_token_ids(*input);
    if (!ids.ok()) return fail(ids.status());
    auto text = tok->decode_checked(*ids);
    if (!text.ok()) return fail(text.status());
    if (o.json) {
      std::printf("%s\n", nlohmann::json{{"text", *text}, {"count", ids->size()}}.dump().c_str());
    } else {
      std::fwrite(text->data(), 1, text->size(), stdout);
      std::fputc('\n', stdout);
    }
    return 0;
  }
  auto ids = tok->encode_checked(*input);
  if (!ids.ok()) return fail(ids.status());
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"ids", *ids}, {"count", ids->size()}}.dump().c_str());
  } else {
    std::printf("%s\n", tok::format_token_ids(*ids, " ").c_str());
  }
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tokenize", "encode text to DeepSeek-V4.1 token ids, or decode ids with --decode");
  auto o = std::make_shared<TokenizeOpts>();
  auto* text = cmd->add_option("--text", o->text, "input text (with --decode: ids like '1 2 3' or '1,2,3')");
  auto* file = cmd->add_option("--file", o->file, "read the input from this file instead");
  text->excludes(file);
  cmd->add_flag("--decode", o->decode, "input is token ids; print the text");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json or its directory (default: $FLASHSEEK_TOKENIZER, then "
                  "models/tokenizer/tokenizer.json of the repository)");
  cmd->add_option("--added-tokens", o->added_tokens,
                  "V4.1 added-token table (default: data/tokenizer/v41_added_tokens.json)");
  cmd->add_flag("--json", o->json, "print a JSON object ({\"ids\":[...]} or {\"text\":...})");
  return [o, text, file]() -> int {
    if (text->count() == 0 && file->count() == 0) {
      return fail(invalid_argument("one of --text or --file is required"));
    }
    o->has_text = text->count() > 0;
    return run(*o);
  };
}

FS_REGISTER_COMMAND("tokenize", setup);

}  // namespace
}  // namespace flashseek::tools
