// Prometheus text for the engine's speculative-decoding counters (appended to /metrics), and the
// one-line summary of the same state for logs (`run`'s stats line, `serve`'s periodic line).
#pragma once
#include <string>

#include "engine/engine.h"

namespace flashseek::engine {

// Empty when speculation is off and no verification step ran. The policy's mode, decisions and
// measured costs come first; the verification counters once a step ran. Per-position counters carry a
// `position` label (1-based draft index): verify steps whose draft at that position was accepted.
std::string spec_metrics_text(const EngineStats& stats);

// "speculative: auto, 12 verify steps (3 probes), 1.083 tokens/step, accepted per draft position
// 1/0/0; 88 plain steps; sequences: 1 speculating (k=1: 1), 2 plain; costs: step x1 1.020 ms,
// verify x4 2.310 ms (2.26x step), draft 0.870 ms". Empty when speculation is off and no
// verification step ran.
std::string spec_summary_text(const EngineStats& stats);

}  // namespace flashseek::engine
