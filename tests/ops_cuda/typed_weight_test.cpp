// The exactness linear and the embedding lookup reading weights as the checkpoint stores them
// (ops/cuda/model_kernels.h WeightRef: BF16, F16, F32, FP8 e4m3 + E8M0 blocks, FP4 e2m1 + E8M0)
// against the same kernels on the FP32 values the CPU backend's dequantisation gives
// (model/quant.h): the results must be bitwise equal, for odd sizes, partial scale blocks, the
// chunked order (in > 1024), stacked matrices with selected rows (and rows of another rank: -1),
// x_row_div, strided x / y, row slices (the grouped wo_a) and BF16 outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "gpu_util.h"
#include "model/quant.h"
#include "ops/linear.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda {
namespace {
using testing::DeviceBuffer;
namespace cd = detail;
using cd::WeightDtype;

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && ++bad <= 3) ADD_FAILURE() << what << " [" << i << "] " << a[i] << " vs " << b[i];
  EXPECT_EQ(bad, 0u) << what;
}

// `count` random matrices [n, k] in one stored format, back to back, and their FP32 values.
struct Stored {
  WeightDtype dtype = WeightDtype::kF32;
  int64_t n = 0, k = 0, count = 1, br = 1, bc = 1;
  std::vector<uint8_t> data, scale;  // all matrices
  int64_t data_bytes = 0, scale_bytes = 0;  // one matrix
  std::vector<float> values;         // [count, n, k], the CPU backend's dequantisation
};

uint8_t random_e4m3(Rng& r) {
  for (;;) {
    const uint8_t b = uint8_t(r.below(256));
    if ((b & 0x7f) != 0x7f) return b;  // not NaN
  }
}

Stored make_stored(WeightDtype dt, int64_t n, int64_t k, int64_t count, int64_t br, int64_t bc, uint64_t seed) {
  Rng r(seed);
  Stored s;
  s.dtype = dt, s.n = n, s.k = k, s.count = count, s.br = br, s.bc = bc;
  s.values.resize(size_t(count * n * k));
  for (int64_t e = 0; e < count; ++e) {
    float* v = s.values.data() + e * n * k;
    switch (dt) {
      case WeightDtype::kF32: {
        s.data_bytes = n * k * 4;
        for (int64_t i = 0; i < n * k; ++i) v[i] = float(r.normal()) * 0.1f;
        const auto* b = reinterpret_cast<const uint8_t*>(v);
        s.data.insert(s.data.end(), b, b + s.data_bytes);
        break;
      }
      case WeightDtype::kBf16: case WeightDtype::kF16: {
        s.data_bytes = n * k * 2;
        std::vector<uint8_t> bytes(size_t(s.data_bytes));
        for (int64_t i = 0; i < n * k; ++i) {
          uint16_t h;
          if (dt == WeightDtype::kBf16) {  // a random float's upper half (finite)
            const float f = float(r.normal()) * 0.1f;
            uint32_t u;
            std::memcpy(&u, &f, 4);
            h = uint16_t(u >> 16);
          } else {  // sign, exponent 1..30 (normal, finite) or 0 (subnormal), random mantissa
            const uint32_t e5 = uint32_t(r.below(31));
            h = uint16_t((r.below(2) << 15) | (e5 << 10) | r.below(1024));
          }
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        EXPECT_TRUE(model::convert_to_f32(dt == WeightDtype::kBf16 ? DType::kBF16 : DType::kF16, bytes,
                                          std::span<float>(v, size_t(n * k)))
                        .ok());
        s.data.insert(s.data.end(), bytes.begin(), bytes.end());
        break;
      }
      case WeightDtype::kFp8: {
        s.data_bytes = n * k;
        const int64_t sr = (n + br - 1) / br, sc = (k + bc - 1) / bc;
        s.scale_bytes = sr * sc;
        std::vector<uint8_t> codes(size_t(n * k)), sb(size_t(s.scale_bytes));
        for (auto& c : codes) c = random_e4m3(r);
        // Mostly ordinary scales, some tiny ones (denormal products) and 0 = 2^-127.
        for (size_t i = 0; i < sb.size(); ++i) sb[i] = i % 7 == 3 ? uint8_t(r.below(4)) : uint8_t(110 + r.below(20));
        model::dequant_fp8_blocks(codes.data(), sb.data(), n, k, br, bc, 0, n, v);
        s.data.insert(s.data.end(), codes.begin(), codes.end());
        s.scale.insert(s.scale.end(), sb.begin(), sb.end());
        break;
      }
      case WeightDtype::kFp4: {
        s.data_bytes = n * k / 2;
        s.scale_bytes = n * k / 32;
        std::vector<uint8_t> nib(size_t(n * k)), packed(size_t(s.data_bytes)), sb(size_t(s.scale_bytes));
        for (auto& c : nib) c = uint8_t(r.below(16));
        for (size_t i = 0; i < sb.size(); ++i) sb[i] = i % 5 == 2 ? uint8_t(r.below(3)) : uint8_t(115 + r.below(15));
        model::pack_fp4(nib.data(), n, k, packed.data());
        model::dequant_fp4(packed.data(), sb.data(), n, k, 0, n, v);
        s.data.insert(s.data.end(), packed.begin(), packed.end());
        s.scale.insert(s.scale.end(), sb.begin(), sb.end());
        break;
      }
    }
  }
  return s;
}

struct DevStored {
  DeviceBuffer<uint8_t> data, scale;
  DeviceBuffer<float> values;
  explicit DevStored(const Stored& s)
      : data(s.data), scale(s.scale.empty() ? std::vector<uint8_t>{0} : s.scale), values(s.values) {}
  cd::WeightRef ref(const Stored& s, int64_t row0 = 0) const {
    cd::WeightRef w;
    w.dtype = s.dtype, w.data = data.get(), w.scale = s.scale.empty() ? nullptr : scale.get(), w.cols = s.k;
    w.block_rows = s.br, w.block_cols = s.bc, w.row0 = row0;
    w.matrix_bytes = s.data_bytes, w.scale_matrix_bytes = s.scale_bytes;
    return w;
  }
};

const char* name_of(WeightDtype d) {
  switch (d) {
    case WeightDtype::kF32: return "f32";
    case WeightDtype::kBf16: return "bf16";
    case WeightDtype::kF16: return "f16";
    case WeightDtype::kFp8: return "fp8";
    case WeightDtype::kFp4: return "fp4";
  }
  return "?";
}

struct Fmt {
  WeightDtype dt;
  int64_t br, bc;
};

// Where the streaming GEMV (LinearArgs::kernel 3, model_kernels.cu linear_stream_kernel) applies,
// as model_kernels.h states it: in > 1024, at most 8 rows, no sel, in a multiple of its load width
// (up to 2 rows 16 bytes of weights, FP4 16 values; from 3 rows 4 values), FP8 scale blocks a power of two at
// least that wide, rows x in padded to whole chunks within 32768 floats (test weights are aligned).
bool stream_applies(WeightDtype dt, int64_t in, int64_t rows, int64_t bc, bool sel) {
  int64_t width = 4;
  if (rows <= 2) width = dt == WeightDtype::kF32 ? 4 : dt == WeightDtype::kFp8 || dt == WeightDtype::kFp4 ? 16 : 8;
  const int64_t m = (in + 1023) / 1024;
  if (in <= 1024 || rows > 8 || sel || in % width != 0 || rows * m * 1024 > 32768) return false;
  return dt != WeightDtype::kFp8 || (bc >= width && (bc & (bc - 1)) == 0);
}

// Every format, widths across the short and chunked orders (FP4: multiples of 32), plain and
// stacked, with x_row_div and strides: typed == FP32 weights, bit for bit.
TEST(CudaTypedWeights, LinearMatchesFp32WeightsBitwise) {
  FS_REQUIRE_GPU();
  const Fmt fmts[] = {{WeightDtype::kF32, 1, 1}, {WeightDtype::kBf16, 1, 1}, {WeightDtype::kF16, 1, 1},
                      {WeightDtype::kFp8, 128, 128}, {WeightDtype::kFp8, 32, 32}, {WeightDtype::kFp8, 1, 32},
                      {WeightDtype::kFp4, 1, 32}};
  const int64_t T = 5, K = 2, E = 3, out = 37;  // 37 rows: partial 32- and 128-row scale blocks
  uint64_t seed = 100;
  for (const Fmt& f : fmts) {
    const std::vector<int64_t> widths = f.dt == WeightDtype::kFp4 ? std::vector<int64_t>{32, 96, 1024, 1056, 2080}
                                                                   : std::vector<int64_t>{1, 9, 203, 1023, 1025, 2051};
    for (int64_t in : widths) {
      const std::string tag = std::string(name_of(f.dt)) + " " + std::to_string(f.br) + "x" + std::to_string(f.bc) +
                              " in=" + std::to_string(in);
      SCOPED_TRACE(tag);
      const Stored s = make_stored(f.dt, out, in, E, f.br, f.bc, ++seed);
      const DevStored ds(s);
      Rng r(++seed);
      const int64_t xs = in + 3, ys = out + 5;  // strided rows
      std::vector<float> x(size_t(T * xs));
      for (auto& v : x) v = float(r.normal());
      std::vector<int32_t> sel(size_t(T * K));
      for (auto& v : sel) v = int32_t(r.below(E));
      sel[3] = -1;  // another rank's expert: 0
      DeviceBuffer<float> dx(x);
      DeviceBuffer<int32_t> dsel(sel);
      for (bool stacked : {false, true}) {
        const int64_t rows = stacked ? T * K : T;
        DeviceBuffer<float> y_ref(std::vector<float>(size_t(rows * ys), -7.0f)), y_typ(std::vector<float>(size_t(rows * ys), -7.0f));
        cd::LinearArgs a;
        a.x = dx.get(), a.rows = rows, a.in = in, a.out = out, a.x_stride = xs, a.y_stride = ys;
        a.sel = stacked ? dsel.get() : nullptr, a.x_row_div = stacked ? K : 1, a.bf16_out = stacked;
        a.w = ds.values.get(), a.y = y_ref.get();
        FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "fp32 linear"));
        a.w = nullptr, a.wt = ds.ref(s), a.y = y_typ.get();
        FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "typed linear"));
        const auto ref = y_ref.to_host(), got = y_typ.to_host();
        expect_bitwise(got, ref, tag + (stacked ? " stacked" : " plain"));
        // Not a vacuous pass: the outputs were written and are not all zero.
        int64_t nonzero = 0;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t o = 0; o < out; ++o) nonzero += got[size_t(i * ys + o)] != 0.0f;
        EXPECT_GT(nonzero, rows * out / 2) << tag;
        EXPECT_EQ(got[size_t(out)], -7.0f) << tag << ": the stride gap was written";
      }
    }
  }
}

