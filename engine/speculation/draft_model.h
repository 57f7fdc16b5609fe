// Draft-model speculation: a second, smaller HF model that shares the target's tokenizer
// proposes K tokens autoregressively (Leviathan et al. 2023; vLLM's draft_model method). It
// runs on its own ModelRunner (CPU, or a GPU: the same or another one) with its own paged KV
// pool. Per sequence it remembers which tokens its KV holds; OnVerified rolls back what
// verification rejected at once (the KV past the context and the accepted drafts). Each Propose
// still keeps only the longest prefix those tokens share with the committed ones: the guard for
// callers that tell nothing (SSD's forked branches) or whose sequence changed otherwise. All
// sequences of a round share each forward pass: one catch-up chunk per sequence (the tokens
// committed since the last round), then K - 1 one-token decode steps.
// Greedy requests draft the argmax of the processed distribution; sampled requests draw from
// it (penalties, temperature, min-p, top-k, top-p as the target's sampler applies them) and
// return it as q for speculative sampling. A pass whose sequences are all greedy runs through
// the runner's Step (on a GPU: the decode CUDA graphs and the argmax kernel, no logits copied
// to the host); its penalties then see the committed tokens but not the round's earlier drafts,
// which only affects how good a draft is, never the output. A sequence whose KV does not fit the
// pool gets no drafts that round (the target decodes it plainly). Engine thread only.
// Token trees (DraftInput::wants_tree) grow a level at a time where the runner takes trees
// (DraftTreeBuilder; on a GPU each node's children are ranked there, ModelRunner::
// ForwardCandidates, unless bans apply); elsewhere, and in parallel drafting, such inputs draft a
// chain of the tree's depth.
// For SSD's speculation cache (engine/speculation/ssd/ssd_worker.h) it also forks sequences without
// copying KV (shared blocks, reference counted), reports the top candidates at each drafted
// position (greedy rows: their raw logits ranked by the runner's Step; sampled rows: their
// processed row, ranked where it is drawn), and draws sampled drafts with Saguaro sampling. On a
// runner that samples speculation on the device, sampled rows are drawn there, candidates and
// Saguaro down-weighting included (StepDraft), and only their q rows come to the host, in one
// copy per Propose (the cache keeps them past the next one); elsewhere they are drawn on the host.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kv/block_allocator.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/draft_tree.h"
#include "engine/speculation/speculator.h"

namespace specd {

// SSD's candidates (DraftModelSpeculator::CacheDraftOptions): appends one drafted position's to
// draft.candidates, `top` ranked best first (ties to the lower id); a greedy draft `first`
// (>= 0) leads its row even where penalties, min_tokens bans or a replay made it differ from the
// raw logits' argmax (it displaces the last when absent).
void AppendCandidates(std::vector<int32_t> top, int32_t first, Draft& draft);

class DraftModelSpeculator : public Speculator {
 public:
  // What SSD's speculation cache asks of one input's drafts (Propose's `cache`); the defaults
  // ask nothing.
  struct CacheDraftOptions {
    // > 0: Draft::candidates gets [k, num_candidates], the draft's best ids at each drafted
    // position, distinct, best first: by the probability of the row draft j was drawn from
    // (before Saguaro down-weighting), ties to the lower id; greedy requests: by raw logit, and
    // row j starts with tokens[j].
    int32_t num_candidates = 0;
    // Sampled drafts: down-weight the top-F ids of each row (F = saguaro_fan_out > 0) ...
    int32_t saguaro_fan_out = 0;
    // ... by C in [0, 1) (Saguaro sampling) and return that row as q; < 0 (unset) or 1: plain.
    float saguaro_c = -1.0f;
  };

