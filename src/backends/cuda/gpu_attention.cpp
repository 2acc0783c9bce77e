// Attention of one layer over one chunk on the GPU (mirrors attention.cpp + compress.cpp): query
// and window KV, compressors (kv sources) writing straight into the device caches, the indexer
// (index sources) publishing device top-k lists, sparse attention with sinks, inverse RoPE and
// the grouped output projection; the chunk's window rows go to the ring last.
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <cmath>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;

Status GpuModel::attention(int l, GpuChunk& ctx, const float* a, float* out) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool R = ref(), v41 = c.is_v41();
  // H (and G below): this rank's heads / output groups (all of them on one GPU, gpu_tp.h).
  const int64_t T = ctx.T, D = c.hidden_size, H = shard_.heads, Dh = c.head_dim, Dr = c.rope_head_dim;
  const int64_t Rq = c.q_lora_rank, W = c.window;
  const float eps = float(c.rms_norm_eps);
  const float* inv_freq = d(A.rope_inv_freq);
  FS_ASSIGN_OR_RETURN(float* qlat, scratch<float>("qlat", T * Rq));
  FS_ASSIGN_OR_RETURN(float* q, scratch<float>("q", T * H * Dh));
  FS_ASSIGN_OR_RETURN(float* kv, scratch<float>("kv", T * Dh));
  // Query: RoPE(wq_b(q_norm(wq_a a))) (+ V4's per-head norm before RoPE).
  FS_RETURN_IF_ERROR(linear(a, d(A.wq_a), T, D, Rq, qlat, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(qlat, d(A.q_norm), qlat, T, Rq, eps, R, stream_));
  FS_RETURN_IF_ERROR(linear(qlat, d(A.wq_b), T, Rq, H * Dh, q, act_block_, R));
  if (!v41) {
    if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_rms_norm_bf16_heads(q, T * H, Dh, eps, stream_));
    else FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(q, nullptr, q, T * H, Dh, eps, false, stream_));
  }
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(q, ctx.d_pos, inv_freq, T, H, Dh, Dr, false, R, stream_));
  // Window KV: kv_norm(wkv a), RoPE, FP8 simulation.
  FS_RETURN_IF_ERROR(linear(a, d(A.wkv), T, D, Dh, kv, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(kv, d(A.kv_norm), kv, T, Dh, eps, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(kv, ctx.d_pos, inv_freq, T, 1, Dh, Dr, false, R, stream_));
  if (R && v41) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(kv, T, Dh, Dh, 32, cd::QuantSim::kFp8, stream_));
  if (R && !v41) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(kv, T, Dh, Dh - Dr, 64, cd::QuantSim::kFp8, stream_));
  if (A.has_compressor) FS_RETURN_IF_ERROR(compress(l, ctx, a));
  if (A.has_indexer) FS_RETURN_IF_ERROR(index_select(l, ctx, a, qlat));

  FS_ASSIGN_OR_RETURN(float* o, scratch<float>("attn_o", T * H * Dh));
  // Each sequence over its own ring, compressed KV and top-k lists: one launch for the step (the
  // sequences as descriptors), or the plain launch for a single sequence; same bits either way.
  cd::ModelAttnArgs p;
  p.q = q, p.kv_chunk = kv, p.sink = d(A.attn_sink), p.out = o;
  p.T = T, p.H = H, p.Dh = Dh, p.window = W;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.bf16 = R;
  std::vector<cd::ModelAttnSeq> seqs;
  for (const GpuSeg& g : ctx.segs) {
    cd::ModelAttnSeq sq;
    sq.ring = g.st->layers[size_t(l)].ring.get(), sq.start = g.start, sq.row0 = g.row0, sq.T = g.T;
    sq.ring_size = g.st->ring_size;
    int64_t keys = W;
    if (role.ratio > 0) {
      sq.ckv = g.st->layers[size_t(role.kv_src)].ckv.get();
      keys += role.idx_src >= 0 ? c.index_topk : (g.start + g.T) / role.ratio;  // V4 HCA: every visible entry
    }
    p.max_keys = std::max(p.max_keys, keys);
    seqs.push_back(sq);
  }
  if (role.ratio > 0) {
    p.ratio = role.ratio;
    if (role.idx_src >= 0) {
      const GpuSeg& g0 = ctx.segs.front();  // row 0: the lists' base
      p.topk = g0.topk[size_t(role.idx_src)];
      p.topk_n = g0.topk_n[size_t(role.idx_src)];
      p.topk_stride = c.index_topk;
      if (!p.topk) return internal_error("layer {}: index source {} published no top-k", l, role.idx_src);
    }
    p.ckv = seqs.front().ckv ? seqs.front().ckv : kv;  // non-null: the layer has compressed rows
  }
  const cd::ModelAttnSeq* d_seqs = nullptr;
  if (seqs.size() == 1) {
    p.ring = seqs[0].ring, p.ring_size = seqs[0].ring_size, p.start = seqs[0].start;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention(p, stream_));
  } else {
    const int64_t bytes = int64_t(seqs.size() * sizeof(cd::ModelAttnSeq));
    FS_ASSIGN_OR_RETURN(uint8_t* ds, scratch<uint8_t>("attn_seqs", bytes));
    FS_RETURN_IF_ERROR(upload(ds, seqs.data(), size_t(bytes)));
    d_seqs = reinterpret_cast<const cd::ModelAttnSeq*>(ds);
    FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention_seqs(p, d_seqs, ctx.d_row_seq, stream_));
  }

  // Several GPUs: each rank's wo_b output is a partial sum; BF16 rounding after the all-reduce.
  FS_RETURN_IF_ERROR(output_projection(A, "attn_z", ctx.d_pos, T, H, shard_.groups, o, out, R && !shard_.split()));
  FS_RETURN_IF_ERROR(tp_allreduce(out, T * D, R));
  // Only now publish the chunk's window rows (the queries above read older ones from the ring).
  if (d_seqs) {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write_seqs(d_seqs, ctx.d_row_seq, kv, ctx.d_pos, T, Dh, stream_));
  } else {
    const GpuSeg& g = ctx.segs.front();
    const int64_t rs = g.st->ring_size;
    FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write(g.st->layers[size_t(l)].ring.get(), kv, g.d_pos,
                                                  std::max<int64_t>(0, g.T - rs), g.T, rs, Dh, stream_));
  }
  return {};
}

