#include "tools/backend_options.h"

#include <cstdio>

#include "core/thread_pool.h"

namespace flashseek::tools {

void add_backend_options(CLI::App* cmd, BackendOpts& o) {
  cmd->add_option("--threads", o.threads, "CPU backend threads, 1.." + std::to_string(ThreadPool::kMaxThreads) +
                                              " (0: one per hardware thread)")
      ->capture_default_str();
  cmd->add_option("--gpu-graphs", o.gpu_graphs,
                  "CUDA graphs for decode-sized steps: on (replay, patching changed nodes) | record (record "
                  "every step) | off (eager)")
      ->check(CLI::IsMember({"on", "record", "off"}))
      ->capture_default_str();
  cmd->add_option("--tp-comm", o.tp_comm,
                  "multi-GPU collectives: auto (NCCL when the devices are distinct) | nccl | host (host-staged)")
      ->check(CLI::IsMember({"auto", "nccl", "host"}))
      ->capture_default_str();
  cmd->add_option("--device-sampling", o.device_sampling,
                  "sample on the GPU when a request needs no logits on the host: on | off (same tokens)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--gpu-graphs-log", o.gpu_graphs_log, "print the CUDA-graph counters to stderr at the end");
  cmd->add_option("--moe-gemm-min-tokens", o.moe_gemm_min_tokens,
                  "GPU backend: a sequence with at least this many tokens in a forward step runs its MXFP4 routed "
                  "experts as grouped FP8 GEMMs (FP4 expanded in the kernel) instead of the expert GEMV; 0: always "
                  "the GEMV (the GEMV's bits whatever the chunking)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--dense-gemm-min-tokens", o.dense_gemm_min_tokens,
                  "GPU backend: a sequence with at least this many tokens in a forward step runs its FP8 token "
                  "linears (attention projections, shared expert) through the FP8 GEMM instead of the "
                  "block-scaled GEMV; 0: always the GEMV (the GEMV's bits whatever the chunking)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--gemv-tiled-min-rows", o.gemv_tiled_min_rows,
                  "GPU backend: block-scaled GEMV launches of at least this many token rows (routed experts: pairs "
                  "per expert) take the tiled kernel, smaller ones the decode GEMV in token passes over each weight tile; the same "
                  "bits either way (0: the tiled kernel above 8 rows)")
      ->check(CLI::Range(int64_t(0), forward::kMaxGemvTiledMinRows))
      ->capture_default_str();
  cmd->add_option("--gemv-prequant-min-rows", o.gemv_prequant_min_rows,
                  "GPU backend: dense block-scaled GEMV launches of at least this many token rows quantise their "
                  "input once before the launch instead of in every block; the same bits either way")
      ->check(CLI::Range(int64_t(1), forward::kMaxGemvTiledMinRows))
      ->capture_default_str();
  cmd->add_option("--prefill-gemm-operands", o.prefill_gemm_operands,
                  "GPU backend: the operands of the FP8/FP4 prefill GEMMs: f16 (f16 codes, each 32-block's sum "
                  "promoted with its scales) | bf16 (activations and weights as BF16 values, scales folded in, each "
                  "32-block's sum added in FP32) | bf16-expanded (bf16 with each weight matrix expanded to BF16 once "
                  "per GEMM into scratch that the memory plan counts, instead of per tile inside it: the same "
                  "bits as bf16) | bf16-direct (bf16-expanded with the tensor core summing the whole of k, no "
                  "FP32 addition per 32-block: another FP32 order); all within the parity bound")
      ->check(CLI::IsMember(kPrefillGemmOperands))
      ->capture_default_str();
  cmd->add_option("--moe-expand-min-rows", o.moe_expand_min_rows, std::string("GPU backend: ") + kMoeExpandMinRowsHelp)
      ->check(CLI::Range(int64_t(0), kMaxMoeExpandMinRows))
      ->capture_default_str();
  cmd->add_option("--moe-w-registers", o.moe_w_registers, std::string("GPU backend: ") + kMoeWRegistersHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--moe-compact-groups", o.moe_compact_groups, std::string("GPU backend: ") + kMoeCompactGroupsHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-fp4-fragments", o.fp4_fragments, std::string("GPU backend: ") + kFp4FragmentsHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-fp8-fragments", o.fp8_fragments, std::string("GPU backend: ") + kFp8FragmentsHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--engram-tables", o.engram_tables,
                  "where the Engram tables live on a GPU backend: host (rows gathered from the checkpoint in host "
                  "memory and copied up each step) | device (each table uploaded as stored, rows gathered on the "
                  "GPU; counted by the memory plan). The CPU backend accepts both: its tables are host memory "
                  "either way")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  cmd->add_option("--gpu-pdl", o.gpu_pdl,
                  "GPU backend: programmatic dependent launch, each kernel's launch overlapping the previous "
                  "kernel's end: on | off (the same results)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gemv-fp4-chunk", o.gemv_fp4_chunk, std::string("GPU backend: ") + kGemvFp4ChunkHelp)
      ->check(CLI::IsMember({0, 2, 4}))
      ->capture_default_str();
  cmd->add_option("--gemv-fp4-ring", o.gemv_fp4_ring, std::string("GPU backend: ") + kGemvFp4RingHelp)
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  cmd->add_option("--mma-decode-tiles", o.mma_decode_tiles, std::string("GPU backend: ") + kMmaDecodeTilesHelp)
      ->check(CLI::IsMember({0, 1, 2, 4}))
      ->capture_default_str();
  cmd->add_option("--gpu-branches", o.gpu_branches,
                  "GPU backend: the independent parts of a decode step (the query beside the window KV and the "
                  "compressors, the ring write beside the output projection, the routed beside the shared "
                  "expert, the DSpark rings beside the LM head; V4.1: each sublayer's mHC mixes beside the "
                  "sublayer) on side streams: off | on | priority (the side streams at the highest priority); "
                  "the same results")
      ->check(CLI::IsMember({"off", "on", "priority"}))
      ->capture_default_str();
  cmd->add_option("--gpu-stack-qkv", o.gpu_stack_qkv, kStackQkvHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-row-fusion", o.gpu_row_fusion, kRowFusionHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-post-mixes", o.gpu_post_mixes, kPostMixesHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--gpu-collapse-norm", o.gpu_collapse_norm, kCollapseNormHelp)
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_exact_linears_option(cmd, o.gpu_exact_linears);
  cmd->add_option("--bf16-linears", o.bf16_linears,
                  "GPU backend, reference numerics: the linears of BF16 inputs (wo_a, the LM head): exact (the "
                  "CPU's summation order) | tensor (BF16 tensor cores: the same products, another FP32 order)")
      ->check(CLI::IsMember({"exact", "tensor"}))
      ->capture_default_str();
  add_attention_options(cmd, o.prefill_attention, o.decode_attention);
  cmd->add_option("--index-scores", o.index_scores,
                  "indexer scores on a GPU backend: auto (reference numerics: the integer tensor cores over the FP4 "
                  "queries and keys, the FP32 kernel's bits wherever its dots are exact) | fp32 (the FP32 kernel "
                  "everywhere, for comparison)")
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
}

void add_attention_options(CLI::App* cmd, std::string& prefill, std::string& decode) {
  cmd->add_option("--prefill-attention", prefill,
                  "attention of prefill chunks on a GPU backend: auto (chunks of 64+ rows in reference numerics on "
                  "the tensor cores: q, keys and probabilities in BF16, another summation order) | staged (the "
                  "exact-order kernel everywhere)")
      ->check(CLI::IsMember({"auto", "staged"}))
      ->capture_default_str();
  cmd->add_option("--decode-attention", decode,
                  "attention of decode steps, verify blocks and short chunks on a GPU backend, reference numerics: "
                  "staged (the exact-order kernel) | tensor (the prefill chunks' tensor-core kernel, each row over "
                  "its own keys: batch-invariant, the bits of --prefill-attention auto's rows)")
      ->check(CLI::IsMember({"staged", "tensor"}))
      ->capture_default_str();
}

forward::GpuPrefillAttention prefill_attention(const std::string& value) {
  return value == "staged" ? forward::GpuPrefillAttention::kStaged : forward::GpuPrefillAttention::kAuto;
}

bool engram_on_device(const BackendOpts& o) { return o.engram_tables == "device"; }

Status apply_threads(const BackendOpts& o) {
  if (o.threads == 0) return {};  // CLI default: the hardware's
  return ThreadPool::set_global_threads(o.threads);
}

Result<uint32_t> fast_linears_without(const std::string& exact_roles) {
  using forward::GpuLinearRole;
  uint32_t mask = forward::kAllGpuLinearRoles;
  if (exact_roles == "none") return mask;
  std::string names;  // the accepted names, for the error
  for (uint32_t r = 0; r < uint32_t(GpuLinearRole::kCount); ++r)
    names += std::string(r ? ", " : "") + forward::gpu_linear_role_name(GpuLinearRole(r));
  size_t at = 0;
  while (at <= exact_roles.size()) {
    const size_t end = std::min(exact_roles.find(',', at), exact_roles.size());
    const std::string name = exact_roles.substr(at, end - at);
    uint32_t bit = 0;
    for (uint32_t r = 0; r < uint32_t(GpuLinearRole::kCount); ++r)
      if (name == forward::gpu_linear_role_name(GpuLinearRole(r))) bit = forward::gpu_linear_bit(GpuLinearRole(r));
    if (!bit) return invalid_argument("unknown role '{}' (none, or comma-separated: {})", name, names);
    mask &= ~bit;
    at = end + 1;
  }
  return mask;
}

void add_exact_linears_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--gpu-exact-linears", value,
                  "GPU backend, reference numerics: linear roles kept on the exactness kernels (the CPU's summation "
                  "order) instead of the block-scaled GEMVs: none, or comma-separated names of wq_a, wq_b, wkv, "
                  "wo_b, indexer.wq_b, shared_experts, routed_experts, engram.wkv, draft (a debug / A-B knob)")
      ->check([](const std::string& v) {
        auto m = fast_linears_without(v);
        return m.ok() ? std::string() : m.status().message();
      })
      ->capture_default_str();
}

