// MoE of one layer over one chunk on the GPU (mirrors moe.cpp): FP32 router + route kernel (bias
// or V4 hash ids), routed experts as one stacked-weight linear per projection over the [T·K]
// (token, slot) rows, clamped SwiGLU with the routing weight, the shared expert, and the combine
// in slot order (ascending expert id) then the shared output.
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <vector>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;
constexpr int64_t kMaxGemvGroups = 65535;  // expert_gemv's grid limit (grid.y)

// Router of one MoE over every row: FP32 gate logits, then the route kernel (bias or V4 hash ids
// `tid2eid`) into scratch sel / weight [T·K] (`tag` prefixes the scratch names).
Status GpuModel::route(const FfnWeights& F, const int32_t* tid2eid, const std::string& tag, const GpuChunk& ctx,
                       const float* m, int64_t E, int64_t K, int32_t*& sel, float*& wt) {
  const auto& c = config();
  const int64_t T = ctx.T;
  FS_ASSIGN_OR_RETURN(float* logits, scratch<float>(tag + "logits", T * E));
  FS_ASSIGN_OR_RETURN(float* rs, scratch<float>(tag + "route", T * 2 * E));
  FS_ASSIGN_OR_RETURN(sel, scratch<int32_t>(tag + "sel", T * K));
  FS_ASSIGN_OR_RETURN(wt, scratch<float>(tag + "wt", T * K));
  FS_RETURN_IF_ERROR(linear(m, d(F.gate), T, c.hidden_size, E, logits, 0, false));
  cd::RouteArgs r;
  r.logits = logits, r.bias = d(F.bias), r.scratch = rs, r.T = T, r.E = E, r.K = K;
  if (tid2eid) r.tid2eid = tid2eid, r.tokens = ctx.d_tokens;
  r.gate_temp = float(c.gate_temp), r.route_scale = float(c.route_scale);
  r.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
  r.norm_topk = c.norm_topk_prob;
  r.renorm_eps = c.is_v41();
  r.sel = sel, r.weight = wt;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_route(r, stream_));
  return {};
}

Status GpuModel::moe(int l, GpuChunk& ctx, const float* m, float* out) {
  const auto& c = config();
  const FfnWeights& F = w_.layers[size_t(l)].ffn;
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, I = c.moe_inter_dim;
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok, TK = T * K;
  const float limit = float(c.swiglu_limit);
  int32_t* sel = nullptr;
  float* wt = nullptr;
  FS_RETURN_IF_ERROR(route(F, tid2eid_[size_t(l)].get(), "moe_", ctx, m, E, K, sel, wt));
  FS_RETURN_IF_ERROR(tp_remap_experts(sel, wt, TK));  // several GPUs: only this rank's experts

  // One SwiGLU expert pass over `rows` rows: stacked weights + sel, or a single matrix.
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  auto expert = [&](int64_t rows, const float* w1, const float* w3, const float* w2, const int32_t* s,
                    int64_t div, const float* weights, int64_t act, float* y) -> Status {
    FS_RETURN_IF_ERROR(linear(m, w1, rows, D, I, g, act, R, false, s, div));
    FS_RETURN_IF_ERROR(linear(m, w3, rows, D, I, u, act, R, false, s, div));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, weights, rows, I, limit, R, stream_));
    return linear(h, w2, rows, I, D, y, act, R, false, s, 1);
  };
  FS_ASSIGN_OR_RETURN(float* ybuf, scratch<float>("moe_y", TK * D));
  FS_ASSIGN_OR_RETURN(float* ys, scratch<float>("moe_ys", T * D));
  const size_t li = size_t(l);
  const int32_t* row_of = nullptr;  // pair (t, k)'s row of ybuf when not t·K + k
  const auto& ek = experts_[li];  // w1, w2, w3: FP32 stacks or as stored
  if (const NativeMatrix* n1 = native(ek[0]); n1 && n1->fast) {  // block-scaled expert GEMV (reference)
    FS_RETURN_IF_ERROR(moe_native(l, ctx, m, sel, wt, ybuf, &row_of));
  } else {
    FS_RETURN_IF_ERROR(expert(TK, ek[0], ek[2], ek[1], sel, K, wt, expert_act_block_, ybuf));
  }
  if (d(F.s_w1)) {
    FS_RETURN_IF_ERROR(expert(T, d(F.s_w1), d(F.s_w3), d(F.s_w2), nullptr, 1, nullptr, act_block_, ys));
  } else {  // the shared expert lives on another rank (gpu_tp.h)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memset_async(ys, 0, size_t(T * D) * 4, stream_));
  }
  // Several GPUs: each rank's combine is a partial sum; BF16 rounding after the all-reduce.
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine(ybuf, ys, out, T, K, D, R && !shard_.split(), stream_, row_of));
  FS_RETURN_IF_ERROR(tp_allreduce(out, T * D, R));
  return {};
}

