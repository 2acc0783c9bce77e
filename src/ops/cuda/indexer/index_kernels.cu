// Indexer kernels of the whole-model GPU forward (model_kernels.h): the GPU twins of
// ops::index_scores and ops::candidate_mask + ops::topk_indices. Serial parts (head sums,
// selections) run in the CPU's order so that ties and sums resolve the same way.
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/indexer/index_imma.h"
#include "ops/cuda/indexer/topk.h"
#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// ops::index_scores relu: std::max(d, 0.0f) keeps d unless d < 0 (a NaN dot stays NaN).
__device__ __forceinline__ float relu_cpu(float d) { return d < 0.0f ? 0.0f : d; }

// grid (T, ceil(stride / 128)), one thread per key (ops::index_scores order). The reference
// kernel: kept for dI > kSumChunk (chunked dot order) and tiles that do not fit shared memory.
__global__ void index_scores_kernel(IndexScoreArgs a) {
  pdl_prologue();
  const int64_t t = blockIdx.x, i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t clen = (a.start + t + 1) / a.ratio;
  if (i >= clen) return;
  const CacheRowRef k{static_cast<const uint8_t*>(a.keys) + i * cache_row_stride(a.key_fmt, a.dI), a.key_fmt};
  float s = 0;
  for (int64_t h = 0; h < a.nI; ++h) {
    float d = dev_dot_f32_ld(a.q + (t * a.nI + h) * a.dI, k, a.dI);
    if (a.bf16) d = dev_round_bf16(d);
    float v = __fmul_rn(relu_cpu(d), a.w[t * a.nI + h]);
    if (a.bf16) v = dev_round_bf16(v);
    s = __fadd_rn(s, v);
  }
  a.scores[t * a.stride + i] = a.bf16 ? dev_round_bf16(s) : s;
}

// Tiled index scores (dI <= kSumChunk: the short dot order, element i into partial s[i % 8],
// combined ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)); then relu, x w, head sum h = 0..nI-1 serially).
// A block owns a tile of keys and loops over its query rows (blockIdx.y, +gridDim.y, ...), so each
// key tile is read from device memory once per launch. Shared memory holds the key tile and one
// row's queries with each vector permuted to [partial j][m] (element 8m + j at j*M + m, M = Dp/8,
// Dp = dI rounded up to 32 with zeros: a +0 product leaves a partial unchanged, partials are never
// -0), rows padded by 4 floats so 8 distinct 16-byte reads hit distinct banks.
// Lane l of a warp: key slot kq = l % 8, head group g = l / 8. A thread computes KPT keys (kq + 8k)
// x kIsHG heads (head block hb: heads hb*32 + g*8 + hh) for two partials at a time (j, j + 4) with
// float4 reads: per 16-byte step 2*KPT key reads (8 distinct addresses) and 2*kIsHG query reads
// (4 distinct) for 16*KPT*kIsHG FP32 instructions. The head sum runs through the 4 groups in
// order (group g adds its 8 heads, then hands the running sum to group g + 1 by shuffle).
constexpr int kIsHG = 8;                  // heads per thread per head block
constexpr int kIsHB = 4 * kIsHG;          // heads per head block (4 lane groups)
constexpr int kIsWarps = 8;
constexpr int kIsThreads = 32 * kIsWarps;

__host__ __device__ constexpr int64_t is_tile(int kpt) { return int64_t(kIsWarps) * 8 * kpt; }
__host__ __device__ inline int64_t is_dp(int64_t dI) { return (dI + 31) / 32 * 32; }
__host__ __device__ inline int64_t is_nip(int64_t nI) { return (nI + kIsHB - 1) / kIsHB * kIsHB; }
inline size_t is_smem_bytes(int kpt, int64_t nI, int64_t dI) {
  const int64_t S = is_dp(dI) + 4, nIp = is_nip(nI);
  return size_t((is_tile(kpt) * S + nIp * S + nIp) * int64_t(sizeof(float)));
}

