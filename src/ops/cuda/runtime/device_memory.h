// GPU runtime memory of the CUDA backend: growable device arrays, the pinned staging arena of a
// forward, and the per-thread guard that defers allocations while a CUDA graph is captured.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ops/cuda/runtime/cuda_check.h"

namespace flashseek::ops::cuda {

// While a forward is being captured into a CUDA graph on this thread (gpu_graph.cpp), buffers
// may not grow (cudaMalloc/cudaFree and legacy-stream copies would break the capture): a growth
// is deferred instead (the capture is then discarded, the deferred growths run, and the step is
// captured again). Thread-local: each tensor-parallel rank captures on its own thread.
struct CaptureGuard {
  bool active = false;
  std::vector<std::function<Status()>> deferred;
};
inline CaptureGuard& capture_guard() {
  thread_local CaptureGuard g;
  return g;
}

// Owning device array that grows (never shrinks); `keep` preserves the old contents. Growth is at
// least geometric (×2) when `keep` or `geometric` is set, so that arrays growing step by step
// reallocate rarely. Allocation and the keep copy use the legacy stream, which orders with the
// model's blocking stream (GpuModel::stream_).
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
  Status reserve(size_t n, bool keep, bool geometric = false) {
    if (n <= cap_) return {};
    if (CaptureGuard& g = capture_guard(); g.active) {  // no allocation under capture: later
      g.deferred.push_back([this, n, keep, geometric] { return reserve(n, keep, geometric); });
      return {};
    }
    const size_t nc = keep || geometric ? std::max(n, cap_ * 2) : n;
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

// Pinned host staging for the host → device data of a forward (tokens, positions, pool pointer
// tables, Engram rows, ...) and the device → host logits: bump-allocated per forward, rewound once
// the forward has synchronised. Grows by whole chunks (never moving a live one); rewind merges
// them into one. Under graph capture a full arena defers its growth (CaptureGuard) and alloc fails.
class PinnedArena {
 public:
  PinnedArena() = default;
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;
  ~PinnedArena() { release(); }
  // `bytes` of pinned host memory (64-byte aligned), valid until rewind().
  Result<void*> alloc(size_t bytes) {
    bytes = (bytes + 63) & ~size_t(63);
    if (!chunks_.empty() && used_ + bytes <= chunks_.back().cap) {
      void* p = chunks_.back().p + used_;
      used_ += bytes;
      return p;
    }
    const size_t want = std::max({bytes, total_ * 2, size_t(1) << 20});
    if (CaptureGuard& g = capture_guard(); g.active) {
      g.deferred.push_back([this, want] { return add_chunk(want); });
      return Status(StatusCode::kResourceExhausted, "pinned staging full under graph capture");
    }
    FS_RETURN_IF_ERROR(add_chunk(want));
    used_ = bytes;
    return static_cast<void*>(chunks_.back().p);
  }
  // Every copy from or to the arena has completed: start over (one chunk of the total size).
  Status rewind() {
    used_ = 0;
    if (chunks_.size() <= 1) return {};
    const size_t total = total_;
    release();
    return add_chunk(total);
  }

 private:
  struct Chunk {
    char* p;
    size_t cap;
  };
  Status add_chunk(size_t cap) {
    void* p = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, cap));
    chunks_.push_back({static_cast<char*>(p), cap});
    total_ += cap;
    used_ = 0;
    return {};
  }
  void release() {
    for (const Chunk& c : chunks_) cudaFreeHost(c.p);
    chunks_.clear();
    total_ = 0;
    used_ = 0;
  }
  std::vector<Chunk> chunks_;
  size_t used_ = 0, total_ = 0;  // bytes used in the last chunk; capacity of all chunks
};

}  // namespace flashseek::ops::cuda
