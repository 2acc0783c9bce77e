// Attention kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of
// ops::sparse_attention over the model's key list (window rows, then compressed rows). The softmax
// denominator runs in the CPU's order so that sums resolve the same way.
//
// Two kernels with the same bits (ModelAttnArgs::kernel):
//   former  one block per (query row, head); each thread a whole dot, rows decoded on load per value
//           and per head. Any Dh; the fallback.
//   staged  (sm_90+, Dh <= 1024) one cluster of `cs` blocks per (query row, group of 4 heads). Key
//           rows are decoded once per block into shared memory (FP32, the same exact products) and
//           serve the 4 heads (all heads read the same rows). Logits: the cluster's blocks split the
//           keys; 8 lanes per (key, all 4 heads), lane k owning the dot's partial s[k] (elements
//           i % 8 == k in increasing i: dev_dot_f32_ld's short order) and the 8 partials combined
//           by the same fixed tree through shuffles. Max and exp(logit - max) per block range,
//           max exchanged through distributed shared memory; every block then holds all e_j of its
//           heads. P·V: the blocks split Dh; each thread owns (head, 4 / 2 / 1 dims) and walks the
//           keys in order, summing the denominator in the same order itself (no serial softmax
//           step). Rows are staged in chunks; each thread issues the loads of several of its
//           quads before decoding any.
#include <cooperative_groups.h>

#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// Key j of query row t: window rows first (oldest first), then compressed rows. Ring and
// compressed rows are in their row formats (decoded on load), chunk rows FP32.
__device__ CacheRowRef attn_key(const ModelAttnArgs& a, int64_t t, int64_t j, int64_t n_win) {
  const int64_t p = a.start + t;
  if (j < n_win) {
    const int64_t s = p - n_win + 1 + j;
    if (s >= a.start)
      return {reinterpret_cast<const uint8_t*>(a.kv_chunk + (s - a.start) * a.Dh), CacheRowFormat{}};
    return {static_cast<const uint8_t*>(a.ring) + (s % a.ring_size) * cache_row_stride(a.ring_fmt, a.Dh), a.ring_fmt};
  }
  j -= n_win;
  const int64_t row = a.topk ? a.topk[t * a.topk_stride + j] : j;
  return {static_cast<const uint8_t*>(a.ckv) + row * cache_row_stride(a.ckv_fmt, a.Dh), a.ckv_fmt};
}

// With several sequences in one launch (launch_model_attention_seqs): row t's sequence replaces
// the per-sequence fields of a, and t becomes the row's index in that sequence.
__device__ __forceinline__ void attn_row_seq(ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                             int64_t& t) {
  const ModelAttnSeq sq = seqs[row_seq[t]];
  a.q += sq.row0 * a.H * a.Dh;
  a.out += sq.row0 * a.H * a.Dh;
  a.kv_chunk += sq.row0 * a.Dh;
  if (a.topk) a.topk += sq.row0 * a.topk_stride, a.topk_n += sq.row0;
  a.ring = sq.ring, a.ring_size = sq.ring_size, a.start = sq.start;
  if (a.ckv) a.ckv = sq.ckv ? sq.ckv : static_cast<const void*>(a.kv_chunk);  // no compressed rows yet: never read
  t -= sq.row0;
}