// Copies rows [n_rows, dI] (row r at src + r * dI, r >= valid_rows: zeros) into shared rows of
// stride S in the [partial][m] order (dims dI..Dp zero), shared row of r = row_of(r). Loads go in
// batches of kIsBatch 16-byte reads per thread before any store, so that they overlap. Plain
// loads: keys and queries are step-written (runtime/pdl.cuh).
template <int kIsBatch, typename RowOf>
__device__ __forceinline__ void is_stage_rows(float* dst, const float* src, int n_rows, int64_t valid_rows, int dI,
                                              int Dp, int S, RowOf row_of) {
  const int M = Dp / 8, c4n = Dp / 4, total = n_rows * c4n;
  const bool vec = (dI % 4) == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  for (int base = int(threadIdx.x); base < total; base += kIsBatch * kIsThreads) {
    float4 v[kIsBatch];
#pragma unroll
    for (int u = 0; u < kIsBatch; ++u) {
      const int idx = base + u * kIsThreads, r = idx / c4n, d0 = 4 * (idx % c4n);
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (idx < total && r < valid_rows && d0 < dI) {
        const float* p = src + int64_t(r) * dI + d0;
        if (vec) {
          v[u] = *reinterpret_cast<const float4*>(p);
        } else {
          v[u].x = p[0];
          if (d0 + 1 < dI) v[u].y = p[1];
          if (d0 + 2 < dI) v[u].z = p[2];
          if (d0 + 3 < dI) v[u].w = p[3];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kIsBatch; ++u) {
      const int idx = base + u * kIsThreads;
      if (idx >= total) break;
      const int r = idx / c4n, d0 = 4 * (idx % c4n);
      float* row = dst + row_of(r) * S + (d0 / 8);
      const int j0 = d0 % 8;  // 0 or 4
      row[(j0 + 0) * M] = v[u].x, row[(j0 + 1) * M] = v[u].y, row[(j0 + 2) * M] = v[u].z, row[(j0 + 3) * M] = v[u].w;
    }
  }
}

// is_stage_rows for key rows in a compact row format (ops/cache_row_format.h): decoded on load
// into the same [partial][m] order, one value per thread.
__device__ __forceinline__ void is_stage_compact_rows(float* dst, const uint8_t* src, const CacheRowFormat& f,
                                                      int n_rows, int64_t valid_rows, int dI, int Dp, int S) {
  const int M = Dp / 8, stride = int(f.row_bytes());
  for (int idx = int(threadIdx.x); idx < n_rows * Dp; idx += kIsThreads) {
    const int r = idx / Dp, d = idx % Dp;
    const float v = r < valid_rows && d < dI ? cache_row_value(f, src + int64_t(r) * stride, d) : 0.0f;
    dst[r * S + d / 8 + (d % 8) * M] = v;
  }
}

// KPT keys per thread; DP: dI rounded up to 32 when known at compile time (128: V4 / V4.1), else 0.
template <int KPT, int DP>
__global__ void __launch_bounds__(kIsThreads, KPT == 1 ? 3 : 2) index_scores_tiled_kernel(IndexScoreArgs a) {
  pdl_prologue();
  extern __shared__ float4 is_smem4[];
  constexpr int tile = int(is_tile(KPT));
  const int dI = int(a.dI), nI = int(a.nI);
  const int Dp = DP ? DP : int(is_dp(a.dI)), M = Dp / 8, S = Dp + 4, nIp = int(is_nip(a.nI));
  constexpr int batch = KPT == 2 && DP ? 8 : 4;  // as many loads in flight as registers allow (no spills)
  float* ks = reinterpret_cast<float*>(is_smem4);  // [tile][S]
  float* qs = ks + tile * S;                        // [nIp][S]: head h = hb*32 + g*8 + hh at row hb*32 + hh*4 + g
  float* ws = qs + nIp * S;                         // [nIp]
  const int tid = int(threadIdx.x);
  const int64_t k0 = int64_t(blockIdx.x) * tile;
  const int64_t clen_max = (a.start + a.T) / a.ratio;  // clen of the last row (clen grows with t)
  if (int64_t(blockIdx.y) >= a.T || clen_max <= k0) return;

  for (int i = tid; i < nIp * S + nIp; i += kIsThreads) qs[i] = 0.0f;  // padded heads stay 0
  if (a.key_fmt.compact())
    is_stage_compact_rows(ks, static_cast<const uint8_t*>(a.keys) + k0 * a.key_fmt.row_bytes(), a.key_fmt, tile,
                          clen_max - k0, dI, Dp, S);
  else
    is_stage_rows<batch>(ks, static_cast<const float*>(a.keys) + k0 * a.dI, tile, clen_max - k0, dI, Dp, S,
                         [](int r) { return r; });

  const int warp = tid / 32, lane = tid % 32, g = lane / 8, kq = lane % 8;
  const float* krow[KPT];
#pragma unroll
  for (int k = 0; k < KPT; ++k) krow[k] = ks + (warp * 8 * KPT + kq + 8 * k) * S;

  for (int64_t t = blockIdx.y; t < a.T; t += gridDim.y) {
    const int64_t clen = (a.start + t + 1) / a.ratio;
    if (clen <= k0) continue;  // block-uniform
    __syncthreads();  // previous row's reads of qs / ws done (first row: zeroing and key tile done)
    is_stage_rows<batch>(qs, a.q + t * a.nI * a.dI, nI, nI, dI, Dp, S, [](int h) {
      const int hi = h % kIsHB;
      return h - hi + (hi % kIsHG) * 4 + hi / kIsHG;
    });
    for (int h = tid; h < nI; h += kIsThreads) ws[h] = a.w[t * a.nI + h];
    __syncthreads();

    float srun[KPT];
#pragma unroll
    for (int k = 0; k < KPT; ++k) srun[k] = 0.0f;
    for (int hb = 0; hb < nIp / kIsHB; ++hb) {
      const float* qrow = qs + (hb * kIsHB + g) * S;  // head hh of this lane: qrow + hh * 4 * S
      float ab[KPT][kIsHG], c[KPT][kIsHG];
#pragma unroll 1
      for (int jj = 0; jj < 4; ++jj) {
        const int jp = (jj & 1) * 2 + (jj >> 1);  // partial pairs (jp, jp + 4) in the order 0, 2, 1, 3
        float s0[KPT][kIsHG], s4[KPT][kIsHG];
#pragma unroll
        for (int k = 0; k < KPT; ++k)
#pragma unroll
          for (int hh = 0; hh < kIsHG; ++hh) s0[k][hh] = 0.0f, s4[k][hh] = 0.0f;
        const int o0 = jp * M, o4 = (jp + 4) * M;
#pragma unroll
        for (int f = 0; f < M; f += 4) {
          float4 kv0[KPT], kv4[KPT];
#pragma unroll
          for (int k = 0; k < KPT; ++k) {
            kv0[k] = *reinterpret_cast<const float4*>(krow[k] + o0 + f);
            kv4[k] = *reinterpret_cast<const float4*>(krow[k] + o4 + f);
          }
#pragma unroll
          for (int hh = 0; hh < kIsHG; ++hh) {
            const float4 q0 = *reinterpret_cast<const float4*>(qrow + hh * 4 * S + o0 + f);
            const float4 q4 = *reinterpret_cast<const float4*>(qrow + hh * 4 * S + o4 + f);
#pragma unroll
            for (int k = 0; k < KPT; ++k) {  // elements in index order within each partial
              float x0 = s0[k][hh], x4 = s4[k][hh];
              x0 = mul_add(q0.x, kv0[k].x, x0), x4 = mul_add(q4.x, kv4[k].x, x4);
              x0 = mul_add(q0.y, kv0[k].y, x0), x4 = mul_add(q4.y, kv4[k].y, x4);
              x0 = mul_add(q0.z, kv0[k].z, x0), x4 = mul_add(q4.z, kv4[k].z, x4);
              x0 = mul_add(q0.w, kv0[k].w, x0), x4 = mul_add(q4.w, kv4[k].w, x4);
              s0[k][hh] = x0, s4[k][hh] = x4;
            }
          }
        }
#pragma unroll
        for (int k = 0; k < KPT; ++k)
#pragma unroll
          for (int hh = 0; hh < kIsHG; ++hh) {
            const float p = __fadd_rn(s0[k][hh], s4[k][hh]);
            if (jj == 0) ab[k][hh] = p;                                      // s0 + s4
            else if (jj == 1) ab[k][hh] = __fadd_rn(ab[k][hh], p);           // + (s2 + s6)
            else if (jj == 2) c[k][hh] = p;                                  // s1 + s5
            else ab[k][hh] = __fadd_rn(ab[k][hh], __fadd_rn(c[k][hh], p));  // + ((s1+s5)+(s3+s7))
          }
      }
      const int hbase = hb * kIsHB + g * kIsHG;
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        float v[kIsHG];
#pragma unroll
        for (int hh = 0; hh < kIsHG; ++hh) {
          float d = ab[k][hh];
          if (a.bf16) d = dev_round_bf16(d);
          float x = __fmul_rn(relu_cpu(d), ws[hbase + hh]);
          if (a.bf16) x = dev_round_bf16(x);
          v[hh] = x;
        }
        float s = srun[k];
#pragma unroll
        for (int step = 0; step < 4; ++step) {  // group step adds its heads, then hands s on
          if (g == step) {
#pragma unroll
            for (int hh = 0; hh < kIsHG; ++hh)
              if (hbase + hh < nI) s = __fadd_rn(s, v[hh]);
          }
          s = __shfl_sync(0xffffffffu, s, kq + 8 * step);
        }
        srun[k] = s;
      }
    }
    if (g == 0) {
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        const int64_t key = k0 + warp * 8 * KPT + kq + 8 * k;
        if (key < clen) a.scores[t * a.stride + key] = a.bf16 ? dev_round_bf16(srun[k]) : srun[k];
      }
    }
  }
}

