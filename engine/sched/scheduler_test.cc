#include "engine/sched/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace specd {
namespace {

constexpr int32_t kBlock = 4;

std::vector<int32_t> Prompt(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A scheduler with its block pool and sequences; Step() plays the engine: run the plan,
// then "sample" a token for every sequence whose tokens all have KV.
struct Harness {
  Harness(int32_t num_blocks, SchedulerConfig config, bool prefix_caching = true)
      : blocks(num_blocks, kBlock, prefix_caching), sched(config, &blocks) {}

  Sequence* Add(std::vector<int32_t> prompt) {
    seqs.push_back(std::make_unique<Sequence>(SeqId{seqs.size() + 1}, std::move(prompt), kBlock));
    sched.Add(seqs.back().get());
    return seqs.back().get();
  }

  StepPlan Step() {
    StepPlan plan = sched.Schedule();
    for (const ScheduledChunk& c : plan.chunks) {
      // Chunks run contiguous tokens with KV slots reserved for them.
      EXPECT_GT(c.num_new_tokens, 0);
      EXPECT_LE(c.seq->num_computed() + c.num_new_tokens, c.seq->num_tokens());
      EXPECT_GE(c.seq->blocks().capacity(), c.seq->num_computed() + c.num_new_tokens);
    }
    sched.Postprocess(plan);
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.seq->num_uncomputed() == 0) c.seq->AppendToken(7);
    }
    return plan;
  }

  int32_t NewTokens(const StepPlan& plan, const Sequence* seq) const {
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.seq == seq) return c.num_new_tokens;
    }
    return 0;
  }

  BlockManager blocks;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

TEST(SchedulerTest, AdmitsAndPrefillsANewSequenceInOneStep) {
  Harness h(16, {4, 64});
  Sequence* seq = h.Add(Prompt(6));
  StepPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].num_new_tokens, 6);
  EXPECT_EQ(plan.admitted.size(), 1u);
  EXPECT_EQ(seq->status(), SequenceStatus::kRunning);
  EXPECT_EQ(seq->num_tokens(), 7);  // one sampled
  EXPECT_EQ(h.NewTokens(h.Step(), seq), 1);
}

TEST(SchedulerTest, ChunksLongPromptUnderTokenBudget) {
  Harness h(64, {4, 16});
  Sequence* seq = h.Add(Prompt(40));
  EXPECT_EQ(h.NewTokens(h.Step(), seq), 16);
  EXPECT_EQ(seq->num_computed(), 16);
  EXPECT_EQ(seq->num_generated(), 0);  // no token until the whole prompt has KV
  EXPECT_EQ(h.NewTokens(h.Step(), seq), 16);
  EXPECT_EQ(h.NewTokens(h.Step(), seq), 8);
  EXPECT_EQ(seq->num_generated(), 1);
  EXPECT_EQ(h.NewTokens(h.Step(), seq), 1);
}

TEST(SchedulerTest, SchedulesDecodesBeforePrefillsAndPrefillsShareTheRest) {
  Harness h(64, {4, 8});
  Sequence* a = h.Add(Prompt(3));
  h.Step();  // a prefilled, now decoding
  Sequence* b = h.Add(Prompt(20, 300));
  Sequence* c = h.Add(Prompt(5, 600));
  StepPlan plan = h.Step();
  ASSERT_GE(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].seq, a);
  EXPECT_EQ(plan.chunks[0].num_new_tokens, 1);
  EXPECT_EQ(h.NewTokens(plan, b), 7);
  EXPECT_EQ(h.NewTokens(plan, c), 0);  // budget spent; c waits for b's chunks (FCFS)
  EXPECT_EQ(plan.num_batched_tokens, 8);
  plan = h.Step();
  EXPECT_EQ(h.NewTokens(plan, a), 1);
  EXPECT_EQ(h.NewTokens(plan, b), 7);  // partial prefill continues before new admissions
  EXPECT_EQ(h.NewTokens(plan, c), 0);
}

TEST(SchedulerTest, RunsAtMostMaxNumSeqs) {
  Harness h(64, {2, 64});
  h.Add(Prompt(3));
  h.Add(Prompt(3, 200));
  Sequence* third = h.Add(Prompt(3, 300));
  StepPlan plan = h.Step();
  EXPECT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(h.sched.num_running(), 2);
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(third->status(), SequenceStatus::kWaiting);
  h.sched.Finish(h.seqs[0].get());
  plan = h.Step();
  EXPECT_EQ(h.NewTokens(plan, third), 3);
}