// Inverse RoPE at the query position, grouped wo_a (BF16 GEMM in the reference) over the G
// output groups, wo_b into `out` (BF16-rounded when bf16_out): the attention output of the
// backbone and of the DSpark stages. `o` [T, H·Dh] is modified in place.
Status GpuModel::output_projection(const AttentionWeights& A, const std::string& tag, const int64_t* d_pos, int64_t T,
                                   int64_t H, int64_t G, float* o, float* out, bool bf16_out) {
  const auto& c = config();
  const bool R = ref();
  const int64_t Dh = c.head_dim, Ro = c.o_lora_rank, in_g = H * Dh / G;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(o, d_pos, d(A.rope_inv_freq), T, H, Dh, c.rope_head_dim, true, R, stream_));
  FS_ASSIGN_OR_RETURN(float* z, scratch<float>(tag, T * G * Ro));
  if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(o, T, H * Dh, H * Dh, 1, cd::QuantSim::kBf16, stream_));
  for (int64_t g = 0; g < G; ++g) {
    cd::LinearArgs la;
    la.x = o + g * in_g, la.x_stride = H * Dh;
    la.y = z + g * Ro, la.y_stride = G * Ro, la.rows = T, la.in = in_g, la.out = Ro, la.bf16_out = R;
    set_weight(la, d(A.wo_a), g * Ro);  // rows [g·Ro, (g+1)·Ro): FP32 copy or as stored
    FS_CUDA_RETURN_IF_ERROR(cd::launch_linear(la, stream_));
  }
  return linear(z, d(A.wo_b), T, G * Ro, c.hidden_size, out, act_block_, bf16_out);
}