// Every kernel of each order (LinearArgs::kernel 1: the former kernels, 8 lanes per output or a
// block per (row, output); 2: the GEMVs; 3: the streaming GEMV, which must refuse exactly where
// stream_applies says it does not apply) and the automatic choice against the CPU twin
// (ops::linear on model/quant.h's FP32 values, one output row at a time), memcmp-equal: every
// stored format, widths around the chunk edges (1, 7, 127, 1023, 1024, 1025, 4096, 5000; FP4
// multiples of 32), outputs 1 / 3 / 33 / 1000, rows 1..6, 8 and 200 (GEMV row groups of 1, 2 and
// 4 with a partial last group; streaming row bounds 1, 2, 4, 8), stacked matrices with -1
// rows, x_row_div 2, strided x and y, a row slice (row0) and BF16 outputs on and off. The
// (out, rows) pairs are drawn at random per width, bounded so the CPU side stays fast.
TEST(CudaTypedWeights, LinearKernelsMatchCpuTwinBitwise) {
  FS_REQUIRE_GPU();
  const Fmt fmts[] = {{WeightDtype::kF32, 1, 1}, {WeightDtype::kBf16, 1, 1}, {WeightDtype::kF16, 1, 1},
                      {WeightDtype::kFp8, 128, 128}, {WeightDtype::kFp8, 1, 32}, {WeightDtype::kFp4, 1, 32}};
  const int64_t outs[] = {1, 3, 33, 1000}, row_counts[] = {1, 2, 3, 4, 5, 6, 8, 200};
  Rng pick(2024);
  uint64_t seed = 500;
  int64_t cases = 0, gemv_cases = 0, stream_cases = 0;
  for (const Fmt& f : fmts) {
    const std::vector<int64_t> widths = f.dt == WeightDtype::kFp4
                                            ? std::vector<int64_t>{32, 992, 1024, 1056, 4096, 5024}
                                            : std::vector<int64_t>{1, 7, 127, 1023, 1024, 1025, 4096, 5000};
    for (int64_t in : widths) {
      for (int rep = 0; rep < 3; ++rep) {
        int64_t out = outs[pick.below(4)], rows = row_counts[pick.below(8)];
        while (rows * out * in > 6'000'000) out = out > 3 ? 33 : 1, rows = rows > 5 ? 5 : rows;
        const bool stacked = rep == 1, bf16 = rep != 0;
        const int64_t E = stacked ? 3 : 1, row0 = rep == 2 ? 5 : 0, x_div = stacked ? 2 : 1;
        const std::string tag = std::string(name_of(f.dt)) + " " + std::to_string(f.br) + "x" + std::to_string(f.bc) +
                                " in=" + std::to_string(in) + " out=" + std::to_string(out) + " rows=" +
                                std::to_string(rows) + (stacked ? " stacked" : "") + (row0 ? " row0" : "") +
                                (bf16 ? " bf16" : "");
        SCOPED_TRACE(tag);
        const Stored s = make_stored(f.dt, out + row0, in, E, f.br, f.bc, ++seed);
        const DevStored ds(s);
        Rng r(++seed);
        const int64_t xs = in + (rep == 1 ? 3 : 0), ys = out + 2, x_rows = (rows + x_div - 1) / x_div;
        std::vector<float> x(size_t(x_rows * xs));
        for (auto& v : x) v = float(r.normal());
        std::vector<int32_t> sel(static_cast<size_t>(rows));
        for (auto& v : sel) v = int32_t(r.below(uint64_t(E)));
        if (stacked && rows > 1) sel[1] = -1;  // another rank's expert: 0
        // The CPU twin, one output row at a time.
        std::vector<float> want(size_t(rows * ys), -7.0f);
        for (int64_t i = 0; i < rows; ++i) {
          float* yr = want.data() + i * ys;
          if (stacked && sel[size_t(i)] < 0) {
            std::fill(yr, yr + out, 0.0f);
            continue;
          }
          const float* w = s.values.data() + (int64_t(sel[size_t(i)]) * (out + row0) + row0) * in;
          ops::linear({x.data() + (i / x_div) * xs, w, yr, 1, in, out, 0, false, bf16});
        }
        DeviceBuffer<float> dx(x);
        DeviceBuffer<int32_t> dsel(sel);
        for (int kernel : {0, 1, 2, 3}) {
          DeviceBuffer<float> dy(std::vector<float>(size_t(rows * ys), -7.0f));
          cd::LinearArgs a;
          a.x = dx.get(), a.wt = ds.ref(s, row0), a.y = dy.get(), a.sel = stacked ? dsel.get() : nullptr;
          a.rows = rows, a.in = in, a.out = out, a.x_stride = xs, a.y_stride = ys, a.x_row_div = x_div;
          a.bf16_out = bf16, a.kernel = kernel;
          if (kernel == 3) {  // the streaming GEMV: refused exactly where it does not apply
            const bool applies = stream_applies(f.dt, in, rows, f.bc, stacked);
            EXPECT_EQ(cd::launch_linear(a, 0) == cudaSuccess, applies) << tag << " kernel 3";
            if (!applies) continue;
            ++stream_cases;
          } else {
            FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "typed linear"));
          }
          expect_bitwise(dy.to_host(), want, tag + " kernel " + std::to_string(kernel));
          if (f.dt == WeightDtype::kF32) {  // the FP32 pointer path (a.w) through the same kernels
            DeviceBuffer<float> dy2(std::vector<float>(size_t(rows * ys), -7.0f));
            a.wt = cd::WeightRef{}, a.y = dy2.get();
            a.w = ds.values.get() + row0 * in;
            if (row0 == 0) {  // (a.w has no row slice: stacked matrices are [E, out, in])
              FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "fp32 linear"));
              expect_bitwise(dy2.to_host(), want, tag + " fp32 kernel " + std::to_string(kernel));
            }
          }
          ++cases, gemv_cases += kernel == 2;
        }
      }
    }
  }
  EXPECT_GT(gemv_cases, 40);
  EXPECT_GT(stream_cases, 8);
  std::printf("[typed] %lld launches compared, %lld of them the GEMV, %lld the streaming GEMV\n", (long long)cases,
              (long long)gemv_cases, (long long)stream_cases);
}

