#include "kvshare/snapshot_size.h"

#include <vector>

#include "forward/paged_rows.h"
#include "forward/state.h"

namespace flashseek::kvshare {

SnapshotSize snapshot_size(const model::ModelConfig& c) {
  SnapshotSize s;
  const int64_t L = c.num_layers, ring = c.window + forward::kMaxRollback;
  // A kv-source layer owns index keys when some layer reading its entries has an indexer.
  std::vector<bool> has_ikeys(size_t(L), false);
  for (int l = 0; l < int(L); ++l) {
    const auto& r = c.role(l);
    if (r.ratio > 0 && r.kv_src >= 0 && (r.idx_src >= 0 || r.index_source)) has_ikeys[size_t(r.kv_src)] = true;
  }
  double per_token = 4;  // the token id itself
  for (int l = 0; l < int(L); ++l) {
    const auto& r = c.role(l);
    if (!r.kv_source || r.ratio <= 0) continue;
    ++s.kv_source_layers;
    double width = double(c.head_dim), paged = 1;
    if (has_ikeys[size_t(l)]) {
      ++s.index_key_layers;
      width += double(c.index_head_dim);
      paged = 2;
    }
    // Rows, plus one page-kind byte per sealed page of each paged-rows object (state_io v3).
    per_token += width * 4.0 / double(r.ratio) +
                 paged / double(r.ratio * forward::kDefaultRowsPerPage);
  }
  s.bytes_per_1k_tokens = per_token * 1000.0;
  s.fixed_bytes = L * ring * c.head_dim * 4 + c.num_mtp_layers * ring * c.head_dim * 4;
  return s;
}

}  // namespace flashseek::kvshare
