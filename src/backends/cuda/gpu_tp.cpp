// Tensor/expert-parallel model over several GPUs (gpu_tp.h): shard math, weight slicing, and the
// TpModel that runs one GpuModel rank per host thread and joins their vocabulary slices.
#include "backends/cuda/gpu_tp.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <thread>

#include "backends/cuda/gpu_model.h"
#include "backends/cuda/stored_slice.h"
#include "forward/state.h"

namespace flashseek::forward {

Result<TpShard> make_tp_shard(const model::ModelConfig& c, Numerics numerics, int rank, int world) {
  if (world < 1) return invalid_argument("tensor parallel: world size {} < 1", world);
  if (rank < 0 || rank >= world) return invalid_argument("tensor parallel: rank {} outside [0, {})", rank, world);
  const int64_t H = c.num_heads, G = c.o_groups, E = c.n_routed_experts, V = c.vocab_size;
  if (H % world != 0) return invalid_argument("tensor parallel over {} GPUs: num_heads {} is not divisible by {}", world, H, world);
  if (G % world != 0) return invalid_argument("tensor parallel over {} GPUs: o_groups {} is not divisible by {}", world, G, world);
  if (E % world != 0)
    return invalid_argument("expert parallel over {} GPUs: n_routed_experts {} is not divisible by {}", world, E, world);
  if (V < world) return invalid_argument("tensor parallel over {} GPUs: vocab_size {} is smaller than that", world, V);
  // Reference numerics quantise wo_b's input [G·Ro] in FP8 blocks (as GpuModel::load): a rank's
  // columns must start on a block boundary or its blocks would differ from the unsplit ones.
  const int64_t blk = c.is_v41() ? 32 : 128;
  const int64_t act_block = numerics == Numerics::kReference && c.fp8_weights ? blk : 0;
  const int64_t cols = G / world * c.o_lora_rank;
  if (world > 1 && act_block > 0 && cols % act_block != 0)
    return invalid_argument("tensor parallel over {} GPUs: {} wo_b input columns per rank are not a multiple of the "
                            "FP8 activation block {}", world, cols, act_block);
  TpShard s;
  s.rank = rank, s.world = world;
  s.heads = H / world, s.head0 = rank * s.heads;
  s.groups = G / world, s.group0 = rank * s.groups;
  s.experts = E / world, s.expert0 = rank * s.experts;
  const int64_t base = V / world, rem = V % world;
  s.vocab = base + (rank < rem ? 1 : 0);
  s.vocab0 = rank * base + std::min<int64_t>(rank, rem);
  s.shared_expert = rank == 0;
  return s;
}

Status shard_weights(ModelWeights& w, const model::ModelConfig& c, const TpShard& s) {
  const int64_t H = c.num_heads, Dh = c.head_dim, Rq = c.q_lora_rank, G = c.o_groups, Ro = c.o_lora_rank;
  const int64_t D = c.hidden_size, V = c.vocab_size, E = c.n_routed_experts;
  const int64_t in_g = H * Dh / G;
  // The draft (DSpark stages, V4 MTP block) is not split: rank 0 runs it whole (GpuModel::
  // has_draft), the other ranks drop its weights (has_dspark / has_mtp still say what the
  // checkpoint carries).
  if (s.rank != 0) w.dspark = DSparkWeights{}, w.mtp = MtpWeights{};
  for (auto& L : w.layers) {
    AttentionWeights& A = L.attn;
    constexpr SliceAxis kRows = SliceAxis::kRows, kCols = SliceAxis::kCols;
    FS_RETURN_IF_ERROR(slice_f32(A.wq_b, H * Dh, Rq, kRows, s.head0 * Dh, s.heads * Dh, "wq_b"));
    FS_RETURN_IF_ERROR(slice_f32(A.attn_sink, H, 1, kRows, s.head0, s.heads, "attn_sink"));
    FS_RETURN_IF_ERROR(slice_f32(A.wo_a, G * Ro, in_g, kRows, s.group0 * Ro, s.groups * Ro, "wo_a"));
    FS_RETURN_IF_ERROR(slice_f32(A.wo_b, D, G * Ro, kCols, s.group0 * Ro, s.groups * Ro, "wo_b"));
    FfnWeights& F = L.ffn;
    if (!F.w1.empty()) {
      if (int64_t(F.w1.size()) != E || F.w2.size() != F.w1.size() || F.w3.size() != F.w1.size())
        return internal_error("tensor parallel: {} routed experts in the weights, config says {}", F.w1.size(), E);
      for (auto* ws : {&F.w1, &F.w2, &F.w3}) {
        std::vector<Vec> keep(std::make_move_iterator(ws->begin() + s.expert0),
                              std::make_move_iterator(ws->begin() + s.expert0 + s.experts));
        ws->swap(keep);
      }
    }
    if (!s.shared_expert) Vec().swap(F.s_w1), Vec().swap(F.s_w2), Vec().swap(F.s_w3);
  }
  return slice_f32(w.head, V, D, SliceAxis::kRows, s.vocab0, s.vocab, "head");
}

TpSlice tp_slice_for(const std::string& name, const model::ModelConfig& c, const TpShard& s) {
  TpSlice out;
  if (!s.split()) return out;
  auto rows = [&](int64_t start, int64_t count) { return TpSlice{TpSlice::kRows, start, count}; };
  if (name == "head.weight") return rows(s.vocab0, s.vocab);
  // The draft (DSpark stages, V4 MTP block) is never split: rank 0 runs it whole (GpuModel::
  // has_draft), the other ranks hold none of it.
  if (name.rfind("mtp.", 0) == 0) return s.rank == 0 ? out : TpSlice{TpSlice::kNone, 0, 0};
  if (name.rfind("layers.", 0) != 0) return out;  // globals
  const size_t dot = name.find('.', 7);           // "layers.N." then the role
  if (dot == std::string::npos) return out;
  const std::string rest = name.substr(dot + 1);
  if (rest == "attn.wq_b.weight") return rows(s.head0 * c.head_dim, s.heads * c.head_dim);
  if (rest == "attn.wo_a.weight") return rows(s.group0 * c.o_lora_rank, s.groups * c.o_lora_rank);
  if (rest == "attn.wo_b.weight") return TpSlice{TpSlice::kCols, s.group0 * c.o_lora_rank, s.groups * c.o_lora_rank};
  if (rest.rfind("ffn.shared_experts.", 0) == 0) return s.shared_expert ? out : TpSlice{TpSlice::kNone, 0, 0};
  if (rest.rfind("ffn.experts.", 0) == 0) {  // ffn.experts.E.wK.weight
    int64_t e = -1;
    const char* p = rest.data() + 12;
    const auto [end, ec] = std::from_chars(p, rest.data() + rest.size(), e);
    if (ec == std::errc() && end != p && *end == '.' && (e < s.expert0 || e >= s.expert0 + s.experts))
      return TpSlice{TpSlice::kNone, 0, 0};
  }
  return out;
}

Status for_each_rank(std::string_view what, const std::vector<int>& devices, const std::function<Status(size_t)>& fn,
                     const std::function<void(size_t)>& on_fail) {
  const size_t W = devices.size();
  std::vector<Status> status(W);
  auto fail = [&](size_t r, Status st) {
    status[r] = std::move(st);
    if (!on_fail) return;
    try {
      on_fail(r);
    } catch (...) {  // the rank's own error is the one reported
    }
  };
  auto run = [&](size_t r) {
    Status st;
    try {
      st = fn(r);
    } catch (const std::exception& e) {
      st = internal_error("exception: {}", e.what());
    } catch (...) {
      st = internal_error("unknown exception");
    }
    if (!st.ok()) fail(r, std::move(st));
  };
  {
    std::vector<std::jthread> threads;  // joined when this block ends, however it ends
    for (size_t r = 1; r < W; ++r) {
      try {
        threads.emplace_back(run, r);
      } catch (const std::exception& e) {  // rank r never runs; on_fail wakes the ranks waiting for it
        fail(r, internal_error("could not start a host thread: {}", e.what()));
      }
    }
    if (W > 0) run(0);
  }
  size_t first = W;
  for (size_t r = 0; r < W; ++r)
    if (!status[r].ok() && (first == W || (status[first].code() == StatusCode::kCancelled &&
                                           status[r].code() != StatusCode::kCancelled)))
      first = r;
  if (first == W) return {};
  return status[first].with_context(fmt::format("{}: rank {} of {} (device {})", what, first, W, devices[first]));
}

std::string cuda_backend_kind(bool block_scaled, int world, std::string_view comm) {
  std::string kind = block_scaled ? "cuda-native" : "cuda";
  if (world > 1) kind += fmt::format("-tp{}", world);
  if (world > 1 && comm == "host") kind += "-host";
  return kind;
}

Result<std::vector<int>> parse_gpu_list(const std::string& gpus) {
  std::vector<int> out;
  size_t i = 0;
  while (true) {
    const size_t j = std::min(gpus.find(',', i), gpus.size());
    int d = -1;
    const auto [end, ec] = std::from_chars(gpus.data() + i, gpus.data() + j, d);
    if (i == j || ec != std::errc() || end != gpus.data() + j || d < 0)
      return invalid_argument("--gpus {}: expected device numbers separated by commas, such as 0,1", gpus);
    out.push_back(d);
    if (j == gpus.size()) break;
    i = j + 1;
  }
  return out;
}

}  // namespace flashseek::forward

