// What one ModelRunner pass takes and gives (ModelRunner::Run): the request names its kind
// (StepKind, engine/base/step_kind.h, whose values carry each kind's contract) and views the
// caller's batch, sample rows, drafts, draft probabilities and probability slots; the result
// points at the caller's output vectors. Views only: nothing of the batch is copied, and
// everything a request or result points at must outlive the Run call. Plain values: the thread
// that makes the call.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/base/step_kind.h"
#include "engine/model/model.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace specd {

// One token drawn this step: from the logits of batch chunk `chunk` at its last token (the
// sequence's next token), or at token `token` of the chunk (verification of greedy drafts draws
// the target's choice after every position of a drafted chunk). Pointers are the request's and
// outlive the Step call.
struct SampleRow {
  int32_t chunk = 0;
  Sampler* sampler = nullptr;              // the request's CPU sampler (its own seeded RNG)
  const SamplingParams* params = nullptr;  // the request's params (what the GPU sampler reads)
  const TokenHistory* history = nullptr;   // prompt and output ids (penalties)
  std::span<const int32_t> banned;         // ids that must not be drawn (min_tokens)
  uint64_t seed = 0;                       // the request's seed (given or drawn at arrival)
  int64_t num_generated = 0;               // tokens drawn so far (GPU Philox offset)
  int32_t token = -1;                      // index into the chunk's tokens; -1: the last
  // Tokens after `history` that penalties count as output: the earlier drafts of a speculative
  // position (StepSampledVerify sets them itself; StepDraft's caller sets them). Runners that
  // keep no probabilities on a device (SamplesSpeculationOnDevice() false) refuse rows with any.
  std::span<const int32_t> pending = {};
  // The ids of the row's num_candidates largest raw logits (before penalties and bans), best
  // first, ties to the lower id, in SampleResult::candidates (SSD's cache candidates; on a GPU
  // only the ids come back). At most kMaxSampleCandidates. kDraft rows rank by the processed
  // probability instead: the row the draft is drawn from, before Saguaro down-weighting.
  int32_t num_candidates = 0;
  // kDraft rows (SSD's cache on a runner that samples speculation on the device): Saguaro
  // sampling. The draft is drawn from the processed row with its saguaro_fan_out most probable
  // ids (ties to the lower id) down-weighted by saguaro_c (kernels::SaguaroDownweightRows), and
  // that row is the q its slot keeps. 0, or C NaN / >= 1: plain. At most kMaxSampleCandidates;
  // other kinds refuse rows with saguaro_fan_out > 0.
  int32_t saguaro_fan_out = 0;
  float saguaro_c = 1.0f;
  // Tensor parallelism: set on a worker rank's copy of a row whose rank-0 original needs its
  // whole row of logits (VocabMergeK), so that every rank merges the vocabulary shards alike.
  bool full_logits = false;
};
inline constexpr int32_t kMaxSampleCandidates = 16;

// What greedy verification of one row's drafts gives: the drafts kept up to the first mismatch
// with the target's argmax, and the target's token after them (the correction, or the bonus
// token when every draft is kept). A row without drafts draws `next` exactly as Step does.
struct GreedyVerifyResult {
  int32_t num_accepted = 0;  // 0..K
  SampleResult next;         // logprobs only for draftless rows that ask for them
                             // (StepSampledVerify: for every row that asks)
  // StepSampledVerify, rows that ask for logprobs: the accepted drafts with theirs; else empty.
  std::vector<SampleResult> accepted;
  // A token tree's row: the accepted drafts (indices into the row's drafts, root side first,
  // num_accepted of them); empty for chains.
  std::vector<int32_t> path;
};

// The distribution a row's drafts were drawn from, for StepSampledVerify: [k, vocab] f32 rows
// on a GPU (StepDraft's probability slots, on this runner's device or another one), or on the
// host (a speculator that drafts on the CPU or over the network), or neither: deterministic
// drafts (n-gram, greedy drafting), whose q is one-hot at each draft.
struct DraftProbs {
  const float* device = nullptr;
  std::span<const float> host;
};

// One pass's inputs. Which fields a kind reads is in its contract (StepKind); the others stay
// empty (the factories below set exactly the fields of their kind).
struct StepRequest {
  StepKind kind = StepKind::kStep;
  std::span<const SequenceInput> batch;  // the scheduler's ragged batch, every kind
  std::span<const SampleRow> rows;       // kStep, kGreedyVerify, kSampledVerify, kDraft
  // kGreedyVerify, kSampledVerify: [rows.size()] each row's drafts (empty: a plain row).
  std::span<const std::span<const int32_t>> drafts;
  std::span<const DraftProbs> probs;  // kSampledVerify: [rows.size()] what drafts[i] came from
  std::span<const int32_t> slots;     // kDraft: [rows.size()] distinct probability slots
  int32_t k = 0;                      // kForwardCandidates: candidates per row (1..16)

  static StepRequest Step(std::span<const SequenceInput> batch, std::span<const SampleRow> rows) {
    StepRequest r = Of(StepKind::kStep, batch);
    r.rows = rows;
    return r;
  }
  static StepRequest GreedyVerify(std::span<const SequenceInput> batch,
                                  std::span<const SampleRow> rows,
                                  std::span<const std::span<const int32_t>> drafts) {
    StepRequest r = Of(StepKind::kGreedyVerify, batch);
    r.rows = rows;
    r.drafts = drafts;
    return r;
  }
  static StepRequest SampledVerify(std::span<const SequenceInput> batch,
                                   std::span<const SampleRow> rows,
                                   std::span<const std::span<const int32_t>> drafts,
                                   std::span<const DraftProbs> probs) {
    StepRequest r = Of(StepKind::kSampledVerify, batch);
    r.rows = rows;
    r.drafts = drafts;
    r.probs = probs;
    return r;
  }
  static StepRequest Draft(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                           std::span<const int32_t> slots) {
    StepRequest r = Of(StepKind::kDraft, batch);
    r.rows = rows;
    r.slots = slots;
    return r;
  }
  static StepRequest Forward(std::span<const SequenceInput> batch) {
    return Of(StepKind::kForward, batch);
  }
  static StepRequest ForwardCandidates(std::span<const SequenceInput> batch, int32_t k) {
    StepRequest r = Of(StepKind::kForwardCandidates, batch);
    r.k = k;
    return r;
  }

 private:
  static StepRequest Of(StepKind kind, std::span<const SequenceInput> batch) {
    StepRequest r;
    r.kind = kind;
    r.batch = batch;
    return r;
  }
};

// Where one pass's outputs go: the caller's vectors (not owned), the ones of the request's kind
// set, the others null.
struct StepResult {
  std::vector<SampleResult>* samples = nullptr;         // kStep, kDraft: [rows.size()]
  std::vector<GreedyVerifyResult>* verified = nullptr;  // kGreedyVerify, kSampledVerify
  std::vector<float>* logits = nullptr;                 // kForward: [num_rows, vocab] f32
  std::vector<int32_t>* candidate_ids = nullptr;        // kForwardCandidates: [num_rows, k]
  std::vector<float>* candidate_logprobs = nullptr;     // kForwardCandidates: [num_rows, k]
};

}  // namespace specd
