#include "tokenizer/tokenizer_utf8.h"

#include <cassert>

namespace flashseek::tok {
namespace {

// Allowed range of the second byte for a given lead byte (Unicode Table 3-7); later
// continuation bytes are always 80..BF.
struct LeadInfo {
  int length;  // total sequence length, 0 for a byte that can never start a sequence
  unsigned char lo;
  unsigned char hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b >= 0xE1 && b <= 0xEC) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes UTF-16 surrogates
  if (b >= 0xEE && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // caps at U+10FFFF
  return {0, 0, 0};
}

}  // namespace

Utf8Step utf8_step(std::string_view s) {
  assert(!s.empty());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const LeadInfo info = lead_info(p[0]);
  if (info.length == 1) return {Utf8Kind::kValid, 1};
  if (info.length == 0) return {Utf8Kind::kInvalid, 1};
  for (int i = 1; i < info.length; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return {Utf8Kind::kIncomplete, s.size()};
    const unsigned char lo = i == 1 ? info.lo : 0x80;
    const unsigned char hi = i == 1 ? info.hi : 0xBF;
    if (p[i] < lo || p[i] > hi) return {Utf8Kind::kInvalid, static_cast<size_t>(i)};
  }
  return {Utf8Kind::kValid, static_cast<size_t>(info.length)};
}

std::optional<size_t> utf8_first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path: most tokenizer input is ASCII.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = utf8_step(s.substr(i));
    if (step.kind != Utf8Kind::kValid) return i;
    i += step.length;
  }
  return std::nullopt;
}

size_t utf8_lossy_append(std::string_view in, bool final, std::string& out) {
  size_t i = 0;
  while (i < in.size()) {
    const Utf8Step step = utf8_step(in.substr(i));
    switch (step.kind) {
      case Utf8Kind::kValid:
        out.append(in.substr(i, step.length));
        break;
      case Utf8Kind::kInvalid:
        out.append(kReplacementChar);
        break;
      case Utf8Kind::kIncomplete:
        if (!final) return i;
        out.append(kReplacementChar);  // a truncated sequence is one maximal subpart
        break;
    }
    i += step.length;
  }
  return i;
}

std::string utf8_lossy(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  utf8_lossy_append(in, /*final=*/true, out);
  return out;
}

std::string utf8_encode(char32_t cp) {
  assert(cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF));
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

}  // namespace flashseek::tok
