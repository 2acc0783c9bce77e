// Geometry of the canonical state format against a model, the CPU backend's export/import and
// the backend-kind fingerprint (state_convert.h), and Model's default snapshot hooks.
#include "forward/state_convert.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "forward/cpu_model.h"

namespace flashseek::forward {

Result<std::unique_ptr<CpuSequenceState>> Model::export_state(const SequenceState&) const {
  return Status(StatusCode::kUnimplemented, "snapshots: this model backend cannot export sequence states");
}

Result<std::unique_ptr<SequenceState>> Model::import_state(const CpuSequenceState&) const {
  return Status(StatusCode::kUnimplemented, "snapshots: this model backend cannot import sequence states");
}

namespace {

// Largest state length accepted (positions stay far from int64 overflow in every product).
constexpr int64_t kMaxStateTokens = int64_t(1) << 40;

using LayerShape = StateLayerShape;

// n == rows · width without overflow (rows, width ≥ 0).
bool is_rows(size_t n, int64_t rows, int64_t width) {
  if (rows < 0 || width <= 0) return false;
  return n % size_t(width) == 0 && int64_t(n / size_t(width)) == rows;
}

Status check_comp(const CompressorState& cs, const LayerShape& ls, int64_t width, int64_t len,
                  const std::string& what) {
  if (!ls.pooled) {
    if (!cs.v.empty() || !cs.z.empty() || !cs.prev_v.empty() || !cs.prev_z.empty() || cs.n_pend != 0 ||
        cs.has_prev || !cs.hist_v.empty() || !cs.hist_z.empty() || cs.hist_first != 0)
      return invalid_argument("state geometry: {} holds compressor data but this layer pools no groups", what);
    return {};
  }
  const int64_t ratio = ls.ratio, n_pend = len % ratio;
  if (cs.n_pend != n_pend || !is_rows(cs.v.size(), n_pend, width) || !is_rows(cs.z.size(), n_pend, width))
    return invalid_argument("state geometry: {} open group has {} rows ({} / {} floats), expected {} rows of {}",
                            what, cs.n_pend, cs.v.size(), cs.z.size(), n_pend, width);
  const bool has_prev = ls.overlap && len / ratio >= 1;
  const int64_t prev_rows = has_prev ? ratio : 0;
  if (cs.has_prev != has_prev || !is_rows(cs.prev_v.size(), prev_rows, width) ||
      !is_rows(cs.prev_z.size(), prev_rows, width))
    return invalid_argument("state geometry: {} previous window ({} / {} floats) differs from {} rows of {}", what,
                            cs.prev_v.size(), cs.prev_z.size(), prev_rows, width);
  const int64_t keep = 2 * ratio + kMaxRollback;
  if (cs.hist_first < 0 || cs.hist_first > len)
    return invalid_argument("state geometry: {} history starts at position {} (length {})", what, cs.hist_first,
                            len);
  const int64_t n_hist = len - cs.hist_first;
  if (n_hist > keep || !is_rows(cs.hist_v.size(), n_hist, width) || !is_rows(cs.hist_z.size(), n_hist, width))
    return invalid_argument("state geometry: {} history ({} / {} floats from position {}) is not {} rows of {} "
                            "(at most {})", what, cs.hist_v.size(), cs.hist_z.size(), cs.hist_first, n_hist, width,
                            keep);
  return {};
}

Status check_rows(const PagedRows& p, int64_t width, int64_t rows, const std::string& what) {
  if (p.width() != PagedRows(width).width() || p.size() != rows)
    return invalid_argument("state geometry: {} holds {} rows of width {}, expected {} rows of width {}", what,
                            p.size(), p.width(), rows, width);
  return {};
}

}  // namespace

StateLayerShape state_layer_shape(const model::ModelConfig& c, int l) {
  const auto& role = c.role(l);
  StateLayerShape s;
  s.ratio = role.ratio;
  if (c.is_v41()) {
    s.compressor = role.kv_source && role.ratio > 0;
    s.pooled = s.compressor && role.ratio > 1;
    s.ikeys = s.compressor && role.index_source;
  } else {
    s.compressor = s.pooled = role.ratio > 0;
    s.overlap = s.icomp = s.ikeys = role.ratio == 4;
  }
  return s;
}

Status check_state_geometry(const CpuSequenceState& s, const model::ModelConfig& c, const StateGeometry& g) {
  const int64_t len = s.len, Dh = c.head_dim, dI = c.index_head_dim;
  if (len < 0 || len > kMaxStateTokens)
    return invalid_argument("state geometry: length {} outside [0, {}]", len, kMaxStateTokens);
  const int64_t ring = c.window + kMaxRollback;
  if (s.ring_size != ring)
    return invalid_argument("state geometry: ring size {} differs from this model's {} (window {} + {})",
                            s.ring_size, ring, c.window, kMaxRollback);
  if (int64_t(s.layers.size()) != c.num_layers)
    return invalid_argument("state geometry: {} layers, this model has {}", s.layers.size(), c.num_layers);
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerState& L = s.layers[size_t(l)];
    const LayerShape ls = state_layer_shape(c, l);
    const std::string at = fmt::format("layer {}", l);
    if (!is_rows(L.ring.size(), ring, Dh))
      return invalid_argument("state geometry: {} window ring has {} floats, expected {} x {}", at, L.ring.size(),
                              ring, Dh);
    FS_RETURN_IF_ERROR(check_rows(L.ckv, Dh, ls.compressor ? len / ls.ratio : 0, at + " compressed KV"));
    FS_RETURN_IF_ERROR(check_rows(L.ikeys, dI, ls.ikeys ? len / ls.ratio : 0, at + " index keys"));
    const int64_t coff = ls.overlap ? 2 : 1;
    FS_RETURN_IF_ERROR(check_comp(L.comp, ls, coff * Dh, len, at + " compressor"));
    LayerShape il = ls;
    il.pooled = ls.icomp;
    FS_RETURN_IF_ERROR(check_comp(L.icomp, il, coff * dI, len, at + " indexer compressor"));
  }
  // Engram look-back: the last N−1 ids at least (the next hash needs them), N−1+kMaxRollback at most.
  if (g.max_engram_id >= 0) {
    const int64_t n1 = std::max<int64_t>(0, c.engram_max_ngram_size - 1);
    const int64_t lo = std::min(len, n1), hi = std::min(len, n1 + kMaxRollback), n = int64_t(s.engram_hist.size());
    if (n < lo || n > hi)
      return invalid_argument("state geometry: Engram look-back holds {} ids, expected {}..{}", n, lo, hi);
    for (int64_t id : s.engram_hist)
      if (id < 0 || id > g.max_engram_id)
        return invalid_argument("state geometry: Engram look-back id {} outside [0, {}]", id, g.max_engram_id);
  } else if (!s.engram_hist.empty()) {
    return invalid_argument("state geometry: Engram look-back present but this model has no Engram");
  }
  if (g.mtp) {
    const int64_t row = c.hc_mult * c.hidden_size;
    if (!is_rows(s.mtp_ring.size(), ring, Dh))
      return invalid_argument("state geometry: MTP ring has {} floats, expected {} x {}", s.mtp_ring.size(), ring, Dh);
    const int64_t n = row > 0 && s.mtp_hist_x.size() % size_t(row) == 0 ? int64_t(s.mtp_hist_x.size() / size_t(row))
                                                                        : -1;
    const int64_t lo = std::min<int64_t>(len, 1), hi = std::min<int64_t>(len, 1 + kMaxRollback);
    if (n < lo || n > hi)
      return invalid_argument("state geometry: MTP history has {} floats, expected {}..{} rows of {}",
                              s.mtp_hist_x.size(), lo, hi, row);
  } else if (!g.ignore_mtp && (!s.mtp_ring.empty() || !s.mtp_hist_x.empty())) {
    return invalid_argument("state geometry: MTP state present but this model has no MTP block");
  }
  const size_t stages = g.draft ? size_t(c.num_mtp_layers) : 0;
  if (!g.ignore_draft && s.draft_rings.size() != stages)
    return invalid_argument("state geometry: {} DSpark draft rings, this model has {}", s.draft_rings.size(), stages);
  for (size_t i = 0; i < stages && !g.ignore_draft; ++i)
    if (!is_rows(s.draft_rings[i].size(), ring, Dh))
      return invalid_argument("state geometry: DSpark draft ring {} has {} floats, expected {} x {}", i,
                              s.draft_rings[i].size(), ring, Dh);
  return {};
}

uint64_t state_fingerprint(uint64_t checkpoint_fingerprint, std::string_view backend_kind) {
  if (backend_kind == "cpu") return checkpoint_fingerprint;
  return XXH64(backend_kind.data(), backend_kind.size(), checkpoint_fingerprint);
}

StateGeometry CpuModel::state_geometry() const {
  const auto& c = config();
  StateGeometry g;
  g.draft = w_.has_dspark;
  g.mtp = w_.has_mtp;
  if (c.is_v41() && !c.engram_layer_ids.empty() && !w_.engram_token_map.empty())
    g.max_engram_id = *std::max_element(w_.engram_token_map.begin(), w_.engram_token_map.end());
  return g;
}

Result<std::unique_ptr<CpuSequenceState>> CpuModel::export_state(const SequenceState& state) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("export_state: not a CPU sequence state");
  return std::make_unique<CpuSequenceState>(*st);  // sealed pages are shared, not copied
}

Result<std::unique_ptr<SequenceState>> CpuModel::import_state(const CpuSequenceState& state) const {
  FS_RETURN_IF_ERROR(check_state_geometry(state, config(), state_geometry()));
  return std::unique_ptr<SequenceState>(std::make_unique<CpuSequenceState>(state));
}

}  // namespace flashseek::forward
