// The device-neutral backend interface of the model (DESIGN.md §6). `Forward` (forward/flow.h)
// composes the V4 / V4.1 layers once over these ops; a backend supplies the memory, the ops and
// the per-sequence state: the CPU backend (forward/cpu_model.h, the oracle kernels of src/ops/cpu)
// and the CUDA backend (backends/cuda, the serving path). Nothing here knows a device API.
//
// Buffers are `Tensor` views of the backend's memory (host memory on the CPU backend, device
// memory on the CUDA backend): the flow allocates them by name (`scratch`), passes them between
// ops and never reads their contents. Weights are named by the host `Vec` of ModelWeights that
// describes them; each backend maps that name to its own copy (FP32 on the CPU, as stored on the
// GPU).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "forward/model.h"
#include "forward/model_state.h"
#include "forward/weights.h"
#include "ops/sample.h"

namespace flashseek::forward {

enum class ElemType : uint8_t { kF32, kI32, kI64, kU8 };

inline size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::kF32: case ElemType::kI32: return 4;
    case ElemType::kI64: return 8;
    case ElemType::kU8: return 1;
  }
  return 1;
}

// A row-major [rows, cols] view of backend memory.
struct Tensor {
  void* data = nullptr;
  ElemType type = ElemType::kF32;
  int64_t rows = 0, cols = 1;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return size_t(numel()) * elem_size(type); }
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
  int64_t* i64() const { return static_cast<int64_t*>(data); }
  uint8_t* u8() const { return static_cast<uint8_t*>(data); }
  // Rows [r0, r0 + n) (n < 0: to the end).
  Tensor rows_from(int64_t r0, int64_t n = -1) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + size_t(r0 * cols) * elem_size(type);
    t.rows = n < 0 ? rows - r0 : n;
    return t;
  }
  // The same elements seen as [r, c] (r·c == numel()).
  Tensor view(int64_t r, int64_t c) const {
    Tensor t = *this;
    t.rows = r, t.cols = c;
    return t;
  }
};

// One sequence's rows in a forward: its state, tokens and positions, and what its index layers
// publish for later layers. The rows of every sequence lie back to back (FwdChunk).
struct FwdSeg {
  ModelState* st = nullptr;
  std::span<const int32_t> tokens;
  int64_t start = 0, T = 0, row0 = 0;
  std::vector<int64_t> pos;          // [T] host copy
  Tensor tokens_d, pos_d;            // the chunk's token / position rows of this sequence
  std::vector<Tensor> topk, topk_n;  // [layer] index lists [T, index_topk] and counts [T] of index sources
  Tensor cand;                       // [T, start + T] candidate masks (V4.1 candidate source)
  bool all_logits = false;           // BatchItem fields
  const ops::SampleSpec* sample = nullptr;
  int32_t* sampled = nullptr;
};

// The rows of one forward: row-wise ops (linears, norms, mHC, MoE, Engram) run once over all T
// rows, so each weight matrix is read once per step; state-bound ops run per sequence.
struct FwdChunk {
  int64_t T = 0;
  Tensor tokens, pos;                // [T] int32 / int64
  Tensor row_seq;                    // [T] int32 segment of each row (empty with one segment)
  std::vector<FwdSeg> segs;
  std::vector<int64_t> engram_ids;   // [n_engram_layers, T, n_cols] (host)
};

// Rounding / quantisation simulations of the reference (ops/quant.h), in place on the first
// `prefix` columns of every row.
enum class QuantSim {
  kBf16,      // round to BF16
  kFp8,       // e4m3 with a power-of-two scale per `block` columns
  kFp4E8m0,   // e2m1 with E8M0 scales per `block` columns
  kFp4E4m3,   // e2m1 with E4M3 scales per `block` columns
};

// The FP8-activation linears, named for the CPU backend's dot perturbation (CpuLoadOptions).
enum class DotOp : uint64_t {
  kNone, kWqA, kWqB, kWkv, kWoB, kIdxWqB, kEngramWkv, kW1, kW3, kW2, kMainProj, kEProj, kHProj
};
struct LinearKey {
  int64_t block = 0;   // role index (or layer for Engram)
  DotOp op = DotOp::kNone;
  int64_t expert = -1; // routed expert id (-1: none / shared expert)
};

