// The flow's concurrency hints (Backend::side_begin / side_end / side_join) checked without a GPU:
// a backend that wraps the CPU ops issues every op on the stream the CUDA backend would (the main
// stream, or lane 0's or lane 1's side stream, forks and joins as events), keeps a vector clock per
// stream and records the memory each op reads and writes (its tensors' byte ranges; the sequence
// states as one resource). Two ops that no fork / join orders must not touch the same bytes unless
// both only read them. A side part's scratch buffers are its lane's own, as in the CUDA backend
// (GpuModel::scratch). The logits must also equal the plain CPU model's, bit for bit.
#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "forward/cpu_backend.h"
#include "forward/cpu_model.h"
#include "forward/flow.h"
#include "parity_test_util.h"

namespace flashseek::forward {
namespace {

struct Range {
  uintptr_t lo = 0, hi = 0;  // [lo, hi)
  bool overlaps(const Range& o) const { return lo < o.hi && o.lo < hi; }
};

constexpr int kStreams = 1 + Backend::kBranchLanes;  // 0: main, 1 + l: lane l

// The order and memory model of a run of ops (independent of any backend: the checker's own
// test feeds it directly).
class HazardLog {
 public:
  struct Op {
    std::string name;
    int stream = 0;
    std::array<uint32_t, kStreams> clock{};
    std::vector<Range> reads, writes;
  };

  int stream() const { return cur_; }
  int forks() const { return forks_; }
  int lane_forks(int lane) const { return lane_forks_[size_t(lane)]; }
  const std::vector<std::string>& hazards() const { return hazards_; }
  bool idle() const { return cur_ == 0 && std::none_of(open_.begin(), open_.end(), [](bool o) { return o; }); }

  // The CUDA backend's rules (GpuModel::side_begin): a fork only from the main branch onto a lane
  // not open; otherwise the branch is issued in line.
  void begin(int lane) {
    const size_t l = size_t(lane);
    if (open_[l] || cur_ != 0) return;
    const bool was_idle = idle();
    clocks_[1 + l] = join_max(clocks_[1 + l], clocks_[0]);
    open_[l] = true;
    cur_ = 1 + lane;
    ++forks_, ++lane_forks_[l];
    if (was_idle) epoch_.clear();
  }
  void end(int lane) {
    if (cur_ == 1 + lane) cur_ = 0;
  }
  void join(int lane) {
    const size_t l = size_t(lane);
    if (cur_ == 1 + lane) cur_ = 0;
    if (!open_[l]) return;
    open_[l] = false;
    clocks_[0] = join_max(clocks_[0], clocks_[1 + l]);
    if (idle()) check_epoch();
  }
  // An op on the current stream.
  void op(const std::string& name, std::vector<Range> reads, std::vector<Range> writes) {
    const size_t s = size_t(cur_);
    ++clocks_[s][s];
    if (idle()) return;  // ordered after everything before it and before everything after it
    Op o;
    o.name = name, o.stream = cur_, o.clock = clocks_[s];
    o.reads = std::move(reads), o.writes = std::move(writes);
    epoch_.push_back(std::move(o));
  }

 private:
  static std::array<uint32_t, kStreams> join_max(std::array<uint32_t, kStreams> a,
                                                 const std::array<uint32_t, kStreams>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = std::max(a[i], b[i]);
    return a;
  }
  static bool any_overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
    for (const Range& x : a)
      for (const Range& y : b)
        if (x.overlaps(y)) return true;
    return false;
  }
  // Every pair of the epoch's ops that no fork / join orders (i before j in issue order: j cannot
  // happen before i).
  void check_epoch() {
    for (size_t i = 0; i < epoch_.size(); ++i)
      for (size_t j = i + 1; j < epoch_.size(); ++j) {
        const Op &a = epoch_[i], &b = epoch_[j];
        if (a.clock[size_t(a.stream)] <= b.clock[size_t(a.stream)]) continue;  // a happens before b
        if (any_overlap(a.writes, b.reads) || any_overlap(a.writes, b.writes) || any_overlap(a.reads, b.writes)) {
          std::ostringstream m;
          m << a.name << " (stream " << a.stream << ") and " << b.name << " (stream " << b.stream
            << ") touch the same bytes unordered";
          hazards_.push_back(m.str());
        }
      }
    epoch_.clear();
  }

