// Prometheus text for the engine's speculative-decoding counters (appended to /metrics).
#pragma once
#include <string>

#include "engine/engine.h"

namespace flashseek::engine {

// Empty when the engine never ran a verification step. Per-position counters carry a
// `position` label (1-based draft index): verify steps whose draft at that position was accepted.
std::string spec_metrics_text(const EngineStats& stats);

}  // namespace flashseek::engine