// The streaming GEMV (LinearArgs::kernel 3) against the CPU twin, memcmp-equal, on every path it
// has: each stored format and load width (FP8 scale blocks of 128, 16 (exactly one 16-byte load)
// and 8 (too narrow for 16-byte loads: refused up to 2 rows, taken from 3)), 1 / 2 / 3 / 6 / 8
// rows (row bounds 1, 2, 4, 8 with skipped rows), widths with a partial last chunk (1040, 4100:
// only 4-value loads), 3 and 5 chunks (tiles of several sets), 17 chunks at one row (512-thread
// blocks, x over 64 KB), outputs that leave partial sets and tiles (1, 7, 33), row slices, strided
// and shared x rows (x_row_div), BF16 outputs; outputs large enough that blocks walk several tiles
// (the double-buffered chunk sums). Where it does not apply it must refuse; the automatic choice
// and the GEMV (kernel 2) give the same bits.
TEST(CudaTypedWeights, StreamingGemvMatchesCpuTwinBitwise) {
  FS_REQUIRE_GPU();
  const Fmt fmts[] = {{WeightDtype::kF32, 1, 1},      {WeightDtype::kBf16, 1, 1},   {WeightDtype::kF16, 1, 1},
                      {WeightDtype::kFp8, 128, 128},  {WeightDtype::kFp8, 32, 16},  {WeightDtype::kFp8, 1, 8},
                      {WeightDtype::kFp4, 1, 32}};
  const int64_t row_counts[] = {1, 2, 3, 6, 8}, outs[] = {1, 7, 33};
  struct Big {
    WeightDtype dt;
    int64_t bc, in, out, rows;
  };
  // Many tiles per block on any GPU of up to ~1000 resident blocks.
  const Big bigs[] = {{WeightDtype::kBf16, 1, 4096, 4000, 1},
                      {WeightDtype::kFp8, 128, 4096, 4000, 6},
                      {WeightDtype::kFp8, 128, 2048, 8000, 1},
                      {WeightDtype::kFp4, 32, 4096, 2000, 2}};
  struct Case {
    Fmt f;
    int64_t in, out, rows;
  };
  std::vector<Case> cases;
  int pick = 0;
  for (const Fmt& f : fmts) {
    const std::vector<int64_t> widths = f.dt == WeightDtype::kFp4 ? std::vector<int64_t>{1056, 3072, 4096, 5120, 17408}
                                                                   : std::vector<int64_t>{1040, 3072, 4096, 4100, 5120, 17408};
    for (int64_t in : widths)
      for (int64_t rows : row_counts) {
        if (in == 17408 && rows > 2) continue;  // refused (x over 128 KB) at 2 rows already
        cases.push_back({f, in, outs[pick++ % 3], rows});
      }
  }
  for (const Big& b : bigs) cases.push_back({{b.dt, b.dt == WeightDtype::kFp8 ? 128 : 1, b.bc}, b.in, b.out, b.rows});
  uint64_t seed = 7000;
  int64_t taken = 0, refused = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const bool bf16 = ci % 2 == 1, strided = ci % 3 == 1;
    const int64_t row0 = ci % 4 == 2 ? 3 : 0, x_div = c.rows > 1 && ci % 5 == 3 ? 2 : 1;
    const std::string tag = std::string(name_of(c.f.dt)) + " " + std::to_string(c.f.br) + "x" + std::to_string(c.f.bc) +
                            " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) + " rows=" +
                            std::to_string(c.rows) + (row0 ? " row0" : "") + (x_div > 1 ? " x_div" : "") +
                            (strided ? " strided" : "") + (bf16 ? " bf16" : "");
    SCOPED_TRACE(tag);
    const Stored s = make_stored(c.f.dt, c.out + row0, c.in, 1, c.f.br, c.f.bc, ++seed);
    const DevStored ds(s);
    Rng r(++seed);
    const int64_t xs = c.in + (strided ? 5 : 0), ys = c.out + (strided ? 3 : 0), x_rows = (c.rows + x_div - 1) / x_div;
    std::vector<float> x(size_t(x_rows * xs));
    for (auto& v : x) v = float(r.normal());
    std::vector<float> want(size_t(c.rows * ys), -7.0f);
    for (int64_t i = 0; i < c.rows; ++i)
      ops::linear({x.data() + (i / x_div) * xs, s.values.data() + row0 * c.in, want.data() + i * ys, 1, c.in, c.out, 0,
                   false, bf16});
    DeviceBuffer<float> dx(x);
    const bool applies = stream_applies(c.f.dt, c.in, c.rows, c.f.bc, false);
    for (int kernel : {3, 0, 2}) {
      if (kernel == 2 && c.in > 16 * 1024) continue;  // beyond the GEMV's x limit
      DeviceBuffer<float> dy(std::vector<float>(size_t(c.rows * ys), -7.0f));
      cd::LinearArgs a;
      a.x = dx.get(), a.wt = ds.ref(s, row0), a.y = dy.get(), a.rows = c.rows, a.in = c.in, a.out = c.out;
      a.x_stride = xs, a.y_stride = ys, a.x_row_div = x_div, a.bf16_out = bf16, a.kernel = kernel;
      const cudaError_t e = cd::launch_linear(a, 0);
      if (kernel == 3) {
        EXPECT_EQ(e == cudaSuccess, applies) << "kernel 3";
        if (e != cudaSuccess) {
          ++refused;
          continue;
        }
        ++taken;
      } else {
        FS_ASSERT_OK(cuda_status(e, "linear"));
      }
      const auto got = dy.to_host();
      expect_bitwise(got, want, tag + " kernel " + std::to_string(kernel));
      int64_t nonzero = 0;  // not a vacuous pass: the outputs were written
      for (int64_t i = 0; i < c.rows; ++i)
        for (int64_t o = 0; o < c.out; ++o) nonzero += got[size_t(i * ys + o)] != 0.0f;
      EXPECT_GT(nonzero, c.rows * c.out / 2) << "kernel " << kernel;
      if (c.f.dt == WeightDtype::kF32 && row0 == 0) {  // the FP32 pointer path (a.w), same kernel
        DeviceBuffer<float> dy2(std::vector<float>(size_t(c.rows * ys), -7.0f));
        a.wt = cd::WeightRef{}, a.w = ds.values.get(), a.y = dy2.get();
        FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "fp32 pointer"));
        expect_bitwise(dy2.to_host(), want, tag + " fp32 pointer kernel " + std::to_string(kernel));
      }
    }
  }
  EXPECT_GT(taken, 100);
  EXPECT_GT(refused, 20);
  std::printf("[stream] %lld cases taken by the streaming GEMV, %lld refused\n", (long long)taken, (long long)refused);

  // Refusals: sel (stacked experts), more than 8 rows, in <= 1024, an unaligned weight (the
  // automatic choice then takes the GEMV, same bits).
  const Stored s = make_stored(WeightDtype::kBf16, 5, 2048, 1, 1, 1, 31);
  DeviceBuffer<uint8_t> shifted(s.data.size() + 16);
  ASSERT_EQ(cudaMemcpy(shifted.get() + 2, s.data.data(), s.data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const DevStored ds(s);
  Rng r(32);
  std::vector<float> x(size_t(9 * 2048));
  for (auto& v : x) v = float(r.normal());
  DeviceBuffer<float> dx(x), dy(size_t(9 * 5));
  DeviceBuffer<int32_t> dsel(std::vector<int32_t>(9, 0));
  cd::LinearArgs a;
  a.x = dx.get(), a.wt = ds.ref(s), a.y = dy.get(), a.rows = 9, a.in = 2048, a.out = 5, a.kernel = 3;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "9 rows";
  a.rows = 1, a.sel = dsel.get();
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "sel";
  a.sel = nullptr, a.in = 1024, a.wt.cols = 1024;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "in = 1024";
  a.in = 2048, a.wt = ds.ref(s), a.wt.data = shifted.get() + 2;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "unaligned weight";
  a.kernel = 0;
  FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "unaligned weight, automatic"));
  std::vector<float> want(5);
  ops::linear({x.data(), s.values.data(), want.data(), 1, 2048, 5, 0, false, false});
  const auto got = dy.to_host();
  expect_bitwise(std::vector<float>(got.begin(), got.begin() + 5), want, "unaligned weight, automatic");
}

