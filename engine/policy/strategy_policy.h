// StrategyPolicy: what `auto` speculation runs. Each step it picks, for every running request, a
// method and K (K 0: plain decoding) that maximise the step's expected committed tokens per
// second for the whole batch, from the device's measured step times (CostProfile) and each
// request's online acceptance (AcceptanceEstimator). A small policy class in the style of
// TensorRT-LLM's scheduling policies: no engine types, tested on the CPU with synthetic costs.
// Engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/policy/acceptance_estimator.h"
#include "engine/policy/cost_profile.h"

namespace specd {

inline constexpr int32_t kMaxPolicyK = 64;  // longest draft a request may pin

// A set of PolicyMethods (bit i: method i).
class MethodSet {
 public:
  constexpr MethodSet() = default;
  constexpr MethodSet(std::initializer_list<PolicyMethod> methods) {
    for (PolicyMethod m : methods) bits_ |= Bit(m);
  }
  static constexpr MethodSet All() { return FromBits((1u << kNumPolicyMethods) - 1); }
  constexpr bool Has(PolicyMethod m) const { return (bits_ & Bit(m)) != 0; }
  constexpr void Add(PolicyMethod m) { bits_ |= Bit(m); }
  constexpr void Remove(PolicyMethod m) { bits_ &= ~Bit(m); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr MethodSet operator&(MethodSet o) const { return FromBits(bits_ & o.bits_); }
  constexpr MethodSet operator|(MethodSet o) const { return FromBits(bits_ | o.bits_); }
  constexpr MethodSet operator~() const { return FromBits(~bits_ & All().bits_); }
  constexpr bool operator==(const MethodSet&) const = default;

 private:
  static constexpr uint32_t Bit(PolicyMethod m) { return 1u << static_cast<int>(m); }
  static constexpr MethodSet FromBits(uint32_t bits) {
    MethodSet s;
    s.bits_ = bits;
    return s;
  }
  uint32_t bits_ = 0;
};

// Drafters that keep per-sequence state (their own KV, the speculator's cache): paused, they
// must be kept in sync or their acceptance collapses when they resume. Not EAGLE-3: its head's
// state is built from the target's own passes (the engine hands it their hidden states), so it
// has no catch-up pass of its own to price; what it missed it drafts without (accepting less for
// a round, which the acceptance estimate sees).
inline constexpr MethodSet kStatefulDrafters = {PolicyMethod::kDraftModel, PolicyMethod::kSsd};

// What one request runs in a step.
struct Strategy {
  PolicyMethod method = PolicyMethod::kPlain;
  int32_t k = 0;  // drafts per round; 0 exactly when method is kPlain
  bool operator==(const Strategy&) const = default;
};

// What the server has right now (the engine updates it when a speculator joins or leaves).
struct PolicyEnvironment {
  bool draft_model_loaded = false;
  bool eagle3_loaded = false;         // an EAGLE-3 head drafts for the target
  bool speculator_connected = false;  // an SSD speculator process is joined
  bool target_is_nsa = false;         // NSA architecture: SSV applies, Vegas / streaming do not
};

struct PolicyOptions {
  int32_t max_k = 8;                        // longest K `auto` picks (requests may pin more)
  int64_t min_sparse_draft_context = 4096;  // Vegas and streaming pay only on long contexts
  // Hysteresis: the batch moves to a new assignment only when it promises more than
  // (1 + switch_margin) times the held one's tokens/s on switch_patience consecutive steps.
  double switch_margin = 0.05;
  int32_t switch_patience = 3;
  int32_t max_sweeps = 3;  // local-search passes over the requests per decision
  // Paused stateful drafters are reported in PolicyRow::drafters_to_sync and their catch-up
  // pass is counted in the step time; false: neither (the engine resynchronises on resume).
  bool sync_paused_drafters = true;
  // Amortising the search. The full search (both starts, local search, hysteresis) runs once
  // every search interval steps, and at once when the batch has halved or doubled since the last
  // one. The steps between are hold steps, O(batch): each request keeps its held strategy (its K
  // lowered to what the request allows that step), and a request not placed yet takes its best
  // candidate against the others' held strategies. The interval keeps the search's measured time
  // within max_search_share of the step time the engine reports (NoteStepSeconds), at most
  // max_search_interval steps; it is 1 until a step time is known. max_search_share 0: every
  // step searches. Hysteresis counts steps, not searches: a switch needs ceil(switch_patience /
  // interval) consecutive searches that clear the margin.
  double max_search_share = 0.02;
  int32_t max_search_interval = 32;
  AcceptanceOptions acceptance;
  absl::Status Validate() const;
};

// Applicability: plain and n-gram always; the draft model and EAGLE-3 when loaded; SSD with a
// speculator
// joined; SSV on NSA targets; Vegas and streaming on dense targets from
// options.min_sparse_draft_context tokens of context on.
MethodSet ApplicableMethods(const PolicyEnvironment& env, const PolicyOptions& options,
                            int64_t context_len);

// One running request, as the engine describes it each step.
struct PolicyRequest {
  uint64_t id = 0;
  int64_t context_len = 0;                    // tokens in the sequence's KV so far
  MethodSet allowed = MethodSet::All();       // what else the engine permits (e.g. sampling rules)
  std::optional<PolicyMethod> pinned_method;  // the request's explicit speculation.method
  int32_t pinned_k = -1;                      // its explicit K (0: none); -1: the policy picks
  int32_t max_k = kMaxPolicyK;                // speculation.policy: cap on K
  MethodSet forbidden;                        // speculation.policy: methods it refuses
  // Tokens each stateful drafter must run before it can draft for the request (its prompt on
  // first use, what was committed while it was paused), and the tokens the request may still
  // generate (0: unknown). A drafter's catch-up is a one-time cost, amortised over the
  // request's expected remaining rounds (the step-time model, strategy_policy.cc).
  std::array<int64_t, kNumPolicyMethods> catch_up_tokens{};
  int64_t remaining_tokens = 0;
};

struct PolicyRow {
  uint64_t id = 0;
  Strategy strategy;
  bool pinned = false;         // chosen by the request, not the policy
  double expected_tokens = 1;  // committed tokens this row is expected to yield this step
  MethodSet drafters_to_sync;  // stateful drafters this request has used, paused this step:
                               // the engine feeds them this step's committed tokens
};

struct PolicyDecision {
  std::vector<PolicyRow> rows;  // one per request, in the order given
  double expected_tokens = 0;   // the step's expected committed tokens
  double step_ms = 0;           // its modelled time
  double tokens_per_second = 0;
  bool switched = false;  // hysteresis let a new assignment replace the held one this step
  bool searched = false;  // a full search ran (else a hold step: PolicyOptions)
};

// The step-time model's answer for one assignment.
struct StepEstimate {
  double expected_tokens = 0;
  double step_ms = 0;      // the profile's time, scaled by the online calibration
  double modelled_ms = 0;  // the profile's time alone
  double tokens_per_second() const { return step_ms > 0 ? 1000 * expected_tokens / step_ms : 0; }
};

// What the policy did (the engine exports these to /metrics).
struct PolicyStats {
  int64_t num_decisions = 0;
  int64_t num_switches = 0;
  int64_t num_searches = 0;     // decisions that ran the full search
  int32_t search_interval = 1;  // steps between searches, as last set
  double search_seconds = 0;    // the search's measured time (exponential average)
  std::array<int64_t, kNumPolicyMethods> rows_by_method{};       // request-steps, cumulative
  std::array<int32_t, kNumPolicyMethods> last_rows_by_method{};  // in the last decision
  double last_tokens_per_second = 0;                             // estimated, last decision
  double last_step_ms = 0;
  double last_expected_tokens = 0;
  double last_calibration = 1;  // the online calibration's factor on the last decision
};

// Use, once per engine step (Prepare, after the scheduler's plan): describe each running decode
// as a PolicyRequest, call Decide, and give each speculator the rows whose strategy names it (K
// as its draft count; plain rows draft nothing); keep every paused drafter in
// PolicyRow::drafters_to_sync in step (a catch-up of the committed tokens) where possible. In
// Apply, report each row's round with OnVerified; when a request ends, Forget it. SetEnvironment
// when a draft model loads or a speculator joins or leaves.
class StrategyPolicy {
 public:
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<StrategyPolicy>> Create(CostProfile profile,
                                                                PolicyOptions options);

