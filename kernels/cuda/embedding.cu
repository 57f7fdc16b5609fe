// Embedding launcher (layer 2): pick the vector width, size the grid, launch, report.
#include <climits>

#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/embedding.h"

namespace specd::kernels {
namespace {

constexpr int64_t kMaxEmbeddingHidden = int64_t{1} << 23;  // keeps the scalar grid's y < 65535

template <int kVec>
cudaError_t LaunchEmbeddingGather(const int32_t* token_ids, int64_t num_tokens,
                                  const __nv_bfloat16* table, int64_t vocab_start, int64_t num_rows,
                                  int64_t hidden, __nv_bfloat16* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(CeilDiv(hidden, int64_t{kVec} * kEmbeddingThreads)));
  return LaunchDependent(EmbeddingGatherKernel<kVec>, grid, kEmbeddingThreads, 0, stream, token_ids,
                         table, vocab_start, num_rows, hidden, out);
}

}  // namespace

cudaError_t EmbeddingGather(const int32_t* token_ids, int64_t num_tokens,
                            const __nv_bfloat16* table, int64_t vocab_start, int64_t num_rows,
                            int64_t hidden, __nv_bfloat16* out, cudaStream_t stream) {
  if (hidden < 1 || hidden > kMaxEmbeddingHidden || num_rows < 0 || num_tokens < 0 ||
      num_tokens > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  if (hidden % kBf16PerVec16 == 0 && IsAligned(table, 16) && IsAligned(out, 16)) {
    return LaunchEmbeddingGather<kBf16PerVec16>(token_ids, num_tokens, table, vocab_start, num_rows,
                                                hidden, out, stream);
  }
  return LaunchEmbeddingGather<1>(token_ids, num_tokens, table, vocab_start, num_rows, hidden, out,
                                  stream);
}

cudaError_t CopyRows(const RowCopies& copies, __nv_bfloat16* table, int64_t row_elems,
                     cudaStream_t stream) {
  if (copies.count < 0 || copies.count > kMaxRowCopies || row_elems <= 0 ||
      row_elems % kBf16PerVec16 != 0 || table == nullptr || !IsAligned(table, 16)) {
    return cudaErrorInvalidValue;
  }
  for (int32_t i = 0; i < copies.count; ++i) {
    if (copies.src[i] < 0 || copies.dst[i] < 0) return cudaErrorInvalidValue;
  }
  if (copies.count == 0) return cudaSuccess;
  const int64_t blocks = CeilDiv(row_elems / kBf16PerVec16, int64_t{kCopyRowsThreads});
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  CopyRowsKernel<<<static_cast<unsigned>(blocks), kCopyRowsThreads, 0, stream>>>(copies, table,
                                                                                 row_elems);
  return cudaGetLastError();
}

}  // namespace specd::kernels
