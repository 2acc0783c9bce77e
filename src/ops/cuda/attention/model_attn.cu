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
//           quads before decoding any. Each key's row address and kind and each quad's code /
//           scale offsets are worked out once per block (shared-memory tables), index math is
//           32-bit, and the block fits twice on an SM (launch bounds 256 x 2).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
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
  pdl_prologue();
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
// Index math is 32-bit (key counts fit shared memory, Dh <= 1024, quads <= 256): a 64-bit
// division is an emulated subroutine on the GPU. Per-key and per-quad facts (row address, row
// kind, where a quad's codes and scale lie) are worked out once per block into shared memory, so
// that staging a quad is a few loads, table lookups and products.

namespace cg = cooperative_groups;

constexpr int kFaHeads = 4;          // heads per block (and per cluster)
constexpr int kFaThreads = 256;
constexpr int kFaMinBlocks = 2;      // launch bounds: two blocks per SM (<= 128 registers)
constexpr int kFaBatch = 8;          // staged quads per thread whose loads are in flight together
constexpr int kFaMaxCluster = 8;     // portable cluster size
constexpr int kFaChunk = 256;        // rows of one staged P·V chunk at most
constexpr int kFaLut = 256 + 256 + 16;
constexpr size_t kFaSmemCap = 200 * 1024;
static_assert(kFaThreads == 64 * kFaHeads, "the exp and gather loops give each head 64 threads");
static_assert(kFaThreads == 8 * 32, "logits: 32 groups of 8 lanes, one key row each");
static_assert(kSumChunk % kFaThreads == 0, "q: Dh <= kSumChunk values per head, kSumChunk / kFaThreads per thread");
// Shared memory: refs [lde] (each key's row address), lut (kFaLut floats), mx (8 floats), qs
// [4][8][qm] (q of each head, element k at (k % 8) * qm + k / 8: lane k % 8 of the logits reads
// its elements four at a time), ep [4][lde] float2 (logit, then e_j and its probability), stage
// [stage_floats], desc [3][nqt] (per row kind and quad: how to stage it, fa_desc), kinds [lde]
// (each key's row kind, FaKind). Offsets up to desc are multiples of 16 bytes (lde is even).
constexpr size_t kFaFixedBytes = size_t(kFaLut + 8) * 4;

// Row kinds of the keys: which desc table stages a row's quads.
enum FaKind : uint8_t {
  kFaF32 = 0,      // FP32 row at a 16-byte aligned address (chunk rows, FP32 ring / compressed rows)
  kFaRing = 1,     // compact ring row (ring_fmt)
  kFaCkv = 2,      // compact compressed row (ckv_fmt)
  kFaF32Odd = 3,   // FP32 row at another address: value by value
};

// A quad's staging descriptor: bits [0, 12) the byte offset of its codes (FP32: of its 4 floats)
// in the row, [12, 24) the byte offset of its scale, [24, 27) the mode, bit 27: E8M0 scale (else
// E4M3). Mode 0: value by value (fa_stage_values: BF16 tails, scale blocks that are no multiple of
// 4, the last quad of an odd Dh); 1: 4 FP32 in one 16-byte load; 2: 4 e4m3 codes (4 bytes) times
// the scale; 3: 4 e2m1 codes (2 bytes) times the scale.
constexpr uint32_t kFaOffMax = 4096;

struct FaPlan {
  int cs = 1;            // blocks per cluster
  int rows = 32;         // key rows per logits chunk (<= 32: one 8-lane group per row)
  int ld = 0;            // floats between staged full rows: Dh rounded up to 32, + 8
  int qm = 0;            // floats of a lane's q slice: (Dh + 7) / 8 up to a multiple of 4, qm / 4 odd
  int lde = 0;           // entries between the ep rows of two heads: max_keys rounded up to 32, + 4
  int stage_floats = 0;  // rows * ld
  int nqt = 0;           // quads of a row: (Dh + 3) / 4
  int qpb = 0;           // quads of dims per block in P·V
};

