#include "engine/sample/sampler.h"

#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

std::vector<float> LogitsFromProbs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

std::vector<int> Histogram(const SamplingParams& params, const std::vector<double>& probs, int n,
                           uint64_t seed = 7) {
  Sampler sampler(params, seed);
  TokenHistory history;
  std::vector<int> counts(probs.size());
  for (int i = 0; i < n; ++i) {
    auto logits = LogitsFromProbs(probs);
    counts[sampler.Sample(logits, history).id]++;
  }
  return counts;
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 1);
  TokenHistory h;
  std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.Sample(logits, h).id, 1);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 1);
  TokenHistory h;
  h.AddPrompt(std::vector<int32_t>{0});
  h.AddOutput(1);
  // 0: 3.0 -> 1.5; 1: -0.5 -> -1.0; 2 untouched at 2.0 wins.
  std::vector<float> logits = {3.0f, -0.5f, 2.0f};
  EXPECT_EQ(s.Sample(logits, h).id, 2);
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[1], -1.0f);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOutputOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 1);
  TokenHistory h;
  h.AddPrompt(std::vector<int32_t>{2});
  h.AddOutput(0);
  h.AddOutput(0);
  std::vector<float> logits = {1.0f, 0.0f, 0.9f};
  EXPECT_EQ(s.Sample(logits, h).id, 2);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(logits[2], 0.9f);  // prompt tokens are not penalised
}

TEST(SamplerTest, BannedIdsAreNeverChosen) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 1);
  TokenHistory h;
  std::vector<float> logits = {5.0f, 1.0f};
  std::vector<int32_t> banned = {0};
  EXPECT_EQ(s.Sample(logits, h, banned).id, 1);
}

TEST(SamplerTest, SameSeedSameDrawsDifferentSeedDifferentDraws) {
  SamplingParams p;
  std::vector<double> probs(50, 1.0 / 50);
  auto draw = [&](uint64_t seed) {
    Sampler s(p, seed);
    TokenHistory h;
    std::vector<int32_t> ids;
    for (int i = 0; i < 32; ++i) {
      auto l = LogitsFromProbs(probs);
      ids.push_back(s.Sample(l, h).id);
    }
    return ids;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

// Pearson chi-square against the expected counts; 3 degrees of freedom, p = 0.001 -> 16.27.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& expected_p, int n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected_p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " must never be drawn";
      continue;
    }
    double e = expected_p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  const int n = 40000;
  auto counts = Histogram(SamplingParams{}, probs, n);
  EXPECT_LT(ChiSquare(counts, probs, n), 16.27);
}

TEST(SamplerTest, TemperatureSharpensDistribution) {
  SamplingParams p;
  p.temperature = 0.5f;
  std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  std::vector<double> sharpened;
  double z = 0;
  for (double v : probs) z += v * v;
  for (double v : probs) sharpened.push_back(v * v / z);
  const int n = 40000;
  EXPECT_LT(ChiSquare(Histogram(p, probs, n), sharpened, n), 16.27);
}

TEST(SamplerTest, TopKTopPMinPTruncateAndRenormalise) {
  std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  const int n = 20000;
  SamplingParams top_k;
  top_k.top_k = 2;
  EXPECT_LT(ChiSquare(Histogram(top_k, probs, n), {0.625, 0.375, 0, 0}, n), 16.27);
  SamplingParams top_p;
  top_p.top_p = 0.7f;  // 0.5 < 0.7 keeps the second token; 0.8 >= 0.7 drops the rest
  EXPECT_LT(ChiSquare(Histogram(top_p, probs, n), {0.625, 0.375, 0, 0}, n), 16.27);
  SamplingParams min_p;
  min_p.min_p = 0.25f;  // keeps p >= 0.125
  EXPECT_LT(ChiSquare(Histogram(min_p, probs, n), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n),
            16.27);
}

TEST(SamplerTest, LogprobsAreRawAndTopNSorted) {
  SamplingParams p;
  p.temperature = 0.3f;
  p.logprobs = 2;
  p.repetition_penalty = 1.5f;
  Sampler s(p, 3);
  TokenHistory h;
  h.AddOutput(0);
  std::vector<double> probs = {0.6, 0.1, 0.3};
  auto logits = LogitsFromProbs(probs);
  SampleResult r = s.Sample(logits, h);
  EXPECT_NEAR(r.logprob, std::log(probs[r.id]), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 0);
  EXPECT_NEAR(r.top[0].logprob, std::log(0.6), 1e-6);
  EXPECT_EQ(r.top[1].id, 2);
}

TEST(SamplingParamsTest, RejectsOutOfRangeValues) {
  const int32_t vocab = 100;
  EXPECT_TRUE(SamplingParams{}.Validate(vocab).ok());
  auto bad = [&](auto mutate) {
    SamplingParams p;
    mutate(p);
    return p.Validate(vocab).code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = -1; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.temperature = NAN; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_p = 0; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.top_k = -2; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.min_p = 1.5f; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.repetition_penalty = 0; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.presence_penalty = 3; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.frequency_penalty = INFINITY; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.max_tokens = 0; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logprobs = 21; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.stop = {""}; }));
  EXPECT_TRUE(bad([](SamplingParams& p) { p.stop_token_ids = {vocab}; }));
}

TEST(SamplingParamsTest, CapsStopStringCountAndLength) {
  SamplingParams p;
  p.stop.assign(kMaxStopStrings, std::string(kMaxStopStringBytes, 'x'));
  EXPECT_TRUE(p.Validate(100).ok());
  p.stop.push_back("y");  // 65 strings
  absl::Status s = p.Validate(100);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "stop ")) << s;
  p.stop.assign(1, std::string(kMaxStopStringBytes + 1, 'x'));
  EXPECT_EQ(p.Validate(100).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
