// The start-up memory plan (memory_plan.h).
#include "forward/memory_plan.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "model/weights.h"

namespace flashseek::forward {
namespace {

std::string gib(uint64_t b) { return fmt::format("{:.2f} GiB ({} bytes)", double(b) / double(1ull << 30), b); }

// A number from a cgroup file; nullopt for "max", a missing file or garbage.
std::optional<uint64_t> read_cgroup_number(const char* path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max" || s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + uint64_t(ch - '0');
  }
  return v;
}

// The share of weight `name` that rank 0 of a `world`-GPU model holds, as a fraction num / den of
// its elements (and stored bytes): the split matrices as backends/cuda/gpu_tp.h cuts them (heads,
// output groups, routed experts, vocabulary rows); everything else, the shared expert included
// (rank 0 computes it), whole. Rank 0 is the largest rank (the first vocabulary slices may hold
// one row more), so the plan per GPU is rank 0's.
std::pair<int64_t, int64_t> rank0_share(const std::string& name, const model::ModelConfig& c, int world) {
  if (world <= 1) return {1, 1};
  if (name == "head.weight") return {(c.vocab_size + world - 1) / world, c.vocab_size};
  if (name.rfind("layers.", 0) != 0) return {1, 1};
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  if (ends(".attn.wq_b.weight") || ends(".attn.wo_a.weight") || ends(".attn.wo_b.weight") || ends(".attn.attn_sink") ||
      name.find(".ffn.experts.") != std::string::npos)
    return {1, world};
  return {1, 1};
}

}  // namespace

MemoryPlan plan_memory(const model::ModelConfig& cfg, const SnapshotGeometry& geometry, bool has_draft,
                       const MemoryPlanOptions& opt, uint64_t available) {
  using model::Component;
  MemoryPlan p;
  p.where = opt.gpu ? (opt.tensor_parallel > 1 ? "GPU memory (per GPU)" : "GPU memory") : "host memory";
  p.max_batch = opt.max_batch;
  p.max_context = opt.max_context > 0 ? opt.max_context : cfg.max_position_embeddings;
  p.utilization = opt.utilization;
  p.available = available;
  // The CPU backend keeps FP32 copies of every weight it loads; the CUDA backend keeps every
  // matrix as stored (--gpu-weights native, the default; vectors as FP32) or FP32 copies (fp32);
  // Engram tables stay in their stored format in host memory and are gathered by rows, or
  // (engram_on_device) are copied as stored to every GPU. Tensor-parallel ranks hold their slices
  // of the split matrices (rank0_share; slices of scale blocks are planned as stored even where a
  // rank keeps an FP32 copy: tiny configs only); the draft is whole on rank 0 (it runs the draft,
  // backends/cuda/gpu_tp.h), the fullest GPU, which is the one planned here.
  const int world = opt.gpu ? std::max(opt.tensor_parallel, 1) : 1;
  uint64_t fp32 = 0, engram_stored = 0;
  for (const model::WeightSpec& w : model::expected_weights(cfg)) {
    if (w.optional || w.component == Component::kVision) continue;  // not loaded
    const bool is_draft = w.component == Component::kDraftDense || w.component == Component::kDraftExperts;
    if (!has_draft && is_draft) continue;
    if (w.kind == model::WeightKind::kEngramTable) {
      for (const auto& t : model::release_tensors(w, cfg)) engram_stored += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
      continue;
    }
    const bool stored = opt.gpu && opt.native_weights && w.shape.size() >= 2;  // every matrix as stored
    const auto [num, den] = is_draft ? std::pair<int64_t, int64_t>{1, 1} : rank0_share(w.name, cfg, world);
    uint64_t bytes = 0;
    if (stored) {
      for (const auto& t : model::release_tensors(w, cfg)) bytes += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    } else {
      bytes = 4 * uint64_t(shape_numel(w.shape));
    }
    fp32 += bytes / uint64_t(den) * uint64_t(num) + bytes % uint64_t(den) * uint64_t(num) / uint64_t(den);
  }
  const bool engram_gpu = opt.gpu && opt.engram_on_device;
  const uint64_t host_extra = opt.resident_checkpoint_bytes > 0 ? opt.resident_checkpoint_bytes
                              : engram_gpu                     ? 0
                                                               : engram_stored;
  if (opt.gpu) {
    p.weights = fp32 + (engram_gpu ? engram_stored : 0);
    p.host_weights = host_extra;
  } else {
    p.weights = fp32 + host_extra;
  }
  p.state = opt.gpu ? sequence_state_bytes(geometry, p.max_context, cache_formats(cfg, opt.numerics))
                    : sequence_state_bytes(geometry, p.max_context, StateFormat::kFp32);
  p.state_compact = sequence_state_bytes(geometry, p.max_context, StateFormat::kCompact);
  // Activations of one step: the mHC streams and block buffers, attention heads, the selected
  // experts' intermediates, a logits row per token and the mHC mixes' chunk sums (a GPU's row
  // tiles: (2 + hc)·hc mixes per 1024-value chunk of hc·dim; counted for both backends) (FP32).
  const int64_t mix_chunks = (cfg.hc_mult * cfg.hidden_size + 1023) / 1024;
  const uint64_t per_token = 4 * uint64_t(8 * cfg.hc_mult * cfg.hidden_size + 3 * cfg.num_heads * cfg.head_dim +
                                          3 * cfg.n_experts_per_tok * cfg.moe_inter_dim + cfg.vocab_size +
                                          (2 + cfg.hc_mult) * cfg.hc_mult * mix_chunks);
  const uint64_t step = uint64_t(std::max<int64_t>(opt.step_tokens, 1));
  p.workspace = step * per_token;
  // The indexer's per-(row, visible position) buffers at the longest context: the candidate mask
  // (a byte, kept over the step's layers) and, on a GPU, the scores, block maxima and kept-block
  // flags (kGpuIndexEntryBytes, in row slices of at most kGpuIndexScratchBytes).
  if (cfg.index_n_heads > 0) {
    const uint64_t entries = step * uint64_t(std::max<int64_t>(p.max_context, 1));
    if (opt.gpu) p.workspace += std::min<uint64_t>(uint64_t(kGpuIndexEntryBytes) * entries, uint64_t(kGpuIndexScratchBytes));
    if (cfg.candidate_source_layer >= 0) p.workspace += entries;
  }
  if (opt.gpu) p.workspace += uint64_t(2 * kGpuDecodeAttnPoolBytes + kGpuDecodeAttnPoolBytes / 32);
  if (opt.gpu && opt.prefill_weight_expansion) {
    // BF16 values of the largest FP8 matrix a dense prefill GEMM expands, and of one chunk of
    // routed-expert matrices (whole matrices, at most kMoeExpandChunkBytes, at least one; at most
    // this rank's experts).
    uint64_t dense = 0, experts = 0;
    const int64_t rank_experts = std::max<int64_t>(1, cfg.n_routed_experts / world);
    for (const model::WeightSpec& w : model::expected_weights(cfg)) {
      if (w.optional || w.component == Component::kVision || w.shape.size() != 2) continue;
      if (!has_draft && (w.component == Component::kDraftDense || w.component == Component::kDraftExperts)) continue;
      const bool routed = w.kind == model::WeightKind::kExpert && w.name.find(".ffn.experts.") != std::string::npos;
      if (!routed) {  // the dense GEMMs expand the FP8 linears
        if (w.kind != model::WeightKind::kLinear) continue;
        const std::vector<model::StoredTensor> st = model::release_tensors(w, cfg);
        if (st.empty() || st[0].dtype != DType::kF8E4M3) continue;
      }
      const uint64_t values = uint64_t(shape_numel(w.shape));
      if (routed) {
        const uint64_t bytes = 2 * values;
        const uint64_t per_chunk = std::max<uint64_t>(1, uint64_t(kMoeExpandChunkBytes) / bytes);
        experts = std::max(experts, bytes * std::min(per_chunk, uint64_t(rank_experts)));
      } else {
        const auto [num, den] = rank0_share(w.name, cfg, world);
        dense = std::max(dense, 2 * values * uint64_t(num) / uint64_t(den));
      }
    }
    p.workspace += dense + experts;
  }
  p.total = p.weights + p.workspace + uint64_t(std::max<int64_t>(p.max_batch, 0)) * p.state.total();
  return p;
}

