// Compact cache rows on the device (ops/cuda/cache/cache_rows.h, cache_row.cuh) against the host
// twin (ops/cache_row.h): the device packs quantiser rows into the same bytes, unpacks them to the
// same bits and counts rows that are not representable; ring writes land in the right slots; and
// the model's readers (attention over ring + compressed rows, index scores over key rows) give
// bitwise the results they give over the FP32 rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "core/numeric.h"
#include "ops/cache_row.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/linear.h"
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


// ---- the staged attention kernel (ModelAttnArgs::kernel 2) ------------------------------------
// Bitwise against the former kernel (kernel 1, whose bits it must keep) and against the host
// twin below, at the real V4.1 width (H 64, Dh 512, window 128, top-512 of the compressed rows at
// positions >= 4096), in the compact formats and FP32, BF16 on and off, T = 1, 6 and a 300-row
// prefill chunk, every cluster size, odd sizes (H 3, Dh 36 / 37: BF16 tails, scale blocks that are
// not multiples of 4, unaligned FP32 rows, key counts that are no multiple of a chunk), the V4 HCA
// path without top-k (every visible compressed row: 1,628 keys), and several sequences per launch.

// The kernels' arithmetic on the host over FP32 rows: ops::dot_f32 · scale, the max, exp through
// double (dev_exp), the denominator in key order plus the sink's term, BF16 probabilities and
// output when asked, P·V in key order (the test build has no FMA contraction).
void host_attention(const float* q, const std::vector<const float*>& keys, int64_t H, int64_t Dh, const float* sink,
                    float scale, bool bf16, float* out) {
  std::vector<float> l(keys.size()), acc(static_cast<size_t>(Dh));
  for (int64_t h = 0; h < H; ++h) {
    float m = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < keys.size(); ++j) {
      l[j] = dot_f32(q + h * Dh, keys[j], Dh) * scale;
      m = std::fmax(m, l[j]);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    float den = 0;
    for (size_t j = 0; j < keys.size(); ++j) {
      const float e = float(std::exp(double(l[j] - m)));
      den += e;
      const float pr = bf16 ? round_bf16(e) : e;
      for (int64_t d = 0; d < Dh; ++d) acc[size_t(d)] += pr * keys[j][d];
    }
    den += float(std::exp(double(sink[h] - m)));
    for (int64_t d = 0; d < Dh; ++d) {
      const float r = acc[size_t(d)] / den;
      out[h * Dh + d] = bf16 ? round_bf16(r) : r;
    }
  }
}

CacheRowFormat f32_fmt(int64_t dim) { return {RowCodec::kF32, int32_t(dim), 0, 1}; }

// One sequence's inputs: FP32 values (quantised to their row formats) on the host, rows packed on
// the device, top-k lists (ascending distinct visible rows; k = 0: every visible row).
struct AttnData {
  int64_t T = 0, H = 0, Dh = 0, W = 0, start = 0, ratio = 4, k = 0, ring = 0, n_ckv = 0;
  CacheRowFormat rf, cf;
  std::vector<float> q, kv, rg, ckv, sink;
  std::vector<int32_t> topk, tn;
  std::unique_ptr<DeviceBuffer<uint8_t>> prg, pckv;

  AttnData(int64_t T_, int64_t H_, int64_t Dh_, int64_t W_, int64_t start_, int64_t k_, CacheRowFormat rf_,
           CacheRowFormat cf_, uint32_t seed)
      : T(T_), H(H_), Dh(Dh_), W(W_), start(start_), k(k_), ring(W_), rf(rf_), cf(cf_) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    q.resize(size_t(T * H * Dh));
    for (float& v : q) v = nd(g);
    kv = rows_of(f32_fmt(Dh), T, seed + 1, true);
    rg = rows_of(rf, ring, seed + 2, true);
    n_ckv = std::max<int64_t>(1, (start + T) / ratio);
    ckv = rows_of(cf, n_ckv, seed + 3, true);
    sink.resize(size_t(H));
    for (float& v : sink) v = 4.0f * nd(g);
    prg.reset(packed(rf, rg)), pckv.reset(packed(cf, ckv));
    if (k > 0) {
      topk.assign(size_t(T * k), 0), tn.assign(size_t(T), 0);
      std::vector<int32_t> all;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t vis = (start + t + 1) / ratio;
        all.resize(size_t(vis));
        for (int64_t i = 0; i < vis; ++i) all[size_t(i)] = int32_t(i);
        std::shuffle(all.begin(), all.end(), g);
        const int64_t cnt = std::min(k, vis);
        std::sort(all.begin(), all.begin() + cnt);
        std::copy(all.begin(), all.begin() + cnt, topk.begin() + t * k);
        tn[size_t(t)] = int32_t(cnt);
      }
    }
  }
  int64_t max_keys() const { return W + (k > 0 ? k : n_ckv); }
  // Key rows of query row t as the kernels order them (window oldest first, then compressed).
  std::vector<const float*> keys(int64_t t) const {
    const int64_t p = start + t;
    std::vector<const float*> ks;
    for (int64_t s = std::max<int64_t>(0, p - W + 1); s <= p; ++s)
      ks.push_back(s >= start ? kv.data() + (s - start) * Dh : rg.data() + (s % ring) * Dh);
    const int64_t nc = k > 0 ? tn[size_t(t)] : (p + 1) / ratio;
    for (int64_t i = 0; i < nc; ++i) ks.push_back(ckv.data() + (k > 0 ? int64_t(topk[size_t(t * k + i)]) : i) * Dh);
    return ks;
  }
};

