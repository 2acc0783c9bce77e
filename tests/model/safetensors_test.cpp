// Safetensors reader/writer: round trips over every dtype and structural errors, each naming
// the file (and tensor).
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

using nlohmann::json;

// A raw file: 8-byte header length + header text + data (for hand-made broken files).
std::string raw_file(const std::string& header, const std::string& data, int64_t claimed_len = -1) {
  const uint64_t n = claimed_len >= 0 ? uint64_t(claimed_len) : header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

void expect_error(const std::string& path, StatusCode code, const std::string& mention) {
  auto r = SafetensorsFile::open(path);
  ASSERT_FALSE(r.ok()) << path;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(mention), std::string::npos) << r.status().message();
}

TEST(Safetensors, RoundTripEveryDtype) {
  testutil::TempDir d;
  Rng rng(5);
  const DType all[] = {DType::kBF16, DType::kF16, DType::kF32,    DType::kI64,   DType::kI32,
                       DType::kI8,   DType::kU8,  DType::kF8E4M3, DType::kF8E8M0};
  SafetensorsWriter w;
  std::map<std::string, std::pair<Shape, std::vector<uint8_t>>> want;
  int i = 0;
  for (DType dt : all) {
    const Shape shape = {int64_t(1 + rng.below(7)), int64_t(1 + rng.below(13))};  // odd sizes
    std::vector<uint8_t> bytes(size_t(shape_numel(shape)) * dtype_size(dt));
    for (auto& b : bytes) b = uint8_t(rng.below(256));
    const std::string name = "t" + std::to_string(i++) + "." + std::string(dtype_name(dt));
    want[name] = {shape, bytes};
    ASSERT_TRUE(w.add(name, dt, shape, bytes).ok());
  }
  ASSERT_TRUE(w.add("empty", DType::kF32, {0, 4}, {}).ok());
  ASSERT_TRUE(w.add("scalar", DType::kF32, {}, std::vector<uint8_t>(4, 7)).ok());
  ASSERT_TRUE(w.write(d / "a.safetensors").ok());
  auto f = SafetensorsFile::open(d / "a.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->tensors().size(), want.size() + 2);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  for (const auto& [name, sv] : want) {
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, sv.first);
    auto b = f->bytes(*t);
    EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.end()), sv.second) << name;
  }
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_EQ(f->find("scalar")->shape, Shape{});
  EXPECT_EQ(f->find("nope"), nullptr);
  // The header is padded so that the data area starts 8-byte aligned.
  const std::string raw = testutil::read_file(d / "a.safetensors");
  uint64_t hlen = 0;
  std::memcpy(&hlen, raw.data(), 8);
  EXPECT_EQ((8 + hlen) % 8, 0u);
}

// Random byte corruption of a valid file: open() either fails with a Status or yields tensors
// that all lie inside the file; it never crashes.
TEST(Safetensors, CorruptedHeadersNeverEscapeTheFile) {
  testutil::TempDir d;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a.weight", DType::kBF16, {3, 5}, std::vector<uint8_t>(30, 1)).ok());
  ASSERT_TRUE(w.add("b", DType::kF8E4M3, {7}, std::vector<uint8_t>(7, 2)).ok());
  ASSERT_TRUE(w.write(d / "ok.safetensors").ok());
  const std::string good = testutil::read_file(d / "ok.safetensors");
  Rng rng(17);
  int failures = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string bad = good;
    const int flips = 1 + int(rng.below(3));
    for (int k = 0; k < flips; ++k) bad[rng.below(std::min<uint64_t>(bad.size(), 120))] = char(rng.below(256));
    if (rng.below(4) == 0) bad.resize(rng.below(bad.size()));
    testutil::write_file(d / "bad.safetensors", bad);
    auto f = SafetensorsFile::open(d / "bad.safetensors");
    if (!f.ok()) {
      ++failures;
      EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos) << f.status().message();
      continue;
    }
    for (const auto& t : f->tensors()) EXPECT_LE(t.offset + t.nbytes, bad.size()) << t.name;
  }
  EXPECT_GT(failures, 0);
}

TEST(Safetensors, WriterRejectsSizeMismatch) {
  SafetensorsWriter w;
  Status st = w.add("x", DType::kBF16, {3, 3}, std::vector<uint8_t>(17));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x"), std::string::npos);
}

