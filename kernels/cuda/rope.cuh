// RoPE and per-head RMSNorm kernel templates (layer 1; launchers in rope.cu). Include from .cu
// files only.
#pragma once

#include "kernels/cuda/attention_common.cuh"  // WriteKvToken
#include "kernels/cuda/common.cuh"

namespace specd::kernels {

constexpr int kRopeThreads = 256;
constexpr int kHeadNormThreads = 256;  // 8 heads per block, one warp each
constexpr int kMaxRopeHeadDim = 512;

// cos_sin[p, i] = cos(inv_freq[i] * p), cos_sin[p, half + i] = sin(...), one (p, i) per thread
// of a grid-stride loop. The angle is one fp32 multiply (transformers' float32 freqs); sincosf is
// the full-range version (nvcc without --use_fast_math), within 2 ulp.
__global__ void __launch_bounds__(kRopeThreads)
    BuildRopeCacheKernel(const float* __restrict__ inv_freq, int half, int64_t total,
                         float* __restrict__ cos_sin) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += step) {
    const int64_t p = idx / half;
    const int i = static_cast<int>(idx - p * half);
    const float angle = __fmul_rn(inv_freq[i], static_cast<float>(p));
    float s, c;
    sincosf(angle, &s, &c);
    float* row = cos_sin + p * 2 * half;
    row[i] = c;
    row[half + i] = s;
  }
}

// One block per token; each thread rotates kVec (x1, x2) pairs of one head per step, q heads
// first, then k heads. q and k may point into the same fused qkv buffer (disjoint heads), hence
// no __restrict__. kVec = 8 needs 16-byte aligned rows and half % 8 == 0.
template <int kVec>
__device__ __forceinline__ void RopeToken(int64_t t, const int32_t* __restrict__ positions,
                                          __nv_bfloat16* q, int64_t q_stride, int num_q_heads,
                                          __nv_bfloat16* k, int64_t k_stride, int num_kv_heads,
                                          int head_dim, int rot_dim,
                                          const float* __restrict__ cos_sin) {
  const int half = rot_dim / 2;
  const int vecs_per_head = half / kVec;
  const int num_items = (num_q_heads + num_kv_heads) * vecs_per_head;
  const float* cos = cos_sin + static_cast<int64_t>(positions[t]) * rot_dim;
  const float* sin = cos + half;
  for (int item = threadIdx.x; item < num_items; item += blockDim.x) {
    const int head = item / vecs_per_head;
    const int i = (item - head * vecs_per_head) * kVec;
    __nv_bfloat16* x = head < num_q_heads
                           ? q + t * q_stride + static_cast<int64_t>(head) * head_dim
                           : k + t * k_stride + static_cast<int64_t>(head - num_q_heads) * head_dim;
    x += i;
    const auto x1 = Bf16Vec<kVec>::Load(x);
    const auto x2 = Bf16Vec<kVec>::Load(x + half);
    Bf16Vec<kVec> y1, y2;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float c = cos[i + j], s = sin[i + j];
      const float a = __bfloat162float(x1.v[j]), b = __bfloat162float(x2.v[j]);
      y1.v[j] = __float2bfloat16_rn(a * c - b * s);
      y2.v[j] = __float2bfloat16_rn(b * c + a * s);
    }
    y1.Store(x);
    y2.Store(x + half);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kRopeThreads)
    ApplyRopeKernel(const int32_t* __restrict__ positions, __nv_bfloat16* q, int64_t q_stride,
                    int num_q_heads, __nv_bfloat16* k, int64_t k_stride, int num_kv_heads,
                    int head_dim, int rot_dim, const float* __restrict__ cos_sin) {
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();     // after the wait: the attention follows (common.cuh)
  RopeToken<kVec>(blockIdx.x, positions, q, q_stride, num_q_heads, k, k_stride, num_kv_heads,
                  head_dim, rot_dim, cos_sin);
}

