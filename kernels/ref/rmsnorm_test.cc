#include "kernels/ref/rmsnorm.h"

#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

// Row [3, 4]: mean square 12.5, so the row scales by 1/sqrt(12.5) before the weight.
TEST(RmsNormRefTest, ScalesRowByInverseRootMeanSquare) {
  const std::vector<double> input = {3, 4, 1, 1};
  const std::vector<double> weight = {1, 2};
  std::vector<double> out(4, -1);
  RmsNorm(input.data(), weight.data(), /*num_tokens=*/2, /*hidden=*/2, /*eps=*/0.0, out.data());
  EXPECT_NEAR(out[0], 0.848528137423857, 1e-12);
  EXPECT_NEAR(out[1], 2.262741699796952, 1e-12);
  EXPECT_NEAR(out[2], 1.0, 1e-12);
  EXPECT_NEAR(out[3], 2.0, 1e-12);
}

TEST(RmsNormRefTest, EpsilonAddsToMeanSquare) {
  const std::vector<double> input = {1, -1};
  const std::vector<double> weight = {1, 3};
  std::vector<double> out(2);
  RmsNorm(input.data(), weight.data(), 1, 2, /*eps=*/1.0, out.data());
  EXPECT_NEAR(out[0], 0.7071067811865475, 1e-12);
  EXPECT_NEAR(out[1], -2.1213203435596424, 1e-12);
}

TEST(RmsNormRefTest, FusedAddUpdatesResidualAndNormalizesTheSum) {
  const std::vector<float> input = {1, 2};
  std::vector<float> residual = {2, 2};
  const std::vector<float> weight = {1, 2};
  std::vector<float> out(2);
  FusedAddRmsNorm(input.data(), residual.data(), weight.data(), 1, 2, 0.0, out.data());
  EXPECT_EQ(residual, (std::vector<float>{3, 4}));
  EXPECT_NEAR(out[0], 0.848528137f, 1e-6);
  EXPECT_NEAR(out[1], 2.262741700f, 1e-6);
}

TEST(RmsNormRefTest, FusedAddWorksInPlaceOnInput) {
  std::vector<double> x = {1, 2, -5, 0.5};
  std::vector<double> residual = {2, 2, 1, 1};
  const std::vector<double> weight = {0.5, -1.5};
  std::vector<double> res_copy = residual, out(4);
  FusedAddRmsNorm(x.data(), res_copy.data(), weight.data(), 2, 2, 1e-6, out.data());
  FusedAddRmsNorm(x.data(), residual.data(), weight.data(), 2, 2, 1e-6, x.data());
  EXPECT_EQ(x, out);
  EXPECT_EQ(residual, res_copy);
}

}  // namespace
}  // namespace specd::kernels::ref
