// Large-M FP8 block-scaled GEMM (wgmma, sm_90a) against its CPU twin on random FP8 weights,
// awkward shapes (m = 1, 7, 129, 8192; n not a multiple of the 128 tile, odd n), both scale
// granularities, FP32/BF16 inputs and outputs, and the pre-quantised input path.
//
// Tolerance. Every product x_q·w is exact in FP32 (e4m3 · e4m3, power-of-two scales). The twin
// adds them in one FP32 dot: error ≤ (k/8 + 3) · 2^-24 · Σ|x_q·w| (< 2e-5 · Σ here). The GPU adds
// each 32-block inside the tensor core, whose FP8 accumulation keeps only about 13-14 bits below
// the block's largest product (DeepSeek-V3 report §3.3.2; measured on an H200: up to 7.8e-4 · Σ,
// mean 5e-5 · Σ), i.e. ≤ 32 · 2^-13 · max ≤ 2^-8 · Σ_block|x_q·w|, then promotes in
// FP32. Outputs must therefore agree within 2^-8 · Σ|x_q·w| per element (Σ computed by the twin
// on |x|, |W|), and on average within 2^-11 · Σ (the typical error is far below the worst case).
//
// Timing of every kernel variant on the V4.1 prefill shapes: `flashseek bench --kernels gemm`
// (bench/cuda/kernel_bench.cpp).
#include "ops/block_scaled_data.h"
#include "ops/cuda/gemm/gemm_fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "gpu_util.h"
#include "ops/cuda/gemm/gemm_fp8_kernels.h"
#include "ops/gemm_fp8.h"
#include "ops/linear_quant.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda {
namespace {


using testing::DeviceBuffer;

constexpr int kLastKernel = 9;  // kernels 1..9 (GemmFp8Params::kernel)

struct Case {
  int64_t m, n, k, w_block, act_block;
  bool bf16_in, bf16_out;
};

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  return b;
}

std::vector<float> output_as_f32(const DeviceBuffer<float>& yf, const DeviceBuffer<uint16_t>& yb,
                                 bool bf16) {
  if (!bf16) return yf.to_host();
  const std::vector<uint16_t> b = yb.to_host();
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

void check_kernel(const Case& c, const GemmFp8Params& p, const std::vector<float>& ref,
                  const std::vector<float>& bound, DeviceBuffer<float>& dyf,
                  DeviceBuffer<uint16_t>& dyb);

// One random case, the twin computed once, then every kernel 1..kLastKernel on it (the output
// poisoned with NaN before each launch, so an element a kernel leaves unwritten fails).
void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k
                                    << " wb=" << c.w_block << " ab=" << c.act_block
                                    << " bf16_in=" << c.bf16_in << " bf16_out=" << c.bf16_out);
  std::mt19937 rng(seed);
  const size_t ns = size_t((c.n + c.w_block - 1) / c.w_block * (c.k / c.w_block));
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.n * c.k)), ws = random_e8m0_scales(rng, ns);
  std::vector<float> x = random_block_activations(rng, c.m, c.k);
  const std::vector<uint16_t> xb = to_bf16(x);
  if (c.bf16_in)
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(xb[i]);  // the twin sees the same

  GemmFp8Params p;
  p.m = c.m, p.n = c.n, p.k = c.k, p.w_block = c.w_block, p.act_block = c.act_block;
  std::vector<float> ref(size_t(c.m * c.n)), bound(ref.size());
  p.x = x.data(), p.w = w.data(), p.w_scale = ws.data(), p.y = ref.data();
  FS_ASSERT_OK(gemm_fp8_ref(p));
  std::vector<float> xa(x);
  for (auto& v : xa) v = std::fabs(v);
  std::vector<uint8_t> wa(w);
  for (auto& b : wa) b &= 0x7f;
  p.x = xa.data(), p.w = wa.data(), p.y = bound.data();
  FS_ASSERT_OK(gemm_fp8_ref(p));
  if (c.bf16_out)
    for (auto& v : ref) v = round_bf16(v);

  DeviceBuffer<float> dxf(x), dyf(ref.size());
  DeviceBuffer<uint16_t> dxb(xb), dyb(ref.size());
  DeviceBuffer<uint8_t> dw(w), dws(ws), work(size_t(gemm_fp8_workspace_bytes(c.m, c.k)));
  ASSERT_TRUE(dxf.ok() && dyf.ok() && dxb.ok() && dyb.ok() && dw.ok() && dws.ok() && work.ok());
  p.x = c.bf16_in ? static_cast<const void*>(dxb.get()) : dxf.get();
  p.x_dtype = c.bf16_in ? ActDtype::kBf16 : ActDtype::kF32;
  p.w = dw.get(), p.w_scale = dws.get();
  p.y = c.bf16_out ? static_cast<void*>(dyb.get()) : dyf.get();
  p.bf16_out = c.bf16_out;
  p.workspace = work.get(), p.workspace_bytes = gemm_fp8_workspace_bytes(c.m, c.k);
  for (int kernel = 1; kernel <= kLastKernel; ++kernel) {
    SCOPED_TRACE(::testing::Message() << "kernel=" << kernel);
    p.kernel = kernel;
    check_kernel(c, p, ref, bound, dyf, dyb);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void check_kernel(const Case& c, const GemmFp8Params& p, const std::vector<float>& ref,
                  const std::vector<float>& bound, DeviceBuffer<float>& dyf,
                  DeviceBuffer<uint16_t>& dyb) {
  const int kernel = p.kernel;
  ASSERT_EQ(cudaMemset(dyf.get(), 0xff, ref.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dyb.get(), 0xff, ref.size() * sizeof(uint16_t)), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = output_as_f32(dyf, dyb, c.bf16_out);
  double worst = 0, mean = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written or not finite";
    const double err = std::fabs(double(got[i]) - ref[i]);
    // BF16 outputs: the two FP32 sums may round to neighbouring BF16 values.
    const double tol =
        std::ldexp(double(bound[i]), -8) + (c.bf16_out ? std::fabs(ref[i]) / 128 : 0.0) + 1e-30;
    const double rel = err / (double(bound[i]) + 1e-30);
    worst = std::max(worst, rel);
    mean += rel / double(ref.size());
    ASSERT_LE(err, tol) << "output " << i << " (row " << i / c.n << ", col " << i % c.n << ") gpu "
                        << got[i] << " ref " << ref[i];
  }
  if (!c.bf16_out) {
    EXPECT_LE(mean, std::ldexp(1.0, -11)) << "mean |error| / Σ|x_q·w|";
  }
  std::printf("kernel %d m=%lld n=%lld k=%lld: |err| / Σ|x_q·w| worst %.2e mean %.2e\n", kernel,
              (long long)c.m, (long long)c.n, (long long)c.k, worst, mean);

  // Same launch again: bitwise identical (no atomics, fixed order).
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> again = output_as_f32(dyf, dyb, c.bf16_out);
  ASSERT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float)));
}

TEST(CudaGemmFp8, MatchesCpuTwinOnOddShapes) {
  FS_REQUIRE_GPU();
  const Case cases[] = {
      {1, 128, 128, 32, 32, false, false},       {7, 256, 256, 32, 32, false, false},
      {129, 384, 640, 32, 32, false, false},     {8192, 128, 256, 32, 32, false, false},
      {65, 200, 512, 32, 32, false, false},      {33, 129, 384, 32, 32, false, false},
      {300, 1280, 1024, 128, 128, false, false}, {130, 256, 512, 128, 32, false, false},
      {250, 512, 2304, 32, 32, true, false},     {96, 320, 1280, 32, 32, true, true},
      {17, 131, 256, 32, 32, false, true},
      // More tiles than an H200 has SMs (132): the persistent kernels 6/7 walk several tiles
      // per block, their stage ring wrapping at a different slot in each tile (k/128 = 1, 5).
      {1100, 1920, 128, 32, 32, false, false},   {1030, 2100, 640, 32, 32, true, true},
  };
  uint32_t seed = 11;
  for (const auto& c : cases) {
    run_case(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// The quantisation kernel writes exactly the codes and scales of the reference quantiser, and
// the GEMM on those pre-quantised operands equals the one-call path bit for bit.
TEST(CudaGemmFp8, QuantizeKernelAndPrequantisedPath) {
  FS_REQUIRE_GPU();
  for (const int64_t ab : {32, 128}) {
    SCOPED_TRACE(::testing::Message() << "act_block=" << ab);
    std::mt19937 rng{uint32_t(ab)};
    const int64_t m = 37, n = 256, k = 640;
    const std::vector<float> x = random_block_activations(rng, m, k);
    const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(n * k));
    const std::vector<uint8_t> ws = random_e8m0_scales(rng, size_t(n / 32 * (k / 32)));
    DeviceBuffer<float> dx(x), dy1(size_t(m * n)), dy2(size_t(m * n));
    DeviceBuffer<uint8_t> dxq(size_t(m * k)), dw(w), dws(ws),
        work(size_t(gemm_fp8_workspace_bytes(m, k)));
    DeviceBuffer<float> dxs(size_t(m * k / 32));
    FS_ASSERT_OK(
        gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, m, k, ab, dxq.get(), dxs.get(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> q = dxq.to_host();
    const std::vector<float> s = dxs.to_host();
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k; b += ab) {
        float amax = 0;
        for (int64_t i = b; i < b + ab; ++i) amax = std::max(amax, std::fabs(x[size_t(r * k + i)]));
        const float want_s = pow2_ceil(std::max(amax, 1e-4f) / 448.0f);
        for (int64_t i = b; i < b + ab; ++i) {
          ASSERT_EQ(s[size_t((r * k + i) / 32)], want_s) << "row " << r << " input " << i;
          const float v = std::clamp(x[size_t(r * k + i)] / want_s, -448.0f, 448.0f);
          ASSERT_EQ(e4m3_to_f32(q[size_t(r * k + i)]), round_e4m3(v))
              << "row " << r << " input " << i;
        }
      }
    }
    GemmFp8Params p;
    p.m = m, p.n = n, p.k = k, p.act_block = ab, p.w = dw.get(), p.w_scale = dws.get();
    p.x = dx.get(), p.workspace = work.get(), p.workspace_bytes = gemm_fp8_workspace_bytes(m, k);
    p.y = dy1.get();
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    p.x = nullptr, p.xq = dxq.get(), p.xs = dxs.get(), p.y = dy2.get();
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y1 = dy1.to_host(), y2 = dy2.to_host();
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)));
  }
}

TEST(CudaGemmFp8, RejectsBadInputWithClearErrors) {
  // Runs without a GPU: every check below fires before any device call.
  alignas(16) uint8_t b[64] = {};
  alignas(16) float f[16] = {};
  GemmFp8Params p;
  p.x = f, p.w = b, p.w_scale = b, p.y = f, p.m = 1, p.n = 4, p.k = 96;
  Status s = gemm_fp8_cuda(p, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("k=96"), std::string::npos) << s.message();
  p.k = 128;
  p.xq = b, p.xs = f;
  s = validate(p);
  EXPECT_NE(s.message().find("both"), std::string::npos) << s.message();
  p.xq = nullptr, p.xs = nullptr, p.w_block = 64;
  s = gemm_fp8_ref(p);
  EXPECT_NE(s.message().find("w_block=64"), std::string::npos) << s.message();
  p.w_block = 32, p.m = 0;
  EXPECT_FALSE(validate(p).ok());
  p.m = 1, p.w = b + 1;  // misaligned weights
  s = gemm_fp8_cuda(p, nullptr);
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s.message();
  p.w = b;
  if (cuda_device_available()) {  // missing workspace is caught after the device check
    s = gemm_fp8_cuda(p, nullptr);
    EXPECT_FALSE(s.ok());
  }
  s = gemm_fp8_quantize_cuda(f, ActDtype::kF32, 1, 128, 64, b, f, nullptr);
  EXPECT_NE(s.message().find("act_block=64"), std::string::npos) << s.message();
}

