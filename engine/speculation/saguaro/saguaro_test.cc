// Saguaro / SSD math on the CPU: geometric fan-out, the online acceptance statistics
// (OutcomeStats), the speedup and critical batch size formulas, and the speculation cache.
// Saguaro sampling and its losslessness are in saguaro_sampling_test.cc.
#include "engine/speculation/saguaro/saguaro.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;

// ---- fan-out ------------------------------------------------------------------------------

TEST(GeometricFanOutTest, SharesFollowTheTheorem12Ratios) {
  const double alpha = 0.7, r = 0.8;
  const std::vector<double> shares = GeometricFanOutShares(7, 24, alpha, r).value();
  ASSERT_EQ(shares.size(), 8u);
  EXPECT_NEAR(std::accumulate(shares.begin(), shares.end(), 0.0), 24.0, 1e-9);
  const double step = std::pow(alpha, 1 / (1 + r));
  for (int k = 0; k + 1 < 7; ++k) EXPECT_NEAR(shares[k + 1] / shares[k], step, 1e-12) << k;
  // F_K / F_{K-1} = alpha^(1/(1+r)) * (1 - alpha)^(-1/(1+r)): the all-accepted boost.
  EXPECT_NEAR(shares[7] / shares[6], step * std::pow(1 - alpha, -1 / (1 + r)), 1e-12);
  EXPECT_NEAR(shares[7] / shares[0], std::pow(alpha, 7 / (1 + r)) / std::pow(0.3, 1 / (1 + r)),
              1e-12);
}

TEST(GeometricFanOutTest, RoundsByLargestRemainderOnAWorkedExample) {
  // alpha 0.8, r 1: shares 24 * 0.8^(k/2) / S, with 0.8^(7/2) * 0.2^(-1/2) at K, are
  // 3.90 3.49 3.12 2.79 2.49 2.23 2.00 3.99: floors 3 3 3 2 2 2 1 3 (19), and the five largest
  // remainders (k = 6, 7, 0, 3, 4) get one more each.
  EXPECT_THAT(GeometricFanOut(7, 24, 0.8, 1.0).value(), ElementsAre(4, 3, 3, 3, 3, 2, 2, 4));
}

TEST(GeometricFanOutTest, SumsToBudgetDecreasesBeforeKAndGivesEveryPositionOne) {
  for (int32_t K : {1, 2, 3, 7, 12}) {
    for (int32_t budget : {1, 3, K + 1, 2 * (K + 1), 24, 64, 1000}) {
      for (double alpha : {0.0, 0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0}) {
        for (double r : {0.1, 0.5, 1.0, 3.0}) {
          const std::vector<int32_t> f = GeometricFanOut(K, budget, alpha, r).value();
          const std::vector<double> shares = GeometricFanOutShares(K, budget, alpha, r).value();
          SCOPED_TRACE(testing::Message()
                       << "K " << K << " B " << budget << " alpha " << alpha << " r " << r);
          ASSERT_EQ(f.size(), static_cast<size_t>(K + 1));
          EXPECT_EQ(std::accumulate(f.begin(), f.end(), 0), budget);
          for (int k = 0; k + 1 < K; ++k) EXPECT_GE(f[k], f[k + 1]) << k;
          EXPECT_THAT(f, Each(testing::Ge(0)));
          if (budget >= K + 1) {
            EXPECT_THAT(f, Each(testing::Ge(1)));
          }
          const bool all_shares_at_least_one =
              std::all_of(shares.begin(), shares.end(), [](double s) { return s >= 1; });
          if (all_shares_at_least_one) {  // no lifting: plain largest remainder, within 1
            for (int k = 0; k <= K; ++k) EXPECT_LT(std::abs(f[k] - shares[k]), 1.0) << k;
          }
        }
      }
    }
  }
}

