// SSV strategies on NSA attention (engine/base/ssv.h), on a hand-made KV cache whose values
// carry their position (value = (1, position)), so the selected branch's output tells which keys
// a query attended. With zero queries every visible block scores the same, and the selection is
// the forced blocks {0, i - 1, i} plus the lowest other indices; the expected selections, key
// sets and counts below are worked out by hand from NSA's rules.
#include "engine/base/ssv.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "engine/model/nsa_attention.h"

namespace specd {
namespace {

constexpr int32_t kBlock = 32;   // NSA block
constexpr int32_t kCount = 8;    // S
constexpr int32_t kWindow = 64;  // window_size
constexpr int32_t kHeadDim = 2;
constexpr int32_t kKvBlock = 16;  // paged-KV block
constexpr int32_t kNumKvBlocks = 40;
constexpr int32_t kLayers = 2;

enum Gate { kCompressedOnly, kSelectedOnly, kAll };

class SsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto kv = CpuKvCache::Create(KvCacheSpec{kLayers, 1, kHeadDim, kKvBlock, kNumKvBlocks});
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    table_.resize(kNumKvBlocks);
    std::iota(table_.rbegin(), table_.rend(), 0);  // not laid out contiguously
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      for (int32_t j = 0; j < kNumKvBlocks * kKvBlock; ++j) {
        float* key = kv_->KeySlot(layer, table_[j / kKvBlock], j % kKvBlock);
        float* value = kv_->ValueSlot(layer, table_[j / kKvBlock], j % kKvBlock);
        // Layer 1's keys point at blocks 8 .. 12 (positions 256 .. 415), so a query along the
        // first axis selects those there; layer 0's are zero.
        key[0] = layer == 1 && j >= 8 * kBlock && j < 13 * kBlock ? 1.0f : 0.0f;
        key[1] = 0.0f;
        value[0] = 1.0f;
        value[1] = static_cast<float>(j);
      }
    }
  }

  // Runs `layers` layers of one query head over the sequences' positions (each sequence's in
  // one contiguous run) with each sequence's strategy; returns the last layer's output
  // [tokens, head_dim]. q: every query's vector in every layer.
  std::vector<float> Run(const std::vector<std::vector<int32_t>>& seqs,
                         const std::vector<const SsvStrategy*>& ssv, Gate gate, int32_t layers = 1,
                         std::vector<float> q = {0.0f, 0.0f}) {
    attention_ = std::make_unique<NsaAttention>(
        NsaShape{1, 1, kHeadDim, NsaConfig{kBlock, kCount, kWindow}}, kLayers);
    std::vector<int32_t> positions, seq_of_token;
    std::vector<std::span<const int32_t>> tables;
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (int32_t p : seqs[s]) {
        positions.push_back(p);
        seq_of_token.push_back(static_cast<int32_t>(s));
      }
      tables.push_back(table_);
    }
    const size_t n = positions.size();
    std::vector<float> qs(n * kHeadDim);
    for (size_t t = 0; t < n; ++t) std::copy(q.begin(), q.end(), qs.begin() + t * kHeadDim);
    std::vector<float> gates(n * 3);
    for (size_t t = 0; t < n; ++t) {
      gates[3 * t + 0] = gate == kSelectedOnly ? -200.0f : 200.0f;
      gates[3 * t + 1] = gate == kCompressedOnly ? -200.0f : 200.0f;
      gates[3 * t + 2] = gate == kAll ? 0.3f * static_cast<float>(t) : -200.0f;
    }
    std::vector<float> out(n * kHeadDim, -1.0f);
    ThreadPool pool(2);
    const std::span<const SsvStrategy* const> per_seq =
        ssv.empty() ? std::span<const SsvStrategy* const>() : std::span(ssv);
    for (int32_t layer = 0; layer < layers; ++layer) {
      attention_->Run(pool, TokenLayout{positions, seq_of_token, tables}, qs.data(), kHeadDim,
                      gates.data(), 3, *kv_, layer, out.data(), per_seq);
    }
    return out;
  }

  std::unique_ptr<CpuKvCache> kv_;
  std::vector<int32_t> table_;
  std::unique_ptr<NsaAttention> attention_;
};

