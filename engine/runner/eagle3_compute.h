// The compute of an EAGLE-3 head held beside its target (RunnerOptions::eagle3_head): what the
// speculator (engine/speculation/eagle3.h, which plans every row) asks the backend to run.
//   CPU:  the exact fp32 Eagle3Head (engine/model/eagle3_head.h), the target's captured hidden
//         states read from the host (ModelRunner::captured_hidden_states), a cache per sequence.
//   CUDA: cuda_eagle3.h: bf16 weights and the head's paged KV on the target's GPU (the KV shares
//         the target's block tables), the captured hidden states read where the target's pass
//         left them on the device, greedy drafts drawn there.
// Fused target hidden states wait in a pool of rows (fc's outputs) that the speculator assigns;
// a pass's prenorm outputs (the next draft step's hidden inputs) stay in the compute until the
// next pass. Engine thread only.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/eagle3_head.h"
#include "engine/model/token_tree.h"

namespace specd {

class ModelRunner;
struct SampleRow;

// Pool rows a sequence may keep pending (target hidden states the head has not run): a
// verification chunk's K + 1 positions at the largest K (kMaxSpeculativeTokens, 64).
inline constexpr int32_t kEagle3PoolWindow = 65;

class Eagle3Compute {
 public:
  virtual ~Eagle3Compute() = default;

  virtual const Eagle3Config& config() const = 0;
  // Draft id -> target id ([draft_vocab_size]).
  virtual std::span<const int32_t> draft_to_target() const = 0;
  // The pool: num_pool_regions() regions of kEagle3PoolWindow rows (one per sequence with
  // pending rows), then scratch rows for one target pass's rows that are run at once (as many
  // as the target's step has tokens).
  virtual int32_t num_pool_regions() const = 0;
  int32_t scratch_row(int32_t i) const { return num_pool_regions() * kEagle3PoolWindow + i; }

  // fc over rows of the target's last pass (its new tokens in batch order, as captured):
  // pool row pool_rows[i] = fc(captured row capture_rows[i]).
  virtual absl::Status Fuse(std::span<const int32_t> capture_rows,
                            std::span<const int32_t> pool_rows) = 0;

  struct Row {
    int64_t seq = -1;      // the sequence whose cache the row joins
    int32_t token = 0;     // its input embedding's id (target vocabulary)
    int32_t position = 0;  // RoPE position
    // The cache slot its K/V is written to; -1: `position`. A chain row attends the slots up
    // to its own that the cache holds.
    int32_t slot = -1;
    // A tree row (a node of a draft tree, engine/model/token_tree.h): caller-owned, valid during
    // Forward. The row is node slot - tree->start of the tree region [tree->start, tree->start +
    // tree->parents.size()), and attends the cache's slots before the region, its ancestors'
    // slots (rows run before it: an earlier Forward or earlier in this one) and its own; never
    // another branch's. Its position is its depth's, apart from its slot. On a paged cache the
    // region lies in the slots the target reserved for the round (the speculator keeps it
    // within the round's K lookahead slots after the last committed token's). nullptr: a chain.
    const TokenTree* tree = nullptr;
    // >= 0: the pool row holding its hidden input; < 0: the prenorm output of logits row
    // -hidden - 1 of the previous Forward (its rows with logits, in order).
    int32_t hidden = 0;
    bool logits = false;  // draw from this row
    // The target's block table of the sequence (paged caches), covering the row's slot.
    std::span<const int32_t> block_table = {};
  };
  // Whether Forward runs tree rows (Row::tree, Row::slot apart from the position); a compute
  // without them gets chains only (the speculator drafts a chain of the tree's depth).
  virtual bool SupportsTrees() const { return false; }
  // Token trees on a device: TopCandidates ranks the last Forward's logits rows where they are
  // (a tree level then copies k ids and log-probabilities per node, not whole rows).
  virtual bool RanksOnDevice() const { return false; }
  // Most rows with logits one Forward takes (a tree level's nodes count one each).
  virtual int32_t max_logit_rows() const { return INT32_MAX; }
  // For each logits row of the last Forward, in order: its k (<= 16) best draft-vocabulary
  // tokens as target ids, best first (ties to the lower draft id), and their log-softmax over
  // the draft vocabulary, appended to *ids and *logprobs (k per row). Unimplemented unless
  // RanksOnDevice().
  virtual absl::Status TopCandidates(int32_t /*k*/, std::vector<int32_t>* /*ids*/,
                                     std::vector<float>* /*logprobs*/) {
    return absl::UnimplementedError("EAGLE-3 head: candidates are ranked on the host");
  }
  // From now on each Forward also ranks its logits rows' k best (TopCandidates' work, 0: off)
  // and brings them back with its ids, so that TopCandidates(k) right after it waits for the
  // device no second time (SSD's speculator ranks every pass). A compute that ranks on the
  // host, or a TopCandidates with another k, just ranks as without it.
  virtual void PrefetchCandidates(int32_t /*k*/) {}

