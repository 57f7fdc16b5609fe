#include "engine/engine.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/engine_internal.h"
#include "engine/parallel/tp_group.h"
#include "engine/policy/strategy_policy.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/eagle3.h"
#include "engine/speculation/ngram.h"
#include "engine/speculation/vegas.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/verification/verifier.h"

namespace specd {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

const char* RequestOutcomeName(RequestOutcome o) {
  switch (o) {
    case RequestOutcome::kStop:
      return "stop";
    case RequestOutcome::kLength:
      return "length";
    case RequestOutcome::kAbort:
      return "abort";
    case RequestOutcome::kDeadline:
      return "deadline";
    case RequestOutcome::kError:
      return "error";
  }
  return "unknown";
}

std::vector<int32_t> GenerateResult::ids() const {
  std::vector<int32_t> out;
  out.reserve(tokens.size());
  for (const auto& t : tokens) out.push_back(t.id);
  return out;
}

namespace {

uint64_t SeedFor(const SamplingParams& p) {
  if (p.seed) return *p.seed;
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The mask token of a parallel draft (PARD): `pard_token` in its config.json, as vLLM reads it
// (or `ptd_token_id`).
absl::StatusOr<int32_t> ReadPardToken(const std::string& dir, int32_t vocab) {
  const std::string file = dir + "/config.json";
  SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  for (const char* key : {"pard_token", "ptd_token_id"}) {
    if (!j.is_object() || !j.contains(key)) continue;
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": '", key, "' must be a token id in [0, ", vocab, ")"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--speculative-config: \"parallel\" needs a draft trained for parallel drafting; ", file,
      " names no mask token (\"pard_token\")"));
}

RequestOutcome OutcomeOf(FinishReason reason, const absl::Status& status) {
  if (status.ok())
    return reason == FinishReason::kStop ? RequestOutcome::kStop : RequestOutcome::kLength;
  switch (status.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
      return RequestOutcome::kAbort;
    case absl::StatusCode::kDeadlineExceeded:
      return RequestOutcome::kDeadline;
    default:
      return RequestOutcome::kError;
  }
}

}  // namespace

// Mixed into the request's seed for the acceptance RNG, so it is not the sampler's stream.
constexpr uint64_t kAcceptSeedSalt = 0xbb67ae8584caa73bULL;

Engine::Request::Request(RequestId id, GenerateRequest req, ResolvedSpeculation spec,
                         int32_t block_size, const Tokenizer* tok)
    : id(id),
      request(std::move(req)),
      seq(SeqId{id}, request.prompt_ids, block_size),
      seed(SeedFor(request.params)),
      sampler(request.params, seed),
      spec(spec),
      step(spec),
      stop(request.params.stop) {
  if (spec.enabled()) {
    acceptor.emplace(request.params, seed ^ kAcceptSeedSalt);
    seq.set_num_lookahead_tokens(spec.num_speculative_tokens);
  }
  history.AddPrompt(request.prompt_ids);
  if (tok) detok.emplace(*tok, request.prompt_ids, /*skip_special=*/true);
}

Engine::Engine() : shared_(std::make_unique<Shared>()) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.block_size < 1 || options.max_num_seqs < 1 || options.max_num_batched_tokens < 1 ||
      options.max_waiting < 1) {
    return absl::InvalidArgumentError(
        "block_size, max_num_seqs, max_num_batched_tokens and max_waiting must be positive");
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  RunnerOptions runner;
  runner.model_dir = options.model_dir;
  static_cast<DeviceOptions&>(runner) = options;  // device, weights, threads, KV pool
  static_cast<BatchLimits&>(runner) = options;
  if (options.speculative.enabled()) {
    // Greedy verification draws K + 1 rows per sequence on the device; rows beyond what one
    // Step draws go the host path (every drafted position's logits copied back).
    runner.max_sample_rows = static_cast<int32_t>(std::min<int64_t>(
        options.max_num_batched_tokens,
        int64_t{options.max_num_seqs} * (options.speculative.num_speculative_tokens + 1)));
  }
  if (!options.speculative.eagle3_model.empty()) {
    // The target's runner holds the head (and captures the hidden states it reads).
    SPECD_ASSIGN_OR_RETURN(const ModelConfig target, LoadModelConfig(options.model_dir));
    if (target.is_nsa()) {
      return absl::InvalidArgumentError(
          "--speculative-config: an EAGLE-3 head drafts for a dense Llama-style target; this "
          "model is an NSA model");
    }
    runner.eagle3_head = options.speculative.eagle3_model;
  }
  if (options.tensor_parallel.size > 1) {
    SPECD_ASSIGN_OR_RETURN(engine->runner_, CreateTpGroup(runner, ToTpGroupOptions(options)));
  } else {
    SPECD_ASSIGN_OR_RETURN(engine->runner_, CreateModelRunner(runner));
  }
  const ModelConfig& config = engine->runner_->config();
  if (std::filesystem::exists(std::filesystem::path(options.model_dir) / "tokenizer.json")) {
    SPECD_ASSIGN_OR_RETURN(engine->tokenizer_, Tokenizer::FromDir(options.model_dir));
  }
  engine->max_model_len_ = engine->runner_->max_model_len();
  engine->trees_ok_ = engine->runner_->SupportsTokenTrees();
  if (options.speculative.tree.enabled && !engine->trees_ok_) {
    SPECD_LOG_WARN(
        "engine: {} verifies no token trees yet; tree requests draft chains of the "
        "tree's depth",
        engine->runner_->device_name());
  }
  engine->eos_ids_ = config.generation.eos_token_ids;
  if (engine->tokenizer_) {
    for (int32_t id : engine->tokenizer_->eos_ids()) {
      if (std::find(engine->eos_ids_.begin(), engine->eos_ids_.end(), id) ==
          engine->eos_ids_.end()) {
        engine->eos_ids_.push_back(id);
      }
    }
  }
  SPECD_RETURN_IF_ERROR(engine->CreateSpeculators(runner));
  SPECD_RETURN_IF_ERROR(engine->CreatePolicy());
  ModelRunner* target = engine->runner_.get();
  engine->verifiers_.push_back(std::make_unique<GreedyVerifier>(target));
  engine->verifiers_.push_back(std::make_unique<SampledVerifier>(target));
  engine->verifiers_.push_back(std::make_unique<HostVerifier>(target));
  engine->block_size_ = engine->runner_->block_size();
  const int32_t num_blocks = engine->runner_->num_kv_blocks();
  engine->core_ = std::make_unique<Core>(num_blocks, engine->block_size_, options);
  {
    std::lock_guard lock(engine->shared_->mu);
    engine->shared_->stats.kv_blocks_total = num_blocks;
  }
  SPECD_LOG_INFO("engine: model {} on {}, {} KV blocks of {} tokens, max_model_len {}",
                 options.model_dir, engine->runner_->device_name(), num_blocks, engine->block_size_,
                 engine->max_model_len_);
  return engine;
}

