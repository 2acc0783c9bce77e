// A backend that exists before the model does: the HTTP server starts at once (so /healthz
// answers and /readyz says 503 while weights load), and the real backend is plugged in later.
#pragma once
#include <atomic>

#include "server/backend.h"

namespace flashseek::server {

class DeferredBackend : public GenerationBackend {
 public:
  // `inner` must outlive this object; set once.
  void set(GenerationBackend* inner) { inner_.store(inner); }

  Result<std::shared_ptr<EventSource>> submit(GenRequest req) override {
    if (auto* b = inner_.load()) return b->submit(std::move(req));
    return Status(StatusCode::kUnavailable, "the model is still loading; retry later");
  }
  void cancel(uint64_t id) override {
    if (auto* b = inner_.load()) b->cancel(id);
  }
  BackendStats stats() const override {
    auto* b = inner_.load();
    return b ? b->stats() : BackendStats{};
  }
  bool ready() const override {
    auto* b = inner_.load();
    return b && b->ready();
  }
  int64_t context_length() const override {
    auto* b = inner_.load();
    return b ? b->context_length() : 1;
  }
  int32_t eos_token() const override {
    auto* b = inner_.load();
    return b ? b->eos_token() : -1;
  }
  int64_t vocab_size() const override {
    auto* b = inner_.load();
    return b ? b->vocab_size() : 0;
  }

 private:
  std::atomic<GenerationBackend*> inner_{nullptr};
};

}  // namespace flashseek::server
