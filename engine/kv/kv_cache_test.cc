#include "engine/kv/kv_cache.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace specd
