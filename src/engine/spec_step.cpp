// Speculative decoding in the engine step (v41 §5.4–5.7). A decoding sequence whose policy
// (spec_policy.h) chooses to speculate runs, instead of a 1-token decode item, a verification
// item [x0, y_1 … y_k] with logits for every row: x0 is its newest sampled token (not yet fed),
// y_i the first k ≤ B of the draft's proposals. After the
// forward, accept_block() decides how many drafts survive, the model rolls the state back to the
// committed length (Model::rollback), and the accepted drafts plus the bonus token are emitted.
// Everything else (prefill items, plain decodes, other sequences) is unaffected: the forward is
// batch-invariant and rows of a chunk equal those of one-token decodes, so greedy output is the
// same token for token as without speculation.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "engine/engine_sequence.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/spec_accept.h"

namespace flashseek::engine {

int64_t Engine::spec_room(const Sequence& seq) const {
  if (!seq.policy || seq.pending_prompt() > 0 || seq.generated.empty()) return 0;
  // A seeded sampled request must give the same tokens every time; under `auto` whether a step
  // speculates depends on measured times, and a speculative step draws differently from a plain
  // one (same distribution). So `auto` decodes those plainly; `on` still speculates.
  if (spec_mode_ == SpecMode::kAuto && seq.req.seed && !seq.req.sampling.greedy()) return 0;
  // A block of k drafts emits at most k + 1 tokens: no more drafts than tokens left to emit − 1
  // (one token left: a plain decode does it without the draft's cost).
  int64_t room = std::min(spec_block_, seq.req.max_tokens - int64_t(seq.generated.size()) - 1);
  // The verification chunk occupies positions length … length + k.
  if (options_.max_context > 0)
    room = std::min(room, options_.max_context - seq.state->length() - 1);
  return std::max<int64_t>(room, 0);
}

// Asks each decoding sequence's policy whether to speculate; for those that do, runs the draft
// and turns the decode item into a verification chunk of the proposal's first k drafts. A failing
// proposal leaves the plain decode item in place.
void Engine::prepare_speculation(StepBatch& batch) {
  int64_t decoding = 0;
  for (const PlannedItem& p : batch.plan) decoding += p.prefill ? 0 : 1;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    Sequence& s = *batch.seqs[i];
    s.verify_tokens.clear();
    s.verify_q.clear();
    s.spec_drafts = 0;
    if (batch.plan[i].prefill) continue;
    const int64_t room = spec_room(s);
    if (room < 1) continue;
    const SpecPolicy::Decision d = s.policy->decide(spec_costs_, decoding);
    if (d.probe) ++batch.spec_probes;
    const int64_t k = std::min(d.drafts, room);
    // The log shows each sequence's first real decision and every change, with the numbers.
    if (spec_mode_ == SpecMode::kAuto && !d.measure && int(k > 0) != s.spec_logged) {
      s.spec_logged = int(k > 0);
      spdlog::info("request {}: speculation {}: {}", s.req.id, k > 0 ? "on" : "off",
                   s.policy->reason());
    }
    if (k < 1) {
      ++batch.spec_plain;
      continue;
    }
    const int32_t x0 = s.generated.back();
    const int64_t first = s.state->length() + 1;  // position of y_1
    const SamplingParams& params = s.req.sampling;
    Status pick_error;
    std::vector<SamplingDistribution> q;
    auto choose = [&](int64_t j, std::span<const float> logits) -> int32_t {
      auto pick = pick_draft(logits, params, first + j - 1);
      if (!pick.ok()) {
        if (pick_error.ok()) pick_error = pick.status();
        return 0;
      }
      q.push_back(std::move(pick->q));
      return pick->token;
    };
    const double t0 = now();
    auto block = model_.propose(*s.state, x0, choose);
    spec_costs_.observe_draft(now() - t0);
    if (!block.ok() || !pick_error.ok() || int64_t(block->tokens.size()) < k) continue;
    s.verify_tokens.assign(1, x0);
    s.verify_tokens.insert(s.verify_tokens.end(), block->tokens.begin(), block->tokens.begin() + k);
    if (!params.greedy()) {
      q.resize(size_t(k));
      s.verify_q = std::move(q);
    }
    forward::BatchItem& item = batch.items[i];
    batch.rows +=
        int64_t(s.verify_tokens.size()) - (item.all_logits ? int64_t(item.tokens.size()) : 1);
    batch.tokens += int64_t(s.verify_tokens.size() - item.tokens.size());
    item.tokens = s.verify_tokens;
    item.all_logits = true;
    s.spec_drafts = k;
  }
}

