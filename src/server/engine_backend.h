// The GenerationBackend port backed by the real continuous-batching engine (src/engine): one
// scheduler thread owns the model; HTTP threads submit requests and read each request's engine
// EventStream, converted event by event.
#pragma once
#include <atomic>

#include "engine/engine.h"
#include "engine/state_cache.h"
#include "server/backend.h"

namespace flashseek::server {

class EngineBackend : public GenerationBackend {
 public:
  // `engine` must outlive this object and have its scheduler thread started.
  explicit EngineBackend(engine::Engine& engine);
  Result<std::shared_ptr<EventSource>> submit(GenRequest req) override;
  void cancel(uint64_t id) override { engine_.cancel(id); }
  BackendStats stats() const override;
  bool ready() const override { return ready_; }
  int64_t context_length() const override;
  int32_t eos_token() const override;
  int64_t vocab_size() const override;

  // Runs one short greedy request through the model and marks the backend ready.
  Status warm_up();
  void set_ready(bool ready) { ready_ = ready; }
  // Conversation state cache (issue 6): prompts restore their longest cached prefix (scoped by
  // GenRequest::tenant) and snapshots are taken at the end of every prompt and response.
  // Set before serving; `cache` must outlive this object.
  void set_state_cache(engine::StateCache* cache) { cache_ = cache; }

 private:
  engine::Engine& engine_;
  engine::StateCache* cache_ = nullptr;
  std::atomic<bool> ready_{false};
};

// Conversions between the port's event and the engine's (exposed for tests).
GenEvent to_gen_event(const engine::TokenEvent& ev);

}  // namespace flashseek::server
