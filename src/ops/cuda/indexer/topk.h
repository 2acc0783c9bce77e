// The cluster top-k of IndexTopkArgs::path 3 (topk.cu), used by launch_index_topk
// (index_kernels.cu). C++17, no core/ headers (included by .cu files).
#pragma once
#include <cuda_runtime_api.h>

#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {

// Picks the cluster size (a.cluster, or automatic when 0) and keys per thread (8, 16 or 32) for
// the rows of `a`; false when the cluster kernel cannot run them (rows longer than 32 x 1024 keys
// per block, clusters that the device cannot hold, a bad a.cluster). Queries the device once per
// (device, kernel, cluster size). Automatic: 16 while all rows' clusters are resident at once
// (or 8 blocks hold no more of them), else 8.
bool topk_cluster_plan(const IndexTopkArgs& a, int* csize, int* kpt);

// The top-k of every row of `a` (mode 0 / 2 semantics on the scores; mode 1's candidate mask must
// be done before) with the plan of topk_cluster_plan: one launch.
cudaError_t launch_topk_cluster(const IndexTopkArgs& a, int csize, int kpt, cudaStream_t s);

}  // namespace flashseek::ops::cuda::detail
