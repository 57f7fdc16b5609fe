// The engine serves an NSA model (nsa-codepair) on the CPU runner: greedy generation with
// ignore_eos reproduces the golden ids (an exact reference we did not write; EOS is not special
// in them), a repeated prompt is served from the prefix cache with the same ids, and chunked
// prefill of two concurrent requests in a KV pool too small for both (so one is preempted and
// recomputed) gives each its golden ids.
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using serving_test::Collector;
using serving_test::Greedy;

const std::string kNsaModel = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

std::vector<Golden> ReadGoldens() {
  absl::StatusOr<std::string> text = ReadFileToString(kNsaModel + "/golden.json");
  EXPECT_TRUE(text.ok()) << text.status();
  const nlohmann::json list = nlohmann::json::parse(text.ok() ? *text : "[]", nullptr, false);
  std::vector<Golden> out;
  if (!list.is_array()) return out;
  for (const nlohmann::json& e : list) {
    out.push_back(
        {e["prompt_ids"].get<std::vector<int32_t>>(), e["greedy_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

// Counts preempted sequences; any thread.
class PreemptionCounter : public EngineObserver {
 public:
  void OnPreemption(int32_t n) override { preempted_ += n; }
  int64_t preempted() const { return preempted_.load(); }

 private:
  std::atomic<int64_t> preempted_{0};
};

absl::Status MakeNsaEngineStatus(EngineOptions options) {
  options.model_dir = kNsaModel;
  options.max_model_len = 2048;
  options.num_threads = 1;
  return Engine::Create(options).status();
}

std::unique_ptr<Engine> MakeNsaEngine(EngineOptions options) {
  options.model_dir = kNsaModel;
  if (options.max_model_len == 0) options.max_model_len = 2048;
  if (options.num_threads == 0) options.num_threads = 1;  // CI has 2 cores; tiny model
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  EXPECT_TRUE((*engine)->Start().ok());
  return std::move(*engine);
}

GenerateRequest GoldenRequest(const Golden& g) {
  GenerateRequest r = Greedy(g.prompt, static_cast<int32_t>(g.greedy.size()));
  r.params.ignore_eos = true;
  return r;
}

// Entry 3's first golden token is EOS: without ignore_eos the engine would stop there.
TEST(EngineNsaTest, GreedyMatchesGoldenAndRepeatHitsPrefixCache) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  const Golden& g = goldens[3];
  auto engine = MakeNsaEngine(EngineOptions{});
  ASSERT_NE(engine, nullptr);
  Collector c;
  auto first = engine->Submit(GoldenRequest(g), c.Callback());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(c.WaitFinished(*first));
  auto second = engine->Submit(GoldenRequest(g), c.Callback());
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(c.WaitFinished(*second));
  const Collector::Stream a = c.Get(*first), b = c.Get(*second);
  EXPECT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.ids, g.greedy);
  EXPECT_EQ(b.ids, g.greedy);
  EXPECT_EQ(a.usage.cached_prompt_tokens, 0);
  EXPECT_GT(b.usage.cached_prompt_tokens, 0);
  EXPECT_LT(b.usage.cached_prompt_tokens, b.usage.prompt_tokens);
  // Vegas drafts with dense attention: an NSA target refuses it when the request arrives, not
  // in the middle of a step shared with other requests.
  GenerateRequest vegas = GoldenRequest(g);
  vegas.speculation.method = SpeculationMethod::kVegas;
  vegas.speculation.num_speculative_tokens = 4;
  auto refused = engine->Submit(vegas, c.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EngineOptions with_vegas;
  with_vegas.speculative.method = SpeculationMethod::kVegas;
  EXPECT_EQ(MakeNsaEngineStatus(with_vegas).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineNsaTest, ChunkedPrefillAndPreemptionOfConcurrentRequestsMatchGoldens) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  auto observer = std::make_shared<PreemptionCounter>();
  EngineOptions options;
  options.max_num_batched_tokens = 100;  // prompts of 601 ids: 7 chunks, blocks cut mid-chunk
  // 66 blocks of 16 tokens (fp32 K and V, 6 layers, one KV head of 32): exactly the two prompts'
  // 38 + 28, so both are admitted and the first new block either needs preempts the other.
  options.max_model_len = 640;
  options.kv_cache_bytes = 66 * int64_t{2 * 6 * 16 * 32 * 4};
  options.observer = observer;
  auto engine = MakeNsaEngine(options);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<RequestId> ids;
  for (size_t e : {0, 3}) {
    auto id = engine->Submit(GoldenRequest(goldens[e]), c.Callback());
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  EXPECT_TRUE(c.WaitFinished(ids[0]));
  EXPECT_TRUE(c.WaitFinished(ids[1]));
  EXPECT_EQ(c.Get(ids[0]).ids, goldens[0].greedy);
  EXPECT_EQ(c.Get(ids[1]).ids, goldens[3].greedy);
  EXPECT_GT(observer->preempted(), 0);
}

}  // namespace
}  // namespace specd
