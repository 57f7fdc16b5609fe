// spec_bench's rows: what one measured point reports (Run), the engine observer it is read from
// (StepObserver: Acceptance plus the rest of each speculative step), and the printing of a row.
// A row carries tokens per round, acceptance by position (a tree's up to its depth: the engine
// counts a tree's nodes as its drafts, so positions past the depth would only print zeros) and
// the speculative step's split into drafting, verification and the rest (scheduling, batch
// building, commit), chains and trees alike. Plain values and printing on the main thread; the
// observer is called on the engine thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "tools/bench/timed_batch.h"

namespace specd {

// Run::decode_tokens_per_s when --decode-phase found no window to time (a request finished
// while another still prefilled).
inline constexpr double kDecodeNotTimed = -2;

struct Run {
  double tokens_per_s = 0;
  // Tokens per second while every request decodes (Acceptance::TakeDecodePhase); < 0: not
  // measured. And the speculative steps' drafting and verification in that window (ms).
  double decode_tokens_per_s = -1, decode_draft_ms = 0, decode_verify_ms = 0;
  double tokens_per_round = 0;  // 0 without speculation
  std::string acceptance;
  double hit_rate = -1;      // SSD: drafts served from the speculation cache; < 0 otherwise
  double wait_ms = 0;        // SSD: verifier time waiting for drafts, per round with the speculator
  double busy_ms = 0;        // SSD: speculator compute (answer + cache build), per round
  double cache_ms = 0;       // SSD: ... of which cache construction, per round
  std::string ssd_timeline;  // SSD: the round's stages on both sides (SsdTimelineLine)
  // SSD: what else the rounds held, and how much of the run's wall time the timed rounds cover
  // (the rest: prefill steps, steps without the speculator).
  int64_t misses_primary = 0, misses_backup = 0, drafts_none = 0, local_rounds = 0;
  int64_t offer_rounds = 0;  // rounds drafted from the speculator's cache offers (no wait)
  double round_share = -1;
  // SSD: q rows received GPU to GPU (the device data path) and bytes over TCP, per round.
  double device_rows = 0, tcp_bytes = 0;
  // SSD with a head in the speculator: target hidden rows sent, and of those GPU to GPU.
  double hidden_rows = 0, device_hidden_rows = 0;
  // Per speculative step (one verification round of every speculating request; the engine's
  // timers): the speculators' Propose calls, the verification pass, and the rest of the step.
  double step_draft_ms = 0, step_verify_ms = 0, step_rest_ms = 0;
  int equal = -1;  // replay: requests whose output equals their trajectory
  int requests = 0;
  int settle_runs = 0;    // replay: runs until the output equalled the trajectories (< 0: never)
  std::string auto_used;  // method auto: what it ran (DescribeAutoUse)
  std::string ssv_used;   // NSA targets: rounds per SSV strategy (Acceptance::TakeSsvUse)
};

// Acceptance, plus each speculative step's wall time past drafting and verification (the sum of
// SpeculationStepMetrics::by_method's `other`).
class StepObserver : public Acceptance {
 public:
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    Acceptance::OnSpeculation(m);
    std::lock_guard lock(mu_);
    ++steps_;
    for (const SpeculationStepMetrics::MethodSeconds& t : m.by_method) rest_s_ += t.other;
  }
  struct StepSplit {
    double draft_ms = 0, verify_ms = 0, rest_ms = 0;
  };
  // Mean milliseconds per speculative step since the last call: drafting, verification and the
  // rest.
  StepSplit TakeStepSplit() {
    StepSplit split;
    std::tie(split.draft_ms, split.verify_ms) = TakeStepTimes();
    std::lock_guard lock(mu_);
    split.rest_ms = steps_ > 0 ? 1e3 * rest_s_ / static_cast<double>(steps_) : 0.0;
    steps_ = 0;
    rest_s_ = 0;
    return split;
  }

 private:
  std::mutex mu_;
  int64_t steps_ = 0;
  double rest_s_ = 0;
};

// The first `n` positions of an acceptance-by-position string ("0.80 0.64 ..." or "-").
inline std::string FirstPositions(const std::string& acceptance, int n) {
  std::vector<std::string> positions = absl::StrSplit(acceptance, ' ', absl::SkipEmpty());
  if (static_cast<int>(positions.size()) <= n) return acceptance;
  positions.resize(static_cast<size_t>(n));
  return absl::StrJoin(positions, " ");
}

