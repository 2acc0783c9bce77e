// Speculative decoding in the engine step (v41 §5.4–5.7). A decoding sequence that speculates
// runs, instead of a 1-token decode item, a verification item [x0, y_1 … y_B] with logits for
// every row: x0 is its newest sampled token (not yet fed), y_i the draft's proposals. After the
// forward, accept_block() decides how many drafts survive, the model rolls the state back to the
// committed length (Model::rollback), and the accepted drafts plus the bonus token are emitted.
// Everything else (prefill items, plain decodes, other sequences) is unaffected: the forward is
// batch-invariant and rows of a chunk equal those of one-token decodes, so greedy output is the
// same token for token as without speculation.
#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_sequence.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/spec_accept.h"

namespace flashseek::engine {

bool Engine::speculate(const Sequence& seq) const {
  const int64_t B = model_.config().dspark_block_size;
  if (!options_.speculative || B < 1 || !model_.has_draft()) return false;
  if (seq.pending_prompt() > 0 || seq.generated.empty()) return false;
  // One token left to emit: a plain decode does it without the draft's cost.
  if (seq.req.max_tokens - int64_t(seq.generated.size()) < 2) return false;
  // The verification chunk occupies positions length … length + B.
  const int64_t end = seq.state->length() + B + 1;
  return options_.max_context == 0 || end <= options_.max_context;
}

// Runs the draft for every decode item whose sequence speculates and turns the item into a
// verification chunk. A failing proposal leaves the plain decode item in place.
void Engine::prepare_speculation(StepBatch& batch) {
  for (size_t i = 0; i < batch.items.size(); ++i) {
    Sequence& s = *batch.seqs[i];
    s.verify_tokens.clear();
    s.verify_q.clear();
    if (batch.plan[i].prefill || !speculate(s)) continue;
    const int32_t x0 = s.generated.back();
    const int64_t first = s.state->length() + 1;  // position of y_1
    const SamplingParams& params = s.req.sampling;
    Status pick_error;
    std::vector<SamplingDistribution> q;
    auto choose = [&](int64_t k, std::span<const float> logits) -> int32_t {
      auto pick = pick_draft(logits, params, first + k - 1);
      if (!pick.ok()) {
        if (pick_error.ok()) pick_error = pick.status();
        return 0;
      }
      q.push_back(std::move(pick->q));
      return pick->token;
    };
    auto block = model_.propose(*s.state, x0, choose);
    if (!block.ok() || !pick_error.ok()) continue;
    s.verify_tokens.assign(1, x0);
    s.verify_tokens.insert(s.verify_tokens.end(), block->tokens.begin(), block->tokens.end());
    if (!params.greedy()) s.verify_q = std::move(q);
    forward::BatchItem& item = batch.items[i];
    batch.rows +=
        int64_t(s.verify_tokens.size()) - (item.all_logits ? int64_t(item.tokens.size()) : 1);
    batch.tokens += int64_t(s.verify_tokens.size() - item.tokens.size());
    item.tokens = s.verify_tokens;
    item.all_logits = true;
  }
}

// logits: [1 + B, V], row j after the j-th token of the verification chunk.
Status Engine::verify_block(Sequence& seq, std::span<const float> logits) {
  const size_t V = size_t(vocab_);
  const int64_t B = int64_t(seq.verify_tokens.size()) - 1;
  const int64_t base = seq.state->length() - (B + 1);  // position of x0
  const std::span<const int32_t> drafts = std::span<const int32_t>(seq.verify_tokens).subspan(1);
  FS_ASSIGN_OR_RETURN(SpecVerdict v, accept_block(drafts, seq.verify_q, logits, vocab_,
                                                  seq.req.sampling, base + 1));

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

  if (int64_t(stats_.spec_accepted_at.size()) < B) stats_.spec_accepted_at.resize(size_t(B), 0);
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