// One block per (query row, head). Shared: logits/probabilities of every key. With `seqs`, the
// row's sequence replaces the per-sequence fields and t becomes the row's index in it.
__global__ void model_attn_kernel(ModelAttnArgs a, const ModelAttnSeq* seqs, const int32_t* row_seq) {
  extern __shared__ float prob[];
  __shared__ float denom_s;
  int64_t t = blockIdx.x / a.H;
  if (seqs) attn_row_seq(a, seqs, row_seq, t);
  const int64_t h = blockIdx.x % a.H, p = a.start + t;
  const int64_t n_win = p + 1 < a.window ? p + 1 : a.window;
  int64_t n_comp = 0;
  if (a.ckv) n_comp = a.topk ? a.topk_n[t] : (p + 1) / a.ratio;
  const int64_t n = n_win + n_comp;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    prob[j] = __fmul_rn(dev_dot_f32_ld(q, attn_key(a, t, j, n_win), a.Dh), a.scale);
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
  if (a.Dh % 4 == 0) {  // four outputs per thread from one load per key; each output's sum as below
    for (int64_t d = 4 * int64_t(threadIdx.x); d < a.Dh; d += 4 * int64_t(blockDim.x)) {
      float acc[4] = {0, 0, 0, 0};
      for (int64_t j = 0; j < n; ++j) {
        float w[4];
        attn_key(a, t, j, n_win).load4(d, w);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] = mul_add(prob[j], w[c], acc[c]);
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float r = acc[c] / denom_s;
        o[d + c] = a.bf16 ? dev_round_bf16(r) : r;
      }
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc = mul_add(prob[j], attn_key(a, t, j, n_win)(d), acc);
    acc /= denom_s;
    o[d] = a.bf16 ? dev_round_bf16(acc) : acc;
  }
}


// ---- the staged kernel ---------------------------------------------------------------------

namespace cg = cooperative_groups;

constexpr int kFaHeads = 4;          // heads per block (and per cluster)
constexpr int kFaThreads = 256;
constexpr int kFaMaxCluster = 8;     // portable cluster size
constexpr int kFaChunk = 256;        // rows of one staged P·V chunk at most
constexpr int kFaLut = 256 + 256 + 16;
constexpr size_t kFaSmemCap = 200 * 1024;
// Shared memory: refs [lde] (each key's row address), lut (kFaLut floats), mx (8 floats), qs
// [4][ld], ep [4][lde] float2 (logit, then e_j and its probability), stage [stage_floats], kinds
// [lde] (each key's row format: 0 chunk FP32, 1 ring, 2 compressed). Offsets up to kinds are
// multiples of 16 bytes (lde is even).
constexpr size_t kFaFixedBytes = size_t(kFaLut + 8) * 4;

struct FaPlan {
  int cs = 1;                 // blocks per cluster
  int rows = 32;              // key rows per logits chunk (<= 32: one 8-lane group per row)
  int64_t ld = 0;             // floats between staged full rows and between q rows: Dh rounded up to 32, + 8
  int64_t lde = 0;            // entries between the ep rows of two heads: max_keys rounded up to 32, + 4
  int64_t stage_floats = 0;   // rows * ld
  int64_t qpb = 0;            // quads of dims per block in P·V
  bool wide = false;          // the <2, 2> build (clusters of 1, at least two blocks per SM to run)
};

inline size_t fa_smem_bytes(const FaPlan& p) {
  return kFaFixedBytes + size_t(p.lde) * 9 + size_t(kFaHeads) * size_t(p.ld + 2 * p.lde) * 4 +
         size_t(p.stage_floats) * 4;
}

// Value d of a row of format f (cache_row_value) with the code values from the block's tables
// (lut: e4m3 [0, 256), E8M0 [256, 512), e2m1 [512, 528), each entry the dev_*_value of its code).
__device__ __forceinline__ float fa_value(const CacheRowFormat& f, const uint8_t* row, int64_t d, const float* lut) {
  if (f.codec == RowCodec::kF32) return reinterpret_cast<const float*>(row)[d];
  if (d >= f.coded) {
    const uint8_t* t = row + f.tail_offset() + 2 * (d - f.coded);
    return __uint_as_float((uint32_t(t[0]) | (uint32_t(t[1]) << 8)) << 16);
  }
  const uint32_t sb = row[f.scale_offset() + d / f.block];
  const float s = f.codec == RowCodec::kFp4E4m3 ? lut[sb] : lut[256 + sb];
  const float c = f.fp4() ? lut[512 + ((uint32_t(row[d >> 1]) >> (4 * (d & 1))) & 15u)] : lut[row[d]];
  return __fmul_rn(c, s);
}

