// CUDA launchers of RMSNorm, RoPE and pooled sparse attention. Params: ops/norm.h, ops/rope.h
// (the CPU functions' own structs, here with device pointers) and ops/attention_pool.h. Nothing
// is allocated; work is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/attention_pool.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace flashseek::ops::cuda {

Status rms_norm_cuda(const RmsNormParams& p, cudaStream_t stream);
Status apply_rope_cuda(const RopeParams& p, cudaStream_t stream);

// Split count that gives about one block per multiprocessor, with >= 32 keys per split.
int64_t sparse_attn_auto_splits(int64_t m, int64_t n_idx, int sm_count);
Status sparse_attention_pool_cuda(const SparseAttnPoolParams& p, cudaStream_t stream);

}  // namespace flashseek::ops::cuda
