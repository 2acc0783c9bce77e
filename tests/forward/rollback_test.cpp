// Rollback of rejected speculative tokens (v41 §5.7): after rolling back, continuing gives the
// same logits (bit for bit) as a run that never saw the rejected tokens, for every alignment of
// the rollback point with the compressor groups (ratios 1/2 for V4.1, 4 overlapping and 128 for V4).
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

class Rollback : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / (std::string("fs_rb_") + GetParam() + "_" + std::to_string(::getpid()))).string();
    auto cfg = model::builtin_config(GetParam());
    ASSERT_TRUE(cfg.ok());
    model::MakeTinyOptions opt;
    opt.seed = 3;
    opt.bf16 = true;
    ASSERT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir_).ok());
    auto m = CpuModel::load(dir_, Numerics::kExact);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<int32_t> toks(int64_t n, uint64_t seed) const {
    Rng rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng.below(uint64_t(model_->config().vocab_size)));
    return t;
  }
  std::vector<float> feed(SequenceState& st, const std::vector<int32_t>& t, bool one_by_one) {
    std::vector<float> logits;
    if (one_by_one) {
      for (size_t i = 0; i < t.size(); ++i) {
        BatchItem item{&st, std::span<const int32_t>(t.data() + i, 1), true};
        EXPECT_TRUE(model_->forward({&item, 1}, logits).ok());
      }
    } else {
      BatchItem item{&st, t, true};
      EXPECT_TRUE(model_->forward({&item, 1}, logits).ok());
    }
    return logits;
  }
  std::string dir_;
  std::unique_ptr<CpuModel> model_;
};

TEST_P(Rollback, ContinuingAfterRollbackEqualsNeverSeeingTheDrafts) {
  const auto cont = toks(20, 99);
  for (int64_t prefix : {1, 6, 37, 126, 128, 131}) {
    for (int64_t drop : {1, 3, 6, 8}) {
      const auto a = toks(prefix, uint64_t(prefix)), rejected = toks(drop, uint64_t(drop) + 1000);
      auto clean = model_->new_sequence();
      feed(*clean, a, false);
      const auto want = feed(*clean, cont, false);
      auto st = model_->new_sequence();
      feed(*st, a, false);
      feed(*st, rejected, drop % 2 == 0);  // verify chunk or one by one
      ASSERT_TRUE(model_->rollback(*st, prefix).ok()) << prefix << " " << drop;
      EXPECT_EQ(st->length(), prefix);
      const auto got = feed(*st, cont, false);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "prefix " << prefix << " drop " << drop;
      if (model_->has_mtp()) {
        auto m1 = model_->mtp_logits(*st, 4), m2 = model_->mtp_logits(*clean, 4);
        ASSERT_TRUE(m1.ok() && m2.ok());
        EXPECT_EQ(m1.value(), m2.value()) << "MTP after rollback, prefix " << prefix << " drop " << drop;
      }
    }
  }
}

TEST_P(Rollback, LimitsAreErrors) {
  auto st = model_->new_sequence();
  feed(*st, toks(30, 5), false);
  EXPECT_FALSE(model_->rollback(*st, 31).ok());                  // cannot grow
  EXPECT_FALSE(model_->rollback(*st, 30 - kMaxRollback - 1).ok());  // deeper than the spare ring slots
  EXPECT_EQ(st->length(), 30);                                   // failed rollback changes nothing
  EXPECT_TRUE(model_->rollback(*st, 30).ok());
}

INSTANTIATE_TEST_SUITE_P(Tiny, Rollback, ::testing::Values("tiny-v41", "tiny-v4"),
                         [](const auto& info) { return std::string(info.param) == "tiny-v41" ? "v41" : "v4"; });

}  // namespace
}  // namespace flashseek::forward
