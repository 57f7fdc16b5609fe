// SSV, sparse speculative verification (../shared/papers, the SSV review): how the queries of
// one verification chunk of an NSA model (engine/model/nsa_attention.h) choose and load their
// selected blocks. The chunk's queries (the last committed token, then the drafts) go C at a
// time, in chunk order:
//   mode exact  (the paper's mode A): each query keeps its own selection; a group loads the
//               union of its queries' keys once and masks per query. The model's semantics:
//               lossless.
//   mode shared (mode B): every query of a group attends the first query's selected blocks.
//               Lossy with respect to the model.
//   refresh_every R > 1: layer l computes its own selection only when l % R == 0 (a refresh
//               layer); the layers between (reuse layers) take the selection the last refresh
//               layer computed for the same query and KV head. Lossy.
// Only verification chunks take a strategy; prefill and plain decode always run the model's
// own attention. Pure values and functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specd {

enum class SsvMode : uint8_t { kExact, kShared };

inline constexpr int32_t kMaxSsvGroupSize = 16;

struct SsvStrategy {
  int32_t group_size = 1;  // C in [1, kMaxSsvGroupSize]: queries per group (1: per query)
  SsvMode mode = SsvMode::kExact;
  int32_t refresh_every = 1;  // R >= 1: layers l with l % R == 0 refresh (1: all, strict)

  bool lossy() const { return mode == SsvMode::kShared || refresh_every > 1; }
  bool Refreshes(int32_t layer) const { return layer % refresh_every == 0; }
  bool operator==(const SsvStrategy&) const = default;
};

// "exact", "shared"; nullptr-free.
std::string_view SsvModeName(SsvMode mode);
// Parses "exact" / "shared"; false for anything else.
bool ParseSsvMode(std::string_view name, SsvMode* mode);
// The strategy as metrics and logs show it, e.g. "exact/c4/r1".
std::string SsvStrategyName(const SsvStrategy& s);
// The inverse of SsvStrategyName ("mode/cC/rR"); false for anything else or a strategy out of
// range (ValidateSsvStrategy).
bool ParseSsvStrategy(std::string_view name, SsvStrategy* out);
// InvalidArgument naming `prefix`.field (message and field payload, engine/base/status.h) when C
// is outside [1, kMaxSsvGroupSize] or R < 1.
absl::Status ValidateSsvStrategy(const SsvStrategy& s, std::string_view prefix);

// What the verification chunks that ran with a strategy read, counted per query, layer and KV
// head (running totals). "Keys" are KV positions (a position's K and V of one KV head): a
// query's are its selected blocks' keys up to its own position and its window; per_query_* is
// what each query loading its own would read, grouped_* what the groups read (the union of
// their queries' keys; the representative's under mode shared).
struct SsvLoadStats {
  int64_t queries = 0;  // query x layer x KV head
  int64_t per_query_keys = 0;
  int64_t grouped_keys = 0;
  int64_t per_query_blocks = 0;  // selected blocks
  int64_t grouped_blocks = 0;
  // The model's own selections of adjacent queries of a chunk: the sum over pairs of
  // |Sel(t) n Sel(t-1)| / |Sel(t)|, and the number of pairs (SSV's first premise, online), on
  // the strategy's refresh layers (a reuse layer computes no selection on the GPU).
  double overlap_sum = 0;
  int64_t overlap_pairs = 0;

  SsvLoadStats& operator+=(const SsvLoadStats& o);
  SsvLoadStats operator-(const SsvLoadStats& o) const;
};

}  // namespace specd
