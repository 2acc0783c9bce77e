// Snapshot blobs (forward/state_io.h) as they arrive from cache files and peers. The first byte
// picks the mode: bit 0 repairs the trailer checksum and takes the blob's own fingerprint as the
// expected one, so that mutations reach the payload decoder instead of stopping at the checksum;
// bit 1 decodes against tiny-v4's geometry (V4 MTP rows) instead of tiny-v41's (DSpark rings).
#include <xxhash.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "forward/model.h"
#include "forward/state_io.h"
#include "fuzz/targets.h"

namespace flashseek::fuzz {

const forward::SnapshotGeometry& tiny_geometry(bool v4) {
  static std::mutex mu;
  static std::map<bool, forward::SnapshotGeometry> g;
  std::lock_guard lock(mu);
  if (auto it = g.find(v4); it != g.end()) return it->second;
  auto r = forward::checkpoint_snapshot_geometry(tiny_checkpoint(v4 ? "tiny-v4" : "tiny-v41"), kTinyMaxTokens);
  if (!r.ok()) fail(__FILE__, __LINE__, r.status().to_string());
  return g.emplace(v4, std::move(*r)).first->second;
}

bool run_snapshot(std::span<const uint8_t> d) {
  if (d.empty()) return false;
  const uint8_t mode = d[0];
  Bytes blob(d.begin() + 1, d.end());
  uint64_t fingerprint = 0x5eed;
  if ((mode & 1) && blob.size() >= forward::kSnapshotHeaderBytes + 8) {
    const uint64_t sum = XXH64(blob.data(), blob.size() - 8, 0);
    std::memcpy(blob.data() + blob.size() - 8, &sum, 8);
    fingerprint = load_u64(blob, kSnapFingerprintAt);
  }
  const auto& g = tiny_geometry(mode & 2);

  auto peek = forward::peek_snapshot_header(blob);
  (void)forward::snapshot_page_refs(blob);
  auto dec = forward::deserialize_snapshot(blob, fingerprint, g);
  if (!dec.ok()) return false;

  // Accepted: it has the geometry's shape, its header agrees with the cheap peek, and it
  // re-encodes to a blob that decodes again and re-encodes to the same bytes.
  FUZZ_CHECK(dec->state != nullptr, "decoded snapshot without a state");
  FUZZ_CHECK(forward::validate_state(*dec->state, g).ok(), "decoded state does not fit the geometry");
  FUZZ_CHECK(peek.ok(), "deserialize accepted a blob whose header peek fails");
  FUZZ_CHECK(peek->n_tokens == dec->header.n_tokens && peek->fingerprint == dec->header.fingerprint &&
                 peek->prefix_hash == dec->header.prefix_hash && peek->tenant == dec->header.tenant,
             "peek and deserialize read different headers");
  FUZZ_CHECK(int64_t(dec->tokens.size()) == dec->header.n_tokens, "token count differs from the header");
  FUZZ_CHECK(dec->state->length() == dec->header.n_tokens, "state length differs from the header");
  auto again = forward::serialize_snapshot(*dec->state, dec->tokens, dec->header);
  FUZZ_CHECK(again.ok(), "a decoded state does not serialise: " + again.status().to_string());
  FUZZ_CHECK(again->size() <= forward::max_snapshot_bytes(g), "re-encoded blob over the geometry's bound");
  auto dec2 = forward::deserialize_snapshot(*again, dec->header.fingerprint, g);
  FUZZ_CHECK(dec2.ok(), "a re-encoded snapshot does not decode: " + dec2.status().to_string());
  FUZZ_CHECK(dec2->tokens == dec->tokens, "tokens changed through a re-encode");
  auto third = forward::serialize_snapshot(*dec2->state, dec2->tokens, dec2->header);
  FUZZ_CHECK(third.ok() && *third == *again, "serialise(deserialise(b)) is not a fixed point");
  return true;
}

std::vector<Bytes> seeds_snapshot() {
  std::vector<Bytes> out;
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    const bool v4 = std::string(name) == "tiny-v4";
    const std::string& dir = tiny_checkpoint(name);
    auto model = forward::load_model(dir, forward::Numerics::kReference);
    if (!model.ok()) fail(__FILE__, __LINE__, model.status().to_string());
    const int64_t vocab = (*model)->config().vocab_size;
    std::vector<int32_t> tokens;
    uint64_t x = 7;
    for (int64_t n : {0, 3, 70, 300}) {  // empty, inside the window, past compression blocks
      while (int64_t(tokens.size()) < n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens.push_back(int32_t((x >> 33) % uint64_t(vocab)));
      }
      auto st = (*model)->new_sequence();
      if (n > 0) {
        forward::BatchItem item{st.get(), tokens, false};
        std::vector<float> logits;
        if (auto s = (*model)->forward(std::span<forward::BatchItem>(&item, 1), logits); !s.ok())
          fail(__FILE__, __LINE__, s.to_string());
      }
      auto blob = forward::serialize_snapshot(*st, tokens, {0x1234, 1, 2, n, 0});
      if (!blob.ok()) fail(__FILE__, __LINE__, blob.status().to_string());
      Bytes seed{uint8_t(1 | (v4 ? 2 : 0))};
      seed.insert(seed.end(), blob->begin(), blob->end());
      out.push_back(std::move(seed));
    }
  }
  return out;
}

}  // namespace flashseek::fuzz
