// DraftModelSpeculator on the codepair draft (CPU runner): its greedy drafts reproduce HF
// transformers' greedy continuation of the draft model (golden.json), across rounds whose
// drafts were partly rejected (its KV rolled back) or all accepted; a pool too small for a
// sequence yields no drafts and no leak; sampled drafts come with their distribution.
#include "engine/spec/draft_model.h"

#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

const std::string kCodepair = std::string(SPECD_SHARED_DIR) + "/models/codepair";

struct Golden {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> greedy_ids;  // 48 tokens of HF greedy decoding with the draft model
};

Golden LoadDraftGolden(int index) {
  std::ifstream in(kCodepair + "/golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json g = nlohmann::json::parse(ss.str())["draft"][index];
  return {g["prompt_ids"].get<std::vector<int32_t>>(), g["greedy_ids"].get<std::vector<int32_t>>()};
}

std::unique_ptr<DraftModelSpeculator> MakeDraft(int64_t kv_cache_bytes = 0) {
  RunnerOptions o;
  o.model_dir = kCodepair + "/draft";
  o.device = "cpu";
  o.num_threads = 2;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_model_len = 1024;
  auto runner = CreateModelRunner(o);
  EXPECT_TRUE(runner.ok()) << runner.status();
  auto draft = DraftModelSpeculator::Create(*std::move(runner), 8192, 64);
  EXPECT_TRUE(draft.ok()) << draft.status();
  return *std::move(draft);
}

class DraftModelTest : public ::testing::Test {
 protected:
  // Proposes up to k drafts for one sequence with the given committed tokens.
  std::vector<int32_t> Propose(DraftModelSpeculator& draft, uint64_t id,
                               const std::vector<int32_t>& tokens, int32_t k) {
    history_ = TokenHistory();
    history_.AddPrompt(tokens);
    DraftInput in;
    in.seq_id = id;
    in.tokens = tokens;
    in.num_draft_tokens = k;
    in.params = &params_;
    in.history = &history_;
    std::vector<Draft> out;
    EXPECT_TRUE(draft.Propose(std::span<const DraftInput>(&in, 1), &out).ok());
    EXPECT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].probs.empty());  // greedy: no q rows
    return out[0].tokens;
  }

  SamplingParams params_ = [] {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }();
  TokenHistory history_;
};

