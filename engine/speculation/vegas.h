// Vegas self-speculation (the Vegas paper, ../shared/papers/): the target drafts K tokens for
// itself, each draft step a forward pass of the target over the sequence's own KV blocks with
// sparse attention: in layer l a query attends only the prefix tokens of the sequence's current
// selection for l plus every token after the prefix that was scored (the latest committed tokens
// and the drafts so far). The drafts' KV goes into the lookahead slots and the last committed
// token's slot; the dense verification pass rewrites those positions, so the output is exactly
// the target's. The selection comes from round T's verification pass (OnVerified's scores: the
// head-averaged attention weights of the rows predicting the first draft and the bonus token):
// per layer the top k = clamp(ceil(ratio * n), min, max) prefix tokens (kernels::ref::
// VegasSelectTopK). A sequence without a selection yet drafts with the streaming selection.
// Method "streaming" (StreamingLLM / MagicDec; Vegas's baseline) always uses it: the first 4
// tokens (attention sinks) and a recent window, k tokens in all.
// Greedy requests draft the argmax; sampled requests draw from the processed distribution (as the
// target's sampler builds it) with their own RNG and return it as q, so verification stays
// lossless. Needs a runner that takes ChunkAttention (the CPU backend; the CUDA runner through the
// Vegas kernels).
// On a runner that keeps selections on its device (ModelRunner::num_sparse_slots() > 0, the CUDA
// runner) a Vegas sequence holds a selection slot: its verification pass selects into the slot
// on the device (PrepareScoring: ChunkAttention::select_slot) and its draft steps attend the slot
// (ChunkAttention::slot), so neither scores nor lists cross to the host, and greedy draft steps
// draw their argmax on the device (ModelRunner::Step: ids only come back), replaying CUDA graphs.
// Without a free slot a sequence takes the host path above. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/model/model.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/speculator.h"

namespace specd {

// Attention sinks of the streaming selection (StreamingLLM keeps the first 4 tokens).
inline constexpr int32_t kStreamingSinkTokens = 4;

// The prefix tokens a budget keeps of n (kernels::ref::VegasKeepCount; max_tokens 0: no cap).
int64_t SparseKeepCount(int64_t n, const SparseDraftOptions& budget);

class VegasSpeculator : public Speculator {
 public:
  // runner: the target's (not owned; outlives the speculator).
  explicit VegasSpeculator(ModelRunner* runner);

  // Inputs need block_table and num_computed (the sequence's last token uncomputed) and a
  // speculation of method vegas or streaming; others get no drafts.
  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  // Vegas rounds with scores (or scored into the sequence's slot) replace its selection.
  void OnVerified(std::span<const VerifiedRound> rounds) override;
  void Release(uint64_t seq_id) override;

  // For the verification chunk of a Vegas round of seq_id: where its selection goes. With a
  // selection slot, sets attention->select_slot and its budget and returns true (the runner
  // selects on the device; the round's VerifiedRound carries num_scored and no scores); false:
  // the caller collects scores on the host (ChunkAttention::scores).
  bool PrepareScoring(uint64_t seq_id, ChunkAttention* attention);

  // Benchmarks only: greedy drafts follow `replay` (controlled acceptance,
  // engine/speculation/draft_replay.h) while every sparse draft pass still runs; nullptr turns it
  // off. Sampled drafts are not replayed.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }

  // Tests: the prefix length of seq_id's selection (0: none yet) and its layer-l tokens.
  int32_t selection_prefix(uint64_t seq_id) const;
  std::span<const int32_t> selection(uint64_t seq_id, int32_t layer) const;

 private:
  struct State {
    SparseDraftOptions budget;     // the request's (OnVerified selects with it)
    int32_t num_scored = 0;        // the selection's prefix length; 0: none
    int32_t num_kept = 0;          // tokens per layer
    std::vector<int32_t> indices;  // [num_layers, num_kept] ascending per layer (host selection)
    int32_t slot = -1;             // the runner's selection slot; -1: none
    bool in_slot = false;          // the selection is the slot's (not `indices`)
    std::mt19937_64 rng;           // sampled drafts
    bool seeded = false;
    std::unique_ptr<Sampler> sampler;  // device draws' SampleRow (greedy: unused draws)
  };
  // One input's draft plan for this round.
  struct Plan {
    bool active = false;
    int32_t num_drafts = 0;  // K, within the runner's max_attention_option_tokens
    ChunkAttention attention;
    std::vector<std::span<const int32_t>> lists;  // [num_layers]
    std::vector<int32_t> sinks;                   // streaming: [sinks]
  };

  // The sparse keys of one input: its selection, or sinks and a recent window.
  void PlanInput(const DraftInput& in, State& state, Plan& plan);
  // Appends draft j of one input, drawn from its logits row.
  void DrawDraft(const DraftInput& in, State& state, std::span<const float> logits, Draft& draft);
  // A free selection slot for a Vegas sequence, or -1.
  int32_t TakeSlot();

  ModelRunner* runner_;
  int32_t num_layers_;
  std::shared_ptr<const DraftReplay> replay_;
  std::vector<int32_t> free_slots_;  // the runner's selection slots no sequence holds
  bool slots_listed_ = false;
  std::vector<SampleRow> rows_;      // device draft steps' rows (scratch)
  std::vector<SampleResult> drawn_;  // and their draws
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<Plan> plans_;           // [num_inputs] scratch
  std::vector<SequenceInput> batch_;  // scratch
  std::vector<int32_t> batch_input_;  // [batch] input of each chunk
  std::vector<float> logits_;         // [batch, vocab] scratch
  std::vector<float> probs_;          // [vocab] scratch
};

}  // namespace specd
