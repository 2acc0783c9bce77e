// Grouped expert GEMV for MoE decode: the (token, expert) pairs of a step are grouped by expert
// so that each expert's weights are read once for all tokens routed to it. One params struct is
// shared by the CUDA launcher (ops/cuda/expert_gemv.h) and the CPU twin (expert_gemv_ref).
//
// Without `w_up`:  y[p] = xq[row(p)] · W[e(p)]ᵀ                       (e.g. w2)
// With `w_up`:     y[p] = swiglu(xq·W_gateᵀ, xq·W_upᵀ, limit) · weight[p]  (w1 ‖ w3 fused)
// where xq is the FP8 (act_block) quant-dequant of x and row(p) = pair_row[p] (or p if null).
#pragma once
#include <cstdint>

#include "ops/linear_quant.h"

namespace flashseek::ops {

struct ExpertGemvParams {
  const float* x = nullptr;            // [rows, k] FP32 inputs
  const uint8_t* w = nullptr;          // [n_experts] matrices [n, k] (gate when w_up is set)
  const uint8_t* w_scale = nullptr;
  const uint8_t* w_up = nullptr;       // nullable: same layout as w (fused SwiGLU)
  const uint8_t* w_up_scale = nullptr;
  int64_t expert_stride = 0;           // bytes between experts' codes (0: one shared matrix)
  int64_t expert_scale_stride = 0;     // bytes between experts' scales
  const int32_t* group_expert = nullptr;  // [n_groups] expert id of each group; -1: another
                                          // rank's expert (expert parallel), outputs 0
  const int32_t* group_start = nullptr;   // [n_groups + 1] pairs of group g: [start[g], start[g+1])
  const int32_t* pair_row = nullptr;      // [n_pairs] input row of each pair; null: row = pair
  const float* pair_weight = nullptr;     // [n_pairs] routing weight (gated only); null: 1
  float* y = nullptr;                     // [n_pairs, n]
  int64_t n_groups = 0, n_pairs = 0, n_experts = 0, n = 0, k = 0;
  WeightFormat format = WeightFormat::kFp4;
  int64_t w_block = 32;
  int64_t act_block = 32;
  float swiglu_limit = 0;              // <= 0: no clamp
  // Each written value rounded to BF16 (RNE) and kept in FP32 (BlockLinearParams::bf16_round_out;
  // with w_up: the SwiGLU result). Zeros of another rank's expert stay 0.
  bool bf16_round_out = false;
  // With w_up: the gate and up sums rounded to BF16 (RNE) before the SwiGLU, the rounding points
  // of separate gate and up launches with bf16_round_out (reference numerics).
  bool bf16_round_gate_up = false;
  // Groups assumed when the kernel picks its k split (0: n_groups). The split sets the summation
  // order; a caller whose results must not depend on how many groups share the launch (a model
  // step batching several sequences) passes a fixed value.
  int64_t split_groups = 0;
  // Optional (CUDA only; the CPU twin ignores them): the rows of x quantised by gemv_quantize_cuda
  // with this act_block (codes [rows, k], scales [rows, k/32]), read instead of quantising x in
  // every block on prefill-sized launches; the same bits. x must still be set.
  const uint8_t* xq = nullptr;
  const float* xs = nullptr;
  bool tiled = true;  // BlockLinearParams::tiled
  // Every expert's w / w_up in the GEMV fragment order (ops/fp4_fragments.h) instead of row-major:
  // FP4 codes and scales (n % 32 == 0, k % 64 == 0) or FP8 codes (n % 32 == 0; scales as they are).
  // The same sums, bit for bit; the CUDA launch then runs the one-pass GEMV kernels only (never
  // the tiled prefill kernel).
  bool w_packed = false;
  // With w_packed FP4, decode-sized launches (at most 8 pairs per group on average) over xq: the
  // weights streamed through a shared-memory ring of this many stages (1..8) instead of loaded
  // into registers; 0 off. The same bits (CUDA only; the twin ignores it).
  int ring_stages = 0;
};

// Host-checkable rules (index arrays live on the device and are not read here).
Status validate(const ExpertGemvParams& p);

// CPU twin (ops/cpu/moe_quant.cpp). All pointers are host pointers here; it also checks the
// index arrays (group order, expert ids, rows) and reports the first bad entry.
Status expert_gemv_ref(const ExpertGemvParams& p, int64_t x_rows);

}  // namespace flashseek::ops
