// The tensor-parallel group's handshake, shared by rank 0 (tp_group.cc) and the worker ranks
// (tp_worker.cc): the group's checks, both ends' Hello, the communicator (its kind and token), the
// TpInit built from rank 0's runner options, the typed receive and the heartbeat interval.
// Used inside engine/parallel only. Pure functions unless stated; any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/base/communicator.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/messages.h"
#include "engine/parallel/tp_group.h"
#include "engine/runner/model_runner.h"

namespace specd::tp_handshake {

// How often each end of a control link sends a heartbeat (and polls for the other's).
inline constexpr absl::Duration kHeartbeatInterval = absl::Seconds(1);

// InvalidArgument for sizes that do not make a group (world_size >= 2, divisible by nnodes,
// node_rank 0 for rank 0's side).
absl::Status ValidateGroup(const TpGroupOptions& group);

// "nccl" or "shm" for the requested communicator on this device; InvalidArgument for a kind
// that cannot work (shm across hosts, nccl on CPU ranks).
absl::StatusOr<std::string> CommunicatorKind(const std::string& requested, bool cuda,
                                             const TpGroupOptions& group);

// Both ends' Hello: the same fingerprint and TpWireLimits(); a fresh nonce.
Hello TpHello(Role role);

// CPU threads for each of this host's ranks: the request, or the cores shared among them.
int32_t ThreadsPerRank(int32_t requested, int32_t ranks_on_host);

// A fresh id for the communicator: the shm group name (hex) or an ncclUniqueId.
absl::StatusOr<std::vector<uint8_t>> NewCommToken(const std::string& kind);

// Joins the group's communicator as `rank` (device: the GPU for NCCL).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& kind,
                                                                 const std::vector<uint8_t>& token,
                                                                 int32_t rank, int32_t world_size,
                                                                 int32_t device,
                                                                 absl::Duration timeout);

// rank 0's runner options as a TpInit (rank to be set per worker), and back on a worker.
TpInit MakeTpInit(const RunnerOptions& runner, int32_t world_size, const std::string& comm_kind,
                  const std::vector<uint8_t>& token, absl::Duration timeout);
RunnerOptions RunnerOptionsFrom(const TpInit& init, const std::string& device, int32_t num_threads);

// Receives one message, which must be a T: a Shutdown or anything else is an error naming it.
template <typename T>
absl::StatusOr<T> RecvAs(Channel& link, absl::Duration timeout) {
  Message message;
  absl::StatusOr<MessageType> got = link.Recv(timeout, &message);
  if (!got.ok()) return got.status();
  if (const T* m = std::get_if<T>(&message)) return *m;
  if (const Shutdown* s = std::get_if<Shutdown>(&message)) {
    return absl::UnavailableError(absl::StrCat("the peer shut down: ", s->reason));
  }
  return absl::InternalError(absl::StrCat("expected ",
                                          DistView(MessageTypeName(MessageTypeOf<T>())), ", got ",
                                          DistView(MessageTypeName(*got))));
}

}  // namespace specd::tp_handshake
