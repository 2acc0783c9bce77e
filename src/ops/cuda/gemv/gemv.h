// CUDA launchers of the block-scaled small-M linears (tensor-core GEMV, see gemv.cu). Params and
// numerics: ops/linear_quant.h and ops/moe_quant.h. All pointers are device pointers; nothing is
// allocated; work is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/linear_quant.h"
#include "ops/moe_quant.h"

namespace flashseek::ops::cuda {

// y = quant(x) · Wᵀ. Efficient for m <= 16 (weights read once); larger m loops over 16-token
// tiles inside each block, re-reading its weight tile, unless x comes pre-quantised (p.xq / p.xs:
// then tiled GEMM passes over 64-token tiles, the same bits).
Status block_linear_cuda(const BlockLinearParams& p, cudaStream_t stream);

// Row ops on a dense block_linear's FP32 output y [m, n], run in the linear's launch by its last
// CTA (no launch of their own), each exactly as its standalone kernel computes it, in this order:
// the RMS norm of each row (launch_model_rms_norm: weight norm_w or none, eps, BF16 output when
// norm_bf16), RoPE (launch_rope over n_vec vectors of vec values, the last rope_dim of each, at
// pos[row], forward rotation, BF16 output when rope_bf16; rope_dim 0: none) and the FP8
// simulation of the first q_prefix values in blocks of q_block (launch_quant_sim kFp8; 0: none).
// `ticket`: a device counter that is 0 before the launch and 0 again after it; launches that may
// run at the same time need their own. RoPE alone needs no ticket and no width limit: each CTA
// rotates the pairs of its own outputs as it stores them.
struct LinearRowOps {
  unsigned* ticket = nullptr;
  bool norm = false, norm_bf16 = false;
  const float* norm_w = nullptr;
  float eps = 0;
  const int64_t* pos = nullptr;
  const float* inv_freq = nullptr;
  int64_t n_vec = 1, vec = 0, rope_dim = 0;
  bool rope_bf16 = false;
  int64_t q_prefix = 0, q_block = 0;
};
// The most rows a launch with row ops takes (its last CTA walks them all) and the widest row.
inline constexpr int64_t kRowOpsMaxRows = 64, kRowOpsMaxDim = 8192;

// block_linear_cuda followed by `r` in the same launch: the bits of block_linear_cuda and the
// three standalone launches. p: dense (no w_up), FP32 y (not bf16_out), x not pre-quantised,
// 1 <= m <= kRowOpsMaxRows, n <= kRowOpsMaxDim (unless RoPE alone).
Status block_linear_rows_cuda(const BlockLinearParams& p, const LinearRowOps& r, cudaStream_t stream);

// x [m, k] FP32 → xq [m, k] e4m3 codes + xs [m, k/32] power-of-two scales per act_block
// (repeated over its 32-blocks): exactly the values the GEMVs quantise x to, for their optional
// xq / xs inputs (one quantisation shared by several prefill-sized launches on the same x).
// bf16_in: x rounded to BF16 first, as BlockLinearParams::bf16_in makes the GEMV do (the
// launches reading these codes then set bf16_in too). x is not modified.
// k % 32 == 0 and k % act_block == 0; x 16-byte and xq 8-byte aligned; xs holds m·k/32 floats.
Status gemv_quantize_cuda(const float* x, int64_t m, int64_t k, int64_t act_block, bool bf16_in, uint8_t* xq,
                          float* xs, cudaStream_t stream);

// Grouped expert GEMV (gate/up fused SwiGLU when p.w_up is set). Groups larger than 16 pairs are
// handled in 16-pair tiles.
Status expert_gemv_cuda(const ExpertGemvParams& p, cudaStream_t stream);

// Decode launches (at most 8 tokens per pass) stream their weights into shared memory by bulk
// copies (sm_90+) instead of each warp's own loads: the same bits. Process-wide, like the PDL
// switch (GpuLoadOptions::gemv_bulk, set before each forward of a model).
void set_gemv_bulk(bool on);

}  // namespace flashseek::ops::cuda
