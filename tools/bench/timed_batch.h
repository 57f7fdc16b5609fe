// What spec_bench and vegas_bench measure: one Engine::GenerateBatch call, timed, with the tokens,
// verification rounds and accepted drafts of its results (RunTimedBatch: main thread only; a
// benchmark has nothing to fall back to, so an engine error ends the process), and the engine's
// per-step speculation metrics and `auto`'s per-step choices (Acceptance: an EngineObserver,
// called on the engine thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/engine.h"

namespace specd {

struct TimedBatch {
  std::vector<GenerateResult> results;
  double seconds = 0;
  int64_t tokens = 0;    // generated, over all results
  int64_t rounds = 0;    // verification rounds (usage.num_drafts)
  int64_t accepted = 0;  // accepted draft tokens

  double tokens_per_s() const { return static_cast<double>(tokens) / seconds; }
  // Tokens committed per verification round: the accepted drafts plus the bonus token.
  double tokens_per_round() const {
    return rounds > 0 ? 1.0 + static_cast<double>(accepted) / static_cast<double>(rounds) : 0.0;
  }
};

inline TimedBatch RunTimedBatch(Engine& engine, const std::vector<GenerateRequest>& requests,
                                const char* tool) {
  const auto start = std::chrono::steady_clock::now();
  auto results = engine.GenerateBatch(requests);
  TimedBatch b;
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!results.ok()) {
    std::fprintf(stderr, "%s: %s\n", tool, results.status().ToString().c_str());
    std::exit(1);
  }
  b.results = *std::move(results);
  for (const GenerateResult& r : b.results) {
    b.tokens += static_cast<int64_t>(r.tokens.size());
    b.rounds += r.usage.num_drafts;
    b.accepted += r.usage.num_accepted_tokens;
  }
  return b;
}

