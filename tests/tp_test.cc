// Tensor parallelism on CPU ranks (issue 17), the whole topology: the engine is rank 0 and
// launches real `specd worker` processes that meet it over the TCP rendezvous and the
// shared-memory communicator. Outputs are checked against references we did not write (HF
// transformers' greedy ids for codepair, Karpathy's stories260K text) and against TP 1; faults
// (a worker killed or stopped mid-stream) must end every request with an error, never hang.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/testing/engine_spec_test_util.h"
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

EngineOptions TpOptions(const std::string& dir, int32_t size) {
  EngineOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.num_threads = 1;  // CI has 2 cores for up to 4 ranks
  o.tensor_parallel.size = size;
  o.tensor_parallel.worker_binary = SPECD_BINARY;
  o.tensor_parallel.timeout = absl::Seconds(30);
  return o;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& options) {
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Greedy with EOS masked (the goldens' min_new_tokens).
constexpr auto* Greedy = &serving_test::GreedyEosMasked;

// The pids of this process's children whose command line is `... worker ...`.
std::vector<pid_t> WorkerPids() {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::istringstream stat(ReadAll(absl::StrCat("/proc/", pid, "/stat")));
    std::string skip;
    pid_t ppid = 0;
    // pid (comm) state ppid: comm has no spaces for our binaries.
    stat >> skip >> skip >> skip >> ppid;
    if (ppid != getpid()) continue;
    const std::string cmdline = ReadAll(absl::StrCat("/proc/", pid, "/cmdline"));
    if (cmdline.find(std::string("worker\0", 7)) != std::string::npos) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

TEST(TpTest, Stories260KAtTp4ReproducesKarpathysText) {
  // 8 query / 4 KV heads: 2 and 1 per rank.
  auto engine = MakeEngine(TpOptions(kModels + "/stories260K/hf", 4));
  ASSERT_NE(engine, nullptr);
  EXPECT_NE(engine->device_name().find("tensor-parallel 4"), std::string::npos)
      << engine->device_name();
  GenerateRequest r = Greedy({1}, 256);  // run.c: 256 steps from BOS
  r.params.min_tokens = 0;
  r.params.stop_token_ids = {1};
  auto result = engine->Generate(r);
  ASSERT_TRUE(result.ok()) << result.status();
  std::string expected = ReadAll(kModels + "/stories260K/golden/expected_greedy_llama2c_doc.txt");
  ASSERT_FALSE(expected.empty());
  if (expected.back() == '\n') expected.pop_back();
  EXPECT_EQ(result->text, expected);
}

TEST(TpTest, CodepairTargetAtTp2EqualsHfGreedyIdsAndTp1) {
  const std::string dir = kModels + "/codepair/target";
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"];
  ASSERT_GE(golden.size(), 8u);
  std::vector<GenerateRequest> requests;
  for (const auto& g : golden) {
    requests.push_back(Greedy(g["prompt_ids"].get<std::vector<int32_t>>(), 48));
  }
  auto tp2 = MakeEngine(TpOptions(dir, 2));
  ASSERT_NE(tp2, nullptr);
  auto batch = tp2->GenerateBatch(requests);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EngineOptions one = TpOptions(dir, 1);
  auto tp1 = MakeEngine(one);
  ASSERT_NE(tp1, nullptr);
  auto reference = tp1->GenerateBatch(requests);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (size_t i = 0; i < golden.size(); ++i) {
    EXPECT_EQ((*batch)[i].ids(), golden[i]["greedy_ids"].get<std::vector<int32_t>>())
        << "prompt " << i;
    EXPECT_EQ((*batch)[i].ids(), (*reference)[i].ids()) << "prompt " << i;
  }
}

TEST(TpTest, SeededSamplingAtTp2EqualsTp1) {
  const std::string dir = kModels + "/codepair/target";
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"];
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < 4; ++i) {
    GenerateRequest r = Greedy(golden[i]["prompt_ids"].get<std::vector<int32_t>>(), 32);
    r.params.temperature = 1.0f;
    r.params.top_p = 0.95f;
    r.params.seed = 1000 + i;
    requests.push_back(r);
  }
  auto tp2 = MakeEngine(TpOptions(dir, 2));
  auto tp1 = MakeEngine(TpOptions(dir, 1));
  ASSERT_NE(tp2, nullptr);
  ASSERT_NE(tp1, nullptr);
  auto a = tp2->GenerateBatch(requests);
  auto b = tp1->GenerateBatch(requests);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*a)[i].ids(), (*b)[i].ids()) << "request " << i;
  }
}

