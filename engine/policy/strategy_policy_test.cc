#include "engine/policy/strategy_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>

namespace specd {
namespace {

using Fn = std::function<double(int b, int t)>;

// A grid over batch 1..256 and tokens 1..9 (context is one sample: constant along it).
CostGrid Grid(const Fn& ms, std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
  const std::vector<int32_t> batch = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<double> values;
  for (int b : batch) {
    for (int t : tokens) values.push_back(ms(b, t));
  }
  return *CostGrid::Create(batch, tokens, {4096}, values);
}

// Plain step 10 ms + 0.05 ms per row; verification adds `per_token` ms per extra token per row.
CostProfile Profile(double per_token, double draft_per_k, double draft_per_row_k = 0) {
  CostProfile p(Grid([](int b, int) { return 10 + 0.05 * b; }, {1}));
  p.SetVerify(Grid([=](int b, int t) { return 10 + 0.05 * b * t + per_token * b * (t - 1); }));
  MethodCosts draft;
  draft.draft = Grid([=](int b, int k) { return k * (draft_per_k + draft_per_row_k * b); },
                     {1, 2, 3, 4, 5, 6, 7, 8});
  p.SetMethod(PolicyMethod::kDraftModel, draft);
  p.SetMethod(PolicyMethod::kNgram, {});
  return p;
}

PolicyEnvironment Env(bool draft_model, bool speculator = false, bool nsa = false) {
  PolicyEnvironment env;
  env.draft_model_loaded = draft_model;
  env.speculator_connected = speculator;
  env.target_is_nsa = nsa;
  return env;
}

// Profile(per_token, draft_per_k) with an EAGLE-3 head whose step costs `head_per_k` ms.
CostProfile WithHead(CostProfile p, double head_per_k) {
  MethodCosts head;
  head.draft = Grid([=](int, int k) { return k * head_per_k; }, {1, 2, 3, 4, 5, 6, 7, 8});
  p.SetMethod(PolicyMethod::kEagle3, head);
  return p;
}

PolicyEnvironment WithHeadLoaded(PolicyEnvironment env) {
  env.eagle3_loaded = true;
  return env;
}

PolicyOptions Options(double prior = 0.8) {
  PolicyOptions o;
  o.acceptance.prior = prior;
  return o;
}

std::unique_ptr<StrategyPolicy> Make(CostProfile profile, PolicyOptions options = Options(),
                                     PolicyEnvironment env = Env(true)) {
  auto policy = StrategyPolicy::Create(std::move(profile), options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  (*policy)->SetEnvironment(env);
  return *std::move(policy);
}

std::vector<PolicyRequest> Requests(int n) {
  std::vector<PolicyRequest> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].id = 100 + i;
    out[i].context_len = 4096;
  }
  return out;
}

// Runs `steps` decisions and returns the last.
PolicyDecision DecideSteps(StrategyPolicy& policy, const std::vector<PolicyRequest>& requests,
                           int steps) {
  PolicyDecision d;
  for (int i = 0; i < steps; ++i) d = policy.Decide(requests);
  return d;
}

TEST(StrategyPolicyTest, ChoosesPlainWhenVerificationCostsMoreThanItGains) {
  // Every extra verified token costs as much as a whole plain step.
  auto costly = Make(Profile(/*per_token=*/10, /*draft_per_k=*/1));
  PolicyDecision d = costly->Decide(Requests(1));
  ASSERT_EQ(d.rows.size(), 1u);
  EXPECT_EQ(d.rows[0].strategy, Strategy{});
  EXPECT_FALSE(d.rows[0].pinned);
  EXPECT_NEAR(d.tokens_per_second, 1000 / 10.05, 1e-9);
  // The same request on cheap verification speculates.
  auto cheap = Make(Profile(/*per_token=*/0.2, /*draft_per_k=*/0.5));
  d = cheap->Decide(Requests(1));
  EXPECT_EQ(d.rows[0].strategy.method, PolicyMethod::kNgram);  // free drafts, same acceptance
  EXPECT_GE(d.rows[0].strategy.k, 4);
  EXPECT_GT(d.tokens_per_second, 2 * 1000 / 10.05);
}

TEST(StrategyPolicyTest, LowersKAsTheBatchGrows) {
  // Verification cost grows with batch x tokens, so long drafts stop paying under load.
  const int sizes[] = {1, 4, 16, 64, 256};
  int32_t k[5];
  for (int i = 0; i < 5; ++i) {
    auto policy = Make(Profile(/*per_token=*/0.05, /*draft_per_k=*/1, /*per_row_k=*/0.01));
    policy->SetEnvironment({});  // n-gram only, so K alone moves
    const PolicyDecision d = policy->Decide(Requests(sizes[i]));
    k[i] = d.rows[0].strategy.k;
    for (const PolicyRow& row : d.rows) EXPECT_EQ(row.strategy, d.rows[0].strategy);
  }
  EXPECT_EQ(k[0], 8);  // alone: the longest draft the profile measured
  for (int i = 1; i < 5; ++i) EXPECT_LE(k[i], k[i - 1]) << sizes[i];
  EXPECT_LE(k[3], 3);
  EXPECT_EQ(k[4], 0);  // at 256 rows speculation no longer pays at all
}

TEST(StrategyPolicyTest, SwitchesMethodWhenARequestsAcceptanceDrops) {
  auto policy = Make(Profile(/*per_token=*/0.2, /*draft_per_k=*/0.2), Options(0.8));
  policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.5);
  const auto requests = Requests(1);
  PolicyDecision d = policy->Decide(requests);
  ASSERT_EQ(d.rows[0].strategy.method, PolicyMethod::kDraftModel);
  EXPECT_TRUE(d.rows[0].drafters_to_sync.empty());
  int switched_at = -1;
  for (int step = 0; step < 20 && switched_at < 0; ++step) {
    policy->OnVerified(100, d.rows[0].strategy.method, d.rows[0].strategy.k, 0);
    d = policy->Decide(requests);
    if (d.rows[0].strategy.method != PolicyMethod::kDraftModel) switched_at = step;
  }
  ASSERT_GE(switched_at, 0);
  EXPECT_GE(switched_at, 2);  // held for switch_patience steps first
  EXPECT_EQ(d.rows[0].strategy.method, PolicyMethod::kNgram);
  EXPECT_TRUE(d.switched);
  // The draft model is paused for this request: the engine must keep it in sync.
  EXPECT_TRUE(d.rows[0].drafters_to_sync.Has(PolicyMethod::kDraftModel));
  EXPECT_EQ(policy->stats().num_switches, 1);
}

