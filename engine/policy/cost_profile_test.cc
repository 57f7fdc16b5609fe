#include "engine/policy/cost_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace specd {
namespace {

// ms = 10 + b + 2 t + c / 1000 at every sample: affine, so interpolation is exact inside.
CostGrid Affine() {
  std::vector<double> ms;
  for (int b : {1, 4, 16}) {
    for (int t : {1, 5}) {
      for (int c : {1000, 3000}) ms.push_back(10 + b + 2 * t + c / 1000.0);
    }
  }
  return *CostGrid::Create({1, 4, 16}, {1, 5}, {1000, 3000}, ms);
}

CostProfile SampleProfile() {
  auto plain = CostGrid::Create({1, 8}, {1}, {512, 4096}, {10, 12, 14, 18});
  CostProfile profile(*plain);
  profile.device = "synthetic";
  profile.models = "target / draft";
  profile.SetVerify(Affine());
  MethodCosts draft;
  draft.draft = *CostGrid::Create({1, 8}, {1, 4}, {512}, {1.5, 6, 2.5, 9.25});
  profile.SetMethod(PolicyMethod::kDraftModel, draft);
  profile.SetMethod(PolicyMethod::kNgram, {});
  MethodCosts vegas;
  vegas.verify = CostGrid::Constant(30);
  profile.SetMethod(PolicyMethod::kVegas, vegas);
  return profile;
}

// SampleProfile with an EAGLE-3 head (K head steps of 0.2 ms at batch 1) and its draft model
// drafting in parallel (one pass: 2 ms at K 1, 2.5 ms at K 4).
CostProfile HeadAndParallelProfile() {
  CostProfile profile = SampleProfile();
  MethodCosts head;
  head.draft =
      *CostGrid::Create({1, 8}, {1, 4}, {512, 4096}, {0.2, 0.25, 0.8, 1, 0.3, 0.4, 1.2, 1.6});
  profile.SetMethod(PolicyMethod::kEagle3, head);
  MethodCosts parallel;
  parallel.draft = *CostGrid::Create({1, 8}, {1, 4}, {512}, {2, 2.5, 3, 6});
  parallel.parallel = true;
  profile.SetMethod(PolicyMethod::kDraftModel, parallel);
  return profile;
}

TEST(CostGridTest, InterpolatesLinearlyBetweenSamples) {
  const CostGrid g = Affine();
  EXPECT_DOUBLE_EQ(g.Ms(4, 5, 1000), 10 + 4 + 10 + 1);     // a sample
  EXPECT_DOUBLE_EQ(g.Ms(10, 3, 2000), 10 + 10 + 6 + 2);    // inside on all three axes
  EXPECT_DOUBLE_EQ(g.Ms(2.5, 1, 1000), 10 + 2.5 + 2 + 1);  // between batch 1 and 4
}

TEST(CostGridTest, HoldsBelowAndExtendsPastTheSamples) {
  const CostGrid g = Affine();
  EXPECT_DOUBLE_EQ(g.Ms(1, 1, 10), g.Ms(1, 1, 1000));    // below the first context: held
  EXPECT_DOUBLE_EQ(g.Ms(32, 1, 1000), 10 + 32 + 2 + 1);  // past batch 16: the last slope
  EXPECT_DOUBLE_EQ(g.Ms(1, 9, 1000), 10 + 1 + 18 + 1);   // past 5 tokens
  // A last segment that falls never predicts less than the last sample.
  const CostGrid falling = *CostGrid::Create({1, 2}, {1}, {1}, {10, 8});
  EXPECT_DOUBLE_EQ(falling.Ms(100, 1, 1), 8);
}

TEST(CostGridTest, RefusesBadAxesAndValues) {
  EXPECT_FALSE(CostGrid::Create({4, 1}, {1}, {1}, {1, 2}).ok());  // not ascending
  EXPECT_FALSE(CostGrid::Create({0}, {1}, {1}, {1}).ok());        // not positive
  EXPECT_FALSE(CostGrid::Create({1}, {1}, {1}, {1, 2}).ok());     // wrong count
  EXPECT_FALSE(CostGrid::Create({1}, {1}, {1}, {-1}).ok());       // negative time
}

TEST(CostProfileTest, MethodNamesRoundTrip) {
  for (PolicyMethod m : kAllPolicyMethods) {
    auto parsed = ParsePolicyMethod(PolicyMethodName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_EQ(ParsePolicyMethod("eagle").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParsePolicyMethod("eagle3"), PolicyMethod::kEagle3);
}

TEST(CostProfileTest, AnswersPerMethod) {
  const CostProfile p = SampleProfile();
  EXPECT_TRUE(p.Has(PolicyMethod::kPlain));
  EXPECT_TRUE(p.Has(PolicyMethod::kNgram));
  EXPECT_FALSE(p.Has(PolicyMethod::kSsd));
  EXPECT_EQ(p.MaxK(PolicyMethod::kDraftModel), 4);  // min(verify 5 - 1, draft 4)
  EXPECT_EQ(p.MaxK(PolicyMethod::kNgram), 4);
  EXPECT_EQ(p.MaxK(PolicyMethod::kVegas), 0);  // its constant grid measured 1 token only
  EXPECT_DOUBLE_EQ(p.PlainMs(8, 4096), 18);
  EXPECT_DOUBLE_EQ(p.VerifyMs(PolicyMethod::kNgram, 4, 5, 1000), 10 + 4 + 10 + 1);  // dense
  EXPECT_DOUBLE_EQ(p.VerifyMs(PolicyMethod::kVegas, 4, 5, 1000), 30);               // its own
  EXPECT_DOUBLE_EQ(p.DraftMs(PolicyMethod::kDraftModel, 8, 4, 512), 9.25);
  EXPECT_DOUBLE_EQ(p.DraftMs(PolicyMethod::kNgram, 8, 4, 512), 0);
  // Catch-up per token: the one-token pass at the largest batch (8 rows: 2.5 ms) over 8.
  EXPECT_DOUBLE_EQ(p.CatchUpMsPerToken(PolicyMethod::kDraftModel, 512), 2.5 / 8);
  EXPECT_DOUBLE_EQ(p.CatchUpMsPerToken(PolicyMethod::kNgram, 512), 0);
}

TEST(CostProfileTest, RoundTripsThroughItsFile) {
  const CostProfile p = SampleProfile();
  const std::string path = ::testing::TempDir() + "/cost_profile_test.json";
  ASSERT_TRUE(p.Save(path).ok());
  auto loaded = CostProfile::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->ToJson(), p.ToJson());
  EXPECT_EQ(loaded->device, "synthetic");
  EXPECT_EQ(loaded->models, "target / draft");
  EXPECT_TRUE(loaded->calibrate);
  for (PolicyMethod m : kAllPolicyMethods) EXPECT_EQ(loaded->Has(m), p.Has(m));
  EXPECT_DOUBLE_EQ(loaded->VerifyMs(PolicyMethod::kDraftModel, 7, 3, 2500),
                   p.VerifyMs(PolicyMethod::kDraftModel, 7, 3, 2500));
  EXPECT_DOUBLE_EQ(loaded->DraftMs(PolicyMethod::kDraftModel, 3, 2, 512),
                   p.DraftMs(PolicyMethod::kDraftModel, 3, 2, 512));
  std::remove(path.c_str());
  // "calibrate": false survives the round trip.
  CostProfile fixed = SampleProfile();
  fixed.calibrate = false;
  auto reparsed = CostProfile::FromJson(fixed.ToJson());
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_FALSE(reparsed->calibrate);
}

TEST(CostProfileTest, RoundTripsTheHeadAndAParallelDraftModel) {
  const CostProfile p = HeadAndParallelProfile();
  auto loaded = CostProfile::FromJson(p.ToJson());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->ToJson(), p.ToJson());
  ASSERT_TRUE(loaded->Has(PolicyMethod::kEagle3));
  EXPECT_EQ(loaded->MaxK(PolicyMethod::kEagle3), 4);  // min(verify 5 - 1, draft 4)
  EXPECT_DOUBLE_EQ(loaded->DraftMs(PolicyMethod::kEagle3, 8, 4, 4096), 1.6);
  EXPECT_DOUBLE_EQ(loaded->VerifyMs(PolicyMethod::kEagle3, 4, 5, 1000),
                   p.VerifyMs(PolicyMethod::kNgram, 4, 5, 1000));  // dense verification
  EXPECT_FALSE(loaded->Costs(PolicyMethod::kEagle3)->parallel);
  ASSERT_NE(loaded->Costs(PolicyMethod::kDraftModel), nullptr);
  EXPECT_TRUE(loaded->Costs(PolicyMethod::kDraftModel)->parallel);
  EXPECT_EQ(loaded->Costs(PolicyMethod::kPlain), nullptr);
  EXPECT_EQ(loaded->Costs(PolicyMethod::kSsd), nullptr);
  // The parallel pass costs what it measured (2.5 ms for four drafts), not four passes.
  EXPECT_DOUBLE_EQ(loaded->DraftMs(PolicyMethod::kDraftModel, 1, 4, 512), 2.5);
  // "parallel" is written only when true: a sequential draft's entry is as before.
  EXPECT_NE(p.ToJson().find("\"parallel\": true"), std::string::npos);
  EXPECT_EQ(SampleProfile().ToJson().find("parallel"), std::string::npos);
}

// Returns the error message FromJson gives for `text` (or "ok").
std::string ErrorOf(std::string_view text) {
  auto p = CostProfile::FromJson(text);
  if (p.ok()) return "ok";
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

TEST(CostProfileTest, RefusesMalformedFilesNamingWhere) {
  const std::string good = SampleProfile().ToJson();
  ASSERT_EQ(ErrorOf(good), "ok");
  const std::string plain = R"("plain": {"batch": [1], "context": [512], "ms": [[[10]]]})";
  EXPECT_EQ(ErrorOf(absl::StrCat(R"({"version": 1, )", plain, "}")), "ok");  // tokens optional

  // A syntax error names its line and column.
  EXPECT_NE(ErrorOf("{\n \"version\": 1,\n \"plain\": [1,,2]\n}").find("line 3, column"),
            std::string::npos)
      << ErrorOf("{\n \"version\": 1,\n \"plain\": [1,,2]\n}");
  // Bad values name the field path.
  const std::pair<std::string, std::string> cases[] = {
      {absl::StrCat(R"({"version": 2, )", plain, "}"), "version"},
      {R"({"version": 1})", "plain: is missing"},
      {absl::StrCat(R"({"version": 1, "colour": 1, )", plain, "}"), "colour: unknown field"},
      {R"({"version": 1, "plain": {"batch": [4, 2], "context": [1], "ms": [[[1]], [[1]]]}})",
       "plain.batch[1]"},
      {R"({"version": 1, "plain": {"batch": [1], "context": [1, 2], "ms": [[[1]]]}})",
       "plain.ms[0][0]: expected an array of 2 (one per context), got 1"},
      {R"({"version": 1, "plain": {"batch": [1], "context": [1], "ms": [[["x"]]]}})",
       "plain.ms[0][0][0]"},
      {R"({"version": 1, "plain": {"batch": [1], "tokens": [1, 2], "context": [1],
          "ms": [[[1], [2]]]}})",
       "plain.tokens"},
      {absl::StrCat(R"({"version": 1, "calibrate": "no", )", plain, "}"),
       "calibrate: must be true or false"},
      {absl::StrCat(R"({"version": 1, )", plain, R"(, "methods": {"eagle": {}}})"),
       "methods.eagle: unknown method"},
      {absl::StrCat(R"({"version": 1, )", plain, R"(, "methods": {"ngram": {}}})"),
       "methods.ngram.verify: is missing"},
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "methods": {"vegas": {"verify": {"batch": [1], "context": [1],)",
                    R"( "ms": [[[0]]]}}}})"),
       "methods.vegas.verify.ms[0][0][0]: must be a positive number"},
      // The new entries: the head's grid, and "parallel" only as the draft model's boolean.
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "verify": {"batch": [1], "context": [1], "ms": [[[1]]]},)",
                    R"( "methods": {"eagle3": {"draft": {"batch": [1], "tokens": [1, 2],)",
                    R"( "context": [1], "ms": [[[1]]]}}}})"),
       "methods.eagle3.draft.ms[0]: expected an array of 2 (one per tokens value), got 1"},
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "verify": {"batch": [1], "context": [1], "ms": [[[1]]]},)",
                    R"( "methods": {"eagle3": {"steps": {}}}})"),
       "methods.eagle3.steps: unknown field (expected one of: draft, verify, parallel)"},
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "verify": {"batch": [1], "context": [1], "ms": [[[1]]]},)",
                    R"( "methods": {"eagle3": {"parallel": true}}})"),
       "methods.eagle3.parallel: only draft_model drafts in parallel"},
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "verify": {"batch": [1], "context": [1], "ms": [[[1]]]},)",
                    R"( "methods": {"draft_model": {"parallel": "yes"}}})"),
       "methods.draft_model.parallel: must be true or false"},
      {absl::StrCat(R"({"version": 1, )", plain,
                    R"(, "verify": {"batch": [1], "context": [1], "ms": [[[1]]]},)",
                    R"( "methods": {"draft_model": {"parallel": true}}})"),
       "methods.draft_model.parallel: a parallel draft model needs its \"draft\" grid"},
      {absl::StrCat(R"({"version": 1, )", plain, R"(, "methods": {"eagle3": {}}})"),
       "methods.eagle3.verify: is missing"},
      {absl::StrCat(R"({"version": 1, )", plain, R"(, "methods": {"eagle": {}}})"),
       "expected draft_model, ngram, ssd, vegas, streaming, ssv, eagle3"},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_NE(ErrorOf(text).find(want), std::string::npos)
        << "want \"" << want << "\" in: " << ErrorOf(text);
  }
}

TEST(CostProfileTest, LoadNamesTheFile) {
  EXPECT_EQ(CostProfile::Load("/nonexistent/profile.json").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = ::testing::TempDir() + "/cost_profile_bad.json";
  std::ofstream(path) << "{\"version\": 1}\n";
  auto p = CostProfile::Load(path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(path), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace specd
