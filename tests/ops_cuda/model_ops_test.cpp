// The whole-model GPU kernels (ops/cuda/model/model_kernels.h) against their CPU twins (ops/*.h) on
// random data with odd sizes, ties, zero / tiny / outlier blocks and empty slots. The kernels are
// written to reproduce the CPU's operation order and rounding, so most comparisons are bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>

#include "core/numeric.h"
#include "core/rng.h"
#include "gpu_util.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/engram.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "ops/rope.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal()) * scale;
  return v;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && ++bad <= 3) ADD_FAILURE() << what << " [" << i << "] " << a[i] << " vs " << b[i];
  EXPECT_EQ(bad, 0u) << what;
}

TEST(CudaModelOps, QuantSimsMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  const int64_t rows = 7, dim = 160;
  auto x = randn(static_cast<size_t>(rows * dim), 1, 3.0f);
  for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0;          // an all-zero block
  for (int64_t i = 32; i < 64; ++i) x[static_cast<size_t>(i)] *= 1e-30f;   // tiny block
  x[100] = 3e4f;                                              // outlier
  for (int kind = 0; kind < 4; ++kind) {
    std::vector<float> ref = x;
    const auto k = cd::QuantSim(kind);
    int64_t block = 32;
    if (k == cd::QuantSim::kBf16) round_bf16_inplace(ref.data(), rows * dim);
    if (k == cd::QuantSim::kFp8) fp8_quant_dequant(ref.data(), rows, dim, block);
    if (k == cd::QuantSim::kFp4E8m0) fp4_quant_dequant_e8m0(ref.data(), rows, dim, block);
    if (k == cd::QuantSim::kFp4E4m3) block = 16, fp4_quant_dequant_e4m3(ref.data(), rows, dim, block);
    DeviceBuffer<float> d(x);
    FS_ASSERT_OK(cuda_status(cd::launch_quant_sim(d.get(), rows, dim, dim, block, k, 0), "quant"));
    expect_bitwise(d.to_host(), ref, "quant sim");
  }
  // Partial rows (V4 window KV: the first Dh − Dr dims in blocks of 64) leave the tail alone.
  std::vector<float> ref = x;
  for (int64_t r = 0; r < rows; ++r) fp8_quant_dequant(ref.data() + r * dim, 1, 128, 64);
  DeviceBuffer<float> d(x);
  FS_ASSERT_OK(cuda_status(cd::launch_quant_sim(d.get(), rows, dim, 128, 64, cd::QuantSim::kFp8, 0), "quant"));
  expect_bitwise(d.to_host(), ref, "partial fp8");
  EXPECT_NE(cd::launch_quant_sim(d.get(), rows, dim, 100, 64, cd::QuantSim::kFp8, 0), cudaSuccess);
}

// The row kernels (quant_sim: a warp per block; Hadamard: a block per row in shared memory;
// rms_norm: the short serial order from a staged row; rms_bf16_heads: a warp per row) against
// their CPU twins, memcmp-equal, on odd shapes: quantisation blocks 16 / 32 / 64 / 128 over whole
// and partial rows (a prefix of a strided row; the tail must stay untouched) with zero, tiny and
// outlier blocks; Hadamard dims 1..16384 (the largest through the one-thread-per-row fallback);
// norms over dims around the chunk edge, weighted or not, BF16 out or not, in place (rows sharing
// a block when short, 5 rows: a block with rows past the end; unaligned rows: scalar loads; 3
// chunks; 20000 past the register kernel's 16 chunks: the wide kernel); the BF16 head norm over
// dims up to and past its shared-memory limit.
TEST(CudaModelOps, RowKernelsOddShapesMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  uint64_t seed = 900;
  for (int kind = 0; kind < 4; ++kind) {
    const auto k = cd::QuantSim(kind);
    for (int64_t block : {16, 32, 64, 128}) {
      if (k == cd::QuantSim::kBf16 && block != 32) continue;
      for (int64_t rows : {1, 3, 37}) {
        for (int64_t nblk : {1, 5, 32}) {
          const int64_t qdim = block * nblk, stride = qdim + 24;
          auto x = randn(static_cast<size_t>(rows * stride), ++seed, 3.0f);
          for (int64_t i = 0; i < std::min<int64_t>(block, qdim); ++i) x[static_cast<size_t>(i)] = 0;  // zero block
          if (rows * stride > 2 * block) {
            for (int64_t i = block; i < 2 * block && i < qdim; ++i) x[static_cast<size_t>(i)] *= 1e-30f;  // tiny
          }
          x[static_cast<size_t>(rows * stride / 2)] = 3e4f;  // outlier (somewhere, maybe in a tail)
          std::vector<float> ref = x;
          for (int64_t r = 0; r < rows; ++r) {
            float* row = ref.data() + r * stride;
            if (k == cd::QuantSim::kBf16) round_bf16_inplace(row, qdim);
            if (k == cd::QuantSim::kFp8) fp8_quant_dequant(row, 1, qdim, block);
            if (k == cd::QuantSim::kFp4E8m0) fp4_quant_dequant_e8m0(row, 1, qdim, block);
            if (k == cd::QuantSim::kFp4E4m3) fp4_quant_dequant_e4m3(row, 1, qdim, block);
          }
          DeviceBuffer<float> d(x);
          FS_ASSERT_OK(cuda_status(cd::launch_quant_sim(d.get(), rows, stride, qdim, block, k, 0), "quant"));
          const std::string tag = "quant kind " + std::to_string(kind) + " block " + std::to_string(block) + " rows " +
                                  std::to_string(rows) + " qdim " + std::to_string(qdim);
          expect_bitwise(d.to_host(), ref, tag.c_str());
        }
      }
    }
  }
  for (int64_t dim : {1, 2, 8, 64, 128, 512, 4096, 16384}) {
    for (int64_t rows : {1, 64}) {
      if (dim * rows > 1 << 20) continue;
      auto x = randn(static_cast<size_t>(rows * dim), ++seed);
      std::vector<float> ref = x;
      hadamard_inplace(ref.data(), rows, dim);
      DeviceBuffer<float> d(x);
      FS_ASSERT_OK(cuda_status(cd::launch_hadamard(d.get(), rows, dim, 0), "hadamard"));
      const std::string tag = "hadamard dim " + std::to_string(dim) + " rows " + std::to_string(rows);
      expect_bitwise(d.to_host(), ref, tag.c_str());
    }
  }
  for (int64_t dim : {1, 7, 512, 1023, 1024, 1025, 2100, 4096, 16384, 20000}) {
    for (int64_t rows : {1, 3, 5}) {
      for (int variant = 0; variant < 3; ++variant) {  // 0: weighted; 1: unweighted, BF16; 2: weighted, in place
        const auto x = randn(static_cast<size_t>(rows * dim), ++seed, 2.0f);
        const auto g = randn(static_cast<size_t>(dim), ++seed);
        const bool weighted = variant != 1, bf16 = variant == 1;
        std::vector<float> ref(x.size());
        rms_norm({x.data(), weighted ? g.data() : nullptr, ref.data(), rows, dim, 1e-6f, bf16});
        DeviceBuffer<float> dx(x), dg(g), dy(x.size());
        float* y = variant == 2 ? dx.get() : dy.get();
        FS_ASSERT_OK(cuda_status(cd::launch_model_rms_norm(dx.get(), weighted ? dg.get() : nullptr, y, rows, dim, 1e-6f,
                                                           bf16, 0),
                                 "norm"));
        const std::string tag = "rms_norm dim " + std::to_string(dim) + " rows " + std::to_string(rows) + " variant " +
                                std::to_string(variant);
        expect_bitwise(variant == 2 ? dx.to_host() : dy.to_host(), ref, tag.c_str());
      }
    }
  }
  for (int64_t dim : {1, 64, 128, 512, 2048, 3000}) {
    for (int64_t rows : {1, 5, 37}) {
      auto x = randn(static_cast<size_t>(rows * dim), ++seed, 1.5f);
      std::vector<float> ref = x;
      rms_norm_bf16_heads(ref.data(), rows, dim, 1e-6f);
      DeviceBuffer<float> d(x);
      FS_ASSERT_OK(cuda_status(cd::launch_rms_norm_bf16_heads(d.get(), rows, dim, 1e-6f, 0), "heads"));
      const std::string tag = "bf16 heads dim " + std::to_string(dim) + " rows " + std::to_string(rows);
      expect_bitwise(d.to_host(), ref, tag.c_str());
    }
  }
}

// The window KV rows' chain in one launch (launch_norm_rope_quant) against the CPU twins in turn
// (ops::rms_norm, ops::apply_rope, ops::fp8_quant_dequant of the row prefix) and against the three
// CUDA launches, memcmp-equal: dims from 4 to the 1024 limit (partial warps: 100, 516), RoPE over
// none, 62 (the rotated values start in the middle of a thread's four), 64 or every value;
// quantisation off, over the whole row or a prefix, in blocks of 4 to 128; weighted or not, BF16
// or not; 1, 3 and 37 rows at positions up to 2^20 (a zero row, a tiny block, an outlier). Shapes
// outside the kernel are refused (and the backend then runs the three).
TEST(CudaModelOps, NormRopeQuantEqualsTheThreeOps) {
  FS_REQUIRE_GPU();
  uint64_t seed = 4200;
  struct Q { int64_t prefix, block; };
  int cases = 0;
  for (int64_t dim : {4, 100, 512, 516, 1024}) {
    for (int64_t rope : {int64_t(0), int64_t(62), int64_t(64), dim}) {  // 62: pairs start mid float4
      if (rope > dim) continue;
      std::vector<Q> quants = {{0, 0}, {dim, 4}};
      for (int64_t b : {32, 64, 128}) {
        if (dim % b == 0) quants.push_back({dim, b});
        if ((dim - rope) % b == 0 && dim - rope > 0) quants.push_back({dim - rope, b});
      }
      for (const Q& qz : quants) {
        for (int64_t rows : {1, 3, 37}) {
          for (int variant = 0; variant < 2; ++variant) {
            const bool bf16 = variant == 1, weighted = variant == 0 || rows == 3;
            auto x = randn(static_cast<size_t>(rows * dim), ++seed, 2.0f);
            if (rows > 1) std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);  // a zero row
            for (int64_t i = 0; i < std::min<int64_t>(dim, 32); ++i) x[static_cast<size_t>(i)] *= 1e-30f;
            x[static_cast<size_t>(rows * dim - 1)] = 3e4f;
            const auto g = randn(static_cast<size_t>(dim), ++seed);
            std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(rope / 2, 1)));
            for (size_t f = 0; f < inv.size(); ++f) inv[f] = float(std::pow(10000.0, -2.0 * double(f) / double(rope)));
            std::vector<int64_t> pos(static_cast<size_t>(rows));
            for (int64_t r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = (r * 7919 + seed * 31) % (int64_t(1) << 20);
            std::vector<float> ref(x.size());
            rms_norm({x.data(), weighted ? g.data() : nullptr, ref.data(), rows, dim, 1e-6f, bf16});
            if (rope > 0) apply_rope({ref.data(), pos.data(), inv.data(), rows, 1, dim, rope, false, bf16});
            if (qz.block > 0)
              for (int64_t r = 0; r < rows; ++r) fp8_quant_dequant(ref.data() + r * dim, 1, qz.prefix, qz.block);
            DeviceBuffer<float> dx(x), dx3(x), dg(g), dinv(inv);
            DeviceBuffer<int64_t> dpos(pos);
            const float* w = weighted ? dg.get() : nullptr;
            ASSERT_TRUE(cd::norm_rope_quant_supports(dx.get(), dim, rope, qz.prefix, qz.block));
            FS_ASSERT_OK(cuda_status(cd::launch_norm_rope_quant(dx.get(), w, dpos.get(), dinv.get(), rows, dim, rope,
                                                                1e-6f, bf16, qz.prefix, qz.block, 0),
                                     "norm_rope_quant"));
            FS_ASSERT_OK(cuda_status(cd::launch_model_rms_norm(dx3.get(), w, dx3.get(), rows, dim, 1e-6f, bf16, 0), "norm"));
            if (rope > 0)
              FS_ASSERT_OK(cuda_status(
                  cd::launch_rope(dx3.get(), dpos.get(), dinv.get(), rows, 1, dim, rope, false, bf16, 0), "rope"));
            if (qz.block > 0)
              FS_ASSERT_OK(cuda_status(
                  cd::launch_quant_sim(dx3.get(), rows, dim, qz.prefix, qz.block, cd::QuantSim::kFp8, 0), "quant"));
            const std::string tag = "dim " + std::to_string(dim) + " rope " + std::to_string(rope) + " quant " +
                                    std::to_string(qz.prefix) + "/" + std::to_string(qz.block) + " rows " +
                                    std::to_string(rows) + " variant " + std::to_string(variant);
            const auto got = dx.to_host();
            expect_bitwise(got, ref, (tag + " vs CPU").c_str());
            expect_bitwise(got, dx3.to_host(), (tag + " vs three launches").c_str());
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 200);
  // Refusals: a row past the limit, not a multiple of 4, an odd RoPE width, a block that is no
  // power of two or does not divide the prefix, an unaligned row.
  DeviceBuffer<float> d(std::vector<float>(2048, 1.0f));
  DeviceBuffer<int64_t> dpos(std::vector<int64_t>(2, 0));
  DeviceBuffer<float> dinv(std::vector<float>(512, 1.0f));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 1028, 64, 0, 0));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 102, 64, 0, 0));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 512, 63, 0, 0));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 512, 64, 480, 48));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 512, 64, 496, 32));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get(), 512, 64, 512, 256));
  EXPECT_FALSE(cd::norm_rope_quant_supports(d.get() + 1, 512, 64, 0, 0));
  EXPECT_NE(cd::launch_norm_rope_quant(d.get(), nullptr, dpos.get(), dinv.get(), 1, 1028, 64, 1e-6f, false, 0, 0, 0),
            cudaSuccess);
  EXPECT_NE(cd::launch_norm_rope_quant(d.get(), nullptr, nullptr, dinv.get(), 1, 512, 64, 1e-6f, false, 0, 0, 0),
            cudaSuccess);
  EXPECT_NE(cd::launch_norm_rope_quant(d.get(), d.get() + 1, dpos.get(), dinv.get(), 1, 512, 64, 1e-6f, false, 0, 0, 0),
            cudaSuccess);
}