absl::Status Engine::CreateSpeculators(const RunnerOptions& target) {
  const SpeculativeConfig& spec = options_.speculative;
  ngram_ = std::make_unique<NgramSpeculator>(spec.prompt_lookup_min, spec.prompt_lookup_max);
  // Self-speculation needs the runner's attention options (ChunkAttention: the CPU Model, or the
  // CUDA runner's Vegas kernels) on one rank, on a dense target (an NSA model's attention is
  // sparse already; its own speculation is SSV).
  const bool nsa = runner_->config().is_nsa();
  if (!nsa && spec.ssv != SsvStrategy{}) {
    return absl::InvalidArgumentError(
        "--speculative-config: \"ssv\" sets how an NSA model verifies; this model is not one");
  }
  if (options_.tensor_parallel.size <= 1 && !nsa) {
    vegas_ = std::make_unique<VegasSpeculator>(runner_.get());
  } else if (spec.method == SpeculationMethod::kVegas ||
             spec.method == SpeculationMethod::kStreaming) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-config: method ", SpeculationMethodName(spec.method),
                     nsa ? " drafts with dense attention and does not apply to an NSA model"
                         : " needs tensor parallelism off"));
  }
  // Benchmarks' controlled acceptance: one recording, followed by the draft model and the head.
  // (SSD's draft runs in the speculator process, which reads the recording itself.)
  const bool local_draft = !spec.draft_model.empty() && spec.method != SpeculationMethod::kSsd;
  std::shared_ptr<const DraftReplay> replay;
  if (spec.replay.enabled() && (local_draft || !spec.eagle3_model.empty())) {
    SPECD_ASSIGN_OR_RETURN(replay, DraftReplay::Load(spec.replay, runner_->config().vocab_size));
    SPECD_LOG_WARN(
        "engine: drafts in replay mode (controlled acceptance alpha {}, {} trajectories): a "
        "benchmark setting, not a drafter's acceptance",
        spec.replay.alpha, replay->num_trajectories());
  }
  if (!spec.eagle3_model.empty()) SPECD_RETURN_IF_ERROR(CreateEagle3(replay));
  // SSD's draft runs in the speculator process, not here.
  if (spec.method == SpeculationMethod::kSsd) return CreateSsd(target);
  if (spec.draft_model.empty()) return absl::OkStatus();
  RunnerOptions draft = target;
  draft.eagle3_head.clear();
  // The draft draws one row per sequence; a parallel draft K rows per sequence in one pass.
  draft.max_sample_rows = spec.parallel_drafting
                              ? static_cast<int32_t>(std::min<int64_t>(
                                    options_.max_num_batched_tokens,
                                    int64_t{options_.max_num_seqs} * spec.num_speculative_tokens))
                              : 0;
  draft.model_dir = spec.draft_model;
  draft.kv_cache_bytes = spec.draft_kv_cache_bytes;
  if (!spec.speculator_device.empty()) draft.device = spec.speculator_device;
  draft.max_model_len = max_model_len_;  // the draft runs the same positions as the target
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(draft);
  if (!runner.ok()) {
    return absl::Status(runner.status().code(),
                        absl::StrCat("draft model: ", runner.status().message()));
  }
  const std::string draft_device = (*runner)->device_name();
  const int32_t draft_vocab = (*runner)->config().vocab_size;
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<DraftModelSpeculator> speculator,
      DraftModelSpeculator::Create(*std::move(runner), runner_->config().vocab_size,
                                   options_.max_num_batched_tokens));
  if (spec.parallel_drafting) {
    SPECD_ASSIGN_OR_RETURN(const int32_t mask, ReadPardToken(spec.draft_model, draft_vocab));
    speculator->set_parallel(mask);
  }
  speculator->set_replay(replay);
  draft_ = std::move(speculator);
  SPECD_LOG_INFO("engine: draft model {} on {} for speculation (default method {}, K {}{})",
                 spec.draft_model, draft_device, SpeculationMethodName(spec.method),
                 spec.num_speculative_tokens, spec.parallel_drafting ? ", parallel drafting" : "");
  return absl::OkStatus();
}

