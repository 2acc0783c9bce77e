// make-tiny: random release-format checkpoints. Quantised weights are generated as codes and
// scales first; the values handed to the sink are computed from those codes independently of
// the loader (ldexp of the decoded code), so a round trip checks the loader bit for bit.
#include "model/make_tiny.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/numeric.h"
#include "core/rng.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace flashseek::model {
namespace {

uint64_t name_hash(const std::string& s) {  // FNV-1a 64: stable across platforms
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
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

// Matrices whose output is added into the residual streams (through hc_post, or Engram's gated
// value, whose key half is RMS-normalised so the gate does not change with the scale).
bool residual_branch_output(const std::string& name) {
  return ends_with(name, "attn.wo_b.weight") || ends_with(name, "engram.wkv.weight") ||
         (ends_with(name, "w2.weight") && name.find("experts.") != std::string::npos);
}

// Standard deviation with MakeTinyOptions::well_conditioned applied. Why it works: every branch
// reads an RMS-normalised collapse of the streams, and with the branches 2^-s smaller the streams
// are the embedding (std 1) plus small corrections, so a layer is close to the identity map. A
// flipped FP8 activation code changes one branch output by about one e4m3 step (6-12 %) of one
// input times a weight column; shrunk by 2^-s, that change moves the next layers' normalised
// inputs too little to flip their codes (or their routing / top-k choices), so it stays one local
// change instead of cascading through the layers. s = 8: at s = 4 the tiny models still
// cascade (CPU self-sensitivity median max|Δlogit| 0.19 vs 0.27 unscaled); from s = 6 the
// sensitivity halves with every further binade (tests/forward/sensitivity_test.cpp; docs/cuda.md,
// "Whole-model parity"). A power of two keeps the checkpoint otherwise identical: the generator
// draws the same codes and only the E8M0 (or BF16) scale moves.
double weight_std(const WeightSpec& w, const MakeTinyOptions& opt) {
  const double sd = weight_std(w);
  return opt.well_conditioned && residual_branch_output(w.name) ? std::ldexp(sd, -kWellConditionedShift) : sd;
}

struct Generated {
  std::vector<float> values;                 // logical values (what the loader must return)
  std::vector<std::pair<StoredTensor, std::vector<uint8_t>>> stored;
};

void put_bf16(std::vector<uint8_t>& b, size_t i, float v) {
  const uint16_t h = f32_to_bf16(v);
  std::memcpy(b.data() + 2 * i, &h, 2);
}

// FP8 e4m3 codes with e8m0 scales on blocks [br, bc]; codes use the e4m3 range (~64 sigma units).
void gen_fp8(Normal& g, double sd, int64_t rows, int64_t cols, int64_t br, int64_t bc, Generated& out,
             std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
  const int64_t sr = ceil_div(rows, br), sc = ceil_div(cols, bc);
  scales.resize(size_t(sr * sc));
  std::vector<int> sexp(scales.size());
  for (size_t k = 0; k < scales.size(); ++k) {
    sexp[k] = pow2_exponent(sd / 64.0) + int(g.rng().below(3)) - 1;  // random scales around the target
    scales[k] = uint8_t(sexp[k] + 127);
  }
  codes.resize(size_t(rows * cols));
  out.values.resize(codes.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = size_t((i / br) * sc + j / bc);
      const double x = std::clamp(g.next() * sd / std::ldexp(1.0, sexp[k]), -448.0, 448.0);
      uint8_t code = f32_to_e4m3(float(x));
      if (i == 0 && j == 0) code = 0x7e;  // +448: the largest e4m3 magnitude
      if (i == 0 && j == 1) code = 0x80;  // negative zero
      codes[size_t(i * cols + j)] = code;
      out.values[size_t(i * cols + j)] = float(std::ldexp(double(e4m3_to_f32(code)), sexp[k]));
    }
}

// FP4 e2m1 codes with one e8m0 scale per 32 inputs of a row, packed low nibble first.
void gen_fp4(Normal& g, double sd, int64_t rows, int64_t cols, Generated& out, std::vector<uint8_t>& packed,
             std::vector<uint8_t>& scales) {
  const int64_t groups = cols / 32;
  scales.resize(size_t(rows * groups));
  std::vector<uint8_t> codes(size_t(rows * cols));
  out.values.resize(codes.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int e = pow2_exponent(sd / 2.0) + int(g.rng().below(3)) - 1;
      scales[size_t(i * groups + gi)] = uint8_t(e + 127);
      for (int64_t j = gi * 32; j < (gi + 1) * 32; ++j) {
        uint8_t code = f32_to_e2m1(float(g.next() * sd / std::ldexp(1.0, e)));
        if (i == 0 && j == 0) code = 0x7;  // +6
        if (i == 0 && j == 1) code = 0xf;  // -6
        if (i == 0 && j == 2) code = 0x8;  // -0
        codes[size_t(i * cols + j)] = code;
        out.values[size_t(i * cols + j)] = float(std::ldexp(double(e2m1_to_f32(code)), e));
      }
    }
  packed.resize(size_t(rows * cols / 2));
  pack_fp4(codes.data(), rows, cols, packed.data());
}

// Plain tensors: norms near 1, mHC scales positive, routing tables with distinct ids per row.
Generated gen_plain(Normal& g, const WeightSpec& w, const ModelConfig& c) {
  Generated out;
  const int64_t n = shape_numel(w.shape);
  out.values.resize(size_t(n));
  const bool norm = ends_with(w.name, "norm.weight") || ends_with(w.name, "norm1.weight") ||
                    ends_with(w.name, "norm2.weight");
  if (w.dtype == DType::kI64) {  // tid2eid [vocab, k]: k distinct expert ids per token
    const int64_t k = w.shape[1];
    std::vector<uint8_t> bytes(size_t(n) * 8);
    std::vector<int64_t> perm(size_t(c.n_routed_experts));
    for (int64_t r = 0; r < w.shape[0]; ++r) {
      for (size_t e = 0; e < perm.size(); ++e) perm[e] = int64_t(e);
      for (int64_t j = 0; j < k; ++j) {
        const size_t pick = size_t(j) + size_t(g.rng().below(perm.size() - size_t(j)));
        std::swap(perm[size_t(j)], perm[pick]);
        std::memcpy(bytes.data() + 8 * size_t(r * k + j), &perm[size_t(j)], 8);
        out.values[size_t(r * k + j)] = float(perm[size_t(j)]);
      }
    }
    out.stored.push_back({{w.name, w.dtype, w.shape}, std::move(bytes)});
    return out;
  }
  double sd = weight_std(w), mean = 0;
  if (norm) { mean = 1.0; sd = 0.1; }
  else if (ends_with(w.name, "_scale")) { mean = 0.75; sd = 0.1; }
  else if (ends_with(w.name, "_base") || ends_with(w.name, "ape") || ends_with(w.name, "bias")) sd = 0.3;
  else if (ends_with(w.name, "bias_vl")) sd = 0.3;
  else if (ends_with(w.name, "attn_sink")) sd = 1.0;
  std::vector<uint8_t> bytes(size_t(n) * dtype_size(w.dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = float(mean + sd * g.next());
    if (w.dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
      out.values[size_t(i)] = x;
    } else {
      put_bf16(bytes, size_t(i), x);
      out.values[size_t(i)] = round_bf16(x);
    }
  }
  out.stored.push_back({{w.name, w.dtype, w.shape}, std::move(bytes)});
  return out;
}

Generated generate(const WeightSpec& w, const ModelConfig& c, const MakeTinyOptions& opt) {
  Normal g(opt.seed ^ (name_hash(w.name) * 0x9e3779b97f4a7c15ull));
  if (w.kind == WeightKind::kPlain) return gen_plain(g, w, c);
  const std::vector<StoredTensor> st = release_tensors(w, c);
  const double sd = weight_std(w, opt);
  const int64_t rows = w.shape[0], cols = w.shape[1];
  Generated out;
  std::vector<uint8_t> data, scales;
  if (st[0].dtype == DType::kBF16) {
    data.resize(size_t(rows * cols) * 2);
    out.values.resize(size_t(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float x = float(sd * g.next());
      put_bf16(data, size_t(i), x);
      out.values[size_t(i)] = round_bf16(x);
    }
    out.stored.push_back({st[0], std::move(data)});
    return out;
  }
  if (st[0].dtype == DType::kI8) gen_fp4(g, sd, rows, cols, out, data, scales);
  else if (w.kind == WeightKind::kEngramTable) gen_fp8(g, sd, rows, cols, 1, 32, out, data, scales);
  else gen_fp8(g, sd, rows, cols, c.weight_block_size, c.weight_block_size, out, data, scales);
  out.stored.push_back({st[0], std::move(data)});
  out.stored.push_back({st[1], std::move(scales)});
  return out;
}

Status write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  if (!f) return io_error("{}: cannot create", p.string());
  f << text << "\n";
  if (!f) return io_error("{}: write failed", p.string());
  return {};
}

Status write_side_files(const ModelConfig& c, const std::filesystem::path& dir) {
  FS_RETURN_IF_ERROR(write_text(dir / "config.json", config_to_hf_json(c)));
  std::error_code ec;
  std::filesystem::create_directories(dir / "inference", ec);
  if (ec) return io_error("{}: cannot create: {}", (dir / "inference").string(), ec.message());
  FS_RETURN_IF_ERROR(write_text(dir / "inference" / "config.json", config_to_ref_json(c)));
  if (!c.is_v41() || c.engram_layer_ids.empty()) return {};
  // Identity map when the compressed vocabulary equals the vocabulary (tiny configs); otherwise
  // ids wrap modulo the compressed size (a synthetic map, not a tokenizer's).
  std::vector<int64_t> map(size_t(c.vocab_size));
  for (int64_t i = 0; i < c.vocab_size; ++i) map[size_t(i)] = i % c.engram_compressed_vocab_size;
  nlohmann::json j = {{"description", "synthetic Engram compressed-id map written by flashseek make-tiny"},
                      {"map", map},
                      {"compressed_vocab_size", c.engram_compressed_vocab_size},
                      {"pad_token_id", c.engram_pad_token_id},
                      {"pad_c", map[size_t(c.engram_pad_token_id)]}};
  return write_text(dir / "engram_token_map.json", j.dump());
}

}  // namespace

Status make_tiny_checkpoint(const ModelConfig& cfg_in, const MakeTinyOptions& opt, const std::string& out_dir,
                            const TensorSink& sink) {
  namespace fs = std::filesystem;
  ModelConfig cfg = cfg_in;
  if (opt.bf16) cfg.fp8_weights = cfg.fp4_experts = false;
  FS_RETURN_IF_ERROR(finalize_config(cfg));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error("{}: cannot create: {}", out_dir, ec.message());
  std::vector<WeightSpec> specs = expected_weights(cfg);
  if (!opt.draft)
    std::erase_if(specs, [](const WeightSpec& w) {
      return w.component == Component::kDraftDense || w.component == Component::kDraftExperts;
    });
  // Shard assignment by cumulative bytes, whole weights (with their scales) per shard.
  std::vector<uint64_t> bytes(specs.size());
  uint64_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const auto& t : release_tensors(specs[i], cfg)) bytes[i] += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    total += bytes[i];
  }
  const uint64_t n_shards = std::max<uint64_t>(uint64_t(std::max(opt.min_shards, 1)),
                                               (total + opt.shard_bytes - 1) / opt.shard_bytes);
  std::map<std::string, std::string> weight_map;
  SafetensorsWriter writer;
  uint64_t cum = 0, shard = 0;
  auto shard_name = [&](uint64_t s) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n_shards); };
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t want = std::min<uint64_t>(n_shards - 1, total ? (cum * n_shards) / total : 0);
    while (shard < want) {
      FS_RETURN_IF_ERROR(writer.write((fs::path(out_dir) / shard_name(shard)).string()));
      writer = SafetensorsWriter();
      ++shard;
    }
    cum += bytes[i];
    Generated g = generate(specs[i], cfg, opt);
    if (sink) sink(specs[i].name, specs[i].shape, g.values);
    for (auto& [t, data] : g.stored) {
      weight_map[t.name] = shard_name(shard);
      FS_RETURN_IF_ERROR(writer.add(t.name, t.dtype, t.shape, std::move(data)));
    }
  }
  for (; shard < n_shards; ++shard) {  // trailing shards (may be empty when weights are few)
    FS_RETURN_IF_ERROR(writer.write((fs::path(out_dir) / shard_name(shard)).string()));
    writer = SafetensorsWriter();
  }
  FS_RETURN_IF_ERROR(write_safetensors_index(out_dir, weight_map, total));
  return write_side_files(cfg, out_dir);
}

}  // namespace flashseek::model
