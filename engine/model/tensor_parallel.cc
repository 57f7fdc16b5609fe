#include "engine/model/tensor_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<TpShard> MakeTpShard(const ModelConfig& config, const TensorParallel& tp) {
  const int32_t n = tp.world_size;
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", n, " < 1"));
  if (tp.rank < 0 || tp.rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", tp.rank, " outside [0, ", n, ")"));
  }
  if (config.num_heads % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel size ", n, " does not divide the ", config.num_heads, " attention heads"));
  }
  if (config.num_kv_heads % n != 0 && n % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel size ", n, " and the ", config.num_kv_heads,
        " KV heads: one must divide the other (KV heads are split, or replicated when fewer)"));
  }
  if (config.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", n,
                                                   " does not divide intermediate_size ",
                                                   config.intermediate_size));
  }
  TpShard s;
  s.rank = tp.rank;
  s.world_size = n;
  s.num_heads = config.num_heads / n;
  s.head_begin = tp.rank * s.num_heads;
  if (config.num_kv_heads % n == 0) {
    s.num_kv_heads = config.num_kv_heads / n;
    s.kv_head_begin = tp.rank * s.num_kv_heads;
  } else {  // fewer KV heads than ranks: each is replicated on n / num_kv_heads ranks
    s.num_kv_heads = 1;
    s.kv_head_begin = tp.rank / (n / config.num_kv_heads);
  }
  s.intermediate = config.intermediate_size / n;
  s.intermediate_begin = tp.rank * s.intermediate;
  const int64_t vocab = config.vocab_size;
  s.vocab_shard = (vocab + n - 1) / n;
  s.vocab_begin = tp.rank * s.vocab_shard;
  s.vocab_local = std::clamp<int64_t>(vocab - s.vocab_begin, 0, s.vocab_shard);
  return s;
}

ModelConfig LocalModelConfig(const ModelConfig& config, const TpShard& shard) {
  ModelConfig local = config;
  local.num_heads = shard.num_heads;
  local.num_kv_heads = shard.num_kv_heads;
  local.intermediate_size = static_cast<int32_t>(shard.intermediate);
  return local;
}

}  // namespace specd