TEST(SchedulerTest, PreemptsNewestWhenOutOfBlocks) {
  // 4 blocks of 4 tokens: two sequences of 7 tokens take 2 blocks each; decoding the 9th
  // position of the older one needs a third block.
  Harness h(4, {4, 64}, /*prefix_caching=*/false);
  Sequence* old_seq = h.Add(Prompt(7));
  Sequence* new_seq = h.Add(Prompt(7, 200));
  h.Step();  // both prefilled; each now has 8 tokens
  EXPECT_EQ(h.blocks.num_free_blocks(), 0);
  StepPlan plan = h.Step();  // decodes position 7: fits in the second blocks
  EXPECT_TRUE(plan.preempted.empty());
  plan = h.Step();  // position 8 needs a new block for each: the newest goes
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], new_seq);
  EXPECT_EQ(new_seq->status(), SequenceStatus::kWaiting);
  EXPECT_EQ(new_seq->num_computed(), 0);
  EXPECT_EQ(new_seq->num_preemptions(), 1);
  EXPECT_EQ(new_seq->num_tokens(), 9);  // generated tokens are kept for the recompute
  EXPECT_EQ(h.NewTokens(plan, old_seq), 1);
  EXPECT_TRUE(plan.admitted.empty());  // no admission in a step that preempted
  // Once the old one finishes, the preempted one comes back first and recomputes all of
  // its tokens (prompt and generated) in one prefill.
  h.sched.Finish(old_seq);
  Sequence* later = h.Add(Prompt(5, 400));
  plan = h.Step();
  ASSERT_FALSE(plan.admitted.empty());
  EXPECT_EQ(plan.admitted[0], new_seq);
  EXPECT_EQ(h.NewTokens(plan, new_seq), 9);
  EXPECT_EQ(new_seq->num_tokens(), 10);
  EXPECT_EQ(later->status(), SequenceStatus::kWaiting);  // no blocks left for it
}

TEST(SchedulerTest, PreemptsItselfWhenItIsTheNewest) {
  Harness h(3, {4, 64}, false);
  Sequence* a = h.Add(Prompt(5));       // 2 blocks, room to decode up to 8 tokens
  Sequence* b = h.Add(Prompt(4, 200));  // 1 block, full
  h.Step();
  StepPlan plan = h.Step();  // b needs a second block; b is the newest: b goes
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], b);
  EXPECT_EQ(h.NewTokens(plan, a), 1);
  EXPECT_EQ(h.NewTokens(plan, b), 0);
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(h.sched.num_running(), 1);
}

TEST(SchedulerTest, ReusesCachedPrefixAtAdmission) {
  Harness h(32, {4, 64});
  Sequence* a = h.Add(Prompt(10));
  h.Step();
  std::vector<int32_t> prompt = Prompt(10);
  prompt.push_back(1);
  Sequence* b = h.Add(prompt);
  StepPlan plan = h.Step();
  EXPECT_EQ(b->num_cached_prompt_tokens(), 8);
  EXPECT_EQ(h.NewTokens(plan, b), 3);  // only tokens 8..10 run
  EXPECT_EQ(plan.num_queried_blocks, 2);
  EXPECT_EQ(plan.num_hit_blocks, 2);
  EXPECT_EQ(b->blocks().ids()[0], a->blocks().ids()[0]);
}

TEST(SchedulerTest, FinishFreesKvFromWaitingOrRunning) {
  Harness h(16, {1, 64});
  Sequence* a = h.Add(Prompt(9));
  Sequence* b = h.Add(Prompt(9, 300));
  h.Step();
  EXPECT_EQ(a->status(), SequenceStatus::kRunning);
  EXPECT_EQ(b->status(), SequenceStatus::kWaiting);
  h.sched.Finish(b);
  h.sched.Finish(a);
  EXPECT_EQ(a->status(), SequenceStatus::kFinished);
  EXPECT_TRUE(h.sched.empty());
  EXPECT_EQ(h.blocks.num_used_blocks(), 0);
  EXPECT_TRUE(h.sched.Schedule().empty());
}

