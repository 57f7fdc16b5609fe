// Engine::SetPaused (backpressure for front ends whose client stopped reading): a paused
// request runs no tokens while others progress, keeps its place and resumes with exactly the
// output it gets never paused (greedy), can be aborted or expire while paused, and never holds
// a running slot that a waiting request needs.
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/testing/engine_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using serving_test::Collector;
using serving_test::Encode;
using serving_test::Endless;
using serving_test::Greedy;
using serving_test::MakeSlowEngine;

constexpr int32_t kLen = 48;

// Polls the published stats until `done` holds for them; false on timeout.
template <typename Predicate>
bool WaitStats(const Engine& engine, Predicate done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done(engine.Stats())) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Polls until the engine has published `n` paused requests; the engine applies a pause
// between steps and publishes it with the next snapshot, so once seen, no step runs them.
bool WaitNumPaused(const Engine& engine, int32_t n) {
  return WaitStats(engine, [n](const EngineStats& s) { return s.num_paused == n; });
}

// Submits an endless request, lets it stream num_tokens, pauses it and waits until the
// engine shows it paused. 0 on failure.
RequestId StartPaused(Engine& engine, Collector& c, const std::string& text, size_t num_tokens) {
  absl::StatusOr<RequestId> id = engine.Submit(Endless(Encode(engine, text)), c.Callback());
  if (!id.ok() || !c.WaitTokens(*id, num_tokens)) {
    ADD_FAILURE() << "the request did not start: " << id.status();
    return 0;
  }
  engine.SetPaused(*id, true);
  if (!WaitNumPaused(engine, 1)) {
    ADD_FAILURE() << "the pause never showed";
    return 0;
  }
  return *id;
}

GenerateRequest FullLength(Engine& engine, const std::string& text) {
  GenerateRequest r = Greedy(Encode(engine, text), kLen);
  r.params.ignore_eos = true;
  return r;
}

// The request's greedy output when it is never paused.
std::vector<int32_t> Reference(Engine& engine, const GenerateRequest& r) {
  Collector c;
  auto id = engine.Submit(r, c.Callback());
  EXPECT_TRUE(id.ok());
  EXPECT_TRUE(id.ok() && c.WaitFinished(*id));
  return id.ok() ? c.Get(*id).ids : std::vector<int32_t>{};
}

TEST(EnginePauseTest, PausedRequestRunsNothingWhileOthersProgressThenResumesExactly) {
  auto engine = MakeSlowEngine(/*max_num_seqs=*/4, 2048);
  ASSERT_NE(engine, nullptr);
  const GenerateRequest r = FullLength(*engine, "def merge(a, b):\n");
  const std::vector<int32_t> expected = Reference(*engine, r);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kLen));
  Collector c;
  auto paused = engine->Submit(r, c.Callback());
  auto other = engine->Submit(Endless(Encode(*engine, "import json\n")), c.Callback());
  ASSERT_TRUE(paused.ok() && other.ok());
  ASSERT_TRUE(c.WaitTokens(*paused, 4));
  engine->SetPaused(*paused, true);
  ASSERT_TRUE(WaitNumPaused(*engine, 1));
  const size_t num_before = c.Get(*paused).ids.size();
  ASSERT_LT(num_before, expected.size()) << "finished before the pause";
  const size_t other_before = c.Get(*other).ids.size();
  ASSERT_TRUE(c.WaitTokens(*other, other_before + 30));
  EXPECT_EQ(c.Get(*paused).ids.size(), num_before) << "a paused request produced tokens";
  EngineStats stats = engine->Stats();
  EXPECT_EQ(stats.num_running, 2);   // still running: it kept its KV and place
  engine->SetPaused(*paused, true);  // idempotent
  engine->SetPaused(*paused, false);
  ASSERT_TRUE(c.WaitFinished(*paused));
  Collector::Stream s = c.Get(*paused);
  EXPECT_TRUE(s.status.ok()) << s.status;
  EXPECT_EQ(s.ids, expected);
  EXPECT_EQ(s.num_finished, 1);
  engine->Abort(*other);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->Stats().num_paused, 0);
  engine->SetPaused(*paused, true);  // finished: no-op
  engine->SetPaused(987654, true);   // unknown: no-op
  EXPECT_TRUE(engine->WaitIdle(absl::Seconds(1)));
}