TEST(StrategyPolicyTest, TurnsSpeculationOffUnderLoadAndBackOnForALoneRequest) {
  // Speculation wins alone and loses from a few rows on.
  auto policy = Make(Profile(/*per_token=*/1.0, /*draft_per_k=*/0.2));
  policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  PolicyDecision d = policy->Decide(Requests(1));
  ASSERT_EQ(d.rows[0].strategy.method, PolicyMethod::kDraftModel);
  const auto loaded = Requests(16);
  d = policy->Decide(loaded);
  EXPECT_EQ(d.rows[1].strategy, Strategy{});  // a newcomer takes the best at once
  EXPECT_EQ(d.rows[0].strategy.method, PolicyMethod::kDraftModel);  // held for now
  d = DecideSteps(*policy, loaded, 3);
  for (const PolicyRow& row : d.rows) EXPECT_EQ(row.strategy, Strategy{}) << row.id;
  EXPECT_TRUE(d.rows[0].drafters_to_sync.Has(PolicyMethod::kDraftModel));
  EXPECT_TRUE(d.rows[1].drafters_to_sync.empty());  // never drafted: nothing to keep in sync
  for (int i = 1; i < 16; ++i) policy->Forget(100 + i);
  d = DecideSteps(*policy, Requests(1), 3);
  EXPECT_EQ(d.rows[0].strategy.method, PolicyMethod::kDraftModel);
  EXPECT_GE(d.rows[0].strategy.k, 1);
}

