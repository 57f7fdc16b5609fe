#include "engine/kv/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace specd {
namespace {

KvCacheSpec SmallSpec() {
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 3;
  spec.head_dim = 4;
  spec.block_size = 5;
  spec.num_blocks = 6;
  return spec;
}

TEST(KvCacheSpecTest, RejectsNonPositiveFields) {
  KvCacheSpec spec = SmallSpec();
  EXPECT_TRUE(spec.Validate().ok());
  spec.head_dim = 0;
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CpuKvCache::Create(spec).ok());
}

TEST(CpuKvCacheTest, SlotsAreDisjointAndLaidOutBlockMajor) {
  const KvCacheSpec spec = SmallSpec();
  auto cache = CpuKvCache::Create(spec);
  ASSERT_TRUE(cache.ok());
  CpuKvCache& kv = **cache;
  EXPECT_EQ(kv.keys(0).size(), static_cast<size_t>(6 * 5 * 3 * 4));
  float* k = kv.KeySlot(1, 2, 3);
  EXPECT_EQ(k - kv.keys(1).data(), (2 * 5 + 3) * 12);
  for (int i = 0; i < 12; ++i) k[i] = 1.0f + i;
  EXPECT_EQ(kv.ValueSlot(1, 2, 3)[0], 0.0f);  // values are separate storage
  EXPECT_EQ(kv.KeySlot(0, 2, 3)[0], 0.0f);    // layers are separate storage
  EXPECT_EQ(kv.KeySlot(1, 2, 4)[0], 0.0f);    // the next slot starts after this one
  EXPECT_EQ(spec.total_bytes(), 2 * 2 * 6 * 5 * 12 * 4);
}

// An NSA model's compressed entries: one per compression block ending in a page (several when the
// block is shorter than a page), counted in the cache's bytes; a block size that neither divides
// the page nor is a multiple of it is refused.
TEST(CpuKvCacheTest, CompressedEntriesArePerPageAndCounted) {
  KvCacheSpec spec = SmallSpec();
  spec.block_size = 8;
  spec.compressed_block_size = 16;
  ASSERT_TRUE(spec.Validate().ok());
  EXPECT_EQ(spec.compressed_per_block(), 1);
  EXPECT_EQ(spec.total_bytes(), 2 * 6 * (2 * 8 * 12 + 1 * 24) * 4);
  spec.compressed_block_size = 4;
  EXPECT_EQ(spec.compressed_per_block(), 2);
  auto cache = CpuKvCache::Create(spec);
  ASSERT_TRUE(cache.ok()) << cache.status();
  CpuKvCache& kv = **cache;
  EXPECT_EQ(kv.CompressedEntry(1, 3, 1) - kv.CompressedEntry(1, 0, 0), (3 * 2 + 1) * 24);
  kv.CompressedEntry(1, 3, 1)[0] = 5.0f;
  EXPECT_EQ(kv.CompressedEntry(0, 3, 1)[0], 0.0f);  // layers are separate storage
  spec.compressed_block_size = 6;
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  spec.compressed_block_size = -1;
  EXPECT_EQ(spec.Validate().code(), absl::StatusCode::kInvalidArgument);
  spec.compressed_block_size = 0;
  EXPECT_EQ(spec.compressed_per_block(), 0);
  EXPECT_EQ(spec.total_bytes(), 2 * 6 * (2 * 8 * 12) * 4);
}

TEST(CpuKvCacheTest, MoveSlotsCopiesEveryLayerInOrderAndChecksFirst) {
  auto cache = CpuKvCache::Create(SmallSpec());
  ASSERT_TRUE(cache.ok());
  CpuKvCache& kv = **cache;
  const std::vector<int32_t> table = {4, 1};  // slots 0-4 in block 4, 5-9 in block 1
  auto mark = [&](int32_t slot, float value) {
    for (int32_t layer = 0; layer < 2; ++layer) {
      kv.KeySlot(layer, table[slot / 5], slot % 5)[0] = value + layer;
      kv.ValueSlot(layer, table[slot / 5], slot % 5)[11] = -value - layer;
    }
  };
  mark(7, 70.0f);
  mark(9, 90.0f);
  // A tree's path at slots 7 and 9 moves to 3 and 4 (across the block boundary).
  const std::vector<KvSlotMove> moves = {{table, 7, 3}, {table, 9, 4}};
  ASSERT_TRUE(kv.MoveSlots(moves).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(kv.KeySlot(layer, 4, 3)[0], 70.0f + layer);
    EXPECT_EQ(kv.ValueSlot(layer, 4, 3)[11], -70.0f - layer);
    EXPECT_EQ(kv.KeySlot(layer, 4, 4)[0], 90.0f + layer);
  }
  // A slot past the table: nothing moves.
  mark(3, 1.0f);
  const std::vector<KvSlotMove> bad = {{table, 9, 3}, {table, 10, 4}};
  const absl::Status s = kv.MoveSlots(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(kv.KeySlot(0, 4, 3)[0], 1.0f);
}

}  // namespace
}  // namespace specd
