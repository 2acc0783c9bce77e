// Per-request sampling parameters and the counter-based random source they use.
//
// Seeded sampling must give the same tokens whatever else is in the batch and however the
// scheduler chunks the prompt, so randomness is never drawn from a stream shared across requests:
// each draw is a pure function of (seed, position of the token being sampled).
#pragma once
#include <cstdint>

#include "core/status.h"

namespace flashseek::engine {

struct SamplingParams {
  double temperature = 1.0;  // <= 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         // <= 0 or >= vocab: no top-k filter; 1: greedy
  double top_p = 1.0;        // (0, 1]; 1: no nucleus filter
  double min_p = 0.0;        // [0, 1]; keep tokens with prob >= min_p * max prob
  uint64_t seed = 0;         // keys the counter RNG (the engine fills it for unseeded requests)

  bool greedy() const { return temperature <= 0.0 || top_k == 1; }
};

// Checks ranges; the message names the offending field.
Status validate_sampling(const SamplingParams& params);

// Uniform double in [0, 1) keyed by (seed, counter): a stateless splitmix-style hash, so the same
// key gives the same number on every platform and in any call order.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  const uint64_t bits = mix64(key ^ mix64(counter * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
  return double(bits >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace flashseek::engine
