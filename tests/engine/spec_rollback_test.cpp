// Rollback after every partial acceptance (v41 §5.7) on tiny-v41: a state that verified a block
// [x0, y_1 … y_B] and was rolled back to x0 + the n accepted drafts behaves exactly like a state
// that only ever saw those tokens: same length, same logits for the following tokens (a chunk,
// every row) and the same draft proposal (draft rings, taps).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/make_tiny.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

std::vector<float> run(forward::Model& m, forward::SequenceState& st, std::span<const int32_t> toks,
                       bool all) {
  std::vector<float> logits;
  forward::BatchItem item{&st, toks, all};
  EXPECT_TRUE(m.forward(std::span<forward::BatchItem>(&item, 1), logits).ok());
  return logits;
}

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(SpecRollback, EveryPartialAcceptanceEqualsThePlainState) {
  flashseek::testing::TempDir dir;
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 5}, dir.path().string()).ok());
  auto loaded = forward::load_model(dir.path().string(), forward::Numerics::kReference);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  forward::Model& m = **loaded;
  const int64_t B = m.config().dspark_block_size, V = m.config().vocab_size;
  Rng rng(9);
  const std::vector<int32_t> prompt = testing::random_prompt(rng, 11, V);
  // Plain greedy continuation: tokens g[0], g[1], … after the prompt.
  auto plain = m.new_sequence();
  std::vector<int32_t> g{argmax(run(m, *plain, prompt, false))};
  // Grow the sequence across many alignments (ratio-2 groups, window wrap), trying every n at each.
  auto spec = plain->clone();  // committed: prompt + g[0 … i−1]; g[i] is the anchor
  for (int64_t i = 0; i < 200; ++i) {
    const int64_t n = i % (B + 1);  // accepted drafts this step
    // Plain side: feed the anchor and the n accepted tokens one by one (extending g as needed).
    auto ref = spec->clone();
    for (int64_t k = 0; k <= n; ++k) {
      const int32_t next =
          argmax(run(m, *ref, std::span<const int32_t>(&g[size_t(i + k)], 1), false));
      if (int64_t(g.size()) == i + k + 1) g.push_back(next);
      ASSERT_EQ(g[size_t(i + k + 1)], next);
    }
    // Spec side: block [g_i, g_{i+1} … g_{i+n}, wrong …], then rollback to the accepted length.
    std::vector<int32_t> block(g.begin() + i, g.begin() + i + n + 1);
    while (int64_t(block.size()) < B + 1)
      block.push_back(int32_t((g[size_t(i + n + 1)] + 1 + block.size()) % V));
    const int64_t base = spec->length();
    auto rows = run(m, *spec, block, true);
    for (int64_t k = 0; k <= n; ++k)  // the accepted rows are the target's own greedy tokens
      ASSERT_EQ(argmax(std::span<const float>(rows).subspan(size_t(k * V), size_t(V))),
                g[size_t(i + k + 1)]);
    ASSERT_TRUE(m.rollback(*spec, base + n + 1).ok());
    ASSERT_EQ(spec->length(), ref->length());
    // Same draft proposal from both states, and same logits for a 4-token continuation.
    const int32_t anchor = g[size_t(i + n + 1)];
    auto da = m.propose(*spec, anchor), db = m.propose(*ref, anchor);
    ASSERT_TRUE(da.ok() && db.ok());
    EXPECT_EQ(da->tokens, db->tokens) << "step " << i;
    EXPECT_EQ(da->logits, db->logits) << "step " << i;
    EXPECT_EQ(da->confidence, db->confidence) << "step " << i;
    const std::vector<int32_t> probe_toks = {anchor, int32_t((anchor + 3) % V), 7, 1};
    auto pa = spec->clone(), pb = ref->clone();
    ASSERT_EQ(run(m, *pa, probe_toks, true), run(m, *pb, probe_toks, true))
        << "step " << i << " n " << n;
    // Continue from the plain state on the spec side too (it must be equivalent anyway).
    spec = std::move(pa);
    ASSERT_TRUE(m.rollback(*spec, base + n + 1).ok());
    i += n;  // committed g[i … i+n]
  }
}

}  // namespace
}  // namespace flashseek::engine
