// Kernels of the whole-model GPU forward (backends/cuda/gpu_*.cpp), each the GPU twin of a CPU
// reference op (ops/*.h): same inputs, same rounding points, FP32 weights (the dequantised values
// the CPU backend uses). Plain `cudaError_t` launchers (nvcc cannot compile core/status.h); the
// host orchestration wraps every call in FS_CUDA_RETURN_IF_ERROR. Nothing here allocates.
// Shapes are outermost-first; all pointers are device pointers unless stated.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cache_row_format.h"

namespace flashseek::ops::cuda::detail {

// ---- quantisation simulations (ops/quant.h), in place ----------------------------------------
enum class QuantSim { kBf16, kFp8, kFp4E8m0, kFp4E4m3 };
// x [rows, stride]: the first `qdim` elements of each row, in blocks of `block` (kBf16: per element).
cudaError_t launch_quant_sim(float* x, int64_t rows, int64_t stride, int64_t qdim, int64_t block,
                             QuantSim kind, cudaStream_t s);
// ops::rms_norm bit for bit (double sum of squares in index order); y may alias x.
cudaError_t launch_model_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                                  bool bf16, cudaStream_t s);
cudaError_t launch_hadamard(float* x, int64_t rows, int64_t dim, cudaStream_t s);  // ops::hadamard_inplace
cudaError_t launch_rms_norm_bf16_heads(float* x, int64_t rows, int64_t dim, float eps, cudaStream_t s);
// x[i] = bf16?(x[i] · scale)
cudaError_t launch_scale(float* x, int64_t n, float scale, bool bf16, cudaStream_t s);

// ---- a weight matrix as the checkpoint stores it -------------------------------------------
// The exactness kernels (linear, embed) expand each weight in registers to the FP32 value the CPU
// backend's dequantisation gives (model/quant.h: e4m3 · 2^(e-127), e2m1 · 2^(e-127), BF16/F16
// widened), which is exact in FP32, so the results are bitwise those of an FP32 copy.
enum class WeightDtype : uint8_t {
  kF32,   // float values
  kBf16,  // bfloat16 values
  kF16,   // IEEE half values
  kFp8,   // e4m3 codes [rows, cols] + E8M0 scales [ceil(rows/block_rows), ceil(cols/block_cols)]
  kFp4,   // e2m1 packed [rows, cols/2] (even column in the low nibble) + E8M0 scales [rows, cols/32]
};
struct WeightRef {
  WeightDtype dtype = WeightDtype::kF32;
  const void* data = nullptr;       // values / codes of matrix 0 (nullptr: no typed weight)
  const uint8_t* scale = nullptr;   // E8M0 scales of matrix 0 (kFp8, kFp4)
  int64_t cols = 0;                 // logical row length (the matrix's `in`)
  int64_t block_rows = 1, block_cols = 1;  // kFp8 scale blocks (kFp4: 1 x 32)
  int64_t row0 = 0;                 // first stored row used (a row slice, e.g. one wo_a group)
  int64_t matrix_bytes = 0;         // stacked matrices (LinearArgs::sel): bytes between data of matrix e and e+1
  int64_t scale_matrix_bytes = 0;   // ... and between their scales
};

