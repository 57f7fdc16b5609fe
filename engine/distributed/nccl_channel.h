// NcclChannel: the device half of the SSD channel. Control messages (SpeculateRequest/Response
// with probs_out_of_band) stay on a Channel (TcpChannel); the bulk payload (q rows, draft tokens
// when wanted on the device) moves GPU to GPU with ncclSend/ncclRecv inside a 2-rank NCCL
// communicator: rank 0 = verifier (GPU 0), rank 1 = speculator (GPU 1). The verifier creates the
// ncclUniqueId and sends it over the control channel (BulkLinkInit), so the TCP rendezvous is the
// only bootstrap and the ranks may be on different hosts.
//
// NOT EXERCISED IN CI (no GPU there): tested by nccl_channel_test (ctest label gpu, 2 GPUs; packed
// and run by tools/gpu/package.sh + run_all.sh; passed on 2x H200, NCCL 2.28: 6.1 MB of q rows
// in ~205 us, and Abort after a killed peer). Built only when CUDA and NCCL are found at
// configure time; otherwise Create returns Unimplemented. No NCCL or CUDA header leaks from
// here: streams are passed as `void*` (a cudaStream_t) and the communicator hides behind a pimpl.
//
// Failure model: NCCL has no timeouts of its own and a dead peer leaves a posted send/receive
// spinning on the GPU forever. The communicator is therefore non-blocking, Synchronize waits with
// a deadline, and the owner calls Abort() when the control channel reports the peer Unavailable
// (or Synchronize times out); Abort ends pending operations and the NcclChannel is dead after it.
// Threads: Send/Recv/Synchronize from one thread (the engine or speculator thread); Abort from
// any thread.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/messages.h"

namespace specd {

class NcclChannel {
 public:
  // True when this build has NCCL (Create can succeed).
  static bool Available();

  // Joins the 2-rank communicator beside `control` (an open, handshaken channel on which no other
  // message is in flight towards the speculator until this returns). The verifier (rank 0)
  // generates the unique id and sends it as BulkLinkInit; the speculator (rank 1) receives it.
  // Selects `cuda_device` on the calling thread. DeadlineExceeded when the peer did not join
  // within `timeout`; Unimplemented without NCCL.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Create(Channel& control, Role role,
                                                             int cuda_device,
                                                             absl::Duration timeout);
  ~NcclChannel();  // finalizes the communicator, or aborts it after a failure
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  // Enqueues sending `bytes` bytes at `device_data` ([bytes] u8, device memory of this rank's
  // GPU) to the peer on `cuda_stream` (cudaStream_t; nullptr = legacy default stream). The peer
  // must post a Recv of the same size. Asynchronous: done when the stream reaches it. The first
  // operation also connects the two ranks and waits (up to 30 s, or until Abort) for the peer.
  absl::Status Send(const void* device_data, size_t bytes, void* cuda_stream);
  // Send, enqueued by the channel's own thread (queuing an NCCL operation takes a few hundred
  // microseconds the caller need not wait for). Every other call here first waits until that
  // send is queued (so operations reach NCCL and the stream in the order they were called) and
  // returns its error if it failed; so does the next SendAsync.
  absl::Status SendAsync(const void* device_data, size_t bytes, void* cuda_stream);
  // Enqueues receiving `bytes` bytes from the peer into `device_data` ([bytes] u8, device).
  absl::Status Recv(void* device_data, size_t bytes, void* cuda_stream);

  // Waits until `cuda_stream` drained, watching the communicator: DeadlineExceeded when it did not
  // within `timeout` (the peer stalled or died: Abort next), Unavailable after Abort, Internal on
  // an NCCL or CUDA error.
  absl::Status Synchronize(void* cuda_stream, absl::Duration timeout);

  // Aborts the communicator: pending operations end, later calls return Unavailable. Idempotent.
  void Abort();

  // The channel's own stream on its GPU (a cudaStream_t, non-blocking), for transfers that must
  // not wait behind, or hold up, the caller's compute stream.
  void* stream() const;
  // A device buffer of at least `bytes` on this rank's GPU, owned by the channel (the SSD data
  // path's send staging or receive target); `slot` (< kNumBuffers) picks one of several
  // independent ones. Growing one first waits for stream() and drops its contents; the pointer
  // stays valid until the next larger request of that slot or the channel's end.
  static constexpr int kNumBuffers = 4;
  absl::StatusOr<void*> Buffer(size_t bytes, int slot = 0);
  // Enqueues a device-to-device copy of `bytes` bytes on this rank's GPU on stream().
  absl::Status Copy(void* device_dst, const void* device_src, size_t bytes);

  // This process's rank: 0 verifier, 1 speculator.
  int rank() const;

  struct Impl;  // NCCL state; defined in nccl_channel.cc

 private:
  explicit NcclChannel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specd
