// Compact cache rows on the device (ops/cuda/cache/cache_rows.h, cache_row.cuh) against the host
// twin (ops/cache_row.h): the device packs quantiser rows into the same bytes, unpacks them to the
// same bits and counts rows that are not representable; ring writes land in the right slots; and
// the model's readers (attention over ring + compressed rows, index scores over key rows) give
// bitwise the results they give over the FP32 rows.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "ops/cache_row.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;

// The quantiser the flow applies to rows of format f (forward/flow.cpp).
void quantise(const CacheRowFormat& f, float* x, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * f.dim;
    if (f.codec == RowCodec::kFp8E8m0) {
      fp8_quant_dequant(row, 1, f.coded, f.block);
      round_bf16_inplace(row + f.coded, f.dim - f.coded);
    } else if (f.codec == RowCodec::kFp4E8m0) {
      fp4_quant_dequant_e8m0(row, 1, f.dim, f.block);
    } else if (f.codec == RowCodec::kFp4E4m3) {
      fp4_quant_dequant_e4m3(row, 1, f.dim, f.block);
    }
  }
}

// Quantised rows with per-block magnitudes from 0 to 1e37 (moderate: 0 to 7.5, for the readers'
// tests, whose sums must stay finite), negative zeros and all-equal blocks.
std::vector<float> rows_of(const CacheRowFormat& f, int64_t rows, uint32_t seed, bool moderate = false) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float mags[] = {0.0f, 1e-6f, 3e-3f, 1.0f, 7.5f, 1e-40f, 1e-30f, 448.0f, 1e6f, 1e37f};
  std::vector<float> x(size_t(rows * f.dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b0 = 0; b0 < f.dim; b0 += f.block) {
      const float m = mags[g() % (moderate ? 5 : 10)];
      const int pat = int(g() % 4);
      const float eq = nd(g) * m;
      for (int64_t i = b0; i < std::min<int64_t>(f.dim, b0 + f.block); ++i)
        x[size_t(r * f.dim + i)] = pat == 1 ? eq : pat == 2 && g() % 2 ? -0.0f : nd(g) * m;
    }
  quantise(f, x.data(), rows);
  return x;
}

const CacheRowFormat kFormats[] = {
    {RowCodec::kFp8E8m0, 512, 512, 32},  // V4.1 window ring
    {RowCodec::kFp4E4m3, 512, 512, 16},  // V4.1 compressed KV
    {RowCodec::kFp4E8m0, 128, 128, 32},  // index keys
    {RowCodec::kFp8E8m0, 512, 448, 64},  // V4 ring / compressed KV (BF16 RoPE tail)
    {RowCodec::kFp8E8m0, 128, 64, 64},   // tiny-v4
    {RowCodec::kFp4E4m3, 64, 64, 16},    // tiny-v41
    {RowCodec::kF32, 72, 0, 1},          // exact numerics
};

TEST(CudaCacheRows, PackAndUnpackMatchTheHost) {
  FS_REQUIRE_GPU();
  for (const CacheRowFormat& f : kFormats) {
    const std::string at = "codec " + std::to_string(int(f.codec)) + " dim " + std::to_string(f.dim);
    const int64_t n = 257, rb = f.row_bytes();
    const std::vector<float> x = rows_of(f, n, 5 + uint32_t(f.dim));
    std::vector<uint8_t> host(size_t(n * rb));
    ASSERT_TRUE(pack_cache_rows(f, x.data(), n, host.data()).ok()) << at;
    DeviceBuffer<float> dx(x), dback(x.size());
    DeviceBuffer<uint8_t> dpk(host.size());
    DeviceBuffer<int> dbad(std::vector<int>{0});
    ASSERT_EQ(cd::launch_cache_pack_rows(f, dx.get(), n, dpk.get(), dbad.get(), 0), cudaSuccess) << at;
    ASSERT_EQ(cd::launch_cache_unpack_rows(f, dpk.get(), n, dback.get(), 0), cudaSuccess) << at;
    EXPECT_EQ(dbad.to_host()[0], 0) << at;
    EXPECT_EQ(dpk.to_host(), host) << at << ": device bytes differ from the host pack";
    const auto back = dback.to_host();
    ASSERT_EQ(std::memcmp(back.data(), x.data(), x.size() * 4), 0) << at << ": unpack is not the input";
    if (!f.compact()) continue;
    // One value one ulp off its grid in 3 rows (a coded value; V4 also a tail value): counted.
    std::vector<float> bad = x;
    for (int64_t r : {1, 50, 200}) {
      float& v = bad[size_t(r * f.dim + 7)];
      v = std::nextafter(v == 0.0f ? 1.0f : v, std::numeric_limits<float>::infinity());
    }
    if (f.tail_dims() > 0) bad[size_t(3 * f.dim + f.dim - 1)] = 1.0f + 1.0f / 1024.0f;
    DeviceBuffer<float> dbx(bad);
    DeviceBuffer<int> dbad2(std::vector<int>{0});
    ASSERT_EQ(cd::launch_cache_pack_rows(f, dbx.get(), n, dpk.get(), dbad2.get(), 0), cudaSuccess) << at;
    EXPECT_EQ(dbad2.to_host()[0], f.tail_dims() > 0 ? 4 : 3) << at;
  }
}

