// SSD end to end on the CPU (issue 6): the verifier engine (codepair target) launches the real
// `specd speculator` process (codepair draft) and talks to it over the TCP transport.
//   - greedy output with SSD equals greedy output without speculation, token for token, on all
//     48 codepair prompts at K = 4 and K = 7, and the speculation cache hits;
//   - with temperature 1 and Saguaro down-weighting C = 0.5 the second token follows the
//     target's distribution (the chi-square test of engine_spec_test);
//   - faults: the speculator killed (SIGKILL) or stopped (SIGSTOP) mid-stream: every request
//     completes with plain decoding's output, the link failure is counted, and a relaunched
//     speculator rejoins and serves cache hits again.
// The specd binary path comes from CMake (SPECD_BINARY).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_spec_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace spec_test;  // NOLINT: the shared fixtures of engine_spec_test_util.h

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

std::string SsdConfig(int32_t k, const std::string& extra = "") {
  return R"({"method": "ssd", "model": ")" + kDraft + R"(", "num_speculative_tokens": )" +
         std::to_string(k) + R"(, "speculator_binary": ")" + SPECD_BINARY + R"(", "fan_out": 3)" +
         extra + "}";
}

std::vector<GenerateRequest> AllPrompts(const Engine& engine, SpeculationParams spec) {
  std::vector<GenerateRequest> requests;
  for (const auto& p : LoadPrompts(*engine.tokenizer())) requests.push_back(Greedy(p, kLen, spec));
  return requests;
}

std::vector<std::vector<int32_t>> Ids(const std::vector<GenerateResult>& results) {
  std::vector<std::vector<int32_t>> out;
  for (const GenerateResult& r : results) out.push_back(r.ids());
  return out;
}

class SsdLosslessTest : public ::testing::TestWithParam<int32_t> {};

// With "cache_build": "complete" (the whole budget is built every round, so hits do not depend
// on how fast this machine is); the default, interruptible build, is what the fault and
// sampling tests below and spec_http_test run.
TEST_P(SsdLosslessTest, GreedyOutputEqualsPlainOnAll48Prompts) {
  const int32_t k = GetParam();
  auto observer = std::make_shared<SsdObserver>();
  // The verifier waits for the whole cache every round: give a loaded machine time for it.
  auto engine = MakeEngine(
      kTarget, SsdConfig(k, R"(, "cache_build": "complete", "speculator_timeout_ms": 60000)"),
      observer);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->has_ssd());
  auto plain = engine->GenerateBatch(AllPrompts(*engine, {SpeculationMethod::kNone, 0}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->size(), 48u);
  auto ssd = engine->GenerateBatch(AllPrompts(*engine, {SpeculationMethod::kSsd, k}));
  ASSERT_TRUE(ssd.ok()) << ssd.status();
  const auto want = Ids(*plain), got = Ids(*ssd);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  const SsdStats s = observer->Last();
  int64_t drafts = 0, accepted = 0, hit_drafts = 0;
  for (const GenerateResult& r : *ssd) {
    drafts += r.usage.num_drafts;
    accepted += r.usage.num_accepted_tokens;
    hit_drafts += r.usage.num_cache_hit_drafts;
    EXPECT_LE(r.usage.num_cache_hit_accepted_tokens, r.usage.num_cache_hit_draft_tokens);
  }
  EXPECT_EQ(hit_drafts, s.drafts_hit) << "per-request cache hits must add up to the speculator's";
  const int64_t told = s.drafts_hit + s.drafts_miss_primary + s.drafts_miss_backup;
  std::printf(
      "[ SSD K=%d, 48 prompts ] %.3f tokens per round; cache hits %lld of %lld drafts (%.1f%%), "
      "primary misses %lld, backup misses %lld, local rounds %lld, wait %.2fs\n",
      k, drafts ? 1.0 + double(accepted) / drafts : 0.0, (long long)s.drafts_hit, (long long)told,
      told ? 100.0 * s.drafts_hit / told : 0.0, (long long)s.drafts_miss_primary,
      (long long)s.drafts_miss_backup, (long long)s.local_rounds, s.wait_seconds);
  for (size_t j = 0; j < s.outcomes_by_accepted_len.size(); ++j) {
    std::printf("    k=%zu: %lld outcomes, %lld hits\n", j,
                (long long)s.outcomes_by_accepted_len[j], (long long)s.hits_by_accepted_len[j]);
  }
  EXPECT_EQ(s.link_failures, 0);
  EXPECT_EQ(s.local_rounds, 0);
  ASSERT_GT(s.rounds, 0);
  EXPECT_GT(s.bytes_sent, 0);
  EXPECT_GT(s.bytes_received, 0);
  std::printf("    link: %.0f bytes sent and %.0f received per round\n",
              double(s.bytes_sent) / s.rounds, double(s.bytes_received) / s.rounds);
  EXPECT_GT(s.drafts_hit, told / 4) << "the speculation cache should serve rounds";
  EXPECT_GT(drafts, 0);
}

INSTANTIATE_TEST_SUITE_P(K, SsdLosslessTest, ::testing::Values(4, 7));

