// One entry point for the stream work of the GPU model (kernel launches, async copies and
// memsets), so that a decode step can be replayed from a cached CUDA graph by patching only the
// node parameters that changed instead of recording the whole step again (backends/cuda/gpu_graph.cpp,
// docs/cuda.md "CUDA graphs").
//
// Each thread has a LaunchTape with a mode:
//   kOff     launch as usual (the default: one TLS read more per launch);
//   kRecord  launch (the stream is being captured) and append the op with its captured graph node;
//   kPatch   do not launch: only append the op (function, grid, block, shared memory, a copy of the
//            argument bytes; or the copy / memset parameters). No CUDA call.
// Work that cannot be put on the tape (a library call such as CUB or NCCL) calls
// launch_tape_unpatchable() so that the caller falls back to recording the step.
//
// Programmatic dependent launch (PDL, sm_90+): while programmatic_launch() is on, launch_kernel*
// launch with cudaLaunchAttributeProgrammaticStreamSerialization, so a kernel's blocks may be
// scheduled while the previous kernel on the stream still runs (its launch and block scheduling
// overlap the predecessor's end). That is only sound because every kernel launched here begins
// with pdl_prologue() (runtime/pdl.cuh), which waits for the previous grid to finish and its
// writes to be visible before anything else; scripts/check_pdl_prologue.py (the ctest
// PdlPrologue.*) fails when a kernel of a file that launches through here lacks it. Kernels
// launched otherwise (<<<>>>, libraries) keep full serialization.
// C++17 (included by .cu files); the launch templates need nvcc, the tape itself does not.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace flashseek::ops::cuda {

struct TapeOp {
  enum Kind : uint8_t { kKernel = 0, kMemcpy = 1, kMemset = 2, kMemcpy2D = 3 };
  Kind kind = kKernel;
  const void* func = nullptr;  // kernel function
  dim3 grid, block;
  unsigned smem = 0, cluster = 1;  // cluster: blocks per cluster along x (1: none)
  uint32_t byte0 = 0, nbytes = 0;  // argument bytes [byte0, byte0 + nbytes) of LaunchTape::bytes
  uint32_t arg0 = 0, nargs = 0;    // argument offsets (from byte0): LaunchTape::arg_offs[arg0, +nargs)
  void* dst = nullptr;             // memcpy / memset
  const void* src = nullptr;       // memcpy
  size_t count = 0;                // bytes (2-D copy: of a row)
  size_t dpitch = 0, spitch = 0, height = 0;  // 2-D copy
  int aux = 0;                     // memcpy: cudaMemcpyKind; memset: the byte value
  cudaGraphNode_t node = nullptr;  // kRecord: the node the capture created for this op
};

struct LaunchTape {
  enum Mode { kOff = 0, kRecord = 1, kPatch = 2 };
  Mode mode = kOff;
  cudaStream_t stream = nullptr;  // the step's stream
  cudaStream_t side[2] = {};      // and its side-branch streams (stream_order below), if any
  bool failed = false;            // an op the tape could not hold: the step cannot be patched
  uint64_t shape = 0;             // hash of the op kinds and functions in order
  std::vector<TapeOp> ops;
  std::vector<unsigned char> bytes;
  std::vector<uint32_t> arg_offs;

  void start(Mode m, cudaStream_t s, cudaStream_t side0 = nullptr, cudaStream_t side1 = nullptr) {
    mode = m;
    stream = s;
    side[0] = side0, side[1] = side1;
    failed = false;
    shape = 1469598103934665603ull;
    ops.clear();
    bytes.clear();
    arg_offs.clear();
  }
  void mix(uint64_t v) {
    shape ^= v;
    shape *= 1099511628211ull;
  }
  // Kernel arguments of op i as the pointer array cudaKernelNodeParams::kernelParams wants.
  void arg_ptrs(const TapeOp& op, std::vector<void*>& out) {
    out.resize(op.nargs);
    for (uint32_t i = 0; i < op.nargs; ++i) out[i] = bytes.data() + op.byte0 + arg_offs[op.arg0 + i];
  }
};

// This thread's tape.
LaunchTape& launch_tape();

// Process-wide PDL switch (on by default; GpuLoadOptions::programmatic_launch sets it before each
// forward of a model). Kernels are correct either way.
void set_programmatic_launch(bool on);
bool programmatic_launch();

