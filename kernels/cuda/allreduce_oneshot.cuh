// One-shot all-reduce kernel template (layer 1 of kernels/cuda: launchers in allreduce_oneshot.cu).
// The flag protocol follows vLLM's custom all-reduce (csrc/custom_all_reduce.cuh: per-block flags
// in every peer, release stores and acquire loads at system scope); the input is pushed into
// alternating slots of the peers' buffers (TensorRT-LLM's push mode), so no end-of-call barrier
// is needed and every read of the sum is local. Include from .cu files only.
#pragma once

#include <type_traits>

#include "kernels/cuda/allreduce_oneshot.h"
#include "kernels/cuda/common.cuh"

namespace specd::kernels {

// Spins between looks at the clock and the host-mapped abort word (a PCIe read).
constexpr int kOneShotSpinsPerCheck = 256;

__device__ __forceinline__ void StoreRelease(uint32_t* addr, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* addr) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(addr) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kVec elements of T moved as one access (16 bytes when kVec * sizeof(T) == 16).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) OneShotPack {
  T v[kVec];
};

// L2-coherent load (ld.global.cg): peers' slots are written by other GPUs, so no L1 copy is used.
template <typename T, int kVec>
__device__ __forceinline__ OneShotPack<T, kVec> LoadCg(const OneShotPack<T, kVec>* p) {
  OneShotPack<T, kVec> out;
  if constexpr (sizeof(out) == 16) {
    *reinterpret_cast<uint4*>(&out) = __ldcg(reinterpret_cast<const uint4*>(p));
  } else if constexpr (sizeof(out) == 4) {
    *reinterpret_cast<unsigned*>(&out) = __ldcg(reinterpret_cast<const unsigned*>(p));
  } else {
    static_assert(sizeof(out) == 2);
    *reinterpret_cast<unsigned short*>(&out) = __ldcg(reinterpret_cast<const unsigned short*>(p));
  }
  return out;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);
  }
}

// Waits until rank `peer`'s flag for this block reaches `epoch` (a peer may already be one call
// ahead, hence the wrap-safe >=). False when the wait gave up: timeout or abort.
__device__ __forceinline__ bool WaitForPeer(const uint32_t* flag, uint32_t epoch,
                                            const OneShotGroup& group) {
  const uint64_t start = GlobalTimerNs();
  for (int spins = 1;; ++spins) {
    if (static_cast<int32_t>(LoadAcquire(flag) - epoch) >= 0) return true;
    if (spins % kOneShotSpinsPerCheck == 0) {
      if (group.abort_word != nullptr &&
          *reinterpret_cast<const volatile uint32_t*>(group.abort_word) != 0) {
        return false;
      }
      if (static_cast<int64_t>(GlobalTimerNs() - start) > group.timeout_ns) return false;
    }
  }
}

// Phase helpers of the kernels below; every thread of the block calls them, in this order.
// OneShotEnter advances block b's epoch (kept in device memory, so graph replays count too) and
// returns false when an earlier call gave up (the peers' epochs no longer match ours: do nothing).
__device__ __forceinline__ bool OneShotEnter(const OneShotGroup& group, uint32_t* epoch) {
  __shared__ uint32_t epoch_shared;
  __shared__ int failed;
  auto* own = static_cast<OneShotSignals*>(group.buffers[group.rank]);
  if (threadIdx.x == 0) {
    failed = *reinterpret_cast<volatile uint32_t*>(&own->error) != 0;
    epoch_shared = own->epochs[blockIdx.x] + 1;
    if (!failed) own->epochs[blockIdx.x] = epoch_shared;
  }
  __syncthreads();
  *epoch = epoch_shared;
  return !failed;
}

// After the block pushed its part: tells every peer (a release store into its flag for this
// block) and waits for every peer's flag (a local spin). False when a wait gave up (timeout or
// abort; the error words are set): leave `data` alone.
template <int kWorld>
__device__ __forceinline__ bool OneShotSignalAndWait(const OneShotGroup& group, uint32_t epoch) {
  __shared__ int failed;
  auto* own = static_cast<OneShotSignals*>(group.buffers[group.rank]);
  const int b = blockIdx.x;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();  // the whole block pushed before one thread per peer releases the flag
  const int peer = threadIdx.x;
  if (peer < kWorld && peer != group.rank) {
    auto* peer_signals = static_cast<OneShotSignals*>(group.buffers[peer]);
    StoreRelease(&peer_signals->flags[b][group.rank], epoch);
    if (!WaitForPeer(&own->flags[b][peer], epoch, group)) {
      failed = 1;
      own->error = 1;
      if (group.error_word != nullptr) *reinterpret_cast<volatile uint32_t*>(group.error_word) = 1;
    }
  }
  __syncthreads();  // the acquiring threads' view extends to the block
  return !failed;
}

// Where this call's copies live: in every rank's buffer, rank r's copy is slot
// (epoch % 2) * kWorld + r, at `parity` + r * slot_bytes from the buffer's start.
template <int kWorld>
struct OneShotSlots {
  size_t parity;  // bytes from a buffer's start to this call's first slot
  size_t slot_bytes;
  const char* own;  // this rank's buffer + parity

  __device__ __forceinline__ OneShotSlots(const OneShotGroup& group, uint32_t epoch)
      : parity(kOneShotSignalBytes + (epoch % 2) * kWorld * group.slot_bytes),
        slot_bytes(group.slot_bytes),
        own(static_cast<const char*>(group.buffers[group.rank]) + parity) {}
};

