// The model's attention on the tensor cores for prefill chunks (prefill_kernels.h,
// launch_model_prefill_attention): the keys launch_model_attention reads, decoded once per chunk
// into BF16 rows, each query row's key list as indices into them, then the MMA prefill attention
// (prefill_attn.cu).
//
// Pool of one sequence (rows in this order, at pool offset `off`):
//   [0, n_r)            its window rows before the chunk: positions start - n_r .. start - 1 from
//                       the ring (slot s % ring_size), n_r = min(start, window - 1)
//   [n_r, n_r + T)      the chunk's kv rows (positions start .. start + T - 1)
//   [n_r + T, + n_ckv)  its compressed rows 0 .. n_ckv - 1, n_ckv = (start + T) / ratio
// so window key s of any query row is pool row off + s - (start - n_r), and compressed row c is
// off + n_r + T + c. Key slots of query row t (position p = start + t): [0, window) the window
// (p - n_win + 1 .. p, n_win = min(p + 1, window); the rest -1), then [window, n_idx) the
// compressed rows (the top-k list's first topk_n[t] entries, or every visible row c < (p + 1) /
// ratio; the rest -1). These are exactly launch_model_attention's keys (model_attn.cu attn_key).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

// One sequence's pool rows and key lists.
struct PoolSeq {
  const uint8_t* ring = nullptr;
  const uint8_t* ckv = nullptr;
  const float* chunk = nullptr;  // its first kv row
  int64_t start = 0, row0 = 0, T = 0, ring_size = 0, n_r = 0, n_ckv = 0, off = 0;
};

// Pool rows of one sequence as BF16 (round to nearest even; the compact values are exact).
__global__ void pool_kernel(PoolSeq g, CacheRowFormat rf, CacheRowFormat cf, int64_t Dh, uint16_t* pool) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = g.n_r + g.T + g.n_ckv;
  if (id >= rows * Dh) return;
  const int64_t r = id / Dh, d = id % Dh;
  float v;
  if (r < g.n_r) {
    const int64_t slot = (g.start - g.n_r + r) % g.ring_size;
    v = cache_row_value(rf, g.ring + slot * cache_row_stride(rf, Dh), d);
  } else if (r < g.n_r + g.T) {
    v = g.chunk[(r - g.n_r) * Dh + d];
  } else {
    v = cache_row_value(cf, g.ckv + (r - g.n_r - g.T) * cache_row_stride(cf, Dh), d);
  }
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  pool[(g.off + r) * Dh + d] = *reinterpret_cast<const uint16_t*>(&b);
}

// What key slot j of the query row at position p (step row `row`) holds: the window position
// p - n_win + 1 + j (n_win = min(p + 1, window)), or compressed row c of the row's top-k list
// (its first topk_n entries; without lists every visible row c < (p + 1) / ratio; rows outside
// [0, n_ckv) absent), or nothing. `at` receives the position or the row.
enum class SlotKey { kAbsent, kWindow, kCompressed };
__device__ __forceinline__ SlotKey slot_key(int64_t p, int64_t j, int64_t window, bool comp, const int32_t* topk,
                                            const int32_t* topk_n, int64_t topk_stride, int64_t ratio, int64_t row,
                                            int64_t n_ckv, int64_t& at) {
  if (j < window) {
    const int64_t n_win = p + 1 < window ? p + 1 : window;
    if (j >= n_win) return SlotKey::kAbsent;
    at = p - n_win + 1 + j;
    return SlotKey::kWindow;
  }
  if (!comp) return SlotKey::kAbsent;
  const int64_t jj = j - window;
  int64_t cnt = topk ? int64_t(topk_n[row]) : (p + 1) / ratio;
  if (topk && cnt > topk_stride) cnt = topk_stride;
  if (jj >= cnt) return SlotKey::kAbsent;
  at = topk ? int64_t(topk[row * topk_stride + jj]) : jj;
  return at >= 0 && at < n_ckv ? SlotKey::kCompressed : SlotKey::kAbsent;
}

// Key slots of the sequence's query rows (see the file comment).
__global__ void idx_kernel(PoolSeq g, const int32_t* topk, const int32_t* topk_n, int64_t topk_stride, int64_t ratio,
                           int64_t window, bool comp, int n_idx, int32_t* idx) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= g.T * n_idx) return;
  const int64_t t = id / n_idx, j = id % n_idx, row = g.row0 + t, p = g.start + t;
  int64_t r = -1, at = 0;
  const SlotKey k = slot_key(p, j, window, comp, topk, topk_n, topk_stride, ratio, row, g.n_ckv, at);
  if (k == SlotKey::kWindow) r = g.off + at - (g.start - g.n_r);
  if (k == SlotKey::kCompressed) r = g.off + g.n_r + g.T + at;
  idx[row * n_idx + j] = int32_t(r);
}

