#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>
#include <string>

namespace specd {
namespace {

using prometheus::Histogram;

// Label values of specd_requests_total{outcome}, indexed by RequestOutcome.
constexpr const char* kOutcomeLabels[] = {"stop", "length", "abort", "deadline", "error"};

// Buckets as vLLM's metrics use them, so dashboards carry over.
const Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kInterTokenBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3, 0.4,
    0.5,   0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries kRequestBuckets = {
    0.01, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,    10.0,  15.0,
    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// Accepted drafts per verification round: every value up to 16, then coarser to K = 64.
const Histogram::BucketBoundaries kAcceptedLengthBuckets = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20, 24, 32, 48, 64};
// Draft and verification time of one engine step.
const Histogram::BucketBoundaries kSpecStepBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                      1.0,    2.5,     5.0,    10.0};

prometheus::Counter* NewCounter(prometheus::Registry& r, const std::string& name,
                                const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge* NewGauge(prometheus::Registry& r, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

Histogram* NewHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                        const Histogram::BucketBoundaries& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  auto& requests = prometheus::BuildCounter()
                       .Name("specd_requests_total")
                       .Help("Finished engine requests by outcome.")
                       .Register(r);
  for (int i = 0; i < kNumOutcomes; ++i)
    requests_[i] = &requests.Add({{"outcome", kOutcomeLabels[i]}});
  prompt_tokens_ =
      NewCounter(r, "specd_prompt_tokens_total", "Prompt tokens of finished requests.");
  generation_tokens_ =
      NewCounter(r, "specd_generation_tokens_total", "Generated tokens of finished requests.");
  ttft_ = NewHistogram(r, "specd_time_to_first_token_seconds",
                       "Time from arrival to the first generated token.", kTtftBuckets);
  inter_token_ = NewHistogram(r, "specd_inter_token_latency_seconds",
                              "Gap between consecutive tokens of a request.", kInterTokenBuckets);
  e2e_ = NewHistogram(r, "specd_e2e_request_latency_seconds",
                      "Time from arrival to the end of a request.", kRequestBuckets);
  queue_ = NewHistogram(r, "specd_request_queue_time_seconds",
                        "Time from arrival to first being scheduled.", kRequestBuckets);
  running_ = NewGauge(r, "specd_num_requests_running", "Requests being prefilled or decoded.");
  waiting_ = NewGauge(r, "specd_num_requests_waiting", "Requests waiting to be scheduled.");
  paused_ = NewGauge(r, "specd_num_requests_paused",
                     "Running or waiting requests paused because their client is not reading.");
  kv_used_ = NewGauge(r, "specd_kv_cache_blocks_used", "KV cache blocks in use.");
  kv_total_ = NewGauge(r, "specd_kv_cache_blocks_capacity",
                       "KV cache blocks in the pool (a gauge: promtool rejects _total on one).");
  prefix_queries_ =
      NewCounter(r, "specd_prefix_cache_queries_total", "KV blocks looked up in the prefix cache.");
  prefix_hits_ =
      NewCounter(r, "specd_prefix_cache_hits_total", "KV blocks found in the prefix cache.");
  preemptions_ = NewCounter(r, "specd_num_preemptions_total",
                            "Sequences preempted (to be recomputed) for lack of KV blocks.");
  http_responses_ = &prometheus::BuildCounter()
                         .Name("specd_http_responses_total")
                         .Help("HTTP responses sent, by status code.")
                         .Register(r);
  spec_drafts_ = NewCounter(r, "specd_spec_decode_num_drafts_total",
                            "Speculative decoding: verification rounds that carried drafts.");
  spec_draft_tokens_ = NewCounter(r, "specd_spec_decode_num_draft_tokens_total",
                                  "Speculative decoding: draft tokens proposed.");
  spec_accepted_tokens_ = NewCounter(r, "specd_spec_decode_num_accepted_tokens_total",
                                     "Speculative decoding: draft tokens the target accepted.");
  spec_accepted_per_pos_ =
      &prometheus::BuildCounter()
           .Name("specd_spec_decode_num_accepted_tokens_per_pos_total")
           .Help("Speculative decoding: accepted draft tokens by position in the draft (0-based).")
           .Register(r);
  spec_accepted_length_ =
      NewHistogram(r, "specd_spec_decode_accepted_length",
                   "Speculative decoding: draft tokens accepted per verification round.",
                   kAcceptedLengthBuckets);
  spec_method_rounds_ = &prometheus::BuildCounter()
                             .Name("specd_spec_decode_rounds_by_method_total")
                             .Help(
                                 "Speculative decoding: verification rounds that carried drafts, "
                                 "by method and shape (chain or tree).")
                             .Register(r);
  spec_method_drafted_ = &prometheus::BuildCounter()
                              .Name("specd_spec_decode_draft_tokens_by_method_total")
                              .Help(
                                  "Speculative decoding: draft tokens verified (a tree's nodes), "
                                  "by method and shape.")
                              .Register(r);
  spec_method_accepted_ = &prometheus::BuildCounter()
                               .Name("specd_spec_decode_accepted_tokens_by_method_total")
                               .Help(
                                   "Speculative decoding: draft tokens accepted (a tree's "
                                   "accepted path), by method and shape.")
                               .Register(r);
  spec_tree_nodes_ =
      NewHistogram(r, "specd_spec_decode_tree_nodes", "Token trees: draft nodes per verified tree.",
                   kAcceptedLengthBuckets);
  spec_tree_accepted_ =
      NewHistogram(r, "specd_spec_decode_tree_accepted_length",
                   "Token trees: accepted path length per verified tree.", kAcceptedLengthBuckets);
  spec_sparse_kept_tokens_ = NewHistogram(
      r, "specd_spec_decode_sparse_kept_tokens",
      "Vegas / streaming speculation: prefix tokens each sparse draft step attended per layer, "
      "per verification round.",
      prometheus::Histogram::BucketBoundaries{64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                              32768, 65536});
  spec_draft_seconds_ =
      NewHistogram(r, "specd_spec_decode_draft_seconds",
                   "Speculative decoding: time the speculators took to draft, per engine step.",
                   kSpecStepBuckets);
  spec_verify_seconds_ = NewHistogram(
      r, "specd_spec_decode_verify_seconds",
      "Speculative decoding: time of the verification pass and acceptance, per engine step.",
      kSpecStepBuckets);
  auto family = [&r](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  ssv_queries_ =
      NewCounter(r, "specd_ssv_verification_queries_total",
                 "SSV (NSA targets): verification queries counted per layer and KV head.");
  ssv_keys_ = family("specd_ssv_kv_positions_loaded_total",
                     "SSV: KV positions (selected blocks and window) the verification queries "
                     "read per layer and KV head, each query alone (per_query) or grouped "
                     "(grouped: the union per group).");
  ssv_blocks_ = family("specd_ssv_selected_blocks_loaded_total",
                       "SSV: selected blocks the verification queries read, per_query or grouped.");
  ssv_overlap_pairs_ =
      NewCounter(r, "specd_ssv_adjacent_query_pairs_total",
                 "SSV: adjacent verification queries whose selections were compared.");
  ssv_overlap_sum_ =
      NewCounter(r, "specd_ssv_adjacent_query_overlap_total",
                 "SSV: the sum over those pairs of the fraction of a query's selected blocks its "
                 "predecessor also selected (divide by the pairs for the mean overlap).");
  ssv_rounds_ = family("specd_ssv_verification_rounds_total",
                       "SSV: verification rounds by strategy (mode/group size/refresh interval).");
  policy_request_steps_ =
      family("specd_policy_request_steps_total",
             "Auto speculation: request-steps the strategy policy gave each method (none: plain).");
  policy_switches_ = NewCounter(r, "specd_policy_switches_total",
                                "Auto speculation: steps in which the policy changed its held "
                                "assignment (past its hysteresis).");
  policy_searches_ = NewCounter(r, "specd_policy_searches_total",
                                "Auto speculation: steps in which the policy searched for a new "
                                "assignment (the others hold each request's strategy).");
  policy_host_seconds_ = NewCounter(r, "specd_policy_host_seconds_total",
                                    "Auto speculation: engine-thread time spent choosing each "
                                    "step's strategies (searches and hold steps).");
  policy_estimated_tps_ = NewGauge(r, "specd_policy_estimated_tokens_per_second",
                                   "Auto speculation: the cost model's tokens per second for the "
                                   "last decided step's decodes (the cost profile's time units).");
  policy_realized_tps_ = NewGauge(r, "specd_policy_realized_tokens_per_second",
                                  "Auto speculation: tokens the last decided step committed over "
                                  "its wall time.");
  spec_seconds_ = family(
      "specd_spec_decode_seconds_total",
      "Speculative decoding: engine time by method and phase: draft (the method's speculator), "
      "verify and other (the verification pass and the rest of the step, shared by the step's "
      "methods in proportion to the positions their rows verified).");
  ssd_drafts_ = family("specd_ssd_drafts_total",
                       "SSD: sequences drafted per round, by how: hit (speculation cache), "
                       "miss_primary / miss_backup (fallback tier), none, local (no speculator).");
  ssd_outcomes_ = family("specd_ssd_outcomes_total",
                         "SSD: verification outcomes told to the speculator, by accepted length.");
  ssd_hits_ = family("specd_ssd_cache_hits_total",
                     "SSD: outcomes the speculation cache held, by accepted length.");
  ssd_bytes_ = family("specd_ssd_bytes_total",
                      "SSD: bytes on the speculator link, by direction (sent, received).");
  ssd_link_failures_ = NewCounter(r, "specd_ssd_link_failures_total",
                                  "SSD: speculator timeouts, broken links and deaths.");
  ssd_connects_ = NewCounter(r, "specd_ssd_speculator_connects_total",
                             "SSD: speculator processes that joined.");
  ssd_refused_joins_ =
      NewCounter(r, "specd_ssd_refused_joins_total",
                 "SSD: connections to the speculator port refused (wrong process, secret or TLS).");
  ssd_launches_ = NewCounter(r, "specd_ssd_speculator_launches_total",
                             "SSD: speculator processes the verifier started.");
  ssd_wait_seconds_ = NewCounter(r, "specd_ssd_verifier_wait_seconds_total",
                                 "SSD: time the verifier waited for the speculator's drafts.");
  ssd_busy_seconds_ = NewCounter(r, "specd_ssd_speculator_busy_seconds_total",
                                 "SSD: speculator compute time (its busy fraction is the rate).");
  ssd_cache_seconds_ = NewCounter(r, "specd_ssd_cache_build_seconds_total",
                                  "SSD: speculator time spent building the speculation cache.");
  ssd_connected_ =
      NewGauge(r, "specd_ssd_speculator_connected", "SSD: 1 while a speculator is connected.");
  ssd_device_rows_ =
      NewCounter(r, "specd_ssd_device_rows_total",
                 "SSD: sampled drafts' q rows received GPU to GPU (the device data path).");
  ssd_hidden_rows_ = NewCounter(r, "specd_ssd_hidden_rows_total",
                                "SSD: the target's hidden-state rows sent to an EAGLE-3 head in "
                                "the speculator.");
  ssd_device_hidden_rows_ =
      NewCounter(r, "specd_ssd_device_hidden_rows_total",
                 "SSD: of those, the rows sent GPU to GPU (the device data path).");
  ssd_offer_rounds_ =
      NewCounter(r, "specd_ssd_offer_rounds_total",
                 "SSD: rounds whose every draft came from the speculator's cache offers (no "
                 "round trip, no wait).");
  ssd_device_path_ = NewGauge(r, "specd_ssd_device_data_path",
                              "SSD: 1 while the speculator link moves q rows GPU to GPU (NCCL).");
  auto* stage_seconds = family(
      "specd_ssd_round_stage_seconds_total",
      "SSD: the round's timeline, seconds per side and stage. verifier (the engine step that "
      "drafted with the speculator): transfer, wait, cache_lookup, verify, sampling, commit, "
      "rest; speculator (from its replies): receive, triage, draft, build, reply.");
  for (int i = 0; i < kNumSsdVerifierStages; ++i) {
    ssd_verifier_stage_[i] =
        &stage_seconds->Add({{"side", "verifier"}, {"stage", kSsdVerifierStageNames[i]}});
  }
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) {
    ssd_speculator_stage_[i] =
        &stage_seconds->Add({{"side", "speculator"}, {"stage", kSsdSpeculatorStageNames[i]}});
  }
  auto* rounds = family("specd_ssd_timeline_rounds_total",
                        "SSD: rounds the timeline covers, per side (a stage's seconds over its "
                        "side's rounds: its mean per round).");
  ssd_verifier_rounds_ = &rounds->Add({{"side", "verifier"}});
  ssd_speculator_rounds_ = &rounds->Add({{"side", "speculator"}});
  ssd_draft_tokens_ = family("specd_ssd_draft_tokens_total",
                             "SSD: draft tokens verified, by where the draft came from (draft: hit "
                             "= the speculation cache, miss = a fallback).");
  ssd_accepted_tokens_ = family("specd_ssd_accepted_tokens_total",
                                "SSD: draft tokens accepted, by where the draft came from.");
}

Metrics::~Metrics() = default;

void Metrics::OnRequestFinished(const FinishedRequestMetrics& m) {
  const int outcome = static_cast<int>(m.outcome);
  if (outcome >= 0 && outcome < kNumOutcomes) requests_[outcome]->Increment();
  prompt_tokens_->Increment(m.prompt_tokens);
  generation_tokens_->Increment(m.generated_tokens);
  if (m.ttft_seconds >= 0) ttft_->Observe(m.ttft_seconds);
  e2e_->Observe(m.e2e_seconds);
  queue_->Observe(m.queue_seconds);
}

void Metrics::OnInterTokenLatency(double seconds) { inter_token_->Observe(seconds); }

void Metrics::OnStep(const EngineStats& stats) { UpdateGauges(stats); }

void Metrics::OnPrefixCache(int64_t queried_blocks, int64_t hit_blocks) {
  prefix_queries_->Increment(static_cast<double>(queried_blocks));
  prefix_hits_->Increment(static_cast<double>(hit_blocks));
}

void Metrics::OnPreemption(int32_t num_sequences) { preemptions_->Increment(num_sequences); }

void Metrics::OnPolicy(const PolicyStepMetrics& m) {
  for (const PolicyStepMetrics::MethodRows& r : m.rows) {
    policy_request_steps_->Add({{"method", r.method}}).Increment(r.num_rows);
  }
  if (m.switched) policy_switches_->Increment();
  if (m.searched) policy_searches_->Increment();
  policy_host_seconds_->Increment(m.host_seconds);
  policy_estimated_tps_->Set(m.estimated_tokens_per_second);
  policy_realized_tps_->Set(m.realized_tokens_per_second);
}

void Metrics::OnSpeculation(const SpeculationStepMetrics& m) {
  if (m.ssd != nullptr) OnSsd(*m.ssd);
  if (m.num_draft_tokens.empty()) return;  // no sequence of the step carried drafts
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  for (size_t i = 0; i < m.num_draft_tokens.size(); ++i) {
    draft_tokens += m.num_draft_tokens[i];
    const int32_t accepted = i < m.num_accepted.size() ? m.num_accepted[i] : 0;
    accepted_tokens += accepted;
    spec_accepted_length_->Observe(accepted);
    for (int32_t pos = 0; pos < accepted && pos < kMaxSpeculativeTokens; ++pos) {
      prometheus::Counter*& at = spec_accepted_at_[pos];
      if (at == nullptr) at = &spec_accepted_per_pos_->Add({{"position", std::to_string(pos)}});
      at->Increment();
    }
  }
  for (size_t i = 0; i < m.num_draft_tokens.size() && i < m.methods.size(); ++i) {
    const bool tree = i < m.trees.size() && m.trees[i] != 0;
    const prometheus::Labels labels = {{"method", m.methods[i]},
                                       {"shape", tree ? "tree" : "chain"}};
    const int32_t accepted = i < m.num_accepted.size() ? m.num_accepted[i] : 0;
    spec_method_rounds_->Add(labels).Increment();
    spec_method_drafted_->Add(labels).Increment(m.num_draft_tokens[i]);
    spec_method_accepted_->Add(labels).Increment(accepted);
    if (tree) {
      spec_tree_nodes_->Observe(m.num_draft_tokens[i]);
      spec_tree_accepted_->Observe(accepted);
    }
  }
  spec_drafts_->Increment(static_cast<double>(m.num_draft_tokens.size()));
  spec_draft_tokens_->Increment(static_cast<double>(draft_tokens));
  spec_accepted_tokens_->Increment(static_cast<double>(accepted_tokens));
  for (int32_t kept : m.sparse_kept_tokens) spec_sparse_kept_tokens_->Observe(kept);
  if (m.ssv.queries > 0) {
    ssv_queries_->Increment(static_cast<double>(m.ssv.queries));
    ssv_keys_->Add({{"load", "per_query"}}).Increment(static_cast<double>(m.ssv.per_query_keys));
    ssv_keys_->Add({{"load", "grouped"}}).Increment(static_cast<double>(m.ssv.grouped_keys));
    ssv_blocks_->Add({{"load", "per_query"}})
        .Increment(static_cast<double>(m.ssv.per_query_blocks));
    ssv_blocks_->Add({{"load", "grouped"}}).Increment(static_cast<double>(m.ssv.grouped_blocks));
    ssv_overlap_pairs_->Increment(static_cast<double>(m.ssv.overlap_pairs));
    ssv_overlap_sum_->Increment(m.ssv.overlap_sum);
  }
  for (const std::string& strategy : m.ssv_strategies) {
    ssv_rounds_->Add({{"strategy", strategy}}).Increment();
  }
  spec_draft_seconds_->Observe(m.draft_seconds);
  spec_verify_seconds_->Observe(m.verify_seconds);
  for (const SpeculationStepMetrics::MethodSeconds& t : m.by_method) {
    const std::string method = t.method;
    spec_seconds_->Add({{"method", method}, {"phase", "draft"}}).Increment(t.draft);
    spec_seconds_->Add({{"method", method}, {"phase", "verify"}}).Increment(t.verify);
    spec_seconds_->Add({{"method", method}, {"phase", "other"}}).Increment(t.other);
  }
  if (m.ssd == nullptr) return;
  double drafted[2] = {0, 0}, accepted[2] = {0, 0};  // [miss, hit]
  for (size_t i = 0; i < m.num_draft_tokens.size() && i < m.from_cache.size(); ++i) {
    const int hit = m.from_cache[i] ? 1 : 0;
    drafted[hit] += m.num_draft_tokens[i];
    accepted[hit] += i < m.num_accepted.size() ? m.num_accepted[i] : 0;
  }
  for (int hit = 0; hit < 2; ++hit) {
    const std::string label = hit ? "hit" : "miss";
    ssd_draft_tokens_->Add({{"draft", label}}).Increment(drafted[hit]);
    ssd_accepted_tokens_->Add({{"draft", label}}).Increment(accepted[hit]);
  }
}

void Metrics::OnSsd(const SsdStats& s) {
  std::lock_guard<std::mutex> lock(ssd_mu_);
  SsdStats& last = ssd_last_;
  // Moves a counter up to `now` (a snapshot older than what it shows changes nothing).
  auto add = [](prometheus::Counter* c, auto now, auto& shown) {
    if (now > shown) {
      c->Increment(static_cast<double>(now - shown));
      shown = now;
    }
  };
  add(&ssd_drafts_->Add({{"status", "hit"}}), s.drafts_hit, last.drafts_hit);
  add(&ssd_drafts_->Add({{"status", "miss_primary"}}), s.drafts_miss_primary,
      last.drafts_miss_primary);
  add(&ssd_drafts_->Add({{"status", "miss_backup"}}), s.drafts_miss_backup,
      last.drafts_miss_backup);
  add(&ssd_drafts_->Add({{"status", "none"}}), s.drafts_none, last.drafts_none);
  add(&ssd_drafts_->Add({{"status", "local"}}), s.local_rounds, last.local_rounds);
  const size_t num_lens = s.outcomes_by_accepted_len.size();
  if (last.outcomes_by_accepted_len.size() < num_lens) {
    last.outcomes_by_accepted_len.resize(num_lens);
    last.hits_by_accepted_len.resize(num_lens);
  }
  for (size_t k = 0; k < num_lens && k < s.hits_by_accepted_len.size(); ++k) {
    const std::string label = std::to_string(k);
    add(&ssd_outcomes_->Add({{"accepted_len", label}}), s.outcomes_by_accepted_len[k],
        last.outcomes_by_accepted_len[k]);
    add(&ssd_hits_->Add({{"accepted_len", label}}), s.hits_by_accepted_len[k],
        last.hits_by_accepted_len[k]);
  }
  add(&ssd_bytes_->Add({{"direction", "sent"}}), s.bytes_sent, last.bytes_sent);
  add(&ssd_bytes_->Add({{"direction", "received"}}), s.bytes_received, last.bytes_received);
  add(ssd_wait_seconds_, s.wait_seconds, last.wait_seconds);
  add(ssd_busy_seconds_, s.speculator_busy_seconds, last.speculator_busy_seconds);
  add(ssd_cache_seconds_, s.speculator_cache_seconds, last.speculator_cache_seconds);
  AddTimeline(s.timeline, last.timeline);
  // The link changes state only with a connect or a failure: the snapshot with the most of
  // them knows its current state.
  const int64_t link_events = s.connects + s.link_failures;
  if (link_events >= ssd_link_events_) {
    ssd_link_events_ = link_events;
    ssd_connected_->Set(s.connected ? 1 : 0);
    ssd_device_path_->Set(s.device_data_path ? 1 : 0);
  }
  add(ssd_link_failures_, s.link_failures, last.link_failures);
  add(ssd_device_rows_, s.device_rows, last.device_rows);
  add(ssd_hidden_rows_, s.hidden_rows, last.hidden_rows);
  add(ssd_device_hidden_rows_, s.device_hidden_rows, last.device_hidden_rows);
  add(ssd_offer_rounds_, s.offer_rounds, last.offer_rounds);
  add(ssd_connects_, s.connects, last.connects);
  add(ssd_launches_, s.launches, last.launches);
  add(ssd_refused_joins_, s.refused_joins, last.refused_joins);
}

void Metrics::AddTimeline(const SsdTimeline& now, SsdTimeline& shown) {
  auto add = [](prometheus::Counter* c, auto value, auto& last) {
    if (value > last) {
      c->Increment(static_cast<double>(value - last));
      last = value;
    }
  };
  add(ssd_verifier_rounds_, now.verifier_rounds, shown.verifier_rounds);
  add(ssd_speculator_rounds_, now.speculator_rounds, shown.speculator_rounds);
  for (int i = 0; i < kNumSsdVerifierStages; ++i) {
    add(ssd_verifier_stage_[i], now.verifier[i], shown.verifier[i]);
  }
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) {
    add(ssd_speculator_stage_[i], now.speculator[i], shown.speculator[i]);
  }
}

void Metrics::OnHttpResponse(int status) {
  http_responses_->Add({{"code", std::to_string(status)}}).Increment();
}

void Metrics::UpdateGauges(const EngineStats& stats) {
  running_->Set(stats.num_running);
  waiting_->Set(stats.num_waiting);
  paused_->Set(stats.num_paused);
  kv_used_->Set(stats.kv_blocks_used);
  kv_total_->Set(stats.kv_blocks_total);
  if (stats.ssd) OnSsd(*stats.ssd);
}

std::string Metrics::Render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace specd
