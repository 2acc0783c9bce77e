// Manifold-constrained hyper-connections (v4 §3.3, V4.1 single-pass data flow v41 §2 item 1).
// The residual is `hc` streams of width `dim`, stored [rows, hc, dim] (stream-major per row).
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct HcMixParams {
  const float* x = nullptr;      // [rows, hc, dim] current residual streams
  const float* fn = nullptr;     // [(2 + hc) · hc, hc · dim] hc_*_fn
  const float* base = nullptr;   // [(2 + hc) · hc] hc_*_base
  const float* scale = nullptr;  // [3] (α_pre, α_post, α_comb)
  int64_t rows = 0, hc = 4, dim = 0;
  float norm_eps = 1e-6f;        // rms_norm_eps of the scalar rsqrt over the flattened streams
  float hc_eps = 1e-6f;
  int64_t sinkhorn_iters = 20;
  float* pre = nullptr;          // [rows, hc]    sigmoid(..) + hc_eps
  float* post = nullptr;         // [rows, hc]    2 · sigmoid(..)
  float* comb = nullptr;         // [rows, hc, hc] Sinkhorn-normalised P[j][k]
};
// Computes the three coefficient sets of every row (FP32, Sinkhorn order of v4 §3.3 step 7).
void hc_mixes(const HcMixParams& p);

// u[r] = Σ_i pre[r, i] · x[r, i, :] in FP32 (optionally rounded to BF16).
void hc_collapse(const float* x, const float* pre, float* u, int64_t rows, int64_t hc, int64_t dim,
                 bool bf16_out);

// x_out[r, k] = post[r, k] · f[r] + Σ_j comb[r, j, k] · x[r, j]  (comb transposed: sum over the
// first index, v4 §3.3 step 9). x_out may alias x.
void hc_post(const float* f, const float* x, const float* post, const float* comb, float* x_out,
             int64_t rows, int64_t hc, int64_t dim, bool bf16_out);

// V4 final collapse weights (v4 §3.7): pre_i = sigmoid(μ_i·scale + base_i) + hc_eps with
// μ = (fn · flatten(x)) · rsqrt(mean(x²) + eps). fn [hc, hc·dim], base [hc], scale [1].
void hc_head_pre(const float* x, const float* fn, const float* base, const float* scale,
                 float* pre, int64_t rows, int64_t hc, int64_t dim, float norm_eps, float hc_eps);

}  // namespace flashseek::ops
