// Communicators of the tensor/expert-parallel model: host-staged (any devices) and NCCL.
#include "ops/cuda/runtime/comm.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/runtime/launch.cuh"

#if FLASHSEEK_HAVE_NCCL
#include <nccl.h>
#endif

namespace flashseek::ops::cuda {
namespace {

// A reusable barrier that can be aborted (std::barrier cannot wake its waiters with an error).
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  Status arrive_and_wait() {
    std::unique_lock lk(mu_);
    if (aborted_) return aborted();
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return {};
    }
    cv_.wait(lk, [&] { return gen_ != gen || aborted_; });
    return gen_ != gen ? Status{} : aborted();
  }
  void abort() {
    std::lock_guard lk(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  void recover() {
    std::lock_guard lk(mu_);
    aborted_ = false;
    arrived_ = 0;
    ++gen_;
  }

 private:
  static Status aborted() { return Status(StatusCode::kCancelled, "collective aborted: another rank failed"); }
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  bool aborted_ = false;
};

// Host-side votes of a group (Communicator::vote): rank r writes its bits to slot[call % 2][r],
// waits for the others, reads every rank's bits. A rank writes slot k % 2 again at call k + 2, after
// every rank has passed call k + 1's barrier, i.e. has read call k's bits.
struct VoteBoard {
  explicit VoteBoard(int w) : barrier(w) {
    for (auto& v : slot) v.assign(size_t(w), 0);
  }
  Status vote(int rank, uint64_t& calls, bool& all, bool& any) {
    std::vector<uint8_t>& v = slot[calls & 1];
    v[size_t(rank)] = uint8_t((all ? 1 : 0) | (any ? 2 : 0));
    FS_RETURN_IF_ERROR(barrier.arrive_and_wait());
    ++calls;  // only when every rank voted (an aborted vote is not counted anywhere)
    for (uint8_t b : v) {
      all = all && (b & 1);
      any = any || (b & 2);
    }
    return {};
  }
  AbortableBarrier barrier;
  std::vector<uint8_t> slot[2];
};

struct HostGroup {
  explicit HostGroup(int w) : world(w), barrier(w), bufs(size_t(w)), votes(w) {}
  const int world;
  AbortableBarrier barrier;
  std::vector<std::vector<float>> bufs;  // [rank] staged values
  VoteBoard votes;
};

class HostComm final : public Communicator {
 public:
  HostComm(std::shared_ptr<HostGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_->world; }
  std::string kind() const override { return "host"; }

  Status allreduce_sum(float* x, int64_t n, cudaStream_t s) override {
    if (n < 0) return invalid_argument("allreduce_sum: negative size {}", n);
    FS_RETURN_IF_ERROR(stage_in(x, n, s));
    // Every rank sums the staged rows in rank order (identical results everywhere).
    sum_.assign(size_t(n), 0.0f);
    for (int r = 0; r < g_->world; ++r) {
      const auto& b = g_->bufs[size_t(r)];
      if (b.size() != size_t(n)) return internal_error("allreduce_sum: rank {} sent {} values, rank {} {}", r, b.size(), rank_, n);
      if (r == 0) {
        std::copy(b.begin(), b.end(), sum_.begin());
      } else {
        for (size_t i = 0; i < size_t(n); ++i) sum_[i] += b[i];
      }
    }
    FS_RETURN_IF_ERROR(g_->barrier.arrive_and_wait());  // nobody rewrites a buffer still being read
    if (n) FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x, sum_.data(), size_t(n) * 4, cudaMemcpyHostToDevice, s));
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));  // sum_ is reused by the next call
    return {};
  }

  Status allgather(const float* send, int64_t n, float* recv, cudaStream_t s) override {
    if (n < 0) return invalid_argument("allgather: negative size {}", n);
    FS_RETURN_IF_ERROR(stage_in(send, n, s));
    for (int r = 0; r < g_->world; ++r) {
      const auto& b = g_->bufs[size_t(r)];
      if (b.size() != size_t(n)) return internal_error("allgather: rank {} sent {} values, rank {} {}", r, b.size(), rank_, n);
      if (n) FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv + r * n, b.data(), size_t(n) * 4, cudaMemcpyHostToDevice, s));
    }
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return g_->barrier.arrive_and_wait();
  }

  Status vote(bool& all, bool& any) override { return g_->votes.vote(rank_, votes_, all, any); }

  void abort() override {
    g_->barrier.abort();
    g_->votes.barrier.abort();
  }
  void recover() override {
    g_->barrier.recover();
    g_->votes.barrier.recover();
  }

 private:
  // Copies this rank's n values to its host buffer and waits until every rank has done so.
  Status stage_in(const float* x, int64_t n, cudaStream_t s) {
    auto& b = g_->bufs[size_t(rank_)];
    b.resize(size_t(n));
    if (n) FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.data(), x, size_t(n) * 4, cudaMemcpyDeviceToHost, s));
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return g_->barrier.arrive_and_wait();
  }

  std::shared_ptr<HostGroup> g_;
  const int rank_;
  std::vector<float> sum_;
  uint64_t votes_ = 0;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_host_comms(int world) {
  if (world < 1) return invalid_argument("host communicator: world size {} < 1", world);
  auto g = std::make_shared<HostGroup>(world);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<HostComm>(g, r));
  return out;
}

