// `specd serve` options: built-in defaults, then the --config file (proto/config.proto's
// ServeConfig as JSON or textproto), then SPECD_API_KEY, then command-line flags (named as
// vLLM names them where the concept matches). Validated once; immutable afterwards.
// Main thread only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace specd {

// The model `specd serve` runs with no --model (relative to the working directory).
inline constexpr std::string_view kBundledModel = "models/codepair/target";

// The engine's leaf option structs (engine/engine.h) are ServeOptions' too, so ToEngineOptions
// copies them whole and server/option_flags.h registers their flags: DeviceOptions (--device,
// --threads, --max-model-len, --block-size, --kv-cache-memory-bytes, ...; device "auto"),
// SchedulerOptions (--max-num-seqs, --max-waiting-requests, --disable-prefix-caching, ...),
// SpeculativeOptions (`speculative`: --speculative-config parsed; --cost-profile) and
// TensorParallelOptions (`tensor_parallel`: --tensor-parallel-size, --nnodes, ...).
struct ServeOptions : DeviceOptions, SchedulerOptions, SpeculativeOptions {
  // Model
  std::string model = std::string(kBundledModel);
  // Default: the model folder's name; "codepair" for the bundled default model.
  std::string served_model_name;
  // Tensor parallelism (EngineOptions::tensor_parallel): ranks, hosts, rendezvous, faults.
  TensorParallelOptions tensor_parallel;
  // Front ends
  std::string host = "0.0.0.0";
  int32_t port = 8000;        // 0: pick a free port
  int32_t grpc_port = 50051;  // 0: pick a free port; -1: no gRPC
  std::string api_key;        // empty: no auth
  std::string ssl_certfile;   // both set: TLS on both front ends
  std::string ssl_keyfile;
  int64_t max_request_body_bytes = int64_t{8} << 20;
  // Host header names accepted on API routes, comma-separated ("name" any port, "name:port"
  // that one); empty: any. /health, /ready and /metrics accept any.
  std::string allowed_hosts;
  int32_t api_worker_threads = 2;  // threads parsing, templating and tokenizing HTTP bodies
  // Special-token text in chat message content becomes control tokens (off: plain text).
  bool allow_special_tokens_in_content = false;
  // HTTP: seconds a client may read nothing of a pending reply before it is closed (its
  // requests aborted); a stream is paused (not buffered) once 4 MiB wait for its client.
  double write_timeout_s = 60;
  // Lifecycle
  double drain_timeout_s = 30;
  double request_timeout_s = 0;  // 0: no deadline
  std::string log_level = "info";
  // Speculative decoding: vLLM-style JSON (engine/speculation/spec_config.h), e.g.
  // {"method": "draft_model", "model": "DIR", "num_speculative_tokens": 4}; empty: none.
  // ParseServeOptions parses it into `speculative`; `cost_profile` (the JSON file specd_profile
  // writes; empty: the runner's default rule) is loaded (and refused) at start-up.
  std::string speculative_config;

  bool help = false;  // --help was given: print ServeUsage() and exit 0
};

// args excludes "specd serve". env_api_key: $SPECD_API_KEY or null.
// InvalidArgument (exit 2) for unknown flags, bad values and bad config files.
absl::StatusOr<ServeOptions> ParseServeOptions(const std::vector<std::string>& args,
                                               const char* env_api_key);
std::string ServeUsage();

// The engine's options (observer left unset).
EngineOptions ToEngineOptions(const ServeOptions& options);

}  // namespace specd
