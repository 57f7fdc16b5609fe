// The CPU backend behind ModelRunner: today's exact fp32 Model over a CpuKvCache, with each
// request's CPU Sampler drawing from the logits rows (bit-identical to the engine before the
// runner seam existed). The reference every other runner is checked against.
// Tensor parallelism (RunnerOptions::tp): every rank's runner holds its shard of the Model and a
// cache of its KV heads. A worker (tp.rank != 0) makes the same call as rank 0 with the same
// batch and rows, runs the same forward (so the same collectives in the same order), and stops
// once the logits are complete: it draws nothing and returns OK with empty outputs. Of a worker's
// rows only chunk and token are read (sampler, params and history may be null).
// Engine thread only (the Model's pool and scratch buffers).
#pragma once

#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/runner/model_runner.h"

namespace specd {

class CpuRunner : public ModelRunner {
 public:
  // KV pool of options.kv_cache_bytes (0: 64 MiB), never less than one max_model_len sequence.
  static absl::StatusOr<std::unique_ptr<CpuRunner>> Create(const RunnerOptions& options);

  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override;
  int32_t num_kv_blocks() const override { return kv_->spec().num_blocks; }
  int32_t block_size() const override { return kv_->spec().block_size; }
  int32_t max_model_len() const override { return max_model_len_; }
  int32_t max_sample_rows() const override { return std::numeric_limits<int32_t>::max(); }
  SsvLoadStats ssv_load_stats() const override {
    return model_->nsa() != nullptr ? model_->nsa()->ssv_stats() : SsvLoadStats{};
  }

  // kStep, kGreedyVerify and kForward; the device-speculation kinds and kForwardCandidates are
  // Unimplemented (probabilities and rankings stay on the host: the engine's HostVerifier).
  absl::Status Run(const StepRequest& request, StepResult* result) override;
  absl::Status CaptureHiddenStates(std::span<const int32_t> layer_ids) override {
    return model_->SetAuxHiddenLayers(layer_ids);
  }
  std::span<const float> captured_hidden_states() const override { return model_->aux_hidden(); }
  Eagle3Compute* eagle3() override { return eagle3_.get(); }
  // One rank (a tensor-parallel group's workers get no trees) and a dense model (NSA attention
  // takes no tree mask).
  bool SupportsTokenTrees() const override;
  bool SupportsLossySsv() const override { return true; }
  absl::Status MoveKv(std::span<const KvSlotMove> moves) override;

 private:
  CpuRunner() = default;

  bool worker() const { return rank_ != 0; }
  // Run's kinds.
  absl::Status DrawRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                        std::vector<SampleResult>* out);
  // Rank 0: GreedyVerifyByStep (kStep over every drafted position). A worker: the same kStep
  // rows (drafts[i].size() + 1 per drafted row), checked only for what it can see (chunks and
  // tokens), and empty verified.
  absl::Status VerifyGreedy(const StepRequest& request, StepResult* result);
  // A worker leaves *logits empty.
  absl::Status ForwardLogits(std::span<const SequenceInput> batch, std::vector<float>* logits);
  // The rows' checks every rank makes (chunk and token inside the batch, no all_logits chunk),
  // then the forward with all_logits on every chunk a row names a token of, into logits_.
  // Returns the batch it ran (batch, or batch_ with those all_logits set).
  absl::StatusOr<std::span<const SequenceInput>> RunRows(std::span<const SequenceInput> batch,
                                                         std::span<const SampleRow> rows);
  // Rank 0's checks of what it draws with: sampler, history, candidates, pending tokens.
  absl::Status CheckSampling(std::span<const SampleRow> rows) const;

  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuKvCache> kv_;
  std::unique_ptr<Eagle3Compute> eagle3_;  // RunnerOptions::eagle3_head (rank 0)
  int32_t max_model_len_ = 0;
  int32_t num_threads_ = 0;
  int32_t rank_ = 0;                  // tensor-parallel rank; 0 samples
  std::vector<float> logits_;         // [num_logit_rows, vocab] scratch of Step
  std::vector<SequenceInput> batch_;  // scratch of Step: the batch with all_logits where needed
};

}  // namespace specd