// Decode rows (launch_model_decode_attention): rows r0 .. r0 + rows - 1 of the step, each with
// pool rows of its own, [lt·n_idx, (lt + 1)·n_idx) for local row lt, one per key slot in
// idx_kernel's slot order and with pool_kernel's values (chunk rows rounded, compact rows decoded,
// then BF16); idx the slots (absent: -1, their pool rows left unwritten: the attention zero-fills
// absent rows). A thread per 8 values of a (row, slot). `seqs` / `row_seq` (device) give each
// row's sequence; without them every row belongs to `one`.
__global__ void decode_gather_kernel(ModelAttnArgs a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                     ModelAttnSeq one, CacheRowFormat rf, CacheRowFormat cf, int64_t r0,
                                     int64_t rows, int n_idx, uint16_t* pool, int32_t* idx) {
  pdl_prologue();
  const int64_t pieces = a.Dh / 8;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * n_idx * pieces) return;
  const int64_t piece = id % pieces, j = (id / pieces) % n_idx, lt = id / pieces / n_idx, t = r0 + lt;
  const ModelAttnSeq& sq = seqs ? seqs[row_seq[t]] : one;
  const int64_t p = sq.start + (t - sq.row0);
  const float* chunk_row = nullptr;
  const uint8_t* row = nullptr;
  CacheRowFormat f = rf;
  int64_t at = 0;
  const bool comp = a.ckv && sq.ckv;
  const int64_t n_ckv = comp ? (sq.start + sq.T) / a.ratio : 0;
  const SlotKey k = slot_key(p, j, a.window, comp, a.topk, a.topk_n, a.topk_stride, a.ratio, t, n_ckv, at);
  if (k == SlotKey::kWindow) {
    if (at >= sq.start) chunk_row = a.kv_chunk + (sq.row0 + at - sq.start) * a.Dh;
    else row = static_cast<const uint8_t*>(sq.ring) + (at % sq.ring_size) * cache_row_stride(rf, a.Dh);
  } else if (k == SlotKey::kCompressed) {
    row = static_cast<const uint8_t*>(sq.ckv) + at * cache_row_stride(cf, a.Dh), f = cf;
  }
  const bool ok = chunk_row || row;
  const int64_t slot = lt * n_idx + j;
  if (piece == 0) idx[slot] = ok ? int32_t(slot) : -1;
  if (!ok) return;
  const int64_t d0 = piece * 8;
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float v0 = chunk_row ? chunk_row[d0 + 2 * e] : cache_row_value(f, row, d0 + 2 * e);
    const float v1 = chunk_row ? chunk_row[d0 + 2 * e + 1] : cache_row_value(f, row, d0 + 2 * e + 1);
    const __nv_bfloat162 b = __floats2bfloat162_rn(v0, v1);
    w[e] = *reinterpret_cast<const uint32_t*>(&b);
  }
  *reinterpret_cast<uint4*>(pool + slot * a.Dh + d0) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows per decode launch: the key rows of a chunk of rows stay within pool_bytes (at least a row).
int64_t decode_chunk_rows(const ModelAttnArgs& a, int64_t n_idx, int64_t pool_bytes) {
  const int64_t per_row = n_idx * a.Dh * 2;
  return std::max<int64_t>(1, std::min<int64_t>(a.T, pool_bytes / std::max<int64_t>(per_row, 1)));
}

