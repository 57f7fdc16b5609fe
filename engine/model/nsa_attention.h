// Native Sparse Attention (NSA; fla >= 0.5.2 semantics, shared/models/nsa-codepair/PROVENANCE.md)
// of a ragged batch over the paged KV cache, CPU fp32: the exact oracle of the NSA family. For a
// query at position p (own block i = p / B, B = block_size) and each query head, three branches
// over the RoPE'd keys, each with one softmax scaled by head_dim^-1/2:
//   compressed: the means of each complete block's keys and values (block c is visible iff
//     (c + 1) * B - 1 <= p; no output while none is);
//   selected:   per KV head, block scores = the compressed probabilities summed over its query
//     heads, blocks {0, i - 1, i} forced with a score of one per head, the top S of the
//     candidates c <= i (all of them while i < S); every key j <= p of the selected blocks;
//   window:     the keys p - window_size + 1 .. p;
// mixed by independent sigmoid gates: o = g_slc * o_slc + g_cmp * o_cmp + g_swa * o_swa.
// The compressed blocks live in the paged cache (KvCacheSpec::compressed_block_size, a Model's
// cache): a block's means are computed once, by the pass that writes its last position, and kept
// in the page holding that position, so prefix-cache reuse and preemption carry them with the
// page and a rewritten position (a rejected draft) recomputes its block when the block's end is
// written again; decode reads a block's means instead of its keys. A cache without them (tests
// that fill K/V directly) has every complete block recomputed from the paged KV on every call.
// A sequence's chunk may carry an SSV strategy (engine/base/ssv.h): its queries then attend the
// selections the strategy names, and what they read is counted (ssv_stats). Each Run goes in two
// phases over the tokens: the compressed branch and every query's own selection, then the
// selected and window branches over the selection each query attends.
// Engine thread; work fans out to the pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/base/ssv.h"
#include "engine/base/thread_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/attention.h"
#include "engine/model/model_config.h"

namespace specd {

struct NsaShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  NsaConfig nsa;
};

class NsaAttention {
 public:
  NsaAttention(const NsaShape& shape, int32_t num_layers);

  // out[t, h] = the gated sum of the three branches for query head h of token t.
  // q: [num_tokens, q_stride] f32, heads at columns [h * head_dim, ...), RoPE applied;
  // gate_logits: [num_tokens, gate_stride] f32, column 3 * h + j = branch j (0 compressed,
  // 1 selected, 2 window) of head h, before the sigmoid;
  // out: [num_tokens, num_heads * head_dim] f32. K/V (RoPE'd keys) of every position up to each
  // token's own must be in the cache already (WriteKv first).
  // ssv: empty, or [num_seqs] each sequence's strategy (null: the model's own attention). A
  // sequence's tokens must be contiguous in the layout, in position order (Model::Forward's).
  // Reuse layers read what the last refresh layer kept: run the layers of one batch in order.
  void Run(ThreadPool& pool, const TokenLayout& layout, const float* q, int64_t q_stride,
           const float* gate_logits, int64_t gate_stride, CpuKvCache& kv, int32_t layer, float* out,
           std::span<const SsvStrategy* const> ssv = {});

  // The blocks KV head `kv_head` selected for the last token of the batch of the last Run of
  // `layer`, ascending ([<= block_counts] block indices); empty before any Run. For tests and
  // selection metrics.
  std::span<const int32_t> LastTokenSelection(int32_t layer, int32_t kv_head) const;
  // How near the last Run of `layer` came to a different selection: over every query and KV head
  // of the batch, the smallest gap between the S-th best candidate block's score and the next one's
  // (scores are probabilities summed over a KV head's query heads, at most `group`); +inf when no
  // query had more candidates than S. Another precision (a GPU's bf16) may select differently
  // where this is small. For tests.
  float LastRunSelectionMargin(int32_t layer) const;

  // Running totals over the chunks that ran with a strategy.
  const SsvLoadStats& ssv_stats() const { return ssv_stats_; }

