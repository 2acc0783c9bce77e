#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <fstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {

Result<std::vector<AddedToken>> parse_added_tokens(const nlohmann::json& array,
                                                   const std::string& where) {
  if (!array.is_array()) return parse_error("{}: added tokens must be a JSON array", where);
  std::vector<AddedToken> out;
  out.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const auto& e = array[i];
    if (!e.is_object() || !e.contains("id") || !e.contains("content") ||
        !e["id"].is_number_integer() || !e["content"].is_string()) {
      return parse_error("{}: added token [{}] needs an integer 'id' and a string 'content'",
                         where, i);
    }
    const int64_t id = e["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX) {
      return parse_error("{}: added token [{}] has id {} out of range", where, i, id);
    }
    out.push_back({static_cast<int32_t>(id), e["content"].get<std::string>()});
  }
  return out;
}

Result<std::vector<AddedToken>> load_added_tokens_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("added tokens file '{}' cannot be opened", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return parse_error("added tokens file '{}': invalid JSON: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("added_tokens")) {
    return parse_error("added tokens file '{}': no 'added_tokens' array", path);
  }
  return parse_added_tokens(j["added_tokens"], path);
}

Result<AddedTokenMatcher> AddedTokenMatcher::create(std::vector<AddedToken> tokens) {
  AddedTokenMatcher m;
  std::sort(tokens.begin(), tokens.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& t = tokens[i];
    if (t.content.empty()) return invalid_argument("added token id {} has an empty string", t.id);
    if (!utf8_is_valid(t.content)) {
      return invalid_argument("added token id {} is not valid UTF-8", t.id);
    }
    if (i > 0 && tokens[i - 1].id == t.id) {
      return invalid_argument("added token id {} is listed twice", t.id);
    }
    if (!seen.insert(t.content).second) {
      return invalid_argument("added token '{}' is listed twice", t.content);
    }
  }
  m.tokens_ = std::move(tokens);
  m.nodes_.emplace_back();
  for (size_t ti = 0; ti < m.tokens_.size(); ++ti) {
    const std::string& s = m.tokens_[ti].content;
    m.first_byte_[static_cast<uint8_t>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t next = m.child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(m.nodes_.size());
        m.nodes_.emplace_back();
        auto& kids = m.nodes_[node].children;
        kids.insert(std::upper_bound(kids.begin(), kids.end(), std::make_pair(b, INT32_MIN),
                                     [](const auto& x, const auto& y) { return x.first < y.first; }),
                    {b, next});
      }
      node = next;
    }
    m.nodes_[node].token = static_cast<int32_t>(ti);
  }
  return m;
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& kids = nodes_[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), byte,
                             [](const auto& kid, uint8_t b) { return kid.first < b; });
  return it != kids.end() && it->first == byte ? it->second : -1;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text,
                                                                size_t from) const {
  if (tokens_.empty()) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t j = pos; j < text.size(); ++j) {
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_len = j + 1 - pos;
      }
    }
    if (best >= 0) return Match{pos, best_len, tokens_[best].id};
  }
  return std::nullopt;
}

std::optional<int32_t> AddedTokenMatcher::id_of(std::string_view content) const {
  int32_t node = 0;
  for (char ch : content) {
    node = child(node, static_cast<uint8_t>(ch));
    if (node < 0) return std::nullopt;
  }
  if (content.empty() || nodes_[node].token < 0) return std::nullopt;
  return tokens_[nodes_[node].token].id;
}

const AddedToken* AddedTokenMatcher::by_id(int32_t id) const {
  auto it = std::lower_bound(tokens_.begin(), tokens_.end(), id,
                             [](const AddedToken& t, int32_t v) { return t.id < v; });
  return it != tokens_.end() && it->id == id ? &*it : nullptr;
}

}  // namespace flashseek::tok
