// Helpers shared by the whole-model GPU tests (gpu_parity_test, gpu_spec_test, gpu_native_test,
// gpu_tp_test, gpu_mtp_test): the visible GPU skip, tie-free tiny checkpoints, random prompts, one-item
// forwards, chunked runs, logit comparisons and greedy generation through the engine.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/state_cache.h"
#include "forward/state_convert.h"
#include "forward/state_io.h"
#include "forward/model.h"
#include "model/config.h"
#include "model/make_tiny.h"

#if FLASHSEEK_HAVE_CUDA
#include "ops/cuda/runtime/cuda_check.h"
#endif

namespace flashseek::forward::gpu_test {

inline bool have_gpu(std::string* why) {
#if FLASHSEEK_HAVE_CUDA
  return ops::cuda::cuda_device_available(why);
#else
  *why = "this build has no CUDA backend";
  return false;
#endif
}

#define FS_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    std::string why_;                                                                      \
    if (!::flashseek::forward::gpu_test::have_gpu(&why_)) GTEST_SKIP() << "GPU test skipped: " << why_; \
  } while (0)

// Greedy tokens of `prompt` + n through the engine on `m` (batch up to 2, EOS ignored), with
// speculation forced on (`spec`) or off; the engine's counters into `stats` when given.
inline std::vector<int32_t> greedy_generate(Model& m, const std::vector<int32_t>& prompt, int64_t n, bool spec,
                                            engine::EngineStats* stats) {
  engine::EngineOptions o;
  o.max_batch = 2;
  o.speculative = spec ? engine::SpecMode::kOn : engine::SpecMode::kOff;
  auto eng = engine::Engine::create(m, o);
  EXPECT_TRUE(eng.ok()) << eng.status().to_string();
  if (!eng.ok()) return {};
  engine::Request r;
  r.id = 1;
  r.prompt = prompt;
  r.max_tokens = n;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  auto s = (*eng)->submit(r);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok()) return {};
  EXPECT_TRUE((*eng)->run_until_idle().ok());
  if (stats) *stats = (*eng)->stats();
  return engine::collect(**s).tokens;
}

// Widens every selection (index top-k over every compressed position, every routed expert active,
// every candidate block kept; with `draft` also every DSpark expert) so that no near-tie can flip
// a discrete choice between backends.
inline void widen_selections(model::ModelConfig& c, bool draft = false) {
  c.index_topk = 4096;
  c.n_experts_per_tok = c.n_routed_experts;
  if (draft) c.dspark_n_experts_per_tok = c.dspark_n_routed_experts;
  c.candidate_topk_blocks = 4096;
  EXPECT_TRUE(model::finalize_config(c).ok());
}

// Writes a make-tiny checkpoint of `c` once per process under <tmp>/<tag>_<pid>; returns its dir.
inline std::string tiny_checkpoint(const std::string& tag, const model::ModelConfig& c, uint64_t seed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir.string();
  model::MakeTinyOptions opt;
  opt.seed = seed;
  EXPECT_TRUE(model::make_tiny_checkpoint(c, opt, dir.string()).ok());
  return dir.string();
}

// The weights of a CUDA model compared with the CPU backend (or with tensor-parallel ranks, which
// slice FP32 copies) at FP32-rounding tolerance: native weights (the default) in exact numerics,
// since the exactness kernels read them bitwise like FP32 copies; FP32 copies in reference
// numerics, where native weights run the FP8-activation linears and the routed experts through
// the block-scaled GEMVs (another summation order, FP8 codes flip and cascade on the tiny models:
// docs/cuda.md).
inline GpuLoadOptions cpu_twin_weights(Numerics n) {
  GpuLoadOptions o;
  o.weights = n == Numerics::kReference ? GpuWeights::kFp32 : GpuWeights::kNative;
  return o;
}

// All logits [n, V] of `tokens` fed in chunks of `chunk` tokens through a fresh sequence.
inline std::vector<float> run_chunked(Model& m, const std::vector<int32_t>& tokens, int64_t chunk) {
  auto st = m.new_sequence();
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
    const size_t n = std::min(tokens.size() - i, size_t(chunk));
    BatchItem item{st.get(), std::span<const int32_t>(tokens.data() + i, n), true};
    const Status s = m.forward({&item, 1}, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
  }
  return out;
}

