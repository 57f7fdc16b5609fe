// Device helpers shared by the kernel templates in kernels/cuda/: bf16 vectors for 16-byte
// loads, warp and block reductions, launch arithmetic. Include from .cu/.cuh files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

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

// Programmatic dependent launch (sm_90). A kernel launched with LaunchDependent may start while
// the previous kernel of its stream drains: its blocks become resident once every block of the
// predecessor has called AllowDependentLaunch (or exited), run what does not depend on it (a
// GEMV's first weight loads), then WaitForPrerequisiteGrid, which returns once the predecessor
// has completed and its memory is visible. Every block of such a kernel must call
// WaitForPrerequisiteGrid before it reads or writes anything another kernel touches, and before
// any early return: a kernel that could finish without waiting would let its own dependents run
// ahead of its predecessor. Both are no-ops below sm_90 and in kernels launched plainly.
// Where a kernel calls AllowDependentLaunch decides how early the kernel after it starts. The
// GEMV, the decode attention and its combine, and the embedding gather call it first, before
// their own wait: the small kernel after them (a norm, RoPE, the combine) is then resident, and
// its own launch latency hidden, while they still wait for theirs. RmsNorm, SiluAndMul and the
// RoPE / KV write call it after their wait, so the GEMV or attention after them does not start
// streaming while the GEMV before them still does: letting it (every kernel calling it first)
// made an 8B-shaped decode step 2-3% slower, this split makes it 0.5% faster and the 1B-shaped
// one 3-4% faster (docs/benchmarks.md, 2026-11-27). Either order is safe: a dependent launches
// only once every block of its predecessor is resident or done, and its wait covers the whole
// chain, since its predecessor completes only after waiting for its own.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPrerequisiteGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether LaunchDependent uses programmatic launches: yes unless the environment sets
// SPECD_PDL=0 (kept for measuring what they save, side by side). Read once per process.
inline bool ProgrammaticLaunchEnabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("SPECD_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's
// previous kernel where ProgrammaticLaunchEnabled() (a plain launch where the attribute is
// refused). The kernel must follow the contract above. Captured into CUDA graphs as programmatic
// edges.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args... args) {
  if (ProgrammaticLaunchEnabled()) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...) == cudaSuccess) {
      return cudaSuccess;
    }
    (void)cudaGetLastError();
  }
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
}

// Exclusive prefix sum of x over a kThreads block (every thread calls it) and the total;
// `scratch` holds kThreads / 32 + 1 words and may be reused after the call's last barrier.
template <int kThreads>
__device__ __forceinline__ uint32_t BlockExclusiveSum(uint32_t x, uint32_t* scratch,
                                                      uint32_t& total) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  uint32_t inclusive = x;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += y;
  }
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  __syncthreads();
  uint32_t before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t v = scratch[w];
    before += w < warp ? v : 0u;
    total += v;
  }
  __syncthreads();  // scratch may be rewritten by the caller's next call
  return before + inclusive - x;
}

}  // namespace specd::kernels
