#include "engine/policy/acceptance_estimator.h"

#include <gtest/gtest.h>

#include <cmath>

namespace specd {
namespace {

TEST(ExpectedCommittedTokensTest, MatchesTheClosedForm) {
  for (double a : {0.0, 0.3, 0.8, 0.95}) {
    for (int k : {0, 1, 4, 7}) {
      EXPECT_NEAR(ExpectedCommittedTokens({a}, k), (1 - std::pow(a, k + 1)) / (1 - a), 1e-12)
          << a << " " << k;
    }
  }
  EXPECT_DOUBLE_EQ(ExpectedCommittedTokens({1.0}, 5), 6);
  // Per-position rates: 1 + 0.9 + 0.9 * 0.5.
  EXPECT_DOUBLE_EQ(ExpectedCommittedTokens({0.9, 0.5}, 2), 2.35);
}

TEST(AcceptanceEstimatorTest, StartsFromTheGlobalAverageAndFollowsTheRequest) {
  AcceptanceOptions options;
  options.request_weight = 0.5;
  options.global_weight = 0.1;
  options.prior = 0.6;
  AcceptanceEstimator est(options);
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kNgram, 0), 0.6);
  EXPECT_DOUBLE_EQ(est.ExpectedCommitted(7, PolicyMethod::kNgram, 1), 1.6);
  EXPECT_DOUBLE_EQ(est.ExpectedCommitted(7, PolicyMethod::kPlain, 5), 1);
  // 4 drafted, 1 accepted: position 0 accepted, position 1 rejected, 2 and 3 untested.
  est.Observe(7, PolicyMethod::kNgram, 4, 1);
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kNgram, 0), 0.8);  // 0.6 + 0.5 * 0.4
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kNgram, 1), 0.3);  // 0.6 - 0.5 * 0.6
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kNgram, 2), 0.6);  // untouched
  EXPECT_DOUBLE_EQ(est.GlobalRate(PolicyMethod::kNgram, 0), 0.64);
  // Other requests and methods still read the global averages.
  EXPECT_DOUBLE_EQ(est.Rate(8, PolicyMethod::kNgram, 1), 0.54);
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kDraftModel, 0), 0.6);
  // A new request's first round starts from the moved global average.
  est.Observe(8, PolicyMethod::kNgram, 1, 1);
  EXPECT_DOUBLE_EQ(est.Rate(8, PolicyMethod::kNgram, 0), 0.64 + 0.5 * 0.36);
  est.Forget(7);
  EXPECT_EQ(est.num_requests(), 1u);
  EXPECT_DOUBLE_EQ(est.Rate(7, PolicyMethod::kNgram, 1), est.GlobalRate(PolicyMethod::kNgram, 1));
}

TEST(AcceptanceEstimatorTest, ExpectedCommittedAtEveryKInOnePass) {
  AcceptanceEstimator est;
  est.Observe(3, PolicyMethod::kDraftModel, 4, 2);
  est.Observe(3, PolicyMethod::kDraftModel, 4, 1);
  std::vector<double> all;
  for (PolicyMethod m : {PolicyMethod::kDraftModel, PolicyMethod::kNgram, PolicyMethod::kPlain}) {
    est.ExpectedCommittedUpTo(3, m, 20, &all);
    ASSERT_EQ(all.size(), 21u);
    for (int32_t k = 0; k <= 20; ++k) {
      EXPECT_NEAR(all[k], est.ExpectedCommitted(3, m, k), 1e-12) << k;
    }
  }
  EXPECT_GT(all.size(), 0u);
  est.ExpectedCommittedUpTo(3, PolicyMethod::kNgram, 0, &all);
  EXPECT_EQ(all, std::vector<double>{1.0});
}

TEST(AcceptanceEstimatorTest, RoundsWithoutADraftMoveOnlyTheOfferRate) {
  AcceptanceEstimator est;
  est.Observe(1, PolicyMethod::kNgram, 4, 4);
  const double rate = est.Rate(1, PolicyMethod::kNgram, 0);
  const double full = est.ExpectedCommitted(1, PolicyMethod::kNgram, 4);
  EXPECT_DOUBLE_EQ(est.OfferRate(1, PolicyMethod::kNgram), 1);
  est.Observe(1, PolicyMethod::kNgram, 0, 0);  // no n-gram match this round
  EXPECT_DOUBLE_EQ(est.Rate(1, PolicyMethod::kNgram, 0), rate);
  EXPECT_DOUBLE_EQ(est.OfferRate(1, PolicyMethod::kNgram), 0.7);
  EXPECT_DOUBLE_EQ(est.ExpectedCommitted(1, PolicyMethod::kNgram, 4), 1 + 0.7 * (full - 1));
  EXPECT_LT(est.OfferRate(2, PolicyMethod::kNgram), 1);  // the global offer rate moved too
  EXPECT_DOUBLE_EQ(est.OfferRate(2, PolicyMethod::kDraftModel), 1);
}

TEST(AcceptanceEstimatorTest, AnUnusedEstimateRelaxesTowardsTheGlobalAverage) {
  AcceptanceOptions o;
  o.relax_weight = 0.1;
  AcceptanceEstimator est(o);
  for (int i = 0; i < 20; ++i) est.Observe(1, PolicyMethod::kNgram, 4, 0);  // all rejected
  const double low = est.Rate(1, PolicyMethod::kNgram, 0);
  const double global = est.GlobalRate(PolicyMethod::kNgram, 0);
  ASSERT_LT(low, 0.01);
  ASSERT_GT(global, 0.2);
  for (int i = 0; i < 11; ++i) est.Tick();  // the first does not count
  EXPECT_NEAR(est.Rate(1, PolicyMethod::kNgram, 0), global + std::pow(0.9, 10) * (low - global),
              1e-12);
  // A new round starts from the relaxed estimate.
  est.Observe(1, PolicyMethod::kNgram, 1, 1);
  const double relaxed = global + std::pow(0.9, 10) * (low - global);
  EXPECT_NEAR(est.Rate(1, PolicyMethod::kNgram, 0), relaxed + 0.3 * (1 - relaxed), 1e-12);
  // relax_weight 0: the estimate stays.
  o.relax_weight = 0;
  AcceptanceEstimator fixed(o);
  fixed.Observe(1, PolicyMethod::kNgram, 4, 0);
  const double before = fixed.Rate(1, PolicyMethod::kNgram, 0);
  for (int i = 0; i < 10; ++i) fixed.Tick();
  EXPECT_DOUBLE_EQ(fixed.Rate(1, PolicyMethod::kNgram, 0), before);
}

TEST(AcceptanceEstimatorTest, OptionsAreValidated) {
  EXPECT_TRUE(AcceptanceOptions{}.Validate().ok());
  AcceptanceOptions bad;
  bad.request_weight = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = {};
  bad.prior = 1.5;
  EXPECT_FALSE(bad.Validate().ok());
  bad = {};
  bad.relax_weight = -1;
  EXPECT_FALSE(bad.Validate().ok());
}

}  // namespace
}  // namespace specd
