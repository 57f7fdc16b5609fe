#include "kernels/ref/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Logits whose tempered (T = 1) probabilities relative to the largest are exactly `p` (up to
// exp/log rounding): l_i = log(p_i), with max p = 1.
std::vector<double> LogitsFor(const std::vector<double>& p) {
  std::vector<double> logits;
  for (double v : p) logits.push_back(v > 0 ? std::log(v) : -kInf);
  return logits;
}

std::vector<int32_t> KeptIds(const FilteredRow<double>& row) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < row.kept.size(); ++i) {
    if (row.kept[i] > 0) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

SampleParams Params(float temperature, int32_t top_k, float top_p, float min_p) {
  return SampleParams{temperature, top_k, top_p, min_p};
}

// Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter, key, expected).
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  struct Kat {
    Philox4x32Block counter;
    uint32_t key0, key1;
    Philox4x32Block expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& kat : kats) {
    const Philox4x32Block out = Philox4x32_10(kat.counter, kat.key0, kat.key1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], kat.expected.v[i]) << i;
  }
}

TEST(PhiloxTest, UniformIsTopBitsOfTheFirstTwoWords) {
  // seed 0, offset 0: the first KAT block, words 0x6627e8d5 0xe169c58d.
  EXPECT_EQ(PhiloxUniform(0, 0), static_cast<double>(0x6627e8d5e169c58dull >> 11) * 0x1.0p-53);
  EXPECT_EQ(PhiloxUniform(0, 0), 0.3990464708489645);
  // Counter words 0/1 come from the offset, key words from the seed.
  const Philox4x32Block b = Philox4x32_10({{7, 1, 0, 0}}, 5, 2);
  EXPECT_EQ(PhiloxUniform((uint64_t{2} << 32) | 5, (uint64_t{1} << 32) | 7),
            static_cast<double>(((uint64_t{b.v[0]} << 32) | b.v[1]) >> 11) * 0x1.0p-53);
  double sum = 0;
  for (uint64_t offset = 0; offset < 1000; ++offset) {
    const double u = PhiloxUniform(42, offset);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 1000, 0.5, 0.05);
  EXPECT_NE(PhiloxUniform(42, 0), PhiloxUniform(43, 0));
}

TEST(ArgmaxRowsTest, TiesGoToTheLowestIndexAndNanIsIgnored) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Rows of 4 with stride 5 (the fifth element is padding that must be ignored).
  const std::vector<double> logits = {1,     3,     3,     2,     9,  //
                                      nan,   0,     -1,    0,     9,  //
                                      -kInf, -kInf, -kInf, -kInf, 9};
  std::vector<int32_t> ids(3, -1);
  ArgmaxRows(logits.data(), 5, 3, 4, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 0}));
}

// The brute-force definition TopKRows must match: every row's (-value, id) pairs, NaN as -inf,
// sorted by std::pair's order (value descending, then id ascending); the first k ids.
template <typename T>
std::vector<int32_t> SortedTopK(const std::vector<T>& logits, int64_t stride, int32_t num_rows,
                                int32_t vocab, int32_t k) {
  std::vector<int32_t> ids;
  for (int32_t r = 0; r < num_rows; ++r) {
    std::vector<std::pair<T, int32_t>> pairs;
    for (int32_t i = 0; i < vocab; ++i) {
      const T v = logits[r * stride + i];
      pairs.emplace_back(std::isnan(v) ? std::numeric_limits<T>::infinity() : -v, i);
    }
    std::sort(pairs.begin(), pairs.end());
    for (int32_t j = 0; j < k; ++j) ids.push_back(pairs[j].second);
  }
  return ids;
}

template <typename T>
std::vector<int32_t> TopK(const std::vector<T>& logits, int64_t stride, int32_t num_rows,
                          int32_t vocab, int32_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(num_rows) * k, -1);
  TopKRows(logits.data(), stride, num_rows, vocab, k, ids.data());
  return ids;
}

