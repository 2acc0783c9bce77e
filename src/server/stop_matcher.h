// Stop strings matched on decoded text. While streaming, text that could be the start of a stop
// string is held back until the next piece shows whether the stop string completes; the matched
// stop string itself is never emitted (OpenAI semantics).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace flashseek::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Output {
    std::string text;      // safe to emit now
    bool matched = false;  // a stop string completed; `text` ends right before it
  };
  // Appends a decoded piece. After a match, further pushes return nothing.
  Output push(std::string_view piece);
  // End of generation without a match: releases the held-back text.
  std::string flush();

 private:
  size_t held_suffix_len() const;  // longest buffer suffix that is a proper prefix of a stop

  std::vector<std::string> stops_;
  std::string buffer_;
  bool done_ = false;
};

}  // namespace flashseek::server
