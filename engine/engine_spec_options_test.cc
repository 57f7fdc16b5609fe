// Speculation is lossless under every sampling option (issue 16, point 6, CPU backend), for the
// draft model and n-gram lookup (SSD: tests/ssd_test.cc):
//   - greedy: with each option that applies to greedy requests (the three penalties, min_tokens
//     with EOS and stop ids banned early, stop strings, logprobs, n > 1, all at once) the
//     speculative output equals plain decoding's: ids, text, finish reason, logprobs;
//   - sampled: with top-k, top-p, min-p and the three penalties the second token (the first one
//     a verification round decides) follows the distribution worked out here from the target's
//     logits (chi-square), and a broken acceptance rule fails the same test;
//   - seeded: a sampled request gives the same output alone and in a batch with others.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/testing/engine_spec_logits_test_util.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/testing/test_flags.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace speculation_test;  // NOLINT: the shared fixtures of engine_spec_test_util.h

const SpeculationParams kDraftK4{SpeculationMethod::kDraftModel, 4};
const SpeculationParams kNgramK3{SpeculationMethod::kNgram, 3};

constexpr int kPromptIndices[] = {0, 17, 39};  // of the 48 held-out prompts

// One engine with the codepair draft loaded; the prompts; their plain greedy output without
// options (where stop strings and stop ids are taken from).
class SpecOptionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = MakeEngine(kTarget, R"({"model": ")" + kDraft + R"(", "method": "none"})").release();
    ASSERT_NE(engine_, nullptr);
    const auto all = LoadPrompts(*engine_->tokenizer());
    ASSERT_EQ(all.size(), 48u);
    prompts_ = new std::vector<std::vector<int32_t>>();
    for (int i : kPromptIndices) prompts_->push_back(all[i]);
    plain_ = new std::vector<GenerateResult>(RunPrompts(*engine_, *prompts_, {}, kPlain));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete prompts_;
    delete plain_;
  }
  void TearDown() override {
    acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kSpeculativeSampling;
  }

  static Engine* engine_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<GenerateResult>* plain_;
};
Engine* SpecOptionsTest::engine_ = nullptr;
std::vector<std::vector<int32_t>>* SpecOptionsTest::prompts_ = nullptr;
std::vector<GenerateResult>* SpecOptionsTest::plain_ = nullptr;

// About 11 s on 2 cores (8 cases x 3 runs of 3 prompts x 20 tokens).
TEST_F(SpecOptionsTest, GreedyWithEachOptionEqualsPlainForDraftModelAndNgram) {
  ExpectGreedyCasesLossless(*engine_, *prompts_, *plain_, {kDraftK4, kNgramK3});
}

// ---- sampled: the distribution is the target's, processed ------------------------------------

// The sampled options under test: each of them cuts or reshapes the second token's distribution.
SamplingParams SampledOptions() {
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_k = 12;
  s.top_p = 0.9f;
  s.min_p = 0.02f;
  s.repetition_penalty = 1.2f;
  s.presence_penalty = 0.4f;
  s.frequency_penalty = 0.3f;
  return s;
}

// The distribution of the token after `ctx` (= prompt + t1, t1 generated) under `s`, as
// sampler.h defines it, from the target's raw logits in double: the repetition penalty over the
// prompt's and t1's ids, presence and frequency over t1, temperature, min-p, top-k, top-p.
NextTokenDistribution ProcessedNextToken(const SamplingParams& s, const std::vector<int32_t>& ctx) {
  std::vector<float> logits = LastLogits(kTarget, ctx);
  for (int32_t id : std::set<int32_t>(ctx.begin(), ctx.end())) {
    float& v = logits[id];
    v = v > 0 ? v / s.repetition_penalty : v * s.repetition_penalty;
  }
  logits[ctx.back()] -= s.frequency_penalty + s.presence_penalty;
  for (float& v : logits) v /= s.temperature;
  const std::vector<double> p = Softmax(logits);
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  size_t keep = 0;
  while (keep < order.size() && p[order[keep]] >= s.min_p * p[order[0]]) ++keep;
  if (s.top_k > 0) keep = std::min<size_t>(keep, s.top_k);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[order[i]];
  double cum = 0;
  size_t n = 0;
  while (n < keep && (n == 0 || cum < s.top_p * kept)) cum += p[order[n++]];
  NextTokenDistribution out;
  out.complete = true;
  for (size_t i = 0; i < n; ++i) out.probs[order[i]] = p[order[i]] / cum;
  return out;
}

