// A per-sequence speculation policy: decides, every decode step, whether
// to verify a block of drafts and how many of the proposal's drafts to verify, from
//   * the sequence's recent acceptance (EWMA of the conditional survival of each draft position),
//   * the measured cost of a verify step of width 1 + k against a plain 1-token step on this
//     backend at this batch size, plus the draft's own cost (SpecCosts).
// It speculates with the k that maximises expected tokens per second when that beats plain
// decoding by SpecPolicyOptions::min_gain, and otherwise decodes plainly, probing the full block
// again every so often (so a draft that starts to agree is picked up again). A shorter block is a
// prefix of the proposal: DSpark's block width is fixed by the weights (v41 §5.6: every draft
// depends on the width), so the draft always proposes its full block and only the first k drafts
// are verified (still lossless: the acceptance rule holds for any prefix).
//
// Pure logic: no clock, no model. The engine feeds SpecCosts from its own step timings; tests feed
// it numbers directly.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flashseek::engine {

// EngineOptions::speculative. kAuto: the policy below; kOn: always verify the full block (tests,
// measurements); kOff: never speculate.
enum class SpecMode { kOff, kOn, kAuto };
const char* spec_mode_name(SpecMode mode);  // "off", "on", "auto"

struct SpecPolicyOptions {
  double acceptance_alpha = 0.25;  // EWMA weight of a new acceptance observation (ewma_add)
  double cost_alpha = 0.2;         // EWMA weight of a new step / draft time (ewma_add)
  // Speculate only when the expected token rate is at least this factor above plain decoding
  // (a margin against noise in the measured costs).
  double min_gain = 1.05;
  // Decode steps between full-block probes while the policy is off (or verifies a shorter
  // prefix); each probe that leaves the policy off doubles the interval, up to max_probe_every.
  int64_t probe_every = 16;
  int64_t max_probe_every = 256;
  // While off, probes are also spaced so that their extra cost (a verify + the draft − a plain
  // step) stays below this fraction of the plain decoding time in between, even beyond
  // max_probe_every. It is what `auto` gives up against `off` on a draft that never agrees: on
  // the CPU a probe costs ~20 plain steps, so ~1 probe per 1,000 steps; on the GPU ~7, ~1 per 350.
  double max_probe_overhead = 0.02;
  // The longest gap between probes while off, whatever a probe costs: a draft that starts to
  // agree is picked up again within this many decode steps of the sequence (the probes' share
  // of the time then exceeds max_probe_overhead only where a probe costs more than
  // max_probe_overhead × max_probe_gap plain steps).
  int64_t max_probe_gap = 4096;
};
// Errors name the bad field; empty when valid.
std::string validate_spec_policy(const SpecPolicyOptions& o);

// The running estimates below (acceptance, costs) are EWMAs with a warm start: the first 1/alpha
// samples are averaged (weight 1/n for the n-th sample), later ones get weight alpha. So one
// unlucky first observation (a probe whose first draft happened to be rejected) does not stand
// for the whole estimate until many more samples have come in.
inline void ewma_add(double& value, int64_t& samples, double x, double alpha) {
  ++samples;
  const double w = 1.0 / double(samples);
  value += (w > alpha ? w : alpha) * (x - value);
}

// Measured step costs of one engine: EWMA of the wall time of decode-only steps, keyed by the
// batch bucket (decode items in the step: 1, 2, 3–4, 5–8, …) and the step's width (tokens per
// decode item, rounded: 1 for plain decoding, 1 + k when the items verify k drafts), and EWMA of
// one draft proposal's wall time.
class SpecCosts {
 public:
  explicit SpecCosts(double alpha = 0.2) : alpha_(alpha) {}
  static int bucket(int64_t batch);                          // 0: 1, 1: 2, 2: 3–4, 3: 5–8, …
  static std::pair<int64_t, int64_t> bucket_range(int bucket);  // {lo, hi} batch sizes
  void observe_step(int64_t batch, int64_t width, double seconds);
  void observe_draft(double seconds);
  bool measured(int64_t batch, int64_t width) const;
  // The step cost at `batch` and `width`: measured, or linear in width between the nearest
  // measured widths of the bucket (extrapolated from the two nearest when outside them);
  // nullopt when the bucket has no measurement that can give it.
  std::optional<double> step(int64_t batch, int64_t width) const;
  std::optional<double> draft() const;
  struct Entry {
    int bucket = 0;
    int64_t width = 0;
    double seconds = 0;
    int64_t samples = 0;
  };
  std::vector<Entry> entries() const;  // ascending (bucket, width)
  int64_t draft_samples() const { return draft_.samples; }

 private:
  struct Ewma {
    double value = 0;
    int64_t samples = 0;
    void add(double x, double alpha) { ewma_add(value, samples, x, alpha); }
  };
  double alpha_;
  std::map<std::pair<int, int64_t>, Ewma> steps_;
  Ewma draft_;
};

// One sequence's policy state.
class SpecPolicy {
 public:
  SpecPolicy(SpecMode mode, int64_t block, SpecPolicyOptions opt = {});

  struct Decision {
    int64_t drafts = 0;   // drafts to verify this step (0: a plain decode)
    bool probe = false;   // a full-block verification made to measure (acceptance or cost)
    bool measure = false;  // taken to measure (a probe, or a plain step whose cost is unknown)
  };
  // Called once per decode step of the sequence; `batch` = decode items in the step.
  Decision decide(const SpecCosts& costs, int64_t batch);
  // After a verification of `verified` drafts of which the first `accepted` survived.
  void observe(int64_t verified, int64_t accepted);
  // Starts from another policy's acceptance estimates (the engine's estimate over all its
  // sequences), so a new sequence decides at once instead of probing first.
  void adopt_acceptance(const SpecPolicy& other);

  // Expected tokens emitted by a verification of k drafts (accepted drafts + the bonus token):
  // 1 + Σ_{i≤k} Π_{j≤i} s_j, s_j the conditional survival of draft j (unobserved positions take
  // their predecessor's estimate).
  double expected_tokens(int64_t k) const;
  std::optional<double> survival(int64_t position) const;  // 1-based; nullopt: never observed
  bool speculating() const { return speculating_; }        // the last decision verified drafts
  int64_t probe_interval() const { return probe_interval_; }
  SpecMode mode() const { return mode_; }
  // Why the last decision was taken, with the numbers (for logs): e.g. "k=2: 1.81 tok in
  // 1.40 ms vs 1.00 tok in 1.05 ms".
  const std::string& reason() const { return reason_; }

 private:
  SpecMode mode_;
  int64_t block_;
  SpecPolicyOptions opt_;
  struct Survival {
    double value = 0;
    int64_t samples = 0;
  };
  std::vector<Survival> s_;         // [block]
  int64_t since_probe_ = 0;         // decode steps since the last full-block verification
  int64_t probe_interval_;
  bool speculating_ = false;
  bool last_was_probe_ = false;
  std::string reason_;
};

}  // namespace flashseek::engine
