// Interleaved, trailing-slice rotary embedding with per-layer frequency tables (v4 §3.5.3,
// v41 §2 item 4). Pairs are adjacent dims (2i, 2i+1) of the last `rope_dim` dims of a vector.
#pragma once
#include <cstdint>
#include <vector>

namespace flashseek::ops {

struct RopeSpec {
  int64_t rope_dim = 64;
  double theta = 10000;
  bool yarn = false;          // YaRN frequency interpolation (no mscale, ever)
  double factor = 1;          // YaRN factor
  int64_t original_len = 0;   // YaRN original_seq_len
  double beta_fast = 32, beta_slow = 1;
};

// ω_i for i < rope_dim/2, in FP32, exactly as the reference formula evaluates them; for the
// released dims (64; θ 10000 plain or θ 160000 + YaRN 16/65536/32/1) the bit patterns measured
// on the reference's own hardware are used (v4 §3.5.3).
std::vector<float> rope_inv_freq(const RopeSpec& spec);

struct RopeParams {
  float* x = nullptr;              // [rows, n_vec, vec_dim]; RoPE on the last rope_dim of each vec
  const int64_t* pos = nullptr;    // [rows] absolute position of each row
  const float* inv_freq = nullptr; // [rope_dim/2]
  int64_t rows = 0, n_vec = 1, vec_dim = 0, rope_dim = 0;
  bool inverse = false;            // rotate by −φ (conjugate), used on attention outputs
  bool bf16_out = false;
};
void apply_rope(const RopeParams& p);

}  // namespace flashseek::ops