// Decodes values [d0, d1) (d0 % 4 == 0) of the cnt keys whose row addresses and kinds are
// refs[0, cnt), kinds[0, cnt) into stage[i * ld + (d - d0)]. Block-wide, with barriers before (the
// previous chunk's readers) and after.
template <int kB>
__device__ __forceinline__ void fa_stage(const ModelAttnArgs& a, int cnt, int64_t d0, int64_t d1, int64_t ld,
                                         const uint8_t* const* refs, const uint8_t* kinds, const float* lut,
                                         float* stage) {
  __syncthreads();
  // Batches of kB items per thread: first every item's addresses, then all loads (independent,
  // so they are in flight together), then decoding. Quads in the coded part of a row (blocks of a
  // multiple of 4) and aligned FP32 quads take one load (+ the scale byte); the rest (BF16 tails,
  // other blocks, unaligned FP32 rows, the last quad of an odd Dh) go value by value.
  const CacheRowFormat f32{};
  const int64_t nq = (d1 - d0 + 3) / 4, total = cnt * nq;
  for (int64_t base = threadIdx.x; base < total; base += kB * int64_t(blockDim.x)) {
    int mode[kB], kd[kB], ii[kB], dd[kB];  // mode 0: no item, 1: FP32 x4, 2: e4m3 x4, 3: e2m1 x4, 4: value by value
    const uint8_t *src[kB], *ssrc[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const int64_t it = base + int64_t(b) * blockDim.x;
      mode[b] = 0, kd[b] = 0, ii[b] = 0, dd[b] = 0;
      src[b] = ssrc[b] = nullptr;
      if (it >= total) continue;
      const int i = int(it / nq), d = int(d0 + 4 * (it % nq));  // i < cnt <= kFaChunk, d < Dh <= 1024
      const uint8_t* row = refs[i];
      kd[b] = kinds[i], ii[b] = i, dd[b] = d;
      const CacheRowFormat f = kd[b] == 0 ? f32 : kd[b] == 1 ? a.ring_fmt : a.ckv_fmt;
      mode[b] = 4;
      if (d + 3 < d1) {
        if (f.codec == RowCodec::kF32) {
          if ((reinterpret_cast<uintptr_t>(row + 4 * d) & 15) == 0) mode[b] = 1, src[b] = row + 4 * d;
        } else if (d + 3 < f.coded && f.block % 4 == 0) {
          mode[b] = f.fp4() ? 3 : 2;
          src[b] = f.fp4() ? row + (d >> 1) : row + d;
          ssrc[b] = row + f.scale_offset() + d / f.block;
        }
      }
    }
    uint4 raw[kB];
    uint32_t sb[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      raw[b] = make_uint4(0, 0, 0, 0), sb[b] = 0;
      if (mode[b] == 1) raw[b] = *reinterpret_cast<const uint4*>(src[b]);
      if (mode[b] == 2) raw[b].x = *reinterpret_cast<const uint32_t*>(src[b]);
      if (mode[b] == 3) raw[b].x = *reinterpret_cast<const uint16_t*>(src[b]);
      if (mode[b] == 2 || mode[b] == 3) sb[b] = *ssrc[b];
    }
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      if (mode[b] == 0) continue;
      const CacheRowFormat f = kd[b] == 0 ? f32 : kd[b] == 1 ? a.ring_fmt : a.ckv_fmt;
      float v[4];
      if (mode[b] == 1) {
        v[0] = __uint_as_float(raw[b].x), v[1] = __uint_as_float(raw[b].y);
        v[2] = __uint_as_float(raw[b].z), v[3] = __uint_as_float(raw[b].w);
      } else if (mode[b] == 4) {
#pragma unroll
        for (int c = 0; c < 4; ++c) v[c] = dd[b] + c < d1 ? fa_value(f, refs[ii[b]], dd[b] + c, lut) : 0.0f;
      } else {  // cache_row_value4: code · scale, exact products
        const float s = f.codec == RowCodec::kFp4E4m3 ? lut[sb[b]] : lut[256 + sb[b]];
        const uint32_t w = raw[b].x;
#pragma unroll
        for (int c = 0; c < 4; ++c)
          v[c] = __fmul_rn(mode[b] == 3 ? lut[512 + ((w >> (4 * c)) & 15u)] : lut[(w >> (8 * c)) & 255u], s);
      }
      // ld and d - d0 are multiples of 4: 16-byte aligned
      *reinterpret_cast<float4*>(stage + ii[b] * ld + (dd[b] - d0)) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
  __syncthreads();
}

// P·V of one block: dims [d0, d1) (wd = the staged width, a multiple of 4) of its heads, keys in
// order. Item it = group * 4 + head owns V consecutive dims (U items per thread at most); every
// thread also sums its head's denominator in key order.
template <int kB, int V, int U>
__device__ __forceinline__ void fa_pv(const ModelAttnArgs& a, int64_t t, int64_t n, int64_t d0, int64_t d1,
                                      int64_t wd, int64_t stage_floats, int hb, int64_t h0, const float2* ep,
                                      int64_t lde, const float* mxg, const uint8_t* const* refs,
                                      const uint8_t* kinds, const float* lut, float* stage) {
  const int tid = int(threadIdx.x);
  const int64_t nitem = kFaHeads * (wd / V);
  const int hh = tid % kFaHeads;  // the same head for each of the thread's items (kFaThreads % 4 == 0)
  const float2* eh = ep + hh * lde;
  const int64_t rows2 = stage_floats / wd < kFaChunk ? stage_floats / wd : kFaChunk;
  float acc[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int c = 0; c < V; ++c) acc[u][c] = 0;
  float den = 0;
  for (int64_t c0 = 0; c0 < n; c0 += rows2) {
    const int cnt = int(n - c0 < rows2 ? n - c0 : rows2);
    fa_stage<kB>(a, cnt, d0, d1, wd, refs + c0, kinds + c0, lut, stage);
#pragma unroll 2
    for (int jj = 0; jj < cnt; ++jj) {
      const float2 e = eh[c0 + jj];  // (e_j, its probability)
      den = __fadd_rn(den, e.x);
      const float* vr = stage + int64_t(jj) * wd;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t it = tid + int64_t(kFaThreads) * u;
        if (it < nitem) {
          float v[V];
          const float* src = vr + V * (it / kFaHeads);
          if constexpr (V == 4) {
            const float4 w = *reinterpret_cast<const float4*>(src);
            v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
          } else if constexpr (V == 2) {
            const float2 w = *reinterpret_cast<const float2*>(src);
            v[0] = w.x, v[1] = w.y;
          } else {
            v[0] = *src;
          }
#pragma unroll
          for (int c = 0; c < V; ++c) acc[u][c] = mul_add(e.y, v[c], acc[u][c]);
        }
      }
    }
  }
  if (hh >= hb) return;
  den = __fadd_rn(den, dev_exp(a.sink[h0 + hh] - mxg[hh]));
  float* o = a.out + (t * a.H + h0 + hh) * a.Dh;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t it = tid + int64_t(kFaThreads) * u;
    if (it >= nitem) continue;
    const int64_t d = d0 + V * (it / kFaHeads);
#pragma unroll
    for (int c = 0; c < V; ++c) {
      if (d + c >= d1) break;
      const float r = acc[u][c] / den;
      o[d + c] = a.bf16 ? dev_round_bf16(r) : r;
    }
  }
}