// Grouped GEMM (routed experts): group sizes 0, 1, 127, 129, 128, 300... (empty groups first,
// middle and last), n not a multiple of the 128 tile (the last n-tile of a group reads the next
// group's weight rows: must not leak), 384 small groups (the in-kernel tile prefix over 12
// 32-group scans, several tiles per block). Bitwise equal to kernel 6 launched per group on the
// group's rows, and within the GEMM tolerance of the CPU twin gemm_fp8_grouped_ref.
struct GroupedCase {
  std::vector<int32_t> sizes;
  int64_t n, k, w_block;
  bool bf16_out;
};

void run_grouped(const GroupedCase& c, uint32_t seed) {
  const int64_t G = int64_t(c.sizes.size()), n = c.n, k = c.k, wb = c.w_block;
  SCOPED_TRACE(::testing::Message() << "groups=" << G << " n=" << n << " k=" << k << " wb=" << wb
                                    << " bf16_out=" << c.bf16_out);
  std::vector<int32_t> starts(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) starts[size_t(g + 1)] = starts[size_t(g)] + c.sizes[size_t(g)];
  const int64_t rows = starts[size_t(G)];
  std::mt19937 rng(seed);
  const int64_t nsb = (n + wb - 1) / wb, kbw = k / wb;
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(G * n * k)), ws = random_e8m0_scales(rng, size_t(G * nsb * kbw));
  const std::vector<float> x = random_block_activations(rng, rows, k);
  DeviceBuffer<float> dx(x), dxs(size_t(rows * k / 32)), dy1(size_t(rows * n)), dy2(size_t(rows * n));
  DeviceBuffer<uint8_t> dxq(size_t(rows * k)), dw(w), dws(ws);
  DeviceBuffer<int32_t> dstarts(starts);
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, dxq.get(), dxs.get(), nullptr));
  const size_t ob = c.bf16_out ? 2 : 4;
  ASSERT_EQ(cudaMemset(dy1.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy2.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  GemmFp8GroupedParams gp;
  gp.xq = dxq.get(), gp.xs = dxs.get(), gp.w = dw.get(), gp.w_scale = dws.get(), gp.row_start = dstarts.get();
  gp.y = dy1.get(), gp.bf16_out = c.bf16_out, gp.groups = G, gp.rows = rows, gp.n = n, gp.k = k, gp.w_block = wb;
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gp, nullptr));
  for (int64_t g = 0; g < G; ++g) {  // kernel 6 on each group alone
    const int64_t r0 = starts[size_t(g)], r1 = starts[size_t(g + 1)];
    if (r1 == r0) continue;
    GemmFp8Params p;
    p.xq = dxq.get() + r0 * k, p.xs = dxs.get() + r0 * (k / 32);
    p.w = dw.get() + g * n * k, p.w_scale = dws.get() + g * nsb * kbw;
    p.y = reinterpret_cast<uint8_t*>(dy2.get()) + size_t(r0 * n) * ob, p.bf16_out = c.bf16_out;
    p.m = r1 - r0, p.n = n, p.k = k, p.w_block = wb, p.kernel = 6;
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host();
  const size_t bytes = size_t(rows * n) * ob;
  ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), bytes)) << "grouped != per-group kernel 6";

  // The CPU twin on the same codes; the bound from |codes| (sign bit cleared).
  std::vector<uint8_t> xq = dxq.to_host(), xqa(xq), wa(w);
  const std::vector<float> xs = dxs.to_host();
  for (auto& b : xqa) b &= 0x7f;
  for (auto& b : wa) b &= 0x7f;
  std::vector<float> ref(size_t(rows * n)), bound(ref.size());
  GemmFp8GroupedParams hp = gp;
  hp.xq = xq.data(), hp.xs = xs.data(), hp.w = w.data(), hp.w_scale = ws.data(), hp.row_start = starts.data();
  hp.y = ref.data(), hp.bf16_out = false;
  FS_ASSERT_OK(gemm_fp8_grouped_ref(hp));
  hp.xq = xqa.data(), hp.w = wa.data(), hp.y = bound.data();
  FS_ASSERT_OK(gemm_fp8_grouped_ref(hp));
  for (int64_t i = 0; i < rows * n; ++i) {
    float got;
    if (c.bf16_out) got = bf16_to_f32(reinterpret_cast<const uint16_t*>(y1.data())[i]);
    else got = y1[size_t(i)];
    ASSERT_TRUE(std::isfinite(got)) << "output " << i << " not written or not finite";
    const double tol = std::ldexp(double(bound[size_t(i)]), -8) + (c.bf16_out ? std::fabs(ref[size_t(i)]) / 128 : 0.0) + 1e-30;
    ASSERT_LE(std::fabs(double(got) - ref[size_t(i)]), tol) << "row " << i / n << " col " << i % n;
  }
}

