// Prometheus metrics of the server: implements the engine's EngineObserver with
// prometheus-cpp core (Registry, Counter, Gauge, Histogram) and renders the registry as
// Prometheus text for the HTTP front end's /metrics (no civetweb exposer). Names carry the
// specd_ prefix and follow Prometheus naming rules (counters end in _total, base units).
// Every method may be called from any thread (prometheus-cpp metrics are thread-safe):
// the engine thread reports, I/O threads count responses and scrape.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "engine/engine.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace specd {

class Metrics : public EngineObserver {
 public:
  Metrics();
  ~Metrics() override;

  // EngineObserver (engine thread).
  void OnRequestFinished(const FinishedRequestMetrics& m) override;
  void OnInterTokenLatency(double seconds) override;
  void OnStep(const EngineStats& stats) override;
  void OnPrefixCache(int64_t queried_blocks, int64_t hit_blocks) override;
  void OnPreemption(int32_t num_sequences) override;
  void OnSpeculation(const SpeculationStepMetrics& m) override;
  void OnPolicy(const PolicyStepMetrics& m) override;

  // One HTTP response sent with this status (I/O threads).
  void OnHttpResponse(int status);
  // Refreshes the gauges (and SSD's counters) from a snapshot: the /metrics handler calls it
  // before rendering, so they are current at start and while the engine is idle. Snapshots
  // may arrive out of order (a scrape's may be older than the last step's): counters never
  // go back or count twice, and the SSD link gauge follows the newest link event.
  void UpdateGauges(const EngineStats& stats);
  // The registry in Prometheus text exposition format 0.0.4.
  std::string Render() const;

 private:
  static constexpr int kNumOutcomes = 5;  // RequestOutcome values

  std::shared_ptr<prometheus::Registry> registry_;
  std::array<prometheus::Counter*, kNumOutcomes> requests_{};
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* inter_token_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* paused_ = nullptr;
  prometheus::Gauge* kv_used_ = nullptr;
  prometheus::Gauge* kv_total_ = nullptr;
  prometheus::Counter* prefix_queries_ = nullptr;
  prometheus::Counter* prefix_hits_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_responses_ = nullptr;
  // Speculative decoding.
  prometheus::Counter* spec_drafts_ = nullptr;
  prometheus::Counter* spec_draft_tokens_ = nullptr;
  prometheus::Counter* spec_accepted_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_pos_ = nullptr;
  // Children of spec_accepted_per_pos_ by position, made when first reached (engine thread
  // only, so that /metrics lists only positions some draft was long enough to have).
  std::array<prometheus::Counter*, kMaxSpeculativeTokens> spec_accepted_at_{};
  prometheus::Histogram* spec_accepted_length_ = nullptr;
  prometheus::Histogram* spec_sparse_kept_tokens_ = nullptr;  // vegas / streaming rounds
  prometheus::Histogram* spec_draft_seconds_ = nullptr;
  prometheus::Histogram* spec_verify_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* spec_seconds_ = nullptr;  // {method, phase}
  // Per method and shape (chain or tree): rounds, draft tokens (a tree's nodes), accepted.
  prometheus::Family<prometheus::Counter>* spec_method_rounds_ = nullptr;    // {method, shape}
  prometheus::Family<prometheus::Counter>* spec_method_drafted_ = nullptr;   // {method, shape}
  prometheus::Family<prometheus::Counter>* spec_method_accepted_ = nullptr;  // {method, shape}
  prometheus::Histogram* spec_tree_nodes_ = nullptr;
  prometheus::Histogram* spec_tree_accepted_ = nullptr;
  // SSV (NSA targets): what verification read, per query x layer x KV head.
  prometheus::Counter* ssv_queries_ = nullptr;
  prometheus::Family<prometheus::Counter>* ssv_keys_ = nullptr;    // {load}
  prometheus::Family<prometheus::Counter>* ssv_blocks_ = nullptr;  // {load}
  prometheus::Counter* ssv_overlap_pairs_ = nullptr;
  prometheus::Counter* ssv_overlap_sum_ = nullptr;
  prometheus::Family<prometheus::Counter>* ssv_rounds_ = nullptr;  // {strategy}
  // `auto` speculation's strategy policy.
  prometheus::Family<prometheus::Counter>* policy_request_steps_ = nullptr;  // {method}
  prometheus::Counter* policy_switches_ = nullptr;
  prometheus::Counter* policy_searches_ = nullptr;
  prometheus::Counter* policy_host_seconds_ = nullptr;
  prometheus::Gauge* policy_estimated_tps_ = nullptr;
  prometheus::Gauge* policy_realized_tps_ = nullptr;
  // SSD: counters follow the engine's cumulative SsdStats (ssd_last_ is what they hold), from
  // OnSpeculation's and from every EngineStats snapshot (engine and scraping threads).
  // std::mutex rather than absl::Mutex: the distribution's abseil is not built with TSan, so
  // absl::Mutex's ordering is invisible to it (the TSan stage runs the daemon's HTTP path).
  void OnSsd(const SsdStats& s);
  // OnSsd's timeline counters, moved up to `now` from `shown` (which they then hold).
  void AddTimeline(const SsdTimeline& now, SsdTimeline& shown)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ssd_mu_);
  std::mutex ssd_mu_;
  SsdStats ssd_last_ ABSL_GUARDED_BY(ssd_mu_);
  int64_t ssd_link_events_ ABSL_GUARDED_BY(ssd_mu_) = -1;          // connects + link_failures shown
  prometheus::Family<prometheus::Counter>* ssd_drafts_ = nullptr;  // {status}
  prometheus::Family<prometheus::Counter>* ssd_outcomes_ = nullptr;  // {accepted_len}
  prometheus::Family<prometheus::Counter>* ssd_hits_ = nullptr;      // {accepted_len}
  prometheus::Family<prometheus::Counter>* ssd_bytes_ = nullptr;     // {direction}
  prometheus::Counter* ssd_link_failures_ = nullptr;
  prometheus::Counter* ssd_connects_ = nullptr;
  prometheus::Counter* ssd_refused_joins_ = nullptr;
  prometheus::Counter* ssd_launches_ = nullptr;
  prometheus::Counter* ssd_wait_seconds_ = nullptr;
  prometheus::Counter* ssd_busy_seconds_ = nullptr;
  prometheus::Counter* ssd_cache_seconds_ = nullptr;
  prometheus::Gauge* ssd_connected_ = nullptr;
  prometheus::Counter* ssd_device_rows_ = nullptr;  // q rows GPU to GPU (the device data path)
  prometheus::Counter* ssd_hidden_rows_ = nullptr;  // target hidden rows sent to a head
  prometheus::Counter* ssd_device_hidden_rows_ = nullptr;  // ... of them GPU to GPU
  prometheus::Counter* ssd_offer_rounds_ = nullptr;        // rounds drafted from cache offers
  prometheus::Gauge* ssd_device_path_ = nullptr;
  // The round's timeline: {side, stage} seconds and {side} rounds, made once (label lookups
  // allocate; these are updated after every step).
  std::array<prometheus::Counter*, kNumSsdVerifierStages> ssd_verifier_stage_{};
  std::array<prometheus::Counter*, kNumSsdSpeculatorStages> ssd_speculator_stage_{};
  prometheus::Counter* ssd_verifier_rounds_ = nullptr;
  prometheus::Counter* ssd_speculator_rounds_ = nullptr;
  prometheus::Family<prometheus::Counter>* ssd_draft_tokens_ = nullptr;     // {draft}
  prometheus::Family<prometheus::Counter>* ssd_accepted_tokens_ = nullptr;  // {draft}
};

}  // namespace specd
