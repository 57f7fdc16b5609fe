// The engine serves an NSA model (nsa-codepair) on the CPU runner: greedy generation with
// ignore_eos reproduces the golden ids (an exact reference we did not write; EOS is not special
// in them), a repeated prompt is served from the prefix cache with the same ids, and chunked
// prefill of two concurrent requests in a KV pool too small for both (so one is preempted and
// recomputed) gives each its golden ids. Speculation on the NSA target (the codepair draft
// shares its tokenizer) verifies with SSV strategies: mode exact reproduces the golden ids, the
// loads are reported, and a lossy strategy's KV stays out of the prefix cache.
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/engine.h"
#include "engine/policy/cost_profile.h"
#include "engine/testing/engine_nsa_test_util.h"
#include "engine/testing/engine_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace nsa_test;  // NOLINT: the shared fixtures of engine_nsa_test_util.h

using serving_test::Collector;
using serving_test::Greedy;
using serving_test::PreemptionCounter;

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
  // 66 blocks of 16 tokens (fp32 K and V, 6 layers, one KV head of 32, and each block's one
  // compressed entry: the mean K and V of the NSA block ending in it): exactly the two prompts'
  // 38 + 28, so both are admitted and the first new block either needs preempts the other.
  options.max_model_len = 640;
  options.kv_cache_bytes = 66 * int64_t{6 * (2 * 16 * 32 + 2 * 32) * 4};
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

// Keeps the SSV part of every speculation step's metrics; any thread.
class SsvCollector : public EngineObserver {
 public:
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    std::lock_guard lock(mu_);
    stats_ += m.ssv;
    strategies_.insert(strategies_.end(), m.ssv_strategies.begin(), m.ssv_strategies.end());
  }
  SsvLoadStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  std::vector<std::string> strategies() const {
    std::lock_guard lock(mu_);
    return strategies_;
  }

 private:
  mutable std::mutex mu_;
  SsvLoadStats stats_;
  std::vector<std::string> strategies_;
};

GenerateRequest SsvRequest(const Golden& g, SsvMode mode, int32_t group_size) {
  GenerateRequest r = GoldenRequest(g);
  r.speculation.method = SpeculationMethod::kDraftModel;
  r.speculation.num_speculative_tokens = 4;
  r.speculation.ssv_mode = mode;
  r.speculation.ssv_group_size = group_size;
  return r;
}

