// One request's life on the HTTP side: submit to the backend, turn token events into text
// (incremental detokenizer -> stop strings -> chat output parser) and hand out steps that the
// streaming and non-streaming responders format. Destroying it before the end cancels the
// request, so a vanished client frees its batch slot.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"
#include "server/text_port.h"

namespace flashseek::server {

struct Step {
  ChatDelta delta;                          // chat: parsed output of this step
  std::string text;                         // completions: text of this step
  std::vector<int32_t> tokens;              // tokens that arrived in this step
  std::vector<PositionLogprobs> logprobs;   // one per token when requested
  std::vector<std::optional<PositionLogprobs>> prompt_logprobs;  // first step only
  bool finished = false;
  std::string finish_reason;                // "stop", "length", "tool_calls" when finished
  std::string error;                        // backend error (finish_reason empty)
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t spec_steps = -1;   // speculative verify steps (-1: the request never speculated)
  int64_t spec_tokens = 0;   // tokens emitted by them
};

class Generation {
 public:
  using Clock = std::chrono::steady_clock;
  // `parser` null: completions (raw text). The request's id must be unique.
  Generation(GenerationBackend& backend, const TextCodec& codec,
             std::unique_ptr<OutputParser> parser, GenRequest request,
             std::vector<std::string> stop_strings, Metrics& metrics, Clock::time_point start);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  Status submit();
  // Gathers every event available within timeout_ms into one step; nullopt if none arrived.
  std::optional<Step> next(int64_t timeout_ms);
  void cancel();  // the client went away
  bool finished() const { return finished_; }
  const Usage& usage() const { return usage_; }
  uint64_t id() const { return request_.id; }
  const std::vector<int32_t>& prompt() const { return request_.prompt; }
  double ttft_seconds() const;
  double total_seconds() const;

 private:
  void apply_event(GenEvent& ev, Step& step);
  void emit_text(const std::string& text, Step& step);
  void finish(Finish why, Step& step);

  GenerationBackend& backend_;
  const TextCodec& codec_;
  std::unique_ptr<OutputParser> parser_;
  std::unique_ptr<StreamDecoder> decoder_;
  StopMatcher stops_;
  GenRequest request_;
  Metrics& metrics_;
  std::shared_ptr<EventSource> channel_;
  Usage usage_;
  Clock::time_point start_, first_token_, last_token_;
  bool submitted_ = false, finished_ = false, any_token_ = false, any_tool_call_ = false;
  bool parser_failed_ = false;
};

}  // namespace flashseek::server