TEST(CudaGemmFp8, GroupedMatchesPerGroupKernelAndCpuTwin) {
  FS_REQUIRE_GPU();
  std::vector<GroupedCase> cases = {
      {{0, 1, 127, 129, 0, 300, 5, 128, 0}, 200, 384, 32, false},
      {{129, 0, 1, 127, 64}, 256, 640, 128, true},
  };
  std::mt19937 rng(5);
  GroupedCase many{{}, 128, 256, 32, false};
  for (int g = 0; g < 384; ++g) many.sizes.push_back(int32_t(rng() % 5 == 0 ? 0 : rng() % 41));
  cases.push_back(many);
  uint32_t seed = 70;
  for (const auto& c : cases) {
    run_grouped(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// FP4 (MXFP4) weights in the grouped GEMM: e2m1 codes [G, n, k/2] + one E8M0 scale per
// (row, 32-block), expanded to e4m3 inside the kernel. Three checks per case:
// * tile scales (the 32 rows of each 32 × 32 block share their scale): bitwise equal to the FP8
//   grouped GEMM on the e4m3 copy of the codes with those tile scales (the expansion is exact
//   and the promotion forms the same sx · sw products);
// * independent random per-row scales: within the GEMM bound of the CPU twin (FP4 format), as
//   run_grouped (every product x_q · w is still exact in FP32).
// * x_f16 (f16 operands, f16 tensor-core steps per 32-block) with those per-row scales: within
//   2^-16 · Σ|x_q·w| of the twin, 2^-20 on average (FP32-precision block sums).
// Group sizes with empty groups, tails past 128, n not a multiple of 128 or 32 (odd n too).
uint8_t e2m1_to_e4m3_code(uint8_t nib) {
  static constexpr uint8_t kMag[8] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C};
  return uint8_t(kMag[nib & 7] | ((nib & 8) << 4));
}

// The x_bf16 GEMM against its twin, per element, relative to Σ|x_q·w|: the products are exact;
// each k16 wgmma adds 16 of them to the FP32 accumulator (at most 2·2^-24 of the larger of the
// running sum and the step's Σ|p|, both at most Σ|x_q·w|: k/8 · 2^-24 over k), and the twin's own
// FP32 dot is within (k/8 + 3) · 2^-24 of the exact sum. Never below the x_f16 mode's 2^-16.
double bf16_gemm_tol(int64_t k) { return std::max(std::ldexp(1.0, -16), double(k / 4 + 3) * std::ldexp(1.0, -24)); }

void run_grouped_fp4(const GroupedCase& c, uint32_t seed) {
  const int64_t G = int64_t(c.sizes.size()), n = c.n, k = c.k, kb = k / 32;
  SCOPED_TRACE(::testing::Message() << "fp4 groups=" << G << " n=" << n << " k=" << k << " bf16_out=" << c.bf16_out);
  std::vector<int32_t> starts(size_t(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) starts[size_t(g + 1)] = starts[size_t(g)] + c.sizes[size_t(g)];
  const int64_t rows = starts[size_t(G)];
  std::mt19937 rng(seed);
  std::vector<uint8_t> w4(size_t(G * n * k / 2));
  for (auto& b : w4) b = uint8_t(rng());
  // The e4m3 copy [G, n, k] of the codes (low nibble = even k).
  std::vector<uint8_t> w8(size_t(G * n * k));
  for (size_t i = 0; i < w8.size(); ++i) w8[i] = e2m1_to_e4m3_code(uint8_t((w4[i / 2] >> (4 * (i & 1))) & 15));
  for (size_t i = 0; i < w8.size(); ++i)
    ASSERT_EQ(e4m3_to_f32(w8[i]), e2m1_to_f32(uint8_t((w4[i / 2] >> (4 * (i & 1))) & 15))) << i;
  const int64_t nsb = (n + 31) / 32;
  const std::vector<uint8_t> tile_s = random_e8m0_scales(rng, size_t(G * nsb * kb));
  std::vector<uint8_t> row_s(size_t(G * n * kb));  // the tile scales per row
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < kb; ++b)
        row_s[size_t((g * n + r) * kb + b)] = tile_s[size_t((g * nsb + r / 32) * kb + b)];
  const std::vector<uint8_t> free_s = random_e8m0_scales(rng, size_t(G * n * kb));
  const std::vector<float> x = random_block_activations(rng, rows, k);

  DeviceBuffer<float> dx(x), dxs(size_t(rows * k / 32)), dy4(size_t(rows * n)), dy8(size_t(rows * n));
  DeviceBuffer<uint8_t> dxq(size_t(rows * k)), dw4(w4), dw8(w8), dts(tile_s), drs(row_s), dfs(free_s);
  DeviceBuffer<int32_t> dstarts(starts);
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, dxq.get(), dxs.get(), nullptr));
  const size_t ob = c.bf16_out ? 2 : 4;
  ASSERT_EQ(cudaMemset(dy4.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy8.get(), 0xee, size_t(rows * n) * 4), cudaSuccess);
  GemmFp8GroupedParams gp;
  gp.xq = dxq.get(), gp.xs = dxs.get(), gp.row_start = dstarts.get(), gp.bf16_out = c.bf16_out;
  gp.groups = G, gp.rows = rows, gp.n = n, gp.k = k, gp.w_block = 32;
  GemmFp8GroupedParams g8 = gp, g4 = gp;
  g8.w = dw8.get(), g8.w_scale = dts.get(), g8.y = dy8.get();
  g4.w = dw4.get(), g4.w_scale = drs.get(), g4.y = dy4.get(), g4.w_format = WeightFormat::kFp4;
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(g8, nullptr));
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(g4, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const std::vector<float> y4 = dy4.to_host(), y8 = dy8.to_host();
    const size_t bytes = size_t(rows * n) * ob;
    size_t diff = 0;
    for (size_t i = 0; i < bytes; ++i)
      diff += reinterpret_cast<const uint8_t*>(y4.data())[i] != reinterpret_cast<const uint8_t*>(y8.data())[i];
    ASSERT_EQ(diff, 0u) << "FP4 != FP8 on the e4m3 copy with the same (tile) scales";
  }

  // Free per-row scales against the CPU twin.
  g4.w_scale = dfs.get();
  ASSERT_EQ(cudaMemset(dy4.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(g4, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y4 = dy4.to_host();
  std::vector<uint8_t> xq = dxq.to_host(), xqa(xq), w4a(w4);
  const std::vector<float> xs = dxs.to_host();
  for (auto& b : xqa) b &= 0x7f;
  for (auto& b : w4a) b &= 0x77;  // |code| of both nibbles
  std::vector<float> ref(size_t(rows * n)), bound(ref.size());
  GemmFp8GroupedParams hp = g4;
  hp.xq = xq.data(), hp.xs = xs.data(), hp.w = w4.data(), hp.w_scale = free_s.data(), hp.row_start = starts.data();
  hp.y = ref.data(), hp.bf16_out = false;
  FS_ASSERT_OK(gemm_fp8_grouped_ref(hp));
  hp.xq = xqa.data(), hp.w = w4a.data(), hp.y = bound.data();
  FS_ASSERT_OK(gemm_fp8_grouped_ref(hp));
  for (int64_t i = 0; i < rows * n; ++i) {
    float got;
    if (c.bf16_out) got = bf16_to_f32(reinterpret_cast<const uint16_t*>(y4.data())[i]);
    else got = y4[size_t(i)];
    ASSERT_TRUE(std::isfinite(got)) << "output " << i << " not written or not finite";
    const double tol = std::ldexp(double(bound[size_t(i)]), -8) + (c.bf16_out ? std::fabs(ref[size_t(i)]) / 128 : 0.0) + 1e-30;
    ASSERT_LE(std::fabs(double(got) - ref[size_t(i)]), tol) << "row " << i / n << " col " << i % n;
  }

  // x_f16: the same codes as f16 values (the quantisation's f16_codes output) and f16 tensor-core
  // steps per 32-block: every product exact and summed at FP32 precision, so the result is within
  // FP32 roundings of Σ|x_q·w| of the twin (an FP32 dot of the same products: error
  // ≤ (k/8 + 3)·2^-24·Σ; the GPU's promotion adds k/32 more roundings, its tensor-core sums
  // truncate below ~2^-23 of a block's largest product). Held to 2^-16·Σ per element (256x
  // tighter than the e4m3 wgmma's 2^-8) and 2^-20·Σ on average (the e4m3 wgmma's ~14-bit block
  // sums: mean 5e-5·Σ, 50x that).
  DeviceBuffer<uint16_t> dxh(size_t(rows * k));
  DeviceBuffer<float> dxsh(size_t(rows * k / 32)), dyh(size_t(rows * n));
  ASSERT_TRUE(dxh.ok() && dxsh.ok() && dyh.ok());
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, reinterpret_cast<uint8_t*>(dxh.get()),
                                      dxsh.get(), nullptr, /*f16_codes=*/true));
  ASSERT_EQ(cudaMemset(dyh.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  GemmFp8GroupedParams gh = g4;
  gh.xq = reinterpret_cast<const uint8_t*>(dxh.get()), gh.xs = dxsh.get(), gh.y = dyh.get(), gh.x_f16 = true;
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gh, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> xh = dxh.to_host();
  const std::vector<float> xsh = dxsh.to_host(), yh = dyh.to_host();
  for (size_t i = 0; i < xq.size(); ++i)
    ASSERT_EQ(f16_to_f32(xh[i]), e4m3_to_f32(xq[i])) << "f16 code " << i << " is not the e4m3 code's value";
  ASSERT_EQ(0, std::memcmp(xsh.data(), xs.data(), xs.size() * 4)) << "f16_codes changed the scales";
  double worst = 0, mean = 0;
  for (int64_t i = 0; i < rows * n; ++i) {
    float got;
    if (c.bf16_out) got = bf16_to_f32(reinterpret_cast<const uint16_t*>(yh.data())[i]);
    else got = yh[size_t(i)];
    ASSERT_TRUE(std::isfinite(got)) << "x_f16 output " << i << " not written or not finite";
    const double err = std::fabs(double(got) - ref[size_t(i)]);
    const double tol = std::ldexp(double(bound[size_t(i)]), -16) + (c.bf16_out ? std::fabs(ref[size_t(i)]) / 128 : 0.0) + 1e-30;
    ASSERT_LE(err, tol) << "x_f16: row " << i / n << " col " << i % n << " gpu " << got << " ref " << ref[size_t(i)];
    const double rel = err / (double(bound[size_t(i)]) + 1e-30);
    worst = std::max(worst, rel), mean += rel / double(rows * n);
  }
  if (!c.bf16_out) {
    EXPECT_LE(mean, std::ldexp(1.0, -20)) << "x_f16: mean |error| / Σ|x_q·w|";
  }
  std::printf("grouped fp4 x_f16 n=%lld k=%lld bf16_out=%d: |err| / Σ|x_q·w| worst %.2e mean %.2e\n", (long long)n,
              (long long)k, int(c.bf16_out), worst, mean);

  // x_bf16: the activations as BF16 values (bf16_values: code · scale, exact), W expanded to BF16
  // with its per-row scales folded in (both the one- and the two-multiply expansion: the scales
  // reach 2^2, and 2^126 · 2^2 passes 2^127), every product exact and summed in FP32 over all of
  // k: within bf16_gemm_tol of the twin.
  DeviceBuffer<uint16_t> dxb(size_t(rows * k));
  ASSERT_TRUE(dxb.ok());
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, reinterpret_cast<uint8_t*>(dxb.get()),
                                      dxsh.get(), nullptr, false, false, /*bf16_values=*/true));
  ASSERT_EQ(cudaMemset(dyh.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  GemmFp8GroupedParams gb = g4;
  gb.xq = reinterpret_cast<const uint8_t*>(dxb.get()), gb.xs = nullptr, gb.y = dyh.get(), gb.x_bf16 = true;
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gb, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> xb = dxb.to_host();
  const std::vector<float> yb = dyh.to_host();
  for (size_t i = 0; i < xq.size(); ++i)
    ASSERT_EQ(bf16_to_f32(xb[i]), e4m3_to_f32(xq[i]) * xs[i / 32]) << "BF16 value " << i << " is not code · scale";
  worst = 0, mean = 0;
  for (int64_t i = 0; i < rows * n; ++i) {
    float got;
    if (c.bf16_out) got = bf16_to_f32(reinterpret_cast<const uint16_t*>(yb.data())[i]);
    else got = yb[size_t(i)];
    ASSERT_TRUE(std::isfinite(got)) << "x_bf16 output " << i << " not written or not finite";
    const double err = std::fabs(double(got) - ref[size_t(i)]);
    const double tol = bf16_gemm_tol(k) * double(bound[size_t(i)]) + (c.bf16_out ? std::fabs(ref[size_t(i)]) / 128 : 0.0) + 1e-30;
    ASSERT_LE(err, tol) << "x_bf16: row " << i / n << " col " << i % n << " gpu " << got << " ref " << ref[size_t(i)];
    const double rel = err / (double(bound[size_t(i)]) + 1e-30);
    worst = std::max(worst, rel), mean += rel / double(rows * n);
  }
  if (!c.bf16_out) {
    EXPECT_LE(mean, std::ldexp(1.0, -20)) << "x_bf16: mean |error| / Σ|x_q·w|";
  }
  std::printf("grouped fp4 x_bf16 n=%lld k=%lld bf16_out=%d: |err| / Σ|x_q·w| worst %.2e mean %.2e\n", (long long)n,
              (long long)k, int(c.bf16_out), worst, mean);
}

TEST(CudaGemmFp8, GroupedFp4MatchesFp8CopyAndCpuTwin) {
  FS_REQUIRE_GPU();
  std::vector<GroupedCase> cases = {
      {{0, 1, 127, 129, 0, 300, 5, 128, 0}, 200, 384, 32, false},
      {{129, 0, 1, 127, 64}, 256, 640, 32, true},
      {{3, 0, 70}, 33, 128, 32, false},  // odd n, a partial 32-row scale tile
  };
  std::mt19937 rng(9);
  GroupedCase many{{}, 128, 256, 32, false};
  for (int g = 0; g < 384; ++g) many.sizes.push_back(int32_t(rng() % 5 == 0 ? 0 : rng() % 41));
  cases.push_back(many);
  uint32_t seed = 170;
  for (const auto& c : cases) {
    run_grouped_fp4(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// The CPU twin's FP4 format against its FP8 format on the e4m3 copy (tile scales): the same sums
// in the same order, so the same bits. Runs without a GPU.
TEST(CudaGemmFp8, GroupedFp4TwinMatchesFp8TwinOnCopy) {
  const int64_t G = 3, n = 40, k = 256, kb = k / 32, nsb = (n + 31) / 32;
  std::vector<int32_t> starts = {0, 5, 5, 12};
  const int64_t rows = 12;
  std::mt19937 rng(3);
  std::vector<uint8_t> w4(size_t(G * n * k / 2)), w8(size_t(G * n * k)), xq(size_t(rows * k));
  for (auto& b : w4) b = uint8_t(rng());
  for (size_t i = 0; i < w8.size(); ++i) w8[i] = e2m1_to_e4m3_code(uint8_t((w4[i / 2] >> (4 * (i & 1))) & 15));
  const std::vector<uint8_t> ts = random_e8m0_scales(rng, size_t(G * nsb * kb)), xc = random_fp8_codes(rng, xq.size());
  std::vector<uint8_t> rs(size_t(G * n * kb));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < kb; ++b) rs[size_t((g * n + r) * kb + b)] = ts[size_t((g * nsb + r / 32) * kb + b)];
  std::vector<float> xs(size_t(rows * kb));
  for (auto& v : xs) v = std::ldexp(1.0f, int(rng() % 9) - 6);
  std::vector<float> y4(size_t(rows * n)), y8(y4.size());
  GemmFp8GroupedParams p;
  p.xq = xc.data(), p.xs = xs.data(), p.row_start = starts.data(), p.groups = G, p.rows = rows, p.n = n, p.k = k;
  GemmFp8GroupedParams p4 = p, p8 = p;
  p8.w = w8.data(), p8.w_scale = ts.data(), p8.y = y8.data();
  p4.w = w4.data(), p4.w_scale = rs.data(), p4.y = y4.data(), p4.w_format = WeightFormat::kFp4;
  FS_ASSERT_OK(gemm_fp8_grouped_ref(p8));
  FS_ASSERT_OK(gemm_fp8_grouped_ref(p4));
  ASSERT_EQ(0, std::memcmp(y4.data(), y8.data(), y4.size() * 4));
  bool any_nonzero = false;
  for (float v : y4) any_nonzero |= v != 0.0f;
  EXPECT_TRUE(any_nonzero);
  p4.w_block = 128;
  const Status s = gemm_fp8_grouped_ref(p4);
  EXPECT_NE(s.message().find("1 x 32"), std::string::npos) << s.message();
}

// FP8 weights in the x_f16 mode (the serving path's prefill linears, GemmFp8Params::x_f16, and the
// grouped form with kFp8): x quantised with f16 codes (optionally rounding FP32 inputs to BF16
// first, as the reference's BF16 activations), W e4m3 expanded to f16 in shared memory, tile
// scales looked up per row. Against the CPU twin (the same function, one FP32 dot): within
// 2^-16 · Σ|x_q·w| per element and 2^-20 · Σ on average (FP32-precision block sums, as the FP4
// x_f16 case above); BF16-rounded FP32 outputs within one BF16 step of the twin's rounding. The
// quantisation with bf16_round_in equals the plain one on BF16-rounded inputs, bit for bit. Odd m
// and n (tails of the 128 tiles), both scale granularities, a grouped launch with empty groups.
struct F16Case {
  int64_t m, n, k, w_block, act_block;
  bool round_in, round_out;
};

void run_f16_fp8(const F16Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "f16/fp8 m=" << c.m << " n=" << c.n << " k=" << c.k << " wb=" << c.w_block
                                    << " ab=" << c.act_block << " round_in=" << c.round_in
                                    << " round_out=" << c.round_out);
  std::mt19937 rng(seed);
  const size_t ns = size_t((c.n + c.w_block - 1) / c.w_block * (c.k / c.w_block));
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.n * c.k)), ws = random_e8m0_scales(rng, ns);
  std::vector<float> x = random_block_activations(rng, c.m, c.k);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1.0f + 1.0f / 1024;  // values BF16 rounding changes
  std::vector<float> xr(x);
  if (c.round_in)
    for (auto& v : xr) v = round_bf16(v);
  DeviceBuffer<float> dx(x), dxr(xr), dxs(size_t(c.m * c.k / 32)), dxs2(size_t(c.m * c.k / 32)), dy(size_t(c.m * c.n));
  DeviceBuffer<uint16_t> dxh(size_t(c.m * c.k)), dxh2(size_t(c.m * c.k));
  DeviceBuffer<uint8_t> dw(w), dws(ws);
  ASSERT_TRUE(dx.ok() && dxr.ok() && dxs.ok() && dxs2.ok() && dy.ok() && dxh.ok() && dxh2.ok() && dw.ok() && dws.ok());
  auto* xh = reinterpret_cast<uint8_t*>(dxh.get());
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, c.m, c.k, c.act_block, xh, dxs.get(), nullptr,
                                      /*f16_codes=*/true, /*bf16_round_in=*/c.round_in));
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dxr.get(), ActDtype::kF32, c.m, c.k, c.act_block,
                                      reinterpret_cast<uint8_t*>(dxh2.get()), dxs2.get(), nullptr, true));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> codes = dxh.to_host();
  const std::vector<float> scales = dxs.to_host();
  {
    const std::vector<uint16_t> codes2 = dxh2.to_host();
    const std::vector<float> scales2 = dxs2.to_host();
    ASSERT_EQ(0, std::memcmp(codes.data(), codes2.data(), codes.size() * 2)) << "bf16_round_in codes";
    ASSERT_EQ(0, std::memcmp(scales.data(), scales2.data(), scales.size() * 4)) << "bf16_round_in scales";
  }
  // The twin on the same f16 codes; the bound on |codes|, |W|.
  GemmFp8Params hp;
  hp.m = c.m, hp.n = c.n, hp.k = c.k, hp.w_block = c.w_block, hp.act_block = c.act_block, hp.x_f16 = true;
  std::vector<float> ref(size_t(c.m * c.n)), bound(ref.size());
  std::vector<uint16_t> codes_abs(codes);
  for (auto& h : codes_abs) h &= 0x7fff;
  std::vector<uint8_t> wa(w);
  for (auto& b : wa) b &= 0x7f;
  hp.xq = reinterpret_cast<const uint8_t*>(codes.data()), hp.xs = scales.data(), hp.w = w.data(), hp.w_scale = ws.data();
  hp.y = ref.data();
  FS_ASSERT_OK(gemm_fp8_ref(hp));
  hp.xq = reinterpret_cast<const uint8_t*>(codes_abs.data()), hp.w = wa.data(), hp.y = bound.data();
  FS_ASSERT_OK(gemm_fp8_ref(hp));
  auto check = [&](const std::vector<float>& got, const char* what) {
    double worst = 0, mean = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": output " << i << " not written or not finite";
      const double r = c.round_out ? round_bf16(ref[i]) : ref[i];
      const double err = std::fabs(double(got[i]) - r);
      if (c.round_out) {
        ASSERT_EQ(got[i], round_bf16(got[i])) << what << ": output " << i << " is not a BF16 value";
        // Two FP32 sums within 2^-16·Σ of each other round to the same or neighbouring BF16 values.
        ASSERT_LE(err, std::ldexp(double(bound[i]), -16) + std::fabs(ref[i]) / 128 + 1e-30) << what << " " << i;
        continue;
      }
      ASSERT_LE(err, std::ldexp(double(bound[i]), -16) + 1e-30)
          << what << ": row " << i / c.n << " col " << i % c.n << " gpu " << got[i] << " ref " << ref[i];
      const double rel = err / (double(bound[i]) + 1e-30);
      worst = std::max(worst, rel), mean += rel / double(ref.size());
    }
    if (!c.round_out) {
      EXPECT_LE(mean, std::ldexp(1.0, -20)) << what << ": mean |error| / Σ|x_q·w|";
    }
    std::printf("%s fp8 x_f16 m=%lld n=%lld k=%lld wb=%lld: |err| / Σ|x_q·w| worst %.2e mean %.2e\n", what,
                (long long)c.m, (long long)c.n, (long long)c.k, (long long)c.w_block, worst, mean);
  };
  GemmFp8Params p = hp;
  p.xq = xh, p.xs = dxs.get(), p.w = dw.get(), p.w_scale = dws.get(), p.y = dy.get(), p.bf16_round_out = c.round_out;
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, ref.size() * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y1 = dy.to_host();
  check(y1, "dense");
  if (::testing::Test::HasFatalFailure()) return;
  // Deterministic: the same launch gives the same bits.
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y2 = dy.to_host();
  ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  // The grouped launch with one weight (groups 2, the first empty): the same bits per row.
  const std::vector<int32_t> starts = {0, 0, int32_t(c.m)};
  std::vector<uint8_t> w2(size_t(2 * c.n * c.k)), ws2(2 * ns);
  std::copy(w.begin(), w.end(), w2.begin() + c.n * c.k);
  std::copy(ws.begin(), ws.end(), ws2.begin() + int64_t(ns));
  DeviceBuffer<int32_t> dst(starts);
  DeviceBuffer<uint8_t> dw2(w2), dws2(ws2);
  ASSERT_TRUE(dst.ok() && dw2.ok() && dws2.ok());
  GemmFp8GroupedParams gp;
  gp.xq = xh, gp.xs = dxs.get(), gp.w = dw2.get(), gp.w_scale = dws2.get(), gp.row_start = dst.get(), gp.y = dy.get();
  gp.groups = 2, gp.rows = c.m, gp.n = c.n, gp.k = c.k, gp.w_block = c.w_block, gp.x_f16 = true;
  gp.bf16_round_out = c.round_out;
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, ref.size() * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gp, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y3 = dy.to_host();
  ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4)) << "grouped x_f16 != dense x_f16";
}

