#include "kernels/ref/vegas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ref/attention.h"

namespace specd::kernels::ref {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> RandomValues(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> values(n);
  for (double& v : values) v = dist(rng);
  return values;
}

// Sequences with contiguous K/V and the same K/V scattered over a paged cache behind shuffled
// block tables; every other slot holds NaN, so a read of a wrong slot shows up as NaN.
struct PagedSequences {
  AttentionShape shape;
  std::vector<int32_t> seq_lens;
  std::vector<std::vector<double>> keys, values;  // per sequence: [seq_len, num_kv_heads, d]
  int64_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  std::vector<double> k_cache, v_cache;

  PagedSequences(const AttentionShape& s, std::vector<int32_t> lens, std::mt19937_64& rng)
      : shape(s), seq_lens(std::move(lens)) {
    const int64_t row = s.num_kv_heads * s.head_dim;
    int64_t num_used = 0;
    for (int32_t len : seq_lens) {
      max_blocks_per_seq =
          std::max<int64_t>(max_blocks_per_seq, (len + s.block_size - 1) / s.block_size);
      num_used += (len + s.block_size - 1) / s.block_size;
    }
    std::vector<int32_t> free_blocks(num_used + 2);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    block_tables.assign(seq_lens.size() * max_blocks_per_seq, -1);
    k_cache.assign(free_blocks.size() * row * s.block_size, kNaN);
    v_cache = k_cache;
    size_t next_free = 0;
    for (size_t i = 0; i < seq_lens.size(); ++i) {
      const int32_t len = seq_lens[i];
      keys.push_back(RandomValues(len * row, rng));
      values.push_back(RandomValues(len * row, rng));
      std::vector<int64_t> slots(len);
      for (int32_t pos = 0; pos < len; ++pos) {
        int32_t& block = block_tables[i * max_blocks_per_seq + pos / s.block_size];
        if (pos % s.block_size == 0) block = free_blocks[next_free++];
        slots[pos] = static_cast<int64_t>(block) * s.block_size + pos % s.block_size;
      }
      WriteKvCache(keys[i].data(), row, values[i].data(), row, slots.data(), len, shape,
                   k_cache.data(), v_cache.data());
    }
  }
};

std::vector<int32_t> CuLens(const std::vector<int32_t>& q_lens) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : q_lens) cu.push_back(cu.back() + n);
  return cu;
}

// scale q.k of query `qi` (of q_len) and q head h against key j, on contiguous K.
double Logit(const std::vector<double>& q, const PagedSequences& ps, size_t seq, int64_t token,
             int64_t h, int64_t j) {
  const AttentionShape& s = ps.shape;
  const int64_t d = s.head_dim, kvh = h / (s.num_q_heads / s.num_kv_heads);
  double dot = 0;
  for (int64_t c = 0; c < d; ++c) {
    dot +=
        q[(token * s.num_q_heads + h) * d + c] * ps.keys[seq][(j * s.num_kv_heads + kvh) * d + c];
  }
  return dot * s.scale;
}

// Dense attention of sequence `seq`'s queries on contiguous K/V with an explicit mask: a query
// at `pos` sees key j iff keep(pos, j); masked logits are -inf before the softmax.
//   returns [q_len, num_q_heads, d] for the sequence's queries (rows first_token ...)
std::vector<double> MaskedDenseAttention(const std::vector<double>& q, const PagedSequences& ps,
                                         size_t seq, int64_t first_token, int64_t q_len,
                                         const std::function<bool(int64_t, int64_t)>& keep) {
  const AttentionShape& s = ps.shape;
  const int64_t d = s.head_dim, hq = s.num_q_heads, len = ps.seq_lens[seq];
  std::vector<double> out(q_len * hq * d, 0.0);
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t pos = len - q_len + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / s.num_kv_heads);
      std::vector<double> logits(len);
      double max_logit = -kInf;
      for (int64_t j = 0; j < len; ++j) {
        logits[j] = keep(pos, j) ? Logit(q, ps, seq, first_token + i, h, j) : -kInf;
        max_logit = std::max(max_logit, logits[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        const double p = std::exp(logits[j] - max_logit);  // exp(-inf) = 0: masked
        sum += p;
        for (int64_t c = 0; c < d; ++c) {
          if (p > 0)
            out[(i * hq + h) * d + c] += p * ps.values[seq][(j * s.num_kv_heads + kvh) * d + c];
        }
      }
      for (int64_t c = 0; c < d; ++c) out[(i * hq + h) * d + c] /= sum;
    }
  }
  return out;
}