#if FLASHSEEK_HAVE_CUDA
#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/runtime/comm.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::forward {
namespace gpu {

Status GpuModel::tp_allreduce(float* x, int64_t n, bool bf16) {
  if (!comm_ || !shard_.split()) return {};
  FS_RETURN_IF_ERROR(comm_->allreduce_sum(x, n, stream_));
  if (bf16) FS_CUDA_RETURN_IF_ERROR(ops::cuda::detail::launch_quant_sim(x, 1, n, n, 1, ops::cuda::detail::QuantSim::kBf16, stream_));
  return {};
}

Status GpuModel::draft_head(const LinearCall& c) {
  if (!shard_.split()) return linear(c);
  const auto& cfg = config();
  if (c.in != cfg.hidden_size || c.out != cfg.vocab_size || c.rows < 1)
    return internal_error("draft head: [{}, {}] x {} rows, expected the full vocabulary {} over {}", c.out, c.in,
                          c.rows, cfg.vocab_size, cfg.hidden_size);
  if (!tp_head_) return internal_error("draft head: rank {} of {} has no vocabulary gather", shard_.rank, shard_.world);
  std::vector<float> y(size_t(c.rows * c.in)), out(size_t(c.rows * c.out));
  FS_RETURN_IF_ERROR(download_now(y.data(), c.x, y.size() * 4));
  FS_RETURN_IF_ERROR(tp_head_(y, c.rows, out));
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // the gather ran other ranks' work on their devices
  return upload(c.y.data, out.data(), out.size() * 4);  // staged; the draft's next download waits for it
}

Status GpuModel::head_slice(std::span<const float> y, int64_t rows, std::span<float> out) {
  const int64_t D = config().hidden_size, Vr = shard_.vocab;
  if (rows < 1 || int64_t(y.size()) != rows * D || int64_t(out.size()) != rows * Vr)
    return internal_error("head slice: {} input and {} output floats for {} rows of [{}, {}]", y.size(), out.size(),
                          rows, Vr, D);
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  FS_ASSIGN_OR_RETURN(Tensor yd, scratch("tp_head_y", ElemType::kF32, rows, D));
  FS_ASSIGN_OR_RETURN(Tensor lg, scratch("tp_head_lg", ElemType::kF32, rows, Vr));
  // A pageable source: the call returns once `y` is copied out (never under capture here).
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(yd.data, y.data(), y.size() * 4, cudaMemcpyHostToDevice, stream_));
  LinearCall c;
  c.x = yd, c.w = &w_.head, c.rows = rows, c.in = D, c.out = Vr, c.y = lg;
  c.x_bf16 = numerics_ == Numerics::kReference;  // the norm's BF16 output, as the flow's head call says
  FS_RETURN_IF_ERROR(linear(c));  // the backbone's head kernels
  return download_now(out.data(), lg, out.size() * 4);
}

