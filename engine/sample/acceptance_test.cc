#include "engine/sample/acceptance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "engine/testing/test_flags.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using acceptance_internal::Rule;

// ---- chi-square --------------------------------------------------------------------------

// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes: the series below a + 1, the
// continued fraction above).
double UpperGammaQ(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && term > sum * 1e-15; ++n) sum += term *= x / (a + n);
    return 1.0 - sum * std::exp(log_prefix);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;  // modified Lentz
  for (int n = 1; n < 1000; ++n) {
    const double an = -n * (n - a);
    b += 2;
    d = 1 / (an * d + b);
    c = b + an / c;
    const double delta = c * d;
    h *= delta;
    if (std::abs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

// Upper 0.1% point of the chi-square distribution with `dof` degrees of freedom: the x with
// Q(dof / 2, x / 2) = 0.001, by bisection.
double ChiSquareCritical999(int dof) {
  double lo = 0, hi = 10.0 * dof + 100;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (UpperGammaQ(dof / 2.0, mid / 2) > 0.001 ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// Pearson's statistic over the cells with positive expected probability, and its degrees of
// freedom. A count in a cell of probability 0 makes the statistic infinite.
std::pair<double, int> ChiSquare(const std::map<int, int>& counts,
                                 const std::map<int, double>& probs, int n) {
  double stat = 0;
  int cells = 0;
  for (const auto& [cell, p] : probs) {
    if (p <= 0) continue;
    ++cells;
    const double expected = n * p;
    const auto it = counts.find(cell);
    const double observed = it == counts.end() ? 0 : it->second;
    stat += (observed - expected) * (observed - expected) / expected;
  }
  for (const auto& [cell, c] : counts) {
    const auto it = probs.find(cell);
    if (it == probs.end() || it->second <= 0) stat = INFINITY;
  }
  return {stat, cells - 1};
}

TEST(ChiSquareTest, CriticalValuesMatchTheTable) {
  EXPECT_NEAR(ChiSquareCritical999(1), 10.828, 0.002);
  EXPECT_NEAR(ChiSquareCritical999(4), 18.467, 0.002);
  EXPECT_NEAR(ChiSquareCritical999(7), 24.322, 0.002);
  EXPECT_NEAR(ChiSquareCritical999(15), 37.697, 0.002);
  EXPECT_NEAR(ChiSquareCritical999(35), 66.619, 0.002);
}

// ---- greedy ------------------------------------------------------------------------------

TEST(AcceptGreedyTest, KeepsDraftsUpToFirstMismatchThenTakesTheTargetToken) {
  const std::vector<int32_t> drafts = {5, 6, 7};
  EXPECT_EQ(AcceptGreedy(drafts, std::vector<int32_t>{5, 9, 7, 1}).num_accepted, 1);
  EXPECT_EQ(AcceptGreedy(drafts, std::vector<int32_t>{5, 9, 7, 1}).next_token, 9);
  const AcceptResult all = AcceptGreedy(drafts, std::vector<int32_t>{5, 6, 7, 1});
  EXPECT_EQ(all.num_accepted, 3);
  EXPECT_EQ(all.next_token, 1);  // bonus
  const AcceptResult none = AcceptGreedy({}, std::vector<int32_t>{4});
  EXPECT_EQ(none.num_accepted, 0);
  EXPECT_EQ(none.next_token, 4);
}

// ---- toy models --------------------------------------------------------------------------

// A bigram "model": logits of the next token given the previous one.
struct Bigram {
  int32_t vocab;
  std::vector<float> logits;  // [vocab, vocab]
  std::span<const float> Next(int32_t prev) const {
    return std::span<const float>(logits).subspan(prev * vocab, vocab);
  }
};

Bigram RandomBigram(int32_t vocab, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> logit(0.0f, scale);
  Bigram m{vocab, std::vector<float>(vocab * vocab)};
  for (float& x : m.logits) x = logit(rng);
  return m;
}

// A draft that mostly agrees with `target`: its logits plus noise.
Bigram Perturbed(const Bigram& target, float noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> delta(0.0f, noise);
  Bigram m = target;
  for (float& x : m.logits) x += delta(rng);
  return m;
}

std::vector<float> Probs(const SamplingParams& params, std::span<const float> logits,
                         const TokenHistory& history = {}) {
  std::vector<float> probs(logits.size());
  ProcessedProbs(params, logits, history, {}, {}, probs);
  return probs;
}

// ---- ProcessedProbs against Sampler ----------------------------------------------------------

TEST(ProcessedProbsTest, GreedyRowIsOneHotAtSamplersChoiceWithPenaltiesPendingAndBans) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 1.4f;
  params.presence_penalty = 0.3f;
  params.frequency_penalty = 0.6f;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::uniform_int_distribution<int32_t> token(0, 15);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(16);
    for (float& x : logits) x = logit(rng);
    TokenHistory history, extended;
    std::vector<int32_t> prompt = {token(rng), token(rng)}, pending = {token(rng), token(rng)};
    history.AddPrompt(prompt);
    extended.AddPrompt(prompt);
    for (int i = 0; i < 3; ++i) {
      const int32_t id = token(rng);
      history.AddOutput(id);
      extended.AddOutput(id);
    }
    for (int32_t id : pending) extended.AddOutput(id);
    const std::vector<int32_t> banned = {token(rng)};
    std::vector<float> probs(16);
    ProcessedProbs(params, logits, history, pending, banned, probs);
    std::vector<float> copy = logits;
    const int32_t expected = Sampler(params, 1).Sample(copy, extended, banned).id;
    EXPECT_EQ(probs[expected], 1.0f) << trial;
    EXPECT_EQ(std::accumulate(probs.begin(), probs.end(), 0.0f), 1.0f);
  }
}

TEST(ProcessedProbsTest, SampledRowIsTheDistributionSamplerDrawsFrom) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 7;
  params.top_p = 0.9f;
  params.min_p = 0.02f;
  params.frequency_penalty = 0.4f;
  const Bigram model = RandomBigram(12, 1.5f, 11);
  TokenHistory history;
  history.AddOutput(3);
  history.AddOutput(3);
  const std::span<const float> logits = model.Next(2);
  const std::vector<float> probs = Probs(params, logits, history);
  std::map<int, double> expected;
  for (int x = 0; x < 12; ++x) expected[x] = probs[x];
  constexpr int kDraws = 20000;
  Sampler sampler(params, 5);
  std::map<int, int> counts;
  for (int i = 0; i < kDraws; ++i) {
    std::vector<float> copy(logits.begin(), logits.end());
    ++counts[sampler.Sample(copy, history).id];
  }
  const auto [stat, dof] = ChiSquare(counts, expected, kDraws);
  ASSERT_GE(dof, 3);
  EXPECT_LT(stat, ChiSquareCritical999(dof)) << "dof " << dof;
}

// ---- losslessness ------------------------------------------------------------------------

enum class Drafts { kSampled, kDeterministic };

// Generates two tokens after token 0 by speculative rounds of K drafts and counts the pairs
// (with K = 1 the second token is the bonus token whenever the draft is accepted).
// The draft model proposes by sampling its processed distribution (kSampled) or its argmax with
// no distribution passed on (kDeterministic, as n-gram speculators); the target verifies through
// Acceptor (rule kSpeculativeSampling, from raw logits) or through the row-based API with the
// given rule.
std::map<int, int> CountFirstTwoTokens(const SamplingParams& params, const Bigram& target,
                                       const Bigram& draft, int kDrafts, Drafts drafts_kind,
                                       Rule rule, bool through_acceptor, int trials,
                                       uint64_t seed) {
  const int32_t vocab = target.vocab;
  Acceptor acceptor(params, seed);
  std::mt19937_64 rng(seed + 1);
  std::map<int, int> counts;
  const TokenHistory history;  // no penalties in these params
  for (int t = 0; t < trials; ++t) {
    std::vector<int32_t> out;
    int32_t last = 0;
    while (out.size() < 2) {
      std::vector<int32_t> drafts;
      std::vector<float> q_rows, target_logits, p_rows;
      int32_t prev = last;
      for (int j = 0; j < kDrafts; ++j) {
        const std::vector<float> q = Probs(params, draft.Next(prev));
        const int32_t d =
            drafts_kind == Drafts::kSampled
                ? DrawFromProbs(q, rng)
                : static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
        if (drafts_kind == Drafts::kSampled) q_rows.insert(q_rows.end(), q.begin(), q.end());
        drafts.push_back(d);
        prev = d;
      }
      prev = last;
      for (int j = 0; j <= kDrafts; ++j) {
        const auto row = target.Next(prev);
        target_logits.insert(target_logits.end(), row.begin(), row.end());
        const std::vector<float> p = Probs(params, row);
        p_rows.insert(p_rows.end(), p.begin(), p.end());
        if (j < kDrafts) prev = drafts[j];
      }
      const AcceptResult r = through_acceptor
                                 ? acceptor.Verify(target_logits, drafts, q_rows, history)
                                 : acceptance_internal::AcceptStochasticWithRule(
                                       drafts, q_rows, p_rows, vocab, rng, rule);
      for (int j = 0; j < r.num_accepted; ++j) out.push_back(drafts[j]);
      out.push_back(r.next_token);
      last = out.back();
    }
    ++counts[out[0] * vocab + out[1]];
  }
  return counts;
}

// P(x0, x1) = p(x0 | 0) p(x1 | x0) under the target's processed distributions.
std::map<int, double> TargetPairProbs(const SamplingParams& params, const Bigram& target) {
  std::map<int, double> probs;
  const std::vector<float> first = Probs(params, target.Next(0));
  for (int32_t a = 0; a < target.vocab; ++a) {
    const std::vector<float> second = Probs(params, target.Next(a));
    for (int32_t b = 0; b < target.vocab; ++b) probs[a * target.vocab + b] = first[a] * second[b];
  }
  return probs;
}

class LosslessTest : public ::testing::Test {
 protected:
  static constexpr int kTrials = 30000;
  // Target and draft disagree substantially (different random bigrams), so q != p everywhere.
  const Bigram target_ = RandomBigram(6, 1.2f, 101);
  const Bigram draft_ = RandomBigram(6, 1.2f, 202);

  std::pair<double, int> Run(const SamplingParams& params, Drafts drafts, Rule rule,
                             bool through_acceptor, int num_drafts = 3) {
    const auto counts = CountFirstTwoTokens(params, target_, draft_, num_drafts, drafts, rule,
                                            through_acceptor, kTrials, 77);
    return ChiSquare(counts, TargetPairProbs(params, target_), kTrials);
  }
};

TEST_F(LosslessTest, FirstTwoTokensFollowTheTargetAtTemperatureOne) {
  const SamplingParams params;  // temperature 1, no filters
  const auto [stat, dof] = Run(params, Drafts::kSampled, Rule::kSpeculativeSampling, true);
  EXPECT_EQ(dof, 35);
  EXPECT_LT(stat, ChiSquareCritical999(dof));
}

TEST_F(LosslessTest, FirstTwoTokensFollowTheProcessedTargetWithTopKAndTemperature) {
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 4;
  const auto [stat, dof] = Run(params, Drafts::kSampled, Rule::kSpeculativeSampling, true);
  EXPECT_EQ(dof, 15);
  EXPECT_LT(stat, ChiSquareCritical999(dof));
}

TEST_F(LosslessTest, SingleDraftRoundsDrawTheBonusTokenFromTheLastTargetRow) {
  const SamplingParams params;
  const auto [stat, dof] = Run(params, Drafts::kSampled, Rule::kSpeculativeSampling, true, 1);
  EXPECT_LT(stat, ChiSquareCritical999(dof));
}

TEST_F(LosslessTest, DeterministicDraftsWithoutProbabilitiesAreLosslessToo) {
  const SamplingParams params;
  const auto [stat, dof] = Run(params, Drafts::kDeterministic, Rule::kSpeculativeSampling, true);
  EXPECT_LT(stat, ChiSquareCritical999(dof));
}

TEST_F(LosslessTest, RowApiWithTheRealRulePasses) {
  const SamplingParams params;
  const auto [stat, dof] = Run(params, Drafts::kSampled, Rule::kSpeculativeSampling, false);
  EXPECT_LT(stat, ChiSquareCritical999(dof));
}

// The power check: the same test rejects a broken acceptance rule, min(1, q/p).
TEST_F(LosslessTest, BrokenRuleDraftOverTargetIsRejected) {
  const SamplingParams params;
  const auto [stat, dof] = Run(params, Drafts::kSampled, Rule::kDraftOverTargetForTest, false);
  EXPECT_GT(stat, ChiSquareCritical999(dof));
}

// ---- greedy speculation equals greedy decoding ---------------------------------------------

TEST(AcceptorTest, GreedySpeculationReproducesGreedyDecodingWithPenaltiesAndMinTokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 1.3f;
  params.frequency_penalty = 0.5f;
  const Bigram target = RandomBigram(10, 2.0f, 7);
  const Bigram draft = Perturbed(target, 1.0f, 8);
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> eos = {0};
  constexpr int kMinTokens = 5, kLength = 24;

  // Plain greedy decoding with the Sampler.
  std::vector<int32_t> plain;
  {
    Sampler sampler(params, 1);
    TokenHistory history;
    history.AddPrompt(prompt);
    int32_t last = prompt.back();
    while (plain.size() < kLength) {
      const auto row = target.Next(last);
      std::vector<float> logits(row.begin(), row.end());
      const auto banned = static_cast<int32_t>(plain.size()) < kMinTokens
                              ? std::span<const int32_t>(eos)
                              : std::span<const int32_t>();
      last = sampler.Sample(logits, history, banned).id;
      history.AddOutput(last);
      plain.push_back(last);
    }
  }
  // Speculative: K = 4 greedy drafts from the draft model, verified by an Acceptor.
  std::vector<int32_t> spec;
  Acceptor acceptor(params, 1);
  TokenHistory history;
  history.AddPrompt(prompt);
  int32_t last = prompt.back();
  int rounds = 0;
  while (spec.size() < kLength) {
    std::vector<int32_t> drafts;
    std::vector<float> target_logits;
    for (int32_t j = 0, prev = last; j < 4; ++j) {
      const auto q = draft.Next(prev);
      drafts.push_back(static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin()));
      prev = drafts.back();
    }
    for (int32_t j = 0, prev = last; j <= 4; ++j) {
      const auto row = target.Next(prev);
      target_logits.insert(target_logits.end(), row.begin(), row.end());
      if (j < 4) prev = drafts[j];
    }
    const int32_t banned_positions = std::max(0, kMinTokens - static_cast<int32_t>(spec.size()));
    const AcceptResult r =
        acceptor.Verify(target_logits, drafts, {}, history, BannedIds{eos, banned_positions});
    for (int j = 0; j < r.num_accepted; ++j) spec.push_back(drafts[j]);
    spec.push_back(r.next_token);
    for (int j = 0; j <= r.num_accepted; ++j) history.AddOutput(spec[spec.size() - 1 - j]);
    last = spec.back();
    ++rounds;
  }
  spec.resize(kLength);
  EXPECT_EQ(spec, plain);
  EXPECT_LT(rounds, kLength);  // some drafts were accepted, or the test proves little
}

