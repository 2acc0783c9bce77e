// The CUDA backend of `forward::Model` (`--gpus N`): the same math as the CPU reference backend
// (cpu_model.h), with the weights and every sequence's state (window rings, compressed KV, index
// keys, compressor partial groups) in GPU memory and every op a GPU kernel (ops/cuda/
// model_kernels.h). Engram tables stay in the checkpoint (host) and only the rows a chunk needs
// are copied up, or (GpuLoadOptions::engram_on_device) live on the device as stored. Available when the build has CUDA (FLASHSEEK_HAVE_CUDA); otherwise the factory
// returns an error.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "forward/model.h"

namespace flashseek::forward {

// True when this build contains the CUDA backend.
bool gpu_backend_built();

// How the CUDA backend keeps the weights (docs/cuda.md, "Weights on the device"); the CLI's
// `--gpu-weights native|fp32`.
enum class GpuWeights {
  // Every matrix as the checkpoint stores it (FP8 e4m3 + E8M0 blocks, MXFP4 experts, BF16, F32),
  // uploaded from the checkpoint's bytes (no FP32 copy on the host or the device). The exactness
  // kernels expand the stored values in registers: bitwise the fp32 mode's results. Reference
  // numerics also run the FP8-activation linears and the routed experts through the block-scaled
  // GEMVs (another summation order: not bitwise the fp32 mode there).
  kNative,
  // Debug: every matrix dequantised to FP32 on the host and uploaded as FP32 (the former path).
  kFp32,
};
// "native" / "fp32"; anything else is an error naming the flag.
Result<GpuWeights> parse_gpu_weights(const std::string& s);

// Collectives of a multi-GPU model (gpu_tp.h; the CLI's --tp-comm).
enum class TpComm {
  kAuto,  // NCCL when every device is distinct, host-staged when a device repeats
  kNccl,
  kHost,  // host-staged: works with several ranks on one GPU (tests), slow
};

// CUDA graphs of decode-sized steps (below; the CLI's --gpu-graphs on|record|off).
enum class GpuGraphs {
  kPatch,   // on: replay a cached executable, patching only the changed node parameters
  kRecord,  // record and launch a new graph every step
  kOff,     // eager launches
};

// A decode step's side branches on a second stream (GpuLoadOptions::branches; the CLI's
// --gpu-branches off|on|priority).
enum class GpuBranches { kOff, kOn, kPriority };

// The FP8-activation linears of reference numerics on native weights, by role: each runs through
// the block-scaled GEMVs (ops/cuda/gemv.h: another summation order than the CPU's) when its bit is
// in GpuLoadOptions::fast_linears, else through the exactness kernels (the CPU's order, bitwise the
// kFp32 path's results). A test/debug knob (docs/cuda.md, "Whole-model parity": which GEMV moves
// the logits); exact numerics and kFp32 never use the block-scaled GEMVs.
enum class GpuLinearRole : uint32_t {
  kAttnWqA,        // attn.wq_a
  kAttnWqB,        // attn.wq_b
  kAttnWkv,        // attn.wkv
  kAttnWoB,        // attn.wo_b
  kIndexerWqB,     // attn.indexer.wq_b
  kSharedExperts,  // ffn.shared_experts.w1 / w2 / w3
  kRoutedExperts,  // ffn.experts.N.w1 / w2 / w3 (the grouped expert GEMV)
  kEngramWkv,      // engram.wkv
  kDraft,          // the drafts' FP8-activation linears and experts: V4 MTP's (+ e_proj, h_proj),
                   // V4.1 DSpark's stages (wq_a, wq_b, wkv, wo_b, shared, routed) and main_proj
  kCount,
};
inline constexpr uint32_t gpu_linear_bit(GpuLinearRole r) { return uint32_t(1) << uint32_t(r); }
inline constexpr uint32_t kAllGpuLinearRoles = (uint32_t(1) << uint32_t(GpuLinearRole::kCount)) - 1;
// "wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b", "shared_experts", "routed_experts", "engram.wkv",
// "draft" ("?" for kCount or beyond).
const char* gpu_linear_role_name(GpuLinearRole r);

// The attention kernel of prefill chunks (docs/cuda.md, "Prefill attention on the tensor cores").
// kAuto: in reference numerics, each sequence's chunk of at least kGpuPrefillAttnMinRows rows runs
// the tensor-core prefill attention (ops/cuda/model/prefill_kernels.h
// launch_model_prefill_attention: the same keys, softmax with sink and scale; q, keys and
// probabilities in BF16, another summation order) where it applies (head dims 64 / 128 / 256 /
// 512; its BF16 key pool no larger than the (row, key) pairs it serves). Everything else, and
// everything with kStaged, runs the exact-order model kernel (launch_model_attention); exact
// numerics always do. The library default is kStaged: the bitwise contracts of the GPU tests
// (chunking and batch invariance, CPU == GPU where they are bitwise) hold for the exact-order
// kernel only; the CLI (`run`, `serve`, `bench`: --prefill-attention) defaults to auto.
enum class GpuPrefillAttention { kAuto, kStaged };
// Rows of a sequence's chunk from which kAuto uses the tensor-core kernel. It runs one block per
// query row (all 64 heads of a block), the staged kernel one cluster per (row, 4 heads), so a short
// chunk gives the tensor-core kernel fewer blocks than the GPU has SMs (132 on an H200) while the
// staged kernel still fills them; 64 is not measured as the crossover (bench --prefill times both
// paths at the chunk size it is given). Decode steps and verify blocks (<= kGpuGraphMaxTokens
// rows) never take it.
inline constexpr int64_t kGpuPrefillAttnMinRows = 64;

// How the CUDA backend keeps the weights and runs steps.
struct GpuLoadOptions {
  GpuWeights weights = GpuWeights::kNative;  // tensor-parallel ranks: their slices (gpu_tp.h)
  GpuGraphs graphs = GpuGraphs::kPatch;
  TpComm tp_comm = TpComm::kAuto;  // several devices only
  // Every backend (load_model_for passes them to the CPU backend too): threads that read and
  // convert the weights (<= 0: all cores) and a progress callback with the checkpoint bytes done
  // and in all, called from those threads (may be empty).
  int load_threads = 0;
  // --engram-tables device: every Engram table is uploaded as stored and the step's rows are
  // gathered on the device; false (host): rows are gathered from the checkpoint in host memory
  // and uploaded each step.
  bool engram_on_device = false;
  std::function<void(uint64_t done, uint64_t total)> load_progress;
  // Native weights, reference numerics: the roles whose FP8-activation linears use the
  // block-scaled GEMVs (GpuLinearRole bits; all by default). A cleared bit runs that role through
  // the exactness kernels. Tests and diagnostics only (gpu_parity_diag_test.cpp).
  uint32_t fast_linears = kAllGpuLinearRoles;
  // The indexer-score kernel (ops/cuda/model/model_kernels.h IndexScoreArgs::kernel): 0 automatic
  // (reference numerics: 4, else key tiles in shared memory), 1 one thread per key, 2 / 3 tiles
  // with 1 / 2 keys per thread, 4 the integer tensor cores over FP4 queries and keys (the same
  // bits wherever the FP32 dot is exact). The CLI's --index-scores fp32 passes 3.
  int index_scores_kernel = 0;
  // The attention of prefill chunks (GpuPrefillAttention; the CLI's --prefill-attention).
  GpuPrefillAttention prefill_attention = GpuPrefillAttention::kStaged;
  // Reference numerics: every row the prefill chunks' tensor-core kernel does not take (decode
  // steps, verify blocks, short chunks) runs the same tensor-core attention, each row over its own
  // keys (ops/cuda/model/prefill_kernels.h launch_model_decode_attention): batch-invariant, a
  // verify block the bits of its tokens decoded one by one, and with prefill_attention kAuto a
  // prefill row the bits of the same row decoded; within the parity bound of the exact-order
  // kernel, not its bits. false, or FP32 weight copies (GpuWeights::kFp32, the debug path that
  // reproduces the CPU's order): the staged exact-order kernel. The CLI's --decode-attention.
  bool decode_attention_tensor = false;
  // Prefill GEMMs. A sequence whose rows in a forward step number at least moe_gemm_min_tokens
  // (and more than kGpuGraphMaxTokens) runs its routed experts as grouped GEMMs over the FP4
  // weights (MXFP4 experts, widths that are multiples of 128, sm_90a, every expert on this GPU;
  // ops/cuda/gemm/gemm_fp8.h, w_format kFp4) instead of the grouped expert GEMV; at least
  // dense_gemm_min_tokens: its FP8 token linears (wq_a, wq_b, wkv, wo_b, the indexer's wq_b, the
  // shared expert, Engram's wkv) run through the FP8 GEMM (GemmFp8Params::x_f16) instead of the block-scaled
  // GEMV. Both in the x_f16 mode: f16 tensor-core steps, FP32-precision 32-block sums; the same
  // quantisation and rounding points, the block sums in another FP32 order, so within the parity
  // bound of the GEMV path but not its bits (docs/cuda.md, "Whole-model parity"). The choice is
  // per sequence (a step's rows are ordered by their sequence's row count, the GEMM taking the
  // long ones), so a sequence's bits never depend on the other sequences of its step; they do
  // depend on the chunk sizes it is fed in. 0 (this struct's default, which the bitwise chunking
  // tests rely on): always the GEMV. The CLI (tools/backend_options.h) sets both to 128.
  int64_t moe_gemm_min_tokens = 0;
  int64_t dense_gemm_min_tokens = 0;
  // The operands of the FP8 / FP4 prefill GEMMs (the CLI's --prefill-gemm-operands). false (f16,
  // the default): the x_f16 mode above. true (bf16): GemmFp8Params::x_bf16, the activations as
  // BF16 values (code · scale, exact) and W expanded to BF16 with its scales folded in, each
  // 32-block summed on the tensor core and added in FP32: the same precision, measured no faster
  // (the W expansion bounds both). BF16 matrices over BF16-valued inputs (the router gate, the
  // compressor and indexer projections in reference numerics) take the BF16 GEMM (w_bf16) under
  // dense_gemm_min_tokens whatever this says.
  bool prefill_gemm_bf16 = false;
  // With the BF16 operands (implies prefill_gemm_bf16; the CLI's --prefill-gemm-operands
  // bf16-expanded): each FP8 / FP4 matrix of a prefill GEMM is expanded to its BF16 values once
  // per GEMM into scratch (ops::cuda::gemm_expand_bf16_cuda; the routed experts in chunks of at
  // most kMoeExpandChunkBytes, only the experts the step reaches) and the GEMM reads them as BF16
  // weights (w_bf16): the same bits as prefill_gemm_bf16, without expanding every W tile again
  // for each 128-row m-tile. The scratch is counted by the memory plan
  // (MemoryPlanOptions::prefill_weight_expansion).
  bool prefill_gemm_expand_w = false;
  // With the BF16 operands (implies prefill_gemm_bf16; the CLI's --prefill-gemm-operands
  // bf16-direct, which expands the weights as well): the tensor core accumulates the whole of k
  // (GemmFp8Params::bf16_direct) instead of each 32-block's sum being added in FP32, for the FP8 /
  // FP4 prefill GEMMs and the BF16 matrices' GEMMs alike. The same exact products in another FP32
  // order: within the parity bound, not the block-summed modes' bits. A row's bits still do not
  // depend on the other rows of its launch.
  bool prefill_gemm_direct = false;
  // With prefill_gemm_expand_w: the routed experts' grouped GEMMs take the expanded weights only
  // when the step has at least this many routed rows per expert on average (pairs / experts);
  // below it each W tile is expanded inside the GEMM (the same values in the same order, so the
  // same bits), which spares the expansion's memory traffic when each expert has few rows (the
  // release's 384 experts give an 8k chunk ~128 rows each). 0: always the expanded weights. The
  // CLI's --moe-expand-min-rows.
  int64_t moe_expand_min_rows = 0;
  // The routed experts' in-kernel expansion (above) with the operands swapped: W expanded into the
  // tensor core's register operand instead of shared memory (gemm_fp8_grouped w_in_registers; the
  // same sums). The CLI's --moe-w-registers.
  bool moe_w_in_registers = true;
  // Routed pairs of a decode-sized step with several tokens (batches, verify blocks) but fewer
  // pairs than experts, where two pairs likely share an expert ((T·K)² >= 2E, the birthday
  // bound), are grouped by expert in compact form (ops::compact_expert_groups: a group per expert
  // that has pairs), so that each touched expert's matrices are streamed once for all its pairs
  // instead of once per pair. A pair's sums are the same bits either way (the GEMV's k split is
  // fixed by the one-token step's group count; tokens are independent MMA columns); only the
  // bytes read change. On by default; the CLI's --moe-compact-groups on | off.
  bool moe_compact_groups = true;
  // Programmatic dependent launch of the model's kernels (ops/cuda/runtime/launch.cuh): each
  // kernel's launch and block scheduling overlap its predecessor's end. The same results either
  // way; process-wide, set before each forward of this model. The CLI's --gpu-pdl.
  bool programmatic_launch = true;
  // The FP4 GEMVs' (the routed experts') k blocks per warp iteration: 0 automatic (2), 2 or 4 (each
  // quad of threads loading a row's whole 16-byte blocks). Another summation order, within the
  // parity bound; process-wide, set before each forward of this model. The CLI's --gemv-fp4-chunk.
  int gemv_fp4_chunk = 0;
  // The routed experts' FP4 matrices stored in the decode GEMV's fragment order
  // (ops/fp4_fragments.h), packed on the device once they are uploaded: each thread's weight words
  // of a block are one 16-byte load and a warp's load is 512 contiguous bytes. The same bits
  // (the GEMVs and the prefill GEMMs read the same values in the same order); experts whose
  // shapes the order does not take (rows % 32, k % 64) stay row-major. false here: the tests'
  // row-major reference (GpuGraphDecode.Fp4FragmentsOnEqualsOffBitwise holds both to the same
  // bits). The CLI's --gpu-fp4-fragments, on by default there.
  bool fp4_fragments = false;
  // With fp4_fragments: the routed experts' decode GEMVs stream their weights through a
  // shared-memory ring of this many stages (1..8, bulk copies; ExpertGemvParams::ring_stages)
  // instead of loading them into registers; 0 off. The same bits. The CLI's --gemv-fp4-ring.
  int gemv_ring_stages = 0;
  // The BF16 tensor-core linear (kernel 5: wo_a, the LM head) over at most 8 rows: 16-output tiles
  // per CTA, 1 / 2 / 4 (fewer stagings of x per output); 0 automatic. The same bits
  // (LinearArgs::mma_decode_tiles). The CLI's --mma-decode-tiles.
  int mma_decode_tiles = 0;
  // The dense FP8 matrices the block-scaled GEMVs read (the attention projections, the shared
  // expert, Engram's wkv, the indexer's wq_b; not the stacked wq_a + wkv) stored in the FP8
  // fragment order (ops/fp4_fragments.h): a thread's pieces of a block are two 16-byte loads. The
  // decode GEMVs read the order; the prefill GEMM and the tiled GEMV read a row-major copy unpacked
  // into scratch per launch (one copy of the matrix per prefill GEMM). The same bits either
  // way. The CLI's --gpu-fp8-fragments.
  bool fp8_fragments = false;
  // Reference numerics: the linears whose inputs are BF16 values (wo_a, the LM head) run on the
  // BF16 tensor cores (ops/cuda/model/linear_mma.cu: the exact products in another FP32 order, the
  // same at every row count) instead of the exactness kernels (the CPU's order). The CLI's
  // --bf16-linears tensor|exact.
  bool tensor_core_linears = false;
  // The block-scaled GEMVs of steps with more than kGpuGraphMaxTokens rows (ops/cuda/gemv), whose
  // inputs are quantised once per launch: a launch of at least this many token rows (the routed
  // experts: this many pairs per expert on average) runs the tiled kernel (64-row x 128-token CTA
  // tiles over the whole of k, built for prefill chunks); a smaller one the decode GEMV in token
  // passes over each weight tile (k split across warps and clusters, later passes re-reading the
  // tile). The same sums in the same order either way, so only speed depends on it: the passes
  // suit decode steps of many sequences (a few tokens per matrix), the tiled kernel prefill steps
  // (many token tiles per weight tile). 0: the tiled kernel from kGpuGraphMaxTokens + 1 rows on.
  // The CLI's --gemv-tiled-min-rows.
  int64_t gemv_tiled_min_rows = 192;
  // The dense block-scaled linears (linear_native, the shared expert's gated GEMV) of at least
  // this many token rows quantise their input once before the launch (gemv_quantize_cuda) and
  // the GEMV reads the codes; smaller launches quantise inside every CTA. The same bits either
  // way, so only speed depends on it (the routed experts quantise once at every size). Default:
  // the launches above kGpuGraphMaxTokens (8) rows. The CLI's --gemv-prequant-min-rows.
  int64_t gemv_prequant_min_rows = 9;
  // Side branches (Backend::side_begin; forward/flow.cpp, lane 0: the query beside the window KV
  // and the compressors, the ring write beside the output projection, the router and routed
  // experts beside the shared expert, the DSpark rings beside the LM head; lane 1, V4.1: each sublayer's mHC mixes beside the sublayer) of
  // decode-sized steps (at most kGpuGraphMaxTokens rows) run on a stream per lane, concurrently
  // with the main branch (in a CUDA graph: parallel branches). The same kernels on the same
  // inputs: the same bits. kPriority: the side streams at the device's highest priority, so that
  // their blocks are scheduled before the main branch's waiting ones. Off by default (the
  // CLI's default is on). The CLI's --gpu-branches off | on | priority.
  GpuBranches branches = GpuBranches::kOff;
  // Each attention layer's wq_a and wkv (the same input, FP8 block-scaled GEMVs of one shape
  // family) kept as one stacked [q_lora_rank + head_dim, hidden] matrix on the device (the same
  // bytes, one allocation; GpuModel::stack_query_kv), so that a decode step streams both in one
  // GEMV launch (Backend::linear_pair) instead of two narrower ones. Both then sum in the stacked
  // launch's order wherever they run (BlockLinearParams::tune_n): the same bits on every path,
  // another FP32 order than without the stack (within the parity bound). On by default; the
  // CLI's --gpu-stack-qkv on | off.
  bool stack_query_kv = true;
  // Small row ops of a step that follow one another run as one launch where a kernel exists, with
  // the same bits: the window KV rows' norm, RoPE and FP8 simulation (Backend::norm_rope_quant)
  // and, for one sequence whose rows fit the ring's spare slots, their ring write
  // (Backend::window_kv_rows), the MoE combine with the block's stream update
  // (Backend::moe_combine_post), the attention output's inverse RoPE inside the tensor-core
  // decode attention (Backend::attention_unrope).
  // On by default. The CLI's --gpu-row-fusion on | off.
  bool row_fusion = true;
  // Decode-sized steps (at most kGpuGraphMaxTokens rows, hc 4, hidden_size a multiple of 1024) run
  // each mHC stream update and the next sublayer's mixes of the updated streams as one launch
  // (Backend::hc_post_mixes / moe_combine_post_mixes; cd::launch_hc_post_mixes): the same bits as
  // the update then hc_mixes, two launches and the mixes' separate reads of the streams fewer per
  // layer. Off by default until measured; the CLI's --gpu-post-mixes on | off.
  bool post_mixes_fusion = false;
  // Each sublayer's input (the mHC collapse of the streams, then the RMS norm) formed by one launch
  // (Backend::hc_collapse_norm; cd::launch_hc_collapse_norm; hc 4, hidden_size up to 16,384): the
  // same bits, the collapsed row kept in registers. Off by default until measured; the CLI's
  // --gpu-collapse-norm on | off.
  bool collapse_norm_fusion = false;
};
// The largest GpuLoadOptions::gemv_tiled_min_rows accepted (larger values: never the tiled kernel).
inline constexpr int64_t kMaxGemvTiledMinRows = int64_t(1) << 40;

// CUDA graphs of decode-sized forwards (docs/cuda.md, "CUDA graphs"): a GpuModel::forward call
// whose items all have at most kGpuGraphMaxTokens tokens runs as a CUDA graph on the model's
// stream. On one GPU a step replays a cached executable of the same op sequence, with only the
// changed node parameters patched (ops/cuda/runtime/launch.cuh launch tape); a new op sequence is recorded
// once. On by default (GpuLoadOptions::graphs kOff: eager; kRecord: record every step), on one GPU
// and on multi-GPU NCCL ranks (their all-reduces are tape markers,
// never patched; the ranks vote each step); the host-staged communicator never uses them. Counters since load
// (a multi-GPU model: summed over its ranks).
inline constexpr int64_t kGpuGraphMaxTokens = 8;
struct GpuGraphStats {
  int64_t forwards = 0;        // GpuModel::forward calls
  int64_t eligible = 0;        // of which decode-sized with graphs on
  int64_t launches = 0;        // graph launches (one per eligible forward that did not fall back)
  int64_t patched = 0;         // of which replayed by patching changed nodes, without recording
  int64_t patched_nodes = 0;   // node parameters set by those patches
  int64_t patch_misses = 0;    // patch attempts that found no matching executable (then recorded)
  int64_t instantiations = 0;  // new executables (first use of a key, or a topology change)
  int64_t updates = 0;         // executables updated in place (cudaGraphExecUpdate)
  int64_t update_failures = 0; // updates refused (counted in instantiations as well)
  int64_t recaptures = 0;      // captures discarded because a buffer had to grow first
  int64_t eager_fallbacks = 0; // eligible forwards that ran without a graph
  // Decode-sized forwards (graphs on or off): how many, host time until the final stream sync
  // (host code, launches or recording or patching) and time waiting in that sync, in ns.
  int64_t timed = 0, host_ns = 0, wait_ns = 0;
  // Of the patched steps' host time: the forward's host code writing the launch tape, then
  // setting the changed nodes and launching the executable, in ns.
  int64_t tape_ns = 0, apply_ns = 0;
  // MoE layers whose routed experts ran as grouped GEMMs (GpuLoadOptions::moe_gemm_min_tokens).
  int64_t moe_gemm_layers = 0;
  // MoE layers whose routed pairs were grouped in compact form (GpuLoadOptions::moe_compact_groups).
  int64_t moe_compact_groupings = 0;
  // Routed expert matrices (one stack of all experts each) put in the FP4 fragment order at load
  // (GpuLoadOptions::fp4_fragments).
  int64_t fp4_fragment_stacks = 0;
  // Dense FP8 matrices put in the FP8 fragment order at load (GpuLoadOptions::fp8_fragments), and
  // the launches that read a row-major copy of one unpacked into scratch.
  int64_t fp8_fragment_matrices = 0, fp8_fragment_unpacks = 0;
  // Stream updates run with the next sublayer's mixes as one launch (GpuLoadOptions::post_mixes_fusion).
  int64_t post_mixes_fused = 0;
  // Sublayer inputs collapsed and normed by one launch (GpuLoadOptions::collapse_norm_fusion).
  int64_t collapse_norm_fused = 0;
  // FP8 token linears that ran (some of) their rows through the FP8 GEMM
  // (GpuLoadOptions::dense_gemm_min_tokens).
  int64_t dense_gemm_linears = 0;
  // wq_a + wkv launches run as one stacked GEMV (GpuLoadOptions::stack_query_kv).
  int64_t paired_linears = 0;
  // Weight matrices (routed experts: chunks of them) expanded to BF16 for a prefill GEMM
  // (GpuLoadOptions::prefill_gemm_expand_w).
  int64_t weight_expansions = 0;
};
// The counters of a CUDA model (one GPU or tensor-parallel); an error for other models.
Result<GpuGraphStats> gpu_graph_stats(const Model& m);

// Opens a release-format checkpoint on CUDA device `device` (numerics as load_model). Errors name
// the file / tensor / device (no device, out of memory, ...).
Result<std::unique_ptr<Model>> load_model_gpu(const std::string& ckpt_dir, Numerics numerics, int device,
                                              const GpuLoadOptions& opts = {});

// Free memory of CUDA device `device` (cudaMemGetInfo) for the start-up memory plan; an error
// without a CUDA backend or device.
Result<uint64_t> gpu_memory_free(int device);

// The CLI/engine hook: `gpus` empty → the CPU backend (load_model); "N" → the CUDA backend on
// device N; a list "0,1,..." → the tensor/expert-parallel model over those devices (gpu_tp.h).
// `opts` apply to the CUDA backends only, except load_threads / load_progress (every backend).
Result<std::unique_ptr<Model>> load_model_for(const std::string& ckpt_dir, Numerics numerics,
                                              const std::string& gpus, const GpuLoadOptions& opts = {});

}  // namespace flashseek::forward
