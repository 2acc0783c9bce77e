// CUDA launchers of the large-M FP8 block-scaled GEMM (prefill linears). Params and numerics:
// ops/gemm_fp8.h; CPU twin gemm_fp8_ref. All pointers are device pointers; nothing is allocated;
// work is queued on `stream`.
//
// Kernels (gemm_fp8.cu), all sm_90a wgmma m64n128k32 e4m3·e4m3 → FP32 on 128-byte swizzled
// operand tiles, every 32-deep wgmma promoted into FP32 registers with its own scale (x block
// scale × W block scale), i.e. DeepGEMM-style promotion at the 32-element granularity of V4.1
// (V4's 128 blocks give the same numbers). Default: kernel 6, warp-specialised: a TMA producer
// warp fills a 6-slot mbarrier ring, two consumer warpgroups (setmaxnreg 232) each own 64 rows
// × 128 columns and promote 32-block i while the wgmma of block i+1 runs; persistent over the
// tiles. Kernels 1-5 (cp.async ring filled by the math warps) are kept for comparison.
// Measured on an H200 (bench/RESULTS.md): kernel 6 runs the V4.1 linears at m = 8192 at
// 514-633 TFLOP/s, 43-51 % of torch._scaled_mm per-tensor FP8 on the same shapes in the same run
// (kernels 1-5: 300-350, 24-30 %).
// Accuracy: the tensor core sums each 32-block of products with ~13 bits below its largest
// product: |Y - twin| <= 2^-8 · Σ|x_q·w| (worst seen 9.0e-4 · Σ, mean 5e-5 · Σ, FP32 out; all
// kernels give identical bits). Deterministic.
//
// Meant for m > 16; for m <= 16 use block_linear_cuda (gemv.h), built for that range.
// Requirements beyond validate(): a compute capability 9.0 device (else kUnimplemented),
// 16-byte aligned x / xq / xs / w / workspace.
//
// Typical prefill use (one quantisation feeding several GEMMs that share the input):
//   gemm_fp8_quantize_cuda(x, ActDtype::kBf16, m, k, act_block, xq, xs, stream);
//   GemmFp8Params p; p.xq = xq; p.xs = xs; p.w = ...; p.y = ...; gemm_fp8_cuda(p, stream);
#pragma once
#include <cuda_runtime_api.h>

#include "ops/gemm_fp8.h"

namespace flashseek::ops::cuda {

// Y = fq8(X) · Wᵀ. With p.x set, X is first quantised into p.workspace (one extra launch).
Status gemm_fp8_cuda(const GemmFp8Params& p, cudaStream_t stream);

// Grouped GEMM (ops/gemm_fp8.h), one persistent launch of kernel 6 over the tiles of all groups;
// p.row_start is a DEVICE array read by the kernel (no host sync on the group sizes). Each
// group's rows are bitwise what gemm_fp8_cuda (kernel 6) gives on that group alone.
// w_format kFp4: the TMA brings each stage's e2m1 bytes (half the FP8 weight bytes) and three
// warps of the producer warpgroup expand them into the swizzled e4m3 W slot (exact) together
// with the per-row scales, then release the stage to the consumers (4-slot ring: the raw bytes
// need room); the consumers promote with sx · sw[column]. Bitwise equal to the kFp8 launch on the
// e4m3 copy wherever the 32 rows of each scale tile share their scales.
// x_f16: X as f16 values, W (kFp4 or kFp8) expanded to f16, every 32-block summed by two f16 wgmmas
// (k16, FP32 accumulation) and promoted as above: the e4m3 wgmma's ~14-bit block sums (above,
// "Accuracy") become FP32-precision sums of the exact products, at half the tensor-core rate
// (5-slot ring of 64-k stages). gemm_fp8_cuda takes the same mode (GemmFp8Params::x_f16) for
// one FP8 matrix.
// x_bf16 (GemmFp8Params::x_bf16; --prefill-gemm-operands bf16, and the BF16 matrices with
// w_bf16): X as BF16 values, W expanded to BF16 with its scale folded in by the same converter
// warps (w_bf16: loaded by the TMA as stored), two BF16 wgmmas per 32-block into a scratch
// accumulator, added in FP32, so that the tensor core's truncating sum spans 32 products, not all
// of k.
Status gemm_fp8_grouped_cuda(const GemmFp8GroupedParams& p, cudaStream_t stream);

// X [m, k] (FP32 or BF16) → xq [m, k] e4m3 codes and xs [m, k/32] FP32 power-of-two scales
// (per act_block; repeated over the 32-blocks of a 128-block). k a multiple of 128.
// f16_codes: xq receives [m, k] f16 values (2·m·k bytes), each code's e4m3 value (exact), the
// input of the x_f16 mode; the same quantisation. bf16_round_in (FP32 x): each input rounded to
// BF16 first (the reference's BF16 activation before its FP8 quantisation).
Status gemm_fp8_quantize_cuda(const void* x, ActDtype x_dtype, int64_t m, int64_t k,
                              int64_t act_block, uint8_t* xq, float* xs, cudaStream_t stream,
                              bool f16_codes = false, bool bf16_round_in = false,
                              bool bf16_values = false);
// bf16_values (above): xq receives [m, k] BF16 values (2·m·k bytes), code · scale (exact), the
// input of the x_bf16 mode; xs is written as well.

// Stored weights → BF16 values code · scale (ops::GemmExpandBf16Params, twin gemm_expand_bf16_ref,
// the same bits): the w_bf16 operand of the x_bf16 GEMM, expanded once per GEMM instead of per
// 128-row m-tile inside it. w 8-byte (FP8) or 4-byte (FP4) aligned, y 16-byte aligned; an sm_90a
// device (the expansion is the GEMM's own BF16 arithmetic).
Status gemm_expand_bf16_cuda(const GemmExpandBf16Params& p, cudaStream_t stream);

// x [n] FP32 → BF16 bits (round to nearest even; exact on BF16 values): the x_bf16 input of
// activations that are BF16 values and not FP8-quantised (wo_a's). n a multiple of 4, x 16-byte
// and y 8-byte aligned.
Status gemm_bf16_pack_cuda(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);

// x [m, k] FP32 (k a multiple of 32, 16-byte aligned) → f16 codes xq [m, k] and power-of-two
// scales xs [m, k/32] (ops::quantize_f16_blocks_ref, bitwise): the x_f16 GEMM's input for
// activations that are BF16 values rather than FP8-quantised ones.
Status gemm_f16_quantize_cuda(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs, cudaStream_t stream);

}  // namespace flashseek::ops::cuda
