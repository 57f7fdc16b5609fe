// A loaded decoder-only transformer (Llama, Qwen2, Qwen3, Mistral) and its exact fp32 CPU
// forward pass over a paged KV cache. Forward runs a ragged batch: every sequence's new
// tokens (a prefill chunk, one decode token, or a run of speculative tokens to verify)
// share one activation matrix, so the projection GEMMs are shared; attention is per
// sequence over its block table. Numerics follow HF transformers' float32 path.
// Engine thread only: Forward uses the model's own thread pool and scratch buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/thread_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace specd {

struct LoadOptions {
  int num_threads = 0;  // 0 = all cores
};

struct SequenceInput {
  std::span<const int32_t> tokens;  // [num_new_tokens] new tokens to run
  int32_t start_pos = 0;  // position of tokens[0]; KV of [0, start_pos) is already in the cache
  std::span<const int32_t> block_table;  // block ids covering [0, start_pos + tokens.size())
  bool all_logits = false;  // logits for every new token (verification, goldens) or only the last
};

class Model {
 public:
  // Loads dir/config.json (+ generation_config.json) and the safetensors weights.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const LoadOptions& opts);

  const ModelConfig& config() const { return config_; }  // includes generation config
  KvCacheSpec MakeKvCacheSpec(int32_t num_blocks, int32_t block_size = 16) const;

  // Runs each sequence's new tokens, writes their K/V into kv, appends logits rows to
  // *logits: row-major [num_rows, vocab_size] f32, rows in sequence order (every new
  // token when all_logits, else only the last one per sequence). InvalidArgument for a
  // token id outside the vocabulary, a position past max_position_embeddings, a block
  // table too short or naming a block outside kv, or a kv not made for this model; nothing
  // is written then.
  absl::Status Forward(std::span<const SequenceInput> batch, CpuKvCache& kv,
                       std::vector<float>* logits);

 private:
  // Scratch activations of one Forward, reused across calls. T = new tokens in the batch.
  struct Workspace {
    std::vector<int32_t> tokens;        // [T]
    std::vector<int32_t> positions;     // [T]
    std::vector<int32_t> seq_of_token;  // [T]
    std::vector<int64_t> logit_rows;    // [num_rows] token indices whose logits are returned
    std::vector<std::span<const int32_t>> block_tables;  // [num_seqs]
    std::vector<float> x;                                // [T, hidden] residual stream
    std::vector<float> h;                                // [T, hidden] normed input of a sublayer
    std::vector<float> qkv;                              // [T, q_size + 2 * kv_size] projections
    std::vector<float> attn;                             // [T, q_size] attention output
    std::vector<float> proj;                             // [T, hidden] o_proj / down_proj output
    std::vector<float> gate_up;                          // [T, 2 * intermediate]
    std::vector<float> act;                              // [T, intermediate]
    std::vector<float> cos;                              // [T, head_dim / 2] RoPE
    std::vector<float> sin;                              // [T, head_dim / 2] RoPE
  };

  Model(ModelConfig config, ModelWeights weights, const LoadOptions& opts);

  absl::Status ValidateBatch(std::span<const SequenceInput> batch, const CpuKvCache& kv) const;
  void PlanBatch(std::span<const SequenceInput> batch);
  void Embed();
  void AttentionBlock(int32_t layer, CpuKvCache& kv);
  void QkNormAndRope(const LayerWeights& w);
  void MlpBlock(int32_t layer);
  void ComputeLogits(std::vector<float>* logits);

  ModelConfig config_;
  ModelWeights weights_;
  std::vector<float> inv_freq_;       // [head_dim / 2] f32 RoPE inverse frequencies
  std::unique_ptr<ThreadPool> pool_;  // attention of large batches
  Workspace ws_;
};

}  // namespace specd
