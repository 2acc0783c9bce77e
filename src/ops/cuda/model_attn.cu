// Attention, indexer and router kernels of the whole-model GPU forward (model_kernels.h): the
// GPU twins of ops::sparse_attention over the model's key list, ops::index_scores,
// ops::candidate_mask + ops::topk_indices and ops::route. Serial parts (softmax denominators,
// selections) run in the CPU's order so that ties and sums resolve the same way.
#include <cfloat>

#include "ops/cuda/model_device.cuh"
#include "ops/cuda/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// Key j of query row t: window rows first (oldest first), then compressed rows.
__device__ const float* attn_key(const ModelAttnArgs& a, int64_t t, int64_t j, int64_t n_win) {
  const int64_t p = a.start + t;
  if (j < n_win) {
    const int64_t s = p - n_win + 1 + j;
    return s >= a.start ? a.kv_chunk + (s - a.start) * a.Dh : a.ring + (s % a.ring_size) * a.Dh;
  }
  j -= n_win;
  const int64_t row = a.topk ? a.topk[t * a.topk_stride + j] : j;
  return a.ckv + row * a.Dh;
}

// One block per (query row, head). Shared: logits/probabilities of every key.
__global__ void model_attn_kernel(ModelAttnArgs a) {
  extern __shared__ float prob[];
  __shared__ float denom_s;
  const int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H, p = a.start + t;
  const int64_t n_win = p + 1 < a.window ? p + 1 : a.window;
  int64_t n_comp = 0;
  if (a.ckv) n_comp = a.topk ? a.topk_n[t] : (p + 1) / a.ratio;
  const int64_t n = n_win + n_comp;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    prob[j] = __fmul_rn(dev_dot_f32(q, attn_key(a, t, j, n_win), a.Dh), a.scale);
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, prob[j]);
    float den = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float e = dev_exp(prob[j] - m);
      den += e;
      prob[j] = a.bf16 ? dev_round_bf16(e) : e;
    }
    den += dev_exp(a.sink[h] - m);
    denom_s = den;
  }
  __syncthreads();
  float* o = a.out + (t * a.H + h) * a.Dh;
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc = mul_add(prob[j], attn_key(a, t, j, n_win)[d], acc);
    acc /= denom_s;
    o[d] = a.bf16 ? dev_round_bf16(acc) : acc;
  }
}

// grid (T, ceil(stride / 128)), one thread per key (ops::index_scores order).
__global__ void index_scores_kernel(IndexScoreArgs a) {
  const int64_t t = blockIdx.x, i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t clen = (a.start + t + 1) / a.ratio;
  if (i >= clen) return;
  const float* k = a.keys + i * a.dI;
  float s = 0;
  for (int64_t h = 0; h < a.nI; ++h) {
    float d = dev_dot_f32(a.q + (t * a.nI + h) * a.dI, k, a.dI);
    if (a.bf16) d = dev_round_bf16(d);
    float v = __fmul_rn(fmaxf(d, 0.0f), a.w[t * a.nI + h]);
    if (a.bf16) v = dev_round_bf16(v);
    s = __fadd_rn(s, v);
  }
  a.scores[t * a.stride + i] = a.bf16 ? dev_round_bf16(s) : s;
}

constexpr int kTopkThreads = 256;

// Block-wide argmax over v[0, n) among entries with ok(v) (value desc, index asc); -1 if none.
template <typename Ok>
__device__ int64_t block_argmax(const float* v, int64_t n, Ok ok, float* sv, int64_t* si) {
  float bv = 0;
  int64_t bi = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float x = v[i];
    if (!ok(x)) continue;
    if (bi < 0 || x > bv) bv = x, bi = i;  // ascending scan: equal values keep the lower index
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) {
      const float ov = sv[threadIdx.x + w];
      const int64_t oi = si[threadIdx.x + w];
      const int64_t ci = si[threadIdx.x];
      if (oi >= 0 && (ci < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < ci)))
        sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  const int64_t r = si[0];
  __syncthreads();
  return r;
}