double MaxAbsDiff(const double* a, const double* b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = std::abs(a[i] - b[i]);
    worst = std::isnan(diff) ? kInf : std::max(worst, diff);
  }
  return worst;
}

AttentionShape Shape(int64_t hq, int64_t hkv, int64_t d, int64_t block, int64_t window = 0) {
  return {hq, hkv, d, block, 1.0 / std::sqrt(static_cast<double>(d)), window};
}

TEST(VegasScoresTest, ScoresAreHeadAveragedLogitsOfTheFirstAndLastQuery) {
  std::mt19937_64 rng(1);
  const AttentionShape s = Shape(8, 2, 16, 16);
  const std::vector<int32_t> q_lens = {5, 1, 3}, cu = CuLens(q_lens);
  PagedSequences ps(s, {40, 70, 9}, rng);
  const int64_t row = s.num_q_heads * s.head_dim, tokens = cu.back(), stride = 72;
  const std::vector<double> q = RandomValues(tokens * row, rng);
  std::vector<double> out(tokens * row), dense(tokens * row);
  std::vector<double> scores(3 * 2 * stride, 1234.0);  // 1234: never written
  PagedVerifyAttentionWithScores(q.data(), row, ps.k_cache.data(), ps.v_cache.data(),
                                 ps.block_tables.data(), ps.max_blocks_per_seq, cu.data(),
                                 ps.seq_lens.data(), 3, s, out.data(), row, scores.data(), stride);
  PagedPrefillAttention(q.data(), row, ps.k_cache.data(), ps.v_cache.data(), ps.block_tables.data(),
                        ps.max_blocks_per_seq, cu.data(), ps.seq_lens.data(), 3, s, dense.data(),
                        row);
  EXPECT_LT(MaxAbsDiff(out.data(), dense.data(), tokens * row), 1e-12);
  for (size_t seq = 0; seq < 3; ++seq) {
    const int64_t prefix = ps.seq_lens[seq] - q_lens[seq];
    for (int r = 0; r < 2; ++r) {
      const int64_t token = cu[seq] + (r == 0 ? 0 : q_lens[seq] - 1);
      const double* got = scores.data() + (seq * 2 + r) * stride;
      for (int64_t j = 0; j < prefix; ++j) {
        double mean = 0;
        for (int64_t h = 0; h < s.num_q_heads; ++h) mean += Logit(q, ps, seq, token, h, j);
        mean /= static_cast<double>(s.num_q_heads);
        EXPECT_NEAR(got[j], mean, 1e-12) << "seq " << seq << " row " << r << " key " << j;
      }
      for (int64_t j = prefix; j < stride; ++j) EXPECT_EQ(got[j], 1234.0) << "key " << j;
    }
  }
  // A one-query run: both rows are that query's.
  EXPECT_EQ(std::vector<double>(scores.begin() + 2 * stride, scores.begin() + 3 * stride),
            std::vector<double>(scores.begin() + 3 * stride, scores.begin() + 4 * stride));
}

TEST(VegasScoresTest, KeysOutsideARowsWindowScoreMinusInfinity) {
  std::mt19937_64 rng(2);
  const AttentionShape s = Shape(4, 4, 16, 16, /*window=*/10);
  const std::vector<int32_t> q_lens = {4}, cu = CuLens(q_lens);
  PagedSequences ps(s, {50}, rng);
  const int64_t row = s.num_q_heads * s.head_dim, stride = 46;
  const std::vector<double> q = RandomValues(4 * row, rng);
  std::vector<double> out(4 * row), scores(2 * stride, 0.0);
  PagedVerifyAttentionWithScores(q.data(), row, ps.k_cache.data(), ps.v_cache.data(),
                                 ps.block_tables.data(), ps.max_blocks_per_seq, cu.data(),
                                 ps.seq_lens.data(), 1, s, out.data(), row, scores.data(), stride);
  // Query 0 at position 46 sees keys 37..46; the last query, at 49, keys 40..49.
  for (int64_t j = 0; j < 46; ++j) {
    EXPECT_EQ(std::isinf(scores[j]) && scores[j] < 0, j < 37) << "row 0 key " << j;
    EXPECT_EQ(std::isinf(scores[stride + j]) && scores[stride + j] < 0, j < 40)
        << "row 1 key " << j;
  }
}

