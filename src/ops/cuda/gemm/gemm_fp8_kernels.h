// Internal interface between gemm_fp8.cpp (checks, Status) and gemm_fp8.cu (kernels). Kept free
// of core/status.h: nvcc's host pass cannot compile the fmt headers it pulls in.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashseek::ops::cuda::detail {

struct GemmFp8Args {
  const uint8_t* xq;  // [m, k] e4m3
  const float* xs;    // [m, k/32]
  const uint8_t* w;   // [n, k] e4m3
  const uint8_t* ws;  // [ceil(n/w_block), k/w_block] e8m0
  void* y;            // [m, n]
  int m, n, k, w_block;
  bool bf16_out;
  int variant;       // 1/2: 128×128 tile (2 warpgroups) / 192×128 (3), unswizzled operand
                     // tiles; 3/4: the same with 128-byte swizzled tiles; 5: as 1 with padded
                     // (1040-byte) 8-row groups; 6-9: TMA producer warp + 2 consumer
                     // warpgroups, 128×128 tile (6/8 overlapped promotion, 7/9 batched;
                     // 6/7 persistent)
  int desc_swap;     // test hook (unswizzled variants): swap the descriptor's byte offsets
  int skip_promote;  // timing diagnostics (results are wrong): bit 0 skips the FP32 promotion,
                     // bit 1 the converter warps' expansion of W (x_f16 / x_bf16 / FP4)
  // Grouped (variant 6 only; groups > 0): `groups` problems sharing n, k and w_block; group g
  // owns rows [row_start[g], row_start[g+1]) of xq / xs / y (device array, non-decreasing, m =
  // the total rows) and the weights w + g·n·k, ws + g·ceil(n/w_block)·(k/w_block). The persistent
  // tile loop walks (group, n-tile, m-tile) over all groups; rows past a group's end are loaded
  // (they belong to the next group) but not stored.
  const int32_t* row_start;
  int groups;
  // Grouped only: W holds e2m1 codes [groups · n, k/2] (low nibble = even k) and ws one E8M0
  // scale per (row, 32-block) [groups · n, k/32]; expanded to e4m3 in shared memory.
  bool w_fp4;
  // xq holds [m, k] f16 values (the e4m3 values, exact; launch_quantize_fp8 with f16_codes) and
  // each 32-block is summed by two m64n128k16 f16 wgmmas (FP32 accumulation: the exact products,
  // summed at FP32 precision) instead of one e4m3 wgmma (whose 32-product sum keeps only ~14 bits
  // below the largest product); W (e2m1 or e4m3) expanded to f16 in shared memory. Kernel 6's
  // schedule (the variant is ignored).
  bool x_f16;
  // xq holds [m, k] BF16 values (GemmFp8Params::x_bf16; xs unused): W expanded to BF16 with its
  // scales, each 32-block's sum (two m64n128k16 BF16 wgmmas) added in FP32.
  bool x_bf16;
  // x_bf16: w holds [n, k] (grouped: [groups · n, k]) BF16 values (ws unused), loaded by the TMA
  // as they are.
  bool w_bf16;
  // x_bf16: every 16-deep step accumulates into the tile's FP32 accumulator on the tensor core
  // (GemmFp8Params::bf16_direct), no per-32-block scratch sums.
  bool bf16_direct;
  // FP32 output (bf16_out false) holding each value rounded to BF16.
  bool bf16_round_out;
  // Grouped FP4 with bf16_direct: the operands swapped (Yᵀ = W · Xᵀ), W expanded by the consumer
  // warpgroups into wgmma register fragments (GemmFp8GroupedParams::w_in_registers).
  bool w_in_registers;
  // x_f16 / x_bf16, not grouped: row strides of X (and its scales: ldx / 32) and Y in elements; 0: k / n.
  int ldx, ldy;
  // Grouped FP4 in the f16 / BF16 pipeline: W in the fragment order (GemmFp8GroupedParams::w_fragments).
  bool w_fragments;
};

constexpr int kGemmFp8MaxGroups = 1024;

// Stored weights → BF16 values (ops::GemmExpandBf16Params): w / ws / y device pointers, y 16-byte
// aligned, k a multiple of 32; fp4: e2m1 codes and one scale per (row, 32-block), else e4m3 with
// w_block × w_block tile scales; row_start (optional, [count + 1]) skips the empty matrices.
struct GemmExpandArgs {
  const uint8_t* w;
  const uint8_t* ws;
  uint16_t* y;
  int64_t count, n, k;
  int w_block;
  bool fp4;
  const int32_t* row_start;
  bool fragments;  // FP4 in the fragment order (GemmExpandBf16Params::w_fragments)
};
cudaError_t launch_expand_bf16(const GemmExpandArgs& a, cudaStream_t stream);

// Dynamic shared memory of a GEMM kernel variant (bytes).
int gemm_fp8_smem_bytes(int variant);

cudaError_t launch_gemm_fp8(const GemmFp8Args& a, cudaStream_t stream);

// f16_codes: xq receives each code's value as f16 (2 bytes per input; exact) instead of the
// e4m3 byte. round_bf16 (FP32 x): each input rounded to BF16 before the quantisation.
cudaError_t launch_quantize_fp8(const void* x, bool bf16, int64_t m, int64_t k, int act_block,
                                uint8_t* xq, float* xs, cudaStream_t stream, bool f16_codes = false,
                                bool round_bf16 = false, bool bf16_values = false);
// FP32 [n] (n a multiple of 4) → BF16 bits, round to nearest even (exact on BF16 values).
cudaError_t launch_pack_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);
// y [m, n] = x [m, k] · w [n, k]ᵀ, BF16 bits in, by mma.sync m16n8k16 steps in ascending k from
// zero (m % 16 == 0, n % 8 == 0, k % 16 == 0, 4-byte aligned rows); see gemm_fp8.cu.
cudaError_t launch_mma_steps(const uint16_t* x, const uint16_t* w, float* y, int m, int n, int k, cudaStream_t stream);
// FP32 x [m, k] → f16 codes [m, k] and a power-of-two scale per 32 values, s = 2^(ceil(log2(amax))
// - 15) (1 for a zero block): code = f16_rn(x / s). CPU twin: ops::quantize_f16_blocks_ref.
cudaError_t launch_quantize_f16(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs,
                                cudaStream_t stream);

}  // namespace flashseek::ops::cuda::detail