__global__ void index_topk_kernel(IndexTopkArgs a) {
  __shared__ float sv[kTopkThreads];
  __shared__ int64_t si[kTopkThreads];
  const int64_t t = blockIdx.x, clen = (a.start + t + 1) / a.ratio;
  float* s = a.scores + t * a.stride;
  uint8_t* cand = a.cand + t * a.stride;
  uint8_t* taken = a.taken + t * a.stride;
  for (int64_t i = threadIdx.x; i < clen; i += blockDim.x) taken[i] = 0;
  if (a.mode == 1) {  // candidate mask: best blocks by max score, the last (partial) block pinned
    float* b = a.block_scratch + t * a.stride;
    const int64_t nb = (clen + a.cand_block - 1) / a.cand_block;
    for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
      float m = -INFINITY;
      for (int64_t i = j * a.cand_block; i < clen && i < (j + 1) * a.cand_block; ++i) m = fmaxf(m, s[i]);
      b[j] = j == (clen - 1) / a.cand_block ? INFINITY : m;
    }
    for (int64_t i = threadIdx.x; i < clen; i += blockDim.x) cand[i] = 0;
    __syncthreads();
    for (int64_t it = 0; it < a.cand_top && it < nb; ++it) {
      const int64_t j = block_argmax(b, nb, [](float x) { return x > -INFINITY; }, sv, si);
      if (j < 0) break;
      if (threadIdx.x == 0) b[j] = -INFINITY;
      for (int64_t i = j * a.cand_block + threadIdx.x; i < clen && i < (j + 1) * a.cand_block; i += blockDim.x)
        cand[i] = 1;
      __syncthreads();
    }
  } else if (a.mode == 2) {
    for (int64_t i = threadIdx.x; i < clen; i += blockDim.x)
      if (!cand[i]) s[i] = -INFINITY;
  }
  __syncthreads();
  for (int64_t it = 0; it < a.k; ++it) {
    const int64_t i = block_argmax(s, clen, [](float x) { return isfinite(x); }, sv, si);
    if (i < 0) break;
    if (threadIdx.x == 0) taken[i] = 1, s[i] = -INFINITY;
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  int32_t n = 0;
  for (int64_t i = 0; i < clen; ++i)
    if (taken[i]) a.out[t * a.k + n++] = int32_t(i);
  a.out_n[t] = n;
}

// One thread per token (ops::route).
__global__ void route_kernel(RouteArgs a) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const int64_t E = a.E, K = a.K;
  const float* lg = a.logits + t * E;
  float* score = a.scratch + t * 2 * E;
  float* key = score + E;
  if (a.sqrtsoftplus) {
    for (int64_t e = 0; e < E; ++e) {
      const float x = lg[e] / a.gate_temp;
      score[e] = sqrtf(x > 20.0f ? x : dev_log1p(dev_exp(x)));
    }
  } else {
    float m = lg[0] / a.gate_temp;
    for (int64_t e = 1; e < E; ++e) m = fmaxf(m, lg[e] / a.gate_temp);
    float s = 0;
    for (int64_t e = 0; e < E; ++e) s += (score[e] = dev_exp(lg[e] / a.gate_temp - m));
    for (int64_t e = 0; e < E; ++e) score[e] /= s;
  }
  int32_t* sel = a.sel + t * K;
  if (a.tid2eid) {
    for (int64_t i = 0; i < K; ++i) sel[i] = a.tid2eid[int64_t(a.tokens[t]) * K + i];
  } else {
    for (int64_t e = 0; e < E; ++e) key[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
    for (int64_t i = 0; i < K; ++i) {
      int64_t bi = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (isnan(key[e])) continue;  // taken
        if (bi < 0 || key[e] > key[bi]) bi = e;
      }
      sel[i] = int32_t(bi);
      key[bi] = NAN;
    }
  }
  for (int64_t i = 1; i < K; ++i)  // ascending expert id
    for (int64_t j = i; j > 0 && sel[j] < sel[j - 1]; --j) {
      const int32_t x = sel[j];
      sel[j] = sel[j - 1];
      sel[j - 1] = x;
    }
  float sum = 0;
  for (int64_t i = 0; i < K; ++i) sum += score[sel[i]];
  for (int64_t i = 0; i < K; ++i) {
    float w = score[sel[i]];
    if (a.norm_topk) {
      if (!a.renorm_eps) w /= sum;
      else if (K > 1) w /= (sum + 1e-20f);
    }
    a.weight[t * K + i] = w * a.route_scale;
  }
}

}  // namespace

cudaError_t launch_model_attention(const ModelAttnArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.Dh <= 0 || a.H <= 0 || a.window <= 0 || (a.ckv && !a.topk && a.ratio <= 0)) return cudaErrorInvalidValue;
  const size_t smem = size_t(a.max_keys) * sizeof(float);
  if (smem > 200 * 1024) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(model_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  model_attn_kernel<<<unsigned(a.T * a.H), 128, smem, s>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_index_scores(const IndexScoreArgs& a, cudaStream_t s) {
  if (a.T == 0 || a.stride == 0) return cudaSuccess;
  if (a.ratio <= 0 || a.T > 65535 * 1024) return cudaErrorInvalidValue;
  index_scores_kernel<<<dim3(unsigned(a.T), unsigned((a.stride + 127) / 128)), 128, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_index_topk(const IndexTopkArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.ratio <= 0 || a.k <= 0 || (a.mode == 1 && a.cand_block <= 0)) return cudaErrorInvalidValue;
  index_topk_kernel<<<unsigned(a.T), kTopkThreads, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.K <= 0 || a.K > a.E) return cudaErrorInvalidValue;
  route_kernel<<<unsigned((a.T + 63) / 64), 64, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
