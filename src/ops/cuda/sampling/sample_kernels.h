// Internal interface between sample.cpp (checks, Status) and sample.cu (kernels). Free of
// core/status.h (nvcc cannot compile the fmt headers).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flashseek::ops::cuda::detail {

// One row's spec (ops::SampleSpec without the status header).
struct SampleRowSpec {
  double temperature, top_p, min_p, u;
  int64_t top_k;
};

// Workspace of one row of `vocab` (keys, ids, sorted copies, CUB radix-sort scratch); needs a
// current device (CUB asks for its properties).
cudaError_t sample_workspace_bytes(int vocab, size_t* bytes);

// Queues one token per row: greedy rows by a block-wide argmax, others by the block-wide
// inverse-CDF draw, after a device radix sort of the row when top-k or top-p applies. Rows run one
// after the other and share the workspace.
cudaError_t launch_sample_rows(const float* logits, int rows, int vocab, const SampleRowSpec* specs,
                               int32_t* out, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace flashseek::ops::cuda::detail
