// `auto` speculation end to end on the CPU (codepair target and draft): with a cost profile in
// which speculation loses from batch 4 on, StrategyPolicy turns the draft model off under a
// 16-request load and back on for a lone request, the resumed draft model's acceptance does not
// collapse, and every output equals plain greedy decoding. Also: speculation.policy (max_k,
// forbid) and pinned methods in the engine, usage per method, and the cost profile's sources
// (a file, the default rule, a bad file refused at Create).
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/policy/cost_profile.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/testing/engine_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace speculation_test;  // NOLINT: the shared fixtures of engine_spec_test_util.h

// Step times (ms) in which the draft model pays at batch 1 and 2 and loses from 4 on: the
// verification pass of K + 1 = 5 tokens grows from 11 ms (batch 1) to 60 ms (batch 4), while a
// plain step stays 10-14 ms. Final ("calibrate": false): the CPU's real step times must not
// overrule it.
constexpr char kLosesAtFourProfile[] = R"({
  "version": 1, "device": "synthetic", "models": "codepair", "calibrate": false,
  "plain": {"batch": [1, 4, 16], "context": [1], "ms": [[[10]], [[11]], [[14]]]},
  "verify": {"batch": [1, 2, 4, 16], "tokens": [1, 5], "context": [1],
             "ms": [[[10], [11]], [[10.5], [14]], [[11], [60]], [[14], [240]]]},
  "methods": {"draft_model": {"draft": {"batch": [1, 16], "tokens": [1, 4], "context": [1],
                                        "ms": [[[1], [4]], [[2], [8]]]}}}
})";

// A head step of 0.1 ms against a draft-model step of 1 ms (both at batch 1): at the prior
// acceptance both pay at batch 1, the head more. No n-gram entry: `auto` weighs the two
// drafters and plain only.
constexpr char kCheapHeadProfile[] = R"({
  "version": 1, "device": "synthetic", "models": "codepair", "calibrate": false,
  "plain": {"batch": [1, 16], "context": [1], "ms": [[[10]], [[14]]]},
  "verify": {"batch": [1, 16], "tokens": [1, 5], "context": [1], "ms": [[[10], [11]], [[14], [30]]]},
  "methods": {
    "draft_model": {"draft": {"batch": [1, 16], "tokens": [1, 4], "context": [1],
                              "ms": [[[1], [4]], [[2], [8]]]}},
    "eagle3": {"draft": {"batch": [1, 16], "tokens": [1, 4], "context": [1],
                         "ms": [[[0.1], [0.4]], [[0.2], [0.8]]]}}}
})";

const std::string kTrainedHead = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
const std::string kParallelDraft = std::string(SPECD_SOURCE_DIR) + "/models/codepair/pard";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return path;
}

// Per step: the auto decodes the policy described, and how many it let speculate; and the
// rounds each step verified (OnSpeculation comes before OnPolicy in a step).
class PolicyObserver : public SpecObserver {
 public:
  struct StepRecord {
    int32_t num_rows = 0;
    int32_t num_speculating = 0;
    std::vector<std::string> methods;  // the methods the policy gave rows, one per method
    int64_t draft_tokens = 0;
    int64_t accepted = 0;
    double estimated = 0;
    double realized = 0;
  };
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    SpecObserver::OnSpeculation(m);
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < m.num_draft_tokens.size(); ++i) {
      pending_.draft_tokens += m.num_draft_tokens[i];
      pending_.accepted += m.num_accepted[i];
    }
  }
  void OnPolicy(const PolicyStepMetrics& m) override {
    std::lock_guard lock(mu_);
    StepRecord s = pending_;
    pending_ = {};
    for (const auto& r : m.rows) {
      s.num_rows += r.num_rows;
      s.methods.push_back(r.method);
      if (std::string(r.method) != "none") s.num_speculating += r.num_rows;
    }
    s.estimated = m.estimated_tokens_per_second;
    s.realized = m.realized_tokens_per_second;
    steps_.push_back(s);
  }
  std::vector<StepRecord> Steps() {
    std::lock_guard lock(mu_);
    return steps_;
  }

 private:
  StepRecord pending_;
  std::vector<StepRecord> steps_;
};

