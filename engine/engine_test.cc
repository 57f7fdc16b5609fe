// Serving API tests on the CPU backend with the codepair target model: Start / Submit /
// Abort / drain / Stop, and continuous batching giving each request exactly the output it
// gets alone (greedy), under preemption, chunked prefill and prefix caching.
#include "engine/engine.h"

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "engine/testing/engine_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using serving_test::Collector;
using serving_test::Encode;
using serving_test::Endless;
using serving_test::Greedy;
using serving_test::MakeEngine;
using serving_test::MakeSlowEngine;

// Counts what the engine reports; any thread.
class TestObserver : public EngineObserver {
 public:
  void OnRequestFinished(const FinishedRequestMetrics& m) override {
    std::lock_guard lock(mu_);
    finished_.push_back(m);
  }
  void OnInterTokenLatency(double seconds) override {
    std::lock_guard lock(mu_);
    ++num_itl_;
    EXPECT_GE(seconds, 0);
  }
  void OnStep(const EngineStats& stats) override {
    std::lock_guard lock(mu_);
    ++num_steps_;
    EXPECT_LE(stats.kv_blocks_used, stats.kv_blocks_total);
  }
  void OnPrefixCache(int64_t queried, int64_t hit) override {
    std::lock_guard lock(mu_);
    queried_ += queried;
    hit_ += hit;
  }
  void OnPreemption(int32_t n) override {
    std::lock_guard lock(mu_);
    preempted_ += n;
  }

  std::vector<FinishedRequestMetrics> finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }
  int64_t num_itl() {
    std::lock_guard lock(mu_);
    return num_itl_;
  }
  int64_t num_steps() {
    std::lock_guard lock(mu_);
    return num_steps_;
  }
  int64_t hit_blocks() {
    std::lock_guard lock(mu_);
    return hit_;
  }
  int64_t queried_blocks() {
    std::lock_guard lock(mu_);
    return queried_;
  }
  int64_t preempted() {
    std::lock_guard lock(mu_);
    return preempted_;
  }

 private:
  std::mutex mu_;
  std::vector<FinishedRequestMetrics> finished_ ABSL_GUARDED_BY(mu_);
  int64_t num_itl_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queried_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hit_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t preempted_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(EngineServingTest, SubmitStreamsTokensAndFinishesOnce) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy(Encode(*engine, "def add(a, b):\n"), 12);
  auto offline = engine->Generate(r);
  ASSERT_TRUE(offline.ok());
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  absl::StatusOr<RequestId> id = engine->Submit(r, c.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(c.WaitFinished(*id));
  Collector::Stream s = c.Get(*id);
  EXPECT_TRUE(s.status.ok()) << s.status;
  EXPECT_EQ(s.num_finished, 1);
  EXPECT_EQ(s.ids, offline->ids());
  EXPECT_EQ(s.text, offline->text);
  EXPECT_EQ(s.usage.prompt_tokens, static_cast<int32_t>(r.prompt_ids.size()));
  EXPECT_EQ(s.usage.completion_tokens, static_cast<int32_t>(s.ids.size()));
  EXPECT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EngineStats stats = engine->Stats();
  EXPECT_TRUE(stats.running);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_GT(stats.kv_blocks_total, 0);
  engine->Stop();
  EXPECT_FALSE(engine->Stats().running);
  EXPECT_EQ(engine->Submit(r, c.Callback()).status().code(), absl::StatusCode::kUnavailable);
}

// The 48 codepair prompts, tokenized with BOS.
std::vector<std::vector<int32_t>> LoadPrompts(const Engine& engine) {
  std::ifstream in(std::string(SPECD_SHARED_DIR) + "/models/codepair/prompts.jsonl");
  std::vector<std::vector<int32_t>> prompts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    prompts.push_back(Encode(engine, nlohmann::json::parse(line)["prompt"].get<std::string>()));
  }
  return prompts;
}

constexpr int32_t kNewTokens = 12;
// Bytes of one KV block of the codepair target (6 layers, 2 KV heads, head_dim 64, f32,
// K and V, 16 tokens).
constexpr int64_t kBlockBytes = 2 * 6 * 16 * 2 * 64 * 4;

