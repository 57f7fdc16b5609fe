// Shared by the speculation tests (engine_spec_test, tests/ssd_test): the codepair pair, an
// observer collecting per-step speculation metrics, engine and request builders, the 48
// held-out prompts, and the chi-square test of the first token a verification round decides
// (against the target's raw distribution, or any distribution a test works out); greedy
// output under each sampling option, plain and speculative.
// Test code only (needs SPECD_SHARED_DIR and GoogleTest).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
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

namespace specd::speculation_test {

// $SPECD_SHARED_DIR where set (a packed test run on the GPU machine), else the build's.
inline const std::string kModels =
    std::string(std::getenv("SPECD_SHARED_DIR") != nullptr && *std::getenv("SPECD_SHARED_DIR")
                    ? std::getenv("SPECD_SHARED_DIR")
                    : SPECD_SHARED_DIR) +
    "/models";
inline const std::string kTarget = kModels + "/codepair/target";
inline const std::string kDraft = kModels + "/codepair/draft";
inline constexpr int32_t kLen = 32;  // tokens generated per prompt

// Collects the per-step speculation metrics.
class SpecObserver : public EngineObserver {
 public:
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

// Keeps the last SSD counters the engine reported (a copy: the pointer is only valid in the
// call).
class SsdObserver : public SpecObserver {
 public:
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    SpecObserver::OnSpeculation(m);
    std::lock_guard lock(mu_);
    if (m.ssd != nullptr) last = *m.ssd;
  }
  SsdStats Last() {
    std::lock_guard lock(mu_);
    return last;
  }
  SsdStats last;
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

// Greedy requests of every prompt, `len` tokens each, with `spec`, in one batch.
inline std::vector<GenerateResult> RunGreedy(Engine& engine,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             SpeculationParams spec, int32_t len) {
  std::vector<GenerateRequest> requests;
  for (const auto& p : prompts) requests.push_back(Greedy(p, len, spec));
  auto results = engine.GenerateBatch(requests);
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? *std::move(results) : std::vector<GenerateResult>();
}

// Tokens committed per verification round over `results` (1 + accepted / rounds; 0: no round).
inline double TokensPerRound(const std::vector<GenerateResult>& results) {
  int64_t rounds = 0, accepted = 0;
  for (const GenerateResult& r : results) {
    rounds += r.usage.num_drafts;
    accepted += r.usage.num_accepted_tokens;
  }
  return rounds > 0 ? 1.0 + static_cast<double>(accepted) / rounds : 0.0;
}

// Upper 0.1% point of chi-square with dof degrees of freedom (Wilson-Hilferty).
inline double ChiSquareCritical999(int dof) {
  const double z = 3.090232306;
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

// The second tokens of `n` seeded requests of prompt + 3 tokens under `params` (temperature 1
// unless it says otherwise) with `spec`, grouped by the first token: the second token is the
// first one a verification round decides.
struct SecondTokenCounts {
  std::map<int32_t, std::map<int32_t, int>> by_first;  // t1 -> t2 -> runs
  int64_t num_drafted = 0;  // requests whose verification round carried drafts
};

inline SecondTokenCounts SampleSecondTokens(Engine& engine, const std::vector<int32_t>& prompt,
                                            int n, SpeculationParams spec,
                                            SamplingParams params = {}) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    r.prompt_ids = prompt;
    r.params = params;
    r.params.max_tokens = 3;
    r.params.seed = 1000 + i;
    r.params.ignore_eos = true;
    r.speculation = spec;
    requests.push_back(r);
  }
  auto results = engine.GenerateBatch(requests);
  EXPECT_TRUE(results.ok()) << results.status();
  SecondTokenCounts counts;
  if (!results.ok()) return counts;
  for (const auto& r : *results) {
    ++counts.by_first[r.tokens[0].id][r.tokens[1].id];
    if (r.usage.num_drafts > 0) ++counts.num_drafted;
  }
  return counts;
}

// What the second token should follow after prompt + t1: probabilities by id. `complete`: the
// ids not listed have probability 0 (a processed distribution, cut by top-k / top-p / min-p);
// otherwise they share the rest of the mass.
struct NextTokenDistribution {
  std::map<int32_t, double> probs;
  bool complete = false;
};

struct ChiSquareResult {
  double statistic = 0;
  double critical = 0;  // at the 0.1% level
  int dof = 0;
  int64_t num_impossible = 0;  // runs that drew an id of probability 0 (complete distributions)
};

// Chi-square of the second tokens against expected(t1), given each first token drawn at least
// 200 times. The groups' statistics add up (independent chi-squares). Bins: ids expected at
// least 5 times, the rest pooled (dropped when expected fewer than 5 times).
inline ChiSquareResult SecondTokenChiSquareOf(
    const SecondTokenCounts& counts,
    const std::function<NextTokenDistribution(int32_t t1)>& expected) {
  ChiSquareResult out;
  for (const auto& [t1, by_t2] : counts.by_first) {
    int total = 0;
    for (const auto& [t2, c] : by_t2) total += c;
    if (total < 200) continue;
    const NextTokenDistribution want = expected(t1);
    if (want.complete) {
      for (const auto& [t2, c] : by_t2) out.num_impossible += want.probs.count(t2) ? 0 : c;
    }
    double rest_expected = total;
    int rest_count = total, bins = 0;
    for (const auto& [id, p] : want.probs) {
      const double e = total * p;
      if (e < 5) continue;
      const auto it = by_t2.find(id);
      const int observed = it == by_t2.end() ? 0 : it->second;
      out.statistic += (observed - e) * (observed - e) / e;
      rest_expected -= e;
      rest_count -= observed;
      ++bins;
    }
    if (rest_expected >= 5) {
      out.statistic += (rest_count - rest_expected) * (rest_count - rest_expected) / rest_expected;
      ++bins;
    }
    out.dof += bins - 1;
    std::printf("chi-square group t1=%d: %d runs, %d bins\n", t1, total, bins);
  }
  out.critical = ChiSquareCritical999(std::max(out.dof, 1));
  std::printf("chi-square: statistic %.2f, dof %d, critical %.2f, impossible draws %lld\n",
              out.statistic, out.dof, out.critical, static_cast<long long>(out.num_impossible));
  return out;
}

// Runs `n` seeded temperature-1 requests with `spec` (the draft model, K = 2 by default) and
// tests the second token against the target's raw distribution (its top-20 logprobs after
// prompt + t1). Returns {statistic, critical value at the 0.1% level}.
inline std::pair<double, double> SecondTokenChiSquare(Engine& engine,
                                                      const std::vector<int32_t>& prompt, int n,
                                                      SpeculationParams spec = {
                                                          SpeculationMethod::kDraftModel, 2}) {
  const SecondTokenCounts counts = SampleSecondTokens(engine, prompt, n, spec);
  const ChiSquareResult chi = SecondTokenChiSquareOf(counts, [&](int32_t t1) {
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(t1);
    GenerateRequest probe = Greedy(ctx, 1);
    probe.params.logprobs = 20;
    auto p = engine.Generate(probe);
    EXPECT_TRUE(p.ok()) << p.status();
    NextTokenDistribution want;
    if (p.ok()) {
      for (const TokenLogprob& t : p->tokens[0].top) want.probs[t.id] = std::exp(t.logprob);
    }
    return want;
  });
  EXPECT_GE(chi.dof, 10) << "the prompt must leave the second token uncertain";
  return {chi.statistic, chi.critical};
}

// ---- greedy output under each sampling option (engine_spec_options_test, ssd_test) -----------

inline const SpeculationParams kPlain{SpeculationMethod::kNone, 0};
inline constexpr int32_t kOptionLen = 20;  // tokens per request

// Logprobs agree to 1e-5 relative (at least 1e-5): the verification pass computes a row among
// K + 1 positions, plain decoding alone, and fp32 sums in another order differ in the last bits
// (measured: up to 1.4e-5 at logprob -9.3).
inline double LogprobTolerance(float want) { return 1e-5 * std::max(1.0f, std::abs(want)); }

inline void ExpectSameOutput(const GenerateResult& got, const GenerateResult& want,
                             const std::string& what) {
  EXPECT_EQ(got.ids(), want.ids()) << what;
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t t = 0; t < got.tokens.size(); ++t) {
    EXPECT_NEAR(got.tokens[t].logprob, want.tokens[t].logprob,
                LogprobTolerance(want.tokens[t].logprob))
        << what << ", token " << t;
    ASSERT_EQ(got.tokens[t].top.size(), want.tokens[t].top.size()) << what << ", token " << t;
    for (size_t j = 0; j < got.tokens[t].top.size(); ++j) {
      EXPECT_EQ(got.tokens[t].top[j].id, want.tokens[t].top[j].id) << what << ", token " << t;
      EXPECT_NEAR(got.tokens[t].top[j].logprob, want.tokens[t].top[j].logprob,
                  LogprobTolerance(want.tokens[t].top[j].logprob))
          << what << ", token " << t;
    }
  }
}

