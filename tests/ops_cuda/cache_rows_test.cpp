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

#include "core/numeric.h"
#include "cache_rows_util.h"
#include "gpu_util.h"
#include "ops/cache_row.h"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/indexer.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;

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
  testing::quantise_cache_rows(f, x.data(), rows);
  return x;
}

const CacheRowFormat kFormats[] = {
    {RowCodec::kFp8E8m0, 512, 512, 32},  // V4.1 window ring
    {RowCodec::kFp4E4m3, 512, 512, 16},  // V4.1 compressed KV
    {RowCodec::kFp4E8m0, 128, 128, 32},  // index keys
    {RowCodec::kFp4E8m0, 512, 512, 32},  // FP4 / E8M0 at 512
    {RowCodec::kFp8E8m0, 512, 448, 64},  // V4 ring / compressed KV (BF16 RoPE tail)
    {RowCodec::kFp8E8m0, 128, 64, 64},   // tiny-v4
    {RowCodec::kFp4E4m3, 64, 64, 16},    // tiny-v41
    {RowCodec::kF32, 72, 0, 1},          // exact numerics
    {RowCodec::kF32, 512, 0, 1},
    // Odd shapes: tails that are no multiple of the block, blocks that do not divide a warp (lanes
    // striding over a block, lanes with no value), blocks of several values per lane.
    {RowCodec::kFp8E8m0, 36, 32, 32},    // tail of 4, row padding
    {RowCodec::kFp8E8m0, 100, 64, 32},   // tail of 36
    {RowCodec::kFp8E8m0, 100, 96, 48},   // block of 48 (two values on lanes 0..15)
    {RowCodec::kFp8E8m0, 45, 42, 3},     // odd block and codes, odd tail offset
    {RowCodec::kFp4E4m3, 100, 100, 20},  // FP4 block of 20 (lanes 20..31 idle)
    {RowCodec::kFp4E8m0, 36, 36, 4},     // eight blocks per warp
    {RowCodec::kFp8E8m0, 512, 512, 128}, // four values per lane
    {RowCodec::kF32, 36, 0, 1},
};

std::string name_of(const CacheRowFormat& f) {
  return "codec " + std::to_string(int(f.codec)) + " dim " + std::to_string(f.dim) + " coded " +
         std::to_string(f.coded) + " block " + std::to_string(f.block);
}

// The device packer's rules on the host, for every input (ops/cuda/cache/cache_rows.h): a block
// some candidate scale fits is packed as ops::pack_cache_rows packs it; any other block (a value
// off every candidate's grid, NaN, ±inf) is written with the first valid E4M3 candidate (else
// amax / 6 rounded and clamped) or the smallest power-of-two candidate, and counted; a tail value
// is its upper 16 bits, counted when the lower 16 are not zero; padding is zero. *bad_rows[r]: the
// count of row r.
int dev_frexp_exp(float v) {  // CUDA's frexpf stores 0 for ±inf and NaN
  int e = 0;
  if (std::isfinite(v)) std::frexp(v, &e);
  return e;
}
float model_pow2_at_least(float v) {  // cache_pack.cu pow2_at_least (frexpf(inf) is inf, exponent 0)
  int e = 0;
  const float m = std::isfinite(v) ? std::frexp(v, &e) : v;
  return std::ldexp(1.0f, std::clamp(m == 0.5f ? e - 1 : e, -127, 127));
}
uint8_t enc(RowCodec c, float q) { return c == RowCodec::kFp8E8m0 ? f32_to_e4m3(q) : f32_to_e2m1(q); }
float dec(RowCodec c, uint8_t code) { return c == RowCodec::kFp8E8m0 ? e4m3_to_f32(code) : e2m1_to_f32(code); }
bool fits(RowCodec c, const float* x, int64_t n, float s) {
  if (!(s > 0.0f) || std::isinf(s)) return false;
  for (int64_t i = 0; i < n; ++i)
    if (std::bit_cast<uint32_t>(dec(c, enc(c, x[i] / s)) * s) != std::bit_cast<uint32_t>(x[i])) return false;
  return true;
}
std::vector<uint8_t> model_pack(const CacheRowFormat& f, const std::vector<float>& x, std::vector<int>* bad_rows) {
  const int64_t n = int64_t(x.size()) / f.dim, rb = f.compact() ? f.row_bytes() : 4 * f.dim;
  std::vector<uint8_t> out(size_t(n * rb), 0);
  bad_rows->assign(size_t(n), 0);
  if (!f.compact()) {
    std::memcpy(out.data(), x.data(), x.size() * 4);
    return out;
  }
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = out.data() + r * rb;
    for (int64_t b = 0; b < f.scales(); ++b) {
      const float* xb = x.data() + r * f.dim + b * f.block;
      float amax = 0;
      bool finite = true;
      for (int64_t i = 0; i < f.block; ++i) {
        finite = finite && std::isfinite(xb[i]);
        if (!std::isnan(xb[i])) amax = std::max(amax, std::fabs(xb[i]));
      }
      float s = 0;
      bool ok = false;
      uint8_t sbyte;
      if (f.codec == RowCodec::kFp4E4m3) {
        if (amax == 0.0f && finite) s = 0.001953125f, ok = true;
        for (const float c : {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f}) {
          if (!finite || ok) break;
          const float cs = amax / c;
          if (!(cs <= 448.0f) || round_e4m3(cs) != cs) continue;
          if (s == 0) s = cs;
          if (fits(f.codec, xb, f.block, cs)) s = cs, ok = true;
        }
        if (s == 0) s = round_e4m3(std::min(std::max(amax / 6.0f, 0.001953125f), 448.0f));
        sbyte = f32_to_e4m3(s);
      } else {
        const float top = f.codec == RowCodec::kFp8E8m0 ? 448.0f : 6.0f;
        const float s0 = amax == 0.0f ? std::ldexp(1.0f, -127) : model_pow2_at_least(amax / top);
        s = s0;
        for (int k = 0; k < 2 && finite && !ok; ++k) {
          const float cs = std::ldexp(s0, k);
          if (cs > std::ldexp(1.0f, 127)) break;
          if (fits(f.codec, xb, f.block, cs)) s = cs, ok = true;
        }
        sbyte = uint8_t(dev_frexp_exp(s) - 1 + 127);
      }
      (*bad_rows)[size_t(r)] += !ok;
      row[f.scale_offset() + b] = sbyte;
      for (int64_t i = 0; i < f.block; ++i) {
        const int64_t d = b * f.block + i;
        const uint8_t c = enc(f.codec, xb[i] / s);
        if (f.fp4()) row[d / 2] |= uint8_t((c & 15u) << (4 * (d % 2)));
        else row[d] = c;
      }
    }
    for (int64_t t = 0; t < f.tail_dims(); ++t) {
      const uint32_t bits = std::bit_cast<uint32_t>(x[size_t(r * f.dim + f.coded + t)]);
      (*bad_rows)[size_t(r)] += (bits & 0xffffu) != 0;
      row[f.tail_offset() + 2 * t] = uint8_t(bits >> 16), row[f.tail_offset() + 2 * t + 1] = uint8_t(bits >> 24);
    }
  }
  return out;
}

