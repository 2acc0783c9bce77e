// The model attention kernels (ops/cuda/attention/model_attn.cu): the staged kernel
// (ModelAttnArgs::kernel 2) bitwise against the former kernel (kernel 1, whose bits it must keep)
// and against the host twin below, at the real V4.1 width (H 64, Dh 512, window 128, top-512 of
// the compressed rows at positions >= 4096), in the compact formats and FP32, BF16 on and off,
// T = 1, 6 and a 300-row prefill chunk, every cluster size, odd sizes (H 3 / 5, Dh 36 / 37: BF16
// tails, scale blocks that are not multiples of 4, unaligned FP32 rows, key counts that are no
// multiple of a chunk), the V4 HCA path without top-k (every visible compressed row: 1,628 keys),
// several sequences per launch, and the fallback where the staged layout does not fit; every
// P·V split of the staged kernel (4 / 2 / 1 dims per thread, 1 / 2 / 4 items: Dh 64, 100, 200,
// 512, 1024 over clusters of 1 to 8), rings longer than the window (wrap-around at another
// modulus), FP4 rows with E8M0 scales, and rows with fewer keys than a cluster has blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "cache_rows_util.h"
#include "gpu_util.h"
#include "ops/cache_row.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/linear.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;

// n rows of format f holding values the row format represents exactly: normal values times a
// per-block magnitude (0, 1e-3, 1 or 4), quantised as the model's flow quantises them.
std::vector<float> rows_of(const CacheRowFormat& f, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float mags[] = {0.0f, 1e-3f, 1.0f, 4.0f};
  std::vector<float> x(size_t(n * f.dim));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b0 = 0; b0 < f.dim; b0 += f.block) {
      const float m = mags[g() % 4];
      for (int64_t i = b0; i < std::min<int64_t>(f.dim, b0 + f.block); ++i) x[size_t(r * f.dim + i)] = nd(g) * m;
    }
  testing::quantise_cache_rows(f, x.data(), n);
  return x;
}

// The rows packed on the host (ops::pack_cache_rows) into a device buffer.
DeviceBuffer<uint8_t>* packed(const CacheRowFormat& f, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size()) / f.dim;
  std::vector<uint8_t> h(size_t(n * f.row_bytes()));
  EXPECT_TRUE(pack_cache_rows(f, x.data(), n, h.data()).ok());
  return new DeviceBuffer<uint8_t>(h);
}

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

  // ring_extra: ring slots beyond the window (the model's rings hold a speculative block more).
  AttnData(int64_t T_, int64_t H_, int64_t Dh_, int64_t W_, int64_t start_, int64_t k_, CacheRowFormat rf_,
           CacheRowFormat cf_, uint32_t seed, int64_t ring_extra = 0)
      : T(T_), H(H_), Dh(Dh_), W(W_), start(start_), k(k_), ring(W_ + ring_extra), rf(rf_), cf(cf_) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    q.resize(size_t(T * H * Dh));
    for (float& v : q) v = nd(g);
    kv = rows_of(f32_fmt(Dh), T, seed + 1);
    rg = rows_of(rf, ring, seed + 2);
    n_ckv = std::max<int64_t>(1, (start + T) / ratio);
    ckv = rows_of(cf, n_ckv, seed + 3);
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
  for (int cluster : {0, 1, 2, 4, 8}) {
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

// Every P·V split of the staged kernel: a block's slice of q quads gives 4 * q (head, quad) items,
// run as 4, 2 or 1 dims per thread and 1, 2 or 4 items per thread (Dh 1024 in one block: 4 x 4,
// cluster 2: 4 x 2, 4: 4 x 1, 8: 2 x 1; Dh 200 alone: 2 x 2; Dh 100 alone: 1 x 2; Dh 64: 1 x 1),
// with rings longer than the window (slots = window + 7 / 5 / 3: the wrap at another modulus),
// BF16 tails, FP4 rows with E8M0 scales in blocks of 20 (one 2-byte load per quad), and a first
// chunk at position 0 whose rows have 1 and 2 keys (most of a cluster's blocks have none).
TEST(CudaModelAttention, StagedKernelIsBitwiseTheFormerOnEveryOutputSplit) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t T, H, Dh, W, start, k, ring_extra;
    CacheRowFormat rf, cf;
  };
  const Case cases[] = {
      {3, 5, 100, 20, 300, 40, 7, {RowCodec::kFp8E8m0, 100, 96, 32}, {RowCodec::kFp4E8m0, 100, 100, 20}},
      {2, 4, 200, 33, 1000, 64, 5, {RowCodec::kFp8E8m0, 200, 200, 8}, {RowCodec::kFp4E4m3, 200, 200, 8}},
      {2, 4, 1024, 64, 2000, 96, 3, {RowCodec::kFp8E8m0, 1024, 1024, 128}, {RowCodec::kFp4E4m3, 1024, 1024, 16}},
      {2, 4, 1024, 64, 2000, 96, 3, f32_fmt(1024), f32_fmt(1024)},
      {2, 4, 64, 4, 0, 3, 0, {RowCodec::kFp8E8m0, 64, 64, 32}, {RowCodec::kFp4E4m3, 64, 64, 16}},
  };
  for (const Case& c : cases)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "H " << c.H << " Dh " << c.Dh << " ring codec " << int(c.rf.codec)
                                        << " bf16 " << bf16);
      const AttnData d(c.T, c.H, c.Dh, c.W, c.start, c.k, c.rf, c.cf, 300 + uint32_t(c.Dh), c.ring_extra);
      if (c.start == 0) {  // one key: seven of a cluster of 8 blocks hold none
        ASSERT_EQ(d.keys(0).size(), 1u);
      }
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
    d.ckv = rows_of(f, d.n_ckv, 56);
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
