#include "engine/step/speculator_set.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/field_status.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/model/model_config.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/eagle3.h"
#include "engine/speculation/ngram.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/speculation/vegas.h"

namespace specd {

SpeculatorSet::~SpeculatorSet() = default;

absl::StatusOr<std::unique_ptr<SpeculatorSet>> SpeculatorSet::Create(
    const SpeculatorSetOptions& options, ModelRunner* target, const RunnerOptions& target_runner) {
  std::unique_ptr<SpeculatorSet> set(new SpeculatorSet());
  const SpeculativeConfig& spec = options.speculative;
  set->trees_ok_ = target->SupportsTokenTrees();
  set->lossy_ssv_ok_ = target->SupportsLossySsv();
  set->draft_context_ = options.max_model_len;  // a draft model's may be shorter
  set->ngram_ = std::make_unique<NgramSpeculator>(spec.prompt_lookup_min, spec.prompt_lookup_max);
  // Self-speculation needs the runner's attention options (ChunkAttention: the CPU Model, or the
  // CUDA runner's Vegas kernels) on one rank, on a dense target (an NSA model's attention is
  // sparse already; its own speculation is SSV).
  const bool nsa = target->config().is_nsa();
  if (!nsa && spec.ssv != SsvStrategy{}) {
    return absl::InvalidArgumentError(
        "--speculative-config: \"ssv\" sets how an NSA model verifies; this model is not one");
  }
  if (spec.ssv.lossy() && !set->lossy_ssv_ok_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-config: SSV strategy ", SsvStrategyName(spec.ssv),
        " is lossy (shared mode or a reuse schedule); this backend runs exact strategies only "
        "(lossy ones run on the CPU backend)"));
  }
  if (options.tensor_parallel_size <= 1 && !nsa) {
    set->vegas_ = std::make_unique<VegasSpeculator>(target);
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
  const bool local_head = !spec.eagle3_model.empty() && !HeadDraftsInSsdSpeculator(spec);
  std::shared_ptr<const DraftReplay> replay;
  if (spec.replay.enabled() && (local_draft || local_head || set->vegas_ != nullptr)) {
    SPECD_ASSIGN_OR_RETURN(replay, DraftReplay::Load(spec.replay, target->config().vocab_size));
    SPECD_LOG_WARN(
        "engine: drafts in replay mode (controlled acceptance alpha {}, {} trajectories): a "
        "benchmark setting, not a drafter's acceptance",
        spec.replay.alpha, replay->num_trajectories());
  }
  if (set->vegas_ != nullptr && replay != nullptr) set->vegas_->set_replay(replay);
  if (local_head) SPECD_RETURN_IF_ERROR(set->CreateEagle3(spec, target, replay));
  // SSD's draft runs in the speculator process, not here.
  if (local_draft) {
    SPECD_RETURN_IF_ERROR(set->CreateDraftModel(options, target, target_runner, replay));
  }
  return set;
}

absl::Status SpeculatorSet::CreateDraftModel(const SpeculatorSetOptions& options,
                                             ModelRunner* target,
                                             const RunnerOptions& target_runner,
                                             std::shared_ptr<const DraftReplay> replay) {
  const SpeculativeConfig& spec = options.speculative;
  RunnerOptions draft = target_runner;
  draft.eagle3_head.clear();
  draft.capture_hidden_layers.clear();
  // The draft draws one row per sequence; a parallel draft K rows per sequence in one pass.
  draft.max_sample_rows = spec.parallel_drafting
                              ? static_cast<int32_t>(std::min<int64_t>(
                                    options.max_num_batched_tokens,
                                    int64_t{options.max_num_seqs} * spec.num_speculative_tokens))
                              : 0;
  draft.model_dir = spec.draft_model;
  draft.kv_cache_bytes = spec.draft_kv_cache_bytes;
  if (!spec.speculator_device.empty()) draft.device = spec.speculator_device;
  // The draft runs the target's positions up to its own context: a draft trained on shorter
  // sequences than the server serves drafts for each sequence until it reaches that context.
  SPECD_ASSIGN_OR_RETURN(const ModelConfig draft_config, LoadModelConfig(spec.draft_model));
  draft_context_ = options.max_model_len;
  if (draft_config.max_position_embeddings < options.max_model_len) {
    draft_context_ = draft_config.max_position_embeddings;
    SPECD_LOG_WARN(
        "engine: draft model {}: its context ({} tokens, max_position_embeddings) is below "
        "max_model_len {}: a sequence longer than that decodes on without draft-model drafts "
        "(usage.speculation.draft_context_stop says where)",
        spec.draft_model, draft_context_, options.max_model_len);
  }
  draft.max_model_len = draft_context_;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(draft);
  if (!runner.ok()) {
    return absl::Status(runner.status().code(),
                        absl::StrCat("draft model: ", runner.status().message()));
  }
  const std::string draft_device = (*runner)->device_name();
  const int32_t draft_vocab = (*runner)->config().vocab_size;
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<DraftModelSpeculator> speculator,
      DraftModelSpeculator::Create(*std::move(runner), target->config().vocab_size,
                                   options.max_num_batched_tokens));
  if (spec.parallel_drafting) {
    SPECD_ASSIGN_OR_RETURN(const int32_t mask,
                           DraftModelSpeculator::ReadMaskToken(spec.draft_model, draft_vocab));
    speculator->set_parallel(mask);
  }
  speculator->set_replay(std::move(replay));
  draft_ = std::move(speculator);
  SPECD_LOG_INFO("engine: draft model {} on {} for speculation (default method {}, K {}{})",
                 spec.draft_model, draft_device, SpeculationMethodName(spec.method),
                 spec.num_speculative_tokens, spec.parallel_drafting ? ", parallel drafting" : "");
  return absl::OkStatus();
}