  // runner: the draft model, loaded with its own KV pool. target_vocab: the target's vocab
  // size; InvalidArgument when the draft's differs (the pair must share a tokenizer).
  // max_tokens_per_forward: the most tokens one forward pass may run (the runner's
  // max_num_batched_tokens); long catch-up chunks (a new prompt) are split over several passes.
  static absl::StatusOr<std::unique_ptr<DraftModelSpeculator>> Create(
      std::unique_ptr<ModelRunner> runner, int32_t target_vocab, int32_t max_tokens_per_forward);

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  // Propose that checks `stop` before every forward pass and returns early (OK) once it says
  // true: sequences still drafting then have fewer drafts than asked (their KV is consistent
  // with the drafts they have). SSD's cache construction yields to the verifier this way.
  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts,
                       const std::function<bool()>& stop);
  // Propose for SSD's cache: cache[i] for inputs[i] (candidates, Saguaro sampling), or empty
  // for none; InvalidArgument for any other size.
  absl::Status Propose(std::span<const DraftInput> inputs, std::span<const CacheDraftOptions> cache,
                       std::vector<Draft>* drafts, const std::function<bool()>& stop = {});
  // Rolls each told sequence back at once to what its draft KV holds validly: the context of
  // its last Propose and the accepted drafts the draft decoded (d_1..d_{k-1} sit at positions
  // n..n+k-2; d_k was never decoded), freeing the blocks past them. Unknown sequences, and
  // sequences not drafted since their last outcome, are ignored.
  void OnVerified(std::span<const VerifiedRound> rounds) override;
  void Release(uint64_t seq_id) override;

  // SSD's branches. Fork makes `child` a new sequence whose KV shares the parent's full
  // blocks below position min(num_tokens, parent's KV length) (no copy: AddRef), and whose
  // kv_tokens are the parent's truncated to those blocks; the partial block after them is not
  // shared: the child recomputes it (and the rest of its tokens) in the catch-up chunk of its
  // first Propose, which rolls back and catches up as for any sequence. num_tokens is the fork
  // point: where the child's tokens leave the parent's (SSD: context + d_1..d_k, then t*).
  // Where the runner copies KV slots (SupportsTokenTrees: MoveKv), the parent's partial block
  // below the fork point is copied into a fresh block of the child's before the next Propose's
  // first forward pass, so the child's catch-up starts at the fork point.
  // Why sharing is safe: shared blocks hold positions below the fork point, which both sides
  // agree on and neither rewrites while both hold them. A sequence only rewrites positions at
  // or after its rollback point; the caller's contract is that a child whose outcome did not
  // happen is Released (and the one that did is Adopted) before the parent is proposed for
  // again, since the parent may then roll back below the fork point. Prepare also enforces
  // it: a rollback point inside a block held by another sequence recomputes from that block's
  // start into a fresh block, so a shared block is never written even if the contract is broken.
  // NotFound for an unknown parent; AlreadyExists for a child id in use; InvalidArgument for
  // num_tokens < 0.
  absl::Status Fork(uint64_t parent, uint64_t child, int32_t num_tokens);
  // Fork at the end of the parent's KV: every full block it holds is shared.
  absl::Status Fork(uint64_t parent, uint64_t child) {
    return Fork(parent, child, std::numeric_limits<int32_t>::max());
  }
  // A cache hit: the child's state (KV, RNG) replaces the parent's, whose own references are
  // released (blocks the child shares stay); the child id is gone. An unknown parent simply
  // gets the child's state. NotFound for an unknown child.
  absl::Status Adopt(uint64_t parent, uint64_t child);

  // Parallel drafting (PARD, arXiv 2504.18583): a draft trained to predict the next K tokens
  // from K - 1 appended copies of a mask token drafts a whole round in one forward pass: the
  // catch-up chunk followed by the masks, every position's logits; draft j comes from the row of
  // the context's last token + j, drawn as in sequential drafting (so q rows and penalties over
  // the earlier drafts are the same). The masks' KV is never kept: kv_tokens stops before them
  // and the next round overwrites their slots. SSD's cache (Propose with `cache`) drafts its
  // branches this way too: candidates per row (ranked by the runner's Step for greedy rows, where
  // they are drawn for sampled ones) and Saguaro sampling as in sequential drafting.
  // `mask_token` < 0: off.
  void set_parallel(int32_t mask_token) { parallel_mask_ = mask_token; }
  // The mask token of a parallel draft in folder `dir`: `pard_token` in its config.json, as
  // vLLM reads it (or `ptd_token_id`); InvalidArgument when it names none or one outside
  // [0, vocab).
  static absl::StatusOr<int32_t> ReadMaskToken(const std::string& dir, int32_t vocab);
  bool parallel() const { return parallel_mask_ >= 0; }

