// Host side of the RMSNorm / RoPE / sparse-attention launchers: checks and Status.
#include "ops/cuda/model/kernels.h"

#include <algorithm>

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda {

Status rms_norm_cuda(const RmsNormParams& p, cudaStream_t stream) {
  if (!p.x || !p.y) return invalid_argument("rms_norm: x and y must be set");
  if (p.rows <= 0 || p.dim <= 0 || p.rows > (1 << 30))
    return invalid_argument("rms_norm: rows={} dim={} out of range", p.rows, p.dim);
  return cuda_status(detail::launch_rms_norm(p.x, p.w, p.y, p.rows, p.dim, p.eps, p.bf16_out, stream),
                     "rms_norm kernel launch");
}

Status apply_rope_cuda(const RopeParams& p, cudaStream_t stream) {
  if (!p.x || !p.pos || !p.inv_freq) return invalid_argument("apply_rope: x, pos, inv_freq must be set");
  if (p.rows <= 0 || p.n_vec <= 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 || p.rope_dim > p.vec_dim)
    return invalid_argument("apply_rope: rows={} n_vec={} vec_dim={} rope_dim={} invalid", p.rows,
                            p.n_vec, p.vec_dim, p.rope_dim);
  if (p.rows * p.n_vec * (p.rope_dim / 2) >= (int64_t(1) << 40))
    return out_of_range("apply_rope: {} pairs is too many", p.rows * p.n_vec * (p.rope_dim / 2));
  return cuda_status(detail::launch_rope(p.x, p.pos, p.inv_freq, p.rows, p.n_vec, p.vec_dim,
                                         p.rope_dim, p.inverse, p.bf16_out, stream),
                     "rope kernel launch");
}

int64_t sparse_attn_auto_splits(int64_t m, int64_t n_idx, int sm_count) {
  // >= one 16-key tile per split, about two blocks per multiprocessor.
  const int64_t by_keys = std::max<int64_t>(1, n_idx / 16);
  const int64_t by_sms = std::max<int64_t>(1, (2 * sm_count + m - 1) / std::max<int64_t>(1, m));
  return std::clamp<int64_t>(std::min(by_keys, by_sms), 1, 1024);
}

Status sparse_attention_pool_cuda(const SparseAttnPoolParams& p, cudaStream_t stream) {
  FS_RETURN_IF_ERROR(validate(p));
  if (!p.workspace) return invalid_argument("sparse_attention_pool: workspace must be set");
  if (p.m > 65535 || p.n_idx > (1 << 30) || p.n_rows > (int64_t(1) << 31) - 1)
    return out_of_range("sparse_attention_pool: m={} n_idx={} n_rows={} too large", p.m, p.n_idx,
                        p.n_rows);
  detail::AttnArgs a{};
  a.q = p.q, a.kv = p.kv, a.idx = p.idx, a.sink = p.sink, a.out = p.out, a.ws = p.workspace;
  a.m = int(p.m), a.n_idx = int(p.n_idx), a.n_rows = int(p.n_rows), a.heads = int(p.n_heads);
  a.dim = int(p.head_dim), a.splits = int(p.n_splits), a.scale = p.scale;
  return cuda_status(detail::launch_sparse_attn(a, stream), "sparse_attention kernel launch");
}

}  // namespace flashseek::ops::cuda
