// CUDA graphs of decode-sized forwards (docs/cuda.md, "CUDA graphs"). A GpuModel::forward call
// whose items all have at most kGpuGraphMaxTokens tokens runs as one graph on stream_.
//
// Patch path (one GPU): the step's host code runs with the launch tape in patch mode
// (ops/cuda/runtime/launch.cuh): every kernel, copy and memset is appended to the tape instead of being
// queued, the host work (Engram gather into pinned staging, pool tables, sequence counters) happens
// as usual. If an executable recorded from the same key (the items' T and all_logits) and the same
// op sequence is cached, the nodes whose parameters differ from its tape are set and it is
// launched: no recording, no instantiation.
//
// Record path (a new op sequence, e.g. the first step in which a compressor group completes; every
// step on NCCL ranks, whose all-reduces are not on the tape): the step is captured whole, the
// tape noting each op's node, and applied to a cached executable (cudaGraphExecUpdate, or a new
// instantiation; a taped recording is always instantiated afresh so that its nodes are the
// executable's). Buffers may not grow under capture (CaptureGuard, gpu_impl.h): a growth is
// deferred, the capture discarded, every host counter it advanced restored, the growths applied,
// and the step recorded again. A step that still cannot be recorded runs eagerly (a fallback).
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/runtime/comm.h"
#include "ops/cuda/runtime/launch.cuh"

