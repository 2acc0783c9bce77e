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
// The tensor-core prefill path of the same attention (launch_model_prefill_attention,
// prefill_kernels.h) against the CPU op ops::sparse_attention within a derived bound
// (CudaModelPrefillAttention.*, below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "cache_rows_util.h"
#include "gpu_util.h"
#include "ops/attention.h"
#include "ops/cache_row.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/prefill_kernels.h"
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

// ---- the tensor-core prefill path (launch_model_prefill_attention) -------------------------
//
// Reference: the CPU op ops::sparse_attention over the same FP32 key rows (AttnData::keys: the
// window, then the top-k / every visible compressed row), BF16 probabilities and a BF16-rounded
// output when bf16 (as the model's kernels). The tensor-core path differs by
//   (1) BF16 inputs: q and the key rows rounded to BF16 (the compact rows are exact in BF16, the
//       chunk's FP32 rows and FP32 caches are not); this logit shift is computed exactly here in
//       double (d_in,j = scale·|Σ bf16(q)·bf16(k) − Σ q·k|) and the value shift
//       V_d = Σ_j w_j·|bf16(k_jd) − k_jd| as well;
//   (2) FP32 dot orders: both logits are FP32 sums of D products, each within
//       γ·Σ|terms| of the exact sum; γ = (D + 2)·2^-23 (twice the round-to-nearest γ_D, so that
//       a truncating tensor-core accumulation is covered): d_acc,j = scale·(A_j + Ã_j)·γ;
//   (3) BF16 probabilities of different values (online softmax: exp against a running max,
//       rescaled later): relative u = 2^-9 on each side's weight, 2u between them;
//   (4) P·V and the normalisation in FP32 in other orders: (n + 64)·2^-22 relative to Σ w|v|.
// With every logit off by at most d = max_j (d_in,j + d_acc,j) (the sink's term exact), each
// normalised weight moves by a factor within e^{±2d}; so per output d,
//   |got − ref| <= (S_d + V_d)·(e^{2d}·(1 + 2u)·(1 + 2^-20) − 1 + (n + 64)·2^-22) + V_d,
// S_d = Σ_j w_j·|k_jd| (exact weights), and with a BF16 output both sides round once more:
// E·(1 + u) + 2u·S_d. The test also shows that this bound sees a wrong key set: removing the
// heaviest key of a head must move some output of most heads past it.
constexpr double kU = 1.0 / 512;  // BF16 unit roundoff (round to nearest)

struct BoundStats {
  int64_t heads = 0, discriminating = 0;
  double worst = 0;  // max |got - ref| / bound
};

void expect_within_bound(const AttnData& d, int64_t t, const float* q, const float* got, const float* sink, bool bf16,
                         float scale, BoundStats* st) {
  const std::vector<const float*> keys = d.keys(t);
  const int64_t H = d.H, D = d.Dh, n = int64_t(keys.size());
  std::vector<float> ref(size_t(H * D));
  SparseAttnParams p;
  p.q = q, p.keys = keys.data(), p.n_keys = n, p.n_heads = H, p.head_dim = D, p.sink = sink, p.scale = scale;
  p.bf16_probs = bf16, p.out = ref.data();
  sparse_attention(p);
  if (bf16)
    for (float& v : ref) v = round_bf16(v);
  const double gamma = double(D + 2) * std::ldexp(1.0, -23);
  std::vector<double> l(static_cast<size_t>(n)), w(static_cast<size_t>(n));
  for (int64_t h = 0; h < H; ++h) {
    const float* qh = q + h * D;
    double dmax = 0, m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sb = 0, a = 0, ab = 0;
      for (int64_t i = 0; i < D; ++i) {
        const double x = double(qh[i]) * keys[size_t(j)][i];
        const double xb = double(round_bf16(qh[i])) * round_bf16(keys[size_t(j)][i]);
        s += x, sb += xb, a += std::fabs(x), ab += std::fabs(xb);
      }
      l[size_t(j)] = s * scale;
      dmax = std::max(dmax, double(scale) * (std::fabs(sb - s) + (a + ab) * gamma));
      m = std::max(m, l[size_t(j)]);
    }
    double den = std::exp(double(sink[h]) - m);
    for (int64_t j = 0; j < n; ++j) den += (w[size_t(j)] = std::exp(l[size_t(j)] - m));
    int64_t heavy = 0;
    for (int64_t j = 0; j < n; ++j) {
      w[size_t(j)] /= den;
      if (w[size_t(j)] > w[size_t(heavy)]) heavy = j;
    }
    const double f = std::exp(2 * dmax) * (1 + 2 * kU) * (1 + std::ldexp(1.0, -20)) - 1 + double(n + 64) * std::ldexp(1.0, -22);
    bool seen = false;
    for (int64_t dd = 0; dd < D; ++dd) {
      double S = 0, V = 0, exact = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float k = keys[size_t(j)][dd];
        S += w[size_t(j)] * std::fabs(k), V += w[size_t(j)] * std::fabs(double(round_bf16(k)) - k);
        exact += w[size_t(j)] * k;
      }
      double bound = (S + V) * f + V;
      if (bf16) bound = bound * (1 + kU) + 2 * kU * S;
      const double diff = std::fabs(double(got[h * D + dd]) - double(ref[size_t(h * D + dd)]));
      ASSERT_TRUE(std::isfinite(got[h * D + dd])) << "row " << t << " head " << h << " dim " << dd;
      ASSERT_LE(diff, bound) << "row " << t << " head " << h << " dim " << dd << ": got " << got[h * D + dd]
                             << " cpu " << ref[size_t(h * D + dd)];
      if (bound > 0) st->worst = std::max(st->worst, diff / bound);
      // Without the heaviest key (renormalised): outside the bound somewhere?
      const double wh = w[size_t(heavy)], without = (exact - wh * keys[size_t(heavy)][dd]) / (1 - wh);
      if (std::fabs(without - exact) > bound + std::fabs(double(ref[size_t(h * D + dd)]) - exact)) seen = true;
    }
    ++st->heads;
    st->discriminating += seen;
  }
}