std::string format_memory_plan(const MemoryPlan& p) {
  auto parts = [](const StateBytes& s) {
    return fmt::format("{} (rings {}, compressed KV {}, index keys {}, compressor partials {}, other {})",
                       gib(s.total()), s.rings, s.compressed_kv, s.index_keys, s.compressors, s.other);
  };
  std::string out = fmt::format("memory plan ({}):\n", p.where);
  out += fmt::format("  weights: {}\n", gib(p.weights));
  if (p.host_weights) out += fmt::format("  host-resident weights (Engram tables / generated image): {}\n", gib(p.host_weights));
  out += fmt::format("  state per sequence of {} tokens: {}\n", p.max_context, parts(p.state));
  out += fmt::format("  state per sequence, compact (planned): {}\n", parts(p.state_compact));
  out += fmt::format("  workspace (estimate): {}\n", gib(p.workspace));
  out += fmt::format("  total for {} sequence(s): {} of {} available x {:.2f} = {}: {}", p.max_batch, gib(p.total),
                     gib(p.available), p.utilization, gib(p.budget()), p.fits() ? "fits" : "DOES NOT FIT");
  return out;
}

Status check_memory_plan(const MemoryPlan& p) {
  if (p.fits()) return {};
  return Status(StatusCode::kResourceExhausted,
                fmt::format("the model does not fit in {}: {} bytes needed (weights {} + workspace {} + {} "
                            "sequence(s) x {} bytes of state for {} tokens), {} bytes available x {:.2f} = {} "
                            "bytes; lower --max-batch / --max-context, use --num-layers, or raise "
                            "--gpu-memory-utilization",
                            p.where, p.total, p.weights, p.workspace, p.max_batch, p.state.total(), p.max_context,
                            p.available, p.utilization, p.budget()));
}

Result<uint64_t> host_memory_available() {
  std::ifstream in("/proc/meminfo");
  if (!in) return io_error("/proc/meminfo: cannot read");
  std::string key;
  uint64_t kb = 0;
  std::optional<uint64_t> avail;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (ls >> key >> kb && key == "MemAvailable:") avail = kb * 1024;
  }
  if (!avail) return io_error("/proc/meminfo: no MemAvailable line");
  uint64_t v = *avail;
  // cgroup v2, then v1.
  if (auto lim = read_cgroup_number("/sys/fs/cgroup/memory.max")) {
    const uint64_t used = read_cgroup_number("/sys/fs/cgroup/memory.current").value_or(0);
    v = std::min(v, *lim > used ? *lim - used : 0);
  } else if (auto lim1 = read_cgroup_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
             lim1 && *lim1 < (uint64_t(1) << 60)) {
    const uint64_t used = read_cgroup_number("/sys/fs/cgroup/memory/memory.usage_in_bytes").value_or(0);
    v = std::min(v, *lim1 > used ? *lim1 - used : 0);
  }
  return v;
}

}  // namespace flashseek::forward
