// Server metrics in Prometheus text format: request counts by endpoint and status, tokens in/out,
// cached prompt tokens, TTFT and inter-token histograms; queue depth and batch size come from the
// backend at scrape time.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/backend.h"

namespace flashseek::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends `name_bucket{le=..}`, `name_sum`, `name_count` lines.
  void render(const std::string& name, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], last = +Inf
  double sum_ = 0;
  uint64_t total_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int http_status);
  void add_tokens(int64_t prompt, int64_t generated, int64_t cached);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { inter_token_.observe(seconds); }
  void observe_request(double seconds) { e2e_.observe(seconds); }
  std::atomic<int64_t> in_flight{0};   // requests admitted and not yet answered
  std::atomic<int64_t> rejected_full{0};

  std::string render(const BackendStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, cached_tokens_{0};
  Histogram ttft_, inter_token_, e2e_;
};

}  // namespace flashseek::server
