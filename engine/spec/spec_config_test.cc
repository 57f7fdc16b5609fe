#include "engine/spec/spec_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

TEST(SpeculativeConfigTest, EmptyMeansNoSpeculation) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kNone);
  EXPECT_FALSE(c->enabled());
}

TEST(SpeculativeConfigTest, ParsesVllmStyleDraftModelConfig) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(
      R"({"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 7})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(c->draft_model, "/m/draft");
  EXPECT_EQ(c->num_speculative_tokens, 7);
  EXPECT_EQ(c->speculator_device, "");
  c = ParseSpeculativeConfig(R"({"model": "/m/draft", "speculator_device": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->speculator_device, "cuda:1");
  c = ParseSpeculativeConfig(R"({"model": "/m/draft", "speculator_device": "cpu"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->speculator_device, "cpu");
}

TEST(SpeculativeConfigTest, ModelAloneImpliesDraftModelAndNgramKeepsLookupBounds) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(R"({"model": "d"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(c->num_speculative_tokens, 4);
  c = ParseSpeculativeConfig(R"({"method": "ngram", "prompt_lookup_min": 2,
                                 "prompt_lookup_max": 5})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kNgram);
  EXPECT_EQ(c->prompt_lookup_min, 2);
  EXPECT_EQ(c->prompt_lookup_max, 5);
}

TEST(SpeculativeConfigTest, RejectsBadInputNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "JSON object"},
      {"[1]", "JSON object"},
      {R"({"method": "draft_model"})", "\"model\""},
      {R"({"method": "magic"})", "unknown"},
      {R"({"method": "ssd", "model": "d"})", "not available yet"},
      {R"({"method": 3})", "\"method\""},
      {R"({"num_speculative_tokens": 0, "method": "ngram"})", "num_speculative_tokens"},
      {R"({"num_speculative_tokens": 65, "method": "ngram"})", "num_speculative_tokens"},
      {R"({"num_speculative_tokens": 2.5, "method": "ngram"})", "integer"},
      {R"({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2})",
       "prompt_lookup_min"},
      {R"({"model": ""})", "\"model\""},
      {R"({"model": "d", "speculator_device": -1})", "speculator_device"},
      {R"({"model": "d", "speculator_device": ""})", "speculator_device"},
      {R"({"method": "ngram", "draft_tensor_parallel_size": 1})", "not a known field"},
  };
  for (const auto& [json, message] : cases) {
    absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(c.status().message(), HasSubstr(message)) << json;
  }
}

TEST(ResolveSpeculationTest, RequestOverridesServerDefault) {
  SpeculativeConfig server;
  server.method = SpeculationMethod::kDraftModel;
  server.draft_model = "d";
  server.num_speculative_tokens = 5;
  auto r = ResolveSpeculation({}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(r->num_speculative_tokens, 5);
  r = ResolveSpeculation({SpeculationMethod::kNgram, 3}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kNgram);
  EXPECT_EQ(r->num_speculative_tokens, 3);
  r = ResolveSpeculation({SpeculationMethod::kNone, 0}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
  EXPECT_EQ(r->num_speculative_tokens, 0);
}

TEST(ResolveSpeculationTest, AutoPicksTheDraftModelWhenLoadedElseNgram) {
  const SpeculativeConfig server;  // no speculation by default
  auto r = ResolveSpeculation({SpeculationMethod::kAuto, 0}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kDraftModel);
  r = ResolveSpeculation({SpeculationMethod::kAuto, 0}, server, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kNgram);
  EXPECT_EQ(r->num_speculative_tokens, 4);
  r = ResolveSpeculation({}, server, false);  // nothing asked, nothing configured
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
}

TEST(ResolveSpeculationTest, DraftModelWithoutOneOrBadKIsAnInvalidArgument) {
  const SpeculativeConfig server;
  auto r = ResolveSpeculation({SpeculationMethod::kDraftModel, 4}, server, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--speculative-config"));
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kNgram, -1}, server, false).ok());
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kNgram, 65}, server, false).ok());
  EXPECT_TRUE(ResolveSpeculation({SpeculationMethod::kNgram, 64}, server, false).ok());
}

TEST(ParseSpeculationMethodTest, AcceptsNamesAndAliases) {
  EXPECT_EQ(*ParseSpeculationMethod(""), SpeculationMethod::kDefault);
  EXPECT_EQ(*ParseSpeculationMethod("draft"), SpeculationMethod::kDraftModel);
  EXPECT_EQ(*ParseSpeculationMethod("draft_model"), SpeculationMethod::kDraftModel);
  EXPECT_EQ(*ParseSpeculationMethod("ngram"), SpeculationMethod::kNgram);
  EXPECT_EQ(*ParseSpeculationMethod("auto"), SpeculationMethod::kAuto);
  EXPECT_EQ(*ParseSpeculationMethod("none"), SpeculationMethod::kNone);
  EXPECT_FALSE(ParseSpeculationMethod("Draft").ok());
}

}  // namespace
}  // namespace specd
