// The CUDA backend's model: weight upload (as stored or FP32), sequence state, and steps (graph
// capture and replay, staging, downloads) around the model flow (forward/flow.h), whose ops are
// GpuModel's Backend methods (gpu_ops.cpp).
#include "backends/cuda/gpu_model.h"

#include <charconv>

#include "backends/cuda/gpu_tp.h"
#include "forward/cpu_model.h"

namespace flashseek::forward {

Result<GpuWeights> parse_gpu_weights(const std::string& s) {
  if (s == "native") return GpuWeights::kNative;
  if (s == "fp32") return GpuWeights::kFp32;
  return invalid_argument("--gpu-weights {}: expected native or fp32", s);
}

const char* gpu_linear_role_name(GpuLinearRole r) {
  switch (r) {
    case GpuLinearRole::kAttnWqA: return "wq_a";
    case GpuLinearRole::kAttnWqB: return "wq_b";
    case GpuLinearRole::kAttnWkv: return "wkv";
    case GpuLinearRole::kAttnWoB: return "wo_b";
    case GpuLinearRole::kIndexerWqB: return "indexer.wq_b";
    case GpuLinearRole::kSharedExperts: return "shared_experts";
    case GpuLinearRole::kRoutedExperts: return "routed_experts";
    case GpuLinearRole::kEngramWkv: return "engram.wkv";
    case GpuLinearRole::kDraft: return "draft";
    case GpuLinearRole::kCount: break;
  }
  return "?";
}

Result<std::unique_ptr<Model>> load_model_for(const std::string& dir, Numerics numerics, const std::string& gpus,
                                              const GpuLoadOptions& opts) {
  if (gpus.empty()) {
    CpuLoadOptions co;
    co.weights.threads = opts.load_threads;
    co.weights.progress = opts.load_progress;
    FS_ASSIGN_OR_RETURN(auto m, CpuModel::load(dir, numerics, co));
    return std::unique_ptr<Model>(std::move(m));
  }
  if (gpus.find(',') != std::string::npos) {  // several devices: tensor + expert parallel (gpu_tp.h)
    FS_ASSIGN_OR_RETURN(std::vector<int> devices, parse_gpu_list(gpus));
    return load_model_tp(dir, numerics, devices, opts);
  }
  int device = -1;
  const auto [end, ec] = std::from_chars(gpus.data(), gpus.data() + gpus.size(), device);
  if (ec != std::errc() || end != gpus.data() + gpus.size() || device < 0)
    return invalid_argument("--gpus {}: expected a device number such as 0 (or a list such as 0,1)", gpus);
  return load_model_gpu(dir, numerics, device, opts);
}

}  // namespace flashseek::forward

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "backends/cuda/gpu_impl.h"
#include "backends/cuda/stored_slice.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "ops/cuda/runtime/comm.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/engram.h"
#include "ops/fp4_fragments.h"

namespace flashseek::forward {

bool gpu_backend_built() { return true; }

Result<uint64_t> gpu_memory_free(int device) {
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return Status(StatusCode::kUnavailable, fmt::format("--gpus {}: {}", device, why));
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  return uint64_t(free_b);
}

Result<std::unique_ptr<Model>> load_model_gpu(const std::string& dir, Numerics numerics, int device,
                                              const GpuLoadOptions& opts) {
  FS_ASSIGN_OR_RETURN(auto m, gpu::GpuModel::load(dir, numerics, device, nullptr, nullptr, opts));
  return std::unique_ptr<Model>(std::move(m));
}

namespace gpu {
namespace cd = ops::cuda::detail;

std::unique_ptr<SequenceState> GpuSequenceState::clone() const {
  auto c = std::make_unique<GpuSequenceState>();
  c->len = len;
  c->ring_size = ring_size;
  c->engram_hist = engram_hist;
  c->error = error;
  c->layers.resize(layers.size());
  auto copy_comp = [&](const GpuCompState& s, GpuCompState& d) -> Status {
    d.n_pend = s.n_pend;
    d.has_prev = s.has_prev;
    d.hist_lo = s.hist_lo;
    FS_RETURN_IF_ERROR(d.hist_v.copy_from(s.hist_v));
    FS_RETURN_IF_ERROR(d.hist_z.copy_from(s.hist_z));
    FS_RETURN_IF_ERROR(d.v.copy_from(s.v));
    FS_RETURN_IF_ERROR(d.z.copy_from(s.z));
    FS_RETURN_IF_ERROR(d.prev_v.copy_from(s.prev_v));
    return d.prev_z.copy_from(s.prev_z);
  };
  for (size_t l = 0; l < layers.size() && c->error.ok(); ++l) {
    const GpuLayerState& s = layers[l];
    GpuLayerState& d = c->layers[l];
    d.n_ckv = s.n_ckv;
    d.n_ikeys = s.n_ikeys;
    Status st = d.ring.copy_from(s.ring);
    if (st.ok()) st = d.ckv.copy_from(s.ckv);
    if (st.ok()) st = d.ikeys.copy_from(s.ikeys);
    if (st.ok()) st = copy_comp(s.comp, d.comp);
    if (st.ok()) st = copy_comp(s.icomp, d.icomp);
    if (!st.ok()) c->error = st;
  }
  c->draft_rings.resize(draft_rings.size());
  for (size_t i = 0; i < draft_rings.size() && c->error.ok(); ++i)
    if (Status st = c->draft_rings[i].copy_from(draft_rings[i]); !st.ok()) c->error = st;
  c->mtp_lo = mtp_lo;  // V4 MTP (gpu_mtp.cpp)
  if (Status st = c->mtp_ring.copy_from(mtp_ring); c->error.ok() && !st.ok()) c->error = st;
  if (Status st = c->mtp_hist.copy_from(mtp_hist); c->error.ok() && !st.ok()) c->error = st;
  return c;
}

namespace {

using cd::WeightDtype;

// How tensor `name` stays on the device as stored: fills m's dtype, shape, scale blocks and byte
// sizes and the stored weight / scale spans; otherwise the reason (the matrix then goes up as an
// FP32 copy, logged).
std::string plan_stored(const model::Checkpoint& ck, const std::string& name, NativeMatrix& m,
                        std::span<const uint8_t>& data, std::span<const uint8_t>& scale) {
  auto t = ck.find(name);
  if (!t.ok()) return "not in the checkpoint";
  const model::TensorView& tv = t.value();
  if (tv.shape.size() != 2 || tv.shape[0] <= 0 || tv.shape[1] <= 0)
    return fmt::format("shape {} is not a 2-D matrix", shape_to_string(tv.shape));
  m.n = tv.shape[0];
  m.k = tv.shape[1];
  m.block_rows = m.block_cols = 1;
  scale = {};
  switch (tv.dtype) {
    case DType::kF32: m.dtype = WeightDtype::kF32, m.code_bytes = m.n * m.k * 4; break;
    case DType::kBF16: m.dtype = WeightDtype::kBf16, m.code_bytes = m.n * m.k * 2; break;
    case DType::kF16: m.dtype = WeightDtype::kF16, m.code_bytes = m.n * m.k * 2; break;
    case DType::kF8E4M3: case DType::kI8: case DType::kU8: {
      const bool fp4 = tv.dtype != DType::kF8E4M3;
      const std::string sname = model::scale_name_for(name);
      if (!ck.has(sname)) return fmt::format("stored as {} without a block scale", dtype_name(tv.dtype));
      auto s = ck.find(sname);
      if (!s.ok()) return "no block scale";
      const model::TensorView& sv = s.value();
      if (sv.dtype != DType::kF8E8M0 || sv.shape.size() != 2) return "scale is not a 2-D E8M0 tensor";
      if (fp4) {
        m.dtype = WeightDtype::kFp4, m.format = ops::WeightFormat::kFp4;
        m.k = 2 * tv.shape[1];
        m.block_cols = m.w_block = 32;
        if (sv.shape[0] != m.n || sv.shape[1] * 32 != m.k)
          return fmt::format("FP4 scale {} is not one per 32 inputs", shape_to_string(sv.shape));
        m.code_bytes = m.n * m.k / 2;
      } else {
        m.dtype = WeightDtype::kFp8, m.format = ops::WeightFormat::kFp8;
        const int64_t b = ck.config().weight_block_size;
        if (b > 0 && sv.shape[0] == (m.n + b - 1) / b && sv.shape[1] == (m.k + b - 1) / b) {
          m.block_rows = m.block_cols = m.w_block = b;
        } else if (sv.shape[0] == m.n && sv.shape[1] == (m.k + 31) / 32) {
          m.block_rows = 1, m.block_cols = 32;  // per-row 32-groups (as model/checkpoint.cpp accepts)
        } else {
          return fmt::format("scale {} matches neither {}x{} blocks nor per-row 32-groups", shape_to_string(sv.shape),
                             b, b);
        }
        m.code_bytes = m.n * m.k;
      }
      m.scale_bytes = sv.shape[0] * sv.shape[1];
      if (int64_t(sv.data.size()) != m.scale_bytes) return "stored scale size does not match its shape";
      scale = sv.data;
      break;
    }
    default: return fmt::format("stored as {}", dtype_name(tv.dtype));
  }
  if (int64_t(tv.data.size()) != m.code_bytes) return "stored byte size does not match the shape";
  data = tv.data;
  return {};
}

// The host view of a matrix plan_stored accepted (its stored bytes `data` / `scale`).
StoredMatrixView stored_view(const NativeMatrix& m, std::span<const uint8_t> data, std::span<const uint8_t> scale) {
  StoredMatrixView v;
  switch (m.dtype) {
    case WeightDtype::kF32: v.format = StoredFormat::kF32; break;
    case WeightDtype::kBf16: v.format = StoredFormat::kBf16; break;
    case WeightDtype::kF16: v.format = StoredFormat::kF16; break;
    case WeightDtype::kFp8: v.format = StoredFormat::kFp8; break;
    case WeightDtype::kFp4: v.format = StoredFormat::kFp4; break;
  }
  v.n = m.n, v.k = m.k, v.block_rows = m.block_rows, v.block_cols = m.block_cols;
  v.codes = data, v.scales = scale;
  return v;
}

// Whether the block-scaled GEMVs (ops/cuda/gemv.h) can run `m` with activation block `act`.
bool fast_fits(const NativeMatrix& m, int64_t act) {
  if (act <= 0) return false;
  if (m.dtype == WeightDtype::kFp8 && m.block_rows != m.block_cols) return false;
  if (m.dtype != WeightDtype::kFp8 && m.dtype != WeightDtype::kFp4) return false;
  ops::BlockLinearParams bp;  // the kernels' shape rules (k multiple of 32, act_block, w_block)
  float dummy = 0;
  uint8_t bytes = 0;
  bp.x = &dummy, bp.w = &bytes, bp.w_scale = &bytes, bp.y = &dummy;
  bp.m = 1, bp.n = m.n, bp.k = m.k, bp.format = m.format, bp.w_block = m.w_block, bp.act_block = act;
  if (!ops::validate(bp).ok()) return false;
  return ops::weight_code_bytes(m.format, m.n, m.k) == m.code_bytes &&
         ops::weight_scale_bytes(m.format, m.n, m.k, m.w_block) == m.scale_bytes;
}

}  // namespace

// Weight upload at the speed of the disk (GpuModel::load, native weights). Read-ahead threads
// bring the checkpoint's stored matrices into the page cache in upload order (readahead(2) on the
// shard files, parallel), staying at most kAhead bytes ahead of the copies so that a checkpoint
// larger than the page cache is not read twice. copy() only queues pieces into one of two pinned
// buffers; a full buffer is filled by every pool thread at once (pread(2) from the shard file
// straight into pinned memory, as `dd` reads: no page faults of the map; memcpy for in-memory
// checkpoints) and handed to the DMA engine on a stream of its own while the next one fills, so
// disk reads, host copies and host-to-device copies overlap. No FP32 intermediates: the bytes go
// up as stored.
class WeightStager {
 public:
  struct Range {
    const uint8_t* p;
    size_t n;
  };
  // A shard mapped from disk: its bytes [base, base + size) are also file offsets 0.. of fd.
  struct Source {
    const uint8_t* base;
    uint64_t size;
    int fd;
  };
  static constexpr size_t kBuffer = size_t(64) << 20;  // each of the two pinned buffers
  static constexpr uint64_t kAhead = uint64_t(4) << 30;
  static constexpr size_t kSegment = size_t(16) << 20;  // one read-ahead task
  static constexpr size_t kPart = size_t(256) << 10;    // one pread / memcpy task of a fill

