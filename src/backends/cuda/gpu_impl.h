// Internals of the CUDA model backend: the per-sequence GPU state and GpuModel, which is both a
// `Model` and the CUDA `Backend` of the model flow (forward/flow.h runs the layers; gpu_ops.cpp
// implements the ops over device memory, gpu_model.cpp loading, weights and steps; device arrays
// and staging: ops/cuda/runtime). Only compiled with CUDA.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "backends/cuda/gpu_tp.h"
#include "forward/backend.h"
#include "forward/cache_format.h"
#include "forward/flow.h"
#include "forward/state.h"
#include "forward/state_convert.h"
#include "forward/weights.h"
#include "model/checkpoint.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/runtime/device_memory.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/linear_quant.h"

namespace flashseek::ops::cuda {
class Communicator;
}

namespace flashseek::forward::gpu {

using ops::cuda::capture_guard;
using ops::cuda::CaptureGuard;
using ops::cuda::DevArray;
using ops::cuda::PinnedArena;

// Rows of a compressor's rollback history ring on the device (GpuCompState::hist_*).
inline int64_t gpu_hist_rows(int64_t ratio) { return 2 * ratio + kMaxRollback; }

// A compressor's open group on the device: pending rows [ratio, width] and (V4 ratio 4) the
// previous complete window; the counts live on the host (they follow from the positions).
struct GpuCompState {
  DevArray<float> v, z, prev_v, prev_z;
  int64_t n_pend = 0;
  bool has_prev = false;
  // Projections of recent positions for rollback (CompressorState::hist_* on the CPU): a ring of
  // 2·ratio + kMaxRollback rows, row of position p at slot p % rows; positions >= hist_lo valid.
  DevArray<float> hist_v, hist_z;
  int64_t hist_lo = 0;
};

// The caches are kept in their row formats (GpuModel::cache_fmt_, forward/cache_format.h):
// compact in reference numerics (exactly the values the flow quantised), FP32 in exact numerics.
struct GpuLayerState {
  DevArray<uint8_t> ring;   // [ring_size] rows of cache_fmt_.ring
  DevArray<uint8_t> ckv;    // [n_ckv] rows of cache_fmt_.ckv (grows)
  DevArray<uint8_t> ikeys;  // [n_ikeys] rows of cache_fmt_.ikeys (grows)
  int64_t n_ckv = 0, n_ikeys = 0;
  GpuCompState comp, icomp;
};

// Rows of the V4 MTP final-stream history ring (GpuSequenceState::mtp_hist): the last position
// and kMaxRollback more, as the CPU's mtp_hist_x keeps.
inline constexpr int64_t kGpuMtpHistRows = 1 + kMaxRollback;

// len, ring_size and engram_hist (host): ModelState.
class GpuSequenceState final : public ModelState {
 public:
  std::unique_ptr<SequenceState> clone() const override;

