// Prometheus text for the engine's speculative-decoding counters (appended to /metrics).
#pragma once
#include <string>

#include "engine/engine.h"

namespace flashseek::engine {

// Empty when speculation is off and no verification step ran. The policy's mode, decisions and
// measured costs come first; the verification counters once a step ran. Per-position counters carry a
// `position` label (1-based draft index): verify steps whose draft at that position was accepted.
std::string spec_metrics_text(const EngineStats& stats);

}  // namespace flashseek::engine
