// The tokenizer on any bytes (tokenizer/tokenizer.h): prompt text that is not UTF-8, and token
// ids from clients (completions prompts, logit_bias) or peers. Byte 0 even: the rest is text;
// odd: little-endian int32 ids. Text that encode_checked accepts decodes back to itself; decode
// output is always UTF-8; decode_checked accepts only ids it can decode.
#include <cstring>

#include "fuzz/targets.h"
#include "tokenizer/tokenizer.h"

namespace flashseek::fuzz {

namespace {

// Written here, not tokenizer_utf8.h's utf8_first_invalid: that is what encode_checked uses, and
// the property needs an independent oracle.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) n = 1, cp = c;
    else if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = cp << 6 | (b & 0x3F);
    }
    // Shortest form only, no surrogates, at most U+10FFFF.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

}  // namespace

bool run_tokenizer(std::span<const uint8_t> d) {
  if (d.empty()) return false;
  const tok::Tokenizer& t = v41_tokenizer();
  const auto body = d.subspan(1);
  if (d[0] % 2 == 0) {
    const std::string_view text = as_text(body);
    const auto lossy = t.encode(text);
    for (int32_t id : lossy) FUZZ_CHECK(id >= 0 && id < t.vocab_size(), "encode produced an id out of range");
    auto checked = t.encode_checked(text);
    FUZZ_CHECK(checked.ok() == valid_utf8(text), "encode_checked and UTF-8 validity disagree");
    if (checked.ok()) {
      FUZZ_CHECK(*checked == lossy, "encode_checked and encode give different ids");
      FUZZ_CHECK(t.decode(*checked) == text, "decode(encode(text)) differs from the text");
    }
    FUZZ_CHECK(valid_utf8(t.decode(lossy)), "decode produced invalid UTF-8");
    return true;  // (every text has its properties checked)
  }
  std::vector<int32_t> ids(body.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), body.data(), ids.size() * 4);
  const std::string text = t.decode(ids);
  FUZZ_CHECK(valid_utf8(text), "decode produced invalid UTF-8");
  auto checked = t.decode_checked(ids);
  bool known = true;
  for (int32_t id : ids) known = known && t.token_bytes(id).has_value();
  FUZZ_CHECK(checked.ok() == known, "decode_checked refuses known ids or accepts unknown ones");
  if (checked.ok()) FUZZ_CHECK(*checked == text, "decode_checked and decode differ");
  return true;
}

std::vector<Bytes> seeds_tokenizer() {
  std::vector<Bytes> out;
  for (std::string_view s : {"Hello, 世界! 123 4567", "  leading spaces\n\ttabs\r\n",
                             "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>",
                             "emoji 👍🏽 and ÿ and \xc3\xa9", "bad \xff\xfe utf8 \xe4\xb8"}) {
    Bytes b{0};
    b.insert(b.end(), s.begin(), s.end());
    out.push_back(std::move(b));
  }
  Bytes ids{1};
  for (int32_t id : {0, 1, 100, 128000, 128822, 129279, 129280, -1, 70000}) {
    uint8_t le[4];
    std::memcpy(le, &id, 4);
    ids.insert(ids.end(), le, le + 4);
  }
  out.push_back(std::move(ids));
  return out;
}

}  // namespace flashseek::fuzz
