// The part of a sequence state every backend keeps on the host: its length, window ring size and
// Engram look-back (the model flow, forward/flow.h, reads and advances them; each backend keeps
// its caches itself).
#pragma once
#include <cstdint>
#include <vector>

#include "forward/model.h"

namespace flashseek::forward {

class ModelState : public SequenceState {
 public:
  int64_t length() const override { return len; }
  int64_t len = 0;                   // tokens processed (the next token's position)
  int64_t ring_size = 0;             // window rows kept: window + kMaxRollback
  std::vector<int64_t> engram_hist;  // compressed ids of the last min(len, N−1+kMaxRollback) positions
};

}  // namespace flashseek::forward