absl::Status SpeculatorSet::CreateEagle3(const SpeculativeConfig& spec, ModelRunner* target,
                                         std::shared_ptr<const DraftReplay> replay) {
  Eagle3Compute* compute = target->eagle3();
  if (compute == nullptr) {
    return absl::InternalError(absl::StrCat("EAGLE-3 head: the runner on ", target->device_name(),
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
      c.aux_layer_ids[1], c.aux_layer_ids[2], target->device_name());
  return absl::OkStatus();
}

void SpeculatorSet::set_ssd(std::unique_ptr<SsdSpeculator> ssd) { ssd_ = std::move(ssd); }

Speculator* SpeculatorSet::at(DraftMethod m) const {
  switch (m) {
    case DraftMethod::kDraftModel:
      return draft_.get();
    case DraftMethod::kNgram:
      return ngram_.get();
    case DraftMethod::kSsd:
      return ssd_.get();
    case DraftMethod::kVegas:
    case DraftMethod::kStreaming:
      return vegas_.get();
    case DraftMethod::kEagle3:
      return eagle3_.get();
    case DraftMethod::kNone:
    case DraftMethod::kSsv:
    case DraftMethod::kAuto:
    case DraftMethod::kDefault:
      return nullptr;
  }
  return nullptr;
}

const SsdStats* SpeculatorSet::ssd_stats() const {
  return ssd_ != nullptr ? &ssd_->stats() : nullptr;
}

absl::StatusOr<ResolvedSpeculation> SpeculatorSet::Resolve(const SpeculationParams& request,
                                                           const SpeculativeConfig& server,
                                                           bool target_is_nsa) const {
  SPECD_ASSIGN_OR_RETURN(ResolvedSpeculation resolved,
                         ResolveSpeculation(request, server, draft_ != nullptr, ssd_ != nullptr,
                                            vegas_ != nullptr, target_is_nsa));
  if (resolved.ssv.lossy() && !lossy_ssv_ok_) {
    return FieldError("speculation.ssv",
                      absl::StrCat("speculation.ssv: strategy ", SsvStrategyName(resolved.ssv),
                                   " is lossy (shared mode or a reuse schedule); this server's "
                                   "backend runs exact strategies only"));
  }
  if (resolved.method == SpeculationMethod::kEagle3 && eagle3_ == nullptr) {
    return FieldError("speculation.method",
                      "speculation.method eagle3 needs an EAGLE-3 head in this process; this "
                      "server's head drafts in its SSD speculator (use method ssd)");
  }
  return resolved;
}

void SpeculatorSet::Release(uint64_t id, uint32_t used) const {
  // Vegas and streaming share a speculator: released once.
  const Speculator* released = nullptr;
  for (DraftMethod m : kDraftingMethods) {
    Speculator* s = at(m);
    if ((used >> DraftMethodIndex(m) & 1u) == 0 || s == nullptr || s == released) continue;
    s->Release(id);
    released = s;
  }
}

}  // namespace specd