namespace flashseek::forward::gpu {
namespace {

// The host-side counters of a sequence that a forward advances (the device data it writes is only
// written when the graph runs).
struct Snapshot {
  struct Comp {
    int64_t n_pend = 0, hist_lo = 0;
    bool has_prev = false;
  };
  struct Layer {
    int64_t n_ckv = 0, n_ikeys = 0;
    Comp comp, icomp;
  };
  GpuSequenceState* st = nullptr;
  int64_t len = 0, mtp_lo = 0;  // mtp_lo: V4 MTP history (gpu_mtp.cpp)
  std::vector<int64_t> engram_hist;
  std::vector<Layer> layers;
};

Snapshot take(GpuSequenceState& st) {
  auto comp = [](const GpuCompState& c) { return Snapshot::Comp{c.n_pend, c.hist_lo, c.has_prev}; };
  Snapshot s;
  s.st = &st;
  s.len = st.len;
  s.mtp_lo = st.mtp_lo;
  s.engram_hist = st.engram_hist;
  for (const GpuLayerState& l : st.layers) s.layers.push_back({l.n_ckv, l.n_ikeys, comp(l.comp), comp(l.icomp)});
  return s;
}

void restore(const Snapshot& s) {
  auto comp = [](const Snapshot::Comp& c, GpuCompState& d) {
    d.n_pend = c.n_pend;
    d.hist_lo = c.hist_lo;
    d.has_prev = c.has_prev;
  };
  GpuSequenceState& st = *s.st;
  st.len = s.len;
  st.mtp_lo = s.mtp_lo;
  st.engram_hist = s.engram_hist;
  for (size_t i = 0; i < s.layers.size() && i < st.layers.size(); ++i) {
    st.layers[i].n_ckv = s.layers[i].n_ckv;
    st.layers[i].n_ikeys = s.layers[i].n_ikeys;
    comp(s.layers[i].comp, st.layers[i].comp);
    comp(s.layers[i].icomp, st.layers[i].icomp);
  }
}

// Recordings of one step, each after growing the buffers the previous one found too small (a
// capture may stop at the first op whose new buffer is still null, so a step that meets many new
// buffers, e.g. the first decode step with side branches, finds them one or a few at a time).
constexpr int kMaxCaptures = 16;
constexpr size_t kMaxExecs = 32;    // cached executables per model (least recently used go)
constexpr int kPatchMissRun = 8;     // patch misses in a row that pause patching ...
constexpr int kPatchBackoff = 16;    // ... for this many decode-sized steps
// Steps whose work bypasses the tape (e.g. a CUB sort) run eagerly; after kPatchMissRun of them in
// a row, patching pauses for kEagerBackoff steps (doubling up to kEagerBackoffMax while it recurs).
constexpr int kEagerBackoff = 64, kEagerBackoffMax = 4096;

// The shape of a recorded graph: its node types and kernel functions in node order. Steps of one
// key differ in shape when a compressor group completes in one item and not in another (with two
// sequences a step apart in phase the pooling kernels move between the items from step to step
// while the node count stays); keying the executables by shape lets cudaGraphExecUpdate succeed.
uint64_t graph_shape(cudaGraph_t g, size_t n) {
  std::vector<cudaGraphNode_t> nodes(n);
  size_t m = n;
  if (cudaGraphGetNodes(g, nodes.data(), &m) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (type, function) pairs
  auto mix = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (size_t i = 0; i < m; ++i) {
    cudaGraphNodeType t{};
    if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) {
      (void)cudaGetLastError();
      mix(~uint64_t(0));
      continue;
    }
    mix(uint64_t(t));
    if (t != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams p{};
    if (cudaGraphKernelNodeGetParams(nodes[i], &p) == cudaSuccess) {
      mix(uint64_t(reinterpret_cast<uintptr_t>(p.func)));
    } else {
      (void)cudaGetLastError();
    }
  }
  return h;
}

bool is_collective(const ops::cuda::TapeOp& op) { return uint8_t(op.kind) == ops::cuda::kTapeCollective; }

// Whether the tape `t` of this step can be applied to an executable recorded (or last patched) with
// tape `o` (host-side checks only: the same ops in the same order, and none that moved which a
// node update cannot move: memsets, 2-D copies, a copy's direction, NCCL collectives).
bool tape_matches(const ops::cuda::LaunchTape& o, const ops::cuda::LaunchTape& t) {
  using Op = ops::cuda::TapeOp;
  if (t.ops.size() != o.ops.size()) return false;
  for (size_t i = 0; i < t.ops.size(); ++i) {  // the hash may collide
    const Op &a = o.ops[i], &b = t.ops[i];
    if (a.kind != b.kind || a.func != b.func || a.cluster != b.cluster || a.nbytes != b.nbytes) return false;
    if (b.kind == Op::kKernel) continue;
    if (b.kind == Op::kMemcpy) {
      if (a.aux != b.aux) return false;
      continue;
    }
    if (a.dst != b.dst || a.src != b.src || a.count != b.count || a.aux != b.aux || a.dpitch != b.dpitch ||
        a.spitch != b.spitch || a.height != b.height)
      return false;
  }
  return true;
}

// Graph nodes of a recording whose tape is `t`: one per op, a collective's those NCCL added.
size_t taped_nodes(const ops::cuda::LaunchTape& t) {
  size_t n = 0;
  for (const auto& op : t.ops) n += is_collective(op) ? op.grid.x : 1;
  return n;
}

}  // namespace

// Replays the step from a cached executable without recording it: the forward's host code runs
// with the launch tape in patch mode (ops/cuda/runtime/launch.cuh: every kernel, copy and memset is
// appended, nothing is queued), inside an empty capture of stream_ that catches any work that
// bypasses the tape. If the tape matches an executable recorded from the same key and op sequence,
// only the nodes whose parameters changed are set, and the executable is launched. `done` false:
// nothing ran and every host counter is as before (the caller records the step, or with
// `off_tape` — work bypassed the tape, so a recording could not be patched either — runs it eagerly).
Status GpuModel::patch_step(const std::vector<int64_t>& key, std::span<BatchItem> batch, std::vector<float>& logits,
                            const std::function<Status()>& discard, bool& done, bool& off_tape) {
  done = false;
  off_tape = false;
  CaptureGuard& guard = capture_guard();
  ops::cuda::LaunchTape& tape = ops::cuda::launch_tape();
  pending_logits_.clear();
  pending_bytes_.clear();
  guard.deferred.clear();
  // NCCL ranks vote (host-side, below) so that all of them patch or all record: a rank recording
  // (or running eagerly) while another replays would deadlock in the collectives.
  const bool multi = comm_ && shard_.split();
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    if (!multi) return {};
    bool all = false, any = false;  // record the step, as the others will
    return comm_->vote(all, any);
  }
  tape.start(ops::cuda::LaunchTape::kPatch, stream_, side_stream_[0], side_stream_[1]);
  guard.active = true;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = run_items(batch, logits);
  const auto t1 = std::chrono::steady_clock::now();
  guard.active = false;
  tape.mode = ops::cuda::LaunchTape::kOff;
  cudaGraph_t g = nullptr;
  const cudaError_t ec = cudaStreamEndCapture(stream_, &g);
  size_t stray = 0;  // nodes captured beside the tape (work that bypassed it)
  if (g) {
    if (cudaGraphGetNodes(g, nullptr, &stray) != cudaSuccess) stray = 1;
    cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();
  off_tape = s.ok() && (stray > 0 || tape.failed);
  GraphExec* x = nullptr;
  if (s.ok() && ec == cudaSuccess && stray == 0 && guard.deferred.empty() && !tape.failed) {
    for (GraphExec& c : execs_)
      if (c.patchable && c.exec && c.shape == tape.shape && c.tape.ops.size() == tape.ops.size() && c.key == key) x = &c;
  }
  if (x && !tape_matches(x->tape, tape)) x = nullptr;  // the step is recorded (its executable replaced)
  if (multi) {
    bool all = x != nullptr, any = off_tape;
    if (Status v = comm_->vote(all, any); !v.ok()) {
      (void)discard();
      return v;
    }
    if (!all) x = nullptr;
    off_tape = any;
  }
  if (x) {
    int64_t set = 0;
    if (apply_tape(*x, set)) {
      x->used = ++exec_clock_;
      if (cudaGraphLaunch(x->exec, stream_) == cudaSuccess) {
        const auto t2 = std::chrono::steady_clock::now();
        gstats_.tape_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
        gstats_.apply_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
        done = true;
        patch_miss_run_ = 0;
        off_tape_run_ = 0;
        eager_backoff_len_ = kEagerBackoff;
        ++gstats_.launches;
        ++gstats_.patched;
        gstats_.patched_nodes += set;
        return {};
      }
    }
    // Partly patched or not launched: this executable is no longer what its tape says.
    (void)cudaGetLastError();
    cudaGraphExecDestroy(x->exec);
    if (x->graph) cudaGraphDestroy(x->graph);
    execs_.erase(execs_.begin() + (x - execs_.data()));
  }
  ++gstats_.patch_misses;
  if (off_tape && ++off_tape_run_ >= kPatchMissRun) {  // e.g. a CUB sort every step: eager for a while
    off_tape_run_ = 0;
    eager_backoff_ = eager_backoff_len_;
    eager_backoff_len_ = std::min(2 * eager_backoff_len_, kEagerBackoffMax);
  }
  if (!off_tape && ++patch_miss_run_ >= kPatchMissRun) {  // record the next steps directly (they fill the cache)
    patch_miss_run_ = 0;
    patch_backoff_ = kPatchBackoff;
  }
  FS_RETURN_IF_ERROR(discard());
  std::vector<std::function<Status()>> grow;
  grow.swap(guard.deferred);
  for (auto& f : grow) FS_RETURN_IF_ERROR(f());  // the recording then needs no retry for these
  return {};
}

// Sets the nodes of `x` whose op on this thread's tape differs from the op it was recorded or last
// patched with; then the tape becomes the executable's. False: an op that cannot be patched (the
// executable may be partly patched).
bool GpuModel::apply_tape(GraphExec& x, int64_t& set) {
  ops::cuda::LaunchTape& t = ops::cuda::launch_tape();
  ops::cuda::LaunchTape& o = x.tape;
  using Op = ops::cuda::TapeOp;
  if (!tape_matches(o, t)) return false;
  std::vector<void*> argv;
  auto same_dim = [](const dim3& p, const dim3& q) { return p.x == q.x && p.y == q.y && p.z == q.z; };
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const Op& a = o.ops[i];
    Op& b = t.ops[i];
    b.node = a.node;
    if (b.kind == Op::kKernel) {
      if (same_dim(a.grid, b.grid) && same_dim(a.block, b.block) && a.smem == b.smem &&
          std::memcmp(o.bytes.data() + a.byte0, t.bytes.data() + b.byte0, b.nbytes) == 0)
        continue;
      cudaKernelNodeParams p{};
      p.func = const_cast<void*>(b.func);
      p.gridDim = b.grid, p.blockDim = b.block, p.sharedMemBytes = b.smem;
      t.arg_ptrs(b, argv);
      p.kernelParams = argv.data();
      if (cudaGraphExecKernelNodeSetParams(x.exec, b.node, &p) != cudaSuccess) return false;
      ++set;
    } else if (b.kind == Op::kMemcpy) {
      if (a.dst == b.dst && a.src == b.src && a.count == b.count && a.aux == b.aux) continue;
      if (a.aux != b.aux ||
          cudaGraphExecMemcpyNodeSetParams1D(x.exec, b.node, b.dst, b.src, b.count, cudaMemcpyKind(b.aux)) !=
              cudaSuccess)
        return false;
      ++set;
    } else if (is_collective(b)) {
      b.grid = a.grid;  // the nodes NCCL added when it was recorded (never patched)
    }  // memsets and 2-D copies: unchanged (tape_matches)
  }
  std::swap(o.ops, t.ops);
  std::swap(o.bytes, t.bytes);
  std::swap(o.arg_offs, t.arg_offs);
  o.shape = t.shape;
  return true;
}

Status GpuModel::forward_graph(std::span<BatchItem> batch, std::vector<float>& logits, bool& ran) {
  ran = false;
  std::vector<int64_t> key;  // the batch bucket and block sizes
  for (const auto& it : batch) key.push_back(int64_t(it.tokens.size()) * 2 + (it.all_logits ? 1 : 0));
  std::vector<Snapshot> snaps;
  for (const auto& it : batch) snaps.push_back(take(*static_cast<GpuSequenceState*>(it.state)));
  const size_t off0 = logits.size();
  CaptureGuard& guard = capture_guard();
  ops::cuda::LaunchTape& tape = ops::cuda::launch_tape();
  // Undo an unlaunched recording: counters, logits, staging (nothing of it ran on the device).
  std::function<Status()> discard = [&]() -> Status {
    for (auto it = snaps.rbegin(); it != snaps.rend(); ++it) restore(*it);  // a state twice: first wins
    logits.resize(off0);
    pending_logits_.clear();
    pending_bytes_.clear();
    return staging_.rewind();
  };
  if (patch_ && eager_backoff_ > 0) {  // recent steps queued work off the tape: eager is cheapest
    --eager_backoff_;
    return {};
  }
  if (patch_ && patch_backoff_ > 0) {
    --patch_backoff_;
  } else if (patch_) {
    bool done = false, off_tape = false;
    FS_RETURN_IF_ERROR(patch_step(key, batch, logits, discard, done, off_tape));
    if (off_tape) return {};  // its recording could not be patched and costs more than eager
    if (done) {
      ran = true;
      if (Status f = finish_forward(logits); !f.ok()) {
        logits.resize(off0);
        return f;
      }
      return {};
    }
  }
  for (int attempt = 0; attempt < kMaxCaptures; ++attempt) {
    pending_logits_.clear();
    pending_bytes_.clear();
    guard.deferred.clear();
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};  // no capture: the step runs eagerly
    }
    // With patching on, the tape records every op with its node (the executable's patch map).
    tape.start(patch_ ? ops::cuda::LaunchTape::kRecord : ops::cuda::LaunchTape::kOff, stream_, side_stream_[0],
               side_stream_[1]);
    guard.active = true;
    const Status s = run_items(batch, logits);
    guard.active = false;
    const bool taped = tape.mode == ops::cuda::LaunchTape::kRecord && !tape.failed;
    tape.mode = ops::cuda::LaunchTape::kOff;
    cudaGraph_t g = nullptr;
    const cudaError_t ec = cudaStreamEndCapture(stream_, &g);
    if (s.ok() && ec == cudaSuccess && g && guard.deferred.empty()) {
      if (Status ls = launch_graph(key, g, taped); !ls.ok()) {  // not launched: the step runs eagerly
        (void)cudaGetLastError();
        FS_RETURN_IF_ERROR(discard());
        return {};
      }
      ran = true;
      ++gstats_.launches;
      if (Status f = finish_forward(logits); !f.ok()) {
        logits.resize(off0);
        return f;
      }
      return {};
    }
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();  // an operation refused under capture (not sticky)
    FS_RETURN_IF_ERROR(discard());
    std::vector<std::function<Status()>> grow;
    grow.swap(guard.deferred);
    if (grow.empty()) return {};  // failed for another reason: the eager run reports or avoids it
    for (auto& f : grow) FS_RETURN_IF_ERROR(f());
    ++gstats_.recaptures;
  }
  return {};
}

