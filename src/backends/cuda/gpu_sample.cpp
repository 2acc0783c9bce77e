// Sampling on the device (BatchItem::sample, issue 4): the token after an item's last logits row
// is drawn on the model's stream by ops::cuda::sample_rows_cuda (the engine's rule, ops/sample.h)
// and one int32 is queued back instead of the [vocab] row (queue_download: written to
// BatchItem::sampled at the forward's sync). The op's kernels go through the launch tape, so a
// greedy or temperature/min-p step is replayed from a patched CUDA graph (the spec travels as
// kernel arguments); a top-k/top-p step sorts with CUB, which the tape cannot hold, so it runs
// eagerly (gpu_graph.cpp).
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/sampling/sample.h"

namespace flashseek::forward::gpu {

Status GpuModel::sample_last_row(const float* row, const ops::SampleSpec& spec, int32_t* out) {
  if (shard_.split())
    return internal_error("device sampling: a tensor-parallel rank holds only a vocabulary slice");
  const int64_t V = config().vocab_size;
  if (sample_ws_bytes_ == 0) {
    FS_ASSIGN_OR_RETURN(sample_ws_bytes_, ops::cuda::sample_rows_workspace_bytes(V));
  }
  FS_ASSIGN_OR_RETURN(uint8_t* ws, scratch<uint8_t>("sample_ws", int64_t(sample_ws_bytes_)));
  FS_ASSIGN_OR_RETURN(int32_t* d_tok, scratch<int32_t>("sample_token", 1));
  ops::SampleRowsParams p;
  p.logits = row, p.rows = 1, p.vocab = V, p.specs = &spec, p.out = d_tok;
  p.workspace = ws, p.workspace_bytes = sample_ws_bytes_;
  FS_RETURN_IF_ERROR(ops::cuda::sample_rows_cuda(p, stream_));
  return queue_download(out, d_tok, sizeof(int32_t));
}

}  // namespace flashseek::forward::gpu
#endif