TEST(CudaGemmFp8, F16ModeFp8WeightsMatchCpuTwin) {
  FS_REQUIRE_GPU();
  const F16Case cases[] = {
      {1, 1, 128, 32, 32, false, false},      {7, 33, 256, 32, 32, true, false},
      {129, 200, 384, 128, 128, false, true}, {300, 4096, 1024, 128, 128, true, true},
      {513, 257, 7168, 128, 128, false, false}, {256, 512, 4096, 32, 32, true, true},
  };
  uint32_t seed = 300;
  for (const auto& c : cases) {
    run_f16_fp8(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// The x_bf16 mode with FP8 weights (the serving path's prefill linears): the quantisation's BF16
// values equal code · scale of the e4m3 quantisation, bit for bit (with and without the BF16
// input rounding); the GEMM within bf16_gemm_tol of the twin (and 2^-20 · Σ on average), BF16-
// rounded outputs within one BF16 step; deterministic; the grouped launch with one weight gives the
// dense launch's bits. Large weight scales (2^10: 2^120 · 2^10 passes 2^127, the two-multiply
// expansion) in one case; odd m and n; both scale granularities.
struct Bf16Case {
  int64_t m, n, k, w_block, act_block;
  bool round_in, round_out, big_scales;
};

void run_bf16_fp8(const Bf16Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "bf16/fp8 m=" << c.m << " n=" << c.n << " k=" << c.k << " wb=" << c.w_block
                                    << " ab=" << c.act_block << " round_in=" << c.round_in
                                    << " round_out=" << c.round_out << " big=" << c.big_scales);
  std::mt19937 rng(seed);
  const size_t ns = size_t((c.n + c.w_block - 1) / c.w_block * (c.k / c.w_block));
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.n * c.k));
  std::vector<uint8_t> ws = random_e8m0_scales(rng, ns);
  if (c.big_scales)
    for (size_t i = 0; i < ws.size(); i += 3) ws[i] = 127 + 10;
  std::vector<float> x = random_block_activations(rng, c.m, c.k);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1.0f + 1.0f / 1024;  // values BF16 rounding changes
  DeviceBuffer<float> dx(x), dxs(size_t(c.m * c.k / 32)), dxs8(size_t(c.m * c.k / 32)), dy(size_t(c.m * c.n));
  DeviceBuffer<uint16_t> dxb(size_t(c.m * c.k));
  DeviceBuffer<uint8_t> dxq(size_t(c.m * c.k)), dw(w), dws(ws);
  ASSERT_TRUE(dx.ok() && dxs.ok() && dxs8.ok() && dy.ok() && dxb.ok() && dxq.ok() && dw.ok() && dws.ok());
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, c.m, c.k, c.act_block,
                                      reinterpret_cast<uint8_t*>(dxb.get()), dxs.get(), nullptr, false, c.round_in,
                                      /*bf16_values=*/true));
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, c.m, c.k, c.act_block, dxq.get(), dxs8.get(), nullptr,
                                      false, c.round_in));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> xb = dxb.to_host();
  {
    const std::vector<uint8_t> q8 = dxq.to_host();
    const std::vector<float> s8 = dxs8.to_host();
    for (size_t i = 0; i < xb.size(); ++i)
      ASSERT_EQ(bf16_to_f32(xb[i]), e4m3_to_f32(q8[i]) * s8[i / 32]) << "BF16 value " << i << " is not code · scale";
  }
  GemmFp8Params hp;
  hp.m = c.m, hp.n = c.n, hp.k = c.k, hp.w_block = c.w_block, hp.act_block = c.act_block, hp.x_bf16 = true;
  std::vector<float> ref(size_t(c.m * c.n)), bound(ref.size());
  std::vector<uint16_t> xb_abs(xb);
  for (auto& h : xb_abs) h &= 0x7fff;
  std::vector<uint8_t> wa(w);
  for (auto& b : wa) b &= 0x7f;
  hp.xq = reinterpret_cast<const uint8_t*>(xb.data()), hp.w = w.data(), hp.w_scale = ws.data(), hp.y = ref.data();
  FS_ASSERT_OK(gemm_fp8_ref(hp));
  hp.xq = reinterpret_cast<const uint8_t*>(xb_abs.data()), hp.w = wa.data(), hp.y = bound.data();
  FS_ASSERT_OK(gemm_fp8_ref(hp));
  const double tol_rel = bf16_gemm_tol(c.k);
  GemmFp8Params p = hp;
  p.xq = reinterpret_cast<const uint8_t*>(dxb.get()), p.w = dw.get(), p.w_scale = dws.get(), p.y = dy.get();
  p.bf16_round_out = c.round_out;
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, ref.size() * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y1 = dy.to_host();
  double worst = 0, mean = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y1[i])) << "output " << i << " not written or not finite";
    const double r = c.round_out ? round_bf16(ref[i]) : ref[i];
    const double err = std::fabs(double(y1[i]) - r);
    if (c.round_out) {
      ASSERT_EQ(y1[i], round_bf16(y1[i])) << "output " << i << " is not a BF16 value";
      ASSERT_LE(err, tol_rel * double(bound[i]) + std::fabs(ref[i]) / 128 + 1e-30) << i;
      continue;
    }
    ASSERT_LE(err, tol_rel * double(bound[i]) + 1e-30)
        << "row " << i / c.n << " col " << i % c.n << " gpu " << y1[i] << " ref " << ref[i];
    const double rel = err / (double(bound[i]) + 1e-30);
    worst = std::max(worst, rel), mean += rel / double(ref.size());
  }
  if (!c.round_out) {
    EXPECT_LE(mean, std::ldexp(1.0, -20)) << "mean |error| / Σ|x_q·w|";
  }
  std::printf("dense fp8 x_bf16 m=%lld n=%lld k=%lld wb=%lld big=%d: |err| / Σ|x_q·w| worst %.2e mean %.2e (bound %.2e)\n",
              (long long)c.m, (long long)c.n, (long long)c.k, (long long)c.w_block, int(c.big_scales), worst, mean,
              tol_rel);
  FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y2 = dy.to_host();
  ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "not deterministic";
  const std::vector<int32_t> starts = {0, 0, int32_t(c.m)};
  std::vector<uint8_t> w2(size_t(2 * c.n * c.k)), ws2(2 * ns);
  std::copy(w.begin(), w.end(), w2.begin() + c.n * c.k);
  std::copy(ws.begin(), ws.end(), ws2.begin() + int64_t(ns));
  DeviceBuffer<int32_t> dst(starts);
  DeviceBuffer<uint8_t> dw2(w2), dws2(ws2);
  ASSERT_TRUE(dst.ok() && dw2.ok() && dws2.ok());
  GemmFp8GroupedParams gp;
  gp.xq = p.xq, gp.w = dw2.get(), gp.w_scale = dws2.get(), gp.row_start = dst.get(), gp.y = dy.get();
  gp.groups = 2, gp.rows = c.m, gp.n = c.n, gp.k = c.k, gp.w_block = c.w_block, gp.x_bf16 = true;
  gp.bf16_round_out = c.round_out;
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, ref.size() * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gp, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y3 = dy.to_host();
  ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4)) << "grouped x_bf16 != dense x_bf16";
}