TEST(GeometricFanOutTest, SmallBudgetsAndExtremeAlphas) {
  EXPECT_THAT(GeometricFanOut(7, 8, 0.7, 1.0).value(), Each(1));
  // Fewer speculations than outcomes: the likeliest positions (small k, and K) get them.
  const std::vector<int32_t> three = GeometricFanOut(7, 3, 0.5, 1.0).value();
  EXPECT_EQ(std::accumulate(three.begin(), three.end(), 0), 3);
  EXPECT_EQ(three[0], 1);
  EXPECT_EQ(three[6], 0);
  // alpha is clamped into [0.01, 0.99]: 0 and 1 behave like the clamp ends and stay finite.
  EXPECT_EQ(GeometricFanOut(7, 24, 0.0, 1.0).value(), GeometricFanOut(7, 24, 0.01, 1.0).value());
  EXPECT_EQ(GeometricFanOut(7, 24, 1.0, 1.0).value(), GeometricFanOut(7, 24, 0.99, 1.0).value());
  // Near 0 nearly everything goes to k = 0 (shares 21.6, 2.2, 0.2, ...: largest remainder gives
  // 22, 2, 0, ..., then the six empty positions take one each from k = 0); near 1 the
  // all-accepted boost dominates.
  EXPECT_THAT(GeometricFanOut(7, 24, 0.0, 1.0).value(), ElementsAre(16, 2, 1, 1, 1, 1, 1, 1));
  const std::vector<int32_t> high = GeometricFanOut(7, 24, 1.0, 1.0).value();
  EXPECT_EQ(*std::max_element(high.begin(), high.end()), high[7]);
}

