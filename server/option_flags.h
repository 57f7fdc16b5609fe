// The flags of the engine's leaf option structs (engine/engine.h: DeviceOptions,
// SchedulerOptions, TensorParallelOptions), one registration function per struct, shared by the
// subcommands that take them (serve, generate, worker), so that a flag's name, help and target
// field are written once. Each flag's default is the struct's value when it is registered.
// Main thread only.
#pragma once

#include "absl/status/status.h"
#include "engine/engine.h"
#include "server/flags.h"

namespace specd {

// --device, --load-format, --gpu-memory-utilization, --enforce-eager, --threads, --max-model-len
// and, with `kv_pool` (the server's), --block-size and --kv-cache-memory-bytes.
void AddDeviceFlags(FlagParser& p, DeviceOptions* o, bool kv_pool = true);

// --max-num-seqs, --max-num-batched-tokens, --max-waiting-requests, --disable-prefix-caching.
void AddSchedulerFlags(FlagParser& p, SchedulerOptions* o);

// Which tensor-parallel flags (vLLM's names) a command takes.
enum class TensorParallelFlags {
  kAll,      // serve: --tensor-parallel-size / -tp, --nnodes, --node-rank, --master-addr,
             // --master-port, --tp-secret-file, --tp-timeout, --tp-communicator
  kOneHost,  // generate: --tensor-parallel-size / -tp, --tp-timeout, --tp-communicator
  kWorker,   // worker: the group and the rendezvous (--tensor-parallel-size / -tp, --nnodes,
             // --node-rank, --master-addr, --master-port); its secret is its own --secret-file
};
void AddTensorParallelFlags(FlagParser& p, TensorParallelOptions* o, TensorParallelFlags which);
// InvalidArgument naming the flag for values out of range.
absl::Status CheckTensorParallelFlags(const TensorParallelOptions& o);

}  // namespace specd