// A greedy option set: a name and the params of each prompt (some depend on its plain output).
struct GreedyCase {
  std::string name;
  std::vector<SamplingParams> params;  // [prompt]
  int copies = 1;                      // n
  bool changes_output = true;          // the option changes plain greedy text (all but logprobs)
};

inline std::vector<GreedyCase> GreedyCases(const std::vector<GenerateResult>& plain) {
  auto each = [&](const std::string& name, auto set, int copies = 1) {
    GreedyCase c{name, {}, copies, name != "logprobs" && name != "n = 3"};
    for (const GenerateResult& p : plain) {
      SamplingParams s;
      s.temperature = 0;
      s.max_tokens = kOptionLen;
      set(s, p);
      c.params.push_back(s);
    }
    return c;
  };
  // min_tokens: EOS and a stop id the plain output has at position 2 are banned for the first
  // 10 tokens (rounds straddle the boundary), then the stop id may end the request.
  auto min_tokens = [](SamplingParams& s, const GenerateResult& p) {
    s.min_tokens = 10;
    s.stop_token_ids = {p.tokens[2].id};
  };
  // A stop string from the middle of the plain output, and one that never comes.
  auto stop = [](SamplingParams& s, const GenerateResult& p) {
    s.stop = {"@@never@@", p.text.substr(p.text.size() / 2, 3)};
  };
  return {
      each("repetition_penalty", [](SamplingParams& s, auto&) { s.repetition_penalty = 1.3f; }),
      each("presence_penalty", [](SamplingParams& s, auto&) { s.presence_penalty = 1.5f; }),
      each("frequency_penalty", [](SamplingParams& s, auto&) { s.frequency_penalty = 0.8f; }),
      each("min_tokens", min_tokens),
      each("stop strings", stop),
      each("logprobs", [](SamplingParams& s, auto&) { s.logprobs = 5; }),
      each(
          "n = 3", [](SamplingParams& s, auto&) { s.logprobs = 1; }, 3),
      each(
          "all at once",
          [&](SamplingParams& s, const GenerateResult& p) {
            s.repetition_penalty = 1.1f;
            s.presence_penalty = 0.5f;
            s.frequency_penalty = 0.5f;
            s.logprobs = 2;
            min_tokens(s, p);
            stop(s, p);
          },
          2),
  };
}