  std::array<std::array<uint32_t, kStreams>, kStreams> clocks_{};
  std::array<bool, Backend::kBranchLanes> open_{};
  std::array<int, Backend::kBranchLanes> lane_forks_{};
  int cur_ = 0, forks_ = 0;
  std::vector<Op> epoch_;
  std::vector<std::string> hazards_;
};

Range rng(const Tensor& t) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data);
  return {p, p + t.bytes()};
}
Range rng(const Tensor& t, size_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data);
  return {p, p + bytes};
}
// The first `n` elements of t (an op's own extent of a larger buffer).
Range elems(const Tensor& t, int64_t n) { return rng(t, size_t(n) * elem_size(t.type)); }
// rows of `cols` elements at a row stride of `stride` elements.
Range strided(const Tensor& t, int64_t rows, int64_t stride, int64_t cols) {
  return rows <= 0 ? Range{} : elems(t, (rows - 1) * stride + cols);
}

// Every sequence's state (caches, rings, compressor and MTP state): one resource.
char g_state_token;
const Range kState{reinterpret_cast<uintptr_t>(&g_state_token), reinterpret_cast<uintptr_t>(&g_state_token) + 1};

// The CPU ops, issued as the CUDA backend would issue them (see the file comment).
class HazardOps final : public Backend {
 public:
  // early_ring_window >= 0 (the model's window): window_kv_rows writes the window rows to the ring
  // with their norm, before the attention, where the CUDA backend's row fusion does
  // (GpuModel::window_kv_rows: one sequence whose rows fit the ring's spare slots).
  HazardOps(CpuOps& in, HazardLog& log, int64_t early_ring_window = -1)
      : in_(in), log_(log), early_window_(early_ring_window) {}

  Result<bool> window_kv_rows(int layer, FwdChunk& chunk, const NormRopeQuantCall& c) override {
    FS_RETURN_IF_ERROR(norm_rope_quant(c));
    if (early_window_ < 0 || chunk.segs.size() != 1) return false;
    const auto* st = static_cast<const ModelState*>(chunk.segs.front().st);
    if (st->ring_size < early_window_ + chunk.T - 1) return false;
    FS_RETURN_IF_ERROR(ring_write(layer, chunk, c.x));
    ++early_rings_;
    return true;
  }
  int early_rings() const { return early_rings_; }

  Status side_begin(int lane) override { return log_.begin(lane), Status{}; }
  Status side_end(int lane) override { return log_.end(lane), Status{}; }
  Status side_join(int lane) override { return log_.join(lane), Status{}; }