constexpr int kTopkThreads = 1024;
constexpr int kSelUnroll = 4;  // keys loaded per thread before they are counted

// Exact top-k selection by radix select, one block per row. Keys are the float bits mapped to an
// order-preserving uint32 (-0 folded onto +0, so equal floats have equal keys); 4 histogram passes
// of 8 bits find the k-th largest key, then the elements above it and the lowest-index ones equal
// to it are emitted in ascending index order: the set of ops::topk_indices (value desc, lower
// index first at ties) for any number of candidates.
struct SelectShared {
  unsigned hist[256];
  unsigned wgt[32], weq[32];
  unsigned prefix, remaining, total;
};

__device__ __forceinline__ uint32_t order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Finds the threshold key of the k largest valid keys (key_of(i) < 0: not a candidate). Leaves
// sh.prefix = threshold, sh.remaining = how many of the elements equal to it are taken, or
// sh.total <= k: every valid element is taken.
template <typename KeyOf>
__device__ void block_radix_select(KeyOf key_of, int64_t n, int64_t k, SelectShared& sh) {
  const int lane = int(threadIdx.x & 31);
  if (threadIdx.x == 0) sh.prefix = 0, sh.remaining = unsigned(k), sh.total = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    for (int64_t base = 0; base < n; base += int64_t(kSelUnroll) * blockDim.x) {
      int64_t kk[kSelUnroll];  // loads first, then the counting
#pragma unroll
      for (int u = 0; u < kSelUnroll; ++u) {
        const int64_t i = base + int64_t(u) * blockDim.x + threadIdx.x;
        kk[u] = i < n ? key_of(i) : -1;
      }
#pragma unroll
      for (int u = 0; u < kSelUnroll; ++u) {
        const bool in = kk[u] >= 0 && (uint32_t(kk[u]) & hi_mask) == prefix;
        const int bin = in ? int((uint32_t(kk[u]) >> shift) & 255u) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);  // one atomic per distinct bin
        if (in && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], unsigned(__popc(peers)));
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l owns bins 8l..8l+7; find the bin where the count from the top reaches remaining
      const unsigned rem = sh.remaining;
      __syncwarp();
      unsigned cnt = 0;
      for (int b = 0; b < 8; ++b) cnt += sh.hist[8 * lane + b];
      unsigned suffix = cnt;  // lanes lane..31
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += t;
      }
      const unsigned total = __shfl_sync(0xffffffffu, suffix, 0);
      if (pass == 0 && lane == 0) sh.total = total;
      const unsigned above = suffix - cnt;
      if (!(pass == 0 && total <= unsigned(k)) && above < rem && above + cnt >= rem) {
        unsigned c = above;
        for (int b = 7; b >= 0; --b) {
          const unsigned h = sh.hist[8 * lane + b];
          if (c + h >= rem) {
            sh.prefix = prefix | (uint32_t(8 * lane + b) << shift);
            sh.remaining = rem - c;
            break;
          }
          c += h;
        }
      }
    }
    __syncthreads();
    if (sh.total <= unsigned(k)) return;
  }
}

