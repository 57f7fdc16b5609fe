// SSD's speculator drafting with an EAGLE-3 head (cache_drafter.h; config "speculator_drafter":
// "eagle3"): the head's compute stands alone (Eagle3Compute::Standalone: no target beside it),
// and the verifier sends the target's hidden states of every committed position with each
// outcome (SpeculateSeq::num_hidden), which AddTargetRows keeps.
// EAGLE's convention (engine/speculation/eagle3.h): the head's position p reads (embedding of token
// p + 1, hidden state of position p) and predicts token p + 2, so a sequence of L tokens drafts
// from position L - 2. The hidden state of position p is the target's where it arrived, and
// otherwise the head's own output at position p - 1 (its prenorm), as EAGLE drafts.
// That is what makes the cache possible: while the verifier verifies d_1..d_K, the branch for
// outcome (k, t*) starts at position L + k - 1 with t*'s embedding and the head's own output at
// L + k - 2 (kept from the round's drafting), on a fork of the sequence's cache. When the target's
// hidden states of those positions arrive, the positions that read the head's own outputs are run
// again with the target's (PrepareForks, before the next branches fork; a re-draft after a miss
// does it too), so approximations never outlive a round.
// Each state keeps the hidden state of its recent positions in a ring of kEagle3PoolWindow pool
// rows (its region); older rows of a long prompt run at once. Greedy drafts are the argmax,
// sampled ones drawn on the host from the processed row (penalties, temperature, min-p, top-k,
// top-p), with candidates and Saguaro sampling as the draft model's; where the compute ranks on
// its device (the CUDA head), greedy rows without penalties or bans take the argmax and their
// candidates from there (no logits row leaves the device).
// A paged cache (the CUDA head, Eagle3Compute::PagedCache) gets block tables from the drafter's
// allocator: a fork shares the parent's full blocks below its fork point and copies the partial
// one; a state about to write a block another state shares copies it first. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kv/block_allocator.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/speculation/draft_replay.h"
#include "engine/speculation/ssd/cache_drafter.h"

namespace specd {

class Eagle3CacheDrafter : public CacheDrafter {
 public:
  // `compute` must be Standalone(); `target_vocab` the verifier's vocabulary size,
  // `max_model_len` its context limit.
  static absl::StatusOr<std::unique_ptr<Eagle3CacheDrafter>> Create(
      std::unique_ptr<Eagle3Compute> compute, int32_t target_vocab, int32_t max_model_len,
      std::string device_name);

  int32_t vocab_size() const override { return vocab_; }
  int32_t max_model_len() const override { return max_model_len_; }
  std::string device_name() const override { return device_name_; }
  int32_t max_rows_per_pass() const override { return compute_->max_logit_rows(); }

  absl::Status Propose(std::span<const DraftInput> inputs, std::span<const CacheDraftOptions> cache,
                       std::vector<Draft>* drafts, const std::function<bool()>& stop) override;
  absl::Status Fork(uint64_t parent, uint64_t child, int32_t num_tokens) override;
  absl::Status Adopt(uint64_t parent, uint64_t child) override;
  void Release(uint64_t seq_id) override;
  absl::Status AddTargetRows(uint64_t seq_id, std::span<const int32_t> tokens, int32_t position,
                             std::span<const float> rows) override;
  bool reads_hidden_on_device() const override;
  absl::Status AddTargetRowsOnDevice(uint64_t seq_id, std::span<const int32_t> tokens,
                                     int32_t position, const void* rows, int32_t n) override;
  absl::Status PrepareForks(std::span<const uint64_t> seq_ids) override;
  Trace TakeTrace() override { return std::exchange(trace_, Trace{}); }
  void set_trace(bool on) override { tracing_ = on; }

  // Benchmarks only: greedy drafts and their candidates follow `replay` (controlled acceptance);
  // the head's passes still run.
  void set_replay(std::shared_ptr<const DraftReplay> replay) { replay_ = std::move(replay); }
  // Propose calls drafted as one ranked round on the device (ProposeRound).
  int64_t rounds_on_device() const { return rounds_on_device_; }
  int64_t graphs_captured() const override { return compute_->graphs_captured(); }
  // Tests: live states (sequences and branches) and free pool regions.
  int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  int32_t num_free_regions() const { return static_cast<int32_t>(free_regions_.size()); }

 private:
  struct State {
    explicit State(int32_t block_size) : blocks(block_size) {}
    // The tokens its cache entries read: entry p read tokens[p + 1] (drafts included).
    std::vector<int32_t> tokens;
    int32_t entries = 0;  // cache slots [0, entries) are valid for `tokens` (or absent)
    int32_t region = -1;
    // ring[p % kEagle3PoolWindow] == p: pool row RingRow(p) holds position p's hidden state.
    std::vector<int32_t> ring;
    BlockTable blocks;  // a paged cache's
    std::mt19937_64 rng;
    bool seeded = false;
  };
  // One sequence drafting in Propose.
  struct Active {
    size_t input = 0;
    State* state = nullptr;
    uint64_t seq = 0;
    int32_t next_position = 0;  // its next row's position
    int32_t logits_row = -1;    // its logits row in the last pass
  };

