// Block-scaled low-precision linears as the GPU runs them, with one params struct shared by the
// CUDA launcher (ops/cuda/block_linear.h) and its CPU twin (block_linear_ref), so that the two can
// be compared on identical inputs.
//
// Numerics (reference mode, v41 §1.4): the FP32 input is FP8-E4M3 quantised per `act_block`
// contiguous elements with a power-of-two (UE8M0) scale, the weight is dequantised with its E8M0
// block scales, products are accumulated in FP32. FP4 (MXFP4) weights are e2m1 nibbles with one
// E8M0 scale per 32 inputs of a row.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace flashseek::ops {

enum class WeightFormat : uint8_t {
  kFp8,  // e4m3 codes [n, k] + e8m0 scales [ceil(n/w_block), k/w_block]
  kFp4,  // packed e2m1 [n, k/2] (low nibble = even k) + e8m0 scales [n, k/32]
};

struct BlockLinearParams {
  const float* x = nullptr;        // [m, k] FP32 activations
  const uint8_t* w = nullptr;      // weight codes, see WeightFormat
  const uint8_t* w_scale = nullptr;
  void* y = nullptr;               // [m, n] float, or BF16 bits (uint16_t) when bf16_out
  int64_t m = 0, n = 0, k = 0;
  WeightFormat format = WeightFormat::kFp8;
  int64_t w_block = 32;            // FP8 scale block edge: 32 (V4.1) or 128 (V4); FP4 ignores it
  int64_t act_block = 32;          // activation quant block: 32 (V4.1) or 128 (V4)
  bool bf16_out = false;
  // x rounded to BF16 (RNE, core/numeric.h round_bf16) before the FP8 quantisation: the result of
  // rounding x in place first (quant_sim kBf16), without touching x.
  bool bf16_in = false;
  // y stays FP32, each value rounded to BF16 (RNE) and widened back: the result of a kBf16
  // quant_sim on the FP32 output, without a second pass. Not with bf16_out.
  bool bf16_round_out = false;
  // Optional (CUDA only; the CPU twin ignores them): x already quantised by gemv_quantize_cuda
  // with this act_block and this bf16_in (codes [m, k], scales [m, k/32]). Prefill-sized launches
  // then read these instead of quantising x in every block; y is the same bits. x must still be
  // set (launches small enough to quantise inside read it, rounding it by bf16_in).
  const uint8_t* xq = nullptr;
  const float* xs = nullptr;
  // With xq (CUDA only): the launch may take the tiled kernel (64-row x 128-token CTA tiles over
  // the whole of k, built for prefill chunks); false: the decode GEMV's token passes over each
  // weight tile (k split across warps and clusters), reading xq. The same bits either way.
  bool tiled = true;
  // Optional: the up matrix of a gated FFN (w is then the gate; same format, shape and scale
  // layout). y = silu(min(g, L)) · clamp(u, ±L) with g = quant(x) · Wᵀ, u = quant(x) · W_upᵀ and
  // L = swiglu_limit (<= 0: no clamp), the model's swiglu; with bf16_round_gate_up g and u are
  // first rounded to BF16 (RNE), as two linears with bf16_round_out would give them. bf16_out /
  // bf16_round_out apply to the SwiGLU result. Each sum keeps the order of the one-matrix launch.
  // Optional: two matrices stacked in one [n, k] launch (CUDA only; the CPU twin writes the same
  // rows the same way): rows [0, n - n2) go to y as an [m, n - n2] output, rows [n - n2, n) to y2
  // as an [m, n2] one (same element type). Used for wq_a + wkv, which read the same input: one
  // launch streams both matrices with one grid shape. n2 == 0 (y2 null): every row to y. CUDA:
  // FP8, no w_up, no xq, m <= kStackedLinearMaxRows (the decode GEMV's one-pass kernels).
  void* y2 = nullptr;
  int64_t n2 = 0;
  // Optional (CUDA only): the row count that picks the k split and chunking (ops/cuda/gemv.cu
  // pick_tuning) instead of n, so that a matrix launched alone sums its rows in the order of the
  // stacked launch it is part of (the same bits either way). 0: n.
  int64_t tune_n = 0;
  const uint8_t* w_up = nullptr;
  const uint8_t* w_up_scale = nullptr;
  float swiglu_limit = 0;
  bool bf16_round_gate_up = false;
  // w (and w_up) in the GEMV fragment order (ops/fp4_fragments.h): FP8 codes with n % 32 == 0
  // (scales as they are), or FP4 codes and scales with n % 32 == 0 and k % 64 == 0. The same
  // sums, bit for bit; the CUDA launch runs the one-pass GEMV kernels only (not the tiled kernel,
  // not the stacked y2 launch).
  bool w_packed = false;
};

// The most token rows of a stacked CUDA launch (BlockLinearParams::y2): the GEMV's one 8-token
// pass, the only kernels that carry the split store.
inline constexpr int64_t kStackedLinearMaxRows = 8;

// Shape rules shared by both backends: k a multiple of 32, of act_block and (FP8) of w_block;
// act_block in {32, 128}; w_block in {32, 128}; non-null pointers.
Status validate(const BlockLinearParams& p);

// Bytes of the weight codes and of the scales for one [n, k] matrix of the given format.
int64_t weight_code_bytes(WeightFormat f, int64_t n, int64_t k);
int64_t weight_scale_bytes(WeightFormat f, int64_t n, int64_t k, int64_t w_block);

// An FP4 matrix [n, k] between the row-major layout and the decode GEMV's fragment order
// (ops/fp4_fragments.h; n % 32 == 0, k % 64 == 0): codes n·k/2 bytes and scales n·k/32 bytes each
// way, `out` not overlapping `in`. (ops/fp4_fragments.cpp)
Status pack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                          uint8_t* out_scales);
Status unpack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                            uint8_t* out_scales);
// The same for FP8 codes [n, k] (n % 32 == 0; ops/fp4_fragments.h); the scales keep their layout.
// check_fp8_fragment_args: the checks every FP8 pack / unpack makes (both set, the shape rule, the
// output apart from the input), named after `op`; the device versions share it.
Status check_fp8_fragment_args(const char* op, const uint8_t* codes, int64_t n, int64_t k, const uint8_t* out);
Status pack_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes);
Status unpack_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes);
// The CPU twins' view of a matrix in the fragment order: its row-major codes (and FP4 scales) in
// `codes` / `scales`, `w` / `ws` set to them (FP8 scales keep their layout: `ws` stays).
Status unpack_weight_fragments(WeightFormat f, int64_t n, int64_t k, std::vector<uint8_t>& codes,
                               std::vector<uint8_t>& scales, const uint8_t*& w, const uint8_t*& ws);

// CPU twin (ops/cpu/linear_quant.cpp): dequantise, (round x to BF16,) quantise x, FP32 dot per
// output (, rounded to BF16).
Status block_linear_ref(const BlockLinearParams& p);

}  // namespace flashseek::ops