  WeightStager(std::vector<Range> order, std::vector<Source> sources, int threads,
               std::function<void(uint64_t, uint64_t)> progress)
      : sources_(std::move(sources)), progress_(std::move(progress)) {
    std::sort(sources_.begin(), sources_.end(), [](const Source& a, const Source& b) { return a.base < b.base; });
    uint64_t cum = 0;
    for (const Range& r : order)
      for (size_t off = 0; off < r.n; off += kSegment) {
        const size_t n = std::min(kSegment, r.n - off);
        segments_.push_back({r.p + off, n, cum, source_of(r.p + off, n)});
        cum += n;
      }
    total_ = cum;
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    threads = int(std::min<size_t>(size_t(threads), segments_.size()));
    for (int i = 0; i < threads; ++i) readers_.emplace_back([this] { read_ahead(); });
  }
  ~WeightStager() {
    stop_readers();
    if (stream_) cudaStreamSynchronize(stream_);
    for (int b = 0; b < 2; ++b) {
      if (ev_[b]) cudaEventDestroy(ev_[b]);
      if (buf_[b]) cudaFreeHost(buf_[b]);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    FS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int b = 0; b < 2; ++b) {
      FS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&buf_[b]), kBuffer, cudaHostAllocDefault));
      FS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev_[b], cudaEventDisableTiming));
    }
    return {};
  }

  // Queues dst[0, bytes) = src[0, bytes) (src stays valid: the mapped checkpoint).
  Status copy(void* dst, const uint8_t* src, size_t bytes) {
    for (size_t off = 0; off < bytes;) {
      const size_t n = std::min(bytes - off, kBuffer - fill_);
      pending_.push_back({static_cast<uint8_t*>(dst) + off, src + off, n, fill_, source_of(src + off, n)});
      fill_ += n;
      off += n;
      if (fill_ == kBuffer) FS_RETURN_IF_ERROR(drain());
    }
    return {};
  }

  uint64_t total() const { return total_; }

  // Copies what is queued, waits for every copy and stops the readers.
  Status finish() {
    Status st = drain();
    stop_readers();
    FS_RETURN_IF_ERROR(st);
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (progress_ && done_ < total_) progress_(total_, total_);
    return {};
  }

 private:
  struct Segment {
    const uint8_t* p;
    size_t n;
    uint64_t start;  // bytes of the upload order before it
    const Source* src;
  };
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    size_t n, at;  // bytes, offset in the buffer
    const Source* file;
  };

  // The from-disk shard holding [p, p + n) whole, else nullptr (in-memory bytes: memcpy).
  const Source* source_of(const uint8_t* p, size_t n) const {
    auto it = std::upper_bound(sources_.begin(), sources_.end(), p,
                               [](const uint8_t* q, const Source& s) { return q < s.base; });
    if (it == sources_.begin()) return nullptr;
    --it;
    const uint64_t off = uint64_t(p - it->base);
    return off <= it->size && n <= it->size - off ? &*it : nullptr;
  }

  // Fills the current buffer with its queued pieces (all pool threads, kPart each), queues their
  // host-to-device copies and switches to the other buffer once its own copies finished.
  Status drain() {
    if (pending_.empty()) return {};
    std::vector<std::pair<size_t, size_t>> parts;  // (piece, offset in it)
    for (size_t i = 0; i < pending_.size(); ++i)
      for (size_t o = 0; o < pending_[i].n; o += kPart) parts.push_back({i, o});
    uint8_t* h = buf_[cur_];
    std::atomic<int> err{0};
    ThreadPool::global().parallel_for(int64_t(parts.size()), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const Piece& pc = pending_[parts[size_t(k)].first];
        const size_t o = parts[size_t(k)].second, n = std::min(kPart, pc.n - o);
        if (!pc.file) {
          std::memcpy(h + pc.at + o, pc.src + o, n);
          continue;
        }
        if (int e2 = pread_all(pc.file->fd, h + pc.at + o, n, uint64_t(pc.src + o - pc.file->base)); e2 != 0) {
          int expect = 0;
          err.compare_exchange_strong(expect, e2);
        }
      }
    });
    if (int e = err.load(); e != 0) return io_error("reading checkpoint weights: {}", std::strerror(e));
    size_t bytes = 0;
    for (const Piece& pc : pending_) {
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pc.dst, h + pc.at, pc.n, cudaMemcpyHostToDevice, stream_));
      bytes += pc.n;
    }
    pending_.clear();
    done_ += bytes;
    consumed_.store(done_, std::memory_order_relaxed);
    if (progress_) progress_(std::min(done_, total_), total_);
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[cur_], stream_));
    used_[cur_] = true;
    cur_ ^= 1;
    if (used_[cur_]) FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev_[cur_]));
    fill_ = 0;
    return {};
  }

  // pread until n bytes are read; 0 or the errno (EIO for a file shorter than its map).
  static int pread_all(int fd, uint8_t* p, size_t n, uint64_t off) {
    while (n > 0) {
      const ssize_t r = ::pread(fd, p, n, off_t(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (r == 0) return EIO;
      p += r, n -= size_t(r), off += uint64_t(r);
    }
    return 0;
  }

  void read_ahead() {
    for (size_t i; (i = next_.fetch_add(1)) < segments_.size();) {
      const Segment& s = segments_[i];
      while (!stop_.load() && s.start > consumed_.load(std::memory_order_relaxed) + kAhead)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (stop_.load()) return;
      if (!s.src) continue;  // in memory already
      if (::readahead(s.src->fd, off64_t(s.p - s.src->base), s.n) == 0) continue;
      uint8_t sum = 0;  // readahead unsupported here: one read per page faults it in
      for (size_t off = 0; off < s.n; off += 4096) sum ^= *reinterpret_cast<const volatile uint8_t*>(s.p + off);
      sink_.fetch_xor(sum, std::memory_order_relaxed);
    }
  }

  void stop_readers() {
    stop_.store(true);
    for (auto& t : readers_) t.join();
    readers_.clear();
  }

  std::vector<Source> sources_;
  std::vector<Segment> segments_;
  std::vector<Piece> pending_;
  uint64_t total_ = 0, done_ = 0;
  std::function<void(uint64_t, uint64_t)> progress_;
  std::atomic<uint64_t> consumed_{0};
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint8_t> sink_{0};
  std::vector<std::thread> readers_;
  cudaStream_t stream_ = nullptr;
  uint8_t* buf_[2] = {nullptr, nullptr};
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  bool used_[2] = {false, false};
  int cur_ = 0;
  size_t fill_ = 0;
};

// The shards of `ck` mapped from disk (pread sources of WeightStager).
std::vector<WeightStager::Source> stager_sources(const model::Checkpoint& ck) {
  std::vector<WeightStager::Source> out;
  for (const model::SafetensorsFile& f : ck.shards().files())
    if (f.map().from_disk() && f.map().fd() >= 0 && f.map().size() > 0)
      out.push_back({f.map().data(), f.map().size(), f.map().fd()});
  return out;
}

namespace {

// The stored byte ranges (codes, then scales) of the matrices load_weights deferred, in the order
// upload_weights copies them: the loader's order, except that a layer's routed experts go up by
// projection (every w1, then every w2, then every w3), as up_experts stacks them. A tensor-parallel
// rank (`shard` split) reads only the code rows of its row slices (tp_slice_for); `names` holds no
// matrix it skips.
std::vector<WeightStager::Range> upload_order(const model::Checkpoint& ck, const std::vector<std::string>& names,
                                              const TpShard& shard) {
  std::vector<std::string> order;
  std::vector<std::pair<std::string, std::string>> run;  // (projection + expert key, name) of one prefix
  std::string run_prefix;
  auto flush = [&] {
    std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& r : run) order.push_back(std::move(r.second));
    run.clear();
  };
  for (const std::string& n : names) {
    const size_t at = n.find(".experts.");
    const size_t dot = at == std::string::npos ? at : n.find('.', at + 9);
    if (at == std::string::npos || dot == std::string::npos) {
      flush();
      order.push_back(n);
      continue;
    }
    const std::string prefix = n.substr(0, at);
    if (prefix != run_prefix) flush();
    run_prefix = prefix;
    const std::string expert = n.substr(at + 9, dot - at - 9), proj = n.substr(dot + 1);
    run.push_back({fmt::format("{}/{:08d}", proj, std::atoi(expert.c_str())), n});
  }
  flush();
  std::vector<WeightStager::Range> ranges;
  for (const std::string& n : order) {
    const TpSlice sl = tp_slice_for(n, ck.config(), shard);
    for (const std::string& t : {n, model::scale_name_for(n)}) {
      auto v = ck.find(t);
      if (!v.ok()) continue;
      std::span<const uint8_t> b = v->data;
      const int64_t rows = v->shape.empty() ? 0 : v->shape[0];
      if (t == n && sl.kind == TpSlice::kRows && rows > 0 && int64_t(b.size()) % rows == 0 &&
          sl.start >= 0 && sl.count >= 0 && sl.start + sl.count <= rows) {
        const size_t rb = b.size() / size_t(rows);  // code bytes of one row
        b = b.subspan(size_t(sl.start) * rb, size_t(sl.count) * rb);
      }
      ranges.push_back({b.data(), b.size()});
    }
  }
  return ranges;
}

}  // namespace

