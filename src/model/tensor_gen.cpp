// Random release-format tensors (tensor_gen.h). Every random draw comes from a counter-based
// generator: draw k of a weight's stream is splitmix64's output function applied to (key + k·γ),
// with the key derived from (seed, tensor name, stream). Any element can therefore be generated on
// its own, so a chunk of rows only writes its own bytes and the result is the same whatever the
// chunking, the thread count or the order the chunks run in.
//
// Quantised codes are drawn straight into the stored bytes: each element takes 16 bits of a 64-bit
// draw (four elements per draw) and looks its code up in a 65,536-entry table that maps the
// uniform to the stored code of a normal deviate (the table is the inverse normal CDF at the
// bucket midpoints, scaled and rounded to e4m3 / e2m1 once per distinct scale). There are no FP32
// intermediates for the stored bytes; the values handed back (make-tiny's sink) are computed from
// the stored codes independently of the loader (ldexp of the decoded code), so a round trip checks
// the loader bit for bit.
#include "model/tensor_gen.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/numeric.h"
#include "core/prefault.h"
#include "core/rng.h"
#include "model/quant.h"

namespace flashseek::model {
namespace {

uint64_t name_hash(const std::string& s) {  // FNV-1a 64: stable across platforms
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

uint64_t mix64(uint64_t z) {  // splitmix64's output function
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Draw k of the stream `key` (random access).
inline uint64_t draw(uint64_t key, uint64_t k) { return mix64(key + (k + 1) * kGamma); }

// The independent streams of one weight.
enum Stream : uint64_t { kCodes = 1, kScales = 2, kIds = 3 };

uint64_t stream_key(uint64_t seed, const std::string& name, Stream s) {
  return mix64(mix64(seed ^ (name_hash(name) * kGamma)) + uint64_t(s) * 0xd1b54a32d192ed03ull);
}

// 16-bit uniforms of elements [e0, e0 + n) of the stream (element e: bits 16·(e mod 4) of draw e/4).
void uniforms16(uint64_t key, int64_t e0, int64_t n, uint16_t* out) {
  int64_t e = e0, i = 0;
  while (i < n && (e & 3)) {
    out[i++] = uint16_t(draw(key, uint64_t(e >> 2)) >> (16 * (e & 3)));
    ++e;
  }
  for (; i + 4 <= n; i += 4, e += 4) {
    const uint64_t w = draw(key, uint64_t(e >> 2));
    out[i] = uint16_t(w);
    out[i + 1] = uint16_t(w >> 16);
    out[i + 2] = uint16_t(w >> 32);
    out[i + 3] = uint16_t(w >> 48);
  }
  for (; i < n; ++i, ++e) out[i] = uint16_t(draw(key, uint64_t(e >> 2)) >> (16 * (e & 3)));
}

// Scale exponent offset in {-1, 0, +1} of scale `s` (one byte of a draw per scale).
inline int scale_delta(uint64_t key, int64_t s) {
  const uint32_t b = uint32_t(draw(key, uint64_t(s >> 3)) >> (8 * (s & 7))) & 0xff;
  return int((b * 3) >> 8) - 1;
}

// Inverse of the standard normal CDF (Acklam's rational approximation, refined by one Halley step
// with erfc: accurate to double rounding, enough for 16-bit quantiles).
double inv_normal_cdf(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p > 1 - 0.02425) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// Normal quantiles at the midpoints of the 65,536 buckets of a 16-bit uniform (|q| < 4.2).
const std::array<float, 65536>& normal_table() {
  static const std::array<float, 65536> t = [] {
    std::array<float, 65536> q{};
    for (int u = 0; u < 32768; ++u) {  // symmetric: q[65535 - u] = -q[u]
      q[size_t(u)] = float(inv_normal_cdf((u + 0.5) / 65536.0));
      q[size_t(65535 - u)] = -q[size_t(u)];
    }
    return q;
  }();
  return t;
}

inline float normal16(uint16_t u) { return normal_table()[u]; }

// Code tables for one (format, value scale): the stored code of q[u]·factor·2^-d for the scale
// offsets d = -1, 0, +1 (table d + 1). Built once per distinct factor and shared by every tensor
// and thread that needs it.
using CodeTables = std::array<std::array<uint8_t, 65536>, 3>;

std::shared_ptr<const CodeTables> code_tables(bool fp4, double factor) {
  static std::mutex mu;
  static std::map<std::pair<bool, uint64_t>, std::shared_ptr<const CodeTables>> cache;
  uint64_t bits;
  std::memcpy(&bits, &factor, 8);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find({fp4, bits}); it != cache.end()) return it->second;
  }
  auto t = std::make_shared<CodeTables>();
  const auto& q = normal_table();
  for (int d = -1; d <= 1; ++d)
    for (int u = 0; u < 65536; ++u) {
      const double x = double(q[size_t(u)]) * factor * std::ldexp(1.0, -d);
      (*t)[size_t(d + 1)][size_t(u)] =
          fp4 ? f32_to_e2m1(float(x)) : f32_to_e4m3(float(std::clamp(x, -448.0, 448.0)));
    }
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(std::pair{fp4, bits}, std::move(t)).first->second;
}

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::char_traits<char>::length(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Standard deviation of a weight's values: fan-in scaling; expert gate/up x5 so that some
// SwiGLU pre-activations pass the ±10 clamp (model-v4.md §6).
double weight_std(const WeightSpec& w) {
  const double in = w.shape.size() >= 2 ? double(w.shape.back()) : 1.0;
  if (w.kind == WeightKind::kEngramTable) return 1.0;
  if (w.kind == WeightKind::kExpert && !ends_with(w.name, "w2.weight")) return 5.0 / std::sqrt(in);
  if (w.name == "embed.weight" || ends_with(w.name, "markov_head.embed.weight")) return 1.0;
  if (w.name.find("engram.q_weight") != std::string::npos || w.name.find("engram.k_weight") != std::string::npos)
    return 1.0;
  return 1.0 / std::sqrt(in);
}

int pow2_exponent(double v) { return int(std::lround(std::log2(v))); }

// FP8 e4m3 codes with e8m0 scales on blocks [br, bc] for rows [r0, r1) (r0 a multiple of br).
// Block scales sit around sd/64, so the codes use the e4m3 range (~64 sigma units): scale
// exponent base + d (d drawn in {-1, 0, +1} per block), code = e4m3(N(0,1)·sd / 2^(base + d)).
void gen_fp8(uint64_t key, uint64_t skey, double sd, int64_t cols, int64_t br, int64_t bc, int64_t r0, int64_t r1,
             uint8_t* codes, uint8_t* scales, float* values) {
  const int64_t sc = ceil_div(cols, bc), b0 = r0 / br, b1 = ceil_div(r1, br);
  const int base = pow2_exponent(sd / 64.0);
  const auto tabs = code_tables(false, sd * std::ldexp(1.0, -base));
  std::vector<int8_t> delta(size_t((b1 - b0) * sc));
  for (size_t k = 0; k < delta.size(); ++k) {
    delta[k] = int8_t(scale_delta(skey, b0 * sc + int64_t(k)));
    scales[size_t(b0 * sc) + k] = uint8_t(base + delta[k] + 127);
  }
  std::vector<uint16_t> u(static_cast<size_t>(cols));
  for (int64_t i = r0; i < r1; ++i) {
    uniforms16(key, i * cols, cols, u.data());
    uint8_t* row = codes + size_t(i * cols);
    const int8_t* drow = delta.data() + size_t((i / br - b0) * sc);
    for (int64_t bj = 0; bj < sc; ++bj) {
      const uint8_t* tab = (*tabs)[size_t(drow[bj] + 1)].data();
      const int64_t j1 = std::min(cols, (bj + 1) * bc);
      for (int64_t j = bj * bc; j < j1; ++j) row[j] = tab[u[size_t(j)]];
    }
    if (i == 0) {
      row[0] = 0x7e;                 // +448: the largest e4m3 magnitude
      if (cols > 1) row[1] = 0x80;   // negative zero
    }
    if (values)
      for (int64_t j = 0; j < cols; ++j)
        values[size_t(i * cols + j)] =
            float(std::ldexp(double(e4m3_to_f32(row[j])), base + drow[j / bc]));
  }
}

// FP4 e2m1 codes with one e8m0 scale per 32 inputs of a row, packed low nibble first; scales
// around sd/2 so the codes use the e2m1 range.
void gen_fp4(uint64_t key, uint64_t skey, double sd, int64_t cols, int64_t r0, int64_t r1, uint8_t* packed,
             uint8_t* scales, float* values) {
  const int64_t groups = cols / 32;
  const int base = pow2_exponent(sd / 2.0);
  const auto tabs = code_tables(true, sd * std::ldexp(1.0, -base));
  std::vector<uint16_t> u(static_cast<size_t>(cols));
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<int8_t> delta(static_cast<size_t>(groups));
  for (int64_t i = r0; i < r1; ++i) {
    uniforms16(key, i * cols, cols, u.data());
    for (int64_t gi = 0; gi < groups; ++gi) {
      delta[size_t(gi)] = int8_t(scale_delta(skey, i * groups + gi));
      scales[size_t(i * groups + gi)] = uint8_t(base + delta[size_t(gi)] + 127);
      const uint8_t* tab = (*tabs)[size_t(delta[size_t(gi)] + 1)].data();
      for (int64_t j = gi * 32; j < (gi + 1) * 32; ++j) codes[size_t(j)] = tab[u[size_t(j)]];
    }
    if (i == 0) {
      codes[0] = 0x7;  // +6
      codes[1] = 0xf;  // -6
      codes[2] = 0x8;  // -0
    }
    pack_fp4(codes.data(), 1, cols, packed + size_t(i * cols / 2));
    if (values)
      for (int64_t j = 0; j < cols; ++j)
        values[size_t(i * cols + j)] =
            float(std::ldexp(double(e2m1_to_f32(codes[size_t(j)])), base + delta[size_t(j / 32)]));
  }
}

// tid2eid [vocab, k]: k distinct expert ids per token (one chunk, a sequential stream).
void gen_ids(uint64_t key, const WeightSpec& w, const ModelConfig& c, uint8_t* bytes, float* values) {
  Rng rng(key);
  const int64_t k = w.shape[1];
  std::vector<int64_t> perm(size_t(c.n_routed_experts));
  for (int64_t r = 0; r < w.shape[0]; ++r) {
    for (size_t e = 0; e < perm.size(); ++e) perm[e] = int64_t(e);
    for (int64_t j = 0; j < k; ++j) {
      const size_t pick = size_t(j) + size_t(rng.below(perm.size() - size_t(j)));
      std::swap(perm[size_t(j)], perm[pick]);
      std::memcpy(bytes + 8 * size_t(r * k + j), &perm[size_t(j)], 8);
      if (values) values[size_t(r * k + j)] = float(perm[size_t(j)]);
    }
  }
}

inline float normal_value(double mean, double sd, uint16_t u) { return float(mean + sd * double(normal16(u))); }

// BF16 codes of mean + sd·q[u] for every u, built once per (mean, sd) and shared.
std::shared_ptr<const std::array<uint16_t, 65536>> bf16_table(double mean, double sd) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const std::array<uint16_t, 65536>>> cache;
  std::pair<uint64_t, uint64_t> k;
  std::memcpy(&k.first, &mean, 8);
  std::memcpy(&k.second, &sd, 8);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(k); it != cache.end()) return it->second;
  }
  auto t = std::make_shared<std::array<uint16_t, 65536>>();
  for (int u = 0; u < 65536; ++u) (*t)[size_t(u)] = f32_to_bf16(normal_value(mean, sd, uint16_t(u)));
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(k, std::move(t)).first->second;
}