// The same launch writing each finished row to its ring slot (NormRopeQuantRing) gives the ring
// bytes of launch_cache_pack_ring over the three ops' rows, and the same rows: FP32 rows, V4.1's
// ring (FP8 + E8M0 over every value in blocks of 32: one warp per unit, 16 units at 512 values,
// so the block has more warps than value warps) and V4's (FP8 in blocks of 64 over the non-RoPE
// values, the BF16 tail by one more warp); 1, 6 and 9 consecutive positions from 0 and from
// 1,000,003 (slots wrapping), the ring as many slots as rows or more; the other slots keep their
// bytes. A ring smaller than the rows or of another width is refused.
TEST(CudaModelOps, NormRopeQuantWritesTheRingAsThePackKernel) {
  FS_REQUIRE_GPU();
  uint64_t seed = 5100;
  for (const int64_t dim : {64, 512, 1024}) {
    const int64_t rope = 64;
    const std::vector<std::pair<ops::CacheRowFormat, int64_t>> formats = {  // format, its FP8 simulation block
        {ops::f32_row_format(dim), 0},
        {ops::CacheRowFormat{ops::RowCodec::kFp8E8m0, int32_t(dim), int32_t(dim), 32}, 32},
        {ops::CacheRowFormat{ops::RowCodec::kFp8E8m0, int32_t(dim), int32_t(dim - rope), 64}, 64}};
    for (const auto& [fmt, qblock] : formats) {
      if (fmt.compact() && (fmt.coded <= 0 || fmt.coded % fmt.block != 0)) continue;
      const int64_t qprefix = qblock == 0 ? 0 : fmt.coded;
      for (const int64_t rows : {1, 6, 9})
        for (const int64_t start : {int64_t(0), int64_t(1000003)})
          for (const int64_t spare : {0, 7}) {
            const int64_t ring_size = rows + spare, stride = fmt.row_bytes();
            auto x = randn(static_cast<size_t>(rows * dim), ++seed, 2.0f);
            const auto g = randn(static_cast<size_t>(dim), ++seed);
            std::vector<float> inv(static_cast<size_t>(rope / 2));
            for (size_t f = 0; f < inv.size(); ++f) inv[f] = float(std::pow(10000.0, -2.0 * double(f) / double(rope)));
            std::vector<int64_t> pos(static_cast<size_t>(rows));
            for (int64_t r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = start + r;
            std::vector<uint8_t> ring0(static_cast<size_t>(ring_size * stride));
            for (size_t i = 0; i < ring0.size(); ++i) ring0[i] = uint8_t((i * 131 + size_t(seed)) & 0xff);
            DeviceBuffer<float> dx(x), dx3(x), dg(g), dinv(inv);
            DeviceBuffer<int64_t> dpos(pos);
            DeviceBuffer<uint8_t> ring1(ring0), ring2(ring0);
            cd::NormRopeQuantRing r;
            r.ring = ring1.get(), r.ring_size = ring_size, r.format = fmt;
            FS_ASSERT_OK(cuda_status(cd::launch_norm_rope_quant(dx.get(), dg.get(), dpos.get(), dinv.get(), rows, dim,
                                                                rope, 1e-6f, true, qprefix, qblock, 0, &r),
                                     "norm_rope_quant + ring"));
            FS_ASSERT_OK(cuda_status(cd::launch_norm_rope_quant(dx3.get(), dg.get(), dpos.get(), dinv.get(), rows, dim,
                                                                rope, 1e-6f, true, qprefix, qblock, 0),
                                     "norm_rope_quant"));
            FS_ASSERT_OK(cuda_status(cd::launch_cache_pack_ring(fmt, ring2.get(), dx3.get(), dpos.get(), 0, rows,
                                                                ring_size, nullptr, 0),
                                     "pack ring"));
            const std::string tag = "dim " + std::to_string(dim) + " block " + std::to_string(fmt.block) + " coded " +
                                    std::to_string(fmt.coded) + " rows " + std::to_string(rows) + " start " +
                                    std::to_string(start) + " ring " + std::to_string(ring_size);
            expect_bitwise(dx.to_host(), dx3.to_host(), (tag + " rows").c_str());
            const auto a = ring1.to_host(), b = ring2.to_host();
            EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << tag << " ring bytes";
          }
      // Refusals: fewer slots than rows, a format of another width.
      DeviceBuffer<float> dx(std::vector<float>(size_t(4 * dim), 1.0f));
      DeviceBuffer<int64_t> dpos(std::vector<int64_t>{0, 1, 2, 3});
      DeviceBuffer<float> dinv(std::vector<float>(32, 1.0f));
      DeviceBuffer<uint8_t> ring(size_t(8 * fmt.row_bytes()));
      cd::NormRopeQuantRing r;
      r.ring = ring.get(), r.ring_size = 3, r.format = fmt;
      EXPECT_NE(cd::launch_norm_rope_quant(dx.get(), nullptr, dpos.get(), dinv.get(), 4, dim, rope, 1e-6f, true, qprefix,
                                           qblock, 0, &r),
                cudaSuccess);
      r.ring_size = 8, r.format.dim = int32_t(dim + 4);
      EXPECT_NE(cd::launch_norm_rope_quant(dx.get(), nullptr, dpos.get(), dinv.get(), 4, dim, rope, 1e-6f, true, qprefix,
                                           qblock, 0, &r),
                cudaSuccess);
    }
  }
}

TEST(CudaModelOps, LinearAndNormMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  const int64_t T = 5, K = 3, in = 203, out = 37, E = 4;
  const auto x = randn(static_cast<size_t>(T * in), 2), w = randn(static_cast<size_t>(E * out * in), 3, 0.1f);
  std::vector<int32_t> sel(static_cast<size_t>(T * K));
  Rng r(4);
  for (auto& s : sel) s = int32_t(r.below(E));
  std::vector<float> ref(static_cast<size_t>(T * K * out));
  for (int64_t i = 0; i < T * K; ++i)
    linear({x.data() + (i / K) * in, w.data() + int64_t(sel[static_cast<size_t>(i)]) * out * in, ref.data() + i * out, 1, in, out,
            0, false, true});
  DeviceBuffer<float> dx(x), dw(w), dy(ref.size());
  DeviceBuffer<int32_t> ds(sel);
  cd::LinearArgs a;
  a.x = dx.get(), a.w = dw.get(), a.y = dy.get(), a.sel = ds.get(), a.rows = T * K, a.in = in, a.out = out;
  a.x_row_div = K, a.bf16_out = true;
  FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "linear"));
  expect_bitwise(dy.to_host(), ref, "stacked linear");

  const auto g = randn(static_cast<size_t>(in), 5);
  std::vector<float> nref(x.size());
  rms_norm({x.data(), g.data(), nref.data(), T, in, 1e-6f, false});
  DeviceBuffer<float> dg(g), dn(x.size());
  FS_ASSERT_OK(cuda_status(cd::launch_model_rms_norm(dx.get(), dg.get(), dn.get(), T, in, 1e-6f, false, 0), "norm"));
  expect_bitwise(dn.to_host(), nref, "rms_norm");
}

// hc_post on its own: the 4-stream kernel (the configs' hc_mult) and the generic one, widths that
// leave partial blocks, with and without the BF16 rounding, bitwise the CPU's.
TEST(CudaModelOps, HcPostEveryStreamCountMatchesCpu) {
  FS_REQUIRE_GPU();
  uint64_t seed = 40;
  for (const int64_t hc : {1, 3, 4, 5})
    for (const int64_t dim : {96, 1000, 4099})
      for (const bool bf16 : {false, true}) {
        const int64_t rows = 7;
        const auto x = randn(static_cast<size_t>(rows * hc * dim), seed++), f = randn(static_cast<size_t>(rows * dim), seed++);
        const auto post = randn(static_cast<size_t>(rows * hc), seed++), comb = randn(static_cast<size_t>(rows * hc * hc), seed++);
        std::vector<float> xo(x.size());
        hc_post(f.data(), x.data(), post.data(), comb.data(), xo.data(), rows, hc, dim, bf16);
        DeviceBuffer<float> dx(x), df(f), dpost(post), dcomb(comb);
        FS_ASSERT_OK(cuda_status(cd::launch_hc_post(df.get(), dx.get(), dpost.get(), dcomb.get(), rows, hc, dim, bf16, 0),
                                 "post"));
        expect_bitwise(dx.to_host(), xo, ("hc_post hc " + std::to_string(hc) + " dim " + std::to_string(dim)).c_str());
      }
}

// The MoE combine and the stream update in one launch (launch_moe_combine_post) against the two
// launches and the CPU's hc_post of the combined rows, memcmp-equal: 1, 3 and 9 rows, 1 and 6
// slots, with and without a row map (some pairs on another rank: -1), widths that leave partial
// blocks, each BF16 rounding on or off; the combined rows are stored as launch_moe_combine stores
// them. Other stream counts are refused (the backend then runs the two).
TEST(CudaModelOps, MoeCombinePostEqualsTheTwoLaunches) {
  FS_REQUIRE_GPU();
  constexpr int64_t hc = 4;
  uint64_t seed = 4700;
  for (const int64_t T : {1, 3, 9})
    for (const int64_t K : {1, 6})
      for (const int64_t dim : {96, 257, 4096})
        for (int variant = 0; variant < 4; ++variant) {
          const bool mapped = variant & 1, bf16 = variant & 2;
          const auto y = randn(static_cast<size_t>(T * K * dim), ++seed), ys = randn(static_cast<size_t>(T * dim), ++seed);
          const auto x = randn(static_cast<size_t>(T * hc * dim), ++seed);
          const auto post = randn(static_cast<size_t>(T * hc), ++seed), comb = randn(static_cast<size_t>(T * hc * hc), ++seed);
          std::vector<int32_t> row_of(static_cast<size_t>(T * K));
          for (int64_t i = 0; i < T * K; ++i)  // a permutation, every fifth pair elsewhere
            row_of[static_cast<size_t>(i)] = i % 5 == 4 ? -1 : int32_t((i * 7 + 3) % (T * K));
          DeviceBuffer<float> dy(y), dys(ys), dpost(post), dcomb(comb);
          DeviceBuffer<float> dx1(x), dx2(x), dout1(ys.size()), dout2(ys.size());
          DeviceBuffer<int32_t> drow(row_of);
          const int32_t* rmap = mapped ? drow.get() : nullptr;
          FS_ASSERT_OK(cuda_status(cd::launch_moe_combine_post(dy.get(), dys.get(), dout1.get(), T, K, dim, bf16, rmap,
                                                               dx1.get(), dpost.get(), dcomb.get(), hc, !bf16, 0),
                                   "combine_post"));
          FS_ASSERT_OK(cuda_status(cd::launch_moe_combine(dy.get(), dys.get(), dout2.get(), T, K, dim, bf16, 0, rmap),
                                   "combine"));
          FS_ASSERT_OK(cuda_status(
              cd::launch_hc_post(dout2.get(), dx2.get(), dpost.get(), dcomb.get(), T, hc, dim, !bf16, 0), "post"));
          const std::string tag = "T " + std::to_string(T) + " K " + std::to_string(K) + " dim " + std::to_string(dim) +
                                  " variant " + std::to_string(variant);
          const auto f = dout2.to_host();
          expect_bitwise(dout1.to_host(), f, (tag + " combined rows").c_str());
          expect_bitwise(dx1.to_host(), dx2.to_host(), (tag + " streams").c_str());
          std::vector<float> xo(x.size());
          hc_post(f.data(), x.data(), post.data(), comb.data(), xo.data(), T, hc, dim, !bf16);
          expect_bitwise(dx1.to_host(), xo, (tag + " streams vs CPU").c_str());
        }
  EXPECT_FALSE(cd::moe_combine_post_supports(1, 3, 96));
  EXPECT_FALSE(cd::moe_combine_post_supports(1, 4, 0));
  EXPECT_NE(cd::launch_moe_combine_post(nullptr, nullptr, nullptr, 1, 1, 96, false, nullptr, nullptr, nullptr, nullptr,
                                        5, false, 0),
            cudaSuccess);
}