// Rows of `vocab` values in a stride of vocab + 3 (padding 1e30 would win if read): odd rows
// uniform in [-8, 8), even rows drawn from a handful of values (ties everywhere), with NaN, -inf,
// +inf and both zeros.
template <typename T>
std::vector<T> RandomTopKRows(int32_t num_rows, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-8.0, 8.0);
  const T few[] = {1,
                   0.5,
                   T{0},
                   -T{0},
                   -2,
                   std::numeric_limits<T>::quiet_NaN(),
                   -std::numeric_limits<T>::infinity(),
                   std::numeric_limits<T>::infinity()};
  std::vector<T> logits(static_cast<size_t>(num_rows) * (vocab + 3), T{1e30});
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t i = 0; i < vocab; ++i) {
      logits[r * (vocab + 3) + i] = r % 2 == 1 ? static_cast<T>(uniform(rng)) : few[rng() % 8];
    }
  }
  return logits;
}

TEST(TopKRowsTest, MatchesSortedPairsOnRandomRowsWithTiesNanAndInf) {
  for (int32_t vocab : {1, 7, 1000}) {
    const auto logits32 = RandomTopKRows<float>(6, vocab, 11 + vocab);
    const auto logits64 = RandomTopKRows<double>(6, vocab, 17 + vocab);
    for (int32_t k : {1, 3, 16, vocab}) {
      if (k > vocab) continue;
      EXPECT_EQ(TopK(logits32, vocab + 3, 6, vocab, k),
                SortedTopK(logits32, vocab + 3, 6, vocab, k))
          << vocab << " " << k;
      EXPECT_EQ(TopK(logits64, vocab + 3, 6, vocab, k),
                SortedTopK(logits64, vocab + 3, 6, vocab, k))
          << vocab << " " << k;
    }
  }
}

TEST(TopKRowsTest, TiesGoToTheLowerIdAndZerosOfEitherSignTie) {
  const std::vector<double> logits = {1,    3,  3,   2,    3,  //
                                      5,    5,  5,   5,    5,  //
                                      -0.0, -1, 0.0, -0.0, 0.0};
  EXPECT_EQ(TopK(logits, 5, 3, 5, 3), (std::vector<int32_t>{1, 2, 4, 0, 1, 2, 0, 2, 3}));
  // k = vocab orders the whole row.
  EXPECT_EQ(TopK(logits, 5, 1, 5, 5), (std::vector<int32_t>{1, 2, 4, 3, 0}));
}

TEST(TopKRowsTest, NanAndNegInfRankLastAmongThemselvesById) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> logits = {nan, -kInf, 1, nan, -kInf, -3};
  EXPECT_EQ(TopK(logits, 6, 1, 6, 6), (std::vector<int32_t>{2, 5, 0, 1, 3, 4}));
  const std::vector<double> banned = {-kInf, nan, nan, -kInf};
  EXPECT_EQ(TopK(banned, 4, 1, 4, 2), (std::vector<int32_t>{0, 1}));
}

TEST(LogSoftmaxAtTest, ExpOfEveryIdSumsToOneAndOutOfRangeOrEmptyRowsAreNegInf) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Row 0: four finite logits, one NaN (ignored) and -inf; row 1: nothing finite.
  const std::vector<float> logits = {1.0f,  -2.0f, 3.5f,  0.25f, std::nanf(""), -kInf,
                                     -kInf, -kInf, -kInf, -kInf, -kInf,         -kInf};
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 6, 0, 1, 2, 3, 4, 5};
  std::vector<float> out(ids.size());
  ref::LogSoftmaxAt(logits.data(), 6, 2, 6, ids.data(), 6, out.data());
  double sum = 0;
  for (int j = 0; j < 4; ++j) sum += std::exp(double{out[j]});
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(out[2] - out[0], 2.5f, 1e-6);
  EXPECT_EQ(out[4], -kInf);  // NaN
  EXPECT_EQ(out[5], -kInf);  // id 6 is outside the row
  for (int j = 6; j < 12; ++j) EXPECT_EQ(out[j], -kInf);
}

