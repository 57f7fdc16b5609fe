// Reference for the embedding gather kernel (kernels/cuda/embedding.h): the definition of what
// it computes. Pure function, any thread.
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// Looks up each token's row in a shard of the embedding table holding vocabulary ids
// [vocab_start, vocab_start + num_rows). Ids outside the shard give a zero row, so the shards
// of a tensor-parallel vocabulary sum to the full lookup after an all-reduce (Megatron-LM's
// VocabParallelEmbedding); a single GPU uses vocab_start = 0, num_rows = vocab size.
//   token_ids  [num_tokens] int32, host, in
//   table      [num_rows, hidden] T, host, in
//   out        [num_tokens, hidden] T, host, out
template <typename T>
void EmbeddingGather(const int32_t* token_ids, int64_t num_tokens, const T* table,
                     int64_t vocab_start, int64_t num_rows, int64_t hidden, T* out);

extern template void EmbeddingGather<float>(const int32_t*, int64_t, const float*, int64_t, int64_t,
                                            int64_t, float*);
extern template void EmbeddingGather<double>(const int32_t*, int64_t, const double*, int64_t,
                                             int64_t, int64_t, double*);

// Copies rows of one table in place, in order: row dst[i] <- row src[i] for i < count (a copy
// reads what an earlier one wrote). The definition of kernels::CopyRows.
//   src, dst  [count] int32, host, in (rows of the table)
//   table     [rows, row_elems] T, host, in/out
template <typename T>
void CopyRows(const int32_t* src, const int32_t* dst, int64_t count, T* table, int64_t row_elems);

extern template void CopyRows<float>(const int32_t*, const int32_t*, int64_t, float*, int64_t);
extern template void CopyRows<uint16_t>(const int32_t*, const int32_t*, int64_t, uint16_t*,
                                        int64_t);

}  // namespace specd::kernels::ref