// Drives one request for `steps` steps with noisy acceptance around `alpha`; returns how often
// its strategy changed.
int CountChanges(PolicyOptions options, int steps) {
  // Verification: +1 ms per extra token; n-gram drafts for free. The best K moves between 2
  // and 4 as the acceptance estimate wanders around 0.55.
  CostProfile p(Grid([](int, int) { return 10; }, {1}));
  p.SetVerify(Grid([](int, int t) { return 10.0 + (t - 1); }));
  p.SetMethod(PolicyMethod::kNgram, {});
  auto policy = Make(std::move(p), options, {});
  std::mt19937 rng(1234);
  std::bernoulli_distribution accept(0.55);
  const auto requests = Requests(1);
  Strategy last;
  int changes = 0;
  for (int step = 0; step < steps; ++step) {
    const PolicyDecision d = policy->Decide(requests);
    const Strategy s = d.rows[0].strategy;
    if (step > 0 && !(s == last)) ++changes;
    last = s;
    int accepted = 0;
    while (accepted < s.k && accept(rng)) ++accepted;
    policy->OnVerified(100, s.method, s.k, accepted);
  }
  return changes;
}

TEST(StrategyPolicyTest, HysteresisHoldsOnNoisyAcceptance) {
  PolicyOptions flappy = Options(0.55);
  flappy.switch_margin = 0;
  flappy.switch_patience = 1;
  const int without = CountChanges(flappy, 300);
  const int with = CountChanges(Options(0.55), 300);
  std::printf("strategy changes in 300 steps: %d without hysteresis, %d with\n", without, with);
  EXPECT_GE(without, 10);  // the choice flaps without hysteresis...
  // ...and holds with it. (A run of rejections may still send the request to plain decoding; its
  // estimate relaxes back and it returns: two changes.)
  EXPECT_LE(with, 5);
  EXPECT_LE(5 * with, without);
}

TEST(StrategyPolicyTest, ExplicitRequestChoicesWin) {
  auto policy = Make(Profile(/*per_token=*/10, /*draft_per_k=*/1));  // plain is best
  auto requests = Requests(4);
  requests[0].pinned_method = PolicyMethod::kDraftModel;
  requests[0].pinned_k = 3;
  requests[1].pinned_method = PolicyMethod::kNgram;  // K left to the policy
  requests[2].pinned_k = 2;                          // K only
  // Unpinned: padding to the pinned rows' K makes its drafts nearly free, so only forbidding
  // both drafters keeps it plain.
  requests[3].forbidden = {PolicyMethod::kNgram, PolicyMethod::kDraftModel};
  const PolicyDecision d = DecideSteps(*policy, requests, 5);
  EXPECT_EQ(d.rows[0].strategy, (Strategy{PolicyMethod::kDraftModel, 3}));
  EXPECT_TRUE(d.rows[0].pinned);
  EXPECT_EQ(d.rows[1].strategy.method, PolicyMethod::kNgram);
  EXPECT_GE(d.rows[1].strategy.k, 1);
  EXPECT_EQ(d.rows[2].strategy.k, 2);
  EXPECT_NE(d.rows[2].strategy.method, PolicyMethod::kPlain);
  EXPECT_EQ(d.rows[3].strategy, Strategy{});
  EXPECT_FALSE(d.rows[3].pinned);
  // And a pinned "none" stays plain where speculation would win.
  auto cheap = Make(Profile(/*per_token=*/0.1, /*draft_per_k=*/0.1));
  auto none = Requests(1);
  none[0].pinned_method = PolicyMethod::kPlain;
  EXPECT_EQ(cheap->Decide(none).rows[0].strategy, Strategy{});
}