struct Cmp {
  double max_abs = 0;
  double argmax_agree = 0;  // fraction of positions with the same argmax
};
inline Cmp compare_logits(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  Cmp r;
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || a.empty()) return r;
  const int64_t n = int64_t(a.size()) / V;
  int64_t agree = 0;
  for (int64_t p = 0; p < n; ++p) {
    const float* x = a.data() + p * V;
    const float* y = b.data() + p * V;
    for (int64_t v = 0; v < V; ++v) r.max_abs = std::max(r.max_abs, std::fabs(double(x[v]) - y[v]));
    agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
  }
  r.argmax_agree = double(agree) / double(n);
  return r;
}

// n tokens uniform in [0, vocab).
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// Turn 1 (`turn1_len` random tokens, 12 answered), then turn 2 = turn 1 + answer + 15 new tokens,
// through the engine on `m` (checkpoint `dir`, reference numerics) with a state cache: turn 1
// stores 2 snapshots (end of prompt, end of response), turn 2 restores turn 1 + answer minus its
// last token, prefills only the rest, and answers like turn 2 without the cache. `tag` names the
// model in the printed line.
inline void check_second_turn_restores_prefix(Model& m, const std::string& dir, int64_t turn1_len, const char* tag) {
  auto fp = checkpoint_fingerprint(dir, "reference");
  ASSERT_TRUE(fp.ok());
  engine::StateCacheOptions co{state_fingerprint(*fp, m.backend_kind()), int64_t(1) << 30, {}, 2};
  co.geometry = model_snapshot_geometry(m, int64_t(1) << 20);
  auto cache = engine::StateCache::open(std::move(co));
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  auto eng = engine::Engine::create(m, {});
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  Rng rng(8);
  auto run_turn = [&](std::vector<int32_t> prompt, bool cached, int64_t* hit) {
    engine::Request r;
    r.id = rng.next_u64() >> 1;
    r.prompt = std::move(prompt);
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    if (cached) *hit = engine::attach_state_cache(**cache, 11, r);
    auto s = (*eng)->submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_TRUE((*eng)->run_until_idle().ok());
    (*cache)->flush();
    return engine::collect(**s).tokens;
  };
  const int64_t V = m.config().vocab_size;
  const auto turn1 = random_tokens(turn1_len, V, 17);
  int64_t hit1 = -1, hit2 = -1;
  const auto answer = run_turn(turn1, true, &hit1);
  EXPECT_EQ(hit1, 0);
  ASSERT_EQ(answer.size(), 12u);
  EXPECT_EQ((*cache)->stats().puts, 2) << "end of prompt + end of response snapshots of a " << tag << " state";
  auto turn2 = turn1;
  turn2.insert(turn2.end(), answer.begin(), answer.end());
  const auto msg = random_tokens(15, V, 18);
  turn2.insert(turn2.end(), msg.begin(), msg.end());
  const int64_t before = (*eng)->stats().prompt_tokens;
  const auto cached_answer = run_turn(turn2, true, &hit2);
  std::printf("[%s snapshot] engine: turn 2 of %zu prompt tokens, %lld restored from the cache\n", tag, turn2.size(),
              (long long)hit2);
  EXPECT_EQ(hit2, turn1_len + 12 - 1);  // turn 1 + answer minus its last token (never fed back)
  EXPECT_EQ((*eng)->stats().prompt_tokens - before, int64_t(turn2.size()) - hit2);
  const auto plain_answer = run_turn(turn2, false, nullptr);
  EXPECT_EQ(cached_answer, plain_answer);
}

// One forward of `tokens` for one sequence (logits of every position when `all`).
inline Status feed(Model& m, SequenceState& st, std::span<const int32_t> tokens, std::vector<float>& logits,
                   bool all = true) {
  BatchItem item{&st, tokens, all};
  return m.forward({&item, 1}, logits);
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

}  // namespace flashseek::forward::gpu_test
