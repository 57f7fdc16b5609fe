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

// ---- token trees -----------------------------------------------------------------------------

constexpr int32_t kUntouched = -7;  // what the tree kernels must leave in unused path entries

// Sequence 0: the RaggedGreedy drafts as chains; sequence 1 no drafts; sequence 2 a chain of 2.
TEST(VerifyTreeGreedyRefTest, ChainsEqualVerifyGreedy) {
  RaggedGreedy g;
  const std::vector<int32_t> parents = {-1, 0, 1, /*seq 2*/ -1, 0};
  std::vector<int32_t> accepted(3, -1), next(3, -1), want_accepted(3, -1), want_next(3, -1);
  std::vector<int32_t> paths(5, kUntouched);
  VerifyTreeGreedy(g.layout, g.drafts.data(), parents.data(), g.targets.data(), accepted.data(),
                   next.data(), paths.data());
  VerifyGreedy(g.layout, g.drafts.data(), g.targets.data(), want_accepted.data(), want_next.data());
  EXPECT_EQ(accepted, want_accepted);
  EXPECT_EQ(next, want_next);
  EXPECT_EQ(paths, (std::vector<int32_t>{0, kUntouched, kUntouched, 0, 1}));

  // Random chains over a small vocabulary (many matches), ragged and uniform layouts.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t batch = 1 + trial % 5, max_len = trial % 9;
    std::vector<int32_t> cu(batch + 1, 0);
    for (int64_t i = 0; i < batch; ++i) {
      cu[i + 1] = cu[i] + (trial % 2 ? static_cast<int32_t>(rng() % (max_len + 1))
                                     : static_cast<int32_t>(max_len));
    }
    const DraftLayout layout{trial % 2 ? cu.data() : nullptr, batch, max_len};
    std::vector<int32_t> drafts(cu.back()), chain(cu.back()), targets(cu.back() + batch);
    for (int32_t& d : drafts) d = static_cast<int32_t>(rng() % 2);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % 2);
    for (int64_t i = 0; i < batch; ++i) {
      for (int32_t j = cu[i]; j < cu[i + 1]; ++j) chain[j] = j - cu[i] - 1;
    }
    accepted.assign(batch, -1);
    next.assign(batch, -1);
    want_accepted.assign(batch, -1);
    want_next.assign(batch, -1);
    paths.assign(cu.back(), kUntouched);
    VerifyTreeGreedy(layout, drafts.data(), chain.data(), targets.data(), accepted.data(),
                     next.data(), paths.data());
    VerifyGreedy(layout, drafts.data(), targets.data(), want_accepted.data(), want_next.data());
    ASSERT_EQ(accepted, want_accepted) << trial;
    ASSERT_EQ(next, want_next) << trial;
    for (int64_t i = 0; i < batch; ++i) {
      for (int32_t t = 0; t < cu[i + 1] - cu[i]; ++t) {
        EXPECT_EQ(paths[cu[i] + t], t < accepted[i] ? t : kUntouched) << trial << " " << i;
      }
    }
  }
}

// Root -> {d0: 5, d1: 7}; d0 -> {d2: 9}; d1 -> {d3: 4, d4: 8}. Positions: root 0, draft j at j + 1.
struct BranchingTree {
  std::vector<int32_t> drafts = {5, 7, 9, 4, 8};
  std::vector<int32_t> parents = {-1, -1, 0, 1, 1};
  DraftLayout layout{nullptr, 1, 5};

  // Runs the greedy walk against the given targets per position.
  void Greedy(const std::vector<int32_t>& targets, int32_t* accepted, int32_t* next,
              std::vector<int32_t>* paths) const {
    paths->assign(drafts.size(), kUntouched);
    VerifyTreeGreedy(layout, drafts.data(), parents.data(), targets.data(), accepted, next,
                     paths->data());
  }
};

