// Vegas KV selection kernels (launchers in vegas.cu, contracts in vegas.h): combine the collected
// scores of a (sequence, layer) pair into one criticality per prefix token, then keep the top k
// by radix select, k from the sparsity ratio with a floor and a cap. Include from .cu files only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace specd::kernels::vegas {

constexpr int kCombineThreads = 256;
constexpr int kSelectThreads = 512;
constexpr int kSelectItems = 4;  // consecutive tokens per thread per chunk (one float4)
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
// ceil(ratio * n) is taken of ratio * n * kRatioSlack, so a product that double rounding puts a
// hair above an integer (0.07 * 1000 = 70.00000000000001) keeps that integer. kernels/ref/vegas.cc
// computes the same expression.
constexpr double kRatioSlack = 1.0 - 1e-9;

// The pair's token count: lengths[pair % num_seqs] clipped to [0, score_stride].
__device__ __forceinline__ int PairLength(const int32_t* lengths, int pair, int num_seqs,
                                          int64_t score_stride) {
  const int n = __ldg(lengths + pair % num_seqs);
  return n < 0 ? 0 : n > score_stride ? static_cast<int>(score_stride) : n;
}

// Tokens to keep of n: clamp(ceil(ratio n), min_tokens, max_tokens), at most n.
__device__ __forceinline__ int KeepCount(int n, double ratio, int min_tokens, int max_tokens) {
  const double scaled = ratio * static_cast<double>(n);
  const double wanted = ceil(scaled * kRatioSlack);
  int64_t k = static_cast<int64_t>(wanted);
  k = k < min_tokens ? min_tokens : k;
  k = k > max_tokens ? max_tokens : k;
  return static_cast<int>(k < n ? k : n);
}

// A float's bits as an unsigned key in the float's total order (-0 below +0), so larger scores
// have larger keys and radix digits select by value.
__device__ __forceinline__ uint32_t OrderedKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// combined[pair][j] = (sum_p scores[pair][0][p][j] + sum_p scores[pair][1][p][j]) * 0.5 for
// j < n (the pair's length): the mean of the two rows' head averages (Vegas paper, eq. 3). The
// sums run in part order from 0.0f, as the reference's do, so both produce the same bits.
// Grid (ceil(score_stride / kCombineThreads), num_pairs).
__global__ void __launch_bounds__(kCombineThreads)
    VegasCombineScoresKernel(const float* __restrict__ scores, int num_parts, int64_t score_stride,
                             const int32_t* __restrict__ lengths, int num_seqs,
                             float* __restrict__ combined, int64_t combined_stride) {
  const int pair = blockIdx.y;
  const int64_t n = PairLength(lengths, pair, num_seqs, score_stride);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (j >= n) return;
  const float* src = scores + static_cast<int64_t>(pair) * 2 * num_parts * score_stride + j;
  float row0 = 0.0f, row1 = 0.0f;
  for (int p = 0; p < num_parts; ++p) row0 += __ldcs(src + p * score_stride);
  for (int p = 0; p < num_parts; ++p) row1 += __ldcs(src + (num_parts + p) * score_stride);
  combined[static_cast<int64_t>(pair) * combined_stride + j] = (row0 + row1) * 0.5f;
}

// The 4 combined scores of tokens j0 .. j0 + 3 (j0 a multiple of 4, below the row's padded
// length), as keys; tokens at or past n are not read into the selection.
__device__ __forceinline__ void LoadKeys(const float* row, int j0, uint32_t (&keys)[kSelectItems]) {
  const float4 v = *reinterpret_cast<const float4*>(row + j0);
  keys[0] = OrderedKey(v.x), keys[1] = OrderedKey(v.y);
  keys[2] = OrderedKey(v.z), keys[3] = OrderedKey(v.w);
}