  // Runs `rows` (a sequence's rows consecutive, slots ascending). For the rows with logits,
  // in order: (*ids)[k] the argmax over the draft vocabulary as a target id (lowest on ties);
  // and when host_logits[k] (one flag per logits row), the row's logits over the target
  // vocabulary (-inf outside the draft vocabulary) appended to *logits. Rows before a row's
  // position that the cache does not hold are absent (the CPU cache) or stale (a paged cache):
  // drafts accept less, verification keeps the output exact.
  virtual absl::Status Forward(std::span<const Row> rows, std::span<const uint8_t> host_logits,
                               std::vector<int32_t>* ids, std::vector<float>* logits) = 0;

  // Sampled chains and rounds drawn on the device (DraftChain / DraftRound with draws; a compute
  // that DrawsOnDevice): each draw is made as DrawRows makes it (the row's processed distribution
  // over the target vocabulary, its uniform SpeculationUniform(seed, num_generated + d, kDraft)
  // for its d-th draw of the call), and its distribution is left in a probability slot.
  // rows[i] (one per sequence, in the rows' order): a sampled row without penalties or bans
  // (temperature, top-k, top-p and min-p only), num_generated that of the call's first draw.
  // Sequence i's d-th draw goes to slot first_slot + i * slot_stride + d (ReserveDrawSlots
  // reserved them). A draw whose distribution has no mass gives -1, and the chain's later ids
  // are to be ignored.
  struct ChainDraws {
    std::span<const SampleRow> rows;
    int32_t first_slot = 0;
    int32_t slot_stride = 0;
  };

  // Chains: runs `steps` (>= 1) draft steps after a Forward, one row per sequence (`rows`:
  // chain rows, each its sequence's only one, all with logits, slot -1), and appends the ids of
  // every step to *ids ([steps, rows.size()], as Forward's ids). Step 0 runs `rows`; step s > 0
  // runs row i at position rows[i].position + s with the token step s - 1 drew for it and that
  // step's prenorm output as its hidden input. Afterwards the last step is "the previous Forward"
  // (Row::hidden < 0 reads its rows). draws null: greedy, each id the argmax; the default runs
  // Forward `steps` times, the CUDA head replays one captured graph for all of them
  // (ChainsOnDevice), reading the ids back once. draws set (sampled): the CUDA head replays one
  // captured graph; *ran false (nothing run, *ids untouched) where it cannot, and always in the
  // default: the caller then runs Forward and DrawRows a step at a time.
  virtual bool ChainsOnDevice() const { return false; }
  virtual absl::Status DraftChain(std::span<const Row> rows, int32_t steps, const ChainDraws* draws,
                                  std::vector<int32_t>* ids, bool* ran);