// Emits the selection of block_radix_select in ascending index order: emit(i, position). Each
// warp owns a contiguous segment; per-warp counts give every warp its output offset.
template <typename KeyOf, typename Emit>
__device__ void block_select_gather(KeyOf key_of, int64_t n, int64_t k, SelectShared& sh, Emit emit) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x / 32), n_warps = int(blockDim.x / 32);
  const bool all = sh.total <= unsigned(k);
  const uint32_t thr = sh.prefix;
  const unsigned need = all ? 0u : sh.remaining;
  const int64_t seg = ((n + n_warps - 1) / n_warps + 31) / 32 * 32;  // multiple of 32: whole steps
  const int64_t lo = warp * seg, hi = lo + seg < n ? lo + seg : n;
  const unsigned lt = (1u << lane) - 1u;
  auto keys = [&](int64_t base, int64_t* kk) {  // 32 x kSelUnroll keys from base, lane-interleaved
#pragma unroll
    for (int u = 0; u < kSelUnroll; ++u) {
      const int64_t i = base + 32 * u + lane;
      kk[u] = i < hi ? key_of(i) : -1;
    }
  };
  auto gt_of = [&](int64_t kk) { return kk >= 0 && (all || uint32_t(kk) > thr); };
  auto eq_of = [&](int64_t kk) { return kk >= 0 && !all && uint32_t(kk) == thr; };
  unsigned ngt = 0, neq = 0;
  for (int64_t base = lo; base < hi; base += 32 * kSelUnroll) {
    int64_t kk[kSelUnroll];
    keys(base, kk);
#pragma unroll
    for (int u = 0; u < kSelUnroll; ++u) {
      ngt += unsigned(__popc(__ballot_sync(0xffffffffu, gt_of(kk[u]))));
      neq += unsigned(__popc(__ballot_sync(0xffffffffu, eq_of(kk[u]))));
    }
  }
  if (lane == 0) sh.wgt[warp] = ngt, sh.weq[warp] = neq;
  __syncthreads();
  unsigned eq_off = 0, sel_off = 0;
  for (int w = 0; w < warp; ++w) {
    const unsigned take = need > eq_off ? min(need - eq_off, sh.weq[w]) : 0u;
    sel_off += sh.wgt[w] + take;
    eq_off += sh.weq[w];
  }
  for (int64_t base = lo; base < hi; base += 32 * kSelUnroll) {
    int64_t kk[kSelUnroll];
    keys(base, kk);
#pragma unroll
    for (int u = 0; u < kSelUnroll; ++u) {
      const bool eq = eq_of(kk[u]);
      const unsigned beq = __ballot_sync(0xffffffffu, eq);
      const bool sel = gt_of(kk[u]) || (eq && eq_off + unsigned(__popc(beq & lt)) < need);
      const unsigned bsel = __ballot_sync(0xffffffffu, sel);
      if (sel) emit(base + 32 * u + lane, int64_t(sel_off + unsigned(__popc(bsel & lt))));
      eq_off += unsigned(__popc(beq));
      sel_off += unsigned(__popc(bsel));
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kTopkThreads) index_topk_kernel(IndexTopkArgs a) {
  pdl_prologue();
  __shared__ SelectShared sh;
  // Row r of the launch: row t of its sequence (a multi-sequence launch: rows of several).
  const int64_t r = blockIdx.x;
  IndexSeg sg{nullptr, a.start, a.T, 0, 0};
  if (a.segs) sg = a.segs[a.row_seg[r]];
  const int64_t t = r - sg.row0, stride = a.segs ? sg.start + sg.T : a.stride, o = sg.off + t * stride;
  const int64_t clen = (sg.start + t + 1) / a.ratio;
  float* s = a.scores + o;
  uint8_t* cand = a.cand + o;
  if (a.mode == 1) {  // candidate mask: best blocks by max score, the last (partial) block pinned
    float* b = a.block_scratch + o;
    uint8_t* kept = a.taken + o;
    const int64_t nb = (clen + a.cand_block - 1) / a.cand_block;
    for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) {
      float m = -INFINITY;
      for (int64_t i = j * a.cand_block; i < clen && i < (j + 1) * a.cand_block; ++i) m = fmaxf(m, s[i]);
      b[j] = j == (clen - 1) / a.cand_block ? INFINITY : m;
      kept[j] = 0;
    }
    __syncthreads();
    auto bkey = [b](int64_t j) -> int64_t { return b[j] > -INFINITY ? int64_t(order_key(b[j])) : -1; };
    if (a.cand_top > 0) {
      block_radix_select(bkey, nb, a.cand_top, sh);
      block_select_gather(bkey, nb, a.cand_top, sh, [kept](int64_t j, int64_t) { kept[j] = 1; });
    }
    for (int64_t i = threadIdx.x; i < clen; i += blockDim.x) cand[i] = kept[i / a.cand_block];
  } else if (a.mode == 2) {
    for (int64_t i = threadIdx.x; i < clen; i += blockDim.x)
      if (!cand[i]) s[i] = -INFINITY;
  }
  __syncthreads();
  auto skey = [s](int64_t i) -> int64_t { const float x = s[i]; return isfinite(x) ? int64_t(order_key(x)) : -1; };
  block_radix_select(skey, clen, a.k, sh);
  int32_t* out = a.out + r * a.k;
  block_select_gather(skey, clen, a.k, sh, [out](int64_t i, int64_t pos) { out[pos] = int32_t(i); });
  if (threadIdx.x == 0) a.out_n[r] = int32_t(sh.total <= unsigned(a.k) ? sh.total : unsigned(a.k));
}

