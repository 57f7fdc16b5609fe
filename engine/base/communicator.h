// Collectives of a tensor-parallel group: one rank per process, ranks 0..world_size-1. The model
// forward (engine/model on the CPU, engine/runner on a GPU) calls them at the points where its
// sharded layers meet (after the row-parallel o_proj and down_proj, after the vocabulary-parallel
// embedding, to gather the vocabulary-parallel logits). Implementations live in
// engine/distributed: ShmCommunicator (CPU ranks on one host: per-rank shared-memory segments and
// stamps, no sockets on the data path) and NcclCommunicator (GPU ranks: NCCL, plus a one-shot
// all-reduce over peer-mapped buffers for small messages on one node). A world of one rank is
// valid everywhere and every collective is then a copy or nothing.
//
// Every rank must call the same collectives in the same order with the same sizes (rank 0 decides
// everything data-dependent and broadcasts it first, so this holds by construction). Results are
// identical on every rank: sums are taken in rank order.
//
// Memory: a host communicator (on_device() false) takes host pointers and ignores `stream`; a
// device communicator takes pointers in its GPU's memory and enqueues on `stream` (a cudaStream_t
// passed as void*, so this header needs no CUDA), returning before the work is done, and its calls
// may be captured in a CUDA graph.
//
// Faults: a collective that cannot complete because a peer died, stopped or was aborted returns
// Unavailable (host) or leaves the group failed (device: the next call or a later synchronisation
// reports it) instead of hanging. Abort() may be called from any thread (a watchdog that saw a rank
// die) and makes every blocked and later collective of this rank return Unavailable.
// Threads: one thread issues collectives; Abort from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace specd {

enum class CommDataType : uint8_t { kF32 = 0, kBF16 = 1, kI32 = 2 };

// Bytes of one element.
inline size_t CommDataTypeBytes(CommDataType t) { return t == CommDataType::kBF16 ? 2 : 4; }

// Which slice of the model a rank holds.
struct TensorParallel {
  int32_t rank = 0;
  int32_t world_size = 1;
  bool enabled() const { return world_size > 1; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  // Whether the buffers are device memory (see the header comment).
  virtual bool on_device() const = 0;
  // "shm", "nccl", ... for logs.
  virtual std::string name() const = 0;

  // In place: data[i] = sum over ranks of data[i], count elements. kF32 and kBF16 (device);
  // kF32 (host).
  virtual absl::Status AllReduceSum(void* data, size_t count, CommDataType type, void* stream) = 0;
  // recv = [world_size, count] with rank r's `send` at row r. `send` and `recv` may not overlap,
  // except that send may be recv + rank * count (in place).
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, CommDataType type,
                                 void* stream) = 0;
  // data on every rank = data on `root`.
  virtual absl::Status Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                                 void* stream) = 0;
  // Returns once every rank entered it (device: once this rank's stream reached it and the other
  // ranks' streams did too; the host waits).
  virtual absl::Status Barrier(void* stream) = 0;

  // The all-reduce fused with the residual add and RMSNorm a pre-norm decoder layer applies to
  // its result, where the communicator has a kernel for it (NcclCommunicator's one-shot path):
  // with S the sum over ranks of `data` ([rows, hidden] bf16, device), residual += S and data =
  // RMSNorm(residual) * weight (`weight` [hidden] bf16), as kernels::FusedAddRmsNorm computes
  // them. Only when FusesAllReduceAddRmsNorm(rows, hidden) said yes; callers otherwise run
  // AllReduceSum and the norm themselves.
  virtual bool FusesAllReduceAddRmsNorm(int64_t /*rows*/, int64_t /*hidden*/) const {
    return false;
  }
  virtual absl::Status AllReduceAddRmsNorm(void* /*data*/, void* /*residual*/,
                                           const void* /*weight*/, int64_t /*rows*/,
                                           int64_t /*hidden*/, float /*eps*/, void* /*stream*/) {
    return absl::UnimplementedError("this communicator has no fused all-reduce and RMSNorm");
  }

  // Thread-safe: fails the group on this rank (see the header comment). Idempotent.
  virtual void Abort() = 0;
};

}  // namespace specd
