#include "engine/run_contract.h"

#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace flashseek::engine {

namespace {

Result<std::vector<int32_t>> ids_from_json(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json* arr = &j;
  if (j.is_object()) {
    if (j.contains("prompt_ids")) arr = &j["prompt_ids"];
    else if (j.contains("tokens")) arr = &j["tokens"];
    else return parse_error("{}: expected a JSON array of ids or an object with \"prompt_ids\"",
                            where);
  }
  if (!arr->is_array()) return parse_error("{}: the token ids must be a JSON array", where);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto& v = (*arr)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      return parse_error("{}: item {} is not a 32-bit integer token id ({})", where, i, v.dump());
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return ids;
}

Result<std::vector<int32_t>> ids_from_list(std::string_view text) {
  std::vector<int32_t> ids;
  size_t i = 0, item = 0;
  auto sep = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  while (i < text.size()) {
    while (i < text.size() && sep(text[i])) ++i;
    if (i == text.size()) break;
    size_t j = i;
    while (j < text.size() && !sep(text[j])) ++j;
    const std::string_view tok = text.substr(i, j - i);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || end != tok.data() + tok.size())
      return parse_error("prompt ids: item {} ('{}') is not a 32-bit integer", item, tok);
    ids.push_back(v);
    ++item;
    i = j;
  }
  return ids;
}

// ordered_json keeps the contract's key order (prompt_logprobs, tokens, logprobs).
nlohmann::ordered_json position_json(const PositionLogprobs& lp) {
  auto list = nlohmann::ordered_json::array();
  bool has_chosen = false;
  for (const auto& t : lp.top) {
    list.push_back({{"id", t.id}, {"logprob", t.logprob}});
    has_chosen |= t.id == lp.chosen.id;
  }
  if (!has_chosen) list.push_back({{"id", lp.chosen.id}, {"logprob", lp.chosen.logprob}});
  return list;
}

}  // namespace

Result<std::vector<int32_t>> parse_token_ids(std::string_view text) {
  std::vector<int32_t> ids;
  if (!text.empty() && text.front() == '@') {
    const std::string path(text.substr(1));
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("prompt ids file {}: cannot be read", path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return parse_error("prompt ids file {}: not valid JSON", path);
    FS_ASSIGN_OR_RETURN(ids, ids_from_json(j, "prompt ids file " + path));
  } else {
    FS_ASSIGN_OR_RETURN(ids, ids_from_list(text));
  }
  if (ids.empty()) return invalid_argument("prompt ids: the list is empty");
  return ids;
}

Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, std::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return out_of_range("{}: id {} at position {} is outside the vocabulary [0, {})", what,
                          ids[i], i, vocab);
  return {};
}

std::string run_result_json(const GenerationResult& r, const RunJsonOptions& o) {
  nlohmann::ordered_json out;
  out["prompt_logprobs"] = nlohmann::ordered_json::array();
  if (o.prompt_logprobs)
    for (const auto& p : r.prompt_logprobs)
      out["prompt_logprobs"].push_back(p ? position_json(*p) : nlohmann::ordered_json(nullptr));
  out["tokens"] = r.tokens;
  out["logprobs"] = nlohmann::ordered_json::array();
  if (o.logprobs)
    for (const auto& lp : r.logprobs) out["logprobs"].push_back(position_json(lp));
  return out.dump(o.indent);
}

}  // namespace flashseek::engine
