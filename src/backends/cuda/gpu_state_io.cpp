// Snapshots of GPU sequence states (Model::export_state / import_state on the CUDA backend): a
// GpuSequenceState is copied to the canonical host format (CpuSequenceState, forward/state.h)
// and back, so that the state cache and kvshare work with `--gpus N` exactly as on the CPU.
// Layout mapping (gpu_impl.h ↔ state.h):
//   window ring [ring_size] rows           ↔ LayerState::ring (same slots, pos % ring_size)
//   ckv [n_ckv] rows, ikeys [n_ikeys] rows ↔ PagedRows ckv / ikeys (the first n rows)
//   (the caches' rows are in their row formats, forward/cache_format.h: unpacked on export to the
//   exact FP32 values, packed on import; a state whose values the format cannot hold exactly is
//   refused, never rounded)
//   open group v/z [n_pend, width]         ↔ CompressorState::v/z; prev_v/z [ratio, width] when has_prev
//   history ring, position p at slot p % (2·ratio + kMaxRollback), positions [hist_lo, len) valid
//                                          ↔ hist_v/z rows of positions [hist_first, len), hist_first = hist_lo
//   engram_hist                            ↔ engram_hist (host on both sides)
//   DSpark draft rings [ring_size, Dh]     ↔ draft_rings
//   V4 MTP ring [ring_size, Dh]           ↔ mtp_ring; MTP history ring, position p at slot
//     p % kGpuMtpHistRows, positions [mtp_lo, len) ↔ mtp_hist_x rows (gpu_mtp.cpp mtp_export / mtp_import)
//
// Tensor-parallel ranks (gpu_tp.h) export and import the same way; the sequence's canonical state
// is rank 0's export (TpModel::export_state), and every rank imports that one state. Why that is
// sound: every field above except the draft's is a function of replicated weights and of the
// layer inputs, and those inputs are the same bits on every rank:
//  - the window ring holds kv = RoPE(kv_norm(wkv · a)), the compressors' open groups and rollback
//    histories the projections wkv / wgate · a, the compressed KV and index keys what they pool,
//    and the indexer reads a and qlat = q_norm(wq_a · a) — wq_a, wkv, kv_norm, the compressors and
//    the indexer are never split (tp_slice_for: kAll), so a rank computes them whole from `a`;
//  - `a` (the attention / FFN input) comes from the residual streams and mHC (replicated), and the
//    only rank-dependent values entering the streams are the partial sums of wo_b (the rank's
//    heads / output groups) and of the MoE combine (its experts, rank 0's shared expert), which
//    are all-reduced before anything else reads them: the host-staged communicator sums the
//    staged buffers in rank order on every rank, NCCL's all-reduce (ring / tree; NVLS is off)
//    computes each element's sum once and broadcasts it, so every rank gets the same FP32 sum,
//    and the BF16 rounding after it (reference numerics) is the same function on every rank;
//  - the embedding and the Engram rows (host rows gathered by every rank, or a full copy on each
//    device) are replicated; engram_hist and len follow from the token ids alone.
// The draft's state (DSpark rings, the V4 MTP ring and history) exists on rank 0 only, which alone
// runs the draft (GpuModel::has_draft). So rank 0's export is the whole state, ranks > 0 export
// its backbone part, and a rank > 0 imports a snapshot's backbone and ignores its draft part
// (state_geometry: ignore_draft / ignore_mtp). tests/forward/gpu_tp_snapshot_test.cpp checks that
// every rank's export equals rank 0's but for the draft fields.
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>

#include "backends/cuda/gpu_impl.h"
#include "forward/state_convert.h"
#include "ops/cache_row.h"
#include "ops/cuda/runtime/comm.h"

namespace flashseek::forward::gpu {

namespace {

// Queues the download of `n` floats at `src` (a device array holding at least n) into `dst`.
Status download(std::vector<float>& dst, const DevArray<float>& src, int64_t n, cudaStream_t s, const char* what) {
  dst.resize(size_t(n));
  if (n == 0) return {};
  if (!src.get() || src.capacity() < size_t(n))
    return internal_error("export_state: {} holds {} floats on the device, {} expected", what, src.capacity(), n);
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.get(), size_t(n) * 4, cudaMemcpyDeviceToHost, s));
  return {};
}

