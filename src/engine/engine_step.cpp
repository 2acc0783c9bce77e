// Engine::step: admit waiting requests, plan one ragged batch, run the model, then turn each
// item's logits into prompt logprobs, sampled tokens and events.
#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_sequence.h"
#include "engine/sampler.h"

namespace flashseek::engine {

void Engine::admit() {
  while (!waiting_.empty() && stats_.running < options_.max_batch) {
    std::unique_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    seq->state = seq->req.prefix ? restore_prefix(seq->req) : model_.new_sequence();
    seq->prompt_done = seq->state->length();
    if (seq->req.prompt_logprobs >= 0) seq->prompt_lp.assign(seq->req.prompt.size(), std::nullopt);
    if (spec_mode_ != SpecMode::kOff) {  // (step_mu_ is held: admit() runs inside step())
      seq->policy.emplace(spec_mode_, spec_block_, options_.spec_policy);
      if (!spec_shared_) spec_shared_.emplace(spec_mode_, spec_block_, options_.spec_policy);
      seq->policy->adopt_acceptance(*spec_shared_);
    }
    running_.push_back(std::move(seq));
    ++stats_.running;
  }
  stats_.waiting = int64_t(waiting_.size());
}

Engine::StepBatch Engine::build_batch() {
  StepBatch b;
  std::vector<Sequence*> live;
  std::vector<SequenceNeed> needs;
  for (auto& s : running_) {
    if (s->done) continue;
    live.push_back(s.get());
    needs.push_back({s->pending_prompt(), true});
  }
  b.plan = plan_step(needs, options_.budget);
  for (const PlannedItem& p : b.plan) {
    Sequence* s = live[p.sequence];
    s->in_flight = true;
    forward::BatchItem item;
    item.state = s->state.get();
    if (p.prefill) {
      item.tokens = std::span<const int32_t>(s->req.prompt).subspan(size_t(s->prompt_done),
                                                                    size_t(p.n_tokens));
      item.all_logits = s->req.prompt_logprobs >= 0;
    } else {
      item.tokens = std::span<const int32_t>(&s->generated.back(), 1);
    }
    b.rows += item.all_logits ? p.n_tokens : 1;
    b.tokens += p.n_tokens;
    b.seqs.push_back(s);
    b.items.push_back(item);
  }
  return b;
}

Status Engine::step() {
  std::lock_guard step_lock(step_mu_);
  StepBatch batch;
  {
    std::lock_guard lock(mu_);
    admit();
    batch = build_batch();
  }
  prepare_speculation(batch);  // drafts outside the lock (spec_step.cpp)
  if (batch.items.empty()) return {};
  plan_device_sampling(batch);

  // The model runs without the lock: submit()/cancel() stay responsive. Nothing the items point
  // at changes meanwhile (only this step mutates prompts, tokens and states; a cancelled
  // sequence keeps its state until apply_results clears in_flight).
  const double t0 = spec_mode_ == SpecMode::kOff ? 0 : now();
  std::vector<float> logits;
  Status st = model_.forward(batch.items, logits);
  if (st.ok() && int64_t(logits.size()) != batch.rows * vocab_)
    st = internal_error("engine: model returned {} logits, expected {} rows x {} vocab",
                        logits.size(), batch.rows, vocab_);
  std::lock_guard lock(mu_);
  apply_results(batch, st, logits);
  // The step's cost as the speculation policy sees it: forward + acceptance, rollback, sampling.
  if (spec_mode_ != SpecMode::kOff) record_step_cost(batch, st.ok(), now() - t0);
  return st;
}

void Engine::plan_device_sampling(StepBatch& batch) const {
  if (!device_sampling_) return;
  batch.specs.assign(batch.items.size(), {});
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const Sequence& s = *batch.seqs[i];
    forward::BatchItem& item = batch.items[i];
    // Rows the host needs: every row (prompt logprobs, verification) or the sampled row's
    // logprobs. A prefill chunk samples only when it completes the prompt.
    if (item.all_logits || s.req.logprobs >= 0 || !s.verify_tokens.empty()) continue;
    if (batch.plan[i].prefill &&
        (s.prompt_done + batch.plan[i].n_tokens < s.prompt_len() || s.req.max_tokens == 0))
      continue;
    // The token will sit at the state's length after this item (Engine::sample_next).
    batch.specs[i] = sample_spec(s.req.sampling, s.state->length() + int64_t(item.tokens.size()));
    item.sample = &batch.specs[i];
    --batch.rows;
  }
}