// Deterministic simulation of many requests through a tight pool and budget: every
// sequence finishes with all its tokens, no step exceeds its limits, and the pool ends
// empty.
TEST(SchedulerTest, RandomSimulationFinishesEverySequenceWithinLimits) {
  constexpr int32_t kMaxSeqs = 6;
  constexpr int32_t kBudget = 24;
  Harness h(16, {kMaxSeqs, kBudget});
  std::mt19937 rng(11);
  std::vector<int32_t> max_new;
  int32_t preemptions = 0;
  int32_t arrived = 0;
  for (int step = 0; step < 5000; ++step) {
    if (arrived < 40 && rng() % 3 != 0) {
      h.Add(Prompt(1 + static_cast<int32_t>(rng() % 30), 100 * (1 + rng() % 3)));
      max_new.push_back(1 + static_cast<int32_t>(rng() % 30));
      ++arrived;
    }
    StepPlan plan = h.Step();
    EXPECT_LE(plan.num_batched_tokens, kBudget);
    EXPECT_LE(h.sched.num_running(), kMaxSeqs);
    preemptions += static_cast<int32_t>(plan.preempted.size());
    for (size_t i = 0; i < h.seqs.size(); ++i) {
      Sequence* s = h.seqs[i].get();
      if (s->status() != SequenceStatus::kFinished && s->num_generated() >= max_new[i] &&
          s->num_uncomputed() == 1) {
        h.sched.Finish(s);
      }
    }
    if (arrived == 40 && h.sched.empty()) break;
  }
  EXPECT_TRUE(h.sched.empty());
  for (size_t i = 0; i < h.seqs.size(); ++i) {
    EXPECT_EQ(h.seqs[i]->num_generated(), max_new[i]) << i;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(h.blocks.num_used_blocks(), 0);
}

}  // namespace
}  // namespace specd

namespace specd {
namespace {

const ScheduledChunk* ChunkOf(const StepPlan& plan, const Sequence* seq) {
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.seq == seq) return &c;
  }
  return nullptr;
}

// Speculating decodes get lookahead slots (KV and budget) for their drafts; accepted drafts
// become computed tokens.
TEST(SchedulerLookaheadTest, DecodeReservesSlotsAndAcceptedDraftsBecomeComputed) {
  Harness h(16, {4, 64});
  Sequence* s = h.Add(Prompt(5));
  s->set_num_lookahead_tokens(3);
  h.Step();  // prefill: no lookahead on prefills
  ASSERT_EQ(s->num_tokens(), 6);
  StepPlan plan = h.sched.Schedule();
  const ScheduledChunk* c = ChunkOf(plan, s);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->num_new_tokens, 1);
  EXPECT_EQ(c->num_lookahead_tokens, 3);
  EXPECT_EQ(plan.num_batched_tokens, 4);
  EXPECT_GE(s->blocks().capacity(), 6 + 3);  // slots for positions 5 .. 8
  h.sched.Postprocess(plan);
  // The engine commits two accepted drafts and the token after them.
  for (int32_t id : {11, 12, 13}) s->AppendToken(id);
  h.sched.AcceptSpeculated(s, 2);
  EXPECT_EQ(s->num_computed(), 8);
  EXPECT_EQ(s->num_uncomputed(), 1);
}

TEST(SchedulerLookaheadTest, LookaheadIsLimitedByTheTokenBudget) {
  Harness h(16, {4, 3});
  Sequence* s = h.Add(Prompt(2));
  s->set_num_lookahead_tokens(8);
  h.Step();
  StepPlan plan = h.sched.Schedule();
  ASSERT_NE(ChunkOf(plan, s), nullptr);
  EXPECT_EQ(ChunkOf(plan, s)->num_lookahead_tokens, 2);  // budget 3: the token and 2 drafts
  EXPECT_EQ(plan.num_batched_tokens, 3);
}

// Lookahead never costs a preemption: a's drafts would take the last free block, which b's
// next token needs, so a decodes without drafts and nobody is preempted (taking it would have
// preempted b).
TEST(SchedulerLookaheadTest, NoLookaheadWhereItWouldForceAPreemption) {
  Harness h(4, {4, 64});  // 4 blocks of 4 tokens
  Sequence* a = h.Add(Prompt(4));
  Sequence* b = h.Add(Prompt(4, 300));
  a->set_num_lookahead_tokens(4);
  h.Step();  // both prefilled (1 block each) and each drew a token: 5 tokens, next needs block 2
  ASSERT_EQ(h.blocks.num_free_blocks(), 2);
  StepPlan plan = h.sched.Schedule();
  EXPECT_TRUE(plan.preempted.empty());
  ASSERT_NE(ChunkOf(plan, a), nullptr);
  ASSERT_NE(ChunkOf(plan, b), nullptr);
  EXPECT_EQ(ChunkOf(plan, a)->num_lookahead_tokens, 0);
  EXPECT_EQ(h.blocks.num_free_blocks(), 0);
  // Alone, the same sequence gets its drafts' slots.
  Harness alone(4, {4, 64});
  Sequence* c = alone.Add(Prompt(4));
  c->set_num_lookahead_tokens(4);
  alone.Step();
  StepPlan solo = alone.sched.Schedule();
  ASSERT_NE(ChunkOf(solo, c), nullptr);
  EXPECT_EQ(ChunkOf(solo, c)->num_lookahead_tokens, 4);
}