// One cluster of p.cs blocks per (query row, group of kFaHeads heads); blockIdx.x = cluster *
// p.cs + rank. With `seqs` as model_attn_kernel. Two builds: <8, 1> (8 loads in flight per
// thread, one block per SM: decode, few blocks) and <2, 2> (two blocks per SM, one's staging
// under the other's arithmetic: many rows, clusters of 1).
template <int kB, int kMinBlocks>
__global__ void __launch_bounds__(kFaThreads, kMinBlocks)
    model_attn_staged_kernel(ModelAttnArgs a, const ModelAttnSeq* seqs, const int32_t* row_seq, FaPlan pl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char fa_smem[];
  const uint8_t** refs = reinterpret_cast<const uint8_t**>(fa_smem);
  float* lut = reinterpret_cast<float*>(refs + pl.lde);
  float* mx = lut + kFaLut;          // [0, 4): this block's max per head; [4, 8): the cluster's
  float* qs = mx + 8;
  float2* ep = reinterpret_cast<float2*>(qs + kFaHeads * pl.ld);
  float* stage = reinterpret_cast<float*>(ep + kFaHeads * pl.lde);
  uint8_t* kinds = reinterpret_cast<uint8_t*>(stage + pl.stage_floats);
  const int cs = pl.cs, tid = int(threadIdx.x);
  cg::cluster_group cl = cg::this_cluster();
  const int rank = cs > 1 ? int(cl.block_rank()) : 0;
  const int64_t G = (a.H + kFaHeads - 1) / kFaHeads, cid = int64_t(blockIdx.x) / cs;
  int64_t t = cid / G;
  const int64_t h0 = (cid % G) * kFaHeads;
  if (seqs) attn_row_seq(a, seqs, row_seq, t);
  const int hb = int(a.H - h0 < kFaHeads ? a.H - h0 : kFaHeads);
  const int64_t p = a.start + t;
  const int64_t n_win = p + 1 < a.window ? p + 1 : a.window;
  int64_t n_comp = 0;
  if (a.ckv) n_comp = a.topk ? a.topk_n[t] : (p + 1) / a.ratio;
  const int64_t n = n_win + n_comp;

  for (int64_t j = tid; j < n; j += kFaThreads) {  // attn_key of every key, the format as a kind
    if (j < n_win) {
      const int64_t s = p - n_win + 1 + j;
      if (s >= a.start) {
        refs[j] = reinterpret_cast<const uint8_t*>(a.kv_chunk + (s - a.start) * a.Dh), kinds[j] = 0;
      } else {
        refs[j] = static_cast<const uint8_t*>(a.ring) + (s % a.ring_size) * cache_row_stride(a.ring_fmt, a.Dh);
        kinds[j] = 1;
      }
    } else {
      const int64_t row = a.topk ? a.topk[t * a.topk_stride + (j - n_win)] : j - n_win;
      refs[j] = static_cast<const uint8_t*>(a.ckv) + row * cache_row_stride(a.ckv_fmt, a.Dh), kinds[j] = 2;
    }
  }
  for (int i = tid; i < kFaLut; i += kFaThreads)
    lut[i] = i < 256 ? dev_e4m3_value(uint32_t(i)) : i < 512 ? dev_e8m0_value(uint32_t(i - 256))
                                                             : dev_e2m1_value(uint32_t(i - 512));
  const float* q = a.q + (t * a.H + h0) * a.Dh;
  for (int64_t i = tid; i < kFaHeads * a.Dh; i += kFaThreads)
    qs[(i / a.Dh) * pl.ld + i % a.Dh] = i < hb * a.Dh ? q[i] : 0.0f;

  // Logits of this block's keys [k0, k1): group grp of 8 lanes per key row, lane `part` owns the
  // partial sums s[part] of the 4 heads.
  const int64_t kpb = (n + cs - 1) / cs;
  const int64_t k0 = rank * kpb < n ? rank * kpb : n, k1 = k0 + kpb < n ? k0 + kpb : n;
  const int grp = tid >> 3, part = tid & 7;
  for (int64_t c0 = k0; c0 < k1; c0 += pl.rows) {
    const int cnt = int(k1 - c0 < pl.rows ? k1 - c0 : pl.rows);
    fa_stage<kB>(a, cnt, 0, a.Dh, pl.ld, refs + c0, kinds + c0, lut, stage);
    for (int i = grp; i < (cnt + 31) / 32 * 32; i += 32) {  // the same trip count in every lane of a warp
      const bool valid = i < cnt;
      const float* r = stage + (valid ? i : 0) * pl.ld;
      float s[kFaHeads] = {0, 0, 0, 0};
      const int dh = int(a.Dh), ld = int(pl.ld);  // Dh <= 1024
#pragma unroll 4
      for (int k = part; k < dh; k += 8) {
        const float rv = r[k];
#pragma unroll
        for (int hh = 0; hh < kFaHeads; ++hh) s[hh] = mul_add(qs[hh * ld + k], rv, s[hh]);
      }
#pragma unroll
      for (int hh = 0; hh < kFaHeads; ++hh) {
        // ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), operands in that order
        float v = s[hh], o = __shfl_xor_sync(0xffffffffu, v, 4);
        v = (part & 4) ? __fadd_rn(o, v) : __fadd_rn(v, o);
        o = __shfl_xor_sync(0xffffffffu, v, 2);
        v = (part & 2) ? __fadd_rn(o, v) : __fadd_rn(v, o);
        o = __shfl_xor_sync(0xffffffffu, v, 1);
        v = (part & 1) ? __fadd_rn(o, v) : __fadd_rn(v, o);
        if (valid && part == 0 && hh < hb) ep[hh * pl.lde + c0 + i] = make_float2(__fmul_rn(v, a.scale), 0.0f);
      }
    }
  }
  __syncthreads();
  // Max per head over this block's keys (fmaxf: the same value in any order; a zero's sign may
  // differ, which no later result sees: l - (±0) and exp(±0) are the same).
  const int warp = tid >> 5, lane = tid & 31;
  if (warp < kFaHeads) {
    float m = -INFINITY;
    for (int64_t j = k0 + lane; j < k1; j += 32) m = fmaxf(m, ep[warp * pl.lde + j].x);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) mx[warp] = m;
  }
  if (cs > 1) cl.sync(); else __syncthreads();
  if (tid < kFaHeads) {
    float m = -INFINITY;
    for (int r = 0; r < cs; ++r) m = fmaxf(m, (cs > 1 ? cl.map_shared_rank(mx, r) : mx)[tid]);
    mx[4 + tid] = m;
  }
  __syncthreads();
  for (int64_t i = tid; i < hb * (k1 - k0); i += kFaThreads) {
    float2* e = ep + (i / (k1 - k0)) * pl.lde + k0 + i % (k1 - k0);
    const float x = dev_exp(e->x - mx[4 + i / (k1 - k0)]);
    *e = make_float2(x, a.bf16 ? dev_round_bf16(x) : x);
  }
  if (cs > 1) {  // every block's e_j of its keys is final: gather the others'
    cl.sync();
    for (int r = 0; r < cs; ++r) {
      const int64_t r0 = r * kpb < n ? r * kpb : n, r1 = r0 + kpb < n ? r0 + kpb : n;
      if (r == rank || r1 <= r0) continue;
      const float2* re = cl.map_shared_rank(ep, r);
      for (int64_t i = tid; i < hb * (r1 - r0); i += kFaThreads) {
        const int64_t off = (i / (r1 - r0)) * pl.lde + r0 + i % (r1 - r0);
        ep[off] = re[off];
      }
    }
  }
  __syncthreads();

  // P·V over this block's quads [qa, qb) of dims. V dims per item: 4, or 2 / 1 where 4 would
  // leave fewer than 128 threads busy (many blocks per cluster: short slices).
  const int64_t quads = (a.Dh + 3) / 4;
  const int64_t qa = rank * pl.qpb < quads ? rank * pl.qpb : quads;
  const int64_t qb = qa + pl.qpb < quads ? qa + pl.qpb : quads;
  if (qb > qa) {  // the same in every thread of the block
    const int64_t d0 = 4 * qa, d1 = 4 * qb < a.Dh ? 4 * qb : a.Dh, wd = 4 * (qb - qa);
    if (kFaHeads * (qb - qa) > 2 * kFaThreads)  // Dh > 512 in one block
      fa_pv<kB, 4, 4>(a, t, n, d0, d1, wd, pl.stage_floats, hb, h0, ep, pl.lde, mx + 4, refs, kinds, lut, stage);
    else if (kFaHeads * (qb - qa) >= 128)
      fa_pv<kB, 4, 2>(a, t, n, d0, d1, wd, pl.stage_floats, hb, h0, ep, pl.lde, mx + 4, refs, kinds, lut, stage);
    else if (kFaHeads * 2 * (qb - qa) >= 128)
      fa_pv<kB, 2, 1>(a, t, n, d0, d1, wd, pl.stage_floats, hb, h0, ep, pl.lde, mx + 4, refs, kinds, lut, stage);
    else
      fa_pv<kB, 1, 1>(a, t, n, d0, d1, wd, pl.stage_floats, hb, h0, ep, pl.lde, mx + 4, refs, kinds, lut, stage);
  }
  if (cs > 1) cl.sync();  // no block leaves while another may still read its shared memory
