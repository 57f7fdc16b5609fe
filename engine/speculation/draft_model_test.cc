// DraftModelSpeculator on the codepair draft (CPU runner): its greedy drafts reproduce HF
// transformers' greedy continuation of the draft model (golden.json), across rounds whose
// drafts were partly rejected (its KV rolled back) or all accepted; OnVerified rolls the KV
// back to the accepted drafts at once, and the next drafts stay a fresh model's; a pool too
// small for a sequence yields no drafts and no leak; sampled drafts come with their
// distribution. SSD's
// additions: forked and adopted sequences draft exactly as fresh ones (shared KV blocks never
// corrupted, reference counts balanced), candidates follow the logits / drawn-from row, and
// Saguaro sampling draws from (and returns) the down-weighted row.
#include "engine/speculation/draft_model.h"

#include <algorithm>
#include <cmath>
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

RunnerOptions DraftRunnerOptions(int64_t kv_cache_bytes = 0) {
  RunnerOptions o;
  o.model_dir = kCodepair + "/draft";
  o.device = "cpu";
  o.num_threads = 2;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_model_len = 1024;
  return o;
}

std::unique_ptr<DraftModelSpeculator> MakeDraft(int64_t kv_cache_bytes = 0) {
  auto runner = CreateModelRunner(DraftRunnerOptions(kv_cache_bytes));
  EXPECT_TRUE(runner.ok()) << runner.status();
  auto draft = DraftModelSpeculator::Create(*std::move(runner), 8192, 64);
  EXPECT_TRUE(draft.ok()) << draft.status();
  return *std::move(draft);
}

class DraftModelTest : public ::testing::Test {
 protected:
  using CacheOptions = DraftModelSpeculator::CacheDraftOptions;

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

  // Proposes for several sequences in one call: ids[i] with tokens[i], k drafts each, the
  // params and seed of `options` (else the fixture's greedy) and SSD's `cache` options.
  std::vector<Draft> ProposeMany(DraftModelSpeculator& draft, const std::vector<uint64_t>& ids,
                                 const std::vector<std::vector<int32_t>>& tokens, int32_t k,
                                 const DraftInput& options = {}, const CacheOptions& cache = {}) {
    histories_.assign(ids.size(), TokenHistory());
    std::vector<DraftInput> inputs(ids.size(), options);
    for (size_t i = 0; i < ids.size(); ++i) {
      histories_[i].AddPrompt(tokens[i]);
      inputs[i].seq_id = ids[i];
      inputs[i].tokens = tokens[i];
      inputs[i].num_draft_tokens = k;
      if (inputs[i].params == nullptr) inputs[i].params = &params_;
      inputs[i].history = &histories_[i];
    }
    const std::vector<CacheOptions> caches(ids.size(), cache);
    std::vector<Draft> out;
    EXPECT_TRUE(draft.Propose(inputs, caches, &out).ok());
    EXPECT_EQ(out.size(), ids.size());
    return out;
  }
  Draft ProposeOne(DraftModelSpeculator& draft, uint64_t id, const std::vector<int32_t>& tokens,
                   int32_t k, const DraftInput& options = {}, const CacheOptions& cache = {}) {
    return ProposeMany(draft, {id}, {tokens}, k, options, cache)[0];
  }

  // Options of a temperature-1 input with its own seed.
  DraftInput Sampled(uint64_t seed) {
    DraftInput options;
    options.params = &sampled_;
    options.seed = seed;
    return options;
  }

