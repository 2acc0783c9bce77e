// --load-format dummy: a model whose tensors have the release checkpoint's names, shapes and
// formats (FP8 e4m3 + E8M0 blocks, MXFP4 experts, BF16, F32), generated in memory from a config
// and a seed (the same bytes as `make-tiny` writes for that config and seed), and --num-layers:
// a smaller config that keeps every layer role of the original.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace flashseek::model {

struct ReducedConfig {
  ModelConfig cfg;
  std::vector<int> kept;  // original backbone layer of each new layer (ascending)
  std::string summary;    // one line: what was kept and how the role lists were mapped
};

// Keeps `n` backbone layers of `cfg` such that every layer role is present: window-only,
// compressor + indexer sources, reusing layers, the candidate source, candidate-filtered
// re-indexers and the layers reading them (V4.1), each compression ratio, hash routing (V4),
// Engram; the first layer of each kind is kept together with the sources it reads, then the
// earliest remaining layers up to `n`. The role lists are renumbered; DSpark taps move to the
// last kept layers when the original ones are dropped; MTP / DSpark stages stay. An `n` below
// what the roles need is an error naming that minimum; n >= num_layers keeps the config.
Result<ReducedConfig> reduce_layers(const ModelConfig& cfg, int64_t n);

struct DummyOptions {
  uint64_t seed = 0;
  int threads = 0;  // generating threads; <= 0: all cores
};

// Every tensor of expected_weights(cfg) in the release formats (as make-tiny writes them for
// the same seed), generated in parallel into one anonymous memory image; `label` names the
// checkpoint in messages.
Result<Checkpoint> make_dummy_checkpoint(const ModelConfig& cfg, const DummyOptions& opt, const std::string& label);

}  // namespace flashseek::model
