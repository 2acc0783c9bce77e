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

// An FP4 matrix (or a stack of experts' matrices, n = experts · rows) from the row-major layout
// to the GEMV fragment order (ops/fp4_fragments.h; ExpertGemvParams::w_packed): n % 32 == 0,
// k % 64 == 0, codes 16-byte aligned, the outputs apart from the inputs. The device twin of
// ops::pack_fp4_fragments.
Status pack_fp4_fragments_cuda(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                               uint8_t* out_scales, cudaStream_t stream);

// FP8 e4m3 codes [n, k] (or a stack of matrices, n = matrices · rows) to the FP8 fragment order
// (BlockLinearParams::w_packed; the scales keep their layout) and back: n % 32 == 0, k % 32 == 0,
// codes 8-byte aligned, the output apart from the input. The device twins of
// ops::pack_fp8_fragments / ops::unpack_fp8_fragments.
Status pack_fp8_fragments_cuda(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes, cudaStream_t stream);
Status unpack_fp8_fragments_cuda(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes, cudaStream_t stream);

// Process-wide (GpuLoadOptions::gemv_fp4_chunk sets it before each forward): the k blocks per warp
// iteration of the FP4 GEMVs (the routed experts), 2 or 4 (4: each quad loads whole 16-byte
// blocks); anything else: automatic (2). Another summation order; the prefill kernels follow it,
// so prefill == decode still holds bit for bit.
void set_gemv_fp4_chunk(int chunk);

}  // namespace flashseek::ops::cuda
