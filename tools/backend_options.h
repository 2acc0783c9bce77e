// Options that choose how a checkpoint runs, shared by `run` and `serve`: CPU threads, CUDA graphs,
// multi-GPU collectives, device sampling. The CLI parses them here and passes them down as
// ThreadPool / GpuLoadOptions / EngineOptions settings (no environment variables inside src/).
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends/cuda/gpu_model.h"
#include "core/status.h"
#include "engine/engine.h"
#include "forward/model.h"

namespace flashseek::tools {

// --moe-expand-min-rows' bound and default (rows per expert below which the routed experts'
// weights are expanded inside the GEMM; `flashseek bench --kernels moe` compares the two ways).
inline constexpr int64_t kMaxMoeExpandMinRows = int64_t(1) << 40;
inline constexpr int64_t kDefaultMoeExpandMinRows = 1024;

struct BackendOpts {
  int threads = 0;                     // CPU threads (0: the hardware's)
  std::string gpu_graphs = "on";       // on | record | off
  std::string tp_comm = "auto";        // auto | nccl | host
  std::string device_sampling = "on";  // on | off
  bool gpu_graphs_log = false;         // print the CUDA-graph counters to stderr at the end
  std::string engram_tables = "host";  // host | device
  std::string prefill_attention = "auto";  // auto | staged (GpuLoadOptions::prefill_attention)
  // staged | tensor (GpuLoadOptions::decode_attention_tensor, whose library default stays off so
  // that the bitwise CPU-order tests keep the exact-order kernel). tensor: within the parity bound,
  // batch-invariant, prefill rows (--prefill-attention auto) the bits of decoded rows.
  std::string decode_attention = "tensor";
  // GpuLoadOptions::moe_gemm_min_tokens / dense_gemm_min_tokens (0: off). On from one GEMM tile
  // (128 rows) per sequence: prefill chunks take the GEMMs, decode and verify rows the GEMVs.
  int64_t moe_gemm_min_tokens = 128;
  int64_t dense_gemm_min_tokens = 128;
  int64_t gemv_tiled_min_rows = 192;  // GpuLoadOptions::gemv_tiled_min_rows
  int64_t gemv_prequant_min_rows = 9;  // GpuLoadOptions::gemv_prequant_min_rows
  int gemv_fp4_chunk = 0;              // GpuLoadOptions::gemv_fp4_chunk (0 automatic, 2, 4)
  int gemv_fp4_ring = 0;               // GpuLoadOptions::gemv_ring_stages (0 off, 1..8)
  int mma_decode_tiles = 0;            // GpuLoadOptions::mma_decode_tiles (0 automatic, 1, 2, 4)
  // f16 | bf16 | bf16-expanded | bf16-direct (GpuLoadOptions::prefill_gemm_bf16, prefill_gemm_expand_w,
  // prefill_gemm_direct)
  std::string prefill_gemm_operands = "bf16-direct";
  int64_t moe_expand_min_rows = kDefaultMoeExpandMinRows;  // GpuLoadOptions::moe_expand_min_rows (0: always expanded)
  std::string moe_w_registers = "on";   // on | off: GpuLoadOptions::moe_w_in_registers
  std::string moe_compact_groups = "on";  // on | off: GpuLoadOptions::moe_compact_groups
  std::string fp4_fragments = "on";       // on | off: GpuLoadOptions::fp4_fragments
  std::string fp8_fragments = "off";      // on | off: GpuLoadOptions::fp8_fragments
  std::string index_scores = "auto";  // auto | fp32 (GpuLoadOptions::index_scores_kernel 0 | 3)
  std::string gpu_pdl = "on";         // on | off (GpuLoadOptions::programmatic_launch)
  std::string gpu_branches = "on";    // off | on | priority (GpuLoadOptions::branches)
  std::string gpu_stack_qkv = "on";   // on | off (GpuLoadOptions::stack_query_kv)
  std::string gpu_row_fusion = "on";  // on | off (GpuLoadOptions::row_fusion)
  std::string gpu_post_mixes = "off";  // on | off (GpuLoadOptions::post_mixes_fusion)
  std::string gpu_collapse_norm = "off";  // on | off (GpuLoadOptions::collapse_norm_fusion)
  // Roles of GpuLinearRole (comma-separated names, or "none") kept on the exactness kernels
  // (GpuLoadOptions::fast_linears without them): a debug / A-B knob.
  std::string gpu_exact_linears = "none";
  // exact | tensor (GpuLoadOptions::tensor_core_linears, whose library default stays off so that
  // the bitwise CPU-order tests keep their kernels). tensor: within the parity bound, row-invariant.
  std::string bf16_linears = "tensor";
};

// Adds --threads, --gpu-graphs, --tp-comm, --device-sampling, --gpu-graphs-log, --moe-gemm-min-tokens,
// --dense-gemm-min-tokens, --gemv-tiled-min-rows, --gemv-prequant-min-rows, --prefill-gemm-operands,
// --moe-expand-min-rows, --moe-w-registers, --engram-tables, --gpu-pdl, --gpu-branches, --gpu-stack-qkv, --gpu-row-fusion, --gpu-post-mixes, --gpu-exact-linears, --bf16-linears, --prefill-attention,
// --decode-attention and --index-scores to `cmd`.
void add_backend_options(CLI::App* cmd, BackendOpts& o);

// Sizes the CPU thread pool (before the model loads); a clear error for a bad --threads.
Status apply_threads(const BackendOpts& o);

// The GpuLoadOptions these options select; an error for a value no option check let through.
Result<forward::GpuLoadOptions> gpu_load_options(const BackendOpts& o);
// --gpu-branches off | on | priority (checked by CLI11).
forward::GpuBranches gpu_branches(const std::string& value);

// --prefill-gemm-operands: its choices, and what each sets in GpuLoadOptions (prefill_gemm_bf16,
// prefill_gemm_expand_w, prefill_gemm_direct); run, serve and the model bench share both.
inline const std::vector<std::string> kPrefillGemmOperands = {"f16", "bf16", "bf16-expanded", "bf16-direct"};
void apply_prefill_gemm_operands(const std::string& operands, forward::GpuLoadOptions& g);
// The help text and upper bound of --moe-expand-min-rows (run, serve and `bench`'s model bench).
extern const char* const kMoeExpandMinRowsHelp;
// The help text of --moe-w-registers (run, serve and `bench`'s model bench).
extern const char* const kMoeWRegistersHelp;
// The help text of --gemv-fp4-chunk (run, serve, and `bench`'s model bench and layer slices).
extern const char* const kGemvFp4ChunkHelp;
extern const char* const kGemvFp4RingHelp;
// The help text of --mma-decode-tiles (run, serve and `bench`'s model bench).
extern const char* const kMmaDecodeTilesHelp;
// The help text of --moe-compact-groups (run, serve and `bench`'s model bench).
extern const char* const kMoeCompactGroupsHelp;
// The help text of --gpu-fp4-fragments (run, serve, and `bench`'s model bench and layer slices).
extern const char* const kFp4FragmentsHelp;
// The help text of --gpu-fp8-fragments (run, serve and `bench`'s model bench).
extern const char* const kFp8FragmentsHelp;
// The help text of --gpu-stack-qkv (run, serve and `bench`'s model bench).
extern const char* const kStackQkvHelp;
// The help text of --gpu-row-fusion (run, serve and `bench`'s model bench).
extern const char* const kRowFusionHelp;
// The help text of --gpu-post-mixes (run, serve and `bench`'s model bench).
extern const char* const kPostMixesHelp;
// The help text of --gpu-collapse-norm (run, serve and `bench`'s model bench).
extern const char* const kCollapseNormHelp;
// --gpu-exact-linears: "none" or comma-separated role names (gpu_linear_role_name) → the
// GpuLoadOptions::fast_linears mask without those roles; a clear error for an unknown name.
Result<uint32_t> fast_linears_without(const std::string& exact_roles);
// Adds --gpu-exact-linears to `cmd` (run, serve and `bench`'s model bench), checked by
// fast_linears_without.
void add_exact_linears_option(CLI::App* cmd, std::string& value);

// Adds --prefill-attention (auto | staged) and --decode-attention (staged | tensor) to `cmd` (run,
// serve and `bench`'s model bench).
void add_attention_options(CLI::App* cmd, std::string& prefill, std::string& decode);
forward::GpuPrefillAttention prefill_attention(const std::string& value);

// --engram-tables device.
bool engram_on_device(const BackendOpts& o);

// Sets the engine options the backend options cover (device sampling).
void apply_engine_options(const BackendOpts& o, engine::EngineOptions& eo);

// With --gpu-graphs-log: one stderr line with the model's CUDA-graph counters (nothing for a CPU
// model).
void log_gpu_graphs(const BackendOpts& o, const forward::Model& model);

}  // namespace flashseek::tools