// Runs the tensor-core path over the sequences `ds` (one launch; `no_ckv`: sequences whose
// compressed rows do not exist yet) and checks every `check_every`-th row of each (and its last).
void expect_prefill_path_within_bound(const std::vector<const AttnData*>& ds, const std::vector<bool>& no_ckv,
                                      const std::vector<float>& sink, bool bf16, int64_t check_every) {
  const AttnData& d0 = *ds[0];
  const int64_t H = d0.H, Dh = d0.Dh, k = d0.k;
  std::vector<float> q, kv;
  std::vector<int32_t> topk, tn;
  std::vector<cd::ModelAttnSeq> seqs;
  int64_t rows = 0;
  for (size_t i = 0; i < ds.size(); ++i) {
    const AttnData& d = *ds[i];
    cd::ModelAttnSeq s;
    s.ring = d.prg->get(), s.ckv = no_ckv[i] ? nullptr : d.pckv->get(), s.start = d.start, s.row0 = rows;
    s.T = d.T, s.ring_size = d.ring;
    seqs.push_back(s);
    q.insert(q.end(), d.q.begin(), d.q.end()), kv.insert(kv.end(), d.kv.begin(), d.kv.end());
    if (k > 0) {
      std::vector<int32_t> tk = d.topk;
      for (int64_t t = 0; t < d.T; ++t)  // the indexer's padding past the count
        for (int64_t j = d.tn[size_t(t)]; j < k; ++j) tk[size_t(t * k + j)] = -1;
      topk.insert(topk.end(), tk.begin(), tk.end()), tn.insert(tn.end(), d.tn.begin(), d.tn.end());
    }
    rows += d.T;
  }
  DeviceBuffer<float> dq(q), dkv(kv), dsink(sink), out(size_t(rows * H * Dh));
  std::unique_ptr<DeviceBuffer<int32_t>> dtk, dtn;
  if (k > 0) dtk = std::make_unique<DeviceBuffer<int32_t>>(topk), dtn = std::make_unique<DeviceBuffer<int32_t>>(tn);
  cd::ModelAttnArgs a;
  a.q = dq.get(), a.kv_chunk = dkv.get(), a.ckv = d0.pckv->get();
  a.ring_fmt = d0.rf.compact() ? d0.rf : CacheRowFormat{}, a.ckv_fmt = d0.cf.compact() ? d0.cf : CacheRowFormat{};
  a.topk = k > 0 ? dtk->get() : nullptr, a.topk_n = k > 0 ? dtn->get() : nullptr, a.topk_stride = k;
  a.ratio = d0.ratio, a.sink = dsink.get(), a.out = out.get(), a.T = rows, a.H = H, a.Dh = Dh, a.window = d0.W;
  a.scale = 1.0f / std::sqrt(float(Dh)), a.bf16 = bf16;
  ASSERT_TRUE(cd::model_prefill_attn_supports(a));
  int64_t pool_rows = 0, n_idx = 0;
  const size_t ws_bytes = cd::model_prefill_attn_workspace(a, seqs.data(), int64_t(seqs.size()), &pool_rows, &n_idx);
  ASSERT_GT(ws_bytes, 0u);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  ASSERT_EQ(cd::launch_model_prefill_attention(a, seqs.data(), int64_t(seqs.size()), ws.get(), ws_bytes - 1, 0),
            cudaErrorInvalidValue);  // a workspace one byte short
  ASSERT_EQ(cd::launch_model_prefill_attention(a, seqs.data(), int64_t(seqs.size()), ws.get(), ws_bytes, 0),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = out.to_host();
  BoundStats st;
  for (size_t i = 0; i < ds.size(); ++i) {
    const AttnData& d = *ds[i];
    if (no_ckv[i]) {  // its lists must be empty: the reference reads no compressed row either
      for (int32_t c : d.tn) ASSERT_EQ(c, 0);
    }
    for (int64_t t = 0; t < d.T; ++t) {
      if (t % check_every != 0 && t != d.T - 1) continue;
      const int64_t r = seqs[i].row0 + t;
      expect_within_bound(d, t, d.q.data() + t * H * Dh, got.data() + r * H * Dh, sink.data(), bf16, a.scale, &st);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("[prefill-attn] H %lld Dh %lld bf16 %d: %lld rows, pool %lld rows, %lld key slots; worst |diff|/bound "
              "%.3g; heaviest key visible past the bound in %lld of %lld heads\n",
              (long long)H, (long long)Dh, int(bf16), (long long)rows, (long long)pool_rows, (long long)n_idx, st.worst,
              (long long)st.discriminating, (long long)st.heads);
  EXPECT_GE(2 * st.discriminating, st.heads) << "the bound is too loose to see a missing key";
}

// Queries of a model scale (logits with a standard deviation of about 2: a few keys carry most of
// the weight) and sinks that are negligible, comparable or dominant by head.
void prefill_inputs(AttnData& d) {
  for (float& v : d.q) v *= 10.0f;
  for (int64_t h = 0; h < d.H; ++h) d.sink[size_t(h)] = h % 3 == 0 ? 8.0f : h % 3 == 1 ? 2.0f : -20.0f;
}

// The real V4.1 width (64 heads x 512, window 128, top-512 of FP4 compressed rows, e4m3 ring
// rows), a 301-row chunk at position 4096 and at 50 (a partial window, lists shorter than 512:
// -1 padding), and a first chunk at 0 (rows with 1 .. 77 window keys, no compressed row for the
// first 3); BF16 on and off.
TEST(CudaModelPrefillAttention, WithinTheBoundOfTheCpuOpAtRealWidth) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t T, start;
  };
  for (const Case& c : {Case{301, 4096}, Case{133, 50}, Case{77, 0}})
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T " << c.T << " start " << c.start << " bf16 " << bf16);
      AttnData d(c.T, 64, 512, 128, c.start, 512, kRingV41, kCkvV41, 900 + uint32_t(c.T));
      prefill_inputs(d);
      expect_prefill_path_within_bound({&d}, {false}, d.sink, bf16, c.T > 100 ? 37 : 5);
    }
}

