// Internal interface between the host launchers (.cpp, Status) and the .cu kernels of RMSNorm,
// RoPE and sparse attention. Free of core/status.h (nvcc cannot compile the fmt headers).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cache_row_format.h"

namespace flashseek::ops::cuda::detail {

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                            float eps, bool bf16_out, cudaStream_t stream);

cudaError_t launch_rope(float* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                        int64_t n_vec, int64_t vec_dim, int64_t rope_dim, bool inverse,
                        bool bf16_out, cudaStream_t stream);

// x[r] = quant?(rope(rms_norm(x[r]; w))) for the window KV rows: ops::rms_norm, then the forward
// RoPE of the last rope_dim values at pos[r], then (qblock > 0) the FP8 simulation of the first
// qprefix values in blocks of qblock; the bits of launch_model_rms_norm, launch_rope and
// launch_quant_sim in turn, in one launch. For what norm_rope_quant_supports admits (rows of
// 4..1024 values, a multiple of 4, 16-byte aligned; qblock 0 or a power of two in 4..128 dividing
// qprefix; w, when given, 16-byte aligned).
// With `ring`: each finished row r is also written to ring slot pos[r] % ring_size in `format`
// (launch_cache_pack_ring's bytes; rows of one sequence, at most ring_size of them, so no two
// share a slot), in the same launch.
struct NormRopeQuantRing {
  void* ring = nullptr;
  int64_t ring_size = 0;
  CacheRowFormat format;  // format.dim == dim, packable (cache_row_packable)
};
bool norm_rope_quant_supports(const float* x, int64_t dim, int64_t rope_dim, int64_t qprefix, int64_t qblock);
cudaError_t launch_norm_rope_quant(float* x, const float* w, const int64_t* pos, const float* inv_freq, int64_t rows,
                                   int64_t dim, int64_t rope_dim, float eps, bool bf16, int64_t qprefix,
                                   int64_t qblock, cudaStream_t stream, const NormRopeQuantRing* ring = nullptr);

struct AttnArgs {
  const float* q;
  const uint16_t* kv;
  const int32_t* idx;
  const float* sink;
  float* out;
  float* ws;  // [m, splits, heads, dim] partial outputs, then [m, splits, heads, 2] (max, sum)
  int m, n_idx, n_rows, heads, dim, splits;
  float scale;
};
cudaError_t launch_sparse_attn(const AttnArgs& a, cudaStream_t stream);
// True when (heads, dim) take the tensor-core path (16-head MMA tiles, dims in quarters of 8·k).
bool sparse_attn_uses_mma(int heads, int dim);

}  // namespace flashseek::ops::cuda::detail

namespace flashseek::ops::cuda::detail {

// Benchmark/test data made on the GPU (a counter hash, no state): kind 0 = any byte,
// 1 = e4m3 code without NaN, 2 = e8m0 scale in [2^-8, 2^-4].
cudaError_t launch_fill_bytes(uint8_t* p, int64_t n, uint64_t seed, int kind, cudaStream_t stream);
// Uniform floats in [-scale, scale).
cudaError_t launch_fill_floats(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace flashseek::ops::cuda::detail
