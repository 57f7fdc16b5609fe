// EAGLE-3 speculation on the CPU engine (issue 33): lossless greedy output (any K, every greedy
// option, mixed with the other methods in one batch, prompts from the prefix cache) and the
// acceptance of the head the project trained for codepair (models/codepair/eagle3,
// tools/train/train_eagle3.py). Sampled output: engine_draft_sampling_test.
#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/eagle3_test_util.h"
#include "engine/model/model_config.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace speculation_test;  // NOLINT: the shared fixtures of the speculation tests

const std::string kTrainedHead = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
const SpeculationParams kEagle3{SpeculationMethod::kEagle3, 4};

// A random head for the codepair target (drafts badly: lossless tests only).
std::string RandomHead() {
  const std::string dir = ::testing::TempDir() + "/engine_eagle3_test_random_head";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    auto target = LoadModelConfig(kTarget);
    EXPECT_TRUE(target.ok()) << target.status();
    eagle3_test::WriteRandomHead(dir, *target,
                                 {.draft_vocab_size = 4096, .aux_layer_ids = {1, 3, 5}});
  }
  return dir;
}

std::string Spec(const std::string& head) {
  return R"({"method": "eagle3", "model": ")" + head + R"(", "num_speculative_tokens": 4})";
}

class Eagle3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = MakeEngine(kTarget, Spec(kTrainedHead)).release();
    ASSERT_NE(engine_, nullptr);
    prompts_ = new std::vector<std::vector<int32_t>>(LoadPrompts(*engine_->tokenizer()));
    prompts_->resize(8);
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete prompts_;
  }
  static std::vector<GenerateResult> Run(Engine& engine, SpeculationParams spec, int32_t len) {
    return RunGreedy(engine, *prompts_, spec, len);
  }

  static Engine* engine_;
  static std::vector<std::vector<int32_t>>* prompts_;
};
Engine* Eagle3Test::engine_ = nullptr;
std::vector<std::vector<int32_t>>* Eagle3Test::prompts_ = nullptr;

TEST_F(Eagle3Test, GreedyEqualsPlainForKOneToSevenWithTheTrainedAndARandomHead) {
  const auto plain = Run(*engine_, kPlain, kLen);
  auto random = MakeEngine(kTarget, Spec(RandomHead()));
  ASSERT_NE(random, nullptr);
  for (Engine* engine : {engine_, random.get()}) {
    for (int32_t k : {1, 2, 4, 7}) {
      const auto got = Run(*engine, {SpeculationMethod::kEagle3, k}, kLen);
      ASSERT_EQ(got.size(), plain.size());
      int64_t drafted = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].ids(), plain[i].ids()) << "K " << k << ", prompt " << i;
        drafted += got[i].usage.num_draft_tokens;
        ASSERT_EQ(got[i].usage.by_method.size(), 1u);
        EXPECT_STREQ(got[i].usage.by_method[0].method, "eagle3");
      }
      EXPECT_GT(drafted, 0) << "K " << k << ": nothing was drafted";
    }
  }
}

TEST_F(Eagle3Test, EveryGreedyOptionKeepsThePlainOutput) {
  const auto plain = Run(*engine_, kPlain, kOptionLen);
  ExpectGreedyCasesLossless(*engine_, *prompts_, plain, {kEagle3});
}

// All methods in one step: the head sees only its own sequences' hidden states.
TEST_F(Eagle3Test, MixedBatchOfEveryMethodEqualsPlain) {
  auto engine = MakeEngine(
      kTarget, R"({"model": ")" + kDraft + R"(", "eagle3_model": ")" + kTrainedHead + R"("})");
  ASSERT_NE(engine, nullptr);
  const auto plain = Run(*engine, kPlain, kLen);
  const SpeculationParams methods[] = {
      kEagle3, {SpeculationMethod::kDraftModel, 3}, kPlain, {SpeculationMethod::kNgram, 2}};
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < prompts_->size(); ++i) {
    requests.push_back(Greedy((*prompts_)[i], kLen, methods[i % 4]));
  }
  auto got = engine->GenerateBatch(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].ids(), plain[i].ids()) << "prompt " << i;
  }
  EXPECT_GT((*got)[0].usage.num_accepted_tokens, 0);
}

// The CPU head keeps its entries per sequence, so the hidden states of a prompt's cached positions
// would never reach it: a request the head may draft for computes its whole prompt (no prefix-cache
// hits) and drafts as it did the first time, while a plain request still reuses the cached blocks.
TEST_F(Eagle3Test, PromptsTheHeadDraftsForAreComputedWhole) {
  const std::vector<int32_t>& prompt = (*prompts_)[2];
  auto first = engine_->Generate(Greedy(prompt, kLen, kEagle3));
  auto again = engine_->Generate(Greedy(prompt, kLen, kEagle3));
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(again->usage.cached_prompt_tokens, 0);
  EXPECT_EQ(again->ids(), first->ids());
  EXPECT_GT(again->usage.num_drafts, 0);
  EXPECT_EQ(again->usage.num_drafts, first->usage.num_drafts);
  EXPECT_EQ(again->usage.num_accepted_tokens, first->usage.num_accepted_tokens);
  auto plain = engine_->Generate(Greedy(prompt, kLen, kPlain));
  ASSERT_TRUE(plain.ok());
  EXPECT_GT(plain->usage.cached_prompt_tokens, 0);
  EXPECT_EQ(plain->ids(), first->ids());
}