#if FLASHSEEK_HAVE_NCCL
namespace {

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return Status(StatusCode::kInternal, fmt::format("{}: {}", what, ncclGetErrorString(r)));
}
#define FS_NCCL_RETURN_IF_ERROR(expr) FS_RETURN_IF_ERROR(nccl_status((expr), #expr))

// Nodes of the graph that stream `s` is being captured into (false: not captured).
bool capture_nodes(cudaStream_t s, size_t& n) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaGraph_t g = nullptr;
  if (cudaStreamGetCaptureInfo(s, &cs, nullptr, &g, nullptr, nullptr, nullptr) != cudaSuccess ||
      cs != cudaStreamCaptureStatusActive || !g || cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t c, int rank, int world, int device, std::shared_ptr<VoteBoard> votes)
      : c_(c), rank_(rank), world_(world), device_(device), votes_(std::move(votes)) {}
  ~NcclComm() override {
    if (c_) ncclCommDestroy(c_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string kind() const override { return "nccl"; }
  Status allreduce_sum(float* x, int64_t n, cudaStream_t s) override {
    if (n < 0) return invalid_argument("allreduce_sum: negative size {}", n);
    if (aborted_) return Status(StatusCode::kCancelled, "collective aborted: another rank failed");
    return taped(x, x, n, kAllReduceSum, s, [&] { return ncclAllReduce(x, x, size_t(n), ncclFloat, ncclSum, c_, s); });
  }
  Status allgather(const float* send, int64_t n, float* recv, cudaStream_t s) override {
    if (n < 0) return invalid_argument("allgather: negative size {}", n);
    if (aborted_) return Status(StatusCode::kCancelled, "collective aborted: another rank failed");
    return taped(recv, send, n, kAllGather, s, [&] { return ncclAllGather(send, recv, size_t(n), ncclFloat, c_, s); });
  }
  // Later calls fail; ranks already waiting inside an NCCL kernel are not woken (rank failures
  // before the first collective of a step are the same on every rank: input checks).
  Status vote(bool& all, bool& any) override { return votes_->vote(rank_, vote_calls_, all, any); }
  void abort() override {
    aborted_ = true;
    votes_->barrier.abort();
  }
  void recover() override {
    aborted_ = false;
    votes_->barrier.recover();
  }

 private:
  enum : int { kAllReduceSum = 1, kAllGather = 2 };
  // Queues the collective through this thread's launch tape (comm.h kTapeCollective): patch mode
  // appends the op without calling NCCL; record mode lets NCCL capture its nodes and notes how many.
  template <typename F>
  Status taped(void* dst, const void* src, int64_t n, int what, cudaStream_t s, F&& call) {
    LaunchTape& t = launch_tape();
    size_t before = 0;
    if (t.mode == LaunchTape::kRecord && !capture_nodes(s, before)) t.failed = true;
    if (t.mode != LaunchTape::kPatch) {
      FS_NCCL_RETURN_IF_ERROR(call());
      if (t.mode == LaunchTape::kOff) return {};
    }
    TapeOp op;
    op.kind = TapeOp::Kind(kTapeCollective);
    op.dst = dst, op.src = src, op.count = size_t(n), op.aux = what;
    op.dpitch = size_t(reinterpret_cast<uintptr_t>(c_));
    size_t after = 0;
    if (t.mode == LaunchTape::kRecord) {
      if (!capture_nodes(s, after) || after < before) t.failed = true;
      op.grid.x = unsigned(after - before);  // the nodes NCCL added (none of them on the tape)
    }
    if (s != t.stream) t.failed = true;
    t.mix(uint64_t(kTapeCollective) * 0x9E3779B97F4A7C15ull ^ uint64_t(what));
    t.ops.push_back(op);
    return {};
  }

  ncclComm_t c_;
  const int rank_, world_, device_;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<VoteBoard> votes_;
  uint64_t vote_calls_ = 0;
};

}  // namespace