// BF16 / F32 elements [e0, e1): mean + sd·N(0,1), rounded to the stored type. BF16 tensors of
// more than 64k elements look their codes up in a table of the same function.
void gen_float(uint64_t key, double mean, double sd, DType dt, int64_t e0, int64_t e1, uint8_t* bytes,
               float* values) {
  constexpr int64_t kBatch = 4096;
  uint16_t u[kBatch];
  if (dt == DType::kBF16 && !values && e1 - e0 > 65536) {
    const auto tab = bf16_table(mean, sd);
    for (int64_t e = e0; e < e1; e += kBatch) {
      const int64_t n = std::min(kBatch, e1 - e);
      uniforms16(key, e, n, u);
      uint8_t* out = bytes + 2 * size_t(e);  // no alignment assumed: byte copies of each code
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = (*tab)[u[i]];
        std::memcpy(out + 2 * i, &h, 2);
      }
    }
    return;
  }
  for (int64_t e = e0; e < e1; e += kBatch) {
    const int64_t n = std::min(kBatch, e1 - e);
    uniforms16(key, e, n, u);
    for (int64_t i = 0; i < n; ++i) {
      const float x = normal_value(mean, sd, u[i]);
      if (dt == DType::kF32) {
        std::memcpy(bytes + 4 * size_t(e + i), &x, 4);
        if (values) values[size_t(e + i)] = x;
      } else {
        const uint16_t h = f32_to_bf16(x);
        std::memcpy(bytes + 2 * size_t(e + i), &h, 2);
        if (values) values[size_t(e + i)] = bf16_to_f32(h);
      }
    }
  }
}

