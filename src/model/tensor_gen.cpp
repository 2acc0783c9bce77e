// Random release-format tensors (tensor_gen.h). Quantised weights are generated as codes and
// scales first; the values handed back are computed from those codes independently of the
// loader (ldexp of the decoded code), so a round trip checks the loader bit for bit.
#include "model/tensor_gen.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/numeric.h"
#include "core/rng.h"
#include "model/quant.h"

namespace flashseek::model {
namespace {

uint64_t name_hash(const std::string& s) {  // FNV-1a 64: stable across platforms
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

uint64_t chunk_seed(uint64_t seed, const std::string& name, int64_t chunk) {
  uint64_t s = seed ^ (name_hash(name) * 0x9e3779b97f4a7c15ull);
  if (chunk == 0) return s;
  Rng mix(s + uint64_t(chunk) * 0xd1b54a32d192ed03ull);
  return mix.next_u64();
}

// Normal deviates two at a time (Box-Muller with both branches) for speed on big embeddings.
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  double next() {
    if (have_) { have_ = false; return spare_; }
    double u1 = rng_.uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * rng_.uniform();
    spare_ = r * std::sin(th);
    have_ = true;
    return r * std::cos(th);
  }
  Rng& rng() { return rng_; }

 private:
  Rng rng_;
  double spare_ = 0;
  bool have_ = false;
};

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

void put_bf16(uint8_t* b, size_t i, float v) {
  const uint16_t h = f32_to_bf16(v);
  std::memcpy(b + 2 * i, &h, 2);
}

// FP8 e4m3 codes with e8m0 scales on blocks [br, bc] for rows [r0, r1) (r0 a multiple of br):
// the chunk's scales first, then its codes; codes use the e4m3 range (~64 sigma units).
void gen_fp8(Normal& g, double sd, int64_t cols, int64_t br, int64_t bc, int64_t r0, int64_t r1,
             uint8_t* codes, uint8_t* scales, float* values) {
  const int64_t sc = ceil_div(cols, bc), b0 = r0 / br, b1 = ceil_div(r1, br);
  std::vector<int> sexp(size_t((b1 - b0) * sc));
  for (size_t k = 0; k < sexp.size(); ++k) {
    sexp[k] = pow2_exponent(sd / 64.0) + int(g.rng().below(3)) - 1;  // random scales around the target
    scales[size_t(b0 * sc) + k] = uint8_t(sexp[k] + 127);
  }
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = size_t((i / br - b0) * sc + j / bc);
      const double x = std::clamp(g.next() * sd / std::ldexp(1.0, sexp[k]), -448.0, 448.0);
      uint8_t code = f32_to_e4m3(float(x));
      if (i == 0 && j == 0) code = 0x7e;  // +448: the largest e4m3 magnitude
      if (i == 0 && j == 1) code = 0x80;  // negative zero
      codes[size_t(i * cols + j)] = code;
      if (values) values[size_t(i * cols + j)] = float(std::ldexp(double(e4m3_to_f32(code)), sexp[k]));
    }
}

// FP4 e2m1 codes with one e8m0 scale per 32 inputs of a row, packed low nibble first.
void gen_fp4(Normal& g, double sd, int64_t cols, int64_t r0, int64_t r1, uint8_t* packed, uint8_t* scales,
             float* values) {
  const int64_t groups = cols / 32;
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int e = pow2_exponent(sd / 2.0) + int(g.rng().below(3)) - 1;
      scales[size_t(i * groups + gi)] = uint8_t(e + 127);
      for (int64_t j = gi * 32; j < (gi + 1) * 32; ++j) {
        uint8_t code = f32_to_e2m1(float(g.next() * sd / std::ldexp(1.0, e)));
        if (i == 0 && j == 0) code = 0x7;  // +6
        if (i == 0 && j == 1) code = 0xf;  // -6
        if (i == 0 && j == 2) code = 0x8;  // -0
        codes[size_t(j)] = code;
        if (values) values[size_t(i * cols + j)] = float(std::ldexp(double(e2m1_to_f32(code)), e));
      }
    }
    pack_fp4(codes.data(), 1, cols, packed + size_t(i * cols / 2));
  }
}

