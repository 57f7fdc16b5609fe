// One-shot all-reduce for small tensor-parallel messages on one host: every rank's receive buffer
// is mapped into every peer (CUDA IPC, or the same pointer when ranks share a process), and one
// kernel per rank pushes its input into every peer's buffer, raises a flag in every peer, waits
// for every peer's flag on its own buffer and sums all ranks' copies in rank order from local
// memory, so all ranks get identical bits. Pushing (stores to the peers, which NVLink posts)
// instead of staging locally and reading the peers' copies saves one peer round trip per call.
// Graph-capturable: epochs are counters the kernel keeps in device memory. Reference:
// kernels/ref/allreduce.h. Any host thread (the one owning the group's stream); work is queued on
// `stream`.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstddef>
#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

constexpr int kOneShotMaxRanks = 8;
// Fixed grid: every call launches the same blocks, so each block's epoch counter advances once
// per call on every rank and all blocks agree on which staging slot a call uses.
constexpr int kOneShotBlocks = 32;
constexpr int kOneShotThreads = 512;

// Layout of each rank's receive buffer (one device allocation, shared with the peers):
//   [0, kOneShotSignalBytes): OneShotSignals
//   then 2 x world_size slots of `slot_bytes` each: in call e (epoch, from 1) rank r pushes its
//   input into slot (e % 2) * world_size + r of every peer, so a rank one call ahead never
//   overwrites a slot a slower peer is still reading. (The own rank's slots stay unused.)
struct OneShotSignals {
  uint32_t flags[kOneShotBlocks][kOneShotMaxRanks];  // peer r's block b writes [b][r] = epoch
  uint32_t epochs[kOneShotBlocks];                   // this rank's calls so far, per block
  uint32_t error;                                    // 1 after a timeout or abort: skip all work
};
constexpr size_t kOneShotSignalBytes = 4096;
static_assert(sizeof(OneShotSignals) <= kOneShotSignalBytes);

// Bytes of one rank's receive buffer for messages of up to `slot_bytes` (a multiple of 16).
constexpr size_t OneShotBufferBytes(size_t slot_bytes, int world_size) {
  return kOneShotSignalBytes + 2 * static_cast<size_t>(world_size) * slot_bytes;
}

// What a launch needs to know about its group. Plain values; the owner sets it up once.
struct OneShotGroup {
  // [world_size] device pointers valid on this rank's device: rank r's receive buffer
  // (OneShotBufferBytes(slot_bytes, world_size) bytes, zeroed before first use); [rank] is this
  // rank's own.
  void* buffers[kOneShotMaxRanks] = {};
  int32_t rank = 0;
  int32_t world_size = 0;  // 2..kOneShotMaxRanks
  size_t slot_bytes = 0;   // multiple of 16
  // [1] u32, host-mapped (pinned, device-visible), in: nonzero asks waiting kernels to give up.
  // May be null.
  const uint32_t* abort_word = nullptr;
  // [1] u32, host-mapped, out: set to 1 when a kernel gave up (timeout or abort), for the host
  // to read without synchronizing. May be null.
  uint32_t* error_word = nullptr;
  // How long a block waits for a peer's flag before it gives up (sets the error words, leaves
  // `data` unchanged); afterwards every call on this group returns at once doing nothing.
  int64_t timeout_ns = 10'000'000'000;
};

// data <- sum over ranks r = 0..world_size-1 of rank r's data, accumulated in fp32 in rank order
// (acc = x_0; acc += x_1; ...) and rounded once to the storage type. Every rank of the group must
// make the same sequence of calls with the same `count`.
//   data   [count] bf16 or f32, device (this rank's), in/out
//   count  elements; count * sizeof(element) <= group.slot_bytes
// cudaErrorInvalidValue for a bad group or count; count == 0 launches nothing. 16-byte accesses
// when data is 16-byte aligned and the message a multiple of 16 bytes, else one element each.
cudaError_t OneShotAllReduce(__nv_bfloat16* data, int64_t count, const OneShotGroup& group,
                             cudaStream_t stream);
cudaError_t OneShotAllReduce(float* data, int64_t count, const OneShotGroup& group,
                             cudaStream_t stream);

// Widest row OneShotAllReduceAddRmsNorm takes: four 8-element packs per thread.
constexpr int64_t kOneShotMaxNormHidden = int64_t{4} * 8 * kOneShotThreads;

// The all-reduce fused with what a pre-norm decoder layer does next (one kernel instead of two):
// with S = OneShotAllReduce's bf16 sum of data, residual <- residual + S and data <-
// RMSNorm(residual) * weight, each exactly as FusedAddRmsNorm (rmsnorm.h) computes them from S
// (bit for bit where FusedAddRmsNorm runs one thread per 8 elements, as at hidden 4096; within
// fp32 reduction order elsewhere). Every rank of the group makes the same sequence of calls
// (plain and fused calls share the epochs).
//   data      [rows, hidden] bf16, device, in/out; rows * hidden * 2 <= group.slot_bytes
//   residual  [rows, hidden] bf16, device, in/out
//   weight    [hidden] bf16, device
// World sizes 2, 4 and 8 (OneShotFusesNorm; the tensor-parallel sizes in use: the other
// instantiations spilled registers), hidden a multiple of 8 up to kOneShotMaxNormHidden and
// 16-byte aligned pointers; cudaErrorInvalidValue otherwise and for a bad group. rows == 0
// launches nothing.
cudaError_t OneShotAllReduceAddRmsNorm(__nv_bfloat16* data, __nv_bfloat16* residual,
                                       const __nv_bfloat16* weight, int64_t rows, int64_t hidden,
                                       float eps, const OneShotGroup& group, cudaStream_t stream);

// Whether OneShotAllReduceAddRmsNorm takes [rows, hidden] on a group of world_size ranks whose
// slots hold slot_bytes.
constexpr bool OneShotFusesNorm(int32_t world_size, int64_t rows, int64_t hidden,
                                size_t slot_bytes) {
  return (world_size == 2 || world_size == 4 || world_size == 8) && rows >= 0 && hidden >= 8 &&
         hidden % 8 == 0 && hidden <= kOneShotMaxNormHidden &&
         static_cast<size_t>(rows) * static_cast<size_t>(hidden) * 2 <= slot_bytes;
}

}  // namespace specd::kernels
