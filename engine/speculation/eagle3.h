// EAGLE-3 speculation (method "eagle3"): a one-layer draft head (engine/model/eagle3_head.h)
// drafts from the target's own hidden states. The target's runner keeps the three layers' hidden
// states of every pass (ModelRunner::CaptureHiddenStates, no second pass); after each pass the
// engine hands them over (OnTargetPass), fused by fc at once. EAGLE's convention: the head's
// position p reads (embedding of token p + 1, target hidden state of position p) and predicts
// token p + 2. So at Propose, for a sequence of L committed tokens, the head first runs the
// positions p < L - 1 it has not run yet with the target's hidden states (prefill chunks, the
// accepted drafts and the last committed token of the previous round), the last of which gives
// draft 1; drafts 2..K feed the head its own output (prenorm hidden state) and the previous
// draft. Its cache entries for drafted positions are dropped at the next Propose, when the
// target's hidden states of those positions arrive. All sequences of a round share each head
// pass (the catch-up rows of every sequence, then one row per sequence per draft step).
// Greedy requests draft the argmax of the processed distribution; sampled requests draw from it
// (penalties, temperature, min-p, top-k, top-p as the target's sampler applies them) and return
// it as q, over the target's vocabulary (zero outside the head's draft vocabulary), so
// speculative sampling stays lossless. Positions whose target hidden state the head never saw
// (a prompt served from the prefix cache) are simply absent from its cache: drafts then accept
// less, the output is unchanged. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/eagle3_head.h"
#include "engine/model/model.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/speculator.h"

namespace specd {

class Eagle3Speculator : public Speculator {
 public:
  static absl::StatusOr<std::unique_ptr<Eagle3Speculator>> Create(std::unique_ptr<Eagle3Head> head);

  // The target layers whose hidden states the runner must capture (the head's aux ids).
  std::span<const int32_t> capture_layers() const { return head_->config().aux_layer_ids; }

  // One target pass: `batch` as run, `hidden` its captured rows ([num_new_tokens, fc input]
  // f32, ModelRunner::captured_hidden_states), and which chunks' sequences draft with the head
  // (`wanted[i]` for batch[i]). Keeps their rows fused (fc) until the next Propose; a chunk
  // starting at position s replaces what the sequence held from s on.
  absl::Status OnTargetPass(std::span<const SequenceInput> batch, std::span<const float> hidden,
                            std::span<const uint8_t> wanted);

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  void Release(uint64_t seq_id) override { states_.erase(seq_id); }

  // Benchmarks only: greedy drafts follow `replay` (controlled acceptance,
  // engine/speculation/draft_replay.h); the head's passes still run. nullptr turns it off.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }

  const Eagle3Head& head() const { return *head_; }
  // Positions in the head's cache for `seq_id` (tests); 0 for an unknown sequence.
  int32_t cache_size(uint64_t seq_id) const;

 private:
  // What the head holds for one sequence.
  struct State {
    Eagle3Head::Kv kv;
    // The committed tokens the cache was built from: position p's entry read token p + 1.
    std::vector<int32_t> kv_tokens;
    int32_t num_target_positions = 0;  // head positions [0, n) are done (target hidden states)
    // Target hidden states not yet run by the head: position, its token, fused row [hidden].
    std::vector<int32_t> pending_positions;
    std::vector<int32_t> pending_tokens;
    std::vector<float> pending_hidden;
    std::mt19937_64 rng;  // sampled drafts
    bool seeded = false;
  };
  // One sequence drafting this round.
  struct Active {
    size_t input = 0;
    State* state = nullptr;
    int32_t num_wanted = 0;
    int32_t next_position = 0;  // position of its next head row
    int32_t logits_row = -1;    // its row of the pass's logits (-1: none this pass)
    int32_t prenorm_row = -1;   // its row of the pass's prenorm output
  };

  explicit Eagle3Speculator(std::unique_ptr<Eagle3Head> head) : head_(std::move(head)) {}
  // Rolls the state back to what it shares with `tokens` and adds the catch-up rows (pending
  // target hidden states of positions < L - 1) to rows_. False when it cannot draft this round.
  bool PlanCatchUp(const DraftInput& in, State& state, Active* active);
  // Draws draft j of one sequence from its logits row (as the draft model does); false when the
  // processed row has no mass left (the sequence drafts no further this round).
  bool DrawDraft(const DraftInput& in, State& state, std::span<const float> logits, Draft& draft);

  std::unique_ptr<Eagle3Head> head_;
  std::shared_ptr<const DraftReplay> replay_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<Active> active_;           // scratch
  std::vector<Eagle3Head::Row> rows_;    // scratch: one head pass
  std::vector<float> hidden_in_;         // scratch: [rows, hidden] draft steps' inputs
  std::vector<float> prenorm_, logits_;  // scratch: a pass's outputs
  std::vector<float> fused_, probs_;     // scratch
};

}  // namespace specd
