// `auto` speculation (auto_strategy.h).
//
// The default profile (no --cost-profile). Step times in nominal units (a plain batch-1 step is
// 10 ms) from one rule: a step costs base * (1 + tokens / knee), tokens = batch x tokens per
// sequence, knee = 64 on a GPU (memory-bound: up to ~64 tokens ride on the weights' read) and 2
// on the CPU (compute-bound: every token costs about half a weights pass more). A draft pass of
// the draft model costs the same times its parameter count over the target's. Context length is
// not modelled. A parallel draft model (PARD) drafts K tokens in one pass of batch x K tokens at
// the same per-token rule, and an EAGLE-3 head's step costs the same times the head's weights
// (fc, its decoder layer, its LM head over the draft vocabulary) over the target's. It is
// conservative on the CPU (speculation must be well accepted to pay) and optimistic about large
// GPU batches; measure with specd_profile for real numbers. Vegas, streaming and SSD are absent
// from it, so `auto` picks only plain, n-gram, the draft model and the EAGLE-3 head. A profile
// from a file prices what it measured: without an "eagle3" entry `auto` never picks the head.
// A measured profile times the model's passes only; the policy scales it online by the step times
// it observes (FinishStep: StrategyPolicy::NoteStepSeconds), and searches only every few
// steps when its own search would otherwise weigh on short steps. On a hold step whose decodes
// are the last decision's (Keep) the engine does not describe the batch again: a
// batch-64 step of a small model on a GPU is ~0.25 ms, and describing it costs ~10 us.
// Stateful drafters are not kept in step while paused: the draft model resynchronises when it
// resumes (its catch-up chunk runs every token committed since, DraftModelSpeculator::Prepare),
// so the policy runs with sync_paused_drafters = false.
#include "engine/step/auto_strategy.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/policy/ssv_planner.h"
#include "engine/policy/strategy_policy.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/eagle3.h"
#include "engine/step/speculator_set.h"