  Eagle3CacheDrafter(std::unique_ptr<Eagle3Compute> compute, int32_t vocab, int32_t max_model_len,
                     std::string device_name);
  // The state of `seq_id`; a new one takes a pool region (none when none is free: it then never
  // holds a hidden state and drafts nothing).
  State* StateOf(uint64_t seq_id);
  int64_t HiddenWidth() const {
    return static_cast<int64_t>(compute_->config().aux_layer_ids.size()) *
           compute_->config().target_hidden_size;
  }
  // AddTargetRows' work for `n` rows of positions [position, position + n): capture_rows(skip,
  // count) makes rows [skip, skip + count) of them the rows Fuse reads.
  absl::Status AddRows(
      uint64_t seq_id, std::span<const int32_t> tokens, int32_t position, int32_t n,
      const std::function<absl::Status(int32_t skip, int32_t count)>& capture_rows);
  int32_t RingRow(const State& s, int32_t position) const;
  bool HasHidden(const State& s, int32_t position) const;
  void SetHidden(State& s, int32_t position);
  // Rows rerunning `s`'s positions [from, to] (their hidden states in the ring) into rows_;
  // stops at the first position without one (or without KV room), returning the positions
  // queued.
  int32_t QueueRows(uint64_t seq, State& s, int32_t from, int32_t to);
  // A paged cache: `s`'s table covers slots [0, to] and slots [from, to] are its own (a block
  // another state shares is copied first, its slots below `from` kept). False when the KV
  // blocks run out (the table is then short of `to`).
  bool PrepareSlots(State& s, int32_t from, int32_t to);
  // Propose's drafts as one round on the device (Eagle3Compute::DraftRankedRound: the catch-up in
  // rows_, then K - 1 steps, every step's candidates and prenorm row kept), when every active
  // sequence drafts K greedy tokens ranked on the device and nothing may stop it between passes;
  // *done false (nothing drafted, rows_ as they were): the passes run one at a time.
  absl::Status ProposeRound(std::span<const DraftInput> inputs,
                            std::span<const CacheDraftOptions> cache, std::vector<Draft>* drafts,
                            bool* done);
  // A greedy draft from the device: the compute's argmax and its `ranked` candidates (best first).
  void DeviceDraft(const DraftInput& in, const CacheDraftOptions& cache, int32_t argmax,
                   std::span<const int32_t> ranked, Draft& draft) const;
  // Draws draft j of `in` from its logits row (candidates and Saguaro sampling per `cache`).
  void DrawDraft(const DraftInput& in, const CacheDraftOptions& cache, State& s,
                 std::span<const float> logits, Draft& draft);

  std::unique_ptr<Eagle3Compute> compute_;
  std::unique_ptr<BlockAllocator> allocator_;  // a paged cache's blocks (its last is scratch)
  int32_t block_size_ = 16;
  int32_t vocab_;
  int32_t max_model_len_;
  std::string device_name_;
  std::shared_ptr<const DraftReplay> replay_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<State>> states_;
  std::vector<int32_t> free_regions_;
  std::vector<Active> active_;            // scratch
  std::vector<Eagle3Compute::Row> rows_;  // scratch: one pass
  std::vector<uint8_t> host_flags_;       // scratch
  std::vector<int32_t> ids_, from_, to_;  // scratch
  std::vector<float> logits_, probs_;     // scratch
  std::vector<int32_t> cand_ids_;         // scratch: device-ranked candidates
  Eagle3Compute::RankedRound ranked_;     // scratch: ProposeRound's
  int64_t rounds_on_device_ = 0;
  std::vector<float> cand_logprobs_;  // scratch
  bool tracing_ = false;
  Trace trace_;  // TakeTrace's: seconds in Forward, TopCandidates and CopyHidden
};

// The head of `head_dir` for the target in `target_dir` on `device` (the CPU, or a GPU with its
// own stream and KV blocks: kv_cache_bytes, 0 for 2 GiB; `dummy`: random weights), for a
// verifier of `target_vocab` ids (0: not checked) and `max_model_len` tokens.
absl::StatusOr<std::unique_ptr<Eagle3CacheDrafter>> CreateEagle3CacheDrafter(
    const std::string& head_dir, const std::string& target_dir, const std::string& device,
    int32_t target_vocab, int32_t max_model_len, bool dummy = false, int64_t kv_cache_bytes = 0);

}  // namespace specd
