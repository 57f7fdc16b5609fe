#include "kernels/ref/verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

// Sequence 0: 3 drafts, mismatch at 1; sequence 1: 0 drafts; sequence 2: 2 drafts, all match.
struct RaggedGreedy {
  std::vector<int32_t> cu = {0, 3, 3, 5};
  std::vector<int32_t> drafts = {7, 8, 9, /*seq 2*/ 4, 5};
  // Positions: seq 0 rows 0..3, seq 1 row 4, seq 2 rows 5..7.
  std::vector<int32_t> targets = {7, 1, 9, 2, /*seq 1*/ 6, /*seq 2*/ 4, 5, 3};
  DraftLayout layout{cu.data(), 3, 3};
};

TEST(VerifyGreedyRefTest, AcceptsUpToFirstMismatchAndTakesTheTargetTokenThere) {
  RaggedGreedy g;
  std::vector<int32_t> accepted(3, -1), next(3, -1);
  VerifyGreedy(g.layout, g.drafts.data(), g.targets.data(), accepted.data(), next.data());
  EXPECT_EQ(accepted, (std::vector<int32_t>{1, 0, 2}));
  // Correction 1 for seq 0, the only position's token for seq 1, bonus 3 for seq 2.
  EXPECT_EQ(next, (std::vector<int32_t>{1, 6, 3}));
}

TEST(VerifyGreedyRefTest, UniformLayoutWithoutOffsetsUsesMaxDraftLen) {
  const std::vector<int32_t> drafts = {1, 2, 3, 4};
  const std::vector<int32_t> targets = {1, 2, 5, /*seq 1*/ 0, 4, 6};
  const DraftLayout layout{nullptr, 2, 2};
  EXPECT_EQ(layout.NumPositions(), 6);
  std::vector<int32_t> accepted(2), next(2);
  VerifyGreedy(layout, drafts.data(), targets.data(), accepted.data(), next.data());
  EXPECT_EQ(accepted, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(next, (std::vector<int32_t>{5, 0}));
}

TEST(PackAcceptedRefTest, PacksCommittedTokensSlotsAndKvRowsBackToBack) {
  RaggedGreedy g;
  std::vector<int32_t> accepted(3), next(3);
  VerifyGreedy(g.layout, g.drafts.data(), g.targets.data(), accepted.data(), next.data());
  const int64_t rows = g.layout.NumPositions(), row_bytes = 3;
  std::vector<int32_t> slots(rows);
  std::iota(slots.begin(), slots.end(), 100);
  std::vector<unsigned char> kv(rows * row_bytes);
  std::iota(kv.begin(), kv.end(), 0);
  std::vector<int32_t> cu(4, -1), tokens(rows, -1), committed_slots(rows, -1);
  std::vector<unsigned char> packed(rows * row_bytes, 0xff);
  const PackArgs pack{cu.data(), tokens.data(), slots.data(), committed_slots.data(),
                      kv.data(), packed.data(), row_bytes};
  PackAccepted(g.layout, g.drafts.data(), accepted.data(), next.data(), pack);

  EXPECT_EQ(cu, (std::vector<int32_t>{0, 2, 3, 6}));
  EXPECT_EQ(tokens, (std::vector<int32_t>{7, 1, 6, 4, 5, 3, -1, -1}));
  // Positions kept: seq 0 rows 0, 1; seq 1 row 4; seq 2 rows 5, 6, 7.
  EXPECT_EQ(committed_slots, (std::vector<int32_t>{100, 101, 104, 105, 106, 107, -1, -1}));
  const std::vector<int> kept_rows = {0, 1, 4, 5, 6, 7};
  for (size_t r = 0; r < kept_rows.size(); ++r) {
    for (int b = 0; b < row_bytes; ++b) {
      EXPECT_EQ(packed[r * row_bytes + b], kv[kept_rows[r] * row_bytes + b]) << r << " " << b;
    }
  }
  EXPECT_EQ(packed[6 * row_bytes], 0xff);  // past the committed rows: untouched
}

TEST(FixedPointTest, WeightsAndThresholdsAreExactAndInRange) {
  EXPECT_EQ(ProbToFixed(0.0f), 0u);
  EXPECT_EQ(ProbToFixed(-0.5f), 0u);
  EXPECT_EQ(ProbToFixed(0.5f), uint64_t{1} << 39);
  EXPECT_EQ(ProbToFixed(1.5f), uint64_t{1} << 40);
  EXPECT_EQ(UniformToFixed(0.5f), 0x80000000u);
  EXPECT_EQ(UniformToFixed(std::nextafter(1.0f, 0.0f)), 0xffffff00u);
  EXPECT_EQ(UniformToFixed(2.0f), 0xffffffffu);
  // floor(total * u / 2^32) for totals past 32 bits.
  const uint64_t total = (uint64_t{3} << 40) + 12345;
  EXPECT_EQ(DrawThreshold(total, 0x80000000u), total / 2);
  EXPECT_EQ(DrawThreshold(total, 0), 0u);
  EXPECT_LT(DrawThreshold(total, 0xffffffffu), total);
  EXPECT_LT(DrawThreshold(1, 0xffffffffu), 1u);
}

TEST(VerifyStochasticRefTest, AcceptsByRatioAndDrawsResidualWithItsOwnUniform) {
  // vocab 4, one sequence, two drafts.
  const int64_t vocab = 4;
  const std::vector<int32_t> drafts = {1, 2};
  const std::vector<float> q = {0.1f, 0.5f, 0.2f, 0.2f,      // draft 0 drawn from q_0
                                0.0f, 0.0f, 1.0f, 0.0f};     // draft 1 drawn from q_1
  const std::vector<float> p = {0.25f, 0.25f, 0.25f, 0.25f,  // p_0(1) / q_0(1) = 0.5
                                0.5f,  0.0f,  0.0f,  0.5f,   // p_1(2) = 0: always rejected
                                0.0f,  0.0f,  0.0f,  1.0f};
  const std::vector<int32_t> cu = {0, 2};
  const DraftLayout layout{cu.data(), 1, 2};
  int32_t accepted = -1, next = -1;
  // u_0 = 0.4 < 0.5: accept draft 0; draft 1 rejected; draw from max(0, p_1 - q_1) = {.5, 0, 0,
  // .5} with u = 0.75 (position K = 2): the upper half, id 3.
  std::vector<float> u = {0.4f, 0.0f, 0.75f};
  VerifyStochastic(layout, drafts.data(), q.data(), p.data(), vocab, u.data(), &accepted, &next);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 3);
  u = {0.4f, 0.0f, 0.25f};
  VerifyStochastic(layout, drafts.data(), q.data(), p.data(), vocab, u.data(), &accepted, &next);
  EXPECT_EQ(next, 0);
  // u_0 = 0.6 >= 0.5 rejects draft 0: residual max(0, p_0 - q_0) = {.15, 0, .05, .05}.
  u = {0.6f, 0.0f, 0.7f};
  VerifyStochastic(layout, drafts.data(), q.data(), p.data(), vocab, u.data(), &accepted, &next);
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(next, 2);  // 0.7 * 0.25 = 0.175 falls in (0.15, 0.20]: id 2
}

