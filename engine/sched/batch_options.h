// Continuous batching's limits (vLLM's names where they exist): what one step may hold
// (BatchLimits, which a runner also sizes its buffers and CUDA graphs from) and the scheduler's
// queue and prefix cache (SchedulerOptions). Leaves of EngineOptions / RunnerOptions /
// ServeOptions; `specd serve` registers them with server/option_flags.h AddSchedulerFlags. Plain
// values; any thread.
#pragma once

#include <cstdint>

namespace specd {

struct BatchLimits {
  int32_t max_num_seqs = 256;             // running sequences per step (the largest batch)
  int32_t max_num_batched_tokens = 2048;  // token budget of one step (chunked prefill)
};

struct SchedulerOptions : BatchLimits {
  int32_t max_waiting = 1024;         // queued requests; Submit past it: ResourceExhausted
                                      // (>= 1; preempted sequences count as queued)
  bool enable_prefix_caching = true;  // share full KV blocks of equal prefixes
};

}  // namespace specd
