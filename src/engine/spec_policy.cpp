#include "engine/spec_policy.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace flashseek::engine {

const char* spec_mode_name(SpecMode mode) {
  switch (mode) {
    case SpecMode::kOff: return "off";
    case SpecMode::kOn: return "on";
    case SpecMode::kAuto: return "auto";
  }
  return "?";
}

std::string validate_spec_policy(const SpecPolicyOptions& o) {
  auto unit = [](double a) { return std::isfinite(a) && a > 0 && a <= 1; };
  if (!unit(o.acceptance_alpha))
    return fmt::format("acceptance_alpha must be in (0, 1] (got {})", o.acceptance_alpha);
  if (!unit(o.cost_alpha)) return fmt::format("cost_alpha must be in (0, 1] (got {})", o.cost_alpha);
  if (!std::isfinite(o.min_gain) || o.min_gain <= 0)
    return fmt::format("min_gain must be > 0 (got {})", o.min_gain);
  if (o.probe_every < 1) return fmt::format("probe_every must be >= 1 (got {})", o.probe_every);
  if (!std::isfinite(o.max_probe_overhead) || o.max_probe_overhead <= 0)
    return fmt::format("max_probe_overhead must be > 0 (got {})", o.max_probe_overhead);
  if (o.max_probe_gap < o.max_probe_every)
    return fmt::format("max_probe_gap ({}) must be >= max_probe_every ({})", o.max_probe_gap,
                       o.max_probe_every);
  if (o.max_probe_every < o.probe_every)
    return fmt::format("max_probe_every ({}) must be >= probe_every ({})", o.max_probe_every,
                       o.probe_every);
  return {};
}

// ---- SpecCosts ----

int SpecCosts::bucket(int64_t batch) {
  int b = 0;
  for (int64_t hi = 1; hi < batch && b < 62; hi *= 2) ++b;
  return b;
}

std::pair<int64_t, int64_t> SpecCosts::bucket_range(int bucket) {
  if (bucket <= 0) return {1, 1};
  const int64_t hi = int64_t(1) << std::min(bucket, 62);
  return {hi / 2 + 1, hi};
}

void SpecCosts::observe_step(int64_t batch, int64_t width, double seconds) {
  if (batch < 1 || width < 1 || !std::isfinite(seconds) || seconds < 0) return;
  steps_[{bucket(batch), width}].add(seconds, alpha_);
}

void SpecCosts::observe_draft(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  draft_.add(seconds, alpha_);
}

bool SpecCosts::measured(int64_t batch, int64_t width) const {
  return steps_.count({bucket(batch), width}) > 0;
}

std::optional<double> SpecCosts::step(int64_t batch, int64_t width) const {
  const int b = bucket(batch);
  if (auto it = steps_.find({b, width}); it != steps_.end()) return it->second.value;
  // The measured widths of this bucket, ascending.
  std::vector<std::pair<int64_t, double>> w;
  for (auto it = steps_.lower_bound({b, 0}); it != steps_.end() && it->first.first == b; ++it)
    w.push_back({it->first.second, it->second.value});
  if (w.size() < 2) return std::nullopt;
  // The two measured widths around `width` (or the two nearest on one side).
  size_t hi = size_t(std::upper_bound(w.begin(), w.end(), std::pair<int64_t, double>{width, 0.0}) -
                     w.begin());
  hi = std::clamp<size_t>(hi, 1, w.size() - 1);
  const auto [x0, y0] = w[hi - 1];
  const auto [x1, y1] = w[hi];
  const double y = y0 + (y1 - y0) * double(width - x0) / double(x1 - x0);
  return std::max(y, 0.0);
}

std::optional<double> SpecCosts::draft() const {
  if (draft_.samples == 0) return std::nullopt;
  return draft_.value;
}

std::vector<SpecCosts::Entry> SpecCosts::entries() const {
  std::vector<Entry> out;
  for (const auto& [k, e] : steps_) out.push_back({k.first, k.second, e.value, e.samples});
  return out;
}

// ---- SpecPolicy ----

SpecPolicy::SpecPolicy(SpecMode mode, int64_t block, SpecPolicyOptions opt)
    : mode_(mode),
      block_(std::max<int64_t>(block, 0)),
      opt_(opt),
      s_(size_t(std::max<int64_t>(block, 0))),
      probe_interval_(opt.probe_every) {}

std::optional<double> SpecPolicy::survival(int64_t position) const {
  if (position < 1 || position > block_ || s_[size_t(position - 1)].samples == 0)
    return std::nullopt;
  return s_[size_t(position - 1)].value;
}

