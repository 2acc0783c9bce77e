// --load-format dummy (model/dummy.h, model/tensor_gen.h): the in-memory checkpoint holds the
// same bytes as make-tiny writes for the seed, independent of the thread count; chunked tensors
// decode to the generator's values across chunk boundaries; --num-layers keeps every role.
#include <cmath>
#include <cstring>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "model/checkpoint.h"
#include "model/dummy.h"
#include "model/make_tiny.h"
#include "model/safetensors.h"
#include "model/tensor_gen.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace flashseek::model {
namespace {

ModelConfig builtin(const char* name) {
  auto c = builtin_config(name);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

// Every stored tensor of `a` is in `b` with the same dtype, shape and bytes (and the counts match).
void expect_same_tensors(const Checkpoint& a, const Checkpoint& b) {
  ASSERT_EQ(a.shards().size(), b.shards().size());
  for (const std::string& name : a.shards().names()) {
    auto x = a.find(name), y = b.find(name);
    ASSERT_TRUE(x.ok() && y.ok()) << name;
    EXPECT_EQ(x->dtype, y->dtype) << name;
    EXPECT_EQ(x->shape, y->shape) << name;
    ASSERT_EQ(x->data.size(), y->data.size()) << name;
    EXPECT_EQ(std::memcmp(x->data.data(), y->data.data(), x->data.size()), 0) << name;
  }
}

// Number of stored tensors whose bytes differ between two checkpoints of one config (the small
// E8M0 scale tensors, three exponents per block, are left out: two seeds may agree on them).
int differing_tensors(const Checkpoint& a, const Checkpoint& b, int* counted = nullptr) {
  int n = 0;
  for (const std::string& name : a.shards().names()) {
    if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0) continue;
    if (counted) ++*counted;
    auto x = a.find(name), y = b.find(name);
    if (x->data.size() != y->data.size() || std::memcmp(x->data.data(), y->data.data(), x->data.size()) != 0) ++n;
  }
  return n;
}

class DummyFormats : public ::testing::TestWithParam<const char*> {};

// Dummy weights are exactly what make-tiny writes for the seed (shared generator), and the
// in-memory checkpoint validates like a loaded one.
TEST_P(DummyFormats, SameBytesAsMakeTiny) {
  const ModelConfig cfg = builtin(GetParam());
  testutil::TempDir d;
  MakeTinyOptions mo;
  mo.seed = 11;
  ASSERT_TRUE(make_tiny_checkpoint(cfg, mo, d.path()).ok());
  auto disk = Checkpoint::open(d.path());
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  auto mem = make_dummy_checkpoint(cfg, {.seed = 11, .threads = 2}, "dummy:test");
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  EXPECT_TRUE(mem->validation().ok());
  EXPECT_EQ(mem->dir(), "dummy:test");
  expect_same_tensors(*disk, *mem);
  // FP8 + E8M0 linears and FP4 experts are present in their release dtypes.
  std::set<DType> dtypes;
  for (const std::string& n : mem->shards().names()) dtypes.insert(mem->find(n)->dtype);
  EXPECT_TRUE(dtypes.count(DType::kF8E4M3) && dtypes.count(DType::kF8E8M0) && dtypes.count(DType::kI8) &&
              dtypes.count(DType::kBF16) && dtypes.count(DType::kF32));
}

INSTANTIATE_TEST_SUITE_P(Configs, DummyFormats, ::testing::Values("tiny-v4", "tiny-v41"));

TEST(Dummy, SeedDecidesBytesNotThreads) {
  const ModelConfig cfg = builtin("tiny-v41");
  auto one = make_dummy_checkpoint(cfg, {.seed = 3, .threads = 1}, "a");
  auto four = make_dummy_checkpoint(cfg, {.seed = 3, .threads = 4}, "b");
  auto other = make_dummy_checkpoint(cfg, {.seed = 4, .threads = 4}, "c");
  ASSERT_TRUE(one.ok() && four.ok() && other.ok());
  expect_same_tensors(*one, *four);
  EXPECT_EQ(differing_tensors(*one, *four), 0);
  // Every weight changes with the seed.
  int weights = 0;
  EXPECT_EQ(differing_tensors(*one, *other, &weights), weights);
  EXPECT_GT(weights, 100);
}

// Registered in-memory checkpoints open by name like a directory and share the bytes.
TEST(Dummy, RegisteredCheckpointOpensByName) {
  auto ck = make_dummy_checkpoint(builtin("tiny-v4"), {.seed = 1}, "dummy:registry-test");
  ASSERT_TRUE(ck.ok());
  EXPECT_FALSE(is_memory_checkpoint("dummy:registry-test"));
  register_memory_checkpoint("dummy:registry-test", *ck);
  EXPECT_TRUE(is_memory_checkpoint("dummy:registry-test"));
  auto again = Checkpoint::open("dummy:registry-test");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto x = ck->find("embed.weight"), y = again->find("embed.weight");
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->data.data(), y->data.data());  // the same memory, not a copy
  unregister_memory_checkpoint("dummy:registry-test");
  EXPECT_FALSE(Checkpoint::open("dummy:registry-test").ok());
}

