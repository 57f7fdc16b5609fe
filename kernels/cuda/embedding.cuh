// Embedding gather kernel template (layer 1; launcher in embedding.cu). Include from .cu only.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace specd::kernels {

constexpr int kEmbeddingThreads = 256;

// Grid (num_tokens, ceil(hidden / (kVec * blockDim.x))); each thread copies kVec elements.
// Arguments as in embedding.h.
template <int kVec>
__global__ void __launch_bounds__(kEmbeddingThreads)
    EmbeddingGatherKernel(const int32_t* __restrict__ token_ids,
                          const __nv_bfloat16* __restrict__ table, int64_t vocab_start,
                          int64_t num_rows, int64_t hidden, __nv_bfloat16* __restrict__ out) {
  AllowDependentLaunch();     // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (col >= hidden) return;
  const int64_t row = static_cast<int64_t>(token_ids[blockIdx.x]) - vocab_start;
  Bf16Vec<kVec> y;
  if (row >= 0 && row < num_rows) {
    y = Bf16Vec<kVec>::Load(table + row * hidden + col);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) y.v[j] = __float2bfloat16_rn(0.0f);
  }
  y.Store(out + static_cast<int64_t>(blockIdx.x) * hidden + col);
}

constexpr int kCopyRowsThreads = 128;

// Grid ceil(row_elems / 8 / kCopyRowsThreads): each thread owns one 16-byte column of a row and
// copies it for every copy in list order. Arguments as in embedding.h CopyRows.
__global__ void __launch_bounds__(kCopyRowsThreads)
    CopyRowsKernel(const RowCopies copies, __nv_bfloat16* table, int64_t row_elems) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kBf16PerVec16;
  if (col >= row_elems) return;
  for (int32_t i = 0; i < copies.count; ++i) {
    const auto v = Bf16Vec<kBf16PerVec16>::Load(table + copies.src[i] * row_elems + col);
    v.Store(table + copies.dst[i] * row_elems + col);
  }
}

}  // namespace specd::kernels