namespace specd {
namespace {

constexpr double kDefaultBaseMs = 10;
constexpr double kGpuKnee = 64;
constexpr double kCpuKnee = 2;

// The method a policy strategy runs: SSV is how an NSA target verifies, not a drafter (plain).
DraftMethod StepMethod(DraftMethod m) { return m == DraftMethod::kSsv ? DraftMethod::kNone : m; }

// Weights of a dense decoder, for the draft / target cost ratio.
double ParamCount(const ModelConfig& c) {
  const double h = c.hidden_size;
  const double per_layer = h * (c.q_size() + 2.0 * c.kv_size()) +
                           static_cast<double>(c.q_size()) * h + 3.0 * h * c.intermediate_size;
  return c.num_layers * per_layer + (c.tie_word_embeddings ? 1.0 : 2.0) * c.vocab_size * h;
}

// An EAGLE-3 head's weights a draft step reads: fc over the three target hidden states, one
// decoder layer whose attention reads [embedding, hidden] (twice the width), the LM head over the
// draft vocabulary (its embedding is a lookup).
double HeadParamCount(const Eagle3Config& c) {
  const ModelConfig& l = c.layer;
  const double h = l.hidden_size;
  return 3.0 * c.target_hidden_size * h + 2 * h * (l.q_size() + 2.0 * l.kv_size()) +
         static_cast<double>(l.q_size()) * h + 3.0 * h * l.intermediate_size +
         static_cast<double>(c.draft_vocab_size) * h;
}

// One pass of `batch` rows of `tokens` each of a model `scale` times the target's size:
// ms = scale * base * (1 + batch * tokens / knee), bilinear in (batch, tokens), so a 2 x 2 grid
// holds it exactly and CostGrid extends it linearly past the corners. `max_tokens` 1: a plain
// step's grid (tokens axis [1]).
CostGrid PassGrid(double base, double knee, int32_t max_tokens, double scale = 1) {
  const std::vector<int32_t> batch = {1, 64};
  const std::vector<int32_t> tokens =
      max_tokens == 1 ? std::vector<int32_t>{1} : std::vector<int32_t>{1, max_tokens};
  std::vector<double> ms;
  for (int32_t b : batch) {
    for (int32_t t : tokens) ms.push_back(scale * base * (1 + b * t / knee));
  }
  return *CostGrid::Create(batch, tokens, {1}, std::move(ms));
}

// A draft of K tokens in K one-token steps of a model `ratio` times the target's size.
CostGrid StepwiseDraftGrid(double base, double knee, double ratio) {
  const std::vector<int32_t> batch = {1, 64};
  const std::vector<int32_t> ks = {1, kMaxPolicyK};
  std::vector<double> ms;
  for (int32_t b : batch) {
    for (int32_t k : ks) ms.push_back(k * ratio * base * (1 + b / knee));
  }
  return *CostGrid::Create(batch, ks, {1}, std::move(ms));
}

double SizeRatio(double drafter, const ModelConfig& target) {
  return std::clamp(drafter / ParamCount(target), 0.01, 1.0);
}

// What DefaultCostProfile prices beside the target: the draft model (and whether it drafts in
// parallel) and the EAGLE-3 head, each when the server has it.
struct Drafters {
  const ModelConfig* draft = nullptr;
  bool parallel = false;
  const Eagle3Config* eagle3 = nullptr;
};

CostProfile DefaultCostProfile(bool cuda, const ModelConfig& target, const Drafters& drafters) {
  const double knee = cuda ? kGpuKnee : kCpuKnee;
  CostProfile profile(PassGrid(kDefaultBaseMs, knee, 1));
  profile.SetVerify(PassGrid(kDefaultBaseMs, knee, kMaxPolicyK + 1));
  profile.SetMethod(PolicyMethod::kNgram, {});
  if (drafters.draft != nullptr) {
    const double ratio = SizeRatio(ParamCount(*drafters.draft), target);
    MethodCosts costs;
    costs.draft = drafters.parallel ? PassGrid(kDefaultBaseMs, knee, kMaxPolicyK, ratio)
                                    : StepwiseDraftGrid(kDefaultBaseMs, knee, ratio);
    costs.parallel = drafters.parallel;
    profile.SetMethod(PolicyMethod::kDraftModel, std::move(costs));
  }
  if (drafters.eagle3 != nullptr) {
    MethodCosts costs;
    costs.draft = StepwiseDraftGrid(kDefaultBaseMs, knee,
                                    SizeRatio(HeadParamCount(*drafters.eagle3), target));
    profile.SetMethod(PolicyMethod::kEagle3, std::move(costs));
  }
  profile.device = absl::StrCat("default rule (", cuda ? "gpu" : "cpu", ", knee ", knee,
                                " tokens; nominal times)");
  return profile;
}

// A profile that does not describe this server's drafters: said once, at start-up.
void WarnOfProfileMismatch(const CostProfile& profile, const DraftModelSpeculator* draft,
                           bool has_eagle3) {
  const MethodCosts* costs = profile.Costs(PolicyMethod::kDraftModel);
  if (draft != nullptr && costs != nullptr && costs->parallel != draft->parallel()) {
    const auto kind = [](bool parallel) { return parallel ? "parallel" : "sequential"; };
    SPECD_LOG_WARN(
        "engine: the cost profile's draft_model entry times {} drafting, this server's draft "
        "model drafts {}: `auto` misprices it (measure it with specd_profile{})",
        kind(costs->parallel), kind(draft->parallel()), draft->parallel() ? " --parallel" : "");
  }
  for (const auto& [method, loaded] : {std::pair{PolicyMethod::kDraftModel, draft != nullptr},
                                       {PolicyMethod::kEagle3, has_eagle3}}) {
    if (loaded && !profile.Has(method)) {
      SPECD_LOG_INFO("engine: the cost profile has no {} entry: `auto` will not choose it",
                     PolicyMethodName(method));
    }
  }
}

}  // namespace

AutoStrategy::~AutoStrategy() = default;

absl::StatusOr<std::unique_ptr<AutoStrategy>> AutoStrategy::Create(
    const AutoStrategyOptions& options, const ModelConfig& target,
    const SpeculatorSet& speculators) {
  std::unique_ptr<AutoStrategy> a(new AutoStrategy());
  a->speculators_ = &speculators;
  a->max_model_len_ = options.max_model_len;
  // Always: a request may ask for `auto` on a server whose default is no speculation.
  std::optional<CostProfile> profile;
  const DraftModelSpeculator* draft = speculators.draft();
  const Eagle3Speculator* eagle3 = speculators.eagle3();
  if (!options.cost_profile.empty()) {
    absl::StatusOr<CostProfile> loaded = CostProfile::Load(options.cost_profile);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cost-profile: ", loaded.status().message()));
    }
    profile = *std::move(loaded);
    a->profile_source_ = absl::StrCat("file ", options.cost_profile);
  } else {
    SPECD_ASSIGN_OR_RETURN(const DeviceChoice device, ParseDevice(options.device));
    profile = DefaultCostProfile(device.cuda, target,
                                 {.draft = draft != nullptr ? &draft->runner().config() : nullptr,
                                  .parallel = draft != nullptr && draft->parallel(),
                                  .eagle3 = eagle3 != nullptr ? &eagle3->config() : nullptr});
    a->profile_source_ = absl::StrCat("default: ", profile->device);
  }
  WarnOfProfileMismatch(*profile, draft, eagle3 != nullptr);
  if (!profile->ssv().empty() && !target.is_nsa()) {
    // They would price this dense target's verification (CostProfile::VerifyMs).
    SPECD_LOG_WARN(
        "engine: the cost profile's SSV strategies are for NSA targets; this model is "
        "not one: ignored");
    profile->ClearSsv();
  }
  PolicyOptions policy;
  policy.max_k = std::clamp(options.max_k, 1, kMaxPolicyK);
  policy.sync_paused_drafters = false;  // the draft model catches up when it resumes
  SPECD_ASSIGN_OR_RETURN(a->policy_, StrategyPolicy::Create(*std::move(profile), policy));
  a->policy_->SetEnvironment({.draft_model_loaded = draft != nullptr,
                              .eagle3_loaded = eagle3 != nullptr,
                              .speculator_connected = speculators.ssd() != nullptr,
                              .target_is_nsa = target.is_nsa()});
  a->profile_json_ = a->policy_->profile().ToJson();
  SPECD_LOG_INFO("engine: auto speculation's cost profile: {}", a->profile_source_);
  const CostProfile& measured = a->policy_->profile();
  if (!measured.ssv().empty()) {
    std::vector<std::string> names;
    bool lossy = false;
    for (const SsvCosts& c : measured.ssv()) {
      names.push_back(SsvStrategyName(c.strategy));
      lossy |= c.strategy.lossy();
    }
    a->ssv_planner_ = std::make_unique<SsvPlanner>(measured);  // an NSA target's (above)
    a->lossy_ssv_ok_ = speculators.lossy_ssv_ok();
    SPECD_LOG_INFO(
        "engine: SSV planner: verification picks among {} per request and step (requests "
        "without speculation.ssv fields; at alpha {} until a request has measured its own){}",
        absl::StrJoin(names, ", "), measured.ssv_alpha,
        !lossy             ? ""
        : a->lossy_ssv_ok_ ? "; lossy ones for requests that are not strict"
                           : "; the lossy ones never: this runner does not run them");
  }
  return a;
}