// ---- linear (ops::linear on pre-quantised x): y[r] = x[r / x_row_div] · W_sel[r]ᵀ -----------
struct LinearArgs {
  const float* x = nullptr;       // rows of `in` values, row stride x_stride
  const float* w = nullptr;       // [out, in]; with sel: stacked [E, out, in]
  WeightRef wt;                   // used instead of w when w is nullptr: the stored format
  float* y = nullptr;             // rows of `out` values, row stride y_stride
  const int32_t* sel = nullptr;   // [rows] matrix of each output row (nullptr: w)
  int64_t rows = 0, in = 0, out = 0;
  int64_t x_stride = 0, y_stride = 0;  // 0: in / out
  int64_t x_row_div = 1;          // output row r reads input row r / x_row_div
  bool bf16_out = false;
  // Grouped launch (one launch for `groups` independent linears of one stacked matrix): group g
  // reads x + g·x_group, writes y + g·y_group and uses the matrix rows [g·out, (g+1)·out) (the
  // weight holds groups·out rows). Each output's sum is the ungrouped one (same bits). Not with sel.
  int64_t groups = 1, x_group = 0, y_group = 0;
  // 0 automatic (in > 1024: the tiled kernel from 32 rows without sel where it applies, for FP8
  // weights the streaming GEMV up to 8 rows without sel where it applies, else the GEMV at any
  // row count; in <= 1024: the GEMV up to 16 rows; else the former kernels), 1 the former kernels
  // (in <= 1024: 8 lanes per output; longer: one block per (row, output)), 2 GEMV (error if in >
  // 16 chunks), 3 the streaming GEMV (error where it does not apply: in <= 1024, > 8 rows, sel,
  // in not a multiple of its load width, unaligned weights, FP8 scale blocks not a power of two
  // >= its load width, x over 128 KB or the device's shared memory per block), 4 the tiled kernel
  // for many rows (error where it does not apply: in <= 1024, in > 16 chunks, sel, or its ~100 KB
  // of shared memory over the device's limit per block). Same bits for every kernel; tests and
  // the benchmark force one.
  // 5: the BF16 tensor-core linear (linear_mma.cu), automatic wherever x_bf16 is set and it
  // applies (typed BF16 or FP8 weights, no sel, in a multiple of 32 / 64, aligned): the same exact
  // products, another FP32 summation order (not the bits of kernels 1-4), the same order at any row
  // count; error where forced and it does not apply.
  int kernel = 0;
  // Every x value is a BF16 value (reference numerics: the inputs of wo_a and of the LM head), so
  // BF16 tensor-core products are exact: kernel 5 may run.
  bool x_bf16 = false;
  // Kernel 5 over more than 8 rows: 16-output tiles per CTA, 1 / 2 / 4 (0: automatic, the most that
  // still gives a CTA per SM). Same bits; tests force one.
  int mma_tiles = 0;
  // Kernel 5 over at most 8 rows (decode): 16-output tiles per CTA, 1 / 2 / 4 (0: automatic, 1
  // below 4 rows, else the most of 4, 2 that still gives a CTA per SM). Same bits;
  // GpuLoadOptions::mma_decode_tiles, tests.
  int mma_decode_tiles = 0;
};
// Sums in ops::dot_f32's order (ops/cpu/sum_order.h): in <= 1024 by 8 lanes per output, longer
// rows one warp per 1024-value chunk; each output row independent of the others (batch invariant).
// Few rows (decode): a GEMV, x staged once per block in shared memory and wide weight loads; in <=
// 1024 one thread per output holds the eight partials, longer rows are warp tasks of (outputs,
// chunk) whose chunk sums are combined per output in the same tree. Many rows (prefill, in >
// 1024): the tiled kernel, each warp's weights of a chunk decoded once into registers and applied
// to up to 64 rows staged in shared memory (4 outputs per x value), the same sums.
// A typed weight (wt) is read in its stored format, each value expanded in registers; the sums
// are the same, so y is bitwise the FP32-weight result.
cudaError_t launch_linear(const LinearArgs& a, cudaStream_t s);
// Kernel 5 (linear_mma.cu): where it applies, and its launch (cudaErrorInvalidValue where not).
bool linear_mma_applies(const LinearArgs& a);
cudaError_t launch_linear_mma(const LinearArgs& a, cudaStream_t s);

