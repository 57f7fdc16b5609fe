// Combine kernels: merge the fp32 partial rows and log-sum-exps that split-KV decode and
// verification launches write (attention_decode*.cuh, attention_verify.cuh) into bf16 rows, by
// log-sum-exp weights. Launched as programmatic dependents of those kernels. Include from .cu
// files only.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace specd::kernels::attention {

// Merges the splits of one (sequence, q head) row per CTA: out = sum_s w_s o_s / sum_s w_s with
// w_s = exp2(lse_s - max lse). A row is a few KiB, so the kernel is latency-bound: it issues the
// log-sum-exps (one per thread) and the partial rows of the first kCombinePreloadSplits splits
// (32 at head_dim 256; threads owning 4 columns each, striding over the splits) in one go, reduces
// the log-sum-exps through shared memory into the max and the weights while those loads are in
// flight, and reads any further splits afterwards: one memory round trip up to 64 splits. (H100, 8B
// shapes, 32K context, batch 1: the combine's share of the call fell from ~2.5 to ~2 us when the
// partial rows stopped waiting for the weights; docs/benchmarks.md, "third pass").
//   partial_out  [rows, num_splits, kHeadDim] fp32; rows of splits with lse -inf may hold any
//                bits (they are read with the others, then dropped)
//   partial_lse  [rows, num_splits] fp32, log2 domain; -inf: the split saw no key
//   out          bf16, row (seq, head) at seq * out_stride + head * kHeadDim
template <int kHeadDim>
__global__ void __launch_bounds__(kCombineThreads)
    DecodeCombineKernel(const float* __restrict__ partial_out,
                        const float* __restrict__ partial_lse, int num_splits, int num_q_heads,
                        __nv_bfloat16* __restrict__ out, int64_t out_stride) {
  constexpr int kCols = kHeadDim / 4;                   // float4 columns of a row
  constexpr int kSplitLanes = kCombineThreads / kCols;  // splits read in parallel
  constexpr int kLsePerThread = kMaxDecodeSplits / kCombineThreads;
  constexpr int kWarps = kCombineThreads / kWarpSize;
  static_assert(kLsePerThread * kCombineThreads == kMaxDecodeSplits);
  // Partial rows each thread loads up front (at most 16 float4 registers; head_dim 256 preloads
  // 32 splits).
  constexpr int kPreload =
      kCombinePreloadSplits / kSplitLanes < 16 ? kCombinePreloadSplits / kSplitLanes : 16;
  __shared__ float weights[kMaxDecodeSplits];
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float4 partial_sums[kCombineThreads];
  AllowDependentLaunch();  // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();
  const int64_t row = blockIdx.x;  // seq * num_q_heads + head
  const float* lse = partial_lse + row * num_splits;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  float lse_own[kLsePerThread];
#pragma unroll
  for (int j = 0; j < kLsePerThread; ++j) {
    const int s = threadIdx.x + j * kCombineThreads;
    lse_own[j] = s < num_splits ? lse[s] : kNegInf;
  }
  const int col = threadIdx.x % kCols, lane_split = threadIdx.x / kCols;
  const float* src = partial_out + row * num_splits * kHeadDim + 4 * col;
  float4 preload[kPreload];
#pragma unroll
  for (int j = 0; j < kPreload; ++j) {
    const int s = lane_split + j * kSplitLanes;
    preload[j] = s < num_splits
                     ? *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kHeadDim)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float max_lse = kNegInf;
#pragma unroll
  for (int j = 0; j < kLsePerThread; ++j) max_lse = fmaxf(max_lse, lse_own[j]);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  }
  if (lane == 0) warp_max[warp] = max_lse;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) max_lse = fmaxf(max_lse, warp_max[w]);
  // Splits without keys (lse -inf, also every split when max_lse is -inf) weigh exactly 0.
  float weight_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kLsePerThread; ++j) {
    const int s = threadIdx.x + j * kCombineThreads;
    const float w = lse_own[j] == kNegInf ? 0.0f : exp2f(lse_own[j] - max_lse);
    if (s < num_splits) weights[s] = w;
    weight_sum += w;
  }
  weight_sum = WarpReduceSum(weight_sum);
  if (lane == 0) warp_sum[warp] = weight_sum;
  __syncthreads();
  weight_sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) weight_sum += warp_sum[w];

  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // Rows of empty splits (never written: any bits, NaN too) are dropped by the select rather
  // than multiplied by 0.
  auto add = [&](float w, const float4& o) {
    if (w > 0.0f) acc.x += w * o.x, acc.y += w * o.y, acc.z += w * o.z, acc.w += w * o.w;
  };