// The four-column kernels of prefill-sized launches (model_kernels.cu kVecMinValues: 2^20 values
// and more, widths that are a multiple of 4, 16-byte aligned operands) against the scalar kernels,
// which the same launch takes when the operands sit 4 bytes off alignment, and against the CPU
// where the op has a twin: collapse, hc_post, SwiGLU (weights, clamp, BF16 rounding on and off; vs
// the CPU within the exp caveat below), the MoE combine and the combine + post (row maps with
// other ranks' pairs), memcmp-equal. Widths
// of 4096 and 1028 (a partial column block), row counts just past the threshold.
TEST(CudaModelOps, FourColumnKernelsEqualScalarKernelsAndCpu) {
  FS_REQUIRE_GPU();
  constexpr int64_t hc = 4, kMin = int64_t(1) << 20;
  uint64_t seed = 9100;
  // A device copy of v at offset 0 (aligned) or 1 float (4 bytes off: the scalar kernels).
  struct Pair {
    DeviceBuffer<float> a, u;
    explicit Pair(const std::vector<float>& v) : a(v), u(pad(v)) {}
    static std::vector<float> pad(const std::vector<float>& v) {
      std::vector<float> p(v.size() + 1, 0.0f);
      std::copy(v.begin(), v.end(), p.begin() + 1);
      return p;
    }
    float* at(bool vec) { return vec ? a.get() : u.get() + 1; }
    std::vector<float> host(bool vec) {
      auto h = vec ? a.to_host() : u.to_host();
      if (!vec) h.erase(h.begin());
      return h;
    }
  };
  for (const int64_t dim : {4096, 1028}) {
    const int64_t rows = kMin / dim + 3;
    const std::string tag = " dim " + std::to_string(dim);
    for (const bool bf16 : {false, true}) {
      const auto x = randn(static_cast<size_t>(rows * hc * dim), ++seed), f = randn(static_cast<size_t>(rows * dim), ++seed);
      const auto pre = randn(static_cast<size_t>(rows * hc), ++seed), post = randn(pre.size(), ++seed);
      const auto comb = randn(static_cast<size_t>(rows * hc * hc), ++seed);
      std::vector<float> u(static_cast<size_t>(rows * dim)), xo(x.size());
      hc_collapse(x.data(), pre.data(), u.data(), rows, hc, dim, bf16);
      hc_post(f.data(), x.data(), post.data(), comb.data(), xo.data(), rows, hc, dim, bf16);
      DeviceBuffer<float> dpre(pre), dpost(post), dcomb(comb);
      for (const bool vec : {true, false}) {
        const std::string t = tag + (vec ? " aligned" : " offset") + (bf16 ? " bf16" : "");
        Pair dx(x), df(f), du(u);
        FS_ASSERT_OK(cuda_status(cd::launch_hc_collapse(dx.at(vec), dpre.get(), du.at(vec), rows, hc, dim, bf16, 0),
                                 "collapse"));
        expect_bitwise(du.host(vec), u, ("collapse" + t).c_str());
        FS_ASSERT_OK(cuda_status(
            cd::launch_hc_post(df.at(vec), dx.at(vec), dpost.get(), dcomb.get(), rows, hc, dim, bf16, 0), "post"));
        expect_bitwise(dx.host(vec), xo, ("hc_post" + t).c_str());
      }
    }
    // The MoE combine and combine + post: the four-column kernels against the scalar ones.
    constexpr int64_t K = 6;
    for (int variant = 0; variant < 4; ++variant) {
      const bool mapped = variant & 1, bf16 = variant & 2;
      const int64_t T = rows;
      const auto y = randn(static_cast<size_t>(T * K * dim), ++seed), ys = randn(static_cast<size_t>(T * dim), ++seed);
      const auto x = randn(static_cast<size_t>(T * hc * dim), ++seed);
      const auto post = randn(static_cast<size_t>(T * hc), ++seed), comb = randn(static_cast<size_t>(T * hc * hc), ++seed);
      std::vector<int32_t> row_of(static_cast<size_t>(T * K));
      for (int64_t i = 0; i < T * K; ++i) row_of[static_cast<size_t>(i)] = i % 5 == 4 ? -1 : int32_t((i * 7 + 3) % (T * K));
      DeviceBuffer<int32_t> drow(row_of);
      DeviceBuffer<float> dpost(post), dcomb(comb);
      const int32_t* rmap = mapped ? drow.get() : nullptr;
      std::vector<float> out[2], xs[2], out2[2];
      for (const bool vec : {true, false}) {
        Pair dy(y), dys(ys), dx(x), dout(ys), dout2(ys);
        FS_ASSERT_OK(cuda_status(cd::launch_moe_combine(dy.at(vec), dys.at(vec), dout.at(vec), T, K, dim, bf16, 0, rmap),
                                 "combine"));
        FS_ASSERT_OK(cuda_status(cd::launch_moe_combine_post(dy.at(vec), dys.at(vec), dout2.at(vec), T, K, dim, bf16,
                                                             rmap, dx.at(vec), dpost.get(), dcomb.get(), hc, !bf16, 0),
                                 "combine_post"));
        out[vec] = dout.host(vec), out2[vec] = dout2.host(vec), xs[vec] = dx.host(vec);
      }
      const std::string t = tag + " variant " + std::to_string(variant);
      expect_bitwise(out[1], out[0], ("moe_combine" + t).c_str());
      expect_bitwise(out2[1], out[0], ("combine_post rows" + t).c_str());
      expect_bitwise(xs[1], xs[0], ("combine_post streams" + t).c_str());
      std::vector<float> xo(x.size());
      hc_post(out[0].data(), x.data(), post.data(), comb.data(), xo.data(), T, hc, dim, !bf16);
      expect_bitwise(xs[1], xo, ("combine_post streams vs CPU" + t).c_str());
    }
  }
  // SwiGLU over [rows, n]: n = 2048 and 1540 (not a multiple of 8), routing weights or none, the
  // clamp on or off, BF16 rounding on or off; values of scale 3 so that the clamp bites.
  for (const int64_t n : {2048, 1540}) {
    const int64_t rows = kMin / n + 5;
    const auto g = randn(static_cast<size_t>(rows * n), ++seed, 3.0f), up = randn(g.size(), ++seed, 3.0f);
    const auto wt = randn(static_cast<size_t>(rows), ++seed);
    DeviceBuffer<float> dwt(wt);
    for (int variant = 0; variant < 8; ++variant) {
      const bool weighted = variant & 1, bf16 = variant & 2;
      const float limit = (variant & 4) ? 1.5f : 0.0f;
      std::vector<float> h(g.size());
      for (int64_t r = 0; r < rows; ++r) {
        const size_t o = static_cast<size_t>(r * n);
        swiglu(g.data() + o, up.data() + o, h.data() + o, n, limit, weighted ? wt[static_cast<size_t>(r)] : 1.0f);
      }
      if (bf16)
        for (auto& v : h) v = round_bf16(v);
      std::vector<float> out[2];
      for (const bool vec : {true, false}) {
        Pair dg(g), du(up), dh(g);
        FS_ASSERT_OK(cuda_status(cd::launch_swiglu(dg.at(vec), du.at(vec), dh.at(vec), weighted ? dwt.get() : nullptr,
                                                   rows, n, limit, bf16, 0),
                                 "swiglu"));
        out[vec] = dh.host(vec);
      }
      const std::string t = "swiglu n " + std::to_string(n) + " variant " + std::to_string(variant);
      expect_bitwise(out[1], out[0], (t + " four-column vs scalar").c_str());
      // Against the CPU: the device's exp (through double) and glibc's expf part by one ulp near a
      // rounding midpoint, which the sum 1 + e, the quotient and the two products each may round
      // one ulp further (up to 4 ulp measured on an H100; fewer than 1 value in 1000 differs): at most 4 ulp, in at most
      // 1 value in 1000.
      size_t off = 0;
      for (size_t i = 0; i < h.size(); ++i) {
        if (std::memcmp(&out[1][i], &h[i], 4) == 0) continue;
        int32_t a, b;
        std::memcpy(&a, &out[1][i], 4), std::memcpy(&b, &h[i], 4);
        EXPECT_LE(std::abs(int64_t(a) - int64_t(b)), 4) << t << " [" << i << "] " << out[1][i] << " vs " << h[i];
        ++off;
      }
      EXPECT_LE(off, h.size() / 1000) << t << ": " << off << " values off the CPU twin";
    }
  }
}

TEST(CudaModelOps, HcMixesCollapsePostMatchCpu) {
  FS_REQUIRE_GPU();
  const int64_t rows = 3, hc = 4, dim = 96, n_mix = (2 + hc) * hc;
  const auto x = randn(static_cast<size_t>(rows * hc * dim), 6), fn = randn(static_cast<size_t>(n_mix * hc * dim), 7, 0.05f);
  const auto base = randn(static_cast<size_t>(n_mix), 8), f = randn(static_cast<size_t>(rows * dim), 9);
  const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
  std::vector<float> pre(static_cast<size_t>(rows * hc)), post(pre.size()), comb(static_cast<size_t>(rows * hc * hc));
  hc_mixes({x.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-6f, 1e-6f, 20, pre.data(), post.data(),
            comb.data()});
  std::vector<float> u(static_cast<size_t>(rows * dim)), xo(x.size());
  hc_collapse(x.data(), pre.data(), u.data(), rows, hc, dim, true);
  hc_post(f.data(), x.data(), post.data(), comb.data(), xo.data(), rows, hc, dim, true);

  DeviceBuffer<float> dx(x), dfn(fn), db(base), ds(scale), df(f), dpre(pre.size()), dpost(post.size()),
      dcomb(comb.size()), du(u.size());
  cd::HcMixArgs a;
  a.x = dx.get(), a.fn = dfn.get(), a.base = db.get(), a.scale = ds.get(), a.rows = rows, a.hc = hc, a.dim = dim;
  a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.pre = dpre.get(), a.post = dpost.get(), a.comb = dcomb.get();
  FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "mixes"));
  expect_bitwise(dpre.to_host(), pre, "pre");
  expect_bitwise(dpost.to_host(), post, "post");
  expect_bitwise(dcomb.to_host(), comb, "comb (Sinkhorn)");
  // Collapse / post from the CPU's mixes so each op is checked on its own.
  DeviceBuffer<float> cpre(pre), cpost(post), ccomb(comb);
  FS_ASSERT_OK(cuda_status(cd::launch_hc_collapse(dx.get(), cpre.get(), du.get(), rows, hc, dim, true, 0), "collapse"));
  expect_bitwise(du.to_host(), u, "collapse");
  FS_ASSERT_OK(cuda_status(cd::launch_hc_post(df.get(), dx.get(), cpost.get(), ccomb.get(), rows, hc, dim, true, 0), "post"));
  expect_bitwise(dx.to_host(), xo, "hc_post in place");
}