// Draft model, n-gram and EAGLE-3 speculation at TP 2 give HF's greedy ids.
TEST(TpTest, GreedySpeculationAtTp2EqualsPlainDecoding) {
  const std::string dir = kModels + "/codepair/target";
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"];
  EngineOptions o = TpOptions(dir, 2);
  o.speculative.draft_model = kModels + "/codepair/draft";
  o.speculative.method = SpeculationMethod::kDraftModel;
  o.speculative.num_speculative_tokens = 4;
  // EAGLE-3: the head reads rank 0's hidden states (whole after the all-reduce).
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  int64_t drafts = 0;
  for (SpeculationMethod method :
       {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram, SpeculationMethod::kEagle3}) {
    std::vector<GenerateRequest> requests;
    for (size_t i = 0; i < golden.size(); ++i) {
      GenerateRequest r = Greedy(golden[i]["prompt_ids"].get<std::vector<int32_t>>(), 48);
      r.speculation.method = method;
      requests.push_back(r);
    }
    auto batch = engine->GenerateBatch(requests);
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (size_t i = 0; i < golden.size(); ++i) {
      EXPECT_EQ((*batch)[i].ids(), golden[i]["greedy_ids"].get<std::vector<int32_t>>())
          << SpeculationMethodName(method) << " prompt " << i;
      drafts += (*batch)[i].usage.num_drafts;
    }
  }
  EXPECT_GT(drafts, 0);  // speculation ran
}

// All 48 held-out codepair prompts, greedy, TP 2 against TP 1 (the CPU backend is fp32: a
// divergence is allowed only where TP 1's top two logits are within 1e-4, a recorded near-tie).
TEST(TpTest, CodepairAll48PromptsAtTp2EqualTp1) {
  const std::string dir = kModels + "/codepair/target";
  auto tp1 = MakeEngine(TpOptions(dir, 1));
  auto tp2 = MakeEngine(TpOptions(dir, 2));
  ASSERT_NE(tp1, nullptr);
  ASSERT_NE(tp2, nullptr);
  const auto prompts = speculation_test::LoadPrompts(*tp1->tokenizer());
  ASSERT_EQ(prompts.size(), 48u);
  std::vector<GenerateRequest> requests;
  for (const auto& p : prompts) {
    GenerateRequest r = speculation_test::Greedy(p, 32);
    r.params.logprobs = 2;  // the top two, to recognise a near-tie where outputs part
    requests.push_back(r);
  }
  auto a = tp2->GenerateBatch(requests);
  auto b = tp1->GenerateBatch(requests);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  int equal = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto got = (*a)[i].ids(), want = (*b)[i].ids();
    if (got == want) {
      ++equal;
      continue;
    }
    size_t at = 0;
    while (at < std::min(got.size(), want.size()) && got[at] == want[at]) ++at;
    ASSERT_LT(at, want.size()) << "prompt " << i;
    const auto& top = (*b)[i].tokens[at].top;
    ASSERT_GE(top.size(), 2u);
    EXPECT_LT(std::abs(top[0].logprob - top[1].logprob), 1e-4)
        << "prompt " << i << " diverges at " << at << " without a near-tie";
  }
  EXPECT_GE(equal, 46) << "of 48 prompts";
}

// SSD at TP 2 (rank 0 talks to the speculator) with `drafter` (the speculative config's fields
// naming it): greedy output equals HF's, and the speculator's cache served rounds. The cache is
// built whole before each answer ("cache_build": "complete"): an interruptible build sized to
// the verifier's measured window can build nothing at all when two loaded cores run both TP
// ranks and the speculator (CI saw a run with no hit), and which rounds hit is not this test's
// subject (ssd_test covers both builds).
void ExpectSsdAtTp2EqualsPlainDecoding(const std::string& drafter) {
  const std::string dir = kModels + "/codepair/target";
  EngineOptions o = TpOptions(dir, 2);
  o.max_model_len = 1024;
  auto spec = ParseSpeculativeConfig(R"({"method": "ssd", )" + drafter +
                                     R"(, "num_speculative_tokens": 4, "speculator_binary": ")" +
                                     SPECD_BINARY +
                                     R"(", "fan_out": 3, "cache_build": "complete", )"
                                     R"("speculator_timeout_ms": 60000})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  auto engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->has_ssd());
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"];
  std::vector<GenerateRequest> requests;
  for (const auto& g : golden) {
    GenerateRequest r = Greedy(g["prompt_ids"].get<std::vector<int32_t>>(), 48);
    r.speculation.method = SpeculationMethod::kSsd;
    requests.push_back(r);
  }
  auto batch = engine->GenerateBatch(requests);
  ASSERT_TRUE(batch.ok()) << batch.status();
  int64_t drafts = 0, hits = 0;
  for (size_t i = 0; i < golden.size(); ++i) {
    EXPECT_EQ((*batch)[i].ids(), golden[i]["greedy_ids"].get<std::vector<int32_t>>())
        << "prompt " << i;
    drafts += (*batch)[i].usage.num_drafts;
    hits += (*batch)[i].usage.num_cache_hit_drafts;
  }
  EXPECT_GT(drafts, 0);
  EXPECT_GT(hits, 0) << "the speculator's cache served no round";
}

