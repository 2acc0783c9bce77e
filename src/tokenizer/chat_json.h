// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it, because the
// DeepSeek chat format embeds JSON (tool schemas, non-string tool arguments, response formats)
// in the prompt and the model was trained on that exact spelling: separators ", " and ": ",
// non-ASCII kept as UTF-8, Python float repr ("1.0", "1e-05", "1e+16"), key order as given.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace flashseek::tok {

// Chat messages keep insertion order of object keys (nlohmann::json would sort them, which
// changes the rendered tool schemas). Parse request bodies with `ChatJson::parse`.
using ChatJson = nlohmann::ordered_json;

// `json.dumps(value, ensure_ascii=False)` with default separators.
std::string py_json_dumps(const ChatJson& value);

// obj[key] when obj is an object holding a string there, else "". Never throws: request JSON can
// hold any type anywhere (nlohmann's value(key, "") throws when the member is not a string).
std::string string_field(const ChatJson& obj, const char* key);

// Body of a JSON string literal (no surrounding quotes), escaped as Python does with
// ensure_ascii=False: `"` `\` and control characters are escaped, all other bytes pass through.
// Escaping works byte by byte, so escaping the pieces of a split string and concatenating
// equals escaping the whole string (the streaming parser relies on this).
std::string json_escape_body(std::string_view text);

// Python float repr of a finite double ("0.1", "1.0", "1e-05", "1.5e+300").
std::string py_float_repr(double value);

// Converts a sorted-key nlohmann::json into ChatJson (keys end up in sorted order).
ChatJson to_chat_json(const nlohmann::json& value);

// 64-bit FNV-1a; used for deterministic tool-call ids.
uint64_t fnv1a64(std::string_view data, uint64_t seed = 0xcbf29ce484222325ULL);

}  // namespace flashseek::tok