// Index scores, candidate mask and top-k with quantised (tied) scores and masked entries.
TEST(CudaModelOps, IndexerSelectionMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t T = 9, start = 50, ratio = 2, nI = 3, dI = 64, k = 7, cblock = 4, ctop = 3;
  const int64_t stride = start + T, n_keys = (start + T) / ratio;
  const auto q = randn(static_cast<size_t>(T * nI * dI), 10), keys = randn(static_cast<size_t>(n_keys * dI), 11), w = randn(static_cast<size_t>(T * nI), 12);
  DeviceBuffer<float> dq(q), dk(keys), dw(w), dsc(static_cast<size_t>(T * stride)), dbs(static_cast<size_t>(T * stride));
  DeviceBuffer<uint8_t> dcand(static_cast<size_t>(T * stride)), dtaken(static_cast<size_t>(T * stride));
  DeviceBuffer<int32_t> dout(static_cast<size_t>(T * k)), dn(static_cast<size_t>(T));
  cd::IndexScoreArgs s;
  s.q = dq.get(), s.w = dw.get(), s.keys = dk.get(), s.scores = dsc.get(), s.T = T, s.nI = nI, s.dI = dI;
  s.start = start, s.ratio = ratio, s.stride = stride, s.bf16 = true;
  FS_ASSERT_OK(cuda_status(cd::launch_index_scores(s, 0), "scores"));
  const auto gsc = dsc.to_host();
  for (int mode : {1, 2, 0}) {
    // Same scores on both sides: coarse rounding forces ties; a few -inf entries.
    std::vector<float> sc = gsc;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t clen = (start + t + 1) / ratio;
      std::vector<float> ref(static_cast<size_t>(clen));
      ops::index_scores({q.data() + t * nI * dI, w.data() + t * nI, keys.data(), clen, nI, dI, true, ref.data()});
      for (int64_t i = 0; i < clen; ++i) {
        ASSERT_EQ(ref[static_cast<size_t>(i)], gsc[static_cast<size_t>(t * stride + i)]) << "score t=" << t << " i=" << i;
        sc[static_cast<size_t>(t * stride + i)] = std::round(ref[static_cast<size_t>(i)] * 2.0f) / 2.0f;
      }
      sc[static_cast<size_t>(t * stride + 3)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<uint8_t> cand_h(static_cast<size_t>(T * stride), 1);
    if (mode == 2) {  // a mask from a previous mode-1 pass, as the model chains them
      for (size_t i = 0; i < cand_h.size(); ++i) cand_h[i] = uint8_t((i * 7) % 3 != 0);
      DeviceBuffer<uint8_t> tmp(cand_h);
      cudaMemcpy(dcand.get(), tmp.get(), cand_h.size(), cudaMemcpyDeviceToDevice);
    }
    DeviceBuffer<float> dsc2(sc);
    cd::IndexTopkArgs a;
    a.scores = dsc2.get(), a.cand = dcand.get(), a.block_scratch = dbs.get(), a.taken = dtaken.get();
    a.out = dout.get(), a.out_n = dn.get(), a.T = T, a.start = start, a.ratio = ratio, a.stride = stride, a.k = k;
    a.cand_block = cblock, a.cand_top = ctop, a.mode = mode;
    FS_ASSERT_OK(cuda_status(cd::launch_index_topk(a, 0), "topk"));
    const auto out = dout.to_host(), n = dn.to_host();
    const auto gcand = dcand.to_host();
    for (int64_t t = 0; t < T; ++t) {
      const int64_t clen = (start + t + 1) / ratio;
      std::vector<float> row(sc.begin() + t * stride, sc.begin() + t * stride + clen);
      if (mode == 1) {
        std::vector<uint8_t> m(static_cast<size_t>(clen));
        candidate_mask(row.data(), clen, clen, cblock, ctop, m.data());
        for (int64_t i = 0; i < clen; ++i) ASSERT_EQ(m[static_cast<size_t>(i)], gcand[static_cast<size_t>(t * stride + i)]) << "cand t=" << t;
      }
      if (mode == 2)
        for (int64_t i = 0; i < clen; ++i)
          if (!cand_h[static_cast<size_t>(t * stride + i)]) row[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
      const auto ref = topk_indices(row.data(), clen, k);
      ASSERT_EQ(int64_t(ref.size()), n[static_cast<size_t>(t)]) << "mode " << mode << " t " << t;
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(ref[i], out[static_cast<size_t>(t * k) + i]) << "mode " << mode << " t " << t;
    }
  }
}

// Index scores of every kernel (1: thread per key, 2/3: key tiles in shared memory with 1/2 keys
// per thread) against ops::index_scores, bitwise: causal rows (clen differs per row), odd key
// counts and dims (zero-padded to 32 in the tiles), head counts below / above one 32-head block,
// V4.1 / V4 real dims, several key tiles with rows split over blocks or looped in one block, BF16
// on and off, NaN / inf / -0 in keys and queries. Entries past clen must stay unwritten.
TEST(CudaModelOps, IndexScoresAllKernelsMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  struct Case { int64_t T, start, ratio, nI, dI; };
  const Case cases[] = {
      {5, 40, 1, 2, 32},       // tiny config dims, clen 41..45 (part of one tile)
      {3, 90, 3, 3, 37},       // odd dI (not a multiple of 4: scalar loads), 3 heads
      {6, 1290, 4, 4, 128},    // V4.1 tiny: 4 heads x 128, clen 322..324 over 3-6 tiles
      {6, 2001, 4, 32, 128},   // V4.1 real dims, odd clen
      {2, 700, 2, 64, 128},    // V4 real dims: 2 head blocks
      {4, 13, 1, 33, 100},     // 33 heads: a padded second head block, dI 100
      {3, 69998, 2, 2, 32},    // 35k keys: > 2 tiles per SM, every row looped in one block
      {9, 0, 4, 5, 64},        // rows 0-2 see no key (clen 0), then 1 and 2 keys
      {2, 20, 1, 3, 1000},     // tile over the shared-memory limit: the thread-per-key kernel
      {2, 10, 1, 2, 1100},     // dI > 1024 (chunked dot order): the thread-per-key kernel
  };
  uint64_t seed = 300;
  for (const Case& c : cases) {
    const int64_t stride = c.start + c.T, n_keys = (c.start + c.T) / c.ratio;
    auto q = randn(static_cast<size_t>(c.T * c.nI * c.dI), ++seed);
    auto keys = randn(static_cast<size_t>(n_keys * c.dI), ++seed);
    const auto w = randn(static_cast<size_t>(c.T * c.nI), ++seed);
    if (n_keys > 6) {  // special values in a few keys and one query head
      keys[static_cast<size_t>(1 * c.dI)] = std::numeric_limits<float>::quiet_NaN();
      keys[static_cast<size_t>(2 * c.dI + c.dI - 1)] = std::numeric_limits<float>::infinity();
      for (int64_t d = 0; d < c.dI; ++d) keys[static_cast<size_t>(3 * c.dI + d)] = -0.0f;
      for (int64_t d = 0; d < c.dI; ++d) keys[static_cast<size_t>(4 * c.dI + d)] = 0.0f;
      q[static_cast<size_t>(c.dI / 2)] = -std::numeric_limits<float>::infinity();
    }
    for (bool bf16 : {false, true}) {
      // CPU reference per row over its own clen.
      std::vector<std::vector<float>> ref(static_cast<size_t>(c.T));
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t clen = (c.start + t + 1) / c.ratio;
        ref[static_cast<size_t>(t)].resize(static_cast<size_t>(clen));
        ops::index_scores({q.data() + t * c.nI * c.dI, w.data() + t * c.nI, keys.data(), clen, c.nI, c.dI, bf16,
                           ref[static_cast<size_t>(t)].data()});
      }
      for (int kernel : {1, 2, 3}) {
        DeviceBuffer<float> dq(q), dk(keys), dw(w), dsc(static_cast<size_t>(c.T * stride));  // poisoned
        cd::IndexScoreArgs s;
        s.q = dq.get(), s.w = dw.get(), s.keys = dk.get(), s.scores = dsc.get(), s.T = c.T, s.nI = c.nI, s.dI = c.dI;
        s.start = c.start, s.ratio = c.ratio, s.stride = stride, s.bf16 = bf16, s.kernel = kernel;
        FS_ASSERT_OK(cuda_status(cd::launch_index_scores(s, 0), "scores"));
        FS_ASSERT_OK(cuda_status(cudaDeviceSynchronize(), "sync"));
        const auto got = dsc.to_host();
        size_t bad = 0;
        for (int64_t t = 0; t < c.T; ++t) {
          const auto& r = ref[static_cast<size_t>(t)];
          for (int64_t i = 0; i < stride; ++i) {
            const float g = got[static_cast<size_t>(t * stride + i)];
            uint32_t gb;
            std::memcpy(&gb, &g, 4);
            bool ok;
            if (i >= int64_t(r.size())) ok = gb == 0xFFFFFFFFu;  // past clen: the poison is intact
            else if (std::isnan(r[static_cast<size_t>(i)])) ok = std::isnan(g);  // NaN payloads differ by platform
            else ok = std::memcmp(&g, &r[static_cast<size_t>(i)], 4) == 0;
            if (!ok && ++bad <= 3)
              ADD_FAILURE() << "kernel " << kernel << " T=" << c.T << " nI=" << c.nI << " dI=" << c.dI << " bf16=" << bf16
                            << " t=" << t << " i=" << i << ": " << g << " vs "
                            << (i < int64_t(r.size()) ? r[static_cast<size_t>(i)] : 0.0f);
          }
        }
        EXPECT_EQ(bad, 0u) << "kernel " << kernel << " nI=" << c.nI << " dI=" << c.dI << " bf16=" << bf16;
      }
    }
  }
}

// Bad index-score arguments are refused, not run.
TEST(CudaModelOps, IndexScoresRejectBadArgs) {
  FS_REQUIRE_GPU();
  cd::IndexScoreArgs s;
  s.T = 1, s.nI = 1, s.dI = 8, s.stride = 4, s.ratio = 0;
  EXPECT_EQ(cd::launch_index_scores(s, 0), cudaErrorInvalidValue);
  s.ratio = 1, s.kernel = 5;
  EXPECT_EQ(cd::launch_index_scores(s, 0), cudaErrorInvalidValue);
  s.kernel = 4;  // FP32 queries and keys: the integer kernel cannot run them
  EXPECT_EQ(cd::launch_index_scores(s, 0), cudaErrorInvalidValue);
  cudaGetLastError();
}

// V4 hash routing (tid2eid): a repeated expert id keeps its score in the denominator but gets
// weight 0 after its first copy, like ops::route.
TEST(CudaModelOps, RouteHashRepeatedIdMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t T = 4, E = 16, K = 6, vocab = 5;
  const auto logits = randn(static_cast<size_t>(T * E), 70);
  const std::vector<int32_t> tid2eid = {
      0, 3, 5, 7, 9, 11,    // distinct
      4, 4, 2, 9, 1, 15,    // one id twice
      6, 6, 6, 6, 6, 6,     // one id six times
      12, 1, 12, 8, 1, 0,   // two ids twice, unsorted
      15, 14, 13, 12, 11, 10};
  ASSERT_EQ(int64_t(tid2eid.size()), vocab * K);
  const std::vector<int32_t> tokens = {3, 1, 2, 0};
  for (bool softplus : {true, false}) {
    DeviceBuffer<float> dl(logits), dscr(static_cast<size_t>(T * 2 * E)), dw(static_cast<size_t>(T * K));
    DeviceBuffer<int32_t> dsel(static_cast<size_t>(T * K)), dtid(tid2eid), dtok(tokens);
    cd::RouteArgs a;
    a.logits = dl.get(), a.tid2eid = dtid.get(), a.tokens = dtok.get(), a.scratch = dscr.get(), a.T = T, a.E = E, a.K = K;
    a.gate_temp = 1.0f, a.route_scale = 1.5f, a.sqrtsoftplus = softplus, a.norm_topk = true, a.renorm_eps = !softplus;
    a.sel = dsel.get(), a.weight = dw.get();
    FS_ASSERT_OK(cuda_status(cd::launch_route(a, 0), "route"));
    const auto sel = dsel.to_host();
    const auto wt = dw.to_host();
    int zeros = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> rs(static_cast<size_t>(K));
      std::vector<float> rw(static_cast<size_t>(K));
      RouteParams p{logits.data() + t * E, nullptr, tid2eid.data() + tokens[static_cast<size_t>(t)] * K, E, K};
      p.gate_temp = 1.0f, p.route_scale = 1.5f, p.sqrtsoftplus = softplus, p.norm_topk = true;
      p.renorm_eps = !softplus, p.sel = rs.data(), p.weight = rw.data();
      route(p);
      for (int64_t i = 0; i < K; ++i) {
        const size_t gi = static_cast<size_t>(t * K + i);
        EXPECT_EQ(rs[static_cast<size_t>(i)], sel[gi]) << "t " << t;
        if (rw[static_cast<size_t>(i)] == 0.0f) {
          ++zeros;
          EXPECT_EQ(wt[gi], 0.0f) << "repeated id keeps a weight: t " << t << " slot " << i;
        } else {
          EXPECT_NEAR(rw[static_cast<size_t>(i)], wt[gi], 1e-6f * std::fabs(rw[static_cast<size_t>(i)])) << "t " << t;
        }
      }
    }
    EXPECT_EQ(zeros, 1 + 5 + 2);  // the repeats of rows 1, 2, 3 (token order 3, 1, 2, 0)
  }
}

TEST(CudaModelOps, RouteMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t T = 11, E = 37, K = 5;
  auto logits = randn(static_cast<size_t>(T * E), 13);
  for (int64_t e = 0; e < E; e += 3) logits[static_cast<size_t>(E + e)] = 0.5f;  // ties in one token
  const auto bias = randn(static_cast<size_t>(E), 14, 0.01f);
  for (bool softplus : {true, false}) {
    DeviceBuffer<float> dl(logits), db(bias), dscr(static_cast<size_t>(T * 2 * E)), dw(static_cast<size_t>(T * K));
    DeviceBuffer<int32_t> dsel(static_cast<size_t>(T * K));
    cd::RouteArgs a;
    a.logits = dl.get(), a.bias = softplus ? db.get() : nullptr, a.scratch = dscr.get(), a.T = T, a.E = E, a.K = K;
    a.gate_temp = 1.5f, a.route_scale = 2.5f, a.sqrtsoftplus = softplus, a.norm_topk = true, a.renorm_eps = softplus;
    a.sel = dsel.get(), a.weight = dw.get();
    FS_ASSERT_OK(cuda_status(cd::launch_route(a, 0), "route"));
    const auto sel = dsel.to_host();
    const auto wt = dw.to_host();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> rs(static_cast<size_t>(K));
      std::vector<float> rw(static_cast<size_t>(K));
      RouteParams p{logits.data() + t * E, softplus ? bias.data() : nullptr, nullptr, E, K};
      p.gate_temp = 1.5f, p.route_scale = 2.5f, p.sqrtsoftplus = softplus, p.norm_topk = true;
      p.renorm_eps = softplus, p.sel = rs.data(), p.weight = rw.data();
      route(p);
      for (int64_t i = 0; i < K; ++i) {
        EXPECT_EQ(rs[static_cast<size_t>(i)], sel[static_cast<size_t>(t * K + i)]) << "t " << t;
        EXPECT_NEAR(rw[static_cast<size_t>(i)], wt[static_cast<size_t>(t * K + i)], 1e-6f * std::fabs(rw[static_cast<size_t>(i)]) + 1e-12f);
      }
    }
  }
}

// Attention over [window from ring + chunk ‖ selected compressed rows] vs ops::sparse_attention.
TEST(CudaModelOps, ModelAttentionMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t T = 6, H = 3, Dh = 72, W = 5, ring = W + 8, start = 9, n_ckv = 8, k = 4;
  const auto q = randn(static_cast<size_t>(T * H * Dh), 15), kv = randn(static_cast<size_t>(T * Dh), 16), rg = randn(static_cast<size_t>(ring * Dh), 17);
  const auto ckv = randn(static_cast<size_t>(n_ckv * Dh), 18), sink = randn(static_cast<size_t>(H), 19);
  std::vector<int32_t> topk(static_cast<size_t>(T * k), 0), tn(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    tn[static_cast<size_t>(t)] = int32_t(t % (k + 1));  // 0..k rows, ascending
    for (int64_t i = 0; i < tn[static_cast<size_t>(t)]; ++i) topk[static_cast<size_t>(t * k + i)] = int32_t(2 * i + t % 2);
  }
  for (bool bf16 : {false, true}) {
    DeviceBuffer<float> dq(q), dkv(kv), drg(rg), dckv(ckv), dsink(sink), dout(static_cast<size_t>(T * H * Dh));
    DeviceBuffer<int32_t> dtk(topk), dtn(tn);
    cd::ModelAttnArgs a;
    a.q = dq.get(), a.kv_chunk = dkv.get(), a.ring = drg.get(), a.ckv = dckv.get(), a.topk = dtk.get();
    a.topk_n = dtn.get(), a.topk_stride = k, a.ratio = 2, a.sink = dsink.get(), a.out = dout.get();
    a.T = T, a.H = H, a.Dh = Dh, a.window = W, a.ring_size = ring, a.start = start, a.max_keys = W + k;
    a.scale = 1.0f / std::sqrt(float(Dh)), a.bf16 = bf16;
    FS_ASSERT_OK(cuda_status(cd::launch_model_attention(a, 0), "attention"));
    const auto got = dout.to_host();
    std::vector<float> ref(got.size());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = start + t;
      std::vector<const float*> keys;
      for (int64_t s = std::max<int64_t>(0, p - W + 1); s <= p; ++s)
        keys.push_back(s >= start ? kv.data() + (s - start) * Dh : rg.data() + (s % ring) * Dh);
      for (int64_t i = 0; i < tn[static_cast<size_t>(t)]; ++i) keys.push_back(ckv.data() + int64_t(topk[static_cast<size_t>(t * k + i)]) * Dh);
      sparse_attention({q.data() + t * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, sink.data(), a.scale, bf16,
                        ref.data() + t * H * Dh});
      if (bf16) round_bf16_inplace(ref.data() + t * H * Dh, H * Dh);
    }
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ref[i], got[i], 1e-6f * (1 + std::fabs(ref[i]))) << i;
  }
}

TEST(CudaModelOps, SoftmaxPoolWithEmptySlotsMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t groups = 3, slots = 8, dim = 130;
  const auto v = randn(static_cast<size_t>(groups * slots * dim), 20), z = randn(static_cast<size_t>(groups * slots * dim), 21, 4.0f);
  DeviceBuffer<float> dv(v), dz(z), dout(static_cast<size_t>(groups * dim));
  std::vector<const float*> tab_h, href_v, href_z;
  std::vector<float> ref(static_cast<size_t>(groups * dim));
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<const float*> hv, hz;
    for (int64_t s = 0; s < slots; ++s) {
      const bool empty = g == 1 && s < 4;  // the first window's missing previous half
      const int64_t off = (g * slots + s) * dim;
      hv.push_back(empty ? nullptr : v.data() + off), hz.push_back(empty ? nullptr : z.data() + off);
      tab_h.push_back(empty ? nullptr : dv.get() + off);
    }
    softmax_pool({hv.data(), hz.data(), slots, dim, ref.data() + g * dim});
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t s = 0; s < slots; ++s) {
      const bool empty = g == 1 && s < 4;
      tab_h.push_back(empty ? nullptr : dz.get() + (g * slots + s) * dim);
    }
  DeviceBuffer<const float*> dtab(tab_h);
  FS_ASSERT_OK(cuda_status(cd::launch_softmax_pool(dtab.get(), dtab.get() + groups * slots, groups, slots, dim,
                                                   dout.get(), 0), "pool"));
  expect_bitwise(dout.to_host(), ref, "softmax_pool");
}

