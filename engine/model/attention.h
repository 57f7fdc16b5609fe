// Causal GQA attention of a ragged batch over the paged KV cache (CPU, fp32): KV writes
// for the new tokens, then for every (new token, query head) a softmax over the keys of
// its sequence, optionally limited to a sliding window (Mistral: key j is visible to
// query i when i - window < j <= i). Engine thread; work fans out to the pool.
#pragma once

#include <cstdint>
#include <span>

#include "engine/base/thread_pool.h"
#include "engine/kv/kv_cache.h"

namespace specd {

struct AttentionShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t sliding_window = 0;  // 0: none
};

// Where each new token of the batch lives.
struct TokenLayout {
  std::span<const int32_t> positions;                      // [num_tokens]
  std::span<const int32_t> seq_of_token;                   // [num_tokens] index into tables
  std::span<const std::span<const int32_t>> block_tables;  // [num_seqs][num_blocks]
};

// Stores each new token's K and V at its position's (block, slot) in `layer`.
// k, v: [num_tokens, row_stride] f32, heads at columns [g * head_dim, (g + 1) * head_dim).
void WriteKv(const TokenLayout& layout, const float* k, const float* v, int64_t row_stride,
             int32_t layer, CpuKvCache& kv);

// out[t, h] = softmax(q[t, h] · K[seq(t), lo..pos(t)] / sqrt(head_dim)) · V[...].
// q: [num_tokens, q_stride] f32 (heads at columns [h * head_dim, ...));
// out: [num_tokens, num_heads * head_dim] f32. K/V of every attended position must be in
// the cache already (WriteKv first).
void PagedAttention(ThreadPool& pool, const AttentionShape& shape, const TokenLayout& layout,
                    const float* q, int64_t q_stride, const CpuKvCache& kv, int32_t layer,
                    float* out);

}  // namespace specd