// The kernel field is checked: 5 is refused, the streaming GEMV (3) refuses a width that is not a
// multiple of 4, and the GEMV and the tiled kernel (4) refuse rows longer than 16 chunks (their
// shared memory) while the automatic choice falls back to the block kernel.
TEST(CudaTypedWeights, ChunkedKernelChoiceIsChecked) {
  FS_REQUIRE_GPU();
  const int64_t in = 17 * 1024 + 1, out = 2;
  const Stored s = make_stored(WeightDtype::kBf16, out, in, 1, 1, 1, 77);
  const DevStored ds(s);
  Rng r(3);
  std::vector<float> x(static_cast<size_t>(in));
  for (auto& v : x) v = float(r.normal());
  std::vector<float> want(static_cast<size_t>(out));
  ops::linear({x.data(), s.values.data(), want.data(), 1, in, out, 0, false, false});
  DeviceBuffer<float> dx(x), dy(static_cast<size_t>(out));
  cd::LinearArgs a;
  a.x = dx.get(), a.wt = ds.ref(s), a.y = dy.get(), a.rows = 1, a.in = in, a.out = out;
  a.kernel = 5;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.kernel = 4;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.kernel = 3;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.kernel = 2;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.kernel = 0;
  FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "automatic"));
  expect_bitwise(dy.to_host(), want, "17 chunks, automatic");
}

