// numpy's default_rng (SeedSequence → PCG64) and Generator.integers for int64 ranges above 2^32
// (Lemire's bounded method), re-implemented bit for bit to derive the Engram hash multipliers of
// any layout (v41 §4.4). Only the pieces that path uses are here.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/engram.h"

namespace flashseek::ops {

namespace {
using u128 = unsigned __int128;

// numpy.random.SeedSequence with one 32-bit-word entropy value and pool size 4.
class SeedSequence {
 public:
  explicit SeedSequence(const std::vector<uint32_t>& entropy) {
    uint32_t hash_const = kInitA;
    auto hashmix = [&](uint32_t v) {
      v ^= hash_const;
      hash_const *= kMultA;
      v *= hash_const;
      v ^= v >> 16;
      return v;
    };
    auto mix = [](uint32_t x, uint32_t y) {
      uint32_t r = kMixL * x - kMixR * y;
      r ^= r >> 16;
      return r;
    };
    for (size_t i = 0; i < 4; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0u);
    for (size_t s = 0; s < 4; ++s)
      for (size_t d = 0; d < 4; ++d)
        if (s != d) pool_[d] = mix(pool_[d], hashmix(pool_[s]));
    for (size_t s = 4; s < entropy.size(); ++s)
      for (size_t d = 0; d < 4; ++d) pool_[d] = mix(pool_[d], hashmix(entropy[s]));
  }
  // generate_state(n, uint64): 2n 32-bit words viewed as little-endian uint64 pairs.
  std::vector<uint64_t> generate_state64(size_t n) const {
    uint32_t hash_const = kInitB;
    std::vector<uint64_t> out(n, 0);
    for (size_t i = 0; i < 2 * n; ++i) {
      uint32_t v = pool_[i % 4];
      v ^= hash_const;
      hash_const *= kMultB;
      v *= hash_const;
      v ^= v >> 16;
      out[i / 2] |= uint64_t(v) << (32 * (i % 2));
    }
    return out;
  }

 private:
  static constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd,
                            kMultB = 0x58f38ded, kMixL = 0xca01f9dd, kMixR = 0x4973f715;
  uint32_t pool_[4] = {};
};

// PCG64 (XSL-RR 128/64) as seeded by numpy: state/inc from SeedSequence.generate_state(4, u64).
class Pcg64 {
 public:
  explicit Pcg64(const SeedSequence& ss) {
    const auto v = ss.generate_state64(4);
    const u128 initstate = (u128(v[0]) << 64) | v[1];
    const u128 initseq = (u128(v[2]) << 64) | v[3];
    state_ = 0;
    inc_ = (initseq << 1) | 1;
    step();
    state_ += initstate;
    step();
  }
  uint64_t next64() {
    step();
    const uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
    const unsigned rot = unsigned(state_ >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
  }

 private:
  void step() {
    const u128 mult = (u128(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;
    state_ = state_ * mult + inc_;
  }
  u128 state_ = 0, inc_ = 0;
};

// Lemire's bounded sampling of numpy for a 64-bit range: a value in [0, rng] (rng > 2^32 − 1).
uint64_t bounded_lemire(Pcg64& g, uint64_t rng) {
  const uint64_t excl = rng + 1;
  u128 m = u128(g.next64()) * excl;
  uint64_t left = uint64_t(m);
  if (left < excl) {
    const uint64_t threshold = (UINT64_MAX - rng) % excl;
    while (left < threshold) {
      m = u128(g.next64()) * excl;
      left = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}
}  // namespace

std::vector<int64_t> engram_multipliers(int64_t layer_id, int64_t compressed_vocab, int64_t n) {
  const int64_t bound = (INT64_MAX / compressed_vocab) / 2;
  SeedSequence ss({uint32_t(10007 * layer_id)});
  Pcg64 g(ss);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(2 * int64_t(bounded_lemire(g, uint64_t(bound - 1))) + 1);
  return out;
}

}  // namespace flashseek::ops