// Greedy output of every prompt generated alone (no batch, no prefix cache): the
// reference every batched run must reproduce token for token.
class ContinuousBatchingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions options;
    options.enable_prefix_caching = false;
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    prompts_ = new std::vector<std::vector<int32_t>>(LoadPrompts(*engine));
    ASSERT_EQ(prompts_->size(), 48u);
    alone_ = new std::vector<std::vector<int32_t>>();
    for (const auto& p : *prompts_) {
      GenerateRequest r = Greedy(p, kNewTokens);
      r.params.min_tokens = kNewTokens;  // EOS masked: every request runs its full length
      auto result = engine->Generate(r);
      ASSERT_TRUE(result.ok()) << result.status();
      alone_->push_back(result->ids());
    }
  }
  static void TearDownTestSuite() {
    delete prompts_;
    delete alone_;
  }

  // Submits every prompt at once and checks each output against its alone run.
  void RunAllAndCompare(EngineOptions options, TestObserver* observer) {
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->Start().ok());
    Collector c;
    std::vector<RequestId> ids;
    for (const auto& p : *prompts_) {
      GenerateRequest r = Greedy(p, kNewTokens);
      r.params.min_tokens = kNewTokens;
      absl::StatusOr<RequestId> id = engine->Submit(r, c.Callback());
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    ASSERT_TRUE(engine->WaitIdle(absl::Seconds(120)));
    for (size_t i = 0; i < ids.size(); ++i) {
      Collector::Stream s = c.Get(ids[i]);
      EXPECT_EQ(s.num_finished, 1) << "prompt " << i;
      EXPECT_TRUE(s.status.ok()) << s.status;
      EXPECT_EQ(s.ids, (*alone_)[i]) << "prompt " << i << " in a batch vs alone";
    }
    EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
    EXPECT_EQ(observer->finished().size(), prompts_->size());
    engine->Stop();
  }

  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<std::vector<int32_t>>* alone_;
};

std::vector<std::vector<int32_t>>* ContinuousBatchingTest::prompts_ = nullptr;
std::vector<std::vector<int32_t>>* ContinuousBatchingTest::alone_ = nullptr;

TEST_F(ContinuousBatchingTest, GreedyEqualsAloneWhenKvPoolForcesPreemption) {
  auto observer = std::make_shared<TestObserver>();
  EngineOptions options;
  options.max_model_len = 256;
  options.kv_cache_bytes = 40 * kBlockBytes;  // 640 token slots for 48 prompts
  options.observer = observer;
  RunAllAndCompare(options, observer.get());
  EXPECT_GT(observer->preempted(), 0);
  EXPECT_GT(observer->hit_blocks(), 0);  // preempted sequences get their prefix back
}

TEST_F(ContinuousBatchingTest, GreedyEqualsAloneWithChunkedPrefill) {
  auto observer = std::make_shared<TestObserver>();
  EngineOptions options;
  options.max_num_batched_tokens = 32;  // shorter than every prompt
  options.max_num_seqs = 16;
  options.observer = observer;
  RunAllAndCompare(options, observer.get());
}