// The chunked summation order (ops/cpu/sum_order.h) on the warp-parallel kernels: lengths around
// the 1024 chunk, n = 1, odd n (unaligned rows: the scalar-load path), full V4.1 widths.
TEST(CudaModelOps, ChunkedLinearAndNormMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  const int64_t T = 3, out = 13, E = 3;
  for (int64_t in : {1, 9, 1023, 1024, 1025, 2051, 4096, 5120}) {
    SCOPED_TRACE(in);
    const auto x = randn(static_cast<size_t>(T * in), 30 + in), w = randn(static_cast<size_t>(E * out * in), 31 + in, 0.1f);
    std::vector<int32_t> sel = {2, 0, 2};
    for (bool stacked : {false, true}) {
      std::vector<float> ref(static_cast<size_t>(T * out));
      for (int64_t r = 0; r < T; ++r)
        linear({x.data() + r * in, w.data() + (stacked ? int64_t(sel[static_cast<size_t>(r)]) : 0) * out * in,
                ref.data() + r * out, 1, in, out, 0, false, stacked});
      DeviceBuffer<float> dx(x), dw(w), dy(ref.size());
      DeviceBuffer<int32_t> ds(sel);
      cd::LinearArgs a;
      a.x = dx.get(), a.w = dw.get(), a.y = dy.get(), a.sel = stacked ? ds.get() : nullptr, a.rows = T;
      a.in = in, a.out = out, a.bf16_out = stacked;
      FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "linear"));
      expect_bitwise(dy.to_host(), ref, stacked ? "stacked chunked linear" : "chunked linear");
      // One row alone: the same bits (batch invariance).
      DeviceBuffer<float> dy1(static_cast<size_t>(out));
      a.x = dx.get() + 2 * in, a.y = dy1.get(), a.sel = stacked ? ds.get() + 2 : nullptr, a.rows = 1;
      FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "linear row"));
      expect_bitwise(dy1.to_host(), std::vector<float>(ref.begin() + 2 * out, ref.end()), "linear row 2 alone");
    }
    const auto g = randn(static_cast<size_t>(in), 32);
    std::vector<float> nref(x.size());
    rms_norm({x.data(), g.data(), nref.data(), T, in, 1e-6f, false});
    DeviceBuffer<float> dx(x), dg(g), dn(x.size());
    FS_ASSERT_OK(cuda_status(cd::launch_model_rms_norm(dx.get(), dg.get(), dn.get(), T, in, 1e-6f, false, 0), "norm"));
    expect_bitwise(dn.to_host(), nref, "chunked rms_norm");
  }
}

// Engram gate (ops::engram_gate's sum orders: short rows by one thread, rows longer than one
// 1024-element chunk by warps over chunks), odd widths, BF16 output on and off, a zero key row
// (the gate's eps path) and a row alone (batch invariance): bitwise.
TEST(CudaModelOps, EngramGateMatchesCpuBitwise) {
  FS_REQUIRE_GPU();
  const int64_t rows = 3, hc = 4;
  for (int64_t dim : {1, 7, 256, 1023, 1024, 1025, 3001, 7168}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " bf16 " << bf16);
      const auto x = randn(static_cast<size_t>(rows * hc * dim), 40 + dim);
      auto kv = randn(static_cast<size_t>(rows * (hc + 1) * dim), 41 + dim, 0.5f);
      std::fill_n(kv.begin() + (hc + 1) * dim + dim, dim, 0.0f);  // row 1, stream 1: zero key
      const auto wqk = randn(static_cast<size_t>(hc * dim), 42 + dim, 0.2f);
      std::vector<float> ref = x;
      for (int64_t r = 0; r < rows; ++r)
        engram_gate({ref.data() + r * hc * dim, kv.data() + r * (hc + 1) * dim, wqk.data(), hc, dim, 1e-20f, false,
                     bf16});
      DeviceBuffer<float> dx(x), dkv(kv), dw(wqk);
      FS_ASSERT_OK(cuda_status(cd::launch_engram_gate(dx.get(), dkv.get(), dw.get(), rows, hc, dim, 1e-20f, bf16, 0),
                               "engram gate"));
      expect_bitwise(dx.to_host(), ref, "engram gate");
      DeviceBuffer<float> dx1(std::vector<float>(x.begin() + 2 * hc * dim, x.end()));
      FS_ASSERT_OK(cuda_status(
          cd::launch_engram_gate(dx1.get(), dkv.get() + 2 * (hc + 1) * dim, dw.get(), 1, hc, dim, 1e-20f, bf16, 0),
          "engram gate row"));
      expect_bitwise(dx1.to_host(), std::vector<float>(ref.begin() + 2 * hc * dim, ref.end()), "engram gate row 2 alone");
    }
  }
  DeviceBuffer<float> d1(std::vector<float>(4, 1.0f));
  EXPECT_NE(cd::launch_engram_gate(d1.get(), d1.get(), d1.get(), 1, 1, 65 * 1024, 1e-20f, false, 0), cudaSuccess)
      << "a row wider than the kernel's chunk table is refused";
}

// mHC mixes at full width (4 x 5120: 20 chunks), a ragged last chunk (4 x 257) and exactly one
// chunk (4 x 256); head-only mixes against ops::hc_head_pre; 1, 3 and the automatic number of
// blocks per row (the chunk-split kernel where hc·dim > 1024, else the row kernel).
TEST(CudaModelOps, HcMixesChunkedMatchCpuBitwise) {
  FS_REQUIRE_GPU();
  const int64_t rows = 2, hc = 4, n_mix = (2 + hc) * hc;
  for (int64_t dim : {256, 257, 5120}) {
    SCOPED_TRACE(dim);
    const auto x = randn(static_cast<size_t>(rows * hc * dim), 40, 2.0f), fn = randn(static_cast<size_t>(n_mix * hc * dim), 41, 0.02f);
    const auto base = randn(static_cast<size_t>(n_mix), 42);
    const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
    std::vector<float> pre(static_cast<size_t>(rows * hc)), post(pre.size()), comb(static_cast<size_t>(rows * hc * hc)), hpre(pre.size());
    hc_mixes({x.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-6f, 1e-6f, 20, pre.data(), post.data(),
              comb.data()});
    hc_head_pre(x.data(), fn.data(), base.data(), scale.data(), hpre.data(), rows, hc, dim, 1e-6f, 1e-6f);
    DeviceBuffer<float> dx(x), dfn(fn), db(base), ds(scale), dpre(pre.size()), dpost(post.size()), dcomb(comb.size());
    cd::HcMixArgs a;
    a.x = dx.get(), a.fn = dfn.get(), a.base = db.get(), a.scale = ds.get(), a.rows = rows, a.hc = hc, a.dim = dim;
    a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.pre = dpre.get(), a.post = dpost.get(), a.comb = dcomb.get();
    for (int cluster : {1, 3, 0}) {  // one block, 3 and the default blocks per row: same bits
      SCOPED_TRACE(cluster);
      a.cluster = cluster, a.head_only = false;
      FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "mixes"));
      expect_bitwise(dpre.to_host(), pre, "pre");
      expect_bitwise(dpost.to_host(), post, "post");
      expect_bitwise(dcomb.to_host(), comb, "comb (Sinkhorn)");
      a.head_only = true;
      FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "head mixes"));
      expect_bitwise(dpre.to_host(), hpre, "head pre");
    }
    a.cluster = 17;
    EXPECT_NE(cd::launch_hc_mixes(a, 0), cudaSuccess);
    a.cluster = 0, a.kernel = 3;
    EXPECT_NE(cd::launch_hc_mixes(a, 0), cudaSuccess);
    a.kernel = 2;  // the chunk-split kernel needs hc·dim > 1024
    if (dim == 256) {
      EXPECT_NE(cd::launch_hc_mixes(a, 0), cudaSuccess);
    }
    a.kernel = 0;
  }
}

// Row tiles of the mHC mixes (HcMixArgs::tiled): many rows, full width (4 x 5120), a ragged last
// chunk and a partial 128-column slice (4 x 1000), 15 mixes (hc 3: a second mix block of 3), two
// chunks with a 4-value tail (2 x 514), rows not a multiple of the 16-row tile, a width the tiles
// cannot take (hc·dim % 4 != 0: the row kernel runs). Every row-tile variant (1, 2 and 4 slices
// per stage, automatic) must give the row kernel's bits (pre, post, comb and head-only pre).
// Against the CPU twin: bitwise except a 1-ulp difference on at most 0.1 % of the values (at
// least one per array): the device sigmoid / softmax use a correctly rounded exp, the CPU's
// glibc expf is not correctly rounded at near-midpoint inputs (seen on an H200 run: post[228] of
// the 129 x 3 case, exp(0.72246838) = 2.0595105885: expf gives 2.05951071, the device
// 2.05951047; the row kernel differs there too, the row tiles equal it).
// The decode-batch shapes (16, 64 and 1000 rows of 4 x 4096) run the row tiles with a workspace
// too (HcMixArgs::work: the chunks split over CTAs, then folded), against the row kernel bitwise;
// their CPU comparison is left to the cases above (in the 1000-row case a near-midpoint expf's
// 1-ulp difference grows to 5 ulp through Sinkhorn).
// 40 x 6 x 700 (hc·hc = 36: the block-wide Sinkhorn after the tiles' dots) against the row kernel
// only: through the hc-6 Sinkhorn the exp difference reaches 2-4 ulp in ~2 % of comb's values.
void expect_near_cpu(const std::vector<float>& gpu, const std::vector<float>& cpu, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t off = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], 4) == 0) continue;
    int32_t a, b;
    std::memcpy(&a, &gpu[i], 4), std::memcpy(&b, &cpu[i], 4);
    EXPECT_LE(std::abs(int64_t(a) - int64_t(b)), 1) << what << " [" << i << "] " << gpu[i] << " vs " << cpu[i];
    ++off;
  }
  EXPECT_LE(off, std::max<size_t>(1, gpu.size() / 1000)) << what << ": " << off << " values not bitwise equal to the CPU twin";
}

TEST(CudaModelOps, HcMixesRowTilesMatchRowKernelBitwise) {
  FS_REQUIRE_GPU();
  struct Case { int64_t rows, hc, dim; bool cpu = true; };
  for (const Case c : {Case{300, 4, 5120}, Case{37, 4, 1000}, Case{129, 3, 1284}, Case{17, 2, 514}, Case{70, 3, 343},
                       Case{40, 6, 700, false}, Case{64, 4, 4096, false}, Case{16, 4, 4096, false},
                       Case{1000, 4, 4096, false}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, hc " << c.hc << ", dim " << c.dim);
    const int64_t rows = c.rows, hc = c.hc, dim = c.dim, n_mix = (2 + hc) * hc;
    const auto x = randn(static_cast<size_t>(rows * hc * dim), 50 + uint64_t(dim), 2.0f);
    const auto fn = randn(static_cast<size_t>(n_mix * hc * dim), 51 + uint64_t(dim), 0.02f);
    const auto base = randn(static_cast<size_t>(n_mix), 52);
    const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
    std::vector<float> pre(static_cast<size_t>(rows * hc)), post(pre.size()), comb(static_cast<size_t>(rows * hc * hc)),
        hpre(pre.size());
    if (c.cpu) {
      hc_mixes({x.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-6f, 1e-6f, 20, pre.data(),
                post.data(), comb.data()});
      hc_head_pre(x.data(), fn.data(), base.data(), scale.data(), hpre.data(), rows, hc, dim, 1e-6f, 1e-6f);
    }
    DeviceBuffer<float> dx(x), dfn(fn), db(base), ds(scale), dpre(pre.size()), dpost(post.size()), dcomb(comb.size());
    cd::HcMixArgs a;
    a.x = dx.get(), a.fn = dfn.get(), a.base = db.get(), a.scale = ds.get(), a.rows = rows, a.hc = hc, a.dim = dim;
    a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.pre = dpre.get(), a.post = dpost.get(), a.comb = dcomb.get();
    std::vector<float> row_out[4];  // the row kernel's pre, post, comb, head pre
    DeviceBuffer<float> dwork(static_cast<size_t>(cd::hc_mixes_work_floats(a)));  // the larger (all mixes)
    for (int tiled : {0, 1, 2, 4, -1, 11, 12, 14, 10}) {  // 1x: the same with a workspace (chunk groups)
      SCOPED_TRACE(::testing::Message() << "tiled " << tiled);
      a.tiled = tiled >= 10 ? (tiled == 10 ? -1 : tiled - 10) : tiled, a.head_only = false;
      a.work = tiled >= 10 ? dwork.get() : nullptr;
      FS_ASSERT_OK(cuda_status(cudaMemset(dpre.get(), 0xff, pre.size() * 4), "poison"));
      FS_ASSERT_OK(cuda_status(cudaMemset(dpost.get(), 0xff, post.size() * 4), "poison"));
      FS_ASSERT_OK(cuda_status(cudaMemset(dcomb.get(), 0xff, comb.size() * 4), "poison"));
      FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "mixes"));
      std::vector<float> out[4] = {dpre.to_host(), dpost.to_host(), dcomb.to_host(), {}};
      a.head_only = true;
      FS_ASSERT_OK(cuda_status(cudaMemset(dpre.get(), 0xff, pre.size() * 4), "poison"));
      FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "head mixes"));
      out[3] = dpre.to_host();
      if (tiled == 0) {
        for (int i = 0; i < 4; ++i) row_out[i] = out[i];
        if (!c.cpu) continue;
        expect_near_cpu(out[0], pre, "pre vs CPU");
        expect_near_cpu(out[1], post, "post vs CPU");
        expect_near_cpu(out[2], comb, "comb (Sinkhorn) vs CPU");
        expect_near_cpu(out[3], hpre, "head pre vs CPU");
        continue;
      }
      expect_bitwise(out[0], row_out[0], "pre vs row kernel");
      expect_bitwise(out[1], row_out[1], "post vs row kernel");
      expect_bitwise(out[2], row_out[2], "comb (Sinkhorn) vs row kernel");
      expect_bitwise(out[3], row_out[3], "head pre vs row kernel");
    }
  }
}