// Odd shapes: the tiny checkpoints' (16 heads x 128 with the V4 HCA path: every visible compressed
// row, ratio 2, and a BF16 tail; 4 heads x 64, window 8, top-4), 80 heads x 256 (a second block
// of 16 heads), FP32 ring and compressed rows (rounded to BF16 on the way), a ring longer than
// the window, odd chunk lengths.
TEST(CudaModelPrefillAttention, WithinTheBoundOfTheCpuOpAtOddShapes) {
  FS_REQUIRE_GPU();
  struct Case {
    int64_t T, H, Dh, W, start, k, ring_extra, ratio;
    CacheRowFormat rf, cf;
  };
  const Case cases[] = {
      {70, 16, 128, 128, 3000, 0, 0, 2, {RowCodec::kFp8E8m0, 128, 64, 32}, {RowCodec::kFp8E8m0, 128, 64, 32}},
      {97, 4, 64, 8, 41, 4, 3, 4, {RowCodec::kFp8E8m0, 64, 48, 16}, {RowCodec::kFp4E4m3, 64, 64, 16}},
      {33, 80, 256, 19, 500, 48, 5, 4, f32_fmt(256), f32_fmt(256)},
      {65, 16, 128, 8, 0, 4, 0, 4, {RowCodec::kFp8E8m0, 128, 64, 32}, {RowCodec::kFp4E4m3, 128, 128, 16}},
  };
  for (const Case& c : cases)
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "T " << c.T << " H " << c.H << " Dh " << c.Dh << " k " << c.k << " bf16 "
                                        << bf16);
      AttnData d(c.T, c.H, c.Dh, c.W, c.start, c.k, c.rf, c.cf, 40 + uint32_t(c.Dh + c.H), c.ring_extra);
      if (c.ratio != d.ratio) {  // n_ckv was sized for ratio 4: regenerate
        d.ratio = c.ratio;
        d.n_ckv = std::max<int64_t>(1, (d.start + d.T) / d.ratio);
        d.ckv = rows_of(c.cf, d.n_ckv, 41);
        d.pckv.reset(packed(c.cf, d.ckv));
      }
      prefill_inputs(d);
      expect_prefill_path_within_bound({&d}, {false}, d.sink, bf16, 7);
    }
}