// Runs the former kernel and the staged one with every cluster size on `d`; all outputs must be
// the same bits, and the host twin's on the rows `check` picks.
void expect_staged_is_former(const AttnData& d, bool bf16, int64_t max_keys, int64_t check_every) {
  DeviceBuffer<float> dq(d.q), dkv(d.kv), dsink(d.sink);
  std::unique_ptr<DeviceBuffer<int32_t>> dtk, dtn;
  if (d.k > 0) dtk = std::make_unique<DeviceBuffer<int32_t>>(d.topk), dtn = std::make_unique<DeviceBuffer<int32_t>>(d.tn);
  cd::ModelAttnArgs a;
  a.q = dq.get(), a.kv_chunk = dkv.get(), a.ring = d.prg->get(), a.ckv = d.pckv->get();
  a.ring_fmt = d.rf.compact() ? d.rf : CacheRowFormat{}, a.ckv_fmt = d.cf.compact() ? d.cf : CacheRowFormat{};
  a.topk = d.k > 0 ? dtk->get() : nullptr, a.topk_n = d.k > 0 ? dtn->get() : nullptr, a.topk_stride = d.k;
  a.ratio = d.ratio, a.sink = dsink.get(), a.T = d.T, a.H = d.H, a.Dh = d.Dh, a.window = d.W, a.ring_size = d.ring;
  a.start = d.start, a.max_keys = max_keys, a.scale = 1.0f / std::sqrt(float(d.Dh)), a.bf16 = bf16;
  const size_t n_out = size_t(d.T * d.H * d.Dh);
  DeviceBuffer<float> o1(n_out);
  a.out = o1.get(), a.kernel = 1;
  ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto former = o1.to_host();
  for (int cluster : {0, 1, 2, 8}) {
    DeviceBuffer<float> o2(n_out);
    ASSERT_EQ(cudaMemset(o2.get(), 0xff, n_out * 4), cudaSuccess);  // NaN: an unwritten output shows
    a.out = o2.get(), a.kernel = 2, a.cluster = cluster;
    ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess) << "cluster " << cluster;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "cluster " << cluster;
    const auto staged = o2.to_host();
    for (int64_t t = 0; t < d.T; ++t)
      ASSERT_EQ(std::memcmp(former.data() + t * d.H * d.Dh, staged.data() + t * d.H * d.Dh, size_t(d.H * d.Dh) * 4), 0)
          << "cluster " << cluster << " row " << t;
  }
  std::vector<float> ref(size_t(d.H * d.Dh));
  for (int64_t t = 0; t < d.T; ++t) {
    if (t % check_every != 0 && t != d.T - 1) continue;
    host_attention(d.q.data() + t * d.H * d.Dh, d.keys(t), d.H, d.Dh, d.sink.data(), a.scale, bf16, ref.data());
    ASSERT_EQ(std::memcmp(former.data() + t * d.H * d.Dh, ref.data(), ref.size() * 4), 0) << "host twin, row " << t;
  }
}

const CacheRowFormat kRingV41{RowCodec::kFp8E8m0, 512, 512, 32};  // 528 B
const CacheRowFormat kCkvV41{RowCodec::kFp4E4m3, 512, 512, 16};   // 288 B

TEST(CudaModelAttention, StagedKernelIsBitwiseTheFormerAtRealWidth) {
  FS_REQUIRE_GPU();
  struct Fmts {
    CacheRowFormat rf, cf;
  };
  const Fmts fmts[] = {{kRingV41, kCkvV41}, {f32_fmt(512), f32_fmt(512)}};
  for (const Fmts& f : fmts)
    for (int64_t T : {1, 6, 300})
      for (bool bf16 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "ring codec " << int(f.rf.codec) << " T " << T << " bf16 " << bf16);
        const AttnData d(T, 64, 512, 128, 4096, 512, f.rf, f.cf, 100 + uint32_t(T));
        expect_staged_is_former(d, bf16, d.max_keys(), T > 6 ? 37 : 1);
      }
}