// RMSNorm of one head_dim vector in place by one warp: lane l holds elements
// [(c * 32 + l) * kVec, +kVec) for chunk c in registers, the warp sums squares with shuffles,
// then writes x * rsqrt(mean + eps) * weight. Every lane of the warp must call it.
template <int kVec>
__device__ __forceinline__ void HeadNormRow(__nv_bfloat16* row, int head_dim,
                                            const __nv_bfloat16* __restrict__ weight, float eps,
                                            int lane) {
  constexpr int kChunks = kMaxRopeHeadDim / (kWarpSize * kVec);
  float v[kChunks][kVec];
  float sum_sq = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int offset = (c * kWarpSize + lane) * kVec;
    if (offset < head_dim) {
      const auto in = Bf16Vec<kVec>::Load(row + offset);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        v[c][j] = __bfloat162float(in.v[j]);
        sum_sq += v[c][j] * v[c][j];
      }
    }
  }
  const float inv_rms = rsqrtf(WarpReduceSum(sum_sq) / static_cast<float>(head_dim) + eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int offset = (c * kWarpSize + lane) * kVec;
    if (offset < head_dim) {
      const auto w = Bf16Vec<kVec>::Load(weight + offset);
      Bf16Vec<kVec> y;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        y.v[j] = __float2bfloat16_rn(v[c][j] * inv_rms * __bfloat162float(w.v[j]));
      }
      y.Store(row + offset);
    }
  }
}

// One warp per (token, head), HeadNormRow. kVec = 8 needs head_dim % 8 == 0 and 16-byte aligned
// rows and weight.
template <int kVec>
__global__ void __launch_bounds__(kHeadNormThreads)
    HeadRmsNormKernel(__nv_bfloat16* x, int64_t x_stride, int64_t num_vectors, int num_heads,
                      int head_dim, const __nv_bfloat16* __restrict__ weight, float eps) {
  const int64_t vector =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (vector >= num_vectors) return;  // whole warps leave together: the shuffles stay full
  const int64_t t = vector / num_heads;
  const int h = static_cast<int>(vector - t * num_heads);
  HeadNormRow<kVec>(x + t * x_stride + static_cast<int64_t>(h) * head_dim, head_dim, weight, eps,
                    threadIdx.x % kWarpSize);
}

// Per-head RMSNorm of q and k (kNorm: Qwen3's q_norm / k_norm, one warp per head, HeadNormRow
// with kRopeVec), then ApplyRopeKernel, then WriteKvCacheKernel (attention_common.cuh), for the
// same token in one block: the barriers make each phase's writes visible to the next one's
// threads. The same arithmetic as the separate kernels, so the same bits.
template <int kRopeVec, int kKvVec, bool kNorm>
__global__ void __launch_bounds__(kRopeThreads)
    RopeAndWriteKvCacheKernel(const int32_t* __restrict__ positions, __nv_bfloat16* q,
                              int64_t q_stride, int num_q_heads, __nv_bfloat16* k, int64_t k_stride,
                              const __nv_bfloat16* v, int64_t v_stride, int num_kv_heads,
                              int head_dim, int rot_dim, const float* __restrict__ cos_sin,
                              const __nv_bfloat16* __restrict__ q_norm,
                              const __nv_bfloat16* __restrict__ k_norm, float eps,
                              const int64_t* __restrict__ slot_mapping, int block_size,
                              __nv_bfloat16* __restrict__ k_cache,
                              __nv_bfloat16* __restrict__ v_cache) {
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();     // after the wait: the attention follows (common.cuh)
  const int64_t t = blockIdx.x;
  if constexpr (kNorm) {
    const int warps = static_cast<int>(blockDim.x) / kWarpSize;
    for (int h = static_cast<int>(threadIdx.x) / kWarpSize; h < num_q_heads + num_kv_heads;
         h += warps) {  // whole warps per head: the shuffles stay full
      __nv_bfloat16* row =
          h < num_q_heads ? q + t * q_stride + static_cast<int64_t>(h) * head_dim
                          : k + t * k_stride + static_cast<int64_t>(h - num_q_heads) * head_dim;
      HeadNormRow<kRopeVec>(row, head_dim, h < num_q_heads ? q_norm : k_norm, eps,
                            threadIdx.x % kWarpSize);
    }
    __syncthreads();
  }
  RopeToken<kRopeVec>(t, positions, q, q_stride, num_q_heads, k, k_stride, num_kv_heads, head_dim,
                      rot_dim, cos_sin);
  __syncthreads();
  attention::WriteKvToken<kKvVec>(t, k, k_stride, v, v_stride, slot_mapping, num_kv_heads, head_dim,
                                  block_size, k_cache, v_cache);
}

}  // namespace specd::kernels
