// DeepSeek-V4 oracle tests (docs/oracles.md): tiny release-format checkpoints with random weights
// whose fp32 logits were computed by HF transformers 5.17 (DeepseekV4ForCausalLM, eager, no
// cache) and cross-checked by an independent fp64 implementation of the spec
// (scripts/oracle/make_v4_fixtures.py). Fixtures: tests/golden/v4-tiny-{a,b}.tgz.
//
// 1. model::Checkpoint opens and validates them, and its dequant_f32 equals the script's own
//    dequantisation (FP8 e4m3 + E8M0 128x128 blocks, FP4 e2m1 + per-32 scales, BF16, F32, I64).
// 2. forward::load_model(dir, kExact) reproduces the prefill logits (median over positions of
//    max|Δlogit| < 1e-3, 99th percentile < 5e-2) and the 40-token greedy continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "forward/model.h"  // forward::load_model
#include "model/checkpoint.h"
#include "test_util.h"

namespace flashseek {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ------------------------------------------------------------------ fixtures and .npy files

// Extracts tests/golden/<name>.tgz once per process; the directory lives until exit.
const fs::path& fixture_dir(const std::string& name) {
  static testing::TempDir root;
  static std::map<std::string, fs::path> done;
  auto it = done.find(name);
  if (it != done.end()) return it->second;
  const fs::path tgz = testing::source_dir() / "tests" / "golden" / (name + ".tgz");
  const auto r = testing::run_command("tar xzf '" + tgz.string() + "' -C '" + root.path().string() + "'");
  EXPECT_EQ(r.exit_code, 0) << "extracting " << tgz << ": " << r.output;
  return done.emplace(name, root.path() / name).first->second;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << "cannot open " << p;
  return f.good() ? json::parse(f) : json();
}

// A little-endian C-order .npy array (format 1.0-3.0) of float32 or int64.
struct Npy {
  std::string descr;            // "<f4" or "<i8"
  std::vector<int64_t> shape;   // outermost first
  std::vector<char> bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  const int64_t* i64() const { return reinterpret_cast<const int64_t*>(bytes.data()); }
};

// Returns an error message, empty on success.
std::string read_npy(const fs::path& p, Npy& out) {
  std::ifstream f(p, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (all.size() < 10 || all.compare(0, 6, "\x93NUMPY") != 0) return p.string() + ": not a .npy file";
  const int major = static_cast<unsigned char>(all[6]);
  size_t hlen = 0, hoff = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(all[8]) | (static_cast<unsigned char>(all[9]) << 8);
    hoff = 10;
  } else {
    uint32_t v = 0;
    std::memcpy(&v, all.data() + 8, 4);
    hlen = v;
    hoff = 12;
  }
  if (hoff + hlen > all.size()) return p.string() + ": truncated header";
  const std::string h = all.substr(hoff, hlen);
  auto field = [&](const std::string& key) {
    const size_t k = h.find("'" + key + "'");
    return k == std::string::npos ? std::string() : h.substr(h.find(':', k) + 1);
  };
  const std::string d = field("descr");
  out.descr = d.substr(d.find('\'') + 1, 3);
  if (out.descr != "<f4" && out.descr != "<i8") return p.string() + ": unsupported dtype " + out.descr;
  if (field("fortran_order").find("False") > 2) return p.string() + ": fortran order is not supported";
  const std::string s = field("shape");
  std::stringstream ss(s.substr(s.find('(') + 1, s.find(')') - s.find('(') - 1));
  for (std::string tok; std::getline(ss, tok, ',');)
    if (tok.find_first_of("0123456789") != std::string::npos) out.shape.push_back(std::stoll(tok));
  const size_t nbytes = size_t(out.numel()) * 4 * (out.descr == "<i8" ? 2 : 1);
  if (hoff + hlen + nbytes != all.size()) return p.string() + ": data size does not match the shape";
  out.bytes.assign(all.begin() + long(hoff + hlen), all.end());
  return {};
}

// ------------------------------------------------------------------ statistics

struct DiffStats {
  double median = 0, p99 = 0, max = 0;
  int argmax_agree = 0;
};

// Per-row max |a - b| over [rows, cols] -> median / p99 (numpy's linear interpolation) / max.
DiffStats row_diff_stats(const float* a, const float* b, int64_t rows, int64_t cols) {
  std::vector<double> d(size_t(rows), 0.0);
  DiffStats s;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a + r * cols;
    const float* y = b + r * cols;
    for (int64_t c = 0; c < cols; ++c) d[size_t(r)] = std::max(d[size_t(r)], double(std::fabs(x[c] - y[c])));
    s.argmax_agree += (std::max_element(x, x + cols) - x) == (std::max_element(y, y + cols) - y);
  }
  std::sort(d.begin(), d.end());
  auto pct = [&](double q) {
    const double pos = q * double(rows - 1);
    const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, size_t(rows - 1));
    return d[lo] + (d[hi] - d[lo]) * (pos - double(lo));
  };
  s.median = pct(0.5);
  s.p99 = pct(0.99);
  s.max = d.back();
  return s;
}