constexpr size_t kAlign = 256;
size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// The pool layout of `seqs`; false where the args are invalid for this path.
bool pool_layout(const ModelAttnArgs& a, const ModelAttnSeq* seqs, int64_t n_seqs, std::vector<PoolSeq>* out,
                 int64_t* pool_rows, int64_t* n_idx) {
  if (!seqs || n_seqs <= 0 || a.window <= 0 || a.Dh <= 0 || a.T <= 0) return false;
  const bool comp = a.ckv != nullptr;
  if (comp && a.ratio <= 0) return false;
  if (comp && a.topk && (!a.topk_n || a.topk_stride <= 0)) return false;
  int64_t rows = 0, k_comp = 0, T = 0;
  out->clear();
  for (int64_t i = 0; i < n_seqs; ++i) {
    const ModelAttnSeq& s = seqs[i];
    if (s.T <= 0 || s.start < 0 || s.row0 != T || s.ring_size < a.window) return false;
    PoolSeq g;
    g.ring = static_cast<const uint8_t*>(s.ring), g.ckv = static_cast<const uint8_t*>(s.ckv);
    g.chunk = a.kv_chunk + s.row0 * a.Dh;
    g.start = s.start, g.row0 = s.row0, g.T = s.T, g.ring_size = s.ring_size;
    g.n_r = std::min<int64_t>(s.start, a.window - 1);
    g.n_ckv = comp && s.ckv ? (s.start + s.T) / a.ratio : 0;
    if (g.n_r > 0 && !g.ring) return false;
    g.off = rows;
    rows += g.n_r + g.T + g.n_ckv;
    if (comp && !a.topk) k_comp = std::max<int64_t>(k_comp, (s.start + s.T) / a.ratio);
    T += s.T;
    out->push_back(g);
  }
  if (comp && a.topk) k_comp = a.topk_stride;
  if (T != a.T) return false;
  *pool_rows = rows;
  *n_idx = a.window + k_comp;
  return rows <= INT32_MAX && *n_idx <= INT32_MAX;
}

}  // namespace

bool model_prefill_attn_supports(const ModelAttnArgs& a) { return prefill_attn_supports(a.H, a.Dh); }

size_t model_prefill_attn_workspace(const ModelAttnArgs& a, const ModelAttnSeq* seqs, int64_t n_seqs,
                                    int64_t* pool_rows, int64_t* n_idx) {
  std::vector<PoolSeq> g;
  int64_t rows = 0, ni = 0;
  if (!pool_layout(a, seqs, n_seqs, &g, &rows, &ni)) return 0;
  if (pool_rows) *pool_rows = rows;
  if (n_idx) *n_idx = ni;
  return align_up(size_t(rows) * size_t(a.Dh) * 2) + size_t(a.T) * size_t(ni) * 4;
}

cudaError_t launch_model_prefill_attention(const ModelAttnArgs& a, const ModelAttnSeq* seqs, int64_t n_seqs, void* ws,
                                           size_t ws_bytes, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (!model_prefill_attn_supports(a) || !a.q || !a.kv_chunk || !a.sink || !a.out || !ws) return cudaErrorInvalidValue;
  std::vector<PoolSeq> segs;
  int64_t rows = 0, n_idx = 0;
  if (!pool_layout(a, seqs, n_seqs, &segs, &rows, &n_idx)) return cudaErrorInvalidValue;
  const size_t pool_bytes = align_up(size_t(rows) * size_t(a.Dh) * 2);
  if (ws_bytes < pool_bytes + size_t(a.T) * size_t(n_idx) * 4) return cudaErrorInvalidValue;
  auto* pool = static_cast<uint16_t*>(ws);
  auto* idx = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(ws) + pool_bytes);
  const CacheRowFormat rf = a.ring_fmt.compact() ? a.ring_fmt : f32_row_format(a.Dh);
  const CacheRowFormat cf = a.ckv_fmt.compact() ? a.ckv_fmt : f32_row_format(a.Dh);
  constexpr unsigned kThreads = 256;
  for (const PoolSeq& g : segs) {
    const int64_t n = (g.n_r + g.T + g.n_ckv) * a.Dh, ni = g.T * n_idx;
    if ((n + kThreads - 1) / kThreads > INT32_MAX || (ni + kThreads - 1) / kThreads > INT32_MAX)
      return cudaErrorInvalidValue;
    if (cudaError_t e = launch_kernel(pool_kernel, dim3(unsigned((n + kThreads - 1) / kThreads)), dim3(kThreads), 0, s,
                                      g, rf, cf, a.Dh, pool);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = launch_kernel(idx_kernel, dim3(unsigned((ni + kThreads - 1) / kThreads)), dim3(kThreads), 0, s,
                                      g, a.topk, a.topk_n, a.topk_stride, a.ratio, a.window, a.ckv != nullptr,
                                      int(n_idx), idx);
        e != cudaSuccess)
      return e;
  }
  PrefillAttnArgs p;
  p.q = a.q, p.kv = pool, p.idx = idx, p.sink = a.sink, p.out = a.out;
  p.m = a.T, p.n_idx = int(n_idx), p.n_rows = int(rows), p.heads = int(a.H), p.dim = int(a.Dh);
  p.scale = a.scale, p.bf16_out = a.bf16;
  return launch_prefill_attn(p, s);
}

int64_t model_decode_attn_slots(const ModelAttnArgs& a) { return a.ckv ? std::max(a.max_keys, a.window) : a.window; }