  ~StrategyPolicy();

  void SetEnvironment(const PolicyEnvironment& env) { env_ = env; }

  // This step's strategy for each request. Pinned choices are honoured as given (an explicit
  // method outside the request's own speculation.policy is the front end's to refuse).
  PolicyDecision Decide(std::span<const PolicyRequest> requests);
  // A hold step the engine took without describing the batch again (the same requests, with
  // the same limits, as the last decision, and !SearchDue()): each keeps its strategy, and the
  // step count, the acceptance clock and the stats move as Decide's hold step would move them.
  void KeepLastDecision();
  // The wall time of the step the last decision was for (the engine's, Decide included): sets
  // the search interval (PolicyOptions::max_search_share), and calibrates the profile when
  // `decode_only` (no prefill chunk shared the step, so the profile models all of it).
  //
  // Online calibration. The profile times the model's passes; a step also runs host work the
  // profile does not see (scheduling, acceptance, commits, detokenisation, the speculators'
  // bookkeeping), more of it per row in a speculative step than in a plain one. So the policy
  // keeps, per kind of step (plain, speculative) and batch size (powers of two), an exponential
  // average of realised / modelled step time, and scales the profile's time of an assignment by
  // its kind's factor (not seen yet at that batch: 1 for plain, plain's for speculative). Off
  // when the profile says "calibrate": false.
  void NoteStepSeconds(double seconds, bool decode_only = true);
  // Whether the next Decide will search (as far as the step count says; a batch that halves or
  // doubles searches too): the engine reserves each request's longest K of lookahead slots for
  // such a step, and only its held K before a hold step.
  bool SearchDue() const;
  // The factor Cost applies to a step of this kind and batch size (1: nothing observed).
  double Calibration(bool speculative, int32_t batch) const;