// Ring writes: rows t0..T-1 land in slots pos % ring_size; the multi-sequence form skips rows a
// later row of the same chunk overwrites.
TEST(CudaCacheRows, RingWritesLandInTheirSlots) {
  FS_REQUIRE_GPU();
  const CacheRowFormat f{RowCodec::kFp8E8m0, 128, 64, 64};
  const int64_t ring = 5, T = 7, rb = f.row_bytes();
  const std::vector<float> kv = rows_of(f, T, 9);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = 11 + t;
  DeviceBuffer<float> dkv(kv);
  DeviceBuffer<int64_t> dpos(pos);
  DeviceBuffer<uint8_t> dring(size_t(ring * rb));
  ASSERT_EQ(cudaMemset(dring.get(), 0, size_t(ring * rb)), cudaSuccess);
  ASSERT_EQ(cd::launch_cache_pack_ring(f, dring.get(), dkv.get(), dpos.get(), T - ring, T, ring, nullptr, 0), cudaSuccess);
  std::vector<float> got(size_t(ring * f.dim));
  unpack_cache_rows(f, dring.to_host().data(), ring, got.data());
  for (int64_t t = T - ring; t < T; ++t)
    EXPECT_EQ(std::memcmp(got.data() + (pos[size_t(t)] % ring) * f.dim, kv.data() + t * f.dim, size_t(f.dim) * 4), 0)
        << "row " << t;
  // Two sequences: rows 0..1 (ring A, positions 3, 4), rows 2..8 (ring B, 7 rows over 5 slots).
  std::vector<float> kv2 = rows_of(f, 9, 10);
  std::vector<int64_t> pos2 = {3, 4, 20, 21, 22, 23, 24, 25, 26};
  std::vector<int32_t> row_seq = {0, 0, 1, 1, 1, 1, 1, 1, 1};
  DeviceBuffer<uint8_t> ra(size_t(ring * rb)), rbuf(size_t(ring * rb));
  cudaMemset(ra.get(), 0, size_t(ring * rb)), cudaMemset(rbuf.get(), 0, size_t(ring * rb));
  std::vector<cd::ModelAttnSeq> seqs(2);
  seqs[0].ring = ra.get(), seqs[0].start = 3, seqs[0].row0 = 0, seqs[0].T = 2, seqs[0].ring_size = ring;
  seqs[1].ring = rbuf.get(), seqs[1].start = 20, seqs[1].row0 = 2, seqs[1].T = 7, seqs[1].ring_size = ring;
  DeviceBuffer<uint8_t> dseqs(seqs.size() * sizeof(cd::ModelAttnSeq));
  cudaMemcpy(dseqs.get(), seqs.data(), seqs.size() * sizeof(cd::ModelAttnSeq), cudaMemcpyHostToDevice);
  DeviceBuffer<float> dkv2(kv2);
  DeviceBuffer<int64_t> dpos2(pos2);
  DeviceBuffer<int32_t> drs(row_seq);
  ASSERT_EQ(cd::launch_cache_pack_ring_seqs(f, reinterpret_cast<const cd::ModelAttnSeq*>(dseqs.get()), drs.get(),
                                            dkv2.get(), dpos2.get(), 9, nullptr, 0),
            cudaSuccess);
  std::vector<float> a(size_t(ring * f.dim)), b(size_t(ring * f.dim));
  unpack_cache_rows(f, ra.to_host().data(), ring, a.data());
  unpack_cache_rows(f, rbuf.to_host().data(), ring, b.data());
  for (int64_t r = 0; r < 9; ++r) {
    if (r >= 2 && r < 4) continue;  // overwritten by rows 7, 8
    const float* slot = (r < 2 ? a.data() : b.data()) + (pos2[size_t(r)] % ring) * f.dim;
    EXPECT_EQ(std::memcmp(slot, kv2.data() + r * f.dim, size_t(f.dim) * 4), 0) << "row " << r;
  }
}

// Packs rows on the host into a device buffer.
DeviceBuffer<uint8_t>* packed(const CacheRowFormat& f, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size()) / f.dim;
  std::vector<uint8_t> h(size_t(n * f.row_bytes()));
  EXPECT_TRUE(pack_cache_rows(f, x.data(), n, h.data()).ok());
  return new DeviceBuffer<uint8_t>(h);
}

