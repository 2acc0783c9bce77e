// `flashseek serve` with DSpark speculative decoding (default auto on a tiny-v41 checkpoint,
// which has draft weights: the policy probes, then speculates only while it pays): same greedy
// tokens as --speculative off, the `usage.speculative` extension, per-position acceptance and
// policy counters in /metrics, the tok/step field in the request log line and the periodic engine
// status line (`--stats-interval`) with the policy's state and measured costs.
#include <gtest/gtest.h>

#include "kvshare/serve_util.h"

namespace flashseek::kvtest {
namespace {

json completion_json(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const json body = {{"model", "deepseek-v4.1-flash"},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  if (!res || res->status != 200) return json();
  return json::parse(res->body);
}

TEST(SpecServe, UsageMetricsAndLogLineAndSameTokensAsOff) {
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "tiny").string();
  ASSERT_EQ(
      ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 4 --out " + ckpt)
          .exit_code,
      0);
  const std::vector<int32_t> prompt = {5, 9, 200, 17, 3, 3, 41};
  json on_json, off_json;
  {
    Serve s(ckpt, dir.path() / "on.log", "--max-batch 4 --stats-interval 0.2");
    ASSERT_TRUE(s.wait_ready()) << s.log_text();
    on_json = completion_json(s.port(), prompt, 40);
    ASSERT_FALSE(on_json.is_null()) << s.log_text();
    EXPECT_GT(metric(s.port(), "flashseek_spec_verify_steps_total"), 0);
    EXPECT_GE(metric(s.port(), "flashseek_spec_mean_tokens_per_step"), 1.0);
    // The policy's state and measured costs (auto is the default).
    EXPECT_GE(metric(s.port(), "flashseek_spec_probe_steps_total"), 1);
    EXPECT_GT(metric(s.port(), "flashseek_spec_draft_seconds"), 0);
    httplib::Client c("127.0.0.1", s.port());
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("flashseek_spec_accepted_at_position_total{position=\"1\"}"),
              std::string::npos);
    // The current block length of the decoding sequences (none now: the request is done) and the
    // measured cost of the full-block verify against a plain step at batch 1.
    EXPECT_NE(m->body.find("flashseek_spec_policy_block_sequences{drafts=\"3\"} 0"), std::string::npos)
        << m->body;
    EXPECT_GT(metric(s.port(), "flashseek_spec_verify_cost_ratio{batch=\"1\",width=\"4\"}"), 0)
        << m->body;
    // The periodic status line (every 0.2 s in which the engine stepped): load, rate, policy.
    const std::regex status_line(
        R"(engine: \d+ running, \d+ waiting, \d+ steps, \d+ tokens in [0-9.]+ s \([0-9.]+ tok/s\); )"
        R"(speculative: auto, \d+ verify steps \(\d+ probes\).*; costs: step x1 [0-9.]+ ms, verify x\d)");
    bool logged = false;
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
         !logged && std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(std::chrono::milliseconds(50)))
      logged = std::regex_search(s.log_text(), status_line);
    EXPECT_TRUE(logged) << s.log_text();
    s.stop();
    EXPECT_NE(s.log_text().find(" tok/step"), std::string::npos) << s.log_text();
    EXPECT_NE(s.log_text().find("speculative decoding: auto"), std::string::npos);
  }
  {
    Serve s(ckpt, dir.path() / "off.log", "--max-batch 4 --speculative off");
    ASSERT_TRUE(s.wait_ready()) << s.log_text();
    off_json = completion_json(s.port(), prompt, 40);
    ASSERT_FALSE(off_json.is_null()) << s.log_text();
    EXPECT_EQ(metric(s.port(), "flashseek_spec_verify_steps_total"), -1);
  }
  EXPECT_EQ(on_json["choices"][0]["token_ids"], off_json["choices"][0]["token_ids"]);
  const json& spec = on_json["usage"]["speculative"];
  ASSERT_TRUE(spec.is_object()) << on_json["usage"].dump();
  EXPECT_GT(spec["verify_steps"].get<int64_t>(), 0);
  EXPECT_LE(spec["tokens"].get<int64_t>(), 40);
  EXPECT_GE(spec["mean_tokens_per_step"].get<double>(), 1.0);
  EXPECT_FALSE(off_json["usage"].contains("speculative"));
}

TEST(SpecServe, OnWithoutADraftFailsAtStartup) {
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "v4").string();
  ASSERT_EQ(
      ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v4 --no-draft --seed 4 --out " + ckpt)
          .exit_code,
      0);
  auto r = ft::run_command("timeout 60 " + ft::flashseek_bin() + " serve --ckpt " + ckpt +
                           " --port 0 --speculative on");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no draft"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace flashseek::kvtest