TEST(ApplyPenaltiesTest, RepetitionOncePerTokenFrequencyPerOccurrence) {
  // Row 0: prompt {1, 1, 3}, output {1, 2, 2, 2, 7 (out of range), -1}.
  // Row 1: penalties off. Row 2: repetition only, prompt {0}, no output.
  std::vector<float> logits = {1, 2, -2, 4, 5, 1, 2, -2, 4, 5, -3, 2, -2, 4, 5};
  const std::vector<int32_t> prompt_ids = {1, 1, 3, 2, 0};
  const std::vector<int32_t> prompt_offsets = {0, 3, 4, 5};
  const std::vector<int32_t> output_ids = {1, 2, 2, 2, 7, -1, 0};
  const std::vector<int32_t> output_offsets = {0, 6, 7, 7};
  const std::vector<float> penalties = {2.0f, 0.5f, 0.25f, 1.0f, 0.0f, 0.0f, 1.5f, 0.0f, 0.0f};
  ApplyPenalties(logits.data(), 5, 3, 5, prompt_ids.data(), prompt_offsets.data(),
                 output_ids.data(), output_offsets.data(), penalties.data());
  // Token 1: in prompt twice and output once: 2 / 2 = 1, then - (0.25 * 1 + 0.5) = 0.25.
  // Token 2: output three times, negative: -2 * 2 = -4, then - (0.25 * 3 + 0.5) = -5.25.
  // Token 3: prompt only: 4 / 2 = 2. Tokens 0 and 4: untouched.
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[1], 0.25f);
  EXPECT_EQ(logits[2], -5.25f);
  EXPECT_EQ(logits[3], 2.0f);
  EXPECT_EQ(logits[4], 5.0f);
  EXPECT_EQ(std::vector<float>(logits.begin() + 5, logits.begin() + 10),
            (std::vector<float>{1, 2, -2, 4, 5}));
  EXPECT_EQ(std::vector<float>(logits.begin() + 10, logits.end()),
            (std::vector<float>{-4.5f, 2, -2, 4, 5}));
}

TEST(FilterRowTest, TopKKeepsTiesAtTheCut) {
  const std::vector<double> logits = {3, 2, 2, 1, 0};
  const FilteredRow<double> row = FilterRow(logits.data(), 5, Params(1, 2, 1, 0));
  EXPECT_EQ(KeptIds(row), (std::vector<int32_t>{0, 1, 2}));
  const FilteredRow<double> top1 = FilterRow(logits.data(), 5, Params(1, 1, 1, 0));
  EXPECT_EQ(KeptIds(top1), (std::vector<int32_t>{0}));
  const FilteredRow<double> all = FilterRow(logits.data(), 5, Params(1, 5, 1, 0));
  EXPECT_EQ(KeptIds(all), (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(FilterRowTest, MinPIsRelativeToTheMostProbableToken) {
  const std::vector<double> logits = LogitsFor({0.3, 1.0, 0.6, 0.45, 0.1});
  const FilteredRow<double> row = FilterRow(logits.data(), 5, Params(1, 0, 1, 0.5f));
  EXPECT_EQ(KeptIds(row), (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(row.kept_mass, 1.6, 1e-12);
  // min_p above 1 keeps the most probable token only.
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 5, Params(1, 0, 1, 3.0f))), (std::vector<int32_t>{1}));
}

TEST(FilterRowTest, TopPKeepsTokensWhoseMoreProbableMassIsBelowTheTarget) {
  // p = {1, 0.6, 0.4}: M = 2; G = 0, 1, 1.6.
  const std::vector<double> logits = LogitsFor({1.0, 0.6, 0.4});
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 3, Params(1, 0, 0.45f, 0))),
            (std::vector<int32_t>{0}));
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 3, Params(1, 0, 0.55f, 0))),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 3, Params(1, 0, 0.85f, 0))),
            (std::vector<int32_t>{0, 1, 2}));
  // top_p 0 still keeps the most probable token.
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 3, Params(1, 0, 0.0f, 0))), (std::vector<int32_t>{0}));
}

TEST(FilterRowTest, TopPKeepsTiesAtTheCut) {
  // p = {0.5, 1, 0.25, 0.5}: M = 2.25, P = 0.49 * 2.25 = 1.1025; both 0.5s have G = 1 < P,
  // although a prefix of a sorted order would stop after one of them.
  const std::vector<double> logits = LogitsFor({0.5, 1.0, 0.25, 0.5});
  const FilteredRow<double> row = FilterRow(logits.data(), 4, Params(1, 0, 0.49f, 0));
  EXPECT_EQ(KeptIds(row), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_NEAR(row.kept_mass, 2.0, 1e-12);
}

TEST(FilterRowTest, TopPIsTakenOverTheTopKSurvivors) {
  // p = {1, 0.8, 0.6, 0.4}; top-k 2 leaves M = 1.8, so top_p 0.5 (P = 0.9) drops token 1
  // (G = 1), which it would keep over the whole row (P = 1.4).
  const std::vector<double> logits = LogitsFor({1.0, 0.8, 0.6, 0.4});
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 4, Params(1, 2, 0.5f, 0))), (std::vector<int32_t>{0}));
  EXPECT_EQ(KeptIds(FilterRow(logits.data(), 4, Params(1, 0, 0.5f, 0))),
            (std::vector<int32_t>{0, 1}));
}

