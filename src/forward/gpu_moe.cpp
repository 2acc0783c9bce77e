// MoE of one layer over one chunk on the GPU (mirrors moe.cpp): FP32 router + route kernel (bias
// or V4 hash ids), routed experts as one stacked-weight linear per projection over the [T·K]
// (token, slot) rows, clamped SwiGLU with the routing weight, the shared expert, and the combine
// in slot order (ascending expert id) then the shared output.
#include "forward/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include "forward/gpu_impl.h"
#include "ops/cuda/model_kernels.h"

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
  FS_CUDA_RETURN_IF_ERROR(cd::launch_route(r, 0));
  FS_RETURN_IF_ERROR(tp_remap_experts(sel, wt, TK));  // several GPUs: only this rank's experts

  // One SwiGLU expert pass over `rows` rows: stacked weights + sel, or a single matrix.
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("moe_h", TK * I));
  auto expert = [&](int64_t rows, const float* w1, const float* w3, const float* w2, const int32_t* s,
                    int64_t div, const float* weights, int64_t act, float* y) -> Status {
    FS_RETURN_IF_ERROR(linear(m, w1, rows, D, I, g, act, R, false, s, div));
    FS_RETURN_IF_ERROR(linear(m, w3, rows, D, I, u, act, R, false, s, div));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, weights, rows, I, limit, R, 0));
    return linear(h, w2, rows, I, D, y, act, R, false, s, 1);
  };
  FS_ASSIGN_OR_RETURN(float* ybuf, scratch<float>("moe_y", TK * D));
  FS_ASSIGN_OR_RETURN(float* ys, scratch<float>("moe_ys", T * D));
  const size_t li = size_t(l);
  FS_RETURN_IF_ERROR(expert(TK, w1_[li].get(), w3_[li].get(), w2_[li].get(), sel, K, wt, expert_act_block_, ybuf));
  if (d(F.s_w1)) {
    FS_RETURN_IF_ERROR(expert(T, d(F.s_w1), d(F.s_w3), d(F.s_w2), nullptr, 1, nullptr, act_block_, ys));
  } else {  // the shared expert lives on another rank (gpu_tp.h)
    FS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ys, 0, size_t(T * D) * 4, 0));
  }
  // Several GPUs: each rank's combine is a partial sum; BF16 rounding after the all-reduce.
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine(ybuf, ys, out, T, K, D, R && !shard_.split(), 0));
  FS_RETURN_IF_ERROR(tp_allreduce(out, T * D, R));
  return {};
}

}  // namespace flashseek::forward::gpu
#endif
