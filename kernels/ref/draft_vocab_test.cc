#include "kernels/ref/draft_vocab.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Draft id d -> target id 3 d + 1 (as a d2t of offsets 2 d + 1 would give).
std::vector<int32_t> SpacedMap(int32_t size) {
  std::vector<int32_t> map(size);
  for (int32_t d = 0; d < size; ++d) map[d] = 3 * d + 1;
  return map;
}

TEST(MapIdsTest, MapsInRangeIdsAndGivesMinusOneForNegativeOrOutOfRangeIds) {
  const std::vector<int32_t> map = SpacedMap(5);
  const std::vector<int32_t> ids = {0, 4, -1, 5, 2, -7, 1000, 3};
  std::vector<int32_t> out(ids.size(), 99);
  MapIds(ids.data(), static_cast<int32_t>(ids.size()), map.data(), 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 13, -1, -1, 7, -1, -1, 10}));
}

TEST(MapIdsTest, InPlaceGivesTheSameIds) {
  const std::vector<int32_t> map = SpacedMap(6);
  std::vector<int32_t> ids = {5, 0, -1, 6, 3, 3};
  MapIds(ids.data(), static_cast<int32_t>(ids.size()), map.data(), 6, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{16, 1, -1, -1, 10, 10}));
}

TEST(MapIdsTest, ZeroIdsWritesNothing) {
  const std::vector<int32_t> map = SpacedMap(2);
  std::vector<int32_t> out = {42};
  MapIds(nullptr, 0, map.data(), 2, out.data());
  EXPECT_EQ(out[0], 42);
}

TEST(ExpandColumnsTest, ScattersEachRowOverFillAndLeavesRowPaddingAlone) {
  // 3 rows of 4 source columns in a stride of 6, into 9 columns in a stride of 11.
  constexpr int32_t kRows = 3, kSrcCols = 4, kDstCols = 9;
  constexpr int64_t kSrcStride = 6, kDstStride = 11;
  constexpr float kPad = 12345.0f;
  std::vector<float> src(kRows * kSrcStride, -99.0f);  // padding never read
  for (int32_t r = 0; r < kRows; ++r) {
    for (int32_t c = 0; c < kSrcCols; ++c) src[r * kSrcStride + c] = 10.0f * r + c + 0.5f;
  }
  const std::vector<int32_t> cols = {7, 0, 8, 3};  // unsorted, both ends of the row
  std::vector<float> dst(kRows * kDstStride, kPad);
  ExpandColumns(src.data(), kSrcStride, kRows, kSrcCols, cols.data(), dst.data(), kDstStride,
                kDstCols, kNegInf);
  for (int32_t r = 0; r < kRows; ++r) {
    const float* row = dst.data() + r * kDstStride;
    const std::vector<float> expected = {10.0f * r + 1.5f, kNegInf,          kNegInf,
                                         10.0f * r + 3.5f, kNegInf,          kNegInf,
                                         kNegInf,          10.0f * r + 0.5f, 10.0f * r + 2.5f};
    EXPECT_EQ(std::vector<float>(row, row + kDstCols), expected) << "row " << r;
    EXPECT_EQ(row[9], kPad) << "row " << r;
    EXPECT_EQ(row[10], kPad) << "row " << r;
  }
}

TEST(ExpandColumnsTest, EveryColumnCoveredLeavesNoFill) {
  // num_src_cols == num_dst_cols: a permutation; fill appears nowhere.
  const std::vector<double> src = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> cols = {2, 0, 1};
  std::vector<double> dst(6, 0.0);
  ExpandColumns(src.data(), 3, 2, 3, cols.data(), dst.data(), 3, 3, -1.0);
  EXPECT_EQ(dst, (std::vector<double>{2, 3, 1, 5, 6, 4}));
}

TEST(ExpandColumnsTest, ScatteredValuesKeepNonFiniteAndNegativeZeroBits) {
  const std::vector<float> src = {kNegInf, -0.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<int32_t> cols = {4, 1, 2};
  std::vector<float> dst(5, 7.0f);
  ExpandColumns(src.data(), 3, 1, 3, cols.data(), dst.data(), 5, 5, 0.25f);
  EXPECT_EQ(dst[0], 0.25f);
  EXPECT_EQ(dst[1], 0.0f);
  EXPECT_TRUE(std::signbit(dst[1]));
  EXPECT_TRUE(std::isnan(dst[2]));
  EXPECT_EQ(dst[3], 0.25f);
  EXPECT_EQ(dst[4], kNegInf);
}

TEST(ExpandColumnsTest, ZeroRowsWritesNothing) {
  const std::vector<float> src = {1.0f};
  const std::vector<int32_t> cols = {0};
  std::vector<float> dst = {3.0f, 3.0f};
  ExpandColumns(src.data(), 1, 0, 1, cols.data(), dst.data(), 2, 2, kNegInf);
  EXPECT_EQ(dst, (std::vector<float>{3.0f, 3.0f}));
}

}  // namespace
}  // namespace specd::kernels::ref