Status GpuModel::tp_remap_experts(int32_t* sel, float* weight, int64_t n) {
  if (!shard_.split()) return {};
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::detail::launch_tp_remap_experts(sel, weight, n, int32_t(shard_.expert0),
                                                                     int32_t(shard_.experts), stream_));
  return {};
}

}  // namespace gpu

namespace {

class TpSequenceState final : public SequenceState {
 public:
  int64_t length() const override { return ranks.empty() ? 0 : ranks[0]->length(); }
  std::unique_ptr<SequenceState> clone() const override {
    auto c = std::make_unique<TpSequenceState>();
    c->devices = devices;
    for (size_t r = 0; r < ranks.size(); ++r) {
      cudaSetDevice(devices[r]);  // the copies live on the rank's device (a failure shows in the clone's error)
      c->ranks.push_back(ranks[r]->clone());
    }
    return c;
  }
  std::vector<std::unique_ptr<SequenceState>> ranks;  // one GpuSequenceState per rank
  std::vector<int> devices;
};

class TpModel final : public Model {
 public:
  TpModel(std::vector<std::unique_ptr<gpu::GpuModel>> ranks, std::vector<std::unique_ptr<ops::cuda::Communicator>> comms,
          std::vector<TpShard> shards, std::vector<int> devices)
      : ranks_(std::move(ranks)), comms_(std::move(comms)), shards_(std::move(shards)), devices_(std::move(devices)) {
    if (ranks_.size() > 1 && ranks_[0]->has_draft())
      ranks_[0]->set_tp_head([this](std::span<const float> y, int64_t rows, std::span<float> out) {
        return gather_head(y, rows, out);
      });
  }
  // The ranks (and their CUDA graphs, which hold NCCL work) go before the communicators.
  ~TpModel() override { ranks_.clear(); }

