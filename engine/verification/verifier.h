// The Verify stage of an engine step (Prepare -> Speculate -> Verify -> Apply, see
// docs/architecture.md, "Speculation"): one target pass over the step's ragged batch (prefill
// chunks, plain decodes, decodes carrying drafts) that turns every sample row into the tokens
// it commits. A plain row is the zero-draft case: it commits the one token drawn after it. A
// drafted row's chunk holds the sequence's last committed token followed by its K drafts; it
// commits the accepted drafts (greedy: up to the first mismatch with the target's choice;
// sampled: speculative sampling against the draft's q, so the output distribution is the
// target's) and then the correction or bonus token.
//
// Three implementations, tried in this order by the engine (the first whose Fits holds):
// - GreedyVerifier: the runner's own sampler draws the target's token at every drafted
//   position (ModelRunner::StepGreedyVerify; on a GPU only ids leave the device). Drafted rows
//   must be greedy without penalties, bans or logprobs. A step without drafts is a plain
//   ModelRunner::Step (the decode CUDA graphs).
// - SampledVerifier: p and q stay on the device and acceptance runs there
//   (ModelRunner::StepSampledVerify); only where the runner keeps probabilities on a device.
// - HostVerifier: every drafted position's logits come to the host and the request's Acceptor
//   verifies them (processed distributions, rejection sampling, logprobs): the exact path, and
//   the oracle the others are tested against.
// Token trees (Draft::parents) go to the first two where the runner takes trees
// (ModelRunner::SupportsTokenTrees; SampledVerifier only when no drafted row of the step carries
// q, as tree nodes are one-hot); RowOutcome::path names the drafts kept.
// Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/acceptance.h"
#include "engine/sample/sampler.h"
#include "engine/speculation/speculator.h"

namespace specd {

// What the Verify stage gets: the step's batch (built once, after Speculate) and, per sample
// row, its drafts.
struct VerifyInput {
  std::span<const SequenceInput> batch;  // [num_chunks]
  std::span<const SampleRow> rows;       // [num_rows] the rows drawing a token this step
  std::span<const Draft> drafts;         // [num_rows] empty tokens: a plain row
  // [num_rows] the requests' acceptors (their own seeded RNG), for HostVerifier's drafted rows;
  // may be null for rows without drafts, and empty for the other verifiers.
  std::span<Acceptor* const> acceptors;
};

// What verification gives one row.
struct RowOutcome {
  int32_t num_drafts = 0;    // drafts the row carried (0: a plain row)
  int32_t num_accepted = 0;  // 0..num_drafts
  // The tokens to commit, in order: the accepted drafts, then the correction or bonus token (a
  // plain row: its one token). Logprobs are the target's raw ones, where the request asks.
  std::vector<SampleResult> tokens;
  // A tree's accepted drafts (indices, root side first); empty for chains and plain rows.
  std::vector<int32_t> path;
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  virtual const char* name() const = 0;
  // Whether this verifier can take these rows and drafts; decided before the batch is built.
  virtual bool Fits(std::span<const SampleRow> rows, std::span<const Draft> drafts) const = 0;
  // Whether drafted chunks must return every position's logits (SequenceInput::all_logits).
  virtual bool wants_all_logits() const { return false; }
  // Runs the batch (writing every new token's KV) and fills (*out)[i] for rows[i]. Errors are
  // the runner's (InvalidArgument: malformed batch; Internal: device failure).
  virtual absl::Status Verify(const VerifyInput& in, std::vector<RowOutcome>* out) = 0;
  // Seconds the last Verify spent accepting on the host after the target pass (speculative
  // sampling against q, the correction or bonus draws: HostVerifier); 0 where acceptance runs
  // inside the pass. The SSD round's timeline (ssd_stats.h) reports it apart from the pass.
  double last_sampling_seconds() const { return sampling_seconds_; }

 protected:
  double sampling_seconds_ = 0;
};

class GreedyVerifier : public Verifier {
 public:
  explicit GreedyVerifier(ModelRunner* runner) : runner_(runner) {}
  const char* name() const override { return "greedy"; }
  bool Fits(std::span<const SampleRow> rows, std::span<const Draft> drafts) const override;
  absl::Status Verify(const VerifyInput& in, std::vector<RowOutcome>* out) override;

 private:
  ModelRunner* runner_;
  std::vector<SampleResult> sampled_;                  // scratch: a plain step
  std::vector<std::span<const int32_t>> draft_spans_;  // scratch
  std::vector<GreedyVerifyResult> verified_;           // scratch
};

class SampledVerifier : public Verifier {
 public:
  explicit SampledVerifier(ModelRunner* runner) : runner_(runner) {}
  const char* name() const override { return "sampled"; }
  bool Fits(std::span<const SampleRow> rows, std::span<const Draft> drafts) const override;
  absl::Status Verify(const VerifyInput& in, std::vector<RowOutcome>* out) override;

 private:
  ModelRunner* runner_;
  std::vector<std::span<const int32_t>> draft_spans_;  // scratch
  std::vector<DraftProbs> draft_probs_;                // scratch
  std::vector<GreedyVerifyResult> verified_;           // scratch
};

class HostVerifier : public Verifier {
 public:
  explicit HostVerifier(ModelRunner* runner) : runner_(runner) {}
  const char* name() const override { return "host"; }
  bool Fits(std::span<const SampleRow>, std::span<const Draft>) const override { return true; }
  bool wants_all_logits() const override { return true; }
  absl::Status Verify(const VerifyInput& in, std::vector<RowOutcome>* out) override;

 private:
  ModelRunner* runner_;
  std::vector<float> logits_;      // scratch: [num_logit_rows, vocab]
  std::vector<size_t> first_row_;  // scratch: each chunk's first logits row
};

}  // namespace specd