// y [rows, out] = q(x [rows, in]) · Wᵀ: FP8 activation blocks of `act_block` (0: none), BF16
// rounding of the input / output.
struct LinearCall {
  Tensor x;
  const Vec* w = nullptr;
  int64_t rows = 0, in = 0, out = 0;
  Tensor y;
  int64_t act_block = 0;
  bool bf16_out = false, bf16_in = false;
  LinearKey key;
  // x holds BF16 values (reference numerics: the final norm's output before the LM head): a
  // backend may then sum the exact products in another FP32 order (the CUDA backend's BF16 tensor
  // cores); the CPU backend keeps its order.
  bool x_bf16 = false;
};

// mHC mixes of `rows` streams [rows, hc, dim] (ops/mhc.h): pre/post [rows, hc], comb [rows, hc, hc].
struct HcMixCall {
  Tensor x;
  const Vec *fn = nullptr, *base = nullptr, *scale = nullptr;
  int64_t rows = 0, hc = 0, dim = 0, sinkhorn_iters = 0;
  float norm_eps = 0, hc_eps = 0;
  Tensor pre, post, comb;
};

// x [rows, dim] in place: rms_norm with weight w, the forward RoPE of each row's last rope_dim
// values at pos, then (quant_block > 0) the FP8 simulation of the first quant_prefix values in
// blocks of quant_block: the window KV rows' (and the DSpark rings') chain.
struct NormRopeQuantCall {
  Tensor x, pos;
  const Vec *w = nullptr, *inv_freq = nullptr;
  int64_t rows = 0, dim = 0, rope_dim = 0, quant_prefix = 0, quant_block = 0;
  float eps = 0;
  bool bf16 = false;  // the norm's and the RoPE's outputs rounded to BF16 (reference numerics)
};

// The arguments of Backend::moe_combine: out [T, D] = bf16?(Σ_k ybuf[pair t,k] + ys[t]).
struct MoeCombineCall {
  Tensor ybuf, ys, out, row_of;
  int64_t T = 0, K = 0, D = 0;
  bool bf16 = false;
};

// Which cache of a layer state an op appends to.
enum class Cache { kCkv, kIkeys };
// Which compressor of a layer feeds it.
enum class Compressor { kKv, kIndex };