Result<std::unique_ptr<GpuModel>> GpuModel::load(const std::string& dir, Numerics numerics, int device,
                                                 const TpShard* shard, ops::cuda::Communicator* comm,
                                                 const GpuLoadOptions& opts) {
  if (opts.moe_gemm_min_tokens < 0)
    return invalid_argument("moe_gemm_min_tokens {}: expected >= 0 (0: off)", opts.moe_gemm_min_tokens);
  if (opts.dense_gemm_min_tokens < 0)
    return invalid_argument("dense_gemm_min_tokens {}: expected >= 0 (0: off)", opts.dense_gemm_min_tokens);
  if (opts.gemv_tiled_min_rows < 0 || opts.gemv_tiled_min_rows > kMaxGemvTiledMinRows)  // times groups stays in int64
    return invalid_argument("gemv_tiled_min_rows {}: expected 0..{}", opts.gemv_tiled_min_rows, kMaxGemvTiledMinRows);
  if (opts.gemv_ring_stages < 0 || opts.gemv_ring_stages > 8)
    return invalid_argument("gemv_ring_stages {}: expected 0 (off) .. 8", opts.gemv_ring_stages);
  if (opts.mma_decode_tiles != 0 && opts.mma_decode_tiles != 1 && opts.mma_decode_tiles != 2 &&
      opts.mma_decode_tiles != 4)
    return invalid_argument("mma_decode_tiles {}: expected 0 (automatic), 1, 2 or 4", opts.mma_decode_tiles);
  if (opts.gemv_fp4_chunk != 0 && opts.gemv_fp4_chunk != 2 && opts.gemv_fp4_chunk != 4)
    return invalid_argument("gemv_fp4_chunk {}: expected 0 (automatic), 2 or 4", opts.gemv_fp4_chunk);
  if (opts.gemv_prequant_min_rows < 1 || opts.gemv_prequant_min_rows > kMaxGemvTiledMinRows)
    return invalid_argument("gemv_prequant_min_rows {}: expected 1..{}", opts.gemv_prequant_min_rows,
                            kMaxGemvTiledMinRows);
  if (opts.index_scores_kernel < 0 || opts.index_scores_kernel > 4)
    return invalid_argument("index_scores_kernel {}: expected 0 (automatic), 1, 2, 3 or 4", opts.index_scores_kernel);
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return Status(StatusCode::kUnavailable, fmt::format("--gpus {}: {}", device, why));
  int n = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&n));
  if (device < 0 || device >= n) return invalid_argument("--gpus {}: this machine has {} CUDA device(s)", device, n);
  // Creating the device's context (cudaSetDevice, ~0.1-0.3 s on an H200) overlaps opening the
  // checkpoint and reading its small tensors on this thread; the phases are reported at the end.
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  std::future<std::pair<cudaError_t, double>> context = std::async(std::launch::async, [device, t_start] {
    const cudaError_t e = cudaSetDevice(device);
    return std::make_pair(e, std::chrono::duration<double>(Clock::now() - t_start).count());
  });
  double context_s = 0;
  auto context_ready = [&]() -> Status {
    if (!context.valid()) return {};
    const auto [e, secs] = context.get();
    FS_CUDA_RETURN_IF_ERROR(e);
    context_s = secs;
    FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));  // this thread's current device
    return {};
  };
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(dir));
  std::unique_ptr<GpuModel> m(new GpuModel());
  m->ck_ = std::make_unique<model::Checkpoint>(std::move(ck));
  // Native weights: the host loads no matrix (they go up from the checkpoint's bytes; a
  // tensor-parallel rank uploads the stored bytes of its slices, up_matrix / up_experts). kFp32:
  // FP32 copies (a rank slices them on the host, gpu_tp.cpp shard_weights).
  m->native_ = opts.weights == GpuWeights::kNative;
  m->engram_device_ = opts.engram_on_device;
  WeightLoadOptions wo;
  wo.matrices = !m->native_;
  wo.threads = opts.load_threads;
  if (!m->native_) wo.progress = opts.load_progress;  // the FP32 path's work is the host dequantisation
  FS_ASSIGN_OR_RETURN(m->w_, load_weights(*m->ck_, wo));
  const double host_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  FS_RETURN_IF_ERROR(context_ready());
  const auto t_upload = Clock::now();
  m->numerics_ = numerics;
  m->cache_fmt_ = cache_formats(m->ck_->config(), numerics);
  m->device_ = device;
  FS_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&m->stream_));  // blocking: orders with the legacy stream
  m->main_stream_ = m->stream_;
  if (opts.branches != GpuBranches::kOff) {
    int least = 0, greatest = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int prio = opts.branches == GpuBranches::kPriority ? greatest : least;
    for (int l = 0; l < kLanes; ++l) {
      FS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&m->side_stream_[size_t(l)], cudaStreamDefault, prio));
      FS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m->fork_ev_[size_t(l)], cudaEventDisableTiming));
      FS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m->join_ev_[size_t(l)], cudaEventDisableTiming));
    }
  }
  // CUDA graphs (gpu_graph.cpp): on by default, decode steps replay a cached executable by
  // patching (GpuLoadOptions::graphs kOff: eager; kRecord: record every step).
  m->graphs_ = opts.graphs != GpuGraphs::kOff;
  if (comm && comm->kind() != "nccl") m->graphs_ = false;  // host-staged collectives synchronise
  // NCCL ranks patch too: their all-reduces stay as NCCL captured them and the ranks vote each
  // step, so that every rank patches, records or runs eagerly together.
  m->patch_ = m->graphs_ && opts.graphs == GpuGraphs::kPatch;
  const auto& c = m->config();
  const ActBlocks ab = reference_act_blocks(c, numerics);
  m->act_block_ = ab.linear;
  m->expert_act_block_ = ab.experts;
  m->fast_linears_ = opts.fast_linears;
  m->index_scores_kernel_ = opts.index_scores_kernel;
  m->prefill_attention_ = opts.prefill_attention;
  m->moe_gemm_min_tokens_ = opts.moe_gemm_min_tokens;
  m->dense_gemm_min_tokens_ = opts.dense_gemm_min_tokens;
  m->gemv_tiled_min_rows_ = opts.gemv_tiled_min_rows;
  m->gemv_prequant_min_rows_ = opts.gemv_prequant_min_rows;
  m->row_fusion_ = opts.row_fusion;
  m->post_mixes_fusion_ = opts.post_mixes_fusion;
  m->collapse_norm_fusion_ = opts.collapse_norm_fusion;
  m->prefill_gemm_bf16_ = opts.prefill_gemm_bf16 || opts.prefill_gemm_expand_w || opts.prefill_gemm_direct;
  m->prefill_gemm_direct_ = opts.prefill_gemm_direct;
  m->prefill_gemm_expand_w_ = opts.prefill_gemm_expand_w;
  m->moe_expand_min_rows_ = std::max<int64_t>(opts.moe_expand_min_rows, 0);
  m->moe_w_in_registers_ = opts.moe_w_in_registers;
  m->moe_compact_groups_ = opts.moe_compact_groups;
  m->programmatic_launch_ = opts.programmatic_launch;
  m->gemv_fp4_chunk_ = opts.gemv_fp4_chunk;
  m->fp4_fragments_ = opts.fp4_fragments && m->native_;
  m->gemv_ring_stages_ = opts.gemv_ring_stages;
  m->mma_decode_tiles_ = opts.mma_decode_tiles;
  m->fp8_fragments_ = opts.fp8_fragments && m->native_;
  m->tensor_core_linears_ = opts.tensor_core_linears;
  // FP32 weight copies are the debug path that reproduces the CPU's order (GpuWeights::kFp32): the
  // exact-order attention stays with them, as the exactness linears do.
  m->decode_attention_tensor_ = opts.decode_attention_tensor && m->native_;
  {
    int major = 0, minor = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, m->device_));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, m->device_));
    m->sm90a_ = major == 9 && minor == 0;
  }
  if (shard) {  // one rank of a multi-GPU model: keep only this rank's slice (gpu_tp.cpp; native
               // matrices are sliced as they go up)
    m->shard_ = *shard;
    m->comm_ = comm;
    FS_RETURN_IF_ERROR(shard_weights(m->w_, c, *shard));
  } else {
    FS_ASSIGN_OR_RETURN(m->shard_, make_tp_shard(c, numerics, 0, 1));
  }
  if (m->native_) {  // the stored matrices go up through pinned staging, overlapped with the reads
    // A rank never reads another rank's experts, nor ranks > 0 the shared expert or the draft
    // (rank 0 runs it: has_draft): tp_slice_for gives them no slice.
    std::vector<std::string> names;
    for (const std::string& nm : m->w_.deferred_matrices)
      if (tp_slice_for(nm, c, m->shard_).kind != TpSlice::kNone) names.push_back(nm);
    if (m->engram_device_)  // uploaded after the layers' matrices (upload_weights)
      for (const LayerWeights& L : m->w_.layers)
        if (L.has_engram) names.push_back(L.engram.table);
    WeightStager stager(upload_order(*m->ck_, names, m->shard_), stager_sources(*m->ck_), opts.load_threads,
                        opts.load_progress);
    FS_RETURN_IF_ERROR(stager.init());
    m->stager_ = &stager;
    Status st = m->upload_weights();
    m->stager_ = nullptr;
    if (st.ok()) st = stager.finish();
    FS_RETURN_IF_ERROR(st);
    const double up_s = std::chrono::duration<double>(Clock::now() - t_upload).count();
    if (!shard)
      std::fprintf(stderr,
                   "flashseek gpu: load phases: checkpoint headers + small tensors %.2f s and device context %.2f s "
                   "(in parallel), stored matrices %.3f GB to the device in %.2f s (%.2f GB/s)\n",
                   host_s, context_s, double(stager.total()) / 1e9, up_s,
                   up_s > 0 ? double(stager.total()) / 1e9 / up_s : 0.0);
  } else {
    FS_RETURN_IF_ERROR(m->upload_weights());
  }
  if (m->native_ && opts.stack_query_kv) FS_RETURN_IF_ERROR(m->stack_query_kv());
  FS_RETURN_IF_ERROR(m->pack_expert_fragments());
  FS_RETURN_IF_ERROR(m->pack_dense_fragments());
  {  // group expert ids 0 … E−1 of the grouped expert GEMV (gpu_ops.cpp moe_native)
    std::vector<int32_t> ids(size_t(std::max<int64_t>(c.n_routed_experts, 1)));
    for (size_t e = 0; e < ids.size(); ++e) ids[e] = int32_t(e);
    FS_RETURN_IF_ERROR(m->expert_ids_.upload(ids.data(), size_t(c.n_routed_experts)));
  }
  // The per-row tickets of the fused stream update + mixes (hc_post_mixes): zero between launches
  // (each launch's last block resets its rows').
  if (m->post_mixes_fusion_) FS_RETURN_IF_ERROR(m->hcpm_tickets_.zeros(size_t(kGpuGraphMaxTokens)));
  m->print_weight_report();
  return m;
}

