// The one-shot all-reduce path of NcclCommunicator (nccl_communicator.h) for small messages on
// one host: each rank's staging buffer is mapped into every peer (CUDA IPC across processes, the
// plain pointer between threads of one process), and one kernel per call
// (kernels/cuda/allreduce_oneshot.h) replaces NCCL's latency-bound small all-reduce. Results are
// summed in rank order, identical on every rank. Built only with NCCL (this file is compiled
// inside the NCCL block of CMakeLists.txt). Threads: the communicator's collective thread; Abort
// from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "kernels/cuda/allreduce_oneshot.h"

namespace specd {

// Gathers `mine` (the same size on every rank) from every rank into `all`, rank r's bytes at
// [r * mine.size(), (r + 1) * mine.size()). A collective: every rank calls it.
using HostAllGather =
    std::function<absl::Status(std::span<const uint8_t> mine, std::span<uint8_t> all)>;

class OneShotAllReduce {
 public:
  // Sets up the group for messages of up to `max_bytes` (the smallest any rank asked for; 0
  // turns the path off for all). A collective over `gather` (every rank calls it, whatever its
  // max_bytes); every rank reaches the same answer. Returns nullptr, after logging
  // why, when some rank cannot use the path (world size outside 2..8, ranks on different hosts,
  // no peer access, an allocation or IPC mapping failed); an error only when `gather` failed.
  static absl::StatusOr<std::unique_ptr<OneShotAllReduce>> Create(int32_t rank, int32_t world_size,
                                                                  int32_t device, size_t max_bytes,
                                                                  const HostAllGather& gather);
  ~OneShotAllReduce();  // unmaps the peers' buffers and frees this rank's; callers make sure no
                        // peer still runs a call (the communicator barriers first)
  OneShotAllReduce(const OneShotAllReduce&) = delete;
  OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

  // Largest message the staging slots hold, in bytes.
  size_t capacity() const { return group_.slot_bytes; }
  // Whether the path takes a message of `count` elements of `type` (bf16 and f32 only).
  bool Accepts(size_t count, CommDataType type) const;

  // In-place sum of `data` ([count] of `type`, device) over the ranks, queued on `stream`
  // (a cudaStream_t). Unavailable once a kernel gave up waiting for a peer or after Abort.
  absl::Status Run(void* data, size_t count, CommDataType type, void* stream);
  // Whether RunAddRmsNorm takes [rows, hidden] (kernels::OneShotFusesNorm).
  bool AcceptsAddRmsNorm(int64_t rows, int64_t hidden) const;
  // The sum fused with the residual add and RMSNorm that follow it
  // (kernels::OneShotAllReduceAddRmsNorm; Communicator::AllReduceAddRmsNorm), on `stream`.
  absl::Status RunAddRmsNorm(void* data, void* residual, const void* weight, int64_t rows,
                             int64_t hidden, float eps, void* stream);

  // Makes kernels waiting for a peer give up (within microseconds) and later calls return
  // Unavailable. Any thread.
  void Abort();
  // True once a kernel gave up (it set the host-mapped error word).
  bool GaveUp() const;

  struct RankInfo;  // what the ranks exchange at setup (defined in the .cc)

 private:
  OneShotAllReduce() = default;
  // Allocates and zeroes this rank's staging buffer (slots of `slot` bytes) and the host-mapped
  // words, filling `info`; empty, or what failed.
  std::string AllocateLocal(size_t slot, RankInfo& info);
  // Unavailable, saying whether this rank aborted or a kernel timed out.
  absl::Status GaveUpError() const;
  // Maps rank r's buffer (described by `peer`) on this rank's GPU; empty, or why it cannot.
  std::string MapPeer(int32_t r, const RankInfo& peer, const RankInfo& mine);

  int32_t device_ = 0;
  kernels::OneShotGroup group_;
  void* own_buffer_ =
      nullptr;  // [OneShotBufferBytes(slot, world)] bytes, device: group_.buffers[rank]
  // Peers' buffers opened with cudaIpcOpenMemHandle (closed on destruction); the same-process
  // peers' pointers are borrowed.
  void* opened_[kernels::kOneShotMaxRanks] = {};
  uint32_t* host_words_ = nullptr;  // [2] u32, pinned host-mapped: abort word, error word
};

}  // namespace specd
