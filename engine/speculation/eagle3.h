// EAGLE-3 speculation (method "eagle3"): a one-layer draft head drafts from the target's own
// hidden states. The target's runner holds the head (RunnerOptions::eagle3_head, its compute
// engine/runner/eagle3_compute.h: exact fp32 on the CPU, bf16 with a paged cache on a GPU) and
// keeps the three layers' hidden states of every pass (no second pass); after each pass the
// engine hands the speculator the batch (OnTargetPass), which has them fused by fc into the
// compute's pool. EAGLE's convention: the head's position p reads (embedding of token p + 1,
// target hidden state of position p) and predicts token p + 2. So at Propose, for a sequence of
// L committed tokens, the head first runs the positions p < L - 1 it has not run yet with the
// target's hidden states (the accepted drafts and the last committed token of the previous
// round), the last of which gives draft 1; drafts 2..K feed the head its own output (prenorm
// hidden state) and the previous draft. A sequence keeps at most kEagle3PoolWindow such pending
// positions (its pool region, a ring by position): older ones, whose next token is known (a
// long prompt), the head runs at once, in one pass per target pass. Cache entries of drafted
// positions are overwritten or dropped at the next Propose, when the target's hidden states of
// those positions arrive. All sequences of a round share each head pass (the catch-up rows of
// every sequence, then one row per sequence per draft step).
// Greedy requests draft the argmax (on the head's device, unless bans or penalties apply, which
// the host applies as for sampled rows); sampled requests draw from the processed distribution
// (penalties, temperature, min-p, top-k, top-p as the target's sampler applies them) and return
// it as q, over the target's vocabulary (zero outside the head's draft vocabulary), so
// speculative sampling stays lossless. Positions whose target hidden state the head never saw
// (a prompt served from the prefix cache) are absent from its cache (CPU) or stale (paged):
// drafts then accept less, the output is unchanged. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/speculator.h"

namespace specd {

class Eagle3Speculator : public Speculator {
 public:
  // `compute` (the target runner's, not owned) outlives the speculator.
  static absl::StatusOr<std::unique_ptr<Eagle3Speculator>> Create(Eagle3Compute* compute);

  // One target pass: `batch` as run (its hidden states are the compute's to read) and which
  // chunks' sequences draft with the head (`wanted[i]` for batch[i]). A chunk starting at
  // position s replaces what the sequence held from s on.
  absl::Status OnTargetPass(std::span<const SequenceInput> batch, std::span<const uint8_t> wanted);

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  void Release(uint64_t seq_id) override;

  // Benchmarks only: greedy drafts follow `replay` (controlled acceptance,
  // engine/speculation/draft_replay.h); the head's passes still run. nullptr turns it off.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }

  const Eagle3Config& config() const { return compute_->config(); }

 private:
  // What the speculator knows of one sequence.
  struct State {
    // The sequence's tokens as the cache saw them (-1: unknown, a position the head never saw):
    // position p's entry read token p + 1.
    std::vector<int32_t> kv_tokens;
    int32_t num_target_positions = 0;  // head positions [0, n) are done (target hidden states)
    // Target hidden states not yet run by the head, positions ascending and contiguous: the
    // fused row of position p is pool row region * kEagle3PoolWindow + p % kEagle3PoolWindow.
    std::vector<int32_t> pending_positions;
    std::vector<int32_t> pending_tokens;
    int32_t region = -1;  // its pool region while it has pending rows
    std::mt19937_64 rng;  // sampled drafts
    bool seeded = false;
  };
  // One sequence drafting this round.
  struct Active {
    size_t input = 0;
    State* state = nullptr;
    int32_t num_wanted = 0;
    int32_t next_position = 0;  // position of its next head row
    int32_t prenorm_row = -1;   // Eagle3Compute::Row::hidden of its next row
  };

  explicit Eagle3Speculator(Eagle3Compute* compute);
  State& StateOf(uint64_t seq_id);
  int32_t PoolRow(const State& s, int32_t position) const;
  // Rolls the state back to what it shares with `tokens` and adds the catch-up rows (pending
  // target hidden states of positions < L - 1) to rows_. False when it cannot draft this round.
  bool PlanCatchUp(const DraftInput& in, State& state, Active* active);
  // Whether draft j of the row is drawn on the host (sampled, penalties or bans at j).
  static bool DrawsOnHost(const DraftInput& in, int32_t j);
  // Draws draft j of one sequence from the compute's argmax or its logits row on the host (as
  // the draft model does); false when the processed row has no mass left (no further drafts).
  bool DrawDraft(const DraftInput& in, State& state, int32_t argmax, std::span<const float> logits,
                 Draft& draft);
  void FreeRegion(State& s);

  Eagle3Compute* compute_;
  std::shared_ptr<const DraftReplay> replay_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<int32_t> free_regions_;
  std::vector<Active> active_;                // scratch
  std::vector<Eagle3Compute::Row> rows_;      // scratch: one head pass
  std::vector<uint8_t> host_flags_;           // scratch: per logits row
  std::vector<int32_t> ids_;                  // scratch: the pass's argmax ids
  std::vector<float> logits_, probs_;         // scratch
  std::vector<int32_t> fuse_from_, fuse_to_;  // scratch: Fuse's rows (run at once)
  std::vector<int32_t> keep_from_, keep_to_;  // scratch: Fuse's rows (the windows)
};

}  // namespace specd