Status GpuModel::stack_query_kv() {
  namespace cd = ops::cuda::detail;
  // Every stager copy has landed before the device-to-device copies below read the matrices.
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  const auto standard = [](const NativeMatrix& m) {
    return m.fast && m.count == 1 && m.dtype == cd::WeightDtype::kFp8 && m.format == ops::WeightFormat::kFp8 &&
           m.block_rows == m.w_block && m.block_cols == m.w_block && !m.codes_view &&
           m.code_bytes == ops::weight_code_bytes(m.format, m.n, m.k) &&
           m.scale_bytes == ops::weight_scale_bytes(m.format, m.n, m.k, m.w_block) &&
           int64_t(m.codes.capacity()) == m.code_bytes && int64_t(m.scales.capacity()) == m.scale_bytes;
  };
  int64_t layers = 0;
  for (LayerWeights& L : w_.layers) {
    AttentionWeights& A = L.attn;
    const auto ia = native_key_.find(&A.wq_a), ib = native_key_.find(&A.wkv);
    if (ia == native_key_.end() || ib == native_key_.end()) continue;
    ++layers;
    NativeMatrix* a = native_w_.count(ia->second) ? &native_w_.at(ia->second) : nullptr;
    NativeMatrix* b = native_w_.count(ib->second) ? &native_w_.at(ib->second) : nullptr;
    // The scale rows concatenate only when wq_a ends on a whole scale block.
    if (!a || !b || !standard(*a) || !standard(*b) || a->k != b->k || a->w_block != b->w_block ||
        a->act_block != b->act_block || a->n % a->w_block != 0 || a->n + b->n >= (int64_t(1) << 30))
      continue;
    DevArray<uint8_t> codes, scales;
    FS_RETURN_IF_ERROR(codes.reserve(size_t(a->code_bytes + b->code_bytes), false));
    FS_RETURN_IF_ERROR(scales.reserve(size_t(a->scale_bytes + b->scale_bytes), false));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(codes.get(), a->codes.get(), size_t(a->code_bytes), cudaMemcpyDeviceToDevice));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(codes.get() + a->code_bytes, b->codes.get(), size_t(b->code_bytes),
                                       cudaMemcpyDeviceToDevice));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(scales.get(), a->scales.get(), size_t(a->scale_bytes), cudaMemcpyDeviceToDevice));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(scales.get() + a->scale_bytes, b->scales.get(), size_t(b->scale_bytes),
                                       cudaMemcpyDeviceToDevice));
    // Re-keyed node by node: the matrices keep their addresses (stacked_with stays valid).
    auto ha = native_w_.extract(ia->second), hb = native_w_.extract(ib->second);
    NativeMatrix &ma = ha.mapped(), &mb = hb.mapped();
    ma.codes = std::move(codes), ma.scales = std::move(scales);  // the old arrays are freed at scope end
    {  // wkv's own arrays freed: it reads its rows in ma's allocation from here on
      DevArray<uint8_t> dead_codes = std::move(mb.codes), dead_scales = std::move(mb.scales);
    }
    mb.codes_view = ma.codes.get() + ma.code_bytes, mb.scales_view = ma.scales.get() + ma.scale_bytes;
    ma.tune_n = mb.tune_n = ma.n + mb.n;
    ma.stacked_with = &mb;
    ha.key() = reinterpret_cast<const float*>(ma.cptr()), hb.key() = reinterpret_cast<const float*>(mb.cptr());
    ia->second = ha.key(), ib->second = hb.key();
    native_w_.insert(std::move(ha)), native_w_.insert(std::move(hb));
    ++stacked_pairs_;
  }
  if (shard_.rank == 0)
    std::fprintf(stderr, "flashseek gpu: wq_a + wkv stacked in %lld of %lld layers\n",
                 static_cast<long long>(stacked_pairs_), static_cast<long long>(layers));
  return {};
}

Status GpuModel::up(Vec& v) {
  if (v.empty()) return {};
  DevArray<float> a;
  FS_RETURN_IF_ERROR(a.upload(v.data(), v.size()));
  report_.fp32_bytes += int64_t(a.capacity() * sizeof(float));
  dev_.emplace(&v, std::move(a));
  Vec().swap(v);  // the device copy is the only one from now on
  return {};
}

const float* GpuModel::d(const Vec& v) const {
  const auto it = dev_.find(&v);
  if (it != dev_.end()) return it->second.get();
  const auto nt = native_key_.find(&v);  // native matrix: its key for linear()
  return nt == native_key_.end() ? nullptr : nt->second;
}

void GpuModel::log_fallback(const std::string& what, const std::string& why) {
  std::string kind;  // the tensor name without layer / expert numbers: one line per kind and reason
  for (char ch : what) kind += std::isdigit(static_cast<unsigned char>(ch)) ? 'N' : ch;
  const std::string key = kind + ": " + why;
  if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
  logged_.push_back(key);
  std::fprintf(stderr, "flashseek gpu: %s: %s; kept as FP32 on the device\n", kind.c_str(), why.c_str());
}

