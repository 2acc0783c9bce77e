// Engram n-gram memory of V4.1 (v41 §4): hash layout, hash ids, gate.
#pragma once
#include <cstdint>
#include <vector>

namespace flashseek::ops {

inline constexpr int64_t kEngramDead = -1;  // compressed id of an image/DEAD position

struct EngramLayout {
  int64_t max_ngram = 0;              // N: orders 2..N
  int64_t n_heads = 0;                // hash heads per order
  std::vector<int64_t> primes;        // [(N−1)·n_heads] bucket sizes, column order (n−2)·nh + k
  std::vector<int64_t> offsets;       // [(N−1)·n_heads] exclusive prefix sums of primes
  std::vector<int64_t> multipliers;   // [N] odd multipliers; m[0] multiplies the current token
  int64_t n_cols() const { return int64_t(primes.size()); }
  int64_t n_rows() const { return primes.empty() ? 0 : offsets.back() + primes.back(); }
};

// Primes of every engram layer (v41 §4.3): one global `seen` set, each order restarting the
// search at vocab_size − 1. Multipliers are left empty (they come from numpy PCG64).
std::vector<EngramLayout> engram_layouts(int64_t n_layers, int64_t max_ngram, int64_t n_heads,
                                         int64_t vocab_size);

// Hash multipliers of engram layer `layer_id` (v41 §4.4): numpy
// `default_rng(10007·layer_id).integers(0, bound, size=n)` with
// bound = floor(floor((2^63−1) / compressed_vocab) / 2), each value v stored as 2v+1.
// Re-implements numpy's SeedSequence, PCG64 and Lemire bounded sampling exactly.
std::vector<int64_t> engram_multipliers(int64_t layer_id, int64_t compressed_vocab, int64_t n);

// Hash row ids (v41 §4.5) for `n` positions. `ctx` holds compressed ids (kEngramDead for DEAD)
// of positions first_pos − n_back … first_pos + n − 1, where n_back = min(first_pos, N − 1);
// ids_out [n, n_cols] are global row ids (offsets included).
void engram_hash(const EngramLayout& layout, const int64_t* ctx, int64_t n_back, int64_t n,
                 int64_t first_pos, int64_t pad_c, int64_t* ids_out);

struct EngramGateParams {
  float* x = nullptr;           // [hc, dim] one token's residual streams, updated in place
  const float* kv = nullptr;    // [(hc + 1) · dim] wkv(e): hc keys then the value
  const float* wqk = nullptr;   // [hc, dim] q_weight ⊙ k_weight (FP32)
  int64_t hc = 4, dim = 0;
  float eps = 1e-20f;
  bool dead = false;            // gate forced to 0 (image / non-participating token)
  bool bf16_out = false;
};
// g_c = sigmoid(signed_sqrt(z_c)), z_c = Σ x·w·key · rsqrt(ms(x)+ε) · rsqrt(ms(key)+ε) / √dim;
// x_c += g_c · value.
void engram_gate(const EngramGateParams& p);

}  // namespace flashseek::ops
