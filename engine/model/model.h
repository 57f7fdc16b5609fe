// A loaded decoder-only transformer (Llama, Qwen2, Qwen3, Mistral, NSA) and its exact fp32 CPU
// forward pass over a paged KV cache. The families share the layer skeleton (norms, projections,
// RoPE, MLP); NSA's attention is its own piece (engine/model/nsa_attention.h). Forward runs a
// ragged batch: every sequence's new tokens (a prefill chunk, one decode token, or a run of
// speculative tokens to verify) share one activation matrix, so the projection GEMMs are shared;
// attention is per sequence over its block table. Numerics follow HF transformers' float32 path.
// Under tensor parallelism (LoadOptions::tp) each rank's Model holds its shard (TpShard) and
// computes with the rank's heads and intermediate columns, all-reducing after the embedding,
// o_proj and down_proj and gathering the vocabulary-parallel logits, so every rank's Forward
// returns the full logits; all ranks must call Forward with the same batch.
// Engine thread only: Forward uses the model's own thread pool and scratch buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "engine/base/thread_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/attention.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/nsa_attention.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/token_tree.h"

namespace specd {

struct LoadOptions {
  int num_threads = 0;  // 0 = all cores
  // Tensor parallelism: the shard this process holds (heads, intermediate columns, vocabulary
  // rows) and the group's collectives (host memory; not owned, outlives the model). world_size 1
  // needs no communicator.
  TensorParallel tp;
  Communicator* comm = nullptr;
};

// Per-chunk attention options (Vegas self-speculation; the CPU Model, and the CUDA runner for
// chunks of up to 16 tokens on one rank; TP refuses them). Either (a) score collection on a dense
// chunk: per layer, the attention weights of the chunk's first and last query rows over the
// prefix [0, start_pos) -- each head's softmax of q.k / sqrt(head_dim) over the prefix alone,
// averaged over all query heads (HeadAveragedPrefixWeights; a key outside a sliding window
// weighs 0); or (b) sparse attention: in layer l each query sees only the positions
// layer_indices[l] and every position in [recent_start, its own], still under the causal (and
// window) rule. Not both on one chunk. Caller-owned; outlives the Forward call.
// Runners that keep selections on their device (ModelRunner::num_sparse_slots() > 0: the CUDA
// runner) also take (a') and (b') with a selection slot in place of the host's arrays, so no
// scores come to the host and no lists go to the device: (a') `select_slot` on a scoring chunk:
// per layer the top k = SelectBudget's count of the start_pos prefix tokens by those weights
// (kernels/ref/vegas.h VegasSelectTopK, as the speculator selects on the host) go into the slot,
// replacing what it held; (b') `slot` on a sparse chunk: layer l attends the slot's layer-l list
// (`slot_count` tokens, what the last select into it kept) and every position from recent_start
// on. The CPU Model refuses both.
struct SelectBudget {
  double ratio = 0;        // in [0, 1]
  int32_t min_tokens = 0;  // the floor
  int32_t max_tokens = 0;  // the cap; 0: none
};
struct ChunkAttention {
  std::span<float> scores;  // (a) [num_layers, 2, start_pos] f32, out; empty: none collected
  // (b) [num_layers][count] strictly ascending positions in [0, recent_start); empty: dense.
  // Layers may share one list (StreamingLLM's sinks).
  std::span<const std::span<const int32_t>> layer_indices;
  int32_t recent_start = 0;  // (b), (b') in [0, start_pos]: every key from here on is attended
  int32_t select_slot = -1;  // (a') the slot the selection goes to; -1: none
  SelectBudget select_budget{};
  int32_t slot = -1;       // (b') the slot attended; -1: none
  int32_t slot_count = 0;  // (b') tokens per layer in it
  bool sparse() const { return !layer_indices.empty(); }
  bool slot_sparse() const { return slot >= 0; }
  bool collects() const { return !scores.empty() || select_slot >= 0; }
};

// Vegas' criticality of the n prefix keys seen by a query row: each head's softmax over the keys
// [0, n) of its raw scores (to_raw times the stored: q.k / sqrt(head_dim)), averaged over the heads
// (Model::ReduceScores says why); the CUDA runner's kernel is tested against it (kernels/ref).
//   scores  [heads, stride] f32 (keys past n ignored; -inf: masked)
//   out     [n] f32
void HeadAveragedPrefixWeights(const float* scores, int64_t heads, int64_t stride, int64_t n,
                               float to_raw, float* out);

struct SequenceInput {
  std::span<const int32_t> tokens;  // [num_new_tokens] new tokens to run
  int32_t start_pos = 0;  // position of tokens[0]; KV of [0, start_pos) is already in the cache
  std::span<const int32_t> block_table;  // block ids covering [0, start_pos + tokens.size())
  bool all_logits = false;  // logits for every new token (verification, goldens) or only the last
  // The engine's id of the sequence, or -1. Only tensor parallelism reads it: rank 0 sends a
  // worker just the block ids its mirror of this sequence's table lacks.
  int64_t seq_id = -1;
  const ChunkAttention* attention = nullptr;  // null: dense, nothing collected
  // NSA models only, for a verification chunk: how its queries choose and load their selected
  // blocks (engine/base/ssv.h). Null: every query its own, every layer (the model's attention).
  // Caller-owned; outlives the Forward call.
  const SsvStrategy* ssv = nullptr;
  // A token tree (engine/model/token_tree.h): the chunk's tokens are the tree's nodes in slots
  // [start_pos, start_pos + tokens.size()), tree->parents covering [tree->start, start_pos +
  // tokens.size()) (tree->start <= start_pos: nodes below start_pos were written by earlier
  // passes). Each token is at position tree->start + its depth and attends the prefix
  // [0, tree->start) and its ancestors. Dense models without attention options or SSV only.
  // Null: causal. Caller-owned; outlives the Forward call.
  const TokenTree* tree = nullptr;
};

class Model {
 public:
  // Loads dir/config.json (+ generation_config.json) and the safetensors weights (the shard of
  // opts.tp: InvalidArgument naming the numbers when the model does not divide, or when
  // world_size > 1 without a host communicator of that rank and size; NSA models run at
  // world_size 1 only).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const LoadOptions& opts);

