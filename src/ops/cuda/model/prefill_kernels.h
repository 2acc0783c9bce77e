// Prefill kernels. Glue kernels of the prefill layer benchmark (bench/cuda/prefill_bench.cpp): the
// routed-expert row permutation, the fused SwiGLU + FP8 quantisation feeding the down GEMMs, and
// the un-permuting combine; not used by the model (yet): the bench times them as a prefill MoE
// would. The tensor-core prefill attention, which the model's prefill chunks also run
// (launch_model_prefill_attention). Plain cudaError_t launchers (nvcc cannot compile
// core/status.h); device pointers; nothing is allocated.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {

// dst row p = src row rows[p] for p < n_rows: FP8 codes [*, k] and their FP32 scales [*, k/32]
// (the layout of gemm_fp8_quantize_cuda). k a multiple of 128. code_bytes 2: the codes are f16
// values (gemm_fp8_quantize_cuda with f16_codes), 2·k bytes per row.
cudaError_t launch_gather_fp8_rows(const uint8_t* src_q, const float* src_s, const int32_t* rows,
                                   int64_t n_rows, int64_t k, uint8_t* dst_q, float* dst_s,
                                   cudaStream_t s, int code_bytes = 1);

// h = swiglu(gu[:, :n], gu[:, n:]) · weight[row] (clamped at `limit` as the model's swiglu when
// limit > 0; weight nullptr: 1), quantised to e4m3 per 32 values with a power-of-two scale
// 2^ceil(log2(max(amax, 1e-4) / 448)) exactly as gemm_fp8_quantize_cuda: xq [rows, n], xs [rows,
// n/32]. gu [rows, 2n] FP32; n a multiple of 32.
cudaError_t launch_swiglu_quant_fp8(const float* gu, const float* weight, int64_t rows, int64_t n,
                                    float limit, uint8_t* xq, float* xs, cudaStream_t s);

// The row positions of two runs of routed pairs computed apart (a step's pairs split in two, each
// run's expert outputs in its own sorted order): out[i] = a[i] for i < na (a nullptr: i), and
// out[na + j] = b[j] + b_off for j < nb (b nullptr: j + b_off; b[j] < 0, a pair no local expert
// takes: -1). The CPU twin is merge_row_of_ref.
cudaError_t launch_merge_row_of(const int32_t* a, int64_t na, const int32_t* b, int64_t nb, int32_t b_off,
                                int32_t* out, cudaStream_t s);
inline void merge_row_of_ref(const int32_t* a, int64_t na, const int32_t* b, int64_t nb, int32_t b_off,
                             int32_t* out) {
  for (int64_t i = 0; i < na; ++i) out[i] = a ? a[i] : int32_t(i);
  for (int64_t j = 0; j < nb; ++j) out[na + j] = b ? (b[j] < 0 ? -1 : b[j] + b_off) : int32_t(j) + b_off;
}

// out[t] = ys[t] + Σ_j y[inv[t·k + j]] (ys nullptr: 0): FP32 rows of `dim` values, dim % 4 == 0.
cudaError_t launch_combine_rows(const float* y, const int32_t* inv, const float* ys, int64_t T,
                                int64_t k, int64_t dim, float* out, cudaStream_t s);

// Prefill sparse attention with sinks on the tensor cores (prefill_attn.cu): out [m, heads, dim]
// FP32, normalised, the same function as sparse_attention_pool_cuda (BF16 q / keys /
// probabilities, FP32 statistics; no valid key: 0). Each 32-key tile of a row's list gets its own
// softmax statistics and P·V, folded into the row in tile order. One block per (query, 16 or 64
// heads) folds every tile; or, for launches of up to kPrefillAttnSplitMaxRows rows given a workspace of
// prefill_attn_split_bytes (part, part_bytes), one block per (query, tile, heads)
// writes the tile's partials and a second launch folds them: the same bits, more blocks. Head
// dims 64, 128, 256 and 512, any head count (prefill_attn_supports).
struct PrefillAttnArgs {
  const float* q = nullptr;       // [m, heads, dim], RoPE applied (16-byte aligned)
  const uint16_t* kv = nullptr;   // [n_rows, dim] BF16 rows (16-byte aligned)
  const int32_t* idx = nullptr;   // [m, n_idx]; < 0 or >= n_rows: padding
  const float* sink = nullptr;    // [heads]
  float* out = nullptr;           // [m, heads, dim]
  int64_t m = 0;
  int n_idx = 0, n_rows = 0, heads = 0, dim = 0;
  float scale = 0;
  bool bf16_out = false;          // round the output to BF16 (the model's ModelAttnArgs::bf16)
  float* part = nullptr;          // split form: [m, tiles, heads, dim] tile outputs, then [m, tiles,
  size_t part_bytes = 0;          //   heads] (max, sum) pairs (16-byte aligned; part_bytes: its size)
  // With unrope_pos: the output then takes the inverse RoPE of each head's last unrope_dim values
  // at position unrope_pos[row] (launch_rope's bits, rounded to BF16 with bf16_out): in the split
  // form's fold, else by a launch_rope after the kernel.
  const int64_t* unrope_pos = nullptr;
  const float* unrope_inv_freq = nullptr;  // [unrope_dim / 2]
  int unrope_dim = 0;
  // Launches of more than 32 rows on an sm_90a device take the warpgroup (wgmma) kernel for head
  // dims 128 / 256 / 512, else the m16n8k16 one; both give the same bits. mma_sync forces the
  // latter (the tests' and `bench --kernels attn`'s comparison).
  bool mma_sync = false;
};
bool prefill_attn_supports(int64_t heads, int64_t dim);
// The most rows a launch may have to take the split form.
inline constexpr int64_t kPrefillAttnSplitMaxRows = 32;
// Bytes of the split form's partials for these sizes; 0 for empty sizes.
size_t prefill_attn_split_bytes(int64_t m, int64_t n_idx, int64_t heads, int64_t dim);
cudaError_t launch_prefill_attn(const PrefillAttnArgs& a, cudaStream_t s);