// A prompt longer than the head's window of pending positions (kEagle3PoolWindow), prefilled in
// chunks of 48 tokens: the positions that leave the window run through the head as each chunk
// arrives (across chunk boundaries), so the head sees the whole prompt: output equal to plain
// decoding, and the trained head still accepts.
TEST_F(Eagle3Test, LongChunkedPromptRunsTheHeadAsItArrives) {
  EngineOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = 1024;
  o.max_num_batched_tokens = 48;
  auto spec = ParseSpeculativeConfig(Spec(kTrainedHead));
  ASSERT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> prompt = *(*engine)->tokenizer()->Encode(
      "import os\nimport sys\nfrom typing import Dict, List, Optional\n\n\n"
      "class Config:\n    \"\"\"Settings read from the environment.\"\"\"\n\n"
      "    def __init__(self, name: str, values: Optional[Dict[str, str]] = None):\n"
      "        self.name = name\n        self.values = values or {}\n\n"
      "    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:\n"
      "        if key in self.values:\n            return self.values[key]\n"
      "        return os.environ.get(key, default)\n\n"
      "    def set(self, key: str, value: str) -> None:\n        self.values[key] = value\n\n"
      "    def keys(self) -> List[str]:\n        return sorted(self.values.keys())\n\n\n"
      "def load_config(path: str) -> Config:\n    values = {}\n"
      "    with open(path) as f:\n        for line in f:\n            line = line.strip()\n"
      "            if not line or line.startswith(\"#\"):\n                continue\n"
      "            key, _, value = line.partition(\"=\")\n"
      "            values[key.strip()] = value.strip()\n    return Config(path, values)\n\n\n"
      "def main(argv: List[str]) -> int:\n",
      true);
  ASSERT_GT(prompt.size(), 2u * kEagle3PoolWindow);
  GenerateRequest r = Greedy(prompt, kLen, kPlain);
  r.params.min_tokens = kLen;  // the end of the prompt invites EOS
  auto plain = (*engine)->Generate(r);
  r.speculation = kEagle3;
  auto head = (*engine)->Generate(r);
  ASSERT_TRUE(plain.ok() && head.ok());
  EXPECT_EQ(head->ids(), plain->ids());
  ASSERT_GT(head->usage.num_drafts, 0);
  const double per_round =
      1.0 + double(head->usage.num_accepted_tokens) / double(head->usage.num_drafts);
  std::printf("prompt of %zu tokens: %.2f tokens per round\n", prompt.size(), per_round);
  EXPECT_GT(per_round, 1.5);
}

// The trained head drafts for real: tokens per round at K 4, greedy, over the first 8 held-out
// prompts, far above a random head's (which stays near 1). Issue 33's comparison with the codepair
// draft model is over all 48 prompts (docs/benchmarks.md: 3.79 against 3.50); on these 8 the two
// are close (3.59 against 3.61 for the stage-5 head), so the comparison is printed and the bar
// checked is 2.5.
TEST_F(Eagle3Test, TrainedHeadDraftsForReal) {
  auto engine = MakeEngine(
      kTarget, R"({"model": ")" + kDraft + R"(", "eagle3_model": ")" + kTrainedHead + R"("})");
  ASSERT_NE(engine, nullptr);
  const double head = TokensPerRound(Run(*engine, kEagle3, 64));
  const double draft = TokensPerRound(Run(*engine, {SpeculationMethod::kDraftModel, 4}, 64));
  std::printf("tokens per round at K 4: EAGLE-3 head %.3f, draft model %.3f\n", head, draft);
  EXPECT_GE(head, 2.5);
}

// A sampled request that bans every id the head can propose (min_tokens with the random head's
// whole draft vocabulary, the even ids, as stop ids) leaves the head nothing to draw from at the
// banned positions: it drafts nothing there (a q row without mass would let verification accept
// what q never proposed), and the output keeps the bans.
TEST(Eagle3BanTest, BanningTheWholeDraftVocabularyLeavesNoDraftToAccept) {
  auto engine = MakeEngine(kTarget, Spec(RandomHead()));
  ASSERT_NE(engine, nullptr);
  GenerateRequest r;
  r.prompt_ids = *engine->tokenizer()->Encode("def main():\n    ", true);
  r.params.temperature = 1.0f;
  r.params.seed = 5;
  r.params.max_tokens = 12;
  r.params.min_tokens = 8;
  for (int32_t id = 0; id < 8192; id += 2) r.params.stop_token_ids.push_back(id);
  r.speculation = kEagle3;
  auto result = engine->Generate(r);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_GE(result->tokens.size(), 8u);
  for (size_t t = 0; t < 8; ++t) EXPECT_EQ(result->tokens[t].id % 2, 1) << "token " << t;
}

TEST(Eagle3ConfigTest, RequestsForAHeadTheServerLacksAreRefused) {
  auto engine = MakeEngine(kTarget, "");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy({0, 5, 6}, 4, kEagle3);
  auto result = engine->Generate(r);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("EAGLE-3 head"), std::string::npos) << result.status();
}

TEST(Eagle3ConfigTest, AHeadForAnotherTargetFailsTheServerStartWithTheReason) {
  EngineOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.num_threads = 1;
  const std::string dir = ::testing::TempDir() + "/engine_eagle3_test_wide_head";
  auto target = LoadModelConfig(kTarget);
  ASSERT_TRUE(target.ok());
  eagle3_test::WriteRandomHead(dir, *target, {.target_hidden_size = 4096});
  auto spec = ParseSpeculativeConfig(Spec(dir));
  ASSERT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  auto engine = Engine::Create(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("EAGLE-3 head"), std::string::npos) << engine.status();
  EXPECT_NE(engine.status().message().find("target_hidden_size"), std::string::npos)
      << engine.status();
}

}  // namespace
}  // namespace specd