// Rows of positions [from, to) of a history ring of `cap` rows (slot p % cap) → dst rows 0 … .
Status download_hist(std::vector<float>& dst, const DevArray<float>& ring, int64_t cap, int64_t from, int64_t to,
                     int64_t width, cudaStream_t s) {
  dst.resize(size_t((to - from) * width));
  if (to == from) return {};
  if (!ring.get() || ring.capacity() < size_t(cap * width))
    return internal_error("export_state: compressor history ring holds {} floats, {} expected", ring.capacity(),
                          cap * width);
  for (int64_t p = from; p < to;) {
    const int64_t slot = p % cap, n = std::min(to - p, cap - slot);
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data() + (p - from) * width, ring.get() + slot * width,
                                            size_t(n * width) * 4, cudaMemcpyDeviceToHost, s));
    p += n;
  }
  return {};
}

// Queues the download of `rows` packed rows of format f into `bytes` (unpacked after the sync).
Status download_packed(std::vector<uint8_t>& bytes, const DevArray<uint8_t>& src, const ops::CacheRowFormat& f,
                       int64_t rows, cudaStream_t s, const char* what) {
  const int64_t n = rows * f.row_bytes();
  bytes.resize(size_t(n));
  if (n == 0) return {};
  if (!src.get() || src.capacity() < size_t(n))
    return internal_error("export_state: {} holds {} bytes on the device, {} expected", what, src.capacity(), n);
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bytes.data(), src.get(), size_t(n), cudaMemcpyDeviceToHost, s));
  return {};
}

// Host → device (synchronous: the legacy-stream copy orders with the model's blocking stream).
Status upload_rows(float* dst, const float* src, int64_t n) {
  if (n > 0) FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, size_t(n) * 4, cudaMemcpyHostToDevice));
  return {};
}

}  // namespace

std::string GpuModel::backend_kind() const {
  // Native weights read by the exactness kernels give the FP32 copies' bits; only the block-scaled
  // GEMVs (reference numerics) sum in another order, so only they make states incompatible. Every
  // rank of a multi-GPU model runs its replicated matrices through them alike, so rank 0's count
  // decides for the model (TpModel::backend_kind); the world size and communicator are part of
  // the kind too (cuda_backend_kind).
  return cuda_backend_kind(report_.fast_matrices > 0, shard_.world, comm_ ? comm_->kind() : std::string());
}

StateGeometry GpuModel::state_geometry() const {
  const auto& c = config();
  StateGeometry g;
  g.draft = draft_rings();
  g.mtp = mtp_state();
  g.ignore_mtp = !mtp_state();  // a backend without the MTP state ignores a snapshot's
  // Ranks > 0 of a multi-GPU model hold no draft (rank 0 runs it): they import a snapshot's
  // backbone and leave its DSpark rings to rank 0, which checks and imports them.
  g.ignore_draft = shard_.rank > 0;
  if (c.is_v41() && !c.engram_layer_ids.empty() && !w_.engram_token_map.empty())
    g.max_engram_id = *std::max_element(w_.engram_token_map.begin(), w_.engram_token_map.end());
  return g;
}

