#include "server/metrics.h"

#include "absl/strings/str_cat.h"
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
                           "specd_spec_decode_verify_seconds",
                           "specd_policy_switches_total",
                           "specd_policy_searches_total",
                           "specd_policy_host_seconds_total",
                           "specd_policy_estimated_tokens_per_second",
                           "specd_policy_realized_tokens_per_second",
                           "specd_ssv_verification_queries_total",
                           "specd_ssv_adjacent_query_pairs_total",
                           "specd_ssv_adjacent_query_overlap_total"}) {
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

TEST(MetricsTest, SpeculationTimeByMethodAndPhase) {
  Metrics m;
  SpeculationStepMetrics step;
  step.num_draft_tokens = {4};
  step.num_accepted = {2};
  step.by_method = {{"draft_model", 0.25, 0.5, 0.125}, {"ngram", 0.0, 0.5, 0.125}};
  m.OnSpeculation(step);
  m.OnSpeculation(step);
  const std::string text = m.Render();
  EXPECT_NE(
      text.find("specd_spec_decode_seconds_total{method=\"draft_model\",phase=\"draft\"} 0.5"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("specd_spec_decode_seconds_total{method=\"draft_model\",phase=\"verify\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("specd_spec_decode_seconds_total{method=\"ngram\",phase=\"other\"} 0.25"),
            std::string::npos);
  EXPECT_EQ(text.find("method=\"ssd\""), std::string::npos);
}

TEST(MetricsTest, RoundsByMethodAndShapeAndTreeSizes) {
  Metrics m;
  SpeculationStepMetrics step;
  step.num_draft_tokens = {16, 4, 9};
  step.num_accepted = {5, 2, 3};
  step.methods = {"draft_model", "draft_model", "ngram"};
  step.trees = {1, 0, 1};
  m.OnSpeculation(step);
  const std::string text = m.Render();
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  };
  has("specd_spec_decode_rounds_by_method_total{method=\"draft_model\",shape=\"tree\"} 1");
  has("specd_spec_decode_rounds_by_method_total{method=\"draft_model\",shape=\"chain\"} 1");
  has("specd_spec_decode_draft_tokens_by_method_total{method=\"draft_model\",shape=\"tree\"} 16");
  has("specd_spec_decode_accepted_tokens_by_method_total{method=\"ngram\",shape=\"tree\"} 3");
  has("specd_spec_decode_tree_nodes_count 2");
  has("specd_spec_decode_tree_nodes_sum 25");
  has("specd_spec_decode_tree_accepted_length_sum 8");
}

TEST(MetricsTest, SsvLoadsOverlapAndStrategies) {
  Metrics m;
  SpeculationStepMetrics step;
  step.num_draft_tokens = {7, 7};
  step.num_accepted = {3, 7};
  step.ssv = SsvLoadStats{.queries = 96,
                          .per_query_keys = 24000,
                          .grouped_keys = 13000,
                          .per_query_blocks = 768,
                          .grouped_blocks = 300,
                          .overlap_sum = 70.5,
                          .overlap_pairs = 84};
  step.ssv_strategies = {"exact/c4/r1", "shared/c4/r1"};
  m.OnSpeculation(step);
  step.ssv_strategies = {"exact/c4/r1"};
  m.OnSpeculation(step);
  const std::string text = m.Render();
  EXPECT_NE(text.find("specd_ssv_verification_queries_total 192"), std::string::npos) << text;
  EXPECT_NE(text.find("specd_ssv_kv_positions_loaded_total{load=\"per_query\"} 48000"),
            std::string::npos);
  EXPECT_NE(text.find("specd_ssv_kv_positions_loaded_total{load=\"grouped\"} 26000"),
            std::string::npos);
  EXPECT_NE(text.find("specd_ssv_selected_blocks_loaded_total{load=\"grouped\"} 600"),
            std::string::npos);
  EXPECT_NE(text.find("specd_ssv_adjacent_query_pairs_total 168"), std::string::npos);
  EXPECT_NE(text.find("specd_ssv_adjacent_query_overlap_total 141"), std::string::npos);
  EXPECT_NE(text.find("specd_ssv_verification_rounds_total{strategy=\"exact/c4/r1\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("specd_ssv_verification_rounds_total{strategy=\"shared/c4/r1\"} 1"),
            std::string::npos);
}

TEST(MetricsTest, PolicyChoicesPerMethodAndEstimatedVsRealizedTokensPerSecond) {
  Metrics m;
  PolicyStepMetrics step;
  step.rows = {{"draft_model", 1}};
  step.estimated_tokens_per_second = 150;
  step.realized_tokens_per_second = 120;
  m.OnPolicy(step);
  step.rows = {{"none", 16}};
  step.estimated_tokens_per_second = 1100;
  step.realized_tokens_per_second = 1000;
  step.switched = true;
  step.searched = true;
  step.host_seconds = 0.25;
  m.OnPolicy(step);
  step.searched = false;
  m.OnPolicy(step);
  const std::string text = m.Render();
  EXPECT_NE(text.find("specd_policy_request_steps_total{method=\"draft_model\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("specd_policy_request_steps_total{method=\"none\"} 32"), std::string::npos);
  EXPECT_NE(text.find("specd_policy_switches_total 2"), std::string::npos);
  EXPECT_NE(text.find("specd_policy_searches_total 1"), std::string::npos);
  EXPECT_NE(text.find("specd_policy_host_seconds_total 0.5"), std::string::npos);
  EXPECT_NE(text.find("specd_policy_estimated_tokens_per_second 1100"), std::string::npos);
  EXPECT_NE(text.find("specd_policy_realized_tokens_per_second 1000"), std::string::npos);
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

// At start (and while idle) no step speculates: a scrape's snapshot alone must show the link.
TEST(MetricsTest, SsdLinkAndCountersComeFromAnySnapshot) {
  Metrics m;
  EngineStats start;
  start.ssd.emplace();
  start.ssd->connects = 1;
  start.ssd->launches = 1;
  start.ssd->connected = true;
  m.UpdateGauges(start);
  const std::string text = m.Render();
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_connected 1")) << text;
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_connects_total 1"));
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_launches_total 1"));
  EXPECT_TRUE(Has(text, "specd_ssd_refused_joins_total 0"));
  // A rogue process knocked on the speculator port while idle.
  start.ssd->refused_joins = 3;
  m.UpdateGauges(start);
  EXPECT_TRUE(Has(m.Render(), "specd_ssd_refused_joins_total 3"));
  // The speculator dropped while no request ran: the next scrape tells.
  start.ssd->link_failures = 1;
  start.ssd->connected = false;
  m.UpdateGauges(start);
  EXPECT_TRUE(Has(m.Render(), "specd_ssd_speculator_connected 0"));
  EXPECT_TRUE(Has(m.Render(), "specd_ssd_link_failures_total 1"));
}

// A scrape may render a snapshot older than what the last step reported.
TEST(MetricsTest, OlderSsdSnapshotsNeitherRecountNorRevertTheLink) {
  Metrics m;
  SsdStats newer;
  newer.connects = 2;
  newer.link_failures = 1;
  newer.connected = true;
  newer.drafts_hit = 10;
  newer.outcomes_by_accepted_len = {3, 4};
  newer.hits_by_accepted_len = {1, 2};
  SpeculationStepMetrics step;
  step.ssd = &newer;
  m.OnSpeculation(step);
  EngineStats older;
  older.ssd.emplace();
  older.ssd->connects = 1;
  older.ssd->link_failures = 1;
  older.ssd->drafts_hit = 5;
  m.UpdateGauges(older);
  std::string text = m.Render();
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_connected 1")) << text;
  EXPECT_TRUE(Has(text, "specd_ssd_drafts_total{status=\"hit\"} 10"));
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_connects_total 2"));

  newer.drafts_hit = 12;
  newer.link_failures = 2;
  newer.connected = false;
  newer.outcomes_by_accepted_len = {3, 6};
  EngineStats latest;
  latest.ssd = newer;
  m.UpdateGauges(latest);
  m.UpdateGauges(latest);  // twice: counted once
  text = m.Render();
  EXPECT_TRUE(Has(text, "specd_ssd_drafts_total{status=\"hit\"} 12")) << text;
  EXPECT_TRUE(Has(text, "specd_ssd_speculator_connected 0"));
  EXPECT_TRUE(Has(text, "specd_ssd_link_failures_total 2"));
  EXPECT_TRUE(Has(text, "specd_ssd_outcomes_total{accepted_len=\"1\"} 6"));
  EXPECT_TRUE(Has(text, "specd_ssd_cache_hits_total{accepted_len=\"1\"} 2"));
}

// The SSD round's timeline: seconds per (side, stage) and rounds per side, from the cumulative
// snapshots like every SSD counter (an older snapshot changes nothing).
TEST(MetricsTest, SsdRoundTimelineIsExportedPerSideAndStage) {
  Metrics m;
  EngineStats s;
  s.ssd.emplace();
  SsdTimeline& t = s.ssd->timeline;
  t.verifier_rounds = 4;
  t.at(SsdVerifierStage::kWait) = 0.5;
  t.at(SsdVerifierStage::kVerify) = 1.25;
  t.at(SsdVerifierStage::kRest) = 0.125;
  t.speculator_rounds = 3;
  t.at(SsdSpeculatorStage::kBuild) = 0.75;
  m.UpdateGauges(s);
  std::string text = m.Render();
  EXPECT_TRUE(Has(text, "specd_ssd_timeline_rounds_total{side=\"verifier\"} 4")) << text;
  EXPECT_TRUE(Has(text, "specd_ssd_timeline_rounds_total{side=\"speculator\"} 3"));
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"verifier\",stage=\"wait\"} 0.5"));
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"verifier\",stage=\"verify\"} 1.25"));
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"verifier\",stage=\"rest\"} 0.125"));
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"speculator\",stage=\"build\"} 0.75"));
  // Every stage is there from the start, at 0 until it ran.
  for (const char* stage : kSsdVerifierStageNames) {
    EXPECT_NE(text.find(absl::StrCat("side=\"verifier\",stage=\"", stage, "\"}")),
              std::string::npos)
        << stage;
  }
  for (const char* stage : kSsdSpeculatorStageNames) {
    EXPECT_NE(text.find(absl::StrCat("side=\"speculator\",stage=\"", stage, "\"}")),
              std::string::npos)
        << stage;
  }
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"speculator\",stage=\"reply\"} 0"));
  // An older snapshot, then a newer one: counted once.
  EngineStats older = s;
  older.ssd->timeline.verifier_rounds = 2;
  older.ssd->timeline.at(SsdVerifierStage::kWait) = 0.25;
  m.UpdateGauges(older);
  t.verifier_rounds = 6;
  t.at(SsdVerifierStage::kWait) = 0.75;
  m.UpdateGauges(s);
  m.UpdateGauges(s);
  text = m.Render();
  EXPECT_TRUE(Has(text, "specd_ssd_timeline_rounds_total{side=\"verifier\"} 6")) << text;
  EXPECT_TRUE(
      Has(text, "specd_ssd_round_stage_seconds_total{side=\"verifier\",stage=\"wait\"} 0.75"));
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
