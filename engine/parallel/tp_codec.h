// The runner calls rank 0 repeats on every worker rank of a tensor-parallel group, as TpStep
// messages (engine/distributed/messages.h): rank 0 encodes the call it is about to make
// (EncodeTpStep), each worker rebuilds it (TpCall::Decode) and makes the same call on its shard
// (TpCall::Run), so every rank runs the same forward and the same collectives in the same order.
// Only what decides the forward travels: the batch, each sample row's (chunk, token), its number
// of drafts and what the vocabulary merge needs (VocabMergeK). Sampling state stays on rank 0 (a
// worker's runner does not sample; its rows carry greedy defaults so that argument checks pass).
// Block tables travel as deltas: rank 0's TpBlockMirror records what each worker holds per
// sequence, and a chunk carries only the ids past the part of its table the worker already has
// (vLLM's scheduler output sends new block ids the same way). One thread per object.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/distributed/messages.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace specd {

// Rank 0's copy of the block tables its workers mirror, by sequence id (all workers hold the
// same: every one applies every TpStep). A mirror unused for kIdleSteps steps is dropped, and the
// next step tells the workers (TpStep::released).
class TpBlockMirror {
 public:
  static constexpr uint64_t kIdleSteps = 64;

  // The number of leading ids of `table` (the ids a chunk needs) that the workers' mirror of
  // `seq_id` already holds, recording `table` as the mirror from now on.
  uint32_t Update(int64_t seq_id, std::span<const int32_t> table, uint64_t step);
  // Drops mirrors idle for kIdleSteps, appending their ids to *released.
  void Expire(uint64_t step, std::vector<int64_t>* released);
  size_t size() const { return mirrors_.size(); }

 private:
  struct Mirror {
    std::vector<int32_t> blocks;
    uint64_t last_step = 0;
  };
  absl::flat_hash_map<int64_t, Mirror> mirrors_;
};

// Fills *out (reusing its storage) with the call: `drafts` empty for kStep / kDraft / kForward.
// Each chunk covers the block ids of its positions (block_size tokens each), not its whole
// table; a chunk with a sequence id that is the first of its id in the batch carries only what
// `mirror` says the workers lack (mirror may be null: every chunk carries all its ids).
void EncodeTpStep(TpMethod method, std::span<const SequenceInput> batch,
                  std::span<const SampleRow> rows, std::span<const std::span<const int32_t>> drafts,
                  int32_t block_size, uint64_t step_id, TpBlockMirror* mirror, TpStep* out);

// The call `request` as a TpStep (the fields of its kind: a kForward carries no rows, a kStep or
// kDraft no drafts; probabilities and slots never travel). kForwardCandidates has no TpStep.
void EncodeTpStep(const StepRequest& request, int32_t block_size, uint64_t step_id,
                  TpBlockMirror* mirror, TpStep* out);

// A worker's copy of one call. Views point into the TpStep it was decoded from, which must
// outlive Run.
class TpCall {
 public:
  TpCall();

  // Rebuilds the call, updating the worker's block-table mirrors; InvalidArgument when the step's
  // rows or drafts do not fit its chunks (the decoder already checked the sizes), or when it
  // keeps more of a mirror than the worker holds (the ranks disagree: the group must fail).
  absl::Status Decode(const TpStep& step);
  size_t num_mirrors() const { return mirrors_.size(); }
  // Makes the call on `runner` (a worker rank's: it runs the forward and returns no outputs):
  // one ModelRunner::Run of the decoded kind.
  absl::Status Run(ModelRunner& runner);

  std::span<const SequenceInput> batch() const { return batch_; }
  std::span<const SampleRow> rows() const { return rows_; }
  std::span<const std::span<const int32_t>> drafts() const { return drafts_; }

 private:
  TpMethod method_ = TpMethod::kStep;
  SamplingParams greedy_;  // what every worker row carries (rank 0 samples)
  TokenHistory history_;
  Sampler sampler_;
  std::vector<SequenceInput> batch_;
  std::vector<SampleRow> rows_;
  std::vector<std::span<const int32_t>> drafts_;
  std::vector<DraftProbs> probs_;
  std::vector<int32_t> slots_;
  std::vector<SampleResult> sampled_;
  std::vector<GreedyVerifyResult> verified_;
  std::vector<float> logits_;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> mirrors_;  // by sequence id
};

}  // namespace specd