 private:
  struct Task;
  // Means of each sequence's complete blocks up to its last new token (into cmp_): those the
  // pass completes computed (and kept in the cache's compressed entries), the others read there.
  void Compress(const TokenLayout& layout, CpuKvCache& kv, int32_t layer);
  // The mean key then value of block c of a sequence ([num_kv_heads, 2, head_dim] into `mean`,
  // zeroed by the caller).
  void MeanOfBlock(std::span<const int32_t> table, const CpuKvCache& kv, int32_t layer, int32_t c,
                   float* mean) const;
  void AttendCompressed(const float* q, const std::vector<float>& cmp, int32_t num_visible,
                        int32_t own_block, int32_t kv_head, Task& task) const;
  void AttendPositions(const float* q, std::span<const int32_t> table, const CpuKvCache& kv,
                       int32_t layer, int32_t kv_head, Task& task, float* out) const;
  // Phase 1 of token t: its compressed branch (into cmp_out_) and own selections (own_).
  void SelectToken(int64_t t, const TokenLayout& layout, const float* q, int64_t q_stride,
                   Task& task);
  // Which selection each query attends (effective_), and the strategies' load counts.
  void ResolveSelections(const TokenLayout& layout, std::span<const SsvStrategy* const> ssv,
                         int32_t layer);
  // Overlap of adjacent queries' own selections: on the strategy's refresh layers only.
  void CountLoads(const TokenLayout& layout, std::span<const SsvStrategy* const> ssv,
                  int32_t layer);
  // Phase 2 of token t: the selected and window branches, and the gated sum into out.
  void AttendToken(int64_t t, const TokenLayout& layout, const float* q, int64_t q_stride,
                   const float* gate_logits, int64_t gate_stride, const CpuKvCache& kv,
                   int32_t layer, float* out, Task& scratch) const;

  NsaShape shape_;
  float scale_;  // head_dim^-1/2
  // Per sequence of the current Run: [num_complete_blocks, num_kv_heads, 2, head_dim] f32, the
  // mean key then the mean value of each block and KV head.
  std::vector<std::vector<float>> cmp_;
  std::vector<int32_t> seq_begin_;  // [num_seqs] first position of each sequence's new tokens
  std::vector<int32_t> seq_end_;    // [num_seqs] last position of each sequence's new tokens
  // [num_layers][num_kv_heads][<= block_counts] the last token's selection per layer.
  std::vector<std::vector<std::vector<int32_t>>> last_selection_;
  std::vector<float> last_margin_;   // [num_layers] LastRunSelectionMargin
  std::vector<float> token_margin_;  // [T] per token of the current Run: its smallest margin
  // Per token of the current Run: [T, num_heads, head_dim] f32 the compressed branch; [T *
  // num_kv_heads] its own selection, the one it attends (into own_ or kept_), and, for tokens
  // of a sequence with a strategy, the selection of the last refresh layer.
  std::vector<float> cmp_out_;
  std::vector<std::vector<int32_t>> own_;
  std::vector<const std::vector<int32_t>*> effective_;
  std::vector<std::vector<int32_t>> kept_;
  std::vector<int32_t> first_token_;  // [num_seqs] each sequence's first token in the layout
  SsvLoadStats ssv_stats_;
};

// The blocks selected from `scores` ([own_block + 1] f32: the summed compressed probabilities of
// blocks 0 .. own_block, zero where a block is not yet complete) for a query in `own_block` with
// `group` query heads per KV head: {0, own_block - 1, own_block} forced with score `group`, then
// the top `count` by score (ties to the lower index), ascending. Writes scores' forced entries.
// `margin`, when given, gets the gap between the count-th and the (count + 1)-th best score
// (from the same ordering; +inf with no more than `count` candidates): how near a tie the
// selection is.
std::vector<int32_t> NsaSelectBlocks(std::span<float> scores, int32_t own_block, int32_t group,
                                     int32_t count, float* margin = nullptr);

}  // namespace specd
