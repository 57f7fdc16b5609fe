// NcclCommunicator: the device Communicator (engine/base/communicator.h) for GPU tensor-parallel
// ranks, one process (or, in tests, one thread) per GPU. Collectives are NCCL calls enqueued on
// the caller's stream (a cudaStream_t passed as void*), so they return before the work is done
// and may be captured in a CUDA graph. The rendezvous carries the unique id: rank 0 calls
// NewNcclUniqueId and sends the bytes to the others, then every rank calls Create.
//
// Failure model: NCCL has no timeouts and a dead peer leaves a collective spinning on the GPU. The
// communicator is non-blocking (ncclConfig_t.blocking = 0): a call that returns ncclInProgress is
// polled (ncclCommGetAsyncError) until it is queued, with a deadline and an abort check, and
// Abort() (any thread; e.g. a watchdog that saw a rank die) calls ncclCommAbort, which ends
// kernels blocked on a peer. Afterwards every call returns Unavailable; graphs that captured this
// communicator's collectives must not be replayed again.
//
// Results are identical on every rank (NCCL's reductions hand every rank the same reduced bits),
// but the summation order is NCCL's, not necessarily rank order.
//
// Small all-reduces (bf16 and f32 up to oneshot_max_bytes(), 1 MiB by default for two ranks) take a
// one-shot path instead when every rank is on one host and every pair of GPUs has peer access: one
// kernel over CUDA-IPC-mapped staging buffers (oneshot_allreduce.h), summing in rank order (the
// same bits on every rank), to cut NCCL's latency at these sizes (nccl_communicator_test prints a
// one-shot vs NCCL table). Its kernels give up after 10 s without a peer (later calls return
// Unavailable) and end at once on Abort. Setup problems only turn it off (logged).
// No NCCL or CUDA header leaks from here (pimpl). Built for real only when NCCL was found at
// configure time; otherwise NewNcclUniqueId and Create return Unimplemented.
// Threads: one thread issues collectives; Abort from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"

namespace specd {

// True when this build has NCCL (Create can succeed).
bool NcclAvailable();

// A fresh ncclUniqueId as bytes (128), for the rendezvous to hand to every rank.
absl::StatusOr<std::vector<uint8_t>> NewNcclUniqueId();

struct NcclCommunicatorOptions {
  // Largest all-reduce, in bytes, for the one-shot path; 0 turns it off. Negative: the
  // environment variable SPECD_ONESHOT_ALLREDUCE_MAX_BYTES, else 1 MiB for two ranks and 128 KiB
  // for more (measured at two: docs/benchmarks.md). The ranks use the smallest value any of them
  // asked for (at most 16 MiB).
  int64_t oneshot_max_bytes = -1;
};

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group on CUDA device `device` (made current on the calling thread, which must be
  // the thread that issues collectives). Returns once all `world_size` ranks joined;
  // DeadlineExceeded when they did not within 120 s. InvalidArgument for a wrong-sized id or a
  // bad rank.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::span<const uint8_t> unique_id, int32_t rank, int32_t world_size, int32_t device,
      const NcclCommunicatorOptions& options = {});
  ~NcclCommunicator() override;  // finalizes the communicator, or aborts it after a failure
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int32_t rank() const override;
  int32_t world_size() const override;
  bool on_device() const override { return true; }
  std::string name() const override { return "nccl"; }

  // Device pointers of this rank's GPU, enqueued on `stream`. AllReduceSum: kF32, kBF16 (and
  // kI32); AllGather and Broadcast: any type. Barrier all-reduces one int on the stream.
  // Unavailable after Abort or when a peer never let the call be queued (the group is failed).
  absl::Status AllReduceSum(void* data, size_t count, CommDataType type, void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, CommDataType type,
                         void* stream) override;
  absl::Status Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                         void* stream) override;
  absl::Status Barrier(void* stream) override;
  bool FusesAllReduceAddRmsNorm(int64_t rows, int64_t hidden) const override;
  absl::Status AllReduceAddRmsNorm(void* data, void* residual, const void* weight, int64_t rows,
                                   int64_t hidden, float eps, void* stream) override;

  void Abort() override;

  // The communicator's asynchronous state: OK, Unavailable after Abort, Internal when NCCL
  // reported an error (a peer's failure shows up here while a kernel waits for it).
  absl::Status AsyncError();

  // Whether the one-shot path was set up (on all ranks or none), and the largest all-reduce in
  // bytes it takes (0 when off).
  bool oneshot_enabled() const;
  size_t oneshot_max_bytes() const;
  // Lowers (or restores, up to the size set up at Create) the one-shot limit; 0 sends every
  // all-reduce through NCCL. Every rank must make the same call at the same point in its
  // sequence of collectives, or ranks would wait in different algorithms. For tests and
  // benchmarks.
  void set_oneshot_max_bytes(size_t bytes);

  struct Impl;  // NCCL state; defined in nccl_communicator.cc

 private:
  explicit NcclCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specd