  // A round at once: `rows` a Forward's catch-up (each sequence's rows consecutive at
  // consecutive positions, only its last row with logits), then `steps` (>= 1) DraftChain steps
  // from those logits rows (the chain row of sequence i at its last row's position + 1, its
  // hidden input that row's prenorm). *ids: [steps + 1, sequences] target ids, the catch-up's
  // draw first; afterwards the last step is "the previous Forward". draws: as DraftChain's (the
  // catch-up's draw is draw 0). *ran false (nothing run, *ids untouched): the caller runs
  // Forward and DraftChain instead; the default, and the CUDA head where the round does not fit
  // its captured graphs (enforce_eager, long catch-ups).
  virtual absl::Status DraftRound(std::span<const Row> /*rows*/, int32_t /*steps*/,
                                  const ChainDraws* /*draws*/, std::vector<int32_t>* /*ids*/,
                                  bool* ran) {
    *ran = false;
    return absl::OkStatus();
  }

  // SSD's speculator (a greedy round whose every draft feeds its cache): DraftRound's greedy round
  // (rows: each sequence's catch-up; `steps` chain steps after it, each fed the argmax of the step
  // before) that also ranks each drawing row's k best as TopCandidates does, and copies each
  // drawing row's prenorm output to pool row keep_rows[s * sequences + i] (step s of sequence i,
  // s = 0 the catch-up's). out: ids [steps + 1, sequences] (target ids, as DraftRound's), then
  // candidates [steps + 1, sequences, k] (target ids) and their log-probabilities. *ran false
  // (nothing run, nothing written): the caller runs Forward and TopCandidates a pass at a time;
  // the default, and the CUDA head where the round does not fit its graphs.
  // CUDA graphs captured so far (SSD's b* leaves passes that captured one out of its timings).
  virtual int64_t graphs_captured() const { return 0; }

  struct RankedRound {
    std::vector<int32_t> ids;
    std::vector<int32_t> candidates;
    std::vector<float> logprobs;
  };
  virtual absl::Status DraftRankedRound(std::span<const Row> /*rows*/, int32_t /*steps*/,
                                        int32_t /*k*/, std::span<const int32_t> /*keep_rows*/,
                                        RankedRound* /*out*/, bool* ran) {
    *ran = false;
    return absl::OkStatus();
  }

  // Sampled drafts whose distributions stay on the device (the CUDA head): DrawRows draws
  // logits rows logits_rows[i] of the last Forward as ModelRunner::StepDraft draws a row
  // (rows[i]'s processed distribution over the target vocabulary, zero outside the draft
  // vocabulary; its uniform SpeculationUniform(seed, num_generated, kDraft)) and leaves that
  // distribution in the target runner's probability slot slots[i] (ReserveDrawSlots,
  // draw_slot). (*ids)[i]: the token drawn, or -1 where the distribution has no mass left.
  // ReserveDrawSlots(seqs, per_seq): slots for `seqs` sequences of `per_seq` draws (slot
  // i * per_seq + d), and as many more as the compute's graphs pad `seqs` to (their padding
  // rows' draws). Unimplemented unless DrawsOnDevice().
  virtual bool DrawsOnDevice() const { return false; }
  virtual absl::Status ReserveDrawSlots(int32_t seqs, int32_t per_seq);
  virtual const float* draw_slot(int32_t /*slot*/) const { return nullptr; }
  virtual absl::Status DrawRows(std::span<const int32_t> logits_rows,
                                std::span<const SampleRow> rows, std::span<const int32_t> slots,
                                std::vector<int32_t>* ids);

  // Whether a prefix-cache hit's positions can be in the head's cache: its KV lives in the
  // target's blocks (the CUDA head), so a block a request the head drafted for computed holds the
  // head's entries too; such requests reuse only blocks marked so, and mark the blocks they
  // compute (Sequence::head_kv). False (the CPU head's per-sequence cache): requests that may
  // draft with the head compute every position of their prompt (Sequence::reuses_cached_prefix),
  // since the hidden states of a cached position never reach the head.
  virtual bool ReadsPrefixCache() const { return false; }

  // Drops the sequence's cache entries at slot `slot` and later (a cache whose rows must
  // ascend); a paged cache overwrites them instead.
  virtual void Truncate(int64_t /*seq*/, int32_t /*slot*/) {}
  // The sequence ended.
  virtual void Release(int64_t /*seq*/) {}