struct SampledCase {
  const char* prompt;
  SpeculationParams spec;
};

// The draft model: the first token is "," with p 0.79, the second is uncertain.
const SampledCase kDraftCase{"class Foo:\n    def __init__(self",
                             {SpeculationMethod::kDraftModel, 2}};
// N-gram: whatever the first token, it has come before, so lookup drafts the second.
const SampledCase kNgramCase{
    "def add(self, a, b):\n        return self.add(a, b)\n\n    def sub(self",
    {SpeculationMethod::kNgram, 2}};

// Runs `n` seeded requests of `c` under SampledOptions() and returns the chi-square of their
// second tokens against ProcessedNextToken; every draw must be possible under the options, and
// most requests must have verified drafts.
ChiSquareResult SampledChiSquare(Engine& engine, const SampledCase& c, int n) {
  const std::vector<int32_t> prompt = *engine.tokenizer()->Encode(c.prompt, true);
  const SamplingParams s = SampledOptions();
  const SecondTokenCounts counts = SampleSecondTokens(engine, prompt, n, c.spec, s);
  const ChiSquareResult chi = SecondTokenChiSquareOf(counts, [&](int32_t t1) {
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(t1);
    return ProcessedNextToken(s, ctx);
  });
  std::printf("%s: %lld of %d requests verified drafts\n", SpeculationMethodName(c.spec.method),
              static_cast<long long>(counts.num_drafted), n);
  EXPECT_GE(counts.num_drafted, n * 9 / 10) << "the second token must come from a verification";
  EXPECT_GE(chi.dof, 4) << "the options must leave the second token uncertain";
  return chi;
}

// 600 requests take about 4 s on 2 cores (the correct rule: statistics 4.5 and 1.2); the negative
// controls, 300 (2 s), still exceed the critical value several times over (measured: draft model
// 110 against 28.1, with 95 draws outside the processed support; n-gram 187 against 18.7).
constexpr int kSampledRuns = 600;
constexpr int kControlRuns = 300;

TEST_F(SpecOptionsTest, SampledWithDraftModelFollowsTheProcessedTarget) {
  const ChiSquareResult chi = SampledChiSquare(*engine_, kDraftCase, kSampledRuns);
  EXPECT_EQ(chi.num_impossible, 0);
  EXPECT_LT(chi.statistic, chi.critical);
}

TEST_F(SpecOptionsTest, SampledWithNgramFollowsTheProcessedTarget) {
  const ChiSquareResult chi = SampledChiSquare(*engine_, kNgramCase, kSampledRuns);
  EXPECT_EQ(chi.num_impossible, 0);
  EXPECT_LT(chi.statistic, chi.critical);
}

TEST_F(SpecOptionsTest, BrokenAcceptanceRuleIsCaughtWithDraftModel) {
  acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kDraftOverTargetForTest;
  const ChiSquareResult chi = SampledChiSquare(*engine_, kDraftCase, kControlRuns);
  EXPECT_GT(chi.statistic, chi.critical);
}

TEST_F(SpecOptionsTest, BrokenAcceptanceRuleIsCaughtWithNgram) {
  acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kDraftOverTargetForTest;
  const ChiSquareResult chi = SampledChiSquare(*engine_, kNgramCase, kControlRuns);
  EXPECT_GT(chi.statistic, chi.critical);
}

// ---- seeded: the same output alone and in a batch ---------------------------------------------