// Each prompt `copies` times in one batch (n > 1), kOptionLen greedy tokens with `spec`;
// params[i] for prompt i when given.
inline std::vector<GenerateResult> RunPrompts(Engine& engine,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<SamplingParams>& params,
                                              SpeculationParams spec, int copies = 1) {
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int c = 0; c < copies; ++c) {
      GenerateRequest r = Greedy(prompts[i], kOptionLen, spec);
      if (!params.empty()) r.params = params[i];
      requests.push_back(r);
    }
  }
  auto results = engine.GenerateBatch(requests);
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? *std::move(results) : std::vector<GenerateResult>();
}

// Every GreedyCase, plain and with each of `specs`: the same output (copies of a prompt too),
// drafts were verified, and the options take effect (else plain output is compared with itself).
// `plain`: the prompts' plain output without options.
inline void ExpectGreedyCasesLossless(Engine& engine,
                                      const std::vector<std::vector<int32_t>>& prompts,
                                      const std::vector<GenerateResult>& plain,
                                      const std::vector<SpeculationParams>& specs) {
  for (const GreedyCase& c : GreedyCases(plain)) {
    const auto want = RunPrompts(engine, prompts, c.params, kPlain, c.copies);
    ASSERT_EQ(want.size(), prompts.size() * c.copies);
    if (c.changes_output) {
      int changed = 0;
      for (size_t i = 0; i < want.size(); ++i) changed += want[i].text != plain[i / c.copies].text;
      EXPECT_GT(changed, 0) << c.name << " must change the plain output";
    }
    for (SpeculationParams spec : specs) {
      const std::string what = c.name + ", " + SpeculationMethodName(spec.method);
      const auto got = RunPrompts(engine, prompts, c.params, spec, c.copies);
      ASSERT_EQ(got.size(), want.size()) << what;
      int64_t drafted = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        // Copies of one prompt: each equals the plain run of its own copy and of the first.
        ExpectSameOutput(got[i], want[i], what + ", request " + std::to_string(i));
        ExpectSameOutput(got[i], want[i - i % c.copies], what + ", copy " + std::to_string(i));
        drafted += got[i].usage.num_draft_tokens;
      }
      EXPECT_GT(drafted, 0) << what << ": nothing was speculated";
    }
  }
}

}  // namespace specd::speculation_test