TEST(VegasKeepCountTest, RatioWithFloorAndCap) {
  const VegasBudget b{0.07, 256, 100000};
  EXPECT_EQ(VegasKeepCount(100000, b), 7000);
  EXPECT_EQ(VegasKeepCount(1000, VegasBudget{0.07, 0, 100000}), 70);  // not 71 (rounding)
  EXPECT_EQ(VegasKeepCount(1001, VegasBudget{0.07, 0, 100000}), 71);  // 70.07 rounds up
  EXPECT_EQ(VegasKeepCount(1000, b), 256);                            // the floor
  EXPECT_EQ(VegasKeepCount(100, b), 100);                             // n < min_tokens: all
  EXPECT_EQ(VegasKeepCount(0, b), 0);
  EXPECT_EQ(VegasKeepCount(5000, VegasBudget{0.0, 16, 64}), 16);      // ratio 0: the floor
  EXPECT_EQ(VegasKeepCount(5000, VegasBudget{1.0, 16, 9000}), 5000);  // ratio 1: all
  EXPECT_EQ(VegasKeepCount(5000, VegasBudget{1.0, 16, 300}), 300);    // the cap
}

// Weights worked by hand: head 0 scores {0, ln 2} (softmax {1/3, 2/3}), head 1 {ln 3, 0}
// ({3/4, 1/4}), stored at a quarter of the raw value (to_raw 4); the mean is {13/24, 11/24}. A
// third head masked throughout adds 0 but still counts in the mean; keys past n are not read.
TEST(VegasWeightsTest, HeadAveragedPrefixWeightsByHand) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const float ln2 = std::log(2.0f) / 4, ln3 = std::log(3.0f) / 4;
  const std::vector<float> scores = {0.0f, ln2, kNaN, ln3, 0.0f, kNaN, -kInf, -kInf, kNaN};
  std::vector<float> out(3, -1.0f);
  HeadAveragedPrefixWeights(scores.data(), 2, 3, 2, 4.0f, out.data());
  EXPECT_NEAR(out[0], 13.0 / 24, 1e-7);
  EXPECT_NEAR(out[1], 11.0 / 24, 1e-7);
  EXPECT_EQ(out[2], -1.0f);  // past n: untouched
  HeadAveragedPrefixWeights(scores.data(), 3, 3, 2, 4.0f, out.data());
  EXPECT_NEAR(out[0], 13.0 / 36, 1e-7);
  EXPECT_NEAR(out[1], 11.0 / 36, 1e-7);
  HeadAveragedPrefixWeights(scores.data(), 3, 3, 0, 4.0f, out.data());  // n 0: nothing written
  EXPECT_NEAR(out[0], 13.0 / 36, 1e-7);
  HeadAveragedPrefixWeights(scores.data() + 6, 1, 3, 2, 1.0f, out.data());  // all masked: 0
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  // A masked key weighs 0 and the rest renormalise: one head {-inf, 0, ln 2 * 4}.
  const std::vector<float> partly = {-kInf, 0.0f, ln2};
  HeadAveragedPrefixWeights(partly.data(), 1, 3, 3, 4.0f, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 1.0 / 3, 1e-7);
  EXPECT_NEAR(out[2], 2.0 / 3, 1e-7);
}