TEST(StrategyPolicyTest, HonoursTheCapOnKAndForbiddenMethods) {
  auto policy = Make(Profile(/*per_token=*/0.1, /*draft_per_k=*/0.1));
  policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  auto requests = Requests(2);
  requests[0].max_k = 3;
  requests[1].forbidden = {PolicyMethod::kDraftModel};
  const PolicyDecision d = policy->Decide(requests);
  EXPECT_EQ(d.rows[0].strategy, (Strategy{PolicyMethod::kDraftModel, 3}));
  EXPECT_EQ(d.rows[1].strategy.method, PolicyMethod::kNgram);
  // Without the limits both would draft with the draft model at a longer K.
  auto unlimited = Make(Profile(0.1, 0.1));
  unlimited->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  const PolicyDecision free = unlimited->Decide(Requests(2));
  EXPECT_EQ(free.rows[1].strategy.method, PolicyMethod::kDraftModel);
  EXPECT_GT(free.rows[0].strategy.k, 3);
}

TEST(StrategyPolicyTest, AppliesMethodsOnlyWhereTheyFit) {
  PolicyOptions o;
  const auto has = [&](PolicyEnvironment env, int64_t context, PolicyMethod m) {
    return ApplicableMethods(env, o, context).Has(m);
  };
  EXPECT_TRUE(has({}, 10, PolicyMethod::kNgram));
  EXPECT_TRUE(has({}, 10, PolicyMethod::kPlain));
  EXPECT_FALSE(has({}, 10, PolicyMethod::kDraftModel));
  EXPECT_TRUE(has(Env(true), 10, PolicyMethod::kDraftModel));
  EXPECT_FALSE(has(Env(true), 10, PolicyMethod::kEagle3));
  EXPECT_TRUE(has(WithHeadLoaded({}), 10, PolicyMethod::kEagle3));
  EXPECT_FALSE(has({}, 10, PolicyMethod::kSsd));
  EXPECT_TRUE(has(Env(false, true), 10, PolicyMethod::kSsd));
  EXPECT_FALSE(has({}, 1000, PolicyMethod::kVegas));
  EXPECT_TRUE(has({}, 8192, PolicyMethod::kVegas));
  EXPECT_TRUE(has({}, 8192, PolicyMethod::kStreaming));
  EXPECT_FALSE(has(Env(false, false, true), 8192, PolicyMethod::kVegas));
  EXPECT_TRUE(has(Env(false, false, true), 10, PolicyMethod::kSsv));
  EXPECT_FALSE(has({}, 10, PolicyMethod::kSsv));
  // SSD profiled as the best method is not chosen while no speculator is joined.
  CostProfile p = Profile(0.1, 5);
  p.SetMethod(PolicyMethod::kSsd, {});
  auto policy = Make(std::move(p));
  policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  EXPECT_NE(policy->Decide(Requests(1)).rows[0].strategy.method, PolicyMethod::kSsd);
  policy->SetEnvironment(Env(true, true));
  policy->Forget(100);
  EXPECT_EQ(policy->Decide(Requests(1)).rows[0].strategy.method, PolicyMethod::kSsd);
}

TEST(StrategyPolicyTest, ChoosesTheEagle3HeadWhenItsStepsAreCheap) {
  // The draft model's step costs 3 ms, the head's 0.2 ms; both accept 0.8 (n-gram 0.3).
  const CostProfile profile = WithHead(Profile(/*per_token=*/0.1, /*draft_per_k=*/3), 0.2);
  auto policy = Make(profile, Options(0.8), WithHeadLoaded(Env(true)));
  policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  PolicyDecision d = policy->Decide(Requests(1));
  EXPECT_EQ(d.rows[0].strategy, (Strategy{PolicyMethod::kEagle3, 8}));  // K 8: steps are cheap
  // Without the head loaded (or the request forbidding it) the draft model, at a shorter K.
  auto unloaded = Make(profile, Options(0.8), Env(true));
  unloaded->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  d = unloaded->Decide(Requests(1));
  EXPECT_EQ(d.rows[0].strategy.method, PolicyMethod::kDraftModel);
  EXPECT_LT(d.rows[0].strategy.k, 8);
  auto requests = Requests(1);
  requests[0].forbidden = {PolicyMethod::kEagle3};
  policy->Forget(100);
  EXPECT_EQ(policy->Decide(requests).rows[0].strategy.method, PolicyMethod::kDraftModel);
  // A head that accepts little loses to the draft model however cheap its steps.
  auto poor = Make(profile, Options(0.8), WithHeadLoaded(Env(true)));
  poor->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
  poor->acceptance().SetGlobalRate(PolicyMethod::kEagle3, 0.2);
  EXPECT_EQ(poor->Decide(Requests(1)).rows[0].strategy.method, PolicyMethod::kDraftModel);
  // Its rounds are counted per method.
  EXPECT_EQ(policy->stats().rows_by_method[static_cast<int>(PolicyMethod::kEagle3)], 1);
}

