// Tokenizer construction from an HF tokenizer.json. Only the configuration DeepSeek uses is
// accepted (BPE model, empty normalizer, Split*/ByteLevel pre-tokenizer, ByteLevel decoder);
// anything else fails with a message naming the field, rather than tokenizing differently.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace flashseek::tok {
namespace {

using nlohmann::json;

Status check_normalizer(const json& j, const std::string& where) {
  if (!j.contains("normalizer") || j["normalizer"].is_null()) return Status::ok_status();
  const json& n = j["normalizer"];
  if (n.value("type", "") == "Sequence" && n.contains("normalizers") &&
      n["normalizers"].is_array() && n["normalizers"].empty()) {
    return Status::ok_status();
  }
  return {StatusCode::kUnimplemented,
          fmt::format("{}: normalizer '{}' is not supported (only none or an empty Sequence)",
                      where, n.value("type", "?"))};
}

// Collects the Split regexes of the pre-tokenizer; requires the trailing
// ByteLevel(add_prefix_space=false, use_regex=false) that DeepSeek uses.
Result<std::vector<std::string>> split_patterns(const json& j, const std::string& where) {
  if (!j.contains("pre_tokenizer") || !j["pre_tokenizer"].is_object()) {
    return parse_error("{}: missing 'pre_tokenizer'", where);
  }
  const json& pt = j["pre_tokenizer"];
  std::vector<json> steps;
  if (pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
      pt["pretokenizers"].is_array()) {
    steps.assign(pt["pretokenizers"].begin(), pt["pretokenizers"].end());
  } else {
    steps.push_back(pt);
  }
  std::vector<std::string> patterns;
  bool byte_level_seen = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string type = s.value("type", "");
    const std::string field = fmt::format("{}: pre_tokenizer step {} ({})", where, i, type);
    if (type == "Split" && !byte_level_seen) {
      if (!s.contains("pattern") || !s["pattern"].is_object() || !s["pattern"].contains("Regex") ||
          !s["pattern"]["Regex"].is_string()) {
        return parse_error("{}: needs pattern.Regex", field);
      }
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false)) {
        return Status{StatusCode::kUnimplemented,
                      fmt::format("{}: only behavior Isolated without invert is supported", field)};
      }
      patterns.push_back(s["pattern"]["Regex"].get<std::string>());
    } else if (type == "ByteLevel" && i + 1 == steps.size()) {
      if (s.value("use_regex", true) || s.value("add_prefix_space", true)) {
        return Status{StatusCode::kUnimplemented,
                      fmt::format("{}: only use_regex=false, add_prefix_space=false", field)};
      }
      byte_level_seen = true;
    } else {
      return Status{StatusCode::kUnimplemented, fmt::format("{}: unsupported step", field)};
    }
  }
  if (!byte_level_seen) return parse_error("{}: pre_tokenizer lacks a final ByteLevel", where);
  return patterns;
}

Status check_bpe_options(const json& m, const std::string& where) {
  if (m.value("type", "") != "BPE") {
    return {StatusCode::kUnimplemented,
            fmt::format("{}: model.type '{}' is not BPE", where, m.value("type", "?"))};
  }
  auto is_unset = [&](const char* key) { return !m.contains(key) || m[key].is_null(); };
  if (!is_unset("unk_token") || m.value("byte_fallback", false) || !is_unset("dropout") ||
      !is_unset("continuing_subword_prefix") || !is_unset("end_of_word_suffix")) {
    return {StatusCode::kUnimplemented,
            fmt::format("{}: model options unk_token/byte_fallback/dropout/subword affixes are "
                        "not supported",
                        where)};
  }
  return Status::ok_status();
}

Result<BpeModel> parse_bpe(const json& j, const std::string& where) {
  if (!j.contains("model") || !j["model"].is_object()) return parse_error("{}: no 'model'", where);
  const json& m = j["model"];
  FS_RETURN_IF_ERROR(check_bpe_options(m, where));
  if (!m.contains("vocab") || !m["vocab"].is_object()) {
    return parse_error("{}: model.vocab must be an object", where);
  }
  if (!m.contains("merges") || !m["merges"].is_array()) {
    return parse_error("{}: model.merges must be an array", where);
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(m["vocab"].size());
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) return parse_error("{}: model.vocab['{}'] is not an int", where, token);
    vocab.emplace_back(token, id.get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m["merges"].size());
  for (size_t i = 0; i < m["merges"].size(); ++i) {
    const json& e = m["merges"][i];
    if (e.is_string()) {  // legacy "left right"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return parse_error("{}: model.merges[{}] '{}' is not 'left right'", where, i, s);
      }
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return parse_error("{}: model.merges[{}] is neither a string nor a pair", where, i);
    }
  }
  auto bpe = BpeModel::create(vocab, merges);
  if (!bpe.ok()) return bpe.status().with_context(where);
  return bpe;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(const json& j, const std::string& where,
                                       const std::vector<AddedToken>* added_override) {
  if (!j.is_object()) return parse_error("{}: top level is not a JSON object", where);
  FS_RETURN_IF_ERROR(check_normalizer(j, where));
  if (j.contains("decoder") && !j["decoder"].is_null() &&
      j["decoder"].value("type", "") != "ByteLevel") {
    return Status{StatusCode::kUnimplemented,
                  fmt::format("{}: decoder '{}' is not ByteLevel", where,
                              j["decoder"].value("type", "?"))};
  }
  FS_ASSIGN_OR_RETURN(std::vector<std::string> patterns, split_patterns(j, where));
  FS_ASSIGN_OR_RETURN(BpeModel bpe, parse_bpe(j, where));
  auto pre = PreTokenizer::create(patterns);
  if (!pre.ok()) return pre.status().with_context(where);

  std::vector<AddedToken> added;
  if (added_override != nullptr) {
    added = *added_override;
  } else if (j.contains("added_tokens")) {
    FS_ASSIGN_OR_RETURN(added, parse_added_tokens(j["added_tokens"], where + ": added_tokens"));
  }
  // An added id inside the vocab must spell the same token (V3 stores BOS/EOS/pad in both).
  for (const AddedToken& t : added) {
    auto vocab_token = bpe.id_to_token(t.id);
    if (vocab_token && *vocab_token != t.content) {
      return invalid_argument("{}: added token id {} '{}' conflicts with vocab token '{}'", where,
                              t.id, t.content, *vocab_token);
    }
  }
  auto matcher = AddedTokenMatcher::create(std::move(added));
  if (!matcher.ok()) return matcher.status().with_context(where);
  return Tokenizer(std::move(bpe), std::move(pre).value(), std::move(matcher).value());
}

Result<Tokenizer> Tokenizer::load(const std::string& path, const TokenizerOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("tokenizer file '{}' cannot be opened", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return parse_error("tokenizer file '{}': invalid JSON: {}", path, e.what());
  }
  if (options.added_tokens_path.empty()) return from_json(j, path);
  FS_ASSIGN_OR_RETURN(std::vector<AddedToken> added,
                      load_added_tokens_file(options.added_tokens_path));
  return from_json(j, path, &added);
}

}  // namespace flashseek::tok