// A row slice (the grouped wo_a: group g reads rows [g·Ro, (g+1)·Ro) of [G·Ro, in]) into
// interleaved output columns, as gpu_ops.cpp (grouped_linear) launches it.
TEST(CudaTypedWeights, RowSlicesMatchFp32Bitwise) {
  FS_REQUIRE_GPU();
  const int64_t G = 3, Ro = 40, in = 96, T = 4;  // Ro = 40: slices straddle the 32-row blocks
  for (const Fmt f : {Fmt{WeightDtype::kFp8, 32, 32}, Fmt{WeightDtype::kFp8, 128, 128}, Fmt{WeightDtype::kBf16, 1, 1}}) {
    SCOPED_TRACE(std::string(name_of(f.dt)) + " " + std::to_string(f.br));
    const Stored s = make_stored(f.dt, G * Ro, in, 1, f.br, f.bc, 7 + f.br);
    const DevStored ds(s);
    Rng r(9);
    std::vector<float> x(size_t(T * G * in));
    for (auto& v : x) v = float(r.normal());
    DeviceBuffer<float> dx(x), y_ref(size_t(T * G * Ro)), y_typ(size_t(T * G * Ro));
    for (int64_t g = 0; g < G; ++g) {
      cd::LinearArgs a;
      a.x = dx.get() + g * in, a.x_stride = G * in, a.rows = T, a.in = in, a.out = Ro, a.y_stride = G * Ro;
      a.bf16_out = true;
      a.w = ds.values.get() + g * Ro * in, a.y = y_ref.get() + g * Ro;
      FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "fp32 slice"));
      a.w = nullptr, a.wt = ds.ref(s, g * Ro), a.y = y_typ.get() + g * Ro;
      FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "typed slice"));
    }
    expect_bitwise(y_typ.to_host(), y_ref.to_host(), "grouped slices");
  }
}

// One grouped launch (LinearArgs::groups, as gpu_ops.cpp grouped_linear runs wo_a: group g reads
// x columns [g·in, (g+1)·in) and rows [g·Ro, (g+1)·Ro) of [G·Ro, in], into output columns
// [g·Ro, (g+1)·Ro)) equals the CPU twin group by group, bit for bit, for every kernel (short,
// chunked, GEMV, streaming GEMV at 1 / 4 / 6 rows, the tiled kernel), typed and FP32-pointer weights; sel with
// groups is refused.
TEST(CudaTypedWeights, GroupedLaunchMatchesCpuTwinPerGroupBitwise) {
  FS_REQUIRE_GPU();
  int64_t cases = 0;
  uint64_t seed = 900;
  for (const Fmt f : {Fmt{WeightDtype::kFp8, 128, 128}, Fmt{WeightDtype::kFp8, 32, 32}, Fmt{WeightDtype::kBf16, 1, 1},
                      Fmt{WeightDtype::kF32, 1, 1}}) {
    for (const int64_t G : {1, 3, 8}) {
      for (const int64_t in : {96, 1025, 4096}) {
        for (const int64_t T : {1, 4, 6, 17}) {
          const int64_t Ro = G == 3 ? 40 : 33;  // 40: slices straddle the 32-row blocks
          const std::string tag = std::string(name_of(f.dt)) + " " + std::to_string(f.br) + " G=" + std::to_string(G) +
                                  " in=" + std::to_string(in) + " T=" + std::to_string(T);
          SCOPED_TRACE(tag);
          const Stored s = make_stored(f.dt, G * Ro, in, 1, f.br, f.bc, ++seed);
          const DevStored ds(s);
          Rng r(++seed);
          std::vector<float> x(size_t(T * G * in));
          for (auto& v : x) v = float(r.normal());
          std::vector<float> want(size_t(T * G * Ro));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t g = 0; g < G; ++g) {
              std::vector<float> yg(static_cast<size_t>(Ro));
              ops::linear({x.data() + t * G * in + g * in, s.values.data() + g * Ro * in, yg.data(), 1, in, Ro, 0, false,
                           true});
              std::copy(yg.begin(), yg.end(), want.begin() + t * G * Ro + g * Ro);
            }
          DeviceBuffer<float> dx(x);
          for (int kernel : {0, 1, 2, 3, 4}) {
            if (kernel == 2 && T > 16) continue;  // the GEMV's row limit (automatic picks kernel 1)
            if (kernel == 3 && !stream_applies(f.dt, in, T, f.bc, false)) continue;  // refusals: other tests
            if (kernel == 4 && in <= 1024) continue;  // the tiled kernel: chunked rows only
            for (const bool fp32_ptr : {false, true}) {
              if (fp32_ptr && f.dt != WeightDtype::kF32) continue;
              DeviceBuffer<float> dy(std::vector<float>(size_t(T * G * Ro), -7.0f));
              cd::LinearArgs a;
              a.x = dx.get(), a.x_stride = G * in, a.x_group = in;
              a.y = dy.get(), a.y_stride = G * Ro, a.y_group = Ro;
              a.rows = T, a.in = in, a.out = Ro, a.bf16_out = true, a.groups = G, a.kernel = kernel;
              if (fp32_ptr) a.w = ds.values.get();
              else a.wt = ds.ref(s);
              FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "grouped linear"));
              expect_bitwise(dy.to_host(), want, tag + " kernel " + std::to_string(kernel) + (fp32_ptr ? " fp32 ptr" : ""));
              ++cases;
            }
          }
        }
      }
    }
  }
  std::printf("[grouped] %lld grouped launches compared with the CPU twin\n", (long long)cases);
  // sel (stacked experts) and groups do not combine; 0 groups is refused.
  const Stored s = make_stored(WeightDtype::kBf16, 4, 32, 1, 1, 1, 5);
  const DevStored ds(s);
  DeviceBuffer<float> dx(std::vector<float>(64, 1.0f)), dy(std::vector<float>(8, 0.0f));
  DeviceBuffer<int32_t> dsel(std::vector<int32_t>{0, 0});
  cd::LinearArgs a;
  a.x = dx.get(), a.wt = ds.ref(s), a.y = dy.get(), a.rows = 2, a.in = 32, a.out = 2, a.groups = 2;
  a.sel = dsel.get();
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.sel = nullptr, a.groups = 0;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
}

// --engram-tables device (GpuModel::engram_rows): the step's rows gathered from an Engram table
// on the device as stored (FP8 e4m3 codes, one E8M0 scale per 32 values of a row) equal the rows
// the host path decodes from the checkpoint (model::dequant_fp8_blocks on each row, what
// Checkpoint::dequant_rows runs), bit for bit: the first and last rows, repeats, ids in any order.
TEST(CudaTypedWeights, EngramRowsOnTheDeviceMatchTheHostGather) {
  FS_REQUIRE_GPU();
  const int64_t rows = 4099, de = 256;
  const Stored s = make_stored(WeightDtype::kFp8, rows, de, 1, 1, 32, 91);
  const DevStored ds(s);
  Rng r(5);
  std::vector<int32_t> ids = {0, int32_t(rows - 1), 7, 7};
  while (ids.size() < 3 * 24) ids.push_back(int32_t(r.below(uint64_t(rows))));  // 3 tokens x 24 columns
  const int64_t n = int64_t(ids.size());
  std::vector<float> want(size_t(n * de));
  for (int64_t i = 0; i < n; ++i)
    model::dequant_fp8_blocks(s.data.data(), s.scale.data(), rows, de, 1, 32, ids[size_t(i)], ids[size_t(i)] + 1,
                              want.data() + i * de);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> got(size_t(n * de));
  FS_ASSERT_OK(cuda_status(cd::launch_embed_w(ds.ref(s), d_ids.get(), got.get(), n, 1, de, 0), "engram rows"));
  expect_bitwise(got.to_host(), want, "engram rows");
}