  // A verified round of `request` under `method` (Apply stage): feeds the acceptance estimate
  // (num_drafts 0: the method offered no draft this round).
  void OnVerified(uint64_t request, PolicyMethod method, int32_t num_drafts, int32_t accepted);
  // The request finished or was aborted: drop its estimates and held strategy.
  void Forget(uint64_t request);

  // The step-time model (documented in strategy_policy.cc) for `strategies[i]` on
  // `requests[i]`, with today's acceptance estimates.
  StepEstimate Estimate(std::span<const PolicyRequest> requests,
                        std::span<const Strategy> strategies) const;

  const PolicyStats& stats() const { return stats_; }
  const CostProfile& profile() const { return profile_; }
  AcceptanceEstimator& acceptance() { return acceptance_; }
  const AcceptanceEstimator& acceptance() const { return acceptance_; }

  // One request's search inputs (strategy_policy.cc).
  struct Row;

 private:
  struct Held {
    Strategy strategy;
    MethodSet used_stateful;  // stateful drafters that hold state for the request
    int32_t streak = 0;       // consecutive steps moving this request alone cleared the margin
  };

  StrategyPolicy(CostProfile profile, PolicyOptions options);  // Row is complete in the .cc

  // Sums over an assignment's rows that the step-time model needs, updated one row at a time
  // while the search tries a request's candidates.
  struct Tally {
    std::array<int32_t, kNumPolicyMethods> num_rows{};
    std::array<std::array<int32_t, kMaxPolicyK + 1>, kNumPolicyMethods> num_at_k{};
    std::array<int32_t, kMaxPolicyK + 1> num_at_k_all{};
    std::array<double, kNumPolicyMethods> context{};  // summed over the method's rows
    std::array<int32_t, kNumPolicyMethods> num_sync{};
    std::array<double, kNumPolicyMethods> sync_context{};
    double all_context = 0;
    double expected_tokens = 0;
    double catch_up_ms = 0;  // stateful drafters' catch-up, amortised per step
    int32_t max_k = 0;       // largest K any candidate has (bounds the scans for the longest K)
    void Add(const Row& row, const Strategy& s, int sign);
  };

