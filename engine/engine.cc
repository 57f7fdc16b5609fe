// The engine facade (engine.h): creation (the runner, the tokenizer, the speculators, `auto`'s
// strategy and the step pipeline), admission, and the offline calls. The serving half is
// engine_serving.cc; one step is engine/step/step_pipeline.h.
#include "engine/engine.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine_internal.h"
#include "engine/parallel/tp_group.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/step/auto_strategy.h"
#include "engine/step/speculator_set.h"
#include "engine/step/step_pipeline.h"
#include "engine/tokenizer/tokenizer.h"

namespace specd {

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
  // Greedy verification draws K + 1 rows per sequence on the device; rows beyond what one Step
  // draws go the host path (every drafted position's logits copied back, tens of milliseconds a
  // round at a 128K vocabulary). Requests may speculate without a --speculative-config (n-gram,
  // vegas and streaming need no model), so the rows are sized for the default K either way.
  runner.max_sample_rows = static_cast<int32_t>(std::min<int64_t>(
      options.max_num_batched_tokens,
      int64_t{options.max_num_seqs} * (options.speculative.num_speculative_tokens + 1)));
  if (!options.speculative.eagle3_model.empty()) {
    // Any target the head's shapes fit: dense or NSA (whose passes capture the same residual
    // stream; its verification attends by SSV as for every drafter).
    SPECD_ASSIGN_OR_RETURN(const ModelConfig target, LoadModelConfig(options.model_dir));
    if (HeadDraftsInSsdSpeculator(options.speculative)) {
      // The head drafts in SSD's speculator: the target keeps the hidden states it reads.
      SPECD_RETURN_IF_ERROR(CaptureForSsdHead(options.speculative, target, &runner));
    } else {
      // The target's runner holds the head (and captures the hidden states it reads).
      runner.eagle3_head = options.speculative.eagle3_model;
    }
  }
  if (options.tensor_parallel.size > 1) {
    SPECD_ASSIGN_OR_RETURN(engine->runner_, CreateTpGroup(runner, ToTpGroupOptions(options)));
  } else {
    SPECD_ASSIGN_OR_RETURN(engine->runner_, CreateModelRunner(runner));
  }
  ModelRunner& target = *engine->runner_;
  if (!runner.capture_hidden_layers.empty()) {  // (empty ids would stop an in-process head's)
    const absl::Status s = target.CaptureHiddenStates(runner.capture_hidden_layers);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("the SSD speculator's EAGLE-3 head: ", s.message()));
    }
  }
  const ModelConfig& config = target.config();
  if (std::filesystem::exists(std::filesystem::path(options.model_dir) / "tokenizer.json")) {
    SPECD_ASSIGN_OR_RETURN(engine->tokenizer_, Tokenizer::FromDir(options.model_dir));
  }
  engine->max_model_len_ = target.max_model_len();
  if (options.speculative.tree.enabled && !target.SupportsTokenTrees()) {
    SPECD_LOG_WARN(
        "engine: {} verifies no token trees yet; tree requests draft chains of the "
        "tree's depth",
        target.device_name());
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
  SpeculatorSetOptions speculation;
  speculation.speculative = options.speculative;
  speculation.tensor_parallel_size = options.tensor_parallel.size;
  speculation.max_num_seqs = options.max_num_seqs;
  speculation.max_num_batched_tokens = options.max_num_batched_tokens;
  speculation.max_model_len = engine->max_model_len_;
  SPECD_ASSIGN_OR_RETURN(engine->speculators_, SpeculatorSet::Create(speculation, &target, runner));
  if (options.speculative.method == SpeculationMethod::kSsd) {
    SPECD_RETURN_IF_ERROR(engine->CreateSsd(runner));
  }
  AutoStrategyOptions strategy;
  strategy.cost_profile = options.cost_profile;
  strategy.device = options.device;
  strategy.max_k = options.speculative.num_speculative_tokens;
  strategy.max_model_len = engine->max_model_len_;
  SPECD_ASSIGN_OR_RETURN(engine->strategy_,
                         AutoStrategy::Create(strategy, config, *engine->speculators_));
  StepPipelineOptions step;
  step.num_kv_blocks = target.num_kv_blocks();
  step.block_size = target.block_size();
  step.enable_prefix_caching = options.enable_prefix_caching;
  step.max_num_seqs = options.max_num_seqs;
  step.max_num_batched_tokens = options.max_num_batched_tokens;
  step.max_model_len = engine->max_model_len_;
  step.eos_ids = engine->eos_ids_;
  step.observer = options.observer.get();
  engine->pipeline_ = std::make_unique<StepPipeline>(
      step, &target, engine->speculators_.get(), engine->strategy_.get(), engine->tokenizer_.get());
  {
    std::lock_guard lock(engine->shared_->mu);
    engine->shared_->stats.kv_blocks_total = step.num_kv_blocks;
  }
  SPECD_LOG_INFO("engine: model {} on {}, {} KV blocks of {} tokens, max_model_len {}",
                 options.model_dir, target.device_name(), step.num_kv_blocks, step.block_size,
                 engine->max_model_len_);
  return engine;
}

Engine::~Engine() { Stop(); }

const ModelConfig& Engine::model_config() const { return runner_->config(); }

std::string Engine::device_name() const { return runner_->device_name(); }

std::optional<int32_t> Engine::model_bos_id() const {
  return runner_->config().generation.bos_token_id;
}

bool Engine::has_draft_model() const { return speculators_->draft() != nullptr; }
bool Engine::has_ssd() const { return speculators_->ssd() != nullptr; }
bool Engine::has_eagle3() const { return speculators_->eagle3() != nullptr; }
bool Engine::has_sparse_drafting() const { return speculators_->has_sparse_drafting(); }
bool Engine::target_is_nsa() const { return runner_->config().is_nsa(); }
const std::string& Engine::cost_profile_json() const { return strategy_->profile_json(); }
const std::string& Engine::cost_profile_source() const { return strategy_->profile_source(); }

int32_t Engine::ssd_speculator_pid() const {
  const SsdSpeculator* ssd = speculators_->ssd();
  return ssd != nullptr ? ssd->speculator_pid() : -1;
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
  return speculators_->Resolve(request.speculation, options_.speculative,
                               runner_->config().is_nsa());
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
  StepPipeline& pipeline = *pipeline_;
  pipeline.set_on_token(&on_token);
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < requests.size(); ++i) {
    LiveRequest& r = pipeline.Add(next_offline_id_++, requests[i], speculation[i], {}, now);
    r.sink = &results[i];
    r.index = i;
  }
  absl::Status status;
  while (!pipeline.empty() && status.ok()) {
    absl::StatusOr<bool> ran = pipeline.Run([this] { PublishStats(false); });
    status = ran.status();
    if (status.ok() && !*ran) status = absl::InternalError("scheduler made no progress");
  }
  if (!status.ok()) pipeline.FinishAll(status);
  pipeline.set_on_token(nullptr);
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