TEST(CudaModelAttention, StagedKernelIsBitwiseTheFormerAtOddSizes) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t T, H, Dh, W, start, k;
    CacheRowFormat rf, cf;
  };
  const Case cases[] = {
      // BF16 tail (values 32..35) and E8M0 blocks of 16; FP4 with E4M3 blocks of 12
      {6, 3, 36, 5, 40, 7, {RowCodec::kFp8E8m0, 36, 32, 16}, {RowCodec::kFp4E4m3, 36, 36, 12}},
      // scale blocks of 6 (not a multiple of 4: value by value); a short window (positions 0..)
      {6, 3, 36, 9, 0, 3, {RowCodec::kFp8E8m0, 36, 36, 6}, {RowCodec::kFp4E8m0, 36, 36, 6}},
      // odd Dh: FP32 rows that are not 16-byte aligned; 5 heads (a group of 1)
      {5, 5, 37, 7, 100, 11, f32_fmt(37), f32_fmt(37)},
      // V4 rows: BF16 RoPE tail of 64, 67 keys (window 19 + 48 top-k)
      {3, 8, 512, 19, 500, 48, {RowCodec::kFp8E8m0, 512, 448, 64}, {RowCodec::kFp8E8m0, 512, 448, 64}},
  };
  for (const Case& c : cases)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "H " << c.H << " Dh " << c.Dh << " bf16 " << bf16);
      const AttnData d(c.T, c.H, c.Dh, c.W, c.start, c.k, c.rf, c.cf, 7 + uint32_t(c.Dh));
      expect_staged_is_former(d, bf16, d.max_keys(), 1);
    }
}

// V4 HCA layers attend to every visible compressed row: 128 + 1,500 .. 1,502 keys.
TEST(CudaModelAttention, StagedKernelIsBitwiseTheFormerWithoutTopk) {
  FS_REQUIRE_GPU();
  const CacheRowFormat f{RowCodec::kFp8E8m0, 512, 448, 64};
  for (bool bf16 : {false, true}) {
    AttnData d(3, 8, 512, 128, 3000, 0, f, f, 55);
    d.ratio = 2;  // n_ckv was sized for ratio 4: regenerate for 2
    d.n_ckv = (d.start + d.T) / d.ratio;
    d.ckv = rows_of(f, d.n_ckv, 56, true);
    d.pckv.reset(packed(f, d.ckv));
    expect_staged_is_former(d, bf16, d.max_keys(), 1);
  }
}

// A key bound whose staged layout does not fit in shared memory: kernel 2 refuses it, the default
// runs the former kernel.
TEST(CudaModelAttention, StagedKernelRefusesWhatDoesNotFitAndTheDefaultFallsBack) {
  FS_REQUIRE_GPU();
  const AttnData d(2, 4, 64, 8, 50, 4, f32_fmt(64), f32_fmt(64), 9);
  DeviceBuffer<float> dq(d.q), dkv(d.kv), dsink(d.sink), o(size_t(d.T * d.H * d.Dh)), o1(size_t(d.T * d.H * d.Dh));
  DeviceBuffer<int32_t> dtk(d.topk), dtn(d.tn);
  cd::ModelAttnArgs a;
  a.q = dq.get(), a.kv_chunk = dkv.get(), a.ring = d.prg->get(), a.ckv = d.pckv->get(), a.topk = dtk.get();
  a.topk_n = dtn.get(), a.topk_stride = d.k, a.ratio = d.ratio, a.sink = dsink.get(), a.T = d.T, a.H = d.H;
  a.Dh = d.Dh, a.window = d.W, a.ring_size = d.ring, a.start = d.start, a.max_keys = 13000;
  a.scale = 0.125f, a.out = o.get(), a.kernel = 2;
  EXPECT_EQ(cd::launch_model_attention(a, 0), cudaErrorInvalidValue);
  a.kernel = 0;
  ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess);
  a.kernel = 1, a.out = o1.get();
  ASSERT_EQ(cd::launch_model_attention(a, 0), cudaSuccess);
  const auto x = o.to_host(), y = o1.to_host();
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  a.kernel = 2, a.max_keys = d.max_keys(), a.Dh = 1100;  // beyond the short dot order
  EXPECT_EQ(cd::launch_model_attention(a, 0), cudaErrorInvalidValue);
  a.Dh = d.Dh, a.kernel = 3;  // no such kernel
  EXPECT_EQ(cd::launch_model_attention(a, 0), cudaErrorInvalidValue);
  a.kernel = 2, a.cluster = 3;  // no such cluster size
  EXPECT_EQ(cd::launch_model_attention(a, 0), cudaErrorInvalidValue);
}