  const std::vector<std::unique_ptr<gpu::GpuModel>>& ranks() const { return ranks_; }

  std::vector<GpuGraphStats> rank_stats() const {
    std::vector<GpuGraphStats> v;
    for (const auto& r : ranks_) v.push_back(r->graph_stats());
    return v;
  }

  GpuGraphStats graph_stats() const {
    GpuGraphStats t;
    for (const auto& r : ranks_) {
      const GpuGraphStats& s = r->graph_stats();
      t.forwards += s.forwards, t.eligible += s.eligible, t.launches += s.launches;
      t.instantiations += s.instantiations, t.updates += s.updates, t.recaptures += s.recaptures;
      t.update_failures += s.update_failures;
      t.patched += s.patched, t.patched_nodes += s.patched_nodes, t.patch_misses += s.patch_misses;
      t.timed += s.timed, t.host_ns += s.host_ns, t.wait_ns += s.wait_ns;
      t.tape_ns += s.tape_ns, t.apply_ns += s.apply_ns;
      t.eager_fallbacks += s.eager_fallbacks;
      t.moe_gemm_layers += s.moe_gemm_layers;
      t.moe_compact_groupings += s.moe_compact_groupings;
      t.post_mixes_fused += s.post_mixes_fused;
      t.collapse_norm_fused += s.collapse_norm_fused;
      t.dense_gemm_linears += s.dense_gemm_linears;
      t.paired_linears += s.paired_linears;
      t.weight_expansions += s.weight_expansions;
    }
    return t;
  }

  const model::ModelConfig& config() const override { return ranks_[0]->config(); }

  std::unique_ptr<SequenceState> new_sequence() const override {
    auto st = std::make_unique<TpSequenceState>();
    st->devices = devices_;
    for (auto& r : ranks_) st->ranks.push_back(r->new_sequence());  // each sets its own device
    return st;
  }

