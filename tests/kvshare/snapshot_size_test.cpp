// The computed snapshot size (kvshare/snapshot_size.h) matches real blobs: growth between two
// context lengths (both multiples of every compress ratio) is the per-token formula up to one
// page-kind byte per paged-rows object, and
// the fixed part bounds what a short state costs.
#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "kvshare/snapshot_size.h"

namespace flashseek::kvtest {
namespace {

using SnapshotSizeTest = TinyModel;

TEST_F(SnapshotSizeTest, FormulaMatchesRealBlobs) {
  const auto s = kvshare::snapshot_size(model_->config());
  EXPECT_GT(s.kv_source_layers, 0);
  Rng rng(12);
  const auto tokens = random_tokens(rng, 160);
  auto blob_bytes = [&](int64_t n) {
    const std::span<const int32_t> t(tokens.data(), size_t(n));
    auto st = run(t);
    auto blob = forward::serialize_snapshot(*st, t, {fingerprint_, 0, 0, n, 0});
    EXPECT_TRUE(blob.ok());
    return blob.ok() ? int64_t(blob->size()) : 0;
  };
  const int64_t a = blob_bytes(64), b = blob_bytes(128), c = blob_bytes(160);
  // Exact up to the page-kind bytes (one per sealed page, spread evenly by the formula).
  const double slack = double(s.kv_source_layers + s.index_key_layers);
  EXPECT_NEAR(double(b - a), s.bytes_per_1k_tokens * 64 / 1000, slack);
  EXPECT_NEAR(double(c - b), s.bytes_per_1k_tokens * 32 / 1000, slack);
  // Fixed part: rings are most of a short state; compressor partials and headers add a little.
  EXPECT_GE(a, s.bytes_at(64));
  EXPECT_LE(a, s.bytes_at(64) + s.fixed_bytes / 2);
}

}  // namespace
}  // namespace flashseek::kvtest
