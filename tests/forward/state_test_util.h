// Bitwise comparison of canonical sequence states (forward/state.h), shared by the snapshot tests
// (state_convert_test on the CPU, gpu_snapshot_test on the GPU).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "forward/state.h"

namespace flashseek::forward::state_test {

// Same size and the same bytes (so -0 ≠ +0 and NaN payloads count: a copy must be exact).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline void expect_same_comp(const CompressorState& a, const CompressorState& b, const std::string& at) {
  EXPECT_TRUE(same_bits(a.v, b.v)) << at << " v";
  EXPECT_TRUE(same_bits(a.z, b.z)) << at << " z";
  EXPECT_TRUE(same_bits(a.prev_v, b.prev_v)) << at << " prev_v";
  EXPECT_TRUE(same_bits(a.prev_z, b.prev_z)) << at << " prev_z";
  EXPECT_EQ(a.n_pend, b.n_pend) << at;
  EXPECT_EQ(a.has_prev, b.has_prev) << at;
  EXPECT_TRUE(same_bits(a.hist_v, b.hist_v)) << at << " hist_v (" << a.hist_v.size() << " vs " << b.hist_v.size() << ")";
  EXPECT_TRUE(same_bits(a.hist_z, b.hist_z)) << at << " hist_z";
  EXPECT_EQ(a.hist_first, b.hist_first) << at;
}

// Every field of a and b bit for bit; with `ignore_mtp` the V4 MTP fields are skipped (the CUDA
// backend keeps only the MTP rows a proposal still reads: tests/forward/gpu_mtp_test.cpp).
inline void expect_same_state(const CpuSequenceState& a, const CpuSequenceState& b, bool ignore_mtp = false) {
  EXPECT_EQ(a.len, b.len);
  EXPECT_EQ(a.ring_size, b.ring_size);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const std::string at = "layer " + std::to_string(l);
    const LayerState &x = a.layers[l], &y = b.layers[l];
    EXPECT_TRUE(same_bits(x.ring, y.ring)) << at << " ring";
    EXPECT_EQ(x.ckv.width(), y.ckv.width()) << at;
    EXPECT_TRUE(same_bits(x.ckv.to_vector(), y.ckv.to_vector())) << at << " ckv (" << x.ckv.size() << " vs "
                                                                  << y.ckv.size() << " rows)";
    EXPECT_EQ(x.ikeys.width(), y.ikeys.width()) << at;
    EXPECT_TRUE(same_bits(x.ikeys.to_vector(), y.ikeys.to_vector())) << at << " ikeys";
    expect_same_comp(x.comp, y.comp, at + " comp");
    expect_same_comp(x.icomp, y.icomp, at + " icomp");
  }
  EXPECT_EQ(a.engram_hist, b.engram_hist);
  if (!ignore_mtp) {
    EXPECT_TRUE(same_bits(a.mtp_ring, b.mtp_ring)) << "mtp_ring";
    EXPECT_TRUE(same_bits(a.mtp_hist_x, b.mtp_hist_x)) << "mtp_hist_x";
  }
  ASSERT_EQ(a.draft_rings.size(), b.draft_rings.size());
  for (size_t i = 0; i < a.draft_rings.size(); ++i)
    EXPECT_TRUE(same_bits(a.draft_rings[i], b.draft_rings[i])) << "draft ring " << i;
}

}  // namespace flashseek::forward::state_test