// ---- mHC (ops/mhc.h) ---------------------------------------------------------------------------
struct HcMixArgs {
  const float* x = nullptr;       // [rows, hc, dim]
  const float* fn = nullptr;      // [n_mix, hc·dim]
  const float* base = nullptr;    // [n_mix]
  const float* scale = nullptr;   // [3]
  int64_t rows = 0, hc = 4, dim = 0, sinkhorn_iters = 20;
  float norm_eps = 0, hc_eps = 0;
  bool head_only = false;         // hc_head_pre: only the hc pre mixes
  int cluster = 0;                // blocks per row, 1..16 (0: automatic; the row kernel takes at most 8,
                                  // 9..16 need a device that runs such a cluster); same bits for any
  int kernel = 0;                 // 0 automatic, 1 the row kernel, 2 the chunk-split kernel (error where
                                  // hc·dim <= 1024 or > 32 chunks); same bits
  int tiled = -1;                 // row tiles (16 rows share each fn slice): -1 from 256 rows (16 with
                                  // `work`), 0 never,
                                  // 1 / 2 / 4 always, staging 1 / 2 / 4 128-column slices per ring
                                  // stage (-1: 2); only where hc·dim > 1024, hc·dim % 4 == 0, x and fn
                                  // 16-byte aligned and hc·dim <= 64 chunks (else the row kernel); same bits
  float* pre = nullptr;           // [rows, hc]
  float* post = nullptr;          // [rows, hc]
  float* comb = nullptr;          // [rows, hc, hc]
  // Row tiles' chunk sums [rows, n_mix, chunks] (hc_mixes_work_floats; nullptr: none): with it the
  // tiles also split the chunks over CTAs (a second launch folds them; same bits) and run
  // automatically from 16 rows.
  float* work = nullptr;
};
// Floats of HcMixArgs::work for `a` (its rows, hc, dim, head_only).
int64_t hc_mixes_work_floats(const HcMixArgs& a);
// The flat sum of squares and the mix dots in the sum_order.h orders, one warp per 1024-value
// chunk; Sinkhorn by one warp (lane per comb entry, shuffles; hc > 5: one thread per entry).
// Automatic choice: hc·dim > 1024 up to 32 chunks, the chunk-split kernel (a cluster of up to 16
// blocks per row, block b the chunks b, b + 16.., a warp per mix, the chunk sums folded in rank
// 0); otherwise the row kernel (a cluster of up to 8 blocks per row; hc·dim <= 1024: one block,
// the short dot order). Row tiles (`tiled`, many rows): the mix dots by a row-tiled kernel (same
// order), then a block per row for the sum of squares, the scaling and Sinkhorn.
cudaError_t launch_hc_mixes(const HcMixArgs& a, cudaStream_t s);
// launch_hc_collapse then launch_model_rms_norm (y ← rms_norm(collapse(x, pre)) · w) in one launch,
// bit for bit, without the collapsed row in global memory: hc 4 and rows of at most 16 chunks of
// kSumChunk values (hc_collapse_norm_supported; else cudaErrorInvalidValue). y must not alias x.
bool hc_collapse_norm_supported(int64_t hc, int64_t dim);
cudaError_t launch_hc_collapse_norm(const float* x, const float* pre, const float* w, float* y, int64_t rows,
                                    int64_t hc, int64_t dim, float eps, bool bf16, cudaStream_t s);
cudaError_t launch_hc_collapse(const float* x, const float* pre, float* u, int64_t rows, int64_t hc,
                               int64_t dim, bool bf16, cudaStream_t s);
// x [rows, hc, dim] ← post ⊗ f + combᵀ x (in place safe).
cudaError_t launch_hc_post(const float* f, float* x, const float* post, const float* comb, int64_t rows,
                           int64_t hc, int64_t dim, bool bf16, cudaStream_t s);
