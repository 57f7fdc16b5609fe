// RMSNorm kernel template (layer 1 of kernels/cuda: launchers in rmsnorm.cu). Kept in a header
// so fused kernels can reuse it. Include from .cu files only.
#pragma once

#include "kernels/cuda/common.cuh"

namespace specd::kernels {

// fp32 values of a row each thread keeps in registers between the reduction and the output.
constexpr int kRmsNormValuesPerThread = 32;

// One block per token row; thread t owns elements [(c * blockDim.x + t) * kVec, +kVec) for
// chunk c < kRmsNormValuesPerThread / kVec, so reads coalesce and each element is read once.
// kAddResidual: sum input + residual in fp32, store the sum to residual, normalise the sum.
// input and out may alias (each thread reads its elements before writing them), hence no
// __restrict__ on them. Arguments as in rmsnorm.h; residual is unused without kAddResidual.
template <int kVec, bool kAddResidual>
__global__ void __launch_bounds__(kMaxBlockThreads, 1)
    RmsNormKernel(const __nv_bfloat16* input, __nv_bfloat16* residual,
                  const __nv_bfloat16* __restrict__ weight, int hidden, float eps,
                  __nv_bfloat16* out) {
  constexpr int kChunks = kRmsNormValuesPerThread / kVec;
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();     // after the wait: a GEMV follows (common.cuh)
  const int first = static_cast<int>(threadIdx.x) * kVec;
  const int stride = static_cast<int>(blockDim.x) * kVec;
  // Chunks whose elements lie inside the row (hidden % kVec == 0); <= 0 for idle threads. One
  // count instead of a bounds test per chunk keeps the unrolled loops from holding 32 predicates.
  const int num_chunks = (hidden - first + stride - 1) / stride;
  const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * hidden + first;
  float x[kChunks][kVec];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= num_chunks) break;
    const int64_t offset = row_offset + c * stride;
    const auto in = Bf16Vec<kVec>::Load(input + offset);
    if constexpr (kAddResidual) {
      auto res = Bf16Vec<kVec>::Load(residual + offset);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        x[c][j] = __bfloat162float(in.v[j]) + __bfloat162float(res.v[j]);
        res.v[j] = __float2bfloat16_rn(x[c][j]);
      }
      res.Store(residual + offset);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[c][j] = __bfloat162float(in.v[j]);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq += x[c][j] * x[c][j];
  }
  const float inv_rms = rsqrtf(BlockReduceSum(sum_sq) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= num_chunks) break;
    const auto w = Bf16Vec<kVec>::Load(weight + first + c * stride);
    Bf16Vec<kVec> y;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      y.v[j] = __float2bfloat16_rn(x[c][j] * inv_rms * __bfloat162float(w.v[j]));
    }
    y.Store(out + row_offset + c * stride);
  }
}

}  // namespace specd::kernels
