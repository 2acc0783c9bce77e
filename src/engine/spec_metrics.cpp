#include "engine/spec_metrics.h"

#include <fmt/format.h>

namespace flashseek::engine {

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
  if (!s.spec_step_costs.empty()) {
    metric("flashseek_spec_step_seconds", "gauge",
           "Measured decode step wall time (EWMA) by batch size and tokens per decode item.");
    for (const SpecCosts::Entry& e : s.spec_step_costs) {
      const auto [lo, hi] = SpecCosts::bucket_range(e.bucket);
      const std::string batch = lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
      out += fmt::format("flashseek_spec_step_seconds{{batch=\"{}\",width=\"{}\"}} {:.6g}\n", batch,
                         e.width, e.seconds);
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

}  // namespace flashseek::engine
