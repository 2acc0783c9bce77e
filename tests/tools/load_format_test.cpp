// `--load-format dummy` through `run` and `make-tiny`: generated weights give finite logits, the
// seed decides them (same seed identical, another seed different), they equal the make-tiny
// checkpoint of that seed, --num-layers keeps a role-complete subset; the memory plan refuses
// what does not fit before generating anything, and `run --max-context` refuses long requests.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace flashseek {
namespace {

using json = nlohmann::json;
using testing::flashseek_bin;
using testing::run_command;

const char* kRunArgs = " --prompt-ids 5,17,2,99,41,7 --max-tokens 4 --temperature 0 --ignore-eos "
                       "--prompt-logprobs 5 --logprobs 3 --speculative off --json";

// `flashseek run <args>`: exit code and stdout (stderr dropped).
testing::CommandResult run_quiet(const std::string& args) {
  return run_command("(" + flashseek_bin() + " run " + args + " 2>/dev/null)");
}

json run_json(const std::string& args) {
  auto r = run_quiet(args + kRunArgs);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << run_command(flashseek_bin() + " run " + args + kRunArgs).output;
  json j = json::parse(r.output, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.output;
  return j;
}

// Every logprob in the contract is finite and <= 0; returns how many were checked.
int expect_finite(const json& j) {
  int n = 0;
  for (const auto* key : {"prompt_logprobs", "logprobs"})
    for (const auto& pos : j[key]) {
      if (pos.is_null()) continue;
      for (const auto& e : pos) {
        const double lp = e["logprob"].get<double>();
        EXPECT_TRUE(std::isfinite(lp)) << j.dump();
        EXPECT_LE(lp, 0.0);
        ++n;
      }
    }
  return n;
}

class LoadFormatDummy : public ::testing::TestWithParam<const char*> {};

TEST_P(LoadFormatDummy, FiniteAndDecidedBySeed) {
  const std::string cfg = GetParam();
  const json a = run_json("--load-format dummy --config " + cfg + " --seed 3");
  EXPECT_GT(expect_finite(a), 20);
  EXPECT_EQ(a["tokens"].size(), 4u);
  const json again = run_json("--load-format dummy --config " + cfg + " --seed 3");
  EXPECT_EQ(a, again);
  // Another seed: other weights, so other prompt logprobs (greedy tokens could coincide).
  const json other = run_json("--load-format dummy --config " + cfg + " --seed 4");
  EXPECT_GT(expect_finite(other), 20);
  EXPECT_NE(a["prompt_logprobs"], other["prompt_logprobs"]);
}

INSTANTIATE_TEST_SUITE_P(Configs, LoadFormatDummy, ::testing::Values("tiny-v4", "tiny-v41"));

// Dummy weights are the make-tiny checkpoint of the same seed (shared generator), also with
// --num-layers on both.
TEST(LoadFormat, DummyEqualsMakeTinyOfTheSeed) {
  testing::TempDir dir;
  const std::string ckpt = (dir.path() / "full").string(), reduced = (dir.path() / "six").string();
  auto made = run_command(flashseek_bin() + " make-tiny --config tiny-v41 --seed 3 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_EQ(run_json("--ckpt " + ckpt), run_json("--load-format dummy --config tiny-v41 --seed 3"));
  // --load-format dummy with --ckpt: that checkpoint's config, generated weights.
  EXPECT_EQ(run_json("--load-format dummy --ckpt " + ckpt + " --seed 3"),
            run_json("--load-format dummy --config tiny-v41 --seed 3"));
  auto made6 = run_command(flashseek_bin() + " make-tiny --config tiny-v41 --seed 5 --num-layers 6 --out " + reduced);
  ASSERT_EQ(made6.exit_code, 0) << made6.output;
  EXPECT_NE(made6.output.find("kept layers 0,1,2,3,4,5 of 7"), std::string::npos) << made6.output;
  const json six = run_json("--load-format dummy --config tiny-v41 --seed 5 --num-layers 6");
  EXPECT_GT(expect_finite(six), 20);
  EXPECT_EQ(run_json("--ckpt " + reduced), six);
  EXPECT_NE(six, run_json("--load-format dummy --config tiny-v41 --seed 5"));
}

TEST(LoadFormat, NumLayersPrintsWhatWasKeptAndRefusesTooFew) {
  auto r = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --num-layers 6" + kRunArgs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--num-layers 6: kept layers 0,1,2,3,4,5 of 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dspark targets [3,4,5]"), std::string::npos) << r.output;
  auto few = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --num-layers 5" + kRunArgs);
  EXPECT_NE(few.exit_code, 0);
  EXPECT_NE(few.output.find("at least 6 layers"), std::string::npos) << few.output;
}

TEST(LoadFormat, OptionErrors) {
  testing::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--config tiny-v41", "need --load-format dummy"},
      {"--load-format dummy", "exactly one of --config and --ckpt"},
      {"--load-format dummy --config no-such-config", "no-such-config"},
      {"--load-format foo --config tiny-v41", "foo not in"},
      {"--ckpt " + dir.path().string() + " --num-layers 2", "need --load-format dummy"}};
  for (const auto& [args, message] : cases) {
    auto r = run_command(flashseek_bin() + " run " + args + kRunArgs);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
  }
}

