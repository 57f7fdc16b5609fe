// `auto` speculation in the engine: the StrategyPolicy (engine/policy) is created with the cost
// profile (`--cost-profile`, or the default rule below), asked once per step in Prepare for the
// method and K of every running decode whose request said `auto`, and told each verified round
// in Apply. Requests with an explicit method or K are described to it as pinned, so it prices
// the whole batch. Engine thread only (CreatePolicy: Engine::Create).
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
// it observes (FinishPolicyStep: StrategyPolicy::NoteStepSeconds), and searches only every few
// steps when its own search would otherwise weigh on short steps. On a hold step whose decodes
// are the last decision's (KeepStrategies) the engine does not describe the batch again: a
// batch-64 step of a small model on a GPU is ~0.25 ms, and describing it costs ~10 us.
// Stateful drafters are not kept in step while paused: the draft model resynchronises when it
// resumes (its catch-up chunk runs every token committed since, DraftModelSpeculator::Prepare),
// so the policy runs with sync_paused_drafters = false.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/model/model_config.h"
#include "engine/policy/strategy_policy.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/eagle3.h"

namespace specd {
namespace {

constexpr double kDefaultBaseMs = 10;
constexpr double kGpuKnee = 64;
constexpr double kCpuKnee = 2;

std::optional<PolicyMethod> ToPolicy(SpeculationMethod m) {
  switch (m) {
    case SpeculationMethod::kNone:
      return PolicyMethod::kPlain;
    case SpeculationMethod::kDraftModel:
      return PolicyMethod::kDraftModel;
    case SpeculationMethod::kNgram:
      return PolicyMethod::kNgram;
    case SpeculationMethod::kSsd:
      return PolicyMethod::kSsd;
    case SpeculationMethod::kVegas:
      return PolicyMethod::kVegas;
    case SpeculationMethod::kStreaming:
      return PolicyMethod::kStreaming;
    case SpeculationMethod::kEagle3:
      return PolicyMethod::kEagle3;
    default:
      return std::nullopt;
  }
}

SpeculationMethod FromPolicy(PolicyMethod m) {
  switch (m) {
    case PolicyMethod::kDraftModel:
      return SpeculationMethod::kDraftModel;
    case PolicyMethod::kNgram:
      return SpeculationMethod::kNgram;
    case PolicyMethod::kSsd:
      return SpeculationMethod::kSsd;
    case PolicyMethod::kVegas:
      return SpeculationMethod::kVegas;
    case PolicyMethod::kStreaming:
      return SpeculationMethod::kStreaming;
    case PolicyMethod::kEagle3:
      return SpeculationMethod::kEagle3;
    default:
      return SpeculationMethod::kNone;  // plain (SSV is not built)
  }
}

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

absl::Status Engine::CreatePolicy() {
  // Always: a request may ask for `auto` on a server whose default is no speculation.
  std::optional<CostProfile> profile;
  if (!options_.cost_profile.empty()) {
    absl::StatusOr<CostProfile> loaded = CostProfile::Load(options_.cost_profile);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cost-profile: ", loaded.status().message()));
    }
    profile = *std::move(loaded);
    cost_profile_source_ = absl::StrCat("file ", options_.cost_profile);
  } else {
    SPECD_ASSIGN_OR_RETURN(const DeviceChoice device, ParseDevice(options_.device));
    const auto* draft = static_cast<const DraftModelSpeculator*>(draft_.get());
    profile = DefaultCostProfile(device.cuda, runner_->config(),
                                 {.draft = draft != nullptr ? &draft->runner().config() : nullptr,
                                  .parallel = draft != nullptr && draft->parallel(),
                                  .eagle3 = eagle3_ != nullptr ? &eagle3_->config() : nullptr});
    cost_profile_source_ = absl::StrCat("default: ", profile->device);
  }
  WarnOfProfileMismatch(*profile, static_cast<const DraftModelSpeculator*>(draft_.get()),
                        eagle3_ != nullptr);
  PolicyOptions options;
  options.max_k = std::clamp(options_.speculative.num_speculative_tokens, 1, kMaxPolicyK);
  options.sync_paused_drafters = false;  // the draft model catches up when it resumes
  SPECD_ASSIGN_OR_RETURN(policy_, StrategyPolicy::Create(*std::move(profile), options));
  policy_->SetEnvironment({.draft_model_loaded = draft_ != nullptr,
                           .eagle3_loaded = eagle3_ != nullptr,
                           .speculator_connected = ssd_ != nullptr,
                           .target_is_nsa = runner_->config().is_nsa()});
  cost_profile_json_ = policy_->profile().ToJson();
  SPECD_LOG_INFO("engine: auto speculation's cost profile: {}", cost_profile_source_);
  return absl::OkStatus();
}

void Engine::ChooseStrategies(const StepPlan& plan) {
  const absl::Time start = absl::Now();
  DecideStrategies(plan);
  core_->policy_seconds = absl::ToDoubleSeconds(absl::Now() - start);
}

int32_t Engine::DraftRoom(const Request& r, const ScheduledChunk& chunk) const {
  return std::min({chunk.num_lookahead_tokens, max_model_len_ - r.seq.num_tokens(),
                   r.request.params.max_tokens - r.seq.num_generated() - 1});
}

void Engine::ApplyStrategy(Request& r, int32_t row, PolicyMethod method, int32_t k,
                           bool reserve_longest) {
  core_->row_policy_method[row] = static_cast<int32_t>(method);
  r.step.method = k > 0 ? FromPolicy(method) : SpeculationMethod::kNone;
  r.step.num_speculative_tokens = r.step.method == SpeculationMethod::kNone ? 0 : k;
  r.seq.set_num_lookahead_tokens(reserve_longest ? r.spec.num_speculative_tokens
                                                 : r.step.num_speculative_tokens);
}

void Engine::DecideStrategies(const StepPlan& plan) {
  Core& c = *core_;
  c.policy_decided = false;
  c.row_policy_method.assign(c.rows.size(), -1);
  bool any_auto = false;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    Request& r = *c.row_requests[k];
    r.step = r.spec;
    if (r.spec.method != SpeculationMethod::kAuto) continue;
    r.step.method = SpeculationMethod::kNone;  // until the policy says otherwise
    r.step.num_speculative_tokens = 0;
    any_auto |= plan.chunks[c.rows[k].chunk].num_new_tokens == 1;
  }
  if (!any_auto || policy_ == nullptr) return;
  // Whether the profile models the whole step (no prefill chunk beside the decodes): only such
  // steps calibrate it, and only then may auto requests reserve their longest K.
  c.policy_decode_only =
      std::all_of(plan.chunks.begin(), plan.chunks.end(),
                  [](const ScheduledChunk& ch) { return ch.num_new_tokens == 1; });
  if (KeepStrategies(plan)) return;
  std::vector<PolicyRequest> requests;
  std::vector<int32_t> request_rows;
  const auto* draft = static_cast<const DraftModelSpeculator*>(draft_.get());
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const ScheduledChunk& chunk = plan.chunks[c.rows[k].chunk];
    if (chunk.num_new_tokens != 1) continue;  // a prompt's last chunk: it cannot speculate
    const Request& r = *c.row_requests[k];
    PolicyRequest q;
    q.id = r.id;
    q.context_len = r.seq.num_computed();
    if (vegas_ == nullptr) {
      q.allowed.Remove(PolicyMethod::kVegas);
      q.allowed.Remove(PolicyMethod::kStreaming);
    }
    // SSV is how an NSA target verifies whatever method drafted (the request's
    // speculation.ssv), not a drafting method of its own: the policy picks the drafter.
    q.allowed.Remove(PolicyMethod::kSsv);
    q.remaining_tokens = r.request.params.max_tokens - r.seq.num_generated();
    if (draft != nullptr) {
      // The draft model's KV covers the first kv_length tokens: the rest it runs before drafting.
      q.catch_up_tokens[static_cast<size_t>(PolicyMethod::kDraftModel)] =
          std::max<int64_t>(0, r.seq.num_tokens() - 1 - draft->kv_length(r.id));
    }
    // The longest useful K this step (as Speculate limits it).
    const int32_t room = DraftRoom(r, chunk);
    if (r.spec.method == SpeculationMethod::kAuto) {
      q.max_k = std::max(0, std::min(r.spec.num_speculative_tokens, room));
      if (r.spec.k_pinned) q.pinned_k = q.max_k;
      for (PolicyMethod m : kAllPolicyMethods) {
        if (r.spec.Forbids(FromPolicy(m)) && m != PolicyMethod::kPlain) q.forbidden.Add(m);
      }
      if (q.max_k == 0) q.pinned_k = 0;
    } else {
      q.pinned_method = ToPolicy(r.spec.method).value_or(PolicyMethod::kPlain);
      q.pinned_k =
          r.spec.enabled() ? std::max(0, std::min(r.spec.num_speculative_tokens, room)) : 0;
      if (q.pinned_k == 0) q.pinned_method = PolicyMethod::kPlain;
    }
    requests.push_back(q);
    request_rows.push_back(static_cast<int32_t>(k));
  }
  const PolicyDecision decision = policy_->Decide(requests);
  c.policy_decided = true;
  c.policy_switched = decision.switched;
  c.policy_searched = decision.searched;
  c.policy_tokens_per_second = decision.tokens_per_second;
  const bool reserve_longest = ReserveLongestK();
  c.policy_ids.clear();
  for (size_t i = 0; i < decision.rows.size(); ++i) {
    const int32_t k = request_rows[i];
    Request& r = *c.row_requests[k];
    r.used_policy = true;
    c.policy_ids.push_back(r.id);
    r.policy_method = static_cast<int32_t>(decision.rows[i].strategy.method);
    r.policy_k = decision.rows[i].strategy.k;
    if (r.spec.method != SpeculationMethod::kAuto) continue;
    const Strategy s = decision.rows[i].strategy;
    ApplyStrategy(r, k, s.method, s.k, reserve_longest);
  }
}