// tid2eid [vocab, k]: k distinct expert ids per token (one chunk).
void gen_ids(Normal& g, const WeightSpec& w, const ModelConfig& c, uint8_t* bytes, float* values) {
  const int64_t k = w.shape[1];
  std::vector<int64_t> perm(size_t(c.n_routed_experts));
  for (int64_t r = 0; r < w.shape[0]; ++r) {
    for (size_t e = 0; e < perm.size(); ++e) perm[e] = int64_t(e);
    for (int64_t j = 0; j < k; ++j) {
      const size_t pick = size_t(j) + size_t(g.rng().below(perm.size() - size_t(j)));
      std::swap(perm[size_t(j)], perm[pick]);
      std::memcpy(bytes + 8 * size_t(r * k + j), &perm[size_t(j)], 8);
      if (values) values[size_t(r * k + j)] = float(perm[size_t(j)]);
    }
  }
}

// Plain float tensors: norms near 1, mHC scales positive, biases and sinks moderate.
void gen_plain(Normal& g, const WeightSpec& w, int64_t e0, int64_t e1, uint8_t* bytes, float* values) {
  const bool norm = ends_with(w.name, "norm.weight") || ends_with(w.name, "norm1.weight") ||
                    ends_with(w.name, "norm2.weight");
  double sd = weight_std(w), mean = 0;
  if (norm) { mean = 1.0; sd = 0.1; }
  else if (ends_with(w.name, "_scale")) { mean = 0.75; sd = 0.1; }
  else if (ends_with(w.name, "_base") || ends_with(w.name, "ape") || ends_with(w.name, "bias")) sd = 0.3;
  else if (ends_with(w.name, "bias_vl")) sd = 0.3;
  else if (ends_with(w.name, "attn_sink")) sd = 1.0;
  for (int64_t i = e0; i < e1; ++i) {
    const float x = float(mean + sd * g.next());
    if (w.dtype == DType::kF32) {
      std::memcpy(bytes + 4 * i, &x, 4);
      if (values) values[size_t(i)] = x;
    } else {
      put_bf16(bytes, size_t(i), x);
      if (values) values[size_t(i)] = round_bf16(x);
    }
  }
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
  Normal g(chunk_seed(seed, w.spec.name, chunk));
  const int64_t r0 = chunk * w.rows_per_chunk, r1 = std::min(w.rows, r0 + w.rows_per_chunk);
  const WeightSpec& s = w.spec;
  if (s.kind == WeightKind::kPlain) {
    if (s.dtype != DType::kI64) gen_plain(g, s, r0 * w.cols, r1 * w.cols, dst[0], values);
    else gen_ids(g, s, c, dst[0], values);
    return;
  }
  const double sd = std::ldexp(weight_std(s), -w.std_shift);
  const DType dt = w.stored[0].dtype;
  if (dt == DType::kBF16) {
    for (int64_t i = r0 * w.cols; i < r1 * w.cols; ++i) {
      const float x = float(sd * g.next());
      put_bf16(dst[0], size_t(i), x);
      if (values) values[size_t(i)] = round_bf16(x);
    }
  } else if (dt == DType::kI8) {
    gen_fp4(g, sd, w.cols, r0, r1, dst[0], dst[1], values);
  } else if (s.kind == WeightKind::kEngramTable) {
    gen_fp8(g, sd, w.cols, 1, 32, r0, r1, dst[0], dst[1], values);
  } else {
    gen_fp8(g, sd, w.cols, c.weight_block_size, c.weight_block_size, r0, r1, dst[0], dst[1], values);
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
    std::vector<uint8_t*> dst;
    for (uint64_t off : p.offsets) dst.push_back(images[p.image] + off);
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
