// The per-thread launch tape of ops/cuda/launch.cuh.
#include "ops/cuda/runtime/launch.cuh"

#include <atomic>

namespace flashseek::ops::cuda {

namespace {
std::atomic<bool> g_programmatic_launch{true};
}  // namespace

void set_programmatic_launch(bool on) { g_programmatic_launch.store(on, std::memory_order_relaxed); }
bool programmatic_launch() { return g_programmatic_launch.load(std::memory_order_relaxed); }

LaunchTape& launch_tape() {
  thread_local LaunchTape t;
  return t;
}

void tape_push(LaunchTape& t, TapeOp& op, cudaStream_t s) {
  // Another stream: not the step's graph.
  if (s != t.stream && (!t.side[0] || s != t.side[0]) && (!t.side[1] || s != t.side[1])) t.failed = true;
  t.mix(uint64_t(op.kind) * 0x9E3779B97F4A7C15ull ^ op.cluster);
  t.mix(uint64_t(reinterpret_cast<uintptr_t>(op.func)));
  if (t.mode == LaunchTape::kRecord) {  // the op was just captured: it is the stream's only dependency
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t* deps = nullptr;
    size_t n = 0;
    if (cudaStreamGetCaptureInfo(s, &cs, nullptr, nullptr, &deps, nullptr, &n) != cudaSuccess ||
        cs != cudaStreamCaptureStatusActive || n != 1) {
      (void)cudaGetLastError();
      t.failed = true;
    } else {
      op.node = deps[0];
    }
  }
  t.ops.push_back(op);
}

cudaError_t stream_order(cudaStream_t from, cudaStream_t to, cudaEvent_t ev, bool join, int lane) {
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kOff) t.mix((join ? 0x6A6F696E6A6F696Eull : 0x666F726B666F726Bull) + uint64_t(lane));
  if (const cudaError_t e = cudaEventRecord(ev, from); e != cudaSuccess) return e;
  return cudaStreamWaitEvent(to, ev, 0);
}

cudaError_t memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;  // no node (a zero-size copy node cannot be patched)
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kPatch) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    if (e != cudaSuccess || t.mode == LaunchTape::kOff) return e;
  }
  TapeOp op;
  op.kind = TapeOp::kMemcpy;
  op.dst = dst, op.src = src, op.count = bytes, op.aux = int(kind);
  tape_push(t, op, s);
  return cudaSuccess;
}

cudaError_t memset_async(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kPatch) {
    const cudaError_t e = cudaMemsetAsync(dst, value, bytes, s);
    if (e != cudaSuccess || t.mode == LaunchTape::kOff) return e;
  }
  TapeOp op;
  op.kind = TapeOp::kMemset;
  op.dst = dst, op.count = bytes, op.aux = value;
  tape_push(t, op, s);
  return cudaSuccess;
}

cudaError_t memcpy2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                           cudaMemcpyKind kind, cudaStream_t s) {
  if (width == 0 || height == 0) return cudaSuccess;
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kPatch) {
    const cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s);
    if (e != cudaSuccess || t.mode == LaunchTape::kOff) return e;
  }
  TapeOp op;
  op.kind = TapeOp::kMemcpy2D;
  op.dst = dst, op.src = src, op.count = width, op.aux = int(kind);
  op.dpitch = dpitch, op.spitch = spitch, op.height = height;
  tape_push(t, op, s);
  return cudaSuccess;
}

}  // namespace flashseek::ops::cuda