TEST(VerifyTreeGreedyRefTest, SecondSiblingsMatchAndALeafGivesTheBonus) {
  const BranchingTree tree;
  int32_t accepted = -1, next = -1;
  std::vector<int32_t> paths;
  // Root's target 7: the second child d1; at d1 the target 8: its second child d4, a leaf whose
  // target token 11 is the bonus.
  tree.Greedy({7, 0, 8, 0, 0, 11}, &accepted, &next, &paths);
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(next, 11);
  EXPECT_EQ(paths, (std::vector<int32_t>{1, 4, kUntouched, kUntouched, kUntouched}));
  // Root's target 5: d0; at d0 the target 3 matches no child (d2 is 9): correction 3.
  tree.Greedy({5, 3, 8, 0, 0, 11}, &accepted, &next, &paths);
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 3);
  EXPECT_EQ(paths[0], 0);
  // d0 -> d2 (9), a leaf: full acceptance along the first branch, bonus from d2's row.
  tree.Greedy({5, 9, 8, 12, 0, 11}, &accepted, &next, &paths);
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(next, 12);
  EXPECT_EQ(paths, (std::vector<int32_t>{0, 2, kUntouched, kUntouched, kUntouched}));
  // No child of the root matches: nothing accepted, the root's target is the correction. The
  // target 4 at the root does not reach d3 (a grandchild).
  tree.Greedy({4, 9, 8, 12, 0, 11}, &accepted, &next, &paths);
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(next, 4);
  EXPECT_EQ(paths, std::vector<int32_t>(5, kUntouched));
}

TEST(VerifyTreeGreedyRefTest, FirstOfEqualSiblingsWinsAndBadParentsAreNeverVisited) {
  // d0, d1 both 5 under the root; d2 (6) under d1 only; d3's parent 3 is itself, d4's parent 9
  // lies ahead: neither is anybody's child.
  const std::vector<int32_t> drafts = {5, 5, 6, 6, 6};
  const std::vector<int32_t> parents = {-1, -1, 1, 3, 9};
  const DraftLayout layout{nullptr, 1, 5};
  const std::vector<int32_t> targets = {5, 6, 6, 6, 6, 6};
  int32_t accepted = -1, next = -1;
  std::vector<int32_t> paths(5, kUntouched);
  VerifyTreeGreedy(layout, drafts.data(), parents.data(), targets.data(), &accepted, &next,
                   paths.data());
  EXPECT_EQ(accepted, 1);  // d0; its row's 6 is d2's token, but d2 hangs under d1
  EXPECT_EQ(next, 6);
  EXPECT_EQ(paths[0], 0);
}

TEST(VerifyTreeGreedyRefTest, RowsOfABatchAreIndependent) {
  // Row 0: the branching tree (5 drafts); row 1: no drafts; row 2: root -> {d0: 3, d1: 4}.
  const BranchingTree tree;
  std::vector<int32_t> drafts = tree.drafts, parents = tree.parents;
  drafts.insert(drafts.end(), {3, 4});
  parents.insert(parents.end(), {-1, -1});
  const std::vector<int32_t> cu = {0, 5, 5, 7};
  const DraftLayout layout{cu.data(), 3, 5};
  // Positions: row 0 at 0..5, row 1 at 6, row 2 at 7..9.
  const std::vector<int32_t> targets = {7, 0, 8, 0, 0, 11, /*row 1*/ 42, /*row 2*/ 4, 1, 2};
  std::vector<int32_t> accepted(3, -1), next(3, -1), paths(7, kUntouched);
  VerifyTreeGreedy(layout, drafts.data(), parents.data(), targets.data(), accepted.data(),
                   next.data(), paths.data());
  EXPECT_EQ(accepted, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(next, (std::vector<int32_t>{11, 42, 2}));  // row 2: d1's row (position 9) gives 2
  EXPECT_EQ(paths, (std::vector<int32_t>{1, 4, kUntouched, kUntouched, kUntouched, 1, kUntouched}));
}

TEST(VerifyTreeStochasticRefTest, SiblingsAreTriedAgainstTheMassLeft) {
  // vocab 4; root p = {1/2, 1/4, 1/8, 1/8}; children d0 (0), d1 (0 again), d2 (7: no token),
  // d3 (1). Each child's row is one-hot at 3 (the bonus).
  const int64_t vocab = 4;
  const std::vector<int32_t> drafts = {0, 0, 7, 1};
  const std::vector<int32_t> parents = {-1, -1, -1, -1};
  std::vector<float> p = {0.5f, 0.25f, 0.125f, 0.125f};
  for (int j = 0; j < 4; ++j) p.insert(p.end(), {0.0f, 0.0f, 0.0f, 1.0f});
  const DraftLayout layout{nullptr, 1, 4};
  int32_t accepted = -1, next = -1;
  std::vector<int32_t> paths(4, kUntouched);
  auto run = [&](std::vector<float> u) {
    std::fill(paths.begin(), paths.end(), kUntouched);
    VerifyTreeStochastic(layout, drafts.data(), parents.data(), p.data(), vocab, u.data(),
                         &accepted, &next, paths.data());
  };
  // u0 = 0.4 < 1/2: d0 kept, a leaf: bonus 3.
  run({0.4f, 0.0f, 0.0f, 0.0f, 0.9f});
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 3);
  EXPECT_EQ(paths, (std::vector<int32_t>{0, kUntouched, kUntouched, kUntouched}));
  // d0 rejected (0.6 >= 1/2): left 1/2. d1 repeats token 0 (mass gone): rejected even at u = 0;
  // d2 is no token: rejected, left unchanged; d3: 0.4 * 1/2 < 1/4 kept.
  run({0.6f, 0.0f, 0.0f, 0.4f, 0.9f});
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(next, 3);
  EXPECT_EQ(paths[0], 3);
  // d3 rejected too (0.6 * 1/2 >= 1/4): residual {0, 0, 1/8, 1/8}, drawn with the last uniform.
  run({0.6f, 0.0f, 0.0f, 0.6f, 0.3f});
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(next, 2);
  EXPECT_EQ(paths, std::vector<int32_t>(4, kUntouched));
  run({0.6f, 0.0f, 0.0f, 0.6f, 0.7f});
  EXPECT_EQ(next, 3);
}