  // SSD's cache on a runner that samples speculation on the device: Propose with cache options
  // then keeps each sampled draft's q rows on the device, in a block of the runner's kept rows
  // (num_blocks blocks of rows_per_block rows; Draft::kept_probs, the block freed when the last
  // reference goes), instead of copying them to the host; a draft longer than a block, or one
  // that finds every block taken, is copied to the host as before. The device memory is reserved
  // with the first sampled draft (a warning and the host copies from then on when it cannot
  // be). No effect where the runner keeps no probabilities on a device.
  absl::Status KeepProbsOnDevice(int32_t rows_per_block, int32_t num_blocks);
  // A draft's kept rows copied to `probs` ([num_rows, vocab] f32), after the passes queued before.
  absl::Status ReadKeptProbs(const KeptProbs& kept, std::vector<float>* probs) const;
  // Free blocks of kept rows (tests).
  int32_t num_free_kept_blocks() const {
    return kept_ ? static_cast<int32_t>(kept_->free.size()) : 0;
  }

  // Benchmarks only: greedy drafts (and their candidates) follow `replay` (controlled
  // acceptance, engine/speculation/draft_replay.h); nullptr turns it off. The forward passes still
  // run.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }

  const ModelRunner& runner() const { return *runner_; }
  int32_t num_free_blocks() const { return allocator_.num_free(); }
  int32_t num_live_sequences() const { return static_cast<int32_t>(states_.size()); }
  // Tokens whose KV the draft holds for `seq_id` (0 for an unknown sequence): what it must
  // catch up on before drafting (the strategy policy's estimate), and tests.
  int32_t kv_length(uint64_t seq_id) const;

 private:
  // What the draft holds for one sequence.
  struct State {
    explicit State(int32_t block_size) : blocks(block_size) {}
    BlockTable blocks;
    std::vector<int32_t> kv_tokens;  // [n] ids whose KV is in `blocks`, positions [0, n)
    // The context length of the last Propose that drafted it (the drafts start there); -1
    // once its outcome was told (OnVerified) or when that Propose drafted nothing.
    int32_t num_context = -1;
    std::mt19937_64 rng;  // sampled drafts
    bool seeded = false;
    std::unique_ptr<Sampler> sampler;  // greedy passes through the runner's Step
  };
  // One sequence being drafted this round.
  struct Active {
    size_t input = 0;         // index into Propose's inputs
    CacheDraftOptions cache;  // what SSD's cache asks of it (the defaults: nothing)
    State* state = nullptr;
    std::vector<int32_t> pending;  // tokens still to run: the catch-up, then the last draft
    size_t offset = 0;             // pending[0, offset) already ran
    size_t num_running = 0;        // tokens of pending the current pass runs (0: not in it)
    int32_t row = -1;              // its row of the pass's results (drawn_ or logits_)
    int32_t num_wanted = 0;        // drafts it still wants
  };

