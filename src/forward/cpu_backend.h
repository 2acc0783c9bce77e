// The CPU backend of the model flow (forward/backend.h): the oracle kernels of src/ops/cpu over
// host memory, the weights as FP32 copies (CpuModel's ModelWeights) and CpuSequenceState. One
// instance per forward / proposal call owns that call's scratch buffers, so concurrent calls on
// one CpuModel share nothing mutable.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "forward/backend.h"
#include "forward/cpu_model.h"
#include "forward/state.h"

namespace flashseek::forward {

class CpuOps final : public Backend {
 public:
  explicit CpuOps(const CpuModel& m);

  Result<Tensor> scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols = 1) override;
  Status upload(const Tensor& dst, const void* host, size_t bytes) override;
  Status copy(const Tensor& dst, const Tensor& src, size_t bytes) override;
  Status copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride, int64_t rows,
                   int64_t cols) override;
  Status zero(const Tensor& t) override;
  Status download_now(void* host, const Tensor& src, size_t bytes) override;
  bool has(const Vec& w) const override { return !w.empty(); }

  Status embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) override;
  Status linear(const LinearCall& c) override;
  Status grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in, int64_t out,
                        const Tensor& z, bool bf16) override;
  Status rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                  bool bf16) override;
  Status rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) override;
  Status rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec, int64_t vec,
              int64_t rope_dim, bool inverse, bool bf16) override;
  Status quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block, QuantSim kind) override;
  Status hadamard(const Tensor& x, int64_t rows, int64_t dim) override;
  Status scale(const Tensor& x, int64_t n, float s, bool bf16) override;
  Status add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                 int64_t ratio) override;
  Status hc_mixes(const HcMixCall& c) override;
  Status hc_head_pre(const HcMixCall& c) override;
  Status hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc, int64_t dim,
                     bool bf16) override;
  Status hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows, int64_t hc,
                 int64_t dim, bool bf16) override;
  Status hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                 bool bf16) override;
  Status swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows, int64_t inter,
                float limit, bool bf16) override;

  Status route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
               const Tensor& sel, const Tensor& wt) override;
  Status routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                        int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) override;
  Status moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K, int64_t D,
                     bool bf16, const Tensor& row_of) override;

  Status engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) override;
  Status engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D,
                     float eps, bool bf16) override;

  Result<PooledRows> compressor_feed(FwdChunk& chunk, int layer, Compressor which, const Tensor& v, const Tensor& z,
                                     int64_t ratio, int64_t c, bool overlap) override;
  Result<Tensor> cache_reserve(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override;
  Status cache_commit(FwdChunk& chunk, int layer, Cache which, std::span<const int64_t> seg_n) override;
  Status index_topk(int layer, FwdChunk& chunk, const Tensor& iq, const Tensor& wts, const Tensor& out,
                    const Tensor& out_n) override;
  Status attention(int layer, FwdChunk& chunk, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                   int64_t H, bool bf16) override;
  Status ring_write(int layer, FwdChunk& chunk, const Tensor& kv) override;

  bool draft_rings() const override { return true; }
  Status draft_ring_write(int stage, FwdChunk& chunk, const Tensor& kv) override;
  Status draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                         int64_t H, bool bf16) override;
  Status markov_logits(int32_t prev, std::span<float> logits) override;
  Status markov_embed_row(int32_t prev, std::span<float> e) override;

  bool mtp_state() const override { return true; }
  Status mtp_advance(FwdSeg& seg, const Tensor& X_seg) override;
  Status stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) override;
  Status mtp_attention(const SequenceState& st, const Tensor& q, const Tensor& kv, const std::vector<int64_t>& pos,
                       const Vec& sink, const Tensor& out, bool bf16) override;

  int64_t heads() const override;
  int64_t groups() const override;
  int64_t vocab_rows() const override;

  Status logits_out(const Tensor& lg, int64_t n, std::vector<float>& logits) override;
  Status sample_rows(const Tensor& lg, std::span<const int64_t> rows, std::span<const ops::SampleSpec* const> specs,
                     std::span<int32_t* const> outs) override;

 private:
  // ops::linear with the CPU load options' dot perturbation (CpuLoadOptions) on FP8-activation
  // linears: every output element of a linear with act_block > 0 is perturbed, keyed by `key`,
  // the input row and the output column.
  void linear_raw(const float* x, const Vec& w, int64_t rows, int64_t in, int64_t out, float* y, int64_t act_block,
                  bool bf16_out, bool bf16_in, const LinearKey& key) const;
  LayerState& layer_state(FwdSeg& seg, int layer) const;
  // One sequence's part of compressor_feed (its rows v / z [seg.T, width]): pooled rows are
  // appended to entries, their groups to groups.
  void feed_seg(FwdSeg& seg, int layer, Compressor which, const Tensor& v, const Tensor& z, int64_t ratio, int64_t c,
                bool overlap, std::vector<float>& entries, std::vector<int64_t>& groups);
  // One sequence's part of index_topk (its rows of iq, wts, out, out_n).
  void index_topk_seg(int layer, FwdSeg& seg, const Tensor& iq, const Tensor& wts, const Tensor& out,
                      const Tensor& out_n);

  const CpuModel& m_;
  const model::ModelConfig& c_;
  const ModelWeights& w_;
  std::map<std::string, std::vector<uint64_t>> scratch_;
  std::vector<float> pending_[2];  // rows reserved at the end of kCkv / kIkeys, not yet committed
};

}  // namespace flashseek::forward
