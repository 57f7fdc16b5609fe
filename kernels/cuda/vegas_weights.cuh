// Vegas head-averaged prefix weights (launcher in vegas.cu, contract in vegas.h): each q head's
// softmax over the scored prefix of a collected score row, averaged over the heads -- the
// criticality the runner ranks by (kernels/ref/vegas.h's HeadAveragedPrefixWeights, which the CPU
// Model runs). Two kernels, so that both spread over many CTAs at batch 1: one CTA per (row,
// head) for the head's max and sum, then one CTA per (row, tokens chunk) for the weights. Include
// from .cu files only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vegas.h"
#include "kernels/cuda/vegas_select.cuh"

namespace specd::kernels::vegas {

constexpr int kStatsThreads = 256;
constexpr int kWeightsThreads = 256;
constexpr int kMaxWeightHeads = kVegasMaxWeightHeads;

// A head's softmax statistics over a row's prefix: the largest stored score, and 1 / the sum of
// the exponentials (0 when every key is masked or the maximum is not finite: the head weighs 0,
// as in the reference).
struct HeadStats {
  double max;
  double inv_sum;
};

// exp(to_raw * (x - max)) with the exponent rounded to float once (the difference and product in
// double are exact or nearly so), so its error is half an ulp of the exponent plus expf's 2 ulp.
__device__ __forceinline__ double ScaledExp(float x, double max, double to_raw) {
  return static_cast<double>(expf(static_cast<float>((static_cast<double>(x) - max) * to_raw)));
}

__device__ __forceinline__ float WarpReduceMax(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ double WarpReduceSumF64(double x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// stats[row * num_heads + h] for every row (pair * 2 + which) of scores and head h: the maximum
// of the first n stored scores and 1 / sum_j exp(to_raw * (x_j - max)), the sum in fp64 (each
// thread in token order, then a fixed tree: deterministic). Grid num_pairs * 2 * num_heads.
__global__ void __launch_bounds__(kStatsThreads)
    VegasHeadStatsKernel(const float* __restrict__ scores, int num_heads, int64_t score_stride,
                         float to_raw, const int32_t* __restrict__ lengths, int num_seqs,
                         HeadStats* __restrict__ stats) {
  constexpr int kWarps = kStatsThreads / kWarpSize;
  __shared__ float warp_max[kWarps];
  __shared__ double warp_sum[kWarps];
  const int64_t row_head = blockIdx.x;  // (pair * 2 + which) * num_heads + h
  const int pair = static_cast<int>(row_head / (2 * num_heads));
  const int n = PairLength(lengths, pair, num_seqs, score_stride);
  if (n == 0) return;  // the weights kernel writes nothing either
  const float* x = scores + row_head * score_stride;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float m = -INFINITY;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += kStatsThreads) m = fmaxf(m, __ldg(x + j));
  m = WarpReduceMax(m);
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  m = WarpReduceMax(lane < kWarps ? warp_max[lane] : -INFINITY);
  if (!isfinite(m)) {  // uniform over the block: every key masked (or an infinite score)
    if (threadIdx.x == 0) stats[row_head] = HeadStats{0.0, 0.0};
    return;
  }
  const double max = m, raw = to_raw;
  double sum = 0.0;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += kStatsThreads) sum += ScaledExp(__ldg(x + j), max, raw);
  sum = WarpReduceSumF64(sum);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  sum = WarpReduceSumF64(lane < kWarps ? warp_sum[lane] : 0.0);
  if (threadIdx.x == 0) stats[row_head] = HeadStats{max, 1.0 / sum};
}

// weights[row][j] = (sum_h exp(to_raw * (x_hj - max_h)) * inv_sum_h) / num_heads for j < n, the
// sum over heads in fp64 in head order. Grid (ceil(score_stride / kWeightsThreads), 2,
// num_pairs); a CTA past its row's n exits.
__global__ void __launch_bounds__(kWeightsThreads)
    VegasHeadAveragedWeightsKernel(const float* __restrict__ scores, int num_heads,
                                   int64_t score_stride, float to_raw,
                                   const int32_t* __restrict__ lengths, int num_seqs,
                                   const HeadStats* __restrict__ stats,
                                   float* __restrict__ weights) {
  __shared__ HeadStats head[kMaxWeightHeads];
  const int pair = blockIdx.z;
  const int n = PairLength(lengths, pair, num_seqs, score_stride);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWeightsThreads;
  if (first >= n) return;  // uniform over the block, before the barrier
  const int64_t row = static_cast<int64_t>(pair) * 2 + blockIdx.y;
  for (int h = threadIdx.x; h < num_heads; h += kWeightsThreads) {
    head[h] = stats[row * num_heads + h];
  }
  __syncthreads();
  const int64_t j = first + threadIdx.x;
  if (j >= n) return;
  const float* x = scores + row * num_heads * score_stride + j;
  const double raw = to_raw;
  double acc = 0.0;
#pragma unroll 4
  for (int h = 0; h < num_heads; ++h) {
    const HeadStats s = head[h];
    const float score = __ldcs(x + h * score_stride);  // unconditional: the loads pipeline
    // inv_sum 0 (a masked head) adds 0 without its exponential, which may be NaN.
    if (s.inv_sum != 0.0) acc += ScaledExp(score, s.max, raw) * s.inv_sum;
  }
  weights[row * score_stride + j] = static_cast<float>(acc / num_heads);
}

}  // namespace specd::kernels::vegas
