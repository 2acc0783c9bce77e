// Sampling one token per row of logits: the single definition of the engine's sampling rule, with
// one params struct shared by the CPU twin (sample_rows_ref, ops/cpu/sample.cpp) and the CUDA op
// (ops/cuda/sampling/sample.h), so that the two can be compared on identical inputs.
//
// The rule (docs/engine.md "Sampling"), for one row [V]:
//   1. greedy (temperature <= 0 or top_k == 1): argmax over finite logits, lowest id on ties;
//   2. non-finite logits (-inf masks, NaN) are never candidates;
//   3. top-k (0 < k < #finite): the k largest logits, lower id first on ties; the candidates are
//      then in that descending order;
//   4. softmax of double(logit) / temperature over the candidates (double);
//   5. top-p (< 1): sort descending (lower id first on ties), keep the shortest prefix whose mass
//      reaches top_p (at least one token);
//   6. min-p (> 0): keep candidates with prob >= min_p * max prob;
//   7. renormalise and draw by inverse CDF with `u` over the candidates in their order: descending
//      when top-k cut or top-p applied, else ascending id.
// Ties are broken towards the lower id everywhere, so the token is a pure function of (row, spec).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace flashseek::ops {

// Sampling parameters of one row. `u` is the uniform in [0, 1) of the inverse-CDF draw (the engine
// keys it by (seed, position), engine/sampling_params.h).
struct SampleSpec {
  double temperature = 1.0;  // <= 0: greedy
  int64_t top_k = 0;         // <= 0 or >= #finite: no top-k filter; 1: greedy
  double top_p = 1.0;        // (0, 1]; 1: no nucleus filter
  double min_p = 0.0;        // [0, 1]; keep tokens with prob >= min_p * max prob
  double u = 0.0;            // [0, 1)

  bool greedy() const { return temperature <= 0.0 || top_k == 1; }
};

// Range checks of temperature, top_p, min_p (and u when `check_u`); the message names the field.
Status validate(const SampleSpec& s, bool check_u = true);

// The distribution a row is drawn from: candidate ids in draw order and their probabilities
// (normalised to sum 1). Greedy specs give the argmax with probability 1.
struct SampleDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

// Index of the largest finite logit (lowest id on ties); error if no logit is finite.
Result<int32_t> argmax_row(std::span<const float> logits);
// Steps 1-6 of the rule (`u` is not used); errors for bad ranges, an empty row or no finite logit.
Result<SampleDistribution> sample_distribution(std::span<const float> logits, const SampleSpec& s);
// Step 7: the first candidate whose cumulative probability exceeds u (the last one when u is
// within rounding of 1).
int32_t draw_inverse_cdf(const SampleDistribution& d, double u);
// The whole rule for one row.
Result<int32_t> sample_row(std::span<const float> logits, const SampleSpec& s);

// One token per row of `logits`. Both backends take the same struct; for the CUDA op `logits` and
// `out` are device pointers and `workspace` device memory of sample_rows_workspace_bytes(vocab)
// bytes (ops/cuda/sampling/sample.h; nothing is allocated inside, so the op may be captured in a CUDA
// graph); the CPU twin ignores the workspace. `specs` is host memory in both.
struct SampleRowsParams {
  const float* logits = nullptr;      // [rows, vocab] FP32
  int64_t rows = 0, vocab = 0;
  const SampleSpec* specs = nullptr;  // [rows], host
  int32_t* out = nullptr;             // [rows]: the token, or -1 when the row has no finite logit
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Shapes (rows >= 0, 1 <= vocab < 2^31), non-null pointers and every spec's ranges.
Status validate(const SampleRowsParams& p);

// CPU twin (ops/cpu/sample.cpp): sample_row per row; a row without a finite logit gives -1 (as on
// the device, which cannot report a per-row error without a synchronisation).
Status sample_rows_ref(const SampleRowsParams& p);

}  // namespace flashseek::ops
