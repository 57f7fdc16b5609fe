#include "server/option_flags.h"

#include "absl/strings/str_cat.h"

namespace specd {

void AddDeviceFlags(FlagParser& p, DeviceOptions* o, bool kv_pool) {
  p.Add("device", &o->device, "cpu | cuda | cuda:N | auto (default: a GPU when one is visible)");
  p.Add("load-format", &o->load_format, "auto (safetensors) | dummy (random weights; CUDA)");
  p.Add("gpu-memory-utilization", &o->gpu_memory_utilization,
        "fraction of the GPU's memory specd may hold (default 0.9)");
  p.Add("enforce-eager", &o->enforce_eager, "no CUDA graphs (debugging)");
  p.Add("threads", &o->num_threads, "CPU compute threads (0 = one per core)");
  p.Add("max-model-len", &o->max_model_len, "context limit in tokens (0 = the model's)");
  if (!kv_pool) return;
  p.Add("kv-cache-memory-bytes", &o->kv_cache_bytes,
        "KV pool size in bytes (0 = CPU 64 MiB; GPU: what --gpu-memory-utilization leaves)");
  p.Add("block-size", &o->block_size, "tokens per KV block (default 16)");
}

void AddSchedulerFlags(FlagParser& p, SchedulerOptions* o) {
  p.Add("max-num-seqs", &o->max_num_seqs, "running sequences per step (default 256)");
  p.Add("max-num-batched-tokens", &o->max_num_batched_tokens, "token budget per step");
  p.Add("max-waiting-requests", &o->max_waiting, "queued requests before 429");
  p.Add("disable-prefix-caching", FlagParser::Negated{&o->enable_prefix_caching},
        "turn prefix caching off");
}

void AddTensorParallelFlags(FlagParser& p, TensorParallelOptions* o, TensorParallelFlags which) {
  p.Add("tensor-parallel-size", &o->size,
        "ranks the target is split over, one process each (default 1; alias -tp)");
  p.Alias("tp", "tensor-parallel-size");
  if (which != TensorParallelFlags::kOneHost) {
    p.Add("nnodes", &o->nnodes, "hosts of the tensor-parallel group (default 1)");
    p.Add("node-rank", &o->node_rank, "this host's index in the group (0..nnodes-1)");
    p.Add("master-addr", &o->master_addr,
          "rank 0's address, where workers connect (default 127.0.0.1)");
    p.Add("master-port", &o->master_port,
          "rank 0's rendezvous port (0 = a free one; one host only)");
  }
  if (which == TensorParallelFlags::kAll) {
    p.Add("tp-secret-file", &o->secret_file,
          "several hosts: the group's secret, 64 hex digits, mode 0600, the same on every host");
  }
  if (which != TensorParallelFlags::kWorker) {
    p.Add("tp-timeout", &o->timeout,
          "seconds a silent rank or a stuck collective may take before the group fails (60)");
    p.Add("tp-communicator", &o->communicator, "auto (GPUs: nccl, CPUs: shm) | nccl | shm");
  }
}

absl::Status CheckTensorParallelFlags(const TensorParallelOptions& o) {
  if (o.size < 1 || o.size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size: ", o.size, " is outside [1, 1024]"));
  }
  if (o.nnodes < 1 || o.size % o.nnodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes: ", o.nnodes, " does not divide --tensor-parallel-size ", o.size));
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node-rank: ", o.node_rank, " is outside [0, ", o.nnodes, ")"));
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--master-port: ", o.master_port));
  }
  if (!(o.timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("--tp-timeout: must be positive");
  }
  if (o.communicator != "auto" && o.communicator != "nccl" && o.communicator != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp-communicator: '", o.communicator, "' is not one of auto, nccl, shm"));
  }
  return absl::OkStatus();
}

}  // namespace specd
