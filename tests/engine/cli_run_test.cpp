// `flashseek run` end to end on a make-tiny checkpoint: the DESIGN.md §7 JSON contract, greedy and
// seeded `run` == the engine's own result, and clear errors on bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

using flashseek::testing::flashseek_bin;
using flashseek::testing::run_command;

class CliRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new flashseek::testing::TempDir();
    auto r = run_command(flashseek_bin() + " make-tiny --config tiny-v41 --seed 1 --out " + ckpt());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ckpt() { return (dir_->path() / "ckpt").string(); }
  // Runs `flashseek run --ckpt <tiny> <args>` and returns (exit code, stdout only).
  static flashseek::testing::CommandResult run(const std::string& args) {
    return run_command("(" + flashseek_bin() + " run --ckpt " + ckpt() + " " + args +
                       " 2>/dev/null)");
  }
  static GenerationResult engine_result(Request r) {
    auto m = forward::load_model(ckpt(), forward::Numerics::kReference);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return testing::run_alone(**m, std::move(r));
  }
  static flashseek::testing::TempDir* dir_;
};
flashseek::testing::TempDir* CliRun::dir_ = nullptr;

TEST_F(CliRun, JsonContractAndGreedyEqualsEngine) {
  const std::vector<int32_t> prompt = {5, 17, 2, 99, 41, 7};
  auto r = run("--prompt-ids 5,17,2,99,41,7 --max-tokens 6 --temperature 0 --ignore-eos "
               "--prompt-logprobs 3 --logprobs 2 --numerics reference --speculative off --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.size(), 3u);
  ASSERT_TRUE(j["prompt_logprobs"].is_array());
  ASSERT_TRUE(j["tokens"].is_array());
  ASSERT_TRUE(j["logprobs"].is_array());
  ASSERT_EQ(j["prompt_logprobs"].size(), prompt.size());
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const auto& pos = j["prompt_logprobs"][i];
    ASSERT_TRUE(pos.size() == 3 || pos.size() == 4) << pos;
    // The top 3, plus the prompt's own token as a fourth entry only when it is not among them
    // (then it is no more likely than any of the three).
    int actual = 0;
    double actual_lp = 0, min_other = 0;
    for (const auto& e : pos) {
      const double lp = e["logprob"].get<double>();
      EXPECT_LE(lp, 0.0);
      if (e["id"] == prompt[i]) {
        ++actual;
        actual_lp = lp;
      } else {
        min_other = std::min(min_other, lp);
      }
    }
    EXPECT_EQ(actual, 1) << "position " << i << ": " << pos;
    if (pos.size() == 4) {
      EXPECT_LE(actual_lp, min_other) << "position " << i << ": " << pos;
    }
  }
  ASSERT_EQ(j["tokens"].size(), 6u);
  ASSERT_EQ(j["logprobs"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(j["logprobs"][i][0]["id"], j["tokens"][i]);  // greedy

  Request req;
  req.prompt = prompt;
  req.max_tokens = 6;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  req.logprobs = 2;
  req.prompt_logprobs = 3;
  auto want = engine_result(req);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want.tokens);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(j["logprobs"][i][1]["logprob"].get<float>(), want.logprobs[i].top[1].logprob);
  EXPECT_EQ(j["prompt_logprobs"][2][0]["logprob"].get<float>(),
            want.prompt_logprobs[2]->top[0].logprob);
}

TEST_F(CliRun, SeededSamplingEqualsEngineAndKZeroGivesEmptyArrays) {
  // Speculation off: speculative sampling follows the same distribution but draws differently.
  auto r = run("--prompt-ids 3,1,4,1,5 --max-tokens 8 --temperature 0.9 --top-p 0.95 --top-k 50 "
               "--seed 7 --ignore-eos --speculative off --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["prompt_logprobs"].empty());
  EXPECT_TRUE(j["logprobs"].empty());
  Request req;
  req.prompt = {3, 1, 4, 1, 5};
  req.max_tokens = 8;
  req.ignore_eos = true;
  req.sampling = {.temperature = 0.9, .top_k = 50, .top_p = 0.95};
  req.seed = 7;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), engine_result(req).tokens);
  // The same seed again gives the same tokens.
  EXPECT_EQ(r.output, run("--prompt-ids 3,1,4,1,5 --max-tokens 8 --temperature 0.9 --top-p 0.95 "
                          "--top-k 50 --seed 7 --ignore-eos --speculative off --json").output);
}