const char* const kRowFusionHelp =
    "GPU backend: small row ops that follow one another run as one launch where a kernel exists (the "
    "window KV rows' norm, RoPE, FP8 simulation and ring write; the MoE combine with the mHC stream "
    "update; the attention output's inverse RoPE inside the decode attention): on | off (the same results)";
const char* const kPostMixesHelp =
    "GPU backend: in decode-sized steps each mHC stream update and the next sublayer's mHC mixes of the "
    "updated streams run as one launch: on | off (the same results)";
const char* const kCollapseNormHelp =
    "GPU backend: each sublayer's input (the mHC collapse of the streams, then the RMS norm) formed by one "
    "launch: on | off (the same results)";
const char* const kStackQkvHelp =
    "GPU backend, native weights: each layer's wq_a and wkv kept as one stacked matrix (the same bytes) "
    "and run as one GEMV launch at decode: on | off (another FP32 summation order of those two "
    "projections, within the parity bound)";

forward::GpuBranches gpu_branches(const std::string& value) {
  return value == "off"        ? forward::GpuBranches::kOff
         : value == "priority" ? forward::GpuBranches::kPriority
                               : forward::GpuBranches::kOn;
}

const char* const kMoeWRegistersHelp =
    "the routed experts' in-kernel expansion (steps below --moe-expand-min-rows) with the GEMM's operands "
    "swapped, each weight tile expanded into the tensor core's register operand instead of shared memory; the "
    "same bits";