Status GpuModel::launch_graph(const std::vector<int64_t>& key, cudaGraph_t g, bool taped) {
  size_t nodes = 0;
  if (cudaError_t e = cudaGraphGetNodes(g, nullptr, &nodes); e != cudaSuccess) {
    cudaGraphDestroy(g);
    return ops::cuda::cuda_status(e, "cudaGraphGetNodes");
  }
  ops::cuda::LaunchTape& tape = ops::cuda::launch_tape();
  // Patchable: every node of the graph is an op of the tape (nothing bypassed it).
  const bool patchable = taped && nodes == taped_nodes(tape);
  const uint64_t shape = patchable ? tape.shape : graph_shape(g, nodes);
  GraphExec* x = nullptr;
  for (GraphExec& c : execs_)
    if (c.patchable == patchable && c.nodes == nodes && c.shape == shape && c.key == key) x = &c;
  if (x && patchable) {  // the patch path missed it (e.g. a memset moved): a fresh executable whose
    if (x->exec) cudaGraphExecDestroy(x->exec);  // nodes are those of `g`
    if (x->graph) cudaGraphDestroy(x->graph);
    x->exec = nullptr;
    x->graph = nullptr;
  } else if (x) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(x->exec, g, &info) == cudaSuccess) {
      ++gstats_.updates;
      cudaGraphDestroy(x->graph);
      x->graph = g;
    } else {  // same shape, parameters an update cannot change: a new executable in its place
      (void)cudaGetLastError();
      ++gstats_.update_failures;
      cudaGraphExecDestroy(x->exec);
      cudaGraphDestroy(x->graph);
      x->exec = nullptr;
      x->graph = nullptr;
    }
  } else {
    if (execs_.size() >= kMaxExecs) {
      auto lru = std::min_element(execs_.begin(), execs_.end(),
                                  [](const GraphExec& a, const GraphExec& b) { return a.used < b.used; });
      cudaGraphExecDestroy(lru->exec);
      cudaGraphDestroy(lru->graph);
      execs_.erase(lru);
    }
    execs_.emplace_back();
    x = &execs_.back();
    x->key = key, x->nodes = nodes, x->shape = shape, x->patchable = patchable;
  }
  if (!x->exec) {
    if (cudaError_t e = cudaGraphInstantiate(&x->exec, g, 0); e != cudaSuccess) {
      cudaGraphDestroy(g);
      execs_.erase(execs_.begin() + (x - execs_.data()));
      return ops::cuda::cuda_status(e, "cudaGraphInstantiate");
    }
    ++gstats_.instantiations;
    x->graph = g;
    if (patchable) {  // the tape (ops, argument bytes and node handles of `g`) is the patch map
      std::swap(x->tape.ops, tape.ops);
      std::swap(x->tape.bytes, tape.bytes);
      std::swap(x->tape.arg_offs, tape.arg_offs);
      x->tape.shape = tape.shape;
    }
  }
  x->used = ++exec_clock_;
  FS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(x->exec, stream_));
  return {};
}

GpuModel::~GpuModel() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (GraphExec& x : execs_) {
    if (x.exec) cudaGraphExecDestroy(x.exec);
    if (x.graph) cudaGraphDestroy(x.graph);
  }
  for (cudaStream_t s : side_stream_)
    if (s) cudaStreamSynchronize(s);
  if (stream_) cudaStreamDestroy(stream_);
  for (int l = 0; l < kLanes; ++l) {
    if (side_stream_[size_t(l)]) cudaStreamDestroy(side_stream_[size_t(l)]);
    if (fork_ev_[size_t(l)]) cudaEventDestroy(fork_ev_[size_t(l)]);
    if (join_ev_[size_t(l)]) cudaEventDestroy(join_ev_[size_t(l)]);
  }
}

}  // namespace flashseek::forward::gpu
#endif