// Quantised rows with hostile blocks mixed in: NaN (quiet, both signs), ±inf, values one ulp off
// the grid, unquantised normals from 1e-42 to 3e38, blocks of zeros with one NaN, FLT_MAX; tail
// values BF16 or not (quiet NaN with a zero low half is a BF16 value to both packers). A third of
// the rows stay as quantised.
std::vector<float> hostile_rows(const CacheRowFormat& f, int64_t rows, uint32_t seed) {
  std::vector<float> x = rows_of(f, rows, seed);
  std::mt19937 g(seed * 7 + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float qnan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float mags[] = {1e-42f, 1e-30f, 1e-3f, 1.0f, 1e5f, 1e30f, 3e38f};
  for (int64_t r = 0; r < rows; ++r) {
    if (g() % 3 == 0) continue;  // a third of the rows stay quantised
    float* row = x.data() + r * f.dim;
    const int64_t nb = f.compact() ? f.scales() : 1, bl = f.compact() ? f.block : f.dim;
    for (int64_t b = 0; b < nb; ++b) {
      float* xb = row + b * bl;
      const int64_t i = int64_t(g() % uint32_t(bl));
      switch (g() % 10) {
        case 0: xb[i] = g() % 2 ? qnan : -qnan; break;
        case 1: xb[i] = g() % 2 ? inf : -inf; break;
        case 2: xb[i] = std::nextafter(xb[i] == 0.0f ? 1.0f : xb[i], inf); break;
        case 3: {
          const float m = mags[g() % 7];
          for (int64_t j = 0; j < bl; ++j) xb[j] = nd(g) * m;
          break;
        }
        case 4:
          for (int64_t j = 0; j < bl; ++j) xb[j] = g() % 2 ? 0.0f : -0.0f;
          xb[i] = qnan;
          break;
        case 5: xb[i] = std::numeric_limits<float>::max(); break;
        default: break;  // stays quantised
      }
    }
    for (int64_t t = f.coded; f.compact() && t < f.dim; ++t) {
      const uint32_t k = g() % 6;
      if (k == 0) row[t] = nd(g);                           // not BF16
      else if (k == 1) row[t] = std::bit_cast<float>(0x7fc00000u);  // quiet NaN, BF16
      else if (k == 2) row[t] = -inf;
    }
  }
  return x;
}

// The model is the host twin where the host twin is defined: a row the host packs is the same
// bytes, and a row the host refuses is a row the device counts (NaN, inf, off-grid, not BF16).
TEST(CacheRowsModel, IsTheHostPackWhereTheHostPacksAndCountsWhatTheHostRefuses) {
  for (const CacheRowFormat& f : kFormats) {
    for (const int64_t n : {1, 300}) {  // the quantised rows of the GPU test: all pack, the model's bytes
      const std::vector<float> q = rows_of(f, n, 5 + uint32_t(f.dim) + uint32_t(n));
      std::vector<uint8_t> h(size_t(n * (f.compact() ? f.row_bytes() : 4 * f.dim)));
      ASSERT_TRUE(pack_cache_rows(f, q.data(), n, h.data()).ok()) << name_of(f);
      std::vector<int> bad_rows;
      EXPECT_EQ(model_pack(f, q, &bad_rows), h) << name_of(f);
      for (int b : bad_rows) EXPECT_EQ(b, 0) << name_of(f);
    }
    const int64_t rb = f.compact() ? f.row_bytes() : 4 * f.dim;
    const std::vector<float> x = hostile_rows(f, 120, 3 + uint32_t(f.dim) + uint32_t(f.block));
    std::vector<int> bad_rows;
    const std::vector<uint8_t> m = model_pack(f, x, &bad_rows);
    int accepted = 0, refused = 0;
    for (int64_t r = 0; r < 120; ++r) {
      std::vector<uint8_t> h(static_cast<size_t>(rb));
      const bool ok = pack_cache_rows(f, x.data() + r * f.dim, 1, h.data()).ok();
      if (!f.compact()) {
        EXPECT_TRUE(ok);
        EXPECT_EQ(bad_rows[size_t(r)], 0);
      } else {
        EXPECT_EQ(ok, bad_rows[size_t(r)] == 0) << name_of(f) << " row " << r;
      }
      if (ok) {
        ++accepted;
        EXPECT_EQ(std::memcmp(h.data(), m.data() + r * rb, size_t(rb)), 0) << name_of(f) << " row " << r;
      } else {
        ++refused;
      }
    }
    EXPECT_GT(accepted, 0) << name_of(f);
    if (f.compact()) {
      EXPECT_GT(refused, 0) << name_of(f);
    }
  }
}

// Quantised rows (what the model writes) of every codec and shape, 1 and 300 rows: the device
// bytes are the host twin's (also when packed to a table of row addresses), they unpack to the
// input bits, and nothing is counted; one value one ulp off its grid in 3 rows (and a non-BF16
// tail value) is counted once each.
TEST(CudaCacheRows, PackAndUnpackMatchTheHost) {
  FS_REQUIRE_GPU();
  for (const CacheRowFormat& f : kFormats) {
    for (const int64_t n : {1, 300}) {
      const std::string at = name_of(f) + " rows " + std::to_string(n);
      const int64_t rb = f.row_bytes();
      const std::vector<float> x = rows_of(f, n, 5 + uint32_t(f.dim) + uint32_t(n));
      std::vector<uint8_t> host(size_t(n * rb));
      ASSERT_TRUE(pack_cache_rows(f, x.data(), n, host.data()).ok()) << at;
      DeviceBuffer<float> dx(x), dback(x.size());
      DeviceBuffer<uint8_t> dpk(host.size());
      ASSERT_EQ(cudaMemset(dpk.get(), 0xab, host.size()), cudaSuccess);  // padding must be written
      DeviceBuffer<int> dbad(std::vector<int>{0});
      ASSERT_EQ(cd::launch_cache_pack_rows(f, dx.get(), n, dpk.get(), dbad.get(), 0), cudaSuccess) << at;
      ASSERT_EQ(cd::launch_cache_unpack_rows(f, dpk.get(), n, dback.get(), 0), cudaSuccess) << at;
      EXPECT_EQ(dbad.to_host()[0], 0) << at;
      EXPECT_EQ(dpk.to_host(), host) << at << ": device bytes differ from the host pack";
      {  // the same rows packed to a table of permuted row addresses with gaps: each the host's bytes
        DeviceBuffer<uint8_t> spread(size_t(3 * n * rb));
        auto slot = [&](int64_t r) { return ((r * 7) % n * 3 + 1) * rb; };  // 7 is prime to n
        std::vector<uint8_t*> addr;
        for (int64_t r = 0; r < n; ++r) addr.push_back(spread.get() + slot(r));
        DeviceBuffer<uint8_t*> daddr(addr);
        ASSERT_EQ(cd::launch_cache_pack_rows_table(f, dx.get(), n, daddr.get(), nullptr, 0), cudaSuccess) << at;
        const auto b = spread.to_host();
        for (int64_t r = 0; r < n; ++r) {
          ASSERT_EQ(std::memcmp(host.data() + r * rb, b.data() + slot(r), size_t(rb)), 0) << at << " row " << r;
          ASSERT_EQ(b[size_t(slot(r) - 1)], 0xFF) << at << ": wrote before row " << r;  // gaps untouched
        }
        EXPECT_EQ(cd::launch_cache_pack_rows_table(f, dx.get(), n, nullptr, nullptr, 0), cudaErrorInvalidValue) << at;
      }
      const auto back = dback.to_host();
      ASSERT_EQ(std::memcmp(back.data(), x.data(), x.size() * 4), 0) << at << ": unpack is not the input";
      if (!f.compact()) continue;
      std::vector<float> bad = x;
      const std::vector<int64_t> hit = n == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{1, 50, 299};
      for (int64_t r : hit) {
        float& v = bad[size_t(r * f.dim + 7)];
        v = std::nextafter(v == 0.0f ? 1.0f : v, std::numeric_limits<float>::infinity());
      }
      if (f.tail_dims() > 0) bad[size_t((n - 1) * f.dim + f.dim - 1)] = 1.0f + 1.0f / 1024.0f;
      DeviceBuffer<float> dbx(bad);
      DeviceBuffer<int> dbad2(std::vector<int>{0});
      ASSERT_EQ(cd::launch_cache_pack_rows(f, dbx.get(), n, dpk.get(), dbad2.get(), 0), cudaSuccess) << at;
      EXPECT_EQ(dbad2.to_host()[0], int(hit.size()) + (f.tail_dims() > 0 ? 1 : 0)) << at;
    }
  }
}

// Hostile rows (NaN, ±inf, off-grid, huge, tiny, zeros with a NaN, tails that are and are not
// BF16): the device writes the bytes of the device rules (model_pack: the host twin's bytes for
// every representable block) and counts exactly the blocks and tail values the host refuses.
TEST(CudaCacheRows, HostileRowsGiveTheModelsBytesAndCount) {
  FS_REQUIRE_GPU();
  for (const CacheRowFormat& f : kFormats) {
    for (const int64_t n : {1, 300}) {
      const std::string at = name_of(f) + " rows " + std::to_string(n);
      const std::vector<float> x = hostile_rows(f, n, 40 + uint32_t(f.dim) + uint32_t(n));
      std::vector<int> bad_rows;
      const std::vector<uint8_t> want = model_pack(f, x, &bad_rows);
      int want_bad = 0;
      for (int b : bad_rows) want_bad += b;
      DeviceBuffer<float> dx(x);
      DeviceBuffer<uint8_t> dpk(want.size());
      ASSERT_EQ(cudaMemset(dpk.get(), 0xab, want.size()), cudaSuccess);
      DeviceBuffer<int> dbad(std::vector<int>{0});
      ASSERT_EQ(cd::launch_cache_pack_rows(f, dx.get(), n, dpk.get(), dbad.get(), 0), cudaSuccess) << at;
      const std::vector<uint8_t> got = dpk.to_host();
      EXPECT_EQ(dbad.to_host()[0], want_bad) << at;
      const int64_t rb = int64_t(want.size()) / n;
      for (int64_t r = 0; r < n; ++r)
        EXPECT_EQ(std::memcmp(got.data() + r * rb, want.data() + r * rb, size_t(rb)), 0) << at << " row " << r;
    }
  }
}

// A FP4 / E4M3 block of zeros and one NaN is not representable (the host refuses it): counted,
// written with the all-zero block's scale 2^-9. (The former kernel took it for an all-zero block
// and did not count it.)
TEST(CudaCacheRows, ZerosAndNanInAnE4m3BlockAreCounted) {
  FS_REQUIRE_GPU();
  const CacheRowFormat f{RowCodec::kFp4E4m3, 32, 32, 16};
  std::vector<float> x(32, 0.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> h(size_t(f.row_bytes()));
  EXPECT_FALSE(pack_cache_rows(f, x.data(), 1, h.data()).ok());
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> dpk(size_t(f.row_bytes()));
  DeviceBuffer<int> dbad(std::vector<int>{0});
  ASSERT_EQ(cd::launch_cache_pack_rows(f, dx.get(), 1, dpk.get(), dbad.get(), 0), cudaSuccess);
  EXPECT_EQ(dbad.to_host()[0], 1);
  const auto got = dpk.to_host();
  EXPECT_EQ(got[size_t(f.scale_offset())], f32_to_e4m3(0.001953125f));
  EXPECT_EQ(got[size_t(f.scale_offset() + 1)], f32_to_e4m3(0.001953125f));
}

// Formats ops::validate_row_format refuses are refused by the launchers, not run.
TEST(CudaCacheRows, InvalidFormatsAreRefused) {
  FS_REQUIRE_GPU();
  DeviceBuffer<float> dx(size_t(64));
  DeviceBuffer<uint8_t> dpk(size_t(512));
  DeviceBuffer<int64_t> dpos(std::vector<int64_t>{0});
  const CacheRowFormat invalid[] = {
      {RowCodec::kFp8E8m0, 64, 64, 0},   // no block
      {RowCodec::kFp8E8m0, 64, 60, 32},  // codes not whole blocks
      {RowCodec::kFp8E8m0, 64, 96, 32},  // more codes than values
      {RowCodec::kFp4E8m0, 64, 32, 32},  // FP4 with a tail
      {RowCodec::kFp4E4m3, 63, 63, 9},   // FP4 odd block
      {RowCodec::kF32, 0, 0, 1},         // no values
  };
  for (const CacheRowFormat& f : invalid) {
    EXPECT_FALSE(validate_row_format(f).ok()) << name_of(f);
    EXPECT_EQ(cd::launch_cache_pack_rows(f, dx.get(), 1, dpk.get(), nullptr, 0), cudaErrorInvalidValue) << name_of(f);
    EXPECT_EQ(cd::launch_cache_pack_ring(f, dpk.get(), dx.get(), dpos.get(), 0, 1, 1, nullptr, 0), cudaErrorInvalidValue)
        << name_of(f);
  }
}

// Host pack of one row (the expected bytes of a ring slot).
std::vector<uint8_t> host_row(const CacheRowFormat& f, const float* x) {
  std::vector<uint8_t> h(size_t(f.row_bytes()));
  EXPECT_TRUE(pack_cache_rows(f, x, 1, h.data()).ok());
  return h;
}

// Ring writes, every format: rows t0..T-1 land in slots pos % ring_size as the host's bytes
// (positions wrap around the ring; a chunk longer than the ring keeps its last ring_size rows,
// 1 row and 300 rows); slots no row maps to are untouched. The multi-sequence form skips rows a
// later row of the same chunk overwrites.
TEST(CudaCacheRows, RingWritesLandInTheirSlots) {
  FS_REQUIRE_GPU();
  for (const CacheRowFormat& f : kFormats) {
    const int64_t rb = f.row_bytes();
    struct Case {
      int64_t ring, T, first_pos;
    };
    for (const Case c : {Case{5, 7, 11}, Case{5, 1, 13}, Case{256, 300, 1000}}) {
      const std::string at = name_of(f) + " ring " + std::to_string(c.ring) + " T " + std::to_string(c.T);
      const int64_t t0 = std::max<int64_t>(0, c.T - c.ring);
      const std::vector<float> kv = rows_of(f, c.T, 9 + uint32_t(c.T));
      std::vector<int64_t> pos(size_t(c.T));
      for (int64_t t = 0; t < c.T; ++t) pos[size_t(t)] = c.first_pos + t;
      std::vector<uint8_t> want(size_t(c.ring * rb), 0xab);
      for (int64_t t = t0; t < c.T; ++t) {
        const auto h = host_row(f, kv.data() + t * f.dim);
        std::memcpy(want.data() + (pos[size_t(t)] % c.ring) * rb, h.data(), size_t(rb));
      }
      DeviceBuffer<float> dkv(kv);
      DeviceBuffer<int64_t> dpos(pos);
      DeviceBuffer<uint8_t> dring(want.size());
      ASSERT_EQ(cudaMemset(dring.get(), 0xab, want.size()), cudaSuccess);
      DeviceBuffer<int> dbad(std::vector<int>{0});
      ASSERT_EQ(cd::launch_cache_pack_ring(f, dring.get(), dkv.get(), dpos.get(), t0, c.T, c.ring, dbad.get(), 0),
                cudaSuccess)
          << at;
      EXPECT_EQ(dring.to_host(), want) << at;
      EXPECT_EQ(dbad.to_host()[0], 0) << at;
    }
    // Two sequences: rows 0..1 (ring A, positions 3, 4: three slots stay untouched), rows 2..8
    // (ring B, 7 rows over 5 slots: rows 2, 3 are overwritten by rows 7, 8 and skipped).
    const int64_t ring = 5;
    const std::vector<float> kv2 = rows_of(f, 9, 10);
    const std::vector<int64_t> pos2 = {3, 4, 20, 21, 22, 23, 24, 25, 26};
    const std::vector<int32_t> row_seq = {0, 0, 1, 1, 1, 1, 1, 1, 1};
    std::vector<uint8_t> want_a(size_t(ring * rb), 0xab), want_b(size_t(ring * rb), 0xab);
    for (int64_t r = 0; r < 9; ++r) {
      if (r >= 2 && r < 4) continue;
      const auto h = host_row(f, kv2.data() + r * f.dim);
      std::memcpy((r < 2 ? want_a : want_b).data() + (pos2[size_t(r)] % ring) * rb, h.data(), size_t(rb));
    }
    DeviceBuffer<uint8_t> ra(want_a.size()), rbuf(want_b.size());
    ASSERT_EQ(cudaMemset(ra.get(), 0xab, want_a.size()), cudaSuccess);
    ASSERT_EQ(cudaMemset(rbuf.get(), 0xab, want_b.size()), cudaSuccess);
    std::vector<cd::ModelAttnSeq> seqs(2);
    seqs[0].ring = ra.get(), seqs[0].start = 3, seqs[0].row0 = 0, seqs[0].T = 2, seqs[0].ring_size = ring;
    seqs[1].ring = rbuf.get(), seqs[1].start = 20, seqs[1].row0 = 2, seqs[1].T = 7, seqs[1].ring_size = ring;
    DeviceBuffer<uint8_t> dseqs(seqs.size() * sizeof(cd::ModelAttnSeq));
    ASSERT_EQ(cudaMemcpy(dseqs.get(), seqs.data(), seqs.size() * sizeof(cd::ModelAttnSeq), cudaMemcpyHostToDevice),
              cudaSuccess);
    DeviceBuffer<float> dkv2(kv2);
    DeviceBuffer<int64_t> dpos2(pos2);
    DeviceBuffer<int32_t> drs(row_seq);
    DeviceBuffer<int> dbad(std::vector<int>{0});
    ASSERT_EQ(cd::launch_cache_pack_ring_seqs(f, reinterpret_cast<const cd::ModelAttnSeq*>(dseqs.get()), drs.get(),
                                              dkv2.get(), dpos2.get(), 9, dbad.get(), 0),
              cudaSuccess)
        << name_of(f);
    EXPECT_EQ(ra.to_host(), want_a) << name_of(f) << " ring A";
    EXPECT_EQ(rbuf.to_host(), want_b) << name_of(f) << " ring B";
    EXPECT_EQ(dbad.to_host()[0], 0) << name_of(f);
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

// FP4 rows (e2m1 x E8M0, 32-blocks) whose block magnitudes are 2^[-3, 3] x `scale`: the spread
// of block scales in the model's index queries and keys, where every FP32 dot of a query head and
// a key is exact (see index_imma.cu).
std::vector<float> fp4_rows_narrow(const CacheRowFormat& f, int64_t rows, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * f.dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b0 = 0; b0 < f.dim; b0 += f.block) {
      const float m = std::ldexp(scale, int(g() % 7) - 3);
      const int pat = int(g() % 6);  // 0: all zero, 1: -0 and values, else values
      for (int64_t i = b0; i < b0 + f.block; ++i)
        x[size_t(r * f.dim + i)] = pat == 0 ? 0.0f : pat == 1 && g() % 3 == 0 ? -0.0f : nd(g) * m;
    }
  testing::quantise_cache_rows(f, x.data(), rows);
  return x;
}

// Index scores on the integer tensor cores (kernel 4; the automatic choice when q is FP4 and a
// workspace is given) against ops::index_scores. With the model's spread of block scales every
// dot is exact, so the scores are the CPU's bits (causal rows, clen 0 rows, heads 1-64 with
// padded m-tiles, head dims 32 / 64 / 96 / 128, rows split over blocks and looped, 35k and 131k
// keys); entries past clen stay unwritten.
// With block magnitudes from 1e-6 to 7.5 in one row (dots not exact in FP32) every score is within
// the reordering bound of the CPU's FP32 dot (plus one BF16 step per rounding it crosses).
TEST(CudaCacheRows, IndexScoresOnIntegerTensorCoresMatchTheCpu) {
  FS_REQUIRE_GPU();
  struct Case { int64_t T, start, ratio, nI, dI; };
  const Case cases[] = {{5, 40, 1, 4, 128},    {6, 2001, 2, 32, 128}, {2, 700, 2, 64, 128}, {3, 300, 1, 20, 128},
                        {9, 0, 4, 5, 128},     {3, 69998, 2, 2, 128}, {40, 5000, 1, 32, 128},
                        {1, 131071, 1, 32, 128}, {17, 511, 2, 48, 128}, {7, 90, 1, 2, 32},  // tiny-v41 dims
                        {5, 300, 2, 3, 64},    {3, 200, 1, 17, 96}};
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](double n) { return n * u / (1 - n * u); };
  uint32_t seed = 700;
  for (const Case& c : cases) {
    const CacheRowFormat f{RowCodec::kFp4E8m0, int32_t(c.dI), int32_t(c.dI), 32};
    for (int narrow = 1; narrow >= 0; --narrow) {
      const int64_t stride = c.start + c.T, n_keys = stride / c.ratio, dI = c.dI;
      const auto q = narrow ? fp4_rows_narrow(f, c.T * c.nI, ++seed, 0.5f) : rows_of(f, c.T * c.nI, ++seed, true);
      const auto keys = narrow ? fp4_rows_narrow(f, std::max<int64_t>(n_keys, 1), ++seed, 2.0f)
                               : rows_of(f, std::max<int64_t>(n_keys, 1), ++seed, true);
      std::vector<float> w(size_t(c.T * c.nI));
      std::mt19937 g(++seed);
      std::normal_distribution<float> nd(0.0f, 0.3f);
      for (float& x : w) x = round_bf16(nd(g));
      std::unique_ptr<DeviceBuffer<uint8_t>> pk(packed(f, keys));
      for (bool bf16 : {false, true}) {
        for (int kernel : {4, 0}) {
          DeviceBuffer<float> dq(q), dw(w), dsc(size_t(c.T * stride));  // poisoned
          cd::IndexScoreArgs s;
          s.q = dq.get(), s.w = dw.get(), s.keys = pk->get(), s.key_fmt = f, s.scores = dsc.get(), s.T = c.T;
          s.nI = c.nI, s.dI = dI, s.start = c.start, s.ratio = c.ratio, s.stride = stride, s.bf16 = bf16;
          s.q_fp4 = true, s.kernel = kernel;
          const size_t wb = cd::index_scores_work_bytes(s);
          ASSERT_GT(wb, 0u);
          DeviceBuffer<uint8_t> work(wb);
          s.work = work.get(), s.work_bytes = wb;
          ASSERT_EQ(cd::launch_index_scores(s, 0), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto got = dsc.to_host();
          size_t bad = 0, differ = 0;
          for (int64_t t = 0; t < c.T; ++t) {
            const int64_t clen = (c.start + t + 1) / c.ratio;
            std::vector<float> ref(size_t(std::max<int64_t>(clen, 1)));
            const float* qt = q.data() + t * c.nI * dI;
            const float* wt = w.data() + t * c.nI;
            ops::index_scores({qt, wt, keys.data(), clen, c.nI, dI, bf16, ref.data()});
            for (int64_t i = 0; i < stride; ++i) {
              const float gv = got[size_t(t * stride + i)];
              if (i >= clen) {
                if (std::bit_cast<uint32_t>(gv) != 0xFFFFFFFFu && ++bad <= 3) ADD_FAILURE() << "written past clen " << t << " " << i;
                continue;
              }
              const float r = ref[size_t(i)];
              if (std::bit_cast<uint32_t>(gv) == std::bit_cast<uint32_t>(r)) continue;
              ++differ;
              bool ok = !narrow;
              if (ok) {  // the reordering bound, with a BF16 step per rounding crossed
                double bound = 0, vsum = 0;
                for (int64_t h = 0; h < c.nI; ++h) {
                  double A = 0, dd = 0;
                  for (int64_t k = 0; k < dI; ++k) {
                    A += std::fabs(double(qt[h * dI + k]) * keys[size_t(i * dI + k)]);
                    dd += double(qt[h * dI + k]) * keys[size_t(i * dI + k)];
                  }
                  const double e = 2 * gamma(dI) * A, aw = std::fabs(double(wt[h]));
                  bound += aw * e * 1.02 + (bf16 ? std::ldexp(1.0, -6) * aw * (std::fabs(dd) + e) : 0.0);
                  vsum += aw * (std::fabs(dd) + e);
                }
                bound = bound * (1 + gamma(double(c.nI))) + 2 * gamma(double(c.nI)) * vsum +
                        (bf16 ? std::ldexp(1.0, -6) * (vsum + bound) : 0.0);
                ok = std::fabs(double(gv) - double(r)) <= bound;
                if (!ok && bad < 3)
                  ADD_FAILURE() << "bound " << bound << " |d| " << std::fabs(double(gv) - double(r));
              }
              if (!ok && ++bad <= 3)
                ADD_FAILURE() << "T=" << c.T << " nI=" << c.nI << " narrow=" << narrow << " bf16=" << bf16 << " kernel "
                              << kernel << " t=" << t << " i=" << i << ": " << gv << " vs " << r;
            }
          }
          EXPECT_EQ(bad, 0u) << "T=" << c.T << " nI=" << c.nI << " narrow=" << narrow << " bf16=" << bf16;
          if (!narrow) std::printf("[imma] T=%lld nI=%lld wide spread bf16=%d: %zu of the scores differ from the CPU's bits\n",
                                   static_cast<long long>(c.T), static_cast<long long>(c.nI), int(bf16), differ);
        }
      }
    }
  }
}

// Several sequences in one launch (IndexScoreArgs::segs, IndexTopkArgs::segs) give every row
// the bytes a launch for its sequence alone gives: scores (poison past each row's clen intact),
// candidate masks, top-k lists and counts. Sequences of decode rows at odd positions, one before
// its first key (clen 0, no keys yet), verify / prefill blocks, tiny-v41 and real head counts.
TEST(CudaCacheRows, IndexOfSeveralSequencesIsEachSequenceAlone) {
  FS_REQUIRE_GPU();
  struct Seg { int64_t start, T; };
  struct Case { int64_t ratio, nI, dI, k; std::vector<Seg> segs; };
  const std::vector<Case> cases = {
      {4, 32, 128, 64, {{4095, 1}, {2, 1}, {1000, 1}, {77, 6}, {3, 1}, {5001, 1}, {300, 13}}},
      {4, 64, 128, 512, {{2000, 1}, {8191, 1}, {0, 1}, {4000, 2}}},  // k above some rows' clen
      {1, 2, 32, 7, {{90, 1}, {17, 5}, {1, 1}, {40, 1}}},              // tiny-v41 dims
      {128, 4, 128, 16, {{130000, 1}, {300, 1}, {12800, 3}}},          // HCA-like ratio
  };
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const CacheRowFormat f{RowCodec::kFp4E8m0, int32_t(c.dI), int32_t(c.dI), 32};
    const int64_t n = int64_t(c.segs.size());
    int64_t T = 0, total = 0, max_len = 0, max_T = 0;
    std::vector<cd::IndexSeg> segs;
    std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> keys;
    std::vector<int32_t> row_seg;
    for (int64_t i = 0; i < n; ++i) {
      const Seg& g = c.segs[size_t(i)];
      const int64_t n_keys = (g.start + g.T) / c.ratio;
      keys.emplace_back(n_keys > 0 ? packed(f, rows_of(f, n_keys, ++seed, true)) : nullptr);
      segs.push_back({keys.back() ? keys.back()->get() : nullptr, g.start, g.T, T, total});
      row_seg.insert(row_seg.end(), size_t(g.T), int32_t(i));
      T += g.T, total += g.T * (g.start + g.T);
      max_len = std::max(max_len, g.start + g.T), max_T = std::max(max_T, g.T);
    }
    const auto q = rows_of(f, T * c.nI, ++seed, true);
    std::vector<float> w(size_t(T * c.nI));
    std::mt19937 gen(++seed);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (float& x : w) x = round_bf16(nd(gen));
    DeviceBuffer<float> dq(q), dw(w);
    DeviceBuffer<cd::IndexSeg> dsegs(segs);
    DeviceBuffer<int32_t> drow(row_seg);
    for (bool bf16 : {false, true}) {
      const std::string at = "ratio " + std::to_string(c.ratio) + " nI " + std::to_string(c.nI) + " bf16 " +
                             std::to_string(int(bf16));
      cd::IndexScoreArgs s;
      s.q = dq.get(), s.w = dw.get(), s.key_fmt = f, s.nI = c.nI, s.dI = c.dI, s.ratio = c.ratio, s.bf16 = bf16;
      s.q_fp4 = true, s.kernel = 4;
      // Alone: each sequence's rows into its own region.
      DeviceBuffer<float> alone(static_cast<size_t>(total)), many(static_cast<size_t>(total));  // poisoned
      for (int64_t i = 0; i < n; ++i) {
        const cd::IndexSeg& g = segs[size_t(i)];
        if (!g.keys) continue;  // as the model does: nothing to score
        cd::IndexScoreArgs a = s;
        a.q = dq.get() + g.row0 * c.nI * c.dI, a.w = dw.get() + g.row0 * c.nI, a.keys = g.keys;
        a.scores = alone.get() + g.off, a.T = g.T, a.start = g.start, a.stride = g.start + g.T;
        const size_t wb = cd::index_scores_work_bytes(a);
        DeviceBuffer<uint8_t> work(wb);
        a.work = work.get(), a.work_bytes = wb;
        ASSERT_EQ(cd::launch_index_scores(a, 0), cudaSuccess) << at;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
      }
      cd::IndexScoreArgs m = s;
      m.scores = many.get(), m.T = T, m.stride = max_len, m.segs = dsegs.get(), m.n_segs = n, m.seg_rows = max_T;
      const size_t wb = cd::index_scores_work_bytes(m);
      DeviceBuffer<uint8_t> work(wb);
      m.work = work.get(), m.work_bytes = wb;
      ASSERT_EQ(cd::launch_index_scores(m, 0), cudaSuccess) << at;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
      const auto sa = alone.to_host(), sm = many.to_host();
      ASSERT_EQ(std::memcmp(sa.data(), sm.data(), sa.size() * 4), 0) << at << ": scores differ";
      { auto bad = m; bad.kernel = 3; EXPECT_EQ(cd::launch_index_scores(bad, 0), cudaErrorInvalidValue) << at; }
      // Top-k over those scores, coarsened for ties and with some -inf, every mode.
      std::vector<float> sc = sa;
      for (size_t i = 0; i < sc.size(); ++i)
        sc[i] = i % 11 == 5 ? -std::numeric_limits<float>::infinity() : std::round(sc[i] * 4.0f) / 4.0f;
      std::vector<uint8_t> cand0(static_cast<size_t>(total));
      for (size_t i = 0; i < cand0.size(); ++i) cand0[i] = uint8_t((i * 7) % 3 != 0);
      for (int mode : {0, 1, 2}) {
        std::vector<int32_t> outs[2], ns[2];
        std::vector<uint8_t> cands[2];
        for (int multi = 0; multi < 2; ++multi) {
          DeviceBuffer<float> dsc(sc), dbs(static_cast<size_t>(total));
          DeviceBuffer<uint8_t> dcand(cand0), dtaken(static_cast<size_t>(total));
          DeviceBuffer<int32_t> dout(static_cast<size_t>(T * c.k)), dn(static_cast<size_t>(T));
          cd::IndexTopkArgs a;
          a.block_scratch = dbs.get(), a.taken = dtaken.get(), a.ratio = c.ratio, a.k = c.k, a.mode = mode;
          a.cand_block = 3, a.cand_top = 5, a.path = 1;
          if (multi) {
            a.scores = dsc.get(), a.cand = dcand.get(), a.out = dout.get(), a.out_n = dn.get(), a.T = T;
            a.stride = max_len, a.segs = dsegs.get(), a.row_seg = drow.get(), a.n_segs = n;
            ASSERT_EQ(cd::launch_index_topk(a, 0), cudaSuccess) << at;
            { auto b = a; b.path = 2; EXPECT_EQ(cd::launch_index_topk(b, 0), cudaErrorInvalidValue) << at; }
          } else {
            for (const cd::IndexSeg& g : segs) {
              cd::IndexTopkArgs b = a;
              b.scores = dsc.get() + g.off, b.cand = dcand.get() + g.off, b.block_scratch = dbs.get() + g.off;
              b.taken = dtaken.get() + g.off, b.out = dout.get() + g.row0 * c.k, b.out_n = dn.get() + g.row0;
              b.T = g.T, b.start = g.start, b.stride = g.start + g.T;
              ASSERT_EQ(cd::launch_index_topk(b, 0), cudaSuccess) << at;
            }
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
          outs[multi] = dout.to_host(), ns[multi] = dn.to_host(), cands[multi] = dcand.to_host();
        }
        EXPECT_EQ(ns[0], ns[1]) << at << " mode " << mode;
        for (int64_t r = 0; r < T; ++r)  // entries past a row's count are not written by either
          for (int32_t j = 0; j < ns[0][size_t(r)]; ++j)
            ASSERT_EQ(outs[0][size_t(r * c.k + j)], outs[1][size_t(r * c.k + j)]) << at << " mode " << mode << " row " << r;
        EXPECT_EQ(cands[0], cands[1]) << at << " mode " << mode;
      }
    }
  }
  cudaGetLastError();
}

// Row copies by address tables: every row lands whole at its destination, nothing else is written.
TEST(CudaCacheRows, CopyRowsByAddressesMovesEachRow) {
  FS_REQUIRE_GPU();
  for (const int64_t width : {1, 37, 128, 1024}) {
    const int64_t n = 23;
    std::vector<float> src(size_t(n * width));
    for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) * 0.5f - 3.0f;
    DeviceBuffer<float> dsrc(src), ddst(size_t(2 * n * width));
    std::vector<const float*> from;
    std::vector<float*> to;
    for (int64_t r = 0; r < n; ++r) {
      from.push_back(dsrc.get() + ((r * 5) % n) * width);
      to.push_back(ddst.get() + (2 * r + 1) * width);
    }
    DeviceBuffer<const float*> dfrom(from);
    DeviceBuffer<float*> dto(to);
    ASSERT_EQ(cd::launch_copy_rows_table(dfrom.get(), dto.get(), n, width, 0), cudaSuccess);
    const auto got = ddst.to_host();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < width; ++d) {
        ASSERT_EQ(got[size_t((2 * r + 1) * width + d)], src[size_t(((r * 5) % n) * width + d)]) << width << " " << r;
        uint32_t bits;
        std::memcpy(&bits, &got[size_t(2 * r * width + d)], 4);
        ASSERT_EQ(bits, 0xFFFFFFFFu) << "gap written, width " << width;
      }
    EXPECT_EQ(cd::launch_copy_rows_table(nullptr, dto.get(), n, width, 0), cudaErrorInvalidValue);
    EXPECT_EQ(cd::launch_copy_rows_table(dfrom.get(), dto.get(), 0, width, 0), cudaSuccess);
  }
}

// Kernel 4 refuses what it cannot compute: queries not marked FP4, FP32 or FP4/E4M3 keys, dI
// not a multiple of 32 or over 128, more than 64 heads, no or a short workspace.
TEST(CudaCacheRows, IndexScoresIntegerKernelRefusesWhatItCannotCompute) {
  FS_REQUIRE_GPU();
  const CacheRowFormat f{RowCodec::kFp4E8m0, 128, 128, 32};
  DeviceBuffer<float> q(size_t(2 * 65 * 128)), w(size_t(2 * 65)), sc(size_t(2 * 100));
  DeviceBuffer<uint8_t> keys(size_t(100 * f.row_bytes())), work(size_t(1) << 20);
  cd::IndexScoreArgs s;
  s.q = q.get(), s.w = w.get(), s.keys = keys.get(), s.key_fmt = f, s.scores = sc.get(), s.T = 2, s.nI = 32;
  s.dI = 128, s.start = 98, s.ratio = 1, s.stride = 100, s.q_fp4 = true, s.kernel = 4;
  s.work = work.get(), s.work_bytes = cd::index_scores_work_bytes(s);
  ASSERT_GT(s.work_bytes, 0u);
  auto refused = [&](cd::IndexScoreArgs a) { return cd::launch_index_scores(a, 0) == cudaErrorInvalidValue; };
  { auto a = s; a.q_fp4 = false; EXPECT_TRUE(refused(a)); EXPECT_EQ(cd::index_scores_work_bytes(a), 0u); }
  { auto a = s; a.key_fmt = CacheRowFormat{RowCodec::kFp4E4m3, 128, 128, 16}; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.key_fmt = f32_row_format(128); EXPECT_TRUE(refused(a)); }
  { auto a = s; a.nI = 65; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.dI = 48, a.key_fmt = CacheRowFormat{RowCodec::kFp4E8m0, 48, 48, 16}; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.dI = 160, a.key_fmt = CacheRowFormat{RowCodec::kFp4E8m0, 160, 160, 32}; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.work = nullptr; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.work_bytes -= 1; EXPECT_TRUE(refused(a)); }
  { auto a = s; a.kernel = 5; EXPECT_TRUE(refused(a)); }
  cudaGetLastError();
}

}  // namespace
}  // namespace flashseek::ops::cuda