  SamplingParams params_ = [] {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }();
  SamplingParams sampled_ = [] {
    SamplingParams p;
    p.temperature = 1.0f;
    return p;
  }();
  TokenHistory history_;
  std::vector<TokenHistory> histories_;
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

// `auto` speculation pauses the draft model (plain or n-gram rounds) and resumes it later: the
// first round after a pause catches up every token committed meanwhile in one chunk, so its
// drafts are HF's greedy continuation again (acceptance does not collapse).
TEST_F(DraftModelTest, ResumedAfterRoundsItDidNotDraftItCatchesUpAndDraftsTheGolden) {
  auto draft = MakeDraft();
  const Golden g = LoadDraftGolden(2);
  const std::span<const int32_t> golden(g.greedy_ids);
  ASSERT_EQ(Propose(*draft, 2, g.prompt_ids, 4),
            std::vector<int32_t>(golden.begin(), golden.begin() + 4));
  VerifiedRound round;
  round.seq_id = 2;
  round.num_drafts = 4;
  round.num_accepted = 1;
  round.next_token = golden[1];
  draft->OnVerified(std::span<const VerifiedRound>(&round, 1));
  // 30 tokens committed by rounds the draft model took no part in.
  const std::vector<int32_t> tokens = Concat(g.prompt_ids, golden.subspan(0, 30));
  EXPECT_EQ(Propose(*draft, 2, tokens, 4),
            std::vector<int32_t>(golden.begin() + 30, golden.begin() + 34));
  // Its KV holds the context and the decoded drafts d_1..d_3.
  EXPECT_EQ(draft->kv_length(2), static_cast<int32_t>(tokens.size()) + 3);
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

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

// A token other than t: the target's correction where it rejected the draft t.
int32_t Other(int32_t t) { return t == 17 ? 18 : 17; }

constexpr int32_t kBlockSize = 16;  // RunnerOptions' default
constexpr int32_t kVocab = 8192;

// The engine tells each outcome (OnVerified): the KV is rolled back at once to the context and
// the accepted drafts the draft decoded (d_k never is), freeing the rejected drafts' blocks
// before the next Propose, whose drafts equal a fresh draft model's.
TEST_F(DraftModelTest, OnVerifiedRollsTheKvBackToTheAcceptedDraftsAtOnce) {
  auto draft = MakeDraft();
  auto fresh = MakeDraft();
  const int32_t total = draft->num_free_blocks();
  std::vector<int32_t> tokens = Prefix(LoadDraftGolden(1).prompt_ids, 30);
  const std::vector<int32_t> d = Propose(*draft, 1, tokens, 8);
  ASSERT_EQ(d.size(), 8u);
  ASSERT_EQ(draft->kv_length(1), 30 + 7);  // the context and d_1..d_7: 3 blocks
  const int32_t free_before = draft->num_free_blocks();
  // d_1 accepted, then the target's correction for d_2.
  const VerifiedRound one{.seq_id = 1,
                          .num_drafts = 8,
                          .num_accepted = 1,
                          .next_token = Other(d[1]),
                          .scores = {},
                          .num_scored = 0};
  draft->OnVerified({&one, 1});
  EXPECT_EQ(draft->kv_length(1), 31);
  EXPECT_EQ(draft->num_free_blocks(), free_before + 1) << "positions 32..36 held a block";
  draft->OnVerified({&one, 1});  // told again before a new Propose: nothing more goes
  EXPECT_EQ(draft->kv_length(1), 31);
  tokens = Concat(tokens, std::span<const int32_t>(d).first(1));
  tokens.push_back(one.next_token);
  const std::vector<int32_t> d2 = Propose(*draft, 1, tokens, 6);
  EXPECT_EQ(d2, Propose(*fresh, 100, tokens, 6));
  // All 6 accepted and a bonus token: the KV keeps d_1..d_5, all it decoded.
  ASSERT_EQ(draft->kv_length(1), 32 + 5);
  const VerifiedRound all{.seq_id = 1,
                          .num_drafts = 6,
                          .num_accepted = 6,
                          .next_token = 42,
                          .scores = {},
                          .num_scored = 0};
  draft->OnVerified({&all, 1});
  EXPECT_EQ(draft->kv_length(1), 32 + 5);
  tokens = Concat(tokens, d2);
  tokens.push_back(all.next_token);
  const std::vector<int32_t> d3 = Propose(*draft, 1, tokens, 4);
  EXPECT_EQ(d3, Propose(*fresh, 101, tokens, 4));
  // None accepted: only the context stays; unknown sequences are ignored.
  const VerifiedRound rounds[] = {{.seq_id = 1,
                                   .num_drafts = 4,
                                   .num_accepted = 0,
                                   .next_token = Other(d3[0]),
                                   .scores = {},
                                   .num_scored = 0},
                                  {.seq_id = 77,
                                   .num_drafts = 4,
                                   .num_accepted = 2,
                                   .next_token = 5,
                                   .scores = {},
                                   .num_scored = 0}};
  draft->OnVerified(rounds);
  EXPECT_EQ(draft->kv_length(1), static_cast<int32_t>(tokens.size()));
  EXPECT_EQ(draft->kv_length(77), 0);
  tokens.push_back(rounds[0].next_token);
  EXPECT_EQ(Propose(*draft, 1, tokens, 4), Propose(*fresh, 102, tokens, 4));
  draft->Release(1);
  EXPECT_EQ(draft->num_free_blocks(), total);
}

TEST_F(DraftModelTest, ForkedChildDraftsAsAFreshSequenceAndLeavesTheParentAlone) {
  auto draft = MakeDraft();
  auto fresh = MakeDraft();  // every sequence new: no rollback, no sharing
  auto plain = MakeDraft();  // the parent's rounds without forks
  const int32_t total = draft->num_free_blocks();
  const std::vector<int32_t> prompt = LoadDraftGolden(1).prompt_ids;
  uint64_t fresh_id = 100;
  // (context length, k): the child forks at len + k, block-aligned (32, 48) or not.
  const std::vector<std::pair<size_t, int32_t>> cases = {{32, 0}, {32, 2}, {37, 0},
                                                         {30, 2}, {45, 3}, {47, 5}};
  for (const auto& [len, k] : cases) {
    SCOPED_TRACE(testing::Message() << "context " << len << ", k " << k);
    const std::vector<int32_t> context = Prefix(prompt, len);
    const std::vector<int32_t> d = Propose(*draft, 1, context, 6);  // KV: context + d_1..d_5
    ASSERT_EQ(d, Propose(*plain, 1, context, 6));
    // The outcome "d_1..d_k accepted, then t* != d_{k+1}" on a fork.
    const int32_t fork_point = static_cast<int32_t>(len) + k;
    const int32_t before = draft->num_free_blocks();
    ASSERT_TRUE(draft->Fork(1, 2, fork_point).ok());
    // The partial block below the fork point is copied into a block of the child's own (the CPU
    // runner copies KV slots); the full ones are shared.
    EXPECT_EQ(before - draft->num_free_blocks(), fork_point % kBlockSize != 0 ? 1 : 0);
    std::vector<int32_t> child = Concat(context, std::span<const int32_t>(d).first(k));
    child.push_back(Other(d[k]));
    EXPECT_EQ(Propose(*draft, 2, child, 5), Propose(*fresh, fresh_id++, child, 5));
    // The child allocated only what lies past the shared blocks.
    const int32_t child_blocks =
        BlockTable::BlocksFor(static_cast<int32_t>(child.size()) + 4, kBlockSize);
    EXPECT_EQ(before - draft->num_free_blocks(), child_blocks - fork_point / kBlockSize);
    draft->Release(2);
    EXPECT_EQ(draft->num_free_blocks(), before);
    // The outcome that happened: d_1..d_3 accepted, bonus d_4; the parent is as if unforked.
    const std::vector<int32_t> next = Concat(context, std::span<const int32_t>(d).first(4));
    EXPECT_EQ(Propose(*draft, 1, next, 5), Propose(*plain, 1, next, 5));
    draft->Release(1);
    plain->Release(1);
  }
  EXPECT_EQ(draft->num_free_blocks(), total);
  EXPECT_EQ(draft->num_live_sequences(), 0);
}

TEST_F(DraftModelTest, ParentAndLiveChildRollingBackIntoASharedBlockStayIntact) {
  // Breaks the caller's contract on purpose (the parent drafts again while its child lives, and
  // both roll back into a block they share): neither may write into the shared block.
  auto draft = MakeDraft();
  auto fresh = MakeDraft();
  const int32_t total = draft->num_free_blocks();
  const std::vector<int32_t> prompt = LoadDraftGolden(2).prompt_ids;
  const std::vector<int32_t> context = Prefix(prompt, 37);
  const std::vector<int32_t> d = Propose(*draft, 1, context, 6);  // KV: 42 tokens, 2 full blocks
  ASSERT_TRUE(draft->Fork(1, 2).ok());                            // shares positions 0..31
  std::vector<int32_t> child = Prefix(prompt, 20);                // rolls back into block 1
  child.push_back(Other(prompt[20]));
  const std::vector<int32_t> c = Propose(*draft, 2, child, 5);
  EXPECT_EQ(c, Propose(*fresh, 100, child, 5));
  std::vector<int32_t> parent = Prefix(prompt, 25);  // also inside block 1, which the child holds
  parent.push_back(Other(prompt[25]));
  EXPECT_EQ(Propose(*draft, 1, parent, 5), Propose(*fresh, 101, parent, 5));
  // Each continues from its own KV.
  child = Concat(child, std::span<const int32_t>(c).first(3));
  EXPECT_EQ(Propose(*draft, 2, child, 4), Propose(*fresh, 102, child, 4));
  parent = Concat(context, std::span<const int32_t>(d).first(2));
  EXPECT_EQ(Propose(*draft, 1, parent, 4), Propose(*fresh, 103, parent, 4));
  draft->Release(1);
  draft->Release(2);
  EXPECT_EQ(draft->num_free_blocks(), total);
}

TEST_F(DraftModelTest, AdoptedChildContinuesAsTheParentAndBlocksBalance) {
  auto draft = MakeDraft();
  auto fresh = MakeDraft();
  const int32_t total = draft->num_free_blocks();
  const std::vector<int32_t> context = Prefix(LoadDraftGolden(3).prompt_ids, 40);
  const std::vector<int32_t> d = Propose(*draft, 1, context, 6);
  // Three branches (k = 0, 1, 2), drafted together in one batched Propose.
  std::vector<uint64_t> ids;
  std::vector<std::vector<int32_t>> branches;
  for (int32_t k = 0; k < 3; ++k) {
    ids.push_back(10 + k);
    branches.push_back(Concat(context, std::span<const int32_t>(d).first(k)));
    branches.back().push_back(Other(d[k]));
    ASSERT_TRUE(draft->Fork(1, ids.back(), 40 + k).ok());
  }
  const std::vector<Draft> drafted = ProposeMany(*draft, ids, branches, 5);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(drafted[i].tokens, Propose(*fresh, 100 + i, branches[i], 5)) << "branch " << i;
  }
  // The verifier's outcome was branch 1's: it becomes sequence 1.
  ASSERT_TRUE(draft->Adopt(1, 11).ok());
  EXPECT_EQ(draft->num_live_sequences(), 3);  // 1 (was 11), 10, 12
  EXPECT_EQ(draft->Adopt(1, 11).code(), absl::StatusCode::kNotFound);
  // Its drafts: 2 accepted, then the bonus token its third draft happened to predict.
  const std::vector<int32_t> next =
      Concat(branches[1], std::span<const int32_t>(drafted[1].tokens).first(3));
  EXPECT_EQ(Propose(*draft, 1, next, 5), Propose(*fresh, 200, next, 5));
  // The errors.
  EXPECT_EQ(draft->Fork(99, 20).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(draft->Fork(1, 10).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(draft->Fork(1, 1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(draft->Fork(1, 20, -1).code(), absl::StatusCode::kInvalidArgument);
  // Forks of forks, an adopt of a grandchild, releases in any order: every reference returns.
  ASSERT_TRUE(draft->Fork(1, 20).ok());
  ASSERT_TRUE(draft->Fork(20, 21, 45).ok());
  ASSERT_TRUE(draft->Adopt(10, 21).ok());
  for (uint64_t id : {12, 1, 10, 20}) draft->Release(id);
  EXPECT_EQ(draft->num_live_sequences(), 0);
  EXPECT_EQ(draft->num_free_blocks(), total);
}

// Ids sorted by (score descending, id ascending): an independent ranking to check TopF's use.
std::vector<int32_t> Ranked(std::span<const float> scores, size_t n) {
  std::vector<int32_t> ids(scores.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  ids.resize(n);
  return ids;
}

TEST_F(DraftModelTest, GreedyCandidatesStartWithTheDraftAndFollowTheLogits) {
  constexpr int32_t kF = 6, kK = 4;
  auto draft = MakeDraft();
  const Golden g = LoadDraftGolden(1);  // a 64-token prompt: one catch-up chunk, like Forward's
  CacheOptions cache;
  cache.num_candidates = kF;
  const Draft out = ProposeOne(*draft, 1, g.prompt_ids, kK, {}, cache);
  // The drafts are exactly the plain (runner argmax) drafts, which follow HF's greedy decoding.
  EXPECT_EQ(out.tokens, std::vector<int32_t>(g.greedy_ids.begin(), g.greedy_ids.begin() + kK));
  EXPECT_EQ(out.tokens, Propose(*draft, 2, g.prompt_ids, kK));
  EXPECT_TRUE(out.probs.empty());
  ASSERT_EQ(out.candidates.size(), size_t{kK} * kF);
  for (int32_t j = 0; j < kK; ++j) {
    std::vector<int32_t> row(out.candidates.begin() + j * kF,
                             out.candidates.begin() + (j + 1) * kF);
    EXPECT_EQ(row[0], out.tokens[j]) << j;
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "distinct, row " << j;
  }
  // Position 1's row against the logits a plain runner computes for the same context.
  auto runner = CreateModelRunner(DraftRunnerOptions());
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> blocks(BlockTable::BlocksFor(64, kBlockSize));
  std::iota(blocks.begin(), blocks.end(), 0);
  SequenceInput s;
  s.tokens = g.prompt_ids;
  s.block_table = blocks;
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->Forward(std::span<const SequenceInput>(&s, 1), &logits).ok());
  ASSERT_EQ(logits.size(), size_t{kVocab});
  const std::vector<int32_t> row0(out.candidates.begin(), out.candidates.begin() + kF);
  EXPECT_EQ(row0, Ranked(logits, kF));
  for (int32_t i = 0; i + 1 < kF; ++i) EXPECT_GE(logits[row0[i]], logits[row0[i + 1]]);
}

// A runner that draws at most two rows per Step (as a GPU runner sized for fewer sequences than
// SSD has branches), and counts its passes.
class TwoRowRunner : public ModelRunner {
 public:
  explicit TwoRowRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  std::string device_name() const override { return inner_->device_name(); }
  int32_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int32_t block_size() const override { return inner_->block_size(); }
  int32_t max_model_len() const override { return inner_->max_model_len(); }
  int32_t max_sample_rows() const override { return 2; }
  absl::Status Run(const StepRequest& request, StepResult* result) override {
    switch (request.kind) {
      case StepKind::kStep:
        ++passes;
        if (request.batch.size() > 2) return absl::InvalidArgumentError("more sequences than rows");
        return inner_->Run(request, result);
      case StepKind::kForward:
        ++passes;
        return inner_->Run(request, result);
      case StepKind::kGreedyVerify:
        return GreedyVerifyByStep(request, result);
      case StepKind::kSampledVerify:
      case StepKind::kDraft:
      case StepKind::kForwardCandidates:
        break;
    }
    return Unsupported(request.kind);
  }
  int passes = 0;

 private:
  std::unique_ptr<ModelRunner> inner_;
};

// More sequences than one Step draws: each pass takes at most max_sample_rows of them, the rest
// run in the next pass, and every sequence drafts exactly what it drafts alone.
TEST_F(DraftModelTest, PassesHoldAtMostMaxSampleRowsSequences) {
  constexpr int32_t kK = 3;
  auto inner = CreateModelRunner(DraftRunnerOptions());
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto two = std::make_unique<TwoRowRunner>(*std::move(inner));
  TwoRowRunner* runner = two.get();
  auto draft = DraftModelSpeculator::Create(std::move(two), kVocab, 2048);
  ASSERT_TRUE(draft.ok()) << draft.status();
  std::vector<uint64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(10 + i);
    prompts.push_back(LoadDraftGolden(i % 2).prompt_ids);
    prompts.back().push_back(100 + i);  // five different contexts
  }
  CacheOptions cache;
  cache.num_candidates = 4;  // the runner's greedy path, with candidates
  const std::vector<Draft> together = ProposeMany(**draft, ids, prompts, kK, {}, cache);
  EXPECT_EQ(runner->passes, 3 * kK) << "5 sequences, 2 per pass: 3 passes per drafted position";
  auto alone = MakeDraft();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Draft one = ProposeOne(*alone, 100 + i, prompts[i], kK, {}, cache);
    EXPECT_EQ(together[i].tokens, one.tokens) << i;
    EXPECT_EQ(together[i].candidates, one.candidates) << i;
  }
}

TEST_F(DraftModelTest, SampledCandidatesFollowTheRowTheDraftWasDrawnFrom) {
  constexpr int32_t kF = 5, kK = 3;
  auto draft = MakeDraft();
  CacheOptions cache;
  cache.num_candidates = kF;
  const Draft out = ProposeOne(*draft, 1, LoadDraftGolden(4).prompt_ids, kK, Sampled(7), cache);
  ASSERT_EQ(out.tokens.size(), size_t{kK});
  ASSERT_EQ(out.probs.size(), size_t{kK} * kVocab);
  ASSERT_EQ(out.candidates.size(), size_t{kK} * kF);
  for (int32_t j = 0; j < kK; ++j) {
    const std::span<const float> q(out.probs.data() + size_t(j) * kVocab, kVocab);
    const std::vector<int32_t> row(out.candidates.begin() + j * kF,
                                   out.candidates.begin() + (j + 1) * kF);
    EXPECT_EQ(row, Ranked(q, kF)) << j;
    EXPECT_GT(q[row[0]], q[row[kF - 1]]) << j;
  }
}

TEST_F(DraftModelTest, SaguaroSamplingDrawsFromAndReturnsTheDownweightedRow) {
  constexpr float kC = 0.2f;
  constexpr int32_t kDraws = 800;
  auto draft = MakeDraft();
  const std::vector<int32_t> context = Prefix(LoadDraftGolden(5).prompt_ids, 16);
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  DraftInput plain;
  plain.params = &sampled;
  CacheOptions saguaro;
  saguaro.saguaro_fan_out = 2;
  saguaro.saguaro_c = kC;
  // q at the first position, and its top 2.
  const Draft q_draft = ProposeOne(*draft, 1, context, 1, plain);
  ASSERT_EQ(q_draft.probs.size(), size_t{kVocab});
  const std::vector<float>& q = q_draft.probs;
  const std::vector<int32_t> top = Ranked(q, 2);
  const double m = double(q[top[0]]) + q[top[1]];
  ASSERT_GT(m, 0.2);  // the context makes the test sensitive: neither tiny nor almost all mass
  ASSERT_LT(m, 0.9);
  // The returned row is q' = q with the top 2 scaled by C, renormalised.
  const Draft s_draft = ProposeOne(*draft, 2, context, 1, plain, saguaro);
  ASSERT_EQ(s_draft.probs.size(), size_t{kVocab});
  const double z = 1.0 - (1.0 - kC) * m;
  double sum = 0;
  for (int32_t t = 0; t < kVocab; ++t) {
    const bool cached = t == top[0] || t == top[1];
    EXPECT_NEAR(s_draft.probs[t], (cached ? kC : 1.0) * q[t] / z, 1e-6) << t;
    sum += s_draft.probs[t];
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Drawn from q': the top 2 come up C-scaled (in odds) against plain draws.
  auto top2_share = [&](const CacheOptions& cache) {
    DraftInput options = plain;
    int32_t hits = 0;
    for (int32_t i = 0; i < kDraws; ++i) {
      options.seed = uint64_t(i);  // a new sequence per draw, each with its own seed
      const int32_t t = ProposeOne(*draft, 1000, context, 1, options, cache).tokens.at(0);
      draft->Release(1000);
      hits += t == top[0] || t == top[1];
    }
    return double(hits) / kDraws;
  };
  const double p_plain = m, p_saguaro = kC * m / z;
  const double f_plain = top2_share({}), f_saguaro = top2_share(saguaro);
  EXPECT_NEAR(f_plain, p_plain, 5 * std::sqrt(p_plain * (1 - p_plain) / kDraws));
  EXPECT_NEAR(f_saguaro, p_saguaro, 5 * std::sqrt(p_saguaro * (1 - p_saguaro) / kDraws));
  const double odds_ratio = (f_saguaro / (1 - f_saguaro)) / (f_plain / (1 - f_plain));
  EXPECT_NEAR(odds_ratio, kC, 0.1) << "plain " << f_plain << ", saguaro " << f_saguaro;
  // Greedy requests ignore it.
  const Draft g = ProposeOne(*draft, 3, context, 3, {}, saguaro);
  EXPECT_TRUE(g.probs.empty());
  EXPECT_EQ(g.tokens, Propose(*draft, 4, context, 3));
}

// SSD's cache on a parallel draft (the project's PARD-style codepair draft): a greedy round's
// drafts are the parallel drafts without the cache's options, and each position's candidates
// start with its draft and rank the logits of that position's row: the row of the context's last
// token + j over the context and the K - 1 masks. Sampled rows with Saguaro sampling come with
// the down-weighted rows they were drawn from.
TEST_F(DraftModelTest, ParallelDraftsServeTheCacheInOnePass) {
  constexpr int32_t kF = 4, kK = 3;
  const std::string pard = std::string(SPECD_SOURCE_DIR) + "/models/codepair/pard";
  auto make = [&] {
    RunnerOptions o = DraftRunnerOptions();
    o.model_dir = pard;
    auto runner = CreateModelRunner(o);
    EXPECT_TRUE(runner.ok()) << runner.status();
    auto draft = DraftModelSpeculator::Create(*std::move(runner), kVocab, 2048);
    EXPECT_TRUE(draft.ok()) << draft.status();
    auto mask = DraftModelSpeculator::ReadMaskToken(pard, kVocab);
    EXPECT_TRUE(mask.ok()) << mask.status();
    (*draft)->set_parallel(*mask);
    return *std::move(draft);
  };
  auto draft = make();
  auto plain = make();
  const std::vector<int32_t> context = Prefix(LoadDraftGolden(2).prompt_ids, 40);
  CacheOptions cache;
  cache.num_candidates = kF;
  const Draft out = ProposeOne(*draft, 1, context, kK, {}, cache);
  EXPECT_EQ(out.tokens, ProposeOne(*plain, 1, context, kK).tokens);
  ASSERT_EQ(out.tokens.size(), size_t{kK});
  ASSERT_EQ(out.candidates.size(), size_t{kK} * kF);
  // The rows of one forward pass over the context and K - 1 masks.
  RunnerOptions o = DraftRunnerOptions();
  o.model_dir = pard;
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> chunk = context;
  const int32_t mask = *DraftModelSpeculator::ReadMaskToken(pard, kVocab);
  chunk.insert(chunk.end(), kK - 1, mask);
  std::vector<int32_t> blocks(
      BlockTable::BlocksFor(static_cast<int32_t>(chunk.size()), kBlockSize));
  std::iota(blocks.begin(), blocks.end(), 0);
  SequenceInput s;
  s.tokens = chunk;
  s.block_table = blocks;
  s.all_logits = true;
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->Forward(std::span<const SequenceInput>(&s, 1), &logits).ok());
  ASSERT_EQ(logits.size(), chunk.size() * kVocab);
  for (int32_t j = 0; j < kK; ++j) {
    const std::span<const float> row(logits.data() + (context.size() - 1 + j) * kVocab, kVocab);
    const std::vector<int32_t> got(out.candidates.begin() + j * kF,
                                   out.candidates.begin() + (j + 1) * kF);
    EXPECT_EQ(got[0], out.tokens[j]) << j;
    EXPECT_EQ(got, Ranked(row, kF)) << j;
  }
  // Sampled, Saguaro: K rows of q, each a distribution, its draft drawn from it.
  CacheOptions saguaro;
  saguaro.num_candidates = kF;
  saguaro.saguaro_fan_out = 2;
  saguaro.saguaro_c = 0.5f;
  const Draft q = ProposeOne(*draft, 2, context, kK, Sampled(11), saguaro);
  ASSERT_EQ(q.tokens.size(), size_t{kK});
  ASSERT_EQ(q.probs.size(), size_t{kK} * kVocab);
  ASSERT_EQ(q.candidates.size(), size_t{kK} * kF);
  for (int32_t j = 0; j < kK; ++j) {
    const std::span<const float> row(q.probs.data() + size_t(j) * kVocab, kVocab);
    EXPECT_NEAR(std::accumulate(row.begin(), row.end(), 0.0), 1.0, 1e-4) << j;
    EXPECT_GT(row[q.tokens[j]], 0.0f) << j;
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
