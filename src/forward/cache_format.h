// Row formats of a sequence's caches (ops/cache_row.h) as the model produces them: what the flow
// (forward/flow.cpp) quantises every row to before it is stored, by model family and numerics.
//
// reference numerics (the values of spec model-v4.md §3.5 / model-v41.md §3):
//   V4.1  window ring  e4m3, E8M0 per 32 over all Dh (RoPE tail included)        512 → 528 B
//         compressed KV e2m1, E4M3 per 16                                         512 → 288 B
//         index keys   e2m1, E8M0 per 32                                          128 →  68 B
//   V4    window ring  e4m3, E8M0 per 64 over Dh − Dr, BF16 RoPE tail (kv_norm and RoPE round
//                      to BF16)                                                   512 → 584 B
//         compressed KV the same                                                   512 → 584 B
//         index keys   e2m1, E8M0 per 32 (after the Hadamard transform)          128 →  68 B
// exact numerics stores unquantised FP32 values: every cache stays FP32. A config whose dims do
// not divide into the blocks (the quantisers require it) also keeps FP32.
#pragma once
#include "forward/model.h"
#include "model/config.h"
#include "ops/cache_row.h"

namespace flashseek::forward {

struct CacheFormats {
  ops::CacheRowFormat ring;   // window ring slot [head_dim]
  ops::CacheRowFormat ckv;    // compressed KV row [head_dim]
  ops::CacheRowFormat ikeys;  // index key row [index_head_dim]
};

CacheFormats cache_formats(const model::ModelConfig& c, Numerics numerics);

}  // namespace flashseek::forward