// Pushes pack i of this rank's input into its slot of every peer's buffer.
template <typename Pack, int kWorld>
__device__ __forceinline__ void OneShotPush(const OneShotGroup& group,
                                            const OneShotSlots<kWorld>& slots, int64_t i,
                                            const Pack& x) {
  const size_t offset = slots.parity + group.rank * slots.slot_bytes;
#pragma unroll
  for (int r = 0; r < kWorld; ++r) {
    if (r != group.rank) {
      reinterpret_cast<Pack*>(static_cast<char*>(group.buffers[r]) + offset)[i] = x;
    }
  }
}

// Rank-order fp32 sum of pack i over every rank's copy (this rank's own from `mine`), all read
// from this rank's memory.
template <typename T, int kVec, int kWorld>
__device__ __forceinline__ void OneShotSum(int rank, const OneShotSlots<kWorld>& slots, int64_t i,
                                           const OneShotPack<T, kVec>& mine, float (&acc)[kVec]) {
  using Pack = OneShotPack<T, kVec>;
#pragma unroll
  for (int r = 0; r < kWorld; ++r) {
    Pack x = mine;
    if (r != rank) x = LoadCg(reinterpret_cast<const Pack*>(slots.own + r * slots.slot_bytes) + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = r == 0 ? ToFloat(x.v[j]) : acc[j] + ToFloat(x.v[j]);
  }
}

// Grid kOneShotBlocks x kOneShotThreads on every rank. Block b handles packs b*blockDim + t
// (grid-stride) in both phases, so it needs only the peers' block b to have pushed: per-block
// flags, no grid-wide barrier. Arguments as in allreduce_oneshot.h; num_packs = count / kVec.
template <typename T, int kVec, int kWorld>
__global__ void __launch_bounds__(kOneShotThreads)
    OneShotAllReduceKernel(T* data, int64_t num_packs, const __grid_constant__ OneShotGroup group) {
  using Pack = OneShotPack<T, kVec>;
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();
  uint32_t epoch;
  if (!OneShotEnter(group, &epoch)) return;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const OneShotSlots<kWorld> slots(group, epoch);
  Pack* io = reinterpret_cast<Pack*>(data);
  for (int64_t i = first; i < num_packs; i += stride) {
    OneShotPush<Pack, kWorld>(group, slots, i, io[i]);
  }
  if (!OneShotSignalAndWait<kWorld>(group, epoch)) return;
  for (int64_t i = first; i < num_packs; i += stride) {
    float acc[kVec];
    OneShotSum<T, kVec, kWorld>(group.rank, slots, i, io[i], acc);
    Pack sum;
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum.v[j] = FromFloat<T>(acc[j]);
    io[i] = sum;
  }
}

// The all-reduce fused with the residual add and RMSNorm that follow it in a pre-norm layer
// (allreduce_oneshot.h). Block b handles rows b, b + gridDim.x, ...: whole rows, so the norm's
// reduction stays in the block. Thread t owns packs t, t + blockDim.x, ... of a row (kPacks at
// most), the mapping and summation order of RmsNormKernel<8, true> (rmsnorm.cuh) at
// blockDim.x threads, whose arithmetic it repeats on the bf16-rounded sum.
template <int kWorld, int kPacks>
__global__ void __launch_bounds__(kOneShotThreads)
    OneShotAllReduceAddRmsNormKernel(__nv_bfloat16* data, __nv_bfloat16* residual,
                                     const __nv_bfloat16* __restrict__ weight, int rows, int hidden,
                                     float eps, const __grid_constant__ OneShotGroup group) {
  using Pack = OneShotPack<__nv_bfloat16, 8>;
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();
  uint32_t epoch;
  if (!OneShotEnter(group, &epoch)) return;
  const int row_packs = hidden / 8;
  const OneShotSlots<kWorld> slots(group, epoch);
  Pack* io = reinterpret_cast<Pack*>(data);
  Pack* res = reinterpret_cast<Pack*>(residual);
  const Pack* w = reinterpret_cast<const Pack*>(weight);
#pragma unroll 1
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int p = threadIdx.x; p < row_packs; p += blockDim.x) {
      const int64_t i = static_cast<int64_t>(row) * row_packs + p;
      OneShotPush<Pack, kWorld>(group, slots, i, io[i]);
    }
  }
  if (!OneShotSignalAndWait<kWorld>(group, epoch)) return;
#pragma unroll 1
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    float x[kPacks][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int c = 0; c < kPacks; ++c) {
      const int p = threadIdx.x + c * blockDim.x;
      if (p >= row_packs) break;
      const int64_t i = static_cast<int64_t>(row) * row_packs + p;
      float acc[8];
      OneShotSum<__nv_bfloat16, 8, kWorld>(group.rank, slots, i, io[i], acc);
      Pack r = res[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[c][j] = __bfloat162float(__float2bfloat16_rn(acc[j])) + __bfloat162float(r.v[j]);
        r.v[j] = __float2bfloat16_rn(x[c][j]);
      }
      res[i] = r;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += x[c][j] * x[c][j];
    }
    const float inv_rms = rsqrtf(BlockReduceSum(sum_sq) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int c = 0; c < kPacks; ++c) {
      const int p = threadIdx.x + c * blockDim.x;
      if (p >= row_packs) break;
      const Pack wv = w[p];
      Pack y;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y.v[j] = __float2bfloat16_rn(x[c][j] * inv_rms * __bfloat162float(wv.v[j]));
      }
      io[static_cast<int64_t>(row) * row_packs + p] = y;
    }
    __syncthreads();  // BlockReduceSum's scratch is reused by the next row
  }
}

}  // namespace specd::kernels