TEST(EnginePauseTest, AbortWhilePausedFreesKv) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  const RequestId id = StartPaused(*engine, c, "while True:\n", 3);
  ASSERT_NE(id, 0u);
  EXPECT_GT(engine->Stats().kv_blocks_used, 0);
  EXPECT_FALSE(engine->WaitIdle(absl::Milliseconds(100))) << "a paused request is not idle";
  engine->Abort(id);
  ASSERT_TRUE(c.WaitFinished(id));
  EXPECT_EQ(c.Get(id).status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->Stats().num_paused, 0);
}

// With every live request paused the engine thread sleeps, yet still ends them on deadline.
TEST(EnginePauseTest, DeadlineStillEndsAPausedRequest) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  GenerateRequest r = Endless(Encode(*engine, "try:\n"));
  r.deadline = absl::Now() + absl::Milliseconds(500);
  auto id = engine->Submit(r, c.Callback());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(c.WaitTokens(*id, 2));
  engine->SetPaused(*id, true);
  ASSERT_TRUE(c.WaitFinished(*id, absl::Seconds(10)));
  EXPECT_EQ(c.Get(*id).status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

// One running slot, held by a paused request: a new request still runs (the paused one is
// preempted, losing its KV), and the paused one resumes afterwards with its exact output.
TEST(EnginePauseTest, PausedRequestGivesUpItsSlotAndResumesExactly) {
  auto engine = MakeSlowEngine(/*max_num_seqs=*/1, 2048);
  ASSERT_NE(engine, nullptr);
  const GenerateRequest r = FullLength(*engine, "class Stack:\n");
  const std::vector<int32_t> expected = Reference(*engine, r);
  Collector c;
  auto paused = engine->Submit(r, c.Callback());
  ASSERT_TRUE(paused.ok());
  ASSERT_TRUE(c.WaitTokens(*paused, 4));
  engine->SetPaused(*paused, true);
  ASSERT_TRUE(WaitNumPaused(*engine, 1));
  const size_t num_before = c.Get(*paused).ids.size();
  auto next = engine->Submit(Greedy(Encode(*engine, "x = [1, 2"), 8), c.Callback());
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(c.WaitFinished(*next, absl::Seconds(30))) << "the paused request held the batch";
  EXPECT_TRUE(c.Get(*next).status.ok());
  EXPECT_EQ(c.Get(*paused).ids.size(), num_before);
  // Preempted: back in the queue with its KV freed, still paused.
  EXPECT_TRUE(WaitStats(*engine, [](const EngineStats& s) {
    return s.num_running == 0 && s.num_waiting == 1 && s.num_paused == 1 && s.kv_blocks_used == 0;
  }));
  engine->SetPaused(*paused, false);
  ASSERT_TRUE(c.WaitFinished(*paused));
  EXPECT_TRUE(c.Get(*paused).status.ok());
  EXPECT_EQ(c.Get(*paused).ids, expected);
}

// A drain waits for a paused request until its timeout; Stop then ends it.
TEST(EnginePauseTest, DrainWaitsForAPausedRequestUntilStop) {
  auto engine = MakeSlowEngine(4, 2048);
  ASSERT_NE(engine, nullptr);
  Collector c;
  const RequestId id = StartPaused(*engine, c, "for x in xs:\n", 2);
  ASSERT_NE(id, 0u);
  engine->BeginDrain();
  EXPECT_FALSE(engine->WaitIdle(absl::Milliseconds(200)));
  engine->Stop();
  ASSERT_TRUE(c.WaitFinished(id, absl::Seconds(1)));
  EXPECT_EQ(c.Get(id).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace specd