std::vector<int32_t> Range(int32_t first, int32_t last) {
  std::vector<int32_t> v(last - first + 1);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST_F(SsvTest, ExactGroupsAttendAsEachQueryAloneAndReadTheUnionOfTheirKeys) {
  // A verification chunk at 600 .. 607 (own block 18) beside a sequence without a strategy.
  const std::vector<std::vector<int32_t>> seqs = {Range(600, 607), Range(90, 97)};
  const std::vector<float> plain = Run(seqs, {}, kAll);
  // Every query selects {0, 1, 2, 3, 4, 5, 17, 18}: keys 0 .. 191, and 544 .. p of blocks 17
  // and 18 inside its window p - 63 .. p: 256 keys each, 2,048 for the chunk. A group of
  // queries p0 .. p1 reads 0 .. 191 and p0 - 63 .. p1: 192 + 64 + (p1 - p0) keys.
  struct Case {
    int32_t c;
    int64_t grouped_keys, grouped_blocks;
  };
  for (const Case& k : {Case{1, 2048, 64}, Case{2, 4 * 257, 32}, Case{4, 2 * 259, 16},
                        Case{8, 263, 8}, Case{16, 263, 8}}) {
    const SsvStrategy st{.group_size = k.c};
    const std::vector<float> got = Run(seqs, {&st, nullptr}, kAll);
    EXPECT_EQ(got, plain) << "C " << k.c << ": mode exact must not change any output";
    const SsvLoadStats& s = attention_->ssv_stats();
    EXPECT_EQ(s.queries, 8) << "only the sequence with a strategy is counted";
    EXPECT_EQ(s.per_query_keys, 2048);
    EXPECT_EQ(s.per_query_blocks, 64);
    EXPECT_EQ(s.grouped_keys, k.grouped_keys) << "C " << k.c;
    EXPECT_EQ(s.grouped_blocks, k.grouped_blocks) << "C " << k.c;
    EXPECT_EQ(s.overlap_pairs, 7);
    EXPECT_DOUBLE_EQ(s.overlap_sum, 7.0) << "identical selections overlap fully";
  }
}

TEST_F(SsvTest, SharedModeAttendsTheGroupsFirstSelection) {
  // Queries 62 .. 69: 62 and 63 are in block 1 (selection {0, 1}), 64 .. 69 in block 2
  // ({0, 1, 2}). The selected branch alone averages the attended positions.
  const std::vector<std::vector<int32_t>> seqs = {Range(62, 69)};
  const std::vector<float> exact = Run(seqs, {}, kSelectedOnly);
  for (int32_t t = 0; t < 8; ++t) {
    const int32_t p = 62 + t;
    EXPECT_NEAR(exact[2 * t + 1], p / 2.0f, 1e-4) << "keys 0 .. " << p;
  }
  // C 8: every query takes 62's {0, 1}: keys 0 .. min(p, 63).
  const SsvStrategy c8{.group_size = 8, .mode = SsvMode::kShared};
  const std::vector<float> shared8 = Run(seqs, {&c8}, kSelectedOnly);
  for (int32_t t = 0; t < 8; ++t) {
    const int32_t p = 62 + t;
    EXPECT_NEAR(shared8[2 * t + 1], std::min(p, 63) / 2.0f, 1e-4) << "p " << p;
  }
  // Each query's keys are 0 .. min(p, 63) plus its window (from 0, all within 0 .. p): p + 1
  // keys; the group reads 0 .. 69 once. Blocks: 2 per query, {0, 1} for the group.
  SsvLoadStats s = attention_->ssv_stats();
  EXPECT_EQ(s.per_query_keys, (63 + 64 + 65 + 66 + 67 + 68 + 69 + 70));
  EXPECT_EQ(s.grouped_keys, 70);
  EXPECT_EQ(s.per_query_blocks, 16);
  EXPECT_EQ(s.grouped_blocks, 2);
  // The overlap is the model's own selections': 63 -> 64 keeps 2 of 3 blocks, the rest all.
  EXPECT_EQ(s.overlap_pairs, 7);
  EXPECT_NEAR(s.overlap_sum, 6.0 + 2.0 / 3.0, 1e-12);
  // C 4: the second group's first query (66) is in block 2, so that group attends as exact;
  // the first group's 64 and 65 lose block 2.
  const SsvStrategy c4{.group_size = 4, .mode = SsvMode::kShared};
  const std::vector<float> shared4 = Run(seqs, {&c4}, kSelectedOnly);
  for (int32_t t = 0; t < 8; ++t) {
    const int32_t p = 62 + t;
    const float want = t < 4 ? std::min(p, 63) / 2.0f : p / 2.0f;
    EXPECT_NEAR(shared4[2 * t + 1], want, 1e-4) << "p " << p;
  }
  // C 1 shares nothing: exactly the model.
  const SsvStrategy c1{.group_size = 1, .mode = SsvMode::kShared};
  EXPECT_EQ(Run(seqs, {&c1}, kAll), Run(seqs, {}, kAll));
}

TEST_F(SsvTest, ReuseLayersAttendTheLastRefreshLayersSelection) {
  // Query (10, 0) at 600. Layer 0 (zero keys) selects {0, 1, 2, 3, 4, 5, 17, 18}; layer 1's
  // keys make it select {0, 8, 9, 10, 11, 12, 17, 18}.
  const std::vector<std::vector<int32_t>> seqs = {{600}};
  const std::vector<float> q = {10.0f, 0.0f};
  const std::vector<float> strict = Run(seqs, {}, kSelectedOnly, 2, q);
  EXPECT_EQ(std::vector<int32_t>(attention_->LastTokenSelection(1, 0).begin(),
                                 attention_->LastTokenSelection(1, 0).end()),
            (std::vector<int32_t>{0, 8, 9, 10, 11, 12, 17, 18}));
  EXPECT_GT(strict[1], 256.0f) << "layer 1 attends blocks 8 .. 12 most";
  // refresh_every 2: layer 1 reuses layer 0's selection, whose keys (0 .. 191, 544 .. 600) are
  // all zero in layer 1, so it averages their positions uniformly.
  const SsvStrategy reuse{.refresh_every = 2};
  const std::vector<float> got = Run(seqs, {&reuse}, kSelectedOnly, 2, q);
  double sum = 0;
  for (int32_t j = 0; j <= 191; ++j) sum += j;
  for (int32_t j = 544; j <= 600; ++j) sum += j;
  EXPECT_NEAR(got[1], sum / (192 + 57), 1e-3);
  // The own selection is still computed (and reported) on reuse layers.
  EXPECT_EQ(attention_->LastTokenSelection(1, 0)[1], 8);
  // refresh_every 1 is strict.
  const SsvStrategy every{.refresh_every = 1};
  EXPECT_EQ(Run(seqs, {&every}, kAll, 2, q), Run(seqs, {}, kAll, 2, q));
}

TEST(SsvStrategyTest, NamesValidatesAndTellsWhatIsLossy) {
  EXPECT_FALSE((SsvStrategy{.group_size = 8}).lossy());
  EXPECT_TRUE((SsvStrategy{.mode = SsvMode::kShared}).lossy());
  EXPECT_TRUE((SsvStrategy{.refresh_every = 2}).lossy());
  EXPECT_EQ(
      SsvStrategyName(SsvStrategy{.group_size = 4, .mode = SsvMode::kShared, .refresh_every = 3}),
      "shared/c4/r3");
  SsvMode mode;
  EXPECT_TRUE(ParseSsvMode("shared", &mode));
  EXPECT_EQ(mode, SsvMode::kShared);
  EXPECT_FALSE(ParseSsvMode("approximate", &mode));
  EXPECT_TRUE(ValidateSsvStrategy(SsvStrategy{.group_size = 16}, "ssv.").ok());
  const absl::Status big = ValidateSsvStrategy(SsvStrategy{.group_size = 17}, "ssv.");
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("ssv.group_size"), std::string::npos) << big;
  EXPECT_FALSE(ValidateSsvStrategy(SsvStrategy{.group_size = 0}, "").ok());
  EXPECT_FALSE(ValidateSsvStrategy(SsvStrategy{.refresh_every = 0}, "").ok());
}

}  // namespace
}  // namespace specd