TEST(GeometricFanOutTest, RejectsBadInputs) {
  EXPECT_EQ(GeometricFanOut(0, 24, 0.7, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeometricFanOut(7, 0, 0.7, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeometricFanOut(7, 24, 0.7, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeometricFanOut(7, 24, 0.7, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeometricFanOut(7, 24, 0.7, INFINITY).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GeometricFanOutShares(7, 24, NAN, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConstantFanOutTest, RepeatsFAtEveryAcceptanceLength) {
  const std::vector<int32_t> f = ConstantFanOut(7, 3).value();
  EXPECT_THAT(f, ElementsAre(3, 3, 3, 3, 3, 3, 3, 3));
  EXPECT_EQ(std::accumulate(f.begin(), f.end(), 0), 24);  // B = (K + 1) * F
  EXPECT_FALSE(ConstantFanOut(0, 3).ok());
  EXPECT_FALSE(ConstantFanOut(7, 0).ok());
}

// ---- OutcomeStats -------------------------------------------------------------------------

// Synthetic rounds: accepted length from a geometric truncated at K (each draft kept with
// probability alpha until the first rejection), bonus rank from the power law
// P(rank >= F) = c * F^(-r) for F >= 1 (rank >= F: a miss at fan-out F).
class SyntheticRounds {
 public:
  SyntheticRounds(int32_t K, int32_t max_fan_out, uint64_t seed)
      : K_(K), max_fan_out_(max_fan_out), rng_(seed) {}

  RoundOutcome Next(double alpha, double r, double c = 1.0) {
    RoundOutcome o;
    while (o.accepted_len < K_ && uniform_(rng_) < alpha) ++o.accepted_len;
    const double u = uniform_(rng_);
    int32_t rank = 0;
    while (rank < max_fan_out_ && u < c * std::pow(rank + 1, -r)) ++rank;
    o.bonus_rank = rank < max_fan_out_ ? rank : kNotInTopF;
    o.cache_hit = o.bonus_rank >= 0 && o.bonus_rank < 3;
    return o;
  }

 private:
  int32_t K_, max_fan_out_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

OutcomeStatsOptions Options(double half_life) {
  OutcomeStatsOptions o;
  o.num_draft_tokens = 7;
  o.max_fan_out = 8;
  o.half_life_rounds = half_life;
  return o;
}

TEST(OutcomeStatsTest, PriorsUntilEnoughRounds) {
  OutcomeStats stats = OutcomeStats::Create(Options(0)).value();
  EXPECT_EQ(stats.Alpha(), 0.8);
  EXPECT_EQ(stats.PowerLawR(), 1.0);
  EXPECT_EQ(stats.HitRate(3), 0.0);
  for (int i = 0; i < 31; ++i) stats.Record({.accepted_len = 0, .bonus_rank = kNotInTopF});
  EXPECT_EQ(stats.Alpha(), 0.8);  // 31 < min_rounds = 32
  EXPECT_EQ(stats.PowerLawR(), 1.0);
  stats.Record({.accepted_len = 0, .bonus_rank = kNotInTopF});
  EXPECT_EQ(stats.Alpha(), 0.0);
  // Every bonus token missed: miss(F) = 1 at every F, a flat line, r at its floor.
  EXPECT_EQ(stats.PowerLawR(), 0.05);
}

TEST(OutcomeStatsTest, ConvergesToTheSyntheticAlphaAndPowerLaw) {
  for (double c : {1.0, 0.5}) {  // the paper's pure law, and one that hits at F = 1 already
    SCOPED_TRACE(c);
    OutcomeStats stats = OutcomeStats::Create(Options(0)).value();
    SyntheticRounds rounds(7, 8, 42);
    for (int i = 0; i < 40000; ++i) stats.Record(rounds.Next(0.7, 0.8, c));
    EXPECT_NEAR(stats.Alpha(), 0.7, 0.01);
    EXPECT_NEAR(stats.PowerLawR(), 0.8, 0.05);
    EXPECT_NEAR(stats.HitRate(3), 1 - c * std::pow(3.0, -0.8), 0.01);
  }
}

TEST(OutcomeStatsTest, DecayFollowsAChangeInAlphaAndR) {
  OutcomeStats decayed = OutcomeStats::Create(Options(200)).value();
  OutcomeStats forever = OutcomeStats::Create(Options(0)).value();
  SyntheticRounds rounds(7, 8, 7);
  for (int i = 0; i < 6000; ++i) {
    const RoundOutcome o = rounds.Next(0.7, 0.8);
    decayed.Record(o);
    forever.Record(o);
  }
  EXPECT_NEAR(decayed.Alpha(), 0.7, 0.05);
  EXPECT_NEAR(decayed.PowerLawR(), 0.8, 0.2);
  for (int i = 0; i < 3000; ++i) {  // the workload changes: 15 half-lives
    const RoundOutcome o = rounds.Next(0.4, 1.6);
    decayed.Record(o);
    forever.Record(o);
  }
  EXPECT_NEAR(decayed.Alpha(), 0.4, 0.05);
  EXPECT_NEAR(decayed.PowerLawR(), 1.6, 0.3);
  EXPECT_GT(forever.Alpha(), 0.55);  // without decay the old workload still dominates
  EXPECT_LT(forever.PowerLawR(), 1.3);
}

TEST(OutcomeStatsTest, CountsRoundsAndHitsPerAcceptanceLength) {
  OutcomeStats stats = OutcomeStats::Create(Options(100)).value();
  stats.Record({.accepted_len = 0, .bonus_rank = 0, .cache_hit = true});
  stats.Record({.accepted_len = 0, .bonus_rank = 5, .cache_hit = false});
  stats.Record({.accepted_len = 7, .bonus_rank = 1, .cache_hit = true});
  stats.Record({.accepted_len = 9, .bonus_rank = 99, .cache_hit = false});  // clamped to K
  const auto rounds = stats.rounds_by_accepted_len();
  const auto hits = stats.cache_hits_by_accepted_len();
  EXPECT_THAT(std::vector<int64_t>(rounds.begin(), rounds.end()),
              ElementsAre(2, 0, 0, 0, 0, 0, 0, 2));
  EXPECT_THAT(std::vector<int64_t>(hits.begin(), hits.end()), ElementsAre(1, 0, 0, 0, 0, 0, 0, 1));
  EXPECT_EQ(stats.num_rounds(), 4);
}

// The worker keeps one OutcomeStats for every K a request may ask for (options' K = 64), while
// a round verifies its own K drafts: a round that accepted all 7 of its 7 drafts saw no
// rejection, and counting one there biases alpha_p down (0.8 would read as about 0.76).
TEST(OutcomeStatsTest, ARoundThatAcceptedAllOfItsOwnDraftsHasNoRejection) {
  OutcomeStatsOptions o = Options(0);
  o.num_draft_tokens = 64;
  OutcomeStats stats = OutcomeStats::Create(o).value();
  SyntheticRounds rounds(7, 8, 11);  // true alpha 0.8, geometric truncated at K = 7
  int64_t all_accepted = 0;
  for (int i = 0; i < 100000; ++i) {
    RoundOutcome outcome = rounds.Next(0.8, 1.0);
    outcome.num_draft_tokens = 7;
    all_accepted += outcome.accepted_len == 7;
    stats.Record(outcome);
  }
  ASSERT_NEAR(double(all_accepted) / 100000, std::pow(0.8, 7), 0.01);
  EXPECT_NEAR(stats.Alpha(), 0.8, 0.005);
  EXPECT_EQ(stats.rounds_by_accepted_len()[7], all_accepted);
  // Without a round K the options' K applies: 7 accepted of up to 64 is a rejection at 8.
  OutcomeStats unknown_k = OutcomeStats::Create(o).value();
  for (int i = 0; i < 40; ++i) unknown_k.Record({.accepted_len = 7});
  EXPECT_NEAR(unknown_k.Alpha(), 7.0 / 8.0, 1e-12);
  // A round with no drafts tells nothing about alpha_p.
  OutcomeStats no_drafts = OutcomeStats::Create(o).value();
  for (int i = 0; i < 40; ++i) no_drafts.Record({.accepted_len = 1});
  for (int i = 0; i < 40; ++i) no_drafts.Record({.accepted_len = 0, .num_draft_tokens = 0});
  EXPECT_NEAR(no_drafts.Alpha(), 0.5, 1e-12);
}

TEST(OutcomeStatsTest, RejectsBadOptions) {
  auto bad = [](auto edit) {
    OutcomeStatsOptions o = Options(100);
    edit(o);
    return OutcomeStats::Create(o).status().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.num_draft_tokens = 0; }));
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.max_fan_out = 1; }));
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.prior_alpha = 1.0; }));
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.prior_r = 0.0; }));
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.half_life_rounds = -1; }));
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.min_rounds = 1000; }));  // never reached
  EXPECT_TRUE(bad([](OutcomeStatsOptions& o) { o.min_misses = 0; }));
  EXPECT_FALSE(bad([](OutcomeStatsOptions&) {}));
}