TEST(CudaCacheRows, AttentionOverCompactRowsIsBitwiseTheFp32Attention) {
  FS_REQUIRE_GPU();
  const CacheRowFormat ring_fmts[] = {{RowCodec::kFp8E8m0, 512, 512, 32}, {RowCodec::kFp8E8m0, 512, 448, 64}};
  const CacheRowFormat ckv_fmts[] = {{RowCodec::kFp4E4m3, 512, 512, 16}, {RowCodec::kFp8E8m0, 512, 448, 64}};
  const int64_t T = 5, H = 2, Dh = 512, W = 6, ring = W + 4, start = 13, n_ckv = 9, k = 4;
  for (int v = 0; v < 2; ++v) {
    const auto q = rows_of(ring_fmts[v], T * H, 1, true), kv = rows_of(ring_fmts[v], T, 2, true);
    const auto rg = rows_of(ring_fmts[v], ring, 3, true), ckv = rows_of(ckv_fmts[v], n_ckv, 4, true);
    std::vector<float> sink = {0.25f, -1.5f};
    std::vector<int32_t> topk(static_cast<size_t>(T * k), 0), tn(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      tn[size_t(t)] = int32_t(t % (k + 1));
      for (int64_t i = 0; i < tn[size_t(t)]; ++i) topk[size_t(t * k + i)] = int32_t(2 * i + t % 2);
    }
    for (bool bf16 : {false, true}) {
      DeviceBuffer<float> dq(q), dkv(kv), drg(rg), dckv(ckv), dsink(sink), o32(size_t(T * H * Dh)), oc(size_t(T * H * Dh));
      DeviceBuffer<int32_t> dtk(topk), dtn(tn);
      std::unique_ptr<DeviceBuffer<uint8_t>> prg(packed(ring_fmts[v], rg)), pckv(packed(ckv_fmts[v], ckv));
      cd::ModelAttnArgs a;
      a.q = dq.get(), a.kv_chunk = dkv.get(), a.ring = drg.get(), a.ckv = dckv.get(), a.topk = dtk.get();
      a.topk_n = dtn.get(), a.topk_stride = k, a.ratio = 2, a.sink = dsink.get(), a.out = o32.get();
      a.T = T, a.H = H, a.Dh = Dh, a.window = W, a.ring_size = ring, a.start = start, a.max_keys = W + k;
      a.scale = 1.0f / std::sqrt(float(Dh)), a.bf16 = bf16;
      ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess);
      a.ring = prg->get(), a.ckv = pckv->get(), a.ring_fmt = ring_fmts[v], a.ckv_fmt = ckv_fmts[v], a.out = oc.get();
      ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess);
      const auto x = o32.to_host(), y = oc.to_host();
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "format set " << v << " bf16 " << bf16;
    }
  }
}

TEST(CudaCacheRows, IndexScoresOverCompactKeysAreBitwiseTheFp32Scores) {
  FS_REQUIRE_GPU();
  for (const int64_t dI : {128, 64}) {
    const CacheRowFormat f{RowCodec::kFp4E8m0, int32_t(dI), int32_t(dI), 32};
    const int64_t T = 4, start = 300, ratio = 2, nI = 5, stride = start + T, n_keys = stride / ratio;
    const auto q = rows_of(f, T * nI, 21, true), keys = rows_of(f, n_keys, 22, true);
    std::vector<float> w(size_t(T * nI));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * float(i % 7) - 0.2f;
    DeviceBuffer<float> dq(q), dk(keys), dw(w), s32(size_t(T * stride)), sc(size_t(T * stride));
    std::unique_ptr<DeviceBuffer<uint8_t>> pk(packed(f, keys));
    for (int kernel : {1, 2, 3}) {
      cd::IndexScoreArgs s;
      s.q = dq.get(), s.w = dw.get(), s.keys = dk.get(), s.scores = s32.get(), s.T = T, s.nI = nI, s.dI = dI;
      s.start = start, s.ratio = ratio, s.stride = stride, s.bf16 = true, s.kernel = kernel;
      ASSERT_EQ(cd::launch_index_scores(s, 0), cudaSuccess);
      s.keys = pk->get(), s.key_fmt = f, s.scores = sc.get();
      ASSERT_EQ(cd::launch_index_scores(s, 0), cudaSuccess);
      const auto x = s32.to_host(), y = sc.to_host();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t clen = (start + t + 1) / ratio;
        EXPECT_EQ(std::memcmp(x.data() + t * stride, y.data() + t * stride, size_t(clen) * 4), 0)
            << "dI " << dI << " kernel " << kernel << " row " << t;
      }
    }
  }
}

}  // namespace
}  // namespace flashseek::ops::cuda