  std::vector<GpuLayerState> layers;
  std::vector<DevArray<float>> draft_rings;   // [stage] DSpark KV [ring_size, Dh] FP32 (gpu_draft.cpp)
  // V4 MTP block (gpu_mtp.cpp; CPU twin: CpuSequenceState::mtp_ring / mtp_hist_x): its window KV
  // ring [ring_size, Dh] (row of position p at p % ring_size) and the backbone's final streams
  // [kGpuMtpHistRows, hc·D] of recent positions (position p at slot p % kGpuMtpHistRows, positions
  // [mtp_lo, len) valid). Empty when the model keeps no MTP state.
  DevArray<float> mtp_ring, mtp_hist;
  int64_t mtp_lo = 0;
  Status error;  // an allocation failure in new_sequence/clone, reported by the next forward
};

// A matrix kept on the device exactly as the checkpoint stores it (native weights, the default):
// BF16 / F16 / F32 values, FP8 e4m3 codes [n, k] + E8M0 scales [ceil(n/br), ceil(k/bc)], or FP4
// packed [n, k/2] + E8M0 [n, k/32] (routed experts). Routed experts: `count` matrices back to
// back. The exactness linear (ops/cuda/model_kernels.h, WeightRef) reads every format; `fast`
// matrices (reference numerics, FP8 linears with FP8 activations and routed experts) run through
// the block-scaled GEMVs (ops/cuda/gemv.h) instead, with activation block `act_block`.
struct NativeMatrix {
  DevArray<uint8_t> codes, scales;
  ops::cuda::detail::WeightDtype dtype = ops::cuda::detail::WeightDtype::kF32;
  ops::WeightFormat format = ops::WeightFormat::kFp8;  // fast kernels: kFp8 or kFp4
  int64_t n = 0, k = 0, block_rows = 1, block_cols = 1, w_block = 32, act_block = 0, count = 1;
  int64_t code_bytes = 0, scale_bytes = 0;  // of one matrix
  bool fast = false;
  // Codes in the fragment order (ops/fp4_fragments.h). FP4 (GpuLoadOptions::fp4_fragments): codes
  // and scales of every matrix, read with ExpertGemvParams::w_packed and the GEMM's w_fragments.
  // FP8 (GpuLoadOptions::fp8_fragments; dense, count 1): the codes only, read with
  // BlockLinearParams::w_packed by the one-pass GEMVs; every other reader takes row_major_codes.
  bool fragments = false;
  // Part of a stacked pair (GpuModel::stack_query_kv): the second matrix owns no memory and reads
  // its rows inside the first one's allocation (codes_view / scales_view); both launch with the
  // stack's row count as their tuning shape (BlockLinearParams::tune_n), so a matrix launched
  // alone sums in the stacked launch's order. stacked_with: the first matrix's partner.
  const uint8_t* codes_view = nullptr;
  const uint8_t* scales_view = nullptr;
  int64_t tune_n = 0;
  const NativeMatrix* stacked_with = nullptr;
  const uint8_t* cptr() const { return codes_view ? codes_view : codes.get(); }
  const uint8_t* sptr() const { return scales_view ? scales_view : scales.get(); }
  // The exactness kernels' view of matrix 0 (rows from row0).
  ops::cuda::detail::WeightRef ref(int64_t row0 = 0) const {
    ops::cuda::detail::WeightRef r;
    r.dtype = dtype, r.data = cptr(), r.scale = sptr(), r.cols = k;
    r.block_rows = block_rows, r.block_cols = block_cols, r.row0 = row0;
    r.matrix_bytes = code_bytes, r.scale_matrix_bytes = scale_bytes;
    return r;
  }
};

// What load put on the device (GpuModel::weight_report): matrices as stored vs the checkpoint's
// bytes of the same tensors (weights + scales), and the FP32 copies.
struct GpuWeightReport {
  int64_t stored_matrices = 0;     // tensors kept as stored (routed experts: one per expert)
  int64_t stored_bytes = 0;        // their device bytes (codes + scales)
  int64_t checkpoint_bytes = 0;    // their bytes in the checkpoint (weights + scales)
  int64_t fp32_matrices = 0;       // matrices uploaded as FP32 copies (fp32 mode, fallbacks)
  int64_t fp32_bytes = 0;          // device bytes of every FP32 copy (those matrices, vectors, derived tables)
  int64_t fast_matrices = 0;       // stored matrices run by the block-scaled GEMVs (reference numerics)
  int64_t fallback_matrices = 0;   // native weights: matrices (or a rank's slices) kept as FP32 copies
  int64_t fallback_bytes = 0;      // their device bytes (part of fp32_bytes)
  int64_t checkpoint_total_bytes = 0;  // every tensor of the checkpoint but the Engram tables
};

class WeightStager;  // gpu_model.cpp: pinned, overlapped weight upload during GpuModel::load

class GpuModel final : public Model, public Backend {
 public:
  // With `shard` (gpu_tp.h): one rank of a multi-GPU model, holding only its slice of the weights;
  // its partial sums go through `comm` (all ranks call forward together).
  static Result<std::unique_ptr<GpuModel>> load(const std::string& dir, Numerics numerics, int device,
                                                const TpShard* shard = nullptr,
                                                ops::cuda::Communicator* comm = nullptr,
                                                const GpuLoadOptions& opts = {});
  const model::ModelConfig& config() const override { return ck_->config(); }
  std::unique_ptr<SequenceState> new_sequence() const override;
  Status forward(std::span<BatchItem> batch, std::vector<float>& logits) override;
  // Speculative decoding (gpu_rollback.cpp, gpu_draft.cpp): same contracts as CpuModel.
  Status rollback(SequenceState& state, int64_t new_length) const override;
  // One GPU, or rank 0 of a tensor-parallel model: the draft's weights are whole (never sliced)
  // and the backbone's final streams are the same on every rank after the all-reduces, so rank 0
  // runs the whole draft on its own sequence state (the other ranks neither load the draft nor
  // keep its state); only its LM head is gathered from every rank's vocabulary slice (draft_head).
  bool has_draft() const override { return (w_.has_dspark || w_.has_mtp) && shard_.rank == 0; }
  // BatchItem::sample (gpu_sample.cpp): one GPU only (a TP rank holds a vocabulary slice).
  bool samples_on_device() const override { return !shard_.split(); }
  Result<DraftBlock> propose(const SequenceState& state, int32_t x0, const DraftChooser& choose = {}) const override;
  // V4.1 DSpark: its block; V4 MTP (gpu_mtp.cpp): one draft per step.
  int64_t draft_block_size() const override {
    return w_.has_dspark ? config().dspark_block_size : w_.has_mtp ? 1 : 0;
  }
  // Snapshots (gpu_state_io.cpp): device state ↔ the canonical host format. A tensor-parallel
  // rank converts its own state (replicated but for the draft, which only rank 0 holds); the
  // multi-GPU model's snapshot is rank 0's (TpModel, gpu_tp.cpp).
  Result<std::unique_ptr<CpuSequenceState>> export_state(const SequenceState& state) const override;
  Result<std::unique_ptr<SequenceState>> import_state(const CpuSequenceState& state) const override;
  std::string backend_kind() const override;
  StateGeometry state_geometry() const;
  // Device bytes of the weights (FP32 copies + stored codes and scales) and how many matrices
  // (routed experts: one per expert) are kept as stored.
  int64_t weight_bytes() const;
  int64_t native_matrices() const { return report_.stored_matrices; }
  const GpuWeightReport& weight_report() const { return report_; }
  ~GpuModel() override;
  // CUDA graph counters since load (gpu_graph.cpp).
  const GpuGraphStats& graph_stats() const { return gstats_; }
  bool graphs_enabled() const { return graphs_; }

