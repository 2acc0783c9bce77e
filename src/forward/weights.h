// The CPU backend's copy of the weights: every matrix dequantised to FP32 at load (the oracle
// trades memory for simplicity; Engram tables stay in the mmapped checkpoint and are gathered
// row by row). Names follow the release checkpoints (model-v4.md §2.2, model-v41.md §6).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/checkpoint.h"
#include "ops/engram.h"

namespace flashseek::forward {

using Vec = std::vector<float>;

struct CompressorWeights {  // v4 §3.5.5 / v41 §2 item 5
  Vec wkv, wgate;           // [coff·c, D]; wgate empty for V4.1 ratio 1
  Vec ape;                  // [ratio, coff·c] (V4 only)
  Vec norm;                 // [c]
};

struct AttentionWeights {
  Vec wq_a, q_norm, wq_b;   // [Rq, D], [Rq], [H·Dh, Rq]
  Vec wkv, kv_norm;         // [Dh, D], [Dh]
  Vec wo_a, wo_b;           // [G·Ro, H·Dh/G], [D, G·Ro]
  Vec attn_sink;            // [H]
  bool has_compressor = false;
  CompressorWeights compressor;
  bool has_indexer = false; // own indexer query (index source)
  Vec idx_wq_b;             // [nI·dI, Rq]
  Vec idx_weights_proj;     // [nI, D]
  Vec idx_wk, idx_k_norm;   // V4.1 key path from the compressor latent: [dI, Dh], [dI]
  bool has_idx_compressor = false;
  CompressorWeights idx_compressor;  // V4 indexer compressor (c = dI)
  Vec rope_inv_freq;        // this layer's table
  int64_t block = 0;        // role index (num_layers + s for draft stages): keys the dot perturbation
};

struct FfnWeights {
  Vec gate;                 // [E, D]
  Vec bias;                 // [E] (empty on V4 hash layers)
  std::vector<int32_t> tid2eid;  // [vocab, k] V4 hash layers
  std::vector<Vec> w1, w2, w3;   // per expert [I, D], [D, I], [I, D]
  Vec s_w1, s_w2, s_w3;     // shared expert
  int64_t block = 0;        // role index, as AttentionWeights::block
};

struct EngramWeights {
  std::string table;        // tensor name of the row table (gathered through the checkpoint)
  Vec wkv;                  // [(hc+1)·D, ncol·de]
  Vec wqk;                  // [hc, D] q_weight ⊙ k_weight in FP32
  ops::EngramLayout layout;
};

struct LayerWeights {
  Vec hc_attn_fn, hc_attn_base, hc_attn_scale;
  Vec hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Vec attn_norm, ffn_norm;
  AttentionWeights attn;
  FfnWeights ffn;
  bool has_engram = false;
  EngramWeights engram;
};

// V4.1 DSpark draft (v41 §5): three window-only V4.1 blocks with their own MoE, the tap
// projection (stage 0), and the last stage's norm, Markov head and confidence head.
struct DSparkWeights {
  std::vector<LayerWeights> stages;
  Vec main_proj, main_norm;    // [D, n_taps·D], [D]
  Vec norm;                    // [D] final norm of the last stage
  Vec markov_embed, markov_head;  // [V, rank] each
  Vec confidence;              // [D + rank]
};

// V4 MTP block `mtp.0.` (v4 §3.8): a window-only decoder block fed by e_proj/h_proj, with its own
// hc_head and norm; embedding and head are shared with the backbone.
struct MtpWeights {
  LayerWeights block;
  Vec enorm, hnorm, e_proj, h_proj, norm;      // [D], [D], [D, D], [D, D], [D]
  Vec hc_head_fn, hc_head_base, hc_head_scale;  // [hc, hc·D], [hc], [1]
};

struct ModelWeights {
  Vec embed, head, norm;    // [V, D], [V, D], [D]
  Vec hc_head_fn, hc_head_base, hc_head_scale;  // V4 only
  std::vector<LayerWeights> layers;             // backbone layers only
  std::vector<int64_t> engram_token_map;        // [vocab] compressed ids (V4.1)
  int64_t engram_pad_c = 0;
  bool has_mtp = false;
  MtpWeights mtp;
  bool has_dspark = false;
  DSparkWeights dspark;
  // WeightLoadOptions::matrices false: the tensor names of the matrices left empty (each one the
  // CPU backend would have loaded), in load order; the backend uploads exactly these.
  std::vector<std::string> deferred_matrices;
};

struct WeightLoadOptions {
  // true: every matrix dequantised to FP32 (the CPU backend). false: the matrices (linears, routed
  // and shared experts, router gates, embedding, head, mHC mixers `hc_*_fn`, Engram `wkv`, the
  // draft's projections and Markov tables) are only checked to exist with the expected element
  // count and left empty, so a backend that uploads the checkpoint's stored bytes itself (the CUDA
  // backend's native weights) never holds an FP32 copy on the host. Vectors (norms, biases,
  // sinks, mHC base/scale, compressor `ape`, Engram q/k, the confidence vector) are always loaded.
  bool matrices = true;
  // Matrices are dequantised in parallel on this many threads (<= 0: all cores), after every
  // tensor was checked; the result does not depend on it.
  int threads = 0;
  // Called from the loading threads after each matrix with the stored bytes done and in all
  // (the CLI's progress line); may be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Loads every backbone weight of `ck`, the V4.1 DSpark draft or the V4 MTP block when present.
Result<ModelWeights> load_weights(const model::Checkpoint& ck, const WeightLoadOptions& opts = {});

}  // namespace flashseek::forward
