// References for the Vegas kernels (kernels/cuda/vegas.h; the algorithm: the Vegas paper,
// ../shared/papers/vegas-verification-guided-sparse-attention.txt): verification attention that
// also returns the scores the next round's KV selection ranks, the head-averaged attention
// weights it ranks by, the top-k selection by sparsity ratio, and sparse attention over a
// token-index list plus the recent tokens. Plain loops over the paged "HND" cache of
// kernels/ref/attention.h; they define what the kernels compute and run in fp64 (the truth) and
// fp32 (the same-precision baseline). Pure functions, any thread.
#pragma once

#include <cstdint>

#include "kernels/ref/attention.h"

namespace specd::kernels::ref {

// PagedPrefillAttention (same arguments, causal and window rule, output) that also writes, in the
// same pass, the pre-softmax scores q.k * scale of two query rows of each sequence -- query 0
// (the last committed token's row, which predicts the first draft) and query q_len - 1 (the row
// that predicts the bonus token) -- averaged over all q heads, for every key of the scored
// prefix [0, seq_len - q_len) (the keys before the run). A key a row may not see (outside its
// sliding window) scores -inf.
//   scores  [num_seqs, 2, score_stride] T, out: row 0 query 0, row 1 the last query; keys
//           [0, min(prefix, score_stride)) written, the rest untouched
template <typename T>
void PagedVerifyAttentionWithScores(const T* q, int64_t q_stride, const T* k_cache,
                                    const T* v_cache, const int32_t* block_tables,
                                    int64_t max_blocks_per_seq, const int32_t* cu_q_lens,
                                    const int32_t* seq_lens, int64_t num_seqs,
                                    const AttentionShape& shape, T* out, int64_t out_stride,
                                    T* scores, int64_t score_stride,
                                    ProbRounding rounding = ProbRounding::kExact);

// How many of n prefix tokens a selection keeps: clamp(ceil(ratio * n), min_tokens, max_tokens),
// at most n. The ceiling is of ratio * n * (1 - 1e-9), so a double product that rounds a hair
// above an integer (0.07 * 1000 = 70.00000000000001) keeps that integer (70, not 71).
struct VegasBudget {
  double ratio = 0;        // in [0, 1]
  int64_t min_tokens = 0;  // the floor
  int64_t max_tokens = 0;  // the cap (>= min_tokens)
};
int64_t VegasKeepCount(int64_t n, const VegasBudget& budget);

// Top-k selection for num_pairs (sequence, layer) pairs; pair p is sequence p % num_seqs (of
// layer p / num_seqs). A token's criticality is the mean of the two rows, each row the sum of its
// num_parts parts -- (sum_p s[0][p][j] + sum_p s[1][p][j]) * 0.5 in fp32, sums from 0.0f in part
// order: the paper's eq. 3 (sum over both rows and every head) up to a constant factor, and the
// bits the CUDA kernel computes. With parts of one the rows are already head averages
// (PagedVerifyAttentionWithScores, VegasPrefixWeights' rows). The
// VegasKeepCount(n) tokens of highest criticality are kept, compared in the float total order
// (-0 below +0), ties to the lower index.
//   scores   [num_pairs, 2, num_parts, score_stride] fp32
//   lengths  [num_seqs]: n, the prefix length (clipped to [0, score_stride])
//   indices  [num_pairs, index_stride], out: kept tokens ascending; later entries untouched
//   counts   [num_pairs], out
// index_stride >= budget.max_tokens.
void VegasSelectTopK(const float* scores, int64_t num_parts, int64_t score_stride,
                     const int32_t* lengths, int64_t num_seqs, int64_t num_pairs,
                     const VegasBudget& budget, int32_t* indices, int64_t index_stride,
                     int32_t* counts);

// The criticality Vegas ranks by (the CPU Model's and the CUDA runner's; the CUDA kernel
// VegasPrefixWeights computes it on the device): for one query row, each head's softmax over
// the keys [0, n) of its raw scores, to_raw times the stored ones, averaged over the heads. In
// fp64 (exp, sums from 0 in key and head order), rounded to float at the end; a head whose
// maximum is not finite (every key masked) adds 0 to the mean; n == 0 writes nothing.
//   scores  [heads, stride] f32 (keys past n ignored; -inf: masked)
//   out     [n] f32
void HeadAveragedPrefixWeights(const float* scores, int64_t heads, int64_t stride, int64_t n,
                               float to_raw, float* out);

// Sparse attention: PagedPrefillAttention's queries (cu_q_lens, seq_lens, positions), except
// that sequence s's queries see only the tokens token_indices[s][0 .. index_counts[s]) and the
// tokens from recent_starts[s] on, each still under the causal (and window) rule. What the
// Vegas draft pass computes for a layer; equal to dense attention with every other key masked.
//   token_indices  [num_seqs, index_stride] int32: distinct positions below recent_starts[s]
//   index_counts, recent_starts  [num_seqs] int32
template <typename T>
void PagedSparseAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                          const int32_t* block_tables, int64_t max_blocks_per_seq,
                          const int32_t* cu_q_lens, const int32_t* seq_lens,
                          const int32_t* token_indices, int64_t index_stride,
                          const int32_t* index_counts, const int32_t* recent_starts,
                          int64_t num_seqs, const AttentionShape& shape, T* out, int64_t out_stride,
                          ProbRounding rounding = ProbRounding::kExact);

extern template void PagedVerifyAttentionWithScores<float>(const float*, int64_t, const float*,
                                                           const float*, const int32_t*, int64_t,
                                                           const int32_t*, const int32_t*, int64_t,
                                                           const AttentionShape&, float*, int64_t,
                                                           float*, int64_t, ProbRounding);
extern template void PagedVerifyAttentionWithScores<double>(const double*, int64_t, const double*,
                                                            const double*, const int32_t*, int64_t,
                                                            const int32_t*, const int32_t*, int64_t,
                                                            const AttentionShape&, double*, int64_t,
                                                            double*, int64_t, ProbRounding);
extern template void PagedSparseAttention<float>(const float*, int64_t, const float*, const float*,
                                                 const int32_t*, int64_t, const int32_t*,
                                                 const int32_t*, const int32_t*, int64_t,
                                                 const int32_t*, const int32_t*, int64_t,
                                                 const AttentionShape&, float*, int64_t,
                                                 ProbRounding);
extern template void PagedSparseAttention<double>(const double*, int64_t, const double*,
                                                  const double*, const int32_t*, int64_t,
                                                  const int32_t*, const int32_t*, const int32_t*,
                                                  int64_t, const int32_t*, const int32_t*, int64_t,
                                                  const AttentionShape&, double*, int64_t,
                                                  ProbRounding);

}  // namespace specd::kernels::ref