// Routed experts in the checkpoint's format through the grouped expert GEMV (ops/cuda/gemv.h),
// with the rounding points of the FP32 path (BF16 gate/up, clamped SwiGLU with the routing
// weight, BF16 h). Few pairs (decode): every (token, slot) pair is its own group in slot order.
// More pairs than experts (batches, prefill chunks): the pairs are grouped by expert on the device
// (ops::group_pairs_by_expert) so each expert's matrices are read once for all its tokens, and the
// combine reads each pair's row from its sorted position. Both give the same bits for a pair: its
// dot products run in the same order (the k split is fixed by split_groups, tokens are
// independent MMA columns).
Status GpuModel::moe_native(int l, const GpuChunk& ctx, const float* m, const int32_t* sel, const float* wt,
                            float* ybuf, const int32_t** row_of) {
  const auto& c = config();
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, I = c.moe_inter_dim;
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok, TK = T * K;
  const auto& ek = experts_[size_t(l)];
  const NativeMatrix &n1 = *native(ek[0]), &n2 = *native(ek[1]), &n3 = *native(ek[2]);
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  const bool grouped = TK > E;
  const int32_t *gstart = nullptr, *gexpert = nullptr, *prow = nullptr;
  const float* pw = wt;
  int64_t n_groups = TK;
  *row_of = nullptr;
  if (grouped) {
    FS_ASSIGN_OR_RETURN(int32_t* d_gstart, scratch<int32_t>("moe_grp_start", E + 1));
    FS_ASSIGN_OR_RETURN(int32_t* d_prow, scratch<int32_t>("moe_grp_row", TK));
    FS_ASSIGN_OR_RETURN(float* d_w, scratch<float>("moe_grp_w", TK));
    FS_ASSIGN_OR_RETURN(int32_t* d_pos, scratch<int32_t>("moe_grp_pos", TK));
    if (expert_ids_.capacity() < size_t(E)) return internal_error("moe: expert id table not uploaded");
    // The route kernel only emits ids in [0, E): no range flag to read back.
    FS_CUDA_RETURN_IF_ERROR(
        cd::launch_moe_group(sel, wt, TK, E, K, d_gstart, d_prow, d_w, d_pos, nullptr, stream_));
    gstart = d_gstart, gexpert = expert_ids_.get(), prow = d_prow, pw = d_w, n_groups = E;
    *row_of = d_pos;
  } else {
    std::vector<int32_t> hstart(static_cast<size_t>(TK + 1)), hrow(static_cast<size_t>(TK));
    for (int64_t i = 0; i <= TK; ++i) hstart[size_t(i)] = int32_t(i);
    for (int64_t i = 0; i < TK; ++i) hrow[size_t(i)] = int32_t(i / K);
    FS_ASSIGN_OR_RETURN(int32_t* d_gstart, scratch<int32_t>("moe_nat_gstart", TK + 1));
    FS_ASSIGN_OR_RETURN(int32_t* d_prow, scratch<int32_t>("moe_nat_prow", TK));
    FS_RETURN_IF_ERROR(upload(d_gstart, hstart.data(), hstart.size() * 4));
    FS_RETURN_IF_ERROR(upload(d_prow, hrow.data(), hrow.size() * 4));
    gstart = d_gstart, gexpert = sel, prow = d_prow;
  }
  // y[s] = fq8(x[row(s)]) · W[expert of s]ᵀ for every (sorted) pair s.
  auto run = [&](const NativeMatrix& w, const float* x, const int32_t* rows, int64_t n_out, int64_t k,
                 float* y) -> Status {
    ops::ExpertGemvParams q;
    q.x = x, q.w = w.codes.get(), q.w_scale = w.scales.get();
    q.expert_stride = w.code_bytes, q.expert_scale_stride = w.scale_bytes;
    q.group_expert = gexpert, q.group_start = gstart, q.pair_row = rows;
    q.y = y;
    q.n_groups = n_groups, q.n_pairs = TK, q.n_experts = E, q.n = n_out, q.k = k;
    q.format = w.format, q.w_block = w.w_block, q.act_block = w.act_block;
    q.split_groups = K;  // the k split of a one-token step, whatever the batch (batch invariance)
    return ops::cuda::expert_gemv_cuda(q, stream_);
  };
  if (n_groups > kMaxGemvGroups) return invalid_argument("moe: {} routed pairs in one step (at most {})", TK, kMaxGemvGroups);
  FS_RETURN_IF_ERROR(run(n1, m, prow, I, D, g));
  FS_RETURN_IF_ERROR(run(n3, m, prow, I, D, u));
  if (R) {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(g, TK, I, I, 1, cd::QuantSim::kBf16, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(u, TK, I, I, 1, cd::QuantSim::kBf16, stream_));
  }
  FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, pw, TK, I, float(c.swiglu_limit), R, stream_));
  return run(n2, h, nullptr, D, I, ybuf);
}

}  // namespace flashseek::forward::gpu
#endif
