#include "engine/request.h"

#include <chrono>

namespace flashseek::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

void EventStream::push(TokenEvent event) {
  {
    std::lock_guard lock(mu_);
    if (final_pushed_) return;  // e.g. a token computed while the request was being cancelled
    if (event.finish != FinishReason::kNone) final_pushed_ = true;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<TokenEvent> EventStream::take_front() {
  if (events_.empty()) return std::nullopt;
  TokenEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.finish != FinishReason::kNone) final_popped_ = true;
  return e;
}

std::optional<TokenEvent> EventStream::pop() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || final_popped_; });
  return take_front();
}

std::optional<TokenEvent> EventStream::pop_for(int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
               [&] { return !events_.empty() || final_popped_; });
  return take_front();
}

std::optional<TokenEvent> EventStream::try_pop() {
  std::lock_guard lock(mu_);
  return take_front();
}

bool EventStream::finished() const {
  std::lock_guard lock(mu_);
  return final_pushed_;
}

GenerationResult collect(EventStream& stream) {
  GenerationResult r;
  while (auto e = stream.pop()) {
    if (!e->prompt_logprobs.empty()) r.prompt_logprobs = std::move(e->prompt_logprobs);
    if (e->token >= 0) {
      r.tokens.push_back(e->token);
      if (e->logprobs) r.logprobs.push_back(std::move(*e->logprobs));
    }
    if (e->finish != FinishReason::kNone) {
      r.finish = e->finish;
      r.error = e->error;
      break;
    }
  }
  return r;
}

}  // namespace flashseek::engine