  const ModelConfig& config() const { return config_; }  // includes generation config
  const TpShard& shard() const { return shard_; }        // what this rank holds
  // NSA models: their attention, whose LastTokenSelection tells the blocks the last Forward
  // selected. Null for the other families.
  const NsaAttention* nsa() const { return nsa_.get(); }
  // The cache of this rank's KV heads.
  KvCacheSpec MakeKvCacheSpec(int32_t num_blocks, int32_t block_size = 16) const;

  // Runs each sequence's new tokens, writes their K/V into kv, appends logits rows to
  // *logits: row-major [num_rows, vocab_size] f32, rows in sequence order (every new
  // token when all_logits, else only the last one per sequence). InvalidArgument for a
  // token id outside the vocabulary, a position past max_position_embeddings, a block
  // table too short or naming a block outside kv, or a kv not made for this model; nothing
  // is written then. Under tensor parallelism a collective's error (Unavailable when a peer
  // failed) is returned, with this step's KV partly written.
  // vocab_merge_k > 0 (tensor parallelism, runner::VocabMergeK): the ranks exchange their
  // shards' k best logits per row instead of the shards, and the rows hold the global k best
  // and -inf elsewhere (the same argmax and top k). Every rank must pass the same value.
  absl::Status Forward(std::span<const SequenceInput> batch, CpuKvCache& kv,
                       std::vector<float>* logits, int32_t vocab_merge_k = 0);

  // EAGLE-3 heads read the target's residual stream at a few layers (engine/model/eagle3_head.h).
  // After SetAuxHiddenLayers(ids), every Forward also keeps, for each new token of the batch (in
  // batch order), the residual stream at the input of layer ids[i] (vLLM's convention: id 0 is the
  // embedding output, id j the output of layer j - 1), concatenated in the order of `ids`:
  // aux_hidden() is [num_new_tokens, ids.size() * hidden] f32. The stream is whole on every rank
  // (tensor parallelism all-reduces it), so rank 0 alone needs to keep it. Empty `ids`: nothing
  // is kept; an id may repeat (vLLM's default ids do for shallow targets). InvalidArgument for
  // an id outside [0, num_layers).
  absl::Status SetAuxHiddenLayers(std::span<const int32_t> ids);
  std::span<const float> aux_hidden() const { return aux_; }

