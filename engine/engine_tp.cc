// Tensor parallelism in the engine: EngineOptions' group settings for engine/parallel, and the
// body of `specd worker` (RunWorkerProcess). The group itself is engine/parallel/tp_group.h.
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/parallel/tp_group.h"

namespace specd {

TpGroupOptions ToTpGroupOptions(const EngineOptions& options) {
  const TensorParallelOptions& tp = options.tensor_parallel;
  TpGroupOptions g;
  g.world_size = tp.size;
  g.nnodes = tp.nnodes;
  g.node_rank = tp.node_rank;
  g.master_addr = tp.master_addr;
  g.master_port = tp.master_port;
  g.secret_file = tp.secret_file;
  g.timeout = tp.timeout;
  g.communicator = tp.communicator;
  g.worker_binary = tp.worker_binary;
  return g;
}

absl::Status RunWorkerProcess(const WorkerProcessOptions& options) {
  TpWorkerOptions w;
  w.master_addr = options.master_addr;
  w.master_port = options.master_port;
  w.rank = options.rank;
  w.world_size = options.size;
  w.nnodes = options.nnodes;
  w.node_rank = options.node_rank;
  w.device = options.device;
  w.num_threads = options.num_threads;
  w.secret_file = options.secret_file;
  w.connect_timeout = options.connect_timeout;
  w.on_ready = options.on_ready;
  return RunTpWorker(w);
}

}  // namespace specd