TEST(StrategyPolicyTest, AParallelDraftModelsOnePassMakesLongDraftsPay) {
  // A 3 ms draft step: stepwise, K drafts cost 3 K ms; in parallel, one pass costs 3 + 0.1 K.
  const CostProfile stepwise = Profile(/*per_token=*/0.1, /*draft_per_k=*/3);
  CostProfile parallel = stepwise;
  MethodCosts pass;
  pass.draft = Grid([](int, int k) { return 3 + 0.1 * k; }, {1, 2, 3, 4, 5, 6, 7, 8});
  pass.parallel = true;
  parallel.SetMethod(PolicyMethod::kDraftModel, pass);
  Strategy chosen[2];
  for (int i = 0; i < 2; ++i) {
    auto policy = Make(i == 0 ? stepwise : parallel);
    policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.3);
    chosen[i] = policy->Decide(Requests(1)).rows[0].strategy;
  }
  EXPECT_EQ(chosen[0].method, PolicyMethod::kDraftModel);
  EXPECT_LE(chosen[0].k, 4);  // each draft costs a step: K stops where acceptance fades
  EXPECT_EQ(chosen[1], (Strategy{PolicyMethod::kDraftModel, 8}));  // the pass barely grows
}

TEST(StrategyPolicyTest, ModelsAMixedStepExplicitly) {
  auto policy = Make(Profile(/*per_token=*/1.0, /*draft_per_k=*/0.5));
  auto requests = Requests(3);
  requests[2].context_len = 8192;
  const Strategy mixed[] = {{PolicyMethod::kDraftModel, 4}, {}, {PolicyMethod::kNgram, 2}};
  const StepEstimate e = policy->Estimate(requests, mixed);
  // Target pass padded to 5 tokens for all 3 rows, plus 4 draft passes for the one draft row.
  const double verify = 10 + 0.05 * 3 * 5 + 1.0 * 3 * 4;
  EXPECT_DOUBLE_EQ(e.step_ms, verify + 4 * 0.5);
  const double a = 0.8;
  EXPECT_NEAR(e.expected_tokens, (1 - std::pow(a, 5)) / (1 - a) + 1 + (1 + a + a * a), 1e-12);
  const Strategy none[] = {{}, {}, {}};
  EXPECT_DOUBLE_EQ(policy->Estimate(requests, none).step_ms, 10 + 0.05 * 3);
}

TEST(StrategyPolicyTest, RecordsItsChoices) {
  auto policy = Make(Profile(/*per_token=*/10, /*draft_per_k=*/1));
  auto requests = Requests(3);
  requests[0].pinned_method = PolicyMethod::kNgram;
  requests[0].pinned_k = 2;
  for (int i = 1; i < 3; ++i)
    requests[i].forbidden = {PolicyMethod::kNgram, PolicyMethod::kDraftModel};
  PolicyDecision d;
  for (int i = 0; i < 2; ++i) d = policy->Decide(requests);
  const PolicyStats& s = policy->stats();
  EXPECT_EQ(s.num_decisions, 2);
  EXPECT_EQ(s.rows_by_method[static_cast<int>(PolicyMethod::kNgram)], 2);
  EXPECT_EQ(s.rows_by_method[static_cast<int>(PolicyMethod::kPlain)], 4);
  EXPECT_EQ(s.last_rows_by_method[static_cast<int>(PolicyMethod::kPlain)], 2);
  EXPECT_DOUBLE_EQ(s.last_tokens_per_second, d.tokens_per_second);
  EXPECT_GT(s.last_step_ms, 0);
  EXPECT_DOUBLE_EQ(s.last_expected_tokens, d.expected_tokens);
}

