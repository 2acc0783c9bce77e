#include "server/generation.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace flashseek::server {

Generation::Generation(GenerationBackend& backend, const TextCodec& codec,
                       std::unique_ptr<OutputParser> parser, GenRequest request,
                       std::vector<std::string> stop_strings, Metrics& metrics,
                       Clock::time_point start)
    : backend_(backend),
      codec_(codec),
      parser_(std::move(parser)),
      decoder_(codec.stream_decoder()),
      stops_(std::move(stop_strings)),
      request_(std::move(request)),
      metrics_(metrics),
      start_(start) {
  usage_.prompt_tokens = int64_t(request_.prompt.size());
}

Generation::~Generation() {
  if (submitted_ && !finished_) backend_.cancel(request_.id);
}

Status Generation::submit() {
  FS_ASSIGN_OR_RETURN(channel_, backend_.submit(request_));
  submitted_ = true;
  return {};
}

void Generation::cancel() {
  if (submitted_ && !finished_) backend_.cancel(request_.id);
  finished_ = true;
}

double Generation::ttft_seconds() const {
  if (!any_token_) return 0;
  return std::chrono::duration<double>(first_token_ - start_).count();
}

double Generation::total_seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

std::optional<Step> Generation::next(int64_t timeout_ms) {
  if (finished_) return std::nullopt;
  auto ev = channel_->pop_for(timeout_ms);
  if (!ev) return std::nullopt;
  Step step;
  apply_event(*ev, step);
  // Drain what else is already there so a slow client gets larger chunks, not a backlog.
  while (!finished_) {
    auto more = channel_->pop_for(0);
    if (!more) break;
    apply_event(*more, step);
  }
  return step;
}

void Generation::apply_event(GenEvent& ev, Step& step) {
  if (!ev.prompt_logprobs.empty()) step.prompt_logprobs = std::move(ev.prompt_logprobs);
  if (ev.cached_tokens >= 0) usage_.cached_tokens = ev.cached_tokens;
  if (ev.spec_steps >= 0) usage_.spec_steps = ev.spec_steps, usage_.spec_tokens = ev.spec_tokens;
  if (ev.token >= 0) {
    const auto now = Clock::now();
    if (!any_token_) {
      first_token_ = now;
      metrics_.observe_ttft(std::chrono::duration<double>(now - start_).count());
    } else {
      metrics_.observe_inter_token(std::chrono::duration<double>(now - last_token_).count());
    }
    any_token_ = true;
    last_token_ = now;
    usage_.completion_tokens++;
    step.tokens.push_back(ev.token);
    if (ev.logprobs) step.logprobs.push_back(*ev.logprobs);
    // A stop token ends the text: its own text (EOS, a stop id) is never shown.
    const bool stop_token =
        ev.finish == Finish::kStop &&
        (ev.token == backend_.eos_token() ||
         std::find(request_.stop_ids.begin(), request_.stop_ids.end(), ev.token) !=
             request_.stop_ids.end());
    if (!stop_token) {
      StopMatcher::Output out = stops_.push(decoder_->push(ev.token));
      emit_text(out.text, step);
      if (out.matched) {
        backend_.cancel(request_.id);  // nothing after a stop string is wanted
        finish(Finish::kStop, step);
        return;
      }
    }
  }
  if (ev.finish == Finish::kError) {
    step.error = ev.error.empty() ? "generation failed" : ev.error;
    finished_ = true;
    step.finished = true;
    return;
  }
  if (ev.finish != Finish::kNone) finish(ev.finish, step);
}

void Generation::emit_text(const std::string& text, Step& step) {
  if (text.empty()) return;
  if (!parser_ || parser_failed_) {
    if (parser_) step.delta.content += text;
    else step.text += text;
    return;
  }
  auto delta = parser_->push(text);
  if (!delta.ok()) {
    // Malformed model output: keep serving it as plain content instead of failing the request.
    spdlog::warn("request {}: output parser: {}", request_.id, delta.status().message());
    parser_failed_ = true;
    step.delta.content += text;
    return;
  }
  step.delta.content += delta->content;
  step.delta.reasoning += delta->reasoning;
  for (auto& tc : delta->tool_calls) {
    any_tool_call_ = true;
    step.delta.tool_calls.push_back(std::move(tc));
  }
}

void Generation::finish(Finish why, Step& step) {
  // Release held-back text: the decoder's partial bytes, then text held for a stop string that
  // never completed (both are no-ops after a stop-string match).
  StopMatcher::Output out = stops_.push(decoder_->flush());
  emit_text(out.text, step);
  if (!out.matched) emit_text(stops_.flush(), step);
  if (parser_ && !parser_failed_) {
    auto tail = parser_->finish();
    if (tail.ok()) {
      step.delta.content += tail->content;
      step.delta.reasoning += tail->reasoning;
      for (auto& tc : tail->tool_calls) {
        any_tool_call_ = true;
        step.delta.tool_calls.push_back(std::move(tc));
      }
    } else {
      spdlog::warn("request {}: output parser at end: {}", request_.id, tail.status().message());
    }
  }
  finished_ = true;
  step.finished = true;
  if (why == Finish::kLength) step.finish_reason = "length";
  else if (any_tool_call_) step.finish_reason = "tool_calls";
  else if (why == Finish::kCancelled) step.finish_reason = "abort";
  else step.finish_reason = "stop";
}

}  // namespace flashseek::server