TEST(BonusRankTest, PositionAmongCandidatesOrNotInTopF) {
  const std::vector<int32_t> candidates = {9, 4, 7};
  EXPECT_EQ(BonusRank(candidates, 9), 0);
  EXPECT_EQ(BonusRank(candidates, 7), 2);
  EXPECT_EQ(BonusRank(candidates, 5), kNotInTopF);
}

// The cache skips the draft token d_{k+1} (a rejected draft is never the bonus token), so its
// F candidates can reach past rank F - 1 of the row, and the rank r is fit over must count
// only the ids the cache can hold.
TEST(CachedCandidatesTest, SkipTheDraftTokenAndRankAmongWhatIsLeft) {
  const std::vector<int32_t> row = {9, 4, 7, 2, 5};
  EXPECT_THAT(CachedCandidates(row, 9, 2), ElementsAre(4, 7));  // d_{k+1} leads (greedy)
  EXPECT_THAT(CachedCandidates(row, 7, 3), ElementsAre(9, 4, 2));
  EXPECT_THAT(CachedCandidates(row, 8, 2), ElementsAre(9, 4));  // d_{k+1} not among them
  EXPECT_THAT(CachedCandidates(row, kNoDraftToken, 3), ElementsAre(9, 4, 7));  // k = K
  EXPECT_THAT(CachedCandidates(row, 9, 9), ElementsAre(4, 7, 2, 5));
  EXPECT_TRUE(CachedCandidates(row, 9, 0).empty());
  EXPECT_EQ(CachedBonusRank(row, 9, 4), 0);
  EXPECT_EQ(CachedBonusRank(row, 9, 5), 3);
  EXPECT_EQ(CachedBonusRank(row, 7, 4), 1);  // before the draft token: its row rank
  EXPECT_EQ(CachedBonusRank(row, 7, 2), 2);  // after it: one less
  EXPECT_EQ(CachedBonusRank(row, kNoDraftToken, 7), 2);
  EXPECT_EQ(CachedBonusRank(row, 9, 9), kNotInTopF);
  EXPECT_EQ(CachedBonusRank(row, 9, 3), kNotInTopF);
  // The rank agrees with the cache: held at fan-out F exactly when the rank is below F.
  for (int32_t d : {9, 4, 7, 2, 5, 8, kNoDraftToken}) {
    for (int32_t t : {9, 4, 7, 2, 5, 8}) {
      if (t == d) continue;
      for (int32_t f = 1; f <= 5; ++f) {
        const std::vector<int32_t> cached = CachedCandidates(row, d, f);
        const int32_t rank = CachedBonusRank(row, d, t);
        EXPECT_EQ(std::find(cached.begin(), cached.end(), t) != cached.end(),
                  rank != kNotInTopF && rank < f)
            << d << " " << t << " " << f;
      }
    }
  }
}

