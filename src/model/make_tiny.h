// Random checkpoints in the release format for tests and demos (DESIGN.md §7):
// names, dtypes, FP8 e4m3 + e8m0 block scales, FP4 experts packed in I8 with per-32 e8m0
// scales, Engram tables F8_E4M3 + E8M0, 2+ shards + model.safetensors.index.json, config.json
// (+ inference/config.json, engram_token_map.json for V4.1). Deterministic for a seed: every
// tensor draws from its own generator seeded by (seed, tensor name).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace flashseek::model {

// "tiny-v4" (model-v4.md §6), "tiny-v41" (model-v41.md §8), "demo" (tiny-v41 with the full
// 129,280-token vocabulary), finalized. Unknown name -> kNotFound.
Result<ModelConfig> builtin_config(std::string_view name);

struct MakeTinyOptions {
  uint64_t seed = 0;
  bool bf16 = false;       // store linears and experts as BF16 (no scales); Engram tables stay FP8
  // false: leave out the draft's tensors (mtp.*) while the config still declares the draft
  // layers, like a release that ships the backbone only (the loader warns and loads it).
  bool draft = true;
  // Residual branches scaled down (make-tiny --well-conditioned): the output projections that
  // write into the residual streams (attention wo_b, routed and shared experts' w2, Engram wkv)
  // are drawn kWellConditionedShift binades smaller, so that one flipped FP8 activation code
  // perturbs the streams too little to flip codes downstream (see make_tiny.cpp).
  bool well_conditioned = false;
  int min_shards = 2;
  uint64_t shard_bytes = 64ull << 20;  // more shards when the data exceeds min_shards * this
  int threads = 0;         // generating threads (all shards at once); <= 0: all cores
};

// Binades (powers of two) by which well_conditioned shrinks the residual branches' outputs.
inline constexpr int kWellConditionedShift = 10;

// Receives each weight's intended dequantised values in its logical shape, computed from the
// generated codes and scales (so a loader can be checked against it bit for bit).
using TensorSink =
    std::function<void(const std::string& name, const Shape& logical_shape, const std::vector<float>& values)>;

// engram_token_map.json for a V4.1 config: the identity when the compressed vocabulary equals
// the vocabulary, else ids modulo the compressed size (synthetic, not a tokenizer's).
std::string synthetic_engram_token_map_json(const ModelConfig& cfg);

// Writes the checkpoint into `out_dir` (created if needed). cfg.fp8_weights / fp4_experts /
// weight_block_size choose the formats (overridden to BF16 by opt.bf16).
Status make_tiny_checkpoint(const ModelConfig& cfg, const MakeTinyOptions& opt, const std::string& out_dir,
                            const TensorSink& sink = {});

}  // namespace flashseek::model