TEST(AcceptStochasticTest, IdenticalDistributionsAcceptEveryDraftAndDrawTheBonus) {
  const std::vector<float> q = {0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.0f};
  const std::vector<float> p = {0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.0f, 0.0f, 0.0f, 1.0f};
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) {
    const AcceptResult r = AcceptStochastic(std::vector<int32_t>{1, 0}, q, p, 3, rng);
    EXPECT_EQ(r.num_accepted, 2);
    EXPECT_EQ(r.next_token, 2);
  }
}

TEST(AcceptStochasticTest, DraftTheTargetRulesOutIsRejectedAndNeverRedrawn) {
  // p(d) = 0: always rejected; the residual max(0, p - q) has no mass at d.
  const std::vector<float> q = {0.0f, 1.0f, 0.0f};
  const std::vector<float> p = {0.5f, 0.0f, 0.5f, 1.0f, 0.0f, 0.0f};
  std::mt19937_64 rng(2);
  for (int i = 0; i < 100; ++i) {
    const AcceptResult r = AcceptStochastic(std::vector<int32_t>{1}, q, p, 3, rng);
    EXPECT_EQ(r.num_accepted, 0);
    EXPECT_NE(r.next_token, 1);
  }
}

// ---- token trees ------------------------------------------------------------------------

