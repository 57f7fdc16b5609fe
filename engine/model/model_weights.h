// The model's parameters in fp32 (bf16/f16 checkpoints are widened on load), laid out
// for the CPU forward: q/k/v (and NSA's gate logits) fused into one projection and gate/up into
// another so each is a single GEMM. Tensor names follow the family (transformers', or fla's for
// NSA: model.embeddings, attn_norm, attn.*, mlp_norm). Under tensor parallelism a rank holds only
// its shard (TpShard): its heads' rows of q/k/v, their columns of o_proj, its intermediate rows of
// gate/up and columns of down, its vocabulary rows of the embedding and LM head; norms are
// replicated. Shapes below use the rank's sizes (LocalModelConfig; the whole model when world_size
// is 1). Immutable after LoadModelWeights; read from any thread.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_parallel.h"

namespace specd {

struct LayerWeights {
  std::vector<float> input_norm;  // [hidden] f32
  std::vector<float> qkv;         // [q_size + 2 * kv_size + gate_size, hidden] f32: q, k, v, gates
  std::vector<float> qkv_bias;    // [q_size + 2 * kv_size] f32, empty without biases
  std::vector<float> q_norm;      // [head_dim] f32, Qwen3 only
  std::vector<float> k_norm;      // [head_dim] f32, Qwen3 only
  std::vector<float> o_proj;      // [hidden, q_size] f32
  std::vector<float> o_bias;      // [hidden] f32, empty without bias and on ranks other than 0
  std::vector<float> post_norm;   // [hidden] f32
  std::vector<float> gate_up;     // [2 * intermediate, hidden] f32 (rows: gate, then up)
  std::vector<float> down;        // [hidden, intermediate] f32
};

struct ModelWeights {
  std::vector<float> embed;          // [vocab_local, hidden] f32: rows [vocab_begin, +vocab_local)
  std::vector<LayerWeights> layers;  // [num_layers]
  std::vector<float> final_norm;     // [hidden] f32
  std::vector<float> lm_head;        // [vocab_local, hidden] f32; empty when tied to embed
  bool tied = false;                 // lm_head is embed

  const std::vector<float>& output_matrix() const { return tied ? embed : lm_head; }
};

// Reads the slices of every tensor the config calls for that `shard` holds, checking each
// tensor's full shape (config is the whole model's). The output matrix is tied to the embedding
// when the config says so or when the checkpoint has no lm_head.weight. A world of one rank
// (MakeTpShard with world_size 1) reads every tensor whole.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              const SafetensorsCheckpoint& checkpoint,
                                              const TpShard& shard);

}  // namespace specd