// `auto` with the codepair draft model; `drafters` adds to the speculative config (e.g. an
// EAGLE-3 head: `"eagle3_model": DIR, `).
EngineOptions AutoOptions(const std::string& profile, std::shared_ptr<EngineObserver> observer,
                          const std::string& drafters = "", const std::string& draft = kDraft) {
  EngineOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = 1024;
  o.observer = std::move(observer);
  auto spec = ParseSpeculativeConfig(R"({"method": "auto", )" + drafters + R"("model": ")" + draft +
                                     R"(", "num_speculative_tokens": 4})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  o.speculative = *spec;
  o.cost_profile = profile;
  return o;
}

GenerateRequest Request(std::vector<int32_t> prompt, int32_t max_tokens, SpeculationParams s) {
  GenerateRequest r = Greedy(std::move(prompt), max_tokens, s);
  r.params.ignore_eos = true;  // every request runs its full length
  return r;
}

class PolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    plain_engine_ = MakeEngine(kTarget, "").release();
    ASSERT_NE(plain_engine_, nullptr);
    prompts_ = new std::vector<std::vector<int32_t>>(LoadPrompts(*plain_engine_->tokenizer()));
    profile_ = new std::string(WriteFile("loses_at_four.json", kLosesAtFourProfile));
  }
  static void TearDownTestSuite() {
    delete plain_engine_;
    delete prompts_;
    delete profile_;
  }
  // Plain greedy decoding of `requests` (their speculation ignored).
  static std::vector<std::vector<int32_t>> Plain(std::vector<GenerateRequest> requests) {
    for (GenerateRequest& r : requests) r.speculation = kPlain;
    auto results = plain_engine_->GenerateBatch(requests);
    EXPECT_TRUE(results.ok()) << results.status();
    std::vector<std::vector<int32_t>> ids;
    for (const GenerateResult& g : *results) ids.push_back(g.ids());
    return ids;
  }

  static Engine* plain_engine_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::string* profile_;
};

Engine* PolicyTest::plain_engine_ = nullptr;
std::vector<std::vector<int32_t>>* PolicyTest::prompts_ = nullptr;
std::string* PolicyTest::profile_ = nullptr;

