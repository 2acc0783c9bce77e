// Whole-model parity statistics between two backends (or a backend and its perturbed self) on
// teacher-forced logits (docs/cuda.md, "Whole-model parity"): per position the largest
// |Δlogit| over the vocabulary, summarised by median, p99 and max over positions, and the
// argmax agreement with the reference's near-ties excluded.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "forward/model.h"

namespace flashseek::forward {

// A position whose reference top-2 logits are within this (absolute) distance is a tie: its
// argmax is an arbitrary choice between two equal scores, so it is left out of the agreement.
inline constexpr double kParityTieEps = 1e-6;

// A compared position whose argmax differs from the reference's: the reference's top-2 gap there
// and that position's max|Δlogit|. A flip needs gap <= 2·max|Δlogit| (one of the two logits moved
// by at least half the gap); a gap below the typical max|Δlogit| of the run (its median) is a
// near-tie that any perturbation of that size flips about as often as not.
struct ArgmaxFlip {
  int64_t position = 0;
  double ref_gap = 0;
  double max_diff = 0;
};

struct ParityStats {
  int64_t positions = 0;
  // Of the per-position max|Δlogit|: nearest-rank quantiles (median = rank ceil(n/2), p99 = rank
  // ceil(0.99 n)) and the maximum.
  double median = 0, p99 = 0, max = 0;
  int64_t ties = 0;      // positions left out of the argmax comparison
  int64_t compared = 0;  // positions - ties
  int64_t agree = 0;     // of those, positions whose argmax is the reference's
  bool finite = true;    // every logit of both runs is finite (else the statistics are meaningless)
  std::vector<ArgmaxFlip> flips;  // the compared positions that disagree (agree + flips == compared)
  // agree / compared; 1 when every position was a tie.
  double argmax_agreement() const { return compared ? double(agree) / double(compared) : 1.0; }
  std::string to_string() const;
};

// Statistics of `other` against `ref`, both [positions, vocab] row-major. Teacher forcing feeds
// both the same tokens, so a tie at one position does not change what later positions see: only
// the tie itself is excluded. Errors: vocab <= 0, sizes that differ or are not whole rows.
Result<ParityStats> parity_stats(std::span<const float> ref, std::span<const float> other, int64_t vocab,
                                 double tie_eps = kParityTieEps);

// Per position of [positions, vocab] row-major logits, the top-1 minus top-2 logit (0 for vocab 1).
std::vector<double> top2_gaps(std::span<const float> logits, int64_t vocab);

// Teacher-forced logits [tokens, vocab] of `tokens` fed through a fresh sequence of `m` in chunks
// of `chunk` tokens (all_logits).
Result<std::vector<float>> teacher_forced_logits(Model& m, std::span<const int32_t> tokens, int64_t chunk);

}  // namespace flashseek::forward
