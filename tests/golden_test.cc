// Engine-level goldens: whole requests (tokenizer + model + sampler + stop logic) against
// references we did not write: HF transformers greedy ids for codepair, Karpathy's
// published stories260K text.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/engine.h"
#include "engine/testing/engine_test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

const std::string kModels = std::string(SPECD_SHARED_DIR) + "/models";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Engine> MakeEngine(const std::string& dir, EngineOptions options = {}) {
  options.model_dir = dir;
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Greedy with EOS masked (the goldens' min_new_tokens).
constexpr auto* Greedy = &serving_test::GreedyEosMasked;

TEST(GoldenTest, Stories260KGreedyFromBosReproducesKarpathysText) {
  auto engine = MakeEngine(kModels + "/stories260K/hf");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy({1}, 256);  // run.c: 256 steps from BOS
  r.params.min_tokens = 0;
  r.params.stop_token_ids = {1};  // run.c stops when BOS comes back
  auto result = engine->Generate(r);
  ASSERT_TRUE(result.ok()) << result.status();
  std::string expected = ReadAll(kModels + "/stories260K/golden/expected_greedy_llama2c_doc.txt");
  ASSERT_FALSE(expected.empty());
  if (expected.back() == '\n') expected.pop_back();  // run.c prints a final newline of its own
  EXPECT_EQ(result->text, expected);
  EXPECT_EQ(result->tokens.size(), 256u);
  auto golden =
      nlohmann::json::parse(ReadAll(kModels + "/stories260K/golden/greedy_from_bos.json"));
  std::vector<int32_t> ids = result->ids();
  std::vector<int32_t> want = golden["generated_ids"].get<std::vector<int32_t>>();
  ids.resize(std::min(ids.size(), want.size()));
  EXPECT_EQ(ids, std::vector<int32_t>(want.begin(), want.begin() + ids.size()));
  EXPECT_GE(ids.size(), 200u);
}

class CodepairGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CodepairGoldenTest, GreedyBatchOfEightEqualsHfAndEachAlone) {
  auto engine = MakeEngine(kModels + "/codepair/" + GetParam());
  ASSERT_NE(engine, nullptr);
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))[GetParam()];
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i)
    requests.push_back(Greedy(golden[i]["prompt_ids"].get<std::vector<int32_t>>(), 48));
  auto batch = engine->GenerateBatch(requests);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*batch)[i].ids(), golden[i]["greedy_ids"].get<std::vector<int32_t>>())
        << "prompt " << i;
    EXPECT_EQ((*batch)[i].text, golden[i]["greedy_text"].get<std::string>()) << "prompt " << i;
  }
  for (int i : {0, 5}) {
    auto alone = engine->Generate(requests[i]);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(alone->ids(), (*batch)[i].ids()) << "prompt " << i << " alone vs in a batch";
  }
}

// Counts preemptions and prefix-cache hits (called on the generating thread here).
class CountingObserver : public EngineObserver {
 public:
  void OnPrefixCache(int64_t, int64_t hit) override { hit_blocks += hit; }
  void OnPreemption(int32_t n) override { preempted += n; }
  int64_t hit_blocks = 0;
  int64_t preempted = 0;
};

// The same goldens through the continuous-batching scheduler at its tightest: a KV pool of
// 16 blocks (the 16 requests need about 150) forces preemption by recompute, a token
// budget of 32 chunks every prefill, and every prompt comes twice, so the second copy
// (or a recomputed sequence) starts from prefix-cache blocks.
TEST_P(CodepairGoldenTest, GreedyEqualsHfUnderPreemptionChunkedPrefillAndPrefixCache) {
  auto observer = std::make_shared<CountingObserver>();
  EngineOptions options;
  options.observer = observer;
  options.max_model_len = 256;
  options.kv_cache_bytes = 1;  // the minimum: one max_model_len sequence (16 blocks)
  options.max_num_batched_tokens = 32;
  auto engine = MakeEngine(kModels + "/codepair/" + GetParam(), options);
  ASSERT_NE(engine, nullptr);
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))[GetParam()];
  std::vector<GenerateRequest> requests;
  for (int copy = 0; copy < 2; ++copy) {
    for (int i = 0; i < 8; ++i)
      requests.push_back(Greedy(golden[i]["prompt_ids"].get<std::vector<int32_t>>(), 48));
  }
  auto batch = engine->GenerateBatch(requests);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ((*batch)[i].ids(), golden[i % 8]["greedy_ids"].get<std::vector<int32_t>>())
        << "request " << i;
  }
  EXPECT_GT(observer->preempted, 0);
  EXPECT_GT(observer->hit_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(TargetAndDraft, CodepairGoldenTest, ::testing::Values("target", "draft"));

TEST(EngineTest, SeededSamplingRepeatsAloneAndInBatch) {
  auto engine = MakeEngine(kModels + "/codepair/target");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("def parse(", true), 32);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.top_k = 50;
  r.params.seed = 1234;
  auto a = engine->Generate(r);
  GenerateRequest other = r;
  other.params.seed = 99;
  std::vector<GenerateRequest> batch = {other, r, other};
  auto b = engine->GenerateBatch(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ids(), (*b)[1].ids());
  EXPECT_NE(a->ids(), (*b)[0].ids());
}

TEST(EngineTest, LogprobsAreTheModelsAndGreedyTokenIsTopOne) {
  auto engine = MakeEngine(kModels + "/codepair/target");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("import numpy as", true), 8);
  r.params.logprobs = 3;
  auto result = engine->Generate(r);
  ASSERT_TRUE(result.ok());
  for (const GeneratedToken& t : result->tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, t.id);
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
    EXPECT_LT(t.logprob, 0.0f);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
  }
}

TEST(EngineTest, StopTokenIdsMaxTokensAndContextLimit) {
  auto engine = MakeEngine(kModels + "/codepair/target");
  ASSERT_NE(engine, nullptr);
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"][0];
  GenerateRequest r = Greedy(golden["prompt_ids"].get<std::vector<int32_t>>(), 48);
  r.params.min_tokens = 0;
  r.params.stop_token_ids = {golden["greedy_ids"][3].get<int32_t>()};
  auto stopped = engine->Generate(r);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->tokens.size(), 4u);
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  r.params.stop_token_ids.clear();
  r.params.max_tokens = 5;
  auto length = engine->Generate(r);
  ASSERT_TRUE(length.ok());
  EXPECT_EQ(length->tokens.size(), 5u);
  EXPECT_EQ(length->finish_reason, FinishReason::kLength);
  GenerateRequest too_long = Greedy(std::vector<int32_t>(engine->max_model_len(), 5), 1);
  EXPECT_EQ(engine->Generate(too_long).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateRequest empty = Greedy({}, 1);
  EXPECT_EQ(engine->Generate(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, StreamedTextConcatenatesToFinalText) {
  auto engine = MakeEngine(kModels + "/codepair/target");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("class Foo:\n", true), 40);
  r.params.stop = {"return"};
  std::string streamed;
  int calls = 0;
  auto result =
      engine->Generate(r, [&](size_t index, const GeneratedToken&, std::string_view text) {
        EXPECT_EQ(index, 0u);
        streamed += text;
        ++calls;
      });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(streamed, result->text);
  EXPECT_EQ(calls, static_cast<int>(result->tokens.size()));
}

}  // namespace
}  // namespace specd