TEST(CudaGemmFp8, Bf16ModeFp8WeightsMatchCpuTwin) {
  FS_REQUIRE_GPU();
  const Bf16Case cases[] = {
      {1, 1, 128, 32, 32, false, false, false},       {7, 33, 256, 32, 32, true, false, true},
      {129, 200, 384, 128, 128, false, true, false},  {300, 4096, 1024, 128, 128, true, true, true},
      {513, 257, 7168, 128, 128, false, false, false}, {256, 512, 4096, 32, 32, true, false, true},
      {1000, 1536, 4096, 128, 128, false, false, false},
  };
  uint32_t seed = 900;
  for (const auto& c : cases) {
    run_bf16_fp8(c, seed++);
    if (HasFatalFailure()) return;
  }
}

// BF16 weights (w_bf16, the compressor's and indexer's projections of long prefill chunks): x BF16
// values (gemm_bf16_pack_cuda of BF16-valued FP32), W BF16 bits loaded as they are, against the
// twin within bf16_gemm_tol (mean 2^-20 · Σ|x·w|), rounded outputs BF16 values within one step;
// odd m and n, widths 16..1024 as the model's; w_bf16 without x_bf16 refused.
TEST(CudaGemmFp8, Bf16WeightsMatchCpuTwin) {
  FS_REQUIRE_GPU();
  struct C {
    int64_t m, n, k;
    bool round_out;
  };
  const C cases[] = {{1, 16, 128, false}, {129, 32, 5120, true}, {300, 512, 5120, false}, {1024, 1024, 4096, false},
                     {77, 200, 384, true}};
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const C& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " round=" << c.round_out);
    std::vector<float> x(size_t(c.m * c.k));
    for (auto& v : x) v = round_bf16(nd(rng) * (rng() % 16 == 0 ? 100.0f : 1.0f));
    std::vector<uint16_t> w(size_t(c.n * c.k)), wa(w.size()), xb(x.size()), xba(x.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(nd(rng) * 0.02f), wa[i] = w[i] & 0x7fff;
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]), xba[i] = xb[i] & 0x7fff;
    DeviceBuffer<float> dx(x), dy(size_t(c.m * c.n));
    DeviceBuffer<uint16_t> dxb(x.size()), dw(w);
    ASSERT_TRUE(dx.ok() && dy.ok() && dxb.ok() && dw.ok());
    FS_ASSERT_OK(gemm_bf16_pack_cuda(dx.get(), int64_t(x.size()), dxb.get(), nullptr));
    ASSERT_EQ(cudaMemset(dy.get(), 0xff, size_t(c.m * c.n) * 4), cudaSuccess);
    GemmFp8Params p;
    p.m = c.m, p.n = c.n, p.k = c.k, p.x_bf16 = true, p.w_bf16 = true, p.bf16_round_out = c.round_out;
    p.xq = reinterpret_cast<const uint8_t*>(dxb.get()), p.w = reinterpret_cast<const uint8_t*>(dw.get()), p.y = dy.get();
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> ref(size_t(c.m * c.n)), bound(ref.size());
    GemmFp8Params h = p;
    h.xq = reinterpret_cast<const uint8_t*>(xb.data()), h.w = reinterpret_cast<const uint8_t*>(w.data()), h.y = ref.data();
    FS_ASSERT_OK(gemm_fp8_ref(h));
    h.xq = reinterpret_cast<const uint8_t*>(xba.data()), h.w = reinterpret_cast<const uint8_t*>(wa.data());
    h.y = bound.data(), h.bf16_round_out = false;
    FS_ASSERT_OK(gemm_fp8_ref(h));
    const std::vector<float> y = dy.to_host();
    const double tol_rel = bf16_gemm_tol(c.k);
    double worst = 0, mean = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << "output " << i << " not written";
      const double err = std::fabs(double(y[i]) - (c.round_out ? round_bf16(ref[i]) : ref[i]));
      ASSERT_LE(err, tol_rel * bound[i] + (c.round_out ? std::fabs(ref[i]) / 128 : 0.0) + 1e-30)
          << "row " << i / c.n << " col " << i % c.n << " gpu " << y[i] << " ref " << ref[i];
      if (c.round_out) {
        ASSERT_EQ(y[i], round_bf16(y[i])) << i;
        continue;
      }
      const double rel = err / (double(bound[i]) + 1e-30);
      worst = std::max(worst, rel), mean += rel / double(y.size());
    }
    if (!c.round_out) {
      EXPECT_LE(mean, std::ldexp(1.0, -20));
    }
    std::printf("bf16 weights m=%lld n=%lld k=%lld: |err| / Σ|x·w| worst %.2e mean %.2e\n", (long long)c.m,
                (long long)c.n, (long long)c.k, worst, mean);
  }
  GemmFp8Params bad;
  std::vector<uint16_t> one(128);
  std::vector<float> out(1);
  bad.m = 1, bad.n = 1, bad.k = 128, bad.w_bf16 = true, bad.w = reinterpret_cast<const uint8_t*>(one.data());
  bad.xq = reinterpret_cast<const uint8_t*>(one.data()), bad.xs = out.data(), bad.y = out.data();
  EXPECT_NE(validate(bad).message().find("x_bf16"), std::string::npos);
}

// Eight FP4 experts [256, 384], some without rows: the row starts, e2m1 codes (two per byte), one
// E8M0 scale per row and 32-block, and the stacked activations of all rows.
struct Fp4Experts {
  static constexpr int64_t n = 256, k = 384;
  std::vector<int32_t> sizes{0, 130, 1, 0, 257, 64, 0, 3}, starts;
  int64_t G = 0, rows = 0;
  std::vector<uint8_t> w4, s4;
  std::vector<float> x;
  explicit Fp4Experts(std::mt19937& rng) : G(int64_t(sizes.size())) {
    starts.assign(size_t(G + 1), 0);
    for (int64_t g = 0; g < G; ++g) starts[size_t(g + 1)] = starts[size_t(g)] + sizes[size_t(g)];
    rows = starts.back();
    w4.resize(size_t(G * n * k / 2));
    for (auto& b : w4) b = uint8_t(rng());
    s4 = random_e8m0_scales(rng, size_t(G * n * (k / 32)));
    x = random_block_activations(rng, rows, k);
  }
};

// The weight expansion (gemm_expand_bf16_cuda) and the x_bf16 GEMMs over its output (w_bf16): the
// expansion equals its twin bit for bit (FP8 with both tile sizes, odd n, scales up to 2^60 so the
// two-multiply expansion runs; FP4 with experts skipped by row_start left as they were), and the
// GEMMs over the expanded weights give exactly the bits of the x_bf16 GEMMs that expand each tile
// themselves: dense FP8, grouped FP4, and the grouped FP4 GEMM run in chunks of experts through
// row_start + e0 (the serving path's kMoeExpandChunkBytes chunks).
TEST(CudaGemmFp8, ExpandedWeightsGiveTheInKernelExpansionsBits) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(31);
  struct D {
    int64_t m, n, k, wb;
  };
  for (const D c : {D{300, 257, 384, 128}, D{129, 96, 256, 32}, D{7, 1536, 1024, 128}}) {
    SCOPED_TRACE(::testing::Message() << "dense m " << c.m << " n " << c.n << " k " << c.k << " wb " << c.wb);
    const int64_t nsb = (c.n + c.wb - 1) / c.wb, kbw = c.k / c.wb;
    const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.n * c.k));
    std::vector<uint8_t> ws = random_e8m0_scales(rng, size_t(nsb * kbw));
    for (size_t i = 0; i < ws.size(); i += 4) ws[i] = uint8_t(127 + 10 + int(rng() % 50));
    const std::vector<float> x = random_block_activations(rng, c.m, c.k);
    DeviceBuffer<float> dx(x), dxs(size_t(c.m * c.k / 32)), dy1(size_t(c.m * c.n)), dy2(size_t(c.m * c.n));
    DeviceBuffer<uint16_t> dxb(size_t(c.m * c.k)), dwe(size_t(c.n * c.k));
    DeviceBuffer<uint8_t> dw(w), dws(ws);
    ASSERT_TRUE(dx.ok() && dxs.ok() && dy1.ok() && dy2.ok() && dxb.ok() && dwe.ok() && dw.ok() && dws.ok());
    GemmExpandBf16Params ep;
    ep.w = dw.get(), ep.w_scale = dws.get(), ep.y = dwe.get(), ep.n = c.n, ep.k = c.k, ep.w_block = c.wb;
    FS_ASSERT_OK(gemm_expand_bf16_cuda(ep, nullptr));
    std::vector<uint16_t> twin(size_t(c.n * c.k));
    GemmExpandBf16Params hp = ep;
    hp.w = w.data(), hp.w_scale = ws.data(), hp.y = twin.data();
    FS_ASSERT_OK(gemm_expand_bf16_ref(hp));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(dwe.to_host(), twin) << "expansion != twin";
    FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, c.m, c.k, c.wb == 32 ? 32 : 128,
                                        reinterpret_cast<uint8_t*>(dxb.get()), dxs.get(), nullptr, false, true,
                                        /*bf16_values=*/true));
    GemmFp8Params p;
    p.m = c.m, p.n = c.n, p.k = c.k, p.w_block = c.wb, p.act_block = c.wb == 32 ? 32 : 128, p.x_bf16 = true;
    p.bf16_round_out = c.m == 129;
    p.xq = reinterpret_cast<const uint8_t*>(dxb.get()), p.w = dw.get(), p.w_scale = dws.get(), p.y = dy1.get();
    ASSERT_EQ(cudaMemset(dy1.get(), 0xff, size_t(c.m * c.n) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(dy2.get(), 0xee, size_t(c.m * c.n) * 4), cudaSuccess);
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    GemmFp8Params pe = p;
    pe.w = reinterpret_cast<const uint8_t*>(dwe.get()), pe.w_scale = nullptr, pe.w_bf16 = true, pe.y = dy2.get();
    FS_ASSERT_OK(gemm_fp8_cuda(pe, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host();
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_TRUE(std::isfinite(y1[i])) << i;
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "expanded W != in-kernel expansion";
  }

  // Grouped FP4 experts, some without rows.
  const Fp4Experts e(rng);
  const int64_t n = e.n, k = e.k, G = e.G, rows = e.rows;
  const std::vector<int32_t>& starts = e.starts;
  const std::vector<uint8_t>&w4 = e.w4, &s4 = e.s4;
  const std::vector<float>& x = e.x;
  DeviceBuffer<float> dx(x), dxs(size_t(rows * k / 32)), dy1(size_t(rows * n)), dy2(size_t(rows * n)),
      dy3(size_t(rows * n));
  DeviceBuffer<uint16_t> dxb(size_t(rows * k)), dwe(size_t(G * n * k));
  DeviceBuffer<uint8_t> dw4(w4), ds4(s4);
  DeviceBuffer<int32_t> dst(starts);
  ASSERT_TRUE(dx.ok() && dxs.ok() && dy1.ok() && dy2.ok() && dy3.ok() && dxb.ok() && dwe.ok() && dw4.ok() && ds4.ok() &&
              dst.ok());
  ASSERT_EQ(cudaMemset(dwe.get(), 0x5a, size_t(G * n * k) * 2), cudaSuccess);
  GemmExpandBf16Params ep;
  ep.w = dw4.get(), ep.w_scale = ds4.get(), ep.y = dwe.get(), ep.count = G, ep.n = n, ep.k = k, ep.w_block = 32;
  ep.w_format = WeightFormat::kFp4, ep.row_start = dst.get();
  FS_ASSERT_OK(gemm_expand_bf16_cuda(ep, nullptr));
  std::vector<uint16_t> twin(size_t(G * n * k), 0x5a5a);
  GemmExpandBf16Params hp = ep;
  hp.w = w4.data(), hp.w_scale = s4.data(), hp.y = twin.data(), hp.row_start = starts.data();
  FS_ASSERT_OK(gemm_expand_bf16_ref(hp));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(dwe.to_host(), twin) << "FP4 expansion != twin (or an expert without rows was written)";
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, reinterpret_cast<uint8_t*>(dxb.get()),
                                      dxs.get(), nullptr, false, false, /*bf16_values=*/true));
  GemmFp8GroupedParams g;
  g.xq = reinterpret_cast<const uint8_t*>(dxb.get()), g.x_bf16 = true, g.row_start = dst.get();
  g.groups = G, g.rows = rows, g.n = n, g.k = k, g.w_block = 32, g.bf16_round_out = true;
  GemmFp8GroupedParams g4 = g, gb = g;
  g4.w = dw4.get(), g4.w_scale = ds4.get(), g4.w_format = WeightFormat::kFp4, g4.y = dy1.get();
  gb.w = reinterpret_cast<const uint8_t*>(dwe.get()), gb.w_bf16 = true, gb.y = dy2.get();
  for (auto* y : {&dy1, &dy2, &dy3}) ASSERT_EQ(cudaMemset(y->get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(g4, nullptr));
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gb, nullptr));
  for (int64_t e0 = 0; e0 < G; e0 += 3) {  // chunks of three experts
    GemmFp8GroupedParams q = gb;
    q.groups = std::min<int64_t>(3, G - e0), q.row_start = dst.get() + e0;
    q.w = reinterpret_cast<const uint8_t*>(dwe.get() + e0 * n * k), q.y = dy3.get();
    FS_ASSERT_OK(gemm_fp8_grouped_cuda(q, nullptr));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host(), y3 = dy3.to_host();
  for (size_t i = 0; i < y1.size(); ++i) ASSERT_TRUE(std::isfinite(y1[i])) << i;
  ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "grouped: expanded W != in-kernel expansion";
  ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4)) << "grouped in chunks of experts != one launch";
  GemmExpandBf16Params bad = ep;
  bad.y = dwe.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(gemm_expand_bf16_cuda(bad, nullptr).ok());
}

