// The runner calls rank 0 repeats on every worker rank of a tensor-parallel group, as TpStep
// messages (engine/distributed/messages.h): rank 0 encodes the call it is about to make
// (EncodeTpStep), each worker rebuilds it (TpCall::Decode) and makes the same call on its shard
// (TpCall::Run), so every rank runs the same forward and the same collectives in the same order.
// Only what decides the forward travels: the batch, each sample row's (chunk, token) and its
// number of drafts. Sampling state stays on rank 0 (a worker's runner does not sample; its rows
// carry greedy defaults so that argument checks pass). One thread per object.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/distributed/messages.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace specd {

// Fills *out (reusing its storage) with the call: `drafts` empty for kStep / kDraft / kForward.
// Each chunk carries the block ids covering its positions (block_size tokens each), not its
// whole table.
void EncodeTpStep(TpMethod method, std::span<const SequenceInput> batch,
                  std::span<const SampleRow> rows, std::span<const std::span<const int32_t>> drafts,
                  int32_t block_size, uint64_t step_id, TpStep* out);

// A worker's copy of one call. Views point into the TpStep it was decoded from, which must
// outlive Run.
class TpCall {
 public:
  TpCall();

  // Rebuilds the call; InvalidArgument when the step's rows or drafts do not fit its chunks
  // (the decoder already checked the sizes).
  absl::Status Decode(const TpStep& step);
  // Makes the call on `runner` (a worker rank's: it runs the forward and returns no outputs).
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
};

}  // namespace specd