// Big tensors are generated in chunks of rows: with a small chunk size every kind of tensor
// (FP8 blocks, FP4 + per-row scales, Engram rows, BF16, plain) splits into several chunks, the
// result does not depend on the order the chunks run in, and the loader decodes exactly the
// values the generator intended across chunk boundaries.
TEST(Dummy, ChunkedTensorsDecodeToGeneratedValues) {
  const ModelConfig cfg = builtin("tiny-v41");
  const std::vector<WeightSpec> specs = expected_weights(cfg);
  std::vector<WeightGen> gens;
  std::vector<WeightPlace> place(specs.size());
  std::vector<SafetensorsEntry> entries;
  uint64_t off = 0;
  int64_t multi = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    gens.push_back(plan_weight(specs[i], cfg, /*chunk_elems=*/1000));
    multi += gens.back().chunks > 1 ? 1 : 0;
    for (size_t k = 0; k < gens[i].stored.size(); ++k) {
      entries.push_back({gens[i].stored[k].name, gens[i].stored[k].dtype, gens[i].stored[k].shape});
      place[i].offsets.push_back(off);
      off += gens[i].bytes[k];
    }
  }
  EXPECT_GT(multi, 20);
  uint64_t data_bytes = 0;
  const std::string prefix = safetensors_prefix(entries, {}, &data_bytes);
  auto build = [&](int threads, bool reverse, std::vector<std::vector<float>>* values) {
    auto img = MappedFile::anonymous("chunked", prefix.size() + data_bytes);
    EXPECT_TRUE(img.ok());
    uint8_t* base = (*img)->writable_data();
    std::memcpy(base, prefix.data(), prefix.size());
    std::vector<WeightPlace> p = place;
    for (auto& w : p)
      for (auto& o : w.offsets) o += prefix.size();
    if (!reverse) {
      generate_weights(gens, p, {base}, cfg, 9, threads, values);
    } else {  // chunks one by one, last first
      for (size_t i = gens.size(); i-- > 0;)
        for (int64_t c = gens[i].chunks; c-- > 0;) {
          std::vector<uint8_t*> dst;
          for (uint64_t o : p[i].offsets) dst.push_back(base + o);
          generate_chunk(gens[i], cfg, 9, c, dst.data(), nullptr);
        }
    }
    auto f = SafetensorsFile::parse(*img);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    std::vector<SafetensorsFile> files;
    files.push_back(std::move(*f));
    auto sh = ShardedSafetensors::from_files(std::move(files));
    EXPECT_TRUE(sh.ok());
    auto ck = Checkpoint::from_shards("chunked", cfg, std::move(*sh));
    EXPECT_TRUE(ck.ok()) << ck.status().to_string();
    return std::move(*ck);
  };
  std::vector<std::vector<float>> values(gens.size());
  const Checkpoint a = build(4, false, &values);
  const Checkpoint b = build(1, true, nullptr);
  expect_same_tensors(a, b);
  // The chunking does not change the bytes either: the default plan (whole tensors at this size)
  // on one thread gives the same checkpoint.
  auto whole = make_dummy_checkpoint(cfg, {.seed = 9, .threads = 1}, "whole");
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  expect_same_tensors(a, *whole);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto got = a.dequant_f32(specs[i].name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), values[i].size()) << specs[i].name;
    EXPECT_EQ(std::memcmp(got->data(), values[i].data(), got->size() * 4), 0) << specs[i].name;
  }
}

