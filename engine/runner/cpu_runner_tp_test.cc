// CpuRunner under tensor parallelism (two rank threads joined by a LocalCommGroup, codepair's
// target): rank 0's Step, StepGreedyVerify and Forward give TP 1's results, and the worker
// (rank 1), whose rows carry only chunk and token, makes the same calls and returns OK with
// empty outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/local_communicator.h"
#include "engine/kv/block_allocator.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"

namespace specd {
namespace {

const std::string kTarget = std::string(SPECD_SHARED_DIR) + "/models/codepair/target";

RunnerOptions Options(int32_t rank, int32_t world_size, Communicator* comm) {
  RunnerOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.num_threads = 1;  // OpenBLAS single-threaded: rank threads call it concurrently
  o.max_model_len = 256;
  o.kv_cache_bytes = 1;  // the minimum: one max_model_len sequence (16 blocks) on every rank
  o.tp = {rank, world_size};
  o.comm = comm;
  return o;
}

// Runs rank 0's and rank 1's calls on two threads; a failed call aborts the group.
void RunBoth(LocalCommGroup& group, const std::function<absl::Status()>& rank0,
             const std::function<absl::Status()>& rank1) {
  absl::Status s0, s1;
  std::thread worker([&] {
    s1 = rank1();
    if (!s1.ok()) group.Abort();
  });
  s0 = rank0();
  if (!s0.ok()) group.Abort();
  worker.join();
  EXPECT_TRUE(s0.ok()) << "rank 0: " << s0;
  EXPECT_TRUE(s1.ok()) << "rank 1: " << s1;
}

class CpuRunnerTpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto one = CpuRunner::Create(Options(0, 1, nullptr));
    ASSERT_TRUE(one.ok()) << one.status();
    one_ = std::move(*one);
    for (int32_t r = 0; r < 2; ++r) {
      auto runner = CpuRunner::Create(Options(r, 2, group_.comm(r)));
      ASSERT_TRUE(runner.ok()) << runner.status();
      ranks_[r] = std::move(*runner);
    }
    // Every rank holds the same number of blocks (its KV heads are the same count).
    ASSERT_EQ(ranks_[0]->num_kv_blocks(), ranks_[1]->num_kv_blocks());
    allocator_ = std::make_unique<BlockAllocator>(
        std::min(one_->num_kv_blocks(), ranks_[0]->num_kv_blocks()));
  }
  // Block ids for `n` tokens, used by the TP 1 runner and by both ranks alike.
  BlockTable Table(int32_t n) {
    BlockTable t(one_->block_size());
    EXPECT_TRUE(t.EnsureCapacity(n, *allocator_).ok());
    return t;
  }

  LocalCommGroup group_{2};
  std::unique_ptr<CpuRunner> one_;
  std::unique_ptr<CpuRunner> ranks_[2];
  std::unique_ptr<BlockAllocator> allocator_;
};

TEST_F(CpuRunnerTpTest, WorkerReturnsNothingWhileRankZeroStepsAsOneRank) {
  const std::vector<int32_t> a = {0, 5, 9, 14, 3, 77, 1024}, b = {0, 7, 7, 300};
  BlockTable ta = Table(16), tb = Table(16);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 3;
  Sampler sampler(greedy, 1);
  TokenHistory history;
  history.AddPrompt(a);
  // Rank 0's rows: b's last token, and a's token 2 (a chunk with every logits row).
  std::vector<SampleRow> rows = {{1, &sampler, &greedy, &history, {}, 1, 0, -1},
                                 {0, &sampler, &greedy, &history, {}, 1, 0, 2}};
  rows[0].num_candidates = 4;
  std::vector<SampleRow> worker_rows(2);  // chunk, token and the vocabulary merge's needs
  worker_rows[0].chunk = 1;
  worker_rows[1].chunk = 0;
  worker_rows[1].token = 2;
  for (size_t i = 0; i < rows.size(); ++i) {  // as TpCall rebuilds them (logprobs: full rows)
    worker_rows[i].full_logits = NeedsFullLogits(rows[i]);
    worker_rows[i].num_candidates = rows[i].num_candidates;
  }

  std::vector<SequenceInput> batch = {{a, 0, ta.ids(), false}, {b, 0, tb.ids(), false}};
  std::vector<SampleResult> expected, out0, out1 = {SampleResult{}};
  ASSERT_TRUE(one_->Step(batch, rows, &expected).ok());
  RunBoth(
      group_, [&] { return ranks_[0]->Step(batch, rows, &out0); },
      [&] { return ranks_[1]->Step(batch, worker_rows, &out1); });
  EXPECT_TRUE(out1.empty());
  ASSERT_EQ(out0.size(), expected.size());
  for (size_t i = 0; i < out0.size(); ++i) {
    EXPECT_EQ(out0[i].id, expected[i].id) << "row " << i;
    EXPECT_EQ(out0[i].candidates, expected[i].candidates) << "row " << i;
    ASSERT_EQ(out0[i].top.size(), expected[i].top.size());
    for (size_t j = 0; j < out0[i].top.size(); ++j) {
      EXPECT_EQ(out0[i].top[j].id, expected[i].top[j].id);
      EXPECT_NEAR(out0[i].top[j].logprob, expected[i].top[j].logprob, 1e-4);
    }
  }
  // A decode step of both sequences on top of the caches just written.
  const std::vector<int32_t> next_a = {expected[1].id}, next_b = {expected[0].id};
  batch = {{next_a, 7, ta.ids(), false}, {next_b, 4, tb.ids(), false}};
  rows[1].token = -1;
  worker_rows[1].token = -1;
  // Greedy rows without logprobs: the ranks exchange their shards' 4 best logits per row instead
  // of the shards (VocabMergeK), and the ids and candidates are still TP 1's.
  SamplingParams plain;
  plain.temperature = 0;
  Sampler plain_sampler(plain, 1);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].params = &plain;
    rows[i].sampler = &plain_sampler;
    rows[i].num_candidates = 4;
    worker_rows[i].full_logits = NeedsFullLogits(rows[i]);
    worker_rows[i].num_candidates = rows[i].num_candidates;
  }
  ASSERT_EQ(VocabMergeK(rows), 4);
  ASSERT_EQ(VocabMergeK(worker_rows), 4);
  ASSERT_TRUE(one_->Step(batch, rows, &expected).ok());
  RunBoth(
      group_, [&] { return ranks_[0]->Step(batch, rows, &out0); },
      [&] { return ranks_[1]->Step(batch, worker_rows, &out1); });
  EXPECT_TRUE(out1.empty());
  ASSERT_EQ(out0.size(), 2u);
  for (size_t i = 0; i < out0.size(); ++i) {
    EXPECT_EQ(out0[i].id, expected[i].id) << "row " << i;
    EXPECT_EQ(out0[i].candidates, expected[i].candidates) << "row " << i;
  }
}