// The embedding from the stored table equals the FP32 table's rows (first, last, repeated ids),
// also one row picked by row0 (the DSpark Markov row); bad shapes are refused.
TEST(CudaTypedWeights, EmbedMatchesFp32Bitwise) {
  FS_REQUIRE_GPU();
  const int64_t V = 300, D = 96, hc = 4;
  const std::vector<int32_t> tokens = {0, 299, 17, 17, 150, 3, 298};
  const int64_t T = int64_t(tokens.size());
  DeviceBuffer<int32_t> dt(tokens), zero(std::vector<int32_t>{0});
  for (const Fmt f : {Fmt{WeightDtype::kBf16, 1, 1}, Fmt{WeightDtype::kF32, 1, 1}, Fmt{WeightDtype::kF16, 1, 1},
                      Fmt{WeightDtype::kFp8, 128, 128}, Fmt{WeightDtype::kFp8, 1, 32}, Fmt{WeightDtype::kFp4, 1, 32}}) {
    SCOPED_TRACE(name_of(f.dt));
    const Stored s = make_stored(f.dt, V, D, 1, f.br, f.bc, 55);
    const DevStored ds(s);
    DeviceBuffer<float> ref(size_t(T * hc * D)), got(size_t(T * hc * D));
    FS_ASSERT_OK(cuda_status(cd::launch_embed(ds.values.get(), dt.get(), ref.get(), T, hc, D, 0), "embed"));
    FS_ASSERT_OK(cuda_status(cd::launch_embed_w(ds.ref(s), dt.get(), got.get(), T, hc, D, 0), "embed typed"));
    const auto h = got.to_host();
    expect_bitwise(h, ref.to_host(), "embed");
    // Row 299 from the host values (not only kernel vs kernel).
    expect_bitwise(std::vector<float>(h.begin() + hc * D, h.begin() + hc * D + D),
                   std::vector<float>(s.values.begin() + 299 * D, s.values.begin() + 300 * D), "row 299");
    DeviceBuffer<float> one(static_cast<size_t>(D));
    FS_ASSERT_OK(cuda_status(cd::launch_embed_w(ds.ref(s, 150), zero.get(), one.get(), 1, 1, D, 0), "row0"));
    expect_bitwise(one.to_host(), std::vector<float>(s.values.begin() + 150 * D, s.values.begin() + 151 * D),
                   "row 150 by row0");
    EXPECT_NE(cd::launch_embed_w(ds.ref(s), dt.get(), got.get(), T, hc, D + 1, 0), cudaSuccess);
  }
  // FP4 rows must be a multiple of 32 values; a typed linear's cols must equal `in`.
  const Stored f4 = make_stored(WeightDtype::kFp4, 4, 64, 1, 1, 32, 3);
  const DevStored d4(f4);
  cd::WeightRef w = d4.ref(f4);
  w.cols = 48;
  DeviceBuffer<float> x(std::vector<float>(64, 1.0f)), y(size_t(4));
  cd::LinearArgs a;
  a.x = x.get(), a.y = y.get(), a.rows = 1, a.in = 48, a.out = 4, a.wt = w;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
  a.in = 64;
  a.wt = d4.ref(f4);
  a.wt.cols = 32;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess);
}

