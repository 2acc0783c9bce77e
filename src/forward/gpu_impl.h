// Internals of the CUDA model backend (gpu_model.cpp, gpu_attention.cpp, gpu_moe.cpp): device
// arrays, the per-sequence GPU state and the GpuModel class. Only compiled with CUDA.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "forward/gpu_model.h"
#include "forward/gpu_tp.h"
#include "forward/state.h"
#include "forward/weights.h"
#include "model/checkpoint.h"
#include "ops/cuda/cuda_check.h"

namespace flashseek::ops::cuda {
class Communicator;
}

namespace flashseek::forward::gpu {

// Owning device array that grows (never shrinks); `keep` preserves the old contents.
template <typename T>
class DevArray {
 public:
  DevArray() = default;
  DevArray(DevArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), cap_(std::exchange(o.cap_, 0)) {}
  DevArray& operator=(DevArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(cap_, o.cap_);
    return *this;
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  ~DevArray() {
    if (p_) cudaFree(p_);
  }
  Status reserve(size_t n, bool keep) {
    if (n <= cap_) return {};
    const size_t nc = keep ? std::max(n, cap_ * 2) : n;
    T* np = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&np), nc * sizeof(T)));
    if (keep && p_) FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(np, p_, cap_ * sizeof(T), cudaMemcpyDeviceToDevice));
    if (p_) cudaFree(p_);
    p_ = np;
    cap_ = nc;
    return {};
  }
  Status upload(const T* h, size_t n) {
    FS_RETURN_IF_ERROR(reserve(n, false));
    if (n) FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(p_, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return {};
  }
  Status zeros(size_t n) {
    FS_RETURN_IF_ERROR(reserve(n, false));
    if (n) FS_CUDA_RETURN_IF_ERROR(cudaMemset(p_, 0, n * sizeof(T)));
    return {};
  }
  Status copy_from(const DevArray& o) {
    FS_RETURN_IF_ERROR(reserve(o.cap_, false));
    if (o.cap_) FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(p_, o.p_, o.cap_ * sizeof(T), cudaMemcpyDeviceToDevice));
    return {};
  }
  T* get() const { return p_; }
  size_t capacity() const { return cap_; }

 private:
  T* p_ = nullptr;
  size_t cap_ = 0;
};

// A compressor's open group on the device: pending rows [ratio, width] and (V4 ratio 4) the
// previous complete window; the counts live on the host (they follow from the positions).
struct GpuCompState {
  DevArray<float> v, z, prev_v, prev_z;
  int64_t n_pend = 0;
  bool has_prev = false;
  // Projections of recent positions for rollback (CompressorState::hist_* on the CPU): a ring of
  // 2·ratio + kMaxRollback rows, row of position p at slot p % rows; positions >= hist_lo valid.
  DevArray<float> hist_v, hist_z;
  int64_t hist_lo = 0;
};

struct GpuLayerState {
  DevArray<float> ring;     // [ring_size, Dh]
  DevArray<float> ckv;      // [n_ckv, Dh] (grows)
  DevArray<float> ikeys;    // [n_ikeys, dI] (grows)
  int64_t n_ckv = 0, n_ikeys = 0;
  GpuCompState comp, icomp;
};

class GpuSequenceState final : public SequenceState {
 public:
  int64_t length() const override { return len; }
  std::unique_ptr<SequenceState> clone() const override;

  int64_t len = 0, ring_size = 0;
  std::vector<GpuLayerState> layers;
  std::vector<int64_t> engram_hist;           // last N−1+kMaxRollback compressed ids
  std::vector<DevArray<float>> draft_rings;   // [stage] DSpark KV [ring_size, Dh] (gpu_draft.cpp)
  Status error;  // an allocation failure in new_sequence/clone, reported by the next forward
};

// Per-chunk data shared by the layers of one forward (cpu_model.h ChunkCtx on the device).
struct GpuChunk {
  GpuSequenceState* st = nullptr;
  std::span<const int32_t> tokens;
  int64_t start = 0, T = 0;
  std::vector<int64_t> pos;        // [T] host copy
  const int32_t* d_tokens = nullptr;
  const int64_t* d_pos = nullptr;
  std::vector<int32_t*> topk, topk_n;  // [layer] device lists published by index sources
  uint8_t* cand = nullptr;         // [T, start + T] candidate masks
  std::vector<int64_t> engram_ids; // [n_engram_layers, T, n_cols] (host)
};

