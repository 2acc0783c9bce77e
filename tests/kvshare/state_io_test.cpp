// Snapshot blobs (forward/state_io.h): a restored state continues exactly like the original;
// every corruption, truncation or foreign fingerprint is rejected with an error (never a crash).
#include <gtest/gtest.h>

#include "forward/state.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using StateIo = TinyModel;

TEST_F(StateIo, RoundTripContinuesBitExactly) {
  Rng rng(1);
  for (int64_t len : {1, 7, 37, 150}) {  // below and beyond the window / compress ratios
    SCOPED_TRACE("len " + std::to_string(len));
    const auto prompt = random_tokens(rng, len);
    auto original = run(prompt);
    forward::SnapshotHeader h{fingerprint_, 42, 0x1234, len, 0};
    auto blob = forward::serialize_snapshot(*original, prompt, h);
    ASSERT_TRUE(blob.ok()) << blob.status().to_string();
    auto d = forward::deserialize_snapshot(*blob, fingerprint_);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->tokens, prompt);
    EXPECT_EQ(d->header.tenant, 42u);
    EXPECT_EQ(d->header.prefix_hash, 0x1234u);
    EXPECT_EQ(d->state->length(), len);
    // Both continue with the same 5 tokens, one at a time: logits must be identical.
    const auto more = random_tokens(rng, 5);
    for (int32_t t : more) {
      std::vector<float> a, b;
      advance(*original, std::span<const int32_t>(&t, 1), &a);
      advance(*d->state, std::span<const int32_t>(&t, 1), &b);
      ASSERT_EQ(a, b);
    }
  }
}

TEST_F(StateIo, RejectsCorruptionTruncationAndOtherModels) {
  Rng rng(2);
  const auto prompt = random_tokens(rng, 23);
  auto st = run(prompt);
  auto blob = forward::serialize_snapshot(*st, prompt, {fingerprint_, 1, 2, 23, 0});
  ASSERT_TRUE(blob.ok());
  EXPECT_FALSE(forward::deserialize_snapshot(*blob, fingerprint_ ^ 1).ok());
  for (int i = 0; i < 200; ++i) {  // single flipped bits anywhere, including the checksum
    auto bad = *blob;
    const size_t at = size_t(rng.below(bad.size()));
    bad[at] ^= uint8_t(1u << rng.below(8));
    EXPECT_FALSE(forward::deserialize_snapshot(bad, fingerprint_).ok()) << "byte " << at;
  }
  for (int i = 0; i < 100; ++i) {  // truncations and garbage appended
    auto bad = *blob;
    if (i % 2) bad.resize(size_t(rng.below(bad.size())));
    else bad.insert(bad.end(), 1 + rng.below(64), uint8_t(rng.below(256)));
    EXPECT_FALSE(forward::deserialize_snapshot(bad, fingerprint_).ok());
  }
  EXPECT_FALSE(forward::peek_snapshot_header(std::span<const uint8_t>(blob->data(), 10)).ok());
}

TEST_F(StateIo, SerializeChecksTokenCount) {
  Rng rng(3);
  const auto prompt = random_tokens(rng, 9);
  auto st = run(prompt);
  auto blob = forward::serialize_snapshot(*st, std::span<const int32_t>(prompt).first(8), {});
  ASSERT_FALSE(blob.ok());
  EXPECT_NE(blob.status().message().find("9 tokens"), std::string::npos);
}

TEST_F(StateIo, FingerprintSeparatesWeightsAndNumerics) {
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok());
  flashseek::testing::TempDir other;
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 10}, other.path().string()).ok());
  auto a = forward::checkpoint_fingerprint(ckpt_.path().string(), "reference");
  auto b = forward::checkpoint_fingerprint(other.path().string(), "reference");
  auto c = forward::checkpoint_fingerprint(ckpt_.path().string(), "exact");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, fingerprint_);
  EXPECT_NE(*a, *b);  // same config, different random weights
  EXPECT_NE(*a, *c);
  auto missing = forward::checkpoint_fingerprint((other.path() / "nope").string(), "exact");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::kvtest