// The chunk-split mixes (HcMixArgs::kernel 2, automatic for hc·dim > 1024 up to 32 chunks: the
// decode path) give the row kernel's bits (pre, post, comb, head-only pre) on every path it has:
// the decode shape 4 x 4096 (16 chunks, one per block at 16 blocks per row), 20 chunks (blocks with
// 2 or 3 chunks at 16 / 8 blocks), 32 chunks (the most), a ragged last chunk (4 x 257: 4 values),
// hc 1 / 2 (3 and 8 mixes; hc·dim = 2002 not a multiple of 4: unaligned rows, scalar loads), hc 6
// (48 mixes: more items than warps; hc·hc = 36: the block-wide Sinkhorn), clusters of 1, 2, 5
// (more blocks than chunks for 2-chunk rows), 8 and 16 blocks (where the device runs 16: a note
// otherwise) and the automatic size, several
// rows and a row alone (batch invariance). 33 chunks are refused (kernel 2) and run by the row
// kernel (automatic). Row kernel vs CPU: expect_near_cpu (the exp caveat above).
TEST(CudaModelOps, HcMixesChunkSplitMatchesRowKernelBitwise) {
  FS_REQUIRE_GPU();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  struct Case { int64_t rows, hc, dim; };
  for (const Case c : {Case{1, 4, 4096}, Case{3, 4, 5120}, Case{2, 4, 8192}, Case{2, 4, 257}, Case{3, 1, 3000},
                       Case{2, 2, 1001}, Case{2, 6, 700}, Case{2, 4, 8200}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, hc " << c.hc << ", dim " << c.dim);
    const int64_t rows = c.rows, hc = c.hc, dim = c.dim, n_mix = (2 + hc) * hc;
    const int64_t chunks = (hc * dim + 1023) / 1024;
    const auto x = randn(static_cast<size_t>(rows * hc * dim), 60 + uint64_t(dim), 2.0f);
    const auto fn = randn(static_cast<size_t>(n_mix * hc * dim), 61 + uint64_t(dim), 0.02f);
    const auto base = randn(static_cast<size_t>(n_mix), 62);
    const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
    std::vector<float> pre(static_cast<size_t>(rows * hc)), post(pre.size()), comb(static_cast<size_t>(rows * hc * hc)),
        hpre(pre.size());
    hc_mixes({x.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-6f, 1e-6f, 20, pre.data(), post.data(),
              comb.data()});
    hc_head_pre(x.data(), fn.data(), base.data(), scale.data(), hpre.data(), rows, hc, dim, 1e-6f, 1e-6f);
    DeviceBuffer<float> dx(x), dfn(fn), db(base), ds(scale), dpre(pre.size()), dpost(post.size()), dcomb(comb.size());
    cd::HcMixArgs a;
    a.x = dx.get(), a.fn = dfn.get(), a.base = db.get(), a.scale = ds.get(), a.rows = rows, a.hc = hc, a.dim = dim;
    a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.pre = dpre.get(), a.post = dpost.get(), a.comb = dcomb.get();
    auto run = [&](std::vector<float> out[4]) -> cudaError_t {  // pre, post, comb, head pre (poisoned first)
      if (cudaMemset(dpre.get(), 0xff, pre.size() * 4) != cudaSuccess ||
          cudaMemset(dpost.get(), 0xff, post.size() * 4) != cudaSuccess ||
          cudaMemset(dcomb.get(), 0xff, comb.size() * 4) != cudaSuccess)
        return cudaErrorUnknown;
      a.head_only = false;
      cudaError_t e = cd::launch_hc_mixes(a, 0);
      if (e != cudaSuccess) return e;
      out[0] = dpre.to_host(), out[1] = dpost.to_host(), out[2] = dcomb.to_host();
      if (cudaMemset(dpre.get(), 0xff, pre.size() * 4) != cudaSuccess) return cudaErrorUnknown;
      a.head_only = true;
      e = cd::launch_hc_mixes(a, 0);
      if (e != cudaSuccess) return e;
      out[3] = dpre.to_host();
      return cudaSuccess;
    };
    std::vector<float> row_out[4];
    a.kernel = 1, a.cluster = 1;
    FS_ASSERT_OK(cuda_status(run(row_out), "row kernel"));
    expect_near_cpu(row_out[0], pre, "row kernel pre vs CPU");
    expect_near_cpu(row_out[1], post, "row kernel post vs CPU");
    expect_near_cpu(row_out[2], comb, "row kernel comb vs CPU");
    expect_near_cpu(row_out[3], hpre, "row kernel head pre vs CPU");
    const char* names[4] = {"pre", "post", "comb (Sinkhorn)", "head pre"};
    if (chunks > 32) {
      a.kernel = 2, a.cluster = 0;
      EXPECT_NE(cd::launch_hc_mixes(a, 0), cudaSuccess) << "more than 32 chunks: no chunk-split kernel";
      a.kernel = 0;
      std::vector<float> out[4];
      FS_ASSERT_OK(cuda_status(run(out), "automatic"));
      for (int i = 0; i < 4; ++i) expect_bitwise(out[i], row_out[i], names[i]);
      continue;
    }
    for (const auto& [kernel, cluster] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{2, 5}, std::pair{2, 8},
                                          std::pair{2, 16}, std::pair{2, 0}, std::pair{0, 0}}) {
      SCOPED_TRACE(::testing::Message() << "kernel " << kernel << ", cluster " << cluster);
      a.kernel = kernel, a.cluster = cluster;
      std::vector<float> out[4];
      const cudaError_t e = run(out);
      if (cluster == 16 && e == cudaErrorInvalidValue) {  // a non-portable size: not every device (or MIG slice)
        std::cout << "[note] this device runs no 16-block cluster of the mHC mixes (sm_" << major
                  << "x); the automatic size is 8\n";
        continue;
      }
      FS_ASSERT_OK(cuda_status(e, "chunk-split mixes"));
      for (int i = 0; i < 4; ++i) expect_bitwise(out[i], row_out[i], names[i]);
    }
    // The last row alone: the same bits as in the batch.
    a.kernel = 0, a.cluster = 0;
    const int64_t last = rows - 1;
    DeviceBuffer<float> dx1(std::vector<float>(x.begin() + last * hc * dim, x.end()));
    a.x = dx1.get(), a.rows = 1;
    std::vector<float> out[4];
    FS_ASSERT_OK(cuda_status(run(out), "one row"));
    for (int i = 0; i < 4; ++i) {  // the first row's entries of out (the buffers hold `rows`)
      const int64_t per = int64_t(row_out[i].size()) / rows;
      out[i].resize(size_t(per));
      expect_bitwise(out[i], std::vector<float>(row_out[i].begin() + per * last, row_out[i].begin() + per * rows), names[i]);
    }
  }
  cd::HcMixArgs bad;
  bad.hc = 4, bad.dim = 4096, bad.rows = 1, bad.cluster = 17;
  EXPECT_NE(cd::launch_hc_mixes(bad, 0), cudaSuccess) << "more than 16 blocks per row";
}

// A stream update and the next sublayer's mixes of the updated streams in one launch
// (launch_hc_post_mixes) against hc_post then the mixes (the automatic kernel, the chunk-split one
// at these sizes), and with the MoE combine as the update's input against moe_combine_post then
// the mixes (slot rows through row_of, one of them another rank's: +0): the same bits in the
// streams, the combined rows, pre, post and comb, with and without BF16 rounding, for 1-8 rows and
// three widths; twice in a row (the per-row tickets reset themselves); the shapes and buffers it
// does not take are refused. Without the combine, also against the CPU twins (ops::hc_post then
// ops::hc_mixes): the streams bit for bit, the mixes within the GPU mixes' bound (one ulp).
TEST(CudaModelOps, HcPostMixesEqualsPostThenMixesBitwise) {
  FS_REQUIRE_GPU();
  constexpr int64_t hc = 4, n_mix = (2 + hc) * hc, kTickets = 8;
  DeviceBuffer<int32_t> tickets(std::vector<int32_t>(size_t(kTickets), 0));
  int64_t compared = 0;
  for (const int64_t dim : {int64_t(1024), int64_t(5120), int64_t(8192)})
    for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(8)})
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << rows << " rows, dim " << dim << ", bf16 " << bf16);
        const uint64_t seed = 700 + uint64_t(dim) + uint64_t(rows) * 7 + (bf16 ? 1 : 0);
        const auto x = randn(static_cast<size_t>(rows * hc * dim), seed, 2.0f);
        const auto f = randn(static_cast<size_t>(rows * dim), seed + 1, 1.5f);
        const auto post = randn(static_cast<size_t>(rows * hc), seed + 2);
        const auto comb = randn(static_cast<size_t>(rows * hc * hc), seed + 3, 0.5f);
        const auto fn = randn(static_cast<size_t>(n_mix * hc * dim), seed + 4, 0.02f);
        const auto base = randn(static_cast<size_t>(n_mix), seed + 5);
        const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
        const bool combine = dim != 5120 || rows == 3;  // with the MoE combine as f (both forms at 5120)
        const int64_t K = 3;
        const auto y = randn(static_cast<size_t>(rows * K * dim), seed + 6);
        const auto ys = randn(static_cast<size_t>(rows * dim), seed + 7);
        std::vector<int32_t> row_of(static_cast<size_t>(rows * K));
        for (int64_t s = 0; s < rows * K; ++s) row_of[size_t(s)] = int32_t((s * 7 + 1) % (rows * K));
        row_of[0] = -1;  // another rank's expert: adds +0
        DeviceBuffer<float> df(f), dpost(post), dcomb(comb), dfn(fn), db(base), ds(scale);
        DeviceBuffer<float> dy(y), dys(ys), out1(static_cast<size_t>(rows * dim)), out2(static_cast<size_t>(rows * dim));
        DeviceBuffer<int32_t> drow(row_of);
        DeviceBuffer<float> x1(x), x2(x);
        const size_t nm = size_t(rows * hc), nc = size_t(rows * hc * hc);
        DeviceBuffer<float> pre1(nm), post1(nm), comb1(nc), pre2(nm), post2(nm), comb2(nc);
        for (float* q : {pre1.get(), post1.get(), comb1.get(), pre2.get(), post2.get(), comb2.get()})
          ASSERT_EQ(cudaMemset(q, 0xff, (q == comb1.get() || q == comb2.get() ? nc : nm) * 4), cudaSuccess);
        cd::HcMixArgs a;
        a.fn = dfn.get(), a.base = db.get(), a.scale = ds.get(), a.rows = rows, a.hc = hc, a.dim = dim;
        a.norm_eps = 1e-6f, a.hc_eps = 1e-6f, a.sinkhorn_iters = 20;
        // Reference: the two launches.
        if (combine)
          FS_ASSERT_OK(cuda_status(cd::launch_moe_combine_post(dy.get(), dys.get(), out1.get(), rows, K, dim, !bf16,
                                                               drow.get(), x1.get(), dpost.get(), dcomb.get(), hc, bf16, 0),
                                   "combine + post"));
        else
          FS_ASSERT_OK(cuda_status(cd::launch_hc_post(df.get(), x1.get(), dpost.get(), dcomb.get(), rows, hc, dim, bf16, 0),
                                   "post"));
        a.x = x1.get(), a.pre = pre1.get(), a.post = post1.get(), a.comb = comb1.get();
        FS_ASSERT_OK(cuda_status(cd::launch_hc_mixes(a, 0), "mixes"));
        cd::HcPostMixArgs p;
        p.f = df.get(), p.x = x2.get(), p.post = dpost.get(), p.comb = dcomb.get(), p.bf16 = bf16, p.mix = a;
        if (combine) {
          p.f = nullptr, p.y = dy.get(), p.ys = dys.get(), p.row_of = drow.get(), p.K = K, p.out = out2.get();
          p.combine_bf16 = !bf16;
        }
        p.mix.x = x2.get(), p.mix.pre = pre2.get(), p.mix.post = post2.get(), p.mix.comb = comb2.get();
        DeviceBuffer<float> work(static_cast<size_t>(cd::hc_post_mixes_work_floats(rows, dim)));
        p.work = work.get(), p.tickets = tickets.get();
        ASSERT_TRUE(cd::hc_post_mixes_supported(p, kTickets));
        for (int rep = 0; rep < 2; ++rep) {
          if (rep == 1) {
            ASSERT_EQ(cudaMemcpy(x2.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          }
          FS_ASSERT_OK(cuda_status(cd::launch_hc_post_mixes(p, kTickets, 0), "post + mixes"));
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          expect_bitwise(x2.to_host(), x1.to_host(), "streams");
          if (combine) expect_bitwise(out2.to_host(), out1.to_host(), "combined rows");
          if (!combine && rep == 0) {
            std::vector<float> xc(x.size()), cpre(nm), cpost(nm), ccomb(nc);
            hc_post(f.data(), x.data(), post.data(), comb.data(), xc.data(), rows, hc, dim, bf16);
            hc_mixes({xc.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-6f, 1e-6f, 20, cpre.data(),
                      cpost.data(), ccomb.data()});
            expect_bitwise(x2.to_host(), xc, "streams vs CPU");
            expect_near_cpu(pre2.to_host(), cpre, "pre vs CPU");
            expect_near_cpu(post2.to_host(), cpost, "post vs CPU");
            expect_near_cpu(comb2.to_host(), ccomb, "comb vs CPU");
          }
          expect_bitwise(pre2.to_host(), pre1.to_host(), "pre");
          expect_bitwise(post2.to_host(), post1.to_host(), "post");
          expect_bitwise(comb2.to_host(), comb1.to_host(), "comb (Sinkhorn)");
          for (const int32_t t : tickets.to_host()) ASSERT_EQ(t, 0) << "a ticket left set";
          ++compared;
        }
        // Refused: the mixes writing the update's own post / comb, too few tickets, a width that is
        // not whole chunks, another stream count.
        cd::HcPostMixArgs q = p;
        q.mix.post = const_cast<float*>(p.post);
        EXPECT_FALSE(cd::hc_post_mixes_supported(q, kTickets));
        EXPECT_NE(cd::launch_hc_post_mixes(q, kTickets, 0), cudaSuccess);
        q = p, q.mix.comb = const_cast<float*>(p.comb);
        EXPECT_FALSE(cd::hc_post_mixes_supported(q, kTickets));
        EXPECT_FALSE(cd::hc_post_mixes_supported(p, rows - 1));
        q = p, q.mix.dim = dim + 4;
        EXPECT_FALSE(cd::hc_post_mixes_supported(q, kTickets));
        q = p, q.mix.hc = 2;
        EXPECT_FALSE(cd::hc_post_mixes_supported(q, kTickets));
        q = p, q.mix.head_only = true;
        EXPECT_FALSE(cd::hc_post_mixes_supported(q, kTickets));
      }
  EXPECT_EQ(compared, 36);  // 3 widths x 3 row counts x BF16 off / on x 2 launches
}