TEST_F(CpuRunnerTpTest, GreedyVerifyOnTheWorkerNeedsNoParams) {
  const std::vector<int32_t> prompt = {0, 11, 42, 99, 5, 300, 17};
  BlockTable t = Table(32);
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy, 1);
  TokenHistory history;
  history.AddPrompt(prompt);
  SampleRow row{0, &sampler, &greedy, &history, {}, 1, 0};
  SampleRow worker_row;  // chunk 0, no sampler, params or history

  // Prefill on every runner, then verify TP 1's own continuation with its last draft wrong.
  std::vector<SequenceInput> batch = {{prompt, 0, t.ids(), false}};
  std::vector<SampleResult> first, out0, out1;
  ASSERT_TRUE(one_->Step(batch, {&row, 1}, &first).ok());
  RunBoth(
      group_,
      [&] {
        return ranks_[0]->Step(batch, {&row, 1}, &out0);
      },
      [&] {
        return ranks_[1]->Step(batch, {&worker_row, 1}, &out1);
      });
  ASSERT_EQ(out0.size(), 1u);
  EXPECT_EQ(out0[0].id, first[0].id);
  std::vector<int32_t> chunk = {first[0].id};
  for (int i = 0; i < 3; ++i) {  // greedy continuation of TP 1 (on a scratch copy of the cache)
    std::vector<float> logits;
    BlockTable scratch = Table(32);
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), chunk.begin(), chunk.end());
    const std::vector<SequenceInput> whole = {{context, 0, scratch.ids(), false}};
    ASSERT_TRUE(one_->Forward(whole, &logits).ok());
    chunk.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  chunk.back() = (chunk.back() + 1) % one_->config().vocab_size;  // the third draft is wrong
  const std::vector<int32_t> drafts(chunk.begin() + 1, chunk.end());
  const std::span<const int32_t> draft_span[] = {drafts};
  batch = {{chunk, static_cast<int32_t>(prompt.size()), t.ids(), false}};
  std::vector<GreedyVerifyResult> expected, verify0, verify1 = {GreedyVerifyResult{}};
  ASSERT_TRUE(one_->StepGreedyVerify(batch, {&row, 1}, draft_span, &expected).ok());
  ASSERT_EQ(expected.size(), 1u);
  EXPECT_EQ(expected[0].num_accepted, 2);
  RunBoth(
      group_,
      [&] {
        return ranks_[0]->StepGreedyVerify(batch, {&row, 1}, draft_span, &verify0);
      },
      [&] {
        return ranks_[1]->StepGreedyVerify(batch, {&worker_row, 1}, draft_span, &verify1);
      });
  EXPECT_TRUE(verify1.empty());
  ASSERT_EQ(verify0.size(), 1u);
  EXPECT_EQ(verify0[0].num_accepted, expected[0].num_accepted);
  EXPECT_EQ(verify0[0].next.id, expected[0].next.id);
}

TEST_F(CpuRunnerTpTest, ForwardGivesRankZeroTheLogitsAndTheWorkerNone) {
  const std::vector<int32_t> a = {0, 5, 9, 14, 3}, b = {0, 7, 7};
  BlockTable ta = Table(5), tb = Table(3);
  const std::vector<SequenceInput> batch = {{a, 0, ta.ids(), true}, {b, 0, tb.ids(), false}};
  std::vector<float> expected, logits0, logits1 = {1.0f};
  ASSERT_TRUE(one_->Forward(batch, &expected).ok());
  RunBoth(
      group_, [&] { return ranks_[0]->Forward(batch, &logits0); },
      [&] { return ranks_[1]->Forward(batch, &logits1); });
  EXPECT_TRUE(logits1.empty());
  ASSERT_EQ(logits0.size(), expected.size());
  ASSERT_EQ(expected.size(), 6u * one_->config().vocab_size);
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double{logits0[i]} - expected[i]));
    max_ref = std::max(max_ref, std::fabs(double{expected[i]}));
  }
  EXPECT_LE(max_diff / max_ref, 1e-5);
  std::printf("[ codepair target TP 2 runner ] Forward max rel error vs TP 1: %.2e\n",
              max_diff / max_ref);
}

}  // namespace
}  // namespace specd
