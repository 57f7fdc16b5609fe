#include "engine/parallel/tp_handshake.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "engine/base/status.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/nccl_communicator.h"
#include "engine/distributed/shm_communicator.h"

namespace specd::tp_handshake {

absl::Status ValidateGroup(const TpGroupOptions& g) {
  if (g.world_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", g.world_size, ": a group needs at least 2 ranks"));
  }
  if (g.nnodes < 1 || g.world_size % g.nnodes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", g.world_size,
                                                   " is not a multiple of --nnodes ", g.nnodes));
  }
  if (g.node_rank != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node-rank ", g.node_rank,
                     ": rank 0 (specd serve / generate) runs on node 0; other "
                     "nodes run `specd worker`"));
  }
  if (g.nnodes > 1 &&
      (g.master_port <= 0 || (g.secret_file.empty() && std::getenv(kTpSecretEnv) == nullptr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a group on several nodes needs --master-port (fixed) and the group's secret: "
                     "--tp-secret-file (the same mode-0600 file on every node) or $",
                     kTpSecretEnv));
  }
  if (g.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tensor-parallel timeout must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CommunicatorKind(const std::string& requested, bool cuda,
                                             const TpGroupOptions& group) {
  const std::string kind = requested == "auto" ? (cuda ? "nccl" : "shm") : requested;
  if (kind == "shm") {
    if (group.nnodes > 1) {
      return absl::InvalidArgumentError(
          "the shared-memory communicator joins ranks of one host; across nodes use GPUs (NCCL)");
    }
    if (cuda) {
      return absl::InvalidArgumentError(
          "the shared-memory communicator moves host memory; GPU ranks use nccl");
    }
    return kind;
  }
  if (kind == "nccl") {
    if (!cuda) return absl::InvalidArgumentError("the nccl communicator needs GPU ranks");
    if (!NcclAvailable()) {
      return absl::FailedPreconditionError("this build has no NCCL: GPU ranks cannot meet");
    }
    return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("communicator '", requested, "' is not one of auto, nccl, shm"));
}

Hello TpHello(Role role) {
  Hello h;
  h.role = role;
  h.model_fingerprint = "specd-tensor-parallel";  // the group's sizes travel in TpInit
  h.limits = TpWireLimits();
  return h;
}

int32_t ThreadsPerRank(int32_t requested, int32_t ranks_on_host) {
  if (requested > 0) return requested;
  const int32_t cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_host));
}

absl::StatusOr<std::vector<uint8_t>> NewCommToken(const std::string& kind) {
  if (kind == "nccl") return NewNcclUniqueId();
  SPECD_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, RandomBytes(8));
  static constexpr char kHex[] = "0123456789abcdef";
  std::vector<uint8_t> name;
  for (uint8_t b : bytes) {
    name.push_back(static_cast<uint8_t>(kHex[b >> 4]));
    name.push_back(static_cast<uint8_t>(kHex[b & 15]));
  }
  return name;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& kind,
                                                                 const std::vector<uint8_t>& token,
                                                                 int32_t rank, int32_t world_size,
                                                                 int32_t device,
                                                                 absl::Duration timeout) {
  if (kind == "nccl") {
    SPECD_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                           NcclCommunicator::Create(token, rank, world_size, device));
    return std::unique_ptr<Communicator>(std::move(comm));
  }
  ShmOptions o;
  o.group.assign(token.begin(), token.end());
  o.rank = rank;
  o.world_size = world_size;
  o.timeout = timeout;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ShmCommunicator> comm, ShmCommunicator::Create(o));
  return std::unique_ptr<Communicator>(std::move(comm));
}

TpInit MakeTpInit(const RunnerOptions& r, int32_t world_size, const std::string& comm_kind,
                  const std::vector<uint8_t>& token, absl::Duration timeout) {
  TpInit init;
  init.world_size = static_cast<uint32_t>(world_size);
  init.model_dir = r.model_dir;
  init.load_format = r.load_format;
  init.comm_kind = comm_kind;
  init.comm_token = token;
  init.block_size = static_cast<uint32_t>(r.block_size);
  init.max_model_len = static_cast<uint32_t>(r.max_model_len);
  init.max_num_seqs = static_cast<uint32_t>(r.max_num_seqs);
  init.max_num_batched_tokens = static_cast<uint32_t>(r.max_num_batched_tokens);
  init.max_sample_rows = static_cast<uint32_t>(r.max_sample_rows);
  init.kv_cache_bytes = static_cast<uint64_t>(r.kv_cache_bytes);
  init.gpu_memory_utilization = static_cast<float>(r.gpu_memory_utilization);
  init.enforce_eager = r.enforce_eager;
  init.timeout_ms = static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout));
  return init;
}

RunnerOptions RunnerOptionsFrom(const TpInit& init, const std::string& device,
                                int32_t num_threads) {
  RunnerOptions r;
  r.model_dir = init.model_dir;
  r.device = device;
  r.load_format = init.load_format;
  r.num_threads = num_threads;
  r.block_size = static_cast<int32_t>(init.block_size);
  r.max_model_len = static_cast<int32_t>(init.max_model_len);
  r.max_num_seqs = static_cast<int32_t>(init.max_num_seqs);
  r.max_num_batched_tokens = static_cast<int32_t>(init.max_num_batched_tokens);
  r.max_sample_rows = static_cast<int32_t>(init.max_sample_rows);
  r.kv_cache_bytes = static_cast<int64_t>(init.kv_cache_bytes);
  r.gpu_memory_utilization = init.gpu_memory_utilization;
  r.enforce_eager = init.enforce_eager;
  r.tp = TensorParallel{static_cast<int32_t>(init.rank), static_cast<int32_t>(init.world_size)};
  return r;
}

}  // namespace specd::tp_handshake