  Result<Tensor> scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols) override {
    const int s = log_.stream();
    return in_.scratch(s == 0 ? name : name + (s == 1 ? "|side" : "|side1"), type, rows, cols);
  }
  Status upload(const Tensor& dst, const void* host, size_t bytes) override {
    log_.op("upload", {}, {rng(dst, bytes)});
    return in_.upload(dst, host, bytes);
  }
  Status copy(const Tensor& dst, const Tensor& src, size_t bytes) override {
    log_.op("copy", {rng(src, bytes)}, {rng(dst, bytes)});
    return in_.copy(dst, src, bytes);
  }
  Status copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride, int64_t rows,
                   int64_t cols) override {
    log_.op("copy_rows", {strided(src, rows, src_stride, cols)}, {strided(dst, rows, dst_stride, cols)});
    return in_.copy_rows(dst, dst_stride, src, src_stride, rows, cols);
  }
  Status zero(const Tensor& t) override {
    log_.op("zero", {}, {rng(t)});
    return in_.zero(t);
  }
  Status download_now(void* host, const Tensor& src, size_t bytes) override {
    log_.op("download_now", {rng(src, bytes)}, {});
    return in_.download_now(host, src, bytes);
  }
  bool has(const Vec& w) const override { return in_.has(w); }

  Status embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) override {
    log_.op("embed", {elems(tokens, T)}, {elems(X, T * hc * D)});
    return in_.embed(table, tokens, X, T, hc, D);
  }
  Status linear(const LinearCall& c) override {
    log_.op("linear", {elems(c.x, c.rows * c.in)}, {elems(c.y, c.rows * c.out)});
    return in_.linear(c);
  }
  Status grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in, int64_t out,
                        const Tensor& z, bool bf16) override {
    log_.op("grouped_linear", {elems(x, rows * groups * in)}, {elems(z, rows * groups * out)});
    return in_.grouped_linear(x, w, rows, groups, in, out, z, bf16);
  }
  Status rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                  bool bf16) override {
    log_.op("rms_norm", {elems(x, rows * dim)}, {elems(y, rows * dim)});
    return in_.rms_norm(x, w, y, rows, dim, eps, bf16);
  }
  Status rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) override {
    log_.op("rms_norm_bf16_heads", {elems(x, rows * dim)}, {elems(x, rows * dim)});
    return in_.rms_norm_bf16_heads(x, rows, dim, eps);
  }
  Status rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec, int64_t vec,
              int64_t rope_dim, bool inverse, bool bf16) override {
    log_.op("rope", {elems(x, rows * n_vec * vec), elems(pos, rows)}, {elems(x, rows * n_vec * vec)});
    return in_.rope(x, pos, inv_freq, rows, n_vec, vec, rope_dim, inverse, bf16);
  }
  Status quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block,
                   QuantSim kind) override {
    log_.op("quant_sim", {elems(x, rows * cols)}, {elems(x, rows * cols)});
    return in_.quant_sim(x, rows, cols, prefix, block, kind);
  }
  Status hadamard(const Tensor& x, int64_t rows, int64_t dim) override {
    log_.op("hadamard", {elems(x, rows * dim)}, {elems(x, rows * dim)});
    return in_.hadamard(x, rows, dim);
  }
  Status scale(const Tensor& x, int64_t n, float s, bool bf16) override {
    log_.op("scale", {elems(x, n)}, {elems(x, n)});
    return in_.scale(x, n, s, bf16);
  }
  Status add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                 int64_t ratio) override {
    log_.op("add_ape", {elems(z, rows * width), elems(pos, rows)}, {elems(z, rows * width)});
    return in_.add_ape(z, ape, pos, rows, width, ratio);
  }
  Status hc_mixes(const HcMixCall& c) override {
    std::vector<Range> w;
    for (const Tensor* t : {&c.pre, &c.post, &c.comb})
      if (!t->empty()) w.push_back(elems(*t, c.rows * (t == &c.comb ? c.hc * c.hc : c.hc)));
    log_.op("hc_mixes", {elems(c.x, c.rows * c.hc * c.dim)}, w);
    return in_.hc_mixes(c);
  }
  Status hc_head_pre(const HcMixCall& c) override {
    log_.op("hc_head_pre", {elems(c.x, c.rows * c.hc * c.dim)}, {elems(c.pre, c.rows * c.hc)});
    return in_.hc_head_pre(c);
  }
  Status hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc, int64_t dim,
                     bool bf16) override {
    log_.op("hc_collapse", {elems(X, rows * hc * dim), elems(pre, rows * hc)}, {elems(y, rows * dim)});
    return in_.hc_collapse(X, pre, y, rows, hc, dim, bf16);
  }
  Status hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows, int64_t hc,
                 int64_t dim, bool bf16) override {
    log_.op("hc_post",
            {elems(f, rows * dim), elems(X, rows * hc * dim), elems(post, rows * hc), elems(comb, rows * hc * hc)},
            {elems(X, rows * hc * dim)});
    return in_.hc_post(f, X, post, comb, rows, hc, dim, bf16);
  }
  Status hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                 bool bf16) override {
    log_.op("hc_mean", {elems(X, rows * hc * dim)}, {strided(y, rows, y_stride, dim)});
    return in_.hc_mean(X, y, y_stride, rows, hc, dim, bf16);
  }
  Status swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows, int64_t inter,
                float limit, bool bf16) override {
    std::vector<Range> r{elems(g, rows * inter), elems(u, rows * inter)};
    if (!weights.empty()) r.push_back(elems(weights, rows));
    log_.op("swiglu", r, {elems(h, rows * inter)});
    return in_.swiglu(g, u, h, weights, rows, inter, limit, bf16);
  }
  Status gated_linear(const LinearCall& gate, const LinearCall& up, const Tensor& h, int64_t rows, int64_t inter,
                      float limit, bool bf16) override {
    log_.op("gated_linear", {elems(gate.x, gate.rows * gate.in), elems(up.x, up.rows * up.in)},
            {elems(gate.y, gate.rows * gate.out), elems(up.y, up.rows * up.out), elems(h, rows * inter)});
    return in_.gated_linear(gate, up, h, rows, inter, limit, bf16);
  }
  Status route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
               const Tensor& sel, const Tensor& wt) override {
    log_.op("route", {elems(logits, T * E), elems(tokens, T)}, {elems(sel, T * K), elems(wt, T * K)});
    return in_.route(F, logits, tokens, T, E, K, sel, wt);
  }
  Status routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                        int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) override {
    const int64_t D = m.cols;
    log_.op("routed_experts", {elems(m, T * D), elems(sel, T * K), elems(wt, T * K)}, {elems(ybuf, T * K * D)});
    return in_.routed_experts(F, m, sel, wt, T, E, K, ybuf, row_of);
  }
  Status moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K, int64_t D,
                     bool bf16, const Tensor& row_of) override {
    std::vector<Range> r{elems(ybuf, T * K * D), elems(ys, T * D)};
    if (!row_of.empty()) r.push_back(elems(row_of, T * K));
    log_.op("moe_combine", r, {elems(out, T * D)});
    return in_.moe_combine(ybuf, ys, out, T, K, D, bf16, row_of);
  }
  Status engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) override {
    log_.op("engram_rows", {}, {rng(e)});
    return in_.engram_rows(E, ids, e);
  }
  Status engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D, float eps,
                     bool bf16) override {
    log_.op("engram_gate", {elems(X, rows * hc * D), elems(kv, rows * (hc + 1) * D)}, {elems(X, rows * hc * D)});
    return in_.engram_gate(X, kv, wqk, rows, hc, D, eps, bf16);
  }
  Result<PooledRows> compressor_feed(FwdChunk& chunk, int layer, Compressor which, const Tensor& v, const Tensor& z,
                                     int64_t ratio, int64_t c, bool overlap) override {
    log_.op("compressor_feed", {rng(v), rng(z), kState}, {kState});
    return in_.compressor_feed(chunk, layer, which, v, z, ratio, c, overlap);
  }
  Result<Tensor> cache_reserve(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override {
    log_.op("cache_reserve", {kState}, {kState});
    return in_.cache_reserve(chunk, layer, which, seg_n);
  }
  Status cache_commit(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override {
    log_.op("cache_commit", {kState}, {kState});
    return in_.cache_commit(chunk, layer, which, seg_n);
  }
  Status index_topk(int layer, FwdChunk& chunk, const Tensor& iq, const Tensor& wts, const Tensor& out,
                    const Tensor& out_n) override {
    log_.op("index_topk", {rng(iq), rng(wts), kState}, {rng(out), rng(out_n)});
    return in_.index_topk(layer, chunk, iq, wts, out, out_n);
  }
  Status attention(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                   int64_t H, bool bf16) override {
    log_.op("attention", {rng(q), rng(kv), kState}, {rng(o)});
    return in_.attention(layer, chunk, q, kv, sink, o, H, bf16);
  }
  Status ring_write(int layer, FwdChunk& chunk, const Tensor& kv) override {
    log_.op("ring_write", {rng(kv), kState}, {kState});
    return in_.ring_write(layer, chunk, kv);
  }
  bool draft_rings() const override { return in_.draft_rings(); }
  Status draft_ring_write(int stage, FwdChunk& chunk, const Tensor& kv) override {
    log_.op("draft_ring_write", {rng(kv), kState}, {kState});
    return in_.draft_ring_write(stage, chunk, kv);
  }
  Status draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                         int64_t H, bool bf16) override {
    log_.op("draft_attention", {rng(q), rng(kv), kState}, {rng(o)});
    return in_.draft_attention(stage, seg, q, kv, sink, o, H, bf16);
  }
  Status markov_logits(int32_t prev, std::span<float> logits) override { return in_.markov_logits(prev, logits); }
  Status markov_embed_row(int32_t prev, std::span<float> e) override { return in_.markov_embed_row(prev, e); }
  bool mtp_state() const override { return in_.mtp_state(); }
  Status mtp_advance(FwdSeg& seg, const Tensor& X_seg) override {
    log_.op("mtp_advance", {rng(X_seg), kState}, {kState});
    return in_.mtp_advance(seg, X_seg);
  }
  Status stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) override {
    log_.op("stream_add", {elems(f, rows * dim), elems(X, rows * hc * dim)}, {elems(X, rows * hc * dim)});
    return in_.stream_add(f, X, rows, hc, dim, bf16);
  }
  Status mtp_attention(const SequenceState& st, const Tensor& q, const Tensor& kv, const std::vector<int64_t>& pos,
                       const Vec& sink, const Tensor& out, bool bf16) override {
    log_.op("mtp_attention", {rng(q), rng(kv), kState}, {rng(out)});
    return in_.mtp_attention(st, q, kv, pos, sink, out, bf16);
  }
  int64_t heads() const override { return in_.heads(); }
  int64_t groups() const override { return in_.groups(); }
  int64_t vocab_rows() const override { return in_.vocab_rows(); }
  bool split() const override { return in_.split(); }
  bool rows_by_length() const override { return in_.rows_by_length(); }
  Status tp_allreduce(const Tensor& x, int64_t n, bool bf16) override {
    log_.op("tp_allreduce", {elems(x, n)}, {elems(x, n)});
    return in_.tp_allreduce(x, n, bf16);
  }
  Status tp_remap_experts(const Tensor& sel, const Tensor& wt, int64_t n) override {
    log_.op("tp_remap_experts", {elems(sel, n), elems(wt, n)}, {elems(sel, n), elems(wt, n)});
    return in_.tp_remap_experts(sel, wt, n);
  }
  Status draft_head(const LinearCall& c) override {
    log_.op("draft_head", {elems(c.x, c.rows * c.in)}, {elems(c.y, c.rows * c.out)});
    return in_.draft_head(c);
  }
  Status logits_out(const Tensor& lg, int64_t n, std::vector<float>& logits) override {
    log_.op("logits_out", {elems(lg, n)}, {});
    return in_.logits_out(lg, n, logits);
  }
  Status sample_rows(const Tensor& lg, std::span<const int64_t> rows, std::span<const ops::SampleSpec* const> specs,
                     std::span<int32_t* const> outs) override {
    log_.op("sample_rows", {rng(lg)}, {});
    return in_.sample_rows(lg, rows, specs, outs);
  }

 private:
  CpuOps& in_;
  HazardLog& log_;
  int64_t early_window_ = -1;
  int early_rings_ = 0;
};