// The selection a full sort gives: combined scores, sorted by (score descending, index
// ascending), the first k, ascending.
std::vector<int32_t> SortSelect(const std::vector<float>& scores, int64_t parts, int64_t stride,
                                int64_t pair, int64_t n, int64_t k) {
  const float* src = scores.data() + pair * 2 * parts * stride;
  std::vector<std::pair<float, int32_t>> items;
  for (int64_t j = 0; j < n; ++j) {
    float r0 = 0, r1 = 0;
    for (int64_t p = 0; p < parts; ++p) r0 += src[p * stride + j];
    for (int64_t p = 0; p < parts; ++p) r1 += src[(parts + p) * stride + j];
    items.push_back({(r0 + r1) * 0.5f, static_cast<int32_t>(j)});
  }
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<int32_t> kept;
  for (int64_t i = 0; i < k; ++i) kept.push_back(items[i].second);
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(VegasSelectTest, EqualsAFullSortWithTiesToTheLowerIndex) {
  std::mt19937_64 rng(3);
  // Scores on a coarse grid, so many tokens tie.
  std::uniform_int_distribution<int> grid(-20, 20);
  const int64_t parts = 3, stride = 3000, num_seqs = 4, num_layers = 2;
  const int64_t pairs = num_seqs * num_layers;
  std::vector<float> scores(pairs * 2 * parts * stride);
  for (float& v : scores) v = 0.25f * static_cast<float>(grid(rng));
  const std::vector<int32_t> lengths = {3000, 1777, 40, 0};
  const VegasBudget budget{0.07, 50, 2000};
  std::vector<int32_t> indices(pairs * 2000, -7), counts(pairs, -1);
  VegasSelectTopK(scores.data(), parts, stride, lengths.data(), num_seqs, pairs, budget,
                  indices.data(), 2000, counts.data());
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t n = lengths[pair % num_seqs], k = VegasKeepCount(n, budget);
    ASSERT_EQ(counts[pair], k) << "pair " << pair;
    const std::vector<int32_t> want = SortSelect(scores, parts, stride, pair, n, k);
    const std::vector<int32_t> got(indices.begin() + pair * 2000,
                                   indices.begin() + pair * 2000 + k);
    EXPECT_EQ(got, want) << "pair " << pair;
    if (k < 2000) {
      EXPECT_EQ(indices[pair * 2000 + k], -7) << "pair " << pair;  // untouched
    }
  }
}

TEST(VegasSelectTest, AllTiedKeepsTheLowestIndices) {
  const int64_t n = 100;
  std::vector<float> scores(2 * n, 1.5f);
  const int32_t length = n;
  std::vector<int32_t> indices(n), counts(1);
  VegasSelectTopK(scores.data(), 1, n, &length, 1, 1, VegasBudget{0.1, 0, n}, indices.data(), n,
                  counts.data());
  ASSERT_EQ(counts[0], 10);
  for (int32_t i = 0; i < 10; ++i) EXPECT_EQ(indices[i], i);
}

TEST(VegasSelectTest, EdgeCasesOfTheBudget) {
  std::mt19937_64 rng(4);
  const int64_t n = 500;
  std::vector<float> scores(2 * n);
  for (float& v : scores) v = static_cast<float>(RandomValues(1, rng)[0]);
  const int32_t length = n;
  std::vector<int32_t> indices(n), counts(1);
  auto select = [&](const VegasBudget& b) {
    VegasSelectTopK(scores.data(), 1, n, &length, 1, 1, b, indices.data(), n, counts.data());
    return std::vector<int32_t>(indices.begin(), indices.begin() + counts[0]);
  };
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(select({0.05, 1000, n}), all);  // n < min_tokens: everything
  EXPECT_EQ(select({1.0, 0, n}), all);      // ratio 1: everything
  EXPECT_EQ(select({0.0, 0, n}).size(), 0u);
  EXPECT_EQ(select({0.0, 7, n}), SortSelect(scores, 1, n, 0, n, 7));  // ratio 0: the floor
  EXPECT_EQ(select({0.5, 0, 9}), SortSelect(scores, 1, n, 0, n, 9));  // the cap
}

TEST(VegasSelectTest, ScoresCompareInTheFloatTotalOrder) {
  // -inf (a masked key) ranks last; -0 and +0 tie (the row sums start from +0).
  std::vector<float> scores = {-0.0f, 0.0f, -std::numeric_limits<float>::infinity(), -1.0f};
  scores.insert(scores.end(), scores.begin(), scores.end());  // row 1 = row 0
  const int32_t length = 4;
  std::vector<int32_t> indices(4), counts(1);
  VegasSelectTopK(scores.data(), 1, 4, &length, 1, 1, VegasBudget{0.5, 0, 4}, indices.data(), 4,
                  counts.data());
  ASSERT_EQ(counts[0], 2);
  EXPECT_EQ(indices[0], 0);
  EXPECT_EQ(indices[1], 1);
  VegasSelectTopK(scores.data(), 1, 4, &length, 1, 1, VegasBudget{0.75, 0, 4}, indices.data(), 4,
                  counts.data());
  EXPECT_EQ(std::vector<int32_t>(indices.begin(), indices.begin() + 3),
            (std::vector<int32_t>{0, 1, 3}));
}

