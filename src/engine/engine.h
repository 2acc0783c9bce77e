// The engine: owns the running sequences of one Model and advances them with continuous
// batching. Clients submit() requests from any thread and read tokens from the returned
// EventStream; one scheduler thread (start()) or the caller (step()) runs the model.
//
// Each step builds ONE ragged batch (batch_planner.h) mixing decode steps of running sequences
// with prompt chunks of newly admitted ones, so new requests join a running batch at the next
// step. Sampling is keyed by (seed, position), and the model is batch-invariant, so every
// request's tokens are the same as when it runs alone.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "core/status.h"
#include "engine/batch_planner.h"
#include "engine/request.h"
#include "engine/spec_policy.h"
#include "forward/model.h"

namespace flashseek::engine {

struct EngineOptions {
  int64_t max_batch = 16;   // running sequences (slots) at most; the rest wait in FIFO order
  int64_t max_waiting = 4096;  // queued requests beyond which submit() fails (kResourceExhausted)
  StepBudget budget;        // tokens per step and per prompt chunk
  std::optional<uint64_t> seed;  // picks seeds of unseeded requests; unset: random_device
  // Longest sequence (prompt + generated) a request may reach; 0: no limit. Not taken from the
  // config by default: tiny test configs declare max_position_embeddings 64 yet the oracles run
  // 300-token sequences through them. A server passes config().max_position_embeddings.
  int64_t max_context = 0;
  // Speculative decoding (v41 §5, spec_step.cpp) when the model has a draft (Model::has_draft):
  // kAuto speculates per sequence and step only while it pays (spec_policy.h), kOn always
  // verifies the full block, kOff never speculates. Off by default in the library so that seeded
  // sampling draws stay those of plain decoding; the CLI and server default to kAuto (greedy
  // output is identical in every mode).
  SpecMode speculative = SpecMode::kOff;
  SpecPolicyOptions spec_policy;
  // BENCHMARK ONLY, CHANGES THE OUTPUT. 0 (default): the acceptance rule of v41 §5.6. Otherwise
  // every verification accepts a scripted number of drafts whatever the target says, so that the
  // tokens per verification step (accepted drafts + bonus) average this value (a deterministic
  // per-sequence sequence, spec_accept.h scripted_accepted; capped at the drafts verified). The
  // draft and the verify block run for real, so the step costs are the product's: this measures
  // tokens/s at a given acceptance on models whose draft accepts nothing (dummy / random
  // weights). Must be in [1, draft block size + 1] and needs speculation on or auto and a draft.
  // `flashseek run --spec-script-accept MEAN --allow-scripted-output` sets it.
  double spec_script_accept = 0;
  // Monotonic clock in seconds for the policy's cost measurements (step and draft wall times);
  // unset: std::chrono::steady_clock. Tests inject a scripted clock.
  std::function<double()> clock;
  // Sample on the model's device when it can (Model::samples_on_device) and the item needs no
  // logits on the host (no logprobs, no prompt logprobs, not a speculative verification): the
  // engine passes an ops::SampleSpec per item and gets one token back instead of a [vocab] row.
  // Same tokens either way (the device op follows the engine's rule). The CLI's
  // --device-sampling on|off sets it.
  bool device_sampling = true;
};

struct EngineStats {
  int64_t running = 0;            // sequences holding a slot (cancelled ones excluded)
  int64_t waiting = 0;
  int64_t steps = 0;              // forward calls made
  int64_t prompt_tokens = 0;      // prompt tokens run through the model
  int64_t generated_tokens = 0;   // tokens sampled
  int64_t last_batch_items = 0;   // sequences in the latest forward call
  int64_t last_batch_tokens = 0;  // tokens in the latest forward call
  // Speculative decoding: verification steps (one per sequence and step), drafts verified (a
  // step may verify a prefix of the proposal), drafts accepted, tokens emitted by them (accepted + bonus, after stop/length truncation),
  // and accepted_at[i]: steps whose draft i+1 was accepted ([draft block size]).
  int64_t spec_steps = 0;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  int64_t spec_emitted = 0;
  std::vector<int64_t> spec_accepted_at;
  // The speculation policy (spec_policy.h): the effective mode (kOff when the model has no
  // draft), decode steps it ran plain although the sequence could have speculated, full-block
  // probes, running sequences by their latest decision, and the measured costs it decides with
  // (step wall time per batch bucket and width; one proposal's wall time, < 0 until measured).
  SpecMode spec_mode = SpecMode::kOff;
  int64_t spec_plain_steps = 0;
  int64_t spec_probes = 0;
  int64_t spec_sequences_speculating = 0;
  int64_t spec_sequences_plain = 0;
  // Current block length: spec_block_sequences[k] = decoding sequences whose latest step verified
  // k drafts ([draft block size + 1]; index 0: a plain decode).
  std::vector<int64_t> spec_block_sequences;
  std::vector<SpecCosts::Entry> spec_step_costs;
  double spec_draft_seconds = -1;
};

class Engine {
 public:
  // `model` must outlive the engine. Fails on bad options.
  static Result<std::unique_ptr<Engine>> create(forward::Model& model, EngineOptions options);
  ~Engine();  // stops the scheduler thread; unfinished requests end with kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request; errors name the bad field.
  Result<std::shared_ptr<EventStream>> submit(Request request);
  // Ends a waiting or running request now: its stream gets a final kCancelled event and its slot
  // is released (a sequence inside the current forward call is dropped when that call returns,
  // and no further token is delivered). False if the id is not live.
  bool cancel(uint64_t request_id);