inline size_t fa_smem_bytes(const FaPlan& p) {
  return kFaFixedBytes + size_t(p.lde) * 9 + size_t(kFaHeads) * size_t(8 * p.qm + 2 * p.lde) * 4 +
         size_t(p.stage_floats) * 4 + size_t(3 * p.nqt) * 4;
}

// Value d of a row of format f (cache_row_value) with the code values from the block's tables
// (lut: e4m3 [0, 256), E8M0 [256, 512), e2m1 [512, 528), each entry the dev_*_value of its code).
__device__ __forceinline__ float fa_value(const CacheRowFormat& f, const uint8_t* row, int d, const float* lut) {
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

// Values d .. d+3 of a row of format f into dst (0 past Dh), value by value: the rare quads
// (mode 0), out of line so that the batched staging loop stays small.
__device__ __noinline__ void fa_stage_values(CacheRowFormat f, const uint8_t* row, int d, int Dh, const float* lut,
                                             float* dst) {
  for (int c = 0; c < 4; ++c) dst[c] = d + c < Dh ? fa_value(f, row, d + c, lut) : 0.0f;
}

// The descriptor of quad d / 4 of a row of kind `kind` (FaKind: kFaF32, kFaRing or kFaCkv).
__device__ __forceinline__ uint32_t fa_desc(const ModelAttnArgs& a, int kind, int d, int Dh) {
  if (d + 3 >= Dh) return 0;
  if (kind == kFaF32) return (1u << 24) | uint32_t(4 * d);
  const CacheRowFormat f = kind == kFaRing ? a.ring_fmt : a.ckv_fmt;
  if (!f.compact() || f.block <= 0 || f.block % 4 != 0 || d + 3 >= f.coded) return 0;
  const int64_t code = f.fp4() ? d >> 1 : d, scale = f.scale_offset() + d / f.block;
  if (code >= kFaOffMax || scale < 0 || scale >= kFaOffMax) return 0;
  return ((f.fp4() ? 3u : 2u) << 24) | (f.codec == RowCodec::kFp4E4m3 ? 0u : 1u << 27) | (uint32_t(scale) << 12) |
         uint32_t(code);
}

// Stages quads [q0, q0 + nq) (values [4 q0, min(4 (q0 + nq), Dh))) of the cnt keys whose row
// addresses and kinds are refs[0, cnt), kinds[0, cnt): quad qq of key i into stage[i * ld + 4 qq]
// (ld a multiple of 4), values past Dh as 0. Block-wide, with barriers before (the previous
// chunk's readers) and after. Each thread takes items (key, quad) tid, tid + kFaThreads, ... in
// batches of kB: first every item's descriptor, then all loads (independent, so in flight
// together), then the products. The values are cache_row_value's (exact products).
template <int kB>
__device__ __forceinline__ void fa_stage(const ModelAttnArgs& a, int cnt, int q0, int nq, int ld, int Dh,
                                         const uint8_t* const* refs, const uint8_t* kinds, const uint32_t* desc,
                                         int nqt, const float* lut, float* stage) {
  __syncthreads();
  const int tid = int(threadIdx.x);
  // Item (i, qq) = key i, quad qq; the next item of a thread is kFaThreads further: (di, dq) on.
  const int di = kFaThreads / nq, dq = kFaThreads - di * nq;
  int i = tid / nq, qq = tid - (tid / nq) * nq;
  while (i < cnt) {
    uint32_t dsc[kB];
    const uint8_t* src[kB];
    int dst[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      dsc[b] = 0, src[b] = nullptr, dst[b] = 0;
      if (i < cnt) {
        const uint8_t* row = refs[i];
        const int kd = kinds[i], q = q0 + qq;
        const uint32_t ds = kd == kFaF32Odd ? 0u : desc[kd * nqt + q];
        dst[b] = i * ld + 4 * qq;
        if (((ds >> 24) & 7u) == 0)
          fa_stage_values(kd == kFaRing ? a.ring_fmt : kd == kFaCkv ? a.ckv_fmt : CacheRowFormat{}, row, 4 * q, Dh,
                          lut, stage + dst[b]);
        else
          dsc[b] = ds, src[b] = row;
        i += di, qq += dq;
        if (qq >= nq) qq -= nq, ++i;
      }
    }
    uint4 raw[kB];
    uint32_t sb[kB];
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const uint32_t mode = (dsc[b] >> 24) & 7u;
      raw[b] = make_uint4(0, 0, 0, 0), sb[b] = 0;
      if (mode == 0) continue;
      const uint8_t* c = src[b] + (dsc[b] & 0xfffu);
      // Plain loads: the key rows (ring, compressed cache) are step-written (runtime/pdl.cuh).
      if (mode == 1) {
        raw[b] = *reinterpret_cast<const uint4*>(c);
      } else {
        raw[b].x = mode == 2 ? *reinterpret_cast<const unsigned int*>(c)
                             : uint32_t(*reinterpret_cast<const unsigned short*>(c));
        sb[b] = src[b][(dsc[b] >> 12) & 0xfffu];
      }
    }
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const uint32_t mode = (dsc[b] >> 24) & 7u;
      if (mode == 0) continue;
      float4 v;
      if (mode == 1) {
        v = make_float4(__uint_as_float(raw[b].x), __uint_as_float(raw[b].y), __uint_as_float(raw[b].z),
                        __uint_as_float(raw[b].w));
      } else {  // cache_row_value4: code · scale, exact products
        const float s = lut[((dsc[b] >> 19) & 256u) + sb[b]];  // bit 27: the E8M0 table at 256
        const uint32_t w = raw[b].x;
        if (mode == 3)
          v = make_float4(__fmul_rn(lut[512 + (w & 15u)], s), __fmul_rn(lut[512 + ((w >> 4) & 15u)], s),
                          __fmul_rn(lut[512 + ((w >> 8) & 15u)], s), __fmul_rn(lut[512 + ((w >> 12) & 15u)], s));
        else
          v = make_float4(__fmul_rn(lut[w & 255u], s), __fmul_rn(lut[(w >> 8) & 255u], s),
                          __fmul_rn(lut[(w >> 16) & 255u], s), __fmul_rn(lut[w >> 24], s));
      }
      *reinterpret_cast<float4*>(stage + dst[b]) = v;  // ld and 4 qq are multiples of 4: 16-byte aligned
    }
  }
  __syncthreads();
}

