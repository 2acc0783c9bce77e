// The launch tape (ops/cuda/runtime/launch.cuh) in patch mode: launches, copies and memsets are appended to
// the thread's tape with their exact parameters and nothing reaches CUDA, so these tests need no
// GPU (the stream is a dummy handle that CUDA never sees). The GPU side — patched graphs bitwise
// equal to eager — is tests/forward/gpu_graph_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda {
namespace {

cudaStream_t fake_stream(uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

// Patch mode on this thread for the scope; leaves the tape off.
struct PatchScope {
  explicit PatchScope(cudaStream_t s) { launch_tape().start(LaunchTape::kPatch, s); }
  ~PatchScope() { launch_tape().mode = LaunchTape::kOff; }
};

template <typename T>
T arg(LaunchTape& t, const TapeOp& op, uint32_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + op.byte0 + t.arg_offs[op.arg0 + i], sizeof(T));
  return v;
}

TEST(LaunchTape, PatchModeRecordsKernelArgumentsWithoutLaunching) {
  const cudaStream_t s = fake_stream(0x1000);
  PatchScope scope(s);
  float* x = reinterpret_cast<float*>(uintptr_t(0xABC0));
  // quant_sim_warp_kernel(float* x, int64_t rows, int64_t stride, int64_t qdim, int64_t block, QuantSim)
  ASSERT_EQ(detail::launch_quant_sim(x, 3, 64, 64, 32, detail::QuantSim::kFp8, s), cudaSuccess);
  LaunchTape& t = launch_tape();
  ASSERT_EQ(t.ops.size(), 1u);
  const TapeOp& op = t.ops[0];
  EXPECT_EQ(op.kind, TapeOp::kKernel);
  EXPECT_NE(op.func, nullptr);
  EXPECT_EQ(op.grid.x, 1u);  // 3 rows x 2 blocks = 6 quantisation blocks, a warp each, 8 per block
  EXPECT_EQ(op.block.x, 256u);
  EXPECT_EQ(op.smem, 0u);
  EXPECT_EQ(op.cluster, 1u);
  ASSERT_EQ(op.nargs, 6u);
  EXPECT_EQ(arg<float*>(t, op, 0), x);
  EXPECT_EQ(arg<int64_t>(t, op, 1), 3);
  EXPECT_EQ(arg<int64_t>(t, op, 2), 64);
  EXPECT_EQ(arg<int64_t>(t, op, 3), 64);
  EXPECT_EQ(arg<int64_t>(t, op, 4), 32);
  EXPECT_EQ(arg<detail::QuantSim>(t, op, 5), detail::QuantSim::kFp8);
  std::vector<void*> ptrs;
  t.arg_ptrs(op, ptrs);
  ASSERT_EQ(ptrs.size(), 6u);
  EXPECT_EQ(*static_cast<int64_t*>(ptrs[1]), 3);
  EXPECT_FALSE(t.failed);
}

TEST(LaunchTape, StructArgumentsAreCopiedWhole) {
  const cudaStream_t s = fake_stream(0x2000);
  PatchScope scope(s);
  detail::LinearArgs a;
  a.x = reinterpret_cast<const float*>(uintptr_t(0x100));
  a.w = reinterpret_cast<const float*>(uintptr_t(0x200));
  a.y = reinterpret_cast<float*>(uintptr_t(0x300));
  a.rows = 2, a.in = 64, a.out = 40;
  ASSERT_EQ(detail::launch_linear(a, s), cudaSuccess);
  LaunchTape& t = launch_tape();
  ASSERT_EQ(t.ops.size(), 1u);
  ASSERT_EQ(t.ops[0].nargs, 3u);  // the GEMV: LinearArgs, row groups, FP8 scale shift
  const auto got = arg<detail::LinearArgs>(t, t.ops[0], 0);
  EXPECT_EQ(got.x, a.x);
  EXPECT_EQ(got.y, a.y);
  EXPECT_EQ(got.rows, 2);
  EXPECT_EQ(got.x_stride, 64);  // the launcher's defaults are what the kernel gets
  EXPECT_EQ(got.y_stride, 40);
}

TEST(LaunchTape, CopiesAndMemsetsAreRecordedAndEmptyOnesSkipped) {
  const cudaStream_t s = fake_stream(0x3000);
  PatchScope scope(s);
  void* d = reinterpret_cast<void*>(uintptr_t(0x4000));
  const void* h = reinterpret_cast<const void*>(uintptr_t(0x5000));
  ASSERT_EQ(memcpy_async(d, h, 96, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(memcpy_async(d, h, 0, cudaMemcpyHostToDevice, s), cudaSuccess);  // nothing to copy: no op
  ASSERT_EQ(memset_async(d, 0, 128, s), cudaSuccess);
  ASSERT_EQ(memcpy2d_async(d, 256, h, 64, 64, 3, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  LaunchTape& t = launch_tape();
  ASSERT_EQ(t.ops.size(), 3u);
  EXPECT_EQ(t.ops[0].kind, TapeOp::kMemcpy);
  EXPECT_EQ(t.ops[0].dst, d);
  EXPECT_EQ(t.ops[0].src, h);
  EXPECT_EQ(t.ops[0].count, 96u);
  EXPECT_EQ(t.ops[0].aux, int(cudaMemcpyHostToDevice));
  EXPECT_EQ(t.ops[1].kind, TapeOp::kMemset);
  EXPECT_EQ(t.ops[1].count, 128u);
  EXPECT_EQ(t.ops[2].kind, TapeOp::kMemcpy2D);
  EXPECT_EQ(t.ops[2].dpitch, 256u);
  EXPECT_EQ(t.ops[2].spitch, 64u);
  EXPECT_EQ(t.ops[2].height, 3u);
  EXPECT_FALSE(t.failed);
}

// The shape hash follows the op kinds and functions in order, not the arguments.
TEST(LaunchTape, ShapeDependsOnOpSequenceNotArguments) {
  const cudaStream_t s = fake_stream(0x6000);
  float* x = reinterpret_cast<float*>(uintptr_t(0x7000));
  auto run = [&](int64_t rows, bool scale_first) {
    PatchScope scope(s);
    if (scale_first) {
      EXPECT_EQ(detail::launch_scale(x, rows * 8, 0.5f, false, s), cudaSuccess);
    }
    EXPECT_EQ(detail::launch_hadamard(x, rows, 8, s), cudaSuccess);
    if (!scale_first) {
      EXPECT_EQ(detail::launch_scale(x, rows * 8, 0.5f, false, s), cudaSuccess);
    }
    return launch_tape().shape;
  };
  const uint64_t a = run(1, true), b = run(5, true), c = run(1, false);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(LaunchTape, OtherStreamOrUnpatchableWorkFailsTheTape) {
  const cudaStream_t s = fake_stream(0x8000);
  float* x = reinterpret_cast<float*>(uintptr_t(0x9000));
  {
    PatchScope scope(s);
    EXPECT_EQ(detail::launch_scale(x, 16, 2.0f, false, fake_stream(0x8001)), cudaSuccess);
    EXPECT_TRUE(launch_tape().failed);
  }
  {
    PatchScope scope(s);
    launch_tape_unpatchable();
    EXPECT_TRUE(launch_tape().failed);
  }
  launch_tape().failed = false;
  launch_tape_unpatchable();  // tape off: nothing to fail
  EXPECT_FALSE(launch_tape().failed);
}

TEST(LaunchTape, EachThreadHasItsOwnTape) {
  const cudaStream_t s = fake_stream(0xA000);
  PatchScope scope(s);
  float* x = reinterpret_cast<float*>(uintptr_t(0xB000));
  EXPECT_EQ(detail::launch_scale(x, 16, 2.0f, false, s), cudaSuccess);
  LaunchTape::Mode other = LaunchTape::kPatch;
  std::thread th([&] { other = launch_tape().mode; });
  th.join();
  EXPECT_EQ(other, LaunchTape::kOff);
  EXPECT_EQ(launch_tape().ops.size(), 1u);
}

}  // namespace
}  // namespace flashseek::ops::cuda