// One CTA per (sequence, layer) pair: k = KeepCount(n); k == n writes 0 .. n-1. Otherwise MSB-first
// radix select over the keys, 8 bits a pass (up to 4 passes over the row, which stays in L2 at
// 128K tokens): each pass histograms the keys that match the digits chosen so far (warp-aggregated
// shared-memory atomics, as many tokens share a bin), and the bin where the count from the top
// reaches the tokens still wanted becomes the next digit; it stops early where that bin is kept
// whole. Then one ordered pass writes every token above the threshold and the first `remaining`
// tokens at it (ties go to the lower index), positions from a block-wide prefix sum of (above, at)
// counts, so the output ascends. References: Alabi et al., "Fast k-selection algorithms for
// graphics processing units" (radix select); the Vegas fork's varlen_topk.
//   combined  [num_pairs, combined_stride] fp32 (VegasCombineScoresKernel), combined_stride % 4 ==
//   0 indices   [num_pairs, index_stride] int32, out: the kept tokens, ascending; the rest
//   untouched counts    [num_pairs] int32, out: k
__global__ void __launch_bounds__(kSelectThreads)
    VegasSelectKernel(const float* __restrict__ combined, int64_t combined_stride,
                      const int32_t* __restrict__ lengths, int num_seqs, int64_t score_stride,
                      double ratio, int min_tokens, int max_tokens, int32_t* __restrict__ indices,
                      int64_t index_stride, int32_t* __restrict__ counts,
                      const int32_t* __restrict__ out_rows, int64_t out_rows_per_layer) {
  __shared__ uint32_t hist[kRadixBins];
  __shared__ uint32_t warp_totals[kSelectThreads / kWarpSize];
  __shared__ uint32_t chosen_digit, chosen_remaining, chosen_bin_count;
  constexpr int kChunk = kSelectThreads * kSelectItems;
  const int pair = blockIdx.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // The pair's output row: its own, or its sequence's row in the layer's table (VegasSelectTopK's
  // out_rows; a negative row: the pair is someone else's, nothing written).
  int64_t out_row = pair;
  if (out_rows != nullptr) {
    const int seq_row = __ldg(out_rows + pair % num_seqs);
    if (seq_row < 0) return;  // CTA-uniform
    out_row = static_cast<int64_t>(pair / num_seqs) * out_rows_per_layer + seq_row;
  }
  const int n = PairLength(lengths, pair, num_seqs, score_stride);
  const int k = KeepCount(n, ratio, min_tokens, max_tokens);
  int32_t* out = indices + out_row * index_stride;
  if (threadIdx.x == 0) counts[out_row] = k;
  if (k == n) {
    for (int j = threadIdx.x; j < n; j += kSelectThreads) out[j] = j;
    return;
  }
  if (k == 0) return;
  const float* row = combined + static_cast<int64_t>(pair) * combined_stride;

  uint32_t prefix = 0, mask = 0;
  int remaining = k;  // tokens still wanted among those matching prefix under mask
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int b = threadIdx.x; b < kRadixBins; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kChunk) {  // trip count uniform over the CTA
      const int j0 = base + kSelectItems * threadIdx.x;
      uint32_t keys[kSelectItems] = {};
      if (j0 < n) LoadKeys(row, j0, keys);
#pragma unroll
      for (int e = 0; e < kSelectItems; ++e) {
        const bool in = j0 + e < n && (keys[e] & mask) == prefix;
        const uint32_t bin = in ? (keys[e] >> shift) & (kRadixBins - 1) : kRadixBins;
        const uint32_t peers = __match_any_sync(0xffffffffu, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255 - 8l down to 248 - 8l; an inclusive scan from the top bin finds
      // the lane, then the lane's bin, where the count reaches `remaining`.
      constexpr int kPerLane = kRadixBins / kWarpSize;
      uint32_t local = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) local += hist[kRadixBins - 1 - kPerLane * lane - i];
      uint32_t inclusive = local;
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += y;
      }
      const uint32_t reached =
          __ballot_sync(0xffffffffu, inclusive >= static_cast<uint32_t>(remaining));
      if (lane == __ffs(reached) - 1) {
        uint32_t above = inclusive - local;
        for (int i = 0; i < kPerLane; ++i) {
          const int b = kRadixBins - 1 - kPerLane * lane - i;
          if (above + hist[b] >= static_cast<uint32_t>(remaining)) {
            chosen_digit = b;
            chosen_remaining = remaining - above;
            chosen_bin_count = hist[b];
            break;
          }
          above += hist[b];
        }
      }
    }
    __syncthreads();
    prefix |= chosen_digit << shift;
    mask |= static_cast<uint32_t>(kRadixBins - 1) << shift;
    remaining = static_cast<int>(chosen_remaining);
    if (chosen_bin_count == chosen_remaining) break;  // the whole bin is kept: no ties to cut
  }

  // Ordered output: token j is kept if its key (under mask) is above prefix, or at it and among
  // the first `remaining` such tokens; its slot is the kept tokens before it.
  int above_seen = 0, at_seen = 0;
  for (int base = 0; base < n && above_seen + min(at_seen, remaining) < k; base += kChunk) {
    const int j0 = base + kSelectItems * threadIdx.x;
    uint32_t keys[kSelectItems] = {};
    if (j0 < n) LoadKeys(row, j0, keys);
    bool above[kSelectItems], at[kSelectItems];
    uint32_t num_above = 0, num_at = 0;
#pragma unroll
    for (int e = 0; e < kSelectItems; ++e) {
      const bool valid = j0 + e < n;
      above[e] = valid && (keys[e] & mask) > prefix;
      at[e] = valid && (keys[e] & mask) == prefix;
      num_above += above[e];
      num_at += at[e];
    }
    uint32_t total;
    const uint32_t before =
        BlockExclusiveSum<kSelectThreads>(num_above | (num_at << 16), warp_totals, total);
    int above_before = above_seen + static_cast<int>(before & 0xffffu);
    int at_before = at_seen + static_cast<int>(before >> 16);
#pragma unroll
    for (int e = 0; e < kSelectItems; ++e) {
      if (above[e]) out[above_before + min(at_before, remaining)] = j0 + e;
      if (at[e] && at_before < remaining) out[above_before + at_before] = j0 + e;
      above_before += above[e];
      at_before += at[e];
    }
    above_seen += static_cast<int>(total & 0xffffu);
    at_seen += static_cast<int>(total >> 16);
  }
}

}  // namespace specd::kernels::vegas