// Multi-block top-k for long rows (decode and verify steps: a few rows of up to ~10^6 keys, where
// one block per row leaves the other SMs idle). Same results as index_topk_kernel:
//   zero:   clears the row's header (histogram + counters) at the start of block_scratch;
//   hist:   blocks over key chunks count the top 11 bits of the order keys (mode 2 first writes -inf
//           to masked-out entries, as the one-block kernel does);
//   part:   every block finds the bin b1 holding the k-th largest key from the histogram; keys in
//           bins above b1 are selected at once (fewer than k), keys in b1 become candidates;
//   finish: one block per row selects the remaining keys among the candidates (value, then lower
//           index at ties: a second radix select on the index breaks ties) and sorts the k indices
//           ascending. A row with at most k valid keys, or more candidates than the scratch holds,
//           is done by the one-block algorithm over the whole row instead.
// Mode 1 runs the same select first over the candidate blocks (kBlk: keys are the block maxima,
// the pinned last block +inf, k = cand_top, the result is the kept flags in `taken`), writes the
// mask, then selects over the unfiltered scores.
// block_scratch row layout (4-byte words): [0, 2048) histogram, then n_sel, n_cand, b1, above,
// total; candidates (int32 indices) from kMbHeader on; mode 1 keeps the block maxima in the last
// nb_max words of the row (the block select's candidates stop before them).
constexpr int kMbThreads = 256;
constexpr int kMbBins = 2048;
constexpr int kMbShift = 21;  // 32 - 11 bits
constexpr int kMbUnroll = 4;  // keys per thread, loaded before any is counted
constexpr int64_t kMbChunk = int64_t(kMbThreads) * kMbUnroll;
constexpr int64_t kMbHeader = kMbBins + 8;
constexpr int64_t kMbMaxK = 2048;     // the finish block orders k indices in shared memory
constexpr int64_t kMbMinKeys = 8192;  // shorter rows: one block per row is as fast
// Automatic path (path 0) with this many rows or more (prefill chunks): one block per row. The
// per-row cluster / multi-block paths spread a row over the SMs, which a decode step's few rows
// need; a chunk's rows fill every SM on their own.
constexpr int64_t kTopkRowKernelMinRows = 512;
constexpr int kMbStage = 4096;        // candidates the finish block stages in shared memory

struct MbRow {
  unsigned* g;       // header
  int32_t* cands;
  int64_t n, k, cap;  // keys in this row, how many to select, candidate capacity
};
__device__ __forceinline__ int64_t mb_clen(const IndexTopkArgs& a, int64_t t) { return (a.start + t + 1) / a.ratio; }
__device__ __forceinline__ int64_t mb_nb_max(const IndexTopkArgs& a) {
  return ((a.start + a.T) / a.ratio + a.cand_block - 1) / a.cand_block;
}
__device__ __forceinline__ float* mb_bmax(const IndexTopkArgs& a, int64_t t) {
  return a.block_scratch + t * a.stride + (a.stride - mb_nb_max(a));
}
template <bool kBlk>
__device__ __forceinline__ MbRow mb_row(const IndexTopkArgs& a, int64_t t) {
  unsigned* g = reinterpret_cast<unsigned*>(a.block_scratch + t * a.stride);
  const int64_t clen = mb_clen(a, t);
  if constexpr (kBlk)
    return {g, reinterpret_cast<int32_t*>(g + kMbHeader), (clen + a.cand_block - 1) / a.cand_block, a.cand_top,
            a.stride - kMbHeader - mb_nb_max(a)};
  else
    return {g, reinterpret_cast<int32_t*>(g + kMbHeader), clen, a.k, a.stride - kMbHeader};
}
// Order key of element i of row t, or -1 when it is not a candidate (non-finite score; a block
// whose maximum is -inf).
template <bool kBlk>
__device__ __forceinline__ int64_t mb_key(const IndexTopkArgs& a, int64_t t, int64_t i) {
  if constexpr (kBlk) {
    const float x = mb_bmax(a, t)[i];
    return x > -INFINITY ? int64_t(order_key(x)) : -1;
  } else {
    const float x = a.scores[t * a.stride + i];
    return isfinite(x) ? int64_t(order_key(x)) : -1;
  }
}

__global__ void topk_mb_zero_kernel(IndexTopkArgs a) {
  pdl_prologue();
  unsigned* h = reinterpret_cast<unsigned*>(a.block_scratch + blockIdx.x * a.stride);
  for (int64_t i = threadIdx.x; i < kMbHeader; i += blockDim.x) h[i] = 0;
}

// Adds the lanes with `pred` to `*ctr` with one atomic per warp; returns this lane's slot.
__device__ __forceinline__ unsigned warp_append(unsigned* ctr, bool pred) {
  const unsigned m = __ballot_sync(0xffffffffu, pred);
  const int lane = int(threadIdx.x & 31), leader = __ffs(m) - 1;
  unsigned base = 0;
  if (m && lane == leader) base = atomicAdd(ctr, unsigned(__popc(m)));
  base = __shfl_sync(0xffffffffu, base, leader < 0 ? 0 : leader);
  return base + unsigned(__popc(m & ((1u << lane) - 1u)));
}

// kBlk: first computes this chunk's block maxima (pinned last block +inf) and clears their kept
// flags.
template <bool kBlk>
__global__ void __launch_bounds__(kMbThreads) topk_mb_hist_kernel(IndexTopkArgs a) {
  pdl_prologue();
  __shared__ unsigned hist[kMbBins];
  const int64_t t = blockIdx.y;
  const MbRow r = mb_row<kBlk>(a, t);
  const int64_t lo = int64_t(blockIdx.x) * kMbChunk;
  if (lo >= r.n) return;
  const int64_t hi = lo + kMbChunk < r.n ? lo + kMbChunk : r.n;
  for (int i = threadIdx.x; i < kMbBins; i += blockDim.x) hist[i] = 0;
  float* s = a.scores + t * a.stride;
  if constexpr (kBlk) {
    const int64_t clen = mb_clen(a, t), cb = a.cand_block;
    float* bm = mb_bmax(a, t);
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
      float m = -INFINITY;
      for (int64_t i = j * cb; i < clen && i < (j + 1) * cb; ++i) m = fmaxf(m, s[i]);
      bm[j] = j == (clen - 1) / cb ? INFINITY : m;
      a.taken[t * a.stride + j] = 0;
    }
  } else if (a.mode == 2) {
    const uint8_t* cand = a.cand + t * a.stride;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      if (!cand[i]) s[i] = -INFINITY;
  }
  __syncthreads();
  const int lane = int(threadIdx.x & 31);
  int64_t key[kMbUnroll];  // the chunk is kMbUnroll keys per thread: all loads in flight at once