TEST(VerifyStochasticRefTest, BonusTokenComesFromTheLastTargetRow) {
  const int64_t vocab = 4;
  const std::vector<int32_t> drafts = {3};
  const std::vector<float> q = {0.0f, 0.0f, 0.0f, 1.0f};
  const std::vector<float> p = {0.0f, 0.0f, 0.0f, 1.0f,  // p_0(3) = 1: accepted
                                0.0f, 1.0f, 0.0f, 0.0f};
  const DraftLayout layout{nullptr, 1, 1};
  const std::vector<float> u = {0.99f, 0.5f};
  int32_t accepted = -1, next = -1;
  VerifyStochastic(layout, drafts.data(), q.data(), p.data(), vocab, u.data(), &accepted, &next);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 1);
}

TEST(VerifyStochasticRefTest, DeterministicDraftsUsePointMassAndNeverRedrawTheDraft) {
  // q = one-hot at the draft: accept with probability p(d); on rejection the residual is p with
  // the draft removed.
  const int64_t vocab = 3;
  const std::vector<int32_t> drafts = {1};
  const std::vector<float> p = {0.3f, 0.4f, 0.3f, /*bonus row*/ 1.0f, 0.0f, 0.0f};
  const DraftLayout layout{nullptr, 1, 1};
  int32_t accepted = -1, next = -1;
  std::vector<float> u = {0.39f, 0.0f};
  VerifyStochastic(layout, drafts.data(), nullptr, p.data(), vocab, u.data(), &accepted, &next);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 0);
  for (float draw : {0.0f, 0.3f, 0.49f, 0.51f, 0.99f}) {
    u = {0.41f, draw};
    VerifyStochastic(layout, drafts.data(), nullptr, p.data(), vocab, u.data(), &accepted, &next);
    EXPECT_EQ(accepted, 0);
    EXPECT_EQ(next, draw < 0.5f ? 0 : 2) << draw;
  }
}

