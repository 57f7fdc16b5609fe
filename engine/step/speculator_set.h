// The speculators one server drafts with, one per method (draft model, n-gram, SSD, vegas and
// streaming (one speculator), EAGLE-3), created once from --speculative-config, and looked up by
// the DraftMethod a row runs. What the step pipeline drives in Speculate and tells in Apply, what
// `auto` prices, and what Admit resolves a request's speculation against. Engine thread only
// after creation (the creation itself: Engine::Create).
//
// A new drafting method: a DraftMethod value (engine/base/draft_method.h), its speculator's
// creation here and its entry in at(); docs/architecture.md lists the rest.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/base/draft_method.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/spec_config.h"
#include "engine/speculation/speculator.h"
#include "engine/speculation/ssd/ssd_stats.h"

namespace specd {

class DraftModelSpeculator;
class DraftReplay;
class Eagle3Speculator;
class SsdSpeculator;
class VegasSpeculator;

// The methods whose speculator drafts, in the order the pipeline asks them (DraftMethod order).
inline constexpr std::array<DraftMethod, 6> kDraftingMethods = {
    DraftMethod::kDraftModel, DraftMethod::kNgram,     DraftMethod::kSsd,
    DraftMethod::kVegas,      DraftMethod::kStreaming, DraftMethod::kEagle3};

// An EAGLE-3 head in SSD's speculator (method ssd, "speculator_drafter": "eagle3"): the head
// drafts in the speculator process, not here (no Eagle3Speculator: method eagle3 is not served);
// the target keeps the head's layers' hidden states for it (Engine::Create).
inline bool HeadDraftsInSsdSpeculator(const SpeculativeConfig& c) {
  return c.method == SpeculationMethod::kSsd && c.ssd.eagle3_drafter;
}

struct SpeculatorSetOptions {
  SpeculativeConfig speculative;
  int32_t tensor_parallel_size = 1;  // vegas and streaming draft on one rank only
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;  // the target's (the draft runs the same positions)
};

class SpeculatorSet {
 public:
  // The speculators `options.speculative` asks for, beside `target` (whose runner options
  // `target_runner` a local draft model inherits); SSD's comes later (set_ssd). InvalidArgument
  // for a configuration this target cannot run; the draft model's or head's load errors.
  static absl::StatusOr<std::unique_ptr<SpeculatorSet>> Create(const SpeculatorSetOptions& options,
                                                               ModelRunner* target,
                                                               const RunnerOptions& target_runner);
  ~SpeculatorSet();

  // Method ssd: the speculator process's client (Engine::CreateSsd).
  void set_ssd(std::unique_ptr<SsdSpeculator> ssd);

  // The speculator that drafts for `m`, or null: none loaded, or a method without one (kNone,
  // kSsv, kAuto, kDefault). Vegas and streaming share one.
  Speculator* at(DraftMethod m) const;
  DraftModelSpeculator* draft() const { return draft_.get(); }
  Eagle3Speculator* eagle3() const { return eagle3_.get(); }
  SsdSpeculator* ssd() const { return ssd_.get(); }
  bool has_sparse_drafting() const { return vegas_ != nullptr; }  // vegas and streaming
  VegasSpeculator* vegas() const { return vegas_.get(); }
  bool lossy_ssv_ok() const { return lossy_ssv_ok_; }  // the target runs lossy SSV strategies
  const SsdStats* ssd_stats() const;                   // null without SSD
  // The target verifies token trees (ModelRunner::SupportsTokenTrees); without, a tree request
  // drafts a chain of its tree's depth.
  bool trees_ok() const { return trees_ok_; }
  // The most tokens a sequence may hold for the draft model to draft for it: its context, the
  // smaller of max_model_len and its max_position_embeddings (a sequence past it decodes on
  // without draft-model drafts, as vLLM does); max_model_len without a draft model.
  int32_t draft_context() const { return draft_context_; }

  // A request's speculation resolved against the server's config and what it loaded (Admit).
  absl::StatusOr<ResolvedSpeculation> Resolve(const SpeculationParams& request,
                                              const SpeculativeConfig& server,
                                              bool target_is_nsa) const;
  // Every speculator in `used` (bit DraftMethodIndex(m): method m drafted for it) drops the
  // request's state.
  void Release(uint64_t id, uint32_t used) const;

 private:
  SpeculatorSet() = default;
  absl::Status CreateDraftModel(const SpeculatorSetOptions& options, ModelRunner* target,
                                const RunnerOptions& target_runner,
                                std::shared_ptr<const DraftReplay> replay);
  absl::Status CreateEagle3(const SpeculativeConfig& spec, ModelRunner* target,
                            std::shared_ptr<const DraftReplay> replay);

  std::unique_ptr<Speculator> ngram_;            // always there (free to run)
  std::unique_ptr<DraftModelSpeculator> draft_;  // when the config names a draft model
  std::unique_ptr<SsdSpeculator> ssd_;           // method ssd: the speculator process's client
  // Methods vegas and streaming: the target drafts for itself (one rank only).
  std::unique_ptr<VegasSpeculator> vegas_;
  // Method eagle3: a draft head reading the target's hidden states (this process, rank 0).
  std::unique_ptr<Eagle3Speculator> eagle3_;
  bool trees_ok_ = false;
  int32_t draft_context_ = 0;
  bool lossy_ssv_ok_ = false;  // the target takes lossy SSV strategies (ModelRunner)
};

}  // namespace specd