TEST(Safetensors, StructuralErrors) {
  testutil::TempDir d;
  const std::string ok_hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto put = [&](const char* name, const std::string& content) {
    testutil::write_file(d / name, content);
    return d / name;
  };
  expect_error(d / "missing.safetensors", StatusCode::kNotFound, "no such file");
  expect_error(put("tiny", "abc"), StatusCode::kParseError, "truncated");
  expect_error(put("hlen", raw_file(ok_hdr, std::string(8, 0), 1 << 20)), StatusCode::kOutOfRange,
               "header length");
  expect_error(put("json", raw_file("{\"a\": [", std::string(8, 0))), StatusCode::kParseError, "JSON");
  expect_error(put("dtype", raw_file(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", std::string(8, 0))),
               StatusCode::kParseError, "unknown dtype");
  expect_error(put("trunc", raw_file(ok_hdr, std::string(5, 0))), StatusCode::kOutOfRange, "tensor a");
  expect_error(put("size", raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0))),
               StatusCode::kParseError, "needs 12");
  expect_error(put("neg", raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0))),
               StatusCode::kParseError, "bad shape");
  expect_error(put("rev", raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, 0))),
               StatusCode::kOutOfRange, "data_offsets");
  expect_error(put("overlap", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                       std::string(12, 0))),
               StatusCode::kParseError, "overlap");
  expect_error(put("meta", raw_file(R"({"__metadata__":{"k":1}})", "")), StatusCode::kParseError, "__metadata__");
  expect_error(put("noofs", raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, 0))),
               StatusCode::kParseError, "data_offsets");
}

// ---- hostile headers (issue 14): each of these crashed or was accepted before the bounds ----

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(SafetensorsHostile, MillionDeepHeaderIsRejectedBeforeATreeIsBuilt) {
  testutil::TempDir d;
  // The nesting sits in "shape": the old "bad shape" error dumped it, recursing 1M levels.
  const std::string hdr = R"({"t":{"dtype":"U8","shape":)" + nested(1'000'000) + R"(,"data_offsets":[0,0]}})";
  testutil::write_file(d / "deep.safetensors", raw_file(hdr, ""));
  expect_error(d / "deep.safetensors", StatusCode::kParseError, "nested deeper than 8 levels");
  // Nesting within the depth bound still reaches the entry check and names the tensor.
  testutil::write_file(d / "nest.safetensors", raw_file(R"({"t":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", "x"));
  expect_error(d / "nest.safetensors", StatusCode::kParseError, "tensor t: bad shape");
}

TEST(SafetensorsHostile, ShapeRankIsBounded) {
  testutil::TempDir d;
  // 100 dimensions of 1: one byte, so only the rank bound can reject it (it was accepted before).
  std::string dims = "1";
  for (int i = 1; i < 100; ++i) dims += ",1";
  testutil::write_file(d / "rank.safetensors",
                       raw_file(R"({"t":{"dtype":"U8","shape":[)" + dims + R"(],"data_offsets":[0,1]}})", "x"));
  expect_error(d / "rank.safetensors", StatusCode::kParseError, "tensor t: shape has 100 dimensions");
  // Rank 8 is the largest accepted.
  testutil::write_file(d / "rank8.safetensors",
                       raw_file(R"({"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,2],"data_offsets":[0,2]}})", "xy"));
  auto ok = SafetensorsFile::open(d / "rank8.safetensors");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->find("t")->shape.size(), 8u);
}