// SSD's round timeline between two snapshots (ssd_stats.h SsdTimeline), in ms per round on
// each side: "ssd round (ms): verifier transfer T wait W ... rest R = ROUND | speculator receive
// ... reply Y"; empty when no round was timed.
inline std::string SsdTimelineLine(const SsdTimeline& before, const SsdTimeline& after) {
  const int64_t rounds = after.verifier_rounds - before.verifier_rounds;
  if (rounds <= 0) return "";
  std::string out = "ssd round (ms): verifier";
  char buf[64];
  for (int i = 0; i < kNumSsdVerifierStages; ++i) {
    std::snprintf(buf, sizeof(buf), " %s %.3f", kSsdVerifierStageNames[i],
                  1e3 * (after.verifier[i] - before.verifier[i]) / rounds);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), " = %.3f",
                1e3 * (after.verifier_round_seconds - before.verifier_round_seconds) / rounds);
  out += buf;
  const int64_t replies = after.speculator_rounds - before.speculator_rounds;
  if (replies <= 0) return out;
  out += " | speculator";
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) {
    std::snprintf(buf, sizeof(buf), " %s %.3f", kSsdSpeculatorStageNames[i],
                  1e3 * (after.speculator[i] - before.speculator[i]) / replies);
    out += buf;
  }
  return out;
}

inline void PrintHeader() {
  std::printf("%-6s %-16s %12s %9s %10s  %s\n", "batch", "method", "tokens/s", "vs plain",
              "tok/round", "acceptance by position");
}

// " [decode phase: X tok/s, R x plain's; per step: draft D ms, verify V ms]" where measured
// (--decode-phase), else "".
inline std::string DecodePhase(double decode, double plain_decode, double draft_ms = 0,
                               double verify_ms = 0) {
  if (decode == kDecodeNotTimed) return "  [decode phase: too short to time; raise --max-tokens]";
  if (decode < 0) return "";
  char buf[160];
  int n = std::snprintf(buf, sizeof(buf), "  [decode phase: %.1f tok/s", decode);
  if (plain_decode > 0) {
    n += std::snprintf(buf + n, sizeof(buf) - n, ", %.2fx plain's", decode / plain_decode);
  }
  if (verify_ms > 0) {
    n += std::snprintf(buf + n, sizeof(buf) - n, "; per step: draft %.2f ms, verify %.2f ms",
                       draft_ms, verify_ms);
  }
  std::snprintf(buf + n, sizeof(buf) - n, "]");
  return buf;
}

inline void PrintPlainRow(int batch, double tokens_per_s, double decode_tokens_per_s = -1) {
  std::printf("%-6d %-16s %12.1f %9s %10s  %s%s\n", batch, "none", tokens_per_s, "1.00x", "-", "-",
              DecodePhase(decode_tokens_per_s, -1).c_str());
}

inline void PrintRow(int batch, const std::string& method, const Run& r, double plain,
                     double plain_decode = -1) {
  char hits[512] = "";
  if (r.hit_rate >= 0) {
    std::snprintf(hits, sizeof(hits),
                  "  (cache hits %.1f%%; misses %lld primary, %lld backup; %lld none, %lld local "
                  "rounds; %lld rounds from offers; timed rounds %.0f%% of the run; per round: "
                  "verifier waits %.3f ms, "
                  "speculator answers in %.3f ms and builds the cache in %.3f ms, %.1f q rows "
                  "GPU to GPU, %.1f hidden rows (%.1f GPU to GPU), %.1f KB over TCP)",
                  100 * r.hit_rate, static_cast<long long>(r.misses_primary),
                  static_cast<long long>(r.misses_backup), static_cast<long long>(r.drafts_none),
                  static_cast<long long>(r.local_rounds), static_cast<long long>(r.offer_rounds),
                  100 * r.round_share, r.wait_ms, r.busy_ms - r.cache_ms, r.cache_ms, r.device_rows,
                  r.hidden_rows, r.device_hidden_rows, r.tcp_bytes / 1e3);
  }
  char equal[128] = "";
  if (r.equal >= 0) {
    std::snprintf(equal, sizeof(equal), "  [output = trajectory: %d of %d; settled %s %d runs]",
                  r.equal, r.requests, r.settle_runs > 0 ? "after" : "NOT after",
                  std::abs(r.settle_runs));
  }
  std::printf(
      "%-6d %-16s %12.1f %8.2fx %10.2f  %s  {per step: draft %.2f ms, verify %.2f ms, rest %.2f "
      "ms}%s%s%s\n",
      batch, method.c_str(), r.tokens_per_s, r.tokens_per_s / plain, r.tokens_per_round,
      r.acceptance.c_str(), r.step_draft_ms, r.step_verify_ms, r.step_rest_ms, hits, equal,
      DecodePhase(r.decode_tokens_per_s, plain_decode, r.decode_draft_ms, r.decode_verify_ms)
          .c_str());
  if (!r.ssd_timeline.empty()) std::printf("%-6s %s\n", "", r.ssd_timeline.c_str());
}

}  // namespace specd