void Engine::apply_results(const StepBatch& batch, const Status& st,
                           const std::vector<float>& logits) {
  ++stats_.steps;
  stats_.last_batch_items = int64_t(batch.items.size());
  stats_.last_batch_tokens = batch.tokens;
  size_t offset = 0;  // in rows
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    Sequence& s = *batch.seqs[i];
    s.in_flight = false;
    const forward::BatchItem& bi = batch.items[i];
    const size_t n_rows = bi.all_logits ? bi.tokens.size() : bi.sample ? 0 : 1;
    if (!st.ok()) {
      if (!s.done) finish(s, FinishReason::kError, st.message());
      continue;
    }
    if (batch.plan[i].prefill) stats_.prompt_tokens += batch.plan[i].n_tokens;
    if (!s.done) {
      auto mine = std::span<const float>(logits).subspan(offset * size_t(vocab_),
                                                          n_rows * size_t(vocab_));
      if (Status ps = process_item(s, batch.plan[i], bi, mine); !ps.ok())
        finish(s, FinishReason::kError, ps.message());
    }
    offset += n_rows;
  }
  drop_finished();
}

Status Engine::process_item(Sequence& seq, const PlannedItem& item, const forward::BatchItem& bi,
                            std::span<const float> logits) {
  const size_t V = size_t(vocab_);
  // A device-sampled item has no row (bi.sample; sample_next takes bi.sampled).
  auto row = [&](size_t r) { return bi.sample ? logits.first(0) : logits.subspan(r * V, V); };
  if (!item.prefill)
    return seq.verify_tokens.empty() ? sample_next(seq, row(0), bi) : verify_block(seq, logits);

  const int64_t start = seq.prompt_done;
  const int64_t P = seq.prompt_len();
  if (seq.req.prompt_logprobs >= 0) {
    // Row j holds the distribution of the token after position start + j.
    for (int64_t j = 0; j < item.n_tokens && start + j + 1 < P; ++j) {
      const int32_t actual = seq.req.prompt[size_t(start + j + 1)];
      FS_ASSIGN_OR_RETURN(PositionLogprobs lp,
                          position_logprobs(row(size_t(j)), actual, seq.req.prompt_logprobs));
      seq.prompt_lp[size_t(start + j + 1)] = std::move(lp);
    }
  }
  seq.prompt_done += item.n_tokens;
  // Long prefills also leave snapshots behind (at the chunk end that crosses each multiple of
  // snapshot_every), so a later prompt sharing only part of this one still finds a prefix.
  const int64_t every = seq.req.snapshot_every;
  if (every > 0 && seq.req.on_snapshot && seq.prompt_done < P &&
      seq.prompt_done / every > start / every)
    hand_snapshot(seq, std::span<const int32_t>(seq.req.prompt).first(size_t(seq.prompt_done)));
  if (seq.prompt_done < P) return {};
  if (seq.req.max_tokens == 0) {
    finish(seq, FinishReason::kLength);
    return {};
  }
  const size_t last = seq.req.prompt_logprobs >= 0 ? size_t(item.n_tokens - 1) : 0;
  return sample_next(seq, row(last), bi);
}

Status Engine::sample_next(Sequence& seq, std::span<const float> row, const forward::BatchItem& bi) {
  // The sampled token will sit at this position; it keys the seeded draw, so chunking and batch
  // composition cannot change the result.
  const int64_t position = seq.state->length();
  int32_t token = bi.sampled;
  if (!bi.sample) {
    FS_ASSIGN_OR_RETURN(token, sample_token(row, seq.req.sampling, position));
  } else if (token < 0 || token >= vocab_) {
    return token == -1 ? invalid_argument("sampling: no finite logit in a row of {} values (sampled on "
                                          "the device)", vocab_)
                       : internal_error("engine: the model sampled token {} outside [0, {})", token, vocab_);
  }
  bool finished = false;
  return emit_token(seq, token, row, position, finished);
}

}  // namespace flashseek::engine
