// spec_bench's sweep summary (--ks, --auto): per batch size, the best fixed choice (plain
// decoding, or one method at one K) against `auto`, with issue 20's acceptance test (auto at least
// 0.95x the best fixed choice, and never below plain); and what `auto` used, from its requests'
// usage (RequestUsage::by_method) and the strategy policy's per-step choices. Plain values and
// printing; main thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"

namespace specd {

// `auto` passes at a batch size when it reaches this fraction of the best fixed choice.
inline constexpr double kAutoVsBestFixed = 0.95;

struct FixedChoice {
  std::string method;  // SpeculationMethodName; "none" for plain decoding
  int k = 0;           // 0 for plain decoding
  double tokens_per_s = 0;

  std::string Label() const { return k > 0 ? absl::StrCat(method, " k=", k) : method; }
};

// One batch size's results.
struct BatchSweep {
  int batch = 0;
  double plain_tokens_per_s = 0;
  double plain_decode_tokens_per_s = -1;  // --decode-phase: plain decoding's decode-phase rate
  std::vector<FixedChoice> fixed;         // every fixed choice measured, plain decoding included
  double auto_tokens_per_s = -1;          // < 0: auto did not run
  std::string auto_used;                  // what auto ran (DescribeAutoUse)

  const FixedChoice* Best() const {
    const FixedChoice* best = nullptr;
    for (const FixedChoice& c : fixed) {
      if (best == nullptr || c.tokens_per_s > best->tokens_per_s) best = &c;
    }
    return best;
  }
  bool Passes() const {
    const FixedChoice* best = Best();
    return auto_tokens_per_s >= 0 && best != nullptr &&
           auto_tokens_per_s >= kAutoVsBestFixed * best->tokens_per_s &&
           auto_tokens_per_s >= plain_tokens_per_s;
  }
};

// What auto ran over one batch: the request-steps the policy gave each method ("none": plain
// decoding; `policy_rows` from Acceptance::TakePolicyRows), then per method that drafted, its
// verification rounds, mean K and committed tokens per round, summed over the requests' usage.
inline std::string DescribeAutoUse(const std::vector<std::pair<std::string, int64_t>>& policy_rows,
                                   const std::vector<GenerateResult>& results) {
  int64_t steps = 0;
  for (const auto& [method, n] : policy_rows) steps += n;
  std::string out = "auto chose (request-steps):";
  for (const auto& [method, n] : policy_rows) {
    absl::StrAppendFormat(&out, " %s %.0f%%", method, 100.0 * n / std::max<int64_t>(1, steps));
  }
  if (policy_rows.empty()) out += " -";
  std::vector<RequestUsage::MethodUsage> used;  // summed over the results, by method name
  for (const GenerateResult& r : results) {
    for (const RequestUsage::MethodUsage& u : r.usage.by_method) {
      auto it = std::find_if(used.begin(), used.end(), [&](const RequestUsage::MethodUsage& m) {
        return std::string(m.method) == u.method;
      });
      if (it == used.end()) {
        used.emplace_back();
        used.back().method = u.method;
        it = used.end() - 1;
      }
      it->num_drafts += u.num_drafts;
      it->num_draft_tokens += u.num_draft_tokens;
      it->num_accepted_tokens += u.num_accepted_tokens;
    }
  }
  out += "; usage.speculation.by_method:";
  for (size_t i = 0; i < used.size(); ++i) {
    const RequestUsage::MethodUsage& u = used[i];
    const double rounds = static_cast<double>(std::max<int64_t>(1, u.num_drafts));
    absl::StrAppendFormat(&out, "%s %s %d rounds, mean K %.2f, %.2f tok/round", i ? ";" : "",
                          u.method, u.num_drafts, u.num_draft_tokens / rounds,
                          1 + u.num_accepted_tokens / rounds);
  }
  if (used.empty()) out += " none (no drafts)";
  return out;
}

// The table, one row per batch size; then what auto used at each.
inline void PrintSweepSummary(const std::vector<BatchSweep>& sweeps) {
  std::printf(
      "\nsummary: auto against the best fixed choice (plain, or one method at one K); PASS: auto "
      ">= %.2fx the best fixed and >= plain\n",
      kAutoVsBestFixed);
  std::printf("%-6s %12s  %-18s %12s %12s %10s %10s  %s\n", "batch", "plain tok/s", "best fixed",
              "tok/s", "auto tok/s", "auto/best", "auto/plain", "result");
  for (const BatchSweep& s : sweeps) {
    const FixedChoice* best = s.Best();
    if (best == nullptr) continue;
    if (s.auto_tokens_per_s < 0) {
      std::printf("%-6d %12.1f  %-18s %12.1f %12s %10s %10s  %s\n", s.batch, s.plain_tokens_per_s,
                  best->Label().c_str(), best->tokens_per_s, "-", "-", "-", "-");
      continue;
    }
    std::printf("%-6d %12.1f  %-18s %12.1f %12.1f %9.3fx %9.3fx  %s\n", s.batch,
                s.plain_tokens_per_s, best->Label().c_str(), best->tokens_per_s,
                s.auto_tokens_per_s, s.auto_tokens_per_s / best->tokens_per_s,
                s.auto_tokens_per_s / s.plain_tokens_per_s, s.Passes() ? "PASS" : "MISS");
  }
  for (const BatchSweep& s : sweeps) {
    if (!s.auto_used.empty()) std::printf("batch %d: %s\n", s.batch, s.auto_used.c_str());
  }
}

}  // namespace specd