// A seeded sampled request (every sampled option, logprobs) with speculation: the same output
// alone as among the other prompts' requests and its own n = 2 copies (seeds seed + j, as the
// HTTP front end gives them).
TEST_F(SpecOptionsTest, SeededSampledOutputIsTheSameAloneAndInABatch) {
  for (SpeculationParams spec : {kDraftK4, kNgramK3}) {
    std::vector<GenerateRequest> batch;
    for (size_t i = 0; i < prompts_->size(); ++i) {
      for (uint64_t j = 0; j < 2; ++j) {
        GenerateRequest r = Greedy((*prompts_)[i], kOptionLen, spec);
        r.params = SampledOptions();
        r.params.max_tokens = kOptionLen;
        r.params.logprobs = 2;
        r.params.seed = 7 * i + j;
        batch.push_back(r);
      }
    }
    auto together = engine_->GenerateBatch(batch);
    ASSERT_TRUE(together.ok()) << together.status();
    int64_t drafted = 0;
    for (const GenerateResult& r : *together) drafted += r.usage.num_draft_tokens;
    EXPECT_GT(drafted, 0) << SpeculationMethodName(spec.method);
    for (size_t i : {size_t{1}, size_t{4}}) {
      auto alone = engine_->Generate(batch[i]);
      ASSERT_TRUE(alone.ok()) << alone.status();
      ExpectSameOutput(
          *alone, (*together)[i],
          std::string(SpeculationMethodName(spec.method)) + ", request " + std::to_string(i));
    }
  }
}

// A draft model whose context is below the server's max_model_len (the codepair draft with
// max_position_embeddings cut to 192, served beside the target at 1024): the server starts, each
// sequence drafts until it holds 192 tokens and decodes on without draft-model drafts after that,
// the output is plain decoding's, and the usage says where the drafts stopped.
TEST(DraftContextTest, ASequencePastTheDraftsContextDecodesOnWithoutItsDrafts) {
  namespace fs = std::filesystem;
  constexpr int32_t kContext = 192;
  const fs::path dir = fs::path(::testing::TempDir()) / "specd_short_draft";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(kDraft)) {
    if (e.path().filename() != "config.json") {
      fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
    }
  }
  std::ifstream in(fs::path(kDraft) / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["max_position_embeddings"] = kContext;
  std::ofstream(dir / "config.json") << config.dump();

  auto engine = MakeEngine(kTarget, R"({"model": ")" + dir.string() + R"(", "method": "none"})");
  ASSERT_NE(engine, nullptr);
  const auto all = LoadPrompts(*engine->tokenizer());
  std::vector<int32_t> prompt;
  for (const auto& p : all) {
    if (p.size() < 150) prompt = p;  // drafts for at least 42 tokens, then stops
  }
  ASSERT_FALSE(prompt.empty());
  constexpr int32_t kTokens = 96;
  auto plain = engine->Generate(Greedy(prompt, kTokens, kPlain));
  auto spec = engine->Generate(Greedy(prompt, kTokens, kDraftK4));
  ASSERT_TRUE(plain.ok() && spec.ok()) << plain.status() << spec.status();
  EXPECT_EQ(spec->ids(), plain->ids());
  EXPECT_EQ(spec->usage.draft_context_stop, kContext);
  EXPECT_EQ(plain->usage.draft_context_stop, 0);
  EXPECT_GT(spec->usage.num_drafts, 0);
  // Drafts only while the sequence fit the draft's context: at most 4 a round, each round at
  // least one token, from the prompt's end to the context.
  EXPECT_LE(spec->usage.num_draft_tokens, 4 * (kContext - static_cast<int64_t>(prompt.size()) + 1));
  // `auto` may choose the draft model early on; past the context it decodes plainly.
  auto chosen = engine->Generate(Greedy(prompt, kTokens, {SpeculationMethod::kAuto, 4}));
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->ids(), plain->ids());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace specd
