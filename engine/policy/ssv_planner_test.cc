#include "engine/policy/ssv_planner.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_replace.h"
#include "engine/policy/acceptance_estimator.h"

namespace specd {
namespace {

SsvStrategy Strategy(SsvMode mode, int32_t c, int32_t r) {
  SsvStrategy s;
  s.mode = mode;
  s.group_size = c;
  s.refresh_every = r;
  return s;
}

// A verification grid whose time is `base` + 0.5 ms per token at every batch and context.
CostGrid Verify(double base) {
  return *CostGrid::Create({1, 8}, {1, 9}, {1024},
                           {base + 0.5, base + 4.5, base + 0.5, base + 4.5});
}

// An NSA target's profile: the dense (per-query) pass at 10 ms + tokens, an EAGLE-3 head at 1 ms
// a draft, and three measured strategies: exact C 1 (the dense pass), exact C 4 (2 ms less),
// shared C 4 (lossy, 5 ms less).
CostProfile NsaProfile() {
  CostProfile p(CostGrid::Constant(10));
  p.SetVerify(Verify(10));
  MethodCosts head;
  head.draft = *CostGrid::Create({1}, {1, 8}, {1024}, {1, 8});
  p.SetMethod(PolicyMethod::kEagle3, head);
  p.SetSsv(Strategy(SsvMode::kExact, 1, 1), Verify(10));
  p.SetSsv(Strategy(SsvMode::kExact, 4, 1), Verify(8));
  p.SetSsv(Strategy(SsvMode::kShared, 4, 1), Verify(5));
  p.ssv_alpha = 0.8;
  return p;
}

TEST(SsvPlannerTest, RanksStrategiesByTheirRoundsAtTheProfilesAlpha) {
  const CostProfile profile = NsaProfile();
  const SsvPlanner planner(profile);
  // K 7: the head drafts in 7 ms; exact C 4 verifies 8 tokens in 8 + 4 = 12 ms.
  const std::vector<SsvRanked> lossless =
      planner.Rank(PolicyMethod::kEagle3, 1, 7, 1024, /*allow_lossy=*/false, nullptr);
  ASSERT_EQ(lossless.size(), 2u);
  EXPECT_EQ(lossless[0].index, 1u);  // exact C 4
  EXPECT_EQ(lossless[1].index, 0u);
  EXPECT_DOUBLE_EQ(lossless[0].round_ms, 7 + 12);
  EXPECT_DOUBLE_EQ(lossless[0].alpha, 0.8);
  EXPECT_NEAR(lossless[0].tokens_per_second, 1e3 * ExpectedCommittedTokens({0.8}, 7) / 19, 1e-9);
  // Lossy strategies only when the request allows them.
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, true, nullptr), 2);
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, false, nullptr), 1);
}

TEST(SsvPlannerTest, ALossyStrategyWhoseAcceptanceDepartsLosesItsRank) {
  const CostProfile profile = NsaProfile();
  const SsvPlanner planner(profile);
  SsvAcceptance measured;
  // Lossless rounds: 6 of 7 drafts accepted each time (alpha 6 / 7).
  for (int i = 0; i < 8; ++i) measured.Note(1, false, 7, 6, planner.options());
  EXPECT_NEAR(measured.Alpha(1, false, 0.8, planner.options()), 6.0 / 7, 1e-12);
  // Before the lossy strategy has its own rounds it is valued at the lossless acceptance.
  EXPECT_NEAR(measured.Alpha(2, true, 0.8, planner.options()), 6.0 / 7, 1e-12);
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, true, &measured), 2);
  // Under shared mode the request accepts one draft a round: the strategy moves down, and the
  // next-ranked (exact C 4) takes over.
  for (int i = 0; i < 7; ++i) measured.Note(2, true, 7, 1, planner.options());
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, true, &measured), 2)
      << "fewer than min_rounds rounds: not yet its own estimate";
  measured.Note(2, true, 7, 1, planner.options());
  EXPECT_NEAR(measured.Alpha(2, true, 0.8, planner.options()), 0.5, 1e-12);
  const std::vector<SsvRanked> ranked =
      planner.Rank(PolicyMethod::kEagle3, 1, 7, 1024, true, &measured);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].index, 1u);
  EXPECT_EQ(ranked[1].index, 0u);
  EXPECT_EQ(ranked[2].index, 2u);
  // The lossy rounds did not move the lossless estimate.
  EXPECT_NEAR(measured.Alpha(0, false, 0.8, planner.options()), 6.0 / 7, 1e-12);
}

