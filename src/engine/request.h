// What a client hands the engine (Request) and what comes back (TokenEvent), plus the
// thread-safe stream that carries the events from the scheduler thread to the client.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/logprobs.h"
#include "engine/sampling_params.h"
#include "forward/model.h"

namespace flashseek::engine {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", ...

struct Request {
  uint64_t id = 0;                       // caller-chosen; unique among live requests
  std::vector<int32_t> prompt;           // [P] token ids, P >= 1
  SamplingParams sampling;
  std::optional<uint64_t> seed;          // set: reproducible; unset: the engine picks one
  int64_t max_tokens = 16;               // generated tokens at most (0: prompt only)
  std::vector<int32_t> stop_ids;         // extra stop tokens (EOS stops unless ignore_eos)
  bool ignore_eos = false;
  int64_t logprobs = -1;                 // -1: none; K >= 0: chosen token + top-K per token
  int64_t prompt_logprobs = -1;          // -1: none; K >= 0: actual token + top-K per position
  // Snapshot hook (issue 6): a state that already holds prompt[0, prefix->length()); the engine
  // clones it and prefills only the rest. Must be shorter than the prompt (the last prompt
  // token's logits are needed), and cannot be combined with prompt_logprobs.
  std::shared_ptr<const forward::SequenceState> prefix;
  // Snapshot sink (issue 6, engine/state_cache.h): called on the scheduler thread with the
  // engine lock held when the prompt is complete (first token) and when the request ends with
  // stop/length; `tokens` are the ids the state holds (size == state.length()). The callee must
  // copy what it keeps (clone()) and return quickly.
  std::function<void(std::span<const int32_t> tokens, const forward::SequenceState& state)>
      on_snapshot;
  // Also call on_snapshot during a long prefill, at the end of the chunk that crosses each
  // multiple of this many prompt tokens (0: only at the end of prompt / response).
  int64_t snapshot_every = 0;
};

struct TokenEvent {
  uint64_t request_id = 0;
  int32_t token = -1;                        // -1: no token in this event (finish/error only)
  int64_t index = -1;                        // 0-based index among generated tokens
  std::optional<PositionLogprobs> logprobs;  // when Request::logprobs >= 0
  // In the first event only, when Request::prompt_logprobs >= 0: one entry per prompt position,
  // empty optional for position 0 (nothing predicts it).
  std::vector<std::optional<PositionLogprobs>> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;  // set on the last event of a request
  std::string error;                          // finish == kError: what went wrong
  // Last event only: speculative verification steps this request ran (-1: it never speculated)
  // and the tokens those steps emitted (accepted drafts + bonus tokens).
  int64_t spec_steps = -1;
  int64_t spec_tokens = 0;
};

// Single-producer (scheduler) / single-consumer (client) event queue; safe from any threads.
// Shared (shared_ptr) between the engine and the client; nothing may follow a final event.
class EventStream {
 public:
  explicit EventStream(uint64_t request_id) : request_id_(request_id) {}
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;
  uint64_t request_id() const { return request_id_; }
  void push(TokenEvent event);
  // Blocks until an event arrives; std::nullopt once the final event has been popped.
  std::optional<TokenEvent> pop();
  // Waits at most `timeout_ms`; std::nullopt on timeout or when exhausted.
  std::optional<TokenEvent> pop_for(int64_t timeout_ms);
  std::optional<TokenEvent> try_pop();
  bool finished() const;  // the final event was pushed

 private:
  std::optional<TokenEvent> take_front();  // caller holds mu_

  const uint64_t request_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool final_pushed_ = false;  // producer side: nothing more will come
  bool final_popped_ = false;  // consumer side: stream exhausted
};

// Everything one request produced, collected from its events (CLI, tests).
struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<PositionLogprobs> logprobs;                       // when requested
  std::vector<std::optional<PositionLogprobs>> prompt_logprobs; // when requested
  FinishReason finish = FinishReason::kNone;
  std::string error;
};
// Drains `stream` until the final event.
GenerationResult collect(EventStream& stream);

}  // namespace flashseek::engine
