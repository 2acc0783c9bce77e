// Glue kernels of the prefill layer benchmark (bench/cuda/prefill_bench.cpp): the routed-expert row
// permutation, the fused SwiGLU + FP8 quantisation feeding the down GEMMs, and the un-permuting
// combine. Plain cudaError_t launchers (nvcc cannot compile core/status.h); device pointers;
// nothing is allocated. Not used by the model (yet): the bench times them as a prefill MoE would.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashseek::ops::cuda::detail {

// dst row p = src row rows[p] for p < n_rows: FP8 codes [*, k] and their FP32 scales [*, k/32]
// (the layout of gemm_fp8_quantize_cuda). k a multiple of 128.
cudaError_t launch_gather_fp8_rows(const uint8_t* src_q, const float* src_s, const int32_t* rows,
                                   int64_t n_rows, int64_t k, uint8_t* dst_q, float* dst_s,
                                   cudaStream_t s);

// h = swiglu(gu[:, :n], gu[:, n:]) · weight[row] (clamped at `limit` as the model's swiglu when
// limit > 0; weight nullptr: 1), quantised to e4m3 per 32 values with a power-of-two scale
// 2^ceil(log2(max(amax, 1e-4) / 448)) exactly as gemm_fp8_quantize_cuda: xq [rows, n], xs [rows,
// n/32]. gu [rows, 2n] FP32; n a multiple of 32.
cudaError_t launch_swiglu_quant_fp8(const float* gu, const float* weight, int64_t rows, int64_t n,
                                    float limit, uint8_t* xq, float* xs, cudaStream_t s);

// out[t] = ys[t] + Σ_j y[inv[t·k + j]] (ys nullptr: 0): FP32 rows of `dim` values, dim % 4 == 0.
cudaError_t launch_combine_rows(const float* y, const int32_t* inv, const float* ys, int64_t T,
                                int64_t k, int64_t dim, float* out, cudaStream_t s);

// Prefill sparse attention with sinks (prefill_attn.cu), only 64 heads x 512: out [m, 64, 512]
// FP32, normalised, the same function as sparse_attention_pool_cuda (BF16 q / keys /
// probabilities, FP32 statistics; no valid key: 0), one block per query, no split workspace.
struct PrefillAttnArgs {
  const float* q = nullptr;       // [m, heads, dim], RoPE applied
  const uint16_t* kv = nullptr;   // [n_rows, dim] BF16 rows (16-byte aligned)
  const int32_t* idx = nullptr;   // [m, n_idx]; < 0 or >= n_rows: padding
  const float* sink = nullptr;    // [heads]
  float* out = nullptr;           // [m, heads, dim]
  int64_t m = 0;
  int n_idx = 0, n_rows = 0, heads = 0, dim = 0;
  float scale = 0;
};
cudaError_t launch_prefill_attn(const PrefillAttnArgs& a, cudaStream_t s);

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
