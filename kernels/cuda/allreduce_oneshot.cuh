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

// Grid kOneShotBlocks x kOneShotThreads on every rank. Block b handles packs b*blockDim + t
// (grid-stride) in both phases, so it needs only the peers' block b to have pushed: per-block
// flags, no grid-wide barrier. Arguments as in allreduce_oneshot.h; num_packs = count / kVec.
template <typename T, int kVec, int kWorld>
__global__ void __launch_bounds__(kOneShotThreads)
    OneShotAllReduceKernel(T* data, int64_t num_packs, OneShotGroup group) {
  using Pack = OneShotPack<T, kVec>;
  __shared__ uint32_t epoch_shared;
  __shared__ int failed;
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();
  auto* own = static_cast<OneShotSignals*>(group.buffers[group.rank]);
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    failed = *reinterpret_cast<volatile uint32_t*>(&own->error) != 0;
    epoch_shared = own->epochs[b] + 1;
    if (!failed) own->epochs[b] = epoch_shared;
  }
  __syncthreads();
  if (failed) return;  // an earlier call gave up: the peers' epochs no longer match ours
  const uint32_t epoch = epoch_shared;
  // This call's slot from source rank r, in any rank's buffer: (epoch % 2) * kWorld + r.
  const size_t parity_offset = kOneShotSignalBytes + (epoch % 2) * kWorld * group.slot_bytes;
  const auto slot = [&](int buffer_rank, int source) {
    return reinterpret_cast<Pack*>(static_cast<char*>(group.buffers[buffer_rank]) + parity_offset +
                                   source * group.slot_bytes);
  };
  const int64_t first = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;

  // 1. Push this rank's input into its slot in every peer's buffer.
  const Pack* in = reinterpret_cast<const Pack*>(data);
  for (int64_t i = first; i < num_packs; i += stride) {
    const Pack x = in[i];
#pragma unroll
    for (int r = 0; r < kWorld; ++r) {
      if (r != group.rank) slot(r, group.rank)[i] = x;
    }
  }
  __syncthreads();  // the whole block pushed before one thread per peer releases the flag

  // 2. Tell every peer this block's part has arrived, then wait for theirs (a local spin).
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
  if (failed) return;

  // 3. Sum every rank's copy in rank order, all from this rank's memory.
  Pack* out = reinterpret_cast<Pack*>(data);
  for (int64_t i = first; i < num_packs; i += stride) {
    Pack x[kWorld];
#pragma unroll
    for (int r = 0; r < kWorld; ++r)
      x[r] = r == group.rank ? out[i] : LoadCg(slot(group.rank, r) + i);
    Pack sum;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float acc = ToFloat(x[0].v[j]);
#pragma unroll
      for (int r = 1; r < kWorld; ++r) acc += ToFloat(x[r].v[j]);
      sum.v[j] = FromFloat<T>(acc);
    }
    out[i] = sum;
  }
}

}  // namespace specd::kernels