Status GpuModel::up_matrix(Vec& v, const std::string& name, int64_t fast_act) {
  if (!native_) {
    if (!v.empty()) ++report_.fp32_matrices;
    return up(v);
  }
  if (!deferred_.count(name)) return {};  // not part of this checkpoint's model (role, absent draft)
  // A tensor-parallel rank: its rows / columns of a split matrix; nothing of another rank's.
  const TpSlice sl = tp_slice_for(name, config(), shard_);
  if (sl.kind == TpSlice::kNone) return {};
  const bool sliced = sl.kind == TpSlice::kRows || sl.kind == TpSlice::kCols;
  const SliceAxis axis = sl.kind == TpSlice::kCols ? SliceAxis::kCols : SliceAxis::kRows;
  uploaded_.insert(name);
  NativeMatrix m;
  std::span<const uint8_t> data, scale;
  std::string why = plan_stored(*ck_, name, m, data, scale);
  StoredSlice part;  // the rank's stored bytes: rows in the checkpoint's map, columns gathered here
  if (why.empty() && sliced) {
    auto s = slice_stored(stored_view(m, data, scale), axis, sl.start, sl.count);
    if (s.ok()) {
      part = std::move(s).value();
      data = part.codes(), scale = part.scales();
      m.n = part.n, m.k = part.k;
      m.code_bytes = int64_t(data.size()), m.scale_bytes = int64_t(scale.size());
    } else {  // e.g. a slice inside a scale block (tiny configs): never a wrong slice, an FP32 one
      why = fmt::format("rank {} of {}: {}; this rank's slice is dequantised on the host", shard_.rank, shard_.world,
                        s.status().message());
    }
  }
  if (!why.empty()) {  // an FP32 copy of this one matrix or slice (dequantised on the host, then freed)
    log_fallback(name, why);
    FS_ASSIGN_OR_RETURN(Vec f, ck_->dequant_f32(name));
    if (sliced) {
      FS_ASSIGN_OR_RETURN(const Shape shape, ck_->logical_shape(name));
      if (shape.size() != 2) return invalid_argument("tensor {}: a split matrix, stored as {}", name, shape_to_string(shape));
      FS_RETURN_IF_ERROR(slice_f32(f, shape[0], shape[1], axis, sl.start, sl.count, name.c_str()));
    }
    DevArray<float> a;
    FS_RETURN_IF_ERROR(a.upload(f.data(), f.size()));
    ++report_.fp32_matrices;
    report_.fp32_bytes += int64_t(a.capacity() * sizeof(float));
    ++report_.fallback_matrices;
    report_.fallback_bytes += int64_t(a.capacity() * sizeof(float));
    dev_.emplace(&v, std::move(a));
    return {};
  }
  if (stager_ && !part.gathered) {  // as stored, through the pinned staging of GpuModel::load
    FS_RETURN_IF_ERROR(m.codes.reserve(data.size(), false));
    FS_RETURN_IF_ERROR(stager_->copy(m.codes.get(), data.data(), data.size()));
    if (!scale.empty()) {
      FS_RETURN_IF_ERROR(m.scales.reserve(scale.size(), false));
      FS_RETURN_IF_ERROR(stager_->copy(m.scales.get(), scale.data(), scale.size()));
    }
  } else {
    FS_RETURN_IF_ERROR(m.codes.upload(data.data(), data.size()));
    if (!scale.empty()) FS_RETURN_IF_ERROR(m.scales.upload(scale.data(), scale.size()));
  }
  m.act_block = fast_act;
  m.fast = fast_fits(m, fast_act);
  ++report_.stored_matrices;
  report_.fast_matrices += m.fast;
  report_.stored_bytes += int64_t(m.codes.capacity() + m.scales.capacity());
  report_.checkpoint_bytes += int64_t(data.size() + scale.size());
  const float* key = reinterpret_cast<const float*>(m.codes.get());
  native_key_[&v] = key;
  native_w_.emplace(key, std::move(m));
  Vec().swap(v);
  return {};
}

Status GpuModel::up_f32_matrix(Vec& v, const std::string& name) {
  if (native_ && deferred_.count(name)) {
    auto t = ck_->find(name);
    if (t.ok() && t.value().dtype != DType::kF32) {  // the kernel reads FP32: an FP32 copy
      log_fallback(name, fmt::format("stored as {}, read as FP32 by the mHC kernels", dtype_name(t.value().dtype)));
      uploaded_.insert(name);
      FS_ASSIGN_OR_RETURN(Vec f, ck_->dequant_f32(name));
      DevArray<float> a;
      FS_RETURN_IF_ERROR(a.upload(f.data(), f.size()));
      ++report_.fp32_matrices;
      report_.fp32_bytes += int64_t(a.capacity() * sizeof(float));
      ++report_.fallback_matrices;
      report_.fallback_bytes += int64_t(a.capacity() * sizeof(float));
      dev_.emplace(&v, std::move(a));
      return {};
    }
  }
  return up_matrix(v, name);  // F32 as stored: the key is the FP32 data itself
}

Status GpuModel::up_experts(std::vector<Vec>& w1, std::vector<Vec>& w2, std::vector<Vec>& w3, const std::string& p,
                            int64_t fast_act, std::vector<DevArray<float>>& stacks, std::array<const float*, 3>& keys) {
  std::vector<Vec>* src[3] = {&w1, &w2, &w3};
  keys = {nullptr, nullptr, nullptr};
  const int64_t E = int64_t(w1.size());
  if (E == 0) return {};
  const char* proj[3] = {"w1", "w2", "w3"};
  // A tensor-parallel rank holds experts [expert0, expert0 + E) of the backbone's layers (the lists
  // were cut by shard_weights; the others are never read); draft stages run on one GPU only.
  const int64_t e0 = p.rfind("layers.", 0) == 0 ? shard_.expert0 : 0;
  bool stored = native_;
  NativeMatrix mats[3];
  std::vector<std::span<const uint8_t>> data[3], scale[3];
  for (int j = 0; j < 3 && stored; ++j) {  // every expert of a projection: one format and shape
    for (int64_t e = 0; e < E && stored; ++e) {
      const std::string name = fmt::format("{}{}.{}.weight", p, e0 + e, proj[j]);
      NativeMatrix m;
      std::span<const uint8_t> d, s;
      std::string why = deferred_.count(name) ? plan_stored(*ck_, name, m, d, s) : "not deferred by the loader";
      if (why.empty() && e > 0 &&
          (m.dtype != mats[j].dtype || m.n != mats[j].n || m.k != mats[j].k || m.block_rows != mats[j].block_rows ||
           m.block_cols != mats[j].block_cols || m.scale_bytes != mats[j].scale_bytes))
        why = "experts differ in format or shape";
      if (!why.empty()) {
        log_fallback(name, why);
        stored = false;
        break;
      }
      if (e == 0) mats[j] = std::move(m);
      data[j].push_back(d);
      scale[j].push_back(s);
    }
  }
  stacks.resize(3);
  if (!stored) {  // FP32 stacks [E, out, in] (fp32 mode; a native fallback dequantises here)
    for (int j = 0; j < 3; ++j) {
      std::vector<Vec>& ws = *src[j];
      for (int64_t e = 0; e < E; ++e) {
        if (ws[size_t(e)].empty()) {
          const std::string name = fmt::format("{}{}.{}.weight", p, e0 + e, proj[j]);
          FS_ASSIGN_OR_RETURN(ws[size_t(e)], ck_->dequant_f32(name));
          uploaded_.insert(name);
        }
      }
      const size_t each = ws[0].size();
      DevArray<float>& out = stacks[size_t(j)];
      FS_RETURN_IF_ERROR(out.reserve(std::max<size_t>(1, each * ws.size()), false));
      for (size_t e = 0; e < ws.size(); ++e) {
        if (ws[e].size() != each)
          return invalid_argument("{}{}.{}.weight: experts differ in shape", p, int64_t(e) + e0, proj[j]);
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.get() + e * each, ws[e].data(), each * 4, cudaMemcpyHostToDevice));
        Vec().swap(ws[e]);
      }
      report_.fp32_matrices += E;
      report_.fp32_bytes += int64_t(out.capacity() * sizeof(float));
      if (native_) {  // the stored experts fell back (logged above)
        report_.fallback_matrices += E;
        report_.fallback_bytes += int64_t(out.capacity() * sizeof(float));
      }
      keys[size_t(j)] = out.get();
    }
    return {};
  }
  for (int j = 0; j < 3; ++j) {  // the stored bytes straight from the mapped checkpoint
    NativeMatrix& m = mats[j];
    m.count = E;
    FS_RETURN_IF_ERROR(m.codes.reserve(size_t(m.code_bytes * E), false));
    if (m.scale_bytes) FS_RETURN_IF_ERROR(m.scales.reserve(size_t(m.scale_bytes * E), false));
    for (int64_t e = 0; e < E; ++e) {
      const auto& d = data[j][size_t(e)];
      const auto& s = scale[j][size_t(e)];
      if (stager_) {  // as stored, through the pinned staging of GpuModel::load
        FS_RETURN_IF_ERROR(stager_->copy(m.codes.get() + e * m.code_bytes, d.data(), d.size()));
        if (!s.empty()) FS_RETURN_IF_ERROR(stager_->copy(m.scales.get() + e * m.scale_bytes, s.data(), s.size()));
      } else {
        FS_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(m.codes.get() + e * m.code_bytes, d.data(), d.size(), cudaMemcpyHostToDevice));
        if (!s.empty())
          FS_CUDA_RETURN_IF_ERROR(
              cudaMemcpy(m.scales.get() + e * m.scale_bytes, s.data(), s.size(), cudaMemcpyHostToDevice));
      }
      report_.checkpoint_bytes += int64_t(d.size() + s.size());
      uploaded_.insert(fmt::format("{}{}.{}.weight", p, e0 + e, proj[j]));
    }
    m.act_block = fast_act;
    m.fast = fast_fits(m, fast_act);
    report_.stored_matrices += E;
    report_.fast_matrices += m.fast ? E : 0;
    report_.stored_bytes += int64_t(m.codes.capacity() + m.scales.capacity());
    const float* key = reinterpret_cast<const float*>(m.codes.get());
    keys[size_t(j)] = key;
    native_w_.emplace(key, std::move(m));
    for (Vec& v : *src[j]) Vec().swap(v);
  }
  // The block-scaled expert GEMV runs all three or none (moe_native).
  const bool all_fast = native(keys[0])->fast && native(keys[1])->fast && native(keys[2])->fast;
  for (const float* k : keys) native_w_.at(k).fast = all_fast;
  // The fragment order for all three or none (the gated launch reads gate and up one way).
  bool frag = fp4_fragments_ && all_fast;
  for (const float* k : keys) {
    const NativeMatrix& m = native_w_.at(k);
    frag = frag && m.format == ops::WeightFormat::kFp4 && ops::fp4_fragment_shape_ok(m.n, m.k) &&
           m.code_bytes == m.n * (m.k / 2) && m.scale_bytes == m.n * (m.k / 32);
  }
  if (frag) fragment_pending_.insert(fragment_pending_.end(), keys.begin(), keys.end());
  return {};
}