TEST_F(ContinuousBatchingTest, RepeatedPromptHitsPrefixCacheWithIdenticalOutput) {
  auto observer = std::make_shared<TestObserver>();
  EngineOptions options;
  options.observer = observer;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  GenerateRequest r = Greedy((*prompts_)[3], kNewTokens);
  r.params.min_tokens = kNewTokens;
  auto first = engine->Submit(r, c.Callback());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c.WaitFinished(*first));
  auto second = engine->Submit(r, c.Callback());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(c.WaitFinished(*second));
  Collector::Stream a = c.Get(*first), b = c.Get(*second);
  EXPECT_EQ(a.usage.cached_prompt_tokens, 0);
  EXPECT_GT(b.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(b.usage.cached_prompt_tokens % 16, 0);
  EXPECT_LT(b.usage.cached_prompt_tokens, b.usage.prompt_tokens);
  EXPECT_EQ(a.ids, (*alone_)[3]);
  EXPECT_EQ(b.ids, (*alone_)[3]);
  EXPECT_EQ(observer->hit_blocks(), b.usage.cached_prompt_tokens / 16);
  EXPECT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

TEST(EngineServingTest, AbortInQueueFreesEverything) {
  auto engine = MakeSlowEngine(/*max_num_seqs=*/1, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  auto running = engine->Submit(Endless(Encode(*engine, "import os\n")), c.Callback());
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(c.WaitTokens(*running, 2));
  auto queued = engine->Submit(Endless(Encode(*engine, "import sys\n")), c.Callback());
  ASSERT_TRUE(queued.ok());
  engine->Abort(*queued);
  ASSERT_TRUE(c.WaitFinished(*queued));
  Collector::Stream q = c.Get(*queued);
  EXPECT_EQ(q.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(q.finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(q.ids.empty());
  engine->Abort(*running);
  ASSERT_TRUE(c.WaitFinished(*running));
  EXPECT_EQ(c.Get(*running).status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
  engine->Abort(*running);  // finished: no-op
  engine->Abort(12345);     // unknown: no-op
}

TEST(EngineServingTest, AbortDuringChunkedPrefillFreesKv) {
  auto engine = MakeSlowEngine(4, /*budget=*/4);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<int32_t> prompt = Encode(*engine, "class A:\n");
  prompt.resize(1200, 42);  // 300 steps of prefill
  auto id = engine->Submit(Greedy(prompt, 4), c.Callback());
  ASSERT_TRUE(id.ok());
  while (engine->Stats().kv_blocks_used == 0) absl::SleepFor(absl::Microseconds(100));
  engine->Abort(*id);
  ASSERT_TRUE(c.WaitFinished(*id));
  Collector::Stream s = c.Get(*id);
  EXPECT_EQ(s.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(s.ids.empty()) << "the prefill finished before the abort";
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

TEST(EngineServingTest, AbortDuringDecodeFreesKv) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  auto id = engine->Submit(Endless(Encode(*engine, "def f(x):\n")), c.Callback());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(c.WaitTokens(*id, 3));
  EXPECT_GT(engine->Stats().kv_blocks_used, 0);
  engine->Abort(*id);
  ASSERT_TRUE(c.WaitFinished(*id));
  Collector::Stream s = c.Get(*id);
  EXPECT_EQ(s.status.code(), absl::StatusCode::kCancelled);
  EXPECT_GE(s.ids.size(), 3u);
  EXPECT_LT(s.ids.size(), 1500u);
  EXPECT_EQ(s.num_finished, 1);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

TEST(EngineServingTest, DeadlineEndsRequestWithDeadlineExceeded) {
  auto observer = std::make_shared<TestObserver>();
  auto engine = MakeSlowEngine(4, 2048, observer);
  ASSERT_NE(engine, nullptr);
  Collector c;
  GenerateRequest r = Endless(Encode(*engine, "def g(y):\n"));
  r.deadline = absl::Now() + absl::Milliseconds(50);
  auto running = engine->Submit(r, c.Callback());
  r.deadline = absl::Now() - absl::Seconds(1);  // already past: ends in the queue
  auto expired = engine->Submit(r, c.Callback());
  ASSERT_TRUE(running.ok() && expired.ok());
  ASSERT_TRUE(c.WaitFinished(*running));
  ASSERT_TRUE(c.WaitFinished(*expired));
  EXPECT_EQ(c.Get(*running).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.Get(*running).finish_reason, FinishReason::kAbort);
  EXPECT_EQ(c.Get(*expired).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(c.Get(*expired).ids.empty());
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
  std::vector<FinishedRequestMetrics> finished = observer->finished();
  ASSERT_EQ(finished.size(), 2u);
  for (const auto& m : finished) EXPECT_EQ(m.outcome, RequestOutcome::kDeadline);
}

TEST(EngineServingTest, FullWaitingQueueIsResourceExhausted) {
  auto engine = MakeSlowEngine(/*max_num_seqs=*/1, 2048, nullptr, /*max_waiting=*/2);
  ASSERT_NE(engine, nullptr);
  Collector c;
  auto running = engine->Submit(Endless(Encode(*engine, "x = 1\n")), c.Callback());
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(c.WaitTokens(*running, 1));
  EXPECT_TRUE(engine->Submit(Endless(Encode(*engine, "y = 2\n")), c.Callback()).ok());
  EXPECT_TRUE(engine->Submit(Endless(Encode(*engine, "z = 3\n")), c.Callback()).ok());
  EXPECT_EQ(engine->Stats().num_waiting, 2);
  auto over = engine->Submit(Endless(Encode(*engine, "w = 4\n")), c.Callback());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  engine->Stop();
  EXPECT_EQ(c.Get(*running).status.code(), absl::StatusCode::kUnavailable);
}

TEST(EngineServingTest, BadRequestIsInvalidArgument) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  EXPECT_EQ(engine->Submit(Greedy({}, 4), c.Callback()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(Greedy({1, 999999}, 4), c.Callback()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EngineServingTest, DrainRefusesNewRequestsAndFinishesRunningOnes) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<RequestId> ids;
  for (const char* text : {"def a():\n", "def b():\n", "def c():\n"}) {
    GenerateRequest r = Greedy(Encode(*engine, text), 20);
    r.params.ignore_eos = true;
    auto id = engine->Submit(r, c.Callback());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  engine->BeginDrain();
  EXPECT_TRUE(engine->Stats().draining);
  EXPECT_EQ(engine->Submit(Greedy(Encode(*engine, "x"), 2), c.Callback()).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(30)));
  for (RequestId id : ids) {
    Collector::Stream s = c.Get(id);
    EXPECT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(s.ids.size(), 20u);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
  }
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
  engine->Stop();
}

TEST(EngineServingTest, StopEndsEveryRequestWithUnavailable) {
  auto engine = MakeSlowEngine(/*max_num_seqs=*/2, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<RequestId> ids;
  for (const char* text : {"a = 1\n", "b = 2\n", "c = 3\n"}) {
    auto id = engine->Submit(Endless(Encode(*engine, text)), c.Callback());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(c.WaitTokens(ids[0], 2));
  engine->Stop();
  for (RequestId id : ids) {
    Collector::Stream s = c.Get(id);
    EXPECT_EQ(s.num_finished, 1);
    EXPECT_EQ(s.status.code(), absl::StatusCode::kUnavailable);
  }
  EngineStats stats = engine->Stats();
  EXPECT_FALSE(stats.running);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  engine->Stop();  // twice: no-op
}

TEST(EngineServingTest, SeededSamplingIsTheSameAloneAndInABatch) {
  auto engine = MakeSlowEngine(8, 2048);
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy(Encode(*engine, "def parse("), 24);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.seed = 1234;
  GenerateRequest other = r;
  other.params.seed = 99;
  Collector c;
  auto alone = engine->Submit(r, c.Callback());
  ASSERT_TRUE(alone.ok());
  ASSERT_TRUE(c.WaitFinished(*alone));
  auto o1 = engine->Submit(other, c.Callback());
  auto batched = engine->Submit(r, c.Callback());
  auto o2 = engine->Submit(other, c.Callback());
  ASSERT_TRUE(o1.ok() && batched.ok() && o2.ok());
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(c.Get(*alone).ids, c.Get(*batched).ids);
  EXPECT_EQ(c.Get(*o1).ids, c.Get(*o2).ids);
  EXPECT_NE(c.Get(*alone).ids, c.Get(*o1).ids);
}

TEST(EngineServingTest, ObserverSeesLatenciesAndOutcomes) {
  auto observer = std::make_shared<TestObserver>();
  auto engine = MakeSlowEngine(8, 2048, observer);
  ASSERT_NE(engine, nullptr);
  Collector c;
  GenerateRequest r = Greedy(Encode(*engine, "for i in range("), 10);
  r.params.ignore_eos = true;
  auto id = engine->Submit(r, c.Callback());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  std::vector<FinishedRequestMetrics> finished = observer->finished();
  ASSERT_EQ(finished.size(), 1u);
  const FinishedRequestMetrics& m = finished[0];
  EXPECT_EQ(m.outcome, RequestOutcome::kLength);
  EXPECT_EQ(m.generated_tokens, 10);
  EXPECT_EQ(m.prompt_tokens, static_cast<int32_t>(r.prompt_ids.size()));
  EXPECT_GE(m.queue_seconds, 0);
  EXPECT_GE(m.ttft_seconds, m.queue_seconds);
  EXPECT_GE(m.e2e_seconds, m.ttft_seconds);
  EXPECT_EQ(observer->num_itl(), 9);
  EXPECT_GE(observer->num_steps(), 10);
  EXPECT_STREQ(RequestOutcomeName(RequestOutcome::kDeadline), "deadline");
  EXPECT_STREQ(FinishReasonName(FinishReason::kAbort), "abort");
}

// Many front-end threads submit (and some abort) at once: every request finishes exactly
// once, greedy outputs equal the same request run alone, and the KV pool ends empty.
TEST(EngineServingTest, ManyThreadsSubmitAndAbortConcurrently) {
  auto engine = MakeSlowEngine(16, 256);
  ASSERT_NE(engine, nullptr);
  const std::vector<std::string> texts = {"import re\n", "def main():\n", "class B(A):\n", "# TODO",
                                          "return x +"};
  Collector c;
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& t : texts) {
    auto id = engine->Submit(Greedy(Encode(*engine, t), 6), c.Callback());
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(c.WaitFinished(*id));
    expected.push_back(c.Get(*id).ids);
  }
  constexpr int kThreads = 8;
  constexpr int kPerThread = 12;
  std::vector<std::vector<std::pair<RequestId, int>>> submitted(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int which = (t + i) % static_cast<int>(texts.size());
        auto id = engine->Submit(Greedy(Encode(*engine, texts[which]), 6), c.Callback());
        ASSERT_TRUE(id.ok()) << id.status();
        submitted[t].push_back({*id, which});
        if (i % 4 == 3) engine->Abort(*id);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(60)));
  int num_aborted = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const auto [id, which] = submitted[t][i];
      Collector::Stream s = c.Get(id);
      ASSERT_EQ(s.num_finished, 1);
      if (s.status.code() == absl::StatusCode::kCancelled) {
        ++num_aborted;
        EXPECT_EQ(i % 4, 3);
        EXPECT_LE(s.ids.size(), expected[which].size());
      } else {
        EXPECT_TRUE(s.status.ok()) << s.status;
        EXPECT_EQ(s.ids, expected[which]);
      }
    }
  }
  EXPECT_GT(num_aborted, 0);
  EngineStats stats = engine->Stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

}  // namespace
}  // namespace specd
