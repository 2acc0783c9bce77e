// Quantisation simulations of the official reference (quantise, then dequantise back to fp32),
// used only in `reference` numerics. Every function works in place on row-major [rows, dim]
// data, blocks running along the last dim; dim must be a multiple of the block.
#pragma once
#include <cstdint>

namespace flashseek::ops {

// Power-of-two scale 2^ceil(log2(v)) for v > 0, computed exactly (no libm log2).
float pow2_ceil(float v);

// FP8 E4M3 per block with UE8M0 scale (v4 §5.1, v41 §1.4 / §2 item 3):
// s = 2^ceil(log2(max(amax, 1e-4) / 448)); x = e4m3(clamp(x / s, ±448)) · s.
void fp8_quant_dequant(float* x, int64_t rows, int64_t dim, int64_t block);

// FP4 E2M1 per block with a UE8M0 scale (index q/k, v4 §3.5.6 and v41 §9 item 4):
// s = 2^ceil(log2(max(amax, 6·2^-126) · fp32(1/6))); x = bf16(e2m1(clamp(x / s, ±6)) · s).
void fp4_quant_dequant_e8m0(float* x, int64_t rows, int64_t dim, int64_t block);

// FP4 E2M1 per block with an E4M3 scale (V4.1 compressed KV, group 16, v41 §2 item 5):
// s = e4m3(max(amax, 6·2^-9) / 6); x = bf16(e2m1(clamp(x / s, ±6)) · s).
void fp4_quant_dequant_e4m3(float* x, int64_t rows, int64_t dim, int64_t block);

// Rounds every value to the nearest BF16 (the reference's `.bfloat16()` points).
void round_bf16_inplace(float* x, int64_t n);

// Orthonormal Sylvester Walsh-Hadamard transform of each row (dim a power of two), FP32 math
// (v4 §3.5.6; V4 indexer only).
void hadamard_inplace(float* x, int64_t rows, int64_t dim);

}  // namespace flashseek::ops