#pragma unroll
  for (int u = 0; u < kMbUnroll; ++u) {
    const int64_t i = lo + int64_t(u) * blockDim.x + threadIdx.x;
    key[u] = i < hi ? mb_key<kBlk>(a, t, i) : -1;
  }
#pragma unroll
  for (int u = 0; u < kMbUnroll; ++u) {
    const int bin = key[u] >= 0 ? int(uint32_t(key[u]) >> kMbShift) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, bin);  // one atomic per distinct bin
    if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], unsigned(__popc(peers)));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kMbBins; i += blockDim.x)
    if (hist[i]) atomicAdd(&r.g[i], hist[i]);
}

// The bin of the k-th largest key: b1, the count in bins above it, and the total (whole block).
struct MbSplit {
  unsigned b1, above, total;
};
__device__ MbSplit mb_find_split(const unsigned* g, int64_t k) {
  __shared__ unsigned part[kMbThreads];
  __shared__ MbSplit res;
  constexpr int kPer = kMbBins / kMbThreads;  // thread j owns bins [kPer j, kPer j + kPer)
  unsigned cnt = 0;
  for (int b = 0; b < kPer; ++b) cnt += g[kPer * threadIdx.x + b];
  part[threadIdx.x] = cnt;
  __syncthreads();
  for (int o = 1; o < kMbThreads; o <<= 1) {  // suffix sums: part[j] = sum over threads >= j
    const unsigned add = threadIdx.x + o < kMbThreads ? part[threadIdx.x + o] : 0u;
    __syncthreads();
    part[threadIdx.x] += add;
    __syncthreads();
  }
  const unsigned total = part[0];
  if (threadIdx.x == 0) res = {0u, 0u, total};
  __syncthreads();
  const unsigned above = part[threadIdx.x] - cnt;
  if (total > unsigned(k) && above < unsigned(k) && above + cnt >= unsigned(k)) {
    unsigned c = above;
    for (int b = kPer - 1; b >= 0; --b) {
      const unsigned h = g[kPer * threadIdx.x + b];
      if (c + h >= unsigned(k)) {
        res = {unsigned(kPer * threadIdx.x + b), c, total};
        break;
      }
      c += h;
    }
  }
  __syncthreads();
  return res;
}

template <bool kBlk>
__global__ void __launch_bounds__(kMbThreads) topk_mb_part_kernel(IndexTopkArgs a) {
  pdl_prologue();
  const int64_t t = blockIdx.y;
  const MbRow r = mb_row<kBlk>(a, t);
  const int64_t lo = int64_t(blockIdx.x) * kMbChunk;
  if (lo >= r.n) return;
  const MbSplit sp = mb_find_split(r.g, r.k);
  if (blockIdx.x == 0 && threadIdx.x == 0) r.g[kMbBins + 2] = sp.b1, r.g[kMbBins + 3] = sp.above, r.g[kMbBins + 4] = sp.total;
  if (sp.total <= unsigned(r.k)) return;  // the finish kernel takes every valid key
  const int64_t hi = lo + kMbChunk < r.n ? lo + kMbChunk : r.n;
  int32_t* out = a.out + t * a.k;
  int64_t key[kMbUnroll];
#pragma unroll
  for (int u = 0; u < kMbUnroll; ++u) {
    const int64_t i = lo + int64_t(u) * blockDim.x + threadIdx.x;
    key[u] = i < hi ? mb_key<kBlk>(a, t, i) : -1;
  }
#pragma unroll
  for (int u = 0; u < kMbUnroll; ++u) {
    const int64_t i = lo + int64_t(u) * blockDim.x + threadIdx.x;
    const int bin = key[u] >= 0 ? int(uint32_t(key[u]) >> kMbShift) : -1;
    const unsigned sel = warp_append(&r.g[kMbBins], bin > int(sp.b1));
    if (bin > int(sp.b1)) {
      if constexpr (kBlk) a.taken[t * a.stride + i] = 1;
      else out[sel] = int32_t(i);
    }
    const unsigned c = warp_append(&r.g[kMbBins + 1], bin == int(sp.b1));
    if (bin == int(sp.b1) && int64_t(c) < r.cap) r.cands[c] = int32_t(i);
  }
}

