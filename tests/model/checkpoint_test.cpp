// Checkpoint validation on deliberately broken copies of a make-tiny checkpoint: every problem
// is an error naming the tensor and the file; unexpected tensors are warnings.
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "model/checkpoint.h"
#include "model/make_tiny.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

struct Raw {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};
using Tensors = std::map<std::string, Raw>;

// Writes `config` (tiny-v41 by default) into `dir`, loads every tensor, applies `mutate`, and
// rewrites the checkpoint as one shard "model-00001-of-00001.safetensors" with a matching index.
void make_broken(const std::string& dir, const std::function<void(Tensors&)>& mutate,
                 const char* config = "tiny-v41") {
  ASSERT_TRUE(make_tiny_checkpoint(*builtin_config(config), {}, dir).ok());
  Tensors all;
  {
    auto s = ShardedSafetensors::open_dir(dir);
    ASSERT_TRUE(s.ok());
    for (const auto& f : s->files())
      for (const auto& t : f.tensors()) {
        auto b = f.bytes(t);
        all[t.name] = {t.dtype, t.shape, {b.begin(), b.end()}};
      }
  }
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") std::filesystem::remove(e.path());
  mutate(all);
  SafetensorsWriter w;
  std::map<std::string, std::string> wm;
  for (auto& [n, r] : all) {
    ASSERT_TRUE(w.add(n, r.dtype, r.shape, r.bytes).ok()) << n;
    wm[n] = "model-00001-of-00001.safetensors";
  }
  ASSERT_TRUE(w.write(dir + "/model-00001-of-00001.safetensors").ok());
  ASSERT_TRUE(write_safetensors_index(dir, wm, w.data_bytes()).ok());
}

struct BrokenCase {
  const char* what;
  std::function<void(Tensors&)> mutate;
  const char* tensor;   // must be named in the error
  const char* detail;   // and this detail
};
void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.what; }

class BrokenCheckpoint : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenCheckpoint, ErrorNamesTensorAndFile) {
  testutil::TempDir d;
  make_broken(d.path(), GetParam().mutate);
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.ok()) << GetParam().what;
  const std::string& m = ck.status().message();
  EXPECT_NE(m.find(GetParam().tensor), std::string::npos) << m;
  EXPECT_NE(m.find(GetParam().detail), std::string::npos) << m;
  // The error names where to look: the shard (present tensors) or the directory (missing ones).
  EXPECT_TRUE(m.find("model-00001-of-00001.safetensors") != std::string::npos || m.find(d.path()) != std::string::npos) << m;
  auto lax = Checkpoint::open(d.path(), /*validate=*/false);
  ASSERT_TRUE(lax.ok()) << lax.status().to_string();
  EXPECT_FALSE(lax->validation().ok());
}

const BrokenCase kBroken[] = {
    {"missing weight", [](Tensors& t) { t.erase("layers.2.attn.wkv.weight"); t.erase("layers.2.attn.wkv.scale"); },
     "layers.2.attn.wkv.weight", "missing"},
    {"missing draft head", [](Tensors& t) { t.erase("mtp.2.markov_head.head.weight"); },
     "mtp.2.markov_head.head.weight", "missing"},
    {"draft stage 1 absent, stages 0 and 2 present",
     [](Tensors& t) { std::erase_if(t, [](const auto& kv) { return kv.first.rfind("mtp.1.", 0) == 0; }); },
     // The message lists at most 8 problems, in the expected-weight order (hc_* first): any
     // tensor of stage 1 reported missing proves the property, not one particular tensor.
     "missing tensor mtp.1.", "missing"},
    {"mis-shaped norm",
     [](Tensors& t) { auto& r = t["layers.0.attn_norm.weight"]; r.shape = {127}; r.bytes.resize(254); },
     "layers.0.attn_norm.weight", "expected [128]"},
    {"wrong dtype", [](Tensors& t) { t["layers.0.attn.attn_sink"].dtype = DType::kI32; },
     "layers.0.attn.attn_sink", "dtype I32"},
    {"FP8 without scale", [](Tensors& t) { t.erase("layers.0.attn.wq_a.scale"); }, "layers.0.attn.wq_a.weight",
     "layers.0.attn.wq_a.scale"},
    {"scale of wrong shape",
     [](Tensors& t) { auto& r = t["layers.3.attn.wo_b.scale"]; r.shape = {2, 4}; r.bytes.resize(8); },
     "layers.3.attn.wo_b.scale", "expected [4, 2]"},
    {"scale of wrong dtype", [](Tensors& t) { t["layers.3.attn.wo_b.scale"].dtype = DType::kU8; },
     "layers.3.attn.wo_b.scale", "F8_E8M0"},
    {"FP4 expert of wrong packed shape",
     [](Tensors& t) { auto& r = t["layers.1.ffn.experts.2.w1.weight"]; r.shape = {128, 32}; },
     "layers.1.ffn.experts.2.w1.weight", "expected [64, 64]"},
    {"Engram table scale missing", [](Tensors& t) { t.erase("layers.4.engram.embed.scale"); },
     "layers.4.engram.embed.weight", "scale"},
    {"routing table as float",
     [](Tensors& t) { t["layers.0.ffn.gate.bias"].dtype = DType::kI32; }, "layers.0.ffn.gate.bias", "dtype"},
};