TEST(FilterRowTest, TemperatureScalesLogitGaps) {
  const std::vector<double> logits = {0.0, -1.0, -kInf};
  const FilteredRow<double> row = FilterRow(logits.data(), 3, Params(0.5f, 0, 1, 0));
  EXPECT_DOUBLE_EQ(row.kept[0], 1.0);
  EXPECT_DOUBLE_EQ(row.kept[1], std::exp(-2.0));
  EXPECT_EQ(row.kept[2], 0.0);
}

TEST(FilterRowTest, MarginIsSmallOnlyNearAThreshold) {
  const std::vector<double> logits = LogitsFor({1.0, 0.6, 0.4});
  EXPECT_GT(FilterRow(logits.data(), 3, Params(1, 0, 0.65f, 0)).filter_margin, 0.1);
  // top_p * M = 1.0000002 lies next to G = 1.
  EXPECT_LT(FilterRow(logits.data(), 3, Params(1, 0, 0.5000001f, 0)).filter_margin, 1e-6);
  EXPECT_LT(FilterRow(logits.data(), 3, Params(1, 0, 1, 0.6000001f)).filter_margin, 1e-6);
}

TEST(SampleRowTest, DrawsByCumulativeMassInTokenIdOrder) {
  // p = {0.25, 1, 0.5}: M = 1.75; intervals id 0 [0, 0.25), id 1 [0.25, 1.25), id 2 [1.25, 1.75).
  const std::vector<double> logits = LogitsFor({0.25, 1.0, 0.5});
  const SampleParams params = Params(1, 0, 1, 0);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.0), 0);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.1), 0);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.25 / 1.75 - 1e-9), 0);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.25 / 1.75 + 1e-9), 1);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.5), 1);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 1.25 / 1.75 + 1e-9), 2);
  EXPECT_EQ(SampleRow(logits.data(), 3, params, 0.999999), 2);
}

TEST(SampleRowTest, GreedyRowsTakeTheArgmax) {
  const std::vector<double> logits = {0.5, 2.0, 2.0, -1.0};
  EXPECT_EQ(SampleRow(logits.data(), 4, Params(0, 0, 1, 0), 0.99), 1);
  EXPECT_EQ(SampleRow(logits.data(), 4, Params(-1, 0, 1, 0), 0.0), 1);
  const std::vector<double> no_finite = {-kInf, -kInf};
  EXPECT_EQ(SampleRow(no_finite.data(), 2, Params(1, 0, 1, 0), 0.7), 0);
}

// Evenly spaced uniforms reproduce the filtered distribution: each kept token is drawn for a
// share of the grid within one grid step of its probability.
TEST(SampleRowTest, EvenlySpacedUniformsReproduceTheFilteredDistribution) {
  const std::vector<double> logits = {1.0, -0.5, 2.0, 0.25, -3.0, 2.0, 0.0, -1.0};
  const SampleParams params = Params(0.8f, 5, 0.9f, 0.05f);
  const FilteredRow<double> row = FilterRow(logits.data(), 8, params);
  const int n = 100000;
  std::vector<int> counts(8);
  for (int j = 0; j < n; ++j) ++counts[SampleRow(logits.data(), 8, params, (j + 0.5) / n)];
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(static_cast<double>(counts[i]) / n, row.kept[i] / row.kept_mass, 1.5 / n) << i;
  }
}

TEST(SampleRowTest, FloatAndDoubleAgreeAwayFromBoundaries) {
  const std::vector<double> logits = {1.0, -0.5, 2.0, 0.25, -3.0, 2.5, 0.0, -1.0};
  const std::vector<float> logits32(logits.begin(), logits.end());
  const SampleParams params = Params(1.3f, 6, 0.95f, 0.01f);
  for (double u : {0.01, 0.2, 0.4, 0.6, 0.8, 0.99}) {
    EXPECT_EQ(SampleRow(logits.data(), 8, params, u), SampleRow(logits32.data(), 8, params, u))
        << u;
  }
}

