// Activation kernel templates (layer 1; launchers in activation.cu). Include from .cu only.
#pragma once

#include "kernels/cuda/common.cuh"

namespace specd::kernels {

constexpr int kElementwiseThreads = 256;

__device__ __forceinline__ float Silu(float x) { return x / (1.0f + __expf(-x)); }

// Grid (num_tokens, ceil(d / (kVec * blockDim.x))); each thread produces kVec outputs.
// Arguments as in activation.h.
template <int kVec>
__global__ void __launch_bounds__(kElementwiseThreads)
    SiluAndMulKernel(const __nv_bfloat16* __restrict__ gate_up, int64_t d,
                     __nv_bfloat16* __restrict__ out) {
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();     // after the wait: a GEMV follows (common.cuh)
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (col >= d) return;
  const __nv_bfloat16* gate = gate_up + static_cast<int64_t>(blockIdx.x) * 2 * d + col;
  const auto g = Bf16Vec<kVec>::Load(gate);
  const auto u = Bf16Vec<kVec>::Load(gate + d);
  Bf16Vec<kVec> y;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    y.v[j] = __float2bfloat16_rn(Silu(__bfloat162float(g.v[j])) * __bfloat162float(u.v[j]));
  }
  y.Store(out + static_cast<int64_t>(blockIdx.x) * d + col);
}

}  // namespace specd::kernels
