// Engine: request intake, validation, cancellation and the scheduler thread
// (the step itself is in engine_step.cpp).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string_view>

#include <spdlog/spdlog.h>

#include "engine/engine_sequence.h"
#include "engine/sampler.h"
#include "forward/state.h"

namespace flashseek::engine {

namespace {
bool device_sampling_on(const forward::Model& model, const EngineOptions& o) {
  return o.device_sampling && model.samples_on_device();
}

uint64_t initial_seed(const EngineOptions& o) {
  if (o.seed) return *o.seed;
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}
}  // namespace

Engine::Engine(forward::Model& model, EngineOptions options)
    : model_(model),
      options_(std::move(options)),
      vocab_(model.config().vocab_size),
      device_sampling_(device_sampling_on(model, options_)),
      spec_mode_(model.has_draft() && model.draft_block_size() >= 1 ? options_.speculative
                                                                     : SpecMode::kOff),
      spec_block_(spec_mode_ == SpecMode::kOff ? 0 : model.draft_block_size()),
      seed_rng_(initial_seed(options_)),
      spec_costs_(options_.spec_policy.cost_alpha) {
  stats_.spec_mode = spec_mode_;
}

double Engine::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<Engine>> Engine::create(forward::Model& model, EngineOptions options) {
  FS_RETURN_IF_ERROR(validate_budget(options.budget));
  if (options.max_batch < 1)
    return invalid_argument("engine: max_batch must be >= 1 (got {})", options.max_batch);
  if (options.budget.max_step_tokens < options.max_batch)
    return invalid_argument(
        "engine: max_step_tokens ({}) must be >= max_batch ({}) so every running sequence can "
        "decode in each step",
        options.budget.max_step_tokens, options.max_batch);
  if (options.max_context < 0)
    return invalid_argument("engine: max_context must be >= 0 (got {})", options.max_context);
  if (options.max_waiting < 0)
    return invalid_argument("engine: max_waiting must be >= 0 (got {})", options.max_waiting);
  if (std::string e = validate_spec_policy(options.spec_policy); !e.empty())
    return invalid_argument("engine: spec_policy: {}", e);
  if (model.config().vocab_size < 1)
    return invalid_argument("engine: model vocab_size is {}", model.config().vocab_size);
  if (options.spec_script_accept != 0) {
    const double m = options.spec_script_accept;
    if (!model.has_draft() || model.draft_block_size() < 1)
      return invalid_argument("engine: spec_script_accept needs a model with a draft");
    if (options.speculative == SpecMode::kOff)
      return invalid_argument("engine: spec_script_accept needs speculation on or auto");
    const int64_t most = model.draft_block_size() + 1;
    if (!std::isfinite(m) || m < 1.0 || m > double(most))
      return invalid_argument(
          "engine: spec_script_accept must be in [1, {}] tokens per verification step (the draft "
          "block of {} + the bonus token), got {}", most, most - 1, m);
  }
  return std::unique_ptr<Engine>(new Engine(model, std::move(options)));
}

Engine::~Engine() { stop(); }

Status Engine::validate(const Request& r) const {
  const auto id = r.id;
  const int64_t P = int64_t(r.prompt.size());
  if (P == 0) return invalid_argument("request {}: prompt is empty", id);
  for (int64_t i = 0; i < P; ++i)
    if (r.prompt[size_t(i)] < 0 || r.prompt[size_t(i)] >= vocab_)
      return out_of_range("request {}: prompt token {} at position {} is outside the vocabulary "
                          "[0, {})", id, r.prompt[size_t(i)], i, vocab_);
  for (int32_t s : r.stop_ids)
    if (s < 0 || s >= vocab_)
      return out_of_range("request {}: stop id {} is outside the vocabulary [0, {})", id, s,
                          vocab_);
  if (r.max_tokens < 0)
    return invalid_argument("request {}: max_tokens must be >= 0 (got {})", id, r.max_tokens);
  if (r.logprobs < -1)
    return invalid_argument("request {}: logprobs must be >= 0, or -1 for none (got {})", id,
                            r.logprobs);
  if (r.prompt_logprobs < -1)
    return invalid_argument("request {}: prompt_logprobs must be >= 0, or -1 for none (got {})",
                            id, r.prompt_logprobs);
  if (Status st = validate_sampling(r.sampling); !st.ok())
    return st.with_context(fmt::format("request {}", id));
  const int64_t max_pos = options_.max_context;
  if (max_pos > 0 && P >= max_pos)
    return out_of_range("request {}: prompt of {} tokens leaves no room in the context of {}", id,
                        P, max_pos);
  if (r.prefix) {
    if (r.prefix->length() >= P)
      return invalid_argument("request {}: prefix state holds {} tokens but must be shorter than "
                              "the prompt ({})", id, r.prefix->length(), P);
    if (r.prompt_logprobs >= 0)
      return invalid_argument("request {}: prompt_logprobs cannot be combined with a prefix "
                              "state (the prefix positions have no logits)", id);
  }
  auto same_id = [&](const std::unique_ptr<Sequence>& s) { return !s->done && s->req.id == id; };
  if (std::any_of(waiting_.begin(), waiting_.end(), same_id) ||
      std::any_of(running_.begin(), running_.end(), same_id))
    return invalid_argument("request {}: id is already in use by a live request", id);
  return {};
}

Result<std::shared_ptr<EventStream>> Engine::submit(Request request) {
  std::lock_guard lock(mu_);
  if (stopping_) return Status(StatusCode::kUnavailable, "engine: stopped");
  FS_RETURN_IF_ERROR(validate(request));
  if (int64_t(waiting_.size()) >= options_.max_waiting)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("engine: {} requests already waiting", waiting_.size()));
  auto seq = std::make_unique<Sequence>();
  if (request.seed) request.sampling.seed = *request.seed;
  else request.sampling.seed = seed_rng_.next_u64();
  seq->stream = std::make_shared<EventStream>(request.id);
  seq->req = std::move(request);
  auto stream = seq->stream;
  waiting_.push_back(std::move(seq));
  stats_.waiting = int64_t(waiting_.size());
  cv_.notify_all();
  return stream;
}

