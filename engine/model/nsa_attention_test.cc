// Unit tests of NSA attention's rules on a hand-made KV cache (and the compressed entries a
// Model's cache keeps against recomputing them): the window holds exactly
// window_size keys, a block becomes visible to compression exactly at p = (c + 1) * B - 1, the
// selected branch reads its blocks up to the query only, and the block selection forces
// {0, i - 1, i} and keeps the top S. Queries are zero, so every branch averages the values of
// the keys it attends, and a value's second column (its position) tells which keys those were.
#include "engine/model/nsa_attention.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace specd {
namespace {

constexpr int32_t kBlock = 32;   // NSA block
constexpr int32_t kWindow = 64;  // window_size
constexpr int32_t kHeadDim = 2;
constexpr int32_t kKvBlock = 16;  // paged-KV block, unlike the NSA block
constexpr int32_t kNumKvBlocks = 32;

enum Branch { kCompressed = 0, kSelected = 1, kWindowed = 2 };

class NsaRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto kv = CpuKvCache::Create(KvCacheSpec{1, 1, kHeadDim, kKvBlock, kNumKvBlocks});
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    // Paged blocks in reverse order, so positions are not laid out contiguously.
    table_.resize(kNumKvBlocks);
    std::iota(table_.rbegin(), table_.rend(), 0);
    for (int32_t j = 0; j < kNumKvBlocks * kKvBlock; ++j) {
      float* key = kv_->KeySlot(0, table_[j / kKvBlock], j % kKvBlock);
      float* value = kv_->ValueSlot(0, table_[j / kKvBlock], j % kKvBlock);
      key[0] = key[1] = 0.0f;
      value[0] = 1.0f;
      value[1] = static_cast<float>(j);
    }
  }

  // One query head, one KV head, a zero query at `pos`, only `branch`'s gate open. Returns the
  // output [head_dim]: (gate, gate * mean attended position).
  std::vector<float> Attend(int32_t pos, Branch branch, int32_t block_counts = 8) {
    NsaAttention attention(NsaShape{1, 1, kHeadDim, NsaConfig{kBlock, block_counts, kWindow}}, 1);
    const std::vector<int32_t> positions = {pos}, seq_of_token = {0};
    const std::vector<std::span<const int32_t>> tables = {table_};
    const std::vector<float> q(kHeadDim, 0.0f);
    std::vector<float> gates(3, -200.0f);  // sigmoid: 0 (closed)
    gates[branch] = 200.0f;                // sigmoid: 1 (open)
    std::vector<float> out(kHeadDim, -1.0f);
    ThreadPool pool(1);
    attention.Run(pool, TokenLayout{positions, seq_of_token, tables}, q.data(), kHeadDim,
                  gates.data(), 3, *kv_, 0, out.data());
    selection_.assign(attention.LastTokenSelection(0, 0).begin(),
                      attention.LastTokenSelection(0, 0).end());
    return out;
  }

  std::unique_ptr<CpuKvCache> kv_;
  std::vector<int32_t> table_;
  std::vector<int32_t> selection_;
};

TEST_F(NsaRulesTest, WindowHoldsExactlyWindowSizeKeys) {
  for (int32_t pos : {63, 64, 100, 511}) {
    const std::vector<float> out = Attend(pos, kWindowed);
    EXPECT_FLOAT_EQ(out[0], 1.0f);
    // Keys pos - 63 .. pos: mean pos - 31.5 (65 keys would give pos - 32, 63 keys pos - 31).
    EXPECT_NEAR(out[1], pos - (kWindow - 1) / 2.0f, 1e-3) << "pos " << pos;
  }
  const std::vector<float> early = Attend(10, kWindowed);  // keys 0 .. 10
  EXPECT_NEAR(early[1], 5.0f, 1e-5);
}

