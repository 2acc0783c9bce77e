// UTF-8 helpers for the tokenizer: validation, lossy repair, and streaming-safe decoding.
// "Lossy" replaces each maximal ill-formed subsequence with one U+FFFD (Unicode §3.9 best
// practice), which is what HF tokenizers' decode (Rust String::from_utf8_lossy) produces, so our
// decode and the streaming detokenizer agree with it byte for byte.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace flashseek::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Classification of the bytes at the start of a buffer.
enum class Utf8Kind {
  kValid,       // one complete, well-formed code point of `length` bytes
  kInvalid,     // `length` bytes form a maximal ill-formed subpart (length >= 1)
  kIncomplete,  // all `length` bytes are a valid prefix but the buffer ends before the code point
};

struct Utf8Step {
  Utf8Kind kind;
  size_t length;
};

// Classifies the first code point of `s` (precondition: !s.empty()).
Utf8Step utf8_step(std::string_view s);

// Byte offset of the first ill-formed byte, or nullopt when `s` is valid UTF-8. A truncated
// sequence at the end counts as ill-formed.
std::optional<size_t> utf8_first_invalid(std::string_view s);

inline bool utf8_is_valid(std::string_view s) { return !utf8_first_invalid(s).has_value(); }

// Appends `in` to `out` with ill-formed subsequences replaced by U+FFFD. When `final` is false an
// incomplete sequence at the very end is left unconsumed (it may be completed by later bytes).
// Returns the number of bytes of `in` consumed.
size_t utf8_lossy_append(std::string_view in, bool final, std::string& out);

// Whole-buffer lossy conversion.
std::string utf8_lossy(std::string_view in);

// Encodes one code point (precondition: cp <= 0x10FFFF and not a surrogate).
std::string utf8_encode(char32_t cp);

}  // namespace flashseek::tok
