// What a self-contained snapshot costs (forward/state_io.h v3, fp32 rows as the CPU state keeps
// them; in the host tier, later snapshots of a conversation share the sealed pages), computed from a config: the fixed part (window rings of every layer, DSpark / MTP
// rings) and the growth per 1,000 tokens (compressed KV and index keys of the kv-source layers,
// plus the 4-byte token ids the blob carries). Used for capacity planning (--host-cache-bytes)
// and checked against real blobs in tests/kvshare.
#pragma once
#include <cstdint>

#include "model/config.h"

namespace flashseek::kvshare {

struct SnapshotSize {
  int64_t fixed_bytes = 0;        // independent of the context length (rings, headers)
  double bytes_per_1k_tokens = 0; // marginal growth
  int64_t kv_source_layers = 0;   // layers that own compressed KV
  int64_t index_key_layers = 0;   // of those, layers that also own index keys
  int64_t bytes_at(int64_t tokens) const {
    return fixed_bytes + int64_t(bytes_per_1k_tokens * double(tokens) / 1000.0);
  }
};

SnapshotSize snapshot_size(const model::ModelConfig& cfg);

}  // namespace flashseek::kvshare