 private:
  GpuModel() = default;
  // The items one after the other on stream_ (eager or under capture); logits are queued for
  // download (finish_forward copies them out).
  Status run_items(std::span<BatchItem> batch, std::vector<float>& logits);
  // Decode-sized forward through a CUDA graph; `ran` false: nothing ran (run it eagerly).
  Status forward_graph(std::span<BatchItem> batch, std::vector<float>& logits, bool& ran);
  // Applies the recorded graph `g` (owned from here on) to the executable of `key` and launches it;
  // `taped`: this thread's launch tape recorded every op of `g` with its node (a patchable graph).
  Status launch_graph(const std::vector<int64_t>& key, cudaGraph_t g, bool taped);
  struct GraphExec;
  // The step from a cached executable by patching changed nodes, without recording (gpu_graph.cpp).
  Status patch_step(const std::vector<int64_t>& key, std::span<BatchItem> batch, std::vector<float>& logits,
                    const std::function<Status()>& discard, bool& done, bool& off_tape);
  bool apply_tape(GraphExec& x, int64_t& set);
  // Waits for stream_, copies the queued logits into `logits`, rewinds the staging arena.
  Status finish_forward(std::vector<float>& logits);
  // Host → device through the pinned staging arena, ordered on stream_ (never a synchronous copy).
  Status upload(void* dst, const void* src, size_t bytes);
  // A pinned staging buffer the host fills before upload_staged (e.g. Engram rows).
  template <typename T>
  Result<T*> staging(int64_t n) {
    FS_ASSIGN_OR_RETURN(void* p, staging_.alloc(size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
    return static_cast<T*>(p);
  }
  Status upload_staged(void* dst, const void* staged, size_t bytes);
  // Queues the device → host copy of n logits [at the end of `logits`] (the spot where a device
  // sampler would consume them instead).
  Status download_logits(const float* d_logits, int64_t n, std::vector<float>& logits);
  // Queues a device → host copy of `bytes` to `host_dst` (an address that stays valid until the
  // forward returns, e.g. a BatchItem field); done by finish_forward, graph capture included.
  Status queue_download(void* host_dst, const void* d_src, size_t bytes);
  // The same for dst.size() elements of `bytes` each at d_src: one copy, element i to dst[i].
  Status queue_download_spread(std::span<void* const> dst, const void* d_src, size_t bytes);
  bool ref() const { return numerics_ == Numerics::kReference; }
  Status upload_weights();
  Status up(Vec& v);
  // A matrix: native weights keep tensor `name` as stored (fast_act > 0: run by the block-scaled
  // GEMV with that activation block when it fits); FP32 mode uploads the host copy (up). A name
  // load_weights did not defer (absent from this checkpoint / role) uploads nothing.
  Status up_matrix(Vec& v, const std::string& name, int64_t fast_act = 0);
  // The same for F32 tensors that kernels read as raw FP32 (mHC mixers): as stored when stored F32.
  Status up_f32_matrix(Vec& v, const std::string& name);
  // Routed experts `prefix`N.wJ.weight, N < E, as stored back to back (fast_act as up_matrix),
  // or FP32 stacks [E, out, in]; keys[j] receives wJ+1's key for linear().
  Status up_experts(std::vector<Vec>& w1, std::vector<Vec>& w2, std::vector<Vec>& w3, const std::string& prefix,
                    int64_t fast_act, std::vector<DevArray<float>>& stacks, std::array<const float*, 3>& keys);
  // A native matrix by key (nullptr: an FP32 device array).
  const NativeMatrix* native(const float* key) const {
    const auto it = native_w_.find(key);
    return it == native_w_.end() ? nullptr : &it->second;
  }
  // X [T, hc, D] ← rows `tokens` of `table` (an embedding: FP32 copy or as stored).
  Status embed_rows(const float* table, const int32_t* tokens, float* X, int64_t T, int64_t hc, int64_t D);
  // Points a grouped linear at rows [row0, ...) of `w` (FP32 copy or as stored).
  void set_weight(ops::cuda::detail::LinearArgs& a, const float* w, int64_t row0) const;
  // The one load line: device bytes of the weights vs the checkpoint's (stderr); fills
  // report_.checkpoint_total_bytes.
  void print_weight_report();
  // Device copy of a host weight (nullptr when the checkpoint has none).
  const float* d(const Vec& v) const;
  template <typename T>
  Result<T*> scratch(const std::string& name, int64_t n);
  // hc_post_mixes / moe_combine_post_mixes in one launch where it takes the call (true), else
  // nothing launched (false); `combine` set: f is that combine's output.
  Result<bool> post_mixes_launch(const Tensor& f, const MoeCombineCall* combine, const Tensor& X, const Tensor& post,
                                 const Tensor& comb, int64_t rows, int64_t hc, int64_t dim, bool bf16,
                                 const HcMixCall& next);
  void log_fallback(const std::string& what, const std::string& why);
  Status linear_native(const NativeMatrix& nw, const float* x, int64_t rows, int64_t in, int64_t out, float* y,
                       int64_t act_block, bool bf16_out, bool bf16_in, const int32_t* sel, int64_t x_row_div);
  // GpuLoadOptions::stack_query_kv: each layer's wq_a and wkv, where both are block-scaled FP8
  // matrices over the same input width whose scale rows concatenate, moved into one allocation
  // (wq_a's rows, then wkv's; the originals freed: the device holds the same bytes) and re-keyed;
  // wkv becomes a view into it. Layers that do not fit keep two matrices (stacked_pairs_ counts).
  Status stack_query_kv();
  // The queued expert stacks (fragment_pending_) into the FP4 fragment order, in place, through a
  // bounded scratch copy (GpuLoadOptions::fp4_fragments).
  Status pack_expert_fragments();
  // The dense FP8 matrices the GEMVs read into the FP8 fragment order, in place through a scratch
  // copy (GpuLoadOptions::fp8_fragments); after stack_query_kv, whose stacked pairs stay row-major.
  Status pack_dense_fragments();
  // Matrix 0's codes in row-major order: cptr(), or for FP8 codes in the fragment order a copy
  // unpacked into the scratch buffer `name` (for the readers of row-major tiles: the prefill GEMM,
  // the tiled GEMV, the weight expansion, the exactness kernels).
  Result<const uint8_t*> row_major_codes(const NativeMatrix& w, const std::string& name);
  // A block-scaled GEMV launch of w whose codes pointer is `codes`: FP8 codes in the fragment
  // order are read as they are (packed set) by the one-pass kernels, or, where the launch may take
  // the tiled kernel (`tiled`: pre-quantised x and BlockLinearParams::tiled; row-major tiles), from
  // a row-major copy (row_major_codes into `name`).
  Status read_fragments(const NativeMatrix& w, const uint8_t*& codes, bool& packed, bool tiled, const std::string& name);
  // p's input quantised once before the block-scaled GEMV (GpuLoadOptions::gemv_prequant_min_rows).
  Status prequantize(ops::BlockLinearParams& p);
  // y [rows, out] = q(x) · Wᵀ with the CPU backend's linear options.
  Status linear(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
                int64_t act_block, bool bf16_out, bool bf16_in = false, const int32_t* sel = nullptr,
                int64_t x_row_div = 1, bool x_bf16 = false);

  // Device sampling (gpu_sample.cpp): draws the token after logits row rows[i] of lg [*, V] by
  // *specs[i] on stream_ for every i and queues one download of them all (*outs[i] written at the
  // forward's sync).
  Status sample_lg_rows(const float* lg, int64_t V, std::span<const int64_t> rows,
                        std::span<const ops::SampleSpec* const> specs, std::span<int32_t* const> outs);
  FlowParams flow_params() const;
  // The device copies of an FFN's routed experts (w1, w2, w3 keys) and V4 hash table.
  struct FfnDev {
    const std::array<const float*, 3>* experts = nullptr;
    const int32_t* tid2eid = nullptr;
  };
  Result<FfnDev> ffn_dev(const FfnWeights& F) const;
  GpuLayerState& layer_state(FwdSeg& seg, int layer) const {
    return static_cast<GpuSequenceState*>(seg.st)->layers[size_t(layer)];
  }
  // Routed experts as stored through the block-scaled grouped expert GEMV; *row_of: ybuf's row of
  // pair (t, k) when not t·K + k (grouped).
  // gemm: the rows take the grouped FP8 GEMMs over the FP4 experts where moe_gemm_path allows;
  // `tag` names the scratch of *row_of (two calls of one step keep theirs apart).
  Status moe_native(const std::array<const float*, 3>& ek, int64_t T, int64_t E, int64_t K, const float* m,
                    const int32_t* sel, const float* wt, float* ybuf, const int32_t** row_of, bool gemm = false,
                    const char* tag = "moe_grp_pos");
  // Whether the routed experts' weights and widths suit the grouped FP8 GEMMs over FP4 experts.
  bool moe_gemm_path(const NativeMatrix& n1, const NativeMatrix& n2, const NativeMatrix& n3, int64_t E) const;
  // An FP8 token linear of the step (LinearCall key) whose sequences' rows from dense_row0_ on run
  // through the FP8 GEMM (GpuLoadOptions::dense_gemm_min_tokens), the rows before it through the
  // GEMV; false: not such a call (the caller runs the usual path).
  Result<bool> linear_gemm(const LinearCall& c);
  // Whether a linear over `rows` token rows of this step gives some of them to the prefill GEMM
  // (rows [dense_row0_, rows): sequences of at least dense_gemm_min_tokens_ rows).
  bool dense_gemm_takes_rows(int64_t rows) const {
    return dense_gemm_min_tokens_ > 0 && sm90a_ && rows == step_rows_ && dense_row0_ < rows;
  }
  Result<bool> linear_gemm_bf16(const LinearCall& c, const NativeMatrix& nw);
  // Matrices [e0, e0 + count) of w expanded to BF16 values into scratch `name` (sized exactly, not
  // geometrically: GpuLoadOptions::prefill_gemm_expand_w); row_start (device, [w.count + 1]):
  // skip the matrices no row reaches. row_major: FP8 codes in the fragment order read from this
  // row-major copy (row_major_codes).
  Result<const uint8_t*> expand_weight(const NativeMatrix& w, int64_t e0, int64_t count, const int32_t* row_start,
                                       const std::string& name, const uint8_t* row_major = nullptr);
  // The device work of compressor_feed for every sequence of a chunk, planned on the host: the
  // pool kernel's slot tables (v then z rows of each completed group), then two passes of row
  // copies (a: rollback history and previous windows, b: the open groups' rows; b writes rows that
  // the pool and a read).
  struct FeedPlan {
    std::vector<const float*> tab_v, tab_z;
    std::vector<const float*> a_src, b_src;
    std::vector<float*> a_dst, b_dst;
  };
  // Plans one sequence's rows v/z [T, width] into `cs` (CPU twin: CpuOps::feed_seg) and advances
  // its host counters; completed groups go to `groups`.
  Status plan_feed(GpuCompState& cs, const float* v, const float* z, const FwdSeg& seg, int64_t ratio, int64_t c,
                   bool overlap, FeedPlan& plan, std::vector<int64_t>& groups);
  // index_topk of one sequence (its rows of iq, wts, out, out_n).
  Status index_topk_seg(int layer, FwdSeg& seg, const Tensor& iq, const Tensor& wts, const Tensor& out,
                        const Tensor& out_n);

 public:
  // ---- Backend (gpu_ops.cpp) ----
  Result<Tensor> scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols = 1) override;
  Status side_begin(int lane) override;
  Status side_end(int lane) override;
  Status side_join(int lane) override;
  Status upload(const Tensor& dst, const void* host, size_t bytes) override { return upload(dst.data, host, bytes); }
  Status copy(const Tensor& dst, const Tensor& src, size_t bytes) override;
  Status copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride, int64_t rows,
                   int64_t cols) override;
  Status zero(const Tensor& t) override;
  Status download_now(void* host, const Tensor& src, size_t bytes) override;
  bool has(const Vec& w) const override { return d(w) != nullptr; }
  Status embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) override;
  Status linear(const LinearCall& c) override;
  Result<bool> linear_pair(const LinearCall& a, const LinearCall& b) override;
  Status grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in, int64_t out,
                        const Tensor& z, bool bf16) override;
  Status rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                  bool bf16) override;
  Status rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) override;
  Status rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec, int64_t vec,
              int64_t rope_dim, bool inverse, bool bf16) override;
  Status quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block, QuantSim kind) override;
  Status norm_rope_quant(const NormRopeQuantCall& c) override;
  Status hc_post_mixes(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                       int64_t hc, int64_t dim, bool bf16, const HcMixCall& next) override;
  Status moe_combine_post_mixes(const MoeCombineCall& c, const Tensor& X, const Tensor& post, const Tensor& comb,
                                int64_t hc, bool bf16, const HcMixCall& next) override;
  bool fuses_post_mixes(int64_t rows) const override;
  Status moe_combine_post(const MoeCombineCall& c, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t hc,
                          bool bf16) override;
  Status hadamard(const Tensor& x, int64_t rows, int64_t dim) override;
  Status scale(const Tensor& x, int64_t n, float s, bool bf16) override;
  Status add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                 int64_t ratio) override;
  Status hc_mixes(const HcMixCall& c) override;
  Status hc_head_pre(const HcMixCall& c) override;
  Status hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc, int64_t dim,
                     bool bf16) override;
  Status hc_collapse_norm(const Tensor& X, const Tensor& pre, const Vec* w, const Tensor& u, const Tensor& y,
                          int64_t rows, int64_t hc, int64_t dim, float eps, bool bf16) override;
  Status hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows, int64_t hc,
                 int64_t dim, bool bf16) override;
  Status hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                 bool bf16) override;
  Status swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows, int64_t inter,
                float limit, bool bf16) override;
  Status gated_linear(const LinearCall& gate, const LinearCall& up, const Tensor& h, int64_t rows, int64_t inter,
                      float limit, bool bf16) override;
  Status route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
               const Tensor& sel, const Tensor& wt) override;
  Status routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                        int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) override;
  Status moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K, int64_t D,
                     bool bf16, const Tensor& row_of) override;
  Status engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) override;
  Status engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D,
                     float eps, bool bf16) override;
  Result<PooledRows> compressor_feed(FwdChunk& chunk, int layer, Compressor which, const Tensor& v, const Tensor& z,
                                     int64_t ratio, int64_t c, bool overlap) override;
  Result<Tensor> cache_reserve(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override;
  Status cache_commit(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override;
  Status index_topk(int layer, FwdChunk& chunk, const Tensor& iq, const Tensor& wts, const Tensor& out,
                    const Tensor& out_n) override;
  Status attention(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                   int64_t H, bool bf16) override;
  Status attention_unrope(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink,
                          const Tensor& o, int64_t H, int64_t Dh, bool bf16, const Vec& inv_freq,
                          int64_t rope_dim) override;
  // attention() with, where unrope_pos is given and every row takes the tensor-core decode
  // attention, the inverse RoPE in its launch (ModelAttnArgs::unrope_pos): *unroped says whether
  // it did.
  Status attention_impl(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink,
                        const Tensor& o, int64_t H, bool bf16, const int64_t* unrope_pos,
                        const float* unrope_inv_freq, int64_t unrope_dim, bool* unroped);
  Status ring_write(int layer, FwdChunk& chunk, const Tensor& kv) override;
  Result<bool> window_kv_rows(int layer, FwdChunk& chunk, const NormRopeQuantCall& c) override;
  bool draft_rings() const override { return has_draft() && w_.has_dspark; }
  Status draft_ring_write(int stage, FwdChunk& chunk, const Tensor& kv) override;
  Status draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                         int64_t H, bool bf16) override;
  Status markov_logits(int32_t prev, std::span<float> logits) override;
  Status markov_embed_row(int32_t prev, std::span<float> e) override;
  // V4 MTP (gpu_mtp.cpp): the state is kept on one GPU when the checkpoint has the MTP block.
  bool mtp_state() const override { return has_draft() && w_.has_mtp && !w_.has_dspark; }
  Status mtp_advance(FwdSeg& seg, const Tensor& X_seg) override;
  Status stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) override;
  Status mtp_attention(const SequenceState& st, const Tensor& q, const Tensor& kv, const std::vector<int64_t>& pos,
                       const Vec& sink, const Tensor& out, bool bf16) override;
  int64_t heads() const override { return shard_.heads; }
  int64_t groups() const override { return shard_.groups; }
  int64_t vocab_rows() const override { return shard_.vocab; }
  bool split() const override { return shard_.split(); }
  Status tp_allreduce(const Tensor& x, int64_t n, bool bf16) override { return tp_allreduce(x.f32(), n, bf16); }
  Status tp_remap_experts(const Tensor& sel, const Tensor& wt, int64_t n) override {
    return tp_remap_experts(sel.i32(), wt.f32(), n);
  }
  // One GPU: the local head. Rank 0 of a tensor-parallel model: every rank's vocabulary slice
  // through the gather set by set_tp_head (gpu_tp.cpp).
  Status draft_head(const LinearCall& c) override;
  // Multi-GPU drafts (gpu_tp.cpp). head_slice: logits [rows, vocab_rows()] of this rank's
  // vocabulary rows for host rows y [rows, D], on this rank's device, synchronously (not under
  // graph capture: called between forwards). set_tp_head: how rank 0 gets the full-vocabulary
  // logits of host rows y [rows, D] into host out [rows, V].
  Status head_slice(std::span<const float> y, int64_t rows, std::span<float> out);
  using TpHead = std::function<Status(std::span<const float> y, int64_t rows, std::span<float> out)>;
  void set_tp_head(TpHead f) { tp_head_ = std::move(f); }
  // With a prefill GEMM on, the step's sequences run in the order of their row counts, so the
  // rows that take it form one run at the end (GpuModel::run_items, linear_gemm, routed_experts).
  bool rows_by_length() const override { return moe_gemm_min_tokens_ > 0 || dense_gemm_min_tokens_ > 0; }
  Status logits_out(const Tensor& lg, int64_t n, std::vector<float>& logits) override {
    return download_logits(lg.f32(), n, logits);
  }
  Status sample_rows(const Tensor& lg, std::span<const int64_t> rows, std::span<const ops::SampleSpec* const> specs,
                     std::span<int32_t* const> outs) override {
    return sample_lg_rows(lg.f32(), lg.cols, rows, specs, outs);
  }

 private:
  // Multi-GPU (gpu_tp.cpp): x[0, n) ← Σ over ranks, then BF16 rounding when `bf16`; no-op on one
  // GPU. Expert-parallel routing: slots of other ranks' experts get weight 0.
  Status tp_allreduce(float* x, int64_t n, bool bf16);
  Status tp_remap_experts(int32_t* sel, float* weight, int64_t n);
  // Rollback history of a compressor: rows v/z [T, width] of the sequence's positions, as copies
  // into `plan` (pass a).
  Status plan_history(GpuCompState& cs, const float* v, const float* z, const FwdSeg& seg, int64_t width,
                      int64_t ratio, FeedPlan& plan);
  // DSpark weights (gpu_draft.cpp).
  Status upload_draft_weights();
  // V4 MTP (gpu_mtp.cpp; the block is Forward::mtp_block): weights as stored like the
  // backbone's; the proposal of one draft; the state's MTP parts on allocation, rollback and
  // snapshots.
  Status upload_mtp_weights();
  Result<DraftBlock> propose_mtp(const GpuSequenceState& st, int32_t x0, const DraftChooser& choose);
  Status mtp_new_sequence(GpuSequenceState& st) const;
  Status mtp_check_rollback(const GpuSequenceState& st, int64_t new_length) const;
  Status mtp_export(const GpuSequenceState& st, CpuSequenceState& out) const;  // queued on stream_
  Status mtp_import(const CpuSequenceState& s, GpuSequenceState& st) const;
  // The sequence descriptors the last multi-sequence attention uploaded (ring_write of the same
  // layer reuses them) and that layer.
  const ops::cuda::detail::ModelAttnSeq* attn_seqs_ = nullptr;
  int attn_seqs_layer_ = -1;
  // Row formats of the window rings, compressed KV and index keys (set at load).
  CacheFormats cache_fmt_;
  // FP32 rows reserved for each cache (Cache::kCkv, kIkeys) by cache_reserve / compressor_feed:
  // the flow finishes them in place, cache_commit packs them into the cache.
  std::array<float*, 2> stage_{};

  std::unique_ptr<model::Checkpoint> ck_;
  ModelWeights w_;  // host shells: matrices are freed after upload (dev_ keeps them)
  std::unordered_map<const Vec*, DevArray<float>> dev_;
  std::vector<DevArray<float>> w1_, w2_, w3_;  // [layer] FP32 stacked experts [E, out, in] (fp32 mode)
  std::vector<std::array<const float*, 3>> experts_;  // [layer] keys of w1, w2, w3 for linear()
  // Native weights (GpuWeights::kNative): key = the stored data's device address (what d()
  // returns for such a Vec).
  bool native_ = false;
  // --engram-tables device: each Engram layer's table as stored (FP8 codes + E8M0 scales), by layer.
  bool engram_device_ = false;
  std::unordered_map<int, NativeMatrix> engram_dev_;
  std::unordered_map<const Vec*, const float*> native_key_;
  std::unordered_map<const float*, NativeMatrix> native_w_;
  DevArray<int32_t> expert_ids_;  // 0 … E−1: group expert ids of the grouped expert GEMV
  DevArray<int32_t> hcpm_tickets_;  // hc_post_mixes: a zeroed ticket per row (kGpuGraphMaxTokens)
  std::unordered_set<std::string> deferred_;  // matrices load_weights left for upload (w_.deferred_matrices)
  std::unordered_set<std::string> uploaded_;  // of which uploaded
  GpuWeightReport report_;
  WeightStager* stager_ = nullptr;  // during upload_weights only: stored matrices go up through it
  size_t sample_ws_bytes_ = 0;  // device sampling workspace (gpu_sample.cpp)
  std::vector<std::string> logged_;  // fallback reasons already logged
  std::vector<DevArray<int32_t>> tid2eid_;     // [layer] V4 hash routing tables
  std::vector<DevArray<float>> dw1_, dw2_, dw3_;  // [stage] DSpark FP32 stacked experts (fp32 mode)
  std::vector<std::array<const float*, 3>> dexperts_;  // [stage] keys of w1, w2, w3
  // DSpark Markov head [V, r] rows and [V, r] head: keys (FP32 copies in markov_*_ or as stored)
  DevArray<float> markov_embed_, markov_head_;
  const float* markov_embed_key_ = nullptr;
  const float* markov_head_key_ = nullptr;
  std::vector<DevArray<int32_t>> dtid2eid_;       // [stage] hash routing (if any)
  // V4 MTP block's routed experts: FP32 stacks (fp32 mode), keys of w1, w2, w3, hash routing.
  std::vector<DevArray<float>> mexpert_stacks_;
  std::array<const float*, 3> mexperts_{};
  DevArray<int32_t> mtid2eid_;
  std::unordered_map<std::string, DevArray<char>> scratch_;
  Numerics numerics_ = Numerics::kExact;
  TpShard shard_;  // this rank's heads / groups / experts / vocabulary (everything on one GPU)
  ops::cuda::Communicator* comm_ = nullptr;
  TpHead tp_head_;  // rank 0 of a multi-GPU model: the drafts' full-vocabulary head (set_tp_head)
  int device_ = 0;
  int64_t act_block_ = 0, expert_act_block_ = 0;
  uint32_t fast_linears_ = kAllGpuLinearRoles;  // GpuLoadOptions::fast_linears
  int index_scores_kernel_ = 0;                 // GpuLoadOptions::index_scores_kernel
  GpuPrefillAttention prefill_attention_ = GpuPrefillAttention::kStaged;  // GpuLoadOptions::prefill_attention
  int64_t moe_gemm_min_tokens_ = 0;             // GpuLoadOptions::moe_gemm_min_tokens
  int64_t dense_gemm_min_tokens_ = 0;           // GpuLoadOptions::dense_gemm_min_tokens
  int64_t gemv_tiled_min_rows_ = 192;           // GpuLoadOptions::gemv_tiled_min_rows
  int64_t gemv_prequant_min_rows_ = 9;          // GpuLoadOptions::gemv_prequant_min_rows
  bool row_fusion_ = true;                       // GpuLoadOptions::row_fusion
  bool post_mixes_fusion_ = false;               // GpuLoadOptions::post_mixes_fusion
  bool collapse_norm_fusion_ = false;            // GpuLoadOptions::collapse_norm_fusion
  int64_t stacked_pairs_ = 0;                    // layers whose wq_a + wkv are stacked (stack_query_kv)
  bool prefill_gemm_bf16_ = false;              // GpuLoadOptions::prefill_gemm_bf16
  bool prefill_gemm_expand_w_ = false;          // GpuLoadOptions::prefill_gemm_expand_w
  bool prefill_gemm_direct_ = false;            // GpuLoadOptions::prefill_gemm_direct
  int64_t moe_expand_min_rows_ = 0;             // GpuLoadOptions::moe_expand_min_rows
  bool moe_w_in_registers_ = true;              // GpuLoadOptions::moe_w_in_registers
  bool moe_compact_groups_ = true;              // GpuLoadOptions::moe_compact_groups
  // The forward running now (run_items): its rows (-1 between forwards) and the first row of the
  // sequences that take the dense / MoE prefill GEMMs (step_rows_: none).
  int64_t step_rows_ = -1, dense_row0_ = 0, moe_row0_ = 0;
  bool programmatic_launch_ = true;             // GpuLoadOptions::programmatic_launch
  int gemv_fp4_chunk_ = 0;                       // GpuLoadOptions::gemv_fp4_chunk
  bool fp4_fragments_ = false;                   // GpuLoadOptions::fp4_fragments
  int gemv_ring_stages_ = 0;                     // GpuLoadOptions::gemv_ring_stages
  int mma_decode_tiles_ = 0;                     // GpuLoadOptions::mma_decode_tiles
  bool fp8_fragments_ = false;                   // GpuLoadOptions::fp8_fragments
  // Expert stacks to put in the fragment order once the upload has landed (up_experts queues them,
  // pack_expert_fragments packs them).
  std::vector<const float*> fragment_pending_;
  bool tensor_core_linears_ = false;            // GpuLoadOptions::tensor_core_linears
  bool decode_attention_tensor_ = false;        // GpuLoadOptions::decode_attention_tensor
  bool sm90a_ = false;                          // the device runs the wgmma GEMMs (gemm_fp8.h)
  // The fast_act argument of up_matrix / up_experts for a matrix of role `r`: `act` when the
  // role may use the block-scaled GEMVs, else 0 (the exactness kernels).
  int64_t fast_act(GpuLinearRole r, int64_t act) const { return fast_linears_ & gpu_linear_bit(r) ? act : 0; }
  // Every op of this model runs on stream_ (a blocking stream: it orders with the legacy-stream
  // copies of DevArray growth and GpuSequenceState::clone). Inside a side branch stream_ is that
  // lane's side_stream_ (also blocking) and main_stream_ the model's stream.
  cudaStream_t stream_ = nullptr;
  // Side branches (Backend::side_begin, GpuLoadOptions::branches), per lane: the lane's stream
  // (null: off), its fork and join events, whether a fork onto it is open (decode-sized steps
  // only); on_lane_ the lane whose side part ops now go to (-1: the main branch; a side part's
  // scratch buffers are its lane's own: scratch<T>).
  static constexpr int kLanes = Backend::kBranchLanes;
  cudaStream_t main_stream_ = nullptr;
  std::array<cudaStream_t, kLanes> side_stream_{};
  std::array<cudaEvent_t, kLanes> fork_ev_{}, join_ev_{};
  std::array<bool, kLanes> side_open_{};
  int on_lane_ = -1;
  PinnedArena staging_;
  struct PendingCopy {
    size_t off;          // into the caller's logits
    const float* src;    // pinned staging
    size_t n;
  };
  std::vector<PendingCopy> pending_logits_;
  struct PendingBytes {
    void* dst;
    const void* src;  // pinned staging
    size_t bytes;
  };
  std::vector<PendingBytes> pending_bytes_;
  // CUDA graphs: executables keyed by the items' (T, all_logits) and the graph's node count and
  // shape.
  struct GraphExec {
    std::vector<int64_t> key;
    size_t nodes = 0;
    // Patchable: the launch tape's op hash; else node types and kernel functions in order
    // (gpu_graph.cpp graph_shape).
    uint64_t shape = 0;
    cudaGraphExec_t exec = nullptr;
    cudaGraph_t graph = nullptr;  // the graph last applied (keeps its user objects, e.g. NCCL's, alive)
    uint64_t used = 0;
    bool patchable = false;       // every node is an op of `tape`, which holds its current parameters
    ops::cuda::LaunchTape tape;
  };
  bool graphs_ = false;  // GpuLoadOptions::graphs (gpu_model.h)
  // Steps replayed by patching nodes (GpuGraphs::kPatch; kRecord: recorded every step).
  bool patch_ = false;
  // Consecutive patch misses, and eligible steps left that skip the patch attempt (after
  // kPatchMissRun misses in a row: e.g. work that bypasses the tape in every step).
  int patch_miss_run_ = 0, patch_backoff_ = 0;
  // Steps in a row whose work bypassed the tape, eligible steps left to run eagerly, and the next
  // such pause (gpu_graph.cpp kEagerBackoff).
  int off_tape_run_ = 0, eager_backoff_ = 0, eager_backoff_len_ = 64;
  bool timed_ = false;  // this forward is decode-sized: finish_forward adds its times to gstats_
  std::chrono::steady_clock::time_point fwd_t0_;
  std::vector<GraphExec> execs_;
  uint64_t exec_clock_ = 0;
  GpuGraphStats gstats_;
};

}  // namespace flashseek::forward::gpu
