// The Verify stage's implementations on the CPU runner, against HF transformers' greedy
// continuation of the codepair draft model (golden.json; the verifiers are model-agnostic, and
// the draft is the smaller model): a plain step draws the golden token; the golden continuation
// as drafts is accepted whole with the golden bonus token; a wrong draft is rejected at its
// position with the golden correction; greedy-on-the-runner and exact-on-the-host agree; each
// verifier refuses what it cannot take.
#include "engine/verification/verifier.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/kv/block_manager.h"
#include "engine/runner/model_runner.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

const std::string kCodepair = std::string(SPECD_SHARED_DIR) + "/models/codepair";

struct Golden {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> greedy_ids;  // HF greedy decoding with the draft model
};

Golden LoadGolden(int index) {
  std::ifstream in(kCodepair + "/golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json g = nlohmann::json::parse(ss.str())["draft"][index];
  return {g["prompt_ids"].get<std::vector<int32_t>>(), g["greedy_ids"].get<std::vector<int32_t>>()};
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

class VerifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RunnerOptions o;
    o.model_dir = kCodepair + "/draft";
    o.device = "cpu";
    o.num_threads = 2;
    o.max_model_len = 1024;
    auto runner = CreateModelRunner(o);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    allocator_ = std::make_unique<BlockAllocator>(runner_->num_kv_blocks());
    golden_ = LoadGolden(0);
    ASSERT_GE(golden_.greedy_ids.size(), 8u);
    table_ = std::make_unique<BlockTable>(runner_->block_size());
    ASSERT_TRUE(table_->EnsureCapacity(1024, *allocator_).ok());
    history_.AddPrompt(golden_.prompt_ids);
  }

  SampleRow Row(const SamplingParams& p) {
    SampleRow row;
    row.chunk = 0;
    row.sampler = &sampler_;
    row.params = &p;
    row.history = &history_;
    return row;
  }

  // Prefills the prompt with a plain step through `v`; the drawn token.
  int32_t Prefill(Verifier& v) {
    const SequenceInput in{golden_.prompt_ids, 0, table_->ids(), false};
    const SampleRow row = Row(greedy_);
    std::vector<Draft> drafts(1);
    EXPECT_TRUE(v.Fits({&row, 1}, drafts));
    std::vector<RowOutcome> out;
    const absl::Status s = v.Verify(VerifyInput{{&in, 1}, {&row, 1}, drafts, {}}, &out);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1) return -1;
    EXPECT_EQ(out[0].num_drafts, 0);
    EXPECT_EQ(out[0].tokens.size(), 1u);
    return out[0].tokens.empty() ? -1 : out[0].tokens[0].id;
  }

  // Verifies `draft` after the prompt and the first golden token; the row's outcome.
  RowOutcome VerifyDraft(Verifier& v, const std::vector<int32_t>& draft) {
    chunk_.assign(1, golden_.greedy_ids[0]);
    chunk_.insert(chunk_.end(), draft.begin(), draft.end());
    const SequenceInput in{chunk_, static_cast<int32_t>(golden_.prompt_ids.size()), table_->ids(),
                           v.wants_all_logits()};
    const SampleRow row = Row(greedy_);
    std::vector<Draft> drafts(1);
    drafts[0].tokens = draft;
    Acceptor acceptor(greedy_, 7);
    Acceptor* acceptors[1] = {&acceptor};
    EXPECT_TRUE(v.Fits({&row, 1}, drafts));
    std::vector<RowOutcome> out;
    const absl::Status s = v.Verify(VerifyInput{{&in, 1}, {&row, 1}, drafts, acceptors}, &out);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? RowOutcome{} : out[0];
  }

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<BlockTable> table_;
  Golden golden_;
  SamplingParams greedy_ = Greedy();
  Sampler sampler_{greedy_, 1};
  TokenHistory history_;
  std::vector<int32_t> chunk_;
};