// The checker itself: an unordered write / read pair is found, ordered or read-only pairs are not.
TEST(BranchHazardLog, FindsUnorderedWritesOnly) {
  float buf[64] = {};
  const Tensor a{buf, ElemType::kF32, 16, 1}, b{buf + 16, ElemType::kF32, 16, 1};
  {  // side writes a, main reads a before the join: a hazard
    HazardLog log;
    log.begin(0);
    log.op("side writes a", {}, {rng(a)});
    log.end(0);
    log.op("main reads a", {rng(a)}, {});
    log.join(0);
    ASSERT_EQ(log.hazards().size(), 1u);
    EXPECT_NE(log.hazards()[0].find("side writes a"), std::string::npos);
  }
  {  // the same after the join, and both branches only reading a: none
    HazardLog log;
    log.begin(0);
    log.op("side writes a", {}, {rng(a)});
    log.op("side reads b", {rng(b)}, {});
    log.end(0);
    log.op("main reads b", {rng(b)}, {});
    log.join(0);
    log.op("main reads a", {rng(a)}, {});
    EXPECT_TRUE(log.hazards().empty());
    EXPECT_TRUE(log.idle());
  }
  {  // lane 1's side part against a lane-0 branch inside lane 1's main part, and its side part
    HazardLog log;
    log.begin(1);
    log.op("lane 1 writes a", {}, {rng(a)});
    log.end(1);
    log.begin(0);
    log.op("lane 0 reads b", {rng(b)}, {});
    log.end(0);
    log.op("main writes b", {}, {rng(b)});
    log.join(0);
    log.op("main reads a", {rng(a)}, {});
    log.join(1);
    EXPECT_EQ(log.hazards().size(), 2u);  // lane 0 vs main on b; lane 1 vs main on a
    EXPECT_EQ(log.lane_forks(0), 1);
    EXPECT_EQ(log.lane_forks(1), 1);
  }
  {  // a begin inside a side part runs in line (no fork): ordered
    HazardLog log;
    log.begin(1);
    log.begin(0);
    log.op("in line", {}, {rng(a)});
    log.end(0);
    log.join(0);
    log.op("lane 1 reads a", {rng(a)}, {});
    log.end(1);
    log.join(1);
    EXPECT_TRUE(log.hazards().empty());
    EXPECT_EQ(log.forks(), 1);
  }
}