Status GpuModel::pack_expert_fragments() {
  // In place, a chunk of experts at a time: the chunk's bytes copied to scratch, packed back.
  constexpr int64_t kChunkBytes = int64_t(256) << 20;
  DevArray<uint8_t> tmp_c, tmp_s;
  for (const float* key : fragment_pending_) {
    NativeMatrix& m = native_w_.at(key);
    const int64_t per = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(m.code_bytes, 1));
    FS_RETURN_IF_ERROR(tmp_c.reserve(size_t(std::min(per, m.count) * m.code_bytes), false));
    FS_RETURN_IF_ERROR(tmp_s.reserve(size_t(std::min(per, m.count) * m.scale_bytes), false));
    for (int64_t e0 = 0; e0 < m.count; e0 += per) {
      const int64_t cnt = std::min(per, m.count - e0);
      uint8_t* c = m.codes.get() + e0 * m.code_bytes;
      uint8_t* s = m.scales.get() + e0 * m.scale_bytes;
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(tmp_c.get(), c, size_t(cnt * m.code_bytes), cudaMemcpyDeviceToDevice));
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(tmp_s.get(), s, size_t(cnt * m.scale_bytes), cudaMemcpyDeviceToDevice));
      // A stack of experts is one matrix of count · n rows in the order: tiles never cross experts.
      FS_RETURN_IF_ERROR(ops::cuda::pack_fp4_fragments_cuda(tmp_c.get(), tmp_s.get(), cnt * m.n, m.k, c, s, nullptr));
    }
    m.fragments = true;
    ++gstats_.fp4_fragment_stacks;
  }
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  fragment_pending_.clear();
  return {};
}

Status GpuModel::pack_dense_fragments() {
  if (!fp8_fragments_) return {};
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // every upload has landed
  DevArray<uint8_t> tmp;
  for (auto& [key, m] : native_w_) {
    // Dense block-scaled FP8 matrices that own their codes (not a stacked pair, whose launch reads
    // row-major rows: neither the matrix holding the pair, stacked_with, nor the one viewing into
    // it, codes_view).
    if (!m.fast || m.count != 1 || m.fragments || m.format != ops::WeightFormat::kFp8 ||
        m.dtype != cd::WeightDtype::kFp8 || m.stacked_with || m.codes_view || !ops::fp8_fragment_shape_ok(m.n, m.k) ||
        m.code_bytes != m.n * m.k || int64_t(m.codes.capacity()) < m.code_bytes)
      continue;
    FS_RETURN_IF_ERROR(tmp.reserve(size_t(m.code_bytes), false));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(tmp.get(), m.codes.get(), size_t(m.code_bytes), cudaMemcpyDeviceToDevice));
    FS_RETURN_IF_ERROR(ops::cuda::pack_fp8_fragments_cuda(tmp.get(), m.n, m.k, m.codes.get(), nullptr));
    m.fragments = true;
    ++gstats_.fp8_fragment_matrices;
  }
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return {};
}

Status GpuModel::read_fragments(const NativeMatrix& w, const uint8_t*& codes, bool& packed, bool tiled,
                                const std::string& name) {
  if (!w.fragments || w.format != ops::WeightFormat::kFp8) return {};
  if (!tiled) {
    packed = true;
    return {};
  }
  FS_ASSIGN_OR_RETURN(codes, row_major_codes(w, name));
  return {};
}

Result<const uint8_t*> GpuModel::row_major_codes(const NativeMatrix& w, const std::string& name) {
  if (!w.fragments || w.format != ops::WeightFormat::kFp8) return w.cptr();
  if (w.count != 1) return internal_error("row_major_codes: a stack of {} FP8 matrices in the fragment order", w.count);
  FS_ASSIGN_OR_RETURN(uint8_t* out, scratch<uint8_t>(name, w.code_bytes));
  FS_RETURN_IF_ERROR(ops::cuda::unpack_fp8_fragments_cuda(w.cptr(), w.n, w.k, out, stream_));
  ++gstats_.fp8_fragment_unpacks;
  return static_cast<const uint8_t*>(out);
}

int64_t GpuModel::weight_bytes() const { return report_.stored_bytes + report_.fp32_bytes; }

void GpuModel::print_weight_report() {
  GpuWeightReport& r = report_;
  r.checkpoint_total_bytes = 0;
  for (const std::string& name : ck_->shards().names()) {  // Engram tables (and their scales) stay on the host
    if (name.find(".engram.embed.") != std::string::npos) continue;
    if (auto t = ck_->find(name); t.ok()) r.checkpoint_total_bytes += int64_t(t.value().data.size());
  }
  const double mib = 1.0 / (1 << 20);
  if (shard_.split()) {  // one line per rank: its slices as stored (== their checkpoint bytes) + FP32
    std::fprintf(stderr,
                 "flashseek gpu: rank %d of %d weights (%s) on device %d: %.2f MiB; %.2f MiB as stored in %lld "
                 "matrices (%.2f MiB of this rank's slices in the checkpoint), %.2f MiB FP32 (%lld matrices, of which "
                 "%lld fell back from the stored format: %.2f MiB)\n",
                 shard_.rank, shard_.world, native_ ? "native" : "fp32", device_, double(weight_bytes()) * mib,
                 double(r.stored_bytes) * mib, static_cast<long long>(r.stored_matrices),
                 double(r.checkpoint_bytes) * mib, double(r.fp32_bytes) * mib,
                 static_cast<long long>(r.fp32_matrices), static_cast<long long>(r.fallback_matrices),
                 double(r.fallback_bytes) * mib);
    return;
  }
  std::fprintf(stderr,
               "flashseek gpu: weights (%s) on device %d: %.2f MiB (checkpoint tensors without the Engram tables, "
               "which stay in host memory: %.2f MiB); %.2f MiB as stored in %lld matrices (%.2f MiB of the same "
               "tensors in the checkpoint), %.2f MiB FP32 (%lld matrices; vectors, norms, biases, sinks, RoPE "
               "tables)\n",
               native_ ? "native" : "fp32", device_, double(weight_bytes()) * mib,
               double(r.checkpoint_total_bytes) * mib, double(r.stored_bytes) * mib,
               static_cast<long long>(r.stored_matrices), double(r.checkpoint_bytes) * mib,
               double(r.fp32_bytes) * mib, static_cast<long long>(r.fp32_matrices));
}

Status GpuModel::upload_weights() {
  deferred_ = std::unordered_set<std::string>(w_.deferred_matrices.begin(), w_.deferred_matrices.end());
  auto comp = [&](CompressorWeights& w, const std::string& p) -> Status {
    FS_RETURN_IF_ERROR(up_matrix(w.wkv, p + "wkv.weight"));
    FS_RETURN_IF_ERROR(up_matrix(w.wgate, p + "wgate.weight"));
    for (Vec* v : {&w.ape, &w.norm}) FS_RETURN_IF_ERROR(up(*v));
    return {};
  };
  FS_RETURN_IF_ERROR(up_matrix(w_.embed, "embed.weight"));
  FS_RETURN_IF_ERROR(up_matrix(w_.head, "head.weight"));
  FS_RETURN_IF_ERROR(up_f32_matrix(w_.hc_head_fn, "hc_head_fn"));
  for (Vec* v : {&w_.norm, &w_.hc_head_base, &w_.hc_head_scale}) FS_RETURN_IF_ERROR(up(*v));
  const size_t nl = w_.layers.size();
  w1_.resize(nl), w2_.resize(nl), w3_.resize(nl), tid2eid_.resize(nl), experts_.resize(nl);
  for (size_t l = 0; l < nl; ++l) {
    LayerWeights& L = w_.layers[l];
    const std::string p = fmt::format("layers.{}.", l);
    // The linears that always run with FP8 activations (act_block_, reference numerics) may use
    // the block-scaled GEMV; every other matrix runs through the exactness kernel.
    using R = GpuLinearRole;  // GpuLoadOptions::fast_linears: the roles that may use the GEMVs
    const auto fa = [&](R r) { return fast_act(r, act_block_); };
    AttentionWeights& A = L.attn;
    FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_attn_fn, p + "hc_attn_fn"));
    FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_ffn_fn, p + "hc_ffn_fn"));
    FS_RETURN_IF_ERROR(up_matrix(A.wq_a, p + "attn.wq_a.weight", fa(R::kAttnWqA)));
    FS_RETURN_IF_ERROR(up_matrix(A.wq_b, p + "attn.wq_b.weight", fa(R::kAttnWqB)));
    FS_RETURN_IF_ERROR(up_matrix(A.wkv, p + "attn.wkv.weight", fa(R::kAttnWkv)));
    FS_RETURN_IF_ERROR(up_matrix(A.wo_a, p + "attn.wo_a.weight"));  // grouped, BF16 inputs: exactness kernel
    FS_RETURN_IF_ERROR(up_matrix(A.wo_b, p + "attn.wo_b.weight", fa(R::kAttnWoB)));
    FS_RETURN_IF_ERROR(up_matrix(A.idx_wq_b, p + "attn.indexer.wq_b.weight", fa(R::kIndexerWqB)));
    FS_RETURN_IF_ERROR(up_matrix(A.idx_weights_proj, p + "attn.indexer.weights_proj.weight"));
    FS_RETURN_IF_ERROR(up_matrix(A.idx_wk, p + "attn.indexer.wk.weight"));
    for (Vec* v : {&L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_base, &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm,
                   &A.q_norm, &A.kv_norm, &A.attn_sink, &A.idx_k_norm, &A.rope_inv_freq})
      FS_RETURN_IF_ERROR(up(*v));
    FS_RETURN_IF_ERROR(comp(A.compressor, p + "attn.compressor."));
    FS_RETURN_IF_ERROR(comp(A.idx_compressor, p + "attn.indexer.compressor."));
    FfnWeights& F = L.ffn;
    FS_RETURN_IF_ERROR(up_matrix(F.gate, p + "ffn.gate.weight"));
    FS_RETURN_IF_ERROR(up(F.bias));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w1, p + "ffn.shared_experts.w1.weight", fa(R::kSharedExperts)));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w2, p + "ffn.shared_experts.w2.weight", fa(R::kSharedExperts)));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w3, p + "ffn.shared_experts.w3.weight", fa(R::kSharedExperts)));
    std::vector<DevArray<float>> stacks;
    FS_RETURN_IF_ERROR(up_experts(F.w1, F.w2, F.w3, p + "ffn.experts.", fast_act(R::kRoutedExperts, expert_act_block_),
                                  stacks, experts_[l]));
    if (!stacks.empty()) w1_[l] = std::move(stacks[0]), w2_[l] = std::move(stacks[1]), w3_[l] = std::move(stacks[2]);
    if (!F.tid2eid.empty()) FS_RETURN_IF_ERROR(tid2eid_[l].upload(F.tid2eid.data(), F.tid2eid.size()));
    FS_RETURN_IF_ERROR(up_matrix(L.engram.wkv, p + "engram.wkv.weight", fa(R::kEngramWkv)));
    FS_RETURN_IF_ERROR(up(L.engram.wqk));  // q_weight ⊙ k_weight, an FP32 product (weights.h)
  }
  if (engram_device_) {  // --engram-tables device: each table as stored (FP8 codes + E8M0 scales)
    uint64_t bytes = 0;
    for (int l = 0; l < int(w_.layers.size()); ++l) {
      if (!w_.layers[size_t(l)].has_engram) continue;
      const std::string& name = w_.layers[size_t(l)].engram.table;
      NativeMatrix t;
      std::span<const uint8_t> data, scale;
      std::string why = plan_stored(*ck_, name, t, data, scale);
      if (why.empty() && t.n > int64_t(INT32_MAX)) why = "more rows than 32-bit row ids address";
      if (!why.empty()) {
        std::fprintf(stderr, "flashseek gpu: %s: %s; its rows are gathered on the host\n", name.c_str(), why.c_str());
        continue;
      }
      FS_RETURN_IF_ERROR(t.codes.reserve(data.size(), false));
      if (!scale.empty()) FS_RETURN_IF_ERROR(t.scales.reserve(scale.size(), false));
      if (stager_) {
        FS_RETURN_IF_ERROR(stager_->copy(t.codes.get(), data.data(), data.size()));
        if (!scale.empty()) FS_RETURN_IF_ERROR(stager_->copy(t.scales.get(), scale.data(), scale.size()));
      } else {
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.codes.get(), data.data(), data.size(), cudaMemcpyHostToDevice));
        if (!scale.empty())
          FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(t.scales.get(), scale.data(), scale.size(), cudaMemcpyHostToDevice));
      }
      bytes += data.size() + scale.size();
      engram_dev_.emplace(l, std::move(t));
    }
    std::fprintf(stderr, "flashseek gpu: %zu Engram table(s) on device %d as stored: %.2f MiB\n", engram_dev_.size(),
                 device_, double(bytes) / (1 << 20));
  }
  if (has_draft() && w_.has_dspark) FS_RETURN_IF_ERROR(upload_draft_weights());
  if (mtp_state()) FS_RETURN_IF_ERROR(upload_mtp_weights());  // V4 MTP (gpu_mtp.cpp)
  // Every matrix the loader left to this backend went up, except what the rank has no slice of
  // (tp_slice_for: other ranks' experts; on ranks > 0 the shared expert and the draft).
  for (const std::string& name : w_.deferred_matrices)
    if (!uploaded_.count(name) && tp_slice_for(name, config(), shard_).kind != TpSlice::kNone)
      return internal_error("gpu weights: matrix {} was not uploaded", name);
  return {};
}

