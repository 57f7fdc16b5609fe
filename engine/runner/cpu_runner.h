// The CPU backend behind ModelRunner: today's exact fp32 Model over a CpuKvCache, with each
// request's CPU Sampler drawing from the logits rows (bit-identical to the engine before the
// runner seam existed). The reference every other runner is checked against.
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

  absl::Status Step(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                    std::vector<SampleResult>* out) override;
  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) override;

 private:
  CpuRunner() = default;

  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuKvCache> kv_;
  int32_t max_model_len_ = 0;
  int32_t num_threads_ = 0;
  std::vector<float> logits_;         // [num_logit_rows, vocab] scratch of Step
  std::vector<SequenceInput> batch_;  // scratch of Step: the batch with all_logits where needed
};

}  // namespace specd