// The tiled kernel (LinearArgs::kernel 4, the prefill rows) against the CPU twin (ops::linear on
// model/quant.h's FP32 values, one output row at a time) and the GEMV (kernel 2), memcmp-equal,
// and the automatic choice (kernel 0: the tiled kernel from 32 rows) too: every stored format
// (FP8 scale blocks of 128 and 32 columns: 4-value loads; 48: RowReader one value at a time),
// widths with a partial last chunk and not a multiple of 4 (1025, 2051: 4-byte x copies and
// scalar weights), 4 and 5 chunks and the 16-chunk maximum, outputs that leave a partial 32-output
// tile and idle warps (1, 7, 33, 100), rows 1..5, 17, 33, 100, 257 (partial 8-row units and
// 64-row tiles), grouped launches with row slices, x_row_div 2, strided and misaligned x, strided
// y and BF16 outputs; the FP32 pointer path for F32 weights. Then launches large enough for
// several row and output tiles per group, and the refusals (no launch: y untouched).
TEST(CudaTypedWeights, TiledKernelMatchesGemvAndCpuTwinBitwise) {
  FS_REQUIRE_GPU();
  const Fmt fmts[] = {{WeightDtype::kF32, 1, 1},     {WeightDtype::kBf16, 1, 1},   {WeightDtype::kF16, 1, 1},
                      {WeightDtype::kFp8, 128, 128}, {WeightDtype::kFp8, 1, 32},   {WeightDtype::kFp8, 32, 48},
                      {WeightDtype::kFp4, 1, 32}};
  const int64_t outs[] = {1, 7, 33, 100}, row_counts[] = {1, 2, 3, 4, 5, 17, 33, 100, 257};
  struct Case {
    Fmt f;
    int64_t in, out, rows, groups, x_div;
    bool strided, bf16, misaligned;
    int64_t row0;
  };
  std::vector<Case> cases;
  Rng pick(4242);
  for (const Fmt& f : fmts) {
    const std::vector<int64_t> widths = f.dt == WeightDtype::kFp4 ? std::vector<int64_t>{1056, 4096, 5024, 16384}
                                                                   : std::vector<int64_t>{1025, 2051, 4096, 5000, 16384};
    for (size_t wi = 0; wi < widths.size(); ++wi)
      for (int rep = 0; rep < 3; ++rep) {
        Case c{f, widths[wi], outs[pick.below(4)], row_counts[pick.below(9)], rep == 2 ? 3 : 1, rep == 1 ? 2 : 1,
               rep == 1, rep != 0, rep == 0 && wi % 2 == 1, rep == 2 ? 5 : 0};
        while (c.rows * c.out * c.in * c.groups > 12'000'000) {
          if (c.out > 7) c.out = c.out == 100 ? 33 : 7;
          else c.rows = c.rows > 5 ? c.rows / 3 : 5;
        }
        cases.push_back(c);
      }
  }
  cases.push_back({{WeightDtype::kFp8, 128, 128}, 4096, 100, 257, 1, 1, false, false, false, 0});
  cases.push_back({{WeightDtype::kBf16, 1, 1}, 4096, 70, 300, 2, 1, true, true, false, 0});
  cases.push_back({{WeightDtype::kFp4, 1, 32}, 2048, 64, 130, 1, 2, false, true, true, 3});
  cases.push_back({{WeightDtype::kF32, 1, 1}, 3072, 40, 200, 1, 1, true, false, false, 0});
  cases.push_back({{WeightDtype::kFp8, 128, 128}, 4096, 33, 77, 8, 1, false, true, false, 0});  // wo_a-like
  uint64_t seed = 12000;
  int64_t launches = 0, many_rows = 0;
  for (const Case& c : cases) {
    const int64_t G = c.groups, in = c.in, out = c.out, rows = c.rows;
    const std::string tag = std::string(name_of(c.f.dt)) + " " + std::to_string(c.f.br) + "x" + std::to_string(c.f.bc) +
                            " in=" + std::to_string(in) + " out=" + std::to_string(out) + " rows=" +
                            std::to_string(rows) + " G=" + std::to_string(G) + (c.x_div > 1 ? " x_div" : "") +
                            (c.strided ? " strided" : "") + (c.misaligned ? " misaligned" : "") +
                            (c.row0 ? " row0" : "") + (c.bf16 ? " bf16" : "");
    SCOPED_TRACE(tag);
    const Stored s = make_stored(c.f.dt, c.row0 + G * out, in, 1, c.f.br, c.f.bc, ++seed);
    const DevStored ds(s);
    Rng r(++seed);
    const int64_t xg = in + (c.strided ? 4 : 0), xs = G * xg + (c.strided ? 3 : 0);
    const int64_t yg = out, ys = G * out + (c.strided ? 2 : 0), x_rows = (rows + c.x_div - 1) / c.x_div;
    const int64_t off = c.misaligned ? 1 : 0;  // x one float past a 16-byte boundary
    std::vector<float> x(size_t(off + x_rows * xs));
    for (auto& v : x) v = float(r.normal());
    std::vector<float> want(size_t(rows * ys), -7.0f);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < rows; ++i)
        ops::linear({x.data() + off + g * xg + (i / c.x_div) * xs, s.values.data() + (c.row0 + g * out) * in,
                     want.data() + g * yg + i * ys, 1, in, out, 0, false, c.bf16});
    DeviceBuffer<float> dx(x);
    for (int kernel : {4, 2, 0}) {
      for (const bool fp32_ptr : {false, true}) {
        if (fp32_ptr && (c.f.dt != WeightDtype::kF32 || c.row0 != 0)) continue;  // a.w has no row slice
        DeviceBuffer<float> dy(std::vector<float>(size_t(rows * ys), -7.0f));
        cd::LinearArgs a;
        a.x = dx.get() + off, a.y = dy.get(), a.rows = rows, a.in = in, a.out = out;
        a.x_stride = xs, a.y_stride = ys, a.x_row_div = c.x_div, a.bf16_out = c.bf16, a.kernel = kernel;
        if (G > 1) a.groups = G, a.x_group = xg, a.y_group = yg;
        if (fp32_ptr) a.w = ds.values.get();
        else a.wt = ds.ref(s, c.row0);
        FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "linear"));
        const auto got = dy.to_host();
        expect_bitwise(got, want, tag + " kernel " + std::to_string(kernel) + (fp32_ptr ? " fp32 ptr" : ""));
        int64_t nonzero = 0;  // not a vacuous pass: the outputs were written
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t o = 0; o < G * out; ++o) nonzero += got[size_t(i * ys + o)] != 0.0f;
        EXPECT_GT(nonzero, rows * G * out / 2) << "kernel " << kernel;
        ++launches, many_rows += kernel == 4 && rows >= 64;
      }
    }
  }
  EXPECT_GE(many_rows, 6);
  std::printf("[tiled] %zu cases, %lld launches compared with the CPU twin (kernels 4, 2, 0), %lld tiled launches "
              "of >= 64 rows\n",
              cases.size(), (long long)launches, (long long)many_rows);

  // Refusals (kernel 4 forced where it cannot run): in <= 1024 (the short order), in over 16
  // chunks, sel; nothing is launched (y keeps its sentinel). Kernel 6 does not exist.
  const Stored s = make_stored(WeightDtype::kBf16, 8, 16385, 2, 1, 1, 77);
  const DevStored ds(s);
  DeviceBuffer<float> dx(std::vector<float>(size_t(40 * 16385), 1.0f)), dy(std::vector<float>(size_t(40 * 8), -7.0f));
  DeviceBuffer<int32_t> dsel(std::vector<int32_t>(40, 1));
  cd::LinearArgs a;
  a.x = dx.get(), a.wt = ds.ref(s), a.y = dy.get(), a.rows = 40, a.in = 16385, a.out = 8, a.kernel = 4;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "17 chunks";
  a.in = 1024, a.wt.cols = 1024;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "in = 1024";
  a.in = 2048, a.wt.cols = 2048, a.sel = dsel.get();
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "sel";
  a.sel = nullptr, a.kernel = 6;
  EXPECT_NE(cd::launch_linear(a, 0), cudaSuccess) << "kernel 6";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : dy.to_host()) ASSERT_EQ(v, -7.0f) << "a refused launch wrote y";
  a.kernel = 4;  // the same args without the refusal reasons run
  FS_ASSERT_OK(cuda_status(cd::launch_linear(a, 0), "tiled"));
}

}  // namespace
}  // namespace flashseek::ops::cuda