const char* const kGemvFp4ChunkHelp =
    "k blocks per warp iteration of the FP4 decode GEMVs (the routed experts): 0 (automatic: 2), 2, or 4 "
    "(each row's whole 16-byte blocks in one load per thread); another summation order, within the parity "
    "bound";

const char* const kMmaDecodeTilesHelp =
    "the BF16 tensor-core linear (wo_a, the LM head) over at most 8 rows: 16-output tiles per CTA "
    "(1, 2 or 4; 0 automatic), each CTA staging x once for all of them; the same bits either way";
const char* const kGemvFp4RingHelp =
    "the routed experts' decode GEMVs (with --gpu-fp4-fragments on) stream their weights through a "
    "shared-memory ring of this many stages (1..8, bulk copies) instead of loading them into registers; 0 off; "
    "the same bits either way";

const char* const kMoeCompactGroupsHelp =
    "decode-sized steps of several tokens with fewer routed pairs than experts (batches, verify blocks) group "
    "the pairs by expert when two likely share one ((tokens x top-k)^2 >= 2 x experts), so each touched "
    "expert's matrices are read once; the same bits either way";

const char* const kFp4FragmentsHelp =
    "the routed experts' FP4 matrices stored in the decode GEMV's fragment order (each thread's weight words of "
    "a block one 16-byte load, a warp's load 512 contiguous bytes), packed on the device after the upload; "
    "the same bits either way: on | off";

const char* const kFp8FragmentsHelp =
    "the dense FP8 matrices of the decode GEMVs (attention projections but the stacked wq_a + wkv, the shared "
    "expert, Engram's wkv, the indexer's wq_b) stored in the FP8 fragment order (a thread's pieces of a block "
    "two 16-byte loads), packed on the device after the upload; prefill GEMMs read a row-major copy unpacked "
    "per launch; the same bits either way: on | off";