// The issue's end-to-end test: a lone request speculates; 15 more arrive and the policy turns
// speculation off within its hysteresis; when they finish it turns back on for the lone one.
TEST_F(PolicyTest, TurnsSpeculationOffUnderLoadAndBackOnForALoneRequestLosslessly) {
  auto observer = std::make_shared<PolicyObserver>();
  auto created = Engine::Create(AutoOptions(*profile_, observer));
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  ASSERT_TRUE(engine.Start().ok());
  const SpeculationParams kAutoParams{SpeculationMethod::kAuto, 0};
  std::vector<GenerateRequest> requests = {Request((*prompts_)[0], 80, kAutoParams)};
  for (int i = 1; i < 16; ++i) requests.push_back(Request((*prompts_)[i], 16, kAutoParams));

  serving_test::Collector c;
  std::vector<RequestId> ids;
  auto lone = engine.Submit(requests[0], c.Callback());
  ASSERT_TRUE(lone.ok());
  ids.push_back(*lone);
  ASSERT_TRUE(c.WaitTokens(*lone, 16));
  for (int i = 1; i < 16; ++i) {
    auto id = engine.Submit(requests[i], c.Callback());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (RequestId id : ids) ASSERT_TRUE(c.WaitFinished(id));
  engine.Stop();

  const std::vector<std::vector<int32_t>> want = Plain(requests);
  for (size_t i = 0; i < ids.size(); ++i) {
    const serving_test::Collector::Stream s = c.Get(ids[i]);
    EXPECT_TRUE(s.status.ok()) << s.status;
    EXPECT_EQ(s.ids, want[i]) << "request " << i;
  }

  // Phases: alone before the load, under load (>= 4 decodes), alone after it.
  struct Phase {
    int32_t steps = 0, speculating_steps = 0;
    int64_t draft_tokens = 0, accepted = 0;
  } before, load, after;
  bool loaded = false;
  for (const PolicyObserver::StepRecord& s : observer->Steps()) {
    if (s.num_rows >= 4) loaded = true;
    Phase& p = s.num_rows >= 4 ? load : s.num_rows == 1 ? (loaded ? after : before) : load;
    if (s.num_rows < 4 && s.num_rows != 1) continue;  // ramps (2-3 decodes): not judged
    ++p.steps;
    p.speculating_steps += s.num_speculating > 0 ? 1 : 0;
    p.draft_tokens += s.draft_tokens;
    p.accepted += s.accepted;
  }
  // Alone: the draft model runs; under load: off after at most the hysteresis' 3 steps (+1 for
  // the step whose decision is held); alone again: back on.
  EXPECT_GT(before.speculating_steps, 0);
  EXPECT_GE(load.steps, 12);
  EXPECT_LE(load.speculating_steps, 4) << "of " << load.steps << " steps under load";
  EXPECT_GT(after.speculating_steps, 10) << "of " << after.steps << " steps alone after";
  // The draft model was paused through the load; resumed, it accepts about as well as the
  // draft model pinned for the whole request, never paused (a draft KV out of step would
  // accept almost nothing).
  auto pinned_engine = MakeEngine(kTarget, R"({"method": "draft_model", "model": ")" + kDraft +
                                               R"(", "num_speculative_tokens": 4})");
  ASSERT_NE(pinned_engine, nullptr);
  auto pinned =
      pinned_engine->Generate(Request((*prompts_)[0], 80, {SpeculationMethod::kDraftModel, 4}));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->ids(), want[0]);
  ASSERT_GT(pinned->usage.num_draft_tokens, 0);
  ASSERT_GT(before.draft_tokens, 0);
  ASSERT_GT(after.draft_tokens, 0);
  const double rate_pinned =
      static_cast<double>(pinned->usage.num_accepted_tokens) / pinned->usage.num_draft_tokens;
  const double rate_before = static_cast<double>(before.accepted) / before.draft_tokens;
  const double rate_after = static_cast<double>(after.accepted) / after.draft_tokens;
  EXPECT_GT(rate_after, 0.5 * rate_pinned) << rate_pinned << " pinned, " << rate_after;
  // usage: the lone request's rounds were all the draft model's; the short ones never drafted
  // past the first held steps.
  const RequestUsage u = c.Get(ids[0]).usage;
  ASSERT_EQ(u.by_method.size(), 1u);
  EXPECT_STREQ(u.by_method[0].method, "draft_model");
  EXPECT_EQ(u.by_method[0].num_drafts, u.num_drafts);
  EXPECT_EQ(u.by_method[0].num_draft_tokens, u.num_draft_tokens);
  EXPECT_EQ(u.by_method[0].num_accepted_tokens, u.num_accepted_tokens);
  std::printf(
      "policy: %d/%d steps speculating alone, %d/%d under load, %d/%d alone after; "
      "acceptance %.2f before, %.2f after the pause, %.2f pinned\n",
      before.speculating_steps, before.steps, load.speculating_steps, load.steps,
      after.speculating_steps, after.steps, rate_before, rate_after, rate_pinned);
}

TEST_F(PolicyTest, RequestPolicyCapsKForbidsMethodsAndPinnedMethodsWin) {
  auto observer = std::make_shared<PolicyObserver>();
  auto created = Engine::Create(AutoOptions(*profile_, observer));
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  SpeculationParams capped{SpeculationMethod::kAuto, 0};
  capped.policy_max_k = 2;
  SpeculationParams forbidden{SpeculationMethod::kAuto, 0};
  forbidden.policy_forbid = {SpeculationMethod::kDraftModel};
  const SpeculationParams pinned{SpeculationMethod::kNgram, 3};
  // One request at a time: batch 1, where the profile says the draft model pays.
  const std::vector<GenerateRequest> requests = {Request((*prompts_)[20], 24, capped),
                                                 Request((*prompts_)[21], 24, forbidden),
                                                 Request((*prompts_)[22], 24, pinned)};
  const std::vector<std::vector<int32_t>> want = Plain(requests);
  std::vector<RequestUsage> usage;
  for (size_t i = 0; i < requests.size(); ++i) {
    observer->Reset();
    auto got = engine.Generate(requests[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->ids(), want[i]) << "request " << i;
    usage.push_back(got->usage);
    if (i == 0) {
      EXPECT_LE(observer->drafted_at.size(), 2u);  // no round past max_k
    }
  }
  EXPECT_GT(usage[0].num_drafts, 0);
  EXPECT_EQ(usage[1].num_drafts, 0);  // the profile knows only the draft model: plain
  ASSERT_EQ(usage[2].by_method.size(), 1u);
  EXPECT_STREQ(usage[2].by_method[0].method, "ngram");  // pinned: not in the profile, still run
}

// A pinned request keeps its method and K in a batch the policy prices for auto rows (its
// padding counts: the pass runs K + 1 positions for every row, so the policy may let auto rows
// draft within it); every output stays plain decoding's.
TEST_F(PolicyTest, PinnedRowsKeepTheirMethodAndKInAMixedBatchLosslessly) {
  auto created = Engine::Create(AutoOptions(*profile_, nullptr));
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(Request((*prompts_)[30 + i], 16, {SpeculationMethod::kAuto, 0}));
  }
  requests.push_back(Request((*prompts_)[40], 16, {SpeculationMethod::kDraftModel, 3}));
  auto got = (*created)->GenerateBatch(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<std::vector<int32_t>> want = Plain(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*got)[i].ids(), want[i]) << "request " << i;
  }
  const RequestUsage& pinned = (*got)[8].usage;
  EXPECT_GT(pinned.num_drafts, 0);
  ASSERT_EQ(pinned.by_method.size(), 1u);
  EXPECT_STREQ(pinned.by_method[0].method, "draft_model");
  EXPECT_LE(pinned.num_draft_tokens, 3 * pinned.num_drafts);
  for (size_t i = 0; i < 8; ++i) {
    const RequestUsage& u = (*got)[i].usage;
    EXPECT_LE(u.num_draft_tokens, 4 * u.num_drafts) << "request " << i;  // the server's K cap
  }
}

