#include "server/stop_matcher.h"

#include <algorithm>

namespace flashseek::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));  // an empty stop would match everywhere
}

size_t StopMatcher::held_suffix_len() const {
  size_t best = 0;
  for (const auto& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, buffer_.size());
    for (size_t len = max_len; len > best; --len) {
      if (buffer_.compare(buffer_.size() - len, len, stop, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

StopMatcher::Output StopMatcher::push(std::string_view piece) {
  Output out;
  if (done_) return out;
  buffer_.append(piece);
  if (stops_.empty()) {
    out.text.swap(buffer_);
    return out;
  }
  // The stop that completes first (smallest end) wins, as if text arrived byte by byte; among
  // stops ending at the same byte the longest does. No match can start in text already emitted:
  // the emitted part never held the start of a possible match.
  size_t first = std::string::npos, best_end = std::string::npos;
  for (const auto& stop : stops_) {
    const size_t at = buffer_.find(stop);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < first)) first = at, best_end = end;
  }
  if (first != std::string::npos) {
    out.text = buffer_.substr(0, first);
    out.matched = true;
    buffer_.clear();
    done_ = true;
    return out;
  }
  const size_t keep = held_suffix_len();
  out.text = buffer_.substr(0, buffer_.size() - keep);
  buffer_.erase(0, buffer_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string rest;
  rest.swap(buffer_);
  done_ = true;
  return rest;
}

}  // namespace flashseek::server