  // Snapshots: the canonical host state of a multi-GPU sequence is rank 0's export. Every field
  // but the draft's is replicated bit for bit on every rank, and the draft's state lives on rank 0
  // only (why: gpu_state_io.cpp), so rank 0's export is the whole state.
  Result<std::unique_ptr<CpuSequenceState>> export_state(const SequenceState& state) const override {
    FS_ASSIGN_OR_RETURN(const TpSequenceState* st, tp_state(state, "export_state"));
    FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[0]));
    return ranks_[0]->export_state(*st->ranks[0]);
  }
  Result<std::vector<std::unique_ptr<CpuSequenceState>>> rank_states(const SequenceState& state) const {
    FS_ASSIGN_OR_RETURN(const TpSequenceState* st, tp_state(state, "export_state"));
    std::vector<std::unique_ptr<CpuSequenceState>> out;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[r]));
      auto x = ranks_[r]->export_state(*st->ranks[r]);
      if (!x.ok()) return x.status().with_context(fmt::format("rank {}", r));
      out.push_back(std::move(*x));
    }
    return out;
  }
  // Every rank imports the same host state on its own device (ranks > 0 leave the draft's part to
  // rank 0). The geometry is checked once before any rank touches its device; the ranks then
  // convert and upload in parallel (on_every_rank). The first failure is returned naming its rank,
  // and every rank's partial state is freed with it: a state is returned only when every rank
  // imported.
  Result<std::unique_ptr<SequenceState>> import_state(const CpuSequenceState& s) const override {
    FS_RETURN_IF_ERROR(check_state_geometry(s, config(), ranks_[0]->state_geometry()));
    auto st = std::make_unique<TpSequenceState>();  // freed on an error return, with every rank's state
    st->devices = devices_;
    st->ranks.resize(ranks_.size());
    FS_RETURN_IF_ERROR(on_every_rank("import_state", [&](size_t r) -> Status {
      FS_ASSIGN_OR_RETURN(st->ranks[r], ranks_[r]->import_state(s));
      return {};
    }));
    return std::unique_ptr<SequenceState>(std::move(st));
  }
  // Rank 0's kind: the weights' numerics, the world size and the communicator (cuda_backend_kind).
  std::string backend_kind() const override { return ranks_[0]->backend_kind(); }

  Status rollback(SequenceState& state, int64_t new_length) const override {
    auto* st = dynamic_cast<TpSequenceState*>(&state);
    if (!st || st->ranks.size() != ranks_.size()) return invalid_argument("rollback: not a multi-GPU sequence state");
    for (size_t r = 0; r < ranks_.size(); ++r) {
      FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[r]));
      FS_RETURN_IF_ERROR(ranks_[r]->rollback(*st->ranks[r], new_length));
    }
    return {};
  }

  // Speculative decoding: rank 0 runs the whole draft on its own sequence state (the draft's
  // weights are whole there; the backbone's final streams, which the draft reads, are the same
  // on every rank after the all-reduces); its LM head gathers every rank's vocabulary slice
  // (gather_head). The draft's state (DSpark rings, the MTP ring and history) lives in rank 0's
  // GpuSequenceState, so clone() and rollback() carry it like the backbone's.
  bool has_draft() const override { return ranks_[0]->has_draft(); }
  int64_t draft_block_size() const override { return ranks_[0]->draft_block_size(); }
  Result<DraftBlock> propose(const SequenceState& state, int32_t x0, const DraftChooser& choose = {}) const override {
    const auto* st = dynamic_cast<const TpSequenceState*>(&state);
    if (!st || st->ranks.size() != ranks_.size()) return invalid_argument("propose: not a multi-GPU sequence state");
    FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[0]));
    return ranks_[0]->propose(*st->ranks[0], x0, choose);
  }

  Status forward(std::span<BatchItem> batch, std::vector<float>& logits) override {
    const size_t W = ranks_.size();
    const int64_t V = config().vocab_size;
    // Input checks here, before any rank starts (a rank failing alone would strand the others).
    std::vector<std::vector<BatchItem>> items(W);
    for (auto& it : batch) {
      auto* st = dynamic_cast<TpSequenceState*>(it.state);
      if (!st || st->ranks.size() != W) return invalid_argument("forward: batch item has no multi-GPU sequence state");
      if (it.tokens.empty()) return invalid_argument("forward: a batch item has no tokens");
      for (int32_t t : it.tokens)
        if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
      for (size_t r = 0; r < W; ++r) items[r].push_back(BatchItem{st->ranks[r].get(), it.tokens, it.all_logits});
    }
    std::vector<std::vector<float>> out(W);
    // A failed rank aborts the group, so that the ranks waiting for it in a collective return
    // (kCancelled: for_each_rank reports the rank that failed first, not the ones woken).
    Status st = on_every_rank(
        "multi-GPU forward", [&](size_t r) { return ranks_[r]->forward(items[r], out[r]); },
        [&](size_t r) { comms_[r]->abort(); });
    if (!st.ok()) {
      for (auto& c : comms_) c->recover();  // every rank has returned: the next step may run
      return st;
    }
    const size_t rows = out[0].size() / size_t(shards_[0].vocab);
    for (size_t r = 0; r < W; ++r)
      if (out[r].size() != rows * size_t(shards_[r].vocab))
        return internal_error("multi-GPU forward: rank {} returned {} logits, expected {} rows of {}", r, out[r].size(),
                              rows, shards_[r].vocab);
    const size_t off = logits.size();
    logits.resize(off + rows * size_t(V));
    for (size_t i = 0; i < rows; ++i)
      for (size_t r = 0; r < W; ++r) {
        const size_t n = size_t(shards_[r].vocab);
        std::copy_n(out[r].data() + i * n, n, logits.data() + off + i * size_t(V) + size_t(shards_[r].vocab0));
      }
    return {};
  }

 private:
  // for_each_rank with rank r's device current on its thread: fn(r) on every rank at once (rank 0
  // on the caller's thread, which keeps devices_[0] current), every thread joined on return, the
  // first failure named by its rank. Every multi-GPU step that the ranks take together goes
  // through here (forward, import_state, gather_head).
  Status on_every_rank(std::string_view what, const std::function<Status(size_t)>& fn,
                       const std::function<void(size_t)>& on_fail = {}) const {
    return for_each_rank(
        what, devices_,
        [&](size_t r) -> Status {
          if (cudaError_t e = cudaSetDevice(devices_[r]); e != cudaSuccess)
            return internal_error("cudaSetDevice({}): {}", devices_[r], cudaGetErrorString(e));
          return fn(r);
        },
        on_fail);
  }

  // The drafts' LM head over the full vocabulary: host rows y [rows, D] → out [rows, V], each
  // rank's slice on its own device (on_every_rank), joined on the host like forward's logits.
  // No collectives: the ranks that do not run the draft only multiply.
  Status gather_head(std::span<const float> y, int64_t rows, std::span<float> out) {
    const size_t W = ranks_.size();
    const int64_t V = config().vocab_size;
    if (int64_t(out.size()) != rows * V)
      return internal_error("draft head: {} output floats for {} rows of {}", out.size(), rows, V);
    std::vector<std::vector<float>> part(W);
    FS_RETURN_IF_ERROR(on_every_rank("draft head", [&](size_t r) {
      part[r].resize(size_t(rows * shards_[r].vocab));
      return ranks_[r]->head_slice(y, rows, part[r]);
    }));
    for (int64_t i = 0; i < rows; ++i)
      for (size_t r = 0; r < W; ++r) {
        const int64_t n = shards_[r].vocab;
        std::copy_n(part[r].data() + i * n, n, out.data() + i * V + shards_[r].vocab0);
      }
    return {};
  }

  Result<const TpSequenceState*> tp_state(const SequenceState& state, const char* what) const {
    const auto* st = dynamic_cast<const TpSequenceState*>(&state);
    if (!st || st->ranks.size() != ranks_.size()) return invalid_argument("{}: not a multi-GPU sequence state", what);
    for (size_t r = 1; r < st->ranks.size(); ++r)
      if (st->ranks[r]->length() != st->ranks[0]->length())
        return internal_error("{}: rank {} holds {} tokens, rank 0 {}", what, r, st->ranks[r]->length(),
                              st->ranks[0]->length());
    return st;
  }

  std::vector<std::unique_ptr<gpu::GpuModel>> ranks_;
  std::vector<std::unique_ptr<ops::cuda::Communicator>> comms_;
  std::vector<TpShard> shards_;
  std::vector<int> devices_;
};

}  // namespace