TEST_F(PolicyTest, CostProfileComesFromTheFileOrTheDefaultRuleAndBadFilesFailCreate) {
  auto from_file = Engine::Create(AutoOptions(*profile_, nullptr));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ((*from_file)->cost_profile_source(), "file " + *profile_);
  auto parsed = CostProfile::FromJson((*from_file)->cost_profile_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->device, "synthetic");

  // An NSA target's SSV strategies in the profile of this dense target: dropped (they would
  // price its verification), the rest kept.
  CostProfile with_ssv = *parsed;
  with_ssv.SetSsv({.group_size = 4}, CostGrid::Constant(0.5));
  const std::string ssv_path = ::testing::TempDir() + "/engine_policy_ssv_profile.json";
  ASSERT_TRUE(with_ssv.Save(ssv_path).ok());
  auto dense = Engine::Create(AutoOptions(ssv_path, nullptr));
  ASSERT_TRUE(dense.ok()) << dense.status();
  parsed = CostProfile::FromJson((*dense)->cost_profile_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->ssv().empty());
  EXPECT_EQ(parsed->device, "synthetic");

  auto by_default = Engine::Create(AutoOptions("", nullptr));
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ((*by_default)->cost_profile_source().rfind("default: ", 0), 0u);
  parsed = CostProfile::FromJson((*by_default)->cost_profile_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->Has(PolicyMethod::kDraftModel));
  EXPECT_TRUE(parsed->Has(PolicyMethod::kNgram));
  EXPECT_FALSE(parsed->Has(PolicyMethod::kVegas));
  // Verifying K + 1 tokens never costs less than a plain step, at any batch.
  for (double b : {1.0, 4.0, 64.0, 256.0}) {
    EXPECT_GE(parsed->VerifyMs(PolicyMethod::kNgram, b, 5, 1), parsed->PlainMs(b, 1));
  }

  const std::string bad = WriteFile("bad_profile.json", R"({"version": 1, "plain": {"batch": [1],
      "context": [1], "ms": [[[-3]]]}})");
  auto refused = Engine::Create(AutoOptions(bad, nullptr));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--cost-profile"), std::string::npos);
  EXPECT_NE(refused.status().message().find("plain.ms[0][0][0]"), std::string::npos)
      << refused.status();
  auto missing = Engine::Create(AutoOptions(::testing::TempDir() + "/no_such.json", nullptr));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
}