// Rows just pooled by a compressor for every sequence of a chunk, at the end of their caches and
// not yet committed: segment s's rows follow segment s-1's, seg_n[s] of them, with the group
// index of each row.
struct PooledRows {
  Tensor rows;                  // [n, c]
  std::vector<int64_t> groups;  // [n]
  std::vector<int64_t> seg_n;   // [segments], summing to n
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory ----
  // A named buffer of at least rows·cols elements, valid until the next call with the same name
  // (names are reused layer after layer; contents are not kept).
  virtual Result<Tensor> scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols = 1) = 0;
  virtual Status upload(const Tensor& dst, const void* host, size_t bytes) = 0;
  virtual Status copy(const Tensor& dst, const Tensor& src, size_t bytes) = 0;
  // dst[r, 0:cols] = src[r, 0:cols] for `rows` rows of the given row strides (elements).
  virtual Status copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride,
                           int64_t rows, int64_t cols) = 0;
  virtual Status zero(const Tensor& t) = 0;
  // Waits for the queued work and copies `bytes` of `src` to host memory.
  virtual Status download_now(void* host, const Tensor& src, size_t bytes) = 0;
  // Whether the backend holds weight `w` (absent tensors: optional weights, other ranks' slices).
  virtual bool has(const Vec& w) const = 0;

  // ---- row-wise math ----
  virtual Status embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) = 0;
  virtual Status linear(const LinearCall& c) = 0;
  // a and b (the same input x, rows, in, activation block and roundings; other matrices and
  // outputs) as one launch where the backend keeps the two matrices stacked: true when done, false
  // when the caller must run linear(a) and linear(b) itself (the default: nothing run).
  virtual Result<bool> linear_pair(const LinearCall& a, const LinearCall& b) { return false; }
  // z[:, g·out:(g+1)·out] = bf16?(x[:, g·in:(g+1)·in]) · W[g·out:(g+1)·out]ᵀ for g < groups (wo_a).
  // With bf16, x holds BF16 values already (the flow passes the attention output, BF16 when bf16,
  // after its BF16-rounded inverse RoPE), so bf16(x) == x and a backend need not round x again.
  virtual Status grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in,
                                int64_t out, const Tensor& z, bool bf16) = 0;
  virtual Status rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                          bool bf16) = 0;
  // V4 per-head query norm in reference numerics (BF16 in and out, no weight).
  virtual Status rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) = 0;
  virtual Status rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec,
                      int64_t vec, int64_t rope_dim, bool inverse, bool bf16) = 0;
  virtual Status quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block,
                           QuantSim kind) = 0;
  virtual Status hadamard(const Tensor& x, int64_t rows, int64_t dim) = 0;
  // The three ops of NormRopeQuantCall in turn; a backend may run them as one (the same bits).
  virtual Status norm_rope_quant(const NormRopeQuantCall& c) {
    FS_RETURN_IF_ERROR(rms_norm(c.x, c.w, c.x, c.rows, c.dim, c.eps, c.bf16));
    FS_RETURN_IF_ERROR(rope(c.x, c.pos, *c.inv_freq, c.rows, 1, c.dim, c.rope_dim, false, c.bf16));
    if (c.quant_block > 0) return quant_sim(c.x, c.rows, c.dim, c.quant_prefix, c.quant_block, QuantSim::kFp8);
    return {};
  }
  // x = bf16?(x · s) over n elements.
  virtual Status scale(const Tensor& x, int64_t n, float s, bool bf16) = 0;
  // z[t] += ape[pos[t] mod ratio] (rows of `width`).
  virtual Status add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                         int64_t ratio) = 0;
  virtual Status hc_mixes(const HcMixCall& c) = 0;
  // V4 final mix weights (hc_head): pre [rows, hc].
  virtual Status hc_head_pre(const HcMixCall& c) = 0;
  virtual Status hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc,
                             int64_t dim, bool bf16) = 0;
  virtual Status hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                         int64_t hc, int64_t dim, bool bf16) = 0;
  // A sublayer's input: hc_collapse(X, pre, u), then rms_norm(u, w, y). `u` is scratch for the
  // collapsed rows; a backend may form y without it (the same bits; u's contents are then
  // unspecified). y may be u; neither may alias X.
  virtual Status hc_collapse_norm(const Tensor& X, const Tensor& pre, const Vec* w, const Tensor& u, const Tensor& y,
                                  int64_t rows, int64_t hc, int64_t dim, float eps, bool bf16) {
    FS_RETURN_IF_ERROR(hc_collapse(X, pre, u, rows, hc, dim, bf16));
    return rms_norm(u, w, y, rows, dim, eps, bf16);
  }
  // A sublayer's stream update, then the next sublayer's mixes of the updated streams: hc_post,
  // then hc_mixes(next) (next.x is X; next.post / next.comb are not `post` / `comb`). A backend may
  // run them as one (the same bits); the flow hands it the mixes only where fuses_post_mixes(rows).
  virtual Status hc_post_mixes(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                               int64_t hc, int64_t dim, bool bf16, const HcMixCall& next) {
    FS_RETURN_IF_ERROR(hc_post(f, X, post, comb, rows, hc, dim, bf16));
    return hc_mixes(next);
  }
  // moe_combine_post, then hc_mixes(next) of the updated streams (as hc_post_mixes).
  virtual Status moe_combine_post_mixes(const MoeCombineCall& c, const Tensor& X, const Tensor& post,
                                        const Tensor& comb, int64_t hc, bool bf16, const HcMixCall& next) {
    FS_RETURN_IF_ERROR(moe_combine_post(c, X, post, comb, hc, bf16));
    return hc_mixes(next);
  }
  virtual bool fuses_post_mixes(int64_t rows) const {
    (void)rows;
    return false;
  }
  // The FFN's combine, then the block's stream update from it: moe_combine(c), then
  // hc_post(c.out, X, post, comb, c.T, hc, c.D, bf16). A backend may run them as one (the same bits).
  virtual Status moe_combine_post(const MoeCombineCall& c, const Tensor& X, const Tensor& post, const Tensor& comb,
                                  int64_t hc, bool bf16) {
    FS_RETURN_IF_ERROR(moe_combine(c.ybuf, c.ys, c.out, c.T, c.K, c.D, c.bf16, c.row_of));
    return hc_post(c.out, X, post, comb, c.T, hc, c.D, bf16);
  }
  // Plain mean over the hc streams into y rows of stride y_stride (DSpark taps).
  virtual Status hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                         bool bf16) = 0;
  // h = bf16?(silu(min(g, L)) · clamp(u, ±L) · weight[r]) (weights empty: 1).
  virtual Status swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows,
                        int64_t inter, float limit, bool bf16) = 0;
  // A gated FFN's first half: h = swiglu(linear(gate), linear(up)) as swiglu above (no weights),
  // the two linears with their own roundings. gate.y and up.y are scratch a backend may leave
  // unwritten: one that forms both sums in one pass over the two matrices, in each linear's own
  // order, gives the same h.
  virtual Status gated_linear(const LinearCall& gate, const LinearCall& up, const Tensor& h, int64_t rows,
                              int64_t inter, float limit, bool bf16) {
    FS_RETURN_IF_ERROR(linear(gate));
    FS_RETURN_IF_ERROR(linear(up));
    return swiglu(gate.y, up.y, h, Tensor{}, rows, inter, limit, bf16);
  }

  // ---- MoE ----
  // Route every row from its gate logits [T, E] (bias or V4 hash ids of `tokens`): sel / wt [T, K].
  virtual Status route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E,
                       int64_t K, const Tensor& sel, const Tensor& wt) = 0;
  // Routed experts of F over the (row, slot) pairs: ybuf [T·K, D]; *row_of: ybuf's row of pair
  // t·K + k when it is not that (left empty otherwise).
  virtual Status routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                                int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) = 0;
  // out[t] = bf16?(Σ_k ybuf[pair t,k] + ys[t]) in slot order.
  virtual Status moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K,
                             int64_t D, bool bf16, const Tensor& row_of) = 0;

  // ---- Engram ----
  // e [n, de] ← rows `ids` of the layer's table.
  virtual Status engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) = 0;
  virtual Status engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D,
                             float eps, bool bf16) = 0;

  // ---- per-sequence state ----
  // Feeds every sequence's compressor rows (v / z [chunk.T, width], the chunk's rows) into its
  // state (rollback history included) and pools every group the chunk completes into new rows at
  // the end of the cache the compressor feeds (kKv → kCkv, kIndex → kIkeys), not yet committed.
  virtual Result<PooledRows> compressor_feed(FwdChunk& chunk, int layer, Compressor which, const Tensor& v,
                                             const Tensor& z, int64_t ratio, int64_t c, bool overlap) = 0;
  // seg_n[s] writable rows at the end of a cache of segment s's layer (all segments' rows back to
  // back), then their commit.
  virtual Result<Tensor> cache_reserve(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) = 0;
  virtual Status cache_commit(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) = 0;
  // Index scores of every sequence's queries iq [chunk.T, nI·dI] / weights [chunk.T, nI] over the
  // index keys of its layer's kv source, candidate masks (V4.1) and the top-k lists out
  // [chunk.T, k] / counts [chunk.T] (each segment's rows at its row0).
  virtual Status index_topk(int layer, FwdChunk& chunk, const Tensor& iq, const Tensor& wts, const Tensor& out,
                            const Tensor& out_n) = 0;
  // Sparse attention of every sequence's rows over [its window ‖ its selected compressed rows]
  // with sinks: q [T, H, Dh], the chunk's window rows kv [T, Dh] → o [T, H·Dh] (BF16 when bf16).
  virtual Status attention(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink,
                           const Tensor& o, int64_t H, bool bf16) = 0;
  // attention(), then the inverse RoPE of each head's last rope_dim values of o (heads of Dh) at
  // the chunk's positions, rounded to BF16 when bf16: the output as the output projection reads
  // it. A backend may apply the rotation inside the attention (the same bits).
  virtual Status attention_unrope(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink,
                                  const Tensor& o, int64_t H, int64_t Dh, bool bf16, const Vec& inv_freq,
                                  int64_t rope_dim) {
    FS_RETURN_IF_ERROR(attention(layer, chunk, q, kv, sink, o, H, bf16));
    return rope(o, chunk.pos, inv_freq, chunk.T, H, Dh, rope_dim, true, bf16);
  }
  // Window rows kv [T, Dh] into each sequence's ring of `layer` (after the layer's attention).
  // window_kv_rows: norm_rope_quant(c) on the chunk's window KV rows of `layer`, and where the
  // backend can, their ring write (ring_write's bytes) in the same work, before the layer's
  // attention: true then, and the caller issues no ring_write. A backend may do so only when no
  // slot it writes is one the attention reads (the attention takes the chunk's own rows from kv,
  // older ones from the ring: a ring of at least window + T − 1 slots).
  virtual Status ring_write(int layer, FwdChunk& chunk, const Tensor& kv) = 0;
  virtual Result<bool> window_kv_rows(int layer, FwdChunk& chunk, const NormRopeQuantCall& c) {
    FS_RETURN_IF_ERROR(norm_rope_quant(c));
    return false;
  }

  // ---- DSpark draft (v41 §5) ----
  // Whether this backend keeps the draft rings (and proposes).
  virtual bool draft_rings() const = 0;
  virtual Status draft_ring_write(int stage, FwdChunk& chunk, const Tensor& kv) = 0;
  // Stage attention of a proposal block (B rows after the committed tokens of seg): keys are the
  // stage ring's rows max(0, a−W+1) … a then every block row (no causal mask).
  virtual Status draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink,
                                 const Tensor& o, int64_t H, bool bf16) = 0;
  // Markov head: logits [V] (host) of the row of token `prev`, and its embedding row e [r] (host).
  virtual Status markov_logits(int32_t prev, std::span<float> logits) = 0;
  virtual Status markov_embed_row(int32_t prev, std::span<float> e) = 0;

  // ---- V4 MTP (v4 §3.8; backends that keep its state) ----
  virtual bool mtp_state() const { return false; }
  // After a backbone forward: the pairs this chunk completes update the sequence's MTP ring; X_seg
  // [T, hc, D] are the sequence's final streams.
  virtual Status mtp_advance(FwdSeg& seg, const Tensor& X_seg) { return {}; }
  // The MTP block's two backend-specific steps (Forward::mtp_block): X [rows, hc, dim] = bf16?(f
  // [rows, dim] broadcast over the streams + X), and the block's window attention of rows at the
  // consecutive positions pos (q [rows, H, Dh], their kv [rows, Dh]) over the sequence's MTP ring
  // into out [rows, H·Dh] (BF16-rounded when bf16).
  virtual Status stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) {
    return Status(StatusCode::kUnimplemented, "stream_add: this backend keeps no MTP state");
  }
  virtual Status mtp_attention(const SequenceState& st, const Tensor& q, const Tensor& kv,
                               const std::vector<int64_t>& pos, const Vec& sink, const Tensor& out, bool bf16) {
    return Status(StatusCode::kUnimplemented, "mtp_attention: this backend keeps no MTP state");
  }

  // ---- concurrency (hints; by default every op runs in call order) ----
  // A side branch on lane `lane` (< kBranchLanes): the ops issued between side_begin(lane) and
  // side_end(lane) depend on every op issued before side_begin(lane); those issued after
  // side_end(lane) form the main branch again, which does not wait for the side branch until
  // side_join(lane), so a backend may run the two at the same time. After side_join(lane) every op
  // depends on both. The flow keeps the branches disjoint: until the join neither writes what the
  // other reads or writes (Forward::branches). A lane holds one branch at a time; the main part of
  // a lane-1 branch may hold lane-0 branches (an mHC sublayer's mixes beside the sublayer, whose
  // own branches use lane 0), never the other way round, and no branch begins inside a side part.
  static constexpr int kBranchLanes = 2;
  virtual Status side_begin(int lane) { return {}; }
  virtual Status side_end(int lane) { return {}; }
  virtual Status side_join(int lane) { return {}; }

  // ---- multi-GPU (no-ops on one device) ----
  // This rank's attention heads, output groups and vocabulary rows.
  virtual int64_t heads() const = 0;
  virtual int64_t groups() const = 0;
  virtual int64_t vocab_rows() const = 0;
  virtual bool split() const { return false; }
  // The flow lays a step's sequences out in the order of their token counts (stable) instead of
  // the batch's; outputs (logits rows, samples) still follow the batch's order. Row-wise ops give
  // the same values either way; a backend that picks a kernel per sequence by its row count then
  // sees those rows as one run at the end of the step.
  virtual bool rows_by_length() const { return false; }
  virtual Status tp_allreduce(const Tensor& x, int64_t n, bool bf16) { return {}; }
  virtual Status tp_remap_experts(const Tensor& sel, const Tensor& wt, int64_t n) { return {}; }
  // The drafts' LM head (DSpark's U, the MTP block's logits): `c` over every vocabulary row
  // (c.out = vocab_size). A tensor-parallel rank holds only vocab_rows() of the head, so the rank
  // that runs the draft gathers the other ranks' slices; one device: a plain linear.
  virtual Status draft_head(const LinearCall& c) { return linear(c); }

  // ---- output ----
  // Appends rows [n] of logits to `logits` (possibly when the forward completes).
  virtual Status logits_out(const Tensor& lg, int64_t n, std::vector<float>& logits) = 0;
  // Draws the token after logits row rows[i] of lg by *specs[i] into *outs[i] for every i (when the
  // forward completes).
  virtual Status sample_rows(const Tensor& lg, std::span<const int64_t> rows, std::span<const ops::SampleSpec* const> specs,
                             std::span<int32_t* const> outs) = 0;
};

}  // namespace flashseek::forward
