// Per-sequence state of the CPU backend (DESIGN.md §3): window rings, append-only compressed KV
// and index keys (kv-source layers only), compressor partial groups, Engram look-back.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "forward/model.h"
#include "forward/model_state.h"
#include "forward/paged_rows.h"

namespace flashseek::forward {

// One compressor's unfinished tokens. Each token keeps its value and gate rows (gate with `ape`
// already added). V4 ratio 4 also keeps the previous complete window (its first halves feed the
// next entry, v4 §3.5.5).
struct CompressorState {
  std::vector<float> v, z;            // [n_pend, width] tokens of the open group
  std::vector<float> prev_v, prev_z;  // [ratio, width] previous window (overlap only)
  int64_t n_pend = 0;
  bool has_prev = false;
  // Projections of the most recent tokens (positions hist_first …, at most 2·ratio +
  // kMaxRollback rows) so that a rollback can rebuild the open group and previous window.
  std::vector<float> hist_v, hist_z;  // [n_hist, width]
  int64_t hist_first = 0;
};

// Most tokens a rollback may discard: the window rings have this many spare slots.
inline constexpr int64_t kMaxRollback = 8;

struct LayerState {
  std::vector<float> ring;            // [ring_size, head_dim] raw window KV, slot = pos % ring_size
  PagedRows ckv;                      // [n_entries, head_dim] compressed KV (kv sources only)
  PagedRows ikeys;                    // [n_entries, index_head_dim] index keys (index-key owners)
  CompressorState comp;               // attention compressor
  CompressorState icomp;              // V4 indexer compressor
};

// len, ring_size (window + kMaxRollback: room for speculative blocks) and engram_hist: ModelState.
class CpuSequenceState final : public ModelState {
 public:
  std::unique_ptr<SequenceState> clone() const override {
    return std::make_unique<CpuSequenceState>(*this);
  }

  std::vector<LayerState> layers;      // [num_layers]
  std::vector<float> mtp_ring;          // [ring_size, head_dim] V4 MTP window KV (row p needs token p+1)
  std::vector<float> mtp_hist_x;        // [n, hc, hidden] final streams of the last n ≤ 1+kMaxRollback positions
  std::vector<std::vector<float>> draft_rings;  // [stage][ring_size, head_dim] DSpark KV of ctx[p]
};

}  // namespace flashseek::forward
