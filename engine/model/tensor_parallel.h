// One rank's slice of a model under tensor parallelism (Megatron / vLLM layout): query heads and
// their KV heads (column-parallel q/k/v), intermediate columns (column-parallel gate/up,
// row-parallel down), and vocabulary rows (vocabulary-parallel embedding and LM head). The CPU
// forward (engine/model) and the CUDA forward (engine/runner) both size and load their shards from
// it, so the two backends shard identically. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "engine/model/model_config.h"

namespace specd {

struct TpShard {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t num_heads = 0;      // query heads this rank holds
  int32_t head_begin = 0;     // global index of its first query head
  int32_t num_kv_heads = 0;   // KV heads this rank holds (replicated when N > num_kv_heads)
  int32_t kv_head_begin = 0;  // global index of its first KV head
  int64_t intermediate = 0;   // intermediate columns this rank holds
  int64_t intermediate_begin = 0;
  int64_t vocab_shard = 0;  // S = ceil(vocab / N): the stride of vocabulary shards
  int64_t vocab_begin = 0;  // rank * S
  int64_t vocab_local = 0;  // vocabulary rows this rank holds: clamp(vocab - begin, 0, S)

  int32_t q_size(int32_t head_dim) const { return num_heads * head_dim; }
  int32_t kv_size(int32_t head_dim) const { return num_kv_heads * head_dim; }
};

// The shard of `config` that rank tp.rank of tp.world_size holds. InvalidArgument naming the
// numbers when the shape does not divide: num_heads % N, num_kv_heads vs N (one must divide the
// other), intermediate_size % N; or when the rank is outside [0, N).
absl::StatusOr<TpShard> MakeTpShard(const ModelConfig& config, const TensorParallel& tp);

// The config a rank computes with: num_heads, num_kv_heads and intermediate_size are the rank's
// (vocab_size, hidden_size and head_dim unchanged).
ModelConfig LocalModelConfig(const ModelConfig& config, const TpShard& shard);

}  // namespace specd