bool AutoStrategy::MayChoose(DraftMethod m) const { return policy_->profile().Has(m); }

void AutoStrategy::Choose(const StepPlan& plan, std::span<const SampleRow> rows,
                          std::span<LiveRequest* const> row_requests, int32_t num_waiting) {
  const absl::Time start = absl::Now();
  Decide(plan, rows, row_requests, num_waiting);
  PlanSsv(plan, rows, row_requests);
  seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
}

int32_t AutoStrategy::DraftRoom(const LiveRequest& r, const ScheduledChunk& chunk) const {
  return std::min({chunk.num_lookahead_tokens, max_model_len_ - r.seq.num_tokens(),
                   r.request.params.max_tokens - r.seq.num_generated() - 1});
}

void AutoStrategy::Apply(LiveRequest& r, int32_t row, DraftMethod method, int32_t k,
                         bool reserve_longest) {
  // A sequence past the draft model's context gets no draft-model drafts (StepPipeline):
  // plain decoding, not a round without drafts.
  if (method == DraftMethod::kDraftModel && r.seq.num_tokens() > speculators_->draft_context()) {
    method = DraftMethod::kNone;
  }
  row_method_[row] = static_cast<int32_t>(method);
  r.step.method = k > 0 ? StepMethod(method) : DraftMethod::kNone;
  r.step.num_speculative_tokens = r.step.method == DraftMethod::kNone ? 0 : k;
  r.seq.set_num_lookahead_tokens(reserve_longest ? r.spec.num_speculative_tokens
                                                 : r.step.num_speculative_tokens);
}