// A side branch's ops take their own scratch buffers (per lane): the ops of the branches use the
// same names (e.g. a linear's pre-quantised input) and may run at the same time.
template <typename T>
Result<T*> GpuModel::scratch(const std::string& name, int64_t n) {
  auto& a = on_lane_ < 0 ? scratch_[name] : scratch_[name + (on_lane_ == 0 ? "|side" : "|side1")];
  FS_RETURN_IF_ERROR(a.reserve(std::max<size_t>(16, size_t(n) * sizeof(T)), false, /*geometric=*/true));
  return reinterpret_cast<T*>(a.get());
}
template Result<float*> GpuModel::scratch<float>(const std::string&, int64_t);
template Result<int32_t*> GpuModel::scratch<int32_t>(const std::string&, int64_t);
template Result<int64_t*> GpuModel::scratch<int64_t>(const std::string&, int64_t);
template Result<uint8_t*> GpuModel::scratch<uint8_t>(const std::string&, int64_t);
template Result<const float**> GpuModel::scratch<const float*>(const std::string&, int64_t);
template Result<uint8_t**> GpuModel::scratch<uint8_t*>(const std::string&, int64_t);

// Side branches run on their own stream only in decode-sized steps (run_items' rows at most
// kGpuGraphMaxTokens), whose kernels leave most of the device idle; larger steps and the drafts'
// forwards keep one stream. A fork is made only from the main branch (a begin inside a side part,
// or on a lane already open, issues the branch in line), so at most one lane's side part is being
// issued at a time.
Status GpuModel::side_begin(int lane) {
  if (lane < 0 || lane >= kLanes) return internal_error("side_begin: lane {} outside [0, {})", lane, kLanes);
  const size_t l = size_t(lane);
  if (!side_stream_[l] || side_open_[l] || on_lane_ >= 0 || step_rows_ < 0 || step_rows_ > kGpuGraphMaxTokens)
    return {};
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::stream_order(main_stream_, side_stream_[l], fork_ev_[l], /*join=*/false, lane));
  side_open_[l] = true;
  on_lane_ = lane;
  stream_ = side_stream_[l];
  return {};
}

Status GpuModel::side_end(int lane) {
  if (lane < 0 || lane >= kLanes) return internal_error("side_end: lane {} outside [0, {})", lane, kLanes);
  if (on_lane_ == lane) on_lane_ = -1, stream_ = main_stream_;
  return {};
}

Status GpuModel::side_join(int lane) {
  if (lane < 0 || lane >= kLanes) return internal_error("side_join: lane {} outside [0, {})", lane, kLanes);
  const size_t l = size_t(lane);
  if (on_lane_ == lane) on_lane_ = -1, stream_ = main_stream_;
  if (!side_open_[l]) return {};
  side_open_[l] = false;
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::stream_order(side_stream_[l], main_stream_, join_ev_[l], /*join=*/true, lane));
  return {};
}

Status GpuModel::linear(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
                        int64_t act_block, bool bf16_out, bool bf16_in, const int32_t* sel, int64_t x_row_div,
                        bool x_bf16) {
  if (!w) return internal_error("gpu linear: missing weight ({}x{})", out, in);
  const NativeMatrix* nw = native(w);
  if (nw && nw->fast && !sel && x_row_div == 1 && act_block == nw->act_block)
    return linear_native(*nw, x, rows, in, out, y, act_block, bf16_out, bf16_in, sel, x_row_div);
  if (nw && (in != nw->k || out != nw->n))
    return internal_error("gpu linear: stored {}x{} matrix used as {}x{}", nw->n, nw->k, out, in);
  if (nw && nw->fragments)  // the exactness kernels read row-major rows
    return internal_error("gpu linear: a {}x{} matrix in the fragment order reached the exactness kernel", nw->n, nw->k);
  if (act_block > 0 || bf16_in) {
    if (act_block > 0 && in % act_block != 0)
      return invalid_argument("gpu linear: input width {} is not a multiple of the activation block {}", in, act_block);
    const int64_t xr = (rows + x_row_div - 1) / x_row_div;
    FS_ASSIGN_OR_RETURN(float* xq, scratch<float>("linear_xq", xr * in));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(xq, x, size_t(xr * in) * 4, cudaMemcpyDeviceToDevice, stream_));
    if (bf16_in) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(xq, xr, in, in, 1, cd::QuantSim::kBf16, stream_));
    if (act_block > 0) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(xq, xr, in, in, act_block, cd::QuantSim::kFp8, stream_));
    x = xq;
  }
  cd::LinearArgs a;
  a.x = x, a.y = y, a.sel = sel, a.rows = rows, a.in = in, a.out = out, a.x_row_div = x_row_div;
  set_weight(a, w, 0);
  a.bf16_out = bf16_out;
  a.x_bf16 = x_bf16 && tensor_core_linears_;  // x holds BF16 values: the tensor-core linear may run
  a.mma_decode_tiles = mma_decode_tiles_;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_linear(a, stream_));
  return {};
}

void GpuModel::set_weight(cd::LinearArgs& a, const float* w, int64_t row0) const {
  if (const NativeMatrix* nw = native(w)) {
    a.w = nullptr;
    a.wt = nw->ref(row0);
  } else {
    a.w = w ? w + row0 * a.in : nullptr;
  }
}

Status GpuModel::embed_rows(const float* table, const int32_t* tokens, float* X, int64_t T, int64_t hc, int64_t D) {
  if (const NativeMatrix* nw = native(table)) {
    if (nw->k != D) return internal_error("gpu embed: stored table rows of {} values, expected {}", nw->k, D);
    FS_CUDA_RETURN_IF_ERROR(cd::launch_embed_w(nw->ref(), tokens, X, T, hc, D, stream_));
    return {};
  }
  if (!table) return internal_error("gpu embed: missing table");
  FS_CUDA_RETURN_IF_ERROR(cd::launch_embed(table, tokens, X, T, hc, D, stream_));
  return {};
}