bool Engine::ReserveLongestK() const {
  // The lookahead slots the scheduler reserves next step (KV blocks and token budget, taken
  // before any prefill's): the K held until the policy searches again, the request's longest K
  // before a search, so that the search may raise K. Not while prompts wait or are part-way
  // through their prefill: decodes reserving drafts the policy is unlikely to run would slow
  // the prefills down (a request's first decode still reserves its longest K).
  return policy_->SearchDue() && core_->policy_decode_only && core_->scheduler.num_waiting() == 0;
}

bool Engine::KeepStrategies(const StepPlan& plan) {
  Core& c = *core_;
  if (policy_->SearchDue() || c.policy_ids.empty()) return false;
  // The decodes must be the last decision's, in its order, each with room for its K.
  size_t next = 0;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const ScheduledChunk& chunk = plan.chunks[c.rows[k].chunk];
    if (chunk.num_new_tokens != 1) continue;
    const Request& r = *c.row_requests[k];
    if (next >= c.policy_ids.size() || c.policy_ids[next++] != r.id) return false;
    if (r.policy_k > DraftRoom(r, chunk)) return false;
  }
  if (next != c.policy_ids.size()) return false;
  policy_->KeepLastDecision();
  const bool reserve_longest = ReserveLongestK();
  for (size_t k = 0; k < c.rows.size(); ++k) {
    if (plan.chunks[c.rows[k].chunk].num_new_tokens != 1) continue;
    Request& r = *c.row_requests[k];
    if (r.spec.method != SpeculationMethod::kAuto) continue;
    ApplyStrategy(r, static_cast<int32_t>(k), static_cast<PolicyMethod>(r.policy_method),
                  r.policy_k, reserve_longest);
  }
  c.policy_decided = true;
  c.policy_switched = false;
  c.policy_searched = false;
  return true;
}