struct Param {
  const char* config;
  Numerics numerics;
};
// ctest listings show the checkpoint and numerics, not the struct's bytes.
void PrintTo(const Param& p, std::ostream* os) {
  *os << p.config << (p.numerics == Numerics::kReference ? " reference" : " exact");
}

class BranchHazard : public ::testing::TestWithParam<Param> {};

// Prefill chunks (one after context), then decode steps of two sequences together, of one with
// a 3-token block and of one alone: no unordered conflict, the lanes used where the flow marks them, the plain model's
// bits; the same with the window rows' ring write moved before the attention where the CUDA
// backend's row fusion moves it.
TEST_P(BranchHazard, BranchesTouchDisjointMemory) {
  const Param p = GetParam();
  auto loaded = CpuModel::load(parity_test::checkpoint({p.config}), p.numerics);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  CpuModel& m = *loaded.value();
  const auto& c = m.config();
  Rng r(5);
  std::vector<int32_t> prompt(37), other(23), more(20);
  for (auto& t : prompt) t = int32_t(r.below(uint64_t(c.vocab_size)));
  for (auto& t : other) t = int32_t(r.below(uint64_t(c.vocab_size)));
  for (auto& t : more) t = int32_t(r.below(uint64_t(c.vocab_size)));
  const std::vector<int32_t> step_a{int32_t(r.below(uint64_t(c.vocab_size)))},
      step_b{int32_t(r.below(uint64_t(c.vocab_size)))}, block{3, 9, 27};

  HazardLog log;
  bool early_ring = false;  // the second hazard run: the window rows' ring write with their norm
  int early_rings = 0;
  auto hazard_forward = [&](std::span<BatchItem> batch, std::vector<float>& logits) -> Status {
    CpuOps ops(m);
    HazardOps h(ops, log, early_ring ? c.window : -1);
    Forward f(m.flow_params(), h);
    const Status s = f.forward(batch, logits);
    EXPECT_TRUE(log.idle()) << "a lane was left open";
    early_rings += h.early_rings();
    return s;
  };
  auto plain_forward = [&](std::span<BatchItem> batch, std::vector<float>& logits) {
    return m.forward(batch, logits);
  };
  // V4.1: then a DSpark proposal (its stages are mHC blocks too), greedy.
  auto hazard_propose = [&](SequenceState& st) -> Result<DraftBlock> {
    CpuOps ops(m);
    HazardOps h(ops, log);
    Forward f(m.flow_params(), h);
    auto d = f.propose(dynamic_cast<ModelState&>(st), step_a[0], nullptr);
    EXPECT_TRUE(log.idle()) << "a lane was left open";
    return d;
  };
  auto plain_propose = [&](SequenceState& st) { return m.propose(st, step_a[0], nullptr); };
  auto run = [&](auto&& fwd, auto&& propose) {
    std::vector<float> logits;
    auto a = m.new_sequence(), b = m.new_sequence();
    BatchItem pa{a.get(), prompt, false}, pb{b.get(), other, false}, pc{b.get(), more, false};
    EXPECT_TRUE(fwd(std::span<BatchItem>(&pa, 1), logits).ok());
    EXPECT_TRUE(fwd(std::span<BatchItem>(&pb, 1), logits).ok());
    EXPECT_TRUE(fwd(std::span<BatchItem>(&pc, 1), logits).ok());  // a chunk after context: too long for early
    BatchItem two[2] = {{a.get(), step_a, false}, {b.get(), step_b, false}};
    EXPECT_TRUE(fwd(std::span<BatchItem>(two, 2), logits).ok());
    BatchItem blk{a.get(), block, true};
    EXPECT_TRUE(fwd(std::span<BatchItem>(&blk, 1), logits).ok());
    BatchItem one{b.get(), step_a, false};
    EXPECT_TRUE(fwd(std::span<BatchItem>(&one, 1), logits).ok());
    if (c.is_v41()) {
      auto d = propose(*a);
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      if (d.ok()) logits.insert(logits.end(), d.value().logits.begin(), d.value().logits.end());
    }
    return logits;
  };
  const std::vector<float> with = run(hazard_forward, hazard_propose), plain = run(plain_forward, plain_propose);
  for (const std::string& h : log.hazards()) ADD_FAILURE() << h;
  EXPECT_EQ(log.hazards().size(), 0u);
  ASSERT_EQ(with.size(), plain.size());
  EXPECT_EQ(std::memcmp(with.data(), plain.data(), with.size() * 4), 0) << "the lanes' scratch changed the logits";
  // Each forward: lane-0 branches in every attention (the query beside the window KV, the ring
  // write beside the output projection) and MoE (routed beside shared), and V4.1 a lane-1 branch
  // per sublayer (the mixes beside it), also in each proposal stage.
  const int forwards = 6, L = int(c.num_layers);
  EXPECT_GE(log.lane_forks(0), forwards * 3 * L);
  if (c.is_v41())
    EXPECT_EQ(log.lane_forks(1), forwards * 2 * L + 2 * int(c.num_mtp_layers));
  else
    EXPECT_EQ(log.lane_forks(1), 0);

  // Again with the window rows written to the ring before the attention where a backend may
  // (one sequence of at most ring_size - window + 1 rows: the 3-token block and the one-token
  // step): no conflict (the query beside them reads no state), the plain model's bits.
  HazardLog early_log;
  std::swap(log, early_log);
  early_ring = true;
  const std::vector<float> early = run(hazard_forward, hazard_propose);
  for (const std::string& h : log.hazards()) ADD_FAILURE() << "early ring write: " << h;
  EXPECT_EQ(early_rings, 2 * L);
  ASSERT_EQ(early.size(), plain.size());
  EXPECT_EQ(std::memcmp(early.data(), plain.data(), early.size() * 4), 0) << "the early ring writes changed the logits";
}

INSTANTIATE_TEST_SUITE_P(Tiny, BranchHazard,
                         ::testing::Values(Param{"tiny-v41", Numerics::kReference}, Param{"tiny-v41", Numerics::kExact},
                                           Param{"tiny-v4", Numerics::kReference}),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           std::string n = std::string(i.param.config) +
                                           (i.param.numerics == Numerics::kReference ? "_reference" : "_exact");
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace flashseek::forward