// Grouped FP4 experts in the GEMV fragment order (GemmFp8GroupedParams::w_fragments: the model's
// experts with --gpu-fp4-fragments): every in-kernel route (x_f16, x_bf16 with the converter warps'
// expansion, bf16_direct with the consumers' expansion, and with W in registers) gives the
// row-major experts' bits, some experts without rows; the twin reads the order as the same
// matrices; shapes the kernel does not take (n % 128) and the pre-expanded mode are refused.
TEST(CudaGemmFp8, GroupedFp4FragmentOrderGivesTheRowMajorBits) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(47);
  const Fp4Experts e(rng);
  const int64_t n = e.n, k = e.k, G = e.G, rows = e.rows;
  std::vector<uint8_t> pw(e.w4.size()), ps(e.s4.size());
  FS_ASSERT_OK(pack_fp4_fragments(e.w4.data(), e.s4.data(), G * n, k, pw.data(), ps.data()));
  DeviceBuffer<float> dx(e.x), dxs(size_t(rows * k / 32)), dy1(size_t(rows * n)), dy2(size_t(rows * n));
  DeviceBuffer<uint16_t> dxb(size_t(rows * k));
  DeviceBuffer<uint8_t> dw4(e.w4), ds4(e.s4), dpw(pw), dps(ps);
  DeviceBuffer<int32_t> dst(e.starts);
  ASSERT_TRUE(dx.ok() && dxs.ok() && dy1.ok() && dy2.ok() && dxb.ok() && dw4.ok() && ds4.ok() && dpw.ok() && dps.ok());
  struct Mode {
    const char* name;
    bool bf16, direct, regs;
  };
  int compared = 0;
  for (const Mode md : {Mode{"x_f16", false, false, false}, Mode{"x_bf16", true, false, false},
                        Mode{"bf16_direct", true, true, false}, Mode{"bf16_direct, W in registers", true, true, true}}) {
    SCOPED_TRACE(md.name);
    FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, reinterpret_cast<uint8_t*>(dxb.get()),
                                        dxs.get(), nullptr, /*f16_codes=*/!md.bf16, false, /*bf16_values=*/md.bf16));
    GemmFp8GroupedParams g;
    g.xq = reinterpret_cast<const uint8_t*>(dxb.get()), g.xs = md.bf16 ? nullptr : dxs.get();
    g.x_f16 = !md.bf16, g.x_bf16 = md.bf16, g.bf16_direct = md.direct, g.w_in_registers = md.regs;
    g.row_start = dst.get(), g.groups = G, g.rows = rows, g.n = n, g.k = k, g.w_block = 32;
    g.w_format = WeightFormat::kFp4;
    GemmFp8GroupedParams f = g;
    g.w = dw4.get(), g.w_scale = ds4.get(), g.y = dy1.get();
    f.w = dpw.get(), f.w_scale = dps.get(), f.y = dy2.get(), f.w_fragments = true;
    ASSERT_EQ(cudaMemset(dy1.get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(dy2.get(), 0xee, size_t(rows * n) * 4), cudaSuccess);
    FS_ASSERT_OK(gemm_fp8_grouped_cuda(g, nullptr));
    FS_ASSERT_OK(gemm_fp8_grouped_cuda(f, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host();
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_TRUE(std::isfinite(y1[i])) << i;
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "fragment order != row-major";
    ++compared;
  }
  EXPECT_EQ(compared, 4);
  // The twin: the packed experts are the same matrices (x_f16 codes, a few rows of two experts).
  {
    const std::vector<int32_t> st = {0, 2, 2, 5};  // three experts, the middle one without rows
    const int64_t r = 5, g3 = 3;
    std::vector<uint16_t> xh(size_t(r * k));
    std::vector<float> xs(size_t(r * k / 32));
    for (auto& v : xh) v = f32_to_f16(float(int(rng() % 9) - 4));
    for (auto& v : xs) v = std::ldexp(1.0f, int(rng() % 5) - 2);
    GemmFp8GroupedParams h;
    h.xq = reinterpret_cast<const uint8_t*>(xh.data()), h.xs = xs.data(), h.x_f16 = true;
    h.row_start = st.data(), h.groups = g3, h.rows = r, h.n = n, h.k = k, h.w_format = WeightFormat::kFp4;
    std::vector<float> a(size_t(r * n)), b(a.size());
    h.w = e.w4.data(), h.w_scale = e.s4.data(), h.y = a.data();
    FS_ASSERT_OK(gemm_fp8_grouped_ref(h));
    h.w = pw.data(), h.w_scale = ps.data(), h.y = b.data(), h.w_fragments = true;
    FS_ASSERT_OK(gemm_fp8_grouped_ref(h));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  }
  GemmFp8GroupedParams bad;
  bad.xq = reinterpret_cast<const uint8_t*>(dxb.get()), bad.x_bf16 = true, bad.row_start = dst.get();
  bad.groups = G, bad.rows = rows, bad.n = 96, bad.k = k, bad.w_format = WeightFormat::kFp4;
  bad.w = dpw.get(), bad.w_scale = dps.get(), bad.y = dy2.get(), bad.w_fragments = true;
  EXPECT_FALSE(gemm_fp8_grouped_cuda(bad, nullptr).ok()) << "n = 96";
  bad.n = n, bad.w_bf16 = true;
  EXPECT_FALSE(gemm_fp8_grouped_cuda(bad, nullptr).ok()) << "w_bf16";
}

// The bf16_direct mode's tolerance: the twin's FP32 dot and the tensor core's 16-deep steps as in
// bf16_gemm_tol, plus one truncation of the FP32 accumulator per 16-deep step (k/16 of them, each
// below 2^-23 of the running sum, itself below Σ|x·w|), counted twice for margin.
double bf16_direct_tol(int64_t k) { return bf16_gemm_tol(k) + double(k / 16) * std::ldexp(1.0, -22); }

// The e4m3 codes whose values are integers of magnitude <= 8 (zero included).
std::vector<uint8_t> small_integer_e4m3_codes() {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(uint8_t(c));
    if (std::isfinite(v) && std::fabs(v) <= 8.0f && v == std::floor(v)) codes.push_back(uint8_t(c));
  }
  return codes;
}