// The split form's partials for chunks of `rows` rows (launch_prefill_attn): used for chunks that
// may take it whose partials fit pool_bytes as well; else 0 (the in-block fold, the same bits).
size_t decode_split_bytes(const ModelAttnArgs& a, int64_t n_idx, int64_t rows, int64_t pool_bytes) {
  const size_t b = prefill_attn_split_bytes(rows, n_idx, a.H, a.Dh);
  return rows <= kPrefillAttnSplitMaxRows && b <= size_t(std::max<int64_t>(pool_bytes, 0)) ? b : 0;
}

size_t model_decode_attn_workspace(const ModelAttnArgs& a, int64_t pool_bytes) {
  if (a.T <= 0 || a.Dh <= 0 || a.Dh % 8 != 0) return 0;
  const int64_t n_idx = model_decode_attn_slots(a), rows = decode_chunk_rows(a, n_idx, pool_bytes);
  return align_up(size_t(rows * n_idx * a.Dh) * 2) + align_up(size_t(rows * n_idx) * 4) +
         decode_split_bytes(a, n_idx, rows, pool_bytes);
}

cudaError_t launch_model_decode_attention(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                          int64_t pool_bytes, void* ws, size_t ws_bytes, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (!model_prefill_attn_supports(a) || !a.q || !a.kv_chunk || !a.sink || !a.out || !ws || a.window <= 0 ||
      (seqs != nullptr) != (row_seq != nullptr) || (a.ckv && a.ratio <= 0) ||
      (a.ckv && a.topk && (!a.topk_n || a.topk_stride <= 0)))
    return cudaErrorInvalidValue;
  if (!seqs && (!a.ring || a.ring_size < a.window)) return cudaErrorInvalidValue;
  const int64_t n_idx = model_decode_attn_slots(a), chunk = decode_chunk_rows(a, n_idx, pool_bytes);
  if (ws_bytes < model_decode_attn_workspace(a, pool_bytes) || chunk * n_idx > INT32_MAX) return cudaErrorInvalidValue;
  auto* pool = static_cast<uint16_t*>(ws);
  auto* idx = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(ws) + align_up(size_t(chunk * n_idx * a.Dh) * 2));
  // The split form's partials after the lists: tile outputs, then (max, sum) pairs.
  const size_t split_bytes = decode_split_bytes(a, n_idx, chunk, pool_bytes);
  auto* part = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(idx) + align_up(size_t(chunk * n_idx) * 4));
  const CacheRowFormat rf = a.ring_fmt.compact() ? a.ring_fmt : f32_row_format(a.Dh);
  const CacheRowFormat cf = a.ckv_fmt.compact() ? a.ckv_fmt : f32_row_format(a.Dh);
  ModelAttnSeq one;
  one.ring = const_cast<void*>(a.ring), one.ckv = a.ckv, one.start = a.start, one.row0 = 0, one.T = a.T;
  one.ring_size = a.ring_size;
  constexpr unsigned kThreads = 256;
  for (int64_t r0 = 0; r0 < a.T; r0 += chunk) {
    const int64_t rows = std::min(chunk, a.T - r0), n = rows * n_idx * (a.Dh / 8);
    if ((n + kThreads - 1) / kThreads > INT32_MAX) return cudaErrorInvalidValue;
    if (cudaError_t e = launch_kernel(decode_gather_kernel, dim3(unsigned((n + kThreads - 1) / kThreads)),
                                      dim3(kThreads), 0, s, a, seqs, row_seq, one, rf, cf, r0, rows, int(n_idx), pool,
                                      idx);
        e != cudaSuccess)
      return e;
    PrefillAttnArgs p;
    p.q = a.q + r0 * a.H * a.Dh, p.kv = pool, p.idx = idx, p.sink = a.sink, p.out = a.out + r0 * a.H * a.Dh;
    p.m = rows, p.n_idx = int(n_idx), p.n_rows = int(rows * n_idx), p.heads = int(a.H), p.dim = int(a.Dh);
    p.scale = a.scale, p.bf16_out = a.bf16;
    if (a.unrope_pos)
      p.unrope_pos = a.unrope_pos + r0, p.unrope_inv_freq = a.unrope_inv_freq, p.unrope_dim = int(a.unrope_dim);
    if (split_bytes > 0) {  // this chunk's partials (a last, shorter chunk takes fewer)
      p.part = part, p.part_bytes = split_bytes;
    }
    if (cudaError_t e = launch_prefill_attn(p, s); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace flashseek::ops::cuda::detail
