// Prefill benchmark kernels (ops/cuda/model/prefill_kernels.h) against CPU references: the prefill
// attention against sparse_attention_pool_ref, the tensor-core indexer scores against a double
// reference on BF16-rounded operands, and the MoE glue (row gather, SwiGLU + FP8 quantise,
// combine). Without a GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_util.h"
#include "ops/attention_pool.h"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/rope.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;

std::vector<float> randn(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

uint16_t bf16_bits(float f) {  // round to nearest even (finite inputs)
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf16_round(float f) {
  const uint32_t u = uint32_t(bf16_bits(f)) << 16;
  float r = 0;
  std::memcpy(&r, &u, 4);
  return r;
}
float e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(float(m) / 8.0f, -6) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return s ? -v : v;
}

// Random inputs of an attention launch: q [m, heads, dim], BF16 key rows [rows, dim], sinks
// [heads] and index lists [m, n_idx] (a fifth of the slots padding).
struct AttnInputs {
  std::vector<float> q;
  std::vector<uint16_t> kv;
  std::vector<float> sink;
  std::vector<int32_t> idx;
};
AttnInputs random_attn_inputs(std::mt19937& rng, int m, int heads, int dim, int n_idx, int rows) {
  AttnInputs in;
  in.q = randn(rng, size_t(m) * heads * dim, 0.3f);
  const auto kvf = randn(rng, size_t(rows) * dim);
  in.kv.resize(kvf.size());
  for (size_t i = 0; i < kvf.size(); ++i) in.kv[i] = bf16_bits(kvf[i]);
  in.sink = randn(rng, size_t(heads), 2.0f);
  in.idx.resize(size_t(m) * n_idx);
  for (auto& v : in.idx) v = rng() % 5 == 0 ? -1 : int32_t(rng() % uint32_t(rows));
  return in;
}

// Inputs of the inverse RoPE inside a launch (PrefillAttnArgs::unrope_pos): a random position
// below 2^20 per row and the inverse frequencies of `rope` rotated dims at base 10000.
struct UnropeInputs {
  std::vector<int64_t> pos;
  std::vector<float> inv;
};
UnropeInputs random_unrope_inputs(std::mt19937& rng, int m, int rope) {
  UnropeInputs u;
  u.pos.resize(static_cast<size_t>(m));
  for (auto& p : u.pos) p = int64_t(rng() % (1u << 20));
  u.inv.resize(static_cast<size_t>(rope / 2));
  for (size_t f = 0; f < u.inv.size(); ++f) u.inv[f] = float(std::pow(10000.0, -2.0 * double(f) / double(rope)));
  return u;
}

struct AttnCase {
  int m, n_idx, n_rows;
  double pad_frac;
  bool odd_tiles_absent = false;  // every key of 32-key tiles 1, 3, ... is padding
};

// The split form (a partials workspace) of launch a: a's own output buffer must differ from out.
std::vector<float> run_split(detail::PrefillAttnArgs a, float* out, size_t n_out) {
  const size_t bytes = detail::prefill_attn_split_bytes(a.m, a.n_idx, a.heads, a.dim);
  EXPECT_GT(bytes, 0u);
  DeviceBuffer<float> part(bytes / sizeof(float));
  a.part = part.get(), a.part_bytes = bytes, a.out = out;
  EXPECT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> h(n_out);
  EXPECT_EQ(cudaMemcpy(h.data(), out, n_out * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(CudaPrefillAttention, MatchesCpuWithPartialTilesAndPadding) {
  FS_REQUIRE_GPU();
  const AttnCase cases[] = {
      {3, 640, 2000, 0.1},  // V4.1 prefill shape: 128 window + 512 selected, 20 full tiles
      {2, 37, 50, 0.3},     // partial second tile
      {2, 40, 30, 1.0},     // every key padding: zero output
      {1, 1, 1, 0.0},       // one key
      {4, 100, 300, 0.5},
      {40, 200, 500, 0.2},  // over 32 rows: 64-head blocks
      {3, 300, 400, 0.1, true},  // whole tiles without a valid key between valid ones
      {1, 64, 100, 0.0, true},   // the last tile without a valid key
      {10, 12, 40, 0.2},         // V4 tiny: 8 window + 4 selected slots, one tile
      {48, 640, 3000, 0.1},      // the V4.1 shape over 32 rows (the warpgroup kernel on sm_90a)
  };
  uint32_t seed = 7;
  // The V4.1 shape, and V4's tiny one (16 heads of 128: one 16-head block; lists of one tile).
  const std::pair<int, int> shapes[] = {{64, 512}, {16, 128}};
  for (const auto& [kH, kD] : shapes)
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "H=" << kH << " D=" << kD << " m=" << c.m << " n_idx=" << c.n_idx
                                      << " pad=" << c.pad_frac);
    std::mt19937 rng(seed++);
    const auto q = randn(rng, size_t(c.m) * kH * kD, 0.3f);
    const auto kvf = randn(rng, size_t(c.n_rows) * kD);
    std::vector<uint16_t> kv(kvf.size());
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = bf16_bits(kvf[i]);
    const auto sink = randn(rng, kH, 2.0f);
    std::vector<int32_t> idx(size_t(c.m) * size_t(c.n_idx));
    std::uniform_real_distribution<double> u(0, 1);
    for (size_t i = 0; i < idx.size(); ++i) {
      int32_t& v = idx[i];
      v = int32_t(rng() % uint32_t(c.n_rows));
      if (u(rng) < c.pad_frac) v = (rng() % 4 == 0) ? c.n_rows + 3 : -1;
      if (c.odd_tiles_absent && (i % size_t(c.n_idx)) / 32 % 2 == 1) v = -1;
    }
    SparseAttnPoolParams p;
    p.q = q.data(), p.kv = kv.data(), p.idx = idx.data(), p.sink = sink.data();
    p.m = c.m, p.n_idx = c.n_idx, p.n_rows = c.n_rows, p.n_heads = kH, p.head_dim = kD;
    p.scale = 1.0f / std::sqrt(float(kD)), p.n_splits = 1;
    std::vector<float> ref(q.size());
    p.out = ref.data();
    FS_ASSERT_OK(sparse_attention_pool_ref(p));
    DeviceBuffer<float> dq(q), dsink(sink), dout(q.size());
    DeviceBuffer<uint16_t> dkv(kv);
    DeviceBuffer<int32_t> didx(idx);
    detail::PrefillAttnArgs a;
    a.q = dq.get(), a.kv = dkv.get(), a.idx = didx.get(), a.sink = dsink.get(), a.out = dout.get();
    a.m = c.m, a.n_idx = c.n_idx, a.n_rows = c.n_rows, a.heads = kH, a.dim = kD, a.scale = p.scale;
    ASSERT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dout.to_host();
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written";
      // BF16 probabilities relative to a running max (GPU) vs the global max (twin): up to one BF16
      // ulp per term; a wrong key or head is off by O(1).
      ASSERT_LE(std::fabs(got[i] - ref[i]), 4e-3f * (1.0f + std::fabs(ref[i]))) << "output " << i;
    }
    // The split form (one block per 32-key tile, then the fold launch) folds the same tile
    // partials in the same order: the same bits (rows of more than 32 take the in-block fold).
    for (const bool bf16 : {false, true}) {
      a.bf16_out = bf16;
      DeviceBuffer<float> in_block(q.size()), split(q.size());
      a.out = in_block.get();
      ASSERT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
      const auto s = run_split(a, split.get(), q.size());
      const auto b = in_block.to_host();
      ASSERT_EQ(0, std::memcmp(b.data(), s.data(), b.size() * sizeof(float))) << "bf16 " << bf16;
    }
  }
  // The block shape (64-head blocks over 33+ rows, 16-head blocks with a deeper key ring for
  // fewer) changes no bit: 40 rows in one launch == each row launched alone; 80 heads (a partial
  // head block in either shape) and head dim 128 as well.
  for (const int kD : {512, 256, 128}) {
    constexpr int kM = 40, kNIdx = 150, kRows = 400, kH = 80;
    std::mt19937 rng(uint32_t(90 + kD));
    const auto [q, kv, sink, idx] = random_attn_inputs(rng, kM, kH, kD, kNIdx, kRows);
    DeviceBuffer<float> dq(q), dsink(sink), dall(q.size()), done(q.size());
    DeviceBuffer<uint16_t> dkv(kv);
    DeviceBuffer<int32_t> didx(idx);
    detail::PrefillAttnArgs a;
    a.q = dq.get(), a.kv = dkv.get(), a.idx = didx.get(), a.sink = dsink.get(), a.out = dall.get();
    a.m = kM, a.n_idx = kNIdx, a.n_rows = kRows, a.heads = kH, a.dim = kD, a.scale = 0.05f;
    ASSERT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
    for (int t = 0; t < kM; ++t) {
      detail::PrefillAttnArgs b = a;
      b.m = 1, b.q = dq.get() + int64_t(t) * kH * kD, b.idx = didx.get() + int64_t(t) * kNIdx;
      b.out = done.get() + int64_t(t) * kH * kD;
      ASSERT_EQ(detail::launch_prefill_attn(b, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto all = dall.to_host(), one = done.to_host();
    ASSERT_EQ(0, std::memcmp(all.data(), one.data(), all.size() * sizeof(float))) << "head dim " << kD;
    // The split form, each row alone and 6 rows at a time: the same bits.
    DeviceBuffer<float> dsplit(q.size());
    for (const int rows : {1, 6}) {
      for (int t = 0; t < kM; t += rows) {
        detail::PrefillAttnArgs b = a;
        b.m = std::min(rows, kM - t), b.q = dq.get() + int64_t(t) * kH * kD, b.idx = didx.get() + int64_t(t) * kNIdx;
        run_split(b, dsplit.get() + int64_t(t) * kH * kD, 1);
      }
      const auto split = dsplit.to_host();
      ASSERT_EQ(0, std::memcmp(all.data(), split.data(), all.size() * sizeof(float))) << "head dim " << kD << " rows " << rows;
    }
  }
  detail::PrefillAttnArgs bad;
  bad.heads = 64, bad.dim = 100, bad.m = 1;
  EXPECT_EQ(detail::launch_prefill_attn(bad, nullptr), cudaErrorInvalidValue) << "head dims 64 / 128 / 256 / 512 only";
  bad.heads = 0, bad.dim = 512;
  EXPECT_EQ(detail::launch_prefill_attn(bad, nullptr), cudaErrorInvalidValue) << "no heads";
}

// Launches of more than 32 rows take the warpgroup (wgmma) kernel on an sm_90a device (head dims
// 128 / 256 / 512): the same bits as the m16n8k16 kernel (PrefillAttnArgs::mma_sync) for the same
// launch, with odd head counts (a partial 64-head block), key lists of 1 to 700 slots (partial
// tiles, tiles without a valid key, rows whose every key is padding), BF16 output or not, the
// inverse RoPE, and q spread over 2^±8 so that the tensor cores' alignment of products shows.
TEST(CudaPrefillAttention, WarpgroupKernelGivesTheMmaSyncBits) {
  FS_REQUIRE_GPU();
  struct Case { int m, heads, dim, n_idx, rows; bool odd_tiles_absent; };
  const Case cases[] = {
      {33, 64, 512, 640, 3000, false}, {70, 80, 512, 700, 900, true}, {41, 16, 512, 1, 5, false},
      {35, 64, 256, 95, 300, false},   {50, 130, 256, 33, 40, true},  {33, 64, 128, 31, 200, false},
      {64, 8, 128, 200, 250, true},
  };
  uint32_t seed = 500;
  for (const auto& c : cases)
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "m=" << c.m << " H=" << c.heads << " D=" << c.dim << " n_idx=" << c.n_idx
                                        << " bf16=" << bf16);
      std::mt19937 rng(seed++);
      auto [q, kv, sink, idx] = random_attn_inputs(rng, c.m, c.heads, c.dim, c.n_idx, c.rows);
      std::uniform_int_distribution<int> ex(-8, 8);
      for (auto& v : q) v = std::ldexp(v, ex(rng));
      for (size_t i = 0; i < idx.size(); ++i) {
        if (c.odd_tiles_absent && (i % size_t(c.n_idx)) / 32 % 2 == 1) idx[i] = -1;
        if (rng() % 50 == 0) idx[i] = c.rows + int32_t(rng() % 7);  // past the rows: padding
      }
      for (int k = 0; k < c.n_idx; ++k) idx[size_t(c.m - 1) * size_t(c.n_idx) + size_t(k)] = -1;  // no key at all
      const int rope = 64;
      const auto [pos, inv] = random_unrope_inputs(rng, c.m, rope);
      DeviceBuffer<float> dq(q), dsink(sink), dinv(inv), d_mma(q.size()), d_wg(q.size());
      DeviceBuffer<uint16_t> dkv(kv);
      DeviceBuffer<int32_t> didx(idx);
      DeviceBuffer<int64_t> dpos(pos);
      for (const bool unrope : {false, true}) {
        detail::PrefillAttnArgs a;
        a.q = dq.get(), a.kv = dkv.get(), a.idx = didx.get(), a.sink = dsink.get();
        a.m = c.m, a.n_idx = c.n_idx, a.n_rows = c.rows, a.heads = c.heads, a.dim = c.dim;
        a.scale = 1.0f / std::sqrt(float(c.dim)), a.bf16_out = bf16;
        if (unrope) a.unrope_pos = dpos.get(), a.unrope_inv_freq = dinv.get(), a.unrope_dim = rope;
        detail::PrefillAttnArgs b = a;
        a.mma_sync = true, a.out = d_mma.get();
        b.out = d_wg.get();
        ASSERT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
        ASSERT_EQ(detail::launch_prefill_attn(b, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto want = d_mma.to_host(), got = d_wg.to_host();
        size_t differ = 0, first = want.size();
        for (size_t i = 0; i < want.size(); ++i)
          if (std::memcmp(&want[i], &got[i], 4) != 0) ++differ, first = std::min(first, i);
        ASSERT_EQ(differ, 0u) << "unrope " << unrope << ": first at " << first << " (" << want[first] << " vs "
                              << got[first] << ")";
        // The last row has no valid key: zero output.
        for (size_t i = size_t(c.m - 1) * size_t(c.heads) * size_t(c.dim); i < got.size(); ++i)
          ASSERT_EQ(got[i], 0.0f) << "output " << i;
      }
    }
}

// The inverse RoPE inside the attention launch (PrefillAttnArgs::unrope_pos): in the split form's
// fold and, for the in-block forms, by the rotation launched after the kernel, the output is
// bitwise the plain launch's followed by launch_rope (inverse; BF16 or not), the CPU's
// ops::apply_rope of the plain output as well: 1, 6 and 40 rows (the last: no split form), head
// dims 512 and 128 with RoPE over 62, 64 and all of them, positions up to 2^20. Bad RoPE
// arguments are refused.
TEST(CudaPrefillAttention, InverseRopeInTheLaunchEqualsRopeAfter) {
  FS_REQUIRE_GPU();
  uint32_t seed = 300;
  for (const int kD : {512, 128})
    for (const int rope : {62, 64, kD})  // 62: the rotated values start in the middle of a thread's four
      for (const int m : {1, 6, 40})
        for (const bool bf16 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "D=" << kD << " rope=" << rope << " m=" << m << " bf16=" << bf16);
          constexpr int kH = 16, kNIdx = 150, kRows = 300;
          std::mt19937 rng(seed++);
          const auto [q, kv, sink, idx] = random_attn_inputs(rng, m, kH, kD, kNIdx, kRows);
          const auto [pos, inv] = random_unrope_inputs(rng, m, rope);
          DeviceBuffer<float> dq(q), dsink(sink), dinv(inv), plain(q.size()), fused(q.size());
          DeviceBuffer<uint16_t> dkv(kv);
          DeviceBuffer<int32_t> didx(idx);
          DeviceBuffer<int64_t> dpos(pos);
          detail::PrefillAttnArgs a;
          a.q = dq.get(), a.kv = dkv.get(), a.idx = didx.get(), a.sink = dsink.get();
          a.m = m, a.n_idx = kNIdx, a.n_rows = kRows, a.heads = kH, a.dim = kD, a.scale = 0.05f, a.bf16_out = bf16;
          detail::PrefillAttnArgs b = a;
          b.unrope_pos = dpos.get(), b.unrope_inv_freq = dinv.get(), b.unrope_dim = rope;
          std::vector<float> want, got;
          if (m <= detail::kPrefillAttnSplitMaxRows) {
            want = run_split(a, plain.get(), q.size());
            got = run_split(b, fused.get(), q.size());
          } else {
            a.out = plain.get(), b.out = fused.get();
            ASSERT_EQ(detail::launch_prefill_attn(a, nullptr), cudaSuccess);
            ASSERT_EQ(detail::launch_prefill_attn(b, nullptr), cudaSuccess);
            want = plain.to_host(), got = fused.to_host();
          }
          std::vector<float> cpu = want;
          apply_rope({cpu.data(), pos.data(), inv.data(), m, kH, kD, rope, true, bf16});
          ASSERT_EQ(detail::launch_rope(plain.get(), dpos.get(), dinv.get(), m, kH, kD, rope, true, bf16, nullptr),
                    cudaSuccess);
          want = plain.to_host();
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float))) << "vs launch_rope";
          ASSERT_EQ(0, std::memcmp(cpu.data(), got.data(), got.size() * sizeof(float))) << "vs the CPU";
        }
  detail::PrefillAttnArgs bad;
  bad.heads = 16, bad.dim = 128, bad.m = 1;
  int64_t pos = 0;
  bad.unrope_pos = &pos, bad.unrope_dim = 64;
  EXPECT_EQ(detail::launch_prefill_attn(bad, nullptr), cudaErrorInvalidValue) << "no frequencies";
  const float inv = 1.0f;
  bad.unrope_inv_freq = &inv, bad.unrope_dim = 63;
  EXPECT_EQ(detail::launch_prefill_attn(bad, nullptr), cudaErrorInvalidValue) << "odd RoPE width";
  bad.unrope_dim = 256;
  EXPECT_EQ(detail::launch_prefill_attn(bad, nullptr), cudaErrorInvalidValue) << "RoPE wider than the head";
}

