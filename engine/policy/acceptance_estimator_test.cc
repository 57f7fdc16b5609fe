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

TEST(AcceptanceEstimatorTest, OptionsAreValidated) {
  EXPECT_TRUE(AcceptanceOptions{}.Validate().ok());
  AcceptanceOptions bad;
  bad.request_weight = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = {};
  bad.prior = 1.5;
  EXPECT_FALSE(bad.Validate().ok());
}

}  // namespace
}  // namespace specd