Result<GpuGraphStats> gpu_graph_stats(const Model& m) {
  if (const auto* g = dynamic_cast<const gpu::GpuModel*>(&m)) return g->graph_stats();
  if (const auto* t = dynamic_cast<const TpModel*>(&m)) return t->graph_stats();
  return invalid_argument("CUDA graph counters: not a CUDA model");
}

Result<std::vector<GpuGraphStats>> gpu_graph_rank_stats(const Model& m) {
  if (const auto* g = dynamic_cast<const gpu::GpuModel*>(&m)) return std::vector<GpuGraphStats>{g->graph_stats()};
  if (const auto* t = dynamic_cast<const TpModel*>(&m)) return t->rank_stats();
  return invalid_argument("CUDA graph counters: not a CUDA model");
}

Result<std::vector<std::unique_ptr<CpuSequenceState>>> tp_rank_states(const Model& m, const SequenceState& state) {
  if (const auto* t = dynamic_cast<const TpModel*>(&m)) return t->rank_states(state);
  return invalid_argument("rank states: not a multi-GPU model");
}

Result<std::vector<GpuWeightBytes>> gpu_rank_weight_bytes(const Model& m) {
  auto bytes = [](const gpu::GpuModel& g) {
    const gpu::GpuWeightReport& r = g.weight_report();
    GpuWeightBytes b;
    b.stored = r.stored_bytes, b.checkpoint = r.checkpoint_bytes, b.stored_matrices = r.stored_matrices;
    b.fp32 = r.fp32_bytes, b.fallback = r.fallback_bytes, b.fallback_matrices = r.fallback_matrices;
    return b;
  };
  if (const auto* g = dynamic_cast<const gpu::GpuModel*>(&m)) return std::vector<GpuWeightBytes>{bytes(*g)};
  if (const auto* t = dynamic_cast<const TpModel*>(&m)) {
    std::vector<GpuWeightBytes> v;
    for (const auto& r : t->ranks()) v.push_back(bytes(*r));
    return v;
  }
  return invalid_argument("weight bytes per rank: not a CUDA model");
}