TEST(SsvPlannerTest, AHeldStrategyStaysWhileItIsWithinTheSwitchMargin) {
  CostProfile profile = NsaProfile();
  // A lossless strategy 2% slower than exact C 4 (at K 7: 19 ms against 19.4 ms).
  profile.SetSsv({.group_size = 2}, Verify(8.4));
  const SsvPlanner planner(profile);
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, false, nullptr), 1);
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, false, nullptr, /*held=*/3), 3);
  // Exact C 1 is 10% slower: the request moves.
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, false, nullptr, /*held=*/0), 1);
  // A held lossy strategy the request may not take is dropped.
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, false, nullptr, /*held=*/2), 1);
}

TEST(SsvPlannerTest, EmptyWithoutStrategiesAndRoundsWithoutDraftsAreIgnored) {
  CostProfile dense(CostGrid::Constant(10));
  dense.SetVerify(Verify(10));
  const SsvPlanner planner(dense);
  EXPECT_TRUE(planner.empty());
  EXPECT_EQ(planner.Choose(PolicyMethod::kEagle3, 1, 7, 1024, true, nullptr), -1);
  SsvAcceptance measured;
  for (int i = 0; i < 20; ++i) measured.Note(0, false, 0, 0, planner.options());
  EXPECT_DOUBLE_EQ(measured.Alpha(0, false, 0.7, planner.options()), 0.7);
}

TEST(SsvCostProfileTest, LosslessStrategiesPriceVerificationAndTheSectionRoundTrips) {
  const CostProfile profile = NsaProfile();
  // The dense grid is 10 + 0.5 t; exact C 4 is cheaper; shared C 4 (lossy) is not counted.
  EXPECT_DOUBLE_EQ(profile.VerifyMs(PolicyMethod::kEagle3, 1, 8, 1024), 8 + 4);
  const std::string json = profile.ToJson();
  const absl::StatusOr<CostProfile> back = CostProfile::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->ssv().size(), 3u);
  EXPECT_DOUBLE_EQ(back->ssv_alpha, 0.8);
  for (const SsvCosts& c : profile.ssv()) {
    bool found = false;
    for (const SsvCosts& d : back->ssv()) {
      if (d.strategy != c.strategy) continue;
      found = true;
      EXPECT_EQ(d.verify.ms(), c.verify.ms()) << SsvStrategyName(c.strategy);
    }
    EXPECT_TRUE(found) << SsvStrategyName(c.strategy);
  }
}

TEST(SsvCostProfileTest, BadSsvSectionsNameTheirField) {
  const std::string good = NsaProfile().ToJson();
  struct Case {
    std::string from, to, field;
  };
  const Case cases[] = {
      {"\"exact/c4/r1\"", "\"exact/c4\"", "ssv.strategies.exact/c4"},
      {"\"exact/c4/r1\"", "\"exact/c99/r1\"", "ssv.strategies.exact/c99/r1"},
      {"\"alpha\": 0.8", "\"alpha\": 1.5", "ssv.alpha"},
      {"\"alpha\": 0.8", "\"alpha\": 0.8, \"rank\": 1", "ssv.rank"},
  };
  for (const Case& c : cases) {
    const std::string text = absl::StrReplaceAll(good, {{c.from, c.to}});
    ASSERT_NE(text, good) << c.from;
    const absl::StatusOr<CostProfile> p = CostProfile::FromJson(text);
    ASSERT_FALSE(p.ok()) << c.to;
    EXPECT_NE(p.status().message().find(c.field), std::string::npos) << p.status();
  }
}

}  // namespace
}  // namespace specd
