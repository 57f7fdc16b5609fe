// Shared by the speculation tests (engine_spec_test, tests/ssd_test): the codepair pair, an
// observer collecting per-step speculation metrics, engine and request builders, the 48
// held-out prompts, and the chi-square test of the first token a verification round decides.
// Test code only (needs SPECD_SHARED_DIR and GoogleTest).
#pragma once

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd::spec_test {

inline const std::string kModels = std::string(SPECD_SHARED_DIR) + "/models";
inline const std::string kTarget = kModels + "/codepair/target";
inline const std::string kDraft = kModels + "/codepair/draft";
inline constexpr int32_t kLen = 32;  // tokens generated per prompt

// Collects the per-step speculation metrics.
class SpecObserver : public EngineObserver {
 public:
  void OnRequestFinished(const FinishedRequestMetrics&) override {}
  void OnInterTokenLatency(double) override {}
  void OnStep(const EngineStats&) override {}
  void OnPrefixCache(int64_t, int64_t) override {}
  void OnPreemption(int32_t) override {}
  void Reset() {
    std::lock_guard lock(mu_);
    num_rounds = num_draft_tokens = num_accepted = 0;
    accepted_at.clear();
    drafted_at.clear();
  }
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < m.num_draft_tokens.size(); ++i) {
      ++num_rounds;
      num_draft_tokens += m.num_draft_tokens[i];
      num_accepted += m.num_accepted[i];
      if (accepted_at.size() < static_cast<size_t>(m.num_draft_tokens[i])) {
        accepted_at.resize(m.num_draft_tokens[i]);
        drafted_at.resize(m.num_draft_tokens[i]);
      }
      for (int32_t j = 0; j < m.num_draft_tokens[i]; ++j) ++drafted_at[j];
      for (int32_t j = 0; j < m.num_accepted[i]; ++j) ++accepted_at[j];
    }
  }
  std::mutex mu_;
  int64_t num_rounds = 0, num_draft_tokens = 0, num_accepted = 0;
  std::vector<int64_t> accepted_at, drafted_at;  // [position]
};

inline std::unique_ptr<Engine> MakeEngine(const std::string& model, const std::string& spec_json,
                                          std::shared_ptr<EngineObserver> observer = nullptr) {
  EngineOptions o;
  o.model_dir = model;
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = model == kTarget ? 1024 : 0;
  o.observer = std::move(observer);
  auto spec = ParseSpeculativeConfig(spec_json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

inline GenerateRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens,
                              SpeculationParams spec = {}) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.speculation = spec;
  return r;
}

// The 48 held-out codepair prompts, tokenized (BOS added).
inline std::vector<std::vector<int32_t>> LoadPrompts(const Tokenizer& tok) {
  std::ifstream in(kModels + "/codepair/prompts.jsonl");
  std::vector<std::vector<int32_t>> prompts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto ids = tok.Encode(nlohmann::json::parse(line)["prompt"].get<std::string>(), true);
    prompts.push_back(*ids);
  }
  return prompts;
}

// Upper 0.1% point of chi-square with dof degrees of freedom (Wilson-Hilferty).
inline double ChiSquareCritical999(int dof) {
  const double z = 3.090232306;
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// Runs `n` seeded temperature-1 requests of prompt + 3 tokens with `spec` (the draft model,
// K = 2 by default) and
// tests the distribution of the second token against the target's, given each frequent first
// token (the target's top-20 logprobs at temperature 1 after prompt + t1): the second token is
// the first one a verification round decides. The groups' statistics add up (independent
// chi-squares). Returns {statistic, critical value at the 0.1% level}.
inline std::pair<double, double> SecondTokenChiSquare(Engine& engine,
                                                      const std::vector<int32_t>& prompt, int n,
                                                      SpeculationParams spec = {
                                                          SpeculationMethod::kDraftModel, 2}) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r = Greedy(prompt, 3, spec);
    r.params.temperature = 1.0f;
    r.params.seed = 1000 + i;
    r.params.ignore_eos = true;
    requests.push_back(r);
  }
  auto results = engine.GenerateBatch(requests);
  EXPECT_TRUE(results.ok());
  std::map<int32_t, std::map<int32_t, int>> counts;  // t1 -> t2 -> runs
  for (const auto& r : *results) ++counts[r.tokens[0].id][r.tokens[1].id];
  double stat = 0;
  int dof = 0;
  for (auto& [t1, by_t2] : counts) {
    int total = 0;
    for (const auto& [t2, c] : by_t2) total += c;
    if (total < 200) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(t1);
    GenerateRequest probe = Greedy(ctx, 1);
    probe.params.logprobs = 20;
    auto p = engine.Generate(probe);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) continue;
    // Bins: tokens expected at least 5 times, the rest pooled.
    double rest_expected = total;
    int rest_count = total, bins = 0;
    for (const TokenLogprob& t : p->tokens[0].top) {
      const double expected = total * std::exp(t.logprob);
      if (expected < 5) continue;
      const int observed = by_t2.count(t.id) ? by_t2[t.id] : 0;
      stat += (observed - expected) * (observed - expected) / expected;
      rest_expected -= expected;
      rest_count -= observed;
      ++bins;
    }
    if (rest_expected >= 5) {
      stat += (rest_count - rest_expected) * (rest_count - rest_expected) / rest_expected;
      ++bins;
    }
    dof += bins - 1;
    std::printf("chi-square group t1=%d: %d runs, %d bins\n", t1, total, bins);
  }
  EXPECT_GE(dof, 10) << "the prompt must leave the second token uncertain";
  std::printf("chi-square: statistic %.2f, dof %d, critical %.2f\n", stat, dof,
              ChiSquareCritical999(dof));
  return {stat, ChiSquareCritical999(std::max(dof, 1))};
}

}  // namespace specd::spec_test