// A model that does not fit the memory plan is refused at start, naming the bytes needed and
// available, before any weights are generated; one that fits prints the plan and runs.
TEST(MemoryPlan, RefusedAtStartWithTheNumbers) {
  auto r = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --memory-limit 1000000" +
                       kRunArgs);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does not fit in host memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1000000 bytes available"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bytes needed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("dummy weights:"), std::string::npos) << "generated before the refusal:\n" << r.output;
  // The same model with room: the plan is printed (FP32 and compact state) and it runs.
  auto ok = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --memory-limit 4000000000" +
                        kRunArgs);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("memory plan (host memory)"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("compact (planned)"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find(": fits"), std::string::npos) << ok.output;
  // A long context needs more state: the same limit refuses it (the state grows with the context).
  auto ctx = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v4 --memory-limit 400000000 "
                         "--max-context 1000000" + kRunArgs);
  EXPECT_NE(ctx.exit_code, 0) << ctx.output;
  EXPECT_NE(ctx.output.find("state for 1000000 tokens"), std::string::npos) << ctx.output;
}

TEST(MemoryPlan, RunRefusesARequestLongerThanMaxContext) {
  auto r = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --max-model-len 9" + kRunArgs);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exceed the maximum context of 9 tokens"), std::string::npos) << r.output;
  auto fits = run_command(flashseek_bin() + " run --load-format dummy --config tiny-v41 --max-context 10" + kRunArgs);
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
}

}  // namespace
}  // namespace flashseek