Result<std::unique_ptr<CpuSequenceState>> GpuModel::export_state(const SequenceState& state) const {
  const auto* st = dynamic_cast<const GpuSequenceState*>(&state);
  if (!st) return invalid_argument("export_state: not a GPU sequence state");
  if (!st->error.ok()) return st->error;
  const auto& c = config();
  const int64_t Dh = c.head_dim, dI = c.index_head_dim, len = st->len, ring = st->ring_size;
  if (int64_t(st->layers.size()) != c.num_layers || ring != c.window + kMaxRollback)
    return internal_error("export_state: GPU state has {} layers / ring {}, the model {} / {}", st->layers.size(), ring,
                          c.num_layers, c.window + kMaxRollback);
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  auto out = std::make_unique<CpuSequenceState>();
  out->len = len;
  out->ring_size = ring;
  out->engram_hist = st->engram_hist;
  out->layers.resize(st->layers.size());
  // Every copy is queued on stream_ (after the forwards that wrote the state), then one sync.
  std::vector<std::vector<uint8_t>> ring_b(st->layers.size()), ckv_b(st->layers.size()), ikeys_b(st->layers.size());
  auto comp = [&](const GpuCompState& g, CompressorState& h, const StateLayerShape& ls, int64_t width) -> Status {
    if (!ls.pooled) return {};
    const int64_t cap = gpu_hist_rows(ls.ratio);
    if (g.n_pend < 0 || g.n_pend >= ls.ratio || g.hist_lo < 0 || g.hist_lo > len || len - g.hist_lo > cap)
      return internal_error("export_state: compressor with {} pending rows, history from {} (length {})", g.n_pend,
                            g.hist_lo, len);
    h.n_pend = g.n_pend;
    h.has_prev = g.has_prev;
    h.hist_first = g.hist_lo;
    FS_RETURN_IF_ERROR(download(h.v, g.v, g.n_pend * width, stream_, "open group"));
    FS_RETURN_IF_ERROR(download(h.z, g.z, g.n_pend * width, stream_, "open group gates"));
    FS_RETURN_IF_ERROR(download(h.prev_v, g.prev_v, g.has_prev ? ls.ratio * width : 0, stream_, "previous window"));
    FS_RETURN_IF_ERROR(download(h.prev_z, g.prev_z, g.has_prev ? ls.ratio * width : 0, stream_, "previous window"));
    FS_RETURN_IF_ERROR(download_hist(h.hist_v, g.hist_v, cap, g.hist_lo, len, width, stream_));
    return download_hist(h.hist_z, g.hist_z, cap, g.hist_lo, len, width, stream_);
  };
  for (size_t l = 0; l < st->layers.size(); ++l) {
    const GpuLayerState& g = st->layers[l];
    LayerState& h = out->layers[l];
    const StateLayerShape ls = state_layer_shape(c, int(l));
    const int64_t coff = ls.overlap ? 2 : 1;
    FS_RETURN_IF_ERROR(download_packed(ring_b[l], g.ring, cache_fmt_.ring, ring, stream_, "window ring"));
    FS_RETURN_IF_ERROR(download_packed(ckv_b[l], g.ckv, cache_fmt_.ckv, g.n_ckv, stream_, "compressed KV"));
    FS_RETURN_IF_ERROR(download_packed(ikeys_b[l], g.ikeys, cache_fmt_.ikeys, g.n_ikeys, stream_, "index keys"));
    FS_RETURN_IF_ERROR(comp(g.comp, h.comp, ls, coff * Dh));
    StateLayerShape il = ls;
    il.pooled = ls.icomp;
    FS_RETURN_IF_ERROR(comp(g.icomp, h.icomp, il, coff * dI));
  }
  out->draft_rings.resize(st->draft_rings.size());
  for (size_t i = 0; i < st->draft_rings.size(); ++i)
    FS_RETURN_IF_ERROR(download(out->draft_rings[i], st->draft_rings[i], ring * Dh, stream_, "DSpark draft ring"));
  FS_RETURN_IF_ERROR(mtp_export(*st, *out));
  FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<float> rows;
  for (size_t l = 0; l < st->layers.size(); ++l) {  // paged rows as CpuModel::new_sequence lays them out
    const GpuLayerState& g = st->layers[l];
    LayerState& h = out->layers[l];
    h.ring.resize(size_t(ring * Dh));
    ops::unpack_cache_rows(cache_fmt_.ring, ring_b[l].data(), ring, h.ring.data());
    h.ckv.reset(Dh);
    rows.resize(size_t(g.n_ckv * Dh));
    ops::unpack_cache_rows(cache_fmt_.ckv, ckv_b[l].data(), g.n_ckv, rows.data());
    h.ckv.append(rows);
    h.ikeys.reset(dI);
    rows.resize(size_t(g.n_ikeys * dI));
    ops::unpack_cache_rows(cache_fmt_.ikeys, ikeys_b[l].data(), g.n_ikeys, rows.data());
    h.ikeys.append(rows);
  }
  return out;
}

