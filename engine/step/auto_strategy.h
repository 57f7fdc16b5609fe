// `auto` speculation in the step pipeline: the StrategyPolicy (engine/policy) created with the
// cost profile (`--cost-profile`, or the default rule in auto_strategy.cc), asked once per step
// in Prepare for the method and K of every running decode whose request said `auto`, and told
// each verified round in Apply. Requests with an explicit method or K are described to it as
// pinned, so it prices the whole batch. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/base/draft_method.h"
#include "engine/model/model_config.h"
#include "engine/sched/scheduler.h"
#include "engine/step/live_request.h"
#include "engine/step/metrics.h"
#include "engine/verification/verifier.h"

namespace specd {

class SpeculatorSet;
class SsvPlanner;
class StrategyPolicy;

struct AutoStrategyOptions {
  std::string cost_profile;  // --cost-profile's file; "": the default rule for `device`
  std::string device = "cpu";
  int32_t max_k = 0;          // the server's K (speculative.num_speculative_tokens)
  int32_t max_model_len = 0;  // the context limit (how far a decode may draft)
};

class AutoStrategy {
 public:
  // The policy `auto` runs, its cost profile loaded (InvalidArgument naming --cost-profile when
  // the file does not load) or the default rule's for this target and these speculators.
  static absl::StatusOr<std::unique_ptr<AutoStrategy>> Create(const AutoStrategyOptions& options,
                                                              const ModelConfig& target,
                                                              const SpeculatorSet& speculators);
  ~AutoStrategy();

  // The cost profile as JSON (CostProfile::ToJson), and where it came from ("file PATH" or
  // "default: ...").
  const std::string& profile_json() const { return profile_json_; }
  const std::string& profile_source() const { return profile_source_; }

  // Prepare, after the sample rows are planned: each row's method and K for this step
  // (LiveRequest::step): the request's own, or the policy's choice for requests whose method is
  // auto. `num_waiting`: prompts queued (auto requests then reserve no longer K than they hold).
  void Choose(const StepPlan& plan, std::span<const SampleRow> rows,
              std::span<LiveRequest* const> row_requests, int32_t num_waiting);
  // Apply, before any commit: the policy's acceptance estimates (and the SSV planner's) from the
  // step's rounds.
  void Report(std::span<LiveRequest* const> row_requests, std::span<const RowOutcome> outcomes);
  // End of Apply: the policy's step time, and its metrics to `observer` (may be null);
  // `committed` tokens in the step that began at `step_start`.
  void FinishStep(int64_t committed, absl::Time step_start, EngineObserver* observer);
  // A request that auto ran has finished.
  void Forget(uint64_t id);
  // Whether the policy may ever give an `auto` request method `m` (the profile prices it).
  bool MayChoose(DraftMethod m) const;

 private:
  AutoStrategy() = default;
  void Decide(const StepPlan& plan, std::span<const SampleRow> rows,
              std::span<LiveRequest* const> row_requests, int32_t num_waiting);
  // The longest K a decode of `r` can draft this step (lookahead slots, max_model_len,
  // max_tokens), as Speculate limits it.
  int32_t DraftRoom(const LiveRequest& r, const ScheduledChunk& chunk) const;
  // Row `row`'s strategy for this step, and the lookahead its request reserves for the next.
  void Apply(LiveRequest& r, int32_t row, DraftMethod method, int32_t k, bool reserve_longest);
  // A hold step over the last decision's decodes: each keeps its strategy without the batch
  // being described to the policy again. False (nothing done) when anything differs.
  bool Keep(const StepPlan& plan, std::span<const SampleRow> rows,
            std::span<LiveRequest* const> row_requests, int32_t num_waiting);
  // Whether auto requests reserve their longest K of lookahead for the next step.
  bool ReserveLongestK(int32_t num_waiting) const;
  // NSA targets whose profile measured SSV strategies: each speculating decode's strategy this
  // step (LiveRequest::ssv_index, step.ssv), for requests that set none of their own.
  void PlanSsv(const StepPlan& plan, std::span<const SampleRow> rows,
               std::span<LiveRequest* const> row_requests);

  std::unique_ptr<StrategyPolicy> policy_;
  std::unique_ptr<SsvPlanner> ssv_planner_;  // null: no SSV plan (dense target, or none measured)
  bool lossy_ssv_ok_ = false;                // the target runs lossy SSV strategies
  const SpeculatorSet* speculators_ = nullptr;
  int32_t max_model_len_ = 0;
  std::string profile_json_;
  std::string profile_source_;
  // The step's decision (Choose): whether it decided, its estimate, and per row its method
  // (-1: not a decode it described).
  bool decided_ = false;
  bool switched_ = false;
  bool searched_ = false;
  bool decode_only_ = false;   // no prefill chunk in the step (the profile models it all)
  double seconds_ = 0;         // Choose's time this step
  std::vector<uint64_t> ids_;  // the requests of the last decision, in its order
  double tokens_per_second_ = 0;
  std::vector<int32_t> row_method_;  // [num_rows] DraftMethod, or -1
};

}  // namespace specd
