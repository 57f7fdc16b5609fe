// A tensor-parallel verifier group (docs/architecture.md, "Tensor parallelism"): one OS process
// per rank. Rank 0 (this process) runs the engine and holds shard 0 behind a ModelRunner that
// the engine uses like any other (TpLeaderRunner, tp_group.cc); ranks 1..N-1 are `specd worker`
// processes (RunTpWorker) that rank 0 launches on this host, or that are started on other hosts
// and join through the rendezvous: TCP, the authenticated Hello handshake of engine/distributed
// (role tensor-parallel leader / worker), then TpJoin (which rank) -> TpInit (what to load, the
// communicator's id) -> TpReady (loaded, its KV block count). Afterwards every runner call that
// runs the model is sent to each worker as a TpStep before rank 0 makes it, so all ranks run the
// same forward and the same collectives; every data-dependent decision (drafts, accepted
// lengths, K, whether a draft pass runs) stays on rank 0 and reaches workers only as the calls
// they repeat, so ranks cannot diverge.
//
// Faults: both ends exchange heartbeats every second on the control link. A worker that dies
// (its link closes), stops answering for `timeout`, or reports an error fails the group: the
// communicator is aborted (a collective in flight returns instead of hanging), every later call
// returns Unavailable naming the rank, and GroupStatus() says so (the engine then ends every
// request with that error, readiness fails and `specd serve` exits non-zero). A worker whose
// rank 0 goes away exits non-zero.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/runner/model_runner.h"

namespace specd {

struct TpGroupOptions {
  int32_t world_size = 1;  // ranks in all (>= 2 here)
  int32_t nnodes = 1;      // hosts; world_size / nnodes ranks on each
  int32_t node_rank = 0;   // this host's index; rank 0 runs on node 0
  // Where workers connect: rank 0 listens on master_addr:master_port (one node: 127.0.0.1 and a
  // free port; several nodes: an address the other hosts reach and a fixed port).
  std::string master_addr = "127.0.0.1";
  int32_t master_port = 0;
  // Several nodes: the group's shared secret (64 hex digits, mode 0600), the same file on every
  // host; empty: $SPECD_TP_SECRET. One node: unused (a fresh secret goes to the launched workers
  // in their environment).
  std::string secret_file;
  absl::Duration timeout = absl::Seconds(60);  // a silent rank or a stuck collective
  // "auto" (NCCL on GPUs, shared memory on CPUs), "nccl" or "shm".
  std::string communicator = "auto";
  // The `specd` binary the workers run; "": this process's own executable (tests name specd).
  std::string worker_binary;
};

// The environment variable that hands a launched worker the group's secret.
inline constexpr char kTpSecretEnv[] = "SPECD_TP_SECRET";

// Starts the group for `runner` (runner.tp and runner.comm are set here) and returns rank 0's
// runner. Launches this node's worker ranks (`specd worker` from /proc/self/exe, GPU r of this
// host for rank r on CUDA), waits up to `timeout` for every rank to join and load, and agrees on
// the KV block count (the minimum). Errors name the rank and what it reported.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateTpGroup(const RunnerOptions& runner,
                                                           const TpGroupOptions& group);

// `specd worker`: one worker rank.
struct TpWorkerOptions {
  std::string master_addr = "127.0.0.1";
  int32_t master_port = 0;
  int32_t rank = -1;            // -1: every rank of this node (see below)
  int32_t world_size = 0;       // with rank -1: the group's size
  int32_t nnodes = 1;           // with rank -1
  int32_t node_rank = 0;        // with rank -1: this node launches ranks
                                // node_rank * (world_size / nnodes) + [0, per node)
  std::string device = "auto";  // this rank's device ("cpu", "cuda:N"; auto: cuda:<local index>)
  int32_t num_threads = 0;      // CPU threads of this rank
  std::string secret_file;      // else $SPECD_TP_SECRET
  absl::Duration connect_timeout = absl::Seconds(120);
  std::function<void()> on_ready;  // this rank joined and loaded (a node: its ranks started)
};
// Joins the group and serves rank 0's calls until it shuts the group down (OK) or fails
// (Unavailable / the runner's error). With rank -1, launches this node's ranks as child
// processes and returns once they all exited (the first failure's status).
absl::Status RunTpWorker(const TpWorkerOptions& options);

}  // namespace specd
