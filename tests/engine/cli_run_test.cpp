// `flashseek run` end to end on a make-tiny checkpoint: the DESIGN.md §7 JSON contract, greedy and
// seeded `run` == the engine's own result, and clear errors on bad input.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

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
  expect_fail(ck + "--prompt-ids 1 --prefill-chunk 0 --json", "--prefill-chunk must be in [1,");
  expect_fail(ck + "--prompt-ids 1 --prefill-chunk -5 --json", "--prefill-chunk must be in [1,");
  expect_fail(ck + "--prompt-ids 1 --prefill-chunk 99999999999 --json", "--prefill-chunk");
  expect_fail(ck + "--prompt-ids 1 --max-step-tokens 0 --json", "--max-step-tokens must be in [1,");
  expect_fail(ck + "--prompt-ids 1 --max-num-batched-tokens 0 --json", "--max-step-tokens");
  expect_fail(ck + "--prompt-ids 1 --prefill-chunk 64 --max-step-tokens 32 --json",
              "--prefill-chunk (64) is larger than --max-step-tokens (32)");
}

// --prefill-chunk and --max-step-tokens (alias --max-num-batched-tokens) set how the prompt is
// split into engine steps: the stats line on stderr counts the prefill steps, and the JSON (tokens,
// logprobs and prompt logprobs, printed as exact floats) is the same for every split.
TEST_F(CliRun, PrefillChunkSplitsThePromptWithoutChangingTheResult) {
  std::string ids;
  for (int i = 0; i < 20; ++i) ids += (i ? "," : "") + std::to_string((i * 37 + 11) % 200);
  const std::string base = flashseek_bin() + " run --ckpt " + ckpt() + " --prompt-ids " + ids +
                           " --max-tokens 4 --ignore-eos --logprobs 2 --prompt-logprobs 2 --json";
  const auto err = dir_->path() / "stderr.txt";
  struct Case {
    std::string args;
    int64_t steps;  // prefill steps of the 20-token prompt
    int64_t chunk;
  };
  const std::vector<Case> cases = {{"", 1, 256},
                                   {"--prefill-chunk 1", 20, 1},
                                   {"--prefill-chunk 7", 3, 7},
                                   {"--max-step-tokens 6", 4, 6},
                                   {"--max-num-batched-tokens 19", 2, 19},
                                   {"--prefill-chunk 5 --max-step-tokens 8", 4, 5}};
  std::string want;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = run_command("(" + base + " " + c.args + " 2>" + err.string() + ")");
    std::ifstream in(err);
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(r.exit_code, 0) << r.output << log;
    const std::string stats = "prompt 20 tokens in ";
    const auto at = log.find(stats);
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find(" " + std::to_string(c.steps) + " prefill steps of <= " +
                        std::to_string(c.chunk) + " tokens"),
              std::string::npos)
        << line;
    auto j = nlohmann::json::parse(r.output);
    ASSERT_EQ(j["tokens"].size(), 4u);
    ASSERT_EQ(j["prompt_logprobs"].size(), 20u);
    if (want.empty()) want = r.output;
    EXPECT_EQ(r.output, want);
  }
}

// `serve` takes the same flags and refuses bad ones before loading anything (the timeout only
// bounds the test if the check were missing and the server started).
TEST_F(CliRun, ServeRejectsABadStepBudget) {
  auto expect_fail = [&](const std::string& args, const std::string& needle) {
    auto r = run_command("timeout 60 " + flashseek_bin() + " serve --ckpt " + ckpt() +
                         " --port 0 " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.exit_code, 124) << args << ": the server started";
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  expect_fail("--prefill-chunk 0", "--prefill-chunk must be in [1,");
  expect_fail("--max-num-batched-tokens -1", "--max-step-tokens must be in [1,");
  expect_fail("--max-batch 8 --max-step-tokens 4", "--max-step-tokens (4) must be >= --max-batch (8)");
  expect_fail("--prefill-chunk 300 --max-step-tokens 256", "--prefill-chunk (300) is larger");
}

// serve's step budget follows --max-batch when that is larger than the default 256 (before, an
// engine with 300 slots and a 256-token step was refused after the model had loaded), and
// --prefill-chunk alone leaves room for a full chunk next to one decode of every other slot.
TEST_F(CliRun, ServeStepBudgetFollowsMaxBatchAndPrefillChunk) {
  if (!std::getenv("FLASHSEEK_TOKENIZER") &&
      !std::filesystem::exists(flashseek::testing::source_dir() / "models/tokenizer/tokenizer.json"))
    FS_SKIP_UNLESS_CI("no tokenizer (serve needs it): run scripts/fetch_tokenizer.sh");
  struct Case {
    std::string args, want;
  };
  const std::vector<Case> cases = {
      {"--max-batch 300", "engine steps: up to 300 tokens each (decodes first), prompt chunks of <= 256"},
      {"--max-batch 8 --prefill-chunk 1000", "engine steps: up to 1007 tokens each (decodes first), prompt chunks of <= 1000"},
      {"--max-batch 8 --max-num-batched-tokens 64", "engine steps: up to 64 tokens each (decodes first), prompt chunks of <= 64"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.args);
    const auto log = dir_->path() / ("serve" + std::to_string(i) + ".log");
    const auto r = run_command(flashseek_bin() + " serve --ckpt " + ckpt() + " --port 0 " + c.args +
                               " > " + log.string() + " 2>&1 & echo $!");
    const int pid = std::atoi(r.output.c_str());
    ASSERT_GT(pid, 0) << r.output;
    std::string text;
    // Polls the log until the server is ready or failed; the deadline only bounds a hang.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (text.find("ready:") != std::string::npos || text.find("error") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid, SIGTERM);
    EXPECT_NE(text.find(c.want), std::string::npos) << text;
    EXPECT_NE(text.find("ready:"), std::string::npos) << text;
    EXPECT_EQ(text.find("error"), std::string::npos) << text;
  }
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
    auto gpu_opts =
        run(req + sampling +
            " --gpu-graphs off --tp-comm host --device-sampling off --prefill-attention staged --decode-attention staged"
            " --index-scores fp32");
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
  expect_fail("run", ck + "--prefill-attention mma", "--prefill-attention: mma not in {auto,staged}");
  expect_fail("run", ck + "--index-scores imma", "--index-scores: imma not in {auto,fp32}");
  expect_fail("run", ck + "--decode-attention mma", "--decode-attention: mma not in {staged,tensor}");
  expect_fail("bench", "--load-format dummy --decode-attention mma", "--decode-attention: mma not in {staged,tensor}");
  expect_fail("run", ck + "--moe-expand-min-rows -2", "--moe-expand-min-rows: Value -2 not in range");
  expect_fail("bench", "--load-format dummy --moe-expand-min-rows x", "--moe-expand-min-rows: Value x not in range");
  expect_fail("run", ck + "--moe-w-registers 1", "--moe-w-registers: 1 not in {on,off}");
  expect_fail("bench", "--load-format dummy --moe-w-registers yes", "--moe-w-registers: yes not in {on,off}");
  // The model bench refuses a bad --gpus list with the list parser's message.
  expect_fail("bench", "--ckpt " + ckpt() + " --gpus 0,x", "--gpus 0,x: expected device numbers separated by commas");
  expect_fail("serve", "--ckpt " + ckpt() + " --port 0 --threads 5000", "--threads 5000: expected 1..1024");
  expect_fail("serve", "--ckpt " + ckpt() + " --port 0 --gpu-graphs 1", "--gpu-graphs: 1 not in {on,record,off}");
}

}  // namespace
}  // namespace flashseek::engine