// A random row of 1-300 logits, in one of three styles (uniform; a 0.5 grid full of ties; a few
// peaks over a low floor), with NaN and -inf sprinkled in but at least one finite logit.
std::vector<double> RandomRow(std::mt19937_64& rng) {
  const int32_t vocab = 1 + static_cast<int32_t>(rng() % 300);
  std::uniform_real_distribution<double> uniform(-6.0, 6.0);
  const int style = static_cast<int>(rng() % 3);
  std::vector<double> row(vocab);
  for (double& v : row) {
    const double x = uniform(rng);
    v = style == 0 ? x : (style == 1 ? std::round(2 * x) / 2 : x * 0.5);
    if (rng() % 23 == 0) v = rng() % 2 == 0 ? -kInf : std::numeric_limits<double>::quiet_NaN();
  }
  if (style == 2) {
    for (int j = 0; j < 4; ++j) row[rng() % vocab] = 4 + uniform(rng) / 3;
  }
  row[rng() % vocab] = uniform(rng);
  return row;
}

// Greedy (temperature 0 or NaN) about one row in seven; every filter alone and combined.
SampleParams RandomParams(int32_t vocab, std::mt19937_64& rng) {
  const float temperatures[] = {
      0.0f, 0.5f, 0.8f, 1.0f, 1.3f, 2.0f, std::numeric_limits<float>::quiet_NaN()};
  const int32_t top_ks[] = {0, 0, 1, 5, 40, vocab, vocab + 10};
  const float top_ps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.01f, 0.999f};
  const float min_ps[] = {0.0f, 0.0f, 0.01f, 0.05f, 0.3f, 1.5f};
  return Params(temperatures[rng() % 7], top_ks[rng() % 7], top_ps[rng() % 6], min_ps[rng() % 6]);
}

template <typename T>
std::vector<T> Probs(const std::vector<T>& logits, const SampleParams& params) {
  std::vector<T> out(logits.size(), T{-1});
  ProcessedProbs(logits.data(), static_cast<int64_t>(logits.size()), 1,
                 static_cast<int32_t>(logits.size()), &params, out.data(),
                 static_cast<int64_t>(out.size()));
  return out;
}

// The processed distribution straight from the definition in sampling.h, in fp64 and O(vocab^2):
// each filter as worded there, top-p by summing G(p_i) for every token separately.
std::vector<double> DefinitionProbs(const std::vector<double>& logits, const SampleParams& q) {
  const size_t n = logits.size();
  std::vector<double> l(n), probs(n, 0.0);
  for (size_t i = 0; i < n; ++i) l[i] = std::isnan(logits[i]) ? -kInf : logits[i];
  const double m = *std::max_element(l.begin(), l.end());
  if (m == -kInf) return probs;
  if (!(q.temperature > 0) || !std::isfinite(m)) {
    probs[std::find(l.begin(), l.end(), m) - l.begin()] = 1;
    return probs;
  }
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = l[i] == -kInf ? 0 : std::exp((l[i] - m) / q.temperature);
  std::vector<bool> kept(n, true);
  std::vector<double> sorted = p;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  for (size_t i = 0; i < n; ++i) {
    if (q.min_p > 0 && p[i] < std::min(static_cast<double>(q.min_p), 1.0)) kept[i] = false;
    if (q.top_k > 0 && static_cast<size_t>(q.top_k) < n && p[i] < sorted[q.top_k - 1]) {
      kept[i] = false;
    }
  }
  if (q.top_p < 1) {
    const std::vector<bool> survivors = kept;
    double mass = 0;
    for (size_t j = 0; j < n; ++j) mass += survivors[j] ? p[j] : 0;
    for (size_t i = 0; i < n; ++i) {
      double g = 0;
      for (size_t j = 0; j < n; ++j) g += survivors[j] && p[j] > p[i] ? p[j] : 0;
      kept[i] = survivors[i] && (g < q.top_p * mass || g == 0);
    }
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += kept[i] ? p[i] : 0;
  for (size_t i = 0; i < n; ++i) probs[i] = kept[i] ? p[i] / total : 0;
  return probs;
}

bool Greedy(const std::vector<double>& logits, const SampleParams& params) {
  double m = -kInf;
  for (double v : logits) m = std::isnan(v) ? m : std::max(m, v);
  return !(params.temperature > 0) || !std::isfinite(m);
}

TEST(ProcessedProbsTest, SampledRowsSumToOneOverTheFilteredTokens) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<double> logits = RandomRow(rng);
    const auto vocab = static_cast<int32_t>(logits.size());
    SampleParams params = RandomParams(vocab, rng);
    params.temperature = 0.7f;
    const std::vector<double> probs = Probs(logits, params);
    const std::vector<float> logits32(logits.begin(), logits.end());
    const std::vector<float> probs32 = Probs(logits32, params);
    const FilteredRow<double> row = FilterRow(logits.data(), vocab, params);
    double sum = 0, sum32 = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(probs[i] > 0, row.kept[i] > 0) << trial << " " << i;
      EXPECT_DOUBLE_EQ(probs[i], row.kept[i] / row.kept_mass);
      sum += probs[i];
      sum32 += probs32[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12) << trial;
    // The fp32 reference normalises by a mass it summed in fp32 (up to a few thousand terms):
    // its rounding, which differs between compilers (g++ and clang contract differently), is
    // worth some 1e-6 (clang 14's ASan build: 1.24e-6).
    EXPECT_NEAR(sum32, 1.0, 1e-5) << trial;
  }
}

