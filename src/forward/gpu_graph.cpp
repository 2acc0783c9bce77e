// CUDA graphs of decode-sized forwards (docs/cuda.md, "CUDA graphs"). A GpuModel::forward call
// whose items all have at most kGpuGraphMaxTokens tokens is recorded on stream_ in one capture
// (every item in order; the host work of the step, such as the Engram gather, the compressor
// pointer tables and the sequence counters, runs while recording), then applied to a cached
// executable with cudaGraphExecUpdate (a new one is instantiated when the topology differs, e.g.
// when a compressor group completes and adds pooling kernels) and launched. The kernels take
// positions and counts as arguments, so the graph is re-recorded every step; what it saves is the
// per-kernel launch work, not the recording.
//
// Buffers may not grow under capture (CaptureGuard, gpu_impl.h): a growth is deferred, the capture
// discarded, every host counter it advanced restored, the growths applied, and the step recorded
// again. A step that still cannot be recorded runs eagerly (counted as a fallback).
#include "forward/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "forward/gpu_impl.h"

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
  int64_t len = 0;
  std::vector<int64_t> engram_hist;
  std::vector<Layer> layers;
};

Snapshot take(GpuSequenceState& st) {
  auto comp = [](const GpuCompState& c) { return Snapshot::Comp{c.n_pend, c.hist_lo, c.has_prev}; };
  Snapshot s;
  s.st = &st;
  s.len = st.len;
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
  st.engram_hist = s.engram_hist;
  for (size_t i = 0; i < s.layers.size() && i < st.layers.size(); ++i) {
    st.layers[i].n_ckv = s.layers[i].n_ckv;
    st.layers[i].n_ikeys = s.layers[i].n_ikeys;
    comp(s.layers[i].comp, st.layers[i].comp);
    comp(s.layers[i].icomp, st.layers[i].icomp);
  }
}

constexpr int kMaxCaptures = 4;     // recordings of one step (each after growing buffers)
constexpr size_t kMaxExecs = 32;    // cached executables per model (least recently used go)

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

}  // namespace

Status GpuModel::forward_graph(std::span<BatchItem> batch, std::vector<float>& logits, bool& ran) {
  ran = false;
  std::vector<int64_t> key;  // the batch bucket and block sizes
  for (const auto& it : batch) key.push_back(int64_t(it.tokens.size()) * 2 + (it.all_logits ? 1 : 0));
  std::vector<Snapshot> snaps;
  for (const auto& it : batch) snaps.push_back(take(*static_cast<GpuSequenceState*>(it.state)));
  const size_t off0 = logits.size();
  CaptureGuard& guard = capture_guard();
  // Undo an unlaunched recording: counters, logits, staging (nothing of it ran on the device).
  auto discard = [&]() -> Status {
    for (auto it = snaps.rbegin(); it != snaps.rend(); ++it) restore(*it);  // a state twice: first wins
    logits.resize(off0);
    pending_logits_.clear();
    pending_bytes_.clear();
    return staging_.rewind();
  };
  for (int attempt = 0; attempt < kMaxCaptures; ++attempt) {
    pending_logits_.clear();
    pending_bytes_.clear();
    guard.deferred.clear();
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};  // no capture: the step runs eagerly
    }
    guard.active = true;
    const Status s = run_items(batch, logits);
    guard.active = false;
    cudaGraph_t g = nullptr;
    const cudaError_t ec = cudaStreamEndCapture(stream_, &g);
    if (s.ok() && ec == cudaSuccess && g && guard.deferred.empty()) {
      if (Status ls = launch_graph(key, g); !ls.ok()) {  // not launched: the step runs eagerly
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

Status GpuModel::launch_graph(const std::vector<int64_t>& key, cudaGraph_t g) {
  size_t nodes = 0;
  if (cudaError_t e = cudaGraphGetNodes(g, nullptr, &nodes); e != cudaSuccess) {
    cudaGraphDestroy(g);
    return ops::cuda::cuda_status(e, "cudaGraphGetNodes");
  }
  const uint64_t shape = graph_shape(g, nodes);
  GraphExec* x = nullptr;
  for (GraphExec& c : execs_)
    if (c.nodes == nodes && c.shape == shape && c.key == key) x = &c;
  if (x) {
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
    execs_.push_back(GraphExec{key, nodes, shape, nullptr, nullptr, 0});
    x = &execs_.back();
  }
  if (!x->exec) {
    if (cudaError_t e = cudaGraphInstantiate(&x->exec, g, 0); e != cudaSuccess) {
      cudaGraphDestroy(g);
      execs_.erase(execs_.begin() + (x - execs_.data()));
      return ops::cuda::cuda_status(e, "cudaGraphInstantiate");
    }
    ++gstats_.instantiations;
    x->graph = g;
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
  if (const char* e = std::getenv("FLASHSEEK_GPU_GRAPHS_LOG"); e && std::string(e) == "1") {
    const GpuGraphStats& s = gstats_;
    std::fprintf(stderr,
                 "flashseek gpu %d: graphs %s; forwards %lld, decode-sized %lld, graph launches %lld, "
                 "instantiations %lld, updates %lld (failed %lld), recaptures %lld, eager fallbacks %lld\n",
                 device_, graphs_ ? "on" : "off", (long long)s.forwards, (long long)s.eligible,
                 (long long)s.launches, (long long)s.instantiations, (long long)s.updates,
                 (long long)s.update_failures, (long long)s.recaptures, (long long)s.eager_fallbacks);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

}  // namespace flashseek::forward::gpu
#endif