// P·V of one block: dims [d0, d1) (quads [qa, qa + nq), staged rows of wd = 4 nq floats) of its
// heads, keys in order. Item it = group * 4 + head owns V consecutive dims (U items per thread at
// most); every thread also sums its head's denominator in key order.
template <int kB, int V, int U>
__device__ __forceinline__ void fa_pv(const ModelAttnArgs& a, int64_t t, int n, int qa, int nq, int Dh,
                                      int stage_floats, int hb, int h0, const float2* ep, int lde, const float* mxg,
                                      const uint8_t* const* refs, const uint8_t* kinds, const uint32_t* desc, int nqt,
                                      const float* lut, float* stage) {
  const int tid = int(threadIdx.x);
  const int wd = 4 * nq, d0 = 4 * qa, d1 = 4 * (qa + nq) < Dh ? 4 * (qa + nq) : Dh;
  const int nitem = kFaHeads * (wd / V);
  const int hh = tid % kFaHeads;  // the same head for each of the thread's items (kFaThreads % 4 == 0)
  const float2* eh = ep + hh * lde;
  const int rows2 = stage_floats / wd < kFaChunk ? stage_floats / wd : kFaChunk;
  float acc[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int c = 0; c < V; ++c) acc[u][c] = 0;
  float den = 0;
  for (int c0 = 0; c0 < n; c0 += rows2) {
    const int cnt = n - c0 < rows2 ? n - c0 : rows2;
    fa_stage<kB>(a, cnt, qa, nq, wd, Dh, refs + c0, kinds + c0, desc, nqt, lut, stage);
#pragma unroll 2
    for (int jj = 0; jj < cnt; ++jj) {
      const float2 e = eh[c0 + jj];  // (e_j, its probability)
      den = __fadd_rn(den, e.x);
      const float* vr = stage + jj * wd;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int it = tid + kFaThreads * u;
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
    const int it = tid + kFaThreads * u;
    if (it >= nitem) continue;
    const int d = d0 + V * (it / kFaHeads);
#pragma unroll
    for (int c = 0; c < V; ++c) {
      if (d + c >= d1) break;
      const float r = acc[u][c] / den;
      o[d + c] = a.bf16 ? dev_round_bf16(r) : r;
    }
  }
}

// One cluster of p.cs blocks per (query row, group of kFaHeads heads); blockIdx.x = cluster *
// p.cs + rank. With `seqs` as model_attn_kernel.
__global__ void __launch_bounds__(kFaThreads, kFaMinBlocks)
    model_attn_staged_kernel(ModelAttnArgs a, const ModelAttnSeq* seqs, const int32_t* row_seq, FaPlan pl) {
  pdl_prologue();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kB = kFaBatch;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  const uint8_t** refs = reinterpret_cast<const uint8_t**>(fa_smem);
  float* lut = reinterpret_cast<float*>(refs + pl.lde);
  float* mx = lut + kFaLut;          // [0, 4): this block's max per head; [4, 8): the cluster's
  float* qs = mx + 8;
  float2* ep = reinterpret_cast<float2*>(qs + kFaHeads * 8 * pl.qm);
  float* stage = reinterpret_cast<float*>(ep + kFaHeads * pl.lde);
  uint32_t* desc = reinterpret_cast<uint32_t*>(stage + pl.stage_floats);
  uint8_t* kinds = reinterpret_cast<uint8_t*>(desc + 3 * pl.nqt);
  const int cs = pl.cs, tid = int(threadIdx.x), ld = pl.ld, lde = pl.lde, nqt = pl.nqt, qm = pl.qm, ldq = 8 * qm;
  cg::cluster_group cl = cg::this_cluster();
  const int rank = cs > 1 ? int(cl.block_rank()) : 0;
  const int G = int((a.H + kFaHeads - 1) / kFaHeads), cid = int(blockIdx.x) / cs;  // grid < 2^31 (fa_plan)
  int64_t t = cid / G;
  const int h0 = (cid % G) * kFaHeads;
  if (seqs) attn_row_seq(a, seqs, row_seq, t);
  const int Dh = int(a.Dh);  // <= kSumChunk (fa_plan)
  const int hb = a.H - h0 < kFaHeads ? int(a.H - h0) : kFaHeads;
  const int64_t p = a.start + t;
  // Key counts fit the shared memory (max_keys; fa_plan): 32-bit from here on.
  const int n_win = int(p + 1 < a.window ? p + 1 : a.window);
  int n_comp = 0;
  if (a.ckv) n_comp = int(a.topk ? int64_t(a.topk_n[t]) : (p + 1) / a.ratio);
  const int n = n_win + n_comp;

  // q of the block's heads into registers first (4 x Dh <= 4 x 1024 values: 16 per thread), so
  // that their latency overlaps the key table and the lookup tables below.
  constexpr int kQu = kSumChunk / kFaThreads;
  float qv[kFaHeads][kQu];
  const float* q = a.q + (t * a.H + h0) * a.Dh;
#pragma unroll
  for (int hh = 0; hh < kFaHeads; ++hh)
#pragma unroll
    for (int u = 0; u < kQu; ++u) {
      const int k = tid + kFaThreads * u;
      qv[hh][u] = hh < hb && k < Dh ? q[hh * Dh + k] : 0.0f;
    }

  {  // attn_key of every key: its row address and kind
    const int64_t s0 = p - n_win + 1, R = a.ring_size;  // s0: the position of key 0
    const int64_t rb = R > 0 ? s0 % R : 0;                // once per thread; then 32-bit where R allows
    const int64_t rstride = cache_row_stride(a.ring_fmt, a.Dh), cstride = cache_row_stride(a.ckv_fmt, a.Dh);
#pragma unroll 4
    for (int j = tid; j < n; j += kFaThreads) {
      const uint8_t* r;
      int kind;
      if (j < n_win) {
        const int64_t s = s0 + j;
        if (s >= a.start) {
          r = reinterpret_cast<const uint8_t*>(a.kv_chunk + (s - a.start) * a.Dh), kind = kFaF32;
        } else {
          const int64_t rr = R <= INT32_MAX ? int64_t(uint32_t(rb + j) % uint32_t(R)) : (rb + j) % R;  // s % R
          r = static_cast<const uint8_t*>(a.ring) + rr * rstride, kind = a.ring_fmt.compact() ? kFaRing : kFaF32;
        }
      } else {
        const int64_t row = a.topk ? int64_t(a.topk[t * a.topk_stride + (j - n_win)]) : int64_t(j - n_win);
        r = static_cast<const uint8_t*>(a.ckv) + row * cstride, kind = a.ckv_fmt.compact() ? kFaCkv : kFaF32;
      }
      if (kind == kFaF32 && (reinterpret_cast<uintptr_t>(r) & 15) != 0) kind = kFaF32Odd;
      refs[j] = r, kinds[j] = uint8_t(kind);
    }
  }
  for (int i = tid; i < kFaLut; i += kFaThreads)
    lut[i] = i < 256 ? dev_e4m3_value(uint32_t(i)) : i < 512 ? dev_e8m0_value(uint32_t(i - 256))
                                                             : dev_e2m1_value(uint32_t(i - 512));
  for (int kind = 0; kind < 3; ++kind)
    for (int qd = tid; qd < nqt; qd += kFaThreads) desc[kind * nqt + qd] = fa_desc(a, kind, 4 * qd, Dh);
#pragma unroll
  for (int hh = 0; hh < kFaHeads; ++hh)
#pragma unroll
    for (int u = 0; u < kQu; ++u) {
      const int k = tid + kFaThreads * u;
      if (k < Dh) qs[hh * ldq + (k & 7) * qm + (k >> 3)] = qv[hh][u];
    }

  // Logits of this block's keys [k0, k1): group grp of 8 lanes per key row, lane `part` owns the
  // partial sums s[part] of the 4 heads (elements k = part + 8 m, m < mk, in increasing k:
  // dev_dot_f32_ld), q four elements at a time from its slice (8 lanes: 8 distinct bank quads).
  const int kpb = (n + cs - 1) / cs;
  const int k0 = rank * kpb < n ? rank * kpb : n, k1 = k0 + kpb < n ? k0 + kpb : n;
  const int grp = tid >> 3, part = tid & 7, mk = (Dh - part + 7) >> 3;
  const float* qp = qs + part * qm;
  for (int c0 = k0; c0 < k1; c0 += pl.rows) {
    const int cnt = k1 - c0 < pl.rows ? k1 - c0 : pl.rows;
    fa_stage<kB>(a, cnt, 0, nqt, ld, Dh, refs + c0, kinds + c0, desc, nqt, lut, stage);
    // The same trip count in every lane of a warp (its 4 groups: rows 4w .. 4w + 3 + 32k, a bound
    // that is a multiple of 4); warps whose rows are all past cnt skip the chunk.
    for (int i = grp; i < (cnt + 3) / 4 * 4; i += 32) {
      const bool valid = i < cnt;
      const float* r = stage + (valid ? i : 0) * ld;
      float s[kFaHeads] = {0, 0, 0, 0};
      int m = 0;
#pragma unroll 2
      for (; m + 4 <= mk; m += 4) {
        float qv[kFaHeads][4];
#pragma unroll
        for (int hh = 0; hh < kFaHeads; ++hh) {
          const float4 w = *reinterpret_cast<const float4*>(qp + hh * ldq + m);  // qm, m: multiples of 4
          qv[hh][0] = w.x, qv[hh][1] = w.y, qv[hh][2] = w.z, qv[hh][3] = w.w;
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float rv = r[part + 8 * (m + c)];
#pragma unroll
          for (int hh = 0; hh < kFaHeads; ++hh) s[hh] = mul_add(qv[hh][c], rv, s[hh]);
        }
      }
      for (; m < mk; ++m) {
        const float rv = r[part + 8 * m];
#pragma unroll
        for (int hh = 0; hh < kFaHeads; ++hh) s[hh] = mul_add(qp[hh * ldq + m], rv, s[hh]);
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
        if (valid && part == 0 && hh < hb) ep[hh * lde + c0 + i] = make_float2(__fmul_rn(v, a.scale), 0.0f);
      }
    }
  }
  __syncthreads();
  // Max per head over this block's keys (fmaxf: the same value in any order; a zero's sign may
  // differ, which no later result sees: l - (±0) and exp(±0) are the same).
  const int warp = tid >> 5, lane = tid & 31;
  if (warp < kFaHeads) {
    float m = -INFINITY;
    for (int j = k0 + lane; j < k1; j += 32) m = fmaxf(m, ep[warp * lde + j].x);
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
  // exp(l - max) of this block's keys: head tid / 64, keys 64 apart.
  const int eh = tid >> 6, el = tid & 63;
  if (eh < hb)
    for (int j = k0 + el; j < k1; j += 64) {
      float2* e = ep + eh * lde + j;
      const float x = dev_exp(e->x - mx[4 + eh]);
      *e = make_float2(x, a.bf16 ? dev_round_bf16(x) : x);
    }
  if (cs > 1) {  // every block's e_j of its keys is final: gather the others' (4 loads in flight)
    cl.sync();
    if (eh < hb)
      for (int j0 = el; j0 < n; j0 += 4 * 64) {
        float2 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + 64 * u;
          v[u] = make_float2(0.0f, 0.0f);
          if (j < n && (j < k0 || j >= k1)) v[u] = cl.map_shared_rank(ep, j / kpb)[eh * lde + j];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + 64 * u;
          if (j < n && (j < k0 || j >= k1)) ep[eh * lde + j] = v[u];
        }
      }
  }
  __syncthreads();

  // P·V over this block's quads [qa, qb) of dims. V dims per item: the largest of 4 / 2 / 1 that
  // keeps every thread busy (short slices: many blocks per cluster), U = the items per thread.
  const int qa = rank * pl.qpb < nqt ? rank * pl.qpb : nqt;
  const int qb = qa + pl.qpb < nqt ? qa + pl.qpb : nqt;
  const int nq = qb - qa, items4 = kFaHeads * nq;  // the same in every thread of the block
#define FA_PV(KB, V, U) \
  fa_pv<KB, V, U>(a, t, n, qa, nq, Dh, pl.stage_floats, hb, h0, ep, lde, mx + 4, refs, kinds, desc, nqt, lut, stage)
  if (nq > 0) {
    if (items4 > 2 * kFaThreads)
      FA_PV(kB / 2, 4, 4);  // Dh > 512 in one block; half the batch keeps its 16 sums in registers
    else if (items4 > kFaThreads)
      FA_PV(kB, 4, 2);
    else if (items4 == kFaThreads)
      FA_PV(kB, 4, 1);
    else if (2 * items4 > kFaThreads)
      FA_PV(kB, 2, 2);
    else if (2 * items4 == kFaThreads)
      FA_PV(kB, 2, 1);
    else if (4 * items4 > kFaThreads)
      FA_PV(kB, 1, 2);
    else
      FA_PV(kB, 1, 1);
  }
#undef FA_PV
  if (cs > 1) cl.sync();  // no block leaves while another may still read its shared memory
#else
  __trap();  // clusters and this layout need sm_90; fa_device_level never picks this kernel there
#endif
}

// Whether the current device runs the staged kernel with clusters of 8 at the largest shared
// memory (0: no, 1: sm_90+ without such clusters, 2: yes), cached per device; sets the kernel's
// shared-memory limit and carveout once per device.
int fa_device_level() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, else level + 1
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  const int c = cache[dev].load(std::memory_order_acquire);
  if (c > 0) return c - 1;
  int major = 0, level = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
      cudaFuncSetAttribute(model_attn_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kFaSmemCap)) ==
          cudaSuccess) {
    level = 1;
    // The most shared memory per SM (two ~105 KB blocks at Dh 512); a refusal only costs occupancy.
    cudaFuncSetAttribute(model_attn_staged_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                         int(cudaSharedmemCarveoutMaxShared));
    cudaGetLastError();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kFaMaxCluster), cfg.blockDim = dim3(kFaThreads), cfg.dynamicSmemBytes = kFaSmemCap;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kFaMaxCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, model_attn_staged_kernel, &cfg) == cudaSuccess && clusters > 0)
      level = 2;
  }
  cudaGetLastError();  // a refused query is an answer here, not the launch's error
  cache[dev].store(level + 1, std::memory_order_release);
  return level;
}