TEST(CudaPrefillIndexScores, MatchesBf16ReferenceAndMasksUnreachableKeys) {
  FS_REQUIRE_GPU();
  struct Case { int64_t T, start, ratio, stride; };
  const Case cases[] = {
      {20, 0, 2, 12},        // first rows reach 0 keys; partial query block
      {17, 2100, 1, 2120},   // two key ranges, partial tile
      {33, 4000, 2, 2100},   // rows past the end of the keys: clamp to stride
      {16, 1000, 1, 4500},   // key ranges no row reaches: -inf only
  };
  uint32_t seed = 11;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " start=" << c.start << " ratio=" << c.ratio
                                      << " stride=" << c.stride);
    constexpr int kNh = 32, kDi = 128;
    std::mt19937 rng(seed++);
    const auto q = randn(rng, size_t(c.T) * kNh * kDi);
    const auto w = randn(rng, size_t(c.T) * kNh, 0.2f);
    const auto keys = randn(rng, size_t(c.stride) * kDi);
    DeviceBuffer<float> dq(q), dw(w), dk(keys), ds(size_t(c.T * c.stride));
    detail::IndexScoreMmaArgs a;
    a.q = dq.get(), a.w = dw.get(), a.keys = dk.get(), a.scores = ds.get();
    a.T = c.T, a.start = c.start, a.ratio = c.ratio, a.stride = c.stride;
    ASSERT_EQ(detail::launch_index_scores_mma(a, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = ds.to_host();
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t vis = std::min(c.stride, (c.start + t + 1) / c.ratio);
      for (int64_t s = 0; s < c.stride; ++s) {
        const float g = got[size_t(t * c.stride + s)];
        if (s >= vis) {
          ASSERT_EQ(g, -INFINITY) << "t=" << t << " s=" << s << " is unreachable";
          continue;
        }
        double ref = 0, mag = 0;
        for (int h = 0; h < kNh; ++h) {
          double dot = 0, dmag = 0;
          for (int d = 0; d < kDi; ++d) {
            const double pr = double(bf16_round(q[size_t((t * kNh + h) * kDi + d)])) *
                              double(bf16_round(keys[size_t(s * kDi + d)]));
            dot += pr, dmag += std::fabs(pr);
          }
          const double wv = w[size_t(t * kNh + h)];
          ref += wv * std::max(dot, 0.0);
          mag += std::fabs(wv) * dmag;
        }
        // Exact BF16 products summed in FP32 (tensor-core order): 1e-4 of the magnitudes covers
        // it; a wrong key, head or weight is off by O(magnitude).
        ASSERT_LE(std::fabs(double(g) - ref), 1e-4 * mag + 1e-6) << "t=" << t << " s=" << s;
      }
    }
  }
}

