// CUDA sampling op: one token per row of device logits, by the rule of ops/sample.h (twin:
// ops::sample_rows_ref). Nothing is allocated inside: the caller passes a workspace of
// sample_rows_workspace_bytes(vocab) device bytes in SampleRowsParams.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/sample.h"

namespace flashseek::ops::cuda {

// Device bytes the op needs for rows of `vocab` logits (any number of rows). Needs a current
// device.
Result<size_t> sample_rows_workspace_bytes(int64_t vocab);

// Queues the rows on `stream`; p.logits / p.out / p.workspace are device pointers, p.specs host
// memory (read before the call returns). Rows without a finite logit get -1.
Status sample_rows_cuda(const SampleRowsParams& p, cudaStream_t stream);

}  // namespace flashseek::ops::cuda