absl::Status Engine::CreateEagle3(std::shared_ptr<const DraftReplay> replay) {
  const SpeculativeConfig& spec = options_.speculative;
  Eagle3Compute* compute = runner_->eagle3();
  if (compute == nullptr) {
    return absl::InternalError(absl::StrCat("EAGLE-3 head: the runner on ", runner_->device_name(),
                                            " did not load ", spec.eagle3_model));
  }
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Speculator> speculator,
                         Eagle3Speculator::Create(compute));
  speculator->set_replay(std::move(replay));
  eagle3_ = std::move(speculator);
  const Eagle3Config& c = eagle3_->config();
  SPECD_LOG_INFO(
      "engine: EAGLE-3 head {} (hidden {}, draft vocabulary {}, target layers {} {} {}) on {} for "
      "speculation",
      spec.eagle3_model, c.layer.hidden_size, c.draft_vocab_size, c.aux_layer_ids[0],
      c.aux_layer_ids[1], c.aux_layer_ids[2], runner_->device_name());
  return absl::OkStatus();
}

Speculator* Engine::SpeculatorAt(int m) const {
  // Vegas and streaming share one speculator (kSpeculatorMethods' order).
  Speculator* const speculators[kNumSpeculatorSlots] = {draft_.get(), ngram_.get(), ssd_.get(),
                                                        vegas_.get(), vegas_.get(), eagle3_.get()};
  return m >= 0 && m < kNumSpeculatorSlots ? speculators[m] : nullptr;
}

Engine::~Engine() { Stop(); }

const ModelConfig& Engine::model_config() const { return runner_->config(); }

std::string Engine::device_name() const { return runner_->device_name(); }

std::optional<int32_t> Engine::model_bos_id() const {
  return runner_->config().generation.bos_token_id;
}

absl::Status Engine::Validate(const GenerateRequest& request) const {
  return Admit(request).status();
}