namespace flashseek::ops::cuda {
namespace {

// The BF16 tensor-core linear (LinearArgs::x_bf16, kernel 5; model_kernels.h, linear_mma.cu) on
// inputs that are BF16 values: the exact products of the CPU twin (ops::linear) summed in another
// FP32 order, so within the reordering bound |Δ| <= 2·in·2^-24·Σ|x·w| (linear_abs_terms) of every
// output; and that order depends on `in` only: a row's outputs are bitwise the same at any row
// count (1, the 8-token decode path, the 32-token prefill path with 1, 2 or 4 output tiles per
// CTA), grouped or per group, and in BF16 output the BF16 rounding of the FP32 result.
TEST(CudaTypedWeights, TensorCoreLinearWithinReorderingBoundAndRowInvariant) {
  FS_REQUIRE_GPU();
  uint64_t seed = 4100;
  int64_t cases = 0;
  double worst = 0;
  for (const Fmt f : {Fmt{WeightDtype::kFp8, 128, 128}, Fmt{WeightDtype::kFp8, 32, 32}, Fmt{WeightDtype::kFp8, 16, 16},
                      Fmt{WeightDtype::kBf16, 1, 1}}) {
    for (const int64_t G : {1, 8}) {
      for (const int64_t in : {256, 1280, 4096}) {
        const int64_t Ro = G == 1 ? 1001 : 40;  // odd tile counts; 40: slices straddle the scale blocks
        const std::string tag = std::string(name_of(f.dt)) + " " + std::to_string(f.bc) + " G=" + std::to_string(G) +
                                " in=" + std::to_string(in);
        SCOPED_TRACE(tag);
        const Stored s = make_stored(f.dt, G * Ro, in, 1, f.br, f.bc, ++seed);
        const DevStored ds(s);
        constexpr int64_t kMaxT = 77;
        Rng r(++seed);
        std::vector<float> x(size_t(kMaxT * G * in));
        for (auto& v : x) v = round_bf16(float(r.normal()));
        DeviceBuffer<float> dx(x);
        // The CPU twin and the magnitude of each output's terms.
        std::vector<float> want(size_t(kMaxT * G * Ro)), mag(want.size());
        for (int64_t t = 0; t < kMaxT; ++t)
          for (int64_t g = 0; g < G; ++g) {
            ops::LinearParams p{x.data() + t * G * in + g * in, s.values.data() + g * Ro * in, nullptr, 1, in, Ro};
            p.y = want.data() + t * G * Ro + g * Ro;
            ops::linear(p);
            p.y = mag.data() + t * G * Ro + g * Ro;
            ops::linear_abs_terms(p);
          }
        auto run = [&](int64_t T, int64_t x_row0, bool bf16_out, int kernel, int mma_tiles = 0, int decode_tiles = 0) {
          DeviceBuffer<float> dy(std::vector<float>(size_t(T * G * Ro), -7.0f));
          cd::LinearArgs a;
          a.x = dx.get() + x_row0 * G * in, a.x_stride = G * in, a.x_group = in;
          a.y = dy.get(), a.y_stride = G * Ro, a.y_group = Ro;
          a.rows = T, a.in = in, a.out = Ro, a.bf16_out = bf16_out, a.groups = G, a.kernel = kernel, a.x_bf16 = true;
          a.wt = ds.ref(s), a.mma_tiles = mma_tiles, a.mma_decode_tiles = decode_tiles;
          EXPECT_TRUE(cd::linear_mma_applies(a));
          EXPECT_EQ(cd::launch_linear(a, 0), cudaSuccess);
          return dy.to_host();
        };
        const std::vector<float> all = run(kMaxT, 0, false, 5), automatic = run(kMaxT, 0, false, 0);
        expect_bitwise(automatic, all, tag + ": x_bf16 picks kernel 5");
        for (const int mt : {1, 2, 4})  // output tiles per CTA (ragged last tiles: Ro 1001 / 40)
          expect_bitwise(run(kMaxT, 0, false, 5, mt), all, tag + ": " + std::to_string(mt) + " output tiles per CTA");
        size_t over = 0;
        for (size_t i = 0; i < all.size(); ++i) {
          const double d = std::fabs(double(all[i]) - double(want[i])), bound = 2.0 * double(in) * 0x1p-24 * mag[i];
          if (mag[i] > 0) worst = std::max(worst, d / mag[i]);
          if (!(d <= bound) && ++over <= 3) ADD_FAILURE() << tag << " [" << i << "] " << all[i] << " vs " << want[i] << " bound " << bound;
        }
        EXPECT_EQ(over, 0u);
        // Row counts: 1 (decode), 6 and 8 (the 8-token path, 1 / 2 / 4 output tiles per CTA), 9
        // and 33 (the 32-token path), from several starting rows: each row's outputs are those of
        // the 77-row launch.
        for (const int64_t T : {1, 6, 8, 9, 33}) {
          const int64_t row0 = T == 1 ? 41 : 3;
          for (const int dt : {0, 1, 2, 4}) {
            if (T > 8 && dt != 0) continue;
            const std::vector<float> part = run(T, row0, false, 5, 0, dt);
            expect_bitwise(part, std::vector<float>(all.begin() + row0 * G * Ro, all.begin() + (row0 + T) * G * Ro),
                           tag + " T=" + std::to_string(T) + " decode tiles " + std::to_string(dt));
          }
        }
        // BF16 output: the rounding of the FP32 result.
        std::vector<float> rounded = all;
        for (auto& v : rounded) v = round_bf16(v);
        expect_bitwise(run(kMaxT, 0, true, 5), rounded, tag + " bf16_out");
        // A group alone (its row slice) gives the grouped launch's outputs.
        if (G > 1) {
          DeviceBuffer<float> dy(std::vector<float>(size_t(6 * Ro), -7.0f));
          cd::LinearArgs a;
          a.x = dx.get() + 5 * in, a.x_stride = G * in, a.y = dy.get(), a.rows = 6, a.in = in, a.out = Ro;
          a.wt = ds.ref(s, 5 * Ro), a.kernel = 5, a.x_bf16 = true;
          EXPECT_EQ(cd::launch_linear(a, 0), cudaSuccess);
          const std::vector<float> one = dy.to_host();
          for (int64_t t = 0; t < 6; ++t)
            expect_bitwise(std::vector<float>(one.begin() + t * Ro, one.begin() + (t + 1) * Ro),
                           std::vector<float>(all.begin() + t * G * Ro + 5 * Ro, all.begin() + t * G * Ro + 6 * Ro),
                           tag + " group 5 alone, row " + std::to_string(t));
        }
        ++cases;
      }
    }
  }
  std::printf("[tensor-core linear] %lld shapes; worst |gpu - cpu| / sum|x*w| = %.3g (bound 2*in*2^-24)\n",
              (long long)cases, worst);
  // Where it does not apply: forced, it refuses; automatic, x_bf16 falls back to the exact kernels.
  const Stored s = make_stored(WeightDtype::kBf16, 8, 96, 1, 1, 1, 7);
  const DevStored ds(s);
  DeviceBuffer<float> dx(std::vector<float>(96, 1.0f)), dy(std::vector<float>(8, 0.0f));
  cd::LinearArgs a;
  a.x = dx.get(), a.wt = ds.ref(s), a.y = dy.get(), a.rows = 1, a.in = 96, a.out = 8, a.x_bf16 = true;
  EXPECT_FALSE(cd::linear_mma_applies(a));
  a.kernel = 5;
  EXPECT_EQ(cd::launch_linear(a, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  a.kernel = 0;
  EXPECT_EQ(cd::launch_linear(a, 0), cudaSuccess);
  // Output tiles per CTA other than 0 / 1 / 2 / 4 are refused, at decode and above 8 rows.
  const Stored s2 = make_stored(WeightDtype::kBf16, 16, 128, 1, 1, 1, 8);
  const DevStored ds2(s2);
  DeviceBuffer<float> dx2(std::vector<float>(9 * 128, 1.0f)), dy2(std::vector<float>(9 * 16, 0.0f));
  cd::LinearArgs b;
  b.x = dx2.get(), b.wt = ds2.ref(s2), b.y = dy2.get(), b.rows = 1, b.in = 128, b.out = 16, b.x_bf16 = true, b.kernel = 5;
  ASSERT_TRUE(cd::linear_mma_applies(b));
  EXPECT_EQ(cd::launch_linear(b, 0), cudaSuccess);
  for (const int bad : {3, -1, 8}) {
    b.mma_decode_tiles = bad, b.mma_tiles = 0, b.rows = 1;
    EXPECT_EQ(cd::launch_linear(b, 0), cudaErrorInvalidValue) << bad;
    b.mma_decode_tiles = 0, b.mma_tiles = bad, b.rows = 9;
    EXPECT_EQ(cd::launch_linear(b, 0), cudaErrorInvalidValue) << bad;
  }
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace flashseek::ops::cuda
