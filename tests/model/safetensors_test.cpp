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