#pragma unroll
  for (int j = 0; j < kPreload; ++j) {
    const int s = lane_split + j * kSplitLanes;
    if (s < num_splits) add(weights[s], preload[j]);
  }
#pragma unroll 4
  for (int s = lane_split + kPreload * kSplitLanes; s < num_splits; s += kSplitLanes) {
    add(weights[s], *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kHeadDim));
  }
  partial_sums[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x >= kCols) return;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < kSplitLanes; ++r) {
    const float4 part = partial_sums[r * kCols + col];
    sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
  }
  const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
  Bf16Vec<4> result;
  result.v[0] = __float2bfloat16_rn(sum.x * inv);
  result.v[1] = __float2bfloat16_rn(sum.y * inv);
  result.v[2] = __float2bfloat16_rn(sum.z * inv);
  result.v[3] = __float2bfloat16_rn(sum.w * inv);
  const int64_t seq = row / num_q_heads, head = row % num_q_heads;
  result.Store(out + seq * out_stride + head * kHeadDim + 4 * col);
}

// DecodeCombineKernel for head_dim 128 and at most kMaxSplits (32 or 64) splits -- batch-1
// decode at long context (32 splits) and short verification runs (49) -- spread thinner so each
// CTA's loads are one short round trip: one CTA per (row, quarter of the row: 8 float4 columns).
// Every warp loads the row's log-sum-exps (lane l: splits l, l + 32) and reduces the max and the
// weight sum by shuffles, so no barrier waits for the weights; thread (column c = lane % 8, split
// lane g = 4 warp + lane / 8) loads splits g, g + 16, ... of its column together with the
// log-sum-exps; shuffles sum a warp's split lanes and one barrier the warps. H100, Llama-3.1-8B
// shapes, 32K, batch 1 (32 rows, 32 splits; scratch probe 2026-11-24): 0.5-0.7 us less per call
// than DecodeCombineKernel (docs/benchmarks.md, "fourth pass").
// Arguments as DecodeCombineKernel; grid: rows * 4 CTAs (row-major), kCombineThreads threads.
constexpr int kCombineFewMaxSplits = 64;  // DecodeCombineFewKernel's largest kMaxSplits
constexpr int kCombineFewCtasPerRow = 4;  // its CTAs per row (quarters of head_dim 128)
template <int kMaxSplits>
__global__ void __launch_bounds__(kCombineThreads)
    DecodeCombineFewKernel(const float* __restrict__ partial_out,
                           const float* __restrict__ partial_lse, int num_splits, int num_q_heads,
                           __nv_bfloat16* __restrict__ out, int64_t out_stride) {
  constexpr int kHeadDim = 128, kGroupCols = 8, kGroups = kHeadDim / 4 / kGroupCols;
  static_assert(kGroups == kCombineFewCtasPerRow && kMaxSplits <= kCombineFewMaxSplits);
  constexpr int kWarps = kCombineThreads / kWarpSize;
  constexpr int kSplitLanes = kCombineThreads / kGroupCols;  // 16
  constexpr int kLsePerLane = kMaxSplits / kWarpSize, kPerThread = kMaxSplits / kSplitLanes;
  static_assert(kMaxSplits == 32 || kMaxSplits == 64);
  __shared__ float4 warp_sums[kWarps][kGroupCols];
  AllowDependentLaunch();  // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = blockIdx.x / kGroups;  // seq * num_q_heads + head
  const int group = blockIdx.x % kGroups;
  const int last = num_splits - 1;  // loads past it read it again (and weigh 0)
  float lse[kLsePerLane];
#pragma unroll
  for (int j = 0; j < kLsePerLane; ++j) {
    lse[j] = partial_lse[row * num_splits + min(lane + kWarpSize * j, last)];
  }
  const int c = lane % kGroupCols, g = warp * (kWarpSize / kGroupCols) + lane / kGroupCols;
  const float* src = partial_out + row * num_splits * kHeadDim + 4 * (group * kGroupCols + c);
  float4 preload[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int s = min(g + kSplitLanes * j, last);
    preload[j] = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kHeadDim);
  }
  float max_lse = kNegInf;