// Per-position acceptance over the rounds the engine reports, and the decode phase of a run:
// the window from the last request's first token to the first request's end, when every request
// of the batch is decoding (a long prompt's prefill, which speculation does not change, is left
// out of it).
class Acceptance : public EngineObserver {
 public:
  void OnInterTokenLatency(double) override {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    token_times_.push_back(now);
  }
  void OnRequestFinished(const FinishedRequestMetrics& m) override {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    if (m.ttft_seconds < 0) return;
    const auto first = now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(m.e2e_seconds - m.ttft_seconds));
    if (finished_ == 0 || first > last_first_) last_first_ = first;
    if (finished_ == 0 || now < first_end_) first_end_ = now;
    ++finished_;
  }
  // The decode phase of the requests finished since the last call (every request's tokens after
  // the last first token, until the first request ended): tokens per second, and the mean
  // milliseconds a speculative step in it spent drafting and verifying (0 without such steps).
  // Not measured (rate < 0) when the window holds fewer than kMinDecodeTokens tokens per request:
  // a request that finished while others still prefilled leaves too short a window to time (a
  // longer --max-tokens opens it).
  struct DecodePhase {
    double tokens_per_s = -1, draft_ms = 0, verify_ms = 0;
  };
  static constexpr int64_t kMinDecodeTokens = 32;
  DecodePhase TakeDecodePhase() {
    std::lock_guard lock(mu_);
    DecodePhase out;
    if (finished_ > 0 && first_end_ > last_first_) {
      int64_t n = 0;
      for (const auto& t : token_times_) n += t > last_first_ && t <= first_end_;
      const double s = std::chrono::duration<double>(first_end_ - last_first_).count();
      if (n >= kMinDecodeTokens * finished_) out.tokens_per_s = static_cast<double>(n) / s;
      int64_t steps = 0;
      for (const StepTime& t : step_times_) {
        if (t.end <= last_first_ || t.end > first_end_) continue;
        ++steps;
        out.draft_ms += 1e3 * t.draft_s;
        out.verify_ms += 1e3 * t.verify_s;
      }
      if (steps > 0 && out.tokens_per_s >= 0) {
        out.draft_ms /= steps, out.verify_ms /= steps;
      } else {
        out.draft_ms = out.verify_ms = 0;
      }
    }
    token_times_.clear();
    step_times_.clear();
    finished_ = 0;
    return out;
  }
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    step_times_.push_back({now, m.draft_seconds, m.verify_seconds});
    for (const std::string& s : m.ssv_strategies) ++ssv_rounds_[s];
    if (m.ssd != nullptr) ssd_ = *m.ssd;
    ++steps_;
    draft_s_ += m.draft_seconds;
    verify_s_ += m.verify_seconds;
    for (size_t i = 0; i < m.num_draft_tokens.size(); ++i) {
      if (drafted.size() < static_cast<size_t>(m.num_draft_tokens[i])) {
        drafted.resize(m.num_draft_tokens[i]);
        accepted.resize(m.num_draft_tokens[i]);
      }
      for (int j = 0; j < m.num_draft_tokens[i]; ++j) ++drafted[j];
      for (int j = 0; j < m.num_accepted[i]; ++j) ++accepted[j];
    }
  }
  void OnPolicy(const PolicyStepMetrics& m) override {
    std::lock_guard lock(mu_);
    for (const PolicyStepMetrics::MethodRows& r : m.rows) policy_rows_[r.method] += r.num_rows;
    ++policy_steps_;
    policy_searches_ += m.searched ? 1 : 0;
    policy_seconds_ += m.host_seconds;
  }
  std::string Take() {
    std::lock_guard lock(mu_);
    std::string out;
    for (size_t j = 0; j < drafted.size(); ++j) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%s%.2f", j ? " " : "",
                    static_cast<double>(accepted[j]) / std::max<int64_t>(1, drafted[j]));
      out += buf;
    }
    drafted.clear();
    accepted.clear();
    return out.empty() ? "-" : out;
  }
  // Mean milliseconds per speculative step spent drafting and verifying since the last call.
  std::pair<double, double> TakeStepTimes() {
    std::lock_guard lock(mu_);
    const double n = std::max<int64_t>(1, steps_);
    const std::pair<double, double> out = {1e3 * draft_s_ / n, 1e3 * verify_s_ / n};

    steps_ = 0;
    draft_s_ = verify_s_ = 0;
    return out;
  }
  // Request-steps the strategy policy gave each method ("none": plain decoding) since the last
  // call, by method name.
  std::vector<std::pair<std::string, int64_t>> TakePolicyRows() {
    std::lock_guard lock(mu_);
    std::vector<std::pair<std::string, int64_t>> out(policy_rows_.begin(), policy_rows_.end());
    policy_rows_.clear();
    return out;
  }
  // The policy's own cost since the last call: "policy: S searches in N steps, X us per step".
  std::string TakePolicyCost() {
    std::lock_guard lock(mu_);
    std::string out =
        absl::StrFormat("policy: %d searches in %d steps, %.1f us per step", policy_searches_,
                        policy_steps_, 1e6 * policy_seconds_ / std::max<int64_t>(1, policy_steps_));
    policy_steps_ = policy_searches_ = 0;
    policy_seconds_ = 0;
    return out;
  }
  SsdStats ssd() {
    std::lock_guard lock(mu_);
    return ssd_;
  }
  // An NSA target's verification rounds per SSV strategy since the last call ("exact/c4/r1 812,
  // shared/c4/r1 12"; "" without any).
  std::string TakeSsvUse() {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& [name, n] : ssv_rounds_) {
      absl::StrAppendFormat(&out, "%s%s %d", out.empty() ? "" : ", ", name, n);
    }
    ssv_rounds_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<int64_t> drafted, accepted;  // [position]
  SsdStats ssd_;                           // the last SSD counters reported
  int64_t steps_ = 0;                      // speculative steps, and their draft / verify time
  double draft_s_ = 0, verify_s_ = 0;
  std::map<std::string, int64_t> policy_rows_;  // request-steps by method (OnPolicy)
  std::map<std::string, int64_t> ssv_rounds_;   // verification rounds by SSV strategy
  int64_t policy_steps_ = 0, policy_searches_ = 0;
  double policy_seconds_ = 0;  // the engine's time choosing strategies (host)
  // The decode phase (TakeDecodePhase): each token's time after its request's first, the latest
  // first token and the earliest end of the requests finished.
  std::vector<std::chrono::steady_clock::time_point> token_times_;
  struct StepTime {
    std::chrono::steady_clock::time_point end;
    double draft_s, verify_s;
  };
  std::vector<StepTime> step_times_;  // each speculative step's end and its two stages
  std::chrono::steady_clock::time_point last_first_, first_end_;
  int64_t finished_ = 0;
};

}  // namespace specd
