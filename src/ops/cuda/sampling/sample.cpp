// Host side of the CUDA sampling op: checks and Status; kernels live in sample.cu.
#include "ops/cuda/sampling/sample.h"

#include <vector>

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/sampling/sample_kernels.h"

namespace flashseek::ops::cuda {

Result<size_t> sample_rows_workspace_bytes(int64_t vocab) {
  if (vocab < 1 || vocab >= (int64_t(1) << 31))
    return invalid_argument("sample_rows: vocab must be in [1, 2^31) (got {})", vocab);
  size_t bytes = 0;
  FS_RETURN_IF_ERROR(cuda_status(detail::sample_workspace_bytes(int(vocab), &bytes),
                                 "sample_rows workspace query"));
  return bytes;
}

Status sample_rows_cuda(const SampleRowsParams& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  if (p.rows == 0) return {};
  if (p.rows >= (int64_t(1) << 31)) return invalid_argument("sample_rows: rows beyond 2^31");
  if (p.vocab >= (int64_t(1) << 30))  // chunk offsets are 32-bit in the kernels
    return invalid_argument("sample_rows: vocab {} beyond the CUDA op's limit 2^30", p.vocab);
  FS_ASSIGN_OR_RETURN(size_t need, sample_rows_workspace_bytes(p.vocab));
  if (!p.workspace || p.workspace_bytes < need)
    return invalid_argument("sample_rows: workspace of {} bytes at {}, need {} bytes for vocab {}",
                            p.workspace_bytes, p.workspace ? "non-null" : "null", need, p.vocab);
  std::vector<detail::SampleRowSpec> specs(size_t(p.rows));
  for (int64_t r = 0; r < p.rows; ++r) {
    const SampleSpec& s = p.specs[r];
    specs[size_t(r)] = {s.temperature, s.top_p, s.min_p, s.u, s.top_k};
  }
  return cuda_status(detail::launch_sample_rows(p.logits, int(p.rows), int(p.vocab), specs.data(), p.out,
                                                p.workspace, p.workspace_bytes, stream),
                     "sample_rows kernel launch");
}

}  // namespace flashseek::ops::cuda
