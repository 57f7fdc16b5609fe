// Reference of the tensor-parallel vocabulary merge (kernels/cuda/vocab_merge.h): instead of
// all-gathering the vocabulary-parallel LM head's [rows, vocab] logits, every rank contributes
// the k largest logits of its shard with their global ids, and the merged rows hold those
// world * k candidates and -inf elsewhere. Their argmax and their k best equal the full rows'
// (ties to the lower id, NaN as -inf, as ArgmaxRows / TopKRows rank), which is all a greedy
// row (and SSD's candidates) needs. Any thread; no state.
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// Candidate pairs: [num_rows, k] of two int32 each, the candidate's f32 logit bits and its global
// id; a slot past the shard's logits holds (-inf, -1).
inline constexpr int32_t kVocabMergeNoId = -1;

// Rank's side: the k best of each row of its shard, best first.
//   logits  [num_rows, local_vocab] f32, in; row stride `stride` (>= local_vocab)
//   id_base global id of the shard's column 0
//   pairs   [num_rows, k, 2] int32, out
// local_vocab may be 0 (a rank holding no vocabulary rows: every slot is empty).
void ShardCandidates(const float* logits, int64_t stride, int32_t num_rows, int32_t local_vocab,
                     int32_t k, int32_t id_base, int32_t* pairs);

// Rank 0's side, after the all-gather: every row of `out` gets -inf, then each candidate's logit
// at its id (ids outside [0, vocab) are skipped).
//   pairs [world, num_rows, k, 2] int32, in: the ranks' ShardCandidates in rank order
//   out   [num_rows, vocab] f32, out; row stride `stride`
void ScatterCandidates(const int32_t* pairs, int32_t world, int32_t num_rows, int32_t k,
                       int32_t vocab, float* out, int64_t stride);

}  // namespace specd::kernels::ref
