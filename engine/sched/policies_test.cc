#include "engine/sched/policies.h"

#include <gtest/gtest.h>

#include "engine/sched/scheduler.h"

namespace specd {
namespace {

TEST(TokenBudgetTest, GrantsWhatIsLeft) {
  TokenBudget budget(10);
  EXPECT_EQ(budget.Take(4), 4);
  EXPECT_EQ(budget.Take(8), 6);
  EXPECT_EQ(budget.Take(1), 0);
  EXPECT_EQ(budget.used(), 10);
  EXPECT_EQ(budget.remaining(), 0);
}

TEST(AdmissionPolicyTest, NeedsASlotBudgetAndBlocks) {
  BlockManager blocks(2, 4, true);
  AdmissionPolicy policy(2);
  Sequence small(SeqId{1}, {1, 2, 3}, 4);
  Sequence big(SeqId{2}, std::vector<int32_t>(9, 5), 4);  // 3 blocks
  TokenBudget budget(8);
  EXPECT_TRUE(policy.CanAdmit(small, 1, budget, blocks));
  EXPECT_FALSE(policy.CanAdmit(small, 2, budget, blocks));  // running slots full
  EXPECT_FALSE(policy.CanAdmit(big, 0, budget, blocks));    // KV does not fit
  budget.Take(8);
  EXPECT_FALSE(policy.CanAdmit(small, 0, budget, blocks));  // no tokens left this step
}

TEST(PreemptNewestTest, PicksTheLastAdmitted) {
  Sequence a(SeqId{1}, {1}, 4), b(SeqId{2}, {1}, 4), c(SeqId{3}, {1}, 4);
  std::vector<Sequence*> running = {&a, &b, &c};
  EXPECT_EQ(PreemptNewest().SelectVictim(running), 2u);
}

TEST(PreemptNewestTest, PicksTheNewestPausedFirst) {
  BlockManager blocks(4, 4, true);
  Scheduler sched({4, 64}, &blocks);
  Sequence a(SeqId{1}, {1}, 4), b(SeqId{2}, {1}, 4), c(SeqId{3}, {1}, 4), d(SeqId{4}, {1}, 4);
  std::vector<Sequence*> running = {&a, &b, &c, &d};
  sched.SetPaused(&a, true);
  sched.SetPaused(&b, true);
  EXPECT_EQ(PreemptNewest().SelectVictim(running), 1u);
}

}  // namespace
}  // namespace specd