TEST(VerifyTreeStochasticRefTest, DescendsAndDrawsTheBonusAtALeafOrMinusOneWithoutMass) {
  // Root -> d0 (2) -> d1 (1); every row one-hot at the next draft, d1's row at 0: full
  // acceptance, bonus 0. Then d1's row without mass: next -1.
  const int64_t vocab = 3;
  const std::vector<int32_t> drafts = {2, 1};
  const std::vector<int32_t> parents = {-1, 0};
  std::vector<float> p = {0, 0, 1, /*d0*/ 0, 1, 0, /*d1*/ 1, 0, 0};
  const DraftLayout layout{nullptr, 1, 2};
  const std::vector<float> u = {0.99f, 0.99f, 0.5f};
  int32_t accepted = -1, next = -1;
  std::vector<int32_t> paths(2, kUntouched);
  VerifyTreeStochastic(layout, drafts.data(), parents.data(), p.data(), vocab, u.data(), &accepted,
                       &next, paths.data());
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(next, 0);
  EXPECT_EQ(paths, (std::vector<int32_t>{0, 1}));
  std::fill(p.begin() + 6, p.end(), 0.0f);
  VerifyTreeStochastic(layout, drafts.data(), parents.data(), p.data(), vocab, u.data(), &accepted,
                       &next, paths.data());
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(next, -1);
}

// Chains with deterministic drafts equal VerifyStochastic(draft_probs = nullptr) under the
// conditions of verify.h: rows whose fixed-point totals are exactly 2^40 (dyadic, multiples of
// 2^-12 summing to 1), uniforms multiples of 2^-24; also rows without mass (both reject every
// draft and return -1) and draft ids outside the vocabulary.
TEST(VerifyTreeStochasticRefTest, ChainsEqualVerifyStochasticWithPointMassDrafts) {
  constexpr int64_t kVocab = 16;
  std::mt19937_64 rng(11);
  int accepted_some = 0, rejected_some = 0, no_mass = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t batch = 1 + trial % 4, max_len = trial % 7;
    std::vector<int32_t> cu(batch + 1, 0);
    for (int64_t i = 0; i < batch; ++i) {
      cu[i + 1] = cu[i] + static_cast<int32_t>(rng() % (max_len + 1));
    }
    const DraftLayout layout{cu.data(), batch, max_len};
    const int64_t rows = cu.back() + batch;
    std::vector<float> p(rows * kVocab, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      if (rng() % 20 == 0) continue;  // no mass
      // 4096 units over a few ids (some peaked), so drafts are often accepted.
      int remaining = 4096;
      while (remaining > 0) {
        const int units = std::min<int>(remaining, 1 + static_cast<int>(rng() % 2048));
        p[r * kVocab + static_cast<int64_t>(rng() % 5)] += static_cast<float>(units) / 4096.0f;
        remaining -= units;
      }
    }
    std::vector<int32_t> drafts(cu.back()), chain(cu.back());
    for (int64_t i = 0; i < batch; ++i) {
      for (int32_t j = cu[i]; j < cu[i + 1]; ++j) {
        chain[j] = j - cu[i] - 1;
        const uint64_t pick = rng() % 16;
        drafts[j] = pick == 0   ? -1
                    : pick == 1 ? static_cast<int32_t>(kVocab)
                                : static_cast<int32_t>(pick % 5);
      }
    }
    std::vector<float> u(rows);
    for (float& x : u) x = static_cast<float>(rng() % (1u << 24)) * 0x1p-24f;
    std::vector<int32_t> accepted(batch, -1), next(batch, -1), want_accepted(batch, -1),
        want_next(batch, -1), paths(cu.back(), kUntouched);
    VerifyTreeStochastic(layout, drafts.data(), chain.data(), p.data(), kVocab, u.data(),
                         accepted.data(), next.data(), paths.data());
    VerifyStochastic(layout, drafts.data(), nullptr, p.data(), kVocab, u.data(),
                     want_accepted.data(), want_next.data());
    ASSERT_EQ(accepted, want_accepted) << trial;
    ASSERT_EQ(next, want_next) << trial;
    for (int64_t i = 0; i < batch; ++i) {
      for (int32_t t = 0; t < cu[i + 1] - cu[i]; ++t) {
        ASSERT_EQ(paths[cu[i] + t], t < accepted[i] ? t : kUntouched) << trial << " " << i;
      }
      accepted_some += accepted[i] > 0;
      rejected_some += accepted[i] < cu[i + 1] - cu[i];
      no_mass += next[i] < 0;
    }
  }
  // The comparison covered acceptances, rejections and rows without mass.
  EXPECT_GT(accepted_some, 500);
  EXPECT_GT(rejected_some, 500);
  EXPECT_GT(no_mass, 20);
}