void Engine::ReportToPolicy() {
  Core& c = *core_;
  if (!c.policy_decided) return;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    if (c.row_policy_method[k] < 0) continue;
    const Request& r = *c.row_requests[k];
    const auto method = static_cast<PolicyMethod>(c.row_policy_method[k]);
    if (r.step.num_speculative_tokens == 0) continue;
    const RowOutcome& o = c.outcomes[k];
    // A round the speculator had nothing for (no n-gram match, no draft KV) ran as a plain row:
    // it moves the method's offer rate, not its acceptance.
    policy_->OnVerified(r.id, method, o.num_drafts, o.num_accepted);
  }
}

void Engine::FinishPolicyStep(int64_t committed) {
  Core& c = *core_;
  if (!c.policy_decided) return;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - c.step_start);
  policy_->NoteStepSeconds(seconds, c.policy_decode_only);
  if (!options_.observer) return;
  PolicyStepMetrics m;
  int32_t counts[kNumPolicyMethods] = {};
  for (int32_t method : c.row_policy_method) {
    if (method >= 0) ++counts[method];
  }
  for (PolicyMethod pm : kAllPolicyMethods) {
    const int32_t n = counts[static_cast<int>(pm)];
    if (n > 0) m.rows.push_back({SpeculationMethodName(FromPolicy(pm)), n});
  }
  m.estimated_tokens_per_second = c.policy_tokens_per_second;
  m.realized_tokens_per_second = seconds > 0 ? static_cast<double>(committed) / seconds : 0;
  m.switched = c.policy_switched;
  m.searched = c.policy_searched;
  m.host_seconds = c.policy_seconds;
  options_.observer->OnPolicy(m);
}

}  // namespace specd