TEST(StrategyPolicyTest, SearchesOnlyAsOftenAsItsShareOfTheStepAllows) {
  PolicyOptions o = Options();
  o.max_search_interval = 8;
  auto policy = Make(Profile(/*per_token=*/0.2, /*draft_per_k=*/0.5), o);
  auto requests = Requests(16);
  const PolicyDecision first = policy->Decide(requests);
  EXPECT_TRUE(first.searched);
  ASSERT_NE(first.rows[0].strategy, Strategy{});
  EXPECT_EQ(policy->stats().search_interval, 1);  // no step time known yet
  // Steps far shorter than a search: it runs once every max_search_interval steps, and the
  // steps between hold every request's strategy.
  policy->NoteStepSeconds(1e-9);
  EXPECT_EQ(policy->stats().search_interval, 8);
  int searches = 0;
  for (int step = 0; step < 16; ++step) {
    const PolicyDecision d = policy->Decide(requests);
    policy->NoteStepSeconds(1e-9);
    searches += d.searched;
    for (size_t i = 0; i < d.rows.size(); ++i) {
      EXPECT_EQ(d.rows[i].strategy, first.rows[i].strategy) << step;
    }
  }
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(policy->stats().num_searches, 3);
  // A hold step places a newcomer against the rest (here it joins their strategy) and lowers a
  // request's K to its cap.
  requests.push_back(Requests(17).back());
  requests[0].max_k = 1;
  PolicyDecision d = policy->Decide(requests);
  EXPECT_FALSE(d.searched);
  EXPECT_EQ(d.rows[16].strategy, first.rows[1].strategy);
  EXPECT_EQ(d.rows[0].strategy, (Strategy{first.rows[0].strategy.method, 1}));
  // The batch halved: a search at once.
  requests.resize(8);
  EXPECT_TRUE(policy->Decide(requests).searched);
  // The engine's own hold steps (KeepLastDecision) count towards the next search too.
  EXPECT_FALSE(policy->SearchDue());
  for (int step = 0; step < 7; ++step) policy->KeepLastDecision();
  EXPECT_TRUE(policy->SearchDue());
  EXPECT_EQ(policy->stats().num_decisions, 1 + 16 + 2 + 7);
  // max_search_share 0: every step searches.
  o.max_search_share = 0;
  auto always = Make(Profile(0.2, 0.5), o);
  for (int step = 0; step < 4; ++step) {
    EXPECT_TRUE(always->Decide(requests).searched);
    always->NoteStepSeconds(1e-9);
  }
}

TEST(StrategyPolicyTest, CalibratesTheProfileByTheStepTimesItObserves) {
  // The profile says n-gram drafting pays (1.3x plain at acceptance 0.3); the steps say a
  // speculative step takes twice the modelled time (host work the profile does not see), a
  // plain one as modelled.
  const auto run = [](bool calibrate) {
    CostProfile p = Profile(/*per_token=*/0.2, /*draft_per_k=*/0.5);
    p.calibrate = calibrate;
    PolicyOptions o = Options(0.3);
    o.max_search_share = 0;
    auto policy = Make(std::move(p), o, {});  // n-gram only
    const auto requests = Requests(1);
    std::vector<Strategy> chosen;
    for (int step = 0; step < 12; ++step) {
      const PolicyDecision d = policy->Decide(requests);
      chosen.push_back(d.rows[0].strategy);
      const double modelled_ms = d.step_ms / policy->stats().last_calibration;
      policy->NoteStepSeconds(modelled_ms * (d.rows[0].strategy.k > 0 ? 2 : 1) / 1000);
    }
    if (calibrate) {
      // It moved towards 2 until plain won, and stays there without speculative steps.
      EXPECT_GT(policy->Calibration(/*speculative=*/true, 1), 1.25);
      EXPECT_LE(policy->Calibration(/*speculative=*/true, 1), 2);
      EXPECT_NEAR(policy->Calibration(/*speculative=*/false, 1), 1, 0.01);
      EXPECT_DOUBLE_EQ(policy->Calibration(/*speculative=*/false, 64), 1);  // not seen
    }
    return chosen;
  };
  const std::vector<Strategy> calibrated = run(true);
  EXPECT_EQ(calibrated.front().method, PolicyMethod::kNgram);  // the profile's word at first
  EXPECT_EQ(calibrated.back(), Strategy{});                    // then the steps'
  // "calibrate": false in the profile: its word stands.
  for (const Strategy& s : run(false)) EXPECT_EQ(s.method, PolicyMethod::kNgram);
  // One very slow step (a graph captured for a new shape) moves the factor by a bounded step.
  auto policy = Make(Profile(0.2, 0.5), Options(0.3), {});
  const PolicyDecision d = policy->Decide(Requests(1));
  ASSERT_GT(d.rows[0].strategy.k, 0);
  policy->NoteStepSeconds(100 * d.step_ms / 1000);
  EXPECT_NEAR(policy->Calibration(/*speculative=*/true, 1), 1.2, 1e-3);
  EXPECT_EQ(policy->Decide(Requests(1)).rows[0].strategy.method, PolicyMethod::kNgram);
}