INSTANTIATE_TEST_SUITE_P(Cases, BrokenCheckpoint, ::testing::ValuesIn(kBroken), [](const auto& info) {
  std::string n;
  for (const char* c = info.param.what; *c; ++c) n += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  return n;
});

// A config that declares draft layers (V4 MTP, V4.1 DSpark) with none of their tensors in the
// checkpoint validates with exactly one warning, and flags the draft as absent.
TEST(Checkpoint, DeclaredDraftWithoutTensorsIsOneWarning) {
  for (const char* name : {"tiny-v4", "tiny-v41"}) {
    SCOPED_TRACE(name);
    testutil::TempDir d;
    ASSERT_TRUE(make_tiny_checkpoint(*builtin_config(name), {.draft = false}, d.path()).ok());
    auto ck = Checkpoint::open(d.path());
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_GT(ck->config().num_mtp_layers, 0);
    EXPECT_FALSE(ck->has("mtp.0.attn.wq_a.weight"));
    const ValidationReport& r = ck->validation();
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(r.draft_absent);
    ASSERT_EQ(r.warnings.size(), 1u) << ::testing::PrintToString(r.warnings);
    EXPECT_NE(r.warnings[0].find("mtp.*"), std::string::npos) << r.warnings[0];
    // The full checkpoint has its draft.
    testutil::TempDir full;
    ASSERT_TRUE(make_tiny_checkpoint(*builtin_config(name), {}, full.path()).ok());
    auto fk = Checkpoint::open(full.path());
    ASSERT_TRUE(fk.ok());
    EXPECT_FALSE(fk->validation().draft_absent);
    EXPECT_TRUE(fk->validation().warnings.empty());
  }
}

// V4's MTP block only partly present is an error naming the missing tensors (not the draft-less
// warning): a few tensors gone, and every tensor gone but one.
TEST(Checkpoint, PartlyPresentMtpBlockIsAnErrorNamingTheMissingTensors) {
  struct Case {
    const char* what;
    std::function<void(Tensors&)> mutate;
    const char* missing;  // a tensor the error must name
  };
  const Case cases[] = {
      {"e_proj gone", [](Tensors& t) { t.erase("mtp.0.e_proj.weight"); t.erase("mtp.0.e_proj.scale"); },
       "mtp.0.e_proj.weight"},
      {"only enorm left",
       [](Tensors& t) {
         std::erase_if(t, [](const auto& kv) {
           return kv.first.rfind("mtp.", 0) == 0 && kv.first != "mtp.0.enorm.weight";
         });
       },
       "missing tensor mtp.0."},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    testutil::TempDir d;
    make_broken(d.path(), c.mutate, "tiny-v4");
    auto ck = Checkpoint::open(d.path());
    ASSERT_FALSE(ck.ok()) << "a partly present draft must not load";
    const std::string& m = ck.status().message();
    EXPECT_NE(m.find(c.missing), std::string::npos) << m;
    EXPECT_NE(m.find("missing"), std::string::npos) << m;
    auto lax = Checkpoint::open(d.path(), /*validate=*/false);
    ASSERT_TRUE(lax.ok()) << lax.status().to_string();
    EXPECT_FALSE(lax->validation().draft_absent);
  }
}

TEST(Checkpoint, UnexpectedTensorIsAWarning) {
  testutil::TempDir d;
  make_broken(d.path(), [](Tensors& t) { t["layers.0.mystery"] = {DType::kF32, {2}, std::vector<uint8_t>(8)}; });
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ASSERT_EQ(ck->validation().warnings.size(), 1u);
  EXPECT_NE(ck->validation().warnings[0].find("layers.0.mystery"), std::string::npos);
  EXPECT_NE(ck->validation().warnings[0].find("model-00001-of-00001.safetensors"), std::string::npos);
}

TEST(Checkpoint, TruncatedShardNamesTheFile) {
  testutil::TempDir d;
  ASSERT_TRUE(make_tiny_checkpoint(*builtin_config("tiny-v41"), {}, d.path()).ok());
  const std::string shard = d / "model-00002-of-00002.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 100);
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find("model-00002-of-00002.safetensors"), std::string::npos)
      << ck.status().message();
  EXPECT_NE(ck.status().message().find("truncated"), std::string::npos) << ck.status().message();
}