#else
  __trap();  // clusters and this layout need sm_90; fa_device_ok never picks this kernel there
#endif
}

// Whether the current device runs the staged kernel with clusters of 8 at the largest shared
// memory (0: no, 1: sm_90+ without such clusters, 2: yes), cached per device; sets the kernel's
// shared-memory limit once per device.
int fa_device_level() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, else level + 1
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  const int c = cache[dev].load(std::memory_order_acquire);
  if (c > 0) return c - 1;
  int major = 0, level = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
      cudaFuncSetAttribute(model_attn_staged_kernel<8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kFaSmemCap)) == cudaSuccess &&
      cudaFuncSetAttribute(model_attn_staged_kernel<2, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kFaSmemCap)) == cudaSuccess) {
    level = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kFaMaxCluster), cfg.blockDim = dim3(kFaThreads), cfg.dynamicSmemBytes = kFaSmemCap;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kFaMaxCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, model_attn_staged_kernel<8, 1>, &cfg) == cudaSuccess && clusters > 0)
      level = 2;
  }
  cudaGetLastError();  // a refused query is an answer here, not the launch's error
  cache[dev].store(level + 1, std::memory_order_release);
  return level;
}

int fa_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 1;
  int c = cache[dev].load(std::memory_order_acquire);
  if (c > 0) return c;
  if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c <= 0) c = 1;
  cache[dev].store(c, std::memory_order_release);
  return c;
}