using TreeVerifier = void (*)(const DraftLayout&, const int32_t*, const int32_t*, const float*,
                              int64_t, const float*, int32_t*, int32_t*, int32_t*);

// A deliberately broken rule for the negative control: every sibling is tested against the
// row's whole mass (`left` never shrinks), the rest as VerifyTreeStochastic. One row.
void BrokenVerifyTree(const DraftLayout& layout, const int32_t* drafts, const int32_t* parents,
                      const float* p, int64_t vocab, const float* u, int32_t* accepted,
                      int32_t* next, int32_t* paths) {
  const int64_t num_drafts = layout.NumDrafts(0);
  int64_t node = -1, k = 0;
  std::vector<int32_t> rejected;
  const float* row = nullptr;
  for (;;) {
    row = p + (node + 1) * vocab;
    uint64_t total = 0;
    for (int64_t x = 0; x < vocab; ++x) total += ProbToFixed(row[x]);
    rejected.clear();
    int64_t kept = -1;
    for (int64_t j = node + 1; j < num_drafts && kept < 0; ++j) {
      if (parents[j] != node || drafts[j] < 0 || drafts[j] >= vocab) continue;
      if (AcceptTreeChild(u[j], total, ProbToFixed(row[drafts[j]]))) kept = j;
      rejected.push_back(drafts[j]);
    }
    if (kept < 0) break;
    paths[k++] = static_cast<int32_t>(kept);
    node = kept;
  }
  std::vector<double> w(vocab);
  for (int64_t x = 0; x < vocab; ++x) {
    const bool out = std::find(rejected.begin(), rejected.end(), x) != rejected.end();
    w[x] = out ? 0.0 : row[x];
  }
  *accepted = static_cast<int32_t>(k);
  const double target = u[num_drafts] * std::accumulate(w.begin(), w.end(), 0.0);
  double cum = 0;
  *next = static_cast<int32_t>(vocab - 1);
  for (int64_t x = 0; x < vocab; ++x) {
    if (w[x] > 0 && target < (cum += w[x])) {
      *next = static_cast<int32_t>(x);
      break;
    }
  }
}

// The first committed token of a root with 3 children (tokens drawn per trial from a fixed q,
// repeats included): the kept child's token, or the drawn one. Its counts over kTrials.
std::vector<int> OneLevelFirstTokens(TreeVerifier verify, const std::vector<float>& p_root,
                                     int trials, uint64_t seed) {
  const int64_t vocab = static_cast<int64_t>(p_root.size());
  std::mt19937_64 rng(seed);
  const std::vector<double> q = {0.3, 0.05, 0.2, 0.05, 0.1, 0.2, 0.05, 0.05};
  std::discrete_distribution<int32_t> child(q.begin(), q.end());
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const std::vector<int32_t> parents = {-1, -1, -1};
  std::vector<float> p = p_root;
  for (int j = 0; j < 3; ++j) {
    const auto row = RandomDistribution(vocab, rng);
    p.insert(p.end(), row.begin(), row.end());
  }
  const DraftLayout layout{nullptr, 1, 3};
  std::vector<int> counts(vocab, 0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<int32_t> drafts = {child(rng), child(rng), child(rng)};
    std::vector<float> u(4);
    for (float& x : u) x = uniform(rng);
    int32_t accepted = -1, next = -1;
    std::vector<int32_t> paths(3, kUntouched);
    verify(layout, drafts.data(), parents.data(), p.data(), vocab, u.data(), &accepted, &next,
           paths.data());
    ++counts[accepted > 0 ? drafts[paths[0]] : next];
  }
  return counts;
}

