// The step planner: decodes first, prompt chunks FCFS within the token budget.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "engine/batch_planner.h"

namespace flashseek::engine {
namespace {

TEST(BatchPlanner, DecodesFirstThenChunkedPrefill) {
  std::vector<SequenceNeed> needs = {{100, true}, {0, true}, {10, true}, {0, true}, {0, false}};
  auto plan = plan_step(needs, {/*max_step_tokens=*/40, /*max_prefill_chunk=*/32});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].sequence, 0u);
  EXPECT_EQ(plan[0].n_tokens, 32);  // capped by the chunk
  EXPECT_TRUE(plan[0].prefill);
  EXPECT_EQ(plan[1].sequence, 1u);
  EXPECT_EQ(plan[1].n_tokens, 1);
  EXPECT_FALSE(plan[1].prefill);
  EXPECT_EQ(plan[2].sequence, 2u);
  EXPECT_EQ(plan[2].n_tokens, 6);  // 40 - 2 decodes - 32: what is left of the budget
  EXPECT_EQ(plan[3].sequence, 3u);
  // Budget exhausted by decodes: no prefill at all.
  plan = plan_step(needs, {2, 32});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_FALSE(plan[0].prefill);
  EXPECT_FALSE(plan[1].prefill);
}

TEST(BatchPlanner, RejectsEmptyBudgets) {
  EXPECT_FALSE(validate_budget({0, 8}).ok());
  EXPECT_FALSE(validate_budget({8, 0}).ok());
  EXPECT_TRUE(validate_budget({1, 1}).ok());
}

TEST(BatchPlanner, RandomizedInvariants) {
  Rng rng(77);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<SequenceNeed> needs(rng.below(12));
    for (auto& n : needs) {
      n.pending_prompt = rng.uniform() < 0.5 ? 0 : int64_t(1 + rng.below(300));
      n.ready = rng.uniform() < 0.9;
    }
    StepBudget b{int64_t(1 + rng.below(200)), int64_t(1 + rng.below(100))};
    auto plan = plan_step(needs, b);
    int64_t total = 0, decodes_ready = 0, decodes_planned = 0;
    for (auto& n : needs) decodes_ready += n.ready && n.pending_prompt == 0;
    size_t last = 0;
    bool starved_prefill = false;
    for (size_t i = 0; i < plan.size(); ++i) {
      const auto& it = plan[i];
      const auto& n = needs[it.sequence];
      if (i > 0) {
        EXPECT_GT(it.sequence, last) << "items must keep admission order";
      }
      last = it.sequence;
      EXPECT_TRUE(n.ready);
      EXPECT_GE(it.n_tokens, 1);
      total += it.n_tokens;
      if (n.pending_prompt == 0) {
        EXPECT_EQ(it.n_tokens, 1);
        ++decodes_planned;
      } else {
        EXPECT_LE(it.n_tokens, std::min(n.pending_prompt, b.max_prefill_chunk));
        // FCFS: once a prompt got less than it could use, no later prompt gets anything.
        EXPECT_FALSE(starved_prefill) << "trial " << trial;
        if (it.n_tokens < std::min(n.pending_prompt, b.max_prefill_chunk)) starved_prefill = true;
      }
    }
    EXPECT_LE(total, b.max_step_tokens);
    EXPECT_EQ(decodes_planned, std::min(decodes_ready, b.max_step_tokens));
    // Work conservation: a leftover budget means every ready prompt got its full chunk.
    if (total >= b.max_step_tokens) continue;
    for (size_t i = 0; i < needs.size(); ++i) {
      if (!needs[i].ready || needs[i].pending_prompt == 0) continue;
      bool found = false;
      for (auto& it : plan) found |= it.sequence == i;
      EXPECT_TRUE(found) << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace flashseek::engine
