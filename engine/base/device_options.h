// Where and how a model runs: the device, the weights' format, CPU threads and the KV pool. A
// leaf of the option structs (EngineOptions, RunnerOptions, ServeOptions compose it), so each
// field is declared once and `specd serve` / `generate` register its flags with one function
// (server/option_flags.h AddDeviceFlags). Plain values; any thread.
#pragma once

#include <cstdint>
#include <string>

namespace specd {

struct DeviceOptions {
  // "cpu", "cuda" (GPU 0), "cuda:N", or "auto" (a GPU when one is visible). EngineOptions
  // defaults to "cpu" (the exact fp32 backend for embedders and tests); the CLI and the runner
  // default to "auto".
  std::string device = "auto";
  std::string load_format = "auto";  // "auto": safetensors; "dummy": random weights (CUDA)
  int32_t num_threads = 0;           // CPU threads; 0: one per core
  int32_t max_model_len = 0;         // 0: the model's max_position_embeddings
  int32_t block_size = 16;           // KV block size in tokens
  // KV pool; 0: the device's default (CPU 64 MiB; CUDA what gpu_memory_utilization leaves).
  // At least one max_model_len sequence always fits.
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.9;  // CUDA: fraction of the GPU's memory specd may hold
  bool enforce_eager = false;           // CUDA: no CUDA graphs (debugging)
};

}  // namespace specd
