#include "engine/speculation/ngram.h"

#include <algorithm>
#include <random>
#include <vector>

#include "engine/speculation/draft_replay.h"
#include "engine/speculation/draft_tree.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(NgramLookupTest, ProposesWhatFollowedTheMostRecentEarlierMatch) {
  //                                 0  1  2  3  4  5  6  7  8  9
  const std::vector<int32_t> tokens = {5, 6, 7, 1, 5, 6, 8, 2, 5, 6};
  // Suffix (5, 6) occurred at 0 and 4; the most recent is 4, followed by 8, 2, 5, 6.
  EXPECT_EQ(NgramLookup(tokens, 1, 2, 3), (std::vector<int32_t>{8, 2, 5}));
  EXPECT_EQ(NgramLookup(tokens, 1, 2, 10), (std::vector<int32_t>{8, 2, 5, 6}));
}

TEST(NgramLookupTest, PrefersTheLongestMatchingSuffix) {
  //                                 0  1  2  3  4  5  6  7
  const std::vector<int32_t> tokens = {1, 2, 3, 9, 4, 3, 1, 2};
  // n = 3 (3, 1, 2) never occurred before; n = 2 (1, 2) at 0 -> 3, 9.
  EXPECT_EQ(NgramLookup(tokens, 1, 3, 2), (std::vector<int32_t>{3, 9}));
  // With n fixed at 1, the most recent earlier 2 ... is at 1 as well.
  EXPECT_EQ(NgramLookup(tokens, 1, 1, 2), (std::vector<int32_t>{3, 9}));
}

TEST(NgramLookupTest, NothingWhenNoSuffixRepeatsOrTooShort) {
  EXPECT_TRUE(NgramLookup(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(NgramLookup(std::vector<int32_t>{7}, 1, 3, 4).empty());
  EXPECT_TRUE(NgramLookup(std::vector<int32_t>{}, 1, 3, 4).empty());
  EXPECT_TRUE(NgramLookup(std::vector<int32_t>{3, 3}, 1, 3, 0).empty());
  // min_n = 2 rules out the single-token match (4 at 1).
  EXPECT_TRUE(NgramLookup(std::vector<int32_t>{1, 4, 2, 4}, 2, 3, 4).empty());
}

TEST(NgramLookupTest, RepeatedTokenRunsProposeTheRun) {
  const std::vector<int32_t> tokens = {9, 9, 9, 9};
  // (9, 9, 9) last occurred at 0 (start < 4 - 3), followed by 9.
  EXPECT_EQ(NgramLookup(tokens, 1, 3, 5), (std::vector<int32_t>{9}));
}

TEST(NgramSpeculatorTest, ProposesPerSequenceWithItsOwnK) {
  NgramSpeculator ngram(1, 3);
  const std::vector<int32_t> a = {1, 2, 3, 4, 1, 2};
  const std::vector<int32_t> b = {7, 8, 9};
  std::vector<DraftInput> inputs(2);
  inputs[0].tokens = a;
  inputs[0].num_draft_tokens = 1;
  inputs[1].tokens = b;
  inputs[1].num_draft_tokens = 4;
  std::vector<Draft> drafts;
  ASSERT_TRUE(ngram.Propose(inputs, &drafts).ok());
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_EQ(drafts[0].tokens, std::vector<int32_t>{3});
  EXPECT_TRUE(drafts[0].probs.empty());  // deterministic: q is one-hot
  EXPECT_TRUE(drafts[1].tokens.empty());
}

TEST(DraftTreeBuilderTest, ReplayRewritesChildrenAndKeepsTheSlotsScores) {
  // Vocabulary 16; the recording: the context 0..7, then 9, 4.
  const std::vector<int32_t> recorded = {0, 1, 2, 3, 4, 5, 6, 7, 9, 4};
  const std::span<const int32_t> context = std::span<const int32_t>(recorded).first(8);
  auto replay_with = [&](double alpha) {
    DraftReplayOptions o;
    o.file = "(memory)";
    o.alpha = alpha;
    auto r = DraftReplay::Create(o, 16, {recorded});
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(r);
  };
  const std::unique_ptr<DraftReplay> always = replay_with(1.0), never = replay_with(0.0);
  std::vector<float> logits(16, 0.0f);
  logits[2] = 3;  // the model: 2, then 5, then 9
  logits[5] = 2;
  logits[9] = 1;
  DraftTreeBuilder b, plain;
  b.Reset(/*depth=*/2, /*top_k=*/2, /*max_nodes=*/6);
  plain.Reset(2, 2, 6);
  b.set_replay(always.get(), context);
  b.Expand(-1, logits, {});
  plain.Expand(-1, logits, {});
  ASSERT_EQ(b.num_nodes(), 2);
  // The recorded token first, the model's best after it; each slot keeps the model's score.
  EXPECT_EQ(b.token(0), 9);
  EXPECT_EQ(b.token(1), 2);
  EXPECT_EQ(b.score(0), plain.score(0));
  EXPECT_EQ(b.score(1), plain.score(1));
  EXPECT_EQ(b.NextLevel(), (std::vector<int32_t>{0, 1}));
  b.Expand(0, logits, {});  // on the recording (path 9): 4 comes first
  b.Expand(1, logits, {});  // off it (path 2): the model's own children
  ASSERT_EQ(b.num_nodes(), 6);
  EXPECT_EQ(b.token(2), 4);
  EXPECT_EQ(b.token(3), 2);
  EXPECT_EQ(b.token(4), 2);
  EXPECT_EQ(b.token(5), 5);
  std::vector<int32_t> tokens, parents;
  b.Finish(&tokens, &parents);
  EXPECT_EQ(tokens, (std::vector<int32_t>{9, 2, 4, 2, 2, 5}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, -1, 0, 0, 1, 1}));
  // alpha 0: never among the children, even where the model ranks it first.
  logits[9] = 5;
  b.Reset(2, 2, 6);
  b.set_replay(never.get(), context);
  b.Expand(-1, logits, {});
  ASSERT_EQ(b.num_nodes(), 2);
  EXPECT_NE(b.token(0), 9);
  EXPECT_NE(b.token(1), 9);
  // Reset turns the replay off: the model's children again.
  b.Reset(2, 2, 6);
  b.Expand(-1, logits, {});
  EXPECT_EQ(b.token(0), 9);
  EXPECT_EQ(b.token(1), 2);
}

}  // namespace
}  // namespace specd

