#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace flashseek::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bucket =
      size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[bucket]++;
  sum_ += value;
  total_++;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cumulative = 0;  // Prometheus buckets are cumulative
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, total_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, total_);
}

namespace {
const std::vector<double> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1,     2.5,  5,     10,   30, 60};

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
}  // namespace

Metrics::Metrics() : ttft_(kLatencyBuckets), inter_token_(kLatencyBuckets), e2e_(kLatencyBuckets) {}

void Metrics::count_request(const std::string& endpoint, int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_[{endpoint, http_status}]++;
}

void Metrics::add_tokens(int64_t prompt, int64_t generated, int64_t cached) {
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
  cached_tokens_ += std::max<int64_t>(cached, 0);
}

std::string Metrics::render(const BackendStats& stats) const {
  std::string out;
  header(out, "flashseek_requests_total", "counter", "HTTP requests by endpoint and status.");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : requests_)
      out += fmt::format("flashseek_requests_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first,
                         key.second, n);
  }
  header(out, "flashseek_prompt_tokens_total", "counter", "Prompt tokens submitted.");
  out += fmt::format("flashseek_prompt_tokens_total {}\n", prompt_tokens_.load());
  header(out, "flashseek_generation_tokens_total", "counter", "Tokens generated.");
  out += fmt::format("flashseek_generation_tokens_total {}\n", generated_tokens_.load());
  header(out, "flashseek_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from the state cache (as reported per request).");
  out += fmt::format("flashseek_cached_prompt_tokens_total {}\n", cached_tokens_.load());
  header(out, "flashseek_cache_hit_tokens_total", "counter",
         "Prompt tokens served from the state cache (engine counter).");
  out += fmt::format("flashseek_cache_hit_tokens_total {}\n", stats.cache_hit_tokens);
  header(out, "flashseek_queue_depth", "gauge", "Requests waiting for a batch slot.");
  out += fmt::format("flashseek_queue_depth {}\n", stats.queued);
  header(out, "flashseek_batch_size", "gauge", "Requests in the running batch (slots in use).");
  out += fmt::format("flashseek_batch_size {}\n", stats.running);
  header(out, "flashseek_max_batch", "gauge", "Batch slots.");
  out += fmt::format("flashseek_max_batch {}\n", stats.max_batch);
  header(out, "flashseek_scheduler_steps_total", "counter", "Scheduler steps run.");
  out += fmt::format("flashseek_scheduler_steps_total {}\n", stats.steps);
  header(out, "flashseek_requests_in_flight", "gauge", "Generation requests being served.");
  out += fmt::format("flashseek_requests_in_flight {}\n", in_flight.load());
  header(out, "flashseek_requests_rejected_total", "counter", "Requests refused: queue full.");
  out += fmt::format("flashseek_requests_rejected_total {}\n", rejected_full.load());
  header(out, "flashseek_time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render("flashseek_time_to_first_token_seconds", out);
  header(out, "flashseek_inter_token_seconds", "histogram", "Time between streamed tokens.");
  inter_token_.render("flashseek_inter_token_seconds", out);
  header(out, "flashseek_request_seconds", "histogram", "Request latency, end to end.");
  e2e_.render("flashseek_request_seconds", out);
  out += stats.extra_metrics;
  return out;
}

}  // namespace flashseek::server