TEST(VegasSparseTest, EqualsDenseAttentionWithTheComplementMasked) {
  std::mt19937_64 rng(5);
  const AttentionShape s = Shape(8, 2, 16, 16);
  const std::vector<int32_t> q_lens = {1, 3, 2}, cu = CuLens(q_lens);
  PagedSequences ps(s, {90, 61, 33}, rng);
  const std::vector<int32_t> recent = {80, 55, 31};  // <= each run's first position
  const int64_t stride = 64, row = s.num_q_heads * s.head_dim, tokens = cu.back();
  std::vector<int32_t> indices(3 * stride, -1), counts(3);
  std::vector<std::vector<bool>> listed(3);
  for (size_t seq = 0; seq < 3; ++seq) {
    listed[seq].assign(recent[seq], false);
    std::vector<int32_t> all(recent[seq]);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    counts[seq] = static_cast<int32_t>(recent[seq] / 4 + seq);  // 20, 14, 9 tokens
    std::sort(all.begin(), all.begin() + counts[seq]);
    for (int32_t i = 0; i < counts[seq]; ++i) {
      indices[seq * stride + i] = all[i];
      listed[seq][all[i]] = true;
    }
  }
  const std::vector<double> q = RandomValues(tokens * row, rng);
  std::vector<double> out(tokens * row);
  PagedSparseAttention(q.data(), row, ps.k_cache.data(), ps.v_cache.data(), ps.block_tables.data(),
                       ps.max_blocks_per_seq, cu.data(), ps.seq_lens.data(), indices.data(), stride,
                       counts.data(), recent.data(), 3, s, out.data(), row);
  for (size_t seq = 0; seq < 3; ++seq) {
    const std::vector<double> want = MaskedDenseAttention(
        q, ps, seq, cu[seq], q_lens[seq],
        [&](int64_t pos, int64_t j) { return j <= pos && (j >= recent[seq] || listed[seq][j]); });
    EXPECT_LT(MaxAbsDiff(out.data() + cu[seq] * row, want.data(), q_lens[seq] * row), 1e-12)
        << "seq " << seq;
    // The mask matters: dense attention over every key differs.
    const std::vector<double> dense = MaskedDenseAttention(
        q, ps, seq, cu[seq], q_lens[seq], [](int64_t pos, int64_t j) { return j <= pos; });
    EXPECT_GT(MaxAbsDiff(out.data() + cu[seq] * row, dense.data(), q_lens[seq] * row), 1e-3);
  }
}

TEST(VegasSparseTest, EveryPrefixTokenListedEqualsTheDenseReference) {
  std::mt19937_64 rng(6);
  const AttentionShape s = Shape(4, 1, 32, 16);
  const std::vector<int32_t> q_lens = {2, 1}, cu = CuLens(q_lens);
  PagedSequences ps(s, {45, 20}, rng);
  const std::vector<int32_t> recent = {40, 19}, counts = {40, 19};
  const int64_t stride = 40, row = s.num_q_heads * s.head_dim, tokens = cu.back();
  std::vector<int32_t> indices(2 * stride);
  for (int32_t j = 0; j < stride; ++j) indices[j] = j, indices[stride + j] = j;
  const std::vector<double> q = RandomValues(tokens * row, rng);
  std::vector<double> out(tokens * row), dense(tokens * row);
  PagedSparseAttention(q.data(), row, ps.k_cache.data(), ps.v_cache.data(), ps.block_tables.data(),
                       ps.max_blocks_per_seq, cu.data(), ps.seq_lens.data(), indices.data(), stride,
                       counts.data(), recent.data(), 2, s, out.data(), row);
  PagedPrefillAttention(q.data(), row, ps.k_cache.data(), ps.v_cache.data(), ps.block_tables.data(),
                        ps.max_blocks_per_seq, cu.data(), ps.seq_lens.data(), 2, s, dense.data(),
                        row);
  EXPECT_LT(MaxAbsDiff(out.data(), dense.data(), tokens * row), 1e-12);
}

}  // namespace
}  // namespace specd::kernels::ref
