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

Status GpuModel::moe(int l, GpuChunk& ctx, const float* m, float* out) {
  const auto& c = config();
  const FfnWeights& F = w_.layers[size_t(l)].ffn;
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, I = c.moe_inter_dim;
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok, TK = T * K;
  const float limit = float(c.swiglu_limit);
  FS_ASSIGN_OR_RETURN(float* logits, scratch<float>("moe_logits", T * E));
  FS_ASSIGN_OR_RETURN(float* rs, scratch<float>("moe_route", T * 2 * E));
  FS_ASSIGN_OR_RETURN(int32_t* sel, scratch<int32_t>("moe_sel", TK));
  FS_ASSIGN_OR_RETURN(float* wt, scratch<float>("moe_wt", TK));
  FS_RETURN_IF_ERROR(linear(m, d(F.gate), T, D, E, logits, 0, false));
  cd::RouteArgs r;
  r.logits = logits, r.bias = d(F.bias), r.scratch = rs, r.T = T, r.E = E, r.K = K;
  if (tid2eid_[size_t(l)].get()) r.tid2eid = tid2eid_[size_t(l)].get(), r.tokens = ctx.d_tokens;
  r.gate_temp = float(c.gate_temp), r.route_scale = float(c.route_scale);
  r.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
  r.norm_topk = c.norm_topk_prob;
  r.renorm_eps = c.is_v41();
  r.sel = sel, r.weight = wt;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_route(r, stream_));
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
  if (nw1_.size() > li && nw1_[li].codes.get()) {  // routed experts kept as stored (FP4 / FP8)
    FS_RETURN_IF_ERROR(moe_native(l, ctx, m, sel, wt, ybuf));
  } else {
    FS_RETURN_IF_ERROR(expert(TK, w1_[li].get(), w3_[li].get(), w2_[li].get(), sel, K, wt, expert_act_block_, ybuf));
  }
  if (d(F.s_w1)) {
    FS_RETURN_IF_ERROR(expert(T, d(F.s_w1), d(F.s_w3), d(F.s_w2), nullptr, 1, nullptr, act_block_, ys));
  } else {  // the shared expert lives on another rank (gpu_tp.h)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memset_async(ys, 0, size_t(T * D) * 4, stream_));
  }
  // Several GPUs: each rank's combine is a partial sum; BF16 rounding after the all-reduce.
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine(ybuf, ys, out, T, K, D, R && !shard_.split(), stream_));
  FS_RETURN_IF_ERROR(tp_allreduce(out, T * D, R));
  return {};
}

// Routed experts in the checkpoint's format through the grouped expert GEMV (ops/cuda/gemv.h):
// every (token, slot) pair is its own group, in slot order (group expert = sel, input row =
// pair / K), so the outputs land in ybuf's slot order without a permutation; the rounding points
// are those of the FP32 path (BF16 gate/up, clamped SwiGLU with the routing weight, BF16 h).
Status GpuModel::moe_native(int l, const GpuChunk& ctx, const float* m, const int32_t* sel, const float* wt,
                            float* ybuf) {
  const auto& c = config();
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, I = c.moe_inter_dim;
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok, TK = T * K;
  const NativeMatrix &n1 = nw1_[size_t(l)], &n2 = nw2_[size_t(l)], &n3 = nw3_[size_t(l)];
  constexpr int64_t kMaxGroups = 65535;  // expert_gemv's grid limit: pairs go in chunks
  std::vector<int32_t> gstart(static_cast<size_t>(std::min(TK, kMaxGroups) + 1));
  std::vector<int32_t> prow(static_cast<size_t>(TK));
  for (size_t i = 0; i < gstart.size(); ++i) gstart[i] = int32_t(i);
  for (int64_t i = 0; i < TK; ++i) prow[size_t(i)] = int32_t(i / K);
  FS_ASSIGN_OR_RETURN(int32_t* d_gstart, scratch<int32_t>("moe_nat_gstart", int64_t(gstart.size())));
  FS_ASSIGN_OR_RETURN(int32_t* d_prow, scratch<int32_t>("moe_nat_prow", TK));
  FS_RETURN_IF_ERROR(upload(d_gstart, gstart.data(), gstart.size() * 4));
  FS_RETURN_IF_ERROR(upload(d_prow, prow.data(), prow.size() * 4));
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  // y[p] = fq8(x[row(p)]) · W[sel[p]]ᵀ for the pairs [p0, p0 + n).
  auto run = [&](const NativeMatrix& w, const float* x, const int32_t* rows, int64_t n_out, int64_t k,
                 float* y) -> Status {
    for (int64_t p0 = 0; p0 < TK; p0 += kMaxGroups) {
      const int64_t n = std::min(kMaxGroups, TK - p0);
      ops::ExpertGemvParams q;
      q.x = x, q.w = w.codes.get(), q.w_scale = w.scales.get();
      q.expert_stride = w.code_bytes, q.expert_scale_stride = w.scale_bytes;
      q.group_expert = sel + p0, q.group_start = d_gstart, q.pair_row = rows ? rows + p0 : nullptr;
      q.y = y + p0 * n_out;
      q.n_groups = n, q.n_pairs = n, q.n_experts = E, q.n = n_out, q.k = k;
      q.format = w.format, q.w_block = w.w_block, q.act_block = w.act_block;
      if (!rows) q.x = x + p0 * k;  // inputs already in pair order
      FS_RETURN_IF_ERROR(ops::cuda::expert_gemv_cuda(q, stream_));
    }
    return {};
  };
  FS_RETURN_IF_ERROR(run(n1, m, d_prow, I, D, g));
  FS_RETURN_IF_ERROR(run(n3, m, d_prow, I, D, u));
  if (R) {
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(g, TK, I, I, 1, cd::QuantSim::kBf16, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(u, TK, I, I, 1, cd::QuantSim::kBf16, stream_));
  }
  FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, wt, TK, I, float(c.swiglu_limit), R, stream_));
  return run(n2, h, nullptr, D, I, ybuf);
}

}  // namespace flashseek::forward::gpu
#endif
