#include "engine/spec_metrics.h"

#include <fmt/format.h>

namespace flashseek::engine {

std::string spec_metrics_text(const EngineStats& s) {
  if (s.spec_steps <= 0) return {};
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("flashseek_spec_verify_steps_total", "counter",
         "Speculative verification steps (one per sequence and step).");
  out += fmt::format("flashseek_spec_verify_steps_total {}\n", s.spec_steps);
  metric("flashseek_spec_draft_tokens_total", "counter", "Draft tokens proposed and verified.");
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
