// GPU RMSNorm, RoPE and pooled sparse attention against the CPU reference ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/numeric.h"
#include "gpu_util.h"
#include "ops/attention_pool.h"
#include "ops/cuda/model/kernels.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace flashseek::ops::cuda {
namespace {

using testing::DeviceBuffer;

std::vector<float> randn(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// rms_norm_cuda runs the model's kernel (the CPU's double sum of squares in its order): bitwise.
TEST(CudaRmsNorm, MatchesCpuBitwise) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (auto [rows, dim, weighted, bf16] : {std::tuple{1, 5120, true, false}, {3, 1280, true, true},
                                           {7, 33, false, false}, {2, 512, true, false}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const auto x = randn(rng, size_t(rows * dim), 3.0f);
    const auto w = randn(rng, size_t(dim));
    std::vector<float> ref(x.size());
    RmsNormParams p;
    p.x = x.data(), p.w = weighted ? w.data() : nullptr, p.y = ref.data();
    p.rows = rows, p.dim = dim, p.eps = 1e-6f, p.bf16_out = bf16;
    rms_norm(p);
    DeviceBuffer<float> dx(x), dw(w), dy(x.size());
    p.x = dx.get(), p.w = weighted ? dw.get() : nullptr, p.y = dy.get();
    FS_ASSERT_OK(rms_norm_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dy.to_host();
    ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
  }
}

TEST(CudaRope, BitwiseEqualToCpu) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(4);
  RopeSpec spec;
  spec.theta = 160000, spec.yarn = true, spec.factor = 16, spec.original_len = 65536;
  const std::vector<float> inv = rope_inv_freq(spec);
  for (auto [rows, n_vec, vec_dim, inverse, bf16] :
       {std::tuple{1, 64, 512, false, false}, {5, 3, 128, true, false}, {2, 1, 64, false, true},
        {3, 17, 192, true, true}}) {  // 17 x 32 pairs per row: threads loop over a row's pairs
    const auto x = randn(rng, size_t(rows * n_vec * vec_dim));
    std::vector<int64_t> pos(static_cast<size_t>(rows));
    for (auto& p : pos) p = int64_t(rng() % 1000000);
    std::vector<float> ref(x);
    RopeParams p;
    p.x = ref.data(), p.pos = pos.data(), p.inv_freq = inv.data();
    p.rows = rows, p.n_vec = n_vec, p.vec_dim = vec_dim, p.rope_dim = 64;
    p.inverse = inverse, p.bf16_out = bf16;
    apply_rope(p);
    DeviceBuffer<float> dx(x), df(inv);
    DeviceBuffer<int64_t> dp(pos);
    p.x = dx.get(), p.pos = dp.get(), p.inv_freq = df.get();
    FS_ASSERT_OK(apply_rope_cuda(p, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dx.to_host();
    ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
        << "rows=" << rows << " n_vec=" << n_vec;
  }
}

struct AttnCase {
  int m, n_idx, n_rows, heads, dim, splits;
  double pad_frac;
};

void run_attn_case(const AttnCase& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n_idx=" << c.n_idx << " heads=" << c.heads
                                    << " dim=" << c.dim << " splits=" << c.splits);
  std::mt19937 rng(seed);
  const auto q = randn(rng, size_t(c.m * c.heads * c.dim), 0.3f);
  const auto kvf = randn(rng, size_t(c.n_rows * c.dim));
  std::vector<uint16_t> kv(kvf.size());
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = f32_to_bf16(kvf[i]);
  const auto sink = randn(rng, size_t(c.heads), 2.0f);
  std::vector<int32_t> idx(static_cast<size_t>(c.m * c.n_idx));
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& v : idx) {
    v = int32_t(rng() % uint32_t(c.n_rows));
    if (u(rng) < c.pad_frac) v = (rng() % 4 == 0) ? c.n_rows + 3 : -1;  // padding / out of range
  }
  SparseAttnPoolParams p;
  p.q = q.data(), p.kv = kv.data(), p.idx = idx.data(), p.sink = sink.data();
  p.m = c.m, p.n_idx = c.n_idx, p.n_rows = c.n_rows, p.n_heads = c.heads, p.head_dim = c.dim;
  p.scale = 1.0f / std::sqrt(float(c.dim)), p.n_splits = c.splits;
  std::vector<float> ref(q.size());
  p.out = ref.data();
  FS_ASSERT_OK(sparse_attention_pool_ref(p));
  DeviceBuffer<float> dq(q), dsink(sink), dout(q.size());
  DeviceBuffer<float> dws(size_t(sparse_attn_workspace_floats(c.m, c.splits, c.heads, c.dim)));
  DeviceBuffer<uint16_t> dkv(kv);
  DeviceBuffer<int32_t> didx(idx);
  p.q = dq.get(), p.kv = dkv.get(), p.idx = didx.get(), p.sink = dsink.get(), p.out = dout.get();
  p.workspace = dws.get();
  FS_ASSERT_OK(sparse_attention_pool_cuda(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = dout.to_host();
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written";
    // BF16 probabilities are rounded relative to the running max of each 16-key tile on the GPU
    // (the reference kernel's running-max scheme) and to the global max in the twin: up to one
    // BF16 ulp per term, so a 2^-8 relative bound; a wrong key or head is off by O(1).
    ASSERT_LE(std::fabs(got[i] - ref[i]), 4e-3f * (1.0f + std::fabs(ref[i]))) << "output " << i;
  }
}

TEST(CudaSparseAttention, MatchesCpuWithSplitsAndPadding) {
  FS_REQUIRE_GPU();
  const AttnCase cases[] = {
      {1, 640, 2000, 64, 512, 20, 0.1},  // V4.1 decode shape: 128 window + 512 selected
      {3, 37, 50, 5, 96, 4, 0.3},        // odd sizes, splits not dividing the list
      {2, 16, 10, 64, 512, 1, 0.0},      // one split
      {2, 40, 30, 8, 64, 8, 1.0},        // every key padding: zero output
      {1, 1, 1, 1, 2, 1, 0.0},           // smallest
      {2, 100, 300, 16, 64, 3, 0.2},     // tensor-core path: one head group, partial tiles
      {1, 33, 100, 48, 192, 2, 0.5},     // tensor-core path: 3 head groups, dim 192
      {1, 40, 30, 32, 128, 4, 1.0},      // tensor-core path: all padding
      {8, 640, 4000, 64, 512, 33, 0.05}, // decode batch of 8 with the auto split count
  };
  uint32_t seed = 100;
  for (const auto& c : cases) run_attn_case(c, seed++);
}

TEST(CudaSparseAttention, ValidationNamesTheField) {
  SparseAttnPoolParams p;
  float f = 0;
  uint16_t b = 0;
  int32_t i = 0;
  p.q = &f, p.kv = &b, p.idx = &i, p.sink = &f, p.out = &f;
  p.m = 1, p.n_idx = 1, p.n_rows = 1, p.n_heads = 65, p.head_dim = 64, p.scale = 0.1f;
  const Status s = validate(p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("n_heads=65"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flashseek::ops::cuda