TEST(SchedulerPauseTest, PausedSequenceRunsNothingAndKeepsItsKv) {
  Harness h(64, {4, 64});
  Sequence* a = h.Add(Prompt(6));
  Sequence* b = h.Add(Prompt(5, 300));
  h.Step();
  h.Step();
  h.sched.SetPaused(a, true);
  const int32_t num_blocks = a->blocks().num_blocks();
  const int32_t num_tokens = a->num_tokens();
  for (int i = 0; i < 8; ++i) {
    StepPlan plan = h.Step();
    EXPECT_EQ(h.NewTokens(plan, a), 0);
    EXPECT_EQ(h.NewTokens(plan, b), 1);
  }
  EXPECT_EQ(a->num_tokens(), num_tokens);
  EXPECT_EQ(a->blocks().num_blocks(), num_blocks);
  EXPECT_EQ(a->status(), SequenceStatus::kRunning);
  EXPECT_EQ(h.sched.num_paused(), 1);
  h.sched.SetPaused(a, false);
  EXPECT_EQ(h.NewTokens(h.Step(), a), 1);
  EXPECT_EQ(h.sched.num_paused(), 0);
}

TEST(SchedulerPauseTest, PausedWaitingSequenceIsPassedOverNotAdmitted) {
  Harness h(64, {4, 64});
  Sequence* a = h.Add(Prompt(6));
  h.sched.SetPaused(a, true);
  Sequence* b = h.Add(Prompt(5, 300));
  StepPlan plan = h.Step();
  EXPECT_EQ(h.NewTokens(plan, a), 0);
  EXPECT_EQ(h.NewTokens(plan, b), 5);
  EXPECT_EQ(a->status(), SequenceStatus::kWaiting);
  h.sched.SetPaused(a, false);
  EXPECT_EQ(h.NewTokens(h.Step(), a), 6);
}

TEST(SchedulerPauseTest, AllPausedGivesAnEmptyPlan) {
  Harness h(64, {4, 64});
  Sequence* a = h.Add(Prompt(6));
  h.Step();
  h.sched.SetPaused(a, true);
  EXPECT_TRUE(h.Step().empty());
  EXPECT_FALSE(h.sched.empty());
}

TEST(SchedulerPauseTest, PausedSequenceGivesItsSlotToAWaitingOne) {
  Harness h(64, {1, 64}, /*prefix_caching=*/false);
  Sequence* a = h.Add(Prompt(6));
  h.Step();
  h.sched.SetPaused(a, true);
  Sequence* b = h.Add(Prompt(5, 300));
  StepPlan plan = h.Step();
  EXPECT_EQ(h.NewTokens(plan, b), 5);
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], a);
  EXPECT_EQ(a->status(), SequenceStatus::kWaiting);
  EXPECT_EQ(a->blocks().num_blocks(), 0);
  EXPECT_EQ(h.sched.num_paused(), 1);
  h.sched.Finish(b);
  h.sched.SetPaused(a, false);
  EXPECT_EQ(h.NewTokens(h.Step(), a), 7);  // recomputed: prompt and its generated token
}

TEST(SchedulerPauseTest, PausedSequenceIsPreemptedFirstWhenBlocksRunOut) {
  // 4 blocks of 4 tokens: a (older, paused) and b each hold 2 blocks after their prompts.
  Harness h(4, {4, 64}, /*prefix_caching=*/false);
  Sequence* a = h.Add(Prompt(7));
  Sequence* b = h.Add(Prompt(7, 300));
  h.Step();  // both prefilled
  h.Step();  // both decoded position 7: 9 tokens each, 2 full blocks each, none free
  h.sched.SetPaused(a, true);
  StepPlan plan = h.Step();  // b needs a third block: a (older, paused), not b, loses its KV
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], a);
  EXPECT_EQ(h.NewTokens(plan, b), 1);
  EXPECT_EQ(b->status(), SequenceStatus::kRunning);
}

}  // namespace
}  // namespace specd