void Engine::record_step_cost(const StepBatch& batch, bool ok, double seconds) {
  // Only decode-only steps tell the cost of decoding: a prefill chunk dominates its step.
  const bool decode_only =
      !batch.plan.empty() &&
      std::none_of(batch.plan.begin(), batch.plan.end(), [](const PlannedItem& p) { return p.prefill; });
  if (ok && decode_only) {
    const int64_t n = int64_t(batch.items.size());
    // Width: tokens per decode item, rounded (1: plain; 1 + k when the items verify k drafts).
    spec_costs_.observe_step(n, (batch.tokens + n / 2) / n, seconds);
  }
  stats_.spec_plain_steps += batch.spec_plain;
  stats_.spec_probes += batch.spec_probes;
  stats_.spec_sequences_speculating = stats_.spec_sequences_plain = 0;
  stats_.spec_block_sequences.assign(size_t(spec_block_ + 1), 0);
  for (const auto& s : running_)
    if (!s->done && s->policy && s->pending_prompt() == 0) {
      ++(s->policy->speculating() ? stats_.spec_sequences_speculating : stats_.spec_sequences_plain);
      ++stats_.spec_block_sequences[size_t(std::clamp<int64_t>(s->spec_drafts, 0, spec_block_))];
    }
  stats_.spec_step_costs = spec_costs_.entries();
  stats_.spec_draft_seconds = spec_costs_.draft().value_or(-1.0);
}

// logits: [1 + B, V], row j after the j-th token of the verification chunk.
Status Engine::verify_block(Sequence& seq, std::span<const float> logits) {
  const size_t V = size_t(vocab_);
  const int64_t B = int64_t(seq.verify_tokens.size()) - 1;
  const int64_t base = seq.state->length() - (B + 1);  // position of x0
  const std::span<const int32_t> drafts = std::span<const int32_t>(seq.verify_tokens).subspan(1);
  // Benchmark mode (EngineOptions::spec_script_accept): the scripted count for this sequence's
  // verification number seq.spec_steps replaces the acceptance rule.
  FS_ASSIGN_OR_RETURN(
      SpecVerdict v,
      options_.spec_script_accept > 0
          ? scripted_verdict(drafts, logits, vocab_, seq.req.sampling, base + 1,
                             scripted_accepted(options_.spec_script_accept, seq.spec_steps))
          : accept_block(drafts, seq.verify_q, logits, vocab_, seq.req.sampling, base + 1));

  // Tokens to emit: y_1 … y_n then z, cut at the first one that ends the request.
  std::vector<int32_t> out(drafts.begin(), drafts.begin() + v.accepted);
  out.push_back(v.bonus);
  const auto& stops = seq.req.stop_ids;
  const int64_t left = seq.req.max_tokens - int64_t(seq.generated.size());
  size_t keep = 0;
  while (keep < out.size()) {
    const int32_t t = out[keep++];
    const bool stop = (!seq.req.ignore_eos && t == model_.config().eos_token_id) ||
                      std::find(stops.begin(), stops.end(), t) != stops.end();
    if (stop || int64_t(keep) >= left) break;
  }
  out.resize(keep);
  // The state keeps x0 and every emitted token but the newest (which is fed next step), exactly
  // as after plain decoding.
  FS_RETURN_IF_ERROR(model_.rollback(*seq.state, base + int64_t(keep)));

  if (seq.policy) seq.policy->observe(B, v.accepted);
  if (spec_shared_) spec_shared_->observe(B, v.accepted);
  const int64_t width = std::max(B, spec_block_);
  if (int64_t(stats_.spec_accepted_at.size()) < width)
    stats_.spec_accepted_at.resize(size_t(width), 0);
  for (int64_t i = 0; i < v.accepted; ++i) ++stats_.spec_accepted_at[size_t(i)];
  ++stats_.spec_steps;
  stats_.spec_drafted += B;
  stats_.spec_accepted += v.accepted;
  stats_.spec_emitted += int64_t(keep);
  ++seq.spec_steps;
  seq.spec_tokens += int64_t(keep);
  seq.verify_tokens.clear();
  seq.verify_q.clear();

  bool finished = false;
  for (size_t k = 0; k < keep && !finished; ++k)
    FS_RETURN_IF_ERROR(
        emit_token(seq, out[k], logits.subspan(k * V, V), base + 1 + int64_t(k), finished));
  return {};
}

// Emits `token` sampled from `row` for `position`, like Engine::sample_next after its draw.
Status Engine::emit_token(Sequence& seq, int32_t token, std::span<const float> row,
                          int64_t position, bool& finished) {
  TokenEvent e;
  e.token = token;
  e.index = int64_t(seq.generated.size());
  if (seq.req.logprobs >= 0) {
    FS_ASSIGN_OR_RETURN(PositionLogprobs lp, position_logprobs(row, token, seq.req.logprobs));
    e.logprobs = std::move(lp);
  }
  seq.generated.push_back(token);
  ++stats_.generated_tokens;
  const auto& stops = seq.req.stop_ids;
  const bool is_eos = !seq.req.ignore_eos && token == model_.config().eos_token_id;
  const int64_t max_pos = options_.max_context;
  if (is_eos || std::find(stops.begin(), stops.end(), token) != stops.end())
    e.finish = FinishReason::kStop;
  else if (int64_t(seq.generated.size()) >= seq.req.max_tokens)
    e.finish = FinishReason::kLength;
  else if (max_pos > 0 && position + 1 >= max_pos)
    e.finish = FinishReason::kLength;
  finished = e.finish != FinishReason::kNone;
  emit(seq, std::move(e));
  return {};
}

}  // namespace flashseek::engine