Result<std::unique_ptr<SequenceState>> GpuModel::import_state(const CpuSequenceState& s) const {
  const auto& c = config();
  FS_RETURN_IF_ERROR(check_state_geometry(s, c, state_geometry()));  // before anything reaches the device
  std::unique_ptr<SequenceState> base = new_sequence();              // rings zeroed, draft rings if any
  auto* st = static_cast<GpuSequenceState*>(base.get());
  if (!st->error.ok()) return st->error;
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t Dh = c.head_dim, dI = c.index_head_dim, ring = st->ring_size;
  // FP32 rows → packed (refused when not exactly representable) → the device.
  std::vector<uint8_t> packed;
  auto pack_up = [&](uint8_t* dst, const ops::CacheRowFormat& f, const float* src, int64_t n,
                     const char* what) -> Status {
    if (n == 0) return {};
    packed.resize(size_t(n * f.row_bytes()));
    if (Status ps = ops::pack_cache_rows(f, src, n, packed.data()); !ps.ok())
      return invalid_argument("import_state: {}: {}", what, ps.message());
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, packed.data(), packed.size(), cudaMemcpyHostToDevice));
    return {};
  };
  // Paged rows → the first rows of a device array sized for them (forward grows it as it appends).
  auto rows = [&](DevArray<uint8_t>& dst, const ops::CacheRowFormat& f, const PagedRows& src, int64_t& n_dst,
                  const char* what) -> Status {
    n_dst = src.size();
    if (n_dst == 0) return {};
    FS_RETURN_IF_ERROR(dst.reserve(size_t(n_dst * f.row_bytes()), false));
    Status status;
    src.for_each_run(0, n_dst, [&](int64_t first, const float* p, int64_t n) {
      if (status.ok()) status = pack_up(dst.get() + first * f.row_bytes(), f, p, n, what);
    });
    return status;
  };
  auto comp = [&](const CompressorState& h, GpuCompState& g, const StateLayerShape& ls, int64_t width) -> Status {
    if (!ls.pooled) return {};
    const int64_t ratio = ls.ratio, cap = gpu_hist_rows(ratio);
    // The sizes GpuModel::plan_feed and plan_history reserve.
    FS_RETURN_IF_ERROR(g.v.zeros(size_t(ratio * width)));
    FS_RETURN_IF_ERROR(g.z.zeros(size_t(ratio * width)));
    FS_RETURN_IF_ERROR(g.prev_v.zeros(size_t(ratio * width)));
    FS_RETURN_IF_ERROR(g.prev_z.zeros(size_t(ratio * width)));
    FS_RETURN_IF_ERROR(g.hist_v.zeros(size_t(cap * width)));
    FS_RETURN_IF_ERROR(g.hist_z.zeros(size_t(cap * width)));
    FS_RETURN_IF_ERROR(upload_rows(g.v.get(), h.v.data(), int64_t(h.v.size())));
    FS_RETURN_IF_ERROR(upload_rows(g.z.get(), h.z.data(), int64_t(h.z.size())));
    FS_RETURN_IF_ERROR(upload_rows(g.prev_v.get(), h.prev_v.data(), int64_t(h.prev_v.size())));
    FS_RETURN_IF_ERROR(upload_rows(g.prev_z.get(), h.prev_z.data(), int64_t(h.prev_z.size())));
    // History rows of positions [hist_first, len) (≤ cap, checked) into their ring slots p % cap:
    // at most two contiguous runs.
    const int64_t first = h.hist_first, end = first + int64_t(h.hist_v.size()) / width;
    for (int64_t p = first; p < end;) {
      const int64_t slot = p % cap, n = std::min(end - p, cap - slot);
      FS_RETURN_IF_ERROR(upload_rows(g.hist_v.get() + slot * width, h.hist_v.data() + (p - first) * width, n * width));
      FS_RETURN_IF_ERROR(upload_rows(g.hist_z.get() + slot * width, h.hist_z.data() + (p - first) * width, n * width));
      p += n;
    }
    g.n_pend = h.n_pend;
    g.has_prev = h.has_prev;
    g.hist_lo = h.hist_first;
    return {};
  };
  for (size_t l = 0; l < st->layers.size(); ++l) {
    const LayerState& h = s.layers[l];
    GpuLayerState& g = st->layers[l];
    const StateLayerShape ls = state_layer_shape(c, int(l));
    const int64_t coff = ls.overlap ? 2 : 1;
    FS_RETURN_IF_ERROR(pack_up(g.ring.get(), cache_fmt_.ring, h.ring.data(), ring, "window ring"));
    FS_RETURN_IF_ERROR(rows(g.ckv, cache_fmt_.ckv, h.ckv, g.n_ckv, "compressed KV"));
    FS_RETURN_IF_ERROR(rows(g.ikeys, cache_fmt_.ikeys, h.ikeys, g.n_ikeys, "index keys"));
    FS_RETURN_IF_ERROR(comp(h.comp, g.comp, ls, coff * Dh));
    StateLayerShape il = ls;
    il.pooled = ls.icomp;
    FS_RETURN_IF_ERROR(comp(h.icomp, g.icomp, il, coff * dI));
  }
  for (size_t i = 0; i < st->draft_rings.size(); ++i)
    FS_RETURN_IF_ERROR(upload_rows(st->draft_rings[i].get(), s.draft_rings[i].data(), ring * Dh));
  FS_RETURN_IF_ERROR(mtp_import(s, *st));
  st->engram_hist = s.engram_hist;
  st->len = s.len;
  return base;
}

}  // namespace flashseek::forward::gpu
#endif