// A call that bypasses the tape (CUB, NCCL, ...) is about to queue work: a tape in use fails.
inline void launch_tape_unpatchable() {
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kOff) t.failed = true;
}

// Appends a finished op (kRecord: looks up its captured node on `s`). Defined in launch.cpp.
void tape_push(LaunchTape& t, TapeOp& op, cudaStream_t s);

// Makes `to` wait for the work queued so far on `from` (cudaEventRecord on `from` with `ev`, then
// cudaStreamWaitEvent): a side branch's fork (main -> side) or join (side -> main) on branch lane
// `lane`. Under capture this adds edges, no node; the tape notes it and the lane in its shape (a
// patched executable must have the same branches). Patch mode calls it too: the step is then
// captured to catch work that bypasses the tape, on the side streams as on the main one.
cudaError_t stream_order(cudaStream_t from, cudaStream_t to, cudaEvent_t ev, bool join, int lane);

// cudaMemcpyAsync / cudaMemsetAsync through the tape (1-D copies; host memory must be pinned
// when the step may be captured).
cudaError_t memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t memset_async(void* dst, int value, size_t bytes, cudaStream_t s);
// cudaMemcpy2DAsync through the tape (a moved 2-D copy is not patched: the step is recorded).
cudaError_t memcpy2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                           cudaMemcpyKind kind, cudaStream_t s);

namespace launch_detail {
template <typename T>
void put_arg(LaunchTape& t, const TapeOp& op, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>, "kernel arguments must be trivially copyable");
  size_t off = t.bytes.size() - op.byte0;
  off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
  t.bytes.resize(op.byte0 + off + sizeof(T));
  std::memcpy(t.bytes.data() + op.byte0 + off, &v, sizeof(T));
  t.arg_offs.push_back(uint32_t(off));
}

template <typename... P, typename... A>
void tape_kernel(LaunchTape& t, void (*k)(P...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                 cudaStream_t s, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "argument count does not match the kernel");
  TapeOp op;
  op.kind = TapeOp::kKernel;
  op.func = reinterpret_cast<const void*>(k);
  op.grid = grid, op.block = block, op.smem = unsigned(smem), op.cluster = cluster;
  t.bytes.resize((t.bytes.size() + 15) & ~size_t(15));
  op.byte0 = uint32_t(t.bytes.size());
  op.arg0 = uint32_t(t.arg_offs.size());
  (put_arg<std::decay_t<P>>(t, op, static_cast<std::decay_t<P>>(std::forward<A>(args))), ...);
  op.nbytes = uint32_t(t.bytes.size() - op.byte0);
  op.nargs = uint32_t(t.arg_offs.size() - op.arg0);
  tape_push(t, op, s);
}
}  // namespace launch_detail

#ifdef __CUDACC__
namespace launch_detail {
// cudaLaunchKernelEx with a cluster of `cluster` blocks along x (1: none) and, while
// programmatic_launch() is on, programmatic stream serialization.
template <typename... P, typename... A>
cudaError_t launch_ex(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, unsigned cluster,
                      A&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (programmatic_launch()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr, cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...);
  if (e != cudaSuccess) (void)cudaGetLastError();  // returned here, not left for a later check (as <<<>>> + cudaGetLastError)
  return e;
}
}  // namespace launch_detail

// k<<<grid, block, smem, s>>>(args...), returning the launch error.
template <typename... P, typename... A>
cudaError_t launch_kernel(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kPatch) {
    const cudaError_t e = launch_detail::launch_ex(k, grid, block, smem, s, 1, args...);
    if (e != cudaSuccess || t.mode == LaunchTape::kOff) return e;
  }
  launch_detail::tape_kernel(t, k, grid, block, smem, 1, s, std::forward<A>(args)...);
  return cudaSuccess;
}

// The same with a thread-block cluster of `cluster` blocks along x (cudaLaunchKernelEx).
template <typename... P, typename... A>
cudaError_t launch_kernel_cluster(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, unsigned cluster,
                                   A&&... args) {
  LaunchTape& t = launch_tape();
  if (t.mode != LaunchTape::kPatch) {
    const cudaError_t e = launch_detail::launch_ex(k, grid, block, smem, s, cluster, args...);
    if (e != cudaSuccess || t.mode == LaunchTape::kOff) return e;
  }
  launch_detail::tape_kernel(t, k, grid, block, smem, cluster, s, std::forward<A>(args)...);
  return cudaSuccess;
}
#endif

}  // namespace flashseek::ops::cuda