// The fused collapse + norm (launch_hc_collapse_norm) against the two launches it replaces and
// the CPU ops, bit for bit: widths with a partial chunk and non-multiples of 4 (the scalar path),
// a misaligned stream block (scalar path at a vector width), 1-3 rows per block (short rows) and
// many rows, BF16 off / on, with and without the norm weight; streams spanning +-2^±6 so the sum of
// squares is not trivially conditioned; the output starts as NaN bits so an unwritten value fails.
TEST(CudaModelOps, HcCollapseNormEqualsCollapseThenNormBitwise) {
  FS_REQUIRE_GPU();
  const int64_t hc = 4;
  int64_t compared = 0;
  struct Case { int64_t rows, dim; bool misalign; };
  const Case cases[] = {{1, 5120, false}, {2, 5120, false}, {7, 5120, false}, {1, 1024, false}, {3, 1024, false},
                        {5, 1000, false}, {2, 7, false},     {1, 16384, false}, {3, 4099, false}, {130, 5120, false},
                        {1, 5120, true},  {4, 2048, true},   {9, 513, false}};
  for (const Case& c : cases)
    for (const bool bf16 : {false, true})
      for (const bool weighted : {true, false}) {
        const int64_t rows = c.rows, dim = c.dim;
        SCOPED_TRACE(::testing::Message() << rows << " rows, dim " << dim << (c.misalign ? " misaligned" : "")
                                          << ", bf16 " << bf16 << ", weight " << weighted);
        const uint64_t seed = 900 + uint64_t(dim) * 3 + uint64_t(rows) + (bf16 ? 1 : 0);
        auto x = randn(static_cast<size_t>(rows * hc * dim), seed, 1.0f);
        Rng r(seed + 9);
        for (auto& v : x) v = std::ldexp(v, int(r.below(13)) - 6);
        const auto pre = randn(static_cast<size_t>(rows * hc), seed + 1);
        const auto w = randn(static_cast<size_t>(dim), seed + 2);
        const float eps = bf16 ? 1e-20f : 1e-6f;
        // CPU: the two ops.
        std::vector<float> u(static_cast<size_t>(rows * dim)), ref(u.size());
        hc_collapse(x.data(), pre.data(), u.data(), rows, hc, dim, bf16);
        rms_norm({u.data(), weighted ? w.data() : nullptr, ref.data(), rows, dim, eps, bf16});
        // The streams one float past a 16-byte boundary where misaligned.
        const size_t off = c.misalign ? 1 : 0;
        std::vector<float> xs(off, 0.0f);
        xs.insert(xs.end(), x.begin(), x.end());
        DeviceBuffer<float> dx(xs), dpre(pre), dw(w), du(u.size()), dy1(u.size()), dy2(u.size());
        const float* X = dx.get() + off;
        const float* W = weighted ? dw.get() : nullptr;
        FS_ASSERT_OK(cuda_status(cd::launch_hc_collapse(X, dpre.get(), du.get(), rows, hc, dim, bf16, 0), "collapse"));
        FS_ASSERT_OK(cuda_status(cd::launch_model_rms_norm(du.get(), W, dy1.get(), rows, dim, eps, bf16, 0), "norm"));
        ASSERT_EQ(cudaMemset(dy2.get(), 0xff, u.size() * 4), cudaSuccess);
        ASSERT_TRUE(cd::hc_collapse_norm_supported(hc, dim));
        FS_ASSERT_OK(cuda_status(cd::launch_hc_collapse_norm(X, dpre.get(), W, dy2.get(), rows, hc, dim, eps, bf16, 0),
                                 "collapse + norm"));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        expect_bitwise(dy2.to_host(), dy1.to_host(), "fused vs the two launches");
        expect_bitwise(dy2.to_host(), ref, "fused vs CPU");
        ++compared;
      }
  EXPECT_EQ(compared, 13 * 4);
  // Refused: other stream counts, rows wider than 16 chunks, an empty row.
  EXPECT_FALSE(cd::hc_collapse_norm_supported(2, 5120));
  EXPECT_FALSE(cd::hc_collapse_norm_supported(4, 16385));
  EXPECT_FALSE(cd::hc_collapse_norm_supported(4, 0));
  EXPECT_NE(cd::launch_hc_collapse_norm(nullptr, nullptr, nullptr, nullptr, 1, 3, 1024, 1e-6f, false, 0), cudaSuccess);
  EXPECT_EQ(cd::launch_hc_collapse_norm(nullptr, nullptr, nullptr, nullptr, 0, 4, 1024, 1e-6f, false, 0), cudaSuccess);
}

// Radix-select top-k on 128k+ candidates with heavy ties (a few distinct values, -0 and +0),
// non-finite entries, k larger than the candidates, and the block-candidate mode over 16k blocks.
TEST(CudaModelOps, IndexTopkLargeWithTiesMatchesCpu) {
  FS_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  // coarse: scores rounded to ~20 distinct values (ties everywhere: the multi-block path breaks
  // them by a second select on the index, or falls back to one block when the threshold bin holds
  // more keys than its scratch); else distinct values. all_equal: every score 1 (fallback).
  struct Case { int64_t T, n, k, mode, cblock, ctop; bool coarse, all_equal; };
  for (const Case c : {Case{2, 131072 + 37, 512, 0, 8, 0, true, false}, Case{2, 262144, 512, 1, 8, 2048, true, false},
                       Case{2, 300, 600, 0, 8, 0, true, false}, Case{2, 5000, 512, 2, 8, 0, true, false},
                       Case{2, 1, 512, 1, 4, 3, true, false}, Case{2, 4096, 1, 0, 8, 0, true, false},
                       Case{6, 139264 - 6, 512, 0, 8, 0, false, false}, Case{6, 69632 - 6, 512, 2, 8, 0, false, false},
                       Case{3, 9000, 2048, 0, 8, 0, false, false}, Case{3, 20011, 777, 2, 8, 0, true, false},
                       Case{2, 40000, 512, 0, 8, 0, false, true}, Case{1, 8192, 8192, 0, 8, 0, false, false},
                       Case{6, 139264 - 6, 512, 1, 8, 2048, false, false}, Case{2, 30000, 300, 1, 8, 1500, true, false},
                       Case{2, 20000, 512, 1, 8, 2048, false, true}}) {
    const int64_t T = c.T, start = c.n - 1, stride = start + T;  // ratio 1: row t has n + t candidates
    auto sc = randn(static_cast<size_t>(T * stride), 50 + c.n);
    Rng r(51);
    for (auto& v : sc) {
      if (c.all_equal) { v = 1.0f; continue; }
      if (c.coarse) v = std::round(v * 3.0f) / 3.0f;
      if (v == 0.0f && r.below(2)) v = -0.0f;
      const uint64_t u = r.below(1000);
      if (u == 0) v = -inf;
      else if (u == 1) v = std::numeric_limits<float>::quiet_NaN();
      else if (u == 2) v = inf;
    }
    std::vector<uint8_t> cand_h(static_cast<size_t>(T * stride));
    for (size_t i = 0; i < cand_h.size(); ++i) cand_h[i] = uint8_t((i * 7) % 5 != 0);
    for (int path : {1, 2, 3}) {
      const int64_t nb = c.mode == 1 ? (stride + c.cblock - 1) / c.cblock : 0;
      if (path == 2 && (c.k > 2048 || stride <= 2056 + 2 * nb)) continue;  // not a multi-block case
      SCOPED_TRACE(::testing::Message() << "T " << T << " n " << c.n << " k " << c.k << " mode " << c.mode
                                        << " path " << path);
      DeviceBuffer<float> dsc(sc), dbs(sc.size());
      DeviceBuffer<uint8_t> dcand(cand_h), dtaken(cand_h.size());
      DeviceBuffer<int32_t> dout(static_cast<size_t>(T * c.k)), dn(static_cast<size_t>(T));
      cd::IndexTopkArgs a;
      a.scores = dsc.get(), a.cand = dcand.get(), a.block_scratch = dbs.get(), a.taken = dtaken.get();
      a.out = dout.get(), a.out_n = dn.get(), a.T = T, a.start = start, a.ratio = 1, a.stride = stride, a.k = c.k;
      a.cand_block = c.cblock, a.cand_top = c.ctop, a.mode = int(c.mode), a.path = path;
      if (path == 3 && cd::index_topk_cluster_size(a) == 0) {  // mode 1 without room for the block select
        EXPECT_EQ(cd::launch_index_topk(a, 0), cudaErrorInvalidValue);
        continue;
      }
      FS_ASSERT_OK(cuda_status(cd::launch_index_topk(a, 0), "topk"));
      const auto out = dout.to_host(), n = dn.to_host();
      const auto gcand = dcand.to_host();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t clen = start + t + 1;
        std::vector<float> row(sc.begin() + t * stride, sc.begin() + t * stride + clen);
        if (c.mode == 1) {
          std::vector<uint8_t> m(static_cast<size_t>(clen));
          candidate_mask(row.data(), clen, clen, c.cblock, c.ctop, m.data());
          size_t bad = 0;
          for (int64_t i = 0; i < clen; ++i) bad += m[static_cast<size_t>(i)] != gcand[static_cast<size_t>(t * stride + i)];
          ASSERT_EQ(bad, 0u) << "candidate mask t=" << t;
        }
        if (c.mode == 2)
          for (int64_t i = 0; i < clen; ++i)
            if (!cand_h[static_cast<size_t>(t * stride + i)]) row[static_cast<size_t>(i)] = -inf;
        const auto ref = topk_indices(row.data(), clen, c.k);
        ASSERT_EQ(int64_t(ref.size()), n[static_cast<size_t>(t)]) << "t " << t;
        size_t bad = 0;
        for (size_t i = 0; i < ref.size(); ++i) bad += ref[i] != out[static_cast<size_t>(t * c.k) + i];
        EXPECT_EQ(bad, 0u) << "t " << t;
      }
    }
  }
  cd::IndexTopkArgs bad;  // the multi-block path refuses what it cannot do
  bad.T = 1, bad.start = 9999, bad.stride = 10000, bad.k = 4096, bad.path = 2;
  float dummy = 0;
  bad.block_scratch = &dummy;
  EXPECT_EQ(cd::launch_index_topk(bad, 0), cudaErrorInvalidValue);
}

// The cluster top-k (path 3, one thread-block cluster per row) against ops::topk_indices on the
// sizes of issue 16: 131,109 and 262,145 keys, k = 1 / 512 / every candidate, M = 1 and 6 rows
// of different lengths (ratio 1 and 4), modes 0 / 1 / 2, clusters of 8 and 16 blocks (and the
// automatic choice), with scores that stop the radix levels at each depth: ~20 distinct values
// (ties decided by the lower index after the exact-key level), distinct normals (the split bin
// is usually taken whole after level 1), and values that differ only in their last mantissa bits
// (same top 22 bits: only the last level separates them); plus -0 / +0, NaN and ±inf. The output
// buffer is poisoned, so a missing or misplaced index shows; mode 2 must leave -inf in the
// masked-out scores, as the other paths do.
TEST(CudaModelOps, IndexTopkClusterMatchesCpu) {
  FS_REQUIRE_GPU();
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "thread-block clusters need sm_90";
  const float inf = std::numeric_limits<float>::infinity();
  enum Values { kCoarse, kDistinct, kLowBits };
  struct Case { int64_t T, n, ratio; Values vals; };
  int ran16 = 0;
  for (const Case c : {Case{1, 131109, 1, kCoarse}, Case{6, 131109, 1, kCoarse}, Case{1, 262145, 1, kCoarse},
                       Case{6, 262145, 1, kDistinct}, Case{1, 131109, 1, kDistinct}, Case{6, 131109, 4, kLowBits},
                       Case{1, 262145, 1, kLowBits}}) {
    // Row t has clen (start + t + 1) / ratio keys; row 0 has n.
    const int64_t T = c.T, start = c.n * c.ratio - 1, stride = (start + T) / c.ratio;
    auto sc = randn(static_cast<size_t>(T * stride), 70 + c.n + c.vals);
    Rng r(71 + c.vals);
    for (auto& v : sc) {
      if (c.vals == kCoarse) v = std::round(v * 3.0f) / 3.0f;  // ~20 distinct values
      if (c.vals == kLowBits) {                                // 1 + j ulp, j < 48: one top-22-bit prefix
        const uint32_t bits = 0x3f800000u + uint32_t(r.below(48));
        std::memcpy(&v, &bits, sizeof(v));
      }
      if (v == 0.0f && r.below(2)) v = -0.0f;
      const uint64_t u = r.below(1000);
      if (u == 0) v = -inf;
      else if (u == 1) v = std::numeric_limits<float>::quiet_NaN();
      else if (u == 2) v = inf;
      else if (u == 3) v = c.vals == kLowBits ? -0.0f : 0.0f;
    }
    std::vector<uint8_t> cand_h(static_cast<size_t>(T * stride));
    for (size_t i = 0; i < cand_h.size(); ++i) cand_h[i] = uint8_t((i * 7) % 5 != 0);
    for (const int64_t k : {int64_t(1), int64_t(512), stride}) {  // stride >= every row's clen: all
      for (int mode : {0, 2, 1}) {
        // The CPU twin per row (mode 1: the mask is checked, the top-k is over the unfiltered row).
        std::vector<std::vector<int32_t>> ref(static_cast<size_t>(T));
        std::vector<std::vector<uint8_t>> mask(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          const int64_t clen = (start + t + 1) / c.ratio;
          std::vector<float> row(sc.begin() + t * stride, sc.begin() + t * stride + clen);
          if (mode == 1) {
            mask[size_t(t)].resize(static_cast<size_t>(clen));
            candidate_mask(row.data(), clen, clen, 8, 2048, mask[size_t(t)].data());
          }
          if (mode == 2)
            for (int64_t i = 0; i < clen; ++i)
              if (!cand_h[static_cast<size_t>(t * stride + i)]) row[static_cast<size_t>(i)] = -inf;
          ref[size_t(t)] = topk_indices(row.data(), clen, k);
        }
        for (int cluster : {0, 8, 16}) {
          SCOPED_TRACE(::testing::Message() << "T " << T << " n " << c.n << " ratio " << c.ratio << " values " << c.vals
                                            << " k " << k << " mode " << mode << " cluster " << cluster);
          DeviceBuffer<float> dsc(sc), dbs(sc.size());
          DeviceBuffer<uint8_t> dcand(cand_h), dtaken(cand_h.size());
          DeviceBuffer<int32_t> dout(static_cast<size_t>(T * k)), dn(static_cast<size_t>(T));
          cd::IndexTopkArgs a;
          a.scores = dsc.get(), a.cand = dcand.get(), a.block_scratch = dbs.get(), a.taken = dtaken.get();
          a.out = dout.get(), a.out_n = dn.get(), a.T = T, a.start = start, a.ratio = c.ratio, a.stride = stride;
          a.k = k, a.cand_block = 8, a.cand_top = 2048, a.mode = mode, a.path = 3, a.cluster = cluster;
          const int used = cd::index_topk_cluster_size(a);
          if (cluster == 0) {
            ASSERT_GT(used, 0) << "the automatic cluster size must run rows of up to 262,150 keys";
          }
          if (used == 0) {  // 8 blocks cannot hold 262k keys (32 per thread at most); 16 where the device cannot
            EXPECT_EQ(cd::launch_index_topk(a, 0), cudaErrorInvalidValue);
            continue;
          }
          EXPECT_TRUE(cluster == 0 || used == cluster);
          ran16 += used == 16;
          FS_ASSERT_OK(cuda_status(cd::launch_index_topk(a, 0), "topk"));
          const auto out = dout.to_host(), n = dn.to_host();
          const auto gcand = dcand.to_host();
          const auto gsc = dsc.to_host();
          for (int64_t t = 0; t < T; ++t) {
            const int64_t clen = (start + t + 1) / c.ratio;
            if (mode == 1) {
              size_t bad = 0;
              for (int64_t i = 0; i < clen; ++i) bad += mask[size_t(t)][size_t(i)] != gcand[static_cast<size_t>(t * stride + i)];
              ASSERT_EQ(bad, 0u) << "candidate mask t=" << t;
            }
            if (mode == 2) {
              size_t bad = 0;
              for (int64_t i = 0; i < clen; ++i)
                bad += !cand_h[static_cast<size_t>(t * stride + i)] && gsc[static_cast<size_t>(t * stride + i)] != -inf;
              EXPECT_EQ(bad, 0u) << "masked-out scores not -inf, t=" << t;
            }
            const auto& rr = ref[size_t(t)];
            ASSERT_EQ(int64_t(rr.size()), n[static_cast<size_t>(t)]) << "t " << t;
            size_t bad = 0, first = rr.size();
            for (size_t i = 0; i < rr.size(); ++i)
              if (rr[i] != out[static_cast<size_t>(t * k) + i]) bad++, first = std::min(first, i);
            EXPECT_EQ(bad, 0u) << "t " << t << " first wrong position " << first;
          }
        }
      }
    }
  }
  if (ran16 == 0) std::cout << "[topk] clusters of 16 blocks are not available on this device: only 8 tested\n";
}