TEST(SafetensorsHostile, ShapeProductOverflowIsAnError) {
  testutil::TempDir d;
  // 2^62 * 2^62 * 16 = 2^128: the old __int128 product wrapped to 0 and matched an empty range,
  // so a tensor with a huge shape and no bytes was accepted.
  const std::string p62 = std::to_string(uint64_t(1) << 62);
  testutil::write_file(d / "wrap.safetensors",
                       raw_file(R"({"t":{"dtype":"U8","shape":[)" + p62 + "," + p62 + R"(,16],"data_offsets":[0,0]}})", ""));
  expect_error(d / "wrap.safetensors", StatusCode::kOutOfRange, "tensor t: dtype U8 x shape");
  // 2^32 x 2^32 F32 elements is 2^66 bytes: beyond 64 bits even though every dimension is small.
  const std::string p32 = std::to_string(uint64_t(1) << 32);
  testutil::write_file(d / "f32.safetensors",
                       raw_file(R"({"t":{"dtype":"F32","shape":[)" + p32 + "," + p32 + R"(],"data_offsets":[0,0]}})", ""));
  expect_error(d / "f32.safetensors", StatusCode::kOutOfRange, "more than 2^64 bytes");
  // A dimension beyond int64 cannot be stored in a Shape.
  testutil::write_file(d / "u64.safetensors",
                       raw_file(R"({"t":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""));
  expect_error(d / "u64.safetensors", StatusCode::kParseError, "bad shape");
  // A zero dimension does not excuse an overflowing product of the others...
  testutil::write_file(d / "zero.safetensors",
                       raw_file(R"({"t":{"dtype":"F32","shape":[0,)" + p62 + "," + p62 + R"(],"data_offsets":[0,0]}})", ""));
  expect_error(d / "zero.safetensors", StatusCode::kOutOfRange, "more than 2^64 bytes");
  // ...but with large, non-overflowing dimensions it is a valid tensor of 0 bytes.
  testutil::write_file(d / "empty.safetensors",
                       raw_file(R"({"t":{"dtype":"F32","shape":[)" + p32 + R"(,0,65536],"data_offsets":[0,0]}})", ""));
  auto z = SafetensorsFile::open(d / "empty.safetensors");
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(z->find("t")->nbytes, 0u);
  EXPECT_EQ(z->find("t")->shape, (Shape{int64_t(1) << 32, 0, 65536}));
}

TEST(SafetensorsHostile, OversizeHeaderLengthIsRejected) {
  testutil::TempDir d;
  // A header length of 100 MiB + 8 inside a (sparse) file that large: bounded by the limit, not
  // only by the file size, so 100 MiB of header are never parsed.
  const uint64_t hlen = (100ull << 20) + 8;
  const std::string path = d / "big.safetensors";
  testutil::write_file(path, raw_file("{}", "", int64_t(hlen)));
  std::filesystem::resize_file(path, 8 + hlen);
  expect_error(path, StatusCode::kOutOfRange, "above the limit");
}

TEST(SafetensorsHostile, DeepShardIndexIsRejected) {
  testutil::TempDir d;
  testutil::write_file(d / "model.safetensors.index.json", R"({"weight_map":{"x":)" + nested(1'000'000) + "}}");
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("model.safetensors.index.json"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("nested deeper"), std::string::npos) << s.status().message();
}

// Two shards + index; then the ways an index can disagree with its shards.
class ShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SafetensorsWriter a, b;
    ASSERT_TRUE(a.add("x", DType::kF32, {2}, std::vector<uint8_t>(8, 1)).ok());
    ASSERT_TRUE(b.add("y", DType::kBF16, {3}, std::vector<uint8_t>(6, 2)).ok());
    ASSERT_TRUE(a.write(d / "m-1.safetensors").ok());
    ASSERT_TRUE(b.write(d / "m-2.safetensors").ok());
  }
  void index(const std::map<std::string, std::string>& wm) {
    ASSERT_TRUE(write_safetensors_index(d.path(), wm, 14).ok());
  }
  testutil::TempDir d;
};

TEST_F(ShardedTest, OpensThroughIndex) {
  index({{"x", "m-1.safetensors"}, {"y", "m-2.safetensors"}});
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->size(), 2u);
  auto y = s->find("y");
  ASSERT_NE(y.file, nullptr);
  EXPECT_NE(y.file->path().find("m-2"), std::string::npos);
  EXPECT_EQ(y.info->dtype, DType::kBF16);
  EXPECT_EQ(s->find("z").file, nullptr);
  EXPECT_EQ(s->names(), (std::vector<std::string>{"x", "y"}));
}

TEST_F(ShardedTest, IndexNamesMissingShard) {
  index({{"x", "m-1.safetensors"}, {"y", "m-3.safetensors"}});
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("m-3.safetensors"), std::string::npos) << s.status().message();
}

TEST_F(ShardedTest, IndexPointsToWrongShard) {
  index({{"x", "m-1.safetensors"}, {"y", "m-1.safetensors"}});
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tensor y"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("m-1.safetensors"), std::string::npos) << s.status().message();
}

TEST_F(ShardedTest, TensorMissingFromIndex) {
  SafetensorsWriter b;
  ASSERT_TRUE(b.add("y", DType::kBF16, {3}, std::vector<uint8_t>(6, 2)).ok());
  ASSERT_TRUE(b.add("stray", DType::kBF16, {1}, std::vector<uint8_t>(2, 2)).ok());
  ASSERT_TRUE(b.write(d / "m-2.safetensors").ok());
  index({{"x", "m-1.safetensors"}, {"y", "m-2.safetensors"}});
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("stray"), std::string::npos) << s.status().message();
}

TEST_F(ShardedTest, BadIndexJson) {
  testutil::write_file(d / "model.safetensors.index.json", "{\"weight_map\": 3}");
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("weight_map"), std::string::npos);
}

TEST_F(ShardedTest, WithoutIndexOpensEveryFileAndRejectsDuplicates) {
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->size(), 2u);
  SafetensorsWriter c;
  ASSERT_TRUE(c.add("x", DType::kF32, {2}, std::vector<uint8_t>(8, 3)).ok());
  ASSERT_TRUE(c.write(d / "m-3.safetensors").ok());
  auto dup = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("stored twice"), std::string::npos) << dup.status().message();
}

TEST(ShardedEmpty, NoSafetensorsIsNotFound) {
  testutil::TempDir d;
  auto s = ShardedSafetensors::open_dir(d.path());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace flashseek::model