// launch_hc_post(f, x, post, comb, mix.rows, mix.hc, mix.dim, bf16), then launch_hc_mixes(mix) of
// the updated x, as one launch with the same bits (mix.x unused); with y set, f is the MoE combine
// instead: launch_moe_combine_post(y, ys, out, rows, K, dim, combine_bf16, row_of, x, post, comb,
// 4, bf16), then the mixes. Only where hc_post_mixes_supported: hc 4, not head_only, dim a
// multiple of 1024 up to 8192, 1..n_tickets rows, f (or y, ys, out) / x / mix.fn 16-byte aligned,
// mix's post and comb other buffers than post and comb.
struct HcPostMixArgs {
  const float* f = nullptr;
  const float* y = nullptr;        // the combine's expert outputs (moe_combine_post), or nullptr
  const float* ys = nullptr;
  const int32_t* row_of = nullptr;
  int64_t K = 0;
  float* out = nullptr;            // the combined rows, stored as moe_combine_post stores them
  bool combine_bf16 = false;
  float* x = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  bool bf16 = false;
  HcMixArgs mix;
  float* work = nullptr;        // hc_post_mixes_work_floats(rows, dim) floats (8-byte aligned)
  int32_t* tickets = nullptr;   // [n_tickets], zero before the launch (and left zero by it)
};
bool hc_post_mixes_supported(const HcPostMixArgs& p, int64_t n_tickets);
int64_t hc_post_mixes_work_floats(int64_t rows, int64_t dim);
cudaError_t launch_hc_post_mixes(const HcPostMixArgs& p, int64_t n_tickets, cudaStream_t s);

// ---- embedding, Engram gate, ring write, compressor ape --------------------------------------
cudaError_t launch_embed(const float* embed, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                         int64_t dim, cudaStream_t s);
// The same from the stored table (row token of `embed`, expanded exactly; bitwise the FP32 copy's).
cudaError_t launch_embed_w(const WeightRef& embed, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                           int64_t dim, cudaStream_t s);
// ops::engram_gate for every row: x [rows, hc, dim], kv [rows, (hc+1)·dim], wqk [hc, dim].
cudaError_t launch_engram_gate(float* x, const float* kv, const float* wqk, int64_t rows, int64_t hc,
                               int64_t dim, float eps, bool bf16, cudaStream_t s);
// ring[pos[t] % ring_size] = kv[t] for t in [t0, T).
cudaError_t launch_ring_write(float* ring, const float* kv, const int64_t* pos, int64_t t0, int64_t T,
                              int64_t ring_size, int64_t dim, cudaStream_t s);
// z[t, j] += ape[(pos[t] % ratio), j]
cudaError_t launch_add_ape(float* z, const float* ape, const int64_t* pos, int64_t T, int64_t width,
                           int64_t ratio, cudaStream_t s);
// ops::softmax_pool per group: v/z are [n_groups, n_slots] device tables of row pointers (nullptr:
// empty slot); out [n_groups, dim].
cudaError_t launch_softmax_pool(const float* const* v, const float* const* z, int64_t n_groups,
                                int64_t n_slots, int64_t dim, float* out, cudaStream_t s);

// ---- MoE (ops/moe.h) ---------------------------------------------------------------------------
struct RouteArgs {
  const float* logits = nullptr;  // [T, E]
  const float* bias = nullptr;    // [E] or nullptr
  const int32_t* tid2eid = nullptr;  // [vocab, K] hash routing (with tokens) or nullptr
  const int32_t* tokens = nullptr;   // [T]
  float* scratch = nullptr;       // [T, 2E]; used only where 2E floats exceed the kernel's shared memory
  int64_t T = 0, E = 0, K = 0;
  float gate_temp = 1, route_scale = 1;
  bool sqrtsoftplus = false, norm_topk = false, renorm_eps = false;
  int32_t* sel = nullptr;         // [T, K] ascending expert ids
  float* weight = nullptr;        // [T, K]
};
cudaError_t launch_route(const RouteArgs& a, cudaStream_t s);
// h[r] = bf16?(swiglu(g[r], u[r]) · weight[r]) (weight nullptr: 1).
cudaError_t launch_swiglu(const float* g, const float* u, float* h, const float* weight, int64_t rows,
                          int64_t n, float limit, bool bf16, cudaStream_t s);