// With an EAGLE-3 head beside the draft model and a profile in which the head's steps are
// cheap, `auto` gives a lone request the head; the output is plain decoding's either way.
TEST_F(PolicyTest, AutoChoosesTheEagle3HeadWhenTheProfileSaysItsStepsAreCheap) {
  const std::string profile = WriteFile("cheap_head.json", kCheapHeadProfile);
  auto observer = std::make_shared<PolicyObserver>();
  auto created = Engine::Create(
      AutoOptions(profile, observer, R"("eagle3_model": ")" + kTrainedHead + R"(", )"));
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  ASSERT_TRUE(engine.has_eagle3());
  auto parsed = CostProfile::FromJson(engine.cost_profile_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->Has(PolicyMethod::kEagle3));

  const GenerateRequest request = Request((*prompts_)[3], 24, {SpeculationMethod::kAuto, 0});
  auto got = engine.Generate(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ids(), Plain({request})[0]);
  const std::vector<PolicyObserver::StepRecord> steps = observer->Steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].methods, std::vector<std::string>{"eagle3"});
  int32_t eagle3_steps = 0;
  for (const PolicyObserver::StepRecord& s : steps) eagle3_steps += s.methods[0] == "eagle3";
  std::string drafted;
  for (const RequestUsage::MethodUsage& m : got->usage.by_method) {
    drafted += std::string(" ") + m.method + " " + std::to_string(m.num_drafts);
  }
  std::printf("auto with a cheap head: %d of %zu steps eagle3; rounds drafted:%s\n", eagle3_steps,
              steps.size(), drafted.c_str());
  // The head had the request's hidden states from its prefill on (FeedEagle3 feeds auto
  // requests), so the steps the policy gave it drafted.
  int64_t head_rounds = 0;
  for (const RequestUsage::MethodUsage& m : got->usage.by_method) {
    if (std::string(m.method) == "eagle3") head_rounds += m.num_drafts;
  }
  EXPECT_GT(head_rounds, 0) << drafted;
  // A request that forbids the head gets the draft model (it still pays at batch 1), and one
  // that pins the head runs it: its rounds are reported per method.
  SpeculationParams no_head{SpeculationMethod::kAuto, 0};
  no_head.policy_forbid = {SpeculationMethod::kEagle3};
  auto forbidden = engine.Generate(Request((*prompts_)[4], 16, no_head));
  ASSERT_TRUE(forbidden.ok()) << forbidden.status();
  ASSERT_GT(observer->Steps().size(), steps.size());
  EXPECT_EQ(observer->Steps()[steps.size()].methods, std::vector<std::string>{"draft_model"});
  auto pinned = engine.Generate(Request((*prompts_)[5], 16, {SpeculationMethod::kEagle3, 3}));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_EQ(pinned->usage.by_method.size(), 1u);
  EXPECT_STREQ(pinned->usage.by_method[0].method, "eagle3");
  EXPECT_GT(pinned->usage.by_method[0].num_drafts, 0);
}

// Without --cost-profile the default rule prices what the server has: a parallel draft model's
// K drafts as one pass, and the EAGLE-3 head's K drafts as K steps of its weights.
TEST_F(PolicyTest, DefaultProfilePricesAParallelDraftsPassAndTheHeadsSteps) {
  auto created = Engine::Create(
      AutoOptions("", nullptr, R"("parallel": true, "eagle3_model": ")" + kTrainedHead + R"(", )",
                  kParallelDraft));
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = CostProfile::FromJson((*created)->cost_profile_json());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->Has(PolicyMethod::kEagle3));
  ASSERT_NE(p->Costs(PolicyMethod::kDraftModel), nullptr);
  EXPECT_TRUE(p->Costs(PolicyMethod::kDraftModel)->parallel);
  EXPECT_FALSE(p->Costs(PolicyMethod::kEagle3)->parallel);
  for (double b : {1.0, 16.0}) {
    const double draft_one = p->DraftMs(PolicyMethod::kDraftModel, b, 1, 1);
    EXPECT_LT(p->DraftMs(PolicyMethod::kDraftModel, b, 4, 1), 4 * draft_one) << b;
    EXPECT_GE(p->DraftMs(PolicyMethod::kDraftModel, b, 4, 1), draft_one) << b;
    EXPECT_NEAR(p->DraftMs(PolicyMethod::kEagle3, b, 4, 1),
                4 * p->DraftMs(PolicyMethod::kEagle3, b, 1, 1), 1e-9)
        << b;
  }
  // The same server with its draft drafting stepwise: K drafts cost K steps.
  auto stepwise = Engine::Create(AutoOptions("", nullptr));
  ASSERT_TRUE(stepwise.ok()) << stepwise.status();
  p = CostProfile::FromJson((*stepwise)->cost_profile_json());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->Has(PolicyMethod::kEagle3));
  EXPECT_FALSE(p->Costs(PolicyMethod::kDraftModel)->parallel);
  EXPECT_NEAR(p->DraftMs(PolicyMethod::kDraftModel, 1, 4, 1),
              4 * p->DraftMs(PolicyMethod::kDraftModel, 1, 1, 1), 1e-9);
}

}  // namespace
}  // namespace specd
