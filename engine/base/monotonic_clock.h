// A monotonic clock in integer nanoseconds, for stage timelines measured across a process
// (the SSD round's stages, engine/speculation/ssd/ssd_stats.h): unaffected by wall-clock steps,
// one vDSO read, no allocation. Values compare only within one host. Any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace specd {

inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds from `start_ns` to `end_ns` (MonotonicNanos values); 0 when end precedes start.
inline double NanosToSeconds(int64_t start_ns, int64_t end_ns) {
  return end_ns > start_ns ? static_cast<double>(end_ns - start_ns) * 1e-9 : 0.0;
}

// Nanoseconds from `start_ns` to `end_ns`; 0 when end precedes start.
inline uint64_t NanosBetween(int64_t start_ns, int64_t end_ns) {
  return end_ns > start_ns ? static_cast<uint64_t>(end_ns - start_ns) : 0;
}

}  // namespace specd
