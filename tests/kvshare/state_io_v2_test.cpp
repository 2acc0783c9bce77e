// state_io still reads v2 blobs (paged rows flattened: width, rows_per_page, all rows), written
// here byte by byte as the v2 writer laid them out; the decoded state re-pages the rows and
// round-trips through the current format unchanged.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include "engine/state_cache.h"
#include "forward/state_io.h"

namespace flashseek::kvtest {
namespace {

class Bytes {
 public:
  template <typename T>
  Bytes& pod(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
    return *this;
  }
  Bytes& floats(const std::vector<float>& v) {
    pod<uint64_t>(v.size());
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(float));
    return *this;
  }
  std::vector<uint8_t> out;
};

std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + float(i);
  return v;
}

// The shape of the state written below: one layer, 4 ring slots of 1 float, 5 compressed rows
// (ratio 1) of width 3 and 2, compressors of ratio 2 (one pending token), 2 Engram ids.
forward::SnapshotGeometry geometry() {
  forward::SnapshotGeometry g;
  g.vocab_size = 16;
  g.max_tokens = 16;
  g.ring_size = 4;
  g.ring_width = 1;
  g.layers.resize(1);
  g.layers[0].ckv = {3, 1};
  g.layers[0].ikeys = {2, 1};
  g.layers[0].comp = g.layers[0].icomp = {2, 1, false};
  g.engram_min = 1;
  g.engram_keep = 2;
  g.engram_vocab = 64;
  return g;
}

TEST(StateIoV2, OldBlobsStillDecode) {
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  const auto ckv = iota(5 * 3, 100), ikeys = iota(5 * 2, 200);  // 5 rows; pages of 2 rows
  Bytes payload;
  payload.pod<int64_t>(5).pod<int64_t>(4).pod<uint64_t>(1);  // len, ring_size, one layer
  payload.floats(iota(4, 1));                                // ring
  payload.pod<uint64_t>(3).pod<uint64_t>(2).floats(ckv);     // ckv: width 3, 2 rows per page
  payload.pod<uint64_t>(2).pod<uint64_t>(2).floats(ikeys);   // ikeys: width 2
  for (int c = 0; c < 2; ++c) {                              // comp, icomp
    payload.floats({1}).floats({2}).floats({}).floats({});
    payload.pod<int64_t>(1).pod<uint8_t>(0).floats({}).floats({}).pod<int64_t>(5);
  }
  payload.pod<uint64_t>(2).pod<int64_t>(42).pod<int64_t>(43);  // Engram history
  payload.floats({}).floats({}).pod<uint64_t>(0);              // MTP ring, MTP hist, drafts
  const uint64_t key = engine::prefix_hashes(9, tokens).back();
  Bytes blob;
  blob.out = {'F', 'S', 'S', 'N', 'A', 'P', '0', '1'};
  blob.pod<uint32_t>(2).pod<uint32_t>(0).pod<uint64_t>(77).pod<uint64_t>(9).pod<uint64_t>(key);
  blob.pod<int64_t>(5).pod<uint64_t>(payload.out.size());
  for (int32_t t : tokens) blob.pod(t);
  blob.out.insert(blob.out.end(), payload.out.begin(), payload.out.end());
  blob.pod<uint64_t>(XXH64(blob.out.data(), blob.out.size(), 0));

  auto d = forward::deserialize_snapshot(blob.out, 77, geometry());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->tokens, tokens);
  EXPECT_EQ(d->header.prefix_hash, key);
  const auto& l = d->state->layers.at(0);
  EXPECT_EQ(l.ckv.size(), 5);
  EXPECT_EQ(l.ckv.pages().full.size(), 2u);  // re-paged: 2 sealed pages + 1 tail row
  EXPECT_EQ(l.ckv.to_vector(), ckv);
  EXPECT_EQ(l.ikeys.to_vector(), ikeys);
  EXPECT_EQ(d->state->engram_hist, (std::vector<int64_t>{42, 43}));

  // Current format (v3) round trip of the decoded state.
  auto v3 = forward::serialize_snapshot(*d->state, tokens, d->header);
  ASSERT_TRUE(v3.ok());
  auto again = forward::deserialize_snapshot(*v3, 77, geometry());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->state->layers.at(0).ckv.to_vector(), ckv);
  EXPECT_EQ(*forward::serialize_snapshot(*again->state, tokens, d->header), *v3);

  // A v2 blob cut short or flipped is still an error.
  auto bad = blob.out;
  bad[bad.size() / 2] ^= 1;
  EXPECT_FALSE(forward::deserialize_snapshot(bad, 77, geometry()).ok());
}

}  // namespace
}  // namespace flashseek::kvtest