  DraftModelSpeculator(std::unique_ptr<ModelRunner> runner, int32_t max_tokens_per_forward);
  // Runs the KV copies Fork queued (copies_), one MoveKv; on failure the children roll back to
  // the start of the copied block and recompute it.
  void CopyForkedKv();
  // One forward pass over every active sequence's next piece of pending tokens (within the
  // token budget); draws a draft for each sequence whose pending tokens all ran.
  absl::Status RunPass(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // The pass's forward: next-draft tokens drawn by the runner (drawn_, one per row, Active::row)
  // when every sequence is greedy and wants no candidates, or in a device round; else logits
  // rows in logits_ (one per sequence in the pass).
  absl::Status ForwardPass(std::span<const DraftInput> inputs, const std::vector<Draft>& drafts,
                           bool* drawn);
  // A device round's pass: rows for the sequences whose pending tokens all run, drawn by the
  // runner's StepDraft, which keeps each row's q in slot slot_base_[input] + j.
  absl::Status DevicePass(std::span<const DraftInput> inputs, const std::vector<Draft>& drafts);
  // Token trees (DraftInput::wants_tree, on a runner with trees; draft_model_tree.cc): the
  // inputs that want one get a tree grown a level at a time (DraftTreeBuilder): their catch-up
  // chunks, then one pass per level running the nodes to expand as a tree chunk in the draft's
  // own KV (slots after the context; never kept: the state's KV ends at the context and the
  // next round catches up on what was accepted).
  absl::Status ProposeTrees(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  bool TreesHere() const { return runner_->SupportsTokenTrees() && !parallel(); }
  // Parallel drafting's pass: each sequence's pending tokens, then its masks when they fit the
  // token budget (its drafts are drawn then); longer catch-ups run first without masks.
  absl::Status RunParallelPass(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // Whether this round drafts on the device: the runner keeps probabilities on a GPU, some input
  // samples, and no greedy input wants candidates (those rank raw logits); then reserves the
  // slots. Sampled inputs get their candidates and Saguaro sampling from the device draw.
  bool PlanDeviceRound(std::span<const DraftInput> inputs);
  // Parallel drafting's slots for a whole Propose (slot_base_ per active input, reserved once):
  // the number reserved, 0 when its passes draw on the host or through the runner's Step.
  int32_t PlanParallelSlots(std::span<const DraftInput> inputs);
  // SSD's cache: the drafts' q rows left in the slots (device_probs) moved into kept rows where
  // KeepProbsOnDevice made room, else copied into Draft::probs, one copy for all.
  absl::Status KeepProbs(std::vector<Draft>& drafts);
  // Rolls the state back to what it shares with `tokens`, reserves KV for the round and
  // queues the catch-up chunk. False when the KV does not fit (nothing is drafted then).
  bool Prepare(const DraftInput& in, State& state, int32_t num_drafts, Active* active);
  // The position Prepare may rewrite from, given the common prefix `start`: `start`, or the
  // first position of its block when another sequence (a fork) also holds that block.
  int32_t WritableStart(const State& state, int32_t start) const;
  // Keeps the state's first num_valid tokens of KV (fewer where WritableStart says so) and
  // frees the blocks past them.
  void RollBack(State& state, int32_t num_valid);
  // Appends a greedy draft (the argmax `token`, unless the replay says otherwise) and, when
  // `cache` asks for them, its candidates `top` (ranked best first) led by the draft.
  void AppendGreedyDraft(const DraftInput& in, const CacheDraftOptions& cache, int32_t token,
                         std::vector<int32_t> top, Draft& draft) const;
  // Draws draft j of one sequence from its logits row (and its candidates, with Saguaro
  // sampling when `cache` asks for them).
  void DrawDraft(const DraftInput& in, const CacheDraftOptions& cache, State& state,
                 std::span<const float> logits, Draft& draft);

  std::unique_ptr<ModelRunner> runner_;
  std::shared_ptr<const DraftReplay> replay_;
  // Fork's queued copies: slots [0, num_slots) of table[0] (the parent's partial block) into
  // the same slots of table[1] (the child's fresh block), as KvSlotMoves over that table.
  struct ForkCopy {
    uint64_t child = 0;
    std::array<int32_t, 2> table{};
    int32_t num_slots = 0;
  };
  std::vector<ForkCopy> copies_;
  int32_t parallel_mask_ = -1;                // set_parallel
  std::vector<std::vector<int32_t>> chunks_;  // scratch: parallel passes' chunk tokens
  int32_t max_tokens_per_forward_;
  BlockAllocator allocator_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<Active> active_;        // scratch
  std::vector<SequenceInput> batch_;  // scratch
  std::vector<float> logits_;         // [num_active, vocab] scratch
  // scratch: token trees' rows ranked on the draft's device (ModelRunner::ForwardCandidates).
  std::vector<int32_t> cand_ids_;
  std::vector<float> cand_lps_;
  std::vector<float> probs_;         // [vocab] scratch
  std::vector<SampleRow> rows_;      // scratch: greedy passes
  std::vector<SampleResult> drawn_;  // scratch: greedy passes
  // Device rounds (PlanDeviceRound, PlanParallelSlots): the first probability slot of each input
  // (-1: none).
  bool device_round_ = false;
  std::vector<int32_t> slot_base_;
  std::vector<int32_t> slots_;     // scratch: the pass's slots
  int32_t parallel_slots_ = 0;     // PlanParallelSlots' reservation for this Propose
  std::vector<float> host_probs_;  // scratch: KeepProbs
  // KeepProbsOnDevice's blocks: the free ones, shared with the handles that give theirs back.
  struct KeptPool {
    int32_t rows_per_block = 0;
    int32_t num_blocks = 0;
    bool reserved = false;  // the runner's kept rows exist (reserved with the first use)
    std::vector<int32_t> free;
  };
  std::shared_ptr<KeptPool> kept_;
  // ProposeTrees' sequences: the tree growing, and the draft KV's tree region (the root, the
  // context's last token, at slot context - 1, then each node run, in order): parents over the
  // region and each builder node's region index (-1: not run).
  struct TreeActive {
    Active active;
    DraftTreeBuilder builder;
    std::vector<int32_t> region_parents;
    std::vector<int32_t> region_of_node;
    std::vector<int32_t> level;   // the nodes this pass runs
    std::vector<int32_t> tokens;  // their tokens
    TokenTree tree;
  };
  std::vector<TreeActive> tree_active_;
};

}  // namespace specd