// The release may ship a linear as FP8+scale or BF16; both validate and dequantise.
TEST(Checkpoint, Bf16VariantOfAnFp8LinearIsAccepted) {
  testutil::TempDir d;
  make_broken(d.path(), [](Tensors& t) {
    t.erase("layers.0.attn.wq_a.scale");
    auto& r = t["layers.0.attn.wq_a.weight"];
    r.dtype = DType::kBF16;
    r.bytes.assign(64 * 128 * 2, 0);
    const uint16_t minus_two = f32_to_bf16(-2.0f);
    std::memcpy(r.bytes.data() + 2 * 5, &minus_two, 2);
  });
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto v = ck->dequant_f32("layers.0.attn.wq_a.weight");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)[5], -2.0f);
  EXPECT_EQ((*v)[4], 0.0f);
}

TEST(Checkpoint, FindAndRowsErrors) {
  testutil::TempDir d;
  ASSERT_TRUE(make_tiny_checkpoint(*builtin_config("tiny-v41"), {}, d.path()).ok());
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok());
  auto missing = ck->dequant_f32("layers.99.attn.wkv.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("layers.99.attn.wkv.weight"), std::string::npos);
  std::vector<float> row(128);
  EXPECT_TRUE(ck->dequant_rows("embed.weight", 255, 256, row).ok());
  EXPECT_FALSE(ck->dequant_rows("embed.weight", 255, 257, row).ok());
  EXPECT_FALSE(ck->dequant_rows("embed.weight", 0, 1, std::span<float>(row).first(100)).ok());
  // One Engram row equals the same row of the full table.
  auto full = ck->dequant_f32("layers.1.engram.embed.weight");
  ASSERT_TRUE(full.ok());
  std::vector<float> r(32);
  ASSERT_TRUE(ck->dequant_rows("layers.1.engram.embed.weight", 151, 152, r).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(r[size_t(i)], (*full)[size_t(151 * 32 + i)]);
  EXPECT_FALSE(ck->read_ints("embed.weight").ok());
}

// A list of rows (dequant_row_list, the Engram gather of a step) gives each row's dequant_rows
// bits, in list order with repeats, for an FP8 Engram table, a BF16 embedding and an FP8 matrix
// with 128 x 128 blocks; short lists on the calling thread, long ones over the pool; a bad id or
// output size is refused before anything is written.
TEST(Checkpoint, RowListsAreTheRowsOneByOne) {
  testutil::TempDir d;
  ASSERT_TRUE(make_tiny_checkpoint(*builtin_config("tiny-v41"), {}, d.path()).ok());
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok());
  for (const char* name : {"layers.1.engram.embed.weight", "embed.weight", "layers.0.attn.wq_a.weight"}) {
    SCOPED_TRACE(name);
    auto shape = ck->logical_shape(name);
    ASSERT_TRUE(shape.ok());
    const int64_t rows = (*shape)[0], cols = shape_numel(*shape) / rows;
    for (const int64_t n : {int64_t(1), int64_t(7), int64_t(300)}) {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < n; ++i) ids.push_back((i * 7919 + 13) % rows);
      if (n > 1) ids[1] = ids[0];  // a repeat
      std::vector<float> got(size_t(n * cols), -1.0f), want(got.size());
      ASSERT_TRUE(ck->dequant_row_list(name, ids, got).ok());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(ck->dequant_rows(name, ids[size_t(i)], ids[size_t(i)] + 1,
                                     std::span<float>(want.data() + i * cols, size_t(cols)))
                        .ok());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << n << " rows";
    }
    std::vector<float> out(size_t(2 * cols), 5.0f);
    const std::vector<int64_t> bad = {0, rows};
    EXPECT_EQ(ck->dequant_row_list(name, bad, out).code(), StatusCode::kOutOfRange);
    const std::vector<int64_t> neg = {-1, 0};
    EXPECT_EQ(ck->dequant_row_list(name, neg, out).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(out[0], 5.0f);  // nothing written
    const std::vector<int64_t> one = {0};
    EXPECT_EQ(ck->dequant_row_list(name, one, out).code(), StatusCode::kInvalidArgument);  // 2 rows of room
  }
}

// FP8 weight whose dims are not multiples of the block: ceil-divided scale grid.
TEST(Checkpoint, Fp8EdgeBlocksThroughTheLoader) {
  testutil::TempDir d;
  make_broken(d.path(), [](Tensors& t) {
    std::vector<uint8_t> w(33 * 70, 0x38);  // 1.0 everywhere
    t["extra.weight"] = {DType::kF8E4M3, {33, 70}, w};
    t["extra.scale"] = {DType::kF8E8M0, {2, 3}, {127, 128, 129, 130, 131, 132}};  // 32x32 blocks
  });
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto v = ck->dequant_f32("extra.weight");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)[0], 1.0f);
  EXPECT_EQ((*v)[69], 4.0f);            // row 0, column block 2
  EXPECT_EQ((*v)[32 * 70 + 0], 8.0f);   // row 32 (the 1-row edge block), column block 0
  EXPECT_EQ((*v)[32 * 70 + 69], 32.0f);
  EXPECT_EQ(ck->validation().warnings.size(), 2u) << "extra.* are unexpected";
}

}  // namespace
}  // namespace flashseek::model
