// Device helpers shared by the kernel templates in kernels/cuda/: bf16 vectors for 16-byte
// loads, warp and block reductions, launch arithmetic. Include from .cu/.cuh files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specd::kernels {

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
// bf16 elements per 16-byte vector access.
constexpr int kBf16PerVec16 = 8;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// kVec consecutive bf16 values; kVec = 8 makes loads and stores single 16-byte accesses.
template <int kVec>
struct alignas(sizeof(__nv_bfloat16) * kVec) Bf16Vec {
  __nv_bfloat16 v[kVec];

  __device__ __forceinline__ static Bf16Vec Load(const __nv_bfloat16* p) {
    return *reinterpret_cast<const Bf16Vec*>(p);
  }
  __device__ __forceinline__ void Store(__nv_bfloat16* p) const {
    *reinterpret_cast<Bf16Vec*>(p) = *this;
  }
};

__device__ __forceinline__ float WarpReduceSum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Sum of `x` over the block, returned to every thread. Every thread of the block must call it;
// blockDim.x must be a multiple of 32. Warp shuffles, then each warp reduces the warp sums.
// Once per kernel: a second call would need a barrier before reusing the shared scratch.
__device__ __forceinline__ float BlockReduceSum(float x) {
  __shared__ float warp_sums[kMaxBlockThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  x = WarpReduceSum(x);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  x = lane < num_warps ? warp_sums[lane] : 0.0f;
  return WarpReduceSum(x);  // every warp reduces the same partials: no second barrier needed
}

}  // namespace specd::kernels