TEST(EngineNsaTest, DraftModelSpeculationWithSsvExactMatchesGoldens) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  auto observer = std::make_shared<SsvCollector>();
  EngineOptions options;
  options.speculative.draft_model = kDraftModel;
  options.observer = observer;
  auto engine = MakeNsaEngine(options);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<RequestId> ids;
  for (const Golden& g : goldens) {
    auto id = engine->Submit(SsvRequest(g, SsvMode::kExact, 4), c.Callback());
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  // n-gram drafts verified by the server's default strategy (group size 1) too.
  GenerateRequest ngram = GoldenRequest(goldens[1]);
  ngram.speculation.method = SpeculationMethod::kNgram;
  auto ngram_id = engine->Submit(ngram, c.Callback());
  ASSERT_TRUE(ngram_id.ok()) << ngram_id.status();
  // A token tree asked of an NSA target: its attention takes no tree mask, so the draft model
  // drafts a chain of the tree's depth (verified with SSV as any chain).
  GenerateRequest tree = SsvRequest(goldens[2], SsvMode::kExact, 2);
  tree.speculation.tree = TreeShape{true, 3, 2, 8};
  auto tree_id = engine->Submit(tree, c.Callback());
  ASSERT_TRUE(tree_id.ok()) << tree_id.status();
  int64_t drafts = 0, accepted = 0;
  for (size_t e = 0; e < goldens.size(); ++e) {
    ASSERT_TRUE(c.WaitFinished(ids[e]));
    const Collector::Stream s = c.Get(ids[e]);
    EXPECT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(s.ids, goldens[e].greedy) << "entry " << e;
    drafts += s.usage.num_draft_tokens;
    accepted += s.usage.num_accepted_tokens;
  }
  // `auto`: the policy picks the drafter (never Vegas / streaming on an NSA target).
  GenerateRequest automatic = SsvRequest(goldens[4], SsvMode::kExact, 2);
  automatic.speculation.method = SpeculationMethod::kAuto;
  auto auto_id = engine->Submit(automatic, c.Callback());
  ASSERT_TRUE(auto_id.ok()) << auto_id.status();
  ASSERT_TRUE(c.WaitFinished(*ngram_id));
  EXPECT_EQ(c.Get(*ngram_id).ids, goldens[1].greedy);
  ASSERT_TRUE(c.WaitFinished(*tree_id));
  EXPECT_TRUE(c.Get(*tree_id).status.ok()) << c.Get(*tree_id).status;
  EXPECT_EQ(c.Get(*tree_id).ids, goldens[2].greedy);
  EXPECT_LE(c.Get(*tree_id).usage.num_draft_tokens, 3 * c.Get(*tree_id).usage.num_drafts);
  ASSERT_TRUE(c.WaitFinished(*auto_id));
  EXPECT_TRUE(c.Get(*auto_id).status.ok()) << c.Get(*auto_id).status;
  EXPECT_EQ(c.Get(*auto_id).ids, goldens[4].greedy);
  EXPECT_GT(drafts, 0);
  const SsvLoadStats st = observer->stats();
  EXPECT_GT(st.queries, 0);
  EXPECT_LT(st.grouped_keys, st.per_query_keys) << "groups of 4 share keys";
  EXPECT_GT(st.overlap_pairs, 0);
  const std::vector<std::string> used = observer->strategies();
  EXPECT_NE(std::find(used.begin(), used.end(), "exact/c4/r1"), used.end());
  EXPECT_NE(std::find(used.begin(), used.end(), "exact/c1/r1"), used.end());
  std::printf(
      "[ nsa-codepair, draft model K 4, SSV exact C 4 ] acceptance %.3f; %.1f keys per query "
      "alone, %.1f grouped; adjacent overlap %.3f\n",
      drafts ? double(accepted) / drafts : 0.0, double(st.per_query_keys) / st.queries,
      double(st.grouped_keys) / st.queries, st.overlap_sum / st.overlap_pairs);
}

// An EAGLE-3 head drafting for the NSA target (the codepair head: nsa-codepair has the codepair
// target's hidden size, layer count and vocabulary, so the head's shapes fit; it was trained on
// the other model's hidden states and accepts little): the target's passes capture the layers
// the head reads, and verification with SSV exact, groups of 4, gives the golden ids.
TEST(EngineNsaTest, Eagle3HeadDraftsForTheNsaTargetAndSsvExactKeepsTheGoldens) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  EngineOptions options;
  options.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  options.speculative.num_speculative_tokens = 4;
  auto engine = MakeNsaEngine(options);
  ASSERT_NE(engine, nullptr);
  Collector c;
  std::vector<RequestId> ids;
  for (size_t e = 0; e < 3; ++e) {
    GenerateRequest r = SsvRequest(goldens[e], SsvMode::kExact, 4);
    r.speculation.method = SpeculationMethod::kEagle3;
    auto id = engine->Submit(r, c.Callback());
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  int64_t drafts = 0;
  for (size_t e = 0; e < ids.size(); ++e) {
    ASSERT_TRUE(c.WaitFinished(ids[e]));
    const Collector::Stream s = c.Get(ids[e]);
    EXPECT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(s.ids, goldens[e].greedy) << "entry " << e;
    drafts += s.usage.num_draft_tokens;
  }
  EXPECT_GT(drafts, 0) << "the head drafted";
}