TEST(StrategyPolicyTest, AmortisesAStatefulDraftersCatchUpOverTheRequestsRemainingTokens) {
  const auto decide = [](int64_t catch_up, int64_t remaining) {
    auto policy = Make(Profile(/*per_token=*/0.2, /*draft_per_k=*/0.5));
    policy->acceptance().SetGlobalRate(PolicyMethod::kNgram, 0.1);  // the draft model wins
    auto requests = Requests(1);
    requests[0].catch_up_tokens[static_cast<size_t>(PolicyMethod::kDraftModel)] = catch_up;
    requests[0].remaining_tokens = remaining;
    return policy->Decide(requests).rows[0].strategy.method;
  };
  EXPECT_EQ(decide(0, 16), PolicyMethod::kDraftModel);
  // The draft model must first run 100,000 tokens (~0.002 ms each here): 16 tokens to go do not
  // repay that, a million do.
  EXPECT_NE(decide(100000, 16), PolicyMethod::kDraftModel);
  EXPECT_EQ(decide(100000, 1000000), PolicyMethod::kDraftModel);
  EXPECT_EQ(decide(100000, 0), PolicyMethod::kDraftModel);  // unknown: nothing amortised
}

TEST(StrategyPolicyTest, RefusesBadOptions) {
  PolicyOptions o;
  o.max_k = 0;
  EXPECT_EQ(StrategyPolicy::Create(Profile(1, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.switch_patience = 0;
  EXPECT_FALSE(StrategyPolicy::Create(Profile(1, 1), o).ok());
  o = {};
  o.max_search_interval = 0;
  EXPECT_FALSE(StrategyPolicy::Create(Profile(1, 1), o).ok());
  o = {};
  o.max_search_share = -0.1;
  EXPECT_FALSE(StrategyPolicy::Create(Profile(1, 1), o).ok());
}

TEST(StrategyPolicyTest, DecidesLargeBatchesQuickly) {
  for (int n : {64, 256}) {
    auto policy = Make(Profile(/*per_token=*/0.05, /*draft_per_k=*/1, 0.01));
    const auto requests = Requests(n);
    const auto start = std::chrono::steady_clock::now();
    const PolicyDecision d = DecideSteps(*policy, requests, 10);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(d.rows.size(), static_cast<size_t>(n));
    // And the hold steps between searches.
    policy->NoteStepSeconds(1e-9);
    const auto hold_start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) EXPECT_FALSE(policy->Decide(requests).searched);
    const double hold_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - hold_start)
            .count();
    std::printf("%d requests: %.3f ms per search, %.4f ms per hold step\n", n, ms / 10,
                hold_ms / 10);
    EXPECT_LT(ms / 10, 200);  // generous (sanitizer builds); the printed numbers are what matter
    EXPECT_LT(hold_ms, ms);
  }
}

}  // namespace
}  // namespace specd