namespace flashseek {
namespace {

// The "logits checksum" line of `flashseek bench <args>` (empty when missing); fails on a non-zero exit.
std::string bench_checksum(const std::string& args) {
  auto r = testing::run_command(testing::flashseek_bin() + " bench " + args + " --reps 2 --batch 2 --prompt-tokens 5 2>&1");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("decode: batch 2 x 1 tokens, median"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loaded "), std::string::npos) << r.output;
  const size_t at = r.output.find("logits checksum");
  return at == std::string::npos ? "" : r.output.substr(at, r.output.find('\n', at) - at);
}

// `bench --load-format dummy` runs the engine's model on generated weights on the CPU backend:
// the seed decides the logits, and they are those of the make-tiny checkpoint of that seed
// loaded with `bench --ckpt` (the same generator), also with --num-layers.
TEST(BenchLoadFormat, DummyWeightsAreTheSeedsCheckpoint) {
  const std::string a = bench_checksum("--load-format dummy --config tiny-v41 --seed 3");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, bench_checksum("--load-format dummy --config tiny-v41 --seed 3"));
  EXPECT_NE(a, bench_checksum("--load-format dummy --config tiny-v41 --seed 4"));
  testing::TempDir dir;
  const std::string ckpt = (dir.path() / "six").string();
  auto made = testing::run_command(testing::flashseek_bin() + " make-tiny --config tiny-v41 --seed 3 --num-layers 6 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_EQ(bench_checksum("--ckpt " + ckpt), bench_checksum("--load-format dummy --config tiny-v41 --num-layers 6 --seed 3"));
  // Without CUDA (or a GPU), --gpus fails with a message after the weights were generated.
  auto gpu = testing::run_command(testing::flashseek_bin() + " bench --load-format dummy --config tiny-v41 --gpus 0 2>&1");
  if (gpu.exit_code != 0) EXPECT_NE(gpu.output.find("bench: "), std::string::npos) << gpu.output;
}

}  // namespace
}  // namespace flashseek

namespace flashseek {
namespace {

// The "weights: ... (N bytes)" line of a memory plan printed by `flashseek run <args>` (0 when missing).
uint64_t plan_weight_bytes(const std::string& args) {
  auto r = testing::run_command(testing::flashseek_bin() + " run " + args + kRunArgs + " 2>&1");
  const size_t at = r.output.find("  weights: ");
  if (at == std::string::npos) {
    ADD_FAILURE() << args << "\n" << r.output;
    return 0;
  }
  const size_t open = r.output.find('(', at);
  return std::stoull(r.output.substr(open + 1));
}

// --engram-tables: the CPU backend accepts both values with the same result (host memory either
// way); on a GPU the plan counts the tables in device memory (the plan is printed before the
// backend loads, so this needs no GPU); other values are refused.
TEST(EngramTables, CpuAcceptsBothGpuPlanCountsTheTables) {
  const std::string base = "--load-format dummy --config tiny-v41 --seed 3";
  EXPECT_EQ(run_json(base + " --engram-tables device"), run_json(base + " --engram-tables host"));
  const std::string gpu = base + " --gpus 0 --memory-limit 100000000000";
  const uint64_t host = plan_weight_bytes(gpu), device = plan_weight_bytes(gpu + " --engram-tables device");
  EXPECT_GT(host, 0u);
  EXPECT_GT(device, host);
  auto bad = testing::run_command(testing::flashseek_bin() + " run " + base + " --engram-tables disk" + kRunArgs + " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--engram-tables"), std::string::npos) << bad.output;
}

// The model bench's step shapes: a prompt prefilled in chunks (--prefill-chunk) leaves the same
// state as one forward of it (the CPU backend is chunk-invariant bit for bit), so the first
// decode step's logits agree; verify-block steps (--step-tokens) time every sequence's block
// with all its logits, and the floor line counts the step's bytes.
TEST(BenchLoadFormat, ChunkedPrefillAndVerifyBlocks) {
  auto run = [](const std::string& extra) {
    auto r = testing::run_command(testing::flashseek_bin() +
                                  " bench --load-format dummy --config tiny-v41 --seed 5 --reps 1 --batch 2 "
                                  "--prompt-tokens 13 " + extra + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << extra << "\n" << r.output;
    return r.output;
  };
  const std::string one = run(""), chunked = run("--prefill-chunk 4"), block = run("--step-tokens 6");
  auto line = [](const std::string& out, const char* key) {
    const size_t at = out.find(key);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  // The checksum covers the prefill's last rows: with chunks it is summed from the same rows.
  EXPECT_FALSE(line(one, "logits checksum").empty()) << one;
  EXPECT_EQ(line(one, "logits checksum"), line(chunked, "logits checksum")) << one << chunked;
  EXPECT_NE(block.find("decode: batch 2 x 6 tokens, median"), std::string::npos) << block;
  EXPECT_NE(one.find("step bytes (floor): "), std::string::npos) << one;
  auto bad = testing::run_command(testing::flashseek_bin() +
                                  " bench --load-format dummy --config tiny-v41 --step-tokens 0 2>&1");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  // The prefill's arithmetic (model/flops.h) does not depend on the chunking; --prefill-reps times
  // the same prompts again on fresh sequences (the same logits) and prints the median's spread.
  auto work = [&](const std::string& out) {
    const std::string l = line(out, "prefill work: ");
    return l.substr(0, l.find(','));  // the counts, without the rate
  };
  EXPECT_FALSE(work(one).empty()) << one;
  EXPECT_EQ(work(one), work(chunked)) << one << chunked;
  const std::string reps = run("--prefill-reps 3");
  EXPECT_EQ(line(one, "logits checksum"), line(reps, "logits checksum")) << reps;
  EXPECT_NE(line(reps, "prefill: ").find(", median of 3 ("), std::string::npos) << reps;
  auto no_reps = testing::run_command(testing::flashseek_bin() +
                                      " bench --load-format dummy --config tiny-v41 --prefill-reps 0 2>&1");
  EXPECT_NE(no_reps.exit_code, 0) << no_reps.output;
}

}  // namespace
}  // namespace flashseek