// The staged kernel's plan for `a` (rows = a.T query rows), or false where it cannot run.
bool fa_plan(const ModelAttnArgs& a, FaPlan* pl) {
  if (a.kernel == 1 || a.Dh > kSumChunk || a.max_keys <= 0) return false;
  if (a.cluster != 0 && a.cluster != 1 && a.cluster != 2 && a.cluster != 4 && a.cluster != 8) return false;
  const int level = fa_device_level();
  if (level == 0) return false;
  FaPlan p;
  p.ld = (a.Dh + 31) / 32 * 32 + 8;
  p.lde = (a.max_keys + 31) / 32 * 32 + 4;
  p.rows = 0;
  for (int r : {32, 16, 8}) {
    FaPlan c = p;
    c.rows = r, c.stage_floats = r * p.ld;
    if (fa_smem_bytes(c) <= kFaSmemCap) {
      p = c;
      break;
    }
  }
  if (p.rows == 0) return false;
  const int64_t G = (a.H + kFaHeads - 1) / kFaHeads, base = a.T * G;
  if (a.cluster != 0) {
    p.cs = a.cluster;
  } else {
    // One block per SM at a time (the <8, 1> build's registers). Time ~ waves / cs (each block
    // does 1/cs of a row's work); a larger cluster must gain 10 % over the best smaller one (its
    // barriers, the exchange, and per block the same number of staging rounds).
    const int64_t sms = fa_sm_count();
    double best = 0;
    p.cs = 1;
    for (int c = 1; c <= kFaMaxCluster; c *= 2) {
      const double cost = double((base * c + sms - 1) / sms) / c;
      if (c == 1 || cost < 0.9 * best) best = cost, p.cs = c;
    }
  }
  if (p.cs > 1 && level < 2) {
    if (a.cluster > 1) return false;
    p.cs = 1;
  }
  if (base * p.cs > INT32_MAX) return false;
  const int64_t quads = (a.Dh + 3) / 4;
  p.qpb = (quads + p.cs - 1) / p.cs;
  p.wide = p.cs == 1 && base >= 2 * int64_t(fa_sm_count());
  *pl = p;
  return true;
}

