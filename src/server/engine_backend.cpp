#include "server/engine_backend.h"

#include <algorithm>

#include "engine/spec_metrics.h"

namespace flashseek::server {

namespace {

PositionLogprobs convert(const engine::PositionLogprobs& lp) {
  PositionLogprobs out{{lp.chosen.id, lp.chosen.logprob}, {}};
  out.top.reserve(lp.top.size());
  for (const auto& t : lp.top) out.top.push_back({t.id, t.logprob});
  return out;
}

Finish convert(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kNone: return Finish::kNone;
    case engine::FinishReason::kStop: return Finish::kStop;
    case engine::FinishReason::kLength: return Finish::kLength;
    case engine::FinishReason::kCancelled: return Finish::kCancelled;
    case engine::FinishReason::kError: return Finish::kError;
  }
  return Finish::kError;
}

}  // namespace

GenEvent to_gen_event(const engine::TokenEvent& ev) {
  GenEvent out;
  out.token = ev.token;
  if (ev.logprobs) out.logprobs = convert(*ev.logprobs);
  out.prompt_logprobs.reserve(ev.prompt_logprobs.size());
  for (const auto& p : ev.prompt_logprobs)
    out.prompt_logprobs.push_back(p ? std::optional<PositionLogprobs>(convert(*p)) : std::nullopt);
  // Cache hits are known to the backend, not the event: EngineEvents overwrites this.
  if (ev.index == 0) out.cached_tokens = 0;
  out.finish = convert(ev.finish);
  out.error = ev.error;
  out.spec_steps = ev.spec_steps;
  out.spec_tokens = ev.spec_tokens;
  return out;
}

EngineBackend::EngineBackend(engine::Engine& engine) : engine_(engine) {}

namespace {
class EngineEvents : public EventSource {
 public:
  EngineEvents(std::shared_ptr<engine::EventStream> s, int64_t cached)
      : stream_(std::move(s)), cached_(cached) {}
  std::optional<GenEvent> pop_for(int64_t timeout_ms) override {
    auto ev = stream_->pop_for(timeout_ms);
    if (!ev) return std::nullopt;
    GenEvent out = to_gen_event(*ev);
    if (first_) out.cached_tokens = cached_;  // prompt tokens restored from the state cache
    first_ = false;
    return out;
  }

 private:
  std::shared_ptr<engine::EventStream> stream_;
  const int64_t cached_;
  bool first_ = true;
};
}  // namespace

Result<std::shared_ptr<EventSource>> EngineBackend::submit(GenRequest req) {
  engine::Request r;
  r.id = req.id;
  r.prompt = std::move(req.prompt);
  r.sampling.temperature = req.temperature;
  r.sampling.top_p = req.top_p;
  r.sampling.top_k = req.top_k;
  r.seed = req.seed;
  r.max_tokens = req.max_tokens;
  r.stop_ids = std::move(req.stop_ids);
  r.ignore_eos = req.ignore_eos;
  r.logprobs = req.logprobs;
  r.prompt_logprobs = req.prompt_logprobs;
  // An isolated request (no tenant scope) neither looks up nor leaves snapshots.
  const int64_t cached =
      cache_ && req.tenant ? engine::attach_state_cache(*cache_, *req.tenant, r) : 0;
  FS_ASSIGN_OR_RETURN(auto stream, engine_.submit(std::move(r)));
  return std::shared_ptr<EventSource>(std::make_shared<EngineEvents>(std::move(stream), cached));
}

BackendStats EngineBackend::stats() const {
  const engine::EngineStats s = engine_.stats();
  BackendStats out;
  out.queued = s.waiting;
  out.running = s.running;
  out.max_batch = engine_.options().max_batch;
  out.steps = s.steps;
  if (cache_) {
    const engine::StateCacheStats c = cache_->stats();
    out.cache_hit_tokens = c.hit_tokens_local + c.hit_tokens_remote;
    out.extra_metrics = cache_->metrics_text();
  }
  out.extra_metrics += engine::spec_metrics_text(s);
  return out;
}

int64_t EngineBackend::context_length() const {
  if (engine_.options().max_context > 0) return engine_.options().max_context;
  const int64_t n = engine_.config().max_position_embeddings;
  return n > 0 ? n : 4096;
}

int32_t EngineBackend::eos_token() const { return int32_t(engine_.config().eos_token_id); }

int64_t EngineBackend::vocab_size() const { return engine_.config().vocab_size; }

Status EngineBackend::warm_up() {
  engine::Request r;
  r.id = ~uint64_t(0);  // never collides with the server's ids (they count up from 1)
  r.prompt = {int32_t(engine_.config().bos_token_id)};
  r.sampling.temperature = 0;
  r.max_tokens = 1;
  r.ignore_eos = true;
  FS_ASSIGN_OR_RETURN(auto stream, engine_.submit(std::move(r)));
  engine::GenerationResult result = engine::collect(*stream);
  if (result.finish == engine::FinishReason::kError)
    return internal_error("warm-up step failed: {}", result.error);
  ready_ = true;
  return {};
}

}  // namespace flashseek::server