TEST(VerifyTreeStochasticRefTest, FirstTokenOfSiblingsFollowsTheTargetAndABrokenRuleFails) {
  constexpr int kTrials = 40000;
  constexpr double kChiSquare999Dof7 = 24.322;
  // Most mass on the likely children's tokens, where the sibling rule matters most.
  const std::vector<float> p = {0.3f, 0.05f, 0.25f, 0.05f, 0.05f, 0.15f, 0.1f, 0.05f};
  const std::vector<double> expected(p.begin(), p.end());
  const std::vector<int> counts = OneLevelFirstTokens(VerifyTreeStochastic, p, kTrials, 44);
  EXPECT_LT(ChiSquare(counts, expected, kTrials), kChiSquare999Dof7);
  // The negative control: the same statistic on the same draws rejects the broken rule (74 at
  // this seed).
  const std::vector<int> broken = OneLevelFirstTokens(BrokenVerifyTree, p, kTrials, 44);
  EXPECT_GT(ChiSquare(broken, expected, kTrials), 2 * kChiSquare999Dof7);
}

// Two levels: root -> {d0, d1, d2}, d0 -> {d3, d4}, d1 -> {d5}, tokens drawn per trial (repeats
// included). A depth-1 node with token x1 has the row p2[x1]. The pair (first, second committed
// token) follows p1(x1) p2(x2 | x1); when the round commits one token only, x2 comes from the
// next round, a plain draw from p2[x1] (a draftless row).
TEST(VerifyTreeStochasticRefTest, TwoLevelTreeGivesTheTargetsJointDistribution) {
  constexpr int64_t kVocab = 6;
  constexpr int kTrials = 120000;
  constexpr double kChiSquare999Dof35 = 66.619;
  std::mt19937_64 rng(45);
  const std::vector<float> p1 = RandomDistribution(kVocab, rng);
  std::vector<std::vector<float>> p2;
  for (int64_t x = 0; x < kVocab; ++x) p2.push_back(RandomDistribution(kVocab, rng));
  const std::vector<float> deep = RandomDistribution(kVocab, rng);  // rows of d3, d4, d5
  const std::vector<int32_t> parents = {-1, -1, -1, 0, 0, 1};
  const DraftLayout layout{nullptr, 1, 6};
  const DraftLayout plain{nullptr, 1, 0};
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<int> counts(kVocab * kVocab, 0);
  int depth2 = 0;
  for (int t = 0; t < kTrials; ++t) {
    std::vector<int32_t> drafts(6);
    for (int32_t& d : drafts) d = token(rng);
    std::vector<float> p = p1;
    for (int j = 0; j < 6; ++j) {
      const std::vector<float>& row = j < 3 ? p2[drafts[j]] : deep;
      p.insert(p.end(), row.begin(), row.end());
    }
    std::vector<float> u(7);
    for (float& x : u) x = uniform(rng);
    int32_t accepted = -1, next = -1;
    std::vector<int32_t> paths(6, kUntouched);
    VerifyTreeStochastic(layout, drafts.data(), parents.data(), p.data(), kVocab, u.data(),
                         &accepted, &next, paths.data());
    const int32_t x1 = accepted > 0 ? drafts[paths[0]] : next;
    int32_t x2 = accepted > 1 ? drafts[paths[1]] : next;
    if (accepted == 0) {
      const float v = uniform(rng);
      int32_t none = -1;
      VerifyTreeStochastic(plain, nullptr, nullptr, p2[x1].data(), kVocab, &v, &none, &x2, nullptr);
    }
    depth2 += accepted == 2;
    ++counts[x1 * kVocab + x2];
  }
  std::vector<double> expected(kVocab * kVocab);
  for (int64_t a = 0; a < kVocab; ++a) {
    for (int64_t b = 0; b < kVocab; ++b) expected[a * kVocab + b] = double{p1[a]} * p2[a][b];
  }
  EXPECT_LT(ChiSquare(counts, expected, kTrials), kChiSquare999Dof35);
  EXPECT_GT(depth2, kTrials / 20);  // the second level was reached often
}

}  // namespace
}  // namespace specd::kernels::ref