// Plain float tensors: norms near 1, mHC scales positive, biases and sinks moderate.
void gen_plain(uint64_t key, const WeightSpec& w, int64_t e0, int64_t e1, uint8_t* bytes, float* values) {
  const bool norm = ends_with(w.name, "norm.weight") || ends_with(w.name, "norm1.weight") ||
                    ends_with(w.name, "norm2.weight");
  double sd = weight_std(w), mean = 0;
  if (norm) { mean = 1.0; sd = 0.1; }
  else if (ends_with(w.name, "_scale")) { mean = 0.75; sd = 0.1; }
  else if (ends_with(w.name, "_base") || ends_with(w.name, "ape") || ends_with(w.name, "bias")) sd = 0.3;
  else if (ends_with(w.name, "bias_vl")) sd = 0.3;
  else if (ends_with(w.name, "attn_sink")) sd = 1.0;
  gen_float(key, mean, sd, w.dtype == DType::kF32 ? DType::kF32 : DType::kBF16, e0, e1, bytes, values);
}

}  // namespace

WeightGen plan_weight(const WeightSpec& spec, const ModelConfig& cfg, int64_t chunk_elems) {
  WeightGen w;
  w.spec = spec;
  w.stored = release_tensors(spec, cfg);
  for (const auto& t : w.stored) w.bytes.push_back(uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype));
  w.rows = spec.shape.empty() ? 1 : spec.shape[0];
  w.cols = w.rows ? shape_numel(spec.shape) / w.rows : 0;
  w.rows_per_chunk = std::max<int64_t>(w.rows, 1);
  const bool ints = spec.kind == WeightKind::kPlain && spec.dtype == DType::kI64;
  if (!ints && w.rows * w.cols > chunk_elems) {
    // FP8 blocks never straddle two chunks (the scales of a block row belong to one chunk).
    const int64_t br = w.stored.size() == 2 && w.stored[0].dtype == DType::kF8E4M3 &&
                               spec.kind != WeightKind::kEngramTable
                           ? cfg.weight_block_size
                           : 1;
    int64_t r = std::max<int64_t>(1, chunk_elems / std::max<int64_t>(w.cols, 1));
    w.rows_per_chunk = ceil_div(r, br) * br;
  }
  w.chunks = std::max<int64_t>(1, ceil_div(w.rows, w.rows_per_chunk));
  return w;
}