// The block-per-token router at V4.1 width (384 experts, top-6) with tied scores.
TEST(CudaModelOps, RouteWideMatchesCpu) {
  FS_REQUIRE_GPU();
  const int64_t T = 7, E = 384, K = 6;
  auto logits = randn(static_cast<size_t>(T * E), 60);
  for (int64_t e = 0; e < E; e += 5) logits[static_cast<size_t>(E + e)] = 2.5f;   // many equal maxima
  for (int64_t e = 0; e < E; ++e) logits[static_cast<size_t>(2 * E + e)] = 0.25f; // all equal
  for (bool softplus : {true, false}) {
    DeviceBuffer<float> dl(logits), dscr(static_cast<size_t>(T * 2 * E)), dw(static_cast<size_t>(T * K));
    DeviceBuffer<int32_t> dsel(static_cast<size_t>(T * K));
    cd::RouteArgs a;
    a.logits = dl.get(), a.scratch = dscr.get(), a.T = T, a.E = E, a.K = K;
    a.gate_temp = 1.0f, a.route_scale = 1.5f, a.sqrtsoftplus = softplus, a.norm_topk = true, a.renorm_eps = softplus;
    a.sel = dsel.get(), a.weight = dw.get();
    FS_ASSERT_OK(cuda_status(cd::launch_route(a, 0), "route"));
    const auto sel = dsel.to_host();
    const auto wt = dw.to_host();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> rs(static_cast<size_t>(K));
      std::vector<float> rw(static_cast<size_t>(K));
      RouteParams p{logits.data() + t * E, nullptr, nullptr, E, K};
      p.gate_temp = 1.0f, p.route_scale = 1.5f, p.sqrtsoftplus = softplus, p.norm_topk = true;
      p.renorm_eps = softplus, p.sel = rs.data(), p.weight = rw.data();
      route(p);
      for (int64_t i = 0; i < K; ++i) {
        EXPECT_EQ(rs[static_cast<size_t>(i)], sel[static_cast<size_t>(t * K + i)]) << "t " << t;
        EXPECT_NEAR(rw[static_cast<size_t>(i)], wt[static_cast<size_t>(t * K + i)], 1e-6f * std::fabs(rw[static_cast<size_t>(i)]) + 1e-12f) << "t " << t;
      }
    }
  }
}

}  // namespace
}  // namespace flashseek::ops::cuda

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;

// Grouping routed pairs by expert (the batched MoE's stable counting sort) vs the CPU twin,
// exactly: pair counts across several scatter tiles (1, 255, 256, 257, 3000), skewed experts
// (most pairs on two experts, many experts with none), 1 and 384 experts; an id out of range
// sets the flag and the CPU twin refuses it.
TEST(CudaModelOps, MoeGroupPairsMatchesCpu) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t pairs, experts, k;
    bool skew;
  };
  for (const Case c : {Case{1, 1, 1}, Case{255, 7, 5}, Case{256, 384, 6}, Case{257, 384, 1}, Case{3000, 384, 6},
                       Case{3000, 16, 6}, Case{1234, 384, 2}, Case{2048, 256, 8}, Case{2049, 256, 1},
                       Case{49152, 16, 6}, Case{49152, 256, 6}, Case{20001, 4096, 3}, Case{9000, 256, 6, true}}) {
    Rng rng(uint64_t(c.pairs * 131 + c.experts));
    std::vector<int32_t> sel(static_cast<size_t>(c.pairs));
    std::vector<float> w(static_cast<size_t>(c.pairs));
    for (int64_t p = 0; p < c.pairs; ++p) {
      const bool hot = c.skew || rng.below(4) == 0;
      sel[size_t(p)] = int32_t(hot ? rng.below(2) * (c.experts - 1) : int64_t(rng.below(uint64_t(c.experts))));
      w[size_t(p)] = float(p) * 0.25f + 1.0f;
    }
    std::vector<int32_t> gs(static_cast<size_t>(c.experts + 1)), row(static_cast<size_t>(c.pairs)),
        pos(static_cast<size_t>(c.pairs));
    std::vector<float> sw(static_cast<size_t>(c.pairs));
    ASSERT_TRUE(group_pairs_by_expert(sel.data(), w.data(), c.pairs, c.experts, c.k, gs.data(), row.data(), sw.data(),
                                      pos.data()));
    DeviceBuffer<int32_t> dsel(sel), dgs(gs.size()), drow(row.size()), dpos(pos.size()), dbad(std::vector<int32_t>{0});
    DeviceBuffer<float> dw(w), dsw(sw.size());
    // One block, then (with the counts scratch) a block per chunk of 2048 pairs.
    DeviceBuffer<int32_t> dcounts(size_t(std::max<int64_t>(1, cd::moe_group_scratch_ints(c.pairs, c.experts))));
    for (int32_t* counts : {static_cast<int32_t*>(nullptr), dcounts.get()}) {
      ASSERT_EQ(cudaMemset(drow.get(), 0xff, row.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(dpos.get(), 0xff, pos.size() * 4), cudaSuccess);
      FS_ASSERT_OK(cuda_status(cd::launch_moe_group(dsel.get(), dw.get(), c.pairs, c.experts, c.k, dgs.get(),
                                                    drow.get(), dsw.get(), dpos.get(), dbad.get(), 0, counts),
                               "moe_group"));
      EXPECT_EQ(dgs.to_host(), gs) << c.pairs << " pairs, chunked " << bool(counts);
      EXPECT_EQ(drow.to_host(), row) << c.pairs << " pairs, chunked " << bool(counts);
      EXPECT_EQ(dpos.to_host(), pos) << c.pairs << " pairs, chunked " << bool(counts);
      EXPECT_EQ(dsw.to_host(), sw) << c.pairs << " pairs, chunked " << bool(counts);
      EXPECT_EQ(dbad.to_host()[0], 0);
    }
    // The compact lists (ops::compact_expert_groups, the CPU twin) beside the same grouping, with
    // the fewest slots allowed and with spare ones; too few slots is refused.
    for (const int64_t spare : {int64_t(0), int64_t(3)}) {
      const int64_t slots = std::min(c.pairs, c.experts) + spare;
      std::vector<int32_t> cs(static_cast<size_t>(slots + 1)), ce(static_cast<size_t>(slots));
      ASSERT_GE(compact_expert_groups(gs.data(), c.experts, slots, cs.data(), ce.data()), 0);
      DeviceBuffer<int32_t> dcs(cs.size()), dce(ce.size());
      ASSERT_EQ(cudaMemset(dcs.get(), 0xff, cs.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(dpos.get(), 0xff, pos.size() * 4), cudaSuccess);
      const cd::MoeCompactGroups compact{dcs.get(), dce.get(), slots};
      FS_ASSERT_OK(cuda_status(cd::launch_moe_group(dsel.get(), dw.get(), c.pairs, c.experts, c.k, dgs.get(),
                                                    drow.get(), dsw.get(), dpos.get(), dbad.get(), 0, dcounts.get(),
                                                    &compact),
                               "moe_group compact"));
      EXPECT_EQ(dcs.to_host(), cs) << c.pairs << " pairs, " << slots << " slots";
      EXPECT_EQ(dce.to_host(), ce) << c.pairs << " pairs, " << slots << " slots";
      EXPECT_EQ(dgs.to_host(), gs) << c.pairs << " pairs, compact";
      EXPECT_EQ(dpos.to_host(), pos) << c.pairs << " pairs, compact";
      EXPECT_EQ(drow.to_host(), row) << c.pairs << " pairs, compact";
      if (slots > 0) {
        const cd::MoeCompactGroups few{dcs.get(), dce.get(), std::min(c.pairs, c.experts) - 1};
        EXPECT_EQ(cd::launch_moe_group(dsel.get(), dw.get(), c.pairs, c.experts, c.k, dgs.get(), drow.get(),
                                       dsw.get(), dpos.get(), dbad.get(), 0, nullptr, &few),
                  cudaErrorInvalidValue);
      }
    }
    // Stability: within an expert, pairs keep their slot order.
    for (int64_t p = 1; p < c.pairs; ++p)
      if (sel[size_t(p)] == sel[size_t(p - 1)]) {
        EXPECT_EQ(pos[size_t(p)], pos[size_t(p - 1)] + 1);
      }
  }
  std::vector<int32_t> bad_sel{0, 5, 1};
  std::vector<float> w(3, 1.0f);
  std::vector<int32_t> gs(4), row(3), pos(3);
  std::vector<float> sw(3);
  EXPECT_FALSE(group_pairs_by_expert(bad_sel.data(), w.data(), 3, 3, 1, gs.data(), row.data(), sw.data(), pos.data()));
  DeviceBuffer<int32_t> dsel(bad_sel), dgs(4), drow(3), dpos(3), dbad(std::vector<int32_t>{0});
  DeviceBuffer<float> dw(w), dsw(3);
  FS_ASSERT_OK(cuda_status(
      cd::launch_moe_group(dsel.get(), dw.get(), 3, 3, 1, dgs.get(), drow.get(), dsw.get(), dpos.get(), dbad.get(), 0),
      "moe_group"));
  EXPECT_EQ(dbad.to_host()[0], 1);
  {  // an id out of range among 5000 pairs, chunked: flagged, no row, the rest grouped
    std::vector<int32_t> sel5(5000);
    for (size_t i = 0; i < sel5.size(); ++i) sel5[i] = int32_t(i % 7);
    sel5[4321] = -1;
    std::vector<float> w5(sel5.size(), 1.0f);
    DeviceBuffer<int32_t> s5(sel5), g5(8), r5(sel5.size()), p5(sel5.size()), b5(std::vector<int32_t>{0}),
        c5(size_t(cd::moe_group_scratch_ints(5000, 7)));
    DeviceBuffer<float> dw5(w5), sw5(sel5.size());
    FS_ASSERT_OK(cuda_status(cd::launch_moe_group(s5.get(), dw5.get(), 5000, 7, 1, g5.get(), r5.get(), sw5.get(),
                                                  p5.get(), b5.get(), 0, c5.get()),
                             "moe_group"));
    EXPECT_EQ(b5.to_host()[0], 1);
    EXPECT_EQ(p5.to_host()[4321], -1);
    EXPECT_EQ(g5.to_host()[7], 4999);
  }
  EXPECT_NE(cuda_status(cd::launch_moe_group(dsel.get(), dw.get(), 3, 0, 1, dgs.get(), drow.get(), dsw.get(), dpos.get(),
                                             nullptr, 0),
                        "moe_group").code(),
            StatusCode::kOk);
}

// The router where 2E floats do not fit its shared memory (E = 6001: the scores and keys go to the
// caller's scratch) and over many tokens (one block each), both scoring functions: the CPU's
// choices and weights.
TEST(CudaModelOps, RouteScratchAndManyTokensMatchCpu) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t T, E, K;
  };
  for (const Case c : {Case{3, 6001, 8}, Case{300, 384, 6}}) {
    auto logits = randn(static_cast<size_t>(c.T * c.E), 91);
    for (int64_t e = 0; e < c.E; e += 7) logits[static_cast<size_t>(e)] = 1.75f;  // ties in token 0
    const auto bias = randn(static_cast<size_t>(c.E), 92, 0.01f);
    for (bool softplus : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " E=" << c.E << " softplus=" << softplus);
      DeviceBuffer<float> dl(logits), db(bias), dscr(static_cast<size_t>(c.T * 2 * c.E)), dw(static_cast<size_t>(c.T * c.K));
      DeviceBuffer<int32_t> dsel(static_cast<size_t>(c.T * c.K));
      cd::RouteArgs a;
      a.logits = dl.get(), a.bias = softplus ? db.get() : nullptr, a.scratch = dscr.get(), a.T = c.T, a.E = c.E, a.K = c.K;
      a.gate_temp = 1.25f, a.route_scale = 1.5f, a.sqrtsoftplus = softplus, a.norm_topk = true, a.renorm_eps = softplus;
      a.sel = dsel.get(), a.weight = dw.get();
      FS_ASSERT_OK(cuda_status(cd::launch_route(a, 0), "route"));
      const auto sel = dsel.to_host();
      const auto wt = dw.to_host();
      for (int64_t t = 0; t < c.T; ++t) {
        std::vector<int32_t> rs(static_cast<size_t>(c.K));
        std::vector<float> rw(static_cast<size_t>(c.K));
        RouteParams p{logits.data() + t * c.E, softplus ? bias.data() : nullptr, nullptr, c.E, c.K};
        p.gate_temp = 1.25f, p.route_scale = 1.5f, p.sqrtsoftplus = softplus, p.norm_topk = true;
        p.renorm_eps = softplus, p.sel = rs.data(), p.weight = rw.data();
        route(p);
        for (int64_t i = 0; i < c.K; ++i) {
          const size_t gi = static_cast<size_t>(t * c.K + i);
          ASSERT_EQ(rs[static_cast<size_t>(i)], sel[gi]) << "t " << t << " slot " << i;
          ASSERT_NEAR(rw[static_cast<size_t>(i)], wt[gi], 1e-6f * std::fabs(rw[static_cast<size_t>(i)]) + 1e-12f) << "t " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashseek::ops::cuda