cudaError_t launch_staged(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq, const FaPlan& p,
                          cudaStream_t s) {
  const int64_t G = (a.H + kFaHeads - 1) / kFaHeads;
  const unsigned grid = unsigned(a.T * G * p.cs);
  const size_t smem = fa_smem_bytes(p);
  if (p.cs > 1)
    return launch_kernel_cluster(model_attn_staged_kernel<8, 1>, grid, kFaThreads, smem, s, unsigned(p.cs), a, seqs,
                                 row_seq, p);
  if (p.wide) return launch_kernel(model_attn_staged_kernel<2, 2>, grid, kFaThreads, smem, s, a, seqs, row_seq, p);
  return launch_kernel(model_attn_staged_kernel<8, 1>, grid, kFaThreads, smem, s, a, seqs, row_seq, p);
}

}  // namespace

cudaError_t launch_model_attention(const ModelAttnArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.Dh <= 0 || a.H <= 0 || a.window <= 0 || (a.ckv && !a.topk && a.ratio <= 0) || a.kernel < 0 || a.kernel > 2)
    return cudaErrorInvalidValue;
  FaPlan plan;
  if (a.kernel != 1 && fa_plan(a, &plan))
    return launch_staged(a, static_cast<const ModelAttnSeq*>(nullptr), static_cast<const int32_t*>(nullptr), plan, s);
  if (a.kernel == 2) return cudaErrorInvalidValue;
  const size_t smem = size_t(a.max_keys) * sizeof(float);
  if (smem > 200 * 1024) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(model_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  return launch_kernel(model_attn_kernel, unsigned(a.T * a.H), 128, smem, s, a,
                       static_cast<const ModelAttnSeq*>(nullptr), static_cast<const int32_t*>(nullptr));
}