absl::StatusOr<ResolvedSpeculation> Engine::Admit(const GenerateRequest& request) const {
  const int32_t vocab = runner_->config().vocab_size;
  SPECD_RETURN_IF_ERROR(request.params.Validate(vocab));
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(request.prompt_ids.size()) >= max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", request.prompt_ids.size(),
                                                   " tokens; the context limit is ",
                                                   max_model_len_));
  }
  if (!request.params.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need a tokenizer; this model has none");
  }
  return ResolveSpeculation(request.speculation, options_.speculative, draft_ != nullptr,
                            ssd_ != nullptr, vegas_ != nullptr, runner_->config().is_nsa());
}

bool Engine::target_is_nsa() const { return runner_->config().is_nsa(); }

Engine::Request& Engine::AddRequest(RequestId id, GenerateRequest request,
                                    const ResolvedSpeculation& spec, OutputCallback on_output,
                                    absl::Time arrival) {
  auto owned =
      std::make_unique<Request>(id, std::move(request), spec, block_size_, tokenizer_.get());
  Request& r = *owned;
  // Lossy SSV verification writes KV that is not the model's: only the prompt's (prefilled
  // exactly) may serve other requests from the prefix cache.
  if (spec.enabled() && spec.ssv.lossy()) r.seq.set_num_shareable_tokens(r.seq.num_prompt_tokens());
  r.on_output = std::move(on_output);
  r.arrival = arrival;
  core_->scheduler.Add(&r.seq);
  core_->live[id] = std::move(owned);
  return r;
}

void Engine::Request::Emit(const TokenCallback* on_token, std::vector<GeneratedToken> new_tokens,
                           std::string text, bool finished, FinishReason reason,
                           absl::Status status) {
  if (sink != nullptr) {  // offline
    for (GeneratedToken& t : new_tokens) {
      if (on_token != nullptr && *on_token) (*on_token)(index, t, text);
      tokens.push_back(std::move(t));
    }
    if (finished) {
      sink->prompt_ids = request.prompt_ids;
      sink->tokens = std::move(tokens);
      sink->text = stop.text();
      sink->finish_reason = reason;
      sink->usage = Usage();
    }
    return;
  }
  if (!on_output) return;
  RequestOutput out;
  out.id = id;
  out.tokens = std::move(new_tokens);
  out.text = std::move(text);
  out.finished = finished;
  out.finish_reason = reason;
  out.status = std::move(status);
  out.usage = Usage();
  on_output(std::move(out));
}

RequestUsage Engine::Request::Usage() const {
  RequestUsage u;
  u.prompt_tokens = seq.num_prompt_tokens();
  u.completion_tokens = seq.num_generated();
  u.cached_prompt_tokens = std::max(0, seq.num_cached_prompt_tokens());
  u.num_drafts = num_drafts;
  u.num_draft_tokens = num_draft_tokens;
  u.num_accepted_tokens = num_accepted_tokens;
  u.num_cache_hit_drafts = num_cache_hit_drafts;
  u.num_cache_hit_draft_tokens = num_cache_hit_draft_tokens;
  u.num_cache_hit_accepted_tokens = num_cache_hit_accepted_tokens;
  u.ssd = spec.method == SpeculationMethod::kSsd;
  for (const RequestUsage::MethodUsage& m : by_method) {
    if (m.num_drafts > 0) u.by_method.push_back(m);
  }
  return u;
}

void Engine::NoteScheduled(const StepPlan& plan, absl::Time now) {
  for (const Sequence* seq : plan.admitted) {
    Request& r = *core_->live.find(seq->id().value)->second;
    if (!r.first_scheduled) r.first_scheduled = now;
  }
  if (!plan.preempted.empty()) {
    SPECD_LOG_DEBUG("engine: preempted {} sequences (KV full)", plan.preempted.size());
  }
  EngineObserver* observer = options_.observer.get();
  if (observer == nullptr) return;
  if (plan.num_queried_blocks > 0)
    observer->OnPrefixCache(plan.num_queried_blocks, plan.num_hit_blocks);
  if (!plan.preempted.empty()) {
    observer->OnPreemption(static_cast<int32_t>(plan.preempted.size()));
  }
}

namespace {

bool Contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

}  // namespace

