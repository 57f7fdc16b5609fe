// SSD's counters on the verifier side (SsdSpeculator keeps them; the engine hands a snapshot
// to its metrics observer, server/metrics.cc exports them). Plain values.
#pragma once

#include <cstdint>
#include <vector>

namespace specd {

// Counters since start (the engine turns them into metrics).
struct SsdStats {
  int64_t rounds = 0;                   // Propose calls that reached the speculator
  int64_t local_rounds = 0;             // rounds drafted locally: no speculator connected
  int64_t drafts_hit = 0;               // sequences served from the speculation cache
  int64_t drafts_miss_primary = 0;      // cache misses re-drafted by the draft model
  int64_t drafts_miss_backup = 0;       // cache misses drafted by the backup speculator
  int64_t drafts_none = 0;              // sequences the speculator gave nothing
  int64_t link_failures = 0;            // timeouts, broken links, dead speculator
  int64_t connects = 0;                 // speculators that joined (the first one too)
  int64_t launches = 0;                 // processes started
  int64_t refused_joins = 0;            // connections refused: wrong process, TLS, secret, ...
  double wait_seconds = 0;              // verifier time spent waiting for drafts
  double speculator_busy_seconds = 0;   // speculator compute time reported by its responses
  double speculator_cache_seconds = 0;  // ... of which building the cache
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Per acceptance length k of the round before (index k, grown as needed): sequences whose
  // outcome the speculator was told, and of those the ones it had in its cache.
  std::vector<int64_t> outcomes_by_accepted_len;
  std::vector<int64_t> hits_by_accepted_len;
  bool connected = false;
};

}  // namespace specd