double SpecPolicy::expected_tokens(int64_t k) const {
  double sum = 1, prod = 1, est = 0;
  for (int64_t i = 1; i <= std::min(k, block_); ++i) {
    const Survival& s = s_[size_t(i - 1)];
    if (s.samples > 0) est = s.value;  // else: the predecessor's estimate (0 before position 1)
    prod *= est;
    sum += prod;
  }
  return sum;
}

void SpecPolicy::observe(int64_t verified, int64_t accepted) {
  verified = std::clamp<int64_t>(verified, 0, block_);
  accepted = std::clamp<int64_t>(accepted, 0, verified);
  // Position i was reached when drafts 1 … i−1 survived; it survived when i ≤ accepted.
  for (int64_t i = 1; i <= std::min(accepted + 1, verified); ++i) {
    Survival& s = s_[size_t(i - 1)];
    ewma_add(s.value, s.samples, i <= accepted ? 1.0 : 0.0, opt_.acceptance_alpha);
  }
}

void SpecPolicy::adopt_acceptance(const SpecPolicy& other) {
  if (other.block_ == block_) s_ = other.s_;
}

SpecPolicy::Decision SpecPolicy::decide(const SpecCosts& costs, int64_t batch) {
  const bool after_probe = last_was_probe_;
  last_was_probe_ = false;
  if (mode_ == SpecMode::kOff || block_ < 1) {
    speculating_ = false;
    return {};
  }
  if (mode_ == SpecMode::kOn) {
    speculating_ = true;
    return {block_, false};
  }
  batch = std::max<int64_t>(batch, 1);
  auto probe = [&](std::string why) {
    since_probe_ = 0;
    speculating_ = true;
    last_was_probe_ = true;
    reason_ = std::move(why);
    return Decision{block_, true, true};
  };
  auto plain = [&](std::string why) {
    speculating_ = false;
    reason_ = std::move(why);
    return Decision{};
  };
  if (s_[0].samples == 0) return probe("probe: no acceptance measured yet");
  // Costs first measured here: one plain step, then one full-block verification.
  if (!costs.measured(batch, 1)) {
    Decision d = plain("measuring the plain step cost");
    d.measure = true;
    return d;
  }
  const std::optional<double> c1 = costs.step(batch, 1);
  if (!costs.step(batch, block_ + 1)) return probe("probe: measuring the verify cost");
  const double draft = costs.draft().value_or(0.0) * double(batch);  // proposals run one by one
  int64_t best_k = 0;
  double best_rate = 0, best_cost = 0;
  for (int64_t k = 1; k <= block_; ++k) {
    const std::optional<double> ck = costs.step(batch, k + 1);
    if (!ck) continue;
    // A verify does all of a plain step's work and more: a noisy measurement that says otherwise
    // (which would lock speculation on, since plain steps are then no longer measured) is
    // clamped to the plain step's cost.
    const double cost = std::max(*ck, *c1) + draft;
    const double rate = cost > 0 ? expected_tokens(k) / cost : 0;
    if (rate > best_rate) best_k = k, best_rate = rate, best_cost = cost;
  }
  const double plain_rate = *c1 > 0 ? 1.0 / *c1 : 0;
  const bool on = best_k > 0 && best_rate >= opt_.min_gain * plain_rate && best_rate > 0;
  const std::string numbers =
      best_k > 0 ? fmt::format("k={}: {:.2f} tok in {:.3f} ms vs 1 tok in {:.3f} ms (batch {})",
                               best_k, expected_tokens(best_k), best_cost * 1e3, *c1 * 1e3, batch)
                 : fmt::format("no verify cost at batch {}", batch);
  ++since_probe_;
  if (on) {
    probe_interval_ = opt_.probe_every;
    if (best_k == block_) since_probe_ = 0;  // the full block is measured anyway
    else if (since_probe_ >= probe_interval_) return probe("probe: refreshing later positions; " + numbers);
    speculating_ = true;
    reason_ = "speculate " + numbers;
    return {best_k, false};
  }
  if (after_probe) probe_interval_ = std::min(probe_interval_ * 2, opt_.max_probe_every);
  // A probe costs a full-block verify and the draft instead of a plain step.
  int64_t interval = probe_interval_;
  if (const std::optional<double> cb = costs.step(batch, block_ + 1); cb && *c1 > 0) {
    const double extra = std::max(0.0, *cb + draft - *c1);
    const double steps = std::ceil(extra / (*c1 * opt_.max_probe_overhead));
    interval = std::max(interval, int64_t(std::min(steps, double(opt_.max_probe_gap))));
  }
  if (since_probe_ >= interval) return probe("probe: " + numbers);
  return plain("plain " + numbers);
}

}  // namespace flashseek::engine