// out[t] = bf16?(Σ_k y[t, k] + ys[t]) in slot order; with row_of, pair (t, k)'s row of y is
// row_of[t·K + k] (outputs computed in expert-sorted order), else t·K + k; a negative row_of
// (another rank's expert) adds +0.
cudaError_t launch_moe_combine(const float* y, const float* ys, float* out, int64_t T, int64_t K,
                               int64_t dim, bool bf16, cudaStream_t s, const int32_t* row_of = nullptr);
// launch_moe_combine into out, then launch_hc_post(out, x, post, comb, T, hc, dim, post_bf16), in
// one launch (each combined value goes from the register that stores it to the stream update):
// the same bits. hc must be 4 (moe_combine_post_supports); rows of at most 65535 · 256 values.
bool moe_combine_post_supports(int64_t T, int64_t hc, int64_t dim);
cudaError_t launch_moe_combine_post(const float* y, const float* ys, float* out, int64_t T, int64_t K, int64_t dim,
                                    bool bf16, const int32_t* row_of, float* x, const float* post, const float* comb,
                                    int64_t hc, bool post_bf16, cudaStream_t s);
// ops::group_pairs_by_expert on the device (nothing read back to the host, so it runs under graph
// capture). A pair whose expert id is out of range (-1: another rank's expert under expert
// parallelism) joins no group and gets slot_pos -1; bad (nullable) is then set to 1. One block,
// or with `counts` (moe_group_scratch_ints(n_pairs, n_experts) ints of device scratch) a block per
// chunk of 2048 pairs when there are more: the same results.
// With `compact` (nullable) it also writes ops::compact_expert_groups's lists of the grouping:
// compact->slots groups (at least min(n_pairs, n_experts)), the experts with pairs first. It then
// runs as one block whatever `counts` (compact groups serve steps with fewer pairs than experts).
struct MoeCompactGroups {
  int32_t* start = nullptr;   // [slots + 1]
  int32_t* expert = nullptr;  // [slots]
  int64_t slots = 0;
};
int64_t moe_group_scratch_ints(int64_t n_pairs, int64_t n_experts);
cudaError_t launch_moe_group(const int32_t* sel, const float* weight, int64_t n_pairs, int64_t n_experts, int64_t k,
                             int32_t* group_start, int32_t* pair_row, float* sorted_weight, int32_t* slot_pos,
                             int32_t* bad, cudaStream_t s, int32_t* counts = nullptr,
                             const MoeCompactGroups* compact = nullptr);

// ---- attention (attention/model_attn.cu), indexer (indexer/index_kernels.cu), router (route.cu) --
// One query row t (position start + t) attends [window oldest first ‖ compressed rows] with sinks
// (ops::sparse_attention). Window key s: kv_chunk[s − start] if s >= start else ring[s % ring].
struct ModelAttnArgs {
  const float* q = nullptr;        // [T, H, Dh]
  const float* kv_chunk = nullptr; // [T, Dh]
  const void* ring = nullptr;      // [ring_size] rows of ring_fmt
  const void* ckv = nullptr;       // [n_entries] compressed rows of ckv_fmt (nullptr: window only)
  // Row formats of ring and ckv (ops/cache_row_format.h; kF32, the default: FP32 rows of Dh),
  // decoded on load.
  CacheRowFormat ring_fmt, ckv_fmt;
  const int32_t* topk = nullptr;   // [T, topk_stride] selected rows, ascending (nullptr: all)
  const int32_t* topk_n = nullptr; // [T] counts
  int64_t topk_stride = 0, ratio = 0;  // ratio > 0 without topk: every visible entry (V4 HCA)
  const float* sink = nullptr;     // [H]
  float* out = nullptr;            // [T, H, Dh]
  int64_t T = 0, H = 0, Dh = 0, window = 0, ring_size = 0, start = 0, max_keys = 0;
  float scale = 0;
  bool bf16 = false;               // BF16 probabilities and output
  // 0: the staged kernel where it can run (sm_90+, Dh <= 1024, its shared memory fits), else the
  // former one; 1: the former kernel (one block per (row, head)); 2: the staged kernel (error if it
  // cannot run). Same bits; tests and the benchmark force one. `cluster` (staged kernel): blocks
  // sharing one (row, head group), 1 / 2 / 4 / 8 (0: by the launch size).
  int kernel = 0, cluster = 0;
  // launch_model_decode_attention only (PrefillAttnArgs::unrope_pos): the inverse RoPE of each
  // head's last unrope_dim output values at unrope_pos[row], as launch_rope applies it.
  const int64_t* unrope_pos = nullptr;
  const float* unrope_inv_freq = nullptr;
  int64_t unrope_dim = 0;
};
cudaError_t launch_model_attention(const ModelAttnArgs& a, cudaStream_t s);