// A native FP8 matrix: y = bf16?(fq8(bf16?(x)) · dq(W)ᵀ) by the block-scaled GEMV kernel (ops/cuda/gemv.h),
// the numerics of the FP32 path's quant_sim + FP32 dot (only the summation order differs).
Status GpuModel::linear_native(const NativeMatrix& nw, const float* x, int64_t rows, int64_t in, int64_t out,
                               float* y, int64_t act_block, bool bf16_out, bool bf16_in, const int32_t* sel,
                               int64_t x_row_div) {
  if (sel || x_row_div != 1 || in != nw.k || out != nw.n || act_block != nw.act_block)
    return internal_error("gpu linear: native {}x{} matrix (act block {}) used as {}x{} (act block {}{})", nw.n,
                          nw.k, nw.act_block, out, in, act_block, sel ? ", selected rows" : "");
  // The BF16 roundings of x and y happen inside the GEMV (and its pre-quantisation): x is not
  // touched, y is FP32 holding the BF16-rounded values; the same bits as a kBf16 quant_sim on a
  // copy of x before and on y after.
  ops::BlockLinearParams p;
  p.x = x, p.w = nw.cptr(), p.w_scale = nw.sptr(), p.y = y;
  p.m = rows, p.n = out, p.k = in, p.format = nw.format, p.w_block = nw.w_block, p.act_block = act_block;
  p.bf16_in = bf16_in, p.bf16_round_out = bf16_out, p.tune_n = nw.tune_n;
  FS_RETURN_IF_ERROR(prequantize(p));
  FS_RETURN_IF_ERROR(read_fragments(nw, p.w, p.w_packed, p.xq && p.tiled, "linear_w_rows"));
  FS_RETURN_IF_ERROR(ops::cuda::block_linear_cuda(p, stream_));
  return {};
}

// Launches of at least gemv_prequant_min_rows_ rows quantise x once (gemv_quantize_cuda, with
// p.bf16_in) instead of in every CTA of the GEMV (the same bits); from gemv_tiled_min_rows_ rows
// the GEMV may then take its tiled kernel, below it the token passes over the codes.
Status GpuModel::prequantize(ops::BlockLinearParams& p) {
  if (p.m < gemv_prequant_min_rows_) return {};
  FS_ASSIGN_OR_RETURN(uint8_t* xq, scratch<uint8_t>("linear_xq8", p.m * p.k));
  FS_ASSIGN_OR_RETURN(float* xs, scratch<float>("linear_xs", p.m * (p.k / 32)));
  FS_RETURN_IF_ERROR(ops::cuda::gemv_quantize_cuda(p.x, p.m, p.k, p.act_block, p.bf16_in, xq, xs, stream_));
  p.xq = xq, p.xs = xs;
  p.tiled = p.m >= gemv_tiled_min_rows_;
  return {};
}

std::unique_ptr<SequenceState> GpuModel::new_sequence() const {
  const auto& c = config();
  auto st = std::make_unique<GpuSequenceState>();
  st->ring_size = c.window + kMaxRollback;  // spare slots: rolled-back rows never overwrite live ones
  st->layers.resize(size_t(c.num_layers));
  if (Status s = ops::cuda::cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) st->error = s;
  for (auto& l : st->layers) {
    if (!st->error.ok()) break;
    if (Status s = l.ring.zeros(size_t(st->ring_size * cache_fmt_.ring.row_bytes())); !s.ok()) st->error = s;
  }
  if (draft_rings()) st->draft_rings.resize(size_t(c.num_mtp_layers));
  for (auto& r : st->draft_rings)
    if (Status s = r.zeros(size_t(st->ring_size * c.head_dim)); st->error.ok() && !s.ok()) st->error = s;
  if (mtp_state() && st->error.ok())
    if (Status s = mtp_new_sequence(*st); !s.ok()) st->error = s;
  return st;
}

Status GpuModel::forward(std::span<BatchItem> batch, std::vector<float>& logits) {
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  ops::cuda::set_programmatic_launch(programmatic_launch_);
  ops::cuda::set_gemv_fp4_chunk(gemv_fp4_chunk_);
  const int64_t V = config().vocab_size;
  bool small = graphs_ && !batch.empty();
  for (auto& item : batch) {  // checks first: a capture never starts on bad input
    auto* st = dynamic_cast<GpuSequenceState*>(item.state);
    if (!st) return invalid_argument("forward: batch item has no GPU sequence state");
    if (!st->error.ok()) return st->error;
    if (item.tokens.empty()) return invalid_argument("forward: a batch item has no tokens");
    for (int32_t t : item.tokens)
      if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
    small = small && int64_t(item.tokens.size()) <= kGpuGraphMaxTokens;
  }
  ++gstats_.forwards;
  timed_ = true;  // decode-sized (host and wait time accumulated by finish_forward)
  for (auto& item : batch) timed_ = timed_ && int64_t(item.tokens.size()) <= kGpuGraphMaxTokens;
  fwd_t0_ = std::chrono::steady_clock::now();
  const size_t off0 = logits.size();
  if (small) {
    ++gstats_.eligible;
    bool ran = false;
    Status s = forward_graph(batch, logits, ran);
    if (ran || !s.ok()) return s;
    ++gstats_.eager_fallbacks;
  }
  Status s = run_items(batch, logits);
  Status f = finish_forward(logits);  // always: waits for what was queued, rewinds the staging
  if (!s.ok() || !f.ok()) {
    logits.resize(off0);
    return s.ok() ? f : s;
  }
  return {};
}

// The first row of the step whose sequences take a prefill GEMM of threshold `min_tokens`
// (GpuLoadOptions::moe_gemm_min_tokens / dense_gemm_min_tokens), the flow having put the
// sequences in the order of their row counts (rows_by_length); T (none) when the GEMM is off or
// no sequence is long enough.
static int64_t gemm_row0(std::vector<int64_t> rows, int64_t min_tokens) {
  std::stable_sort(rows.begin(), rows.end());
  int64_t row = 0;
  const int64_t need = std::max(min_tokens, kGpuGraphMaxTokens + 1);
  for (const int64_t n : rows) {
    if (min_tokens > 0 && n >= need) return row;
    row += n;
  }
  return row;
}

Status GpuModel::run_items(std::span<BatchItem> batch, std::vector<float>& logits) {
  for (auto& item : batch)
    if (item.sample && item.all_logits) return invalid_argument("forward: an item cannot ask for all logits and a sample");
  // The step's rows, for the per-sequence choice of the prefill GEMMs (reset on every exit).
  struct StepRows {
    GpuModel* m;
    ~StepRows() { m->step_rows_ = -1, m->dense_row0_ = m->moe_row0_ = 0; }
  } reset{this};
  std::vector<int64_t> rows;
  for (const BatchItem& it : batch) rows.push_back(int64_t(it.tokens.size()));
  step_rows_ = 0;
  for (const int64_t n : rows) step_rows_ += n;
  dense_row0_ = gemm_row0(rows, dense_gemm_min_tokens_);
  moe_row0_ = gemm_row0(rows, moe_gemm_min_tokens_);
  return Forward(flow_params(), *this).forward(batch, logits);
}

Status GpuModel::upload_staged(void* dst, const void* staged, size_t bytes) {
  if (bytes) FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(dst, staged, bytes, cudaMemcpyHostToDevice, stream_));
  return {};
}

Status GpuModel::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return {};
  FS_ASSIGN_OR_RETURN(void* h, staging_.alloc(bytes));
  std::memcpy(h, src, bytes);
  return upload_staged(dst, h, bytes);
}

Status GpuModel::download_logits(const float* d_logits, int64_t n, std::vector<float>& logits) {
  const size_t off = logits.size(), bytes = size_t(n) * 4;
  logits.resize(off + size_t(n));
  constexpr size_t kDirect = size_t(64) << 20;  // huge (prefill, all rows): straight into the vector
  if (bytes > kDirect && !capture_guard().active) {
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(logits.data() + off, d_logits, bytes, cudaMemcpyDeviceToHost, stream_));
    return {};  // pageable destination: the copy has completed when the call returns
  }
  FS_ASSIGN_OR_RETURN(float* h, staging<float>(n));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(h, d_logits, bytes, cudaMemcpyDeviceToHost, stream_));
  pending_logits_.push_back({off, h, size_t(n)});
  return {};
}

Status GpuModel::queue_download(void* host_dst, const void* d_src, size_t bytes) {
  if (!bytes) return {};
  FS_ASSIGN_OR_RETURN(void* h, staging_.alloc(bytes));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(h, d_src, bytes, cudaMemcpyDeviceToHost, stream_));
  pending_bytes_.push_back({host_dst, h, bytes});
  return {};
}

Status GpuModel::queue_download_spread(std::span<void* const> dst, const void* d_src, size_t bytes) {
  if (dst.empty() || !bytes) return {};
  FS_ASSIGN_OR_RETURN(void* h, staging_.alloc(bytes * dst.size()));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(h, d_src, bytes * dst.size(), cudaMemcpyDeviceToHost, stream_));
  for (size_t i = 0; i < dst.size(); ++i) pending_bytes_.push_back({dst[i], static_cast<char*>(h) + i * bytes, bytes});
  return {};
}

Status GpuModel::finish_forward(std::vector<float>& logits) {
  const auto t1 = std::chrono::steady_clock::now();
  Status s = ops::cuda::cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (timed_) {
    const auto t2 = std::chrono::steady_clock::now();
    ++gstats_.timed;
    gstats_.host_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - fwd_t0_).count();
    gstats_.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
    timed_ = false;
  }
  if (s.ok()) {
    for (const PendingCopy& p : pending_logits_) std::memcpy(logits.data() + p.off, p.src, p.n * 4);
    for (const PendingBytes& p : pending_bytes_) std::memcpy(p.dst, p.src, p.bytes);
  }
  pending_logits_.clear();
  pending_bytes_.clear();
  Status r = staging_.rewind();
  return s.ok() ? r : s;
}

}  // namespace gpu
}  // namespace flashseek::forward

#else  // no CUDA in this build

namespace flashseek::forward {
bool gpu_backend_built() { return false; }
Result<uint64_t> gpu_memory_free(int device) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("--gpus {}: this build has no CUDA backend (configure with nvcc found)", device));
}
Result<std::unique_ptr<Model>> load_model_gpu(const std::string&, Numerics, int device, const GpuLoadOptions&) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("--gpus {}: this build has no CUDA backend (configure with nvcc found)", device));
}
}  // namespace flashseek::forward

#endif