#pragma unroll
  for (int j = 0; j < kLsePerLane; ++j) {
    if (lane + kWarpSize * j >= num_splits) lse[j] = kNegInf;
    max_lse = fmaxf(max_lse, lse[j]);
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  }
  // Splits without keys (lse -inf, also every split when max_lse is -inf) weigh exactly 0.
  float weight[kLsePerLane], weight_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kLsePerLane; ++j) {
    weight[j] = lse[j] == kNegInf ? 0.0f : exp2f(lse[j] - max_lse);
    weight_sum += weight[j];
  }
  weight_sum = WarpReduceSum(weight_sum);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    // Split s's weight: lane s % 32, register s / 32 (= j / 2 for every lane: g < 16).
    const int s = g + kSplitLanes * j;
    const float w = __shfl_sync(0xffffffffu, weight[j / 2], s % kWarpSize);
    // A select, not a product: rows of empty or absent splits may hold NaN.
    const bool use = s < num_splits && w > 0.0f;
    acc.x = use ? fmaf(w, preload[j].x, acc.x) : acc.x;
    acc.y = use ? fmaf(w, preload[j].y, acc.y) : acc.y;
    acc.z = use ? fmaf(w, preload[j].z, acc.z) : acc.z;
    acc.w = use ? fmaf(w, preload[j].w, acc.w) : acc.w;
  }
#pragma unroll
  for (int offset = kGroupCols; offset < kWarpSize; offset *= 2) {
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, offset);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, offset);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, offset);
    acc.w += __shfl_xor_sync(0xffffffffu, acc.w, offset);
  }
  if (lane < kGroupCols) warp_sums[warp][lane] = acc;
  __syncthreads();
  if (warp > 0 || lane >= kGroupCols) return;
  acc = warp_sums[0][lane];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    const float4 part = warp_sums[w][lane];
    acc.x += part.x, acc.y += part.y, acc.z += part.z, acc.w += part.w;
  }
  const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
  Bf16Vec<4> result;
  result.v[0] = __float2bfloat16_rn(acc.x * inv);
  result.v[1] = __float2bfloat16_rn(acc.y * inv);
  result.v[2] = __float2bfloat16_rn(acc.z * inv);
  result.v[3] = __float2bfloat16_rn(acc.w * inv);
  const int64_t seq = row / num_q_heads, head = row % num_q_heads;
  result.Store(out + seq * out_stride + head * kHeadDim + 4 * (group * kGroupCols + lane));
}

// Launches the combine kernel as a programmatic dependent of the kernel that wrote the partial
// rows (sm_90: it may start while that grid drains and waits in-kernel for its results); where the
// attribute is refused, a plain launch. Head dims of 128 with few splits take a quarter row per
// CTA. For .cu files (attention.cu, vegas.cu, nsa.cu).
template <int kHeadDim>
cudaError_t LaunchCombine(const float* partial_out, const float* partial_lse, int num_splits,
                          int num_q_heads, int64_t num_rows, __nv_bfloat16* out, int64_t out_stride,
                          cudaStream_t stream) {
  auto kernel = DecodeCombineKernel<kHeadDim>;
  int64_t num_ctas = num_rows;
  if (kHeadDim == 128 && num_splits <= kCombineFewMaxSplits) {
    kernel = num_splits <= 32 ? DecodeCombineFewKernel<32>
                              : DecodeCombineFewKernel<kCombineFewMaxSplits>;
    num_ctas = num_rows * kCombineFewCtasPerRow;
  }
  if (num_ctas > INT_MAX) return cudaErrorInvalidValue;
  return LaunchDependent(kernel, static_cast<unsigned>(num_ctas), kCombineThreads, 0, stream,
                         partial_out, partial_lse, num_splits, num_q_heads, out, out_stride);
}

}  // namespace specd::kernels::attention
