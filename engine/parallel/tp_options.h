// Tensor parallelism's options (`--tensor-parallel-size` and friends, vLLM's names): the target
// is split over `size` ranks, one process each; rank 0 launches the workers of its host
// (`specd worker`), and with nnodes > 1 the other hosts' workers join it (docs/architecture.md,
// "Tensor parallelism"). A leaf of EngineOptions / ServeOptions / WorkerProcessOptions; the
// flags are server/option_flags.h AddTensorParallelFlags. Plain values; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace specd {

struct TensorParallelOptions {
  int32_t size = 1;    // ranks; 1: no tensor parallelism
  int32_t nnodes = 1;  // hosts, size / nnodes ranks each
  int32_t node_rank = 0;
  std::string master_addr = "127.0.0.1";       // where the other hosts' workers connect
  int32_t master_port = 0;                     // 0: a free port (one host only)
  std::string secret_file;                     // several hosts: the group's secret (mode 0600)
  absl::Duration timeout = absl::Seconds(60);  // a silent rank fails the group after this
  std::string communicator = "auto";           // auto (GPUs: nccl; CPUs: shm), nccl, shm
  std::string worker_binary;                   // the `specd` to launch workers from; "": this one
};

}  // namespace specd