TEST(V4OracleStats, RowDiffStatsOnKnownRows) {
  // Rows differ by 0, 1, 2, ..., 100 at one column: median 50, p99 99, max 100.
  const int64_t rows = 101, cols = 3;
  std::vector<float> a(size_t(rows * cols), 0.f), b = a;
  for (int64_t r = 0; r < rows; ++r) b[size_t(r * cols + 1)] = float(r);
  const DiffStats s = row_diff_stats(a.data(), b.data(), rows, cols);
  EXPECT_DOUBLE_EQ(s.median, 50.0);
  EXPECT_DOUBLE_EQ(s.p99, 99.0);
  EXPECT_DOUBLE_EQ(s.max, 100.0);
  EXPECT_EQ(s.argmax_agree, 1);  // only row 0 keeps its argmax at column 0
}

TEST(V4OracleStats, NpyReaderRejectsBadFiles) {
  testing::TempDir tmp;
  const fs::path p = tmp.path() / "bad.npy";
  std::ofstream(p, std::ios::binary) << "not numpy at all";
  Npy n;
  EXPECT_NE(read_npy(p, n).find("not a .npy"), std::string::npos);
}

// The fixture script's numpy-only self-check (FP8/FP4/E8M0/BF16 codecs against hand-computed
// values, safetensors writer, checkpoint layout): needs a python3 with numpy.
TEST(V4OracleScript, FormatSelfCheckPasses) {
  std::string py;
  for (const char* cand : {"python3", "/usr/bin/python3"})
    if (testing::run_command(std::string(cand) + " -c 'import numpy'").exit_code == 0) {
      py = cand;
      break;
    }
  if (py.empty()) FS_SKIP_UNLESS_CI("no python3 with numpy on this machine");
  const fs::path script = testing::source_dir() / "scripts" / "oracle" / "make_v4_fixtures.py";
  const auto r = testing::run_command(py + " -B '" + script.string() + "' --selfcheck");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v4_format selfcheck: ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("v4_checkpoint selfcheck: ok"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------ checkpoint loading

class V4Oracle : public ::testing::TestWithParam<std::string> {
 protected:
  const fs::path& dir() { return fixture_dir(GetParam()); }
};

TEST_P(V4Oracle, CheckpointOpensAndValidates) {
  auto ck = model::Checkpoint::open(dir().string(), /*validate=*/false);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const model::ValidationReport rep = ck->validate();
  for (const auto& e : rep.errors) ADD_FAILURE() << "validation error: " << e;
  for (const auto& w : rep.warnings) std::cout << "  validation warning: " << w << "\n";
  EXPECT_TRUE(model::Checkpoint::open(dir().string(), /*validate=*/true).ok());

  const json cfg = read_json(dir() / "config.json");
  const model::ModelConfig& c = ck->config();
  EXPECT_EQ(c.family, model::Family::kV4);
  EXPECT_EQ(c.num_layers, cfg["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c.num_heads, cfg["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, cfg["head_dim"].get<int64_t>());
  EXPECT_EQ(c.rope_head_dim, cfg["qk_rope_head_dim"].get<int64_t>());
  EXPECT_EQ(c.window, cfg["sliding_window"].get<int64_t>());
  EXPECT_EQ(c.index_topk, cfg["index_topk"].get<int64_t>());
  EXPECT_EQ(c.num_hash_layers, cfg["num_hash_layers"].get<int64_t>());
  EXPECT_EQ(c.compress_ratios, cfg["compress_ratios"].get<std::vector<int>>());
  EXPECT_EQ(c.rms_norm_eps, cfg["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.rope_factor, 16.0);
  EXPECT_EQ(c.original_seq_len, 65536);

  // Every tensor of the index is reachable, whichever shard holds it.
  const json idx = read_json(dir() / "model.safetensors.index.json");
  for (const auto& [name, file] : idx["weight_map"].items()) EXPECT_TRUE(ck->has(name)) << name;
}

TEST_P(V4Oracle, DequantEqualsTheScriptsDequantisation) {
  auto ck = model::Checkpoint::open(dir().string(), /*validate=*/false);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const json expected = read_json(dir() / "expected.json");
  ASSERT_GE(expected["reference_tensors"].size(), 8u);
  for (const auto& [name, file] : expected["reference_tensors"].items()) {
    SCOPED_TRACE(name);
    Npy ref;
    const std::string err = read_npy(dir() / file.get<std::string>(), ref);
    ASSERT_TRUE(err.empty()) << err;
    if (ref.descr == "<i8") {
      auto ints = ck->read_ints(name);
      ASSERT_TRUE(ints.ok()) << ints.status().message();
      ASSERT_EQ(int64_t(ints->size()), ref.numel());
      EXPECT_TRUE(std::equal(ints->begin(), ints->end(), ref.i64()));
      continue;
    }
    auto shape = ck->logical_shape(name);
    ASSERT_TRUE(shape.ok()) << shape.status().message();
    EXPECT_EQ(*shape, ref.shape);
    auto got = ck->dequant_f32(name);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(int64_t(got->size()), ref.numel());
    // Every stored format dequantises exactly (power-of-two scales), so equality is bitwise.
    int64_t bad = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) bad += (*got)[size_t(i)] != ref.f32()[i];
    EXPECT_EQ(bad, 0) << "of " << ref.numel() << " values differ";
  }
}

// ------------------------------------------------------------------ the forward pass

// Loads the V4 model in exact numerics. The fixtures are valid V4 checkpoints, so any loader
// error (whatever its code) is a failure, never a skip.
std::unique_ptr<forward::Model> load_exact(const fs::path& dir) {
  auto m = forward::load_model(dir.string(), forward::Numerics::kExact);
  if (m.ok()) return std::move(m).value();
  ADD_FAILURE() << "load_model(" << dir << "): " << m.status().to_string();
  return nullptr;
}

// Feeds `tokens` to `st` as one chunk; returns logits [T or 1, vocab].
std::vector<float> run_tokens(forward::Model& m, forward::SequenceState& st,
                              const std::vector<int32_t>& tokens, bool all_logits) {
  forward::BatchItem item{&st, std::span<const int32_t>(tokens), all_logits};
  std::vector<float> logits;
  const Status s = m.forward(std::span<forward::BatchItem>(&item, 1), logits);
  EXPECT_TRUE(s.ok()) << s.message();
  return logits;
}

std::vector<int32_t> as_ids(const json& j) {
  std::vector<int32_t> v;
  for (const auto& x : j) v.push_back(x.get<int32_t>());
  return v;
}

TEST_P(V4Oracle, PrefillLogitsMatchTransformers) {
  auto m = load_exact(dir());
  ASSERT_NE(m, nullptr);
  const json expected = read_json(dir() / "expected.json");
  const std::vector<int32_t> tokens = as_ids(expected["tokens"]);
  Npy ref, spec;
  ASSERT_EQ(read_npy(dir() / "logits_prefill.npy", ref), "");
  ASSERT_EQ(read_npy(dir() / "logits_prefill_spec_ref.npy", spec), "");
  const int64_t T = int64_t(tokens.size()), V = m->config().vocab_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));

  auto st = m->new_sequence();
  const std::vector<float> got = run_tokens(*m, *st, tokens, /*all_logits=*/true);
  ASSERT_EQ(int64_t(got.size()), T * V);
  const DiffStats s = row_diff_stats(got.data(), ref.f32(), T, V);
  const DiffStats s_spec = row_diff_stats(got.data(), spec.f32(), T, V);
  std::cout << "  vs transformers: median " << s.median << " p99 " << s.p99 << " max " << s.max
            << " argmax " << s.argmax_agree << "/" << T << "; vs fp64 spec ref: median "
            << s_spec.median << " max " << s_spec.max << "\n";
  const json& th = expected["thresholds"];
  EXPECT_LT(s.median, th["median_max_abs"].get<double>());
  EXPECT_LT(s.p99, th["p99_max_abs"].get<double>());
}

TEST_P(V4Oracle, GreedyContinuationMatchesTransformers) {
  auto m = load_exact(dir());
  ASSERT_NE(m, nullptr);
  const json expected = read_json(dir() / "expected.json");
  const std::vector<int32_t> prompt = as_ids(expected["greedy_prompt"]);
  const std::vector<int32_t> want = as_ids(expected["greedy_output"]);
  const int64_t V = m->config().vocab_size;
  // The engine's own path: one prefill chunk, then decode steps on the same state.
  auto st = m->new_sequence();
  std::vector<float> row = run_tokens(*m, *st, prompt, /*all_logits=*/false);
  std::vector<int32_t> got;
  for (size_t i = 0; i < want.size() && int64_t(row.size()) == V; ++i) {
    got.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    if (i + 1 < want.size()) row = run_tokens(*m, *st, {got.back()}, false);
  }
  int agree = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()) && got[i] == want[i]; ++i) ++agree;
  EXPECT_EQ(agree, int(want.size())) << "greedy tokens agree up to step " << agree;
}
INSTANTIATE_TEST_SUITE_P(Fixtures, V4Oracle, ::testing::Values("v4-tiny-a", "v4-tiny-b"));

}  // namespace
}  // namespace flashseek