// Feeds the chunk's rows v/z [T, width] into `cs` and pools every group completed in this chunk
// into dst rows [n_dst, n_dst + n) (CPU: compress.cpp pool_groups). Slot pointers go to the
// kernel as tables; the open group's rows and the previous window are then copied into the state.
Status GpuModel::pool(GpuCompState& cs, const float* v, const float* z, const std::vector<int64_t>& pos,
                      int64_t ratio, int64_t c, bool overlap, DevArray<float>& dst, int64_t n_dst,
                      std::vector<int64_t>& groups, const std::string& tag) {
  const int64_t width = overlap ? 2 * c : c, T = int64_t(pos.size());
  FS_RETURN_IF_ERROR(cs.v.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.z.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.prev_v.reserve(size_t(ratio * width), true));
  FS_RETURN_IF_ERROR(cs.prev_z.reserve(size_t(ratio * width), true));
  std::vector<const float*> cur_v, cur_z, prev_v, prev_z, tab_v, tab_z;
  for (int64_t i = 0; i < cs.n_pend; ++i) cur_v.push_back(cs.v.get() + i * width), cur_z.push_back(cs.z.get() + i * width);
  if (cs.has_prev)
    for (int64_t s = 0; s < ratio; ++s)
      prev_v.push_back(cs.prev_v.get() + s * width), prev_z.push_back(cs.prev_z.get() + s * width);
  bool new_prev = false;
  for (int64_t t = 0; t < T; ++t) {
    cur_v.push_back(v + t * width);
    cur_z.push_back(z + t * width);
    if (int64_t(cur_v.size()) < ratio) continue;
    if (overlap)
      for (int64_t s = 0; s < ratio; ++s) {
        tab_v.push_back(prev_v.empty() ? nullptr : prev_v[size_t(s)]);
        tab_z.push_back(prev_z.empty() ? nullptr : prev_z[size_t(s)]);
      }
    for (int64_t s = 0; s < ratio; ++s) {
      tab_v.push_back(cur_v[size_t(s)] + (overlap ? c : 0));
      tab_z.push_back(cur_z[size_t(s)] + (overlap ? c : 0));
    }
    groups.push_back(pos[size_t(t)] / ratio);
    if (overlap) prev_v = cur_v, prev_z = cur_z, new_prev = true;
    cur_v.clear();
    cur_z.clear();
  }
  const int64_t n = int64_t(groups.size()), n_slots = overlap ? 2 * ratio : ratio;
  if (n > 0) {
    FS_RETURN_IF_ERROR(dst.reserve(size_t((n_dst + n) * c), true));
    FS_ASSIGN_OR_RETURN(const float** tv, scratch<const float*>(tag + "_tab", 2 * n * n_slots));
    tab_v.insert(tab_v.end(), tab_z.begin(), tab_z.end());
    FS_RETURN_IF_ERROR(upload(tv, tab_v.data(), tab_v.size() * sizeof(void*)));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_softmax_pool(tv, tv + n * n_slots, n, n_slots, c, dst.get() + n_dst * c, stream_));
  }
  // State update, stream-ordered after the pool kernel: previous window first (its rows may sit in
  // the pending buffer), then the open group's rows.
  const size_t row_bytes = size_t(width) * 4;
  if (new_prev)
    for (int64_t s = 0; s < ratio; ++s) {
      FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(cs.prev_v.get() + s * width, prev_v[size_t(s)], row_bytes, cudaMemcpyDeviceToDevice, stream_));
      FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(cs.prev_z.get() + s * width, prev_z[size_t(s)], row_bytes, cudaMemcpyDeviceToDevice, stream_));
    }
  for (size_t i = 0; i < cur_v.size(); ++i) {
    if (cur_v[i] == cs.v.get() + i * width) continue;  // an old pending row already in place
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(cs.v.get() + i * width, cur_v[i], row_bytes, cudaMemcpyDeviceToDevice, stream_));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(cs.z.get() + i * width, cur_z[i], row_bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  cs.n_pend = int64_t(cur_v.size());
  cs.has_prev = cs.has_prev || new_prev;
  return {};
}

Status GpuModel::compress(int l, GpuChunk& ctx, const float* a) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = ctx.T, D = c.hidden_size, Dh = c.head_dim, dI = c.index_head_dim;
  const int64_t ratio = role.ratio;
  const int64_t coff = !v41 && ratio == 4 ? 2 : 1;
  // Projections in FP32 over every row (V4.1 ratio 1 is a BF16 GEMM); gates get `ape` at
  // pos % ratio (V4).
  auto project = [&](const CompressorWeights& cw, int64_t width, const std::string& tag, float*& v,
                     float*& z) -> Status {
    FS_ASSIGN_OR_RETURN(v, scratch<float>(tag + "_v", T * width));
    FS_ASSIGN_OR_RETURN(z, scratch<float>(tag + "_z", T * width));
    FS_RETURN_IF_ERROR(linear(a, d(cw.wkv), T, D, width, v, 0, R && v41 && ratio == 1));
    if (!d(cw.wgate)) return {};
    FS_RETURN_IF_ERROR(linear(a, d(cw.wgate), T, D, width, z, 0, false));
    if (d(cw.ape)) FS_CUDA_RETURN_IF_ERROR(cd::launch_add_ape(z, d(cw.ape), ctx.d_pos, T, width, ratio, stream_));
    return {};
  };
  float *v = nullptr, *z = nullptr, *iv = nullptr, *iz = nullptr;
  FS_RETURN_IF_ERROR(project(A.compressor, coff * Dh, "cmp", v, z));
  if (A.has_idx_compressor) FS_RETURN_IF_ERROR(project(A.idx_compressor, coff * dI, "icmp", iv, iz));
  for (GpuSeg& g : ctx.segs) {
    const int64_t r = g.row0;
    FS_RETURN_IF_ERROR(compress_seg(l, g, v + r * coff * Dh, z ? z + r * coff * Dh : nullptr,
                                    iv ? iv + r * coff * dI : nullptr, iz ? iz + r * coff * dI : nullptr));
  }
  return {};
}