// A speculator that cannot start (no such draft model) fails the server's start with the reason,
// at once, instead of leaving it to wait for a speculator that never joins.
TEST(SsdStartupTest, ASpeculatorThatExitsIsAStartupError) {
  EngineOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = 1024;
  auto spec = ParseSpeculativeConfig(R"({"method": "ssd", "model": "/no/such/draft", )"
                                     R"("speculator_binary": ")" SPECD_BINARY R"("})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  const absl::Time start = absl::Now();
  auto engine = Engine::Create(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
  EXPECT_NE(engine.status().message().find("exited with status 1"), std::string::npos)
      << engine.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(SsdSamplingTest, SecondTokenFollowsTheTargetWithSaguaroDownweighting) {
  auto observer = std::make_shared<SsdObserver>();
  auto engine = MakeEngine(kTarget, SsdConfig(2, R"(, "saguaro_c": 0.5)"), observer);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt =
      *engine->tokenizer()->Encode("class Foo:\n    def __init__(self", true);
  const auto [stat, critical] =
      SecondTokenChiSquare(*engine, prompt, 3000, {SpeculationMethod::kSsd, 2, 0.5f});
  EXPECT_LT(stat, critical);
  const SsdStats s = observer->Last();
  std::printf("[ SSD sampled, C = 0.5 ] drafts: %lld hits, %lld primary, %lld backup, %lld none\n",
              (long long)s.drafts_hit, (long long)s.drafts_miss_primary,
              (long long)s.drafts_miss_backup, (long long)s.drafts_none);
  EXPECT_GT(s.drafts_hit + s.drafts_miss_primary, 1000) << "few sampled drafts were verified";
}

// Streams the 48 prompts through the serving engine while `fault` is done to the speculator
// once the first tokens arrived; every request must finish with plain decoding's output.
void RunWithFault(int signal) {
  auto observer = std::make_shared<SsdObserver>();
  auto engine = MakeEngine(kTarget, SsdConfig(4, R"(, "speculator_timeout_ms": 500)"), observer);
  ASSERT_NE(engine, nullptr);
  auto plain = engine->GenerateBatch(AllPrompts(*engine, {SpeculationMethod::kNone, 0}));
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(engine->Start().ok());
  std::vector<GenerateRequest> requests = AllPrompts(*engine, {SpeculationMethod::kSsd, 4});
  for (GenerateRequest& r : requests) r.params.max_tokens = 96;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> got(requests.size());
  std::vector<bool> done(requests.size(), false);
  std::atomic<int> tokens{0};
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine->Submit(requests[i], [&, i](RequestOutput&& out) {
      std::lock_guard lock(mu);
      for (const GeneratedToken& t : out.tokens) got[i].push_back(t.id);
      tokens += static_cast<int>(out.tokens.size());
      if (out.finished) {
        EXPECT_TRUE(out.status.ok()) << out.status;
        done[i] = true;
        cv.notify_all();
      }
    });
    ASSERT_TRUE(id.ok()) << id.status();
  }
  while (tokens < 200) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const pid_t pid = engine->ssd_speculator_pid();
  ASSERT_GT(pid, 0);
  kill(pid, signal);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] {
      return std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t>& want = (*plain)[i].ids();
    // The stream ran 96 tokens; plain ran kLen: compare the common part.
    ASSERT_GE(got[i].size(), std::min<size_t>(want.size(), kLen)) << "prompt " << i;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got[i].begin())) << "prompt " << i;
  }
  SsdStats s = observer->Last();
  EXPECT_GE(s.link_failures, 1);
  EXPECT_GT(s.local_rounds, 0);
  std::printf("[ SSD fault %s ] link failures %lld, local rounds %lld, launches %lld\n",
              signal == SIGKILL ? "SIGKILL" : "SIGSTOP", (long long)s.link_failures,
              (long long)s.local_rounds, (long long)s.launches);
  // A relaunched speculator rejoins and serves cache hits again.
  auto run_one = [&](const GenerateRequest& r) {
    std::mutex m2;
    std::condition_variable cv2;
    bool fin = false;
    ASSERT_TRUE(engine
                    ->Submit(r,
                             [&](RequestOutput&& out) {
                               std::lock_guard lock(m2);
                               if (out.finished) fin = true;
                               cv2.notify_all();
                             })
                    .ok());
    std::unique_lock lock(m2);
    cv2.wait(lock, [&] { return fin; });
  };
  const std::vector<std::vector<int32_t>> prompts = LoadPrompts(*engine->tokenizer());
  for (int attempt = 0; attempt < 100 && !observer->Last().connected; ++attempt) {
    run_one(Greedy(prompts[attempt % 48], 8, {SpeculationMethod::kSsd, 4}));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int64_t hits_before = observer->Last().drafts_hit;
  for (int i = 0; i < 8; ++i) run_one(Greedy(prompts[i], 32, {SpeculationMethod::kSsd, 4}));
  s = observer->Last();
  EXPECT_TRUE(s.connected) << "the relaunched speculator did not rejoin";
  EXPECT_GE(s.connects, 2);
  EXPECT_GE(s.launches, 2);
  EXPECT_GT(s.drafts_hit, hits_before) << "no cache hits after the speculator rejoined";
  std::printf("[ SSD fault %s ] rejoined: connects %lld, launches %lld, hits %lld -> %lld\n",
              signal == SIGKILL ? "SIGKILL" : "SIGSTOP", (long long)s.connects,
              (long long)s.launches, (long long)hits_before, (long long)s.drafts_hit);
  engine->Stop();
}

TEST(SsdFaultTest, SpeculatorKilledMidStream) { RunWithFault(SIGKILL); }
TEST(SsdFaultTest, SpeculatorStoppedMidStream) { RunWithFault(SIGSTOP); }

}  // namespace
}  // namespace specd
