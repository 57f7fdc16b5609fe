#include "engine/speculation/ngram.h"

#include <vector>

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

}  // namespace
}  // namespace specd