// A device attribute of the current device (at least 1), cached per device and attribute slot.
int fa_device_attr(int slot, cudaDeviceAttr attr) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[2][kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 1;
  int c = cache[slot][dev].load(std::memory_order_acquire);
  if (c > 0) return c;
  if (cudaDeviceGetAttribute(&c, attr, dev) != cudaSuccess || c <= 0) c = 1;
  cudaGetLastError();
  cache[slot][dev].store(c, std::memory_order_release);
  return c;
}
int fa_sm_count() { return fa_device_attr(0, cudaDevAttrMultiProcessorCount); }
int fa_smem_per_sm() { return fa_device_attr(1, cudaDevAttrMaxSharedMemoryPerMultiprocessor); }

// The staged kernel's plan for `a` (rows = a.T query rows), or false where it cannot run.
bool fa_plan(const ModelAttnArgs& a, FaPlan* pl) {
  if (a.kernel == 1 || a.Dh > kSumChunk || a.max_keys <= 0 || a.max_keys > (int64_t(1) << 20)) return false;
  if (a.cluster != 0 && a.cluster != 1 && a.cluster != 2 && a.cluster != 4 && a.cluster != 8) return false;
  const int level = fa_device_level();
  if (level == 0) return false;
  FaPlan p;
  p.ld = int((a.Dh + 31) / 32 * 32 + 8);
  p.qm = int((a.Dh + 7) / 8 + 3) / 4 * 4;
  if ((p.qm / 4) % 2 == 0) p.qm += 4;
  p.lde = int((a.max_keys + 31) / 32 * 32 + 4);
  p.nqt = int((a.Dh + 3) / 4);
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
    // Blocks resident per SM: the launch bounds' kFaMinBlocks where the shared memory allows (1 KB
    // of it reserved per block). Time ~ waves / cs (each block does 1/cs of a row's work); a larger
    // cluster must gain 10 % over the best smaller one (its barriers, the exchange, and per block
    // the same number of staging rounds).
    const int64_t per_sm = std::max<int64_t>(
        1, std::min<int64_t>(kFaMinBlocks, int64_t(fa_smem_per_sm()) / int64_t(fa_smem_bytes(p) + 1024)));
    const int64_t slots = int64_t(fa_sm_count()) * per_sm;
    double best = 0;
    p.cs = 1;
    for (int c = 1; c <= kFaMaxCluster; c *= 2) {
      const double cost = double((base * c + slots - 1) / slots) / c;
      if (c == 1 || cost < 0.9 * best) best = cost, p.cs = c;
    }
  }
  if (p.cs > 1 && level < 2) {
    if (a.cluster > 1) return false;
    p.cs = 1;
  }
  if (base * p.cs > INT32_MAX) return false;
  p.qpb = (p.nqt + p.cs - 1) / p.cs;
  *pl = p;
  return true;
}

cudaError_t launch_staged(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq, const FaPlan& p,
                          cudaStream_t s) {
  const int64_t G = (a.H + kFaHeads - 1) / kFaHeads;
  const unsigned grid = unsigned(a.T * G * p.cs);
  const size_t smem = fa_smem_bytes(p);
  if (p.cs > 1)
    return launch_kernel_cluster(model_attn_staged_kernel, grid, kFaThreads, smem, s, unsigned(p.cs), a, seqs, row_seq,
                                 p);
  return launch_kernel(model_attn_staged_kernel, grid, kFaThreads, smem, s, a, seqs, row_seq, p);
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
  pdl_prologue();
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