void generate_chunk(const WeightGen& w, const ModelConfig& c, uint64_t seed, int64_t chunk, uint8_t* const* dst,
                    float* values) {
  const WeightSpec& s = w.spec;
  const uint64_t key = stream_key(seed, s.name, kCodes), skey = stream_key(seed, s.name, kScales);
  const int64_t r0 = chunk * w.rows_per_chunk, r1 = std::min(w.rows, r0 + w.rows_per_chunk);
  if (s.kind == WeightKind::kPlain) {
    if (s.dtype != DType::kI64) gen_plain(key, s, r0 * w.cols, r1 * w.cols, dst[0], values);
    else gen_ids(stream_key(seed, s.name, kIds), s, c, dst[0], values);
    return;
  }
  const double sd = std::ldexp(weight_std(s), -w.std_shift);
  const DType dt = w.stored[0].dtype;
  if (dt == DType::kBF16) {
    gen_float(key, 0.0, sd, DType::kBF16, r0 * w.cols, r1 * w.cols, dst[0], values);
  } else if (dt == DType::kI8) {
    gen_fp4(key, skey, sd, w.cols, r0, r1, dst[0], dst[1], values);
  } else if (s.kind == WeightKind::kEngramTable) {
    gen_fp8(key, skey, sd, w.cols, 1, 32, r0, r1, dst[0], dst[1], values);
  } else {
    gen_fp8(key, skey, sd, w.cols, c.weight_block_size, c.weight_block_size, r0, r1, dst[0], dst[1], values);
  }
}

