// Pre-tokenizer: a sequence of regex `Split` steps with the *Isolated* behaviour (HF tokenizers),
// run with PCRE2 in UTF + UCP mode (JIT when available). Each step re-splits every piece of the
// previous step: matches become pieces, and the unmatched gaps between them stay pieces too.
// The final ByteLevel(use_regex=false) step of the DeepSeek pre-tokenizer only changes the
// alphabet, which BpeModel handles on raw bytes, so it needs no work here.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace flashseek::tok {

class PreTokenizer {
 public:
  // Compiles the patterns (PCRE2 syntax; the DeepSeek ones are also valid Oniguruma/JS).
  static Result<PreTokenizer> create(const std::vector<std::string>& split_patterns);

  // The three DeepSeek-V3/V4/V4.1 split patterns (spec model-v41.md §7.1), in order.
  static const std::vector<std::string>& deepseek_patterns();

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends the pieces of `text` (views into it, in order, covering it exactly) to `pieces`.
  // Precondition: `text` is valid UTF-8 (checked by the caller; PCRE2 runs without re-checking).
  // Fails only on a PCRE2 resource error (match/stack limit), naming the pattern.
  Status split(std::string_view text, std::vector<std::string_view>& pieces) const;

  size_t pattern_count() const { return patterns_.size(); }
  bool jit_enabled() const { return jit_; }

 private:
  struct Compiled;
  PreTokenizer() = default;
  Status split_one(size_t pattern_index, std::string_view piece,
                   std::vector<std::string_view>& out) const;

  std::vector<std::unique_ptr<Compiled>> patterns_;
  bool jit_ = false;
};

}  // namespace flashseek::tok
