// The model's parameters in fp32 (bf16/f16 checkpoints are widened on load), laid out
// for the CPU forward: q/k/v fused into one projection and gate/up into another so each
// is a single GEMM. Immutable after LoadModelWeights; read from any thread.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace specd {

struct LayerWeights {
  std::vector<float> input_norm;  // [hidden] f32
  std::vector<float> qkv;         // [q_size + 2 * kv_size, hidden] f32 (rows: q, then k, then v)
  std::vector<float> qkv_bias;    // [q_size + 2 * kv_size] f32, empty without biases
  std::vector<float> q_norm;      // [head_dim] f32, Qwen3 only
  std::vector<float> k_norm;      // [head_dim] f32, Qwen3 only
  std::vector<float> o_proj;      // [hidden, q_size] f32
  std::vector<float> o_bias;      // [hidden] f32, empty without bias
  std::vector<float> post_norm;   // [hidden] f32
  std::vector<float> gate_up;     // [2 * intermediate, hidden] f32 (rows: gate, then up)
  std::vector<float> down;        // [hidden, intermediate] f32
};

struct ModelWeights {
  std::vector<float> embed;          // [vocab, hidden] f32
  std::vector<LayerWeights> layers;  // [num_layers]
  std::vector<float> final_norm;     // [hidden] f32
  std::vector<float> lm_head;        // [vocab, hidden] f32; empty when tied to embed
  bool tied = false;                 // lm_head is embed

  const std::vector<float>& output_matrix() const { return tied ? embed : lm_head; }
};

// Reads every tensor the config calls for, checking its shape. The output matrix is tied
// to the embedding when the config says so or when the checkpoint has no lm_head.weight.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const SafetensorsCheckpoint& checkpoint);

}  // namespace specd