const char* const kMoeExpandMinRowsHelp =
    "with --prefill-gemm-operands bf16-expanded or bf16-direct, the routed experts' prefill GEMMs read weights "
    "expanded to BF16 once per GEMM only when the step has at least this many routed rows per expert on average "
    "(pairs / experts); below it each weight tile is expanded inside the GEMM, sparing the expansion's memory "
    "traffic when each expert has few rows. The same bits either way; 0: always expanded";

void apply_prefill_gemm_operands(const std::string& operands, forward::GpuLoadOptions& g) {
  g.prefill_gemm_bf16 = operands != "f16";
  g.prefill_gemm_expand_w = operands == "bf16-expanded" || operands == "bf16-direct";
  g.prefill_gemm_direct = operands == "bf16-direct";
}

Result<forward::GpuLoadOptions> gpu_load_options(const BackendOpts& o) {
  forward::GpuLoadOptions g;
  g.graphs = o.gpu_graphs == "off"      ? forward::GpuGraphs::kOff
             : o.gpu_graphs == "record" ? forward::GpuGraphs::kRecord
                                        : forward::GpuGraphs::kPatch;
  g.tp_comm = o.tp_comm == "nccl"   ? forward::TpComm::kNccl
              : o.tp_comm == "host" ? forward::TpComm::kHost
                                    : forward::TpComm::kAuto;
  g.load_threads = o.threads;
  g.engram_on_device = engram_on_device(o);  // reading and converting the weights: as many threads as the backend
  g.prefill_attention = prefill_attention(o.prefill_attention);
  g.decode_attention_tensor = o.decode_attention == "tensor";
  g.moe_gemm_min_tokens = o.moe_gemm_min_tokens;
  g.dense_gemm_min_tokens = o.dense_gemm_min_tokens;
  g.gemv_tiled_min_rows = o.gemv_tiled_min_rows;
  g.gemv_prequant_min_rows = o.gemv_prequant_min_rows;
  apply_prefill_gemm_operands(o.prefill_gemm_operands, g);
  g.moe_expand_min_rows = o.moe_expand_min_rows;
  g.moe_w_in_registers = o.moe_w_registers == "on";
  g.moe_compact_groups = o.moe_compact_groups == "on";
  g.fp4_fragments = o.fp4_fragments == "on";
  g.fp8_fragments = o.fp8_fragments == "on";
  g.index_scores_kernel = o.index_scores == "fp32" ? 3 : 0;
  g.programmatic_launch = o.gpu_pdl != "off";
  g.gemv_fp4_chunk = o.gemv_fp4_chunk;
  g.gemv_ring_stages = o.gemv_fp4_ring;
  g.mma_decode_tiles = o.mma_decode_tiles;
  g.branches = gpu_branches(o.gpu_branches);
  g.stack_query_kv = o.gpu_stack_qkv == "on";
  g.row_fusion = o.gpu_row_fusion == "on";
  g.post_mixes_fusion = o.gpu_post_mixes == "on";
  g.collapse_norm_fusion = o.gpu_collapse_norm == "on";
  g.tensor_core_linears = o.bf16_linears == "tensor";
  auto fast = fast_linears_without(o.gpu_exact_linears);
  if (!fast.ok()) return fast.status().with_context("--gpu-exact-linears");
  g.fast_linears = fast.value();
  return g;
}

void apply_engine_options(const BackendOpts& o, engine::EngineOptions& eo) {
  eo.device_sampling = o.device_sampling != "off";
}

void log_gpu_graphs(const BackendOpts& o, const forward::Model& model) {
  if (!o.gpu_graphs_log) return;
  auto st = forward::gpu_graph_stats(model);
  if (!st.ok()) return;  // a CPU model: no graphs
  const forward::GpuGraphStats& s = st.value();
  std::fprintf(stderr,
               "gpu graphs %s: forwards %lld, decode-sized %lld, graph launches %lld, patched %lld (%lld nodes "
               "set, %lld misses), instantiations %lld, updates %lld (failed %lld), recaptures %lld, eager "
               "fallbacks %lld\n",
               o.gpu_graphs.c_str(), (long long)s.forwards, (long long)s.eligible, (long long)s.launches,
               (long long)s.patched, (long long)s.patched_nodes, (long long)s.patch_misses,
               (long long)s.instantiations, (long long)s.updates, (long long)s.update_failures,
               (long long)s.recaptures, (long long)s.eager_fallbacks);
}

}  // namespace flashseek::tools
