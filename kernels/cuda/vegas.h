// Vegas (verification-guided sparse self-speculation) launchers for the CUDA backend: the
// verification attention that also collects the scores the next round's KV selection needs, their
// reduction to head-averaged attention weights, the batched top-k selection by sparsity ratio, and
// the sparse drafting attention over a token-index list into the paged cache. References:
// kernels/ref/vegas.h; the algorithm: Vegas paper
// (../shared/papers/vegas-verification-guided-sparse-attention.txt). Any host thread; work is
// queued on `stream`, nothing allocates (scratch comes from the caller's workspace), and lengths,
// counts and indices are read on the device, so the launches replay from CUDA graphs.
//
// The KV cache layout, shapes, alignment rules and split-KV workspace are attention.h's.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention.h"

struct __nv_bfloat16;
struct __half;

namespace specd::kernels {

// Score rows per (sequence, collected query) of PagedVerifyAttentionWithScores: num_q_heads (one
// per q head, so each head's softmax can be taken before the heads are averaged).
int32_t VegasScoreParts(const AttentionShape& shape);

// Most splits a score-collecting verification may run: the length of each row's statistics.
inline constexpr int32_t kVegasScoreSplits = 32;

// PagedVerifyAttention (attention.h: same arguments, splits, workspace and output) that also
// collects, per sequence, what the next round's selection ranks by for two query rows -- query 0
// (the last committed token's row, which predicts the first draft) and query q_len - 1 (the bonus
// token's row), Vegas' "Collect-2-Query" -- over the scored prefix, the keys before the run:
// positions [0, seq_len - q_len). Per q head h of each collected row it writes the logits
// x = q.k * scale * log2(e) of every prefix key, rounded to fp16 (the paper stores bf16 logits;
// fp16 keeps 3 more bits and holds any real logit), and per split the softmax statistics of those
// rounded logits over the split's prefix keys: max and sum of exp2(x - max). So the head's
// softmax over the prefix needs no second pass over the keys (VegasPrefixWeights). Written in the
// same pass as the attention (no second read of the KV), deterministically (no atomics). What it
// adds to the pass: 2 * num_q_heads fp16 values per prefix key, under 4% of the 4 KB of KV per key
// of a Llama-3.1-8B layer.
//   logits        [num_seqs, 2, num_q_heads, score_stride] fp16, device, out: entries for keys
//                 [0, min(seq_len - q_len, score_stride)) of each row; the rest untouched
//   stats         [num_seqs, 2, num_q_heads, kVegasScoreSplits, 2] fp32, device, out: (max, sum)
//                 of each split; (-inf, 0) for a split with no scored key and for the splits from
//                 num_splits on
//   score_stride  >= the longest prefix to be scored; even
// Needs head_dim 16 to 128, sliding_window == 0, num_q_heads / num_kv_heads <= 16 and num_splits
// <= kVegasScoreSplits, logits 4-byte and stats 8-byte aligned, every run <= max_q_len;
// cudaErrorInvalidValue otherwise and as PagedVerifyAttention.
cudaError_t PagedVerifyAttentionWithScores(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* cu_q_lens, const int32_t* seq_lens, int32_t num_seqs, int64_t num_tokens,
    int32_t max_q_len, int32_t num_splits, const AttentionShape& shape, __nv_bfloat16* out,
    int64_t out_stride, __half* logits, float* stats, int64_t score_stride, void* workspace,
    size_t workspace_bytes, cudaStream_t stream);

// How many prefix tokens a selection keeps of n: clamp(ceil(ratio * n), min_tokens, max_tokens),
// at most n (the ceiling forgives a product 1e-9 relative above an integer, so 7% of 1000 is 70).
struct VegasBudget {
  double ratio = 0;        // in [0, 1]; the paper's 7%
  int32_t min_tokens = 0;  // the floor (the fork's default 256)
  int32_t max_tokens = 0;  // the cap; at most the index buffer's row (index_stride)
};

// Bytes of workspace VegasSelectTopK needs for num_pairs pairs of up to score_stride tokens
// (one fp32 combined score per token, rows padded to 16 bytes).
size_t VegasSelectWorkspaceBytes(int32_t num_pairs, int64_t score_stride);

// For many (sequence, layer) pairs in one launch: combine each pair's collected scores into one
// criticality per prefix token -- the mean of the two rows, each the sum of its num_parts parts
// (1 for VegasPrefixWeights' head-averaged weights; more for scores kept in parts) -- and keep the
// top k = the budget's count of the pair's n tokens, highest criticality first, ties to the lower
// index (scores compare in the float total order, -0 below +0). Pair p is sequence p % num_seqs of
// layer p / num_seqs. Two kernels: an elementwise combine over every pair, then one CTA per pair
// radix-selecting 8 bits a pass (vegas_select.cuh), for any n up to score_stride (128K tokens and
// more).
//   scores     [num_pairs, 2, num_parts, score_stride] fp32, device, in
//   lengths    [num_seqs] int32, device, in: n, the prefix length of each sequence (clipped to
//              [0, score_stride])
//   indices    [num_pairs, index_stride] int32, device, out: the kept tokens, ascending; entries
//              past the count untouched
//   counts     [num_pairs] int32, device, out: how many were kept
//   workspace  >= VegasSelectWorkspaceBytes(num_pairs, score_stride) bytes, device, 16-byte aligned
//   out_rows   optional, [num_seqs] int32, device: where each sequence's pairs go in a table of
//              out_rows_per_layer rows per layer (a runner's selections kept per sequence slot):
//              pair p's row of `indices` and `counts` is (p / num_seqs) * out_rows_per_layer +
//              out_rows[p % num_seqs]; a negative entry: that sequence's pairs write nothing (a
//              launch per budget when sequences differ). Null: row p.
// cudaErrorInvalidValue for a null or misaligned pointer, num_parts < 1, ratio outside [0, 1],
// min_tokens < 0, max_tokens < min_tokens or > index_stride, num_pairs > 65535, out_rows with
// out_rows_per_layer < 1, a workspace too small; num_pairs == 0 launches nothing.
cudaError_t VegasSelectTopK(const float* scores, int32_t num_parts, int64_t score_stride,
                            const int32_t* lengths, int32_t num_seqs, int32_t num_pairs,
                            const VegasBudget& budget, int32_t* indices, int64_t index_stride,
                            int32_t* counts, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, const int32_t* out_rows = nullptr,
                            int64_t out_rows_per_layer = 0);

// Most heads VegasPrefixWeights averages (their log-sum-exps sit in shared memory).
inline constexpr int32_t kVegasMaxWeightHeads = 128;

// For many (sequence, layer) pairs in one launch: turn PagedVerifyAttentionWithScores' logits and
// split statistics into the head-averaged prefix weights the selection ranks by, as the CPU Model
// computes them from its own scores (kernels/ref/vegas.h's HeadAveragedPrefixWeights): for each
// row of a pair and its prefix length n, weights[t] = mean over heads h of 2^(x_ht - lse_h), lse_h
// the log2-sum-exp of head h's stored logits over [0, n) from its split statistics, for t < n. A
// head with no finite statistic adds 0 to the mean. Pair p is sequence p % num_seqs of layer
// p / num_seqs, as in VegasSelectTopK. One kernel reading each logit once: one CTA per (pair,
// row, 1024 tokens) combines the heads' statistics, then sums the heads in head order
// (deterministic).
//   logits     [num_pairs, 2, num_heads, score_stride] fp16, device, in (entries [0, n) read)
//   stats      [num_pairs, 2, num_heads, kVegasScoreSplits, 2] fp32, device, in
//   num_heads  1 to kVegasMaxWeightHeads
//   lengths    [num_seqs] int32, device, in: n, the prefix length of each sequence (clipped to
//              [0, score_stride]); the same prefixes the statistics were taken over
//   weights    [num_pairs, 2, score_stride] fp32, device, out: entries [0, n) of each row; the
//              rest untouched
// cudaErrorInvalidValue for a null or misaligned pointer (logits 8-byte aligned with score_stride a
// multiple of 4, stats 8-byte, weights 16-byte aligned), num_heads outside [1, 128], num_seqs < 1,
// num_pairs outside [0, 65535], score_stride outside [0, INT_MAX]; num_pairs == 0 or
// score_stride == 0 launches nothing.
cudaError_t VegasPrefixWeights(const __half* logits, const float* stats, int32_t num_heads,
                               int64_t score_stride, const int32_t* lengths, int32_t num_seqs,
                               int32_t num_pairs, float* weights, cudaStream_t stream);

// Sparse drafting attention: PagedVerifyAttention's contract (queries, runs of up to
// kMaxVerifyQueryLen, GQA folding, split-KV with its workspace and combine) except that sequence
// s attends only to the tokens token_indices[s][0 .. index_counts[s]) and every token from
// recent_starts[s] on (causally: a query sees recent tokens up to its own position). K and V are
// read in place through the block tables (no copy). The split count and workspace are those of
// PagedVerifyAttention over a context of the longest key count (count + seq_len - recent_start):
// ChooseVerifySplits(num_seqs, max_q_len, that, num_sms, shape) and PagedVerifyWorkspaceBytes.
//   token_indices  [num_seqs, index_stride] int32, device, in: strictly ascending positions below
//                  recent_starts[s] (VegasSelectTopK's output for the layer)
//   index_counts   [num_seqs] int32, device, in (clipped to [0, index_stride])
//   recent_starts  [num_seqs] int32, device, in: <= the run's first query position
//   index_rows     optional, [num_seqs] int32, device: sequence s reads row index_rows[s] of
//                  token_indices and index_counts (a runner's selections kept per sequence slot,
//                  VegasSelectTopK's out_rows); null: row s
// Needs sliding_window == 0; cudaErrorInvalidValue otherwise, for a null list, and as
// PagedVerifyAttention.
cudaError_t PagedSparseAttention(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* cu_q_lens, const int32_t* seq_lens, const int32_t* token_indices,
    int64_t index_stride, const int32_t* index_counts, const int32_t* recent_starts,
    int32_t num_seqs, int64_t num_tokens, int32_t max_q_len, int32_t num_splits,
    const AttentionShape& shape, __nv_bfloat16* out, int64_t out_stride, void* workspace,
    size_t workspace_bytes, cudaStream_t stream, const int32_t* index_rows = nullptr);

// PagedSparseAttention for one query per sequence (a draft step's chunks; cu_q_lens is
// implicit): the split-KV decode kernel (PagedDecodeAttention's grid, workspace and combine:
// num_splits from ChooseDecodeSplits over the longest key count, count + seq_len -
// recent_start, and PagedDecodeWorkspaceBytes) reading each key's K and V row through its token
// and block (vegas_decode.cuh), instead of the verification kernel's 16-row tiles, of which a
// GQA group of 4 would fill a quarter. Query s is at position seq_lens[s] - 1; sequence s
// attends token_indices[row][0 .. index_counts[row]) and every token from recent_starts[s] up to
// its query, row = index_rows ? index_rows[s] : s. Needs head_dim 16 to 128 and
// sliding_window == 0; cudaErrorInvalidValue otherwise and as PagedDecodeAttention.
cudaError_t PagedSparseDecodeAttention(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* seq_lens, const int32_t* token_indices, int64_t index_stride,
    const int32_t* index_counts, const int32_t* recent_starts, const int32_t* index_rows,
    int32_t num_seqs, int32_t num_splits, const AttentionShape& shape, __nv_bfloat16* out,
    int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace specd::kernels
