// Parameter and byte counts per component (the rows of model-v41.md §1.8) and per dtype, either
// from a config alone (release on-disk formats) or from the tensors of an opened checkpoint.
// params = logical (dequantised) weight elements, scales excluded; bytes = on-disk bytes
// including scales; tensors = stored tensors including scales.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace flashseek::model {

struct CountRow {
  int64_t params = 0;
  uint64_t bytes = 0;
  int64_t tensors = 0;
  void add(const CountRow& o) {
    params += o.params;
    bytes += o.bytes;
    tensors += o.tensors;
  }
};

struct ModelCounts {
  std::array<CountRow, kNumComponents> components{};  // indexed by Component
  CountRow total;
  std::map<std::string, CountRow> dtypes;  // safetensors dtype name -> tensors/bytes/elements(params)
};

ModelCounts count_from_config(const ModelConfig& cfg);
ModelCounts count_from_checkpoint(const Checkpoint& ck);

}  // namespace flashseek::model

namespace flashseek::model {

// Human-readable table: one line per non-empty component, the total, then the dtype summary.
std::string format_counts_table(const ModelCounts& m);
// {"components": [{"name", "params", "bytes", "tensors"}...], "total": {...}, "dtypes": {...}};
// with a report also "valid", "errors", "warnings". Pretty-printed JSON text.
std::string format_counts_json(const ModelCounts& m, const ValidationReport* report,
                               const std::vector<std::string>& config_warnings);

}  // namespace flashseek::model