bool nccl_built() { return true; }

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_comms(const std::vector<int>& devices) {
  const int n = int(devices.size());
  if (n < 1) return invalid_argument("NCCL communicator: no devices");
  int have = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&have));
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= have)
      return invalid_argument("NCCL communicator: device {} does not exist (this machine has {})", devices[i], have);
    for (size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        return invalid_argument("NCCL communicator: device {} listed twice (NCCL needs one rank per GPU)", devices[i]);
  }
  // NVLink multicast (NVLS) stays off on the lent machines, whatever the environment says.
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Peers connect at init, not lazily at the first collective: a first collective inside a CUDA
  // graph capture (a decode step of a multi-GPU model with graphs on) faulted on 2 H200s. A value
  // set by the user wins.
  ::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  FS_NCCL_RETURN_IF_ERROR(ncclCommInitAll(comms.data(), n, devices.data()));
  {  // ... and one eager all-reduce on every rank, so no collective is ever a process's first under capture.
    int prev = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
    std::vector<float*> one(size_t(n), nullptr);
    Status st;
    for (int r = 0; r < n && st.ok(); ++r) {
      st = cuda_status(cudaSetDevice(devices[size_t(r)]), "cudaSetDevice");
      if (st.ok()) st = cuda_status(cudaMalloc(reinterpret_cast<void**>(&one[size_t(r)]), sizeof(float)), "cudaMalloc");
      if (st.ok()) st = cuda_status(cudaMemset(one[size_t(r)], 0, sizeof(float)), "cudaMemset");
    }
    if (st.ok()) st = nccl_status(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n && st.ok(); ++r)
      st = nccl_status(ncclAllReduce(one[size_t(r)], one[size_t(r)], 1, ncclFloat, ncclSum, comms[size_t(r)], nullptr),
                       "ncclAllReduce (warm-up)");
    if (st.ok()) st = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(devices[size_t(r)]);
      if (st.ok()) st = cuda_status(cudaDeviceSynchronize(), "NCCL warm-up");
      if (one[size_t(r)]) cudaFree(one[size_t(r)]);
    }
    cudaSetDevice(prev);
    if (!st.ok()) {
      for (ncclComm_t c : comms) ncclCommDestroy(c);
      return st;
    }
  }
  std::vector<std::unique_ptr<Communicator>> out;
  auto votes = std::make_shared<VoteBoard>(n);
  for (int r = 0; r < n; ++r)
    out.push_back(std::make_unique<NcclComm>(comms[size_t(r)], r, n, devices[size_t(r)], votes));
  return out;
}
#else
bool nccl_built() { return false; }
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_comms(const std::vector<int>& devices) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("{} GPUs: this build has no NCCL (multi-GPU needs nccl.h and libnccl at configure time)",
                            devices.size()));
}
#endif

}  // namespace flashseek::ops::cuda
