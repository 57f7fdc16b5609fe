// SSD's counters on the verifier side (SsdSpeculator keeps them; the engine hands a snapshot
// to its metrics observer, server/metrics.cc exports them). Plain values.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace specd {

// The stages of an SSD round (docs/architecture.md "SSD", the round timeline). The verifier's
// round is the engine step that drafted with the speculator, from the step's start to the end of
// its commit; its stages partition it:
//   transfer      the request built and sent (releases, outcomes) and the reply read and decoded
//                 from its first byte
//   wait          from the request sent to the reply's first byte: the speculator's drafts
//   cache_lookup  each sequence's drafts taken from the reply (hit or which fallback)
//   verify        the target's verification pass (acceptance included where it runs in the pass)
//   sampling      acceptance on the host: speculative sampling against the drafts' q (Saguaro's
//                 down-weighted rows) and the correction or bonus draw; 0 on the runner's
//                 verifiers, which accept inside the pass
//   commit        the outcomes told to the speculators and every row's tokens committed
//   rest          the rest of the step: scheduling, batch building, other methods' drafts, ...
enum class SsdVerifierStage { kTransfer, kWait, kCacheLookup, kVerify, kSampling, kCommit, kRest };
inline constexpr int kNumSsdVerifierStages = 7;
inline constexpr std::array<const char*, kNumSsdVerifierStages> kSsdVerifierStageNames = {
    "transfer", "wait", "cache_lookup", "verify", "sampling", "commit", "rest"};

// The speculator's stages, as its responses report them (SpeculateResponse::*_ns: the work
// since its previous response, so the build and the reply's send after response n arrive with
// response n + 1):
//   receive  the request read and decoded, from its first byte
//   triage   the outcomes applied, the cache looked up, each sequence's tier chosen
//   draft    the misses drafted: primary re-drafts, partial hits' remaining passes, backups
//   build    the speculation cache built for the next outcomes
//   reply    the response composed and sent
enum class SsdSpeculatorStage { kReceive, kTriage, kDraft, kBuild, kReply };
inline constexpr int kNumSsdSpeculatorStages = 5;
inline constexpr std::array<const char*, kNumSsdSpeculatorStages> kSsdSpeculatorStageNames = {
    "receive", "triage", "draft", "build", "reply"};

// Cumulative seconds per stage and the rounds they cover, on each side (a monotonic clock; a
// few clock reads per round). Shares: seconds over the side's round seconds.
struct SsdTimeline {
  int64_t verifier_rounds = 0;
  double verifier_round_seconds = 0;  // the rounds' wall time: the stages sum to it
  std::array<double, kNumSsdVerifierStages> verifier{};
  // Responses whose stage times arrived, and rounds drafted from a cache offer (their stage
  // times ride on the offer; its reply stage is 0).
  int64_t speculator_rounds = 0;
  std::array<double, kNumSsdSpeculatorStages> speculator{};

  double& at(SsdVerifierStage s) { return verifier[static_cast<int>(s)]; }
  double at(SsdVerifierStage s) const { return verifier[static_cast<int>(s)]; }
  double& at(SsdSpeculatorStage s) { return speculator[static_cast<int>(s)]; }
  double at(SsdSpeculatorStage s) const { return speculator[static_cast<int>(s)]; }
};

// Counters since start (the engine turns them into metrics).
struct SsdStats {
  int64_t rounds = 0;  // Propose calls that reached the speculator
  // Of them, rounds whose every sequence took its drafts from a cache offer (wire version 10):
  // no wait, no response.
  int64_t offer_rounds = 0;
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
  int64_t device_rows = 0;  // q rows received GPU to GPU (the device data path), not in bytes_*
  // Target hidden-state rows sent to an EAGLE-3 head in the speculator (inline ones in
  // bytes_sent), and of those the ones sent GPU to GPU (the device data path).
  int64_t hidden_rows = 0;
  int64_t device_hidden_rows = 0;
  // Per acceptance length k of the round before (index k, grown as needed): sequences whose
  // outcome the speculator was told, and of those the ones it had in its cache.
  std::vector<int64_t> outcomes_by_accepted_len;
  std::vector<int64_t> hits_by_accepted_len;
  SsdTimeline timeline;  // the round's stages on both sides
  bool connected = false;
  bool device_data_path = false;  // the current link moves q rows GPU to GPU
};

}  // namespace specd
