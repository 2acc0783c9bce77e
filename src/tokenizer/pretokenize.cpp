#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace flashseek::tok {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: match data with one ovector pair (the patterns have no capture
// groups we need) and a JIT stack large enough for long whitespace runs with lookahead.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Compiled {
  std::string pattern;
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

const std::vector<std::string>& PreTokenizer::deepseek_patterns() {
  static const std::vector<std::string> patterns = {
      R"(\p{N}{1,3})",
      "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
      "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\r\n]*"
      "|\\s*[\r\n]+"
      "|\\s+(?!\\S)"
      "|\\s+",
  };
  return patterns;
}

Result<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& split_patterns) {
  PreTokenizer pt;
  pt.jit_ = !split_patterns.empty();
  for (size_t i = 0; i < split_patterns.size(); ++i) {
    auto c = std::make_unique<Compiled>();
    c->pattern = split_patterns[i];
    int err = 0;
    PCRE2_SIZE offset = 0;
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(c->pattern.data()), c->pattern.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (c->code == nullptr) {
      return parse_error("pre-tokenizer pattern {} '{}': PCRE2 error at offset {}: {}", i,
                         c->pattern, offset, pcre2_message(err));
    }
    c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
    pt.jit_ = pt.jit_ && c->jit;
    pt.patterns_.push_back(std::move(c));
  }
  return pt;
}

Status PreTokenizer::split_one(size_t pattern_index, std::string_view piece,
                               std::vector<std::string_view>& out) const {
  const Compiled& c = *patterns_[pattern_index];
  ThreadMatchState& st = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t start = 0;  // end of the last emitted piece
  size_t pos = 0;    // where the next search starts
  while (pos < piece.size()) {
    const int rc = c.jit ? pcre2_jit_match(c.code, subject, piece.size(), pos, 0, st.data,
                                           st.context)
                         : pcre2_match(c.code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK,
                                       st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return {StatusCode::kResourceExhausted,
              fmt::format("pre-tokenizer pattern {} failed on a {}-byte piece: {}", pattern_index,
                          piece.size(), pcre2_message(rc))};
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t m_begin = ov[0], m_end = ov[1];
    if (m_end == m_begin) {
      // Empty match (none of the DeepSeek patterns can produce one): step over one character.
      pos = m_end + 1;
      while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (m_begin > start) out.push_back(piece.substr(start, m_begin - start));
    out.push_back(piece.substr(m_begin, m_end - m_begin));
    start = pos = m_end;
  }
  if (start < piece.size()) out.push_back(piece.substr(start));
  return Status::ok_status();
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return Status::ok_status();
  if (patterns_.empty()) {
    pieces.push_back(text);
    return Status::ok_status();
  }
  std::vector<std::string_view> current{text}, next;
  for (size_t p = 0; p < patterns_.size(); ++p) {
    std::vector<std::string_view>& dst = p + 1 == patterns_.size() ? pieces : next;
    if (&dst == &next) next.clear();
    for (std::string_view piece : current) FS_RETURN_IF_ERROR(split_one(p, piece, dst));
    if (&dst == &next) std::swap(current, next);
  }
  return Status::ok_status();
}

}  // namespace flashseek::tok