TEST(VerifyStochasticRefTest, EmptyResidualFallsBackToTargetAndInvalidDraftsAreRejected) {
  const int64_t vocab = 2;
  const std::vector<int32_t> drafts = {0, 5};
  const std::vector<float> q = {0.5f, 0.5f, /*seq 1*/ 0.5f, 0.5f};
  // Seq 0's row p_0 is not normalised and lies below q_0 everywhere: a rejection leaves no
  // residual mass, so the draw falls back to p_0.
  const std::vector<float> p = {0.25f, 0.25f, 0.5f, 0.5f, /*seq 1*/ 0.75f, 0.25f, 0.5f, 0.5f};
  const std::vector<int32_t> cu = {0, 1, 2};  // two sequences of one draft
  const DraftLayout layout{cu.data(), 2, 1};
  const std::vector<float> u = {0.6f, 0.9f, /*seq 1*/ 0.0f, 0.1f};
  std::vector<int32_t> accepted(2, -1), next(2, -1);
  VerifyStochastic(layout, drafts.data(), q.data(), p.data(), vocab, u.data(), accepted.data(),
                   next.data());
  EXPECT_EQ(accepted[0], 0);  // 0.6 * 0.5 >= 0.25
  EXPECT_EQ(next[0], 1);      // from p_0 = {.25, .25} with u = 0.9
  EXPECT_EQ(accepted[1], 0);  // 5 is not a token id
  EXPECT_EQ(next[1], 0);      // max(0, p - q) = {.25, 0}
}

TEST(VerifyStochasticRefTest, NextTokenIsMinusOneForARowWithoutMass) {
  const std::vector<int32_t> drafts;
  const std::vector<float> p = {0.0f, 0.0f};
  const DraftLayout layout{nullptr, 1, 0};
  const std::vector<float> u = {0.5f};
  int32_t accepted = -1, next = 7;
  VerifyStochastic(layout, drafts.data(), nullptr, p.data(), 2, u.data(), &accepted, &next);
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(next, -1);
}

// Chi-square of counts against expected probabilities.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double stat = 0;
  for (size_t x = 0; x < counts.size(); ++x) {
    const double expected = n * probs[x];
    stat += (counts[x] - expected) * (counts[x] - expected) / expected;
  }
  return stat;
}

std::vector<float> RandomDistribution(int64_t vocab, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  std::vector<float> row(vocab);
  float sum = 0;
  for (float& w : row) sum += (w = weight(rng));
  for (float& w : row) w /= sum;
  return row;
}

// The lossless property of the rule as the reference implements it (fixed-point draws
// included): the first committed token (draft 0 if accepted, else the drawn one) follows p_0.
TEST(VerifyStochasticRefTest, FirstCommittedTokenFollowsTheTargetDistribution) {
  constexpr int64_t kVocab = 8;
  constexpr int kDrafts = 2;
  constexpr int kTrials = 20000;
  constexpr double kChiSquare999Dof7 = 24.322;  // 0.1% upper tail, 7 degrees of freedom
  std::mt19937_64 rng(42);
  std::vector<float> p, q;
  for (int j = 0; j <= kDrafts; ++j) {
    const auto row = RandomDistribution(kVocab, rng);
    p.insert(p.end(), row.begin(), row.end());
  }
  for (int j = 0; j < kDrafts; ++j) {
    const auto row = RandomDistribution(kVocab, rng);
    q.insert(q.end(), row.begin(), row.end());
  }
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<int> counts(kVocab, 0);
  const DraftLayout layout{nullptr, 1, kDrafts};
  for (int t = 0; t < kTrials; ++t) {
    std::vector<int32_t> drafts(kDrafts);
    for (int j = 0; j < kDrafts; ++j) {
      std::discrete_distribution<int32_t> draw(q.begin() + j * kVocab,
                                               q.begin() + (j + 1) * kVocab);
      drafts[j] = draw(rng);
    }
    std::vector<float> u(kDrafts + 1);
    for (float& x : u) x = uniform(rng);
    int32_t accepted = 0, next = 0;
    VerifyStochastic(layout, drafts.data(), q.data(), p.data(), kVocab, u.data(), &accepted, &next);
    ++counts[accepted > 0 ? drafts[0] : next];
  }
  const std::vector<double> p0(p.begin(), p.begin() + kVocab);
  EXPECT_LT(ChiSquare(counts, p0, kTrials), kChiSquare999Dof7);
}

TEST(VerifyStochasticRefTest, BonusDrawFollowsTheLastTargetRow) {
  constexpr int64_t kVocab = 8;
  constexpr int kTrials = 20000;
  constexpr double kChiSquare999Dof7 = 24.322;
  std::mt19937_64 rng(43);
  const std::vector<float> p = RandomDistribution(kVocab, rng);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<int> counts(kVocab, 0);
  const DraftLayout layout{nullptr, 1, 0};  // no drafts: the next token is the bonus draw
  for (int t = 0; t < kTrials; ++t) {
    const float u = uniform(rng);
    int32_t accepted = -1, next = -1;
    VerifyStochastic(layout, nullptr, nullptr, p.data(), kVocab, &u, &accepted, &next);
    ASSERT_EQ(accepted, 0);
    ++counts[next];
  }
  EXPECT_LT(ChiSquare(counts, std::vector<double>(p.begin(), p.end()), kTrials), kChiSquare999Dof7);
}

}  // namespace
}  // namespace specd::kernels::ref