// bf16_direct (--prefill-gemm-operands bf16-direct): the x_bf16 GEMMs with the whole of k summed on
// the tensor core. Dense FP8 weights expanded in the kernel and pre-expanded (w_bf16), grouped FP4
// experts (some without rows) both ways: within bf16_direct_tol of the twin (mean below 2^-17 ·
// Σ|x·w|), pre-expanded == in-kernel expansion bitwise (the same values in the same order), a
// row's bits independent of the other rows of the launch (the first rows alone give the same
// bits), each grouped expert's rows the dense launch's bits on that expert alone, deterministic;
// and on integer data whose every partial sum is exact in FP32, the twin's bits exactly.
TEST(CudaGemmFp8, Bf16DirectWithinBoundRowInvariantAndExactOnIntegers) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(4242);
  struct D {
    int64_t m, n, k, wb;
  };
  for (const D c : {D{1, 1, 128, 32}, D{7, 33, 256, 32}, D{300, 4096, 1024, 128}, D{513, 257, 7168, 128},
                    D{1000, 1536, 4096, 32}}) {
    SCOPED_TRACE(::testing::Message() << "dense m " << c.m << " n " << c.n << " k " << c.k << " wb " << c.wb);
    const int64_t ab = c.wb, ns = (c.n + c.wb - 1) / c.wb * (c.k / c.wb);
    const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.n * c.k)), ws = random_e8m0_scales(rng, size_t(ns));
    const std::vector<float> x = random_block_activations(rng, c.m, c.k);
    DeviceBuffer<float> dx(x), dxs(size_t(c.m * c.k / 32)), dy1(size_t(c.m * c.n)), dy2(size_t(c.m * c.n)),
        dy3(size_t(c.m * c.n));
    DeviceBuffer<uint16_t> dxb(size_t(c.m * c.k)), dwe(size_t(c.n * c.k));
    DeviceBuffer<uint8_t> dw(w), dws(ws);
    ASSERT_TRUE(dx.ok() && dxs.ok() && dy1.ok() && dy2.ok() && dy3.ok() && dxb.ok() && dwe.ok() && dw.ok() &&
                dws.ok());
    FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, c.m, c.k, ab, reinterpret_cast<uint8_t*>(dxb.get()),
                                        dxs.get(), nullptr, false, false, /*bf16_values=*/true));
    GemmExpandBf16Params ep;
    ep.w = dw.get(), ep.w_scale = dws.get(), ep.y = dwe.get(), ep.n = c.n, ep.k = c.k, ep.w_block = c.wb;
    FS_ASSERT_OK(gemm_expand_bf16_cuda(ep, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> xb = dxb.to_host();
    std::vector<uint16_t> xba(xb);
    for (auto& h : xba) h &= 0x7fff;
    std::vector<uint8_t> wa(w);
    for (auto& b : wa) b &= 0x7f;
    GemmFp8Params hp;
    hp.m = c.m, hp.n = c.n, hp.k = c.k, hp.w_block = c.wb, hp.act_block = ab, hp.x_bf16 = true, hp.bf16_direct = true;
    std::vector<float> ref(size_t(c.m * c.n)), bound(ref.size());
    hp.xq = reinterpret_cast<const uint8_t*>(xb.data()), hp.w = w.data(), hp.w_scale = ws.data(), hp.y = ref.data();
    FS_ASSERT_OK(gemm_fp8_ref(hp));
    hp.xq = reinterpret_cast<const uint8_t*>(xba.data()), hp.w = wa.data(), hp.y = bound.data();
    FS_ASSERT_OK(gemm_fp8_ref(hp));
    GemmFp8Params p = hp;
    p.xq = reinterpret_cast<const uint8_t*>(dxb.get()), p.w = dw.get(), p.w_scale = dws.get(), p.y = dy1.get();
    GemmFp8Params pe = p;
    pe.w = reinterpret_cast<const uint8_t*>(dwe.get()), pe.w_scale = nullptr, pe.w_bf16 = true, pe.y = dy2.get();
    for (auto* y : {&dy1, &dy2, &dy3}) ASSERT_EQ(cudaMemset(y->get(), 0xff, size_t(c.m * c.n) * 4), cudaSuccess);
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    FS_ASSERT_OK(gemm_fp8_cuda(pe, nullptr));
    GemmFp8Params head = pe;  // the first rows alone
    head.m = c.m / 2 + 1, head.y = dy3.get();
    FS_ASSERT_OK(gemm_fp8_cuda(head, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host(), y3 = dy3.to_host();
    const double tol = bf16_direct_tol(c.k);
    double worst = 0, mean = 0;
    for (size_t i = 0; i < y1.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y1[i])) << "output " << i << " not written or not finite";
      const double err = std::fabs(double(y1[i]) - ref[i]), rel = err / (double(bound[i]) + 1e-30);
      ASSERT_LE(err, tol * double(bound[i]) + 1e-30)
          << "row " << i / c.n << " col " << i % c.n << " gpu " << y1[i] << " ref " << ref[i];
      worst = std::max(worst, rel), mean += rel / double(y1.size());
    }
    EXPECT_LE(mean, std::ldexp(1.0, -17)) << "mean |error| / Σ|x·w|";
    std::printf("bf16_direct dense m=%lld n=%lld k=%lld wb=%lld: |err| / Σ|x·w| worst %.2e mean %.2e (bound %.2e)\n",
                (long long)c.m, (long long)c.n, (long long)c.k, (long long)c.wb, worst, mean, tol);
    ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "pre-expanded W != in-kernel expansion";
    ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), size_t(head.m * c.n) * 4))
        << "a row's bits depend on the launch's m";
    FS_ASSERT_OK(gemm_fp8_cuda(pe, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(dy2.to_host(), y1) << "not deterministic";
  }

  // Grouped FP4 experts (some without rows), in-kernel expansion and pre-expanded.
  const Fp4Experts e(rng);
  const int64_t n = e.n, k = e.k, G = e.G, rows = e.rows;
  const std::vector<int32_t>& starts = e.starts;
  DeviceBuffer<float> dx(e.x), dxs(size_t(rows * k / 32)), dy1(size_t(rows * n)), dy2(size_t(rows * n)),
      dy3(size_t(257 * n));
  DeviceBuffer<uint16_t> dxb(size_t(rows * k)), dwe(size_t(G * n * k));
  DeviceBuffer<uint8_t> dw4(e.w4), ds4(e.s4);
  DeviceBuffer<int32_t> dst(starts);
  ASSERT_TRUE(dx.ok() && dxs.ok() && dy1.ok() && dy2.ok() && dy3.ok() && dxb.ok() && dwe.ok() && dw4.ok() &&
              ds4.ok() && dst.ok());
  GemmExpandBf16Params ep;
  ep.w = dw4.get(), ep.w_scale = ds4.get(), ep.y = dwe.get(), ep.count = G, ep.n = n, ep.k = k, ep.w_block = 32;
  ep.w_format = WeightFormat::kFp4;
  FS_ASSERT_OK(gemm_expand_bf16_cuda(ep, nullptr));
  FS_ASSERT_OK(gemm_fp8_quantize_cuda(dx.get(), ActDtype::kF32, rows, k, 32, reinterpret_cast<uint8_t*>(dxb.get()),
                                      dxs.get(), nullptr, false, false, /*bf16_values=*/true));
  GemmFp8GroupedParams g;
  g.xq = reinterpret_cast<const uint8_t*>(dxb.get()), g.x_bf16 = true, g.bf16_direct = true, g.row_start = dst.get();
  g.groups = G, g.rows = rows, g.n = n, g.k = k, g.w_block = 32;
  GemmFp8GroupedParams g4 = g, gb = g;
  g4.w = dw4.get(), g4.w_scale = ds4.get(), g4.w_format = WeightFormat::kFp4, g4.y = dy1.get();
  gb.w = reinterpret_cast<const uint8_t*>(dwe.get()), gb.w_bf16 = true, gb.y = dy2.get();
  // The swapped-operand kernel (W expanded into register fragments) on the same problem.
  DeviceBuffer<float> dy4(size_t(rows * n));
  ASSERT_TRUE(dy4.ok());
  GemmFp8GroupedParams gr = g4;
  gr.w_in_registers = true, gr.y = dy4.get();
  for (auto* y : {&dy1, &dy2, &dy4}) ASSERT_EQ(cudaMemset(y->get(), 0xff, size_t(rows * n) * 4), cudaSuccess);
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(g4, nullptr));
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gb, nullptr));
  FS_ASSERT_OK(gemm_fp8_grouped_cuda(gr, nullptr));
  // Expert 4 (257 rows) alone through the dense launch over its expanded matrix.
  GemmFp8Params one;
  one.xq = reinterpret_cast<const uint8_t*>(dxb.get() + int64_t(starts[4]) * k), one.x_bf16 = true;
  one.bf16_direct = true, one.w_bf16 = true, one.w = reinterpret_cast<const uint8_t*>(dwe.get() + 4 * n * k);
  one.y = dy3.get(), one.m = e.sizes[4], one.n = n, one.k = k;
  FS_ASSERT_OK(gemm_fp8_cuda(one, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y1 = dy1.to_host(), y2 = dy2.to_host(), y3 = dy3.to_host(), y4 = dy4.to_host();
  ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "grouped: pre-expanded W != in-kernel expansion";
  {
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < y1.size(); ++i)
      if (std::memcmp(&y1[i], &y4[i], 4) != 0 && differ++ == 0) first = int64_t(i);
    ASSERT_EQ(differ, 0) << "grouped: W in registers (swapped operands) != in-kernel expansion; first at row "
                         << first / n << " col " << first % n << ": " << (first >= 0 ? y4[size_t(first)] : 0.0f)
                         << " vs " << (first >= 0 ? y1[size_t(first)] : 0.0f);
  }
  ASSERT_EQ(0, std::memcmp(y1.data() + int64_t(starts[4]) * n, y3.data(), y3.size() * 4))
      << "grouped expert != the dense launch on its rows";
  {
    const std::vector<uint16_t> xb = dxb.to_host();
    std::vector<uint16_t> xba(xb);
    for (auto& h : xba) h &= 0x7fff;
    std::vector<uint8_t> w4a(e.w4);
    for (auto& b : w4a) b &= 0x77;  // e2m1 magnitudes (sign bits 3 and 7 cleared)
    std::vector<float> ref(size_t(rows * n)), bound(ref.size());
    GemmFp8GroupedParams h = g4;
    h.xq = reinterpret_cast<const uint8_t*>(xb.data()), h.w = e.w4.data(), h.w_scale = e.s4.data();
    h.row_start = starts.data(), h.y = ref.data();
    FS_ASSERT_OK(gemm_fp8_grouped_ref(h));
    h.xq = reinterpret_cast<const uint8_t*>(xba.data()), h.w = w4a.data(), h.y = bound.data();
    FS_ASSERT_OK(gemm_fp8_grouped_ref(h));
    const double tol = bf16_direct_tol(k);
    for (size_t i = 0; i < y1.size(); ++i)
      ASSERT_LE(std::fabs(double(y1[i]) - ref[i]), tol * double(bound[i]) + 1e-30)
          << "grouped row " << i / n << " col " << i % n << " gpu " << y1[i] << " ref " << ref[i];
  }

  // Integers: x in [-8, 8] (BF16 values), W codes of integers in [-8, 8] with scale 1, k = 2048:
  // every partial sum is an integer below 2^17, exact in FP32 in any order.
  {
    const int64_t m = 131, nn = 200, kk = 2048;
    const std::vector<uint8_t> ints = small_integer_e4m3_codes();
    ASSERT_GE(ints.size(), 17u);
    std::vector<uint8_t> w(size_t(nn * kk)), ws(size_t((nn + 31) / 32 * (kk / 32)), 127);
    for (auto& b : w) b = ints[rng() % ints.size()];
    std::vector<uint16_t> xb(size_t(m * kk));
    for (auto& h : xb) h = f32_to_bf16(float(int(rng() % 17) - 8));
    std::vector<float> ref(size_t(m * nn));
    GemmFp8Params hp;
    hp.m = m, hp.n = nn, hp.k = kk, hp.w_block = 32, hp.act_block = 32, hp.x_bf16 = true, hp.bf16_direct = true;
    hp.xq = reinterpret_cast<const uint8_t*>(xb.data()), hp.w = w.data(), hp.w_scale = ws.data(), hp.y = ref.data();
    FS_ASSERT_OK(gemm_fp8_ref(hp));
    DeviceBuffer<uint16_t> dxi(xb);
    DeviceBuffer<uint8_t> dwi(w), dwsi(ws);
    DeviceBuffer<float> dyi(ref.size());
    ASSERT_TRUE(dxi.ok() && dwi.ok() && dwsi.ok() && dyi.ok());
    GemmFp8Params p = hp;
    p.xq = reinterpret_cast<const uint8_t*>(dxi.get()), p.w = dwi.get(), p.w_scale = dwsi.get(), p.y = dyi.get();
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(dyi.to_host(), ref) << "exact integer sums differ from the twin";
  }

  GemmFp8Params bad;
  std::vector<uint8_t> one8(128);
  std::vector<float> out(4);
  bad.m = 1, bad.n = 1, bad.k = 128, bad.w = one8.data(), bad.w_scale = one8.data(), bad.y = out.data();
  bad.xq = one8.data(), bad.xs = out.data(), bad.bf16_direct = true;
  EXPECT_NE(validate(bad).message().find("bf16_direct"), std::string::npos);
}

