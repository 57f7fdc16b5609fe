// Unit tests of NSA attention's rules on a hand-made KV cache: the window holds exactly
// window_size keys, a block becomes visible to compression exactly at p = (c + 1) * B - 1, the
// selected branch reads its blocks up to the query only, and the block selection forces
// {0, i - 1, i} and keeps the top S. Queries are zero, so every branch averages the values of
// the keys it attends, and a value's second column (its position) tells which keys those were.
#include "engine/model/nsa_attention.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
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

}  // namespace
}  // namespace specd