TEST_F(CliRun, PromptIdsFromFile) {
  const auto file = dir_->path() / "ids.json";
  std::ofstream(file) << "[5, 17, 2]";
  auto a = run("--prompt-ids @" + file.string() + " --max-tokens 3 --json");
  auto b = run("--prompt-ids 5,17,2 --max-tokens 3 --json");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST_F(CliRun, BadInputFailsWithAMessage) {
  auto expect_fail = [&](const std::string& args, const std::string& needle) {
    auto r = run_command(flashseek_bin() + " run " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  const std::string ck = "--ckpt " + ckpt() + " ";
  expect_fail("--ckpt /nonexistent/dir --prompt-ids 1 --json", "/nonexistent/dir");
  expect_fail(ck + "--prompt-ids 1,x,3 --json", "'x'");
  expect_fail(ck + "--prompt-ids 1,100000 --json", "id 100000 at position 1");
  expect_fail(ck + "--prompt-ids 1 --max-tokens -2 --json", "--max-tokens");
  expect_fail(ck + "--prompt-ids 1 --speculative maybe --json", "--speculative");
  expect_fail(ck + "--json", "--prompt-ids");
  expect_fail(ck + "--prompt-ids 1 --stop-ids 100000 --json", "--stop-ids");
  expect_fail(ck + "--prompt-ids @/nonexistent/ids.json --json", "ids.json");
}

// Backend options (tools/backend_options.h): --threads N sizes the CPU backend's thread pool (the
// log line reports the pool's real size) and the result does not depend on it, greedy or seeded;
// the CUDA-only options are accepted on the CPU backend and change nothing there.
TEST_F(CliRun, ThreadsSizeThePoolAndDoNotChangeTheResult) {
  const std::string req = "--prompt-ids 5,17,2,99,41,7 --max-tokens 8 --ignore-eos --logprobs 2 --json ";
  for (const std::string sampling : {"--temperature 0", "--temperature 0.9 --seed 7"}) {
    SCOPED_TRACE(sampling);
    auto one = run(req + sampling + " --threads 1");
    auto three = run(req + sampling + " --threads 3");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_EQ(three.exit_code, 0) << three.output;
    EXPECT_FALSE(nlohmann::json::parse(one.output)["tokens"].empty());
    EXPECT_EQ(one.output, three.output);
    auto gpu_opts = run(req + sampling + " --gpu-graphs off --tp-comm host --device-sampling off");
    ASSERT_EQ(gpu_opts.exit_code, 0) << gpu_opts.output;
    EXPECT_EQ(one.output, gpu_opts.output);
  }
  for (int n : {1, 3}) {  // stderr only: the log line of the pool actually made
    auto r = run_command("(" + flashseek_bin() + " run --ckpt " + ckpt() + " " + req + "--threads " +
                         std::to_string(n) + " 2>&1 >/dev/null)");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("CPU backend: " + std::to_string(n) + " threads"), std::string::npos) << r.output;
  }
}

TEST_F(CliRun, BadBackendOptionsFailWithAMessage) {
  const std::string ck = "--ckpt " + ckpt() + " --prompt-ids 1 --json ";
  auto expect_fail = [&](const std::string& cmd, const std::string& args, const std::string& needle) {
    // `timeout`: a serve that wrongly accepted the option would listen until stopped.
    auto r = run_command("timeout 60 " + flashseek_bin() + " " + cmd + " " + args);
    EXPECT_NE(r.exit_code, 0) << cmd << " " << args;
    EXPECT_NE(r.exit_code, 124) << cmd << " " << args << ": did not fail before serving";
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  // The needles are the options' own checks (an unknown option would fail differently).
  expect_fail("run", ck + "--threads -1", "--threads -1: expected 1..1024");
  expect_fail("run", ck + "--threads 5000", "--threads 5000: expected 1..1024");
  expect_fail("run", ck + "--threads two", "--threads = two");
  expect_fail("run", ck + "--gpu-graphs maybe", "--gpu-graphs: maybe not in {on,record,off}");
  expect_fail("run", ck + "--tp-comm mpi", "--tp-comm: mpi not in {auto,nccl,host}");
  expect_fail("run", ck + "--device-sampling 0", "--device-sampling: 0 not in {on,off}");
  expect_fail("serve", "--ckpt " + ckpt() + " --port 0 --threads 5000", "--threads 5000: expected 1..1024");
  expect_fail("serve", "--ckpt " + ckpt() + " --port 0 --gpu-graphs 1", "--gpu-graphs: 1 not in {on,record,off}");
}

}  // namespace
}  // namespace flashseek::engine
