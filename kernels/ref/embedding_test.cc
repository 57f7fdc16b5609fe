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

// In place and in order: a later copy reads what an earlier one wrote.
TEST(CopyRowsRefTest, CopiesRowsInPlaceInOrder) {
  std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31};  // 4 rows of 2
  const std::vector<int32_t> src = {0, 1, 3, 2};
  const std::vector<int32_t> dst = {1, 2, 0, 2};
  CopyRows(src.data(), dst.data(), 4, table.data(), 2);
  // row 1 <- row 0; row 2 <- row 1 (now row 0's); row 0 <- row 3; row 2 onto itself.
  EXPECT_EQ(table, (std::vector<float>{30, 31, 0, 1, 0, 1, 30, 31}));
}

}  // namespace
}  // namespace specd::kernels::ref
