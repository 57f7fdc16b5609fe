// Vegas head-averaged prefix weights (launcher in vegas.cu, contract in vegas.h): each q head's
// softmax over the scored prefix of a collected row, from the fp16 logits and per-split
// statistics the score-collecting verification wrote, averaged over the heads -- the criticality
// the runner ranks by (kernels/ref/vegas.h's HeadAveragedPrefixWeights, which the CPU Model runs).
// One kernel: one CTA per (pair, row, kWeightsTokens tokens) merges each head's split statistics
// into its log2-sum-exp (a warp per head, from L2), then sums the heads' weights of its tokens in
// head order, reading each logit once. Include from .cu files only.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vegas.h"
#include "kernels/cuda/vegas_select.cuh"

namespace specd::kernels::vegas {

constexpr int kWeightsThreads = 256;
constexpr int kWeightsTokensPerThread = 4;  // one 8-byte load of fp16 logits per head
constexpr int kWeightsTokens = kWeightsThreads * kWeightsTokensPerThread;
constexpr int kMaxWeightHeads = kVegasMaxWeightHeads;
static_assert(kVegasScoreSplits <= kWarpSize, "a lane per split");

// weights[row][j] = (sum_h 2^(x_hj - lse_h)) / num_heads for j < n, lse_h merged from the
// head's kVegasScoreSplits (max, sum) statistics (+inf, so the head adds 0, when none is finite).
// Grid (ceil(score_stride / kWeightsTokens), 2, num_pairs); a CTA past its row's n exits.
__global__ void __launch_bounds__(kWeightsThreads)
    VegasPrefixWeightsKernel(const __half* __restrict__ logits, const float* __restrict__ stats,
                             int num_heads, int64_t score_stride,
                             const int32_t* __restrict__ lengths, int num_seqs,
                             float* __restrict__ weights) {
  __shared__ float lse[kMaxWeightHeads];
  const int pair = blockIdx.z;
  const int n = PairLength(lengths, pair, num_seqs, score_stride);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWeightsTokens;
  if (first >= n) return;  // uniform over the block, before the barrier
  const int64_t row = static_cast<int64_t>(pair) * 2 + blockIdx.y;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int h = warp; h < num_heads; h += kWeightsThreads / kWarpSize) {
    const float* st = stats + ((row * num_heads + h) * kVegasScoreSplits) * 2;
    const float2 ml = lane < kVegasScoreSplits ? __ldg(reinterpret_cast<const float2*>(st) + lane)
                                               : make_float2(-INFINITY, 0.0f);
    float m = ml.x;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    float sum = ml.y > 0.0f && isfinite(m) ? ml.y * exp2f(ml.x - m) : 0.0f;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) lse[h] = sum > 0.0f && isfinite(m) ? m + __log2f(sum) : INFINITY;
  }
  __syncthreads();
  const int64_t j = first + static_cast<int64_t>(threadIdx.x) * kWeightsTokensPerThread;
  if (j >= n) return;
  const __half* x = logits + row * num_heads * score_stride + j;
  float acc[kWeightsTokensPerThread] = {};
#pragma unroll 4
  for (int h = 0; h < num_heads; ++h) {
    // score_stride % 4 == 0 and j % 4 == 0: an aligned 8-byte load of 4 logits (those past n
    // are read, never used).
    const uint2 bits = __ldcs(reinterpret_cast<const uint2*>(x + h * score_stride));
    const __half2 ab = *reinterpret_cast<const __half2*>(&bits.x);
    const __half2 cd = *reinterpret_cast<const __half2*>(&bits.y);
    const float c = lse[h];
    acc[0] += exp2f(__low2float(ab) - c);
    acc[1] += exp2f(__high2float(ab) - c);
    acc[2] += exp2f(__low2float(cd) - c);
    acc[3] += exp2f(__high2float(cd) - c);
  }
  const float inv = 1.0f / static_cast<float>(num_heads);
  float* out = weights + row * score_stride + j;
  if (j + kWeightsTokensPerThread <= n) {
    *reinterpret_cast<float4*>(out) =
        make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
  } else {
#pragma unroll
    for (int i = 0; i < kWeightsTokensPerThread; ++i) {
      if (j + i < n) out[i] = acc[i] * inv;
    }
  }
}

}  // namespace specd::kernels::vegas
