// Model-level flow of the CPU backend: embedding, the per-layer mHC data flow (V4.1 single-pass,
// V4 classic), the final collapse/norm/head, and Engram (V4.1).
#include "forward/cpu_model.h"

#include "forward/cpu_backend.h"

#include <algorithm>
#include <cassert>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "ops/engram.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"

namespace flashseek::forward {

Result<std::unique_ptr<CpuModel>> CpuModel::load(const std::string& dir, Numerics numerics,
                                                 const CpuLoadOptions& opts) {
  // Checked before the (large) weight load: NaN fails both comparisons.
  if (!(opts.dot_perturbation >= 0 && opts.dot_perturbation <= 1e-3))
    return invalid_argument("CPU load options: dot_perturbation {} outside [0, 1e-3]", opts.dot_perturbation);
  if (opts.perturbation_mode != DotPerturbationMode::kRelative &&
      opts.perturbation_mode != DotPerturbationMode::kTermMagnitude)
    return invalid_argument("CPU load options: unknown perturbation_mode {}", int(opts.perturbation_mode));
  if (opts.dot_perturbation > 0 && numerics != Numerics::kReference)
    return invalid_argument("CPU load options: dot_perturbation needs reference numerics (exact has no "
                            "FP8-activation dot products)");
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(dir));
  std::unique_ptr<CpuModel> m(new CpuModel());
  m->ck_ = std::make_unique<model::Checkpoint>(std::move(ck));
  WeightLoadOptions wo = opts.weights;
  wo.matrices = true;
  FS_ASSIGN_OR_RETURN(m->w_, load_weights(*m->ck_, wo));
  m->numerics_ = numerics;
  const auto& c = m->config();
  const ActBlocks ab = reference_act_blocks(c, numerics);
  m->act_block_ = ab.linear;
  m->expert_act_block_ = ab.experts;
  if (opts.dot_perturbation > 0 && m->act_block_ == 0 && m->expert_act_block_ == 0)
    return invalid_argument("{}: dot_perturbation: the checkpoint has no FP8/FP4 linears (nothing "
                            "quantises activations to FP8)", dir);
  m->dot_perturbation_ = opts.dot_perturbation;
  m->perturbation_seed_ = opts.perturbation_seed;
  m->perturbation_mode_ = opts.perturbation_mode;
  m->perturbation_filter_ = opts.perturbation_filter;
  return m;
}

Result<std::unique_ptr<Model>> load_model(const std::string& ckpt_dir, Numerics numerics) {
  FS_ASSIGN_OR_RETURN(auto m, CpuModel::load(ckpt_dir, numerics));
  return std::unique_ptr<Model>(std::move(m));
}

std::unique_ptr<SequenceState> CpuModel::new_sequence() const {
  const auto& c = config();
  auto st = std::make_unique<CpuSequenceState>();
  st->ring_size = c.window + kMaxRollback;
  st->layers.resize(size_t(c.num_layers));
  for (auto& l : st->layers) {
    l.ring.assign(size_t(st->ring_size * c.head_dim), 0.0f);
    l.ckv.reset(c.head_dim);
    l.ikeys.reset(c.index_head_dim);
  }
  if (w_.has_mtp) st->mtp_ring.assign(size_t(st->ring_size * c.head_dim), 0.0f);
  if (w_.has_dspark)
    st->draft_rings.assign(size_t(c.num_mtp_layers), std::vector<float>(size_t(st->ring_size * c.head_dim), 0.0f));
  return st;
}

FlowParams CpuModel::flow_params() const { return make_flow_params(config(), w_, numerics_); }

Status CpuModel::forward(std::span<BatchItem> batch, std::vector<float>& logits) {
  const int64_t V = config().vocab_size;
  for (auto& item : batch) {
    if (!dynamic_cast<CpuSequenceState*>(item.state)) return invalid_argument("forward: batch item has no CPU sequence state");
    if (item.tokens.empty()) return invalid_argument("forward: a batch item has no tokens");
    if (item.sample) return invalid_argument("forward: the CPU backend does not sample on the device");
    for (int32_t t : item.tokens)
      if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
  }
  // All items in one pass: every CPU kernel is row-wise, so an item's result does not depend on
  // its neighbours (batch invariance by construction).
  CpuOps ops(*this);
  Forward f(flow_params(), ops);
  const size_t off = logits.size();
  Status s = f.forward(batch, logits);
  if (!s.ok()) logits.resize(off);
  return s;
}

Result<DraftBlock> CpuModel::propose(const SequenceState& state, int32_t x0, const DraftChooser& choose) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("propose: not a CPU sequence state");
  if (st->len < 1) return invalid_argument("propose: the sequence has no committed token yet");
  const auto& c = config();
  if (x0 < 0 || x0 >= c.vocab_size) return invalid_argument("propose: anchor token {} outside [0, {})", x0, c.vocab_size);
  if (!w_.has_dspark && w_.has_mtp) {  // V4 MTP: the draft for position a + 2 from (X_a, x0)
    DraftBlock out;
    FS_ASSIGN_OR_RETURN(out.logits, mtp_logits(state, x0));
    const std::span<const float> row(out.logits);
    const int32_t y = choose ? choose(1, row)
                             : int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    if (y < 0 || y >= c.vocab_size)
      return invalid_argument("propose: chooser returned token {} outside [0, {})", y, c.vocab_size);
    out.tokens.push_back(y);
    out.confidence.push_back(0.0f);  // MTP has no confidence head
    return out;
  }
  if (!w_.has_dspark) return invalid_argument("propose: the checkpoint has no draft (mtp.*)");
  CpuOps ops(*this);
  Forward f(flow_params(), ops);
  // The flow only reads the state (the draft rings).
  return f.propose(const_cast<CpuSequenceState&>(*st), x0, choose);
}

Result<std::vector<int64_t>> CpuModel::engram_hash_ids(const SequenceState& state,
                                                       std::span<const int32_t> tokens) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("engram_hash_ids: not a CPU sequence state");
  const auto& c = config();
  if (!c.is_v41() || c.engram_layer_ids.empty()) return std::vector<int64_t>{};
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) return invalid_argument("engram_hash_ids: token id {} out of range", t);
  CpuSequenceState copy = *st;
  FwdChunk ctx;
  FwdSeg g;
  g.st = &copy;
  g.tokens = tokens;
  g.start = st->len;
  g.T = int64_t(tokens.size());
  ctx.T = g.T;
  ctx.segs.push_back(std::move(g));
  CpuOps ops(*this);
  Forward(flow_params(), ops).engram_ids(ctx);
  // Reorder [layer, T, cols] -> [T, layer, cols].
  const int64_t nl = int64_t(c.engram_layer_ids.size()), T = ctx.T;
  const int64_t nc = w_.layers[size_t(c.engram_layer_ids[0])].engram.layout.n_cols();
  std::vector<int64_t> out(size_t(T * nl * nc));
  for (int64_t l = 0; l < nl; ++l)
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(ctx.engram_ids.data() + (l * T + t) * nc, nc, out.data() + (t * nl + l) * nc);
  return out;
}

}  // namespace flashseek::forward
