#include "kernels/ref/activation.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

// silu(1) = 1/(1+e^-1), silu(-2) = -2/(1+e^2), silu(4) = 4/(1+e^-4).
TEST(SiluAndMulRefTest, GatesSecondHalfWithSiluOfFirstHalf) {
  const std::vector<double> gate_up = {1, -2, 3,  0.5,  // token 0: gate [1, -2], up [3, 0.5]
                                       4, 1,  -1, 0};   // token 1: gate [4, 1], up [-1, 0]
  std::vector<double> out(4, 7);
  SiluAndMul(gate_up.data(), /*num_tokens=*/2, /*d=*/2, out.data());
  EXPECT_NEAR(out[0], 2.193175735890015, 1e-12);
  EXPECT_NEAR(out[1], -0.11920292202211755, 1e-12);
  EXPECT_NEAR(out[2], -3.928055160151634, 1e-12);
  EXPECT_EQ(out[3], 0.0);
}

TEST(SiluAndMulRefTest, FloatAgreesWithDouble) {
  const std::vector<float> gate_up_f = {-30, 0.25f, 12, 2, -3, 1.5f};
  const std::vector<double> gate_up_d(gate_up_f.begin(), gate_up_f.end());
  std::vector<float> out_f(3);
  std::vector<double> out_d(3);
  SiluAndMul(gate_up_f.data(), 1, 3, out_f.data());
  SiluAndMul(gate_up_d.data(), 1, 3, out_d.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out_f[i], out_d[i], 1e-6 * (1 + std::abs(out_d[i])));
}

}  // namespace
}  // namespace specd::kernels::ref