  // ---- A head without its target beside it (SSD's speculator, ssd/eagle3_drafter.h) ----
  // Whether the caller supplies the target's hidden states (SetHostCapture) and the cache forks;
  // false for a compute held by a target runner (its Fuse reads the runner's capture).
  virtual bool Standalone() const { return false; }
  // The rows Fuse reads from now on: [n, fc input] f32 on the host (the caller keeps them alive
  // until the Fuse that reads them).
  virtual absl::Status SetHostCapture(std::span<const float> /*rows*/) {
    return absl::UnimplementedError("EAGLE-3 head: its target's capture is its runner's");
  }
  // Or rows already on the compute's device ([n, fc input] bf16; the CUDA head): Fuse reads them
  // there. Each call first waits for the compute's queued work (the rows before are free after
  // it); SetDeviceCapture(nullptr, 0) just waits. Unimplemented unless TakesDeviceCapture().
  virtual bool TakesDeviceCapture() const { return false; }
  virtual absl::Status SetDeviceCapture(const void* /*rows*/, int64_t /*n*/) {
    return absl::UnimplementedError("EAGLE-3 head: no device capture");
  }
  // Copies hidden rows: pool row to[i] gets pool row from[i] (>= 0) or the prenorm output of
  // logits row -from[i] - 1 of the last Forward (< 0, as Row::hidden).
  virtual absl::Status CopyHidden(std::span<const int32_t> /*from*/,
                                  std::span<const int32_t> /*to*/) {
    return absl::UnimplementedError("EAGLE-3 head: no hidden-row copies");
  }
  // A paged cache (the CUDA head): rows name their block tables (Row::block_table), which the
  // caller allocates from kv_blocks() blocks of kv_block_size() slots (the last block is the
  // compute's scratch: never handed out); CopyKvBlocks copies whole blocks (src, dst) so forks
  // share full blocks and copy the rest. Otherwise (the CPU head) a cache per sequence, forked
  // by ForkCache: `child` (a new sequence) gets `parent`'s entries of slots below `slots`;
  // AdoptCache gives `parent` the child's cache instead of its own (the child is gone).
  virtual bool PagedCache() const { return false; }
  virtual int32_t kv_blocks() const { return 0; }
  virtual int32_t kv_block_size() const { return 0; }
  virtual absl::Status CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> /*src_dst*/) {
    return absl::UnimplementedError("EAGLE-3 head: no paged cache");
  }
  virtual absl::Status ForkCache(int64_t /*parent*/, int64_t /*child*/, int32_t /*slots*/) {
    return absl::UnimplementedError("EAGLE-3 head: no cache forks");
  }
  virtual absl::Status AdoptCache(int64_t /*parent*/, int64_t /*child*/) {
    return absl::UnimplementedError("EAGLE-3 head: no cache forks");
  }
};

// The CPU compute over `target`'s captured hidden states: loads the head from `dir` (its
// embedding from `target_dir` when it has none) and makes `target` capture its layers.
// InvalidArgument prefixed "EAGLE-3 head: " for a head that cannot draft for the target.
absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateCpuEagle3Compute(const std::string& dir,
                                                                      const std::string& target_dir,
                                                                      ModelRunner* target);
// A standalone CPU compute (Standalone(): SSD's speculator): the head of `dir` for the target in
// `target_dir` (its config.json, and its embedding when the head has none); Fuse reads the rows
// of SetHostCapture.
absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneCpuEagle3Compute(
    const std::string& dir, const std::string& target_dir);

// A standalone compute on `device` (CreateStandaloneEagle3Compute in model_runner.h picks the
// backend).
struct StandaloneEagle3Options {
  std::string dir;         // the head's folder
  std::string target_dir;  // the target's (config.json; its embedding when the head has none)
  std::string device = "cpu";
  bool dummy = false;        // load_format "dummy": random weights (CUDA)
  int32_t max_states = 512;  // sequences and branches alive at once (pool regions)
  int32_t max_model_len = 2048;
  int32_t block_size = 16;     // a paged cache's
  int64_t kv_cache_bytes = 0;  // a paged cache's; 0: 2 GiB
};

}  // namespace specd
