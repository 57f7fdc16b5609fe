#include "engine/kv/block_allocator.h"

#include <gtest/gtest.h>

#include <set>

namespace specd {
namespace {

TEST(BlockAllocatorTest, AllocatesEveryBlockOnceThenReportsFull) {
  BlockAllocator allocator(4);
  std::set<int32_t> seen;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<BlockId> id = allocator.Allocate();
    ASSERT_TRUE(id.ok());
    EXPECT_TRUE(seen.insert(id->value).second);
    EXPECT_EQ(allocator.ref_count(*id), 1);
  }
  EXPECT_EQ(allocator.num_free(), 0);
  EXPECT_EQ(allocator.Allocate().status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockAllocatorTest, FreedBlocksAreReusedOldestFirst) {
  BlockAllocator allocator(3);
  BlockId a = *allocator.Allocate();
  BlockId b = *allocator.Allocate();
  ASSERT_TRUE(allocator.Free(b).ok());
  ASSERT_TRUE(allocator.Free(a).ok());
  // Block 2 was never used, then b, then a.
  EXPECT_EQ(allocator.Allocate()->value, 2);
  EXPECT_EQ(*allocator.Allocate(), b);
  EXPECT_EQ(*allocator.Allocate(), a);
}

TEST(BlockAllocatorTest, SharedBlockIsFreedWithItsLastReference) {
  BlockAllocator allocator(2);
  BlockId a = *allocator.Allocate();
  ASSERT_TRUE(allocator.AddRef(a).ok());
  EXPECT_EQ(allocator.ref_count(a), 2);
  ASSERT_TRUE(allocator.Free(a).ok());
  EXPECT_EQ(allocator.num_free(), 1);
  ASSERT_TRUE(allocator.Free(a).ok());
  EXPECT_EQ(allocator.num_free(), 2);
}

TEST(BlockAllocatorTest, RejectsDoubleFreeAndBadIds) {
  BlockAllocator allocator(2);
  BlockId a = *allocator.Allocate();
  ASSERT_TRUE(allocator.Free(a).ok());
  EXPECT_EQ(allocator.Free(a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator.AddRef(a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator.Free(BlockId{7}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(allocator.Free(BlockId{-1}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(allocator.num_free(), 2);
}

TEST(BlockTableTest, GrowsByWholeBlocks) {
  BlockAllocator allocator(8);
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(1, allocator).ok());
  EXPECT_EQ(table.num_blocks(), 1);
  ASSERT_TRUE(table.EnsureCapacity(4, allocator).ok());
  EXPECT_EQ(table.num_blocks(), 1);
  ASSERT_TRUE(table.EnsureCapacity(9, allocator).ok());
  EXPECT_EQ(table.num_blocks(), 3);
  EXPECT_EQ(table.capacity(), 12);
  EXPECT_EQ(allocator.num_free(), 5);
}

TEST(BlockTableTest, EnsureCapacityIsAllOrNothing) {
  BlockAllocator allocator(3);
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(4, allocator).ok());
  EXPECT_EQ(table.EnsureCapacity(20, allocator).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.num_blocks(), 1);
  EXPECT_EQ(allocator.num_free(), 2);
}

TEST(BlockTableTest, TruncateRollsBackRejectedTokens) {
  BlockAllocator allocator(8);
  BlockTable table(4);
  ASSERT_TRUE(table.EnsureCapacity(10, allocator).ok());  // 3 blocks
  const int32_t first = table.ids()[0];
  ASSERT_TRUE(table.Truncate(5, allocator).ok());  // positions 0..4 need 2 blocks
  EXPECT_EQ(table.num_blocks(), 2);
  EXPECT_EQ(table.ids()[0], first);
  EXPECT_EQ(allocator.num_free(), 6);
  ASSERT_TRUE(table.Truncate(8, allocator).ok());  // no-op: already fits
  EXPECT_EQ(table.num_blocks(), 2);
  ASSERT_TRUE(table.Release(allocator).ok());
  EXPECT_EQ(table.num_blocks(), 0);
  EXPECT_EQ(allocator.num_free(), 8);
}

TEST(BlockTableTest, SimulatedSequencesNeverShareBlocks) {
  BlockAllocator allocator(16);
  BlockTable a(4), b(4);
  int32_t len_a = 0, len_b = 0;
  for (int step = 0; step < 12; ++step) {
    len_a += 3;  // speculative step: 4 proposed, 3 kept
    ASSERT_TRUE(a.EnsureCapacity(len_a + 1, allocator).ok());
    ASSERT_TRUE(a.Truncate(len_a, allocator).ok());
    len_b += 2;
    ASSERT_TRUE(b.EnsureCapacity(len_b, allocator).ok());
    std::set<int32_t> ids(a.ids().begin(), a.ids().end());
    for (int32_t id : b.ids()) EXPECT_FALSE(ids.contains(id));
    EXPECT_EQ(allocator.num_free(), 16 - a.num_blocks() - b.num_blocks());
  }
}

}  // namespace
}  // namespace specd