template <bool kBlk>
__global__ void __launch_bounds__(kTopkThreads) topk_mb_finish_kernel(IndexTopkArgs a) {
  pdl_prologue();
  __shared__ SelectShared sh;
  __shared__ int32_t sorted[kBlk ? 1 : kMbMaxK];
  __shared__ unsigned pos, eq_total;
  const int64_t t = blockIdx.x;
  const MbRow r = mb_row<kBlk>(a, t);
  int32_t* out = a.out + t * a.k;
  uint8_t* kept = a.taken + t * a.stride;
  auto emit = [&](int64_t i, unsigned p) {
    if constexpr (kBlk) kept[i] = 1;
    else out[p] = int32_t(i);
  };
  auto key = [&](int64_t i) { return mb_key<kBlk>(a, t, i); };
  const unsigned total = r.n > 0 ? r.g[kMbBins + 4] : 0u, above = r.g[kMbBins + 3], m = r.g[kMbBins + 1];
  if (total <= unsigned(r.k) || int64_t(m) > r.cap) {  // one block over the row
    block_radix_select(key, r.n, r.k, sh);
    block_select_gather(key, r.n, r.k, sh, [&](int64_t i, int64_t p) { emit(i, unsigned(p)); });
    if (!kBlk && threadIdx.x == 0) a.out_n[t] = int32_t(sh.total <= unsigned(a.k) ? sh.total : unsigned(a.k));
    return;
  }
  const unsigned need = unsigned(r.k) - above;  // >= 1: the k-th key is in bin b1
  if (threadIdx.x == 0) pos = above, eq_total = 0;
  // Up to kMbStage candidates are staged in shared memory (index, key) so that the selects below
  // read no global memory; more stay in global memory.
  __shared__ int32_t st_idx[kMbStage];
  __shared__ uint32_t st_key[kMbStage];
  const bool staged = m <= unsigned(kMbStage);
  if (staged)
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const int32_t i = r.cands[j];
      st_idx[j] = i, st_key[j] = uint32_t(key(i));  // valid: the candidates are in b1
    }
  __syncthreads();
  auto cidx = [&](int64_t j) -> int32_t { return staged ? st_idx[j] : r.cands[j]; };
  auto ckey = [&](int64_t j) -> int64_t { return staged ? int64_t(st_key[j]) : key(r.cands[j]); };
  block_radix_select(ckey, m, need, sh);  // ends with a barrier
  const bool all = sh.total <= need;
  const uint32_t thr = sh.prefix;
  const unsigned take_eq = sh.remaining;
  unsigned n_eq = 0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const uint32_t kj = uint32_t(ckey(j));
    if (all || kj > thr) emit(cidx(j), atomicAdd(&pos, 1u));
    else n_eq += kj == thr;
  }
  if (!all) {  // the equal keys: the take_eq lowest indices (all of them when no more are equal)
    if (n_eq) atomicAdd(&eq_total, n_eq);
    __syncthreads();
    if (eq_total == take_eq) {
      for (int64_t j = threadIdx.x; j < m; j += blockDim.x)
        if (uint32_t(ckey(j)) == thr) emit(cidx(j), atomicAdd(&pos, 1u));
    } else {
      auto ikey = [&](int64_t j) -> int64_t {
        return uint32_t(ckey(j)) == thr ? int64_t(0x7fffffff - cidx(j)) : int64_t(-1);
      };
      block_radix_select(ikey, m, take_eq, sh);
      const uint32_t ithr = sh.prefix;  // indices are distinct: keys >= ithr are exactly take_eq
      for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
        const int64_t ik = ikey(j);
        if (ik >= 0 && uint32_t(ik) >= ithr) emit(cidx(j), atomicAdd(&pos, 1u));
      }
    }
  }
  if constexpr (!kBlk) {
    __syncthreads();
    // Ascending order: the indices are distinct, so each one's position is the count of smaller
    // ones (every thread reads the same shared word at once: broadcasts, two barriers in all).
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) sorted[i] = out[i];
    __syncthreads();
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) {
      const int32_t x = sorted[i];
      int rank = 0;
      for (int j = 0; j < a.k; ++j) rank += sorted[j] < x;
      out[rank] = x;
    }
    if (threadIdx.x == 0) a.out_n[t] = int32_t(a.k);
  }
}

// Mode 1: the published candidate mask from the kept blocks.
__global__ void topk_mb_mask_kernel(IndexTopkArgs a) {
  pdl_prologue();
  const int64_t t = blockIdx.y, clen = mb_clen(a, t);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < clen) a.cand[t * a.stride + i] = a.taken[t * a.stride + i / a.cand_block];
}

}  // namespace