  // One scheduling step on the calling thread (when no scheduler thread runs). Returns the
  // forward error, if any (the affected requests end with kError; the engine stays usable).
  Status step();
  // Steps until no request is waiting or running.
  Status run_until_idle();
  // Background scheduler thread; stop() joins it and cancels what is left.
  void start();
  void stop();

  EngineStats stats() const;
  const model::ModelConfig& config() const { return model_.config(); }
  const EngineOptions& options() const { return options_; }

 private:
  struct Sequence;
  // One forward call's worth of work: [items] sequences, plan entries and batch items.
  struct StepBatch {
    std::vector<Sequence*> seqs;
    std::vector<PlannedItem> plan;
    std::vector<forward::BatchItem> items;
    std::vector<ops::SampleSpec> specs;  // [items] device-sampling specs (items[i].sample)
    int64_t rows = 0;    // logits rows the model must return
    int64_t tokens = 0;  // tokens in the call
    int64_t spec_plain = 0, spec_probes = 0;  // policy decisions this step (EngineStats)
  };
  Engine(forward::Model& model, EngineOptions options);
  Status validate(const Request& r) const;  // caller holds mu_
  void admit();                             // caller holds mu_
  StepBatch build_batch();                  // caller holds mu_
  void apply_results(const StepBatch& batch, const Status& st,
                     const std::vector<float>& logits);  // caller holds mu_
  void finish(Sequence& seq, FinishReason reason, std::string error = {});
  void emit(Sequence& seq, TokenEvent event);
  // Hands seq's state (holding `tokens`) to Request::on_snapshot in the canonical host format
  // (Model::export_state for non-CPU states); a backend that cannot export skips it.
  void hand_snapshot(Sequence& seq, std::span<const int32_t> tokens);
  // The sequence state for Request::prefix: Model::import_state of a canonical (host) snapshot,
  // a clone of a backend state; a snapshot the model refuses means a full prefill (logged).
  std::unique_ptr<forward::SequenceState> restore_prefix(const Request& r);
  void drop_finished();                     // caller holds mu_
  // Items whose next token the model samples itself (EngineOptions::device_sampling).
  void plan_device_sampling(StepBatch& batch) const;
  Status process_item(Sequence& seq, const PlannedItem& item, const forward::BatchItem& bi,
                      std::span<const float> logits);
  // Samples from `row`, or takes the token the model sampled for `bi` (then `row` is empty).
  Status sample_next(Sequence& seq, std::span<const float> row, const forward::BatchItem& bi);
  bool has_work() const;                    // caller holds mu_
  // Speculative decoding (spec_step.cpp).
  int64_t spec_room(const Sequence& seq) const;  // drafts the sequence could verify now
  // Feeds the step's wall time to spec_costs_ (decode-only steps that succeeded) and updates the
  // policy's EngineStats. Caller holds step_mu_ and mu_.
  void record_step_cost(const StepBatch& batch, bool ok, double seconds);
  void prepare_speculation(StepBatch& batch);  // without mu_: runs the draft
  Status verify_block(Sequence& seq, std::span<const float> logits);
  Status emit_token(Sequence& seq, int32_t token, std::span<const float> row, int64_t position,
                    bool& finished);
  void loop();

  forward::Model& model_;
  const EngineOptions options_;
  const int64_t vocab_;
  const bool device_sampling_;  // options_.device_sampling and the model agree
  const SpecMode spec_mode_;     // options_.speculative, kOff when the model has no draft
  const int64_t spec_block_;     // the draft's block size (Model::draft_block_size)
  double now() const;            // options_.clock or steady_clock, in seconds

  mutable std::mutex mu_;       // guards everything below
  std::condition_variable cv_;  // wakes the scheduler thread
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::list<std::unique_ptr<Sequence>> running_;  // admission order
  EngineStats stats_;
  Rng seed_rng_;
  bool stopping_ = false;
  bool snapshot_warned_ = false;  // hand_snapshot logged a refused export

  std::mutex step_mu_;  // one step at a time (thread or caller); also guards spec_costs_
  SpecCosts spec_costs_;
  // Acceptance over all sequences (fed by every verification); new sequences start from it.
  std::optional<SpecPolicy> spec_shared_;
  std::thread thread_;
};

}  // namespace flashseek::engine