// Several sequences in one launch: rows [row0, row0 + T) of q / kv_chunk / out / topk / topk_n
// belong to the sequence described here (its window ring, compressed rows, first position).
struct ModelAttnSeq {
  void* ring = nullptr;          // [ring_size] rows of ModelAttnArgs::ring_fmt (written by launch_cache_pack_ring_seqs)
  const void* ckv = nullptr;     // compressed rows (ckv_fmt); nullptr: none yet (never read)
  int64_t start = 0, row0 = 0, T = 0, ring_size = 0;
};
// launch_model_attention over every row of `seqs` (device array [n_seqs]; row_seq [rows]: the
// sequence of each row): `a` gives the shared fields (q, kv_chunk, topk, topk_n and out at row 0
// of the step, H, Dh, window, topk_stride, ratio, sink, scale, bf16, max_keys = the largest
// sequence's); a.T = rows; a.ring / a.start / a.ring_size are ignored; a.ckv non-null marks a
// layer with compressed rows. Each row computes exactly what launch_model_attention computes for
// its sequence alone.
cudaError_t launch_model_attention_seqs(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        cudaStream_t s);
// ring of row_seq[t]'s sequence [pos[t] % ring_size] = kv[t] for every row among its sequence's
// last ring_size rows (launch_ring_write per sequence, in one launch).
cudaError_t launch_ring_write_seqs(const ModelAttnSeq* seqs, const int32_t* row_seq, const float* kv, const int64_t* pos,
                                   int64_t rows, int64_t dim, cudaStream_t s);

// Multiprocessors of the current device (queried once per device; 1 when the query fails).
int device_sm_count();

// One sequence of a multi-sequence index launch (IndexScoreArgs::segs, IndexTopkArgs::segs): its
// positions start .. start + T - 1 are rows row0 .. row0 + T - 1 of q / w / out / out_n, and its
// [T, start + T] region of scores / cand / block_scratch / taken begins `off` elements in.
struct IndexSeg {
  const void* keys = nullptr;  // the index keys it scores (IndexScoreArgs::keys of this sequence)
  int64_t start = 0, T = 0, row0 = 0, off = 0;
};