// A long held-out prompt (codepair-long's 2,048-id window: the same tokenizer and held-out
// split; 64 NSA blocks, S = 8 of them selected): speculation verified with SSV exact, groups of 4
// and 8, gives plain decoding's ids.
TEST(EngineNsaTest, LongHeldOutPromptWithSsvExactEqualsPlainDecoding) {
  absl::StatusOr<std::string> text =
      ReadFileToString(std::string(SPECD_SHARED_DIR) + "/models/codepair-long/golden.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json list = nlohmann::json::parse(*text, nullptr, false);
  ASSERT_TRUE(list.is_array() && !list.empty());
  const std::vector<int32_t> prompt = list[0]["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(prompt.size(), 2048u);
  EngineOptions options;
  options.model_dir = kNsaModel;
  options.max_model_len = 4096;
  options.num_threads = 2;
  options.speculative.draft_model = kDraftModel;
  auto engine = Engine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateRequest plain = Greedy(prompt, 32);
  plain.params.ignore_eos = true;
  std::vector<GenerateRequest> requests = {plain};
  for (auto [k, c] : {std::pair{4, 4}, std::pair{7, 8}}) {
    GenerateRequest r = plain;
    r.speculation.method = SpeculationMethod::kDraftModel;
    r.speculation.num_speculative_tokens = k;
    r.speculation.ssv_group_size = c;
    requests.push_back(r);
  }
  auto results = (*engine)->GenerateBatch(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_EQ((*results)[1].ids(), (*results)[0].ids()) << "K 4, C 4";
  EXPECT_EQ((*results)[2].ids(), (*results)[0].ids()) << "K 7, C 8";
  EXPECT_GT((*results)[1].usage.num_drafts, 0);
  EXPECT_GT((*results)[2].usage.num_drafts, 0);
}

// A follow-up request whose prompt is the first one's prompt and output (a chat's next turn)
// finds the generated tokens' blocks in the prefix cache after exact verification, and only
// the prompt's after lossy verification (its KV is not the model's).
TEST(EngineNsaTest, LossySsvKeepsGeneratedKvOutOfThePrefixCache) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  const Golden& g = goldens[0];
  const int32_t prompt_len = static_cast<int32_t>(g.prompt.size());
  for (SsvMode mode : {SsvMode::kExact, SsvMode::kShared}) {
    EngineOptions options;
    options.speculative.draft_model = kDraftModel;
    auto engine = MakeNsaEngine(options);  // a fresh prefix cache
    ASSERT_NE(engine, nullptr);
    Collector c;
    auto first = engine->Submit(SsvRequest(g, mode, 4), c.Callback());
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(c.WaitFinished(*first));
    const Collector::Stream a = c.Get(*first);
    ASSERT_TRUE(a.status.ok()) << a.status;
    std::vector<int32_t> next = g.prompt;
    next.insert(next.end(), a.ids.begin(), a.ids.end());
    auto second = engine->Submit(GoldenRequest(Golden{next, {0}}), c.Callback());
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_TRUE(c.WaitFinished(*second));
    const int32_t cached = c.Get(*second).usage.cached_prompt_tokens;
    if (mode == SsvMode::kExact) {
      EXPECT_GT(cached, prompt_len) << "exact verification's KV is the model's: shareable";
    } else {
      EXPECT_GT(cached, 0);
      EXPECT_LE(cached, prompt_len) << "lossy verification's KV must not serve other requests";
    }
  }
}

// The SSV planner: a cost profile with three measured strategies (exact C 1, exact C 4 cheaper,
// shared C 4 cheapest and lossy) picks, per request and step, exact C 4 for a strict request
// (its ids the goldens), shared C 4 for one that allows lossy strategies, and leaves a request
// that set its own strategy alone.
TEST(EngineNsaTest, SsvPlanPicksPerRequestAndNeverALossyStrategyForAStrictRequest) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  const auto grid = [](double base) {
    return *CostGrid::Create({1, 8}, {1, 9}, {1024}, {base, base + 8, base, base + 8});
  };
  CostProfile profile(CostGrid::Constant(10));
  profile.SetVerify(grid(10));
  MethodCosts draft;
  draft.draft = CostGrid::Constant(1);
  profile.SetMethod(PolicyMethod::kDraftModel, draft);
  profile.SetSsv({.group_size = 1}, grid(10));
  profile.SetSsv({.group_size = 4}, grid(8));
  profile.SetSsv({.group_size = 4, .mode = SsvMode::kShared}, grid(5));
  profile.calibrate = false;
  const std::string path = ::testing::TempDir() + "/engine_nsa_ssv_plan.json";
  ASSERT_TRUE(profile.Save(path).ok());
  // Runs `r` alone on an engine of its own; the strategies its steps verified with (read once
  // the engine has stopped: a step's metrics may reach the observer after the request's end).
  const auto run = [&](GenerateRequest r, std::vector<int32_t>* ids) {
    auto observer = std::make_shared<SsvCollector>();
    Collector c;  // outlives the engine, which calls it
    EngineOptions options;
    options.speculative.draft_model = kDraftModel;
    options.cost_profile = path;
    options.observer = observer;
    auto engine = MakeNsaEngine(options);
    if (engine == nullptr) return std::set<std::string>{};
    auto id = engine->Submit(std::move(r), c.Callback());
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok() || !c.WaitFinished(*id)) return std::set<std::string>{};
    EXPECT_TRUE(c.Get(*id).status.ok()) << c.Get(*id).status;
    *ids = c.Get(*id).ids;
    engine.reset();
    const std::vector<std::string> all = observer->strategies();
    return std::set<std::string>(all.begin(), all.end());
  };
  GenerateRequest strict = GoldenRequest(goldens[0]);
  strict.speculation.method = SpeculationMethod::kDraftModel;
  strict.speculation.num_speculative_tokens = 4;
  strict.speculation.ssv_strict = true;
  std::vector<int32_t> ids;
  EXPECT_EQ(run(strict, &ids), std::set<std::string>{"exact/c4/r1"});
  EXPECT_EQ(ids, goldens[0].greedy);
  GenerateRequest lossy = strict;
  lossy.speculation.ssv_strict = false;
  EXPECT_TRUE(run(lossy, &ids).contains("shared/c4/r1"));
  EXPECT_EQ(run(SsvRequest(goldens[1], SsvMode::kExact, 2), &ids),
            std::set<std::string>{"exact/c2/r1"});
  EXPECT_EQ(ids, goldens[1].greedy);
}

