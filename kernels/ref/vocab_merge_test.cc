#include "kernels/ref/vocab_merge.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ref/sampling.h"

namespace specd::kernels::ref {
namespace {

// Rows of `vocab` logits drawn from a few values, so equal logits in different shards are
// common (the tie rule across shards is what a per-shard merge gets wrong), plus NaN and -inf.
std::vector<float> TiedLogits(int32_t rows, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(0, 12);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) {
    const int l = level(rng);
    x = l == 0   ? std::numeric_limits<float>::quiet_NaN()
        : l == 1 ? -std::numeric_limits<float>::infinity()
                 : 0.5f * static_cast<float>(l);
  }
  return logits;
}

// Splits each row into `world` shards of S = ceil(vocab / world) ids (the last ones may be short
// or empty, as MakeTpShard cuts the LM head), merges them and returns the merged rows.
std::vector<float> Merge(const std::vector<float>& full, int32_t rows, int32_t vocab, int32_t world,
                         int32_t k) {
  const int32_t shard = (vocab + world - 1) / world;
  std::vector<int32_t> pairs(static_cast<size_t>(world) * rows * k * 2);
  for (int32_t w = 0; w < world; ++w) {
    const int32_t begin = std::min(vocab, w * shard);
    const int32_t local = std::min(vocab - begin, shard);
    ShardCandidates(full.data() + begin, vocab, rows, local, k, begin,
                    pairs.data() + static_cast<size_t>(w) * rows * k * 2);
  }
  std::vector<float> merged(full.size(), 1.0f);
  ScatterCandidates(pairs.data(), world, rows, k, vocab, merged.data(), vocab);
  return merged;
}

// The merged rows' argmax and k best equal the full rows', for shards of every size including
// an empty one (vocab 9 over 4 ranks: 3, 3, 3, 0).
TEST(VocabMergeRefTest, ArgmaxAndTopKEqualTheFullRows) {
  struct Case {
    int32_t vocab, world, k;
  };
  for (const Case c : {Case{9, 4, 1}, Case{9, 4, 3}, Case{1000, 2, 1}, Case{1000, 2, 16},
                       Case{1001, 8, 5}, Case{64, 3, 16}}) {
    constexpr int32_t kRows = 40;
    const std::vector<float> full = TiedLogits(kRows, c.vocab, 11 + c.vocab + c.world);
    const std::vector<float> merged = Merge(full, kRows, c.vocab, c.world, c.k);
    std::vector<int32_t> want(kRows), got(kRows);
    ArgmaxRows(full.data(), c.vocab, kRows, c.vocab, want.data());
    ArgmaxRows(merged.data(), c.vocab, kRows, c.vocab, got.data());
    EXPECT_EQ(got, want) << "vocab " << c.vocab << " world " << c.world;
    const int32_t k = std::min(c.k, c.vocab);
    std::vector<int32_t> want_k(kRows * k), got_k(kRows * k);
    TopKRows(full.data(), c.vocab, kRows, c.vocab, k, want_k.data());
    TopKRows(merged.data(), c.vocab, kRows, c.vocab, k, got_k.data());
    // Candidates that are -inf or NaN in the full row rank by id among all such ids; the merged
    // row keeps only some of them, so compare the finite ones.
    for (int32_t r = 0; r < kRows; ++r) {
      for (int32_t j = 0; j < k; ++j) {
        const float v = full[static_cast<size_t>(r) * c.vocab + want_k[r * k + j]];
        if (!std::isfinite(v)) break;
        ASSERT_EQ(got_k[r * k + j], want_k[r * k + j])
            << "vocab " << c.vocab << " world " << c.world << " row " << r << " rank " << j;
      }
    }
  }
}

// Each rank's slots: its best first with global ids, and (-inf, -1) past its logits.
TEST(VocabMergeRefTest, ShardSlotsCarryGlobalIdsAndEmptyMarkers) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  std::vector<int32_t> pairs(4 * 2);
  ShardCandidates(logits.data(), 3, 1, 3, 4, 100, pairs.data());
  EXPECT_EQ(pairs[1], 101);
  EXPECT_EQ(pairs[3], 102);
  EXPECT_EQ(pairs[5], 100);
  EXPECT_EQ(pairs[7], kVocabMergeNoId);
  EXPECT_EQ(std::bit_cast<float>(pairs[0]), 3.0f);
  EXPECT_EQ(std::bit_cast<float>(pairs[6]), -std::numeric_limits<float>::infinity());
  std::vector<float> out(200, 5.0f);
  ScatterCandidates(pairs.data(), 1, 1, 4, 200, out.data(), 200);
  EXPECT_EQ(out[101], 3.0f);
  EXPECT_EQ(out[100], 1.0f);
  EXPECT_EQ(out[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[199], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace specd::kernels::ref
