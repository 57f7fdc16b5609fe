#include "kernels/ref/allreduce.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ref/bf16.h"

namespace specd::kernels::ref {
namespace {

// Four ranks of random values: the reference equals a straightforward rank-order double sum
// rounded to bf16 within one bf16 step of the fp32 rounding, and equals the fp32 loop exactly.
TEST(AllReduceRefTest, Bf16MatchesRankOrderFp32SumRoundedOnce) {
  constexpr int kRanks = 4;
  constexpr int64_t kCount = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<uint16_t>> in(kRanks, std::vector<uint16_t>(kCount));
  for (auto& row : in) {
    for (uint16_t& x : row) x = FloatToBf16(normal(rng));
  }
  std::vector<const uint16_t*> ptrs;
  for (const auto& row : in) ptrs.push_back(row.data());
  std::vector<uint16_t> out(kCount, 0xFFFF);
  AllReduceSumBf16(ptrs, kCount, out.data());
  for (int64_t i = 0; i < kCount; ++i) {
    float fp32 = 0.0f;
    double exact = 0.0;
    for (int r = 0; r < kRanks; ++r) {
      fp32 += Bf16ToFloat(in[r][i]);
      exact += Bf16ToFloat(in[r][i]);
    }
    ASSERT_EQ(out[i], FloatToBf16(fp32)) << i;
    // bf16 keeps 8 significant bits: within one unit in the last place of the exact sum.
    EXPECT_LE(std::abs(Bf16ToFloat(out[i]) - exact), std::ldexp(std::abs(exact), -7) + 1e-30) << i;
  }
}

TEST(AllReduceRefTest, F32SumsInRankOrderAndMayRunInPlace) {
  // 1e8 + 1 - 1e8 in fp32: rank order gives 0 (1 is lost), another order would give 1.
  std::vector<float> a = {1e8f, 2.0f}, b = {1.0f, 3.0f}, c = {-1e8f, -0.5f};
  const std::vector<const float*> ptrs = {a.data(), b.data(), c.data()};
  AllReduceSumF32(ptrs, 2, a.data());
  EXPECT_EQ(a, (std::vector<float>{0.0f, 4.5f}));
}

TEST(AllReduceRefTest, OneRankCopiesAndKeepsNegativeZero) {
  const std::vector<uint16_t> x = {FloatToBf16(-0.0f), FloatToBf16(1.5f)};
  const std::vector<const uint16_t*> ptrs = {x.data()};
  std::vector<uint16_t> out(2);
  AllReduceSumBf16(ptrs, 2, out.data());
  EXPECT_EQ(out, x);
}

}  // namespace
}  // namespace specd::kernels::ref