TEST(ProcessedProbsTest, GreedyRowsAreOneHotAndRowsWithoutTokensAreZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> logits = {0.5, 2.0, nan, 2.0, -1.0};
  for (float temperature : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(Probs(logits, Params(temperature, 2, 0.5f, 0.1f)),
              (std::vector<double>{0, 1, 0, 0, 0}));
  }
  // No finite maximum with temperature > 0: greedy on the first +inf.
  const std::vector<double> inf = {0.5, kInf, nan, kInf};
  EXPECT_EQ(Probs(inf, Params(1, 0, 1, 0)), (std::vector<double>{0, 1, 0, 0}));
  // All -inf / NaN, greedy or not: zeros (SampleRow would return id 0).
  const std::vector<double> empty = {-kInf, nan, -kInf};
  EXPECT_EQ(Probs(empty, Params(0, 0, 1, 0)), (std::vector<double>(3, 0.0)));
  EXPECT_EQ(Probs(empty, Params(1, 2, 0.9f, 0)), (std::vector<double>(3, 0.0)));
  const std::vector<float> empty32 = {-INFINITY, NAN};
  EXPECT_EQ(Probs(empty32, Params(1, 0, 1, 0)), (std::vector<float>(2, 0.0f)));
}

TEST(ProcessedProbsTest, MatchesTheDefinitionComputedDirectlyInFp64) {
  std::mt19937_64 rng(11);
  int compared = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const std::vector<double> logits = RandomRow(rng);
    const auto vocab = static_cast<int32_t>(logits.size());
    const SampleParams params = RandomParams(vocab, rng);
    // A filter decision at its threshold may go either way under different summation orders.
    if (!Greedy(logits, params) && FilterRow(logits.data(), vocab, params).filter_margin < 1e-4) {
      continue;
    }
    ++compared;
    const std::vector<double> expected = DefinitionProbs(logits, params);
    const std::vector<double> probs = Probs(logits, params);
    const std::vector<float> probs32 =
        Probs(std::vector<float>(logits.begin(), logits.end()), params);
    for (int32_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(probs[i], expected[i], 1e-12) << trial << " " << i;
      ASSERT_NEAR(probs32[i], expected[i], 1e-6) << trial << " " << i;
      ASSERT_EQ(probs32[i] == 0, expected[i] == 0) << trial << " " << i;
    }
  }
  EXPECT_GT(compared, 800);
}

// The tie to the sampling definition: drawing from the processed row by the same inverse CDF and
// the same u gives SampleRow's token, except where the two cumulative sums (of p_i and of p_i / M)
// round to opposite sides of u * total; the tokens then neighbour each other in the kept order.
// Returns how many of its 10000 trials drew a different (neighbouring) token.
template <typename T>
int DrawsFromProcessedProbsThatDifferFromSampleRow() {
  std::mt19937_64 rng(sizeof(T));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int trials = 10000;
  int mismatches = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const std::vector<double> row64 = RandomRow(rng);
    const std::vector<T> logits(row64.begin(), row64.end());
    const auto vocab = static_cast<int32_t>(logits.size());
    const SampleParams params = RandomParams(vocab, rng);
    const double u = uniform(rng);
    const std::vector<T> probs = Probs(logits, params);
    const int32_t expected = SampleRow(logits.data(), vocab, params, u);
    const int32_t drawn = InverseCdf(probs.data(), vocab, u);
    if (drawn == expected) continue;
    ++mismatches;
    EXPECT_GE(drawn, 0) << trial;
    EXPECT_GT(probs[expected], 0) << trial;
    EXPECT_GT(probs[drawn], 0) << trial;
    for (int32_t i = std::min(drawn, expected) + 1; i < std::max(drawn, expected); ++i) {
      EXPECT_EQ(probs[i], 0) << trial << ": kept token " << i << " between " << drawn << " and "
                             << expected;
    }
  }
  return mismatches;
}

