// Causal GQA attention of a ragged batch over the paged KV cache (CPU, fp32): KV writes
// for the new tokens, then for every (new token, query head) a softmax over the keys of
// its sequence, optionally limited to a sliding window (Mistral: key j is visible to
// query i when i - window < j <= i). Vegas options per sequence: sparse attention over a
// token-index list plus the recent tokens, and capture of the raw scores of chosen query rows.
// Engine thread; work fans out to the pool.
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
  // Token trees (engine/model/token_tree.h): each token's KV slot (empty: its position), and
  // for a tree token the keys it attends: the prefix [0, tree_prefix[t]) and the slots
  // tree_keys[t] (its ancestors and itself, ascending; a key's position is tree_prefix[t] plus
  // its index there). tree_prefix[t] < 0, or both empty: causal.
  std::span<const int32_t> slots = {};                       // [num_tokens] or empty
  std::span<const int32_t> tree_prefix = {};                 // [num_tokens] or empty
  std::span<const std::span<const int32_t>> tree_keys = {};  // [num_tokens] or empty
  int32_t slot(size_t t) const { return slots.empty() ? positions[t] : slots[t]; }
  bool is_tree(size_t t) const { return !tree_prefix.empty() && tree_prefix[t] >= 0; }
};

// One sequence's keys under sparse attention (Vegas drafting): `indices` (strictly ascending,
// below recent_start) and every position from recent_start up to the query's own. recent_start
// < 0: dense.
struct SparseKeys {
  std::span<const int32_t> indices;
  int32_t recent_start = -1;
};

// Raw-score capture: for each token t with slot_of_token[t] >= 0, every head's q.k * scale over
// the keys [0, prefix[slot]) is written to out[(slot * num_heads + h) * stride + key]; keys the
// token does not attend (outside its window) are left as they were.
struct ScoreCapture {
  std::span<const int32_t> slot_of_token;  // [num_tokens]
  std::span<const int32_t> prefix;         // [num_slots]
  float* out = nullptr;                    // [num_slots, num_heads, stride] f32
  int64_t stride = 0;
};

// Stores each new token's K and V at its slot's (block, offset) in `layer`.
// k, v: [num_tokens, row_stride] f32, heads at columns [g * head_dim, (g + 1) * head_dim).
void WriteKv(const TokenLayout& layout, const float* k, const float* v, int64_t row_stride,
             int32_t layer, CpuKvCache& kv);

// out[t, h] = softmax(q[t, h] · K[seq(t), lo..pos(t)] / sqrt(head_dim)) · V[...]; a tree token
// attends its tree's keys instead (TokenLayout), under the same window rule by position.
// q: [num_tokens, q_stride] f32 (heads at columns [h * head_dim, ...));
// out: [num_tokens, num_heads * head_dim] f32. K/V of every attended position must be in
// the cache already (WriteKv first). sparse: [num_seqs] or empty (all dense); capture: null or
// as ScoreCapture says (dense sequences only).
void PagedAttention(ThreadPool& pool, const AttentionShape& shape, const TokenLayout& layout,
                    const float* q, int64_t q_stride, const CpuKvCache& kv, int32_t layer,
                    float* out, std::span<const SparseKeys> sparse = {},
                    const ScoreCapture* capture = nullptr);

}  // namespace specd