 private:
  // Scratch activations of one Forward, reused across calls. T = new tokens in the batch.
  struct Workspace {
    std::vector<int32_t> tokens;        // [T]
    std::vector<int32_t> positions;     // [T]
    std::vector<int32_t> seq_of_token;  // [T]
    std::vector<int64_t> logit_rows;    // [num_rows] token indices whose logits are returned
    std::vector<std::span<const int32_t>> block_tables;  // [num_seqs]
    // Token trees (empty when no chunk has one): TokenLayout's slots, tree_prefix, tree_keys.
    std::vector<int32_t> slots;                       // [T]
    std::vector<int32_t> tree_prefix;                 // [T]
    std::vector<int32_t> tree_key_data;               // every tree token's keys, concatenated
    std::vector<std::span<const int32_t>> tree_keys;  // [T] into tree_key_data
    std::vector<int32_t> depths;                      // scratch: one tree's node depths
    std::vector<int32_t> path;                        // scratch: one node's path
    std::vector<float> x;                             // [T, hidden] residual stream
    std::vector<float> h;                             // [T, hidden] normed input of a sublayer
    std::vector<float> qkv;                           // [T, qkv_stride()] q, k, v, NSA gates
    std::vector<float> attn;                          // [T, q_size] attention output
    std::vector<float> proj;                          // [T, hidden] o_proj / down_proj output
    std::vector<float> gate_up;                       // [T, 2 * intermediate]
    std::vector<float> act;                           // [T, intermediate]
    std::vector<float> cos;                           // [T, head_dim / 2] RoPE
    std::vector<float> sin;                           // [T, head_dim / 2] RoPE
    // Tensor parallelism only: [world_size, num_rows, vocab_shard] every rank's LM-head columns.
    std::vector<float> gathered;
    std::vector<int32_t> pairs;  // [world, rows, k, 2] vocabulary-merge candidates
    // Vegas (ChunkAttention), planned once per Forward: the batch's options per sequence, the
    // sparse keys of the current layer, and the scored rows (first and last query of each
    // scored chunk; one row when the chunk has one token).
    std::vector<const ChunkAttention*> attention;  // [num_seqs] null: dense
    bool any_sparse = false;
    std::vector<SparseKeys> sparse;      // [num_seqs] this layer's
    std::vector<int32_t> slot_of_token;  // [T] capture slot, or -1
    std::vector<int32_t> slot_seq;       // [num_slots] its sequence
    std::vector<int32_t> slot_prefix;    // [num_slots] keys captured: [0, start_pos)
    int64_t capture_stride = 0;          // longest prefix among the slots
    std::vector<float> capture;          // [num_slots, num_heads, capture_stride] raw scores
    // NSA: each sequence's SSV strategy (empty when no sequence of the batch has one).
    std::vector<const SsvStrategy*> ssv;
  };

  Model(ModelConfig config, ModelWeights weights, const LoadOptions& opts, const TpShard& shard);

  absl::Status ValidateBatch(std::span<const SequenceInput> batch, const CpuKvCache& kv) const;
  absl::Status ValidateAttention(size_t s, const SequenceInput& seq) const;
  absl::Status ValidateTree(size_t s, const SequenceInput& seq) const;
  void PlanBatch(std::span<const SequenceInput> batch);
  void PlanAttentionOptions(std::span<const SequenceInput> batch);
  absl::Status Embed();
  absl::Status AttentionBlock(int32_t layer, CpuKvCache& kv);
  // The attention of the family: dense (with Vegas' options) or NSA, ws_.qkv -> ws_.attn.
  void Attend(int32_t layer, const TokenLayout& layout, CpuKvCache& kv);
  int64_t qkv_stride() const {
    return int64_t{local_.q_size()} + 2 * local_.kv_size() + local_.gate_size();
  }
  // Chunks' attention options (ChunkAttention) resolved to `layer` (ws_.sparse, ws_.capture).
  void PlanLayerAttention(int32_t layer);
  // Head averages of the captured rows into the chunks' score buffers (layer `layer`).
  void ReduceScores(int32_t layer);
  void QkNormAndRope(const LayerWeights& w);
  absl::Status MlpBlock(int32_t layer);
  absl::Status ComputeLogits(std::vector<float>* logits, int32_t vocab_merge_k);
  // Tensor parallelism: the rank's LM-head columns, gathered and laid out as full rows, or
  // merged by their k best (vocab_merge_k > 0).
  absl::Status ComputeShardedLogits(int64_t rows, std::vector<float>* logits,
                                    int32_t vocab_merge_k);
  // Sums `data` ([count] f32) over the ranks; nothing in a world of one.
  absl::Status SumOverRanks(float* data, int64_t count);

  ModelConfig config_;  // the whole model's
  ModelConfig local_;   // the sizes this rank computes with (LocalModelConfig); config_ at TP 1
  TpShard shard_;
  Communicator* comm_ = nullptr;  // null in a world of one
  ModelWeights weights_;
  std::vector<float> inv_freq_;        // [head_dim / 2] f32 RoPE inverse frequencies
  std::unique_ptr<ThreadPool> pool_;   // attention of large batches
  std::unique_ptr<NsaAttention> nsa_;  // NSA models only
  Workspace ws_;
  // EAGLE-3's capture (SetAuxHiddenLayers): the layer ids, whether each layer is captured, and
  // the last Forward's rows [T, num_aux * hidden].
  std::vector<int32_t> aux_ids_;
  std::vector<bool> aux_layer_;  // [num_layers]
  int32_t num_aux_ = 0;
  std::vector<float> aux_;
  // Copies the residual stream into every slot of the captured rows that names `layer`.
  void CaptureAux(int32_t layer);
};

}  // namespace specd
