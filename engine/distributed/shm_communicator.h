// ShmCommunicator: the host Communicator (engine/base/communicator.h) for CPU tensor-parallel
// ranks, one process each, on one host. Every rank owns one POSIX shared-memory segment (header +
// two payload buffers) and maps all its peers'; data moves by memcpy through the segments and
// ranks meet through per-rank stamps (std::atomic counters in the mapped memory, acquire/release),
// so nothing but memory is on the data path (the design of vLLM's CPU shm all-reduce).
//
// Protocol: collectives are split into steps (one per chunk of at most max_bytes); every rank
// runs the same steps in the same order, numbered 1, 2, ... For step k a rank waits until every
// peer has consumed step k-2 (the last step that used the same buffer), copies its payload into
// its buffer k % 2, publishes k, waits until the ranks it reads from published k, reads their
// buffers, then marks k consumed. So a fast rank never overwrites data a slow rank still reads.
// Messages larger than max_bytes are split into chunks (never refused).
//
// Rendezvous: Create makes this rank's segment (/dev/shm/specd-<group>-r<rank>, mode 0600), maps
// every peer's as it appears, and returns once all ranks have attached; each rank then unlinks its
// own name, so nothing is left in /dev/shm however the processes end later. A rank missing at the
// deadline is DeadlineExceeded naming it.
//
// Faults: a waiting rank spins briefly, then yields, then sleeps on a futex word in the peer's
// segment that the peer bumps and wakes whenever it publishes (N ranks on fewer cores still make
// progress), and on the slow path checks the deadline, Abort, and each peer it waits for: its pid
// (kill(pid, 0) and /proc zombie state) and its failure flag (a rank that fails or aborts marks its
// segment, with the reason, so the group fails together). Such a failure is Unavailable naming the
// rank; after it every later call returns the same status.
// Threads: one thread issues collectives; Abort from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/base/communicator.h"

namespace specd {

struct ShmOptions {
  // The group's id, handed out by the rendezvous (e.g. 16 random hex chars): 1..64 characters of
  // [A-Za-z0-9_-]. Segment names derive from it, so it must be fresh for every group.
  std::string group;
  int32_t rank = 0;
  int32_t world_size = 1;
  // Largest payload one rank moves in one step (rounded up to 64); each segment holds two such
  // buffers. Larger collectives take several steps. Must agree across ranks.
  size_t max_bytes = size_t{1} << 20;
  // How long Create waits for peers to arrive, and a collective for a peer to reach it.
  absl::Duration timeout = absl::Seconds(60);
};

class ShmCommunicator final : public Communicator {
 public:
  // Joins the group (see the header comment). InvalidArgument for bad options or a peer created
  // with different world_size / max_bytes; AlreadyExists when this rank's segment name is taken;
  // DeadlineExceeded naming the ranks that did not arrive; Unavailable when a peer failed.
  // World size 1 maps nothing.
  static absl::StatusOr<std::unique_ptr<ShmCommunicator>> Create(const ShmOptions& options);
  ~ShmCommunicator() override;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_size_; }
  bool on_device() const override { return false; }
  std::string name() const override { return "shm"; }

  // Host pointers; `stream` is ignored. AllReduceSum takes kF32 only (each rank sums all ranks'
  // chunks in rank order, so results are bitwise identical); AllGather and Broadcast copy bytes of
  // any type.
  absl::Status AllReduceSum(void* data, size_t count, CommDataType type, void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, CommDataType type,
                         void* stream) override;
  absl::Status Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                         void* stream) override;
  absl::Status Barrier(void* stream) override;

  void Abort() override;

  struct Segment;  // the mapped header; defined in shm_communicator.cc

 private:
  explicit ShmCommunicator(const ShmOptions& options);

  // Create's steps: make and publish this rank's segment, map the peers', meet all of them.
  absl::Status CreateOwnSegment();
  absl::Status MapPeers(absl::Time deadline);
  absl::Status MeetPeers(absl::Time deadline);

  // One protocol step: `payload` ([bytes] u8, host; may be null with bytes 0) goes into this
  // rank's buffer, then `read` runs once `from` (a rank, or -1 for all peers) published the step.
  template <typename Read>
  absl::Status Step(const void* payload, size_t bytes, int32_t from, Read&& read);
  // Waits until `ready(peer)` holds for `from` (a rank or -1 = all peers), spinning, yielding,
  // then sleeping; Unavailable when a lagging peer died, failed or stayed past the timeout.
  template <typename Ready>
  absl::Status WaitFor(int32_t from, Ready&& ready, const char* what);
  // Status of a peer that is lagging: its failure flag and whether its process is alive.
  absl::Status CheckPeer(int32_t peer, bool check_pid) const;
  // The status a call returns before starting: OK, the first failure, or Unavailable after Abort.
  absl::Status Precheck();
  // Records `status` as this rank's failure and marks the segment so peers stop waiting.
  absl::Status Fail(absl::Status status);
  void MarkFailed(const std::string& reason);
  uint8_t* Buffer(int32_t rank, uint64_t step) const;
  // Futex hand-off between ranks: Wake after changing a stamp of `s`; SleepOn until `s` changes
  // (or a short timeout), unless `ready` already holds.
  static void Wake(Segment* s);
  template <typename Ready>
  static void SleepOn(Segment* s, Ready&& ready);

  const std::string group_;
  const int32_t rank_;
  const int32_t world_size_;
  const size_t buffer_bytes_;  // max_bytes rounded up to 64
  const size_t segment_bytes_;
  const absl::Duration timeout_;
  const int spin_polls_;  // polls before yielding: long with a core per rank, short without

  std::vector<Segment*> segments_;  // [world_size]: mapped segments, this rank's included
  bool own_name_linked_ = false;    // this rank's name still in /dev/shm (Create not finished)
  uint64_t step_ = 0;               // the last step this rank ran
  absl::Status failed_;             // the first failure; collective thread only
  std::atomic<bool> aborted_{false};
};

}  // namespace specd