// Generates `specs` under `cfg` into one buffer (stored tensors back to back) with chunks of
// about `chunk_elems` on `threads` threads; `values` (optional) receives the dequantised values.
std::vector<uint8_t> generate_all(const std::vector<WeightSpec>& specs, const ModelConfig& cfg, uint64_t seed,
                                  int threads, int64_t chunk_elems, std::vector<std::vector<float>>* values) {
  std::vector<WeightGen> gens;
  std::vector<WeightPlace> place(specs.size());
  uint64_t off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    gens.push_back(plan_weight(specs[i], cfg, chunk_elems));
    for (uint64_t b : gens[i].bytes) {
      place[i].offsets.push_back(off);
      off += b;
    }
  }
  std::vector<uint8_t> buf(off, 0xAA);
  if (values) values->resize(specs.size());
  generate_weights(gens, place, {buf.data()}, cfg, seed, threads, values);
  return buf;
}

// Real V4.1 widths (the config of the release): the weights of layer 0, big enough
// that the default plan splits several of them into chunks of rows, come out bit for bit the
// same on 1 and 4 threads and as one chunk per tensor.
TEST(Dummy, RealWidthOneThreadEqualsFourThreads) {
  auto cfg = parse_config(testutil::read_file(testutil::source_path("tests/model/data/v41-flash-config.json")),
                          "v41-flash-config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  std::vector<WeightSpec> specs;
  int64_t multi = 0, experts = 0;
  for (const WeightSpec& w : expected_weights(*cfg)) {
    if (w.name.rfind("layers.0.", 0) != 0) continue;
    if (w.kind == WeightKind::kExpert && ++experts > 6) continue;  // 2 routed experts are enough
    specs.push_back(w);
    multi += plan_weight(w, *cfg).chunks > 1 ? 1 : 0;
  }
  ASSERT_GE(specs.size(), 20u);
  EXPECT_GE(multi, 3);
  const std::vector<uint8_t> one = generate_all(specs, *cfg, 5, 1, kDefaultChunkElems, nullptr);
  const std::vector<uint8_t> four = generate_all(specs, *cfg, 5, 4, kDefaultChunkElems, nullptr);
  const std::vector<uint8_t> unchunked = generate_all(specs, *cfg, 5, 4, int64_t(1) << 40, nullptr);
  EXPECT_GT(one.size(), uint64_t(100) << 20);
  EXPECT_TRUE(one == four);
  EXPECT_TRUE(one == unchunked);
}

// The generated values are normal with the intended spread: FP8 linears (block scales around
// std/64) and BF16 matrices have mean ~0 and standard deviation ~1/sqrt(fan-in), so the codes
// use the format's range the way the release does.
TEST(Dummy, GeneratedValuesHaveTheIntendedSpread) {
  for (bool fp8 : {true, false}) {
    ModelConfig cfg = builtin("tiny-v41");
    cfg.fp8_weights = fp8;
    const int64_t in = 512;
    WeightSpec w{"layers.0.attn.wq_b.weight", {1024, in}, WeightKind::kLinear, DType::kBF16};
    ASSERT_EQ(release_tensors(w, cfg)[0].dtype, fp8 ? DType::kF8E4M3 : DType::kBF16);
    std::vector<std::vector<float>> values;
    generate_all({w}, cfg, 21, 2, 1 << 14, &values);
    double sum = 0, sq = 0;
    for (float v : values[0]) sum += v, sq += double(v) * v;
    const double n = double(values[0].size()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    const double want = 1.0 / std::sqrt(double(in));
    EXPECT_LT(std::abs(mean), 0.01 * want) << (fp8 ? "fp8" : "bf16");
    EXPECT_NEAR(sd / want, 1.0, 0.05) << (fp8 ? "fp8" : "bf16");
  }
}

std::tuple<int, bool, bool, bool, bool, bool> kind(const ModelConfig& c, int l) {
  const LayerRole& r = c.role(l);
  const bool reads_filtered = r.idx_src >= 0 && r.idx_src != l && c.role(r.idx_src).candidate_filtered;
  return {r.ratio, r.kv_src == l, r.idx_src == l, r.candidate_source, r.candidate_filtered, reads_filtered};
}

std::set<std::tuple<int, bool, bool, bool, bool, bool>> kinds(const ModelConfig& c) {
  std::set<std::tuple<int, bool, bool, bool, bool, bool>> s;
  for (int l = 0; l < int(c.num_layers); ++l) s.insert(kind(c, l));
  return s;
}

ModelConfig data_config(const char* file) {
  auto c = parse_config(testutil::read_file(testutil::source_path(std::string("tests/model/data/") + file)), file);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

TEST(ReduceLayers, RealV41KeepsEveryRole) {
  const ModelConfig full = data_config("v41-flash-config.json");
  auto r = reduce_layers(full, 8);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kept, (std::vector<int>{0, 1, 2, 3, 20, 21, 24, 25}));
  const ModelConfig& c = r->cfg;
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(kinds(c), kinds(full));
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 4}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(c.candidate_source_layer, 4);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{full.engram_num_embeddings[0]}));
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(c.num_mtp_layers, full.num_mtp_layers);
  EXPECT_EQ(c.hidden_size, full.hidden_size);
  EXPECT_NE(r->summary.find("0,1,2,3,20,21,24,25"), std::string::npos) << r->summary;
  // More layers: the earliest others join (layer 4 reuses layer 2's compressed KV).
  auto r10 = reduce_layers(full, 10);
  ASSERT_TRUE(r10.ok());
  EXPECT_EQ(r10->kept, (std::vector<int>{0, 1, 2, 3, 4, 5, 20, 21, 24, 25}));
  // Fewer than the roles need: an error naming the minimum.
  auto r7 = reduce_layers(full, 7);
  ASSERT_FALSE(r7.ok());
  EXPECT_NE(r7.status().message().find("at least 8 layers"), std::string::npos) << r7.status().message();
  // All layers: unchanged.
  auto all = reduce_layers(full, 40);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->cfg.num_layers, 40);
  EXPECT_EQ(all->cfg.dspark_target_layer_ids, full.dspark_target_layer_ids);
}

TEST(ReduceLayers, RealV4KeepsRatiosAndHashRouting) {
  const ModelConfig full = data_config("v4-flash-config.json");
  auto r = reduce_layers(full, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kept, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(r->cfg.compress_ratios, (std::vector<int>{0, 4, 128, 0}));  // + the MTP layer
  EXPECT_EQ(r->cfg.num_hash_layers, 2);
  EXPECT_EQ(kinds(r->cfg), kinds(full));
  EXPECT_FALSE(reduce_layers(full, 2).ok());
}

// tiny-v41 loses its last (window-only) layer; the DSpark taps move to the last kept layers and
// the reduced model's dummy checkpoint validates.
TEST(ReduceLayers, TinyV41DummyValidates) {
  auto r = reduce_layers(builtin("tiny-v41"), 6);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kept, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r->cfg.dspark_target_layer_ids, (std::vector<int>{3, 4, 5}));
  auto ck = make_dummy_checkpoint(r->cfg, {.seed = 2}, "reduced");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE(ck->validation().ok());
  EXPECT_FALSE(reduce_layers(builtin("tiny-v41"), 5).ok());
}

}  // namespace
}  // namespace flashseek::model