void AutoStrategy::Decide(const StepPlan& plan, std::span<const SampleRow> rows,
                          std::span<LiveRequest* const> row_requests, int32_t num_waiting) {
  decided_ = false;
  row_method_.assign(rows.size(), -1);
  bool any_auto = false;
  for (size_t k = 0; k < rows.size(); ++k) {
    LiveRequest& r = *row_requests[k];
    r.step = r.spec;
    if (r.spec.method != DraftMethod::kAuto) continue;
    r.step.method = DraftMethod::kNone;  // until the policy says otherwise
    r.step.num_speculative_tokens = 0;
    any_auto |= plan.chunks[rows[k].chunk].num_new_tokens == 1;
  }
  if (!any_auto || policy_ == nullptr) return;
  // Whether the profile models the whole step (no prefill chunk beside the decodes): only such
  // steps calibrate it, and only then may auto requests reserve their longest K.
  decode_only_ = std::all_of(plan.chunks.begin(), plan.chunks.end(),
                             [](const ScheduledChunk& ch) { return ch.num_new_tokens == 1; });
  if (Keep(plan, rows, row_requests, num_waiting)) return;
  std::vector<PolicyRequest> requests;
  std::vector<int32_t> request_rows;
  const DraftModelSpeculator* draft = speculators_->draft();
  for (size_t k = 0; k < rows.size(); ++k) {
    const ScheduledChunk& chunk = plan.chunks[rows[k].chunk];
    if (chunk.num_new_tokens != 1) continue;  // a prompt's last chunk: it cannot speculate
    const LiveRequest& r = *row_requests[k];
    PolicyRequest q;
    q.id = r.id;
    q.context_len = r.seq.num_computed();
    if (!speculators_->has_sparse_drafting()) {
      q.allowed.Remove(DraftMethod::kVegas);
      q.allowed.Remove(DraftMethod::kStreaming);
    }
    // SSV is how an NSA target verifies whatever method drafted (the request's
    // speculation.ssv), not a drafting method of its own: the policy picks the drafter.
    q.allowed.Remove(DraftMethod::kSsv);
    q.remaining_tokens = r.request.params.max_tokens - r.seq.num_generated();
    if (draft != nullptr) {
      // The draft model's KV covers the first kv_length tokens: the rest it runs before drafting.
      q.catch_up_tokens[DraftMethodIndex(DraftMethod::kDraftModel)] =
          std::max<int64_t>(0, r.seq.num_tokens() - 1 - draft->kv_length(r.id));
    }
    // The longest useful K this step (as Speculate limits it).
    const int32_t room = DraftRoom(r, chunk);
    if (r.spec.method == DraftMethod::kAuto) {
      q.max_k = std::max(0, std::min(r.spec.num_speculative_tokens, room));
      if (r.spec.k_pinned) q.pinned_k = q.max_k;
      for (DraftMethod m : kAllPolicyMethods) {
        if (m != DraftMethod::kPlain && r.spec.Forbids(StepMethod(m))) q.forbidden.Add(m);
      }
      if (q.max_k == 0) q.pinned_k = 0;
    } else {
      q.pinned_method = r.spec.method;
      q.pinned_k =
          r.spec.enabled() ? std::max(0, std::min(r.spec.num_speculative_tokens, room)) : 0;
      if (q.pinned_k == 0) q.pinned_method = DraftMethod::kPlain;
    }
    requests.push_back(q);
    request_rows.push_back(static_cast<int32_t>(k));
  }
  const PolicyDecision decision = policy_->Decide(requests);
  decided_ = true;
  switched_ = decision.switched;
  searched_ = decision.searched;
  tokens_per_second_ = decision.tokens_per_second;
  const bool reserve_longest = ReserveLongestK(num_waiting);
  ids_.clear();
  for (size_t i = 0; i < decision.rows.size(); ++i) {
    const int32_t k = request_rows[i];
    LiveRequest& r = *row_requests[k];
    r.used_policy = true;
    ids_.push_back(r.id);
    r.policy_method = static_cast<int32_t>(decision.rows[i].strategy.method);
    r.policy_k = decision.rows[i].strategy.k;
    if (r.spec.method != DraftMethod::kAuto) continue;
    const Strategy s = decision.rows[i].strategy;
    Apply(r, k, s.method, s.k, reserve_longest);
  }
}