// ops::index_scores for every query row: clen(t) = (start + t + 1) / ratio visible keys.
struct IndexScoreArgs {
  const float* q = nullptr;        // [T, nI, dI]
  const float* w = nullptr;        // [T, nI]
  const void* keys = nullptr;      // [n] rows of key_fmt (kF32, the default: FP32 rows of dI)
  CacheRowFormat key_fmt;
  float* scores = nullptr;         // [T, stride]
  int64_t T = 0, nI = 0, dI = 0, start = 0, ratio = 1, stride = 0;
  bool bf16 = false;
  // The query rows are FP4 values (the e2m1 x E8M0 32-block quant-dequant of reference
  // numerics): with kFp4E8m0 keys of 32-blocks and dI 128, kernel 4 can run.
  bool q_fp4 = false;
  // Kernel 4's workspace (index_scores_work_bytes; 16-byte aligned); nullptr: kernel 4 cannot run.
  void* work = nullptr;
  size_t work_bytes = 0;
  // 0: automatic (4 where it can run, else 2 or 3 by tiles x rows); 1: one thread per key; 2 / 3:
  // key tiles in shared memory, 1 / 2 keys per thread (dI > 1024 or a tile over the shared-memory
  // limit: kernel 1); 4: integer tensor cores over the FP4 codes (q_fp4, FP4 keys, dI 128,
  // nI <= 64, a workspace). Kernels 1-3 give the same bits; kernel 4 gives them too whenever the
  // CPU's FP32 dot is exact (block scales of a dot within ~2^9 of each other, nothing subnormal),
  // else it may differ within the reordering bound of the dot (docs/cuda.md, "Indexer scores").
  // Tests and the benchmarks force one.
  int kernel = 0;
  // Several sequences in one launch (kernel 4 only: error otherwise): device array [n_segs]; q / w
  // hold all T rows, `keys` / `start` are ignored, stride = the longest sequence's start + T,
  // seg_rows = the most rows of one sequence (0: T). Each row gets exactly the scores of a launch
  // for its sequence alone.
  const IndexSeg* segs = nullptr;
  int64_t n_segs = 0, seg_rows = 0;
};
// Workspace kernel 4 needs for `a` (0 when it cannot run a).
size_t index_scores_work_bytes(const IndexScoreArgs& a);
cudaError_t launch_index_scores(const IndexScoreArgs& a, cudaStream_t s);

// Per query row: mode 1 publishes the candidate mask (ops::candidate_mask), mode 2 filters the
// scores by it, then top-k (ops::topk_indices: finite scores, lower index at ties, ascending).
// Radix select on the score bits (any candidate count up to the stride): one block per row, or
// (k <= 2048, rows of 8192+ keys, stride > 2056 + 2 * blocks in mode 1) a histogram and
// partition over blocks of key chunks and one block per row for the candidates of the threshold
// bin (mode 1: the same for the candidate blocks first); block_scratch is its workspace then.
// Or (sm_90+, rows of up to 16 x 32768 keys) one thread-block cluster per row, one launch
// (indexer/topk.cu; mode 1 runs the candidate-block launches above first).
struct IndexTopkArgs {
  float* scores = nullptr;         // [T, stride] (mode 2 sets the masked-out entries to -inf)
  uint8_t* cand = nullptr;         // [T, stride]
  float* block_scratch = nullptr;  // [T, stride] mode 1: block maxima
  uint8_t* taken = nullptr;        // [T, stride] mode 1: kept-block flags
  int32_t* out = nullptr;          // [T, k]
  int32_t* out_n = nullptr;        // [T]
  int64_t T = 0, start = 0, ratio = 1, stride = 0, k = 0, cand_block = 1, cand_top = 0;
  int mode = 0;
  // 0: by row length and count (fewer than 512 rows of 8192+ keys: 3 where it can run, else 2;
  // otherwise one block per row); 1: one block per row;
  // 2: over blocks; 3: one cluster per row (2 and 3: error if the args do not allow it).
  int path = 0;
  int cluster = 0;  // path 3: blocks per cluster, 8 or 16 (0: 16 while all rows fit at once, else 8)
  // Several sequences in one launch (path 0 or 1: one block per row; index_topk_segs_applies):
  // device array [n_segs] and the sequence of each of the T rows (row_seg [T]); out / out_n hold
  // all T rows, `start` is ignored, stride = the longest sequence's start + T. Each row gets
  // exactly the lists of a launch for its sequence alone.
  const IndexSeg* segs = nullptr;
  const int32_t* row_seg = nullptr;
  int64_t n_segs = 0;
};
// Whether path 0 runs a single sequence of up to max_len positions by one block per row (so a
// multi-sequence launch of such sequences keeps each one's kernel).
bool index_topk_segs_applies(int64_t max_len, int64_t ratio);
// The cluster size path 3 would use for `a` (0: path 3 cannot run these args on this device).
int index_topk_cluster_size(const IndexTopkArgs& a);
cudaError_t launch_index_topk(const IndexTopkArgs& a, cudaStream_t s);

}  // namespace flashseek::ops::cuda::detail