namespace {
template <int KPT, int DP>
cudaError_t launch_index_scores_tiled(const IndexScoreArgs& a, size_t smem, int sms, cudaStream_t s) {
  const int64_t clen_max = (a.start + a.T) / a.ratio;
  if (clen_max <= 0) return cudaSuccess;
  const int64_t tiles = (clen_max + is_tile(KPT) - 1) / is_tile(KPT);
  // Few key tiles (short contexts): rows are spread over blockIdx.y until ~2 blocks per SM.
  int64_t splits = (2 * int64_t(sms) + tiles - 1) / tiles;
  splits = splits < 1 ? 1 : splits > a.T ? a.T : splits;
  if (splits > 65535) splits = 65535;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 && cudaFuncSetAttribute(index_scores_tiled_kernel<KPT, DP>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  return launch_kernel(index_scores_tiled_kernel<KPT, DP>, dim3(unsigned(tiles), unsigned(splits)), kIsThreads, smem, s, a);
}
}  // namespace

size_t index_scores_work_bytes(const IndexScoreArgs& a) {
  return index_scores_imma_applies(a) ? index_scores_imma_work_bytes(a.T, a.nI) : 0;
}

cudaError_t launch_index_scores(const IndexScoreArgs& a, cudaStream_t s) {
  if (a.T == 0 || a.stride == 0) return cudaSuccess;
  if (a.ratio <= 0 || a.T > 65535 * 1024 || a.kernel < 0 || a.kernel > 4) return cudaErrorInvalidValue;
  if (a.kernel == 4 || (a.kernel == 0 && index_scores_imma_applies(a) && a.work)) return launch_index_scores_imma(a, s);
  if (a.segs) return cudaErrorInvalidValue;  // several sequences: kernel 4 only
  int kind = a.kernel;
  if (kind != 1 && a.nI > 0 && a.dI > 0 && a.dI <= kSumChunk) {
    int dev = 0, optin = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return cudaGetLastError();
    // Auto: 2 keys per thread (fewer shared-memory reads per FLOP) once 128-key tiles x rows
    // cover the SMs, else 1 key per thread (64-key tiles: twice the blocks). On an H200: 4096
    // keys at M = 1 9.2 vs 12.9 us, at M = 6 21.6 vs 19.3 us; 131072 keys 74.6 / 337.4 us with 2.
    if (kind == 0) {
      const int64_t tiles2 = ((a.start + a.T) / a.ratio + is_tile(2) - 1) / is_tile(2);
      kind = tiles2 * a.T >= sms ? 3 : 2;
    }
    const size_t smem = is_smem_bytes(kind == 2 ? 1 : 2, a.nI, a.dI);
    if (smem <= size_t(optin) && is_dp(a.dI) == 128)  // V4 / V4.1: dims known at compile time
      return kind == 2 ? launch_index_scores_tiled<1, 128>(a, smem, sms, s) : launch_index_scores_tiled<2, 128>(a, smem, sms, s);
    if (smem <= size_t(optin))
      return kind == 2 ? launch_index_scores_tiled<1, 0>(a, smem, sms, s) : launch_index_scores_tiled<2, 0>(a, smem, sms, s);
  }  // else the reference kernel
  return launch_kernel(index_scores_kernel, dim3(unsigned(a.T), unsigned((a.stride + 127) / 128)), 128, 0, s, a);
}

namespace {
// The cluster path's plan (topk.cu); mode 1 also needs what the candidate-block launches of the
// multi-block path need (block_scratch holds the block maxima and their candidates).
bool cluster_plan(const IndexTopkArgs& a, int* csize, int* kpt) {
  if (a.T <= 0 || a.ratio <= 0 || a.stride > INT32_MAX || (a.mode == 1 && a.cand_block <= 0)) return false;
  const int64_t clen_max = (a.start + a.T) / a.ratio;
  const int64_t nb_max = a.mode == 1 ? (clen_max + a.cand_block - 1) / a.cand_block : 0;
  const bool blk_ok = a.block_scratch && a.stride > kMbHeader + 2 * nb_max && a.T <= 65535 && a.taken &&
                      a.cand_top > 0 && a.cand_top <= INT32_MAX;
  return (a.mode != 1 || blk_ok) && topk_cluster_plan(a, csize, kpt);
}
}  // namespace

bool index_topk_segs_applies(int64_t max_len, int64_t ratio) { return ratio > 0 && max_len / ratio < kMbMinKeys; }

cudaError_t launch_index_topk(const IndexTopkArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.ratio <= 0 || a.k <= 0 || a.k > INT32_MAX || (a.mode == 1 && a.cand_block <= 0)) return cudaErrorInvalidValue;
  if (a.stride > INT32_MAX || a.path < 0 || a.path > 3) return cudaErrorInvalidValue;
  if (a.segs) {  // several sequences: one block per row
    if (!a.row_seg || a.n_segs < 1 || a.path > 1 || a.T > INT32_MAX || !index_topk_segs_applies(a.stride, a.ratio))
      return cudaErrorInvalidValue;
    return launch_kernel(index_topk_kernel, unsigned(a.T), kTopkThreads, 0, s, a);
  }
  const int64_t clen_max = (a.start + a.T) / a.ratio;
  // Mode 1 keeps the block maxima at the end of each scratch row, after the header and room for
  // as many block candidates.
  const int64_t nb_max = a.mode == 1 ? (clen_max + a.cand_block - 1) / a.cand_block : 0;
  const bool mb_ok = a.k <= kMbMaxK && a.block_scratch && a.stride > kMbHeader + 2 * nb_max && a.T <= 65535 &&
                     (a.mode != 1 || (a.taken && a.cand_top > 0 && a.cand_top <= INT32_MAX));
  if (a.path == 2 && !mb_ok) return cudaErrorInvalidValue;
  // The cluster path: one launch (mode 1: after the candidate-block launches).
  int csize = 0, kpt = 0;
  const bool spread = clen_max >= kMbMinKeys && a.T < kTopkRowKernelMinRows;  // path 0: spread a row over blocks
  const bool ct_ok = (a.path == 3 || (a.path == 0 && spread)) && cluster_plan(a, &csize, &kpt);
  if (a.path == 3 && !ct_ok) return cudaErrorInvalidValue;
  if (!ct_ok && !(a.path == 2 || (a.path == 0 && mb_ok && spread)))
    return launch_kernel(index_topk_kernel, unsigned(a.T), kTopkThreads, 0, s, a);
  const auto chunks = [](int64_t n) { return unsigned(n > 0 ? (n + kMbChunk - 1) / kMbChunk : 1); };
  const dim3 grid(chunks(clen_max), unsigned(a.T));
  cudaError_t e = cudaSuccess;
  if (a.mode == 1) {
    const dim3 bgrid(chunks(nb_max), unsigned(a.T));
    e = launch_kernel(topk_mb_zero_kernel, unsigned(a.T), kMbThreads, 0, s, a);
    if (e == cudaSuccess) e = launch_kernel(topk_mb_hist_kernel<true>, bgrid, kMbThreads, 0, s, a);
    if (e == cudaSuccess) e = launch_kernel(topk_mb_part_kernel<true>, bgrid, kMbThreads, 0, s, a);
    if (e == cudaSuccess) e = launch_kernel(topk_mb_finish_kernel<true>, unsigned(a.T), kTopkThreads, 0, s, a);
    if (e == cudaSuccess)
      e = launch_kernel(topk_mb_mask_kernel, dim3(unsigned((clen_max + 255) / 256 > 0 ? (clen_max + 255) / 256 : 1), unsigned(a.T)),
                        256, 0, s, a);
  }
  if (ct_ok) return e == cudaSuccess ? launch_topk_cluster(a, csize, kpt, s) : e;
  if (e == cudaSuccess) e = launch_kernel(topk_mb_zero_kernel, unsigned(a.T), kMbThreads, 0, s, a);
  if (e == cudaSuccess) e = launch_kernel(topk_mb_hist_kernel<false>, grid, kMbThreads, 0, s, a);
  if (e == cudaSuccess) e = launch_kernel(topk_mb_part_kernel<false>, grid, kMbThreads, 0, s, a);
  if (e == cudaSuccess) e = launch_kernel(topk_mb_finish_kernel<false>, unsigned(a.T), kTopkThreads, 0, s, a);
  return e;
}

int index_topk_cluster_size(const IndexTopkArgs& a) {
  int csize = 0, kpt = 0;
  return cluster_plan(a, &csize, &kpt) ? csize : 0;
}

}  // namespace flashseek::ops::cuda::detail