cudaError_t launch_model_attention_seqs(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (!seqs || !row_seq || a.Dh <= 0 || a.H <= 0 || a.window <= 0 || (a.ckv && !a.topk && a.ratio <= 0) ||
      a.kernel < 0 || a.kernel > 2)
    return cudaErrorInvalidValue;
  FaPlan plan;
  if (a.kernel != 1 && fa_plan(a, &plan)) return launch_staged(a, seqs, row_seq, plan, s);
  if (a.kernel == 2) return cudaErrorInvalidValue;
  const size_t smem = size_t(a.max_keys) * sizeof(float);
  if (smem > 200 * 1024 || a.T * a.H > INT32_MAX) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(model_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  return launch_kernel(model_attn_kernel, unsigned(a.T * a.H), 128, smem, s, a, seqs, row_seq);
}

namespace {
__global__ void ring_write_seqs_kernel(const ModelAttnSeq* seqs, const int32_t* row_seq, const float* kv,
                                       const int64_t* pos, int64_t rows, int64_t dim) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * dim) return;
  const int64_t r = id / dim, d = id % dim;
  const ModelAttnSeq sq = seqs[row_seq[r]];
  if (r - sq.row0 < sq.T - sq.ring_size) return;  // overwritten later in the same chunk
  static_cast<float*>(sq.ring)[(pos[r] % sq.ring_size) * dim + d] = kv[r * dim + d];
}
}  // namespace

cudaError_t launch_ring_write_seqs(const ModelAttnSeq* seqs, const int32_t* row_seq, const float* kv, const int64_t* pos,
                                   int64_t rows, int64_t dim, cudaStream_t s) {
  if (rows * dim == 0) return cudaSuccess;
  if (!seqs || !row_seq) return cudaErrorInvalidValue;
  return launch_kernel(ring_write_seqs_kernel, unsigned((rows * dim + 255) / 256), 256, 0, s, seqs, row_seq, kv, pos, rows, dim);
}

}  // namespace flashseek::ops::cuda::detail
