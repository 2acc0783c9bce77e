// The port between the HTTP layer and whatever generates tokens (the real engine through
// engine_backend.h, or a deterministic fake in tests). The server never sees a model: it submits
// token ids with sampling settings and reads token events from a channel until the final one.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::server {

enum class Finish { kNone, kStop, kLength, kCancelled, kError };
// OpenAI spelling: "stop", "length", "cancelled", "error" ("" for kNone).
const char* finish_name(Finish f);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};
struct PositionLogprobs {
  TokenLogprob chosen;            // the generated (or prompt) token
  std::vector<TokenLogprob> top;  // [K] highest first
};

struct GenRequest {
  uint64_t id = 0;                 // unique among live requests (the server assigns it)
  // State-cache scope (server/tenants.h); nullopt: isolated, the request neither restores nor
  // leaves cached state.
  std::optional<uint64_t> tenant;
  std::vector<int32_t> prompt;     // [P] token ids, P >= 1
  double temperature = 1.0;        // <= 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;               // <= 0: off
  std::optional<uint64_t> seed;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_ids;   // stop tokens besides EOS
  bool ignore_eos = false;
  int64_t logprobs = -1;           // -1: none; K >= 0: chosen + top-K per generated token
  int64_t prompt_logprobs = -1;    // -1: none; K >= 0: per prompt position (first is empty)
};

struct GenEvent {
  int32_t token = -1;                        // -1: no token (final event of an error/cancel)
  std::optional<PositionLogprobs> logprobs;  // when requested
  // First event only: one entry per prompt position (position 0 has none).
  std::vector<std::optional<PositionLogprobs>> prompt_logprobs;
  int64_t cached_tokens = -1;                // first event only: prompt tokens served from cache
  Finish finish = Finish::kNone;             // set on the last event of a request
  std::string error;                         // finish == kError
  int64_t spec_steps = -1;                   // last event: speculative verify steps (-1: none)
  int64_t spec_tokens = 0;                   // last event: tokens those steps emitted
};

// Where one request's events are read from (by one HTTP thread). The final event has
// finish != kNone; after it pop_for returns nullopt.
class EventSource {
 public:
  virtual ~EventSource() = default;
  // Waits up to timeout_ms for an event; nullopt on timeout or when drained after the final one.
  virtual std::optional<GenEvent> pop_for(int64_t timeout_ms) = 0;
};

// A thread-safe queue source: a producer thread pushes, one consumer pops.
class EventChannel : public EventSource {
 public:
  void push(GenEvent ev);
  std::optional<GenEvent> pop_for(int64_t timeout_ms) override;
  bool closed() const;  // the final event was pushed

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenEvent> events_;
  bool closed_ = false;
};

struct BackendStats {
  int64_t queued = 0;       // submitted, not yet scheduled
  int64_t running = 0;      // in the current batch (slots in use)
  int64_t max_batch = 0;
  int64_t cache_hit_tokens = 0;  // prompt tokens served from cache since start
  int64_t steps = 0;        // scheduler steps since start
  std::string extra_metrics;  // Prometheus text appended to /metrics (state cache, kvshare)
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Queues the request and returns where its events arrive. kResourceExhausted when the queue
  // is full, kInvalidArgument for a request the engine cannot run (message names the field).
  virtual Result<std::shared_ptr<EventSource>> submit(GenRequest req) = 0;
  // Stops a request and frees its slot; its source then yields a final kCancelled event.
  // Unknown / finished ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  virtual BackendStats stats() const = 0;
  // Weights loaded and a warm-up step ran.
  virtual bool ready() const = 0;
  // Longest prompt + generation the backend accepts.
  virtual int64_t context_length() const = 0;
  virtual int32_t eos_token() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace flashseek::server