TEST(ProcessedProbsTest, InverseCdfDrawsSampleRowsTokenInFp64) {
  EXPECT_LE(DrawsFromProcessedProbsThatDifferFromSampleRow<double>(), 10);  // 0.1% of trials
}

TEST(ProcessedProbsTest, InverseCdfDrawsSampleRowsTokenInFp32) {
  EXPECT_LE(DrawsFromProcessedProbsThatDifferFromSampleRow<float>(), 10);  // 0.1% of trials
}

TEST(ProcessedProbsTest, InPlaceEqualsOutOfPlace) {
  std::mt19937_64 rng(5);
  const int32_t num_rows = 8, vocab = 100, stride = 103;
  std::vector<float> logits(num_rows * stride, 1e30f);
  std::vector<SampleParams> params;
  for (int32_t r = 0; r < num_rows; ++r) {
    std::vector<double> row;
    while (static_cast<int32_t>(row.size()) < vocab) row = RandomRow(rng);
    std::copy(row.begin(), row.begin() + vocab, logits.begin() + r * stride);
    params.push_back(RandomParams(vocab, rng));
  }
  std::vector<float> out(num_rows * vocab);
  ProcessedProbs(logits.data(), stride, num_rows, vocab, params.data(), out.data(), vocab);
  ProcessedProbs(logits.data(), stride, num_rows, vocab, params.data(), logits.data(), stride);
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t i = 0; i < vocab; ++i) ASSERT_EQ(logits[r * stride + i], out[r * vocab + i]);
    for (int32_t i = vocab; i < stride; ++i) ASSERT_EQ(logits[r * stride + i], 1e30f);  // padding
  }
}

TEST(InverseCdfTest, LastPositiveWeightOrMinusOne) {
  const std::vector<double> weights = {0, 0.5, 0, 0.5, 0};
  EXPECT_EQ(InverseCdf(weights.data(), 5, 0.0), 1);
  EXPECT_EQ(InverseCdf(weights.data(), 5, 0.4999), 1);
  EXPECT_EQ(InverseCdf(weights.data(), 5, 0.5), 3);
  EXPECT_EQ(InverseCdf(weights.data(), 5, 1.0), 3);  // u * sum at the total
  const std::vector<double> zeros(3, 0.0);
  EXPECT_EQ(InverseCdf(zeros.data(), 3, 0.5), -1);
}

TEST(ScatterRowsTest, CopiesEachRowToItsSlotAndNothingElse) {
  // src: 3 rows of 4 in a stride of 5; dst: 5 rows of stride 6.
  std::vector<double> src(15), dst(30, -1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<double>(i);
  const std::vector<int32_t> dst_rows = {4, 0, 2};
  ScatterRows(src.data(), 5, 3, 4, dst_rows.data(), dst.data(), 6);
  for (int32_t r = 0; r < 5; ++r) {
    for (int32_t c = 0; c < 6; ++c) {
      const auto from = std::find(dst_rows.begin(), dst_rows.end(), r) - dst_rows.begin();
      const double expected = c < 4 && from < 3 ? src[from * 5 + c] : -1;
      EXPECT_EQ(dst[r * 6 + c], expected) << r << " " << c;
    }
  }
}

TEST(RawLogprobTest, IsLogSoftmaxOfTheUntemperedRow) {
  const std::vector<double> logits = {1.0, 2.0, 3.0};
  const double log_z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(RawLogprob(logits.data(), 3, 0), 1.0 - log_z, 1e-12);
  EXPECT_NEAR(RawLogprob(logits.data(), 3, 2), 3.0 - log_z, 1e-12);
}

}  // namespace
}  // namespace specd::kernels::ref