class GpuModel final : public Model {
 public:
  // With `shard` (gpu_tp.h): one rank of a multi-GPU model, holding only its slice of the weights;
  // its partial sums go through `comm` (all ranks call forward together).
  static Result<std::unique_ptr<GpuModel>> load(const std::string& dir, Numerics numerics, int device,
                                                const TpShard* shard = nullptr,
                                                ops::cuda::Communicator* comm = nullptr);
  const model::ModelConfig& config() const override { return ck_->config(); }
  std::unique_ptr<SequenceState> new_sequence() const override;
  Status forward(std::span<BatchItem> batch, std::vector<float>& logits) override;
  // Speculative decoding (gpu_rollback.cpp, gpu_draft.cpp): same contracts as CpuModel.
  Status rollback(SequenceState& state, int64_t new_length) const override;
  // One GPU only: a tensor-parallel rank holds a vocabulary slice of the LM head (gpu_tp.h).
  bool has_draft() const override { return w_.has_dspark && !shard_.split(); }
  Result<DraftBlock> propose(const SequenceState& state, int32_t x0, const DraftChooser& choose = {}) const override;

 private:
  GpuModel() = default;
  bool ref() const { return numerics_ == Numerics::kReference; }
  Status upload_weights();
  Status up(Vec& v);
  // Device copy of a host weight (nullptr when the checkpoint has none).
  const float* d(const Vec& v) const;
  template <typename T>
  Result<T*> scratch(const std::string& name, int64_t n);
  // y [rows, out] = q(x) · Wᵀ with the CPU backend's linear options.
  Status linear(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
                int64_t act_block, bool bf16_out, bool bf16_in = false, const int32_t* sel = nullptr,
                int64_t x_row_div = 1);

  Status forward_one(GpuSequenceState& st, std::span<const int32_t> tokens, bool all_logits,
                     std::vector<float>& logits);
  Status block(int layer, GpuChunk& ctx, float* X, float* pre_in);
  Status engram(int layer, GpuChunk& ctx, float* X);
  Status attention(int layer, GpuChunk& ctx, const float* a, float* out);
  Status compress(int layer, GpuChunk& ctx, const float* a);
  Status pool(GpuCompState& cs, const float* v, const float* z, const std::vector<int64_t>& pos,
              int64_t ratio, int64_t c, bool overlap, DevArray<float>& dst, int64_t n_dst,
              std::vector<int64_t>& groups, const std::string& tag);
  Status index_select(int layer, GpuChunk& ctx, const float* a, const float* qlat);
  Status moe(int layer, GpuChunk& ctx, const float* m, float* out);
  // Multi-GPU (gpu_tp.cpp): x[0, n) ← Σ over ranks, then BF16 rounding when `bf16`; no-op on one
  // GPU. Expert-parallel routing: slots of other ranks' experts get weight 0.
  Status tp_allreduce(float* x, int64_t n, bool bf16);
  Status tp_remap_experts(int32_t* sel, float* weight, int64_t n);
  // Rollback history of a compressor: rows v/z [T, width] of the chunk's positions.
  Status record_history(GpuCompState& cs, const float* v, const float* z, const GpuChunk& ctx, int64_t width,
                        int64_t ratio);
  // DSpark (gpu_draft.cpp): weights, taps [n_taps, T, D] of the target forward, draft rings.
  Status upload_draft_weights();
  Status append_tap(int layer, GpuChunk& ctx, const float* X, float* taps);
  Status write_draft_rings(GpuChunk& ctx, const float* taps);
  Result<DraftBlock> propose_impl(const GpuSequenceState& st, int32_t x0, const DraftChooser& choose);
  Status draft_block(int stage, GpuChunk& ctx, float* X, float* pre_in);
  Status draft_attention(int stage, GpuChunk& ctx, const float* a, float* out);
  Status draft_moe(int stage, GpuChunk& ctx, const float* m, float* out);

  std::unique_ptr<model::Checkpoint> ck_;
  ModelWeights w_;  // host shells: matrices are freed after upload (dev_ keeps them)
  std::unordered_map<const Vec*, DevArray<float>> dev_;
  std::vector<DevArray<float>> w1_, w2_, w3_;  // [layer] stacked experts [E, out, in]
  std::vector<DevArray<int32_t>> tid2eid_;     // [layer] V4 hash routing tables
  std::vector<DevArray<float>> dw1_, dw2_, dw3_;  // [stage] DSpark stacked experts
  std::vector<DevArray<int32_t>> dtid2eid_;       // [stage] hash routing (if any)
  std::unordered_map<std::string, DevArray<char>> scratch_;
  Numerics numerics_ = Numerics::kExact;
  TpShard shard_;  // this rank's heads / groups / experts / vocabulary (everything on one GPU)
  ops::cuda::Communicator* comm_ = nullptr;
  int device_ = 0;
  int64_t act_block_ = 0, expert_act_block_ = 0;
};

}  // namespace flashseek::forward::gpu
