#include "engine/kv/block_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace specd {
namespace {

constexpr int32_t kBlock = 4;

std::vector<int32_t> Iota(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Allocates and marks every token computed, as the scheduler does after a prefill.
int32_t Prefill(BlockManager& bm, const std::vector<int32_t>& tokens, BlockTable& table) {
  absl::StatusOr<int32_t> cached = bm.Allocate(tokens, table);
  EXPECT_TRUE(cached.ok()) << cached.status();
  bm.CacheComputedBlocks(table, tokens, static_cast<int32_t>(tokens.size()));
  return cached.value_or(-1);
}

TEST(BlockManagerTest, AllocatesBlocksForEveryTokenAndFreesThem) {
  BlockManager bm(8, kBlock, /*enable_prefix_caching=*/true);
  BlockTable table(kBlock);
  const std::vector<int32_t> tokens = Iota(10);
  ASSERT_TRUE(bm.CanAllocate(tokens));
  EXPECT_EQ(bm.Allocate(tokens, table).value_or(-1), 0);
  EXPECT_EQ(table.num_blocks(), 3);
  EXPECT_EQ(bm.num_used_blocks(), 3);
  ASSERT_TRUE(bm.Deallocate(table).ok());
  EXPECT_EQ(table.num_blocks(), 0);
  EXPECT_EQ(bm.num_used_blocks(), 0);
}

TEST(BlockManagerTest, RefusesWhatDoesNotFitAndChangesNothing) {
  BlockManager bm(2, kBlock, true);
  BlockTable table(kBlock);
  const std::vector<int32_t> tokens = Iota(9);  // 3 blocks
  EXPECT_FALSE(bm.CanAllocate(tokens));
  EXPECT_EQ(bm.Allocate(tokens, table).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.num_blocks(), 0);
  EXPECT_EQ(bm.num_free_blocks(), 2);
}

TEST(BlockManagerTest, SharesComputedFullBlocksOfAnEqualPrefix) {
  BlockManager bm(16, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  std::vector<int32_t> ta = Iota(10);
  EXPECT_EQ(Prefill(bm, ta, a), 0);
  std::vector<int32_t> tb = ta;
  tb[9] = 7;  // differs in the third (partial) block only
  tb.push_back(8);
  ASSERT_TRUE(bm.CanAllocate(tb));
  EXPECT_EQ(bm.Allocate(tb, b).value_or(-1), 8);
  EXPECT_EQ(b.ids()[0], a.ids()[0]);
  EXPECT_EQ(b.ids()[1], a.ids()[1]);
  EXPECT_NE(b.ids()[2], a.ids()[2]);
  EXPECT_EQ(bm.ref_count(a.block(0)), 2);
  EXPECT_EQ(bm.num_used_blocks(), 4);
  EXPECT_EQ(bm.num_queried_blocks(), 2 + 2);  // a: 2 full blocks looked up, b: 2
  EXPECT_EQ(bm.num_hit_blocks(), 2);
  ASSERT_TRUE(bm.Deallocate(a).ok());
  EXPECT_EQ(bm.ref_count(b.block(0)), 1);
  ASSERT_TRUE(bm.Deallocate(b).ok());
  EXPECT_EQ(bm.num_used_blocks(), 0);
}

// A sequence that may not reuse the cache (Sequence::reuses_cached_prefix false) gets fresh
// blocks for an equal prefix and counts no lookup; the cached blocks stay for the next one.
TEST(BlockManagerTest, WithoutReuseAnEqualPrefixGetsFreshBlocks) {
  BlockManager bm(16, kBlock, true);
  BlockTable a(kBlock), b(kBlock), c(kBlock);
  std::vector<int32_t> tokens = Iota(10);
  EXPECT_EQ(Prefill(bm, tokens, a), 0);
  const PrefixCacheUse no_reuse{false, false};
  ASSERT_TRUE(bm.CanAllocate(tokens, no_reuse));
  EXPECT_EQ(bm.Allocate(tokens, b, no_reuse).value_or(-1), 0);
  for (int i = 0; i < 3; ++i) EXPECT_NE(b.ids()[i], a.ids()[i]);
  EXPECT_EQ(bm.ref_count(a.block(0)), 1);
  EXPECT_EQ(bm.num_queried_blocks(), 2);  // a's lookup only
  EXPECT_EQ(bm.Allocate(tokens, c).value_or(-1), 8);
  EXPECT_EQ(c.ids()[0], a.ids()[0]);
  for (BlockTable* t : {&a, &b, &c}) ASSERT_TRUE(bm.Deallocate(*t).ok());
}

// Blocks cached by a sequence without a draft head's entries do not serve one that needs them
// (PrefixCacheUse::head_kv); once such a sequence computes the same content, its marked blocks
// serve both kinds, and the mark goes with the block when it is reused for other content.
TEST(BlockManagerTest, HeadSequencesReuseOnlyBlocksWithTheHeadsEntries) {
  BlockManager bm(16, kBlock, true);
  const PrefixCacheUse head{true, true};
  BlockTable plain(kBlock), first(kBlock), second(kBlock), other(kBlock);
  std::vector<int32_t> tokens = Iota(10);
  EXPECT_EQ(Prefill(bm, tokens, plain), 0);  // cached without the head's entries
  EXPECT_EQ(bm.Allocate(tokens, first, head).value_or(-1), 0);
  bm.CacheComputedBlocks(first, tokens, 10, /*head_kv=*/true);
  EXPECT_EQ(bm.Allocate(tokens, second, head).value_or(-1), 8);
  EXPECT_EQ(second.ids()[0], first.ids()[0]);
  EXPECT_EQ(second.ids()[1], first.ids()[1]);
  EXPECT_EQ(bm.Allocate(tokens, other).value_or(-1), 8);  // a plain one takes them too
  EXPECT_EQ(other.ids()[0], first.ids()[0]);
  for (BlockTable* t : {&plain, &first, &second, &other}) ASSERT_TRUE(bm.Deallocate(*t).ok());
}

TEST(BlockManagerTest, NeverServesTheLastTokenFromTheCache) {
  BlockManager bm(16, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  const std::vector<int32_t> tokens = Iota(8);  // exactly two full blocks
  Prefill(bm, tokens, a);
  // The same 8 tokens again: the second block holds the last token, whose logits are
  // needed, so only the first block is reused.
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 4);
  EXPECT_EQ(b.num_blocks(), 2);
  EXPECT_EQ(b.ids()[0], a.ids()[0]);
  EXPECT_NE(b.ids()[1], a.ids()[1]);
}

TEST(BlockManagerTest, UncomputedBlocksAreNotShared) {
  BlockManager bm(16, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  const std::vector<int32_t> tokens = Iota(12);
  ASSERT_TRUE(bm.Allocate(tokens, a).ok());
  bm.CacheComputedBlocks(a, tokens, 5);  // a chunked prefill got through 5 tokens
  EXPECT_EQ(bm.num_cached_blocks(), 1);
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 4);
}

TEST(BlockManagerTest, HashChainCoversTheWholePrefix) {
  BlockManager bm(16, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  std::vector<int32_t> ta = Iota(9);
  Prefill(bm, ta, a);
  std::vector<int32_t> tb = ta;
  tb[0] = 1;  // first block differs; the second is equal but its prefix is not
  EXPECT_EQ(bm.Allocate(tb, b).value_or(-1), 0);
}

TEST(BlockManagerTest, FreedCachedBlockIsRevivedUntilReused) {
  BlockManager bm(4, kBlock, true);
  BlockTable a(kBlock), b(kBlock), c(kBlock), d(kBlock);
  const std::vector<int32_t> tokens = Iota(9);
  Prefill(bm, tokens, a);
  const int32_t first = a.ids()[0];
  ASSERT_TRUE(bm.Deallocate(a).ok());
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  // Revived straight from the free list.
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 8);
  EXPECT_EQ(b.ids()[0], first);
  ASSERT_TRUE(bm.Deallocate(b).ok());
  // Fill the pool with other tokens: the cached blocks are handed out and forgotten.
  Prefill(bm, Iota(16, 500), c);
  ASSERT_TRUE(bm.Deallocate(c).ok());
  EXPECT_EQ(bm.Allocate(tokens, d).value_or(-1), 0);
}

TEST(BlockManagerTest, CanAllocateCountsSharedBlocksInUseAsFree) {
  BlockManager bm(5, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  const std::vector<int32_t> tokens = Iota(13);  // 4 blocks, 3 full ones cacheable
  Prefill(bm, tokens, a);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  // Needs 4 blocks, 3 of them shared with a: one free block is enough.
  EXPECT_TRUE(bm.CanAllocate(tokens));
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 12);
  EXPECT_EQ(bm.num_free_blocks(), 0);
}

TEST(BlockManagerTest, DisabledPrefixCachingNeverHits) {
  BlockManager bm(16, kBlock, false);
  BlockTable a(kBlock), b(kBlock);
  const std::vector<int32_t> tokens = Iota(12);
  Prefill(bm, tokens, a);
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 0);
  EXPECT_EQ(bm.num_queried_blocks(), 0);
  EXPECT_EQ(bm.num_cached_blocks(), 0);
}

TEST(BlockManagerTest, AppendGrowsOneBlockAtABoundaryAndHashesFullDecodedBlocks) {
  BlockManager bm(3, kBlock, true);
  BlockTable a(kBlock), b(kBlock);
  std::vector<int32_t> tokens = Iota(4);
  Prefill(bm, tokens, a);
  EXPECT_EQ(a.num_blocks(), 1);
  tokens.push_back(9);  // decode: position 4 needs a second block
  EXPECT_TRUE(bm.CanAppend(a, 5));
  ASSERT_TRUE(bm.MayAppend(a, 5).ok());
  EXPECT_EQ(a.num_blocks(), 2);
  for (int32_t t = 10; t < 13; ++t) tokens.push_back(t);
  ASSERT_TRUE(bm.MayAppend(a, 8).ok());
  EXPECT_EQ(a.num_blocks(), 2);
  bm.CacheComputedBlocks(a, tokens, 8);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  tokens.push_back(13);
  ASSERT_TRUE(bm.MayAppend(a, 9).ok());
  EXPECT_FALSE(bm.CanAppend(a, 13));
  EXPECT_EQ(bm.MayAppend(a, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.num_blocks(), 3);
  // A new sequence with the decoded text as its prompt reuses both blocks.
  ASSERT_TRUE(bm.Deallocate(a).ok());
  EXPECT_EQ(bm.Allocate(tokens, b).value_or(-1), 8);
}

// Deterministic simulation: random sequences with overlapping prefixes are admitted,
// computed in chunks, decoded and freed; the pool's accounting must match the tables at
// every step, and every cache hit must name blocks holding exactly the right tokens.
TEST(BlockManagerTest, RandomSimulationKeepsRefCountsAndContentsConsistent) {
  constexpr int32_t kNumBlocks = 48;
  BlockManager bm(kNumBlocks, kBlock, true);
  std::mt19937 rng(7);
  struct Live {
    std::vector<int32_t> tokens;
    BlockTable table{kBlock};
    int32_t computed = 0;
  };
  std::vector<Live> live;
  std::vector<int32_t> content(kNumBlocks * kBlock, -1);  // what each slot holds
  const std::vector<std::vector<int32_t>> prefixes = {Iota(12, 1), Iota(7, 50), Iota(20, 90)};
  int64_t hits = 0;
  for (int step = 0; step < 2000; ++step) {
    const int action = static_cast<int>(rng() % 4);
    if (action == 0 && live.size() < 8) {
      Live l;
      l.tokens = prefixes[rng() % prefixes.size()];
      l.tokens.resize(l.tokens.size() - rng() % 5);
      for (int i = 0, n = static_cast<int>(rng() % 9); i < n; ++i) l.tokens.push_back(rng() % 30);
      if (l.tokens.empty() || !bm.CanAllocate(l.tokens)) continue;
      absl::StatusOr<int32_t> cached = bm.Allocate(l.tokens, l.table);
      ASSERT_TRUE(cached.ok());
      ASSERT_LT(*cached, static_cast<int32_t>(l.tokens.size()));
      for (int32_t p = 0; p < *cached; ++p) {
        ASSERT_EQ(content[l.table.ids()[p / kBlock] * kBlock + p % kBlock], l.tokens[p]);
      }
      hits += *cached / kBlock;
      l.computed = *cached;
      live.push_back(std::move(l));
    } else if (action == 1 && !live.empty()) {  // compute a chunk or decode one token
      Live& l = live[rng() % live.size()];
      if (l.computed == static_cast<int32_t>(l.tokens.size())) {
        const int32_t n = static_cast<int32_t>(l.tokens.size()) + 1;
        if (!bm.CanAppend(l.table, n)) continue;
        ASSERT_TRUE(bm.MayAppend(l.table, n).ok());
        l.tokens.push_back(rng() % 30);
      }
      const int32_t end =
          std::min<int32_t>(l.tokens.size(), l.computed + 1 + static_cast<int32_t>(rng() % 6));
      for (int32_t p = l.computed; p < end; ++p) {
        content[l.table.ids()[p / kBlock] * kBlock + p % kBlock] = l.tokens[p];
      }
      l.computed = end;
      bm.CacheComputedBlocks(l.table, l.tokens, l.computed);
    } else if (action == 2 && !live.empty()) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(bm.Deallocate(live[i].table).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::map<int32_t, int32_t> refs;
    for (const Live& l : live) {
      for (int32_t id : l.table.ids()) ++refs[id];
    }
    ASSERT_EQ(bm.num_used_blocks(), static_cast<int32_t>(refs.size()));
    for (const auto& [id, n] : refs) ASSERT_EQ(bm.ref_count(BlockId{id}), n);
  }
  EXPECT_GT(hits, 0);
  EXPECT_EQ(bm.num_hit_blocks(), hits);
}

}  // namespace
}  // namespace specd