Result<std::unique_ptr<Model>> load_model_tp(const std::string& dir, Numerics numerics, const std::vector<int>& devices,
                                             const GpuLoadOptions& opts) {
  TpComm comm = opts.tp_comm;
  const int W = int(devices.size());
  if (W < 1) return invalid_argument("--gpus: no device given");
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return Status(StatusCode::kUnavailable, fmt::format("--gpus: {}", why));
  int have = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&have));
  bool repeated = false;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] >= have) return invalid_argument("--gpus: device {} does not exist (this machine has {} CUDA device(s))", devices[i], have);
    for (size_t j = 0; j < i; ++j) repeated = repeated || devices[j] == devices[i];
  }
  if (comm == TpComm::kAuto) comm = repeated ? TpComm::kHost : TpComm::kNccl;
  if (comm == TpComm::kNccl && repeated)
    return invalid_argument("--gpus: NCCL needs distinct devices (a device is listed twice); host staging allows it");
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(dir));
  std::vector<TpShard> shards;
  for (int r = 0; r < W; ++r) {
    FS_ASSIGN_OR_RETURN(TpShard s, make_tp_shard(ck.config(), numerics, r, W));
    shards.push_back(s);
  }
  std::vector<std::unique_ptr<ops::cuda::Communicator>> comms;
  if (comm == TpComm::kNccl) {
    FS_ASSIGN_OR_RETURN(comms, ops::cuda::make_nccl_comms(devices));
  } else {
    FS_ASSIGN_OR_RETURN(comms, ops::cuda::make_host_comms(W));
  }
  std::vector<std::unique_ptr<gpu::GpuModel>> ranks;
  for (int r = 0; r < W; ++r) {
    FS_ASSIGN_OR_RETURN(auto m, gpu::GpuModel::load(dir, numerics, devices[size_t(r)], &shards[size_t(r)],
                                                    comms[size_t(r)].get(), opts));
    ranks.push_back(std::move(m));
  }
  return std::unique_ptr<Model>(
      std::make_unique<TpModel>(std::move(ranks), std::move(comms), std::move(shards), devices));
}

}  // namespace flashseek::forward

#else  // no CUDA in this build

namespace flashseek::forward {
Result<GpuGraphStats> gpu_graph_stats(const Model&) {
  return Status(StatusCode::kUnimplemented, "CUDA graph counters: this build has no CUDA backend");
}
Result<std::vector<GpuGraphStats>> gpu_graph_rank_stats(const Model&) {
  return Status(StatusCode::kUnimplemented, "CUDA graph counters: this build has no CUDA backend");
}
Result<std::vector<GpuWeightBytes>> gpu_rank_weight_bytes(const Model&) {
  return Status(StatusCode::kUnimplemented, "weight bytes per rank: this build has no CUDA backend");
}
Result<std::vector<std::unique_ptr<CpuSequenceState>>> tp_rank_states(const Model&, const SequenceState&) {
  return Status(StatusCode::kUnimplemented, "rank states: this build has no CUDA backend");
}
Result<std::unique_ptr<Model>> load_model_tp(const std::string&, Numerics, const std::vector<int>& devices,
                                             const GpuLoadOptions&) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("--gpus: {} GPUs requested but this build has no CUDA backend", devices.size()));
}
}  // namespace flashseek::forward

#endif
