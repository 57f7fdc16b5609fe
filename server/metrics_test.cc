#include "server/metrics.h"

#include "gtest/gtest.h"

namespace specd {
namespace {

// Labelled families (http_responses, accepted_tokens_per_pos) appear once a child exists.
TEST(MetricsTest, RendersEveryFamilyWithSpecdPrefix) {
  Metrics m;
  const std::string text = m.Render();
  for (const char* name : {"specd_requests_total",
                           "specd_prompt_tokens_total",
                           "specd_generation_tokens_total",
                           "specd_time_to_first_token_seconds",
                           "specd_inter_token_latency_seconds",
                           "specd_e2e_request_latency_seconds",
                           "specd_request_queue_time_seconds",
                           "specd_num_requests_running",
                           "specd_num_requests_waiting",
                           "specd_num_requests_paused",
                           "specd_kv_cache_blocks_used",
                           "specd_kv_cache_blocks_capacity",
                           "specd_prefix_cache_queries_total",
                           "specd_prefix_cache_hits_total",
                           "specd_num_preemptions_total",
                           "specd_spec_decode_num_drafts_total",
                           "specd_spec_decode_num_draft_tokens_total",
                           "specd_spec_decode_num_accepted_tokens_total",
                           "specd_spec_decode_accepted_length",
                           "specd_spec_decode_draft_seconds",
                           "specd_spec_decode_verify_seconds"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name), std::string::npos) << name;
  }
}

TEST(MetricsTest, ObserverCallsShowUpInTheText) {
  Metrics m;
  FinishedRequestMetrics f;
  f.outcome = RequestOutcome::kLength;
  f.prompt_tokens = 7;
  f.generated_tokens = 3;
  f.ttft_seconds = 0.2;
  f.e2e_seconds = 1.0;
  m.OnRequestFinished(f);
  m.OnInterTokenLatency(0.01);
  m.OnPrefixCache(4, 1);
  m.OnPreemption(2);
  EngineStats s;
  s.num_running = 3;
  s.kv_blocks_used = 9;
  s.kv_blocks_total = 100;
  m.OnStep(s);
  m.OnHttpResponse(429);
  const std::string text = m.Render();
  EXPECT_NE(text.find("specd_requests_total{outcome=\"length\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("specd_prompt_tokens_total 7"), std::string::npos);
  EXPECT_NE(text.find("specd_generation_tokens_total 3"), std::string::npos);
  EXPECT_NE(text.find("specd_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(text.find("specd_inter_token_latency_seconds_count 1"), std::string::npos);
  EXPECT_NE(text.find("specd_prefix_cache_queries_total 4"), std::string::npos);
  EXPECT_NE(text.find("specd_prefix_cache_hits_total 1"), std::string::npos);
  EXPECT_NE(text.find("specd_num_preemptions_total 2"), std::string::npos);
  EXPECT_NE(text.find("specd_num_requests_running 3"), std::string::npos);
  EXPECT_NE(text.find("specd_kv_cache_blocks_used 9"), std::string::npos);
  EXPECT_NE(text.find("specd_kv_cache_blocks_capacity 100"), std::string::npos);
  EXPECT_NE(text.find("specd_http_responses_total{code=\"429\"} 1"), std::string::npos);
}

TEST(MetricsTest, SpeculationCountsRoundsTokensAndPositions) {
  Metrics m;
  SpeculationStepMetrics step;
  step.num_draft_tokens = {4, 4, 2};
  step.num_accepted = {4, 1, 0};
  step.draft_seconds = 0.002;
  step.verify_seconds = 0.01;
  m.OnSpeculation(step);
  step.num_draft_tokens = {64};
  step.num_accepted = {64};
  m.OnSpeculation(step);
  m.OnSpeculation(SpeculationStepMetrics{});  // a step without drafts: nothing
  const std::string text = m.Render();
  EXPECT_NE(text.find("specd_spec_decode_num_drafts_total 4"), std::string::npos) << text;
  EXPECT_NE(text.find("specd_spec_decode_num_draft_tokens_total 74"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_num_accepted_tokens_total 69"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 3"),
            std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"4\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"63\"} 1"),
            std::string::npos);
  EXPECT_EQ(text.find("position=\"64\""), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_accepted_length_count 4"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_accepted_length_bucket{le=\"0\"} 1"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_accepted_length_bucket{le=\"1\"} 2"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_accepted_length_bucket{le=\"16\"} 3"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_draft_seconds_count 2"), std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_verify_seconds_count 2"), std::string::npos);
}

TEST(MetricsTest, RequestsWithoutTokensSkipTheTtftHistogram) {
  Metrics m;
  FinishedRequestMetrics f;
  f.outcome = RequestOutcome::kAbort;
  f.ttft_seconds = -1;
  m.OnRequestFinished(f);
  const std::string text = m.Render();
  EXPECT_NE(text.find("specd_time_to_first_token_seconds_count 0"), std::string::npos);
  EXPECT_NE(text.find("specd_e2e_request_latency_seconds_count 1"), std::string::npos);
}

}  // namespace
}  // namespace specd