std::vector<int32_t> Ids(const RowOutcome& o) {
  std::vector<int32_t> ids;
  for (const SampleResult& t : o.tokens) ids.push_back(t.id);
  return ids;
}

TEST_F(VerifierTest, GreedyOnTheRunnerAcceptsTheGoldenContinuationAndCorrectsAWrongDraft) {
  GreedyVerifier v(runner_.get());
  EXPECT_FALSE(v.wants_all_logits());
  EXPECT_EQ(Prefill(v), golden_.greedy_ids[0]);
  const std::vector<int32_t>& g = golden_.greedy_ids;
  const RowOutcome all = VerifyDraft(v, {g[1], g[2], g[3], g[4]});
  EXPECT_EQ(all.num_drafts, 4);
  EXPECT_EQ(all.num_accepted, 4);
  EXPECT_EQ(Ids(all), (std::vector<int32_t>{g[1], g[2], g[3], g[4], g[5]}));  // + bonus
  const int32_t wrong = (g[3] + 1) % runner_->config().vocab_size;
  const RowOutcome cut = VerifyDraft(v, {g[1], g[2], wrong, g[4]});
  EXPECT_EQ(cut.num_accepted, 2);
  EXPECT_EQ(Ids(cut), (std::vector<int32_t>{g[1], g[2], g[3]}));  // the correction
}

TEST_F(VerifierTest, ExactOnTheHostAgreesWithTheGoldenAndTheRunner) {
  HostVerifier v(runner_.get());
  EXPECT_TRUE(v.wants_all_logits());
  EXPECT_EQ(Prefill(v), golden_.greedy_ids[0]);
  const std::vector<int32_t>& g = golden_.greedy_ids;
  const RowOutcome all = VerifyDraft(v, {g[1], g[2], g[3], g[4], g[5]});
  EXPECT_EQ(all.num_accepted, 5);
  EXPECT_EQ(Ids(all), (std::vector<int32_t>{g[1], g[2], g[3], g[4], g[5], g[6]}));
  const RowOutcome first = VerifyDraft(v, {(g[1] + 5) % 100, g[2]});
  EXPECT_EQ(first.num_drafts, 2);
  EXPECT_EQ(first.num_accepted, 0);
  EXPECT_EQ(Ids(first), (std::vector<int32_t>{g[1]}));
}

TEST_F(VerifierTest, EachVerifierRefusesWhatItCannotTake) {
  GreedyVerifier greedy(runner_.get());
  SampledVerifier sampled(runner_.get());
  HostVerifier host(runner_.get());
  SamplingParams hot;
  hot.temperature = 1.0f;
  SampleRow row = Row(hot);
  std::vector<Draft> drafts(1);
  // A plain sampled row: any verifier that runs at all.
  EXPECT_TRUE(greedy.Fits({&row, 1}, drafts));
  EXPECT_TRUE(host.Fits({&row, 1}, drafts));
  // A drafted sampled row: not greedy; the CPU runner keeps no probabilities on a device.
  drafts[0].tokens = {golden_.greedy_ids[1]};
  EXPECT_FALSE(greedy.Fits({&row, 1}, drafts));
  EXPECT_FALSE(sampled.Fits({&row, 1}, drafts));
  EXPECT_TRUE(host.Fits({&row, 1}, drafts));
  // Host verification of a drafted chunk that returns only its last logits row.
  chunk_ = {golden_.greedy_ids[0], golden_.greedy_ids[1]};
  const SequenceInput in{chunk_, static_cast<int32_t>(golden_.prompt_ids.size()), table_->ids(),
                         false};
  Acceptor acceptor(hot, 3);
  Acceptor* acceptors[1] = {&acceptor};
  std::vector<RowOutcome> out;
  const absl::Status s = host.Verify(VerifyInput{{&in, 1}, {&row, 1}, drafts, acceptors}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Drafts for a different number of rows.
  std::vector<Draft> two(2);
  EXPECT_EQ(greedy.Verify(VerifyInput{{&in, 1}, {&row, 1}, two, {}}, &out).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
