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

namespace specd::kernels {

// Parts per (sequence, row) of PagedVerifyAttentionWithScores' scores: num_q_heads (one per q
// head, so a consumer can take each head's softmax before averaging).
int32_t VegasScoreParts(const AttentionShape& shape);

// PagedVerifyAttention (attention.h: same arguments, splits, workspace and output) that also
// writes, per sequence, the pre-softmax scores (q.k * scale, before the softmax) of two query
// rows -- query 0 (the last committed token's row, which predicts the first draft) and query
// q_len - 1 (the bonus token's row) -- over the scored prefix, the keys before the run:
// positions [0, seq_len - q_len). Part h is q head h's score divided by num_q_heads, so the sum
// of a row's VegasScoreParts(shape) parts is the average over all q heads (Vegas
// "Collect-2-Query"), and num_q_heads times a part is that head's own score. Written in the same
// pass as the attention (no second read of the KV), deterministically (no atomics).
//   scores        [num_seqs, 2, VegasScoreParts(shape), score_stride] fp32, device, out: entries
//                 for keys [0, min(seq_len - q_len, score_stride)) of each part; the rest untouched
//   score_stride  >= the longest prefix to be scored; even
// Needs head_dim 16 to 128, sliding_window == 0 and num_q_heads / num_kv_heads <= 16, scores
// 8-byte aligned, every run <= max_q_len; cudaErrorInvalidValue otherwise and as
// PagedVerifyAttention.
cudaError_t PagedVerifyAttentionWithScores(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* cu_q_lens, const int32_t* seq_lens, int32_t num_seqs, int64_t num_tokens,
    int32_t max_q_len, int32_t num_splits, const AttentionShape& shape, __nv_bfloat16* out,
    int64_t out_stride, float* scores, int64_t score_stride, void* workspace,
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
// (num_kv_heads parts from PagedVerifyAttentionWithScores; 1 for scores already averaged over the
// heads) -- and keep the top k = the budget's count of the pair's n tokens, highest criticality
// first, ties to the lower index (scores compare in the float total order, -0 below +0). Pair p
// is sequence p % num_seqs of layer p / num_seqs. Two kernels: an elementwise combine over every
// pair, then one CTA per pair radix-selecting 8 bits a pass (vegas_select.cuh), for any n up to
// score_stride (128K tokens and more).
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

// Most heads VegasHeadAveragedWeights averages (its per-head statistics sit in shared memory).
inline constexpr int32_t kVegasMaxWeightHeads = 128;

// Bytes of workspace VegasHeadAveragedWeights needs: one 16-byte (max, 1 / sum) pair per head of
// each of the num_pairs * 2 rows.
size_t VegasWeightsWorkspaceBytes(int32_t num_pairs, int32_t num_heads);

// For many (sequence, layer) pairs in one launch: turn PagedVerifyAttentionWithScores' per-head
// scores into the head-averaged prefix weights the selection ranks by, as the CPU Model computes
// them (kernels/ref/vegas.h's HeadAveragedPrefixWeights): for each row of a pair and its prefix
// length n, weights[t] = mean over heads h of softmax over [0, n) of to_raw * scores[h][.], at
// t, for t < n. A head whose maximum is not finite (every key masked) adds 0 to the mean. Pair p
// is sequence p % num_seqs of layer p / num_seqs, as in VegasSelectTopK. Two kernels
// (vegas_weights.cuh): one CTA per (row, head) for the head's max and fp64 sum of exponentials,
// then one CTA per (row, 256 tokens) summing the heads' weights in fp64; the exponentials are
// expf of an exponent rounded to float once. Deterministic (fixed reduction order, no atomics).
//   scores     [num_pairs, 2, num_heads, score_stride] fp32, device, in (entries [0, n) read)
//   num_heads  1 to kVegasMaxWeightHeads
//   to_raw     > 0, finite: the factor that makes a stored score raw (num_heads for the parts of
//              PagedVerifyAttentionWithScores, 1 for raw scores)
//   lengths    [num_seqs] int32, device, in: n, the prefix length of each sequence (clipped to
//              [0, score_stride])
//   weights    [num_pairs, 2, score_stride] fp32, device, out: entries [0, n) of each row; the
//              rest untouched
//   workspace  >= VegasWeightsWorkspaceBytes(num_pairs, num_heads) bytes, device, 16-byte aligned
// cudaErrorInvalidValue for a null or misaligned pointer, num_heads outside [1, 128], to_raw not
// finite and positive, num_seqs < 1, num_pairs outside [0, 65535], score_stride outside
// [0, INT_MAX] or a workspace too small; num_pairs == 0 or score_stride == 0 launches nothing.
cudaError_t VegasHeadAveragedWeights(const float* scores, int32_t num_heads, int64_t score_stride,
                                     float to_raw, const int32_t* lengths, int32_t num_seqs,
                                     int32_t num_pairs, float* weights, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream);

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
