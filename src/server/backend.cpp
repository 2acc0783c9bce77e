#include "server/backend.h"

#include <chrono>

namespace flashseek::server {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kNone: return "";
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kCancelled: return "cancelled";
    case Finish::kError: return "error";
  }
  return "";
}

void EventChannel::push(GenEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;  // nothing may follow the final event
    closed_ = ev.finish != Finish::kNone;
    events_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

std::optional<GenEvent> EventChannel::pop_for(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  if (events_.empty()) return std::nullopt;
  GenEvent ev = std::move(events_.front());
  events_.pop_front();
  return ev;
}

bool EventChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace flashseek::server