// BF16-valued activations in the x_f16 mode (wo_a's grouped linear on the serving path): the f16
// block quantisation (gemm_f16_quantize_cuda) bitwise equal to its twin, exact on BF16 values
// (code · scale == x for every value at least 2^-30 of its block's amax, zero blocks included); then a column slice per
// group (x_stride, y_stride) through the GEMM against the twin on the same codes, within
// 2^-16 · Σ|x·w|, with rows past the slice's columns untouched.
// The twin's exactness is checked on every machine, the rest on a GPU.
TEST(CudaGemmFp8, F16BlockQuantAndStridedSlices) {
  const int64_t m = 197, G = 3, k = 256, n = 160, ldx = G * k, ldy = G * n + 8;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(m * ldx));
  for (size_t i = 0; i < x.size(); ++i) x[i] = round_bf16(nd(rng) * std::ldexp(1.0f, int(rng() % 24) - 12));
  for (int64_t i = 0; i < 32; ++i) x[size_t(5 * ldx + 64 + i)] = 0.0f;  // an all-zero block
  std::vector<uint16_t> hq(x.size());
  std::vector<float> hs(x.size() / 32);
  quantize_f16_blocks_ref(x.data(), m, ldx, hq.data(), hs.data());
  size_t inexact = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    float amax = 0.0f;
    for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float back = f16_to_f32(hq[i]) * hs[i / 32];
    if (std::fabs(x[i]) >= std::ldexp(amax, -30)) {
      ASSERT_EQ(back, x[i]) << "BF16 value " << i << " not exact";
    } else {
      ++inexact;
      ASSERT_LE(std::fabs(back - x[i]), std::ldexp(hs[i / 32], -25)) << i;
    }
  }
  EXPECT_LT(inexact, x.size() / 1000) << "too few values checked exactly";
  FS_REQUIRE_GPU();
  DeviceBuffer<float> dx(x), dxs(hs.size());
  DeviceBuffer<uint16_t> dxq(hq.size());
  ASSERT_TRUE(dx.ok() && dxs.ok() && dxq.ok());
  FS_ASSERT_OK(gemm_f16_quantize_cuda(dx.get(), m, ldx, dxq.get(), dxs.get(), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(dxq.to_host(), hq) << "f16 codes differ from the twin";
  {
    const std::vector<float> gs = dxs.to_host();
    ASSERT_EQ(0, std::memcmp(gs.data(), hs.data(), hs.size() * 4)) << "scales differ from the twin";
  }
  // Group g: x columns [g·k, (g+1)·k), W_g [n, k] (FP8, 32 blocks), y columns [g·n, (g+1)·n).
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(G * n * k));
  const std::vector<uint8_t> ws = random_e8m0_scales(rng, size_t(G * (n / 32) * (k / 32)));
  DeviceBuffer<uint8_t> dw(w), dws(ws);
  DeviceBuffer<float> dy(size_t(m * ldy));
  ASSERT_TRUE(dw.ok() && dws.ok() && dy.ok());
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, size_t(m * ldy) * 4), cudaSuccess);
  std::vector<float> ref(size_t(m * ldy), 0.0f), bound(ref.size(), 0.0f);
  std::vector<uint16_t> qa(hq);
  for (auto& h : qa) h &= 0x7fff;
  std::vector<uint8_t> wa(w);
  for (auto& b : wa) b &= 0x7f;
  for (int64_t g = 0; g < G; ++g) {
    GemmFp8Params p;
    p.m = m, p.n = n, p.k = k, p.w_block = 32, p.act_block = 32, p.x_f16 = true, p.bf16_round_out = g == 1;
    p.x_stride = ldx, p.y_stride = ldy;
    p.xq = reinterpret_cast<const uint8_t*>(dxq.get() + g * k), p.xs = dxs.get() + g * k / 32;
    p.w = dw.get() + g * n * k, p.w_scale = dws.get() + g * (n / 32) * (k / 32), p.y = dy.get() + g * n;
    FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
    GemmFp8Params h = p;
    h.xq = reinterpret_cast<const uint8_t*>(hq.data() + g * k), h.xs = hs.data() + g * k / 32;
    h.w = w.data() + g * n * k, h.w_scale = ws.data() + g * (n / 32) * (k / 32), h.y = ref.data() + g * n;
    FS_ASSERT_OK(gemm_fp8_ref(h));
    h.xq = reinterpret_cast<const uint8_t*>(qa.data() + g * k), h.w = wa.data() + g * n * k, h.y = bound.data() + g * n;
    h.bf16_round_out = false;
    FS_ASSERT_OK(gemm_fp8_ref(h));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y = dy.to_host();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < ldy; ++c) {
      const size_t i = size_t(r * ldy + c);
      if (c >= G * n) {  // past the last slice: never written
        uint32_t u = 0;
        std::memcpy(&u, &y[i], 4);
        ASSERT_EQ(u, 0xffffffffu) << "row " << r << " col " << c << " written";
        continue;
      }
      const bool rounded = c / n == 1;
      const double tol = std::ldexp(double(bound[i]), -16) + (rounded ? std::fabs(ref[i]) / 128 : 0.0) + 1e-30;
      ASSERT_LE(std::fabs(double(y[i]) - ref[i]), tol) << "row " << r << " col " << c << " gpu " << y[i] << " ref " << ref[i];
      if (rounded) {
        ASSERT_EQ(y[i], round_bf16(y[i])) << "row " << r << " col " << c;
      }
    }
  // The same slices in the x_bf16 mode (wo_a's path): x packed to BF16 (exact: BF16 values), one
  // GEMM per group with the row strides, against the twin on the same values.
  {
    DeviceBuffer<uint16_t> dxb(x.size());
    ASSERT_TRUE(dxb.ok());
    FS_ASSERT_OK(gemm_bf16_pack_cuda(dx.get(), int64_t(x.size()), dxb.get(), nullptr));
    ASSERT_EQ(cudaMemset(dy.get(), 0xff, size_t(m * ldy) * 4), cudaSuccess);
    std::vector<uint16_t> xb(x.size()), xba(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]), xba[i] = xb[i] & 0x7fff;
    std::fill(ref.begin(), ref.end(), 0.0f), std::fill(bound.begin(), bound.end(), 0.0f);
    for (int64_t g = 0; g < G; ++g) {
      GemmFp8Params p;
      p.m = m, p.n = n, p.k = k, p.w_block = 32, p.act_block = 32, p.x_bf16 = true, p.bf16_round_out = g == 1;
      p.x_stride = ldx, p.y_stride = ldy;
      p.xq = reinterpret_cast<const uint8_t*>(dxb.get() + g * k);
      p.w = dw.get() + g * n * k, p.w_scale = dws.get() + g * (n / 32) * (k / 32), p.y = dy.get() + g * n;
      FS_ASSERT_OK(gemm_fp8_cuda(p, nullptr));
      GemmFp8Params h = p;
      h.xq = reinterpret_cast<const uint8_t*>(xb.data() + g * k);
      h.w = w.data() + g * n * k, h.w_scale = ws.data() + g * (n / 32) * (k / 32), h.y = ref.data() + g * n;
      FS_ASSERT_OK(gemm_fp8_ref(h));
      h.xq = reinterpret_cast<const uint8_t*>(xba.data() + g * k), h.w = wa.data() + g * n * k, h.y = bound.data() + g * n;
      h.bf16_round_out = false;
      FS_ASSERT_OK(gemm_fp8_ref(h));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    {
      const std::vector<uint16_t> got = dxb.to_host();
      ASSERT_EQ(got, xb) << "gemm_bf16_pack_cuda is not the BF16 bits of x";
    }
    const std::vector<float> yb = dy.to_host();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < ldy; ++c) {
        const size_t i = size_t(r * ldy + c);
        if (c >= G * n) {
          uint32_t u = 0;
          std::memcpy(&u, &yb[i], 4);
          ASSERT_EQ(u, 0xffffffffu) << "x_bf16: row " << r << " col " << c << " written";
          continue;
        }
        const bool rounded = c / n == 1;
        const double tol = bf16_gemm_tol(k) * double(bound[i]) + (rounded ? std::fabs(ref[i]) / 128 : 0.0) + 1e-30;
        ASSERT_LE(std::fabs(double(yb[i]) - ref[i]), tol) << "x_bf16: row " << r << " col " << c;
        if (rounded) {
          ASSERT_EQ(yb[i], round_bf16(yb[i])) << "x_bf16: row " << r << " col " << c;
        }
      }
  }
  GemmFp8Params bad;
  bad.m = 1, bad.n = 1, bad.k = 128, bad.xq = reinterpret_cast<const uint8_t*>(hq.data()), bad.xs = hs.data();
  bad.w = w.data(), bad.w_scale = ws.data(), bad.y = ref.data(), bad.x_stride = 256;
  EXPECT_NE(validate(bad).message().find("x_f16"), std::string::npos);
  bad.x_f16 = true, bad.x_stride = 200;
  EXPECT_NE(validate(bad).message().find("x_stride"), std::string::npos);
}

// The CPU twin's x_f16 input and bf16_round_out (no GPU): f16 codes give the e4m3 codes' numbers,
// and the rounded output is the BF16 rounding of the plain one.
TEST(CudaGemmFp8, TwinF16CodesAndRoundedOutput) {
  const int64_t m = 3, n = 5, k = 128;
  std::mt19937 rng(4);
  const std::vector<uint8_t> xq = random_fp8_codes(rng, size_t(m * k)), w = random_fp8_codes(rng, size_t(n * k));
  const std::vector<uint8_t> ws = random_e8m0_scales(rng, size_t(k / 32));
  std::vector<uint16_t> xh(xq.size());  // every e4m3 value is an f16 value
  for (size_t i = 0; i < xq.size(); ++i) xh[i] = f32_to_f16(e4m3_to_f32(xq[i]));
  for (size_t i = 0; i < xq.size(); ++i) ASSERT_EQ(f16_to_f32(xh[i]), e4m3_to_f32(xq[i])) << i;
  std::vector<float> xs(size_t(m * k / 32), 0.25f), y8(size_t(m * n)), yh(y8.size()), yr(y8.size());
  GemmFp8Params p;
  p.m = m, p.n = n, p.k = k, p.xs = xs.data(), p.w = w.data(), p.w_scale = ws.data();
  GemmFp8Params p8 = p, ph = p, pr = p;
  p8.xq = xq.data(), p8.y = y8.data();
  ph.xq = reinterpret_cast<const uint8_t*>(xh.data()), ph.x_f16 = true, ph.y = yh.data();
  pr.xq = xq.data(), pr.bf16_round_out = true, pr.y = yr.data();
  FS_ASSERT_OK(gemm_fp8_ref(p8));
  FS_ASSERT_OK(gemm_fp8_ref(ph));
  FS_ASSERT_OK(gemm_fp8_ref(pr));
  ASSERT_EQ(0, std::memcmp(y8.data(), yh.data(), y8.size() * 4));
  bool changed = false;
  for (size_t i = 0; i < y8.size(); ++i) {
    ASSERT_EQ(yr[i], round_bf16(y8[i])) << i;
    changed |= yr[i] != y8[i];
  }
  EXPECT_TRUE(changed) << "no output changed by the BF16 rounding: the check is empty";
  pr.bf16_out = true;
  EXPECT_NE(gemm_fp8_ref(pr).message().find("bf16_round_out"), std::string::npos);
  ph.xq = nullptr, ph.x = xs.data();
  EXPECT_NE(gemm_fp8_ref(ph).message().find("x_f16"), std::string::npos);
}

TEST(CudaGemmFp8, GroupedRejectsBadInput) {
  // Runs without a GPU: every check fires before any device call.
  alignas(16) uint8_t b[256] = {};
  alignas(16) float f[64] = {};
  int32_t starts[3] = {0, 1, 2};
  GemmFp8GroupedParams p;
  p.xq = b, p.xs = f, p.w = b, p.w_scale = b, p.row_start = starts, p.y = f;
  p.groups = 2, p.rows = 2, p.n = 1, p.k = 128;
  EXPECT_TRUE(validate(p).ok()) << validate(p).message();
  p.groups = 0;
  Status s = gemm_fp8_grouped_cuda(p, nullptr);
  EXPECT_NE(s.message().find("groups=0"), std::string::npos) << s.message();
  p.groups = 2, p.row_start = nullptr;
  EXPECT_FALSE(gemm_fp8_grouped_ref(p).ok());
  p.row_start = starts, p.k = 100;
  s = gemm_fp8_grouped_ref(p);
  EXPECT_NE(s.message().find("k=100"), std::string::npos) << s.message();
  p.k = 128;
  starts[1] = 3;  // decreasing
  s = gemm_fp8_grouped_ref(p);
  EXPECT_NE(s.message().find("decreases"), std::string::npos) << s.message();
  starts[1] = 1, starts[2] = 5;  // does not end at rows
  EXPECT_FALSE(gemm_fp8_grouped_ref(p).ok());
  starts[2] = 2, p.xq = b + 1;
  s = gemm_fp8_grouped_cuda(p, nullptr);
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s.message();
  // FP4 weights: one scale per 1 x 32 block (w_block 32 only), 4-byte aligned scales.
  p.xq = b, p.w_format = WeightFormat::kFp4, p.w_block = 128;
  s = gemm_fp8_grouped_cuda(p, nullptr);
  EXPECT_NE(s.message().find("1 x 32"), std::string::npos) << s.message();
  p.w_block = 32, p.w_scale = b + 2;
  s = gemm_fp8_grouped_cuda(p, nullptr);
  EXPECT_NE(s.message().find("4-byte aligned"), std::string::npos) << s.message();
  p.w_scale = b, p.w_format = WeightFormat::kFp8, p.bf16_out = true, p.bf16_round_out = true;
  s = gemm_fp8_grouped_cuda(p, nullptr);
  EXPECT_NE(s.message().find("bf16_round_out"), std::string::npos) << s.message();
  p.bf16_out = p.bf16_round_out = false, p.w_format = static_cast<WeightFormat>(7);
  s = gemm_fp8_grouped_ref(p);
  EXPECT_NE(s.message().find("kFp8 or kFp4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flashseek::ops::cuda
