// Tensor-parallel collectives among N ranks that are threads of one process, over host memory:
// tests of sharded forwards (engine/model, engine/runner) without processes. The last rank to
// enter a collective performs it for every rank while the others wait, so a sum is taken in rank
// order and every rank gets identical bits. Processes use engine/distributed's communicators.
// Threads: rank r's Communicator is called by one thread at a time (rank r's); Abort and
// LocalCommGroup::Abort from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "engine/base/communicator.h"

namespace specd {

class LocalCommGroup {
 public:
  explicit LocalCommGroup(int32_t world_size);
  ~LocalCommGroup();
  LocalCommGroup(const LocalCommGroup&) = delete;
  LocalCommGroup& operator=(const LocalCommGroup&) = delete;

  int32_t world_size() const { return world_size_; }
  // Rank `rank`'s communicator, owned by the group.
  Communicator* comm(int32_t rank);
  // Fails the group: every blocked and later collective of every rank returns Unavailable (a
  // rank's Abort does the same: the others could never complete a collective without it).
  void Abort();

 private:
  class RankComm;
  enum class Op { kAllReduceSum, kAllGather, kBroadcast, kBarrier };
  // One rank's side of a collective.
  struct Call {
    Op op = Op::kBarrier;
    const void* send = nullptr;  // AllGather's input
    void* data = nullptr;        // AllReduceSum / Broadcast: in and out; AllGather: recv
    size_t count = 0;
    CommDataType type = CommDataType::kF32;
    int32_t root = 0;
  };

  absl::Status Collective(int32_t rank, const Call& call);
  absl::Status Perform() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PerformAllReduceSum() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t world_size_;
  std::vector<std::unique_ptr<RankComm>> ranks_;  // [world_size]
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);  // [world_size] this generation's calls
  int32_t arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // collectives completed
  absl::Status result_ ABSL_GUARDED_BY(mu_);      // of the last completed collective
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);  // [count] AllReduceSum scratch
};

}  // namespace specd