void AutoStrategy::PlanSsv(const StepPlan& plan, std::span<const SampleRow> rows,
                           std::span<LiveRequest* const> row_requests) {
  if (ssv_planner_ == nullptr) return;
  // The step's verifying rows: the batch the strategies' grids are read at.
  int32_t batch = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    LiveRequest& r = *row_requests[k];
    r.ssv_index = -1;
    if (plan.chunks[rows[k].chunk].num_new_tokens == 1 && r.step.num_speculative_tokens > 0) {
      ++batch;
    }
  }
  const std::vector<SsvCosts>& strategies = ssv_planner_->profile().ssv();
  for (size_t k = 0; k < rows.size(); ++k) {
    LiveRequest& r = *row_requests[k];
    if (!r.spec.ssv_planned || plan.chunks[rows[k].chunk].num_new_tokens != 1 ||
        r.step.num_speculative_tokens == 0) {
      continue;
    }
    const int32_t index = ssv_planner_->Choose(
        r.step.method, batch, r.step.num_speculative_tokens, r.seq.num_computed(),
        /*allow_lossy=*/lossy_ssv_ok_ && !r.spec.ssv_strict, &r.ssv_acceptance, r.ssv_held);
    if (index < 0) continue;
    r.ssv_index = r.ssv_held = index;
    r.step.ssv = strategies[index].strategy;
    // Lossy verification writes KV that is not the model's: what is in the cache so far (exact)
    // may still serve other requests from the prefix cache, nothing after it.
    if (r.step.ssv.lossy()) {
      r.seq.set_num_shareable_tokens(std::min(r.seq.num_shareable_tokens(), r.seq.num_computed()));
    }
  }
}

bool AutoStrategy::ReserveLongestK(int32_t num_waiting) const {
  // The lookahead slots the scheduler reserves next step (KV blocks and token budget, taken
  // before any prefill's): the K held until the policy searches again, the request's longest K
  // before a search, so that the search may raise K. Not while prompts wait or are part-way
  // through their prefill: decodes reserving drafts the policy is unlikely to run would slow
  // the prefills down (a request's first decode still reserves its longest K).
  return policy_->SearchDue() && decode_only_ && num_waiting == 0;
}

