// Sampling on the device (BatchItem::sample): each sampled item's token is drawn from its last
// logits row on the model's stream by ops::cuda::sample_rows_cuda (the engine's rule,
// ops/sample.h; one call per run of consecutive rows), and the step's tokens come back in one
// copy (queue_download_spread, written to BatchItem::sampled at the forward's sync). The op's kernels go through the launch tape, so a
// greedy or temperature/min-p step is replayed from a patched CUDA graph (the spec travels as
// kernel arguments); a top-k/top-p step sorts with CUB, which the tape cannot hold, so it runs
// eagerly (gpu_graph.cpp).
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/sampling/sample.h"

namespace flashseek::forward::gpu {

Status GpuModel::sample_lg_rows(const float* lg, int64_t V, std::span<const int64_t> rows,
                                std::span<const ops::SampleSpec* const> specs, std::span<int32_t* const> outs) {
  if (shard_.split())
    return internal_error("device sampling: a tensor-parallel rank holds only a vocabulary slice");
  const int64_t n = int64_t(rows.size());
  if (n == 0) return {};
  if (specs.size() != rows.size() || outs.size() != rows.size())
    return internal_error("sample_rows: {} rows, {} specs, {} outputs", rows.size(), specs.size(), outs.size());
  if (V != config().vocab_size) return internal_error("sample_rows: logits rows of {}, vocabulary {}", V, config().vocab_size);
  if (sample_ws_bytes_ == 0) {
    FS_ASSIGN_OR_RETURN(sample_ws_bytes_, ops::cuda::sample_rows_workspace_bytes(V));
  }
  FS_ASSIGN_OR_RETURN(uint8_t* ws, scratch<uint8_t>("sample_ws", int64_t(sample_ws_bytes_)));
  FS_ASSIGN_OR_RETURN(int32_t* d_tok, scratch<int32_t>("sample_token", n));
  // Runs of consecutive rows in one call each (the op launches consecutive greedy rows together).
  std::vector<ops::SampleSpec> run;
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && rows[size_t(j)] == rows[size_t(j - 1)] + 1) ++j;
    run.clear();
    for (int64_t k = i; k < j; ++k) run.push_back(*specs[size_t(k)]);
    ops::SampleRowsParams p;
    p.logits = lg + rows[size_t(i)] * V, p.rows = j - i, p.vocab = V, p.specs = run.data(), p.out = d_tok + i;
    p.workspace = ws, p.workspace_bytes = sample_ws_bytes_;
    FS_RETURN_IF_ERROR(ops::cuda::sample_rows_cuda(p, stream_));
    i = j;
  }
  // One copy back for all of them, spread to the items' fields when the forward completes.
  std::vector<void*> dst(outs.begin(), outs.end());
  return queue_download_spread(dst, d_tok, sizeof(int32_t));
}

}  // namespace flashseek::forward::gpu
#endif
