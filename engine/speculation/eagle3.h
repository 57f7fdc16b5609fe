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
// drafts then accept less, the output is unchanged.
// Token trees (DraftInput::wants_tree, on a compute with trees; eagle3_tree.cc) grow as the
// draft model's do (DraftTreeBuilder, EAGLE-2's dynamic tree): the catch-up's last row gives the
// root's children, then each level is one head pass whose rows are the nodes to expand (each
// reading its parent's prenorm output), in tree slots of their own after the committed
// positions. A verified tree chunk's hidden states wait per node until the next Propose walks
// the tree along the committed tokens and runs the accepted path's positions. Engine thread only.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/draft_tree.h"
#include "engine/speculation/speculator.h"

namespace specd {

class Eagle3Speculator : public Speculator {
 public:
  // `compute` (the target runner's, not owned) outlives the speculator.
  static absl::StatusOr<std::unique_ptr<Eagle3Speculator>> Create(Eagle3Compute* compute);

  // One target pass: `batch` as run (its hidden states are the compute's to read) and which
  // chunks' sequences draft with the head (`wanted[i]` for batch[i]). A chunk starting at
  // position s replaces what the sequence held from s on. A tree chunk (SequenceInput::tree
  // from the chunk's first slot: the root, the last committed token, then the drafts) keeps
  // every node's hidden state until the next Propose finds the accepted path.
  absl::Status OnTargetPass(std::span<const SequenceInput> batch, std::span<const uint8_t> wanted);

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  void Release(uint64_t seq_id) override;

  // Benchmarks only: greedy drafts follow `replay` (controlled acceptance,
  // engine/speculation/draft_replay.h); the head's passes still run. nullptr turns it off.
  // Trees are grown from the head's own logits for now. A chained round (DraftChain) feeds the
  // head its own argmax and the replay rewrites the drafts afterwards; a replayed chain keeps
  // only the drafts up to its first miss either way, so acceptance is the replay's.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }

  const Eagle3Config& config() const { return compute_->config(); }
  // Eagle3Compute::ReadsPrefixCache: false makes the engine compute whole prompts of the
  // requests the head may draft for.
  bool reads_prefix_cache() const { return compute_->ReadsPrefixCache(); }

