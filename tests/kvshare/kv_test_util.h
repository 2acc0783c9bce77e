// Shared fixture for the state cache tests: a tiny checkpoint on disk and its loaded model.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "engine/state_cache.h"
#include "forward/model.h"
#include "forward/state_io.h"
#include "model/make_tiny.h"
#include "test_util.h"

namespace flashseek::kvtest {

class TinyModel : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = model::builtin_config("tiny-v41");
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 9}, ckpt_.path().string()).ok());
    auto m = forward::load_model(ckpt_.path().string(), forward::Numerics::kReference);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    auto fp = forward::checkpoint_fingerprint(ckpt_.path().string(), "reference");
    ASSERT_TRUE(fp.ok()) << fp.status().to_string();
    fingerprint_ = *fp;
    auto g = forward::checkpoint_snapshot_geometry(ckpt_.path().string(), kMaxTokens);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    geometry_ = std::move(*g);
  }

  static constexpr int64_t kMaxTokens = 4096;  // the "serving context" of these tests

  // Cache options for this model (fingerprint and geometry filled in).
  engine::StateCacheOptions cache_opts(int64_t host_bytes, std::string dir = {},
                                       int64_t min_tokens = 2) const {
    engine::StateCacheOptions o;
    o.fingerprint = fingerprint_;
    o.host_bytes = host_bytes;
    o.dir = std::move(dir);
    o.min_tokens = min_tokens;
    o.geometry = geometry_;
    return o;
  }

  std::vector<int32_t> random_tokens(Rng& rng, int64_t n) const {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng.below(uint64_t(model_->config().vocab_size)));
    return t;
  }

  // A fresh state after running `tokens` (one forward call); appends the last logits row.
  std::unique_ptr<forward::SequenceState> run(std::span<const int32_t> tokens,
                                              std::vector<float>* logits = nullptr) {
    auto st = model_->new_sequence();
    if (!tokens.empty()) advance(*st, tokens, logits);
    return st;
  }
  void advance(forward::SequenceState& st, std::span<const int32_t> tokens,
               std::vector<float>* logits = nullptr) {
    forward::BatchItem item{&st, tokens, false};
    std::vector<float> out;
    ASSERT_TRUE(model_->forward(std::span<forward::BatchItem>(&item, 1), out).ok());
    if (logits) *logits = std::move(out);
  }

  flashseek::testing::TempDir ckpt_;
  std::unique_ptr<forward::Model> model_;
  uint64_t fingerprint_ = 0;
  forward::SnapshotGeometry geometry_;
};

}  // namespace flashseek::kvtest
