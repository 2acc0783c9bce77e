#include "engine/spec_metrics.h"

#include <fmt/format.h>

namespace flashseek::engine {
namespace {

std::string batch_label(int bucket) {
  const auto [lo, hi] = SpecCosts::bucket_range(bucket);
  return lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
}

// The measured plain (width 1) step cost of the bucket; 0 when not measured.
double plain_step(const EngineStats& s, int bucket) {
  for (const SpecCosts::Entry& e : s.spec_step_costs)
    if (e.bucket == bucket && e.width == 1) return e.seconds;
  return 0;
}

}  // namespace

std::string spec_metrics_text(const EngineStats& s) {
  if (s.spec_mode == SpecMode::kOff && s.spec_steps <= 0) return {};
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // The policy (spec_policy.h): mode, decisions, and the costs it decides with.
  metric("flashseek_spec_policy_info", "gauge", "Speculative decoding mode (auto: the policy).");
  out += fmt::format("flashseek_spec_policy_info{{mode=\"{}\"}} 1\n", spec_mode_name(s.spec_mode));
  metric("flashseek_spec_policy_sequences", "gauge",
         "Decoding sequences by the policy's latest decision.");
  out += fmt::format("flashseek_spec_policy_sequences{{state=\"speculating\"}} {}\n",
                     s.spec_sequences_speculating);
  out += fmt::format("flashseek_spec_policy_sequences{{state=\"plain\"}} {}\n",
                     s.spec_sequences_plain);
  metric("flashseek_spec_plain_steps_total", "counter",
         "Decode steps the policy ran without speculation (the draft did not pay).");
  out += fmt::format("flashseek_spec_plain_steps_total {}\n", s.spec_plain_steps);
  metric("flashseek_spec_probe_steps_total", "counter",
         "Full-block verifications made to measure acceptance or cost.");
  out += fmt::format("flashseek_spec_probe_steps_total {}\n", s.spec_probes);
  if (s.spec_block_sequences.size() > 1) {
    metric("flashseek_spec_policy_block_sequences", "gauge",
           "Decoding sequences by the drafts their latest step verified (the current block "
           "length; 0: a plain decode).");
    for (size_t k = 0; k < s.spec_block_sequences.size(); ++k)
      out += fmt::format("flashseek_spec_policy_block_sequences{{drafts=\"{}\"}} {}\n", k,
                         s.spec_block_sequences[k]);
  }
  if (!s.spec_step_costs.empty()) {
    metric("flashseek_spec_step_seconds", "gauge",
           "Measured decode step wall time (EWMA) by batch size and tokens per decode item.");
    for (const SpecCosts::Entry& e : s.spec_step_costs)
      out += fmt::format("flashseek_spec_step_seconds{{batch=\"{}\",width=\"{}\"}} {:.6g}\n",
                         batch_label(e.bucket), e.width, e.seconds);
    std::string ratios;
    for (const SpecCosts::Entry& e : s.spec_step_costs)
      if (const double plain = plain_step(s, e.bucket); e.width > 1 && plain > 0)
        ratios += fmt::format("flashseek_spec_verify_cost_ratio{{batch=\"{}\",width=\"{}\"}} {:.4f}\n",
                              batch_label(e.bucket), e.width, e.seconds / plain);
    if (!ratios.empty()) {
      metric("flashseek_spec_verify_cost_ratio", "gauge",
             "Measured cost of a verify step of this width over a plain 1-token step at the same "
             "batch size.");
      out += ratios;
    }
  }
  if (s.spec_draft_seconds >= 0) {
    metric("flashseek_spec_draft_seconds", "gauge", "Measured draft proposal wall time (EWMA).");
    out += fmt::format("flashseek_spec_draft_seconds {:.6g}\n", s.spec_draft_seconds);
  }
  if (s.spec_steps <= 0) return out;
  metric("flashseek_spec_verify_steps_total", "counter",
         "Speculative verification steps (one per sequence and step).");
  out += fmt::format("flashseek_spec_verify_steps_total {}\n", s.spec_steps);
  metric("flashseek_spec_draft_tokens_total", "counter", "Draft tokens verified.");
  out += fmt::format("flashseek_spec_draft_tokens_total {}\n", s.spec_drafted);
  metric("flashseek_spec_accepted_tokens_total", "counter", "Draft tokens accepted.");
  out += fmt::format("flashseek_spec_accepted_tokens_total {}\n", s.spec_accepted);
  metric("flashseek_spec_emitted_tokens_total", "counter",
         "Tokens emitted by verification steps (accepted drafts + bonus tokens).");
  out += fmt::format("flashseek_spec_emitted_tokens_total {}\n", s.spec_emitted);
  metric("flashseek_spec_accepted_at_position_total", "counter",
         "Verification steps whose draft at this 1-based position was accepted.");
  for (size_t i = 0; i < s.spec_accepted_at.size(); ++i)
    out += fmt::format("flashseek_spec_accepted_at_position_total{{position=\"{}\"}} {}\n", i + 1,
                       s.spec_accepted_at[i]);
  metric("flashseek_spec_mean_tokens_per_step", "gauge",
         "Mean tokens emitted per verification step.");
  out += fmt::format("flashseek_spec_mean_tokens_per_step {:.4f}\n",
                     double(s.spec_emitted) / double(s.spec_steps));
  return out;
}


std::string spec_summary_text(const EngineStats& s) {
  if (s.spec_mode == SpecMode::kOff && s.spec_steps <= 0) return {};
  std::string per;
  for (int64_t a : s.spec_accepted_at) per += (per.empty() ? "" : "/") + std::to_string(a);
  std::string out = fmt::format("speculative: {}, {} verify steps ({} probes), {:.3f} tokens/step",
                                spec_mode_name(s.spec_mode), s.spec_steps, s.spec_probes,
                                s.spec_steps ? double(s.spec_emitted) / double(s.spec_steps) : 0.0);
  if (!per.empty()) out += ", accepted per draft position " + per;
  out += fmt::format("; {} plain steps", s.spec_plain_steps);
  if (s.spec_sequences_speculating + s.spec_sequences_plain > 0) {
    std::string blocks;
    for (size_t k = s.spec_block_sequences.size(); k-- > 1;)
      if (s.spec_block_sequences[k] > 0)
        blocks += fmt::format("{}k={}: {}", blocks.empty() ? "" : ", ", k, s.spec_block_sequences[k]);
    out += fmt::format("; sequences: {} speculating{}, {} plain", s.spec_sequences_speculating,
                       blocks.empty() ? "" : " (" + blocks + ")", s.spec_sequences_plain);
  }
  std::string costs;
  for (const SpecCosts::Entry& e : s.spec_step_costs) {
    const std::string batch = batch_label(e.bucket);
    costs += fmt::format("{}{} x{} {:.3f} ms", costs.empty() ? "" : ", ",
                         e.width == 1 ? "step" : "verify", e.width, e.seconds * 1e3);
    const double plain = plain_step(s, e.bucket);
    if (e.width > 1 && plain > 0) costs += fmt::format(" ({:.2f}x step)", e.seconds / plain);
    if (batch != "1") costs += " (batch " + batch + ")";
  }
  if (s.spec_draft_seconds >= 0)
    costs += fmt::format("{}draft {:.3f} ms", costs.empty() ? "" : ", ", s.spec_draft_seconds * 1e3);
  if (!costs.empty()) out += "; costs: " + costs;
  return out;
}

}  // namespace flashseek::engine