TEST_F(NsaRulesTest, BlockIsCompressedExactlyWhenItsLastTokenIsReached) {
  // Before the first block completes there is nothing to compress: the branch gives zeros.
  const std::vector<float> none = Attend(kBlock - 2, kCompressed);
  EXPECT_EQ(none[0], 0.0f);
  EXPECT_EQ(none[1], 0.0f);
  for (int32_t c = 0; c < 4; ++c) {
    const int32_t last = (c + 1) * kBlock - 1;
    // At p = last, blocks 0 .. c are visible: the mean of their mean positions is last / 2.
    const std::vector<float> at = Attend(last, kCompressed);
    EXPECT_FLOAT_EQ(at[0], 1.0f) << "c " << c;
    EXPECT_NEAR(at[1], last / 2.0f, 1e-4) << "c " << c;
    if (c == 0) continue;
    // One token earlier, block c is not yet visible: blocks 0 .. c - 1, mean (last - 32) / 2.
    const std::vector<float> before = Attend(last - 1, kCompressed);
    EXPECT_NEAR(before[1], (last - kBlock) / 2.0f, 1e-4) << "c " << c;
  }
}

TEST_F(NsaRulesTest, SelectedBranchReadsItsBlocksUpToTheQuery) {
  // p = 100 lies in block 3 (positions 96 .. 127); with S = 8 every block 0 .. 3 is selected,
  // the own block truncated at 100: keys 0 .. 100, mean 50.
  const std::vector<float> out = Attend(100, kSelected);
  EXPECT_EQ(selection_, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_NEAR(out[1], 50.0f, 1e-4);
  // S = 2 at p = 100: the forced blocks alone are {0, 2, 3}; the top 2 by score among equal
  // forced scores keep the lower indices 0 and 2.
  const std::vector<float> two = Attend(100, kSelected, /*block_counts=*/2);
  EXPECT_EQ(selection_, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(two[1], 47.5f, 1e-4);  // keys 0 .. 31 and 64 .. 95
}

// A Model's cache keeps each complete block's means in the page of its last position
// (KvCacheSpec::compressed_block_size): computed once, by the pass that writes that position.
// Through a prefill chunk, decode steps, verification chunks whose drafts are rewritten (a block
// completed by a rejected draft), and a second sequence reusing the first's pages (a prefix-cache
// hit), the output equals the same attention over a cache without them, which recomputes every
// block on every call.
TEST(NsaCompressedEntriesTest, KeptMeansEqualMeansRecomputedEveryCall) {
  constexpr int32_t kHeads = 4, kKvHeads = 2, kDim = 4, kBlocks = 16;
  KvCacheSpec spec{1, kKvHeads, kDim, kKvBlock, kBlocks};
  auto plain = CpuKvCache::Create(spec);
  spec.compressed_block_size = kBlock;
  auto kept = CpuKvCache::Create(spec);
  ASSERT_TRUE(plain.ok() && kept.ok());
  ASSERT_EQ(spec.compressed_per_block(), 1);
  std::vector<int32_t> table(kBlocks);
  std::iota(table.rbegin(), table.rend(), 0);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // New K/V at positions [from, to) of the sequence over `t`.
  auto write = [&](int32_t from, int32_t to, std::span<const int32_t> t) {
    for (int32_t j = from; j < to; ++j) {
      for (int32_t x = 0; x < kKvHeads * kDim; ++x) {
        const float k = normal(rng), v = normal(rng);
        for (CpuKvCache* c : {plain->get(), kept->get()}) {
          c->KeySlot(0, t[j / kKvBlock], j % kKvBlock)[x] = k;
          c->ValueSlot(0, t[j / kKvBlock], j % kKvBlock)[x] = v;
        }
      }
    }
  };
  const NsaShape shape{kHeads, kKvHeads, kDim, NsaConfig{kBlock, 4, kWindow}};
  NsaAttention on_plain(shape, 1), on_kept(shape, 1);
  ThreadPool pool(1);
  // One chunk of positions [from, to) of a sequence over `t`; the outputs on both caches.
  auto run = [&](int32_t from, int32_t to, std::span<const int32_t> t) {
    std::vector<int32_t> positions, seq_of_token;
    for (int32_t p = from; p < to; ++p) {
      positions.push_back(p);
      seq_of_token.push_back(0);
    }
    const std::vector<std::span<const int32_t>> tables = {t};
    const TokenLayout layout{positions, seq_of_token, tables};
    std::vector<float> q(positions.size() * kHeads * kDim), gates(positions.size() * kHeads * 3);
    for (float& x : q) x = normal(rng);
    for (float& x : gates) x = normal(rng);
    std::vector<float> a(q.size()), b(q.size());
    on_plain.Run(pool, layout, q.data(), kHeads * kDim, gates.data(), kHeads * 3, **plain, 0,
                 a.data());
    on_kept.Run(pool, layout, q.data(), kHeads * kDim, gates.data(), kHeads * 3, **kept, 0,
                b.data());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_FLOAT_EQ(b[i], a[i]) << "chunk [" << from << ", " << to << "), element " << i;
    }
  };
  write(0, 40, table);
  run(0, 40, table);  // a prefill chunk: block 0 completes
  for (int32_t p = 40; p < 90; ++p) {
    write(p, p + 1, table);
    run(p, p + 1, table);  // decode: block 1 completes at 63
  }
  write(90, 98, table);
  run(90, 98, table);     // a verification chunk: its drafts complete block 2 at 95
  write(93, 101, table);  // drafts from 93 on were rejected: rewritten, block 2 again
  run(93, 101, table);
  for (int32_t p = 101; p < 140; ++p) {
    write(p, p + 1, table);
    run(p, p + 1, table);
  }
  // A second sequence whose first 8 pages (positions 0 .. 127) are the first's (the first holds
  // 9): its first pass starts at 128 and reads blocks 0 .. 3 from the pages it reuses.
  std::vector<int32_t> second(table.begin(), table.begin() + 8);
  second.insert(second.end(), table.begin() + 9, table.end());
  write(128, 150, second);
  run(128, 150, second);
}

TEST(NsaSelectBlocksTest, ForcesFirstPreviousAndOwnBlockThenKeepsTheTopS) {
  // Own block 10, S 4: 0, 9 and 10 forced (score 16), then the best of the rest (block 5).
  std::vector<float> scores = {0.1f, 2.0f, 0.5f, 1.0f, 0.2f, 7.0f, 3.0f, 0.0f, 0.0f, 0.3f, 0.0f};
  EXPECT_EQ(NsaSelectBlocks(scores, 10, 16, 4), (std::vector<int32_t>{0, 5, 9, 10}));
  EXPECT_EQ(scores[0], 16.0f);
  EXPECT_EQ(scores[9], 16.0f);
  EXPECT_EQ(scores[10], 16.0f);
  // S 6: blocks 5, 6 and 1 join (scores 7, 3, 2).
  EXPECT_EQ(NsaSelectBlocks(scores, 10, 16, 6), (std::vector<int32_t>{0, 1, 5, 6, 9, 10}));
}

TEST(NsaSelectBlocksTest, KeepsEveryCandidateWhileTheyAreAtMostS) {
  std::vector<float> scores(8, 0.0f);
  EXPECT_EQ(NsaSelectBlocks(scores, 7, 16, 8), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  std::vector<float> one(1, 0.0f);
  EXPECT_EQ(NsaSelectBlocks(one, 0, 16, 8), (std::vector<int32_t>{0}));
}

// The margin is the gap between the S-th and (S + 1)-th candidate scores after the forced
// entries: how far a query's selection is from another one.
TEST(NsaSelectBlocksTest, TheMarginIsTheGapAtTheSthScore) {
  const std::vector<float> scores = {0.1f, 2.0f, 0.5f, 1.0f, 0.2f, 7.0f,
                                     3.0f, 0.0f, 0.0f, 0.3f, 0.0f};
  auto margin = [&](int32_t count) {
    std::vector<float> s = scores;
    float m = 0;
    NsaSelectBlocks(s, 10, 16, count, &m);
    return m;
  };
  EXPECT_FLOAT_EQ(margin(4), 4.0f);  // forced 0, 9, 10 (16), then 5 (7); next best 6 (3)
  EXPECT_FLOAT_EQ(margin(6), 1.0f);  // block 1 (2) over block 3 (1)
  EXPECT_EQ(margin(11), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace specd