std::vector<int32_t> Concat(std::vector<int32_t> a, std::span<const int32_t> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(DraftModelTest, GreedyDraftsFollowHfGoldenAcrossRejectionsAndFullAcceptance) {
  auto draft = MakeDraft();
  for (int p : {0, 3, 6}) {
    const Golden g = LoadDraftGolden(p);
    const std::span<const int32_t> golden(g.greedy_ids);
    // Round 1: prefill + 8 drafts.
    EXPECT_EQ(Propose(*draft, p, g.prompt_ids, 8),
              std::vector<int32_t>(golden.begin(), golden.begin() + 8))
        << "prompt " << p;
    // Round 2: the target accepted 3 and emitted the draft's 4th as its own token (so the
    // draft KV of drafts 4..7 is rolled back and recomputed): drafts continue from there.
    std::vector<int32_t> tokens = Concat(g.prompt_ids, golden.subspan(0, 4));
    EXPECT_EQ(Propose(*draft, p, tokens, 6),
              std::vector<int32_t>(golden.begin() + 4, golden.begin() + 10))
        << "prompt " << p;
    // Round 3: all 6 accepted plus a bonus token: two tokens to catch up.
    tokens = Concat(g.prompt_ids, golden.subspan(0, 11));
    EXPECT_EQ(Propose(*draft, p, tokens, 5),
              std::vector<int32_t>(golden.begin() + 11, golden.begin() + 16))
        << "prompt " << p;
  }
  EXPECT_EQ(draft->num_live_sequences(), 3);
  const int32_t total = draft->runner().num_kv_blocks();
  for (uint64_t id : {0, 3, 6}) draft->Release(id);
  EXPECT_EQ(draft->num_free_blocks(), total);
  EXPECT_EQ(draft->num_live_sequences(), 0);
}

TEST_F(DraftModelTest, RejectedTokenReplacedByTheTargetsRollsBackTheDraftKv) {
  auto draft = MakeDraft();
  const Golden g = LoadDraftGolden(1);
  const std::span<const int32_t> golden(g.greedy_ids);
  ASSERT_EQ(Propose(*draft, 1, g.prompt_ids, 4),
            std::vector<int32_t>(golden.begin(), golden.begin() + 4));
  // The target rejected the first draft and chose another token: the draft's result must be
  // what a fresh draft model computes for the new tokens.
  const int32_t other = golden[0] == 17 ? 18 : 17;
  std::vector<int32_t> tokens = g.prompt_ids;
  tokens.push_back(other);
  const std::vector<int32_t> after_rollback = Propose(*draft, 1, tokens, 6);
  auto fresh = MakeDraft();
  EXPECT_EQ(after_rollback, Propose(*fresh, 1, tokens, 6));
  EXPECT_EQ(after_rollback.size(), 6u);
}

TEST_F(DraftModelTest, NoDraftsWhenTheKvPoolCannotHoldTheSequence) {
  // 1536 bytes of KV per token (3 layers, 1 KV head, head_dim 64, f32 K and V): a 1 MiB pool
  // is 682 tokens, 42 blocks of 16; max_model_len 1024 needs 64, so the runner rounds up to one
  // max_model_len sequence. Fill it with a long sequence, then a second one cannot fit.
  auto draft = MakeDraft(1 << 20);
  const int32_t total = draft->runner().num_kv_blocks();
  std::vector<int32_t> long_seq(16 * total - 8, 100);
  std::iota(long_seq.begin(), long_seq.end(), 10);
  EXPECT_EQ(Propose(*draft, 1, long_seq, 4).size(), 4u);
  const std::vector<int32_t> other = LoadDraftGolden(0).prompt_ids;
  EXPECT_TRUE(Propose(*draft, 2, other, 4).empty());
  draft->Release(1);
  EXPECT_EQ(Propose(*draft, 2, other, 4).size(), 4u);  // fits once the first is gone
  draft->Release(2);
  EXPECT_EQ(draft->num_free_blocks(), total);
}

TEST_F(DraftModelTest, SampledDraftsComeWithTheDistributionTheyWereDrawnFrom) {
  auto draft = MakeDraft();
  const Golden g = LoadDraftGolden(2);
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  sampled.top_k = 20;
  TokenHistory history;
  history.AddPrompt(g.prompt_ids);
  DraftInput in;
  in.seq_id = 9;
  in.tokens = g.prompt_ids;
  in.num_draft_tokens = 5;
  in.params = &sampled;
  in.history = &history;
  in.seed = 1234;
  std::vector<Draft> out;
  ASSERT_TRUE(draft->Propose(std::span<const DraftInput>(&in, 1), &out).ok());
  ASSERT_EQ(out[0].tokens.size(), 5u);
  ASSERT_EQ(out[0].probs.size(), 5u * 8192);
  for (int j = 0; j < 5; ++j) {
    std::span<const float> q(out[0].probs.data() + j * 8192, 8192);
    double sum = 0;
    int nonzero = 0;
    for (float v : q) {
      sum += v;
      nonzero += v > 0;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << j;
    EXPECT_LE(nonzero, 20) << j;  // top_k 20
    EXPECT_GT(q[out[0].tokens[j]], 0.0f) << j;
  }
}

TEST(DraftModelCreateTest, RejectsADraftWithAnotherVocabulary) {
  RunnerOptions o;
  o.model_dir = kCodepair + "/draft";
  o.device = "cpu";
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok());
  auto draft = DraftModelSpeculator::Create(*std::move(runner), 32000, 64);
  ASSERT_FALSE(draft.ok());
  EXPECT_EQ(draft.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
