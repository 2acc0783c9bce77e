#include "tokenizer/chat_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace flashseek::tok {
namespace {

void dump_into(const ChatJson& v, std::string& out) {
  switch (v.type()) {
    case ChatJson::value_t::null: out += "null"; return;
    case ChatJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case ChatJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case ChatJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case ChatJson::value_t::number_float: out += py_float_repr(v.get<double>()); return;
    case ChatJson::value_t::string:
      out += '"';
      out += json_escape_body(v.get_ref<const std::string&>());
      out += '"';
      return;
    case ChatJson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump_into(e, out);
      }
      out += ']';
      return;
    }
    case ChatJson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        out += json_escape_body(it.key());
        out += "\": ";
        dump_into(it.value(), out);
      }
      out += '}';
      return;
    }
    case ChatJson::value_t::binary:
    case ChatJson::value_t::discarded:
      out += "null";  // cannot come from parsed JSON text
      return;
  }
}

}  // namespace

std::string string_field(const ChatJson& obj, const char* key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string py_json_dumps(const ChatJson& value) {
  std::string out;
  dump_into(value, out);
  return out;
}

std::string json_escape_body(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

std::string py_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+02", then re-laid out with
  // Python's rule: fixed notation when the decimal exponent e satisfies -4 <= e < 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int n = static_cast<int>(digits.size());
  std::string out = sign;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (exp10 + 1 >= n) {
      out += digits + std::string(static_cast<size_t>(exp10 + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

ChatJson to_chat_json(const nlohmann::json& value) { return ChatJson::parse(value.dump()); }

uint64_t fnv1a64(std::string_view data, uint64_t seed) {
  uint64_t h = seed;
  for (char c : data) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace flashseek::tok