// The model's attention (launch_model_attention: window ring rows of ring_fmt, this chunk's FP32
// kv rows, compressed rows of ckv_fmt by top-k list or every visible one (V4 HCA), sink, scale,
// BF16 output when a.bf16) on the tensor cores (model_prefill_attn.cu): the same keys and the same
// softmax with sink, in another order and with q, the key values and the probabilities rounded to
// BF16 (FP32 products and sums). The compact codes times their scales are exact in BF16 (at most
// 4 + 2 significant bits), so a compact key loses nothing; FP32 rows (chunk rows, FP32 caches)
// are rounded. Several sequences: `seqs` (host array, n_seqs; rows [row0, row0 + T) of the step
// each, a.T the sum) as for launch_model_attention_seqs; a.ring / a.start / a.ring_size are
// ignored. A compressed layer (a.ckv non-null) needs a.ratio > 0 (with or without top-k lists):
// a sequence holds (start + T) / ratio compressed rows (a seq's ckv nullptr: none).
// Steps: every key row the chunk can read is decoded once into a BF16 pool in `ws` (per sequence:
// its window rows before the chunk, the chunk's rows, its compressed rows), then each query row's
// key list as pool indices (window slots, then top-k slots; absent: -1), then launch_prefill_attn.
// The staged kernel stays the model's kernel where this one does not apply
// (model_prefill_attn_supports: head dims 64 / 128 / 256 / 512, key counts within int32).
bool model_prefill_attn_supports(const ModelAttnArgs& a);
// Workspace bytes for these args (0 where they are invalid); *pool_rows (if given): the BF16 rows
// decoded, *n_idx: key slots per query row.
size_t model_prefill_attn_workspace(const ModelAttnArgs& a, const ModelAttnSeq* seqs, int64_t n_seqs,
                                    int64_t* pool_rows = nullptr, int64_t* n_idx = nullptr);
cudaError_t launch_model_prefill_attention(const ModelAttnArgs& a, const ModelAttnSeq* seqs, int64_t n_seqs, void* ws,
                                           size_t ws_bytes, cudaStream_t s);

// The same tensor-core attention for rows of any count, each row alone (decode steps, verify
// blocks, short chunks; GpuLoadOptions::decode_attention): each row's own key rows, in the slot
// order above (window slots, then its top-k list or every visible compressed row), are decoded
// into BF16 rows of its own in `ws` and the row attends to them as a prefill row does. So a row's
// bits depend on its own keys only (batch-invariant; a verify block equals its tokens decoded one
// by one) and equal the prefill path's for the same row (the same key values in the same slots;
// trailing absent slots change nothing). Rows in chunks whose key rows fit pool_bytes (at least
// one row per chunk); a chunk of up to kPrefillAttnSplitMaxRows rows whose split partials also fit
// pool_bytes takes the split form, its partials after the key rows and lists in `ws`
// (model_decode_attn_workspace counts all three).
// `seqs` / `row_seq` (device arrays, as launch_model_attention_seqs; both nullptr: one sequence
// given by a.ring, a.ckv, a.start, a.ring_size). Key slots per row: a.window, plus a.max_keys −
// a.window compressed slots on a compressed layer (a.max_keys: the launch's largest key count).
int64_t model_decode_attn_slots(const ModelAttnArgs& a);
size_t model_decode_attn_workspace(const ModelAttnArgs& a, int64_t pool_bytes);
cudaError_t launch_model_decode_attention(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                          int64_t pool_bytes, void* ws, size_t ws_bytes, cudaStream_t s);

// Indexer scores on the tensor cores (prefill_index.cu), 32 heads x 128 only:
// scores[t, s] = Σ_h w[t, h] · relu(q[t, h] · keys[s]) with q and keys rounded to BF16, FP32
// products and sums (the head sum in a different order than launch_index_scores); −inf for
// s >= (start + t + 1) / ratio. Not bitwise equal to ops::index_scores: a prefill speed path.
struct IndexScoreMmaArgs {
  const float* q = nullptr;     // [T, 32, 128]
  const float* w = nullptr;     // [T, 32]
  const float* keys = nullptr;  // [stride, 128]
  float* scores = nullptr;      // [T, stride]
  int64_t T = 0, start = 0, ratio = 1, stride = 0;
};
cudaError_t launch_index_scores_mma(const IndexScoreMmaArgs& a, cudaStream_t s);

}  // namespace flashseek::ops::cuda::detail
