// Glue kernels of the prefill layer benchmark (prefill_bench.cpp): the routed-expert row
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

}  // namespace flashseek::ops::cuda::detail
