// Index scores on the integer tensor cores (index_imma.cu), used by launch_index_scores
// (index_kernels.cu) as IndexScoreArgs::kernel 4. C++17, no core/ headers (included by .cu files).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {

// Whether kernel 4 can compute `a` (FP4 queries, kFp4E8m0 keys of 32-blocks, dI 128, nI <= 64);
// the workspace is checked by the launch.
bool index_scores_imma_applies(const IndexScoreArgs& a);
// Workspace of kernel 4 for T query rows of nI heads: the packed queries and their block scales.
size_t index_scores_imma_work_bytes(int64_t T, int64_t nI);
cudaError_t launch_index_scores_imma(const IndexScoreArgs& a, cudaStream_t s);

}  // namespace flashseek::ops::cuda::detail