bool Engine::CommitToken(Request& r, SampleResult sampled, absl::Time now) {
  const SamplingParams& p = r.request.params;
  const int32_t num_generated = r.seq.num_generated();
  r.seq.AppendToken(sampled.id);
  r.history.AddOutput(sampled.id);
  std::vector<GeneratedToken> token = {{sampled.id, sampled.logprob, std::move(sampled.top)}};

  bool stop =
      (!p.ignore_eos && Contains(eos_ids_, sampled.id)) || Contains(p.stop_token_ids, sampled.id);
  if (r.detok) stop |= r.stop.Append(r.detok->Push(sampled.id));
  const bool length = num_generated + 1 >= p.max_tokens || r.seq.num_tokens() >= max_model_len_;
  const bool finished = stop || length;
  if (finished && r.detok && !r.stop.stopped()) stop |= r.stop.Append(r.detok->Flush());
  std::string text = r.stop.TakeStreamable(finished);
  if (r.first_token && options_.observer) {
    options_.observer->OnInterTokenLatency(Seconds(now - r.last_token));
  }
  if (!r.first_token) r.first_token = now;
  r.last_token = now;
  if (finished) {
    FinishRequest(r, stop ? FinishReason::kStop : FinishReason::kLength, absl::OkStatus(), now,
                  std::move(token), std::move(text));
    return true;
  }
  r.Emit(core_->on_token, std::move(token), std::move(text), false, FinishReason::kLength,
         absl::OkStatus());
  return false;
}

// Frees the request's KV, sends its last update, reports it, and destroys it.
void Engine::FinishRequest(Request& r, FinishReason reason, absl::Status status, absl::Time now,
                           std::vector<GeneratedToken> tokens, std::string text) {
  core_->scheduler.Finish(&r.seq);
  // Every speculator that drafted for it (`auto` may have used several) drops its state.
  for (int m = 0; m < kNumSpeculatorSlots; ++m) {
    if ((r.used_speculators >> m & 1u) != 0 && SpeculatorAt(m) != nullptr) {
      SpeculatorAt(m)->Release(r.id);
    }
  }
  if (r.used_policy) policy_->Forget(r.id);
  if (EngineObserver* observer = options_.observer.get()) {
    FinishedRequestMetrics m;
    m.outcome = OutcomeOf(reason, status);
    m.prompt_tokens = r.seq.num_prompt_tokens();
    m.generated_tokens = r.seq.num_generated();
    m.queue_seconds = Seconds(r.first_scheduled.value_or(now) - r.arrival);
    m.ttft_seconds = r.first_token ? Seconds(*r.first_token - r.arrival) : -1.0;
    m.e2e_seconds = Seconds(now - r.arrival);
    observer->OnRequestFinished(m);
  }
  if (!status.ok()) {
    SPECD_LOG_DEBUG("engine: request {} ({}) ended: {}", r.id, r.request.request_id,
                    status.ToString());
  }
  r.Emit(core_->on_token, std::move(tokens), std::move(text), true, reason, std::move(status));
  core_->live.erase(r.id);
}

void Engine::FinishAll(const absl::Status& status) {
  std::vector<RequestId> ids;
  for (const auto& [id, r] : core_->live) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  const absl::Time now = absl::Now();
  for (RequestId id : ids) FinishRequest(*core_->live[id], FinishReason::kAbort, status, now);
}

// ---- Offline ----

absl::StatusOr<std::vector<GenerateResult>> Engine::GenerateBatch(
    std::span<const GenerateRequest> requests, const TokenCallback& on_token) {
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->started) {
      return absl::FailedPreconditionError("the engine is serving: use Submit, not Generate");
    }
  }
  std::vector<ResolvedSpeculation> speculation;
  speculation.reserve(requests.size());
  for (const GenerateRequest& r : requests) {
    SPECD_ASSIGN_OR_RETURN(ResolvedSpeculation s, Admit(r));
    speculation.push_back(std::move(s));
  }
  std::vector<GenerateResult> results(requests.size());
  core_->on_token = &on_token;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = AddRequest(core_->next_offline_id++, requests[i], speculation[i], {}, now);
    r.sink = &results[i];
    r.index = i;
  }
  absl::Status status;
  while (!core_->live.empty() && status.ok()) {
    absl::StatusOr<bool> ran = RunStep();
    status = ran.status();
    if (status.ok() && !*ran) status = absl::InternalError("scheduler made no progress");
  }
  if (!status.ok()) FinishAll(status);
  core_->on_token = nullptr;
  SPECD_RETURN_IF_ERROR(status);
  return results;
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                                const TokenCallback& on_token) {
  SPECD_ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                         GenerateBatch(std::span<const GenerateRequest>(&request, 1), on_token));
  return std::move(results.front());
}

}  // namespace specd