// One sequence's compressor rows v/z [T, coff·Dh] (and the V4 indexer compressor's iv/iz):
// rollback history, pooling of the groups completed in this chunk into the state's caches, and
// the new entries' norm, RoPE and quantisation (compress.cpp).
Status GpuModel::compress_seg(int l, GpuSeg& ctx, const float* v, const float* z, const float* iv,
                              const float* iz) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  GpuLayerState& LS = ctx.st->layers[size_t(l)];
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = ctx.T, Dh = c.head_dim, Dr = c.rope_head_dim, dI = c.index_head_dim;
  const int64_t ratio = role.ratio;
  const float eps = float(c.rms_norm_eps);
  const bool overlap = !v41 && ratio == 4;
  const int64_t coff = overlap ? 2 : 1;
  const float* inv_freq = d(A.rope_inv_freq);
  auto upload_pos = [&](const std::vector<int64_t>& groups, const std::string& tag) -> Result<int64_t*> {
    std::vector<int64_t> gp(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) gp[i] = groups[i] * ratio;  // RoPE at the group's first token
    FS_ASSIGN_OR_RETURN(int64_t* p, scratch<int64_t>(tag, int64_t(gp.size())));
    if (!gp.empty()) FS_RETURN_IF_ERROR(upload(p, gp.data(), gp.size() * 8));
    return p;
  };
  if (!(v41 && ratio == 1)) FS_RETURN_IF_ERROR(record_history(LS.comp, v, z, ctx, coff * Dh, ratio));  // rollback
  std::vector<int64_t> groups;
  if (v41 && ratio == 1) {
    groups = ctx.pos;
    FS_RETURN_IF_ERROR(LS.ckv.reserve(size_t((LS.n_ckv + T) * Dh), true));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(LS.ckv.get() + LS.n_ckv * Dh, v, size_t(T * Dh) * 4, cudaMemcpyDeviceToDevice, stream_));
  } else {
    FS_RETURN_IF_ERROR(pool(LS.comp, v, z, ctx.pos, ratio, Dh, overlap, LS.ckv, LS.n_ckv, groups, "cmp"));
  }
  const int64_t n = int64_t(groups.size());
  if (n > 0) {
    float* e = LS.ckv.get() + LS.n_ckv * Dh;  // the new entries, processed in place
    FS_ASSIGN_OR_RETURN(int64_t* gpos, upload_pos(groups, "cmp_gpos"));
    if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(e, n, Dh, Dh, 1, cd::QuantSim::kBf16, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(e, d(A.compressor.norm), e, n, Dh, eps, R, stream_));
    if (v41 && d(A.idx_wk)) {  // index keys from the pre-RoPE latent: k_norm(wk(latent)), RoPE, FP4
      FS_RETURN_IF_ERROR(LS.ikeys.reserve(size_t((LS.n_ikeys + n) * dI), true));
      float* k = LS.ikeys.get() + LS.n_ikeys * dI;
      FS_RETURN_IF_ERROR(linear(e, d(A.idx_wk), n, Dh, dI, k, 0, R, R));
      FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(k, d(A.idx_k_norm), k, n, dI, eps, R, stream_));
      FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(k, gpos, inv_freq, n, 1, dI, Dr, false, R, stream_));
      if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(k, n, dI, dI, 32, cd::QuantSim::kFp4E8m0, stream_));
      LS.n_ikeys += n;
    }
    FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(e, gpos, inv_freq, n, 1, Dh, Dr, false, R, stream_));
    if (R && v41) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(e, n, Dh, Dh, 16, cd::QuantSim::kFp4E4m3, stream_));
    if (R && !v41) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(e, n, Dh, Dh - Dr, 64, cd::QuantSim::kFp8, stream_));
    LS.n_ckv += n;
  }
  if (!A.has_idx_compressor) return {};
  // V4 indexer compressor (c = dI): same pooling, then Hadamard + FP4 in reference numerics.
  FS_RETURN_IF_ERROR(record_history(LS.icomp, iv, iz, ctx, coff * dI, ratio));  // rollback
  std::vector<int64_t> igroups;
  FS_RETURN_IF_ERROR(pool(LS.icomp, iv, iz, ctx.pos, ratio, dI, overlap, LS.ikeys, LS.n_ikeys, igroups, "icmp"));
  const int64_t ni = int64_t(igroups.size());
  if (ni == 0) return {};
  float* k = LS.ikeys.get() + LS.n_ikeys * dI;
  FS_ASSIGN_OR_RETURN(int64_t* ipos, upload_pos(igroups, "icmp_gpos"));
  if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(k, ni, dI, dI, 1, cd::QuantSim::kBf16, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(k, d(A.idx_compressor.norm), k, ni, dI, eps, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(k, ipos, inv_freq, ni, 1, dI, Dr, false, R, stream_));
  if (R) {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_hadamard(k, ni, dI, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(k, ni, dI, dI, 1, cd::QuantSim::kBf16, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(k, ni, dI, dI, 32, cd::QuantSim::kFp4E8m0, stream_));
  }
  LS.n_ikeys += ni;
  return {};
}

Status GpuModel::index_select(int l, GpuChunk& ctx, const float* a, const float* qlat) {
  const auto& c = config();
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = ctx.T, D = c.hidden_size, Dr = c.rope_head_dim, Rq = c.q_lora_rank;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk;
  FS_ASSIGN_OR_RETURN(float* iq, scratch<float>("idx_q", T * nI * dI));
  FS_ASSIGN_OR_RETURN(float* wts, scratch<float>("idx_w", T * nI));
  FS_RETURN_IF_ERROR(linear(qlat, d(A.idx_wq_b), T, Rq, nI * dI, iq, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(iq, ctx.d_pos, d(A.rope_inv_freq), T, nI, dI, Dr, false, R, stream_));
  if (R) {
    if (!v41) {
      FS_CUDA_RETURN_IF_ERROR(cd::launch_hadamard(iq, T * nI, dI, stream_));
      FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(iq, T * nI, dI, dI, 1, cd::QuantSim::kBf16, stream_));
    }
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(iq, T * nI, dI, dI, 32, cd::QuantSim::kFp4E8m0, stream_));
  }
  FS_RETURN_IF_ERROR(linear(a, d(A.idx_weights_proj), T, D, nI, wts, 0, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_scale(wts, T * nI, 1.0f / std::sqrt(float(dI)) / std::sqrt(float(nI)), R, stream_));
  // This layer's lists for every row (later layers read them through their idx_src).
  FS_ASSIGN_OR_RETURN(int32_t* out, scratch<int32_t>("topk" + std::to_string(l), T * K));
  FS_ASSIGN_OR_RETURN(int32_t* out_n, scratch<int32_t>("topk_n" + std::to_string(l), T));
  for (GpuSeg& g : ctx.segs)
    FS_RETURN_IF_ERROR(index_select_seg(l, g, iq + g.row0 * nI * dI, wts + g.row0 * nI, out + g.row0 * K, out_n + g.row0));
  return {};
}

// Scores over the keys of this layer's own kv source (v41 §9.x), rows strided by start + T, and
// the top-k of one sequence.
Status GpuModel::index_select_seg(int l, GpuSeg& ctx, const float* iq, const float* wts, int32_t* out,
                                  int32_t* out_n) {
  const auto& c = config();
  const auto& role = c.role(l);
  const bool R = ref();
  const int64_t T = ctx.T, nI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk;
  const int64_t stride = ctx.start + T;
  FS_ASSIGN_OR_RETURN(float* sc, scratch<float>("idx_scores", T * stride));
  FS_ASSIGN_OR_RETURN(float* bs, scratch<float>("idx_blocks", T * stride));
  FS_ASSIGN_OR_RETURN(uint8_t* taken, scratch<uint8_t>("idx_taken", T * stride));
  cd::IndexScoreArgs s;
  s.q = iq, s.w = wts, s.keys = ctx.st->layers[size_t(role.kv_src)].ikeys.get(), s.scores = sc;
  s.T = T, s.nI = nI, s.dI = dI, s.start = ctx.start, s.ratio = role.ratio, s.stride = stride, s.bf16 = R;
  if (s.keys) FS_CUDA_RETURN_IF_ERROR(cd::launch_index_scores(s, stream_));
  cd::IndexTopkArgs t;
  t.scores = sc, t.cand = ctx.cand, t.block_scratch = bs, t.taken = taken, t.out = out, t.out_n = out_n;
  t.T = T, t.start = ctx.start, t.ratio = role.ratio, t.stride = stride, t.k = K;
  t.cand_block = c.candidate_block_size, t.cand_top = c.candidate_topk_blocks;
  t.mode = role.candidate_source ? 1 : role.candidate_filtered ? 2 : 0;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_index_topk(t, stream_));
  ctx.topk[size_t(l)] = out;
  ctx.topk_n[size_t(l)] = out_n;
  return {};
}

}  // namespace flashseek::forward::gpu
#endif
