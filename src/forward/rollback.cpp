// Rollback of a CPU sequence state by up to kMaxRollback tokens (v41 §5.7): compressed rows past
// the new length are dropped, open compressor groups are rebuilt from the recent projections,
// Engram look-back is trimmed; window rings need nothing (kMaxRollback spare slots mean a
// discarded position never overwrote a row the next window reads).
#include <algorithm>

#include "forward/cpu_model.h"

namespace flashseek::forward {

namespace {
// Rebuilds `cs` for a sequence of length L: the open group [g·ratio, L) and, with overlap, the
// previous window [(g−1)·ratio, g·ratio), from the history rows.
Status restore(CompressorState& cs, int64_t ratio, int64_t width, bool overlap, int64_t L, int layer) {
  const int64_t g = L / ratio, open = g * ratio;
  const int64_t need = overlap && g >= 1 ? open - ratio : open;
  const int64_t n_hist = int64_t(cs.hist_v.size()) / width;
  if (need < L && (need < cs.hist_first || L > cs.hist_first + n_hist))
    return out_of_range("rollback: layer {} compressor history starts at position {}, needs {}", layer,
                        cs.hist_first, need);
  auto rows = [&](const std::vector<float>& h, int64_t from, int64_t to) {
    return std::vector<float>(h.begin() + (from - cs.hist_first) * width, h.begin() + (to - cs.hist_first) * width);
  };
  cs.v = rows(cs.hist_v, open, L);
  cs.z = rows(cs.hist_z, open, L);
  cs.n_pend = L - open;
  if (overlap) {
    cs.has_prev = g >= 1;
    cs.prev_v = cs.has_prev ? rows(cs.hist_v, open - ratio, open) : std::vector<float>{};
    cs.prev_z = cs.has_prev ? rows(cs.hist_z, open - ratio, open) : std::vector<float>{};
  }
  const int64_t keep = std::max<int64_t>(0, std::min(L - cs.hist_first, n_hist));
  cs.hist_v.resize(size_t(keep * width));
  cs.hist_z.resize(size_t(keep * width));
  return {};
}
}  // namespace

Status CpuModel::rollback(SequenceState& state, int64_t L) const {
  auto* st = dynamic_cast<CpuSequenceState*>(&state);
  if (!st) return invalid_argument("rollback: not a CPU sequence state");
  const int64_t drop = st->len - L;
  if (drop < 0 || L < 0) return invalid_argument("rollback: new length {} outside [0, {}]", L, st->len);
  if (drop > st->ring_size - config().window)
    return out_of_range("rollback: {} tokens requested, at most {} supported", drop, st->ring_size - config().window);
  if (drop == 0) return {};
  const auto& c = config();
  const bool v41 = c.is_v41();
  const int64_t Dh = c.head_dim, dI = c.index_head_dim;
  CpuSequenceState next = *st;  // all-or-nothing
  for (int l = 0; l < int(c.num_layers); ++l) {
    const auto& role = c.role(l);
    const AttentionWeights& A = w_.layers[size_t(l)].attn;
    if (!A.has_compressor) continue;
    LayerState& LS = next.layers[size_t(l)];
    const int64_t ratio = role.ratio, groups = L / ratio;
    const bool overlap = !v41 && ratio == 4;
    const int64_t coff = overlap ? 2 : 1;
    LS.ckv.truncate(groups);  // pages before the cut stay shared
    LS.ikeys.truncate(groups);
    if (v41 && ratio == 1) continue;  // no partial state
    FS_RETURN_IF_ERROR(restore(LS.comp, ratio, coff * Dh, overlap, L, l));
    if (A.has_idx_compressor) FS_RETURN_IF_ERROR(restore(LS.icomp, ratio, coff * dI, overlap, L, l));
  }
  const size_t drop_hist = std::min(next.engram_hist.size(), size_t(drop));
  next.engram_hist.resize(next.engram_hist.size() - drop_hist);
  if (!next.mtp_hist_x.empty()) {  // MTP: final streams of the kept positions
    const size_t row = size_t(c.hc_mult * c.hidden_size), n = next.mtp_hist_x.size() / row;
    next.mtp_hist_x.resize((n - std::min(n, size_t(drop))) * row);
    if (next.mtp_hist_x.empty() && L > 0) return out_of_range("rollback: MTP history too short");
  }
  next.len = L;
  *st = std::move(next);
  return {};
}

}  // namespace flashseek::forward
