// The Speculate half of one speculative decoding iteration (Speculate -> Verify -> Apply, see
// docs/architecture.md): a Speculator proposes up to K draft tokens for each sequence of a
// continuous batch (ragged: K per request, and a speculator may propose fewer, even none).
// The engine verifies all drafts in one target pass and commits the accepted prefix; the
// speculator learns the outcome from the sequence's committed tokens at its next Propose
// (a speculator with state, like the draft model's KV, rolls back what was rejected then).
// Implementations: NgramSpeculator (prompt lookup, stateless), DraftModelSpeculator (a second
// model with its own paged KV). Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

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
  // SSD (a draft model building a speculation cache; others ignore these):
  int32_t num_candidates = 0;   // > 0: Draft::candidates gets the top ids at each position
  int32_t saguaro_fan_out = 0;  // sampled drafts: down-weight the top-F ids of each row ...
  float saguaro_c = -1.0f;      // ... by C in [0, 1) (Saguaro sampling); < 0 (unset) or 1: plain
};

// Where an SSD draft came from (metrics split acceptance by it); kDefault for other speculators.
enum class DraftOrigin : uint8_t { kDefault, kCacheHit, kPrimary, kBackup, kLocal };

// What a speculator proposes for one sequence.
struct Draft {
  std::vector<int32_t> tokens;  // [k], k <= num_draft_tokens
  // [k, vocab] f32: q_j, the distribution draft j was drawn from (processed under the
  // request's params, as acceptance needs for sampled requests). Empty for deterministic
  // proposals (n-gram) and for greedy requests: acceptance then treats q as one-hot.
  std::vector<float> probs;
  // The same rows when they stay on a GPU instead ([k, vocab] f32 on the draft runner's device,
  // ModelRunner::StepDraft's slots; valid until the speculator's next Propose). probs is then
  // empty. Verification copies them device to device.
  const float* device_probs = nullptr;
  // [k, num_candidates] with DraftInput::num_candidates: the draft's best ids at each drafted
  // position, distinct, best first: by the probability of the row draft j was drawn from
  // (before Saguaro down-weighting), ties to the lower id; greedy requests: by raw logit, and
  // row j starts with tokens[j]. Empty when num_candidates is 0.
  std::vector<int32_t> candidates;
  DraftOrigin origin = DraftOrigin::kDefault;
};

class Speculator {
 public:
  virtual ~Speculator() = default;

  // Fills (*drafts)[i] for inputs[i] (resized to inputs.size()). An error is a device or
  // internal failure: the engine then runs the step without speculation.
  virtual absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) = 0;
  // The sequence finished, was aborted or lost its KV: drop any state held for it.
  virtual void Release(uint64_t seq_id) = 0;
};

}  // namespace specd
