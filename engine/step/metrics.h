// What the engine reports for metrics: per finished request, per step (speculation, the `auto`
// policy's decision), the stats snapshot, and the EngineObserver sink that receives them. Part of
// the engine's API (engine.h includes it); server/ implements the observer with prometheus-cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/base/ssv.h"
#include "engine/speculation/ssd/ssd_stats.h"

namespace specd {

// What /metrics and /ready need; a consistent snapshot, any thread.
struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_paused = 0;  // of the running and waiting ones: paused by SetPaused
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_total = 0;
  bool draining = false;
  bool running = false;  // engine thread started and not stopped
  // The tensor-parallel group lost a rank (for good): every request ended with `failure`, new
  // ones are refused, and the server should report not ready and exit non-zero.
  bool failed = false;
  std::string failure;
  // SSD's counters as the engine thread last published them (at start and after every
  // step), for metrics scraped while idle; none without SSD.
  std::optional<SsdStats> ssd;
};

// Outcome of a finished request, for metrics.
enum class RequestOutcome { kStop, kLength, kAbort, kDeadline, kError };
const char* RequestOutcomeName(RequestOutcome o);

struct FinishedRequestMetrics {
  RequestOutcome outcome = RequestOutcome::kStop;
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  double queue_seconds = 0;  // arrival -> first scheduled
  double ttft_seconds = -1;  // arrival -> first token; < 0 when none was produced
  double e2e_seconds = 0;    // arrival -> finished
};

// One engine step's speculation, for metrics.
struct SpeculationStepMetrics {
  std::vector<int32_t> num_draft_tokens;  // [num_rounds] drafts each verified sequence carried
  std::vector<int32_t> num_accepted;      // [num_rounds] how many of them the target accepted
  double draft_seconds = 0;               // the speculators' Propose calls
  double verify_seconds = 0;              // the target's verification pass and acceptance
  std::vector<uint8_t> from_cache;        // [num_rounds] 1: SSD drafts from the cache
  std::vector<const char*> methods;       // [num_rounds] SpeculationMethodName of each round
  std::vector<uint8_t> trees;             // [num_rounds] 1: a token tree (its drafts: nodes)
  // [num_sparse_rounds] vegas / streaming rounds: prefix tokens each draft step attended per
  // layer (the selection plus the tokens committed since it was scored); dense rounds not listed.
  std::vector<int32_t> sparse_kept_tokens;
  // NSA targets (SSV, engine/base/ssv.h): what this step's verification chunks read, and the
  // strategy of each verified row ([num_rounds], SsvStrategyName); empty for dense targets.
  SsvLoadStats ssv;
  std::vector<std::string> ssv_strategies;
  const SsdStats* ssd = nullptr;  // SSD's cumulative counters (null without SSD)
  // Per method whose speculator drafted this step: its Propose time, and its share of the
  // verification pass and of the rest of the step (scheduling, batch building, commit), split
  // by the positions its rows verified (drafts + 1 per drafted row).
  struct MethodSeconds {
    const char* method = "";  // SpeculationMethodName
    double draft = 0, verify = 0, other = 0;
  };
  std::vector<MethodSeconds> by_method;
};

// One engine step's `auto` decision (StrategyPolicy), for metrics: after every step in which
// some running decode had method auto.
struct PolicyStepMetrics {
  struct MethodRows {
    const char* method = "";  // SpeculationMethodName; "none" for plain rows
    int32_t num_rows = 0;     // decodes the policy gave this method this step (auto and pinned)
  };
  std::vector<MethodRows> rows = {};  // methods with rows only
  // The cost model's tokens per second for the step's decodes (the profile's units: nominal
  // for the default profile), and the step's committed tokens over its wall time.
  double estimated_tokens_per_second = 0;
  double realized_tokens_per_second = 0;
  bool switched = false;    // hysteresis let a new assignment replace the held one
  bool searched = false;    // the policy searched this step (else it held: PolicyOptions)
  double host_seconds = 0;  // the engine thread's time choosing this step's strategies
};

// Metrics sink the engine calls on its own thread (implementations must be thread-safe
// against their readers and quick). server/ implements it with prometheus-cpp. Every callback
// does nothing by default, so an observer overrides only the ones it needs.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnRequestFinished(const FinishedRequestMetrics& /*m*/) {}
  // Gap between consecutive tokens of one request (one call per token after the first).
  virtual void OnInterTokenLatency(double /*seconds*/) {}
  // After every engine step.
  virtual void OnStep(const EngineStats& /*stats*/) {}
  // Counters: prefix-cache lookups and hits (in blocks), sequences preempted.
  virtual void OnPrefixCache(int64_t /*queried_blocks*/, int64_t /*hit_blocks*/) {}
  virtual void OnPreemption(int32_t /*num_sequences*/) {}
  // After a step that verified drafts.
  virtual void OnSpeculation(const SpeculationStepMetrics& /*m*/) {}
  // After a step in which the strategy policy decided (some decode had method auto).
  virtual void OnPolicy(const PolicyStepMetrics& /*m*/) {}
};

}  // namespace specd