namespace specd {
namespace {

TEST(NgramTreeTest, MergesEarlierContinuationsIntoATrie) {
  // "1 2" occurs three times before the end; its continuations are 3 4 5 (most recent), 3 6
  // and 7 8.
  const std::vector<int32_t> tokens = {1, 2, 7, 8, 0, 1, 2, 3, 6, 0, 1, 2, 3, 4, 5, 0, 1, 2};
  std::vector<int32_t> out, parents;
  NgramTree(tokens, 1, 2, /*depth=*/3, /*top_k=*/2, /*max_nodes=*/16, &out, &parents);
  // Breadth first: 3, 7 (the root's children, most recent first); 4, 6 (3's), 8 (7's); then
  // 5 (after 3 4), 0 (after 3 6) and 0 (after 7 8). The n = 1 matches add nothing new.
  EXPECT_EQ(out, (std::vector<int32_t>{3, 7, 4, 6, 8, 5, 0, 0}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, -1, 0, 0, 1, 2, 3, 4}));
  // top_k 1: a chain of the most recent continuation; max_nodes cuts the trie.
  NgramTree(tokens, 1, 2, 3, 1, 16, &out, &parents);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, 1}));
  NgramTree(tokens, 1, 2, 3, 2, 3, &out, &parents);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 5}));
  // Nothing matches: no tree.
  NgramTree(std::vector<int32_t>{1, 2, 3}, 1, 2, 3, 2, 16, &out, &parents);
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(parents.empty());
}

TEST(NgramTreeTest, LargeTriesAreTopologicalAndFollowTheText) {
  // A text of few distinct ids repeats its suffix often: tries of up to 64 nodes.
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(600);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 5);
  std::vector<int32_t> out, parents, path;
  NgramTree(tokens, 1, 3, /*depth=*/8, /*top_k=*/4, /*max_nodes=*/64, &out, &parents);
  ASSERT_EQ(out.size(), 64u);
  ASSERT_EQ(parents.size(), out.size());
  std::vector<int32_t> children(out.size() + 1, 0);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_LT(parents[i], static_cast<int32_t>(i));
    ASSERT_LE(++children[static_cast<size_t>(parents[i] + 1)], 4);
    // Every path is a continuation of some earlier occurrence: it appears in the text.
    path.clear();
    for (int32_t n = static_cast<int32_t>(i); n >= 0; n = parents[n])
      path.insert(path.begin(), out[n]);
    EXPECT_LE(path.size(), 8u);
    EXPECT_NE(std::search(tokens.begin(), tokens.end(), path.begin(), path.end()), tokens.end());
  }
}

TEST(DraftTreeBuilderTest, GrowsTheBestPathsAndKeepsTheBestNodes) {
  DraftTreeBuilder b;
  b.Reset(/*depth=*/3, /*top_k=*/2, /*max_nodes=*/4);
  // Vocabulary 4. The root: ids 1 (best), 3.
  b.Expand(-1, std::vector<float>{0, 3, -1, 2}, {});
  ASSERT_EQ(b.num_nodes(), 2);
  EXPECT_EQ(b.token(0), 1);
  EXPECT_EQ(b.token(1), 3);
  std::vector<int32_t> level = b.NextLevel();
  EXPECT_EQ(level, (std::vector<int32_t>{0, 1}));
  b.Expand(0, std::vector<float>{5, 0, 0, 0}, {});                       // 1 -> 0, almost surely
  b.Expand(1, std::vector<float>{0, 0, 1, 1}, std::vector<int32_t>{3});  // 3 -> 2 (3 banned), 0
  EXPECT_EQ(b.num_nodes(), 6);
  std::vector<int32_t> path;
  b.AppendPathTokens(2, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{1, 0}));
  level = b.NextLevel();  // the top 2 of level 1 by path score: 1 -> 0, then 3 -> 2
  EXPECT_EQ(level, (std::vector<int32_t>{2, 4}));
  b.Expand(2, std::vector<float>{0, 0, 9, 0}, {});
  b.Expand(4, std::vector<float>{0, 0, 9, 0}, {});
  EXPECT_TRUE(b.NextLevel().empty());  // depth 3 reached
  std::vector<int32_t> tokens, parents;
  b.Finish(&tokens, &parents);
  // The 4 best: 1, 1 -> 0, 1 -> 0 -> 2, 3; breadth first.
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, -1, 0, 2}));
}

}  // namespace
}  // namespace specd