TEST(TpTest, SsdAtTp2EqualsPlainDecoding) {
  ExpectSsdAtTp2EqualsPlainDecoding(R"("model": ")" + kModels + R"(/codepair/draft")");
}

// The EAGLE-3 head in the speculator: rank 0 sends it the hidden states it captured (whole
// after the all-reduce) with each outcome.
TEST(TpTest, SsdWithTheHeadInTheSpeculatorAtTp2EqualsPlainDecoding) {
  ExpectSsdAtTp2EqualsPlainDecoding(R"("eagle3_model": ")" + std::string(SPECD_SOURCE_DIR) +
                                    R"(/models/codepair/eagle3")");
}

TEST(TpTest, ShapesThatDoNotShardAreRefusedNamingThem) {
  // codepair's target has 6 attention heads (config.json): 4 ranks cannot split them.
  EngineOptions o = TpOptions(kModels + "/codepair/target", 4);
  auto engine = Engine::Create(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("does not divide"), std::string::npos)
      << engine.status();
  EXPECT_TRUE(WorkerPids().empty());  // refused before any worker started
}

// A worker that dies (SIGKILL) or stops (SIGSTOP) while requests stream: every request ends
// with an error naming the group, within the timeout, and the engine reports the failure.
void RunFaultCase(int signal) {
  EngineOptions o = TpOptions(kModels + "/codepair/target", 2);
  o.tensor_parallel.timeout = absl::Seconds(3);
  auto engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->Start().ok());
  auto golden = nlohmann::json::parse(ReadAll(kModels + "/codepair/golden.json"))["target"];
  std::mutex mu;
  std::vector<absl::Status> finished;
  std::atomic<int> tokens{0};
  const int kRequests = 4;
  for (int i = 0; i < kRequests; ++i) {
    GenerateRequest r = Greedy(golden[i]["prompt_ids"].get<std::vector<int32_t>>(), 100000);
    r.params.max_tokens = 4000;
    r.params.min_tokens = 4000;
    auto id = engine->Submit(r, [&](RequestOutput&& out) {
      tokens += static_cast<int>(out.tokens.size());
      if (out.finished) {
        std::lock_guard lock(mu);
        finished.push_back(out.status);
      }
    });
    ASSERT_TRUE(id.ok()) << id.status();
  }
  const absl::Time start = absl::Now();
  while (tokens < 20 && absl::Now() - start < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GE(tokens, 20) << "no tokens streamed";
  std::vector<pid_t> workers = WorkerPids();
  ASSERT_EQ(workers.size(), 1u);
  const absl::Time signaled = absl::Now();
  kill(workers[0], signal);
  while (absl::Now() - signaled < absl::Seconds(20)) {
    {
      std::lock_guard lock(mu);
      if (finished.size() == kRequests) break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration took = absl::Now() - signaled;
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(finished.size(), static_cast<size_t>(kRequests)) << "requests still running";
    for (const absl::Status& s : finished) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      EXPECT_NE(s.message().find("tensor-parallel"), std::string::npos) << s;
    }
  }
  EXPECT_LT(took, absl::Seconds(signal == SIGSTOP ? 10 : 5));
  const EngineStats stats = engine->Stats();
  EXPECT_TRUE(stats.failed);
  EXPECT_NE(stats.failure.find("rank 1"), std::string::npos) << stats.failure;
  // New requests are refused with the same reason.
  auto again = engine->Submit(Greedy({1, 2, 3}, 4), [](RequestOutput&&) {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  if (signal == SIGSTOP) kill(workers[0], SIGKILL);
  engine->Stop();
}

TEST(TpTest, KilledWorkerEndsEveryRequestWithAnError) { RunFaultCase(SIGKILL); }

TEST(TpTest, StoppedWorkerEndsEveryRequestWithinTheTimeout) { RunFaultCase(SIGSTOP); }

}  // namespace
}  // namespace specd