bool AutoStrategy::Keep(const StepPlan& plan, std::span<const SampleRow> rows,
                        std::span<LiveRequest* const> row_requests, int32_t num_waiting) {
  if (policy_->SearchDue() || ids_.empty()) return false;
  // The decodes must be the last decision's, in its order, each with room for its K.
  size_t next = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const ScheduledChunk& chunk = plan.chunks[rows[k].chunk];
    if (chunk.num_new_tokens != 1) continue;
    const LiveRequest& r = *row_requests[k];
    if (next >= ids_.size() || ids_[next++] != r.id) return false;
    if (r.policy_k > DraftRoom(r, chunk)) return false;
  }
  if (next != ids_.size()) return false;
  policy_->KeepLastDecision();
  const bool reserve_longest = ReserveLongestK(num_waiting);
  for (size_t k = 0; k < rows.size(); ++k) {
    if (plan.chunks[rows[k].chunk].num_new_tokens != 1) continue;
    LiveRequest& r = *row_requests[k];
    if (r.spec.method != DraftMethod::kAuto) continue;
    Apply(r, static_cast<int32_t>(k), static_cast<DraftMethod>(r.policy_method), r.policy_k,
          reserve_longest);
  }
  decided_ = true;
  switched_ = false;
  searched_ = false;
  return true;
}

void AutoStrategy::Report(std::span<LiveRequest* const> row_requests,
                          std::span<const RowOutcome> outcomes) {
  if (ssv_planner_ != nullptr) {
    const std::vector<SsvCosts>& strategies = ssv_planner_->profile().ssv();
    for (size_t k = 0; k < row_requests.size(); ++k) {
      LiveRequest& r = *row_requests[k];
      if (r.ssv_index < 0) continue;
      r.ssv_acceptance.Note(r.ssv_index, strategies[r.ssv_index].strategy.lossy(),
                            outcomes[k].num_drafts, outcomes[k].num_accepted,
                            ssv_planner_->options());
    }
  }
  if (!decided_) return;
  for (size_t k = 0; k < row_method_.size(); ++k) {
    if (row_method_[k] < 0) continue;
    const LiveRequest& r = *row_requests[k];
    const auto method = static_cast<DraftMethod>(row_method_[k]);
    if (r.step.num_speculative_tokens == 0) continue;
    const RowOutcome& o = outcomes[k];
    // A round the speculator had nothing for (no n-gram match, no draft KV) ran as a plain row:
    // it moves the method's offer rate, not its acceptance.
    policy_->OnVerified(r.id, method, o.num_drafts, o.num_accepted);
  }
}

void AutoStrategy::FinishStep(int64_t committed, absl::Time step_start, EngineObserver* observer) {
  if (!decided_) return;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - step_start);
  policy_->NoteStepSeconds(seconds, decode_only_);
  if (observer == nullptr) return;
  PolicyStepMetrics m;
  int32_t counts[kNumPolicyMethods] = {};
  for (int32_t method : row_method_) {
    if (method >= 0) ++counts[method];
  }
  for (DraftMethod pm : kAllPolicyMethods) {
    const int32_t n = counts[DraftMethodIndex(pm)];
    if (n > 0) m.rows.push_back({SpeculationMethodName(StepMethod(pm)), n});
  }
  m.estimated_tokens_per_second = tokens_per_second_;
  m.realized_tokens_per_second = seconds > 0 ? static_cast<double>(committed) / seconds : 0;
  m.switched = switched_;
  m.searched = searched_;
  m.host_seconds = seconds_;
  observer->OnPolicy(m);
}

void AutoStrategy::Forget(uint64_t id) { policy_->Forget(id); }

}  // namespace specd