void generate_weights(const std::vector<WeightGen>& gens, const std::vector<WeightPlace>& place,
                      const std::vector<uint8_t*>& images, const ModelConfig& cfg, uint64_t seed, int threads,
                      std::vector<std::vector<float>>* values) {
  struct Task {
    size_t weight;
    int64_t chunk;
    uint64_t bytes;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < gens.size(); ++i) {
    const uint64_t per = gens[i].total_bytes() / uint64_t(gens[i].chunks) + 1;
    for (int64_t c = 0; c < gens[i].chunks; ++c) tasks.push_back({i, c, per});
    if (values) (*values)[i].assign(size_t(gens[i].rows * gens[i].cols), 0.0f);
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.bytes > b.bytes; });
  run_tasks(int64_t(tasks.size()), threads, [&](int64_t t) {
    const Task& task = tasks[size_t(t)];
    const WeightPlace& p = place[task.weight];
    const WeightGen& g = gens[task.weight];
    std::vector<uint8_t*> dst;
    for (size_t k = 0; k < p.offsets.size(); ++k) {
      dst.push_back(images[p.image] + p.offsets[k]);
      // The chunk's share of each stored tensor (rows are contiguous), prefaulted by this thread.
      const int64_t r0 = task.chunk * g.rows_per_chunk, r1 = std::min(g.rows, r0 + g.rows_per_chunk);
      const uint64_t b0 = g.bytes[k] * uint64_t(r0) / uint64_t(std::max<int64_t>(g.rows, 1));
      const uint64_t b1 = g.bytes[k] * uint64_t(r1) / uint64_t(std::max<int64_t>(g.rows, 1));
      prefault_for_write(dst.back() + b0, b1 - b0);
    }
    generate_chunk(gens[task.weight], cfg, seed, task.chunk, dst.data(),
                   values ? (*values)[task.weight].data() : nullptr);
  });
}

void run_tasks(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = int(std::min<int64_t>(threads, std::max<int64_t>(n, 1)));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t t; (t = next.fetch_add(1)) < n;) fn(t);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace flashseek::model