TEST(EngineNsaTest, SsvOptionsAreCheckedWhenTheRequestArrives) {
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  EngineOptions options;
  options.speculative.draft_model = kDraftModel;
  options.speculative.ssv = SsvStrategy{.group_size = 4, .mode = SsvMode::kShared};
  auto engine = MakeNsaEngine(options);
  ASSERT_NE(engine, nullptr);
  Collector c;
  GenerateRequest strict_lossy = SsvRequest(goldens[0], SsvMode::kShared, 4);
  strict_lossy.speculation.ssv_strict = true;
  auto refused = engine->Submit(strict_lossy, c.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  GenerateRequest big = SsvRequest(goldens[0], SsvMode::kExact, kMaxSsvGroupSize + 1);
  EXPECT_EQ(engine->Submit(big, c.Callback()).status().code(), absl::StatusCode::kInvalidArgument);
  // A strict request demotes the server's lossy default to exact: the golden ids.
  GenerateRequest strict = GoldenRequest(goldens[2]);
  strict.speculation.method = SpeculationMethod::kDraftModel;
  strict.speculation.ssv_strict = true;
  auto id = engine->Submit(strict, c.Callback());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(c.WaitFinished(*id));
  EXPECT_EQ(c.Get(*id).ids, goldens[2].greedy);
}

}  // namespace
}  // namespace specd
