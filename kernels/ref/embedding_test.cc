#include "kernels/ref/embedding.h"

#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

TEST(EmbeddingGatherRefTest, CopiesShardRowsAndZeroesIdsOutsideTheShard) {
  // Shard holds vocabulary ids 10, 11, 12.
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> ids = {11, 10, 9, 13, 12};
  std::vector<float> out(10, -1);
  EmbeddingGather(ids.data(), 5, table.data(), /*vocab_start=*/10, /*num_rows=*/3, /*hidden=*/2,
                  out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 1, 2, 0, 0, 0, 0, 5, 6}));
}

}  // namespace
}  // namespace specd::kernels::ref