// Several sequences in one launch (launch_model_attention_seqs): a full window at 4096, a short
// one at 50, one past 5000 and one with no compressed row yet (ckv nullptr), real width, compact
// rows: the staged kernel gives each row the former kernel's bits for its sequence alone.
TEST(CudaModelAttention, StagedSeqsLaunchIsBitwiseTheFormerPerSequence) {
  FS_REQUIRE_GPU();
  const int64_t H = 64, Dh = 512, W = 128, k = 512;
  struct S {
    int64_t T, start;
  };
  const S ss[] = {{1, 4096}, {6, 50}, {2, 5000}, {1, 2}};
  std::vector<std::unique_ptr<AttnData>> data;
  int64_t rows = 0, max_keys = 0;
  for (size_t i = 0; i < 4; ++i) {
    data.push_back(std::make_unique<AttnData>(ss[i].T, H, Dh, W, ss[i].start, k, kRingV41, kCkvV41, 70 + uint32_t(i)));
    rows += ss[i].T;
    max_keys = std::max(max_keys, data.back()->max_keys());
  }
  std::vector<float> q, kv;
  std::vector<int32_t> topk, tn, row_seq;
  std::vector<cd::ModelAttnSeq> seqs(4);
  for (size_t i = 0; i < 4; ++i) {
    const AttnData& d = *data[i];
    seqs[i].ring = d.prg->get(), seqs[i].ckv = i == 3 ? nullptr : d.pckv->get(), seqs[i].start = d.start;
    seqs[i].row0 = int64_t(row_seq.size()), seqs[i].T = d.T, seqs[i].ring_size = d.ring;
    q.insert(q.end(), d.q.begin(), d.q.end()), kv.insert(kv.end(), d.kv.begin(), d.kv.end());
    topk.insert(topk.end(), d.topk.begin(), d.topk.end()), tn.insert(tn.end(), d.tn.begin(), d.tn.end());
    row_seq.insert(row_seq.end(), size_t(d.T), int32_t(i));
  }
  ASSERT_EQ(tn.back(), 0);  // position 2, ratio 4: nothing compressed yet
  const std::vector<float> sink = data[0]->sink;
  DeviceBuffer<float> dq(q), dkv(kv), dsink(sink);
  DeviceBuffer<int32_t> dtk(topk), dtn(tn), drs(row_seq);
  DeviceBuffer<uint8_t> dseqs(seqs.size() * sizeof(cd::ModelAttnSeq));
  ASSERT_EQ(cudaMemcpy(dseqs.get(), seqs.data(), seqs.size() * sizeof(cd::ModelAttnSeq), cudaMemcpyHostToDevice),
            cudaSuccess);
  for (bool bf16 : {false, true}) {
    cd::ModelAttnArgs a;
    a.q = dq.get(), a.kv_chunk = dkv.get(), a.ckv = data[0]->pckv->get(), a.ring_fmt = kRingV41, a.ckv_fmt = kCkvV41;
    a.topk = dtk.get(), a.topk_n = dtn.get(), a.topk_stride = k, a.ratio = 4, a.sink = dsink.get();
    a.T = rows, a.H = H, a.Dh = Dh, a.window = W, a.max_keys = max_keys, a.scale = 1.0f / std::sqrt(float(Dh));
    a.bf16 = bf16;
    // The former kernel, one launch per sequence.
    DeviceBuffer<float> o1(size_t(rows * H * Dh));
    for (size_t i = 0; i < 4; ++i) {
      cd::ModelAttnArgs b = a;
      const int64_t r0 = seqs[i].row0;
      b.q = dq.get() + r0 * H * Dh, b.kv_chunk = dkv.get() + r0 * Dh, b.topk = dtk.get() + r0 * k, b.topk_n = dtn.get() + r0;
      b.out = o1.get() + r0 * H * Dh, b.ring = seqs[i].ring, b.ring_size = seqs[i].ring_size, b.start = seqs[i].start;
      b.ckv = i == 3 ? data[0]->pckv->get() : seqs[i].ckv;  // never read for sequence 3
      b.T = seqs[i].T, b.kernel = 1;
      ASSERT_EQ(cd::launch_model_attention(b, 0), cudaSuccess);
    }
    const auto former = o1.to_host();
    for (int cluster : {0, 1, 8}) {
      DeviceBuffer<float> o2(size_t(rows * H * Dh));
      a.out = o2.get(), a.kernel = 2, a.cluster = cluster;
      ASSERT_EQ(cd::launch_model_attention_seqs(a, reinterpret_cast<const cd::ModelAttnSeq*>(dseqs.get()), drs.get(), 0),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto staged = o2.to_host();
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(std::memcmp(former.data() + r * H * Dh, staged.data() + r * H * Dh, size_t(H * Dh) * 4), 0)
            << "bf16 " << bf16 << " cluster " << cluster << " row " << r;
    }
  }
}

}  // namespace
}  // namespace flashseek::ops::cuda