  MethodSet Allowed(const PolicyRequest& request) const;
  int32_t Cap(const PolicyRequest& request) const;
  void MakeRow(const PolicyRequest& request, Row& row) const;
  // A row with only the request's held strategy (lowered to what it allows now) as candidate.
  void MakeHeldRow(const PolicyRequest& request, const Strategy& held, Row& row) const;
  // MakeRow's and MakeHeldRow's shared parts: the request's fields and catch-up costs, then
  // the expected tokens of the candidates and the drafters to keep in sync.
  void StartRow(const PolicyRequest& request, Row& row) const;
  void FinishRow(const PolicyRequest& request, MethodSet allowed, Row& row) const;
  void FillExpected(Row& row) const;
  PolicyDecision Search(std::span<const PolicyRequest> requests);
  PolicyDecision Hold(std::span<const PolicyRequest> requests);
  PolicyDecision Finish(const std::vector<Row>& rows, const std::vector<Strategy>& chosen,
                        PolicyDecision decision);
  Tally Count(const std::vector<Row>& rows, const std::vector<Strategy>& choice) const;
  StepEstimate Cost(const Tally& tally, int32_t batch_size) const;
  StepEstimate Evaluate(const std::vector<Row>& rows, const std::vector<Strategy>& choice) const;
  std::vector<Strategy> BestUniform(const std::vector<Row>& rows) const;
  void LocalSearch(const std::vector<Row>& rows, std::vector<Strategy>& choice) const;
  // Moves one request to its candidate that raises the batch's rate above `rate` the most (then
  // `rate` is the new one); true when it moved. `tally` counts `choice` before and after.
  bool Move(const Row& row, int32_t batch, Tally& tally, Strategy& choice, double& rate) const;
  void Record(const PolicyDecision& decision);

  CostProfile profile_;
  PolicyOptions options_;
  PolicyEnvironment env_;
  AcceptanceEstimator acceptance_;
  absl::flat_hash_map<uint64_t, Held> held_;
  int32_t streak_ = 0;     // consecutive searches in which a better assignment cleared the margin
  std::vector<Row> rows_;  // Decide's rows, reused (their vectors keep their capacity)
  std::vector<Strategy> choice_;
  // Online calibration, [plain, speculative][log2 batch bucket]: realised / modelled step time.
  struct Calib {
    double factor = 1;
    int64_t samples = 0;
  };
  static constexpr int kCalibBuckets = 12;
  std::array<std::array<Calib, kCalibBuckets>, 2> calib_{};
  // The last decision, for NoteStepSeconds.
  double last_modelled_ms_ = 0;
  bool last_speculative_ = false;
  int32_t last_batch_ = 0;
  double last_decide_seconds_ = 0;
  int32_t steps_since_search_ = 0;
  size_t last_search_batch_ = 0;  // 0: no search yet
  double step_seconds_ = 0;       // exponential average of NoteStepSeconds
  // Cost's lookups of the target pass, [method][longest K], for one (batch, mean context).
  mutable std::array<std::array<double, kMaxPolicyK + 1>, kNumPolicyMethods> verify_cache_{};
  mutable double verify_cache_batch_ = -1;
  mutable double verify_cache_context_ = -1;
  PolicyStats stats_;
};

}  // namespace specd