// ---- speedup and b* -----------------------------------------------------------------------

TEST(SsdSpeedupTest, MatchesTheorem7OnHandComputedValues) {
  EXPECT_NEAR(SsdSpeedup(0.8, 4, 3, 0.5, 0.5), (3.2 + 0.6) / (0.8 + 0.2 * 1.5), 1e-12);
  EXPECT_NEAR(SsdSpeedup(0.8, 4, 3, 1.5, 0.1), 3.8 / (0.8 * 1.5 + 0.2 * 1.1), 1e-12);
  EXPECT_NEAR(SsdSpeedup(0.0, 4, 3, 0.5, 0.2), 3 / 1.2, 1e-12);  // all misses
  EXPECT_NEAR(SsdSpeedup(1.0, 4, 3, 0.5, 0.2), 4.0, 1e-12);      // all hits: drafting hidden
}

TEST(SsdSpeedupTest, ExpectedTokensPerRoundIsTheGeometricSum) {
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(1.0, 7), 8.0);
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(0.0, 7), 1.0);
  EXPECT_NEAR(ExpectedTokensPerRound(0.7, 7), (1 - std::pow(0.7, 8)) / 0.3, 1e-12);
}

BatchRoundModel PaperLikeModel(double p_hit) {
  BatchRoundModel m;
  m.p_hit = p_hit;
  m.e_hit = m.e_miss = ExpectedTokensPerRound(0.7, 7);
  m.e_backup = 1;
  m.t_p = 0.3;
  m.t_b = 0.01;
  return m;
}

TEST(CriticalBatchSizeTest, BatchOfOneReducesToTheorem7) {
  const BatchRoundModel m = PaperLikeModel(0.85);
  EXPECT_NEAR(BatchThroughput(m, 1, FallbackTier::kBackup),
              SsdSpeedup(m.p_hit, m.e_hit, m.e_backup, m.t_p, m.t_b), 1e-12);
  EXPECT_NEAR(BatchThroughput(m, 1, FallbackTier::kPrimary),
              SsdSpeedup(m.p_hit, m.e_hit, m.e_miss, m.t_p, m.t_p), 1e-12);
  // A batch of 16 rarely all hits (0.85^16 = 7%): rounds cost nearly 1 + T.
  EXPECT_NEAR(ExpectedRoundTime(m, 16, FallbackTier::kPrimary),
              std::pow(0.85, 16) + (1 - std::pow(0.85, 16)) * 1.3, 1e-12);
  EXPECT_NEAR(ExpectedBatchTokens(m, 16, FallbackTier::kBackup), 16 * (0.85 * m.e_hit + 0.15),
              1e-9);
}

