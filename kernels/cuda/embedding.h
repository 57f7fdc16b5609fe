// Embedding lookup launcher for the CUDA backend: bf16 rows copied bit for bit. Reference:
// kernels/ref/embedding.h. Any host thread; queued on `stream`, no allocation, graph-capturable.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// out[t, :] = table[token_ids[t] - vocab_start, :] for ids in [vocab_start, vocab_start +
// num_rows), else zeros: a tensor-parallel vocabulary shard (Megatron-LM VocabParallelEmbedding;
// an all-reduce of the shards' outputs gives the full lookup). One GPU holding the whole table
// passes vocab_start = 0, num_rows = vocab size; the caller rejects out-of-vocabulary ids at
// admission, the kernel only guarantees it never reads outside the table.
// Grid (token, chunk of hidden); 16-byte copies when hidden % 8 == 0 and table and out are
// 16-byte aligned, else scalar.
//   token_ids  [num_tokens] int32, device, in
//   table      [num_rows, hidden] bf16, device, in
//   out        [num_tokens, hidden] bf16, device, out
// cudaErrorInvalidValue unless 1 <= hidden <= 2^23, num_rows >= 0, 0 <= num_tokens < 2^31;
// num_tokens == 0 launches nothing.
cudaError_t EmbeddingGather(const int32_t* token_ids, int64_t num_tokens,
                            const __nv_bfloat16* table, int64_t vocab_start, int64_t num_rows,
                            int64_t hidden, __nv_bfloat16* out, cudaStream_t stream);

// At most this many copies in one CopyRows launch (its list travels as a kernel parameter).
inline constexpr int32_t kMaxRowCopies = 64;
// A CopyRows list, passed by value (no upload): copy i moves row src[i] to row dst[i].
struct RowCopies {
  int32_t count = 0;
  int32_t src[kMaxRowCopies];
  int32_t dst[kMaxRowCopies];
};

// Copies rows of one bf16 table in place, in list order: row dst[i] <- row src[i] for
// i < copies.count, a copy reading what an earlier one wrote (as that many cudaMemcpyAsync calls
// would, in one launch: an EAGLE-3 head's hidden rows, tens a drafting pass, each a few KB).
// One thread per 16-byte column of a row (8 bf16), each copying its column for every copy in
// order. Reference: kernels/ref/embedding.h CopyRows.
//   table  [rows, row_elems] bf16, device, in/out (the caller keeps indices inside it)
// cudaErrorInvalidValue unless 0 <= count <= kMaxRowCopies, row_elems > 0 a multiple of 8, table
// non-null and 16-byte aligned, every index >= 0; count == 0 launches nothing. Graph-capturable.
cudaError_t CopyRows(const RowCopies& copies, __nv_bfloat16* table, int64_t row_elems,
                     cudaStream_t stream);

}  // namespace specd::kernels
