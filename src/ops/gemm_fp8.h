// Large-M FP8 block-scaled GEMM (prefill linears): params shared by the CUDA launcher
// (ops/cuda/gemm_fp8.h, wgmma on sm_90a) and its CPU twin (gemm_fp8_ref, ops/cpu/gemm_fp8.cpp).
//
//   Y[m, n] = fq8(X)[m, k] · dq(W)[n, k]ᵀ
//
// Numerics are those of block_linear_ref (ops/linear_quant.h, v41 §1.4): X (FP32 or BF16) is
// quantised to e4m3 per `act_block` contiguous inputs with a power-of-two (UE8M0) scale; W holds
// e4m3 codes with one E8M0 scale per w_block × w_block block; products are summed in FP32.
// The activation may instead come pre-quantised (xq codes + one FP32 scale per 32 inputs, the
// layout gemm_fp8_quantize_cuda writes), so that one quantisation serves several GEMMs.
#pragma once
#include <cstdint>

#include "core/status.h"
#include "ops/linear_quant.h"

namespace flashseek::ops {

enum class ActDtype : uint8_t { kF32, kBf16 };

struct GemmFp8Params {
  // Activations, one of:
  const void* x = nullptr;  // [m, k] FP32 or BF16 bits (x_dtype), quantised by the op
  ActDtype x_dtype = ActDtype::kF32;
  const uint8_t* xq = nullptr;  // [m, k] e4m3 codes, pre-quantised (x == nullptr)
  const float* xs = nullptr;    // [m, k/32] power-of-two scale per 32 inputs (per act_block,
                                //   repeated over its 32-blocks when act_block = 128)
  // Weights: e4m3 codes [n, k] + E8M0 scales [ceil(n/w_block), k/w_block].
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  void* y = nullptr;  // [m, n] FP32, or BF16 bits when bf16_out
  bool bf16_out = false;
  bool bf16_round_out = false;  // FP32 y holding each output rounded to BF16 (not with bf16_out)
  // xq holds [m, k] f16 values (2 bytes each: the e4m3 codes' values, exact;
  // gemm_fp8_quantize_cuda with f16_codes), and the CUDA kernel forms each 32-block's sum with f16
  // tensor-core steps (FP32 accumulation), W expanded from e4m3 to f16 in shared memory: the same
  // function, block sums at FP32 precision (GemmFp8GroupedParams::x_f16). Pre-quantised x only;
  // kernel 6's schedule whatever `kernel` says.
  bool x_f16 = false;
  // xq holds [m, k] BF16 values, the activations themselves (the dequantised e4m3 code · scale,
  // exact in BF16: gemm_fp8_quantize_cuda with bf16_values; or BF16-valued activations that are
  // not FP8-quantised, gemm_bf16_pack_cuda); xs is not read. The CUDA kernel expands W to BF16
  // with its block scale folded in (exact: e4m3 and e2m1 values times a power of two are BF16
  // values), sums each 32-block's exact products on the BF16 tensor cores and adds the block sums
  // in FP32 (no scale work): the same function, the products summed in another FP32 order, at
  // the x_f16 mode's precision.
  bool x_bf16 = false;
  // x_bf16 only: w holds [n, k] BF16 bits (a matrix the checkpoint stores in BF16, e.g. the
  // compressor's and the indexer's projections in reference numerics), w_scale is not read: the
  // exact BF16 products summed in FP32 as above. The CUDA kernel loads W as it is (no expansion).
  bool w_bf16 = false;
  // x_bf16 only: the tensor core accumulates the whole of k (each 16-deep BF16 step adds into the
  // FP32 accumulator) instead of each 32-block's sum being added in FP32 by the threads: the same
  // exact products summed in the tensor core's order, without the per-block FP32 additions that
  // hold back the next block's steps. Rows stay independent of m (no split over k), so a row's
  // bits do not depend on the other rows of the launch. The twin's numbers are unchanged.
  bool bf16_direct = false;
  // x_f16 / x_bf16 only: row strides of xq (x_f16: its scales x_stride / 32) and y in elements; 0:
  // k and n. A column slice of a wider matrix (the groups of a grouped linear), x_stride a
  // multiple of 128.
  int64_t x_stride = 0, y_stride = 0;
  int64_t m = 0, n = 0, k = 0;
  int64_t w_block = 32;    // 32 (V4.1) or 128 (V4)
  int64_t act_block = 32;  // 32 (V4.1) or 128 (V4)
  // CUDA kernel choice: 0 = default; 1 / 2 = 128×128 tile (2 warpgroups) / 192×128 (3) with
  // unswizzled shared-memory tiles; 3 / 4 = the same with 128-byte swizzled tiles; 5 = as 1 with
  // padded row groups; 6..9 = TMA producer warp + 2 consumer warpgroups, 128×128 tile (see
  // ops/cuda/gemm_fp8.h).
  int kernel = 0;
  // CUDA only, when x is given: scratch for the quantised activations, at least
  // gemm_fp8_workspace_bytes(m, k) bytes, 16-byte aligned.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Bytes of the quantised activations: codes [m, k] then scales [m, k/32] FP32 (16-byte aligned).
inline int64_t gemm_fp8_workspace_bytes(int64_t m, int64_t k) {
  const int64_t codes = (m * k + 15) / 16 * 16;
  return codes + m * (k / 32) * 4;
}

// Shape rules of both backends: k a positive multiple of 128 (the GEMM's k stage), w_block and
// act_block in {32, 128}, m >= 1, n >= 1, exactly one activation source, non-null pointers.
inline Status validate(const GemmFp8Params& p) {
  if (!p.w || (!p.w_scale && !p.w_bf16) || !p.y)
    return invalid_argument("gemm_fp8: w, w_scale (but with w_bf16) and y must be set");
  if (p.w_bf16 && !p.x_bf16) return invalid_argument("gemm_fp8: w_bf16 needs the x_bf16 mode");
  if (bool(p.x) == bool(p.xq))
    return invalid_argument("gemm_fp8: give either x or the pre-quantised xq/xs, not {}",
                            p.x ? "both" : "neither");
  if (p.xq && !p.xs && !p.x_bf16) return invalid_argument("gemm_fp8: xq needs its scales xs");
  if (p.x_f16 && !p.xq) return invalid_argument("gemm_fp8: x_f16 needs the pre-quantised xq (f16 codes)");
  if (p.x_bf16 && !p.xq) return invalid_argument("gemm_fp8: x_bf16 needs xq (BF16 values)");
  if (p.x_bf16 && p.x_f16) return invalid_argument("gemm_fp8: x_f16 and x_bf16 exclude each other");
  if (p.bf16_direct && !p.x_bf16) return invalid_argument("gemm_fp8: bf16_direct needs the x_bf16 mode");
  if (p.bf16_out && p.bf16_round_out)
    return invalid_argument("gemm_fp8: bf16_out and bf16_round_out exclude each other");
  if ((p.x_stride != 0 || p.y_stride != 0) && !p.x_f16 && !p.x_bf16)
    return invalid_argument("gemm_fp8: row strides need the x_f16 or x_bf16 mode");
  if (p.x_stride != 0 && (p.x_stride < p.k || p.x_stride % 128 != 0))
    return invalid_argument("gemm_fp8: x_stride={} must be >= k={} and a multiple of 128", p.x_stride, p.k);
  if (p.y_stride != 0 && (p.y_stride < p.n || p.y_stride >= (int64_t(1) << 30)))
    return invalid_argument("gemm_fp8: y_stride={} must be >= n={}", p.y_stride, p.n);
  if (p.x_stride >= (int64_t(1) << 30)) return out_of_range("gemm_fp8: x_stride={} too large", p.x_stride);
  if (p.m <= 0 || p.n <= 0)
    return invalid_argument("gemm_fp8: m={} and n={} must be positive", p.m, p.n);
  if (p.k <= 0 || p.k % 128 != 0)
    return invalid_argument("gemm_fp8: k={} must be a positive multiple of 128", p.k);
  if (p.w_block != 32 && p.w_block != 128)
    return invalid_argument("gemm_fp8: w_block={} must be 32 or 128", p.w_block);
  if (p.act_block != 32 && p.act_block != 128)
    return invalid_argument("gemm_fp8: act_block={} must be 32 or 128", p.act_block);
  if (p.kernel < 0 || p.kernel > 9)
    return invalid_argument("gemm_fp8: kernel={} must be in 0..9", p.kernel);
  if (p.m >= (int64_t(1) << 31) / 128 || p.n >= (int64_t(1) << 30) || p.k >= (int64_t(1) << 30))
    return out_of_range("gemm_fp8: m={}, n={} or k={} too large", p.m, p.n, p.k);
  return {};
}

// CPU twin: quantise x exactly like the GPU (or dequantise xq·xs), dequantise W, FP32 dots.
Status gemm_fp8_ref(const GemmFp8Params& p);

// x [m, k] (k a multiple of 32) → f16 codes [m, k] (bits) and one power-of-two scale per 32
// values, s = 2^(ceil(log2(amax)) - 15) (amax floored at 2^-100; 1 for an all-zero block), code =
// f16_rn(x / s): the input of the x_f16 GEMM for activations that are not FP8-quantised (BF16
// values, e.g. wo_a's). A BF16 value of at least 2^-30 of its block's amax is exact (code · s ==
// x: its last bit is at least 2^-24 · s, the f16 subnormal step); smaller ones are off by at most
// 2^-25 · s. CPU twin of gemm_f16_quantize_cuda.
void quantize_f16_blocks_ref(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs);

// Grouped FP8 GEMM (the routed experts of a prefill chunk in one launch): `groups` problems that
// share n, k and w_block. The activations come pre-quantised and stacked by group: group g owns
// rows [row_start[g], row_start[g+1]) of xq / xs / y (row_start[0] = 0, non-decreasing,
// row_start[groups] = rows; empty groups allowed) and the weights w + g·n·k (codes [n, k]) with
// scales w_scale + g·ceil(n/w_block)·(k/w_block):
//   Y[rows of g] = (xq·xs)[rows of g] · dq(W_g)ᵀ
// Same numbers per group as gemm_fp8 on that group's rows. row_start: a device array for the
// CUDA op (the launch needs no host knowledge of the group sizes), a host array for the twin.
//
// w_format kFp4 (MXFP4 routed experts as the checkpoint stores them): w holds e2m1 codes
// [groups, n, k/2] (two per byte, low nibble = even k) and w_scale one E8M0 scale per row and
// 32-block [groups, n, k/32] (w_block must be 32). Every e2m1 value is exact in e4m3, so the
// numbers are those of the kFp8 GEMM on the e4m3 copy of the codes with the scale taken per
// (row, 32-block) instead of per 32 × 32 tile: Y = Σ_kb (Xq·Wq)_kb · xs[m, kb] · ws[n, kb]; where
// the 32 rows of every tile share their scales the two formats give identical bits.
struct GemmFp8GroupedParams {
  const uint8_t* xq = nullptr;  // [rows, k] e4m3
  const float* xs = nullptr;    // [rows, k/32]
  const uint8_t* w = nullptr;   // kFp8: [groups, n, k] e4m3; kFp4: [groups, n, k/2] e2m1 pairs
  const uint8_t* w_scale = nullptr;  // kFp8: [groups, ceil(n/w_block), k/w_block] e8m0;
                                     // kFp4: [groups, n, k/32] e8m0
  const int32_t* row_start = nullptr;  // [groups + 1]
  void* y = nullptr;            // [rows, n] FP32, or BF16 bits when bf16_out
  bool bf16_out = false;
  bool bf16_round_out = false;  // FP32 y holding each output rounded to BF16 (not with bf16_out)
  int64_t groups = 0, rows = 0, n = 0, k = 0;
  int64_t w_block = 32;
  WeightFormat w_format = WeightFormat::kFp8;  // kFp8 or kFp4
  // xq holds [rows, k] f16 values (2 bytes each: the e4m3 codes' values, exact;
  // gemm_fp8_quantize_cuda with f16_codes), and the CUDA kernel forms each 32-block's sum with
  // f16 tensor-core steps (FP32 accumulation) instead of the e4m3 one, whose 32-product sums keep
  // only ~14 bits below the block's largest product (up to 2^-8 · Σ|x·w|): the same function,
  // block sums at FP32 precision. The twin reads the f16 values; its numbers are unchanged. W
  // (kFp8 or kFp4) is expanded to f16 in shared memory.
  bool x_f16 = false;
  // xq holds [rows, k] BF16 values (GemmFp8Params::x_bf16; xs is not read): W (kFp8 or kFp4)
  // expanded to BF16 with its scales folded in, 32-block sums of the exact products added in FP32.
  bool x_bf16 = false;
  // x_bf16 only: w holds [groups, n, k] BF16 bits (w_format and w_scale are not read; e.g. the
  // experts expanded once by gemm_expand_bf16), loaded as they are: the x_bf16 mode's numbers
  // without the per-tile expansion.
  bool w_bf16 = false;
  // x_bf16 only: the whole of k accumulated on the tensor core (GemmFp8Params::bf16_direct).
  bool bf16_direct = false;
  // kFp4 with bf16_direct: the CUDA kernel computes Yᵀ = W · Xᵀ, expanding W into the tensor
  // core's register operand instead of shared memory (the same values and sums; the twin ignores it).
  bool w_in_registers = false;
  // kFp4 in the x_f16 / x_bf16 modes: w and w_scale in the GEMV fragment order
  // (ops/fp4_fragments.h; n % 128 == 0 here: whole 128-row tiles): the same values, so the same
  // outputs. The CUDA kernel copies each stage's four 1,024-byte units and puts them back in row
  // order in shared memory.
  bool w_fragments = false;
};

inline Status validate(const GemmFp8GroupedParams& p) {
  if (!p.xq || (!p.xs && !p.x_bf16) || !p.w || (!p.w_scale && !p.w_bf16) || !p.row_start || !p.y)
    return invalid_argument(
        "gemm_fp8_grouped: xq, xs (but with x_bf16), w, w_scale (but with w_bf16), row_start and y must be set");
  if (p.x_bf16 && p.x_f16) return invalid_argument("gemm_fp8_grouped: x_f16 and x_bf16 exclude each other");
  if (p.w_bf16 && !p.x_bf16) return invalid_argument("gemm_fp8_grouped: w_bf16 needs the x_bf16 mode");
  if (p.bf16_direct && !p.x_bf16) return invalid_argument("gemm_fp8_grouped: bf16_direct needs the x_bf16 mode");
  if (p.groups <= 0 || p.groups > 1024)
    return invalid_argument("gemm_fp8_grouped: groups={} must be in 1..1024", p.groups);
  if (p.rows < 0 || p.n <= 0) return invalid_argument("gemm_fp8_grouped: rows={}, n={}", p.rows, p.n);
  if (p.k <= 0 || p.k % 128 != 0)
    return invalid_argument("gemm_fp8_grouped: k={} must be a positive multiple of 128", p.k);
  if (p.w_block != 32 && p.w_block != 128)
    return invalid_argument("gemm_fp8_grouped: w_block={} must be 32 or 128", p.w_block);
  if (p.w_format != WeightFormat::kFp8 && p.w_format != WeightFormat::kFp4)
    return invalid_argument("gemm_fp8_grouped: the weight format must be kFp8 or kFp4");
  if (p.w_fragments && (p.w_format != WeightFormat::kFp4 || p.w_bf16 || !(p.x_f16 || p.x_bf16) || p.n % 128 != 0))
    return invalid_argument("gemm_fp8_grouped: w_fragments (the FP4 fragment order) needs FP4 weights in the x_f16 or "
                            "x_bf16 mode and n={} a multiple of 128", p.n);
  if (p.bf16_out && p.bf16_round_out)
    return invalid_argument("gemm_fp8_grouped: bf16_out and bf16_round_out exclude each other");
  if (p.w_format == WeightFormat::kFp4 && p.w_block != 32)
    return invalid_argument("gemm_fp8_grouped: FP4 weights have one scale per 1 x 32 block (w_block={})",
                            p.w_block);
  if (p.rows >= (int64_t(1) << 31) / 128 || p.n * p.groups >= (int64_t(1) << 30) || p.k >= (int64_t(1) << 30))
    return out_of_range("gemm_fp8_grouped: rows={}, groups·n={} or k={} too large", p.rows, p.n * p.groups, p.k);
  return {};
}

// CPU twin: gemm_fp8_ref per non-empty group (row_start on the host, checked).
Status gemm_fp8_grouped_ref(const GemmFp8GroupedParams& p);

// Stored weights → their BF16 values, code · scale, once per GEMM (the x_bf16 GEMM with w_bf16
// then reads W as it is instead of expanding every W tile again for each 128-row m-tile):
//   kFp8: w [count, n, k] e4m3 with w_scale [count, ceil(n/w_block), k/w_block] E8M0 tile scales;
//   kFp4: w [count, n, k/2] e2m1 (low nibble = even k) with w_scale [count, n, k/32] (w_block 32).
// y [count, n, k] BF16 bits. Exact (a value of at most 4 significant bits times a power of two)
// wherever the product is a normal BF16 value; the CUDA op rounds the rest as one BF16 multiply
// would, the twin as f32_to_bf16 of the FP32 product: the same bits for every finite input the
// checkpoints hold (the e4m3 NaN codes 0x7f / 0xff excluded). row_start (optional, [count + 1]; a
// device array for the CUDA op, a host array for the twin): matrix e is skipped (its y left as it
// is) when row_start[e + 1] <= row_start[e], i.e. the experts no row of the step reaches.
struct GemmExpandBf16Params {
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  uint16_t* y = nullptr;
  int64_t count = 1, n = 0, k = 0;
  int64_t w_block = 128;
  WeightFormat w_format = WeightFormat::kFp8;
  const int32_t* row_start = nullptr;
  // kFp4: w and w_scale in the GEMV fragment order (ops/fp4_fragments.h; n % 32 == 0, k % 64 == 0):
  // the same values out.
  bool w_fragments = false;
};

inline Status validate(const GemmExpandBf16Params& p) {
  if (!p.w || !p.w_scale || !p.y) return invalid_argument("gemm_expand_bf16: w, w_scale and y must be set");
  if (p.count <= 0 || p.n <= 0 || p.k <= 0 || p.k % 32 != 0)
    return invalid_argument("gemm_expand_bf16: count={} and n={} must be positive, k={} a positive multiple of 32",
                            p.count, p.n, p.k);
  if (p.w_format != WeightFormat::kFp8 && p.w_format != WeightFormat::kFp4)
    return invalid_argument("gemm_expand_bf16: the weight format must be kFp8 or kFp4");
  if (p.w_format == WeightFormat::kFp4 && p.w_block != 32)
    return invalid_argument("gemm_expand_bf16: FP4 weights have one scale per 1 x 32 block (w_block={})", p.w_block);
  if (p.w_fragments && (p.w_format != WeightFormat::kFp4 || p.n % 32 != 0 || p.k % 64 != 0))
    return invalid_argument("gemm_expand_bf16: w_fragments (the FP4 fragment order) needs FP4 weights, n={} a multiple "
                            "of 32 and k={} of 64", p.n, p.k);
  if (p.w_format == WeightFormat::kFp8 && ((p.w_block != 32 && p.w_block != 128) || p.k % p.w_block != 0))
    return invalid_argument("gemm_expand_bf16: w_block={} must be 32 or 128 and divide k={}", p.w_block, p.k);
  if (p.count > (int64_t(1) << 20) || p.n >= (int64_t(1) << 30) || p.k >= (int64_t(1) << 30) ||
      p.count * p.n > (int64_t(1) << 40) / p.k)
    return out_of_range("gemm_expand_bf16: count={}, n={}, k={} too large", p.count, p.n, p.k);
  return {};
}

// CPU twin of gemm_expand_bf16_cuda: f32_to_bf16(value · scale) per weight.
Status gemm_expand_bf16_ref(const GemmExpandBf16Params& p);

// The reference's FP4 → FP8 re-pack of an MXFP4 matrix (spec model-v4.md, "FP4 experts"), the
// form in which the routed experts can run on the e4m3 tensor cores with one scale per 128 x 128
// block: per block (rows r0 .. r0 + 127, k k0 .. k0 + 127) the scale exponent E = the largest of
// the block's 32-group scale exponents − 6 (at least 0), and each value e2m1 · 2^(s − E) as an e4m3
// code (at most 6 · 2^6 = 384 < 448), so that code · 2^(E − 127) is the stored value.
//   w4 [n, k / 2] e2m1 (low nibble = even k), s32 [n, k / 32] E8M0; k a multiple of 128.
//   w8 [n, k] e4m3, s128 [ceil(n / 128), k / 128] E8M0.
// Returns the number of values e4m3 cannot hold exactly (they fall between or below its subnormal
// steps when a group's scale lies more than 2^14 or so below its block's largest; NaN scales,
// 0xFF, count for their 32 values, which are written as NaN): 0 means code · block scale equals
// every stored value.
Result<int64_t> repack_fp4_to_fp8_128(const uint8_t* w4, const uint8_t* s32, int64_t n, int64_t k, uint8_t* w8,
                                      uint8_t* s128);

}  // namespace flashseek::ops
