// Cache row formats (forward/cache_format.h) against what the model really stores: after a CPU
// forward in reference numerics, every window ring slot, compressed KV row and index key row of
// every layer packs into its compact format and unpacks to the same bits (so the formats are the
// quantisers' own); in exact numerics the caches hold unquantised values, which those compact
// formats refuse, so cache_formats keeps FP32 there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "forward/cache_format.h"
#include "forward/cpu_model.h"
#include "forward/state.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

// Packs `rows` [n, f.dim] and checks the round trip; false when packing refuses them.
bool round_trips(const ops::CacheRowFormat& f, const std::vector<float>& rows, const std::string& at) {
  if (rows.empty()) return true;
  const int64_t n = int64_t(rows.size()) / f.dim;
  std::vector<uint8_t> packed(size_t(n * f.row_bytes()));
  if (!ops::pack_cache_rows(f, rows.data(), n, packed.data()).ok()) return false;
  std::vector<float> back(rows.size());
  ops::unpack_cache_rows(f, packed.data(), n, back.data());
  EXPECT_EQ(std::memcmp(back.data(), rows.data(), rows.size() * 4), 0) << at;
  return true;
}

class CacheFormat : public ::testing::TestWithParam<const char*> {};

TEST_P(CacheFormat, FormatsHoldEveryCachedRowExactly) {
  const std::string dir =
      (fs::temp_directory_path() / (std::string("fs_cfmt_") + GetParam() + "_" + std::to_string(::getpid()))).string();
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  model::MakeTinyOptions opt;
  opt.seed = 11;
  ASSERT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir).ok());
  for (const Numerics num : {Numerics::kReference, Numerics::kExact}) {
    auto m = CpuModel::load(dir, num);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const model::ModelConfig& c = m.value()->config();
    const CacheFormats f = cache_formats(c, num);
    const CacheFormats ref = cache_formats(c, Numerics::kReference);
    if (num == Numerics::kReference) {
      EXPECT_TRUE(f.ring.compact() && f.ckv.compact() && f.ikeys.compact()) << GetParam();
      EXPECT_LT(f.ring.row_bytes(), 4 * c.head_dim);
    } else {
      EXPECT_FALSE(f.ring.compact() || f.ckv.compact() || f.ikeys.compact());
    }
    auto st = m.value()->new_sequence();
    Rng rng(3);
    std::vector<int32_t> t(70);
    for (auto& x : t) x = int32_t(rng.below(uint64_t(c.vocab_size)));
    std::vector<float> logits;
    BatchItem item{st.get(), t, false};
    ASSERT_TRUE(m.value()->forward({&item, 1}, logits).ok());
    const auto& s = static_cast<const CpuSequenceState&>(*st);
    int64_t ckv_rows = 0, ikey_rows = 0, refused = 0;
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const LayerState& L = s.layers[l];
      const std::string at = std::string(GetParam()) + " layer " + std::to_string(l);
      ckv_rows += L.ckv.size(), ikey_rows += L.ikeys.size();
      EXPECT_TRUE(round_trips(f.ring, L.ring, at + " ring"));
      EXPECT_TRUE(round_trips(f.ckv, L.ckv.to_vector(), at + " ckv"));
      EXPECT_TRUE(round_trips(f.ikeys, L.ikeys.to_vector(), at + " ikeys"));
      if (num == Numerics::kExact)  // unquantised values: the reference formats refuse them
        refused += !round_trips(ref.ring, L.ring, at) + !round_trips(ref.ckv, L.ckv.to_vector(), at) +
                   !round_trips(ref.ikeys, L.ikeys.to_vector(), at);
    }
    EXPECT_GT(ckv_rows, 0) << "the prompt must produce compressed rows";
    EXPECT_GT(ikey_rows, 0) << "the prompt must produce index keys";
    if (num == Numerics::kExact) {
      EXPECT_GT(refused, 0);
    }
  }
  fs::remove_all(dir);
}

// At the real widths (head_dim 512, RoPE 64, index keys 128) the rows take perf-budget.md §2's
// bytes (V4: 583 padded to 584).
TEST(CacheFormatBytes, RealWidthsTakeThePerfBudgetBytes) {
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    auto cfg = model::builtin_config(name);
    ASSERT_TRUE(cfg.ok());
    cfg->head_dim = 512, cfg->rope_head_dim = 64, cfg->index_head_dim = 128;
    const CacheFormats f = cache_formats(*cfg, Numerics::kReference);
    const bool v41 = cfg->is_v41();
    EXPECT_EQ(f.ring.row_bytes(), v41 ? 528 : 584) << name;
    EXPECT_EQ(f.ckv.row_bytes(), v41 ? 288 : 584) << name;
    EXPECT_EQ(f.ikeys.row_bytes(), 68) << name;
    const CacheFormats e = cache_formats(*cfg, Numerics::kExact);
    EXPECT_EQ(e.ring.row_bytes(), 2048) << name;
    EXPECT_EQ(e.ikeys.row_bytes(), 512) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, CacheFormat, ::testing::Values("tiny-v4", "tiny-v41"),
                         [](const auto& info) { return std::string(info.param) == "tiny-v4" ? "V4" : "V41"; });

}  // namespace
}  // namespace flashseek::forward