// Several sequences in one launch (a chunk of a 4096-deep sequence, one at 50, and positions 1-2,
// which see no compressed row yet: ratio 4 makes the first one visible at position 3): each row
// against the CPU op over its own sequence's keys.
TEST(CudaModelPrefillAttention, SeveralSequencesWithinTheBound) {
  FS_REQUIRE_GPU();
  AttnData a(100, 64, 512, 128, 4096, 512, kRingV41, kCkvV41, 71), b(37, 64, 512, 128, 50, 512, kRingV41, kCkvV41, 72),
      c(2, 64, 512, 128, 1, 512, kRingV41, kCkvV41, 73);
  for (AttnData* d : {&a, &b, &c}) prefill_inputs(*d);
  expect_prefill_path_within_bound({&a, &b, &c}, {false, false, true}, a.sink, true, 9);
}

// Shapes the kernel does not have (head dims other than 64 / 128 / 256 / 512) and malformed
// sequence lists are refused; the model runs the staged kernel for them (gpu_ops.cpp).
TEST(CudaModelPrefillAttention, RefusesWhatItDoesNotRun) {
  FS_REQUIRE_GPU();
  const AttnData d(4, 3, 64, 8, 20, 4, f32_fmt(64), f32_fmt(64), 5);
  DeviceBuffer<float> dq(d.q), dkv(d.kv), dsink(d.sink), o(size_t(d.T * d.H * d.Dh));
  DeviceBuffer<int32_t> dtk(d.topk), dtn(d.tn);
  cd::ModelAttnArgs a;
  a.q = dq.get(), a.kv_chunk = dkv.get(), a.ckv = d.pckv->get(), a.topk = dtk.get(), a.topk_n = dtn.get();
  a.topk_stride = d.k, a.ratio = d.ratio, a.sink = dsink.get(), a.out = o.get(), a.T = d.T, a.H = d.H, a.Dh = d.Dh;
  a.window = d.W, a.scale = 0.125f;
  cd::ModelAttnSeq s;
  s.ring = d.prg->get(), s.ckv = d.pckv->get(), s.start = d.start, s.T = d.T, s.ring_size = d.ring;
  const size_t ws_bytes = cd::model_prefill_attn_workspace(a, &s, 1);
  ASSERT_GT(ws_bytes, 0u);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  EXPECT_EQ(cd::launch_model_prefill_attention(a, &s, 1, ws.get(), ws_bytes, 0), cudaSuccess);
  for (int64_t dh : {36, 37, 100, 1024}) {
    cd::ModelAttnArgs b = a;
    b.Dh = dh;
    EXPECT_FALSE(cd::model_prefill_attn_supports(b)) << dh;
    EXPECT_EQ(cd::launch_model_prefill_attention(b, &s, 1, ws.get(), ws_bytes, 0), cudaErrorInvalidValue) << dh;
  }
  cd::ModelAttnSeq bad = s;
  bad.T = d.T + 1;  // rows do not add up to a.T
  EXPECT_EQ(cd::model_prefill_attn_workspace(a, &bad, 1), 0u);
  EXPECT_EQ(cd::launch_model_prefill_attention(a, &bad, 1, ws.get(), ws_bytes, 0), cudaErrorInvalidValue);
  bad = s, bad.ring_size = d.W - 1;  // a ring shorter than the window
  EXPECT_EQ(cd::model_prefill_attn_workspace(a, &bad, 1), 0u);
  cd::ModelAttnArgs hca = a;
  hca.topk = nullptr, hca.topk_n = nullptr, hca.ratio = 0;  // every visible row needs the ratio
  EXPECT_EQ(cd::model_prefill_attn_workspace(hca, &s, 1), 0u);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace flashseek::ops::cuda