bool Engine::cancel(uint64_t request_id) {
  std::lock_guard lock(mu_);
  auto match = [&](const std::unique_ptr<Sequence>& s) {
    return !s->done && s->req.id == request_id;
  };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), match); it != waiting_.end()) {
    finish(**it, FinishReason::kCancelled);
    waiting_.erase(it);
    stats_.waiting = int64_t(waiting_.size());
    return true;
  }
  auto it = std::find_if(running_.begin(), running_.end(), match);
  if (it == running_.end()) return false;
  finish(**it, FinishReason::kCancelled);
  drop_finished();  // frees the state now unless a forward call is using it
  cv_.notify_all();
  return true;
}

void Engine::finish(Sequence& seq, FinishReason reason, std::string error) {
  TokenEvent e;
  e.finish = reason;
  e.error = std::move(error);
  emit(seq, std::move(e));
}

void Engine::emit(Sequence& seq, TokenEvent event) {
  event.request_id = seq.req.id;
  if (!seq.prompt_lp_sent && seq.req.prompt_logprobs >= 0 &&
      seq.pending_prompt() == 0 && seq.state) {
    event.prompt_logprobs = std::move(seq.prompt_lp);
    seq.prompt_lp_sent = true;
  }
  if (event.finish != FinishReason::kNone) {
    seq.done = true;
    if (seq.spec_steps > 0) event.spec_steps = seq.spec_steps, event.spec_tokens = seq.spec_tokens;
  }
  // Snapshot sink (Request::on_snapshot): prompt complete (first token) or a normal end. The
  // state holds the prompt then the generated tokens fed back so far (not the newest one).
  const bool first_token = event.index == 0 && event.token >= 0;
  const bool ended = event.finish == FinishReason::kStop || event.finish == FinishReason::kLength;
  if (seq.req.on_snapshot && seq.state && (first_token || ended)) {
    const int64_t n = seq.state->length(), P = seq.prompt_len();
    if (n >= P && n <= P + int64_t(seq.generated.size())) {
      std::vector<int32_t> tokens(seq.req.prompt);
      tokens.insert(tokens.end(), seq.generated.begin(), seq.generated.begin() + (n - P));
      hand_snapshot(seq, tokens);
    }
  }
  seq.stream->push(std::move(event));
}

void Engine::hand_snapshot(Sequence& seq, std::span<const int32_t> tokens) {
  // The sink sees the canonical host format (forward/state.h): a CPU state as it is, any other
  // backend's state through Model::export_state (e.g. a device → host copy on the GPU backend).
  if (const auto* host = dynamic_cast<const forward::CpuSequenceState*>(seq.state.get())) {
    seq.req.on_snapshot(tokens, *host);
    return;
  }
  auto host = model_.export_state(*seq.state);
  if (!host.ok()) {  // a backend without snapshots (or a failed copy): none taken (logged once per engine)
    if (!snapshot_warned_) spdlog::warn("engine: snapshots skipped: {}", host.status().message());
    snapshot_warned_ = true;
    return;
  }
  seq.req.on_snapshot(tokens, **host);
}

std::unique_ptr<forward::SequenceState> Engine::restore_prefix(const Request& r) {
  const auto* host = dynamic_cast<const forward::CpuSequenceState*>(r.prefix.get());
  if (!host) return r.prefix->clone();  // a state of this backend (the caller's own snapshot)
  // A snapshot in the canonical format (state cache, peers): the backend checks its geometry
  // and builds its own state. A refused one costs a full prefill, never the request.
  auto st = model_.import_state(*host);
  if (st.ok()) return std::move(*st);
  spdlog::warn("engine: request {}: cached prefix of {} tokens not restored ({}); prefilling the whole prompt",
               r.id, host->length(), st.status().message());
  return model_.new_sequence();
}

void Engine::drop_finished() {
  running_.remove_if([](const std::unique_ptr<Sequence>& s) { return s->done && !s->in_flight; });
  stats_.running = int64_t(std::count_if(running_.begin(), running_.end(),
                                         [](const auto& s) { return !s->done; }));
}

bool Engine::has_work() const {
  return !waiting_.empty() ||
         std::any_of(running_.begin(), running_.end(), [](const auto& s) { return !s->done; });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Status Engine::run_until_idle() {
  Status first;
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (!has_work()) return first;
    }
    Status st = step();
    if (!st.ok() && first.ok()) first = st;
  }
}

void Engine::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { loop(); });
}

void Engine::loop() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || has_work(); });
      if (stopping_) return;
    }
    if (Status st = step(); !st.ok()) spdlog::warn("engine: step failed: {}", st.to_string());
  }
}

void Engine::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard step_lock(step_mu_);
  std::lock_guard lock(mu_);
  for (auto& s : waiting_) finish(*s, FinishReason::kCancelled, "engine stopped");
  for (auto& s : running_)
    if (!s->done) finish(*s, FinishReason::kCancelled, "engine stopped");
  waiting_.clear();
  running_.clear();
  stats_.waiting = stats_.running = 0;
}

}  // namespace flashseek::engine
