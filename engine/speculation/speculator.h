// The Speculate stage of an engine step (Prepare -> Speculate -> Verify -> Apply, see
// docs/architecture.md): a Speculator proposes up to K draft tokens for each sequence of a
// continuous batch (ragged: K per request, and a speculator may propose fewer, even none).
// The engine verifies all drafts in one target pass (engine/verification/verifier.h) and tells
// the speculator each sequence's outcome (OnVerified: accepted length and the target's next
// token) before committing the tokens; a speculator with state, like the draft model's KV, rolls
// back what was rejected then. Implementations: NgramSpeculator (prompt lookup, stateless),
// DraftModelSpeculator (a second model with its own paged KV), SsdSpeculator (the client of the
// SSD speculator process), VegasSpeculator (the target itself with sparse attention; methods
// vegas and streaming). Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/speculation/spec_config.h"

namespace specd {

// One sequence to draft for.
struct DraftInput {
  uint64_t seq_id = 0;
  std::span<const int32_t> tokens;         // [num_tokens] committed ids: prompt then generated
  int32_t num_draft_tokens = 0;            // K wanted (>= 1); a speculator may return fewer
  const SamplingParams* params = nullptr;  // the request's (sampled drafts follow them)
  const TokenHistory* history = nullptr;   // penalties' view of `tokens`
  std::span<const int32_t> banned;         // ids the target may not emit (min_tokens) ...
  int32_t num_banned_positions = 0;        // ... at the first this many draft positions
  uint64_t seed = 0;                       // the request's seed (sampled drafts' RNG)
  int64_t num_generated = 0;               // tokens generated so far (device draws' Philox key)
  // The request's resolved speculation options; each speculator reads its own fields (SSD:
  // saguaro_c). May be null (the defaults).
  const ResolvedSpeculation* speculation = nullptr;
  // The sequence's KV in the target's cache (self-speculation: VegasSpeculator drafts on it):
  // its block ids, covering the lookahead slots num_computed .. num_computed + K - 1 as well, and
  // the tokens whose KV is computed (the last committed token's is not).
  std::span<const int32_t> block_table;  // [num_blocks]
  int32_t num_computed = 0;
  // A token tree wanted instead of a chain (Draft::parents): at most num_draft_tokens nodes, no
  // path longer than tree_depth, each node expanding at most tree_top_k children. tree_depth 0:
  // a chain. A speculator without trees drafts a chain of up to min(K, tree_depth) then.
  int32_t tree_depth = 0;
  int32_t tree_top_k = 0;
  bool wants_tree() const { return tree_depth > 0; }
};

// Where an SSD draft came from (metrics split acceptance by it); kDefault for other speculators.
enum class DraftOrigin : uint8_t { kDefault, kCacheHit, kPrimary, kBackup, kLocal };

// What a speculator proposes for one sequence.
// q rows a draft runner keeps on its device past the speculator's next Propose (SSD's speculation
// cache): kept rows [first_row, first_row + num_rows) of the runner (ModelRunner::
// ReserveKeptRows). Whoever made it gets the rows back when the last reference goes.
struct KeptProbs {
  int32_t first_row = 0;
  int32_t num_rows = 0;
  virtual ~KeptProbs() = default;
};

struct Draft {
  std::vector<int32_t> tokens;  // [k], k <= num_draft_tokens
  // A token tree (engine/model/token_tree.h) instead of a chain: parents[j] is draft j's parent,
  // -1 for a child of the last committed token, else an earlier draft; siblings best first,
  // every node the drafter's deterministic choice (q one-hot: probs stays empty). Empty: a chain.
  std::vector<int32_t> parents;
  // [k, vocab] f32: q_j, the distribution draft j was drawn from (processed under the
  // request's params, as acceptance needs for sampled requests). Empty for deterministic
  // proposals (n-gram) and for greedy requests: acceptance then treats q as one-hot.
  std::vector<float> probs;
  // The same rows when they stay on a GPU instead ([k, vocab] f32 on the draft runner's device,
  // ModelRunner::StepDraft's slots; valid until the speculator's next Propose). probs is then
  // empty. Verification copies them device to device.
  const float* device_probs = nullptr;
  // Or kept on the draft runner's device past the next Propose (SSD's cache; DraftModelSpeculator::
  // KeepProbsOnDevice): DraftModelSpeculator::ReadKeptProbs brings them to the host.
  std::shared_ptr<const KeptProbs> kept_probs;
  // SSD's speculation cache only (DraftModelSpeculator's Propose with CacheDraftOptions): the
  // draft's best ids at each drafted position, [k, num_candidates]. Empty otherwise.
  std::vector<int32_t> candidates;
  DraftOrigin origin = DraftOrigin::kDefault;
  // Vegas / streaming: the prefix tokens each draft step attended per layer besides the recent
  // ones (metrics); -1 for other speculators and for dense drafting.
  int32_t num_kept_tokens = -1;

  // Back to an empty draft, keeping the vectors' capacity (drafts are reused every step).
  void Reset() {
    tokens.clear();
    parents.clear();
    probs.clear();
    device_probs = nullptr;
    kept_probs.reset();
    candidates.clear();
    origin = DraftOrigin::kDefault;
    num_kept_tokens = -1;
  }
};

// What verification made of one sequence's drafts (Speculator::OnVerified).
struct VerifiedRound {
  uint64_t seq_id = 0;
  int32_t num_drafts = 0;    // drafts verified: those Propose returned (cut to the K asked)
  int32_t num_accepted = 0;  // 0..num_drafts: the accepted prefix
  int32_t next_token = 0;    // the target's token after them: the correction or the bonus token
  // A tree's accepted drafts (indices into the draft, root side first; num_accepted of them);
  // empty for chains (drafts 0..num_accepted - 1). Valid during OnVerified only.
  std::span<const int32_t> path = {};
  // Vegas: what the verification pass scored, [num_layers, 2, num_scored] f32 (ChunkAttention's
  // scores of the chunk's first and last query rows over the prefix [0, num_scored)); empty for
  // other methods. Valid during OnVerified only.
  std::span<const float> scores = {};
  int32_t num_scored = 0;
};

class Speculator {
 public:
  virtual ~Speculator() = default;

  // Fills (*drafts)[i] for inputs[i] (resized to inputs.size()). An error is a device or
  // internal failure: the engine then runs the step without speculation.
  virtual absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) = 0;
  // The outcome of verifying drafts this speculator proposed, one entry per sequence whose
  // drafts were verified, told after the verification pass and before the tokens are
  // committed (so a sequence may then finish and be Released). A sequence whose drafts were not
  // verified (the step failed; the request ended) is told nothing and proposed for anew.
  virtual void OnVerified(std::span<const VerifiedRound> /*rounds*/) {}
  // The sequence finished, was aborted or lost its KV: drop any state held for it.
  virtual void Release(uint64_t seq_id) = 0;
};

}  // namespace specd
