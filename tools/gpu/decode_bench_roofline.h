// The roofline decode_bench measures the CUDA runner against: what a step of the model costs,
// counted from its config (bytes read, FLOPs), and the ceilings the device reaches in the same
// process (copy bandwidth bounds a decode step, the bf16 GEMM rate bounds prefill). The
// measurements run on the current CUDA device, from the one thread that drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace specd::decode_bench {

// Median of `v`, 0 when it is empty: every timing the bench reports is a median of repeats.
double Median(std::vector<double> v);

// ---- What a step of the model costs, counted from its config (bf16 everywhere).

struct ModelCosts {
  int64_t layer_matmul_params = 0;  // projection weights every token goes through, all layers
  int64_t lm_head_params = 0;       // per row whose logits are computed
  int64_t step_weight_bytes = 0;    // one decode step at batch 1: every parameter it reads
  int64_t embedding_row_bytes = 0;  // one more per extra sequence of a batch (untied embedding)
  int64_t kv_bytes_per_token = 0;   // K and V of every layer
  int32_t sliding_window = 0;       // 0: every cached token is read
  int64_t attention_width = 0;      // num_layers * q_size: attention FLOPs = 4 * width * keys
};

ModelCosts CountCosts(const ModelConfig& c);

// Keys one query at `position` attends to.
int64_t KeysRead(const ModelCosts& costs, int64_t position);

// The roofline of a decode step: weights once, an embedding row and the KV of each sequence.
double RooflineMs(const ModelCosts& costs, int32_t batch, double keys_per_step, double bw);

// ---- Ceilings measured on the device.

struct Ceilings {
  double copy_bytes_per_s = 0;
  double gemm_flop_per_s = 0;
};

// Device-to-device cudaMemcpy of `bytes`, bytes read plus written per second; median of repeats.
double MeasureCopyBandwidth(size_t bytes, int32_t repeats);

// bf16 GEMM FLOP/s through kernels::Gemm at n x n x n on random data; median of repeats.
absl::StatusOr<double> MeasureGemmRate(int64_t n, int32_t repeats);

}  // namespace specd::decode_bench
