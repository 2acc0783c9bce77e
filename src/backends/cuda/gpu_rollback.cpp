// Rollback of a GPU sequence state by up to kMaxRollback tokens (the CUDA twin of rollback.cpp,
// v41 §5.7): compressed KV and index-key counts drop to the kept groups, open compressor groups
// (and V4's previous windows) are rebuilt from the device history of recent projections, Engram
// look-back is trimmed. Window rings and DSpark draft rings need nothing: kMaxRollback spare
// slots mean a discarded position never overwrote a row a later window reads.
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;

namespace {

// Copies history rows of positions [from, to) into dst rows 0 … (contiguous in at most two runs).
Status copy_hist(const DevArray<float>& hist, int64_t cap, int64_t from, int64_t to, int64_t width, float* dst,
                 cudaStream_t s) {
  for (int64_t p = from; p < to;) {
    const int64_t slot = p % cap, n = std::min(to - p, cap - slot);
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(dst + (p - from) * width, hist.get() + slot * width,
                                            size_t(n * width) * 4, cudaMemcpyDeviceToDevice, s));
    p += n;
  }
  return {};
}

// Rebuilds `cs` for a sequence of length L: the open group [g·ratio, L) and, with overlap, the
// previous window [(g−1)·ratio, g·ratio).
Status restore(GpuCompState& cs, int64_t ratio, int64_t width, bool overlap, int64_t L, int layer, cudaStream_t s) {
  const int64_t g = L / ratio, open = g * ratio, cap = gpu_hist_rows(ratio);
  const int64_t need = overlap && g >= 1 ? open - ratio : open;
  if (need < L && (need < cs.hist_lo || !cs.hist_v.get()))
    return out_of_range("rollback: layer {} compressor history starts at position {}, needs {}", layer, cs.hist_lo,
                        need);
  FS_RETURN_IF_ERROR(cs.v.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.z.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(copy_hist(cs.hist_v, cap, open, L, width, cs.v.get(), s));
  FS_RETURN_IF_ERROR(copy_hist(cs.hist_z, cap, open, L, width, cs.z.get(), s));
  cs.n_pend = L - open;
  if (overlap) {
    cs.has_prev = g >= 1;
    if (cs.has_prev) {
      FS_RETURN_IF_ERROR(cs.prev_v.reserve(size_t(ratio * width), true));
      FS_RETURN_IF_ERROR(cs.prev_z.reserve(size_t(ratio * width), true));
      FS_RETURN_IF_ERROR(copy_hist(cs.hist_v, cap, open - ratio, open, width, cs.prev_v.get(), s));
      FS_RETURN_IF_ERROR(copy_hist(cs.hist_z, cap, open - ratio, open, width, cs.prev_z.get(), s));
    }
  }
  return {};
}

}  // namespace

Status GpuModel::plan_history(GpuCompState& cs, const float* v, const float* z, const FwdSeg& seg, int64_t width,
                              int64_t ratio, FeedPlan& plan) {
  const int64_t cap = gpu_hist_rows(ratio), T = seg.T;
  FS_RETURN_IF_ERROR(cs.hist_v.reserve(size_t(cap * width), true));
  FS_RETURN_IF_ERROR(cs.hist_z.reserve(size_t(cap * width), true));
  for (int64_t t = std::max<int64_t>(0, T - cap); t < T; ++t) {  // distinct slots: at most cap rows
    const int64_t slot = seg.pos[size_t(t)] % cap;
    plan.a_src.push_back(v + t * width), plan.a_dst.push_back(cs.hist_v.get() + slot * width);
    plan.a_src.push_back(z + t * width), plan.a_dst.push_back(cs.hist_z.get() + slot * width);
  }
  cs.hist_lo = std::max(cs.hist_lo, seg.start + T - cap);
  return {};
}

Status GpuModel::rollback(SequenceState& state, int64_t L) const {
  auto* st = dynamic_cast<GpuSequenceState*>(&state);
  if (!st) return invalid_argument("rollback: not a GPU sequence state");
  if (!st->error.ok()) return st->error;
  const auto& c = config();
  const int64_t drop = st->len - L;
  if (drop < 0 || L < 0) return invalid_argument("rollback: new length {} outside [0, {}]", L, st->len);
  if (drop > st->ring_size - c.window)
    return out_of_range("rollback: {} tokens requested, at most {} supported", drop, st->ring_size - c.window);
  if (drop == 0) return {};
  FS_RETURN_IF_ERROR(mtp_check_rollback(*st, L));  // V4 MTP history (gpu_mtp.cpp)
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const bool v41 = c.is_v41();
  const int64_t Dh = c.head_dim, dI = c.index_head_dim;
  // Validate every history first (all-or-nothing), then rewrite the partial groups.
  for (int pass = 0; pass < 2; ++pass) {
    for (int l = 0; l < int(c.num_layers); ++l) {
      const AttentionWeights& A = w_.layers[size_t(l)].attn;
      if (!A.has_compressor) continue;
      GpuLayerState& LS = st->layers[size_t(l)];
      const int64_t ratio = c.role(l).ratio, groups = L / ratio;
      const bool overlap = !v41 && ratio == 4;
      const int64_t coff = overlap ? 2 : 1, g = groups, open = g * ratio;
      if (pass == 0) {
        if (v41 && ratio == 1) continue;
        const int64_t need = overlap && g >= 1 ? open - ratio : open;
        for (const GpuCompState* cs : {&LS.comp, A.has_idx_compressor ? &LS.icomp : nullptr})
          if (cs && need < L && need < cs->hist_lo)
            return out_of_range("rollback: layer {} compressor history starts at position {}, needs {}", l,
                                cs->hist_lo, need);
        continue;
      }
      LS.n_ckv = std::min(LS.n_ckv, groups);
      LS.n_ikeys = std::min(LS.n_ikeys, groups);
      if (v41 && ratio == 1) continue;  // no partial state
      FS_RETURN_IF_ERROR(restore(LS.comp, ratio, coff * Dh, overlap, L, l, stream_));
      if (A.has_idx_compressor) FS_RETURN_IF_ERROR(restore(LS.icomp, ratio, coff * dI, overlap, L, l, stream_));
    }
  }
  FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const size_t drop_hist = std::min(st->engram_hist.size(), size_t(drop));
  st->engram_hist.resize(st->engram_hist.size() - drop_hist);
  st->len = L;
  return {};
}

}  // namespace flashseek::forward::gpu
#endif