// A tree over a vocabulary of 6: the root's children 2, 0, 5 (best first); 2's children 1, 3;
// 0's child 4. parents index the drafts; target rows: the root's, then each draft's.
const std::vector<int32_t> kTreeTokens = {2, 0, 5, 1, 3, 4};
const std::vector<int32_t> kTreeParents = {-1, -1, -1, 0, 0, 1};
constexpr int32_t kTreeVocab = 6;

std::vector<float> TreeLogits() {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits((kTreeTokens.size() + 1) * kTreeVocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

std::vector<double> Softmax(std::span<const float> row) {
  const float max = *std::max_element(row.begin(), row.end());
  std::vector<double> p(row.size());
  double sum = 0;
  for (size_t i = 0; i < row.size(); ++i) sum += p[i] = std::exp(double{row[i]} - max);
  for (double& x : p) x /= sum;
  return p;
}

TEST(AcceptTreeTest, GreedyDescendsThroughTheChildTheTargetChooses) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Acceptor acceptor(greedy, 1);
  TokenHistory history;
  history.AddPrompt(std::vector<int32_t>{1});
  // Rows as one-hot-ish logits: the root picks 0 (draft 1), draft 1 picks 4 (draft 5), draft 5
  // picks 3 (a leaf: the bonus token).
  std::vector<float> logits((kTreeTokens.size() + 1) * kTreeVocab, 0.0f);
  auto pick = [&](int32_t row, int32_t id) { logits[row * kTreeVocab + id] = 5.0f; };
  pick(0, 0);
  pick(2, 4);
  pick(6, 3);
  for (int32_t row : {1, 3, 4, 5}) pick(row, 1);
  std::vector<int32_t> path;
  AcceptResult r =
      acceptor.VerifyTree(logits, kTreeTokens, kTreeParents, history, BannedIds{}, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_EQ(r.next_token, 3);
  // The root choosing 3 (no child has it): nothing accepted, 3 is the correction.
  logits[0 * kTreeVocab + 0] = 0.0f;
  pick(0, 3);
  r = acceptor.VerifyTree(logits, kTreeTokens, kTreeParents, history, BannedIds{}, &path);
  EXPECT_TRUE(path.empty());
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.next_token, 3);
  // min_tokens: the root may not emit 3, so it takes its next best, 2 (draft 0), whose row
  // picks 1 (draft 3), a leaf whose row picks 1 again.
  const std::vector<int32_t> banned = {3};
  logits[0 * kTreeVocab + 2] = 4.0f;
  r = acceptor.VerifyTree(logits, kTreeTokens, kTreeParents, history, BannedIds{banned, 1}, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(r.next_token, 1);
}

// The first committed token must follow the root's p, and the second, given a first that is a
// drafted child, that child's p: chi-square over 60,000 rounds each.
struct TreeChi {
  double first = 0, second = 0, critical_first = 0, critical_second = 0;
};

TreeChi TreeChiSquare(Rule rule) {
  acceptance_internal::acceptor_rule_for_test = rule;
  SamplingParams params;  // temperature 1, nothing filtered: p = softmax(logits)
  Acceptor acceptor(params, 11);
  TokenHistory history;
  history.AddPrompt(std::vector<int32_t>{1});
  const std::vector<float> logits = TreeLogits();
  auto row_p = [&](int32_t row) {
    return Softmax(std::span<const float>(logits).subspan(row * kTreeVocab, kTreeVocab));
  };
  constexpr int kRounds = 60000;
  std::vector<int> first(kTreeVocab, 0);
  std::map<int32_t, std::vector<int>> second;  // draft -> counts of the token after it
  std::vector<int32_t> path;
  for (int i = 0; i < kRounds; ++i) {
    const AcceptResult r =
        acceptor.VerifyTree(logits, kTreeTokens, kTreeParents, history, BannedIds{}, &path);
    const int32_t t1 = path.empty() ? r.next_token : kTreeTokens[path[0]];
    ++first[t1];
    if (!path.empty()) {
      std::vector<int>& c = second[path[0]];
      c.resize(kTreeVocab, 0);
      ++c[path.size() > 1 ? kTreeTokens[path[1]] : r.next_token];
    }
  }
  acceptance_internal::acceptor_rule_for_test = Rule::kSpeculativeSampling;
  auto chi = [](const std::vector<int>& counts, const std::vector<double>& p) {
    const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
    double stat = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double e = n * p[i];
      stat += (counts[i] - e) * (counts[i] - e) / e;
    }
    return stat;
  };
  TreeChi out;
  out.first = chi(first, row_p(0));
  out.critical_first = ChiSquareCritical999(kTreeVocab - 1);
  for (const auto& [draft, counts] : second) {
    out.second += chi(counts, row_p(draft + 1));
    out.critical_second += kTreeVocab - 1;  // degrees of freedom, for now
  }
  out.critical_second = ChiSquareCritical999(static_cast<int>(out.critical_second));
  return out;
}

TEST(AcceptTreeTest, SampledTokensFollowTheTargetThroughTheTree) {
  const TreeChi chi = TreeChiSquare(Rule::kSpeculativeSampling);
  EXPECT_LT(chi.first, chi.critical_first);
  EXPECT_LT(chi.second, chi.critical_second);
}

TEST(AcceptTreeTest, BrokenRuleIsRejected) {
  const TreeChi chi = TreeChiSquare(Rule::kDraftOverTargetForTest);
  EXPECT_GT(chi.first, chi.critical_first);
}

}  // namespace
}  // namespace specd
