// The expected tensor list of a checkpoint, derived from its ModelConfig
// (V4: spec model-v4.md §2.2; V4.1: model-v41.md §6 plus what a V4.1 layer keeps from V4).
// Names are the release names (no "model." prefix). One WeightSpec per logical weight; its
// companion `.scale` tensor (FP8 / FP4 / Engram rows) is implied by the kind.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace flashseek::model {

// Rows of the parameter table of model-v41.md §1.8 (V4 maps MTP onto the draft rows).
enum class Component : uint8_t {
  kRoutedExperts,   // backbone routed experts
  kEngramTables,    // Engram embedding tables
  kAttention,       // attention incl. mHC mixers and the block norms
  kSharedRouters,   // shared experts + routers (weight, bias, bias_vl, tid2eid)
  kEmbedHead,       // embedding, LM head, final norm (+ V4 hc_head)
  kEngramProj,      // Engram wkv, q_weight, k_weight
  kCompressors,     // compressors + indexers (V4 CSA/HCA, V4.1 CSA2)
  kDraftExperts,    // MTP / DSpark routed experts
  kDraftDense,      // everything else of the MTP / DSpark stages
  kVision,          // vision tower + aligner + image delimiters
  kOther,           // tensors not in the weight map
};
inline constexpr int kNumComponents = 11;
const char* component_name(Component c);

enum class WeightKind : uint8_t {
  kPlain,        // stored exactly as `dtype` (norms, mHC params, sinks, biases, tid2eid, embeddings)
  kLinear,       // release: F8_E4M3 + F8_E8M0 scale [ceil(out/b), ceil(in/b)] when fp8_weights;
                 // also accepted: BF16/F16/F32 without a scale
  kExpert,       // release: FP4 (I8 [out, in/2] + E8M0 [out, in/32]) when fp4_experts, else as kLinear
  kEngramTable,  // F8_E4M3 [rows, de] + F8_E8M0 [rows, de/32]; BF16/F32 without scale accepted
};

struct WeightSpec {
  std::string name;        // e.g. "layers.3.attn.wq_a.weight"
  Shape shape;             // logical (dequantised) shape, outermost first; [out, in] for linears
  WeightKind kind = WeightKind::kPlain;
  DType dtype = DType::kBF16;  // kPlain: stored dtype; others: the dequantised compute dtype
  Component component = Component::kOther;
  bool optional = false;   // may be absent (vision tower)
};

// Every weight of the checkpoint in a stable order (globals, layers, MTP/DSpark stages, vision).
std::vector<WeightSpec> expected_weights(const ModelConfig& cfg);

// "x.weight" -> "x.scale"; any other name -> name + ".scale".
std::string scale_name_for(const std::string& weight_name);

// One tensor as the release stores it.
struct StoredTensor {
  std::string name;
  DType dtype;
  Shape shape;
};
// The release on-disk tensors of a weight under cfg's formats (weight first, then its scale).
// `bf16_linears` stores kLinear/kExpert as BF16 without scales (make-tiny --dtype bf16).
std::vector<StoredTensor> release_tensors(const WeightSpec& w, const ModelConfig& cfg,
                                          bool bf16_linears = false);

}  // namespace flashseek::model