 private:
  // A target hidden state the head has not run: its position, the token there, its fused row.
  struct Pending {
    int32_t position = 0;
    int32_t token = 0;
    int32_t pool_row = 0;
  };
  // What the speculator knows of one sequence.
  struct State {
    // The sequence's tokens as the cache saw them (-1: unknown, a position the head never saw):
    // position p's entry read token p + 1.
    std::vector<int32_t> kv_tokens;
    int32_t num_target_positions = 0;  // head positions [0, n) are done (target hidden states)
    // Target hidden states not yet run by the head, positions ascending and contiguous. A
    // chunk's row of slot q is fused into pool row PoolRow(q) (the region's ring by slot).
    std::vector<Pending> pending;
    // A verified tree chunk whose accepted path is not known yet (its root is pending): its
    // tokens and parents (root first, parents as chunk indices), node j fused into
    // PoolRow(tree_start + j). The next Propose walks it; the next target pass drops it.
    int32_t tree_start = -1;
    std::vector<int32_t> tree_tokens, tree_parents;
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
    int32_t tree = -1;          // its tree in trees_, or -1 (a chain)
  };
  // A tree growing this round (eagle3_tree.cc). Its region in the head's cache: the nodes run
  // (expanded), in run order, in slots root_slot + i at position root_slot + depth.
  struct TreeActive {
    size_t input = 0;
    DraftTreeBuilder builder;
    int32_t root_slot = 0;       // L - 1: the head position after the catch-up's last
    int32_t max_region = 0;      // nodes run at most: the round's K (the target's lookahead slots)
    std::vector<int32_t> level;  // the nodes of the pass (-1: the root, the catch-up row)
    std::vector<int32_t> level_rows;      // their logits rows in that pass
    std::vector<int32_t> region_parents;  // [region] parents as region indices (-1: the prefix)
    std::vector<int32_t> region_of_node;  // [builder nodes] region index, -1 if not run
    TokenTree tree;                       // {root_slot, region_parents}: the rows' Row::tree
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
  // OnTargetPass for one chunk whose captured rows start at first_row.
  void TakeChunk(const SequenceInput& in, int32_t first_row, State& s, int32_t* scratch);
  // Sampled chains on a compute that draws on its device (Eagle3Compute::DrawsOnDevice): each
  // such input's probability slots (slot_base_[input] + j for draft j; -1: drawn on the host),
  // slot_stride_ apart.
  void PlanDeviceDraws(std::span<const DraftInput> inputs);
  // After a pass: the device draws of its chain rows that need more than the argmax (drawn_).
  absl::Status DrawOnDevice(std::span<const DraftInput> inputs, const std::vector<Draft>& drafts);
  // Whether every active sequence is a sampled chain the compute's graphs can draw for (device
  // slots in active order, the same number of drafts so far, no penalties, no bans from here on);
  // then graph_draws_ describes them.
  bool PlanGraphDraws(std::span<const DraftInput> inputs, const std::vector<Draft>& drafts);
  // Before the first pass: where every sequence of the catch-up is a chain drafting the head's
  // argmax, or every one a sampled chain of PlanGraphDraws, the catch-up and the drafts all of
  // them want (the fewest) in one Eagle3Compute::DraftRound (one captured graph on the CUDA
  // head); the rest as below.
  absl::Status RunRound(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // After a pass: the same for the drafts all active chains still want (the fewest), in one
  // Eagle3Compute::DraftChain.
  absl::Status RunChains(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // After DraftRound / DraftChain: ids_ holds `draws_each` ids per active sequence ([draws_each,
  // active]); each joins its drafts (a sampled -1 ends the chain), and its next row is `advance`
  // positions on, reading the last step's prenorm.
  void TakeChainIds(std::span<const DraftInput> inputs, std::vector<Draft>* drafts,
                    int32_t draws_each, int32_t advance);
  // After a pass: each chain's next draft (finished chains leave active_) and each tree's level
  // expanded from its logits rows.
  void TakeDrafts(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // The next pass's rows: one per chain, a tree's next level (finished trees leave active_).
  void PlanNextRows(std::span<const DraftInput> inputs, const std::vector<Draft>& drafts);
  // Trees (eagle3_tree.cc). The tree chunk's accepted path (walked along the committed tokens)
  // joins the pending rows.
  void ResolveTree(const DraftInput& in, State& s) const;
  // A tree for `a`, whose catch-up row gives the root's children.
  void StartTree(const DraftInput& in, Active* a);
  // Expands the tree's level from its host logits rows [*host_row, ...) of the pass whose first
  // logits row for it is *row; advances both.
  void ExpandLevel(const DraftInput& in, TreeActive& t, int32_t* row, int64_t* host_row);
  // Whether `node`'s children are chosen from its whole logits row on the host (bans apply, or
  // the compute ranks none on its device) rather than from TopCandidates.
  bool TreeRanksOnHost(const DraftInput& in, const TreeActive& t, int32_t node) const;
  // Appends the next level's rows, at most `cap` (the compute's logits rows shared by the
  // pass's trees); false when the tree is complete.
  bool PlanLevel(const DraftInput& in, TreeActive& t, int32_t cap);

  Eagle3Compute* compute_;
  std::shared_ptr<const DraftReplay> replay_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<int32_t> free_regions_;
  std::vector<Active> active_;            // scratch
  std::vector<TreeActive> trees_;         // scratch: this round's trees (rows point in)
  std::vector<Eagle3Compute::Row> rows_;  // scratch: one head pass
  std::vector<uint8_t> host_flags_;       // scratch: per logits row
  // scratch: the pass's device-ranked candidates (Eagle3Compute::TopCandidates), k per row.
  int32_t candidates_k_ = 0;
  std::vector<int32_t> candidate_ids_;
  std::vector<float> candidate_logprobs_;
  std::vector<int32_t> ids_;  // scratch: the pass's argmax ids
  // scratch: device draws (DrawOnDevice): each input's probability slots, the pass's draw
  // requests, and per logits row the token drawn on the device (kNotDrawn: none).
  static constexpr int32_t kNotDrawn = INT32_MIN;
  std::vector<int32_t> slot_base_;
  int32_t slot_stride_ = 0;
  // scratch: PlanGraphDraws' rows and what it hands the compute.
  std::vector<SampleRow> graph_rows_;
  Eagle3Compute::ChainDraws graph_draws_;
  std::vector<int32_t> draw_logits_rows_, draw_slots_, ids_drawn_, drawn_;
  std::vector<SampleRow> draw_rows_;
  std::vector<float> logits_, probs_;         // scratch
  std::vector<int32_t> fuse_from_, fuse_to_;  // scratch: Fuse's rows (run at once)
  std::vector<int32_t> keep_from_, keep_to_;  // scratch: Fuse's rows (the windows)
};

}  // namespace specd