TEST(CriticalBatchSizeTest, FiniteAboveOneForTheExampleAndConsistentWithThroughputs) {
  const BatchRoundModel m = PaperLikeModel(0.9);
  const int32_t b_star = CriticalBatchSize(m);
  std::printf("[ saguaro  ] b* for p_hit 0.9, T_p 0.3, T_b 0.01, E 3.14 / 1: %d\n", b_star);
  ASSERT_GT(b_star, 1);
  ASSERT_LT(b_star, 1024);
  EXPECT_GT(BatchThroughput(m, b_star, FallbackTier::kBackup),
            BatchThroughput(m, b_star, FallbackTier::kPrimary));
  EXPECT_LE(BatchThroughput(m, b_star - 1, FallbackTier::kBackup),
            BatchThroughput(m, b_star - 1, FallbackTier::kPrimary));
  for (int32_t b = b_star; b < 256; ++b) {  // once the backup wins it keeps winning
    EXPECT_GT(BatchThroughput(m, b, FallbackTier::kBackup),
              BatchThroughput(m, b, FallbackTier::kPrimary))
        << b;
  }
  // A slower primary or a better backup pays off at a smaller batch, a slower backup later.
  BatchRoundModel slow_primary = m, better_backup = m, slow_backup = m;
  slow_primary.t_p = 0.6;
  better_backup.e_backup = 2;
  slow_backup.t_b = 0.2;
  EXPECT_LT(CriticalBatchSize(slow_primary), b_star);
  EXPECT_LT(CriticalBatchSize(better_backup), b_star);
  EXPECT_GT(CriticalBatchSize(slow_backup), b_star);
}

TEST(CriticalBatchSizeTest, NeverSwitchesWithoutMissesOrWithoutAFasterBackup) {
  EXPECT_EQ(CriticalBatchSize(PaperLikeModel(1.0)), kNeverSwitch);
  BatchRoundModel slow_backup = PaperLikeModel(0.8);
  slow_backup.t_b = slow_backup.t_p;
  EXPECT_EQ(CriticalBatchSize(slow_backup), kNeverSwitch);
  BatchRoundModel free_primary = PaperLikeModel(0.8);  // a backup as good as the primary wins
  free_primary.e_backup = free_primary.e_miss;         // from b = 1
  EXPECT_EQ(CriticalBatchSize(free_primary), 1);
}

// ---- SpeculationCache ---------------------------------------------------------------------

CachedDraft Draft(std::vector<int32_t> tokens) {
  CachedDraft d;
  d.tokens = std::move(tokens);
  return d;
}

TEST(SpeculationCacheTest, HitsOnlyTheExactOutcomeOfTheCurrentRound) {
  SpeculationCache cache;
  ASSERT_TRUE(cache.Insert(1, 5, 2, 42, Draft({7, 8, 9})));
  CachedDraft with_probs;
  with_probs.tokens = {3};
  with_probs.probs = {0.25f, 0.75f};
  ASSERT_TRUE(cache.Insert(1, 5, 0, 11, with_probs));
  const CachedDraft* hit = cache.Lookup(1, 5, 2, 42);
  ASSERT_NE(hit, nullptr);
  EXPECT_THAT(hit->tokens, ElementsAre(7, 8, 9));
  EXPECT_THAT(cache.Lookup(1, 5, 0, 11)->probs, ElementsAre(0.25f, 0.75f));
  EXPECT_EQ(cache.Lookup(1, 5, 2, 43), nullptr);  // other bonus token
  EXPECT_EQ(cache.Lookup(1, 5, 1, 42), nullptr);  // other accepted length
  EXPECT_EQ(cache.Lookup(2, 5, 2, 42), nullptr);  // other sequence
  EXPECT_EQ(cache.Lookup(1, 4, 2, 42), nullptr);  // other round
  EXPECT_EQ(cache.Lookup(1, 6, 2, 42), nullptr);
  EXPECT_EQ(cache.num_entries(1), 2);
}