TEST(CudaPrefillMoeGlue, GatherSwigluQuantCombine) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(5);
  // Gather: codes + scales of rows in a permuted order (repeats allowed).
  const int64_t rows = 9, k = 256, n_out = 14;
  std::vector<uint8_t> codes(size_t(rows * k));
  for (auto& b : codes) b = uint8_t(rng());
  const auto scales = randn(rng, size_t(rows * k / 32));
  std::vector<int32_t> perm(n_out);
  for (auto& p : perm) p = int32_t(rng() % rows);
  DeviceBuffer<uint8_t> dc(codes), dgc(size_t(n_out * k));
  DeviceBuffer<float> dsc(scales), dgs(size_t(n_out * k / 32));
  DeviceBuffer<int32_t> dperm(perm);
  ASSERT_EQ(detail::launch_gather_fp8_rows(dc.get(), dsc.get(), dperm.get(), n_out, k, dgc.get(), dgs.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gc = dgc.to_host();
  const auto gs = dgs.to_host();
  for (int64_t p = 0; p < n_out; ++p) {
    ASSERT_EQ(0, std::memcmp(gc.data() + p * k, codes.data() + perm[size_t(p)] * k, size_t(k))) << "row " << p;
    ASSERT_EQ(0, std::memcmp(gs.data() + p * (k / 32), scales.data() + perm[size_t(p)] * (k / 32), size_t(k / 32) * 4));
  }
  EXPECT_EQ(detail::launch_gather_fp8_rows(dc.get(), dsc.get(), dperm.get(), 1, 100, dgc.get(), dgs.get(), nullptr),
            cudaErrorInvalidValue);
  // code_bytes 2 (f16 values, 2·k bytes per row): the same rows of half the width k / 2.
  DeviceBuffer<float> dgs2(size_t(n_out * k / 64));
  ASSERT_EQ(cudaMemset(dgc.get(), 0, size_t(n_out * k)), cudaSuccess);
  ASSERT_EQ(detail::launch_gather_fp8_rows(dc.get(), dsc.get(), dperm.get(), n_out, k / 2, dgc.get(), dgs2.get(),
                                           nullptr, 2),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gc2 = dgc.to_host();
  const auto gs2 = dgs2.to_host();
  for (int64_t p = 0; p < n_out; ++p) {
    const int64_t r = perm[size_t(p)];
    ASSERT_EQ(0, std::memcmp(gc2.data() + p * k, codes.data() + r * k, size_t(k))) << "f16 row " << p;
    ASSERT_EQ(0, std::memcmp(gs2.data() + p * (k / 64), scales.data() + r * (k / 64), size_t(k / 64) * 4))
        << "f16 row " << p;
  }
  EXPECT_EQ(detail::launch_gather_fp8_rows(dc.get(), dsc.get(), dperm.get(), 1, 128, dgc.get(), dgs.get(), nullptr, 3),
            cudaErrorInvalidValue);

  // SwiGLU x weight, quantised: the decoded value is within half an e4m3 step of the FP32 value.
  const int64_t r2 = 7, n = 96;
  auto gu = randn(rng, size_t(r2 * 2 * n), 3.0f);
  gu[5] = 40.0f, gu[size_t(n) + 6] = -40.0f;  // clamped by the limit
  for (int64_t i = 0; i < n; ++i) gu[size_t(2 * n + i)] = 0.0f;  // an all-zero gate row: h = 0
  const auto wt = randn(rng, size_t(r2));
  DeviceBuffer<float> dgu(gu), dwt(wt), dxs(size_t(r2 * n / 32));
  DeviceBuffer<uint8_t> dxq(size_t(r2 * n));
  const float limit = 10.0f;
  ASSERT_EQ(detail::launch_swiglu_quant_fp8(dgu.get(), dwt.get(), r2, n, limit, dxq.get(), dxs.get(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto xq = dxq.to_host();
  const auto xs = dxs.to_host();
  for (int64_t r = 0; r < r2; ++r)
    for (int64_t b = 0; b < n / 32; ++b) {
      float h[32], amax = 0;
      for (int i = 0; i < 32; ++i) {
        float g = gu[size_t(r * 2 * n + b * 32 + i)], u = gu[size_t(r * 2 * n + n + b * 32 + i)];
        g = std::min(g, limit), u = std::min(std::max(u, -limit), limit);
        h[i] = g / (1.0f + std::exp(-g)) * u * wt[size_t(r)];
        amax = std::max(amax, std::fabs(h[i]));
      }
      const float s = xs[size_t(r * (n / 32) + b)];
      const float want_s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4f) / 448.0f)));
      ASSERT_NEAR(s, want_s, want_s * 1e-6f) << "row " << r << " block " << b;  // a power of two >= amax/448
      for (int i = 0; i < 32; ++i) {
        const float v = e4m3_value(xq[size_t(r * n + b * 32 + i)]) * s;
        ASSERT_LE(std::fabs(v - h[i]), std::fabs(h[i]) / 16.0f + s / 256.0f + 1e-5f * amax)
            << "row " << r << " col " << b * 32 + i;
      }
    }

  // Combine: out[t] = ys[t] + sum of the rows inv[t*k + j].
  const int64_t T = 5, K = 3, dim = 8;
  const auto y = randn(rng, size_t(T * K * dim));
  const auto ys = randn(rng, size_t(T * dim));
  std::vector<int32_t> inv(size_t(T * K));
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = int32_t((i * 7) % inv.size());
  DeviceBuffer<float> dy(y), dys(ys), dout(size_t(T * dim));
  DeviceBuffer<int32_t> dinv(inv);
  ASSERT_EQ(detail::launch_combine_rows(dy.get(), dinv.get(), dys.get(), T, K, dim, dout.get(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto out = dout.to_host();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      float want = ys[size_t(t * dim + d)];
      for (int64_t j = 0; j < K; ++j) want += y[size_t(inv[size_t(t * K + j)] * dim + d)];
      ASSERT_NEAR(out[size_t(t * dim + d)], want, 1e-5f * (1.0f + std::fabs(want))) << "t=" << t << " d=" << d;
    }
}

// The merged row positions of a step's routed pairs run in two parts (the GPU model's split MoE)
// against merge_row_of_ref: either part with or without its own positions (nullptr: identity),
// pairs of other ranks' experts (-1), empty parts, sizes across block boundaries.
TEST(CudaPrefillMoeGlue, MergeRowOfMatchesTwin) {
  FS_REQUIRE_GPU();
  std::mt19937 rng(12);
  const int64_t sizes[][2] = {{0, 5}, {7, 0}, {255, 257}, {1000, 3}, {1, 1}};
  for (const auto& sz : sizes)
    for (int mode = 0; mode < 4; ++mode) {
      const int64_t na = sz[0], nb = sz[1];
      SCOPED_TRACE(::testing::Message() << "na=" << na << " nb=" << nb << " mode=" << mode);
      std::vector<int32_t> a(size_t(std::max<int64_t>(na, 1))), b(size_t(std::max<int64_t>(nb, 1)));
      for (auto& v : a) v = int32_t(rng() % 5000);
      for (auto& v : b) v = rng() % 7 == 0 ? -1 : int32_t(rng() % 5000);
      const bool has_a = mode & 1, has_b = mode & 2;
      const int32_t off = int32_t(na * 3 + 11);
      std::vector<int32_t> want(size_t(na + nb) + 1, 0);
      detail::merge_row_of_ref(has_a ? a.data() : nullptr, na, has_b ? b.data() : nullptr, nb, off, want.data());
      DeviceBuffer<int32_t> da(a), db(b), dout(want.size());
      ASSERT_TRUE(da.ok() && db.ok() && dout.ok());
      ASSERT_EQ(cudaMemset(dout.get(), 0x7f, want.size() * 4), cudaSuccess);
      ASSERT_EQ(detail::launch_merge_row_of(has_a ? da.get() : nullptr, na, has_b ? db.get() : nullptr, nb, off,
                                            dout.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<int32_t> got = dout.to_host();
      EXPECT_EQ(got.back(), 0x7f7f7f7f) << "wrote past na + nb";
      got.back() = want.back() = 0;
      ASSERT_EQ(got, want);
    }
  EXPECT_EQ(detail::launch_merge_row_of(nullptr, -1, nullptr, 0, 0, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace flashseek::ops::cuda