TEST(SpeculationCacheTest, StaleRoundsNeverHit) {
  SpeculationCache cache;
  ASSERT_TRUE(cache.Insert(1, 1, 0, 5, Draft({1})));
  cache.BeginRound(1, 2);
  EXPECT_EQ(cache.Lookup(1, 1, 0, 5), nullptr);
  EXPECT_EQ(cache.Lookup(1, 2, 0, 5), nullptr);  // the old entry did not carry over
  EXPECT_EQ(cache.num_entries(1), 0);
  EXPECT_FALSE(cache.Insert(1, 1, 0, 5, Draft({1})));  // a late insert for round 1
  EXPECT_EQ(cache.Lookup(1, 1, 0, 5), nullptr);
  cache.BeginRound(1, 1);  // going back is ignored
  EXPECT_EQ(cache.Lookup(1, 1, 0, 5), nullptr);
  ASSERT_TRUE(cache.Insert(1, 3, 0, 5, Draft({2})));  // inserting for a newer round begins it
  EXPECT_THAT(cache.Lookup(1, 3, 0, 5)->tokens, ElementsAre(2));
}

TEST(SpeculationCacheTest, TakeMovesOutOnceAndClearDropsTheSequence) {
  SpeculationCache cache;
  ASSERT_TRUE(cache.Insert(1, 1, 3, 5, Draft({4, 4})));
  ASSERT_TRUE(cache.Insert(2, 9, 3, 5, Draft({6})));
  EXPECT_FALSE(cache.Take(1, 2, 3, 5).has_value());
  const std::optional<CachedDraft> taken = cache.Take(1, 1, 3, 5);
  ASSERT_TRUE(taken.has_value());
  EXPECT_THAT(taken->tokens, ElementsAre(4, 4));
  EXPECT_FALSE(cache.Take(1, 1, 3, 5).has_value());
  cache.Clear(2);
  EXPECT_EQ(cache.Lookup(2, 9, 3, 5), nullptr);
  EXPECT_EQ(cache.num_sequences(), 1);
  ASSERT_TRUE(cache.Insert(2, 0, 3, 5, Draft({1})));  // a cleared sequence starts afresh
  EXPECT_NE(cache.Lookup(2, 0, 3, 5), nullptr);
}

// A deterministic multi-round simulation of three sequences: every round each sequence caches
// speculations for a few outcomes, some of them arriving late (after the next round began);
// the cache must hit exactly when the outcome was cached for the current round, and always
// return that round's draft.
TEST(SpeculationCacheTest, MultiRoundSimulationMatchesAReferenceModel) {
  SpeculationCache cache;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> small(0, 3);
  std::set<std::tuple<uint64_t, uint64_t, int32_t, int32_t>> cached;  // current rounds only
  auto draft_for = [](uint64_t seq, uint64_t round, int32_t k, int32_t t) {
    return Draft({static_cast<int32_t>(seq), static_cast<int32_t>(round), k, t});
  };
  int hits = 0, misses = 0;
  for (uint64_t round = 1; round <= 60; ++round) {
    for (uint64_t seq = 0; seq < 3; ++seq) {
      if (round == 30 && seq == 1) {
        cache.Clear(seq);
        std::erase_if(cached, [&](const auto& e) { return std::get<0>(e) == seq; });
      }
      cache.BeginRound(seq, round);
      std::erase_if(cached, [&](const auto& e) { return std::get<0>(e) == seq; });
      for (int i = 0; i < 4; ++i) {
        const int32_t k = small(rng), t = small(rng);
        ASSERT_TRUE(cache.Insert(seq, round, k, t, draft_for(seq, round, k, t)));
        cached.emplace(seq, round, k, t);
      }
      EXPECT_FALSE(cache.Insert(seq, round - 1, 0, 0, draft_for(seq, round - 1, 0, 0)));
      const int32_t k = small(rng), t = small(rng);  // the verification outcome
      const CachedDraft* got = cache.Lookup(seq, round, k, t);
      if (cached.contains({seq, round, k, t})) {
        ++hits;
        ASSERT_NE(got, nullptr);
        EXPECT_EQ(got->tokens, draft_for(seq, round, k, t).tokens);
      } else {
        ++misses;
        EXPECT_EQ(got, nullptr);
      }
    }
  }
  EXPECT_GT(hits, 20);  // both branches exercised
  EXPECT_GT(misses, 20);
}

}  // namespace
}  // namespace specd
